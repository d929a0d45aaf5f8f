"""Data loaders over the device sampler, for users who write their own training loop.

`NeighborLoader` plays the part of PyG's `NeighborLoader` (DGL's `DataLoader`): it
yields one sampled subgraph of seed nodes per batch, with the seeds' features and
targets fetched on the device; `LinkNeighborLoader` that of PyG's
`LinkNeighborLoader`: positive edges in, negatives drawn on the device, the subgraph
sampled around every endpoint with the batch's own edges hidden (link prediction's
task, training/tasks/link.py, is its seed source). Both offer every sampler and layout
the trainer has (uniform, weighted, LABOR; with or without replacement; dedup or tree
levels) and keep static shapes (the envelope), so a jitted step compiles once.

A loader samples `sample_ahead` batches per call (one vmapped sample, as `train()`'s
`sample_ahead`) and reads one flag per call to catch an overflow (then grows the
envelope and samples those batches again, with the same randomness). The next call is
queued before the current group's batches are handed out, so its flag read waits for
the work queued before it, not for the steps a loop queues for the group in hand: the
GPU always holds a group of steps in its queue.

Hop order. Hops count from the seeds: `fanouts[0]`, `minibatch.nodes[0]` (the seeds)
and `minibatch.blocks[0]` are the seeds' hop (the sampler's record, as before). What a
model consumes comes in layer order, outermost hop first: `batch.views[i]` and
`batch.blocks[i]` feed layer i, and both are `minibatch.blocks[L - 1 - i]`'s edges.
"""

from __future__ import annotations

import dataclasses
import functools
import numbers
import warnings
from collections.abc import Iterator, Mapping
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from zerognn_jax._src.data import graph_kinds
from zerognn_jax._src.data.checks import (
    LibraryWarning,
    at_least_one,
    check_ids,
    is_int,
    require_ids,
)
from zerognn_jax._src.data.graph import CSRGraph
from zerognn_jax._src.data.hetero import HeteroGraph
from zerognn_jax._src.data.links import EvalEdges, LinkSplit, transposed_hint
from zerognn_jax._src.ops.gather import gather_rows
from zerognn_jax._src.ops.host_rows import is_host_resident, to_device
from zerognn_jax._src.ops.registry import XLA, Kernels, as_kernels
from zerognn_jax._src.sampling.calibrate import choose_envelope
from zerognn_jax._src.sampling.envelope import DEFAULT_POLICY, Envelope, EnvelopePolicy, grow
from zerognn_jax._src.sampling.minibatch import MiniBatch, SamplerConfig, prepare_graph
from zerognn_jax._src.sampling.negatives import check_frontier
from zerognn_jax._src.sampling.seeds import counter_key, epoch_items, ordered_items
from zerognn_jax._src.sampling.steps import ITEM_SEEDS, sample_step
from zerognn_jax._src.training.program import views_for
from zerognn_jax._src.training.tasks.link import LinkTask
from zerognn_jax._src.training.user_frames import user_stacklevel

# Batches sampled by one call by default (docs/loader.md, "The cost").
SAMPLE_AHEAD = 4


def _register(cls):
    """`cls`, a frozen dataclass, as a pytree whose `positional` and `kernels` are static."""
    static = ["positional", "kernels"]
    names = [f.name for f in dataclasses.fields(cls)]
    return jax.tree_util.register_dataclass(
        cls, data_fields=[n for n in names if n not in static], meta_fields=static)


class _Layers:
    """Layer-order access to a batch's `minibatch` (module docstring: hop order)."""

    @property
    def seeds(self) -> jax.Array:
        """int32[S]: level 0's node ids (padding rows hold 0)."""
        return self.minibatch.nodes[0]

    @property
    def seed_mask(self) -> jax.Array:
        """bool[S]: the real seeds."""
        return self.minibatch.valid[0]

    @property
    def input_nodes(self) -> jax.Array:
        """int32[C_L]: the outermost level's node ids, whose rows `x` holds."""
        return self.minibatch.nodes[-1]

    @property
    def blocks(self) -> tuple:
        """The sampled `Block`s in layer order: `blocks[i]` feeds layer i."""
        return tuple(reversed(self.minibatch.blocks))

    @property
    def views(self) -> tuple:
        """One `EllView` per layer, in layer order (`zg.views_for`), for training."""
        return views_for(self.minibatch, self.kernels, positional=self.positional)

    def inference_views(self) -> tuple:
        """The views for a forward pass that is not differentiated (`EllView.pin_aggregates`)."""
        return views_for(self.minibatch, self.kernels, positional=self.positional,
                         inference=True)


@_register
@dataclasses.dataclass(frozen=True)
class LoaderBatch(_Layers):
    """One batch of a `NeighborLoader`.

    Attributes:
      minibatch: the sampled subgraph, hops from the seeds (`minibatch.nodes[0]` are the
        seeds, padding rows hold id 0; `minibatch.valid[0]` marks the real ones).
      dropout_key: a `jax.random` key for this batch (from the loader's key, the epoch
        and the step), for the model's dropout.
      epoch, step: where the batch sits.
      x: float[C_L, d], the features of `input_nodes` (zero on padding rows), when the
        loader has `features`; else None.
      y: the seeds' rows of the loader's `targets` ([S, ...]), else None.
      positional: per hop, whether its level is in slot order (static; `views` read it).
      kernels: the loader's `Kernels` (static): the views' aggregations run them.
    """

    minibatch: MiniBatch
    dropout_key: jax.Array
    epoch: Any
    step: Any
    x: jax.Array | None = None
    y: Any = None
    positional: tuple = ()
    kernels: Kernels = XLA


@_register
@dataclasses.dataclass(frozen=True)
class LinkLoaderBatch(_Layers):
    """One batch of a `LinkNeighborLoader`: B positive edges, K negatives each.

    Attributes:
      minibatch: the subgraph sampled around every endpoint (level 0, `seeds`, is the
        deduplicated endpoints), with the batch's positive edges hidden from every
        block when the loader excludes them.
      pairs: int32[P, 2], P = B (1 + K): each pair's endpoints as positions in level 0
        (score `h[pairs[:, 0]]` against `h[pairs[:, 1]]`); positives first, then
        negative j of positive i at row B + i K + j.
      edges: int32[P, 2], the same pairs as global node ids.
      labels: float32[P], 1 for positives, 0 for negatives.
      weight: float32[P], 1 per real positive, 1/K per real negative, 0 for padding
        and for a shared negative that hits its positive's own destination (positives
        and negatives weigh the same in total; training/tasks/link.py). Weigh the
        loss by it: a pair of weight 0 is not a negative.
      dropout_key, epoch, step, x, positional, kernels: as in `LoaderBatch`.
    """

    minibatch: MiniBatch
    pairs: jax.Array
    edges: jax.Array
    labels: jax.Array
    weight: jax.Array
    dropout_key: jax.Array
    epoch: Any
    step: Any
    x: jax.Array | None = None
    positional: tuple = ()
    kernels: Kernels = XLA


def require_graph(loader: str, graph, kind: type) -> None:
    """`graph_kinds.require_graph` for `loader`: a dataset's graph with its features, or the
    loader of the other kind of graph."""
    def elsewhere(what: str, inner) -> str:
        other = (f"Hetero{loader}" if isinstance(inner, HeteroGraph)
                 else loader.removeprefix("Hetero"))
        return f"{what} is sampled by zg.{other}"

    graph_kinds.require_graph(loader, graph, kind, elsewhere=elsewhere, dataset_fix=(
        "pass dataset.graph (and features=dataset.features for batch.x)"))


class _Group(NamedTuple):
    """One call's output: its batches, whether any overflowed (bool[]), and the
    per-level counts' maximum over them (to grow the envelope from)."""

    batches: list
    overflow: jax.Array
    counts: Any


def _node_table(name: str, table, num_nodes: int):
    """`table` (features: one [N, d] table; targets: [N, ...] per leaf) checked against
    the graph's `num_nodes`, a list made an array; ValueError naming `name` and the
    shape."""
    if table is None:
        return None
    if isinstance(table, list):
        table = np.asarray(table)
    if name == "features" and not (is_host_resident(table) or hasattr(table, "shape")):
        typed = (" of " + ", ".join(map(repr, table)) + ": tables per node type are "
                 "zg.HeteroNeighborLoader's") if isinstance(table, Mapping) else ""
        raise ValueError(f"features must be one float[N, d] table, got a "
                         f"{type(table).__name__}{typed}")
    leaves = [table] if is_host_resident(table) else jax.tree_util.tree_leaves(table)
    if not leaves or not all(hasattr(x, "shape") for x in leaves):
        raise ValueError(f"{name} must be an array (or a pytree of arrays) with one row per "
                         f"node, got {type(table).__name__}")
    for x in leaves:
        if len(x.shape) < 1 or x.shape[0] != num_nodes:
            raise ValueError(f"{name} must have one row per node ({num_nodes}), got shape "
                             f"{tuple(x.shape)}")
        if name == "features" and len(x.shape) != 2:
            raise ValueError(f"features must be 2-D [num_nodes, d], got shape {tuple(x.shape)}")
        if name == "features" and not jnp.issubdtype(x.dtype, jnp.floating):
            raise ValueError(f"features must be floating point, got {x.dtype} (as float32: "
                             f"np.asarray(features, np.float32))")
    return table


class DeviceLoader:
    """What the loaders share: items, order, keys, the envelope and its growth.

    Subclasses give the seed source (`_source`) and turn a step's sample into their
    batch (`_assemble`, traced); a typed graph's loader also samples (`_sample`) and
    grows its envelope (`_grown`) its own way (typed_loaders.py).
    """

    _source = ITEM_SEEDS

    def _start(self, items: np.ndarray, *, batch_size: int, key, shuffle: bool,
               drop_last: bool, policy: EnvelopePolicy, kernels: Kernels,
               sample_ahead: int) -> None:
        """What every loader keeps before its sampler: the items, keys, order options."""
        batch_size = at_least_one(batch_size, "batch_size")
        self.sample_ahead = at_least_one(sample_ahead, "sample_ahead")
        # The run's seed as the engines take it: a non-negative int32 (its top bit dropped;
        # an integer key with it set would replay another's batches, so it is refused).
        if isinstance(key, int | np.integer) and not 0 <= int(key) < 2**31:
            raise ValueError(f"an integer key must lie in [0, 2**31) (the engines' seeds are "
                             f"non-negative int32, as TrainConfig.seed), got {key}")
        self.seed = int(counter_key(key)) & 0x7FFFFFFF
        self.items = jnp.asarray(items, jnp.int32)
        self.batch_size, self.policy, self.kernels = batch_size, policy, kernels
        self.shuffle, self.drop_last = bool(shuffle), bool(drop_last)
        self._next_epoch = 0
        self._programs = {}

    def _built(self) -> None:
        """Warns, once the loader is built, where `drop_last` leaves it no batch."""
        n = self.items.shape[0]
        if self.drop_last and 0 < n < self.batch_size:
            warnings.warn(f"drop_last leaves out the last batch when it is not full, and "
                          f"the {n} items make no full batch of {self.batch_size}: the "
                          f"loader yields none", LibraryWarning, stacklevel=user_stacklevel())

    def _setup(self, graph: CSRGraph, items: np.ndarray, *, fanouts, batch_size: int, key,
               envelope, sampler: str, replace: bool, dedup: bool, flat_outer: bool,
               edge_ids: bool, shuffle: bool, drop_last: bool, features, targets,
               policy: EnvelopePolicy, kernels: Kernels, sample_ahead: int):
        self._start(items, batch_size=batch_size, key=key, shuffle=shuffle,
                    drop_last=drop_last, policy=policy, kernels=kernels,
                    sample_ahead=sample_ahead)
        fanouts = (fanouts,) if isinstance(fanouts, numbers.Real | str) else tuple(fanouts)
        config = SamplerConfig(fanouts, replace=replace, dedup=dedup,
                               flat_outer=flat_outer, method=sampler,
                               edge_ids=edge_ids).resolve(graph.max_degree())
        self.sampler = config
        self.graph = prepare_graph(graph, config).to_device()
        features, targets = (_node_table(name, table, graph.num_nodes)
                             for name, table in (("features", features), ("targets", targets)))
        self.features = (features if features is None or is_host_resident(features)
                         else to_device(features))
        self.targets = None if targets is None else jax.tree_util.tree_map(jnp.asarray, targets)
        if isinstance(envelope, str):
            envelope, _ = choose_envelope(self.graph, self.items, batch_size, config,
                                          method=envelope, seed=self.seed, policy=policy,
                                          kernels=kernels, source=self._source)
        elif not self._source.dedups_seeds and envelope.batch_size != batch_size:
            raise ValueError(f"the envelope's level 0 holds {envelope.batch_size} seeds, "
                             f"this loader's batches {batch_size}: give an envelope made for "
                             f"batch_size {batch_size} (a loader's own `.envelope`), or "
                             f"\"calibrate\"")
        self.envelope = config.fit_envelope(envelope)
        self._built()

    def __len__(self) -> int:
        n, b = self.items.shape[0], self.batch_size
        return n // b if self.drop_last else -(-n // b)

    def __iter__(self) -> Iterator:
        epoch, self._next_epoch = self._next_epoch, self._next_epoch + 1
        return self.epoch(epoch)

    def epoch(self, epoch: int) -> Iterator:
        """The batches of epoch `epoch`, in order (the same key: the same batches)."""
        if not is_int(epoch) or epoch < 0:  # a float or negative one was taken as given
            raise ValueError(f"epoch must be an integer >= 0, got {epoch!r}")
        total = len(self)
        if not total:
            return
        if self.shuffle:
            order = epoch_items(self.items, self.batch_size, self.seed, epoch)
        else:
            order = ordered_items(self.items, self.batch_size)
        ahead = min(self.sample_ahead, total)  # a short epoch samples no repeats
        pending = self._launch(order, epoch, 0, ahead)
        for first in range(0, total, ahead):
            group, pending = pending, None
            while bool(group.overflow):  # one host read a call
                self.envelope = self._grown(group.counts)
                group = None  # freed before the call that samples it again
                group = self._launch(order, epoch, first, ahead)
            if first + ahead < total:  # queued before this group's steps are
                pending = self._launch(order, epoch, first + ahead, ahead)
            for i, batch in enumerate(group.batches[:total - first]):
                yield dataclasses.replace(batch, epoch=epoch, step=first + i)
            group = None

    def _fetch(self, mb: MiniBatch, tables):
        """(x, y): the input nodes' features and the seeds' targets (`tables`: the
        program's (features, targets) arguments), or None each."""
        features, targets = tables
        x = None if features is None else gather_rows(
            self.kernels, features, mb.nodes[-1], mb.valid[-1])
        y = None if targets is None else jax.tree_util.tree_map(
            lambda t: t[mb.nodes[0]], targets)
        return x, y

    def _sample(self, graph, order, epoch, step, envelope):
        """The step's sample at `envelope` (traced)."""
        return sample_step(graph, order, step, seed=self.seed, epoch=epoch,
                           batch_size=self.batch_size, config=self.sampler,
                           envelope=envelope, kernels=self.kernels, source=self._source)

    def _grown(self, counts):
        """The envelope after a sample with per-level `counts` overflowed it, no level
        above the graph's node count."""
        return self.sampler.fit_envelope(grow(self.envelope, np.asarray(counts), self.policy,
                                              num_nodes=self.graph.num_nodes))

    def _program(self, envelope):
        if envelope not in self._programs:
            # the tables are arguments: closed over, they would be compiled in as constants
            def sample(graph, tables, order, epoch, steps):
                def one(step):
                    return self._sample(graph, order, epoch, step, envelope)
                if steps.shape[0] == 1:
                    outs = [one(steps[0])]
                else:
                    group = jax.vmap(one)(steps)
                    outs = [jax.tree_util.tree_map(lambda a, i=i: a[i], group)
                            for i in range(steps.shape[0])]
                batches = [self._assemble(out, epoch, steps[i], tables)
                           for i, out in enumerate(outs)]
                overflow = functools.reduce(jnp.logical_or, [o.mb.overflow for o in outs])
                counts = jax.tree_util.tree_map(lambda *c: functools.reduce(jnp.maximum, c),
                                                *[o.mb.counts for o in outs])
                return _Group(batches, overflow, counts)
            self._programs[envelope] = jax.jit(sample)
        return self._programs[envelope]

    def _launch(self, order, epoch: int, first: int, ahead: int) -> _Group:
        """Queues the `ahead` steps from `first` (the last step repeated past the
        epoch's end) at the current envelope."""
        steps = np.minimum(np.arange(first, first + ahead), len(self) - 1)
        return self._program(self.envelope)(self.graph, (self.features, self.targets), order,
                                            np.int32(epoch), steps.astype(np.int32))


class NeighborLoader(DeviceLoader):
    """Sampled mini-batches around `nodes` of `graph`, on the device (PyG's
    `NeighborLoader`; docs/loader.md).

    Args:
      graph: a CSRGraph (host or device arrays); with `sampler="weighted"` it needs
        edge weights (`CSRGraph.weights`).
      nodes: int[M], the seed nodes (e.g. the training split); a node given twice is
        two seeds, and a batch holding both holds it twice in every level.
      fanouts: neighbours per hop, seeds' hop first; -1 takes every neighbour.
      batch_size: seeds per batch; the last batch of an epoch is padded (masked)
        unless `drop_last`.
      key: a `jax.random.key`, a legacy `jax.random.PRNGKey` or an integer.
      sampler: "uniform", "weighted" (by edge weight) or "labor" (LABOR-0); replace:
        with replacement (not LABOR); dedup: deduplicate each level (False: tree mode,
        exact sizes, views read by position); flat_outer: with dedup, the outermost hop
        in slot order (`SamplerConfig.flat_outer`); edge_ids: blocks carry their edges'
        CSR positions (`Block.eid`).
      shuffle: a fresh permutation of `nodes` every epoch; False keeps their order.
      drop_last: leave out the last batch when it is not full.
      features: float[N, d] (host or device), gathered for each batch's input nodes on
        the device (`batch.x`); targets: [N, ...] (or a pytree of such), the seeds' rows
        (`batch.y`).
      envelope: "calibrate" (tight, measured on a first epoch), "conservative", or an
        `Envelope`. It grows by itself when a batch does not fit.
      policy: how capacities are sized and grown. kernels: which op implementations run:
        a `Kernels`, or its spec ("auto", the default, as `zg.train` picks: the Pallas
        sampler on a GPU, XLA on a CPU; "xla"; `Kernels.parse`).
      sample_ahead: batches sampled by one call (one vmapped sample and one host read
        for all of them; the same batches as one at a time, padded alike where the
        envelope is the same: one grown from a call's largest counts may end larger).
        The next call is queued as a group is handed out, so up to twice this many
        batches are held at once.

    Iterating gives the batches of the next epoch (0, 1, ...); `epoch(e)` those of
    epoch `e`.
    """

    def __init__(self, graph: CSRGraph, nodes, *, fanouts, batch_size: int, key,
                 sampler: str = "uniform", replace: bool = False, dedup: bool = True,
                 flat_outer: bool = False, edge_ids: bool = False, shuffle: bool = True,
                 drop_last: bool = False, features=None, targets=None,
                 envelope: Envelope | str = "calibrate",
                 policy: EnvelopePolicy = DEFAULT_POLICY, kernels: Kernels | str = "auto",
                 sample_ahead: int = SAMPLE_AHEAD):
        require_graph("NeighborLoader", graph, CSRGraph)
        kernels = as_kernels(kernels)
        nodes = np.asarray(nodes)
        require_ids("nodes", nodes, nonempty=True)
        check_ids("nodes", nodes, graph.num_nodes)
        self._setup(graph, nodes, fanouts=fanouts, batch_size=batch_size, key=key,
                    envelope=envelope, sampler=sampler, replace=replace, dedup=dedup,
                    flat_outer=flat_outer, edge_ids=edge_ids, shuffle=shuffle, drop_last=drop_last,
                    features=features, targets=targets, policy=policy, kernels=kernels,
                    sample_ahead=sample_ahead)

    def _assemble(self, out, epoch, step, tables) -> LoaderBatch:
        x, y = self._fetch(out.mb, tables)
        return LoaderBatch(out.mb, out.drop_key, epoch, step, x, y, self.sampler.positional,
                           self.kernels)


class LinkNeighborLoader(DeviceLoader):
    """Batches of positive edges with negatives drawn on the device and the subgraph
    sampled around every endpoint (PyG's `LinkNeighborLoader`; docs/loader.md).

    Args:
      graph: the message-passing graph (for link prediction without leakage: the
        training edges only, e.g. `zg.random_link_split(g).graph`).
      edges: int[E, 2], the positive (source, destination) edges; each epoch cuts them
        into batches of `batch_size`.
      num_negatives: K negatives per positive, drawn on the device (a function of the
        key, epoch, step and slot: sampling/negatives.py). negative_mode:
        "destination" (corrupt the destination), "pairs" (both ends uniform) or
        "shared" (every positive of a batch meets the same K destinations).
      exclude_seed_edges: hide the batch's positive edges (both directions) from
        every sampled block, so message passing cannot read the edge it predicts.
      features: float[N, d], gathered for each batch's input nodes (`batch.x`).
      fanouts, batch_size, key, sampler, replace, dedup, flat_outer, edge_ids, shuffle,
      drop_last, envelope, policy, kernels, sample_ahead: as in `NeighborLoader`. Level 0
      (the endpoints) has a capacity of its own, calibrated like the other levels, and
      grows on overflow.
    """

    def __init__(self, graph: CSRGraph, edges, *, fanouts, batch_size: int, key,
                 num_negatives: int = 1, negative_mode: str = "destination",
                 exclude_seed_edges: bool = True, sampler: str = "uniform",
                 replace: bool = False, dedup: bool = True, flat_outer: bool = False,
                 edge_ids: bool = False, shuffle: bool = True, drop_last: bool = False,
                 features=None,
                 envelope: Envelope | str = "calibrate",
                 policy: EnvelopePolicy = DEFAULT_POLICY, kernels: Kernels | str = "auto",
                 sample_ahead: int = SAMPLE_AHEAD):
        require_graph("LinkNeighborLoader", graph, CSRGraph)
        kernels = as_kernels(kernels)
        edges = np.asarray(edges)
        if (edges.ndim != 2 or edges.shape[1] != 2 or not edges.shape[0]
                or not np.issubdtype(edges.dtype, np.integer)):
            raise ValueError(f"edges must be a non-empty integer [E, 2] array, got "
                             f"{edges.dtype}{list(edges.shape)}{transposed_hint(edges)}")
        check_ids("edges", edges, graph.num_nodes)
        none = EvalEdges(np.zeros((0, 2), np.int32), np.zeros((0, 2), np.int32),
                         np.zeros((0, 0), np.int32))
        split = LinkSplit(edges.astype(np.int32), graph, none, none, graph.num_nodes)
        self._source = LinkTask(split, num_negatives, negative_mode,
                                exclude_seed_edges=exclude_seed_edges, kernels=kernels)
        check_frontier(at_least_one(batch_size, "batch_size"), num_negatives, negative_mode)
        self._setup(graph, edges, fanouts=fanouts, batch_size=batch_size, key=key,
                    envelope=envelope, sampler=sampler, replace=replace, dedup=dedup,
                    flat_outer=flat_outer, edge_ids=edge_ids, shuffle=shuffle, drop_last=drop_last,
                    features=features, targets=None, policy=policy, kernels=kernels,
                    sample_ahead=sample_ahead)
        self._source = self._source.with_sampler(self.sampler)

    def _assemble(self, out, epoch, step, tables) -> LinkLoaderBatch:
        task = self._source
        batch = task.batch(None, out.items, out.valid, out.key, out.level)
        mb = task.restrict(out.mb, batch)
        pairs = batch.model_inputs["pairs"]
        x, _ = self._fetch(mb, tables)
        return LinkLoaderBatch(mb, pairs, out.level.seeds[pairs], batch.targets,
                               batch.weight, out.drop_key, epoch, step, x,
                               self.sampler.positional, self.kernels)
