"""Node classification on a typed graph: labels of one node type (`HeteroDataset`'s
target type), or its float targets (multi-label, regression: the node task's losses and
metrics), the other types as context, through the engines' one step body and scan.

It is a `BatchedTask` (base.py): a step samples a `TypedMiniBatch` around its seeds
(`sample_typed_step`, the keys of homogeneous steps), and hands the engine a
`TypedSample`, which reads as a one-level minibatch: its rows are the outermost level's
nodes of every type with features, as rows of one stacked table (`TypedInputs`), one id
array per type, so the step gathers each type's rows into a buffer of its own (the
model's matmuls read a type as wide as the table without a copy); counts are per
(level, type), flattened. The
featureless types' rows come from one stacked, learnable table (`TypedEmbedding`), which
the step gathers and trains by row-sparse lazy Adam as it does the homogeneous node
embedding; with `embedding_dim`, every type has rows there, after its features if it
has any. The model (`OnTypes` around a `HeteroGNN`) unpacks both by type and reads
the typed blocks. The envelope is a `TypedEnvelope`, calibrated by
`choose_typed_envelope` and grown after an overflow by `grow_typed`, as the homogeneous
one is (scan.py reruns the step). A graph of one type trains as the homogeneous node
task does (tests).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from zerognn_jax._src.data.hetero import HeteroGraph, named_relation, relation_name
from zerognn_jax._src.data.hetero_dataset import HeteroDataset
from zerognn_jax._src.data.loaders import load_hetero_dataset, row_normalize
from zerognn_jax._src.nn.hetero import OnTypes, make_hetero_model
from zerognn_jax._src.ops.registry import Kernels
from zerognn_jax._src.sampling.calibrate import Calibration
from zerognn_jax._src.sampling.minibatch import SamplerConfig
from zerognn_jax._src.sampling.steps import ItemLevel
from zerognn_jax._src.sampling.typed_calibrate import choose_typed_envelope
from zerognn_jax._src.sampling.typed_config import TypedSamplerConfig, seed_types
from zerognn_jax._src.sampling.typed_envelope import (
    TypedEnvelope,
    fit_typed_envelope,
    grow_typed,
)
from zerognn_jax._src.sampling.typed_minibatch import (
    TypedMiniBatch,
    prepare_typed_graph,
    sample_typed_step,
)
from zerognn_jax._src.training.embeddings import NodeEmbedding
from zerognn_jax._src.training.layout import typed_layout
from zerognn_jax._src.training.memory import (
    Resident,
    _gib,
    device_memory_limit,
    gathered_rows_bytes,
)
from zerognn_jax._src.training.parallel import make_mesh
from zerognn_jax._src.training.placement import (
    HEADROOM,
    Placement,
    add_drawn_counts,
    announce_placement,
    cache_budget,
    choose_placement,
    place_features,
    warn_unsplit,
    warn_unused_cache,
)
from zerognn_jax._src.training.program import (
    DeviceData,
    StepProgram,
    block_edge_rows,
    kept_replace,
)
from zerognn_jax._src.training.schedule import make_optimizer, step_size
from zerognn_jax._src.training.tasks.base import ItemsAreLevel0, Predictor, TaskBatch, data_log
from zerognn_jax._src.training.tasks.losses import class_accuracy, softmax_cross_entropy
from zerognn_jax._src.training.tasks.node import (
    METRICS,
    batch_weights,
    node_task,
    require_labels,
    split_metrics,
)
from zerognn_jax._src.training.tasks.typed_eval import split_logits, typed_logits

SPLITS = ("train", "val", "test")


class TypedSample(NamedTuple):
    """One typed step's sample, as the engines read a minibatch.

    Attributes:
      typed: the sampled `TypedMiniBatch`.
      rows: (int32[S_t], ...), the feature-table rows of the outermost level's nodes
        of each type with features (`TypedInputs.pack`); row_valid: (bool[S_t], ...).
      counts: int32[(L + 1) * T], real sizes per level, then per type of `types`.
      embedded: int32[E], the stacked embedding table's rows of the outermost level's
        nodes of the embedded types (`TypedInputs.pack_embedded`); embedded_valid:
        bool[E].
    """

    typed: TypedMiniBatch
    rows: tuple
    row_valid: tuple
    counts: jax.Array
    embedded: jax.Array
    embedded_valid: jax.Array

    @property
    def nodes(self) -> tuple:
        return (self.rows,)

    @property
    def valid(self) -> tuple:
        return (self.row_valid,)

    @property
    def blocks(self) -> tuple:
        return ()

    @property
    def overflow(self) -> jax.Array:
        return self.typed.overflow

    def num_edges(self) -> jax.Array:
        return self.typed.num_edges()


# Rows of one type converted to the table at a time (TypedInputs.table).
_TABLE_BLOCK = 1 << 20


@dataclasses.dataclass(frozen=True)
class TypedInputs:
    """Where the outermost level's input rows come from: `widths` ((type, d), ...) of
    the types with features, stacked in that order in the one device feature table at
    `offsets` (type, first row), zero-padded to the widest; `embedded` (type, N) the
    types with learnable rows (the featureless ones; every type, in the graph's order,
    with `embed_all`), whose tables are stacked in that order in the one embedding
    table at `embedded_offsets` (type, first row). A type in both reads its features,
    then its embedding row (`join_inputs`)."""

    widths: tuple
    offsets: tuple
    embedded: tuple
    embedded_offsets: tuple

    @classmethod
    def of(cls, dataset: HeteroDataset, *, embed_all: bool = False) -> TypedInputs:
        counts = dataset.num_nodes
        types = dataset.graph.node_types
        featured = [t for t in types if t in dataset.features]
        learned = [t for t in types if embed_all or t not in dataset.features]
        return cls(tuple((t, dataset.feature_dims[t]) for t in featured),
                   _offsets(featured, counts), tuple((t, counts[t]) for t in learned),
                   _offsets(learned, counts))

    def widest(self, dim: int) -> int:
        """The widest input row with `dim`-wide embedding rows: a type's features, then
        its embedding row if it has one."""
        embedded = {t for t, _ in self.embedded}
        return max([d + (dim if t in embedded else 0) for t, d in self.widths]
                   + [dim if embedded else 0])

    @property
    def embedded_rows(self) -> int:
        """Rows of the stacked embedding table: every embedded type's nodes."""
        return sum(n for _, n in self.embedded)

    def table_rows(self, num_nodes: dict) -> int:
        """Rows of the stacked feature table (`table`) of a graph of `num_nodes` {type:
        N_t}: every featured type's nodes (one row where no type has features)."""
        return sum(num_nodes[t] for t, _ in self.widths) if self.widths else 1

    def table(self, dataset: HeteroDataset, dtype, normalize: bool) -> np.ndarray:
        """[sum of N_t over featured types, max d]: the types' features, stacked, zero
        padded. Written into one array of `dtype` a block of rows at a time (float32 only
        for a block being normalised): IGBH-like's 35 GB in bfloat16 would otherwise
        pass through float32 copies several times its size."""
        width = max((d for _, d in self.widths), default=1)
        total = self.table_rows(dataset.num_nodes)
        out = np.zeros((total, width), np.dtype(dtype))
        for t, d in self.widths:
            rows, first = dataset.features[t], dict(self.offsets)[t]
            for start in range(0, rows.shape[0], _TABLE_BLOCK):
                block = np.asarray(rows[start:start + _TABLE_BLOCK])
                if normalize:
                    block = row_normalize(block, what=f"{t!r} features", first_row=start)
                out[first + start:first + start + block.shape[0], :d] = block.astype(
                    out.dtype, copy=False)
        return out

    def degrees(self, graph: HeteroGraph, sampled) -> np.ndarray:
        """int64[rows of `table`]: how often each featured node is drawn, as its edges
        estimate it: its uses as a source, summed over the relations `sampled` (a set)
        that a hop draws from. The host table's degree order and cache of hot rows
        follow it (`place_features`)."""
        counts, offsets = graph.num_nodes, dict(self.offsets)
        total = sum(counts[t] for t, _ in self.widths) if self.widths else 1
        out = np.zeros(total, np.int64)
        for rel, g in graph.items():
            src = rel[0]
            if src in offsets and rel in sampled:
                add_drawn_counts(out[offsets[src]:offsets[src] + counts[src]], g.indices)
        return out

    def pack(self, nodes: dict, valid: dict) -> tuple[tuple, tuple]:
        """((int32[S_t] feature-table rows, ...), (bool[S_t], ...)) of the featured
        types' ids in `nodes`, type by type; one invalid row if there are none."""
        present = [(t, off) for t, off in self.offsets if t in nodes]
        if not present:
            return (jnp.zeros((1,), jnp.int32),), (jnp.zeros((1,), bool),)
        return (tuple((off + nodes[t]).astype(jnp.int32) for t, off in present),
                tuple(valid[t] for t, _ in present))

    def pack_embedded(self, nodes: dict, valid: dict) -> tuple[jax.Array, jax.Array]:
        """(int32[E] embedding-table rows, bool[E]) of the embedded types' ids in
        `nodes`."""
        return _pack(self.embedded_offsets, nodes, valid)


def _offsets(types, counts: dict) -> tuple:
    """((type, first row), ...) of `types` stacked in order."""
    starts = np.cumsum([0] + [counts[t] for t in types])
    return tuple((t, int(s)) for t, s in zip(types, starts))


def _pack(offsets, nodes: dict, valid: dict) -> tuple[jax.Array, jax.Array]:
    """(int32[S] rows of a stacked table, bool[S]) of the ids in `nodes` of the types of
    `offsets` ((type, first row), ...), type after type; one invalid row if none."""
    ids = [off + nodes[t] for t, off in offsets if t in nodes]
    live = [valid[t] for t, _ in offsets if t in nodes]
    if not ids:
        return jnp.zeros((1,), jnp.int32), jnp.zeros((1,), bool)
    return jnp.concatenate(ids).astype(jnp.int32), jnp.concatenate(live)


@dataclasses.dataclass(frozen=True)
class TypedEmbedding(NodeEmbedding):
    """The embedded types' learnable rows (`TypedInputs.embedded`): one table per type,
    stacked into one float[sum of N_t, dim] table at `TypedInputs.embedded_offsets`, so
    the homogeneous node embedding's machinery (lazy Adam in the scan, applied only to
    kept steps, checkpoints, `restore`, and the row all-gather of data parallelism)
    serves it unchanged. A step reads the rows of its outermost level's embedded nodes
    (`TypedSample.embedded`) and hands the model (`OnTypes`) the pair (feature rows,
    embedding rows).

    Attributes:
      table_rows: the stacked table's rows (`TypedInputs.embedded_rows`). (`apart` plays
        no part: `join` always hands over the pair.)
    """

    table_rows: int = 0

    def num_rows(self, graph) -> int:
        del graph
        return max(1, self.table_rows)  # embedded types of no nodes: one row none reads

    def ids(self, mb: TypedSample) -> tuple[jax.Array, jax.Array]:
        return mb.embedded, mb.embedded_valid

    def join(self, x: tuple, embedded: jax.Array):
        return x, embedded.astype(x[0].dtype)


def relation_fanouts(cfg, graph: HeteroGraph) -> dict:
    """{relation: per-hop fanouts}: `cfg.fanouts` for every relation, replaced where
    `cfg.relation_fanouts` names one ("src__name__dst", or its name when unique)."""
    out, keys = {r: tuple(cfg.fanouts) for r in graph.relations}, {}
    for key, per_hop in (cfg.relation_fanouts or {}).items():
        relation = named_relation(graph.relations, key, "relation_fanouts key")
        if relation in keys:
            raise ValueError(f"relation_fanouts names {'__'.join(relation)} twice, as "
                             f"{keys[relation]!r} and {key!r}: keep one")
        keys[relation] = key
        if len(per_hop) != len(cfg.fanouts):
            raise ValueError(f"relation_fanouts[{key!r}] is {tuple(per_hop)}: one "
                             f"fanout per layer is needed, and the "
                             f"model has {len(cfg.fanouts)} "
                             f"layer{'s' if len(cfg.fanouts) != 1 else ''}")
        out[relation] = tuple(per_hop)
    return out


def typed_sampler(cfg, graph: HeteroGraph) -> TypedSamplerConfig:
    """The run `cfg`'s typed sampler (`relation_fanouts`, the layout `typed_layout`
    picks, the sampling method, edge ids where edge features are read), resolved
    against `graph`."""
    if not graph.relations:
        raise ValueError(f"the typed graph has no relations, so a relational model has no "
                         f"neighbours to sample (its node types: "
                         f"{', '.join(graph.node_types)}): give it at least one")
    layout = typed_layout(cfg)
    return TypedSamplerConfig(relation_fanouts(cfg, graph), replace=cfg.replace,
                              dedup=layout.dedup, flat_outer=layout.flat_outer,
                              method=cfg.sampler,
                              edge_ids=bool(cfg.edge_features)).resolve(graph)


def _same_edge_columns(rel, trained, other, name: str) -> None:
    """ValueError unless relation `rel` of dataset `name` has edge features (`other`)
    of the width the model read (`trained`, None where it read none)."""
    if trained is None:
        return
    if other is None or np.shape(other)[1] != trained.shape[1]:
        has = "none" if other is None else f"{np.shape(other)[1]} columns"
        raise ValueError(f"the model reads edge features of {trained.shape[1]} columns in "
                         f"relation {relation_name(rel)}; dataset {name!r} has {has}")


def _typed_placement(cfg, resident: Resident, limit: int | None,
                     whole_table: bool) -> Placement:
    """`choose_placement`'s, except that "auto" keeps the device for exact evaluation
    by a model that reads every row onto it (`whole_table`: one without
    `chunked_exact`, typed_eval.py)."""
    placement = choose_placement(cfg.feature_placement, resident, limit,
                                 sharded=cfg.shard_features)
    if placement.where == "device" or cfg.feature_placement != "auto" \
            or cfg.eval_mode != "full" or not whole_table:
        return placement
    return Placement("device", f"kept for exact evaluation, although {placement.reason}; "
                               f"eval_mode 'sampled' would put them on the host", True)


def _refuse(cfg) -> None:
    """Raises ValueError for an option typed training does not take."""
    if cfg.engine != "scan":
        raise ValueError(f"typed graphs train on the scan engine; got engine {cfg.engine!r}")


def _embedding_dim(cfg) -> int:
    """The learnable rows' width: `cfg.embedding_dim` where set (every type then has
    rows), else `cfg.hidden` (the featureless types' rows)."""
    return cfg.embedding_dim or cfg.hidden


def _edge_tables(graph: HeteroGraph, read: bool, dtype) -> HeteroGraph:
    """`graph` with its relations' edge-feature tables in `dtype` where the views `read`
    them, else without: a table nothing reads stays on the host (as the homogeneous
    run's does)."""
    graphs = tuple(g._replace(edge_features=None if not read or g.edge_features is None
                              else np.asarray(g.edge_features).astype(dtype, copy=False))
                   for g in graph.graphs)
    return dataclasses.replace(graph, graphs=graphs)


def _edge_dims(cfg, dataset: HeteroDataset, *, user_model: bool) -> dict:
    """{relation: D} of the relations whose views carry their edge features: with
    `cfg.edge_features`, every relation that has a table (none without). ValueError
    when none has one, or for a built-in model that reads none (rgat does)."""
    if not cfg.edge_features:
        return {}
    dims = {r: int(g.edge_features.shape[1]) for r, g in dataset.graph.items()
            if g.edge_features is not None}
    if not dims:
        raise ValueError(f"edge_features asks for edge features, and no relation of "
                         f"{dataset.name!r} has any")
    if not user_model and cfg.model != "rgat":
        raise ValueError(f"model {cfg.model!r} reads no edge features: drop edge_features "
                         f"(--edge-features), or train rgat, whose attention reads them")
    return dims


@dataclasses.dataclass(frozen=True, eq=False)
class TypedNodeTask(ItemsAreLevel0):
    """Classes (or float targets) of the target type's nodes (`Task` and `BatchedTask`).

    Attributes:
      sampler: the fanouts per relation, resolved against the graph.
      seed_type: the target type; types: every type of the outermost level (plan order).
      inputs: where the types' features lie (`TypedInputs`).
      loss, score, weight: per-row functions, as the node task's.
    """

    sampler: TypedSamplerConfig
    seed_type: str
    types: tuple
    inputs: TypedInputs
    loss: Callable = softmax_cross_entropy
    score: Callable | None = class_accuracy
    weight: Callable | None = None
    name = "node"
    score_name = "acc"
    dedups_seeds = False
    tree_by_default = False
    row_normalizes_planetoid = False

    @classmethod
    def build(cls, cfg, dataset, *, loss=None, kernels=None):
        """The typed node task of `cfg` on `dataset` (default: `cfg.dataset` loaded by
        `load_hetero_dataset`), a `HeteroDataset`."""
        del kernels
        _refuse(cfg)
        named = cfg.dataset if dataset is None else None  # (as the user named it)
        if dataset is None:
            dataset = load_hetero_dataset(cfg.dataset, cfg.root, scale=cfg.scale, seed=cfg.seed,
                                          log=data_log(cfg))
        if not isinstance(dataset, HeteroDataset):
            raise TypeError(f"typed node classification trains on a HeteroDataset, got "
                            f"{type(dataset).__name__}")
        require_labels(dataset, named)
        config = typed_sampler(cfg, dataset.graph)
        plan = config.plan(dataset.target_type)
        rows = node_task(loss, dataset)
        inputs = TypedInputs.of(dataset, embed_all=cfg.embedding_dim > 0)
        return cls(config, dataset.target_type, plan[-1].types, inputs, rows.loss,
                   rows.score, rows.weight), dataset

    def default_model(self, dataset: HeteroDataset) -> str:
        del dataset
        return "rsage"

    def output_dim(self, cfg, dataset: HeteroDataset) -> int:
        del cfg
        return dataset.output_dim

    def wrap_model(self, model, cfg, kernels=None):
        """`model` as the step runs it: `OnTypes` unpacks the rows by type."""
        kernels = Kernels.parse(cfg.kernels) if kernels is None else kernels
        return OnTypes(model, kernels, self.inputs.widths,
                       tuple(t for t, _ in self.inputs.embedded))

    def device_targets(self, dataset: HeteroDataset) -> np.ndarray:
        """int32[N_target] class ids (-1, unlabelled, as 0: never a training row), or the
        float targets float32[N_target, T]."""
        if dataset.targets is not None:
            return dataset.targets
        return np.maximum(dataset.labels, 0).astype(np.int32)

    def batch(self, data, items, valid, key, level) -> TaskBatch:
        del key
        targets = data.targets[items]
        return TaskBatch(targets, batch_weights(self, targets, valid), {}, level)

    def model_inputs(self, data: DeviceData, mb: TypedMiniBatch) -> dict:
        """What `OnTypes` reads besides the rows: the minibatch, and with edge ids
        (`edge_features`) per hop the sampled slots' rows of each relation's edge
        features, for the relations that have them."""
        if not self.sampler.edge_ids:
            return {"typed": mb}
        edges = tuple({r: block_edge_rows(data.graph[r].edge_features, b)
                       for r, b in hop.items() if data.graph[r].edge_features is not None}
                      for hop in mb.blocks)
        return {"typed": mb, "edges": edges}

    def restrict(self, mb, batch: TaskBatch):
        del batch
        return mb

    def metric_names(self, dataset: HeteroDataset) -> tuple[str, ...]:
        return METRICS[dataset.target_kind]

    def output_type(self, node_type: str | None) -> str:
        """`PredictsTypes`: the target type, the only one this task predicts."""
        if node_type not in (None, self.seed_type):
            raise ValueError(f"this run predicts the nodes of its target type "
                             f"{self.seed_type!r}; got node_type {node_type!r}")
        return self.seed_type

    def seed_capacities(self, batch_size: int):
        """Level 0's capacity for `batch_size` seeds, as the typed envelope records it
        (a link task's has one per end type)."""
        return batch_size

    def for_seeds(self, node_type: str) -> TypedNodeTask:
        """`PredictsTypes`: this task (its seeds are its target type's nodes)."""
        del node_type
        return self

    def outputs_of(self, predictor: Predictor, node_type: str, ids) -> jax.Array:
        """`PredictsTypes`: the logits of the target-type nodes `ids`, as evaluation
        computes them (`typed_logits`)."""
        del node_type
        return jnp.asarray(typed_logits(self, predictor, ids))

    def evaluate(self, predictor: Predictor, dataset: HeteroDataset) -> dict:
        """Every split's metrics (`metric_names`, as the node task's) from exact
        layer-wise outputs ("full") or sampled with the training fanouts,
        `predictor.batch_size` seeds per step, each split on its own (as the node
        task's, and as `zg.predict` gives a split's ids)."""
        parts = [np.asarray(getattr(dataset, f"{s}_idx")) for s in SPLITS]
        result = {}
        for split, ids, outputs in zip(SPLITS, parts, split_logits(self, predictor, parts)):
            metrics = split_metrics(outputs, dataset, ids, self)
            result.update({f"{split}_{name}": value for name, value in metrics.items()})
        return result

    # -- BatchedTask ---------------------------------------------------------------

    def sample_of(self, mb: TypedMiniBatch) -> TypedSample:
        """The engines' view of a typed minibatch (`TypedSample`)."""
        rows, live = self.inputs.pack(mb.nodes[-1], mb.valid[-1])
        embedded, embedded_live = self.inputs.pack_embedded(mb.nodes[-1], mb.valid[-1])
        zero = jnp.zeros(len(mb.nodes), jnp.int32)
        counts = jnp.stack([mb.counts.get(t, zero) for t in self.types], axis=1)
        return TypedSample(mb, rows, live, counts.reshape(-1), embedded, embedded_live)

    def prepare_run(self, cfg, dataset: HeteroDataset, *, model, tx, kernels):
        """Device data (the typed graph, the stacked feature table, the labels) and the
        step program of the built-in relational `cfg.model` or the user's `model`."""
        dtype = jnp.dtype(cfg.dtype)
        if model is None:  # (a model of another kind: refused by trainer.prepare)
            model = make_hetero_model(
                cfg.model, hidden=cfg.hidden, num_layers=cfg.layers,
                num_classes=self.output_dim(cfg, dataset),
                target_type=seed_types(self.seed_type)[0],
                relations=dataset.graph.relations, heads=cfg.heads, dropout=cfg.dropout,
                input_dropout=cfg.input_dropout, dtype=dtype,
                edge_dims=_edge_dims(cfg, dataset, user_model=False))
        else:
            _edge_dims(cfg, dataset, user_model=True)
        graph, table = self.device_inputs(dataset, dtype, bool(cfg.normalize_features))
        mesh = make_mesh(cfg.devices)
        warn_unsplit(cfg.shard_features, mesh.size)
        whole = not getattr(model, "chunked_exact", False)  # exact evaluation's reads
        table, placement = self._placed(cfg, graph, table, dtype, whole_table=whole)
        host = DeviceData(graph, table, self.device_targets(dataset))
        # The engines read the layout of the outermost level from the program's sampler
        # (`update_embedding`: are its rows distinct?), so the summary carries it.
        summary = SamplerConfig(tuple(cfg.fanouts), replace=cfg.replace, method=cfg.sampler,
                                dedup=self.sampler.dedup, flat_outer=self.sampler.flat_outer)
        rate = step_size(cfg, self, dataset)
        program = StepProgram(self.wrap_model(model, cfg, kernels),
                              tx or make_optimizer(cfg, rate), summary,
                              cfg.batch_size, cfg.seed, kernels, task=self,
                              layout=typed_layout(cfg), embedding=self.embedding(cfg, rate),
                              placement=placement)
        if mesh.size > 1 or cfg.shard_features:
            # every device holds the graph and samples its seeds; the stacked table is
            # whole on each, or split by rows across them (`shard_features`: a step
            # fetches its rows from their owners, `DataParallel.gather_rows`)
            program = program.with_mesh(mesh, shard_features=cfg.shard_features)
            return program.parallel.place_data(host), program
        # device_put, not jnp.asarray: that compiles a copy on the device (two tables)
        return jax.device_put(host), program

    def device_inputs(self, dataset: HeteroDataset, dtype, normalize: bool, *,
                      samples: bool = True) -> tuple[HeteroGraph, np.ndarray]:
        """(`dataset`'s graph as the step samples it (as exact inference reads it where
        it `samples` nothing: a weighted sampler's tables left unbuilt), with the
        edge-feature tables the model reads in `dtype`; the stacked feature table, rows
        divided by their sums where `normalize`), on the host."""
        weighed = samples or self.sampler.method != "weighted"
        graph = prepare_typed_graph(dataset.graph, self.sampler) if weighed else dataset.graph
        graph = _edge_tables(graph, self.sampler.edge_ids, dtype)
        return graph, self.inputs.table(dataset, dtype, normalize)

    def over(self, cfg, trained: HeteroGraph, dataset: HeteroDataset, *,
             samples: bool = True) -> TypedNodeTask:
        """`PredictsOtherGraphs`: this task over `dataset`, another typed graph (its
        labels and splits are not read), for the model of run `cfg` that trained on
        `trained`, to give rows that it `samples` (else exact ones): the fanouts
        resolved against its degrees, its feature rows stacked by its counts; the same
        object for the same graph shape.

        Raises:
          ValueError: `dataset` is no `HeteroDataset`; the run learned rows for nodes of
            its own graph (featureless types, `embedding_dim`); other node types or
            relations (or the same in another order), another target type, other
            feature widths, no edge features of the width the model reads, or no edge
            weights of a relation a weighted sampler draws from, for sampled rows.
        """
        if not isinstance(dataset, HeteroDataset):
            raise ValueError(f"dataset must be a HeteroDataset of the typed graph to predict "
                             f"(zg.make_hetero_dataset; its labels and splits are not "
                             f"read), got {type(dataset).__name__}")
        if self.inputs.embedded:
            learned = ", ".join(repr(t) for t, _ in self.inputs.embedded)
            raise ValueError(f"the run learned a row per node of its own graph for type(s) "
                             f"{learned} (featureless, or embedding_dim), which the nodes of "
                             f"dataset {dataset.name!r} lack: a run whose every type has "
                             f"features and no embedding_dim predicts other graphs")
        for what, have, got in (
                ("node types", trained.node_types, dataset.graph.node_types),
                ("relations", tuple(map(relation_name, trained.relations)),
                 tuple(map(relation_name, dataset.graph.relations)))):
            if have != got:
                raise ValueError(f"the model trained on the {what} {', '.join(have)}; "
                                 f"dataset {dataset.name!r} has {', '.join(got)} (the same, "
                                 f"in the same order, are needed)")
        self._check_target(dataset)
        inputs = TypedInputs.of(dataset)
        if inputs.widths != self.inputs.widths:
            has = lambda widths: ", ".join(f"{t!r} {d}" for t, d in widths)
            raise ValueError(f"the model trained on feature columns {has(self.inputs.widths)}"
                             f"; dataset {dataset.name!r} has {has(inputs.widths) or 'none'}")
        if self.sampler.edge_ids:
            for rel, g in trained.items():
                _same_edge_columns(rel, g.edge_features, dataset.graph[rel].edge_features,
                                   dataset.name)
        sampler = typed_sampler(cfg, dataset.graph)
        if samples and sampler.method == "weighted":
            for rel, g in dataset.graph.items():
                drawn = any(sampler.fanout(rel, h) for h in range(sampler.num_hops))
                if drawn and g.weights is None:
                    raise ValueError(f"the run samples neighbours by edge weight (sampler "
                                     f"'weighted'), and relation {relation_name(rel)} of "
                                     f"dataset {dataset.name!r} has no weights: give it "
                                     f"weights, or predict exactly (mode='full')")
        return kept_replace(self, sampler=sampler, inputs=inputs)

    def _check_target(self, dataset: HeteroDataset) -> None:
        """ValueError unless `dataset`'s target type is the type this run predicts (the
        type its split ids, which `--nodes test` names, are of)."""
        if dataset.target_type != self.seed_type:
            raise ValueError(f"the run predicts {self.seed_type!r} nodes; dataset "
                             f"{dataset.name!r} has target type {dataset.target_type!r}, "
                             f"which its split ids are of")

    def _placed(self, cfg, graph, table: np.ndarray, dtype, *, whole_table: bool = True):
        """(the stacked feature table where `cfg.feature_placement` puts it, its
        `Placement`): as is (the device), or a `HostTable` over it in the row order
        `cfg.host_row_order` gives (by `TypedInputs.degrees` or as stored), whose hottest
        rows a device cache holds (on every device of a mesh: `place_features`). "auto"
        weighs graph, table and the embedded types' tables with their moments against
        the device's memory (and says what it chose, with progress on). Where exact
        evaluation reads the whole table onto the device (`whole_table`: a model without
        `chunked_exact`), "auto" keeps the device (`_typed_placement`), and asked for the
        host the default cache leaves the table room beside graph and model, and a table
        that cannot fit beside them at all stops the run here, before training
        (ValueError); a model that takes chunks reads a table too large for the device
        chunk by chunk instead."""
        arrays = jax.tree_util.tree_leaves(graph)
        embedded = self.inputs.embedded_rows * _embedding_dim(cfg) * (dtype.itemsize + 8)
        resident = Resident(sum(int(a.nbytes) for a in arrays), table.nbytes, embedded,
                            dtype.name, 1)
        limit = device_memory_limit()
        placement = _typed_placement(cfg, resident, limit, whole_table)
        warn_unused_cache(cfg.feature_cache_gib, placement, cfg.host_row_order,
                          cfg.read_ahead_gib)
        announce = cfg.progress and jax.process_index() == 0
        if placement.where == "device":
            if announce:
                announce_placement(placement, table.nbytes)
            return table, placement
        exact = cfg.eval_mode == "full" and whole_table
        cache = cache_budget(cfg.feature_cache_gib, placement, resident, limit)
        if exact and limit is not None:
            if resident.total > limit:
                raise ValueError(
                    f"exact evaluation of a typed graph reads every feature row onto the "
                    f"device, and graph, features and model ({_gib(resident.total)}) exceed "
                    f"its {_gib(limit)}: set eval_mode 'sampled' or 'none'")
            if cfg.feature_cache_gib is None:  # the default cache leaves the table room
                cache = min(cache, max(0, int((1 - HEADROOM) * limit) - resident.total))
        sampled = {r for hop in self.sampler.plan(self.seed_type) for r in hop.relations}
        return place_features(table, dtype, placement, announce=announce, cache_bytes=cache,
                              degree=self.inputs.degrees(graph, sampled),
                              row_order=cfg.host_row_order), placement

    def embedding(self, cfg, rate) -> TypedEmbedding | None:
        """The embedded types' tables (`_embedding_dim` wide), trained by lazy Adam at
        `rate` (the run's `schedule.step_size`) (None when every type has features and
        `cfg.embedding_dim` is 0)."""
        if not self.inputs.embedded:
            return None
        return TypedEmbedding(_embedding_dim(cfg), rate, cfg.dtype,
                              table_rows=self.inputs.embedded_rows)

    def sample_batch(self, program: StepProgram, data: DeviceData, perm, batch_index, epoch,
                     envelope: TypedEnvelope, active=None):
        """(TaskBatch, TypedSample, dropout key) of batch `batch_index` at `envelope`."""
        st = sample_typed_step(data.graph, perm, batch_index, seed=program.seed, epoch=epoch,
                               batch_size=program.batch_size, config=self.sampler,
                               envelope=envelope, kernels=program.kernels, active=active)
        batch = self.batch(data, st.items, st.valid, st.key, ItemLevel(st.items, st.valid))
        return (batch._replace(model_inputs=self.model_inputs(data, st.mb)),
                self.sample_of(st.mb), st.drop_key)

    def choose_envelope(self, program: StepProgram, data: DeviceData,
                        dataset: HeteroDataset, cfg):
        """The typed envelope (`choose_typed_envelope`), its calibration flattened as
        the step's counts are."""
        return self._chosen_envelope(program, data, dataset.train_idx, cfg)

    def _chosen_envelope(self, program: StepProgram, data: DeviceData, items, cfg,
                         seeds=None):
        """`choose_envelope` over the training `items` (`seeds`: as
        `choose_typed_envelope` takes it)."""
        env, cal = choose_typed_envelope(data.graph, items, program.batch_size,
                                         self.sampler, seed_type=self.seed_type,
                                         method=cfg.envelope, seed=cfg.seed,
                                         policy=cfg.envelope_policy, kernels=program.kernels,
                                         seeds=seeds)
        if cal is None:
            return env, None
        flat = lambda per_type: tuple(
            per_type[t][lvl] if t in per_type else 0
            for lvl in range(env.num_hops + 1) for t in self.types)
        return env, Calibration(env, flat(cal.max_counts), flat(cal.mean_counts), cal.steps)

    def grow_envelope(self, program: StepProgram, envelope: TypedEnvelope, counts,
                      policy, graph: HeteroGraph | None = None) -> TypedEnvelope:
        """`grow_typed` after a step that overflowed with these flattened counts, no
        level of a type above `graph`'s count of that type."""
        per_level = np.asarray(counts).reshape(envelope.num_hops + 1, len(self.types))
        by_type = {t: per_level[:, j] for j, t in enumerate(self.types)}
        return fit_typed_envelope(self.sampler, grow_typed(
            envelope, self.sampler, by_type, policy,
            num_nodes=None if graph is None else graph.num_nodes))

    def envelope_from(self, program: StepProgram, saved: dict) -> TypedEnvelope:
        """The envelope a checkpoint recorded ({"batch_size", "capacities"})."""
        caps = tuple(tuple((t, int(c)) for t, c in level) for level in saved["capacities"])
        return fit_typed_envelope(self.sampler, TypedEnvelope(self.seed_type,
                                                              saved["batch_size"], caps))

    def _row_bytes(self, program: StepProgram, levels) -> list[int]:
        """Bytes of a row at each level: ids, mask, a row of activations and its gradient
        at the model's `hidden` width (the widest input row at the outermost level: a
        type's features, then its embedding row if it has one)."""
        hidden = getattr(program.model.model, "hidden", 0)
        dim = program.embedding.dim if program.embedding is not None else 0
        width = max(self.inputs.widest(dim), hidden)
        return [5 + 8 * (width if lvl == len(levels) - 1 else hidden)
                for lvl in range(len(levels))]

    def _level_bytes(self, program: StepProgram, envelope: TypedEnvelope) -> int:
        per_row = self._row_bytes(program, envelope.levels)
        return int(sum(caps.get(t, 0) * b for caps, b in zip(envelope.levels, per_row)
                       for t in self.types))

    def feature_rows(self, envelope: TypedEnvelope) -> int:
        """The feature-table rows a step reads at `envelope`: its outermost level's
        nodes of the types with features."""
        return sum(envelope.levels[-1].get(t, 0) for t, _ in self.inputs.widths)

    def envelope_bytes(self, program: StepProgram, envelope: TypedEnvelope) -> int:
        """A step's buffer bytes: its levels' rows and, on several devices, the
        embedded types' rows every device gathers (`gathered_rows_bytes`)."""
        step = self._level_bytes(program, envelope)
        emb = program.embedding
        if emb is not None:
            rows = sum(envelope.levels[-1].get(t, 0) for t, _ in self.inputs.embedded)
            step += gathered_rows_bytes(rows, emb.dim, emb.dtype, program.num_shards)
        return step

    def memory_report(self, program: StepProgram, envelope: TypedEnvelope,
                      calibration: Calibration) -> dict:
        """The levels' bytes (`envelope_bytes` without the rows devices gather) against
        the bytes at the largest counts calibration saw."""
        levels = envelope.levels
        per_row = self._row_bytes(program, levels)
        seen = np.asarray(calibration.max_counts).reshape(len(levels), len(self.types))
        env = self._level_bytes(program, envelope)
        ideal = sum(int(seen[lvl, j]) * per_row[lvl] for lvl in range(len(levels))
                    for j in range(len(self.types)))
        return {"envelope_bytes": env, "ideal_bytes": int(ideal),
                "ratio": env / max(ideal, 1)}
