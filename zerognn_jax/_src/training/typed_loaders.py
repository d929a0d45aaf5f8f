"""A data loader over the typed device sampler, for users who write their own training
loop on a graph with node and edge types (PyG's hetero `NeighborLoader` with
`input_nodes=(type, ids)`, DGL's `DataLoader` over a heterograph).

`HeteroNeighborLoader` yields one sampled typed subgraph per batch of seed nodes of one
type: the `TypedMiniBatch`, each featured type's input rows and the seeds' targets, all
fetched on the device at static shapes (the typed envelope, per (level, type)), so a
jitted step compiles once. As `NeighborLoader` (loaders.py), whose machinery it shares:
a loop returns to Python after every batch and reads one flag, and a batch that
overflowed its envelope is sampled again, with the same randomness, after the envelope
grows (`grow_typed`).

A batch hands a relational model (`HeteroGNN`'s interface: `model(x, layers, train=)`
with `x` {type: rows} and one `TypedLayer` per layer) its inputs: `batch.x` and
`batch.layers()`. A type without features gets no rows in `batch.x`: give it rows of
your own (an embedding of `batch.input_nodes[type]`).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from zerognn_jax._src.data.hetero import HeteroGraph
from zerognn_jax._src.nn.hetero import TypedLayer, typed_layers
from zerognn_jax._src.ops.gather import gather_rows
from zerognn_jax._src.ops.registry import XLA, Kernels
from zerognn_jax._src.sampling.envelope import DEFAULT_POLICY, EnvelopePolicy
from zerognn_jax._src.sampling.seeds import counter_key
from zerognn_jax._src.sampling.typed_calibrate import choose_typed_envelope
from zerognn_jax._src.sampling.typed_config import TypedSamplerConfig
from zerognn_jax._src.sampling.typed_envelope import (
    TypedEnvelope,
    fit_typed_envelope,
    grow_typed,
)
from zerognn_jax._src.sampling.typed_minibatch import (
    TypedMiniBatch,
    host_counts,
    prepare_typed_graph,
    sample_typed_step,
)
from zerognn_jax._src.training.loaders import DeviceLoader, as_kernels


@jax.tree_util.register_dataclass
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
    """

    minibatch: TypedMiniBatch
    dropout_key: jax.Array
    epoch: Any
    step: Any
    x: dict
    y: Any = None

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

    def layers(self, kernels: Kernels = XLA) -> tuple[TypedLayer, ...]:
        """One `TypedLayer` per layer, outermost hop first (`layers()[i]` feeds layer
        i), whose views aggregate with `kernels`."""
        return typed_layers(self.minibatch, kernels)


class HeteroNeighborLoader(DeviceLoader):
    """Sampled typed mini-batches around seed nodes of one type, on the device (module
    docstring; docs/loader.md).

    Args:
      graph: a HeteroGraph (host or device arrays); with `sampler="weighted"` the
        sampled relations need edge weights.
      nodes: (type, int[M] ids), the seed nodes (e.g. ("paper", train ids)).
      fanouts: neighbours per hop, seeds' hop first: one tuple for every relation, a
        dict {relation or its (src, name, dst): per-hop tuple}, or one dict per hop
        (DGL's layout); 0 skips a relation at a hop, -1 takes every neighbour
        (docs/hetero.md, "Fanouts, and how they count").
      batch_size, key, shuffle, drop_last, envelope, policy, kernels: as in
        `NeighborLoader`; `envelope` may also be a `TypedEnvelope`.
      sampler, replace, dedup: as in `NeighborLoader`, for every relation (dedup False:
        tree mode, exact sizes).
      features: {type: float[N_t, d_t]} (host or device arrays), gathered for each
        batch's input nodes of that type on the device (`batch.x`); types left out get
        no rows.
      targets: [N_seed type, ...] (or a pytree of such), the seeds' rows (`batch.y`).
    """

    def __init__(self, graph: HeteroGraph, nodes, *, fanouts, batch_size: int, key,
                 sampler: str = "uniform", replace: bool = False, dedup: bool = True,
                 shuffle: bool = True, drop_last: bool = False, features=None,
                 targets=None, envelope: TypedEnvelope | str = "calibrate",
                 policy: EnvelopePolicy = DEFAULT_POLICY, kernels: Kernels | str = "auto"):
        kernels = as_kernels(kernels)
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        self.seed_type, ids = _seed_nodes(graph, nodes)
        self.seed = int(counter_key(key)) & 0x7FFFFFFF  # as NeighborLoader takes it
        config = TypedSamplerConfig(fanouts, replace=replace, dedup=dedup,
                                    method=sampler).resolve(graph)
        self.sampler = config
        self.graph = prepare_typed_graph(graph, config).to_device()
        self.items = jnp.asarray(ids, jnp.int32)
        self.batch_size, self.policy, self.kernels = batch_size, policy, kernels
        self.shuffle, self.drop_last = bool(shuffle), bool(drop_last)
        self.features = _device_tables(graph, features)
        self.targets = _device_targets(graph, self.seed_type, targets)
        if isinstance(envelope, str):
            envelope, _ = choose_typed_envelope(self.graph, self.items, batch_size, config,
                                                seed_type=self.seed_type, method=envelope,
                                                seed=self.seed, policy=policy,
                                                kernels=kernels)
        if envelope.seed_type != self.seed_type:
            raise ValueError(f"the envelope is for seeds of type {envelope.seed_type!r}, "
                             f"the nodes are {self.seed_type!r}")
        self.envelope = fit_typed_envelope(config, envelope)
        self._next_epoch = 0
        self._programs = {}

    def _sample(self, graph, order, epoch, step, envelope):
        return sample_typed_step(graph, order, step, seed=self.seed, epoch=epoch,
                                 batch_size=self.batch_size, config=self.sampler,
                                 envelope=envelope, kernels=self.kernels)

    def _grown(self, mb: TypedMiniBatch) -> TypedEnvelope:
        return fit_typed_envelope(self.sampler, grow_typed(
            self.envelope, self.sampler, host_counts(mb.counts), self.policy))

    def _assemble(self, out, epoch, step, tables) -> HeteroLoaderBatch:
        features, targets = tables
        mb = out.mb
        x = {t: gather_rows(self.kernels, table, mb.nodes[-1][t], mb.valid[-1][t])
             for t, table in features.items() if t in mb.nodes[-1]}
        y = None if targets is None else jax.tree_util.tree_map(
            lambda a: a[mb.nodes[0][self.seed_type]], targets)
        return HeteroLoaderBatch(mb, out.drop_key, epoch, step, x, y)


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
    if ids.ndim != 1 or ids.size == 0 or not np.issubdtype(ids.dtype, np.integer):
        raise ValueError(f"nodes' ids must be a non-empty 1-D integer array, got "
                         f"{ids.dtype}{list(ids.shape)}")
    if ids.min() < 0 or ids.max() >= counts[seed_type]:
        raise ValueError(f"nodes' ids must lie in [0, {counts[seed_type]}) ({seed_type!r} "
                         f"ids), found [{ids.min()}, {ids.max()}]")
    return seed_type, ids


def _device_tables(graph: HeteroGraph, features) -> dict:
    """{type: device float[N_t, d_t]} from `features`, each checked: a type of the
    graph, one 2-D row per node."""
    out, counts = {}, graph.num_nodes
    for t, table in (features or {}).items():
        if t not in counts:
            raise ValueError(f"features has type {t!r}, which is not a node type of the "
                             f"graph ({', '.join(counts)})")
        table = jnp.asarray(table)
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
