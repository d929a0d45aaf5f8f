"""LABOR-0 (layer-neighbour) sampling into fixed-width rows: the op and its plain-XLA
reference (Balin & Catalyurek, "Layer-Neighbor Sampling", NeurIPS 2023).

Every candidate vertex t gets one uniform number r_t per hop, a hash of (hop key, t)
shared by every row of the hop; row s keeps its neighbour t when r_t < fanout / d_s
(every neighbour when d_s <= fanout). Rows that share a neighbour agree on it, so a hop
reaches fewer unique vertices than neighbour sampling at the same fanout, while each
row still keeps each neighbour with probability min(1, fanout / d_s) and expects
`fanout` of them (Poisson sampling).

Fixed shapes, and what they cost:
- Span. A row is scanned over at most `span` consecutive neighbours (cyclically, from a
  random offset of the row): a row of degree d <= span is scanned whole, exactly as
  above; a hub row scans a random window of `span` of its neighbours with threshold
  fanout / span, so each neighbour is still kept with probability fanout / d and the
  row still expects `fanout`, but two hubs agree only on the neighbours their windows
  share. Cost per row: `span` index reads and hashes, whatever the degree.
- Slots. The count per row is random, so a row has `slots` >= fanout places
  (`labor_slots`: the smallest K with P(Poisson(fanout) > K) <= tail). A row that keeps
  more keeps the first `slots` in scan order from its random offset: given the count,
  every neighbour stays equally likely (the kept set is a run of the scan, not a
  uniform subset), so mean and GCN aggregation stay unbiased; only the inclusion
  probability of such rows drops below fanout / d. `row_counts` gives the counts before
  that cut.

Weights. The paper's unbiased estimator weights edge (t, s) by 1 / pi_ts, pi_ts =
min(1, fanout / d_s), normalised per row (as DGL does). LABOR-0 gives every neighbour of
a row the same pi_ts, so the normalised weights are those of the plain mean over the
sampled neighbours: mean and GCN aggregation (nn/views.py) need no per-slot weights.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp

from zerognn_jax._src.data.graph import edge_ids, take_edges
from zerognn_jax._src.ops.registry import Kernels
from zerognn_jax._src.pallas import counter_hash
from zerognn_jax._src.sampling.uniform import row_bounds

# Hash domains of the per-hop key: one for vertices (r_t), one for row offsets.
_VERTEX_DOMAIN = 0x4C41424F
_ROW_DOMAIN = 0x524F5753


@functools.cache
def labor_slots(fanout: int, span: int, tail: float = 1e-3) -> int:
    """Slots per row: the smallest K >= fanout with P(Poisson(fanout) > K) <= tail, at
    most `span` (a row never keeps more than it scans)."""
    if fanout < 1 or span < 1 or not 0.0 < tail < 1.0:
        raise ValueError(f"need fanout >= 1, span >= 1, 0 < tail < 1; got {fanout}, {span}, "
                         f"{tail}")
    log_f, k = math.log(fanout), fanout
    cdf = math.fsum(math.exp(-fanout + i * log_f - math.lgamma(i + 1)) for i in range(k + 1))
    while 1.0 - cdf > tail and k < span:
        k += 1
        cdf += math.exp(-fanout + k * log_f - math.lgamma(k + 1))
    return min(k, span)


def vertex_uniform(key: jax.Array, vertex: jax.Array) -> jax.Array:
    """float32 in [0, 1), 24 random bits: r_t of `vertex` under the hop's `key`."""
    bits = counter_hash.hash2(counter_hash.hash2(key, _VERTEX_DOMAIN), vertex)
    return (bits >> 8).astype(jnp.float32) * jnp.float32(2.0**-24)


def _scan(indptr, indices, frontier, valid, key, fanout: int, span: int):
    """(int32[C, span] scanned neighbours, bool[C, span] kept, [C, span] their edge ids)
    in scan order."""
    start, deg = row_bounds(indptr, frontier, valid)
    row_bits = counter_hash.hash2(counter_hash.hash2(key, _ROW_DOMAIN), frontier)
    first = counter_hash.uniform_below(row_bits, jnp.maximum(deg, 1))
    j = jnp.arange(span, dtype=jnp.int32)[None, :]
    off = first[:, None] + j
    off = jnp.where(off >= deg[:, None], off - deg[:, None], off)
    n = jnp.minimum(deg, span)
    scanned = j < n[:, None]
    edge = jnp.where(scanned, edge_ids(start[:, None], off), 0)
    nbr = jnp.where(scanned, take_edges(indices, edge), 0)
    p = jnp.float32(fanout) / jnp.maximum(n, 1).astype(jnp.float32)
    keep = scanned & (vertex_uniform(key, nbr) < p[:, None])
    return nbr, keep, edge


def row_counts(indptr, indices, frontier, valid, key, fanout: int, *, span: int) -> jax.Array:
    """int32[C]: neighbours each row keeps before the slot cut (for measuring the cut)."""
    _, keep, _ = _scan(indptr, indices, frontier, valid, key, fanout, span)
    return jnp.sum(keep, axis=1, dtype=jnp.int32)


def sample_labor_reference(
    indptr: jax.Array,
    indices: jax.Array,
    frontier: jax.Array,
    valid: jax.Array,
    key: jax.Array,
    fanout: int,
    *,
    slots: int,
    span: int,
    with_edges: bool = False,
) -> tuple[jax.Array, ...]:
    """LABOR-0 sample of every valid frontier row.

    Args:
      indptr, indices: the CSR graph.
      frontier: int32[C] node ids; valid: bool[C].
      key: uint32 scalar for this hop (the same for every row: that is the point).
      fanout: expected neighbours per row.
      slots: K, the static width of a row (`labor_slots`).
      span: neighbours scanned per row (see the module docstring): at least `fanout`,
        unless no row is longer than `span` (a narrower window of a longer row is kept
        whole, each neighbour with probability span / d).
      with_edges: also return the sampled edges' ids.

    Returns:
      nbr: int32[C, K] global ids, packed to the front of each row; 0 in invalid slots.
      mask: bool[C, K], a prefix of each row.
      edge (with `with_edges`): [C, K] in indptr's dtype, each slot's CSR position; 0 in
        invalid slots.
    """
    nbr, keep, edge = _scan(indptr, indices, frontier, valid, key, fanout, span)
    rank = jnp.cumsum(keep, axis=1, dtype=jnp.int32) - 1
    col = jnp.where(keep & (rank < slots), rank, slots)  # column `slots` is cut off
    rows = jnp.arange(frontier.shape[0], dtype=jnp.int32)[:, None]

    def packed(values):  # into a spare column, never out of range (ops/relabel.py, SPARE)
        out = jnp.zeros((frontier.shape[0], slots + 1), values.dtype)
        return out.at[rows, col].set(values)[:, :slots]

    out = packed(nbr)
    count = jnp.sum(keep, axis=1, dtype=jnp.int32)
    mask = jnp.arange(slots, dtype=jnp.int32)[None, :] < count[:, None]
    return (out, mask, packed(edge)) if with_edges else (out, mask)


def sample_labor(kernels: Kernels, indptr, indices, frontier, valid, key, fanout: int, *,
                 slots: int, span: int, with_edges: bool = False):
    """`sample_labor_reference`: it serves every `kernels` setting (no Pallas twin yet)."""
    del kernels
    return sample_labor_reference(indptr, indices, frontier, valid, key, fanout, slots=slots,
                                  span=span, with_edges=with_edges)
