"""Batches of whole graphs packed on the device into static capacities.

A step takes B graph ids (a slice of the epoch's on-device permutation, `step_graphs`)
and packs their nodes and edges back to back into `node_capacity` node slots and
`edge_capacity` edge slots (`pack_graphs`): the envelope of a graph-level task, sized
by calibration over the run's real batches. As in jraph (`pad_with_graphs`), a padding
graph, slot B of the B + 1 graph slots, absorbs the slack: every unused node slot and
every unused edge slot, its edges joining its last node to itself, so every message
and pooling stays inside its graph. Packing needs the real nodes plus that padding
node; a batch that needs more slots than the envelope holds sets `overflow` (the
engine reruns it with a larger envelope: nothing is dropped or cut).

With a row width K (`width`), packing also lists each node slot's incident edge
slots, K per node, both ways (`in_slots`: the edges it receives, `out_slots`: those
it sends): the fixed-width ("ELL") incidence that lets a layer sum messages by
gathers instead of scatter-adds (ops/incidence.py). The lists are read from the
collection's edges sorted by receiver and by sender (`GraphTables`), so building them
is gathers too. A batch holding a node of degree above K overflows like one above the
node or edge slots.

Optional balancing (`window` > 1) deals the graphs of each window of `window` steps
by size: the window's items are sorted by node count (largest first, ties in their
shuffled order) and dealt to its steps in snake order (step 0, 1, ..., m-1, m-1, ...,
0, ...). Each graph is still trained on exactly once per epoch, and every batch is a
size-stratified sample of its window: batch sizes in nodes vary less (the envelope and
the padding shrink), and no batch holds only large or only small graphs. Which graphs
share a batch is less random than with plain shuffling (neighbours in size are never
in the same batch of a window); gradients stay unbiased per epoch.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from zerognn_jax._src.data.graphs import GraphCollection
from zerognn_jax._src.ops.search import count_at_most
from zerognn_jax._src.sampling.seeds import step_items


class GraphTables(NamedTuple):
    """A graph collection on the device (what a step packs from).

    Attributes:
      node_offsets, edge_offsets: int32[G + 1], each graph's node and edge rows.
      senders, receivers: int32[E], edge endpoints local to their graph.
      edge_features: float32[E, d_e] (categorical ids as floats) or None.
      targets: float32[G, T] (NaN where missing) or int32[G] class ids.
      by_receiver, by_sender: int32[E + 1], the edge rows sorted (stably) by their
        receiver's, or sender's, node row; the last entry is unused.
      receiver_ptr, sender_ptr: int32[N + 1], node row n's edges are entries
        [ptr[n], ptr[n + 1]) of the sorted lists.
      max_degree: int32[G], each graph's largest in- or out-degree.
    """

    node_offsets: jax.Array
    edge_offsets: jax.Array
    senders: jax.Array
    receivers: jax.Array
    edge_features: jax.Array | None
    targets: jax.Array
    by_receiver: jax.Array
    by_sender: jax.Array
    receiver_ptr: jax.Array
    sender_ptr: jax.Array
    max_degree: jax.Array


def graph_tables(c: GraphCollection) -> GraphTables:
    """The host arrays of `c` as `GraphTables` holds them (NumPy; moved by the caller)."""
    if c.num_nodes >= 2**31 or c.num_edges >= 2**31:
        raise ValueError(f"{c.name} has {c.num_nodes} nodes and {c.num_edges} edges; "
                         "graph batching indexes them with int32 (< 2**31)")
    edges = None if c.edge_features is None else c.edge_features.astype(np.float32)
    rows = _node_rows(c)
    (by_r, ptr_r), (by_s, ptr_s) = (_sorted_incidence(ends, c.num_nodes) for ends in rows)
    # a collection without edges still gets an edge row to index (masked in every batch)
    one_row = lambda a: a if a is None or a.shape[0] else np.zeros((1, *a.shape[1:]), a.dtype)
    return GraphTables(c.node_offsets.astype(np.int32), c.edge_offsets.astype(np.int32),
                       one_row(c.senders), one_row(c.receivers), one_row(edges), c.targets,
                       by_r, by_s, ptr_r, ptr_s, _degree_peaks(c, *rows))


def _node_rows(c: GraphCollection) -> tuple[np.ndarray, np.ndarray]:
    """The node rows (of the whole collection) of every edge's receiver and sender."""
    base = np.repeat(c.node_offsets[:-1], np.diff(c.edge_offsets))
    return base + c.receivers, base + c.senders


def max_degrees(c: GraphCollection) -> np.ndarray:
    """int32[G]: each graph's largest in- or out-degree (0 for a graph without nodes)."""
    return _degree_peaks(c, *_node_rows(c))


def _degree_peaks(c: GraphCollection, receivers: np.ndarray, senders: np.ndarray):
    """`max_degrees` from the edges' receiver and sender node rows (`_node_rows`)."""
    degree = np.maximum(np.bincount(receivers, minlength=c.num_nodes),
                        np.bincount(senders, minlength=c.num_nodes))
    # one extra zero: a trailing empty graph's offset N still indexes the array
    peak = np.maximum.reduceat(np.append(degree, 0), c.node_offsets[:-1])
    return np.where(np.diff(c.node_offsets) > 0, peak, 0).astype(np.int32)


def _sorted_incidence(ends: np.ndarray, num_nodes: int) -> tuple[np.ndarray, np.ndarray]:
    """(the edge rows sorted by `ends` plus one unused entry, int32[N + 1] offsets) of
    the edges meeting each node row at `ends` (int[E])."""
    order = np.argsort(ends, kind="stable").astype(np.int32)
    ptr = np.concatenate([[0], np.cumsum(np.bincount(ends, minlength=num_nodes))])
    return np.append(order, np.int32(0)), ptr.astype(np.int32)


class GraphBatch(NamedTuple):
    """B graphs and the padding graph packed into Nc node and Ec edge slots.

    Attributes:
      node_ids: int32[Nc], each node slot's row of the node table; 0 where padded.
      node_mask: bool[Nc], the real nodes (a prefix).
      node_graph: int32[Nc], each slot's graph slot in [0, B]; B for padding.
      senders, receivers: int32[Ec], positions in the node slots; padding edges join
        the last node slot (a padding node) to itself.
      edge_ids: int32[Ec], each edge slot's row of the edge tables; 0 where padded.
      edge_mask: bool[Ec], the real edges (a prefix).
      n_node, n_edge: int32[B + 1], per graph slot; the last is the padding graph's.
      graph_mask: bool[B + 1], the real graphs.
      counts: int32[3], the node slots this batch needs (real nodes + 1 padding node),
        its real edges and its largest degree; above the capacities on overflow.
      overflow: bool scalar, the batch did not fit.
      in_slots, out_slots: int32[Nc, K], the edge slots each node slot receives and
        sends (real edges only); Ec in unused slots. None when packed without a width.

    For the feature stage it reads as a one-level sampled minibatch: `nodes` and
    `valid` hold the node slots' ids and mask, `blocks` is empty.
    """

    node_ids: jax.Array
    node_mask: jax.Array
    node_graph: jax.Array
    senders: jax.Array
    receivers: jax.Array
    edge_ids: jax.Array
    edge_mask: jax.Array
    n_node: jax.Array
    n_edge: jax.Array
    graph_mask: jax.Array
    counts: jax.Array
    overflow: jax.Array
    in_slots: jax.Array | None = None
    out_slots: jax.Array | None = None

    @property
    def nodes(self) -> tuple:
        return (self.node_ids,)

    @property
    def valid(self) -> tuple:
        return (self.node_mask,)

    @property
    def blocks(self) -> tuple:
        return ()

    def num_edges(self) -> jax.Array:
        """int32 scalar: the real edges of the batch."""
        return jnp.sum(self.edge_mask.astype(jnp.int32))


# Above this many (position, graph) pairs `_slot_graph` searches instead of comparing.
COMPARE_ALL_LIMIT = 2**23


def _slot_graph(ends: jax.Array, capacity: int) -> jax.Array:
    """int32[capacity]: the graph slot owning each position, given each graph's end (the
    running count of slots up to and including it).

    Up to COMPARE_ALL_LIMIT pairs (molhiv-like at 256 graphs a batch: 4.3M), every
    position is compared with every end and the hits summed. A CPU writes the
    comparisons out (32 MB at the limit), and the work grows as B x capacity, so larger
    batches search (ops/search.py: no loop, where JAX's default search is a
    `while` of log2(B) iterations, on a GPU a kernel and copies each, inside every step)."""
    positions = jnp.arange(capacity, dtype=ends.dtype)
    if ends.shape[0] * capacity <= COMPARE_ALL_LIMIT:
        return jnp.searchsorted(ends, positions, side="right",
                                method="compare_all").astype(jnp.int32)
    return count_at_most(ends, positions)


def _incident_slots(by_edge, ptr, node_ids, node_mask, first_edge, edge_start,
                    edge_capacity: int, width: int) -> jax.Array:
    """int32[Nc, width]: the edge slots of each node slot's edges in one sorted list
    (`by_edge`, `ptr`), given per node slot its graph's first edge row (`first_edge`)
    and first edge slot (`edge_start`); `edge_capacity` where unused."""
    start = ptr[node_ids]
    degree = jnp.where(node_mask, ptr[node_ids + 1] - start, 0)
    k = jnp.arange(width, dtype=jnp.int32)
    last = by_edge.shape[0] - 1
    rows = by_edge[jnp.minimum(start[:, None] + k, last)]
    slot = edge_start[:, None] + rows - first_edge[:, None]
    return jnp.where(k < degree[:, None], slot, edge_capacity).astype(jnp.int32)


def pack_graphs(tables: GraphTables, ids: jax.Array, valid: jax.Array, node_capacity: int,
                edge_capacity: int, width: int | None = None) -> GraphBatch:
    """Packs graphs `ids` (int32[B], bool[B] `valid`) into the capacities (jit-ready),
    with each node's incident edge slots `width` per node when `width` is given."""
    b = ids.shape[0]
    ids = jnp.where(valid, ids, 0)
    no, eo = tables.node_offsets, tables.edge_offsets
    n_node = jnp.where(valid, no[ids + 1] - no[ids], 0)
    n_edge = jnp.where(valid, eo[ids + 1] - eo[ids], 0)
    node_end, edge_end = jnp.cumsum(n_node), jnp.cumsum(n_edge)
    node_start, edge_start = node_end - n_node, edge_end - n_edge
    total_n, total_e = node_end[-1], edge_end[-1]
    node_slot = jnp.arange(node_capacity, dtype=jnp.int32)
    slot_graph = _slot_graph(node_end, node_capacity)
    node_mask = node_slot < total_n
    g = jnp.minimum(slot_graph, b - 1)
    node_ids = jnp.where(node_mask, no[ids[g]] + node_slot - node_start[g], 0)
    edge_slot = jnp.arange(edge_capacity, dtype=jnp.int32)
    edge_mask = edge_slot < total_e
    eg = jnp.minimum(_slot_graph(edge_end, edge_capacity), b - 1)
    edge_ids = jnp.where(edge_mask, eo[ids[eg]] + edge_slot - edge_start[eg], 0)
    pad = node_capacity - 1
    endpoint = lambda local: jnp.where(
        edge_mask, jnp.minimum(local[edge_ids] + node_start[eg], pad), pad)
    degree = jnp.max(jnp.where(valid, tables.max_degree[ids], 0))
    counts = jnp.stack([total_n + 1, total_e, degree]).astype(jnp.int32)
    overflow = (counts[0] > node_capacity) | (counts[1] > edge_capacity)
    slots = (None, None)
    if width is not None:
        node_ids = node_ids.astype(jnp.int32)
        incident = lambda by_edge, ptr: _incident_slots(
            by_edge, ptr, node_ids, node_mask, eo[ids[g]], edge_start[g], edge_capacity,
            width)
        slots = (incident(tables.by_receiver, tables.receiver_ptr),
                 incident(tables.by_sender, tables.sender_ptr))
        overflow = overflow | (degree > width)
    return GraphBatch(
        node_ids.astype(jnp.int32), node_mask, jnp.where(node_mask, slot_graph, b),
        endpoint(tables.senders), endpoint(tables.receivers), edge_ids.astype(jnp.int32),
        edge_mask,
        jnp.append(n_node, jnp.maximum(node_capacity - total_n, 0)).astype(jnp.int32),
        jnp.append(n_edge, jnp.maximum(edge_capacity - total_e, 0)).astype(jnp.int32),
        jnp.append(valid, False), counts, overflow, *slots)


def balanced_items(perm: jax.Array, batch_index, batch_size: int, window: int,
                   n_node: jax.Array) -> tuple[jax.Array, jax.Array]:
    """(items int32[B], valid bool[B]) of step `batch_index` with size balancing over
    windows of `window` steps (module docstring); `n_node` int32[G] per graph."""
    total = perm.shape[0]
    steps = total // batch_size
    span = window * batch_size
    w, j = batch_index // window, batch_index % window
    m = jnp.minimum(window, steps - w * window)  # steps in this window
    pos = w * span + jnp.arange(span)
    items = jnp.where(pos < total, perm[jnp.minimum(pos, total - 1)], -1)
    key = jnp.where(items >= 0, -n_node[jnp.maximum(items, 0)], jnp.iinfo(jnp.int32).max)
    ranked = items[jnp.argsort(key, stable=True)]
    k = jnp.arange(batch_size)
    p = k * m + jnp.where(k % 2 == 0, j, m - 1 - j)
    out = jnp.where(p < span, ranked[jnp.minimum(p, span - 1)], -1)
    return jnp.maximum(out, 0), out >= 0


def step_graphs(perm: jax.Array, batch_index, batch_size: int, window: int,
                n_node: jax.Array) -> tuple[jax.Array, jax.Array]:
    """The graph ids of step `batch_index` of a padded epoch permutation: its slice
    (`window` <= 1) or its share of a size-balanced window."""
    if window <= 1:
        return step_items(perm, batch_index, batch_size)
    return balanced_items(perm, batch_index, batch_size, window, n_node)


def epoch_counts(tables: GraphTables, perm: jax.Array, batch_size: int,
                 window: int) -> jax.Array:
    """int32[steps, 3]: every step's (node slots needed, edges, largest degree) in an
    epoch (jit-ready), from the graphs' sizes alone."""
    no, eo = tables.node_offsets, tables.edge_offsets
    n_node = no[1:] - no[:-1]

    def count(step):
        ids, valid = step_graphs(perm, step, batch_size, window, n_node)
        nodes = jnp.sum(jnp.where(valid, n_node[ids], 0))
        edges = jnp.sum(jnp.where(valid, eo[ids + 1] - eo[ids], 0))
        return jnp.stack([nodes + 1, edges, jnp.max(jnp.where(valid, tables.max_degree[ids],
                                                              0))])

    return jax.vmap(count)(jnp.arange(perm.shape[0] // batch_size, dtype=jnp.int32))
