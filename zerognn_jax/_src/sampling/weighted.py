"""Weighted neighbour sampling (probability proportional to an edge weight): the op and
its plain-XLA reference.

The weights of each row are stored once, as integer units in a running sum per row
(`cumulative_table`, built on the host when a run starts): a nonzero weight w of a row
whose weights sum to W gets floor(w / W * 2**31) + 1 units, a zero weight none. So every
row sums to at most 2**31 + degree < 2**32, each probability is exact to about 2**-31,
and an edge of weight zero covers no unit and can never be drawn.

A draw is a uniform unit v (counter hash of key, node, slot) and a binary search for the
first edge whose running sum exceeds v. With replacement every slot draws
independently. Without replacement (successive sampling, as `torch.multinomial`
defines it) draw i takes v uniform among the units not yet taken and steps it over the
taken intervals, kept in increasing order, onto the full axis; the search then lands on
an edge not taken yet, with probability w / (W - taken weight).

Cost per row: `fanout` searches of `search_steps` = ceil(log2(max degree + 1)) gathers
each, plus O(fanout**2) integer operations without replacement: a row with a million
neighbours costs what a row with fifty does, bar the logarithm. The table costs one
uint32 per edge and one pass over the edges when built.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from zerognn_jax._src.data.graph import edge_ids, take_edges
from zerognn_jax._src.ops.registry import Kernels
from zerognn_jax._src.pallas import counter_hash
from zerognn_jax._src.sampling.uniform import row_bounds

_UNITS = 2**31
_NO_INTERVAL = 0xFFFFFFFF  # start of an unused taken-interval slot: above every unit


def cumulative_table(indptr, weights) -> np.ndarray:
    """uint32[E]: per row, the running sum of the edges' weight units (see the module doc).

    Host-side (NumPy); `weights` must be finite and non-negative.
    """
    indptr = np.asarray(indptr, np.int64)
    w = np.asarray(weights, np.float64)
    if w.shape != (int(indptr[-1]),):
        raise ValueError(f"weights has shape {w.shape}, expected ({int(indptr[-1])},)")
    if w.size and not (np.all(np.isfinite(w)) and w.min() >= 0):
        raise ValueError(f"edge weights must be finite and non-negative; smallest is {w.min()}")
    deg = np.diff(indptr)
    if deg.size and deg.max() >= 2**31:
        raise ValueError(f"a row has {deg.max()} edges; weighted sampling needs fewer than 2**31")
    row = np.repeat(np.arange(deg.size), deg)
    # (float64 even without edges, where NumPy's bincount gives int64)
    total = np.bincount(row, weights=w, minlength=deg.size).astype(np.float64)
    scale = np.divide(_UNITS, total, out=np.zeros_like(total), where=total > 0)
    units = np.floor(w * scale[row]).astype(np.int64) + (w > 0)
    run = np.cumsum(units)
    before = np.concatenate([[0], run])[indptr[:-1]]
    return (run - np.repeat(before, deg)).astype(np.uint32)


def search_steps(max_degree: int) -> int:
    """Binary-search steps that cover any row of at most `max_degree` edges."""
    return max(int(max_degree).bit_length(), 1)


def _search(table, start, deg, v, steps: int):
    """int32: the first offset e in [0, deg) with table[start + e] > v (v below the row's total)."""
    lo = jnp.zeros_like(deg)
    hi = jnp.maximum(deg - 1, 0)
    for _ in range(steps):
        mid = jnp.minimum((lo + hi) >> 1, hi)
        above = take_edges(table, edge_ids(start, mid)) > v
        hi = jnp.where(above, mid, hi)
        lo = jnp.where(above, lo, mid + 1)
    return jnp.minimum(lo, jnp.maximum(deg - 1, 0))


def _interval(table, start, e):
    """(first unit, units) of edge `e` of each row."""
    end = take_edges(table, edge_ids(start, e))
    before = take_edges(table, edge_ids(start, jnp.maximum(e - 1, 0)))
    begin = jnp.where(e > 0, before, jnp.uint32(0))
    return begin, end - begin


def _without_replacement(table, start, deg, total, key, frontier, fanout, steps):
    """(int32[C, K] edge offsets, bool[C, K] mask): successive weighted draws per row."""
    c = frontier.shape[0]
    slots = jnp.arange(fanout, dtype=jnp.int32)[None, :]
    init = (jnp.full((c, fanout), _NO_INTERVAL, jnp.uint32),  # taken interval starts, sorted
            jnp.zeros((c, fanout), jnp.uint32),               # their lengths, same order
            jnp.zeros((c,), jnp.uint32),                      # units taken so far
            jnp.zeros((c, fanout), jnp.int32),                # offsets drawn
            jnp.zeros((c, fanout), bool))

    def draw(i, carry):
        starts, lens, taken, offsets, mask = carry
        left = total - taken
        ok = left > 0
        u = counter_hash.mulhi32(counter_hash.slot_bits(key, frontier, i), left)
        # Onto the full axis: interval j starts at starts_j - (units taken before it)
        # among the units left, and u steps over every interval that starts at or below it.
        before = jnp.cumsum(lens, axis=1, dtype=jnp.uint32) - lens
        over = (starts - before) <= u[:, None]
        v = u + jnp.sum(jnp.where(over, lens, jnp.uint32(0)), axis=1, dtype=jnp.uint32)
        e = _search(table, start, deg, v, steps)
        begin, length = _interval(table, start, e)
        pos = jnp.sum(starts < begin[:, None], axis=1, dtype=jnp.int32)[:, None]
        shift = lambda a: jnp.concatenate([a[:, :1], a[:, :-1]], axis=1)
        insert = lambda a, x: jnp.where(slots < pos, a, jnp.where(slots == pos, x[:, None],
                                                                  shift(a)))
        keep = ok[:, None]
        starts = jnp.where(keep, insert(starts, begin), starts)
        lens = jnp.where(keep, insert(lens, length), lens)
        here = slots == i
        return (starts, lens, taken + jnp.where(ok, length, jnp.uint32(0)),
                jnp.where(here, e[:, None], offsets), jnp.where(here, keep, mask))

    # A loop, not unrolled draws: each draw shifts the sorted intervals by one column,
    # and fused across draws that shift makes XLA recompute them exponentially often.
    carry = lax.fori_loop(0, fanout, draw, init)
    return carry[3], carry[4]


def sample_weighted_reference(
    indptr: jax.Array,
    indices: jax.Array,
    table: jax.Array,
    frontier: jax.Array,
    valid: jax.Array,
    key: jax.Array,
    fanout: int,
    *,
    replace: bool = False,
    steps: int = 31,
    with_edges: bool = False,
) -> tuple[jax.Array, ...]:
    """Samples up to `fanout` neighbours per valid frontier node, in proportion to weight.

    Args:
      indptr, indices: the CSR graph; table: uint32[E] from `cumulative_table`.
      frontier: int32[C] node ids; valid: bool[C].
      key: uint32 scalar for this hop.
      fanout: K, the static number of slots per row.
      replace: draw K times with replacement (every slot valid when the row has weight).
      steps: binary-search steps, `search_steps(max degree)` (31 covers any row).
      with_edges: also return the sampled edges' ids.

    Returns:
      nbr: int32[C, K], global ids in draw order; 0 in invalid slots.
      mask: bool[C, K]. Without replacement a row with m < K edges of nonzero weight
        fills its first m slots (all those edges, in random order).
      edge (with `with_edges`): [C, K] in indptr's dtype, each slot's CSR position; 0 in
        invalid slots.
    """
    start, deg = row_bounds(indptr, frontier, valid)
    last = take_edges(table, edge_ids(start, jnp.maximum(deg - 1, 0)))
    total = jnp.where(deg > 0, last, jnp.uint32(0))
    if replace:
        slots = jnp.arange(fanout, dtype=jnp.int32)[None, :]
        bits = counter_hash.slot_bits(key, frontier[:, None], slots)
        v = counter_hash.mulhi32(bits, total[:, None])
        offsets = _search(table, start[:, None], deg[:, None], v, steps)
        mask = jnp.broadcast_to(total[:, None] > 0, offsets.shape)
    else:
        offsets, mask = _without_replacement(table, start, deg, total, key, frontier, fanout,
                                             steps)
    edge = jnp.where(mask, edge_ids(start[:, None], offsets), 0)
    nbr = jnp.where(mask, take_edges(indices, edge), 0)
    return (nbr, mask, edge) if with_edges else (nbr, mask)


def sample_weighted(kernels: Kernels, indptr, indices, table, frontier, valid, key,
                    fanout: int, *, replace: bool = False, steps: int = 31,
                    with_edges: bool = False):
    """`sample_weighted_reference`: it serves every `kernels` setting (no Pallas twin yet)."""
    del kernels
    return sample_weighted_reference(indptr, indices, table, frontier, valid, key, fanout,
                                     replace=replace, steps=steps, with_edges=with_edges)
