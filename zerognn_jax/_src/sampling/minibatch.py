"""L-hop neighbour sampling of a mini-batch into fixed-capacity buffers.

Level 0 is the seed batch (capacity B); sampling level l with fanout f_l gives level
l + 1 (capacity C_{l+1}, the execution envelope). Real sizes are device scalars, so one
compiled program serves every batch; a level whose real size exceeds its capacity sets
the `overflow` flag instead of raising.

Each hop runs the sampler that `SamplerConfig.method` names: "uniform" (uniform.py),
"weighted" (weighted.py: by edge weight, reading the table `prepare_graph` builds) or
"labor" (labor.py: LABOR-0, whose rows are `SamplerConfig.slots` wide).
"""

from __future__ import annotations

import dataclasses
import numbers
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from zerognn_jax._src.data.checks import check_ids, is_whole
from zerognn_jax._src.data.graph import CSRGraph
from zerognn_jax._src.ops.registry import XLA, Kernels, given_kernels
from zerognn_jax._src.ops.relabel import relabel
from zerognn_jax._src.pallas import counter_hash
from zerognn_jax._src.sampling.envelope import Envelope, check_slots
from zerognn_jax._src.sampling.labor import labor_slots, sample_labor
from zerognn_jax._src.sampling.seeds import counter_key
from zerognn_jax._src.sampling.uniform import sample_neighbors
from zerognn_jax._src.sampling.weighted import cumulative_table, sample_weighted, search_steps

MAX_HOPS = 8
SAMPLERS = ("uniform", "weighted", "labor")
# `SamplerConfig.tree_is_small`: the largest share of the graph's nodes a computed tree
# level may hold. Tree mode won at the three shares measured (products-like at scales
# 1, 0.5, 0.25: 7, 15 and 29 %; docs/benchmarks.md); larger shares were not measured.
TREE_SHARE = 1 / 4


def fanout_count(f) -> int:
    """A fanout as an int; ValueError for what is not a whole number (2.5, True, "3")."""
    if not is_whole(f):
        raise ValueError(f"fanouts must be whole numbers (-1: every neighbour), got {f!r}")
    return int(f)


def hop_width(fanout: int, max_degree: int, method: str, replace: bool) -> tuple[int, bool]:
    """(slots K, whether the hop takes every neighbour) of a hop asking `fanout` of a graph
    whose largest degree is `max_degree` (1 for an edgeless one).

    -1 takes every neighbour. Without replacement no row gives more neighbours than its
    degree, so a fanout above the largest degree would only add slots that are masked in
    every row (a fanout of 100,000 on a graph of degree 500 would allocate [C, 100,000]
    buffers): it gets `max_degree` slots, which hold the same draws (uniform sampling
    takes a row of degree <= K whole, in CSR order; weighted sampling's successive draws
    do not depend on K). The hop is not marked full: on another graph, of larger
    degree, the same config still samples. With replacement, and under LABOR (whose
    rows `labor_slots` caps at its span), the fanout stays.
    """
    top = max(max_degree, 1)
    if fanout == -1:
        return top, True
    if replace or fanout <= top or method == "labor":
        return fanout, False
    return top, False


@dataclasses.dataclass(frozen=True)
class SamplerConfig:
    """What to sample; static (hashable).

    Attributes:
      fanouts: neighbours per node for each hop, seeds' hop first (e.g. (15, 10, 5)).
        A fanout of -1 takes every neighbour (full neighbourhood); it is resolved to
        the graph's largest degree by `resolve`.
      replace: sample with replacement.
      dedup: deduplicate each level (False: tree mode, exact static sizes, no metadata).
      flat_outer: leave the outermost hop undeduplicated (with `dedup`): its level is
        the level before it followed by the sampled neighbours in slot order, exact size
        C (1 + K). The first layer then reads its neighbours by position, without a
        gather, and sampling skips its largest dedup; the model computes the same
        outputs (every source row is the same feature row), over more rows.
      all_neighbors: per hop, take every neighbour; set by `resolve` for -1 fanouts
        (whatever the method).
      method: "uniform", "weighted" (probability proportional to the graph's edge
        weights; the graph must go through `prepare_graph`) or "labor" (LABOR-0: a
        fanout is the expected count per row; no replacement).
      span: LABOR scans at most this many neighbours per row, or a hop's fanout where
        that is more (see labor.py and `labor_span`).
      slot_tail: LABOR's rows get `slots` places, enough for all but about this
        fraction of rows (see `labor_slots`).
      max_degree: the graph's largest degree (0: unknown), set by `resolve`; it bounds
        the weighted sampler's binary search and LABOR's span.
      edge_ids: every Block also carries its slots' edge ids (`Block.eid`), for models
        that read edge features or weights. Off, the samplers compile as without it.
    """

    fanouts: tuple[int, ...]
    replace: bool = False
    dedup: bool = True
    flat_outer: bool = False
    all_neighbors: tuple[bool, ...] = ()
    method: str = "uniform"
    span: int = 128
    slot_tail: float = 1e-3
    max_degree: int = 0
    edge_ids: bool = False

    def __post_init__(self):
        if isinstance(self.fanouts, numbers.Real | str):
            raise ValueError(f"fanouts must list one fanout per hop (e.g. (15, 10)), got "
                             f"{self.fanouts!r}")
        fanouts = tuple(fanout_count(f) for f in self.fanouts)
        object.__setattr__(self, "fanouts", fanouts)
        if not 1 <= len(fanouts) <= MAX_HOPS:
            raise ValueError(f"need between 1 and {MAX_HOPS} hops, got {len(fanouts)}: {fanouts}")
        for hop, f in enumerate(fanouts):
            if f <= 0 and f != -1:
                raise ValueError(f"fanout of hop {hop} must be positive or -1 (all), got {f}")
        if self.method not in SAMPLERS:
            raise ValueError(f"the sampler (method) must be one of {', '.join(SAMPLERS)}, "
                             f"got {self.method!r}")
        if self.flat_outer and not self.dedup:
            raise ValueError("flat_outer=True lays out the outermost hop of deduplicated "
                             "levels in slot order; dedup=False (tree mode) lays out every "
                             "hop so: drop flat_outer")
        if self.method == "labor" and self.replace:
            raise ValueError("LABOR samples without replacement; drop replace=True")
        if self.span < 1 or not 0.0 < self.slot_tail < 1.0 or self.max_degree < 0:
            raise ValueError(f"need span >= 1, 0 < slot_tail < 1, max_degree >= 0; got "
                             f"{self.span}, {self.slot_tail}, {self.max_degree}")

    @property
    def num_hops(self) -> int:
        return len(self.fanouts)

    def resolve(self, max_degree: int | CSRGraph) -> SamplerConfig:
        """Fanouts for a graph whose largest degree is `max_degree` (or for the graph
        itself, as `TypedSamplerConfig.resolve` takes one: its `max_degree()`;
        `hop_width`: -1, and a fanout above that degree without replacement, become the
        degree), those hops that take every neighbour marked full, and `max_degree`
        recorded. The result belongs to that graph (its degree bounds the widths,
        weighted sampling's search and LABOR's span): resolve the config as given again
        for another."""
        if isinstance(max_degree, CSRGraph):
            max_degree = max_degree.max_degree()
        widths = [hop_width(f, max_degree, self.method, self.replace) for f in self.fanouts]
        return dataclasses.replace(self, fanouts=tuple(f for f, _ in widths),
                                   all_neighbors=tuple(full for _, full in widths),
                                   max_degree=max_degree)

    @property
    def positional(self) -> tuple[bool, ...]:
        """Per hop, whether its level holds the sampled neighbours in slot order: row
        C + c K + k is slot (c, k) of the C rows before it (tree mode, `flat_outer`)."""
        last = self.num_hops - 1
        return tuple(not self.dedup or (self.flat_outer and hop == last)
                     for hop in range(self.num_hops))

    def tree_is_small(self, batch_size: int, num_nodes: int) -> bool:
        """Whether tree mode's computed levels (all but the outermost) each hold at most
        `TREE_SHARE` of the graph's nodes. Then dedup's savings are small against its
        cost (a dedup per hop, a gather and a scatter in the backward): on products-like
        (SAGE [15, 10, 5], batch 1024) the tree's second level is 1.28x the dedup'd one
        and tree mode trains a bfloat16 epoch 15 % faster on an H100."""
        inner = tree_sizes(batch_size, self.slots)[1:-1]
        return all(size <= TREE_SHARE * num_nodes for size in inner)

    def fit_envelope(self, envelope: Envelope) -> Envelope:
        """`envelope` with every positional level at the one size it can have, C (1 + K)."""
        if len(envelope.capacities) != self.num_hops:
            raise ValueError(f"the envelope has {len(envelope.capacities)} levels past the "
                             f"seeds, the sampler {self.num_hops} hops: give one capacity "
                             "per hop")
        caps, prev = [], envelope.batch_size
        for cap, k, flat in zip(envelope.capacities, self.slots, self.positional):
            prev = prev * (1 + k) if flat else cap
            caps.append(prev)
        return Envelope(envelope.batch_size, tuple(caps))

    @property
    def full(self) -> tuple[bool, ...]:
        """Per hop, whether it takes every neighbour."""
        return self.all_neighbors or (False,) * self.num_hops

    def labor_span(self, hop: int) -> int:
        """Neighbours LABOR scans per row at `hop`: `span`, or the hop's fanout where that
        is wider (a window narrower than the fanout would be kept whole, each neighbour
        with probability span / d instead of fanout / d), capped by a known largest
        degree (a row no longer than its window is scanned whole)."""
        wide = max(self.span, self.fanouts[hop])
        return min(wide, self.max_degree) if self.max_degree else wide

    @property
    def slots(self) -> tuple[int, ...]:
        """Per hop, the width K of a row of its Block: the fanout, or LABOR's capacity
        for its random count. Sizes (the conservative envelope, tree mode, the memory
        model) follow these, not the fanouts."""
        if self.method != "labor":
            return self.fanouts
        return tuple(f if full else labor_slots(f, self.labor_span(hop), self.slot_tail)
                     for hop, (f, full) in enumerate(zip(self.fanouts, self.full)))


class Block(NamedTuple):
    """Edges from level l (destinations) into level l + 1 (sources).

    Attributes:
      nbr: int32[C_l, K], positions of the sampled neighbours in level l + 1; 0 where masked.
        K is the hop's `SamplerConfig.slots`.
      mask: bool[C_l, K], valid slots.
      eid: [C_l, K] in the graph's offset dtype (int32, or uint32 past 2**31 edges): the
        position of each slot's edge in the CSR (row i's slot k is the edge from node
        `nodes[l][i]` to `graph.indices[eid[i, k]]`); 0 where masked. None unless
        `SamplerConfig.edge_ids`.
    """

    nbr: jax.Array
    mask: jax.Array
    eid: jax.Array | None = None


class MiniBatch(NamedTuple):
    """A sampled L-hop computation graph, all fixed shapes.

    Attributes:
      nodes: L + 1 arrays int32[C_l], global node ids per level; level 0 is the seeds,
        level l is a prefix of level l + 1.
      valid: L + 1 arrays bool[C_l], which entries are real nodes.
      degrees: L + 1 arrays int32[C_l], full-graph degree of each node (0 when padded).
      blocks: L Blocks; block l maps level l onto level l + 1.
      counts: int32[L + 1], real size of each level (may exceed capacity on overflow).
      overflow: bool scalar, some level did not fit its capacity.
    """

    nodes: tuple
    valid: tuple
    degrees: tuple
    blocks: tuple
    counts: jax.Array
    overflow: jax.Array

    def num_edges(self) -> jax.Array:
        """int32 scalar: sampled edges (valid neighbour slots) over every hop."""
        return sum(jnp.sum(b.mask.astype(jnp.int32)) for b in self.blocks)


def _degrees(indptr, ids, valid):
    return jnp.where(valid, (indptr[ids + 1] - indptr[ids]).astype(jnp.int32), 0)


def prepare_graph(graph: CSRGraph, config: SamplerConfig, what: str = "the graph") -> CSRGraph:
    """The graph as `sample_minibatch` reads it under `config`; host-side, once per run.

    Weighted sampling searches per-row cumulative weights: the returned graph's
    `weights` hold that uint32 table (`weighted.cumulative_table`) instead of the float
    weights. Other methods get the graph unchanged. Weights that are all zero are
    refused (`what` names the graph) where a hop draws by them (not a -1 fanout's).
    """
    if config.method != "weighted":
        return graph
    if graph.weights is None and what == "the graph":
        raise ValueError("sampler 'weighted' draws neighbours by edge weight, and this "
                         "graph has none (CSRGraph.weights is None; no built-in dataset "
                         "has weights): give the graph weights (make_dataset's or "
                         "CSRGraph's weights=, a SciPy matrix's values, a .npz or dataset "
                         "folder saved with them), or use sampler 'uniform' or 'labor'")
    if graph.weights is None:
        raise ValueError(f"weighted sampling needs edge weights, and {what} has none: give "
                         "every relation weights (weights={relation: [E]}), or sample "
                         "uniformly")
    weights = np.asarray(graph.weights)
    if weights.size and not weights.any() and not all(config.full):
        raise ValueError(f"all {weights.size:,} edge weights of {what} are zero: weighted "
                         "sampling would draw no neighbour of any node; give positive "
                         "weights, or sample uniformly")
    try:
        return graph._replace(weights=cumulative_table(np.asarray(graph.indptr), weights))
    except ValueError as err:  # (a negative weight: which relation's, on a typed graph)
        if what == "the graph":
            raise
        raise ValueError(f"{what}: {err}") from None


def _weight_table(graph: CSRGraph) -> jax.Array:
    table = graph.weights
    if table is None or jnp.dtype(table.dtype) != jnp.uint32:
        raise ValueError("weighted sampling reads a per-row cumulative weight table: pass "
                         "the graph through prepare_graph(graph, config) first (its "
                         f"weights are {None if table is None else table.dtype})")
    return table


def sample_hop(graph: CSRGraph, ids, valid, key, config: SamplerConfig, hop: int,
               kernels: Kernels = XLA) -> tuple[jax.Array, jax.Array, jax.Array | None]:
    """(int32[C, K] global ids, bool[C, K] mask, [C, K] edge ids or None) of hop `hop`
    under `config.method`; edge ids with `config.edge_ids` (see `Block.eid`)."""
    fanout, full, edges = config.fanouts[hop], config.full[hop], config.edge_ids
    if graph.num_edges == 0:  # an edgeless graph: no row has a neighbour, whatever the method
        shape = (ids.shape[0], config.slots[hop])
        eid = jnp.zeros(shape, graph.indptr.dtype) if edges else None
        return jnp.zeros(shape, jnp.int32), jnp.zeros(shape, bool), eid
    if full or config.method == "uniform":  # -1 takes every neighbour once, replace or not
        out = sample_neighbors(kernels, graph.indptr, graph.indices, ids, valid, key, fanout,
                               replace=config.replace and not full, all_neighbors=full,
                               with_edges=edges)
    elif config.method == "weighted":
        steps = search_steps(config.max_degree) if config.max_degree else 31
        out = sample_weighted(kernels, graph.indptr, graph.indices, _weight_table(graph), ids,
                              valid, key, fanout, replace=config.replace, steps=steps,
                              with_edges=edges)
    else:
        out = sample_labor(kernels, graph.indptr, graph.indices, ids, valid, key, fanout,
                           slots=config.slots[hop], span=config.labor_span(hop),
                           with_edges=edges)
    return out if edges else (*out, None)


def sample_minibatch(
    graph: CSRGraph,
    seeds: jax.Array,
    seed_valid: jax.Array,
    key: jax.Array,
    config: SamplerConfig,
    capacities: tuple[int, ...],
    kernels: Kernels | str = XLA,
) -> MiniBatch:
    """Samples the L-hop neighbourhood of `seeds` (jit-compatible; traced, no host reads;
    called eagerly, concrete seeds are read back once to check their range).

    Args:
      graph: device CSRGraph with N nodes.
      seeds: int32[B], seed ids; seed_valid: bool[B], True on a prefix (the padding of
        a last batch comes at the end). A seed given twice is two rows, and stays so in
        every level's prefix: a level's valid nodes are distinct only if the seeds are.
      key: uint32 scalar for this step (`counter_hash.step_key(seed, epoch, step, 0)`); hop h
        uses `counter_hash.hash2(key, h)`. A `jax.random` key (typed or legacy) is turned
        into such a word first (`seeds.counter_key`).
      config: fanouts etc., with no -1 left (see `SamplerConfig.resolve`).
      capacities: (C_1, ..., C_L), non-decreasing and >= B. Ignored for positional
        levels (`config.positional`: tree mode, a flat outer hop), whose sizes are
        exact: C_{l+1} = C_l * (1 + K_l), K_l = `config.slots[l]`.
      kernels: which implementation runs each op (sample, relabel, ...): XLA or Pallas
        (`Kernels`, ops/registry.py).
    """
    key = counter_key(key)
    if any(f < 1 for f in config.fanouts):
        raise ValueError(f"unresolved fanouts {config.fanouts}: call SamplerConfig.resolve")
    if len(capacities) != config.num_hops and not all(config.positional):
        raise ValueError(f"capacities must give one level per hop ({config.num_hops}), got "
                         f"{tuple(capacities)}")
    kernels = given_kernels(kernels)
    n = graph.num_nodes
    # Seeds given concretely are checked here; traced ones (under jit, vmap, a scan) are
    # the step's own, and asking whether they are is cheaper than a failed conversion.
    if not any(isinstance(x, jax.core.Tracer) for x in (seeds, seed_valid)):
        given = np.asarray(seed_valid, bool)
        check_ids("seeds", np.asarray(seeds)[given], n)
        if given.ndim == 1 and given.size and np.any(given[1:] & ~given[:-1]):
            first = int(np.argmin(given))
            raise ValueError(f"seed_valid must mark a prefix of the seeds (padding at the "
                             f"end); seed {first} is marked padding and a later one real")
    ids = jnp.where(seed_valid, seeds, 0).astype(jnp.int32)
    valid = seed_valid
    count = jnp.sum(seed_valid.astype(jnp.int32))
    nodes, valids, degs, blocks, counts = [ids], [valid], [], [], [count]
    for hop in range(config.num_hops):
        check_slots(f"hop {hop + 1}", ids.shape[0] * config.slots[hop],
                    f" ({ids.shape[0]:,} rows x {config.slots[hop]:,})")
        degs.append(_degrees(graph.indptr, ids, valid))
        nbr, mask, eid = sample_hop(graph, ids, valid, counter_hash.hash2(key, hop), config,
                                    hop, kernels)
        if not config.positional[hop]:
            out = relabel(kernels, ids, count, nbr, mask, capacities[hop], n)
            ids, count, local = out.frontier, out.count, out.nbr_local
            valid = jnp.arange(ids.shape[0]) < count
        else:
            c, k = nbr.shape
            local = c + jnp.arange(c * k, dtype=jnp.int32).reshape(c, k)
            ids = jnp.concatenate([ids, nbr.reshape(-1)])
            valid = jnp.concatenate([valid, mask.reshape(-1)])
            count = jnp.sum(valid.astype(jnp.int32))
        blocks.append(Block(jnp.where(mask, local, 0), mask, eid))
        nodes.append(ids)
        valids.append(valid)
        counts.append(count)
    degs.append(_degrees(graph.indptr, ids, valid))
    counts = jnp.stack(counts)
    caps = jnp.asarray([c.shape[0] for c in nodes], jnp.int32)
    overflow = jnp.any(counts > caps) if config.dedup else jnp.array(False)
    return MiniBatch(tuple(nodes), tuple(valids), tuple(degs), tuple(blocks), counts, overflow)


def tree_sizes(batch_size: int, slots) -> tuple[int, ...]:
    """Level sizes of tree (no-dedup) sampling: exact, (B, B(1+K_0), ...), K = slots per row."""
    sizes = [batch_size]
    for f in slots:
        sizes.append(sizes[-1] * (1 + f))
    return tuple(sizes)
