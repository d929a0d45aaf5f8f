"""Dedup/relabel of a sampled hop into the next frontier: the op and its XLA references.

Contract shared by every implementation (the Pallas kernel in `pallas/relabel.py`
too): the next frontier keeps the current frontier as its prefix (dst-first), then every
sampled id not seen before, in order of first occurrence when the `[C, K]` neighbour
matrix is read row by row. That order depends only on the real rows, never on the
capacities, so growing the envelope reproduces the same frontier.

SPARE. Writes that must go nowhere (padding, ids past the capacity) go to one spare
entry past the end that is cut off after, never to an index out of range with
`mode="drop"`: sampling runs under `jax.vmap` (steps sampled together), which gives the
scatter a batch dimension, and XLA:GPU's deterministic scatter
(`--xla_gpu_exclude_nondeterministic_ops=true`, JAX 0.11.2) flattens its indices, so an
index one past the end of batch b's row wrote entry 0 of batch b + 1 (seen on an H200,
2026-12-01: wrong LABOR samples, other typed-loader batches).
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from zerognn_jax._src.ops.registry import Kernels, implementation


class Relabeled(NamedTuple):
    """One hop after dedup.

    Attributes:
      frontier: int32[C_next], next frontier ids; the first n_frontier entries are the
        current frontier, padding entries are 0.
      count: int32 scalar, real size of the next frontier (may exceed C_next: overflow).
      nbr_local: int32[C, K], positions of the sampled neighbours in `frontier`; 0 in
        masked slots (and meaningless when count > C_next).
    """

    frontier: jax.Array
    count: jax.Array
    nbr_local: jax.Array


def _first_positions_table(ids, valid, num_nodes):
    """For each entry, the smallest position holding the same id (scatter-min over ids)."""
    m = ids.shape[0]
    pos = jnp.arange(m, dtype=jnp.int32)
    table = jnp.full((num_nodes,), m, jnp.int32)
    # SPARE's exception: a table of N + 1 entries made products-like's dedup epoch 3 %
    # slower (H200); invalid entries write the table's own fill, m, a no-op for the min,
    # at spread ids (one id for all of them would be one contended address).
    table = table.at[jnp.where(valid, ids, pos % num_nodes)].min(jnp.where(valid, pos, m))
    return jnp.where(valid, table[jnp.where(valid, ids, 0)], pos)


def _first_positions_sort(ids, valid, num_nodes):
    """Same result as `_first_positions_table`, by a stable sort instead of a table."""
    m = ids.shape[0]
    pos = jnp.arange(m, dtype=jnp.int32)
    order = jnp.argsort(jnp.where(valid, ids, num_nodes), stable=True).astype(jnp.int32)
    sorted_ids = jnp.where(valid, ids, num_nodes)[order]
    starts = jnp.concatenate([jnp.ones((1,), bool), sorted_ids[1:] != sorted_ids[:-1]])
    head = jax.lax.cummax(jnp.where(starts, pos, 0))
    first_sorted = order[head]
    first = jnp.zeros((m,), jnp.int32).at[order].set(first_sorted)
    return jnp.where(valid, first, pos)


_METHODS = {"table": _first_positions_table, "sort": _first_positions_sort}


def relabel_reference(
    frontier: jax.Array,
    count: jax.Array,
    nbr: jax.Array,
    mask: jax.Array,
    capacity: int,
    num_nodes: int,
    *,
    method: str = "table",
) -> Relabeled:
    """Deduplicates `frontier[:count]` plus the sampled `nbr[mask]` into `capacity` slots.

    Args:
      frontier: int32[C], current frontier (first `count` entries real, all distinct).
      count: int32 scalar.
      nbr: int32[C, K], sampled global ids; mask: bool[C, K].
      capacity: C_next >= C, static.
      num_nodes: N, static; ids lie in [0, N).
      method: "table" (scatter-min over an N-entry table) or "sort" (stable argsort).
    """
    c, k = nbr.shape
    if capacity < c:
        raise ValueError(f"capacity {capacity} is smaller than the frontier capacity {c}")
    if method not in _METHODS:
        raise ValueError(f"unknown relabel method {method!r}; choose from {sorted(_METHODS)}")
    ids = jnp.concatenate([frontier, nbr.reshape(-1)])
    valid = jnp.concatenate([jnp.arange(c) < count, mask.reshape(-1)])
    first = _METHODS[method](ids, valid, num_nodes)
    pos = jnp.arange(ids.shape[0], dtype=jnp.int32)
    is_new = valid & (first == pos) & (pos >= c)
    rank = jnp.cumsum(is_new.astype(jnp.int32)) - 1
    local = jnp.where(first < c, first, count + rank[first])
    nbr_local = jnp.where(mask, local[c:].reshape(c, k), 0)
    n_next = count + jnp.sum(is_new.astype(jnp.int32))
    out = jnp.zeros((capacity + 1,), jnp.int32).at[:c].set(jnp.where(valid[:c], frontier, 0))
    out = out.at[jnp.where(is_new, jnp.minimum(count + rank, capacity), capacity)].set(ids)
    return Relabeled(out[:capacity], n_next.astype(jnp.int32), nbr_local)  # SPARE cut off


def relabel_sorted(frontier, count, nbr, mask, capacity: int, num_nodes: int) -> Relabeled:
    """`relabel_reference` finding first occurrences by a stable sort instead of a table
    (the same result; slower on GPU, docs/design.md). Select it with
    `Kernels(relabel=relabel_sorted)`."""
    return relabel_reference(frontier, count, nbr, mask, capacity, num_nodes, method="sort")


def relabel(kernels: Kernels, frontier, count, nbr, mask, capacity: int,
            num_nodes: int) -> Relabeled:
    """`relabel_reference`, or the implementation `kernels` selects for "relabel"."""
    impl = implementation(kernels, "relabel") or relabel_reference
    return Relabeled(*impl(frontier, count, nbr, mask, capacity, num_nodes))
