"""Dedup/relabel of a sampled hop in four Pallas kernels: the twin of `relabel_reference`.

Positions: the frontier holds positions 0..C-1, the flattened neighbour matrix C..C+CK-1
(row-major, as the reference concatenates them). With a table of one float32 entry per
node id, initialised to +inf (an XLA fill):

1. claim: every live position p does `atomic_min(table[id], p)`, so the table holds the
   first position of each id (float32 represents positions below 2**24 exactly; integer
   atomics on blocks do not lower, see the package docstring).
2. count: a slot whose table entry equals its own position is a new id; each program
   writes how many new ids its block holds. An XLA cumsum over the (few) block counts
   gives each block's offset.
3. assign: each new id gets rank = block offset + its exclusive prefix within the block,
   is written to the next frontier at `count + rank`, and overwrites its table entry
   with the encoded local position `-(count + rank) - 1` (negative, so no later read
   can mistake it for a position).
4. localise: every live slot reads its id's entry: a frontier position (>= 0) or an
   encoded new position; that is its local index.

The next frontier starts as the current one masked to `count` and zero-padded to the
capacity (one XLA op) and is updated in place by step 3. Output equals the reference's
exactly, overflow included.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plt

from zerognn_jax._src.pallas.common import Tiling, atomic, cdiv, launch, scatter

TILING = Tiling(block_rows=1024, num_warps=4)
# Positions are kept in float32, exact below this bound.
MAX_POSITIONS = 2**24


def hop_launch(c: int, k: int):
    """(flattened neighbour slots per program, compiler params) of the kernels of a
    [c, k] hop; the tests read the block to build hops that fill it."""
    return launch(TILING, c * k, 1)


def _block(block: int, size: int):
    q = pl.program_id(0) * block + jnp.arange(block, dtype=jnp.int32)
    return q, q < size


def _new_slots(table_ref, nbr_ref, mask_ref, q, live, c):
    """(ids, live-and-masked, is-new) of the flat slots `q`."""
    ok = plt.load(mask_ref.at[q], mask=live, other=False) & live
    ids = plt.load(nbr_ref.at[q], mask=ok, other=0)
    first = plt.load(table_ref.at[ids], mask=ok, other=-1.0)
    return ids, ok, ok & (first == (q + c).astype(jnp.float32))


def _claim_kernel(
    count_ref, frontier_ref, nbr_ref, mask_ref, _, table_ref, *, c, m, block, interpret
):
    p, live = _block(block, c)
    ok = live & (p < count_ref[0])
    ids = plt.load(frontier_ref.at[p], mask=ok, other=0)
    atomic(plt.atomic_min, table_ref, (ids,), p.astype(jnp.float32), ok, interpret=interpret)
    q, live = _block(block, m)
    ok = plt.load(mask_ref.at[q], mask=live, other=False) & live
    ids = plt.load(nbr_ref.at[q], mask=ok, other=0)
    atomic(plt.atomic_min, table_ref, (ids,), (q + c).astype(jnp.float32), ok, interpret=interpret)


def _count_kernel(table_ref, nbr_ref, mask_ref, counts_ref, *, c, m, block):
    q, live = _block(block, m)
    _, _, new = _new_slots(table_ref, nbr_ref, mask_ref, q, live, c)
    counts_ref[pl.program_id(0)] = jnp.sum(new.astype(jnp.int32))


def _assign_kernel(
    count_ref, offsets_ref, nbr_ref, mask_ref, _table, _out, table_ref, out_ref, *,
    c, m, block, capacity, interpret
):
    q, live = _block(block, m)
    ids, _, new = _new_slots(table_ref, nbr_ref, mask_ref, q, live, c)
    flags = new.astype(jnp.int32)
    local = count_ref[0] + offsets_ref[pl.program_id(0)] + jnp.cumsum(flags) - flags
    scatter(out_ref, (local,), ids, new & (local < capacity), interpret=interpret)
    scatter(table_ref, (ids,), (-local - 1).astype(jnp.float32), new, interpret=interpret)


def _localise_kernel(table_ref, nbr_ref, mask_ref, local_ref, *, m, block):
    q, live = _block(block, m)
    ok = plt.load(mask_ref.at[q], mask=live, other=False) & live
    ids = plt.load(nbr_ref.at[q], mask=ok, other=0)
    entry = plt.load(table_ref.at[ids], mask=ok, other=0.0)
    local = jnp.where(entry < 0, -entry - 1, entry).astype(jnp.int32)
    plt.store(local_ref.at[q], jnp.where(ok, local, 0), mask=live)


def _check(frontier, nbr, mask, capacity):
    c, k = nbr.shape
    if capacity < c:
        raise ValueError(f"capacity {capacity} is smaller than the frontier capacity {c}")
    if frontier.shape != (c,) or mask.shape != (c, k):
        raise ValueError(
            f"frontier {frontier.shape} and mask {mask.shape} must be ({c},) and ({c}, {k}) "
            f"for nbr of shape {nbr.shape}"
        )
    if c * (k + 1) > MAX_POSITIONS:
        raise ValueError(
            f"the Pallas relabel keeps positions in float32, exact up to {MAX_POSITIONS}; "
            f"a [{c}, {k}] hop has {c * (k + 1)} (use the XLA relabel)"
        )


def relabel(
    frontier: jax.Array,
    count: jax.Array,
    nbr: jax.Array,
    mask: jax.Array,
    capacity: int,
    num_nodes: int,
    *,
    interpret: bool = False,
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Pallas twin of `relabel_reference`: the same (frontier, count, nbr_local), computed
    with its own table scheme (module docstring)."""
    _check(frontier, nbr, mask, capacity)
    c, k = nbr.shape
    m = c * k
    block, params = hop_launch(c, k)
    grid = (cdiv(m, block),)
    call = functools.partial(pl.pallas_call, grid=grid, compiler_params=params, interpret=interpret)
    i32 = functools.partial(jax.ShapeDtypeStruct, dtype=jnp.int32)
    count = jnp.reshape(count, (1,)).astype(jnp.int32)
    frontier = frontier.astype(jnp.int32)
    flat_nbr, flat_mask = nbr.reshape(m).astype(jnp.int32), mask.reshape(m).astype(jnp.bool_)

    table = jnp.full((num_nodes,), jnp.inf, jnp.float32)
    table = call(
        functools.partial(_claim_kernel, c=c, m=m, block=block, interpret=interpret),
        out_shape=jax.ShapeDtypeStruct(table.shape, table.dtype),
        input_output_aliases={4: 0},
        name="zerognn_relabel_claim",
    )(count, frontier, flat_nbr, flat_mask, table)
    counts = call(
        functools.partial(_count_kernel, c=c, m=m, block=block),
        out_shape=i32((grid[0],)),
        name="zerognn_relabel_count",
    )(table, flat_nbr, flat_mask)
    offsets = jnp.cumsum(counts) - counts
    slot = jnp.arange(capacity, dtype=jnp.int32)
    out = jnp.where(slot < count[0], jnp.pad(frontier, (0, capacity - c)), 0)
    table, out = call(
        functools.partial(
            _assign_kernel, c=c, m=m, block=block, capacity=capacity, interpret=interpret
        ),
        out_shape=(jax.ShapeDtypeStruct(table.shape, table.dtype), i32((capacity,))),
        input_output_aliases={4: 0, 5: 1},
        name="zerognn_relabel_assign",
    )(count, offsets, flat_nbr, flat_mask, table, out)
    local = call(
        functools.partial(_localise_kernel, m=m, block=block),
        out_shape=i32((m,)),
        name="zerognn_relabel_localise",
    )(table, flat_nbr, flat_mask)
    n_next = count[0] + jnp.sum(counts)
    return out, n_next, local.reshape(c, k)
