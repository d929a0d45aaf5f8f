"""Graph-level tasks over a collection of many small graphs: one prediction per graph
(binary multi-task with missing labels, classes, regression), B graphs per step.

A step's items are graph ids, a slice of the epoch's on-device permutation (size
balanced with `cfg.balance_window`); the task packs them into the envelope's node and
edge slots (sampling/graph_batch.py) instead of sampling neighbourhoods (it is a
`BatchedTask`), the step gathers their node rows as it gathers a sampled level, and the
model (`nn/graph_models.py`, wrapped in `OnGraphs`) returns one row per graph slot.
The envelope is `Envelope(node slots, (edge slots, ELL slots))`, calibrated over every
batch of the run's epochs from the graphs' sizes and degrees; an overflow reruns the
batch as for sampling. ELL slots are node slots x K, K edge slots listed per node
(`aggregation="ell"`: layers sum messages by gathers, ops/incidence.py); with
`aggregation="segment"` (scatter-adds, the reference) the envelope has no ELL slots.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np
import optax

from zerognn_jax._src.data.graph import CSRGraph
from zerognn_jax._src.data.graph_datasets import load_graphs
from zerognn_jax._src.data.graphs import GraphCollection
from zerognn_jax._src.data.loaders import require_graphs
from zerognn_jax._src.nn.graph_models import OnGraphs, make_graph_model
from zerognn_jax._src.ops.jitting import jit_per_object
from zerognn_jax._src.sampling.calibrate import Calibration
from zerognn_jax._src.sampling.envelope import (
    Envelope,
    EnvelopePolicy,
    bucket,
    grow,
    monotone,
    round_up,
)
from zerognn_jax._src.sampling.graph_batch import (
    GraphBatch,
    GraphTables,
    epoch_counts,
    graph_tables,
    max_degrees,
    pack_graphs,
    step_graphs,
)
from zerognn_jax._src.sampling.minibatch import SamplerConfig
from zerognn_jax._src.sampling.seeds import (
    epoch_items,
    num_steps,
    ordered_items,
    serving_items,
    step_items,
    step_keys,
)
from zerognn_jax._src.sampling.steps import ItemLevel
from zerognn_jax._src.training.parallel import make_mesh
from zerognn_jax._src.training.placement import Placement, warn_unused_cache
from zerognn_jax._src.training.program import DeviceData, StepProgram
from zerognn_jax._src.training.schedule import make_optimizer, step_size
from zerognn_jax._src.training.tasks.base import ItemsAreLevel0, Predictor, TaskBatch, data_log
from zerognn_jax._src.training.tasks.graph_metrics import (
    DEFAULT_LOSS,
    LOSSES,
    METRICS,
    SCORES,
    graph_metrics,
)
from zerognn_jax._src.training.tasks.losses import row_weights

SPLITS = ("train", "val", "test")
# Capacities of graph batches round to at most this many slots: the sampled levels'
# default multiple (1024) would double a batch of 32 molecules (~820 node slots).
GRAPH_MULTIPLE = 64
AGGREGATIONS = ("auto", "ell", "segment")
# "auto" sums by ELL gathers on a GPU from this many graphs a batch: on an H100
# (molhiv-like, GINE-virtual 5 x 300) ELL epochs were 1.14x faster at batch 256 and
# 0.90x at batch 32, where a step's hundreds of small kernels, not its atomics, set the
# time (docs/benchmarks.md).
ELL_MIN_BATCH = 128


def resolve_aggregation(name: str, batch_size: int) -> str:
    """"auto": "ell" on a GPU for batches of at least ELL_MIN_BATCH graphs (scatter-adds
    there are atomics), "segment" for smaller ones and elsewhere (a CPU adds rows in
    order; its ELL epochs were slower)."""
    if name != "auto":
        return name
    gpu = jax.default_backend() == "gpu"
    return "ell" if gpu and batch_size >= ELL_MIN_BATCH else "segment"


def ell_envelope(nodes: int, edges: int, width: int) -> Envelope:
    """`Envelope(nodes, (edges, nodes x K))` with K >= `width` (widened to hold `edges`
    so that the capacities do not decrease)."""
    k = max(width, math.ceil(edges / nodes), 1)
    return Envelope(nodes, (edges, nodes * k))


def edge_rows(tables: GraphTables, gb: GraphBatch):
    """The batch's edge feature rows float[Ec, d_e] (zero where padded), or None."""
    if tables.edge_features is None:
        return None
    rows = tables.edge_features[gb.edge_ids]
    return jnp.where(gb.edge_mask[:, None], rows, jnp.zeros((), rows.dtype))


@dataclasses.dataclass(frozen=True, eq=False)
class GraphTask(ItemsAreLevel0):
    """Supervised learning of one target row per graph (`Task` and `BatchedTask`).

    Attributes:
      loss: (outputs[rows, ...], targets[rows, ...]) -> float32[rows]; rows are graph
        slots, weighted by their labelled entries (`losses.row_weights`).
      score: the same shape of per-row score in [0, 1] (None for regression).
      kind: the collection's target kind ("binary", "classes", "regression").
      window: batches per size-balanced window (0 or 1: plain shuffled batches;
        sampling/graph_batch.py says what balancing does); on D devices a step takes
        D of them (batch indices s D + d), so a window spans W / D steps.
      aggregation: "ell" (layers sum messages by gathers over each node's listed edge
        slots) or "segment" (by scatter-adds: the reference, the default); the same
        sums. `TrainConfig.graph_aggregation` resolves "auto" (`resolve_aggregation`).
      node_vocab, edge_vocab: the trained collection's categorical vocabularies (set by
        `prepare_run`): an exported model gives NaN for a graph with an id outside them.
    """

    loss: Callable = LOSSES["sigmoid"]
    score: Callable | None = SCORES["binary"]
    kind: str = "binary"
    window: int = 0
    aggregation: str = "segment"
    node_vocab: tuple[int, ...] = ()
    edge_vocab: tuple[int, ...] = ()
    name = "graph"
    item_name = "graph"  # `PredictsItems`: zg.predict's ids are graphs of the collection
    score_name = "acc"  # the fraction of labelled entries (or graphs) predicted right
    dedups_seeds = False
    tree_by_default = False
    row_normalizes_planetoid = False
    samples_neighbours = False  # whole graphs, packed

    def __post_init__(self):
        if self.aggregation not in ("ell", "segment"):
            raise ValueError(f"a graph task's aggregation must be 'ell' or 'segment', "
                             f"got {self.aggregation!r}")

    @classmethod
    def build(cls, cfg, dataset, *, loss=None, kernels=None):
        """The graph task of `loss` on `dataset` (default: `cfg.dataset` loaded by
        `load_graphs`), a `GraphCollection`."""
        del kernels
        if dataset is None:
            require_graphs(cfg.dataset)
            dataset = load_graphs(cfg.dataset, cfg.root, scale=cfg.scale, seed=cfg.seed,
                                  log=data_log(cfg))
        if not isinstance(dataset, GraphCollection):
            raise TypeError(f"the graph task trains on a GraphCollection, got "
                            f"{type(dataset).__name__}")
        if not dataset.train_idx.size:
            raise ValueError(f"{dataset.name}'s train_idx is empty: there is nothing to "
                             f"train on")
        train_targets = np.asarray(dataset.targets)[dataset.train_idx]
        if train_targets.dtype.kind == "f" and np.isnan(train_targets).all():
            raise ValueError(f"{dataset.name}'s training graphs have no target: every entry "
                             f"of targets[train_idx] is missing (NaN), so there is nothing "
                             f"to learn from")
        return graph_task(loss, dataset.target_kind, cfg.balance_window), dataset

    def default_model(self, dataset: GraphCollection) -> str:
        """GIN with a virtual node, reading the graphs' edge features where they have
        them (GINE: OGB's GIN-virtual on its molecules)."""
        return "gin-virtual" if dataset.edge_features is None else "gine-virtual"

    def output_dim(self, cfg, dataset: GraphCollection) -> int:
        del cfg
        return dataset.output_dim

    def wrap_model(self, model, cfg):
        del cfg
        return OnGraphs(model)

    def device_targets(self, dataset: GraphCollection) -> GraphTables:
        """The collection's offsets, edges, edge features and targets (`GraphTables`)."""
        return graph_tables(dataset)

    def batch(self, data, items, valid, key, level) -> TaskBatch:
        """Targets and weights of the B graphs and the padding graph (B + 1 rows)."""
        del key
        tables = data.targets
        ids = jnp.append(items, 0)
        rows = jnp.append(valid, False)
        targets = tables.targets[ids]
        return TaskBatch(targets, row_weights(targets, rows), {}, level)

    def restrict(self, mb, batch: TaskBatch):
        del batch
        return mb

    def metric_names(self, dataset: GraphCollection) -> tuple[str, ...]:
        return METRICS[dataset.target_kind]

    def evaluate(self, predictor: Predictor, dataset: GraphCollection) -> dict:
        """Every split's metrics from the model's outputs on its graphs (one pass over
        the splits' graphs together: one compiled program)."""
        parts = [np.asarray(getattr(dataset, f"{split}_idx")) for split in SPLITS]
        outputs = graph_outputs(predictor.program, predictor.variables, predictor.data,
                                np.concatenate(parts), dataset,
                                batch_size=predictor.batch_size)
        result, start = {}, 0
        for split, ids in zip(SPLITS, parts):
            rows = outputs[start:start + ids.size]
            start += ids.size
            metrics = graph_metrics(rows, dataset.targets[ids], dataset.target_kind)
            result.update({f"{split}_{k}": v for k, v in metrics.items()})
        return result

    # -- BatchedTask ---------------------------------------------------------------

    def num_items(self, dataset: GraphCollection) -> int:
        return dataset.num_graphs

    def outputs_of_items(self, program: StepProgram, variables, data: DeviceData,
                         dataset: GraphCollection, ids, *, batch_size: int) -> jax.Array:
        return jnp.asarray(graph_outputs(program, variables, data, ids, dataset,
                                         batch_size=batch_size, bucketed=True))

    def prepare_run(self, cfg, dataset: GraphCollection, *, model, tx, kernels):
        """Device data (node rows as `features`, `GraphTables` as `targets`) and the
        step program of the built-in `cfg.model` or the user's graph-level `model`.

        The built-in optimizer runs over the parameters raveled into one vector
        (`optax.flatten`): the same elementwise Adam, as a few kernels per step instead
        of a few per parameter array (one CPU-compiled step: 807 fusions and 411 copies
        against 970 and 654). A user's optimizer sees the parameter tree. The program's
        task resolves its aggregation by `cfg.batch_size`, the batch a step takes
        (`trainer.fit_batch` has lowered one above the training graphs)."""
        task = dataclasses.replace(
            self, aggregation=resolve_aggregation(cfg.graph_aggregation, cfg.batch_size),
            node_vocab=tuple(dataset.node_vocab), edge_vocab=tuple(dataset.edge_vocab))
        dtype = jnp.dtype(cfg.dtype)
        # categorical ids stay exact in float32; float features take the run's dtype
        feat_dtype = jnp.float32 if dataset.node_vocab else dtype
        if model is None:
            model = make_graph_model(cfg.model, hidden=cfg.hidden, num_layers=cfg.layers,
                                     out_dim=dataset.output_dim, dropout=cfg.dropout,
                                     readout=cfg.readout, node_vocab=dataset.node_vocab,
                                     edge_vocab=dataset.edge_vocab, dtype=dtype)
        tables = graph_tables(dataset)
        if tables.edge_features is not None and not dataset.edge_vocab:
            tables = tables._replace(edge_features=tables.edge_features.astype(dtype))
        graph = CSRGraph(np.zeros(dataset.num_nodes + 1, np.int32), np.zeros(0, np.int32))
        rows = np.asarray(dataset.node_features).astype(feat_dtype, copy=False)
        tx = tx or optax.flatten(make_optimizer(cfg, step_size(cfg, task, dataset)))
        placement = Placement("device", "graph tasks keep their graphs' features there")
        warn_unused_cache(cfg.feature_cache_gib, placement)
        program = StepProgram(task.wrap_model(model, cfg), tx, SamplerConfig((1,)),
                              cfg.batch_size, cfg.seed, kernels, task=task,
                              placement=placement)
        mesh = make_mesh(cfg.devices)
        if mesh.size > 1:  # every device holds the whole collection and packs its batch
            program = program.with_mesh(mesh)
        return _placed(program, DeviceData(graph, rows, tables)), program

    def data_of(self, program: StepProgram, data: DeviceData,
                dataset: GraphCollection) -> DeviceData:
        """`PredictsNewItems`: `dataset`'s graphs as the model trained on `data` reads
        them, in its dtypes; ValueError unless their node and edge columns are those it
        trained on, categorical ids within the vocabularies trained on (an id past its
        column's would read another column's embedding)."""
        if not isinstance(dataset, GraphCollection):
            raise ValueError(f"dataset must be a GraphCollection of the graphs to predict "
                             f"(zg.make_collection), got {type(dataset).__name__}")
        trained_edges = data.targets.edge_features
        _same_columns("node", data.features.shape[1], self.node_vocab, dataset.node_features,
                      dataset.node_vocab)
        if (trained_edges is None) != (dataset.edge_features is None):
            has = lambda e: "none" if e is None else f"{e.shape[1]} columns"
            raise ValueError(f"the model trained on edge features of {has(trained_edges)}; "
                             f"collection {dataset.name!r} has {has(dataset.edge_features)}")
        if trained_edges is not None:
            _same_columns("edge", trained_edges.shape[1], self.edge_vocab,
                          dataset.edge_features, dataset.edge_vocab)
        tables = graph_tables(dataset)
        if trained_edges is not None:
            tables = tables._replace(
                edge_features=tables.edge_features.astype(trained_edges.dtype))
        rows = np.asarray(dataset.node_features).astype(data.features.dtype, copy=False)
        graph = CSRGraph(np.zeros(dataset.num_nodes + 1, np.int32), np.zeros(0, np.int32))
        return _placed(program, DeviceData(graph, rows, tables))

    def sample_batch(self, program: StepProgram, data: DeviceData, perm, batch_index, epoch,
                     envelope: Envelope, active=None):
        """Packs the step's graphs at `envelope`: (TaskBatch, GraphBatch, dropout key)."""
        tables = data.targets
        n_node = tables.node_offsets[1:] - tables.node_offsets[:-1]
        items, valid = step_graphs(perm, batch_index, program.batch_size, self.window, n_node)
        if active is not None:
            valid = valid & active
        key, drop_key = step_keys(program.seed, epoch, batch_index)
        gb = pack_graphs(tables, items, valid, *self.capacities(envelope))
        batch = self.batch(data, items, valid, key, ItemLevel(items, valid))
        inputs = {"graph": gb, "edges": edge_rows(tables, gb)}
        return batch._replace(model_inputs=inputs), gb, drop_key

    def capacities(self, envelope: Envelope) -> tuple[int, int, int | None]:
        """`pack_graphs`' (node slots, edge slots, K or None) of an envelope."""
        nodes, edges = envelope.batch_size, envelope.capacities[0]
        if self.aggregation == "segment":
            return nodes, edges, None
        return nodes, edges, envelope.capacities[1] // nodes

    def _envelope(self, nodes: int, edges: int, width: int) -> Envelope:
        if self.aggregation == "segment":
            return Envelope(nodes, (edges,))
        return ell_envelope(nodes, edges, width)

    def choose_envelope(self, program: StepProgram, data: DeviceData,
                        dataset: GraphCollection, cfg):
        """The largest (node slots, edges) of every batch of the run's epochs (from
        the graphs' sizes, on the device, one read), times the margin (1.0 unless
        `cfg.margin` says otherwise: these counts are exact, not a sample), rounded to
        `min(cfg.multiple, GRAPH_MULTIPLE)`, and their largest degree as K (no margin:
        every node pays for a wider row in every layer); "conservative": the B largest
        graphs and the collection's largest degree."""
        margin = 1.0 if cfg.margin is None else cfg.margin
        policy = EnvelopePolicy(margin, min(cfg.multiple, GRAPH_MULTIPLE))
        b = program.batch_size
        if cfg.envelope == "conservative":
            top = lambda sizes: int(np.sort(sizes)[::-1][:b].sum())
            env = monotone(round_up(top(dataset.n_node) + 1, policy.multiple),
                           [top(dataset.n_edge)], policy.multiple)
            width = int(max_degrees(dataset).max(initial=0))
            return self._envelope(env.batch_size, env.capacities[0], width), None
        items = jnp.asarray(self.train_items(dataset), jnp.int32)
        # every device's batches: padded as training pads them (a size-balanced window
        # at the end of the epoch holds the padding of all devices' last batches)
        counts = [_epoch_counts(data.targets,
                                epoch_items(items, program.global_batch, program.seed, epoch),
                                batch_size=b, window=self.window)
                  for epoch in range(max(cfg.epochs, 1))]
        counts = np.concatenate(jax.device_get(counts))
        peak = counts.max(0)
        env = monotone(round_up(peak[0] * policy.margin, policy.multiple),
                       [peak[1] * policy.margin], policy.multiple)
        env = self._envelope(env.batch_size, env.capacities[0], int(peak[2]))
        return env, Calibration(env, tuple(int(c) for c in peak),
                                tuple(float(c) for c in counts.mean(0)), counts.shape[0])

    def grow_envelope(self, program: StepProgram, envelope: Envelope, counts,
                      policy: EnvelopePolicy, graph=None) -> Envelope:
        """The homogeneous rule (`envelope.grow`, rounding to at most GRAPH_MULTIPLE
        slots as calibration does) on the (node, edge) slots, left as they are when
        both fit; K becomes the batch's largest degree if that exceeds it. (A batch's
        slots are bounded by its graphs, not by the collection: `graph` is not read.)"""
        del graph
        nodes, edges, width = self.capacities(envelope)
        if counts[0] > nodes or counts[1] > edges:
            rounding = dataclasses.replace(policy, multiple=min(policy.multiple,
                                                                GRAPH_MULTIPLE))
            grown = grow(Envelope(nodes, (edges,)), counts[:2], rounding)
            nodes, edges = grown.batch_size, grown.capacities[0]
        return self._envelope(nodes, edges, max(width or 0, int(counts[2])))

    def envelope_from(self, program: StepProgram, saved: dict) -> Envelope:
        """The saved envelope; one saved without ELL slots gets the narrowest K (a
        batch with a larger degree grows it)."""
        nodes, caps = saved["batch_size"], tuple(saved["capacities"])
        if self.aggregation == "segment" or len(caps) > 1:
            return Envelope(nodes, caps[:1] if self.aggregation == "segment" else caps)
        return ell_envelope(nodes, caps[0], 1)

    @staticmethod
    def _slot_bytes(program: StepProgram) -> tuple[int, int, int]:
        """Bytes per node slot, edge slot and ELL slot: ids, masks, features and per-layer
        activations with their gradients, estimated from the model's `hidden` and
        `num_layers`."""
        model = program.model.model
        hidden = getattr(model, "hidden", None) or 0
        layers = getattr(model, "num_layers", None) or 1  # (an NNX model's wrapper: None)
        return 12 + 8 * 4 * hidden * layers, 16 + 8 * hidden * layers, 8  # 2 int32 lists

    def envelope_bytes(self, program: StepProgram, envelope: Envelope) -> int:
        per_node, per_edge, per_slot = self._slot_bytes(program)
        nodes, edges, width = self.capacities(envelope)
        return int(nodes * per_node + edges * per_edge + nodes * (width or 0) * per_slot)

    def memory_report(self, program: StepProgram, envelope: Envelope,
                      calibration: Calibration) -> dict:
        """`envelope_bytes` against the bytes of the largest batch seen."""
        per_node, per_edge, per_slot = self._slot_bytes(program)
        env = self.envelope_bytes(program, envelope)
        peak = calibration.max_counts
        ideal = peak[0] * per_node + peak[1] * per_edge
        if self.capacities(envelope)[2] is not None:
            ideal += peak[0] * peak[2] * per_slot
        return {"envelope_bytes": env, "ideal_bytes": int(ideal),
                "ratio": env / max(ideal, 1)}


@functools.partial(jax.jit, static_argnames=("batch_size", "window"))
def _epoch_counts(tables, perm, *, batch_size, window):
    return epoch_counts(tables, perm, batch_size, window)


# The built-in losses each kind of targets takes (its default first).
FITTING = {"binary": ("sigmoid",), "classes": ("cross_entropy",), "regression": ("mae", "mse")}


def graph_task(loss, kind: str, window: int = 0) -> GraphTask:
    """The graph task of targets of `kind`: `loss` None (the kind's default: sigmoid
    for binary, cross_entropy for classes, mae for regression), a built-in name, a
    per-row function, or a `GraphTask`."""
    if isinstance(loss, GraphTask):
        return loss
    if loss is None:
        loss = DEFAULT_LOSS[kind]
    if isinstance(loss, str):
        if loss not in LOSSES:
            raise ValueError(f"graph loss must be one of {', '.join(LOSSES)}, got {loss!r}")
        if loss not in FITTING[kind]:  # (sigmoid on regression trained to a loss < 0)
            raise ValueError(f"loss {loss!r} does not fit {kind} targets, whose loss is "
                             f"{' or '.join(map(repr, FITTING[kind]))}")
        return GraphTask(LOSSES[loss], SCORES[kind], kind, window)
    if callable(loss):
        return GraphTask(loss, SCORES[kind], kind, window)
    raise TypeError(f"loss must be a name ({', '.join(LOSSES)}), a per-row function or a "
                    f"GraphTask, got {type(loss).__name__}")


def _eval_capacities(task: GraphTask, dataset: GraphCollection, ids: np.ndarray,
                     batch_size: int, degrees: jax.Array):
    """Exact (node slots, edge slots, K) of the consecutive batches of `ids`, rounded;
    `degrees` the device tables' per-graph largest degree (`GraphTables.max_degree`)."""
    steps = num_steps(ids.size, batch_size)
    pad = np.zeros(steps * batch_size - ids.size, np.int64)
    n = np.concatenate([dataset.n_node[ids], pad]).reshape(steps, -1).sum(1).max() + 1
    e = np.concatenate([dataset.n_edge[ids], pad]).reshape(steps, -1).sum(1).max()
    width = None if task.aggregation == "segment" else \
        max(int(jnp.max(degrees[jnp.asarray(ids)])), 1)
    return round_up(int(n), GRAPH_MULTIPLE), round_up(max(int(e), 1), GRAPH_MULTIPLE), width


def _placed(program: StepProgram, data: DeviceData) -> DeviceData:
    """Host `data` on the program's device, or on every device of its mesh (each packs
    its own batches from the whole collection)."""
    if program.parallel is not None:
        return program.parallel.place_data(data)
    return DeviceData(data.graph.to_device(), jax.device_put(data.features),
                      jax.tree_util.tree_map(jax.device_put, data.targets))


def _same_columns(what: str, width: int, vocab: tuple[int, ...], table, given_vocab) -> None:
    """ValueError unless a new collection's `what` ("node", "edge") feature `table` has
    the `width` columns trained on, categorical (within `vocab`) where those were."""
    table = np.asarray(table)
    if table.shape[1] != width:
        raise ValueError(f"the model trained on {what} features of {width} columns; these "
                         f"have {table.shape[1]}")
    if bool(vocab) != bool(given_vocab):
        kind = lambda v: "categorical" if v else "float"
        raise ValueError(f"the model trained on {kind(vocab)} {what} features; these are "
                         f"{kind(given_vocab)}")
    if vocab and table.size:
        high = table.max(0)
        for col, (hi, v) in enumerate(zip(high, vocab)):
            if hi >= v:
                raise ValueError(f"{what} features column {col} holds {int(hi)}, outside "
                                 f"the vocabulary trained on [0, {v})")


def graph_outputs(program: StepProgram, variables, data: DeviceData, ids,
                  dataset: GraphCollection, *, batch_size: int,
                  bucketed: bool = False) -> np.ndarray:
    """float32[len(ids), out]: the model's output rows of graphs `ids` (evaluation mode),
    `batch_size` graphs per step at capacities that fit every batch exactly.

    `bucketed` (requests of varying graphs, `zg.predict`): a batch below `batch_size`
    (to a power of two), the steps and the capacities (`bucket`: under 25 % more) are
    rounded up to shared sizes, so that requests share a few programs (exact capacities
    change with the graphs picked: a new program for most requests)."""
    ids = np.asarray(ids, np.int64)
    if ids.size == 0:
        return np.zeros((0, dataset.output_dim), np.float32)
    items, batch = jnp.asarray(ids, jnp.int32), min(batch_size, ids.size)
    padded, batch_size = (serving_items(items, batch, batch_size) if bucketed
                          else (ordered_items(items, batch), batch))
    caps = _eval_capacities(program.task, dataset, ids, batch_size, data.targets.max_degree)
    if bucketed:
        caps = tuple(None if c is None else bucket(c) for c in caps)
    out = _eval_pass(program, variables, data, padded, caps=caps, batch_size=batch_size)
    return np.asarray(out, np.float32).reshape(padded.shape[0], -1)[:ids.size]


@jit_per_object(static_argnames=("caps", "batch_size"))
def _eval_pass(program: StepProgram, variables, data: DeviceData, padded, *, caps,
               batch_size: int):
    """float[steps, B, out]: one scan over the consecutive batches of `padded`."""
    tables = data.targets

    def step(_, s):
        items, valid = step_items(padded, s, batch_size)
        gb = pack_graphs(tables, items, valid, *caps)
        out, _ = program.apply_model(variables, data, gb, train=False,
                                     inputs={"graph": gb, "edges": edge_rows(tables, gb)})
        return None, out[:-1]

    steps = padded.shape[0] // batch_size
    return jax.lax.scan(step, None, jnp.arange(steps, dtype=jnp.int32))[1]
