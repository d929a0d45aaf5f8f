"""Edge blocks: a sampled hop's live slots compacted into one level-wide edge list.

A row-form block is [C, K]: every row has K slots, K the most a row may keep. When the
count per row is random (LABOR-0: a row keeps each neighbour with probability f / d, so
it needs K = 28 slots for an expected 15) most slots are dead, and a layer that
aggregates over the block reads C x K of them. An edge block holds only the live slots,
row by row, in an edge list of a static capacity E (the execution envelope's budget for
the hop, `Envelope.edges`: calibrated like the level capacities, about f x C instead of
K x C); layers read it as an `EdgeView` (a gather and a sorted segment sum).

The edges keep the row-form order: row-major over [C, K], live slots only. So the kept
neighbours, the dedup order and every sampled subgraph are those of the row form; only
the shape differs. A hop whose live slots exceed E sets the minibatch's overflow flag
(its count is in `MiniBatch.counts`) and the engine replays it with a larger budget.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp


class Compacted(NamedTuple):
    """One hop's live slots as an edge list of capacity E.

    Attributes:
      values: the compacted arrays, each [E] in its input's dtype; 0 past `count`.
      dst: int32[E], each edge's row (non-decreasing); C (one past the last row) past
        `count`, where segment sums drop it.
      live: bool[E], a prefix: the first min(count, E) entries.
      count: int32 scalar, the live slots before the cut (above E: overflow).
    """

    values: tuple
    dst: jax.Array
    live: jax.Array
    count: jax.Array


def compact_rows(values, mask: jax.Array, capacity: int) -> Compacted:
    """Compacts the live slots of [C, K] `values` (a tuple of arrays) into `capacity` edges.

    Args:
      values: arrays [C, K] of any dtype (None entries pass through as None).
      mask: bool[C, K], the live slots (any pattern; LABOR's are row prefixes).
      capacity: E >= 1, static.
    """
    if capacity < 1:
        raise ValueError(f"an edge block needs a capacity of at least 1, got {capacity}")
    c = mask.shape[0]
    per_row = jnp.sum(mask, axis=1, dtype=jnp.int32)
    start = jnp.cumsum(per_row, dtype=jnp.int32) - per_row
    rank = jnp.cumsum(mask, axis=1, dtype=jnp.int32) - 1
    pos = jnp.where(mask, start[:, None] + rank, capacity)  # dead slots are dropped
    rows = jnp.broadcast_to(jnp.arange(c, dtype=jnp.int32)[:, None], mask.shape)
    count = jnp.sum(per_row)
    return Compacted(
        tuple(None if v is None else _scatter(v, pos, capacity, 0) for v in values),
        _scatter(rows, pos, capacity, c),
        jnp.arange(capacity, dtype=jnp.int32) < count,
        count,
    )


def _scatter(values, pos, capacity: int, fill) -> jax.Array:
    out = jnp.full((capacity,), fill, values.dtype)
    return out.at[pos.reshape(-1)].set(values.reshape(-1), mode="drop")
