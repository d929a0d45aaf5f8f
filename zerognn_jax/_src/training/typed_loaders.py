"""Data loaders over the typed device sampler, for users who write their own training
loop on a graph with node and edge types (PyG's hetero `NeighborLoader` with
`input_nodes=(type, ids)` and hetero `LinkNeighborLoader`, DGL's `DataLoader` over a
heterograph).

`HeteroNeighborLoader` yields one sampled typed subgraph per batch of seed nodes of one
type: the `TypedMiniBatch`, each featured type's input rows and the seeds' targets;
`HeteroLinkNeighborLoader` one per batch of positive pairs of a relation, with
negatives drawn on the device, the subgraph around every end and the batch's own pairs
hidden from it. Both fetch on the device at static shapes (the typed envelope, per
(level, type)), so a jitted step compiles once, and sample what `zg.train`'s typed node
and link tasks sample. As `NeighborLoader` (loaders.py), whose machinery they share:
`sample_ahead` batches are sampled by one call whose one flag the host reads, and
batches that overflowed their envelope are sampled again, with the same randomness,
after the envelope grows (`grow_typed`).

A batch hands a relational model (`HeteroGNN`'s interface: `model(x, layers, train=)`
with `x` {type: rows} and one `TypedLayer` per layer; `model.encode` for every level-0
type's rows) its inputs: `batch.x` and `batch.layers()`. A type without features gets
no rows in `batch.x`: give it rows of your own (an embedding of
`batch.input_nodes[type]`).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from zerognn_jax._src.data.checks import at_least_one, check_ids, require_ids
from zerognn_jax._src.data.hetero import HeteroGraph, named_relation
from zerognn_jax._src.data.hetero_links import TypedLinkSplit
from zerognn_jax._src.data.links import EvalEdges, transposed_hint
from zerognn_jax._src.nn.hetero import TypedLayer, typed_layers
from zerognn_jax._src.ops.gather import gather_rows
from zerognn_jax._src.ops.host_rows import is_host_resident
from zerognn_jax._src.ops.registry import XLA, Kernels
from zerognn_jax._src.sampling.envelope import DEFAULT_POLICY, EnvelopePolicy
from zerognn_jax._src.sampling.negatives import check_frontier
from zerognn_jax._src.sampling.typed_calibrate import choose_typed_envelope
from zerognn_jax._src.sampling.typed_config import TypedSamplerConfig
from zerognn_jax._src.sampling.typed_envelope import (
    TypedEnvelope,
    fit_typed_envelope,
    grow_typed,
    seed_level,
)
from zerognn_jax._src.sampling.typed_minibatch import (
    TypedMiniBatch,
    host_counts,
    prepare_typed_graph,
    sample_typed_step,
)
from zerognn_jax._src.training.loaders import (
    SAMPLE_AHEAD,
    DeviceLoader,
    as_kernels,
    require_graph,
)
from zerognn_jax._src.training.tasks.typed_link import TypedLinkTask
from zerognn_jax._src.training.tasks.typed_node import TypedInputs


@functools.partial(jax.tree_util.register_dataclass,
                   data_fields=["minibatch", "dropout_key", "epoch", "step", "x", "y"],
                   meta_fields=["kernels"])
@dataclasses.dataclass(frozen=True)
class HeteroLoaderBatch:
    """One batch of a `HeteroNeighborLoader`.

    Attributes:
      minibatch: the sampled typed subgraph, hops from the seeds (`TypedMiniBatch`:
        `nodes[0][seed type]` are the seeds, padding rows hold id 0, `valid[0]` marks
        the real ones).
      dropout_key: a `jax.random` key for this batch, for the model's dropout.
      epoch, step: where the batch sits.
      x: {type: float[C_t, d_t]}, the features of the outermost level's nodes of each
        type the loader has features for (zero on padding rows).
      y: the seeds' rows of the loader's `targets` ([S, ...]), or None.
      kernels: the loader's (static), which `layers()` gives the views.
    """

    minibatch: TypedMiniBatch
    dropout_key: jax.Array
    epoch: Any
    step: Any
    x: dict
    y: Any = None
    kernels: Kernels = XLA

    @property
    def seeds(self) -> jax.Array:
        """int32[S]: the seed nodes' ids (padding rows hold 0)."""
        (ids,) = self.minibatch.nodes[0].values()
        return ids

    @property
    def seed_mask(self) -> jax.Array:
        """bool[S]: the real seeds."""
        (mask,) = self.minibatch.valid[0].values()
        return mask

    @property
    def input_nodes(self) -> dict:
        """{type: int32[C_t]}: the outermost level's node ids, whose rows `x` holds."""
        return self.minibatch.nodes[-1]

    def layers(self, kernels: Kernels | None = None) -> tuple[TypedLayer, ...]:
        """One `TypedLayer` per layer, outermost hop first (`layers()[i]` feeds layer
        i), whose views aggregate with `kernels` (default: the loader's)."""
        return typed_layers(self.minibatch, self.kernels if kernels is None else kernels)


@functools.partial(jax.tree_util.register_dataclass,
                   data_fields=["minibatch", "pairs", "edges", "labels", "weight",
                                "dropout_key", "epoch", "step", "x"],
                   meta_fields=["kernels"])
@dataclasses.dataclass(frozen=True)
class HeteroLinkLoaderBatch:
    """One batch of a `HeteroLinkNeighborLoader`: B positive pairs, K negatives each.

    Attributes:
      minibatch: the typed subgraph around level 0, the deduplicated ends of the
        batch's pairs (one frontier per end type), the batch's positives hidden from
        the relation and its reverse when the loader excludes them.
      pairs: int32[P, 2], P = B (1 + K): each pair's positions among level 0's rows of
        the source and destination types (score `h[src][pairs[:, 0]]` against
        `h[dst][pairs[:, 1]]`); positives first, then negative j of positive i at row
        B + i K + j.
      edges: int32[P, 2], the same pairs as ids of the two end types.
      labels: float32[P], 1 for positives, 0 for negatives. weight: float32[P], 1 per
        real positive, 1/K per real negative, 0 for padding: weigh the loss by it.
      dropout_key, epoch, step, x, kernels: as in `HeteroLoaderBatch`.
    """

    minibatch: TypedMiniBatch
    pairs: jax.Array
    edges: jax.Array
    labels: jax.Array
    weight: jax.Array
    dropout_key: jax.Array
    epoch: Any
    step: Any
    x: dict
    kernels: Kernels = XLA

    @property
    def input_nodes(self) -> dict:
        """{type: int32[C_t]}: the outermost level's node ids, whose rows `x` holds."""
        return self.minibatch.nodes[-1]

    def layers(self, kernels: Kernels | None = None) -> tuple[TypedLayer, ...]:
        """As `HeteroLoaderBatch.layers`."""
        return typed_layers(self.minibatch, self.kernels if kernels is None else kernels)


class _TypedLoader(DeviceLoader):
    """What the typed loaders share: the resolved sampler, the device graph and feature
    tables, the typed envelope and its growth."""

    def _setup_typed(self, graph: HeteroGraph, items: np.ndarray, seed_type, *, fanouts,
                     batch_size: int, key, sampler: str, replace: bool, dedup: bool,
                     shuffle: bool, drop_last: bool, features, envelope, policy,
                     kernels: Kernels, sample_ahead: int, seeds=None):
        self._start(items, batch_size=batch_size, key=key, shuffle=shuffle,
                    drop_last=drop_last, policy=policy, kernels=kernels,
                    sample_ahead=sample_ahead)
        config = TypedSamplerConfig(fanouts, replace=replace, dedup=dedup,
                                    method=sampler).resolve(graph)
        self.sampler = config
        unread = dataclasses.replace(graph, graphs=tuple(g._replace(edge_features=None)
                                                        for g in graph.graphs))
        self.graph = prepare_typed_graph(unread, config).to_device()  # no edge tables
        self.features = _device_tables(graph, features)
        if isinstance(envelope, str):
            envelope, _ = choose_typed_envelope(self.graph, self.items, batch_size, config,
                                                seed_type=seed_type, method=envelope,
                                                seed=self.seed, policy=policy,
                                                kernels=kernels, seeds=seeds)
        _check_envelope(config, envelope, seed_type,
                        batch_size if seeds is None else seeds[0])
        self.envelope = fit_typed_envelope(config, envelope)
        self._built()

    def _grown(self, counts: dict) -> TypedEnvelope:
        """The envelope after a sample with `counts` ({type: per-level counts})
        overflowed it, no level of a type above the type's node count."""
        return fit_typed_envelope(self.sampler, grow_typed(
            self.envelope, self.sampler, host_counts(counts), self.policy,
            num_nodes=self.graph.num_nodes))

    def _rows(self, mb: TypedMiniBatch, features: dict) -> dict:
        """{type: float[C_t, d_t]}: the outermost level's feature rows of the types
        `features` has (zero on padding rows)."""
        return {t: gather_rows(self.kernels, table, mb.nodes[-1][t], mb.valid[-1][t])
                for t, table in features.items() if t in mb.nodes[-1]}


class HeteroNeighborLoader(_TypedLoader):
    """Sampled typed mini-batches around seed nodes of one type, on the device (module
    docstring; docs/loader.md).

    Args:
      graph: a HeteroGraph (host or device arrays); with `sampler="weighted"` the
        sampled relations need edge weights.
      nodes: (type, int[M] ids), the seed nodes (e.g. ("paper", train ids)).
      fanouts: neighbours per hop, seeds' hop first: one tuple for every relation, a
        dict {relation or its (src, name, dst): per-hop tuple}, or one dict per hop
        (DGL's dicts in reverse: DGL lists the input layer first); 0 skips a relation
        at a hop, -1 takes every neighbour (docs/hetero.md, "Fanouts, and how they
        count").
      batch_size, key, shuffle, drop_last, envelope, policy, kernels, sample_ahead: as
        in `NeighborLoader`; `envelope` may also be a `TypedEnvelope`.
      sampler, replace, dedup: as in `NeighborLoader`, for every relation (dedup False:
        tree mode, exact sizes).
      features: {type: float[N_t, d_t]} (NumPy or device arrays, or `zg.HostTable`s
        left in host memory), gathered for each batch's input nodes of that type onto
        the device (`batch.x`); types left out get no rows.
      targets: [N_seed type, ...] (or a pytree of such), the seeds' rows (`batch.y`).
    """

    def __init__(self, graph: HeteroGraph, nodes, *, fanouts, batch_size: int, key,
                 sampler: str = "uniform", replace: bool = False, dedup: bool = True,
                 shuffle: bool = True, drop_last: bool = False, features=None,
                 targets=None, envelope: TypedEnvelope | str = "calibrate",
                 policy: EnvelopePolicy = DEFAULT_POLICY, kernels: Kernels | str = "auto",
                 sample_ahead: int = SAMPLE_AHEAD):
        require_graph("HeteroNeighborLoader", graph, HeteroGraph)
        self.seed_type, ids = _seed_nodes(graph, nodes)
        self.targets = _device_targets(graph, self.seed_type, targets)
        self._setup_typed(graph, ids, self.seed_type, fanouts=fanouts, batch_size=batch_size,
                          key=key, sampler=sampler, replace=replace, dedup=dedup,
                          shuffle=shuffle, drop_last=drop_last, features=features,
                          envelope=envelope, policy=policy, kernels=as_kernels(kernels),
                          sample_ahead=sample_ahead)

    def _sample(self, graph, order, epoch, step, envelope):
        return sample_typed_step(graph, order, step, seed=self.seed, epoch=epoch,
                                 batch_size=self.batch_size, config=self.sampler,
                                 envelope=envelope, kernels=self.kernels)

    def _assemble(self, out, epoch, step, tables) -> HeteroLoaderBatch:
        features, targets = tables
        mb = out.mb
        y = None if targets is None else jax.tree_util.tree_map(
            lambda a: a[mb.nodes[0][self.seed_type]], targets)
        return HeteroLoaderBatch(mb, out.drop_key, epoch, step, self._rows(mb, features), y,
                                 self.kernels)


class HeteroLinkNeighborLoader(_TypedLoader):
    """Batches of positive pairs of one relation, negatives drawn on the device and the
    typed subgraph sampled around every end (PyG's hetero `LinkNeighborLoader`; module
    docstring; docs/loader.md).

    Args:
      graph: the message-passing HeteroGraph (for link prediction without leakage, the
        training pairs only: e.g. `zg.typed_link_split(graph, relation).graph`).
      relation: the relation whose pairs the batches hold: (src, name, dst), or its
        name ("src__name__dst", or the name alone where unique).
      edges: int[E, 2], the positive (source id, destination id) pairs, ids of the
        relation's two end types; each epoch cuts them into batches of `batch_size`.
      num_negatives, negative_mode, exclude_seed_edges: as in `LinkNeighborLoader`
        (negatives of the destination type; "pairs" draws sources of the source type);
        the batch's positives are hidden from the relation and its reverse.
      features: {type: float[N_t, d_t]}, as in `HeteroNeighborLoader`.
      fanouts, batch_size, key, sampler, replace, dedup, shuffle, drop_last, envelope,
      policy, kernels, sample_ahead: as in `HeteroNeighborLoader`. Level 0 holds the most
      distinct ends a batch can have, so it never overflows; the levels after it are
      calibrated.
    """

    def __init__(self, graph: HeteroGraph, relation, edges, *, fanouts, batch_size: int,
                 key, num_negatives: int = 1, negative_mode: str = "destination",
                 exclude_seed_edges: bool = True, sampler: str = "uniform",
                 replace: bool = False, dedup: bool = True, shuffle: bool = True,
                 drop_last: bool = False, features=None,
                 envelope: TypedEnvelope | str = "calibrate",
                 policy: EnvelopePolicy = DEFAULT_POLICY, kernels: Kernels | str = "auto",
                 sample_ahead: int = SAMPLE_AHEAD):
        require_graph("HeteroLinkNeighborLoader", graph, HeteroGraph)
        kernels = as_kernels(kernels)
        if not isinstance(relation, str | tuple | list):  # PyG takes the pairs first
            raise ValueError(f"relation must be a (src, name, dst) triple or a relation's "
                             f"name, got {type(relation).__name__}: the arguments are "
                             f"(graph, relation, edges)")
        relation = (tuple(relation) if isinstance(relation, tuple | list)
                    else named_relation(graph.relations, relation, "relation"))
        if relation not in graph.relations:
            raise ValueError(f"relation {relation} is not a relation of the graph")
        edges = _pairs(graph, relation, edges)
        none = EvalEdges(np.zeros((0, 2), np.int32), np.zeros((0, 2), np.int32),
                         np.zeros((0, 0), np.int32))
        split = TypedLinkSplit(relation, edges, graph, none, none)
        src, dst = split.ends
        seed_type = src if src == dst else (src, dst)
        config = TypedSamplerConfig(fanouts, replace=replace, dedup=dedup, method=sampler)
        self._task = TypedLinkTask(config.resolve(graph), seed_type, (),
                                   TypedInputs((), (), (), ()), split=split,
                                   num_negatives=num_negatives, mode=negative_mode,
                                   exclude_seed_edges=exclude_seed_edges)
        check_frontier(at_least_one(batch_size, "batch_size"), num_negatives, negative_mode)
        self._setup_typed(graph, edges, seed_type, fanouts=fanouts, batch_size=batch_size,
                          key=key, sampler=sampler, replace=replace, dedup=dedup,
                          shuffle=shuffle, drop_last=drop_last, features=features,
                          envelope=envelope, policy=policy, kernels=kernels,
                          sample_ahead=sample_ahead,
                          seeds=self._task.level0_source(batch_size, kernels))
        self.targets = None

    def _sample(self, graph, order, epoch, step, envelope):
        return self._task.sample_pairs(graph, order, step, seed=self.seed, epoch=epoch,
                                       batch_size=self.batch_size, envelope=envelope,
                                       kernels=self.kernels)

    def _assemble(self, out, epoch, step, tables) -> HeteroLinkLoaderBatch:
        features, _ = tables
        src, dst = self._task.split.ends
        level0 = out.mb.nodes[0]
        edges = jnp.stack([level0[src][out.pairs[:, 0]], level0[dst][out.pairs[:, 1]]], 1)
        return HeteroLinkLoaderBatch(out.mb, out.pairs, edges, out.labels, out.weight,
                                     out.drop_key, epoch, step, self._rows(out.mb, features),
                                     self.kernels)


def _seed_nodes(graph: HeteroGraph, nodes) -> tuple[str, np.ndarray]:
    """(type, int[M] ids) from `nodes`, checked against the graph."""
    if not (isinstance(nodes, tuple) and len(nodes) == 2 and isinstance(nodes[0], str)):
        raise ValueError(f"nodes must be a pair (node type, ids), e.g. ('paper', ids); got "
                         f"{type(nodes).__name__}")
    seed_type, ids = nodes[0], np.asarray(nodes[1])
    counts = graph.num_nodes
    if seed_type not in counts:
        raise ValueError(f"nodes' type {seed_type!r} is not a node type of the graph "
                         f"({', '.join(counts)})")
    require_ids("nodes' ids", ids, nonempty=True)
    check_ids("nodes' ids", ids, counts[seed_type], f" ({seed_type!r} ids)")
    return seed_type, ids


def _pairs(graph: HeteroGraph, relation, edges) -> np.ndarray:
    """int32[E, 2] from `edges`, checked: a non-empty integer [E, 2] array whose columns
    are ids of the relation's source and destination types."""
    edges = np.asarray(edges)
    if (edges.ndim != 2 or edges.shape[1] != 2 or not edges.shape[0]
            or not np.issubdtype(edges.dtype, np.integer)):
        raise ValueError(f"edges must be a non-empty integer [E, 2] array, got "
                         f"{edges.dtype}{list(edges.shape)}{transposed_hint(edges)}")
    counts = graph.num_nodes
    for col, (end, t) in enumerate((("source", relation[0]), ("destination", relation[2]))):
        check_ids(f"edges' {end} ids", edges[:, col], counts[t], f" ({t!r} ids)")
    return edges.astype(np.int32)


def _check_envelope(config: TypedSamplerConfig, envelope: TypedEnvelope, seed_type,
                    level0) -> None:
    """ValueError, in one line, unless `envelope` is one for this loader: its seed types,
    level 0 capacities, hops and each level's types."""
    want = [dict(seed_level(seed_type, level0))] + [set(step.types)
                                                    for step in config.plan(seed_type)]
    got = [envelope.level(0)] + [set(dict(level)) for level in envelope.capacities]
    if envelope.seed_type != seed_type or got[0] != want[0]:
        raise ValueError(f"the envelope is for seeds {envelope.seed_type!r} with level-0 "
                         f"capacity {envelope.batch_size}; the loader's are {seed_type!r} "
                         f"with {level0}")
    if [sorted(g) for g in got[1:]] != [sorted(w) for w in want[1:]]:
        raise ValueError(f"the envelope's levels hold types {[sorted(g) for g in got[1:]]}; "
                         f"the fanouts sample {[sorted(w) for w in want[1:]]}")


def _device_tables(graph: HeteroGraph, features) -> dict:
    """{type: float[N_t, d_t]} from `features`, each checked: a type of the graph, one
    2-D row per node; on the device, but for tables left in host memory (`HostTable`,
    `CachedTable`), which the batches read as `zg.train` reads them."""
    if features is not None and not isinstance(features, Mapping):
        raise ValueError(f"features must be a dict {{node type: float[N_t, d]}}, got "
                         f"{type(features).__name__}")
    out, counts = {}, graph.num_nodes
    for t, table in (features or {}).items():
        if t not in counts:
            raise ValueError(f"features has type {t!r}, which is not a node type of the "
                             f"graph ({', '.join(counts)})")
        dtype = table.dtype if hasattr(table, "dtype") else np.asarray(table).dtype
        if not jnp.issubdtype(dtype, jnp.floating):
            raise ValueError(f"features[{t!r}] must be floating point, got {dtype} (as "
                             f"float32: np.asarray(table, np.float32))")
        table = table if is_host_resident(table) else jnp.asarray(table)
        if table.ndim != 2 or table.shape[0] != counts[t]:
            raise ValueError(f"features[{t!r}] must be [{counts[t]}, d] (one row per node), "
                             f"got {list(table.shape)}")
        out[t] = table
    return out


def _device_targets(graph: HeteroGraph, seed_type: str, targets):
    """`targets` on the device, each leaf checked to have one row per seed-type node."""
    if targets is None:
        return None
    n = graph.num_nodes[seed_type]
    targets = jax.tree_util.tree_map(jnp.asarray, targets)
    rows = {leaf.shape[0] if leaf.ndim else None for leaf in jax.tree_util.tree_leaves(targets)}
    if rows != {n}:
        raise ValueError(f"targets must have one row per {seed_type!r} node ({n}), got "
                         f"{sorted(rows, key=str)}")
    return targets
