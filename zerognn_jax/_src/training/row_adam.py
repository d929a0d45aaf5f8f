"""Row-sparse ("lazy") Adam for embedding tables: a step reads and writes only its rows.

A learnable table of one row per node (`N x D`, millions of rows) gets gradient in the
few thousand rows a sampled step gathered. Dense Adam would read and write the whole
table and both moment tables every step, more bytes than the step itself moves. Lazy
Adam (PyTorch's `SparseAdam`, TensorFlow Addons' `LazyAdam`) instead updates, for the
rows a step touched, the row, its first and second moments, and leaves every other row
and its moments as they are; the step count and so the bias correction are global.

`row_adam_update` takes the step's row ids (duplicates allowed: their gradients are
summed first, as a dense gradient would have them; padding marked invalid) and their
gradient rows, and works at a static number of rows R: repeats are merged into the slot
of each id's first occurrence, found through a table of the N rows (or, for a table far
larger than R, by `jnp.unique(size=R)`; where each id repeats at most a known number of
times, by a sort and a sum over that many neighbours), moments are gathered and
scattered for those R slots only. It is
pure and jit-compatible; inside a scan the carry holds the table and `RowAdamState`.
The row update itself is the op "row_adam" of the kernel registry: the XLA form below,
or its Pallas twin, which writes the rows in place.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp

from zerognn_jax._src.ops.registry import XLA, Kernels, given_kernels, implementation

# Repeats are merged through a table of the table's N rows while N is at most this many
# times the step's R rows (the table's fill then costs about as much as the ids' pass);
# past it by `jnp.unique`'s sort.
TABLE_MERGE_ROWS = 16


class RowAdamState(NamedTuple):
    """Lazy Adam's state for one table.

    Attributes:
      mu, nu: float32[N, D], first and second moments; rows never touched stay zero.
      count: int32 scalar, steps taken (the bias correction's t).
    """

    mu: jax.Array
    nu: jax.Array
    count: jax.Array


def row_adam_init(table: jax.Array) -> RowAdamState:
    """Zero moments (float32, whatever the table's dtype) and a zero step count."""
    zeros = lambda: jnp.zeros(table.shape, jnp.float32)  # two buffers: a carry donates each
    return RowAdamState(zeros(), zeros(), jnp.zeros((), jnp.int32))


def row_adam_update(table: jax.Array, state: RowAdamState, rows: jax.Array,
                    grads: jax.Array, valid: jax.Array | None = None, *,
                    lr: float | Callable[[jax.Array], jax.Array],
                    b1: float = 0.9, b2: float = 0.999, eps: float = 1e-8,
                    unique: bool = False, repeats: int | None = None, taken=True,
                    kernels: Kernels | str | None = None) -> tuple[jax.Array, RowAdamState]:
    """One lazy Adam step on the rows `rows` of `table`.

    Args:
      table: [N, D] (or [N, ...], rows of any shape), any float dtype (updates are
        computed in float32, stored in it).
      state: from `row_adam_init` or a previous step.
      rows: int32[R] row ids; repeats allowed; one outside [0, N) touches nothing.
      grads: [R, D], the gradient of each entry of `rows`.
      valid: bool[R], entries that count (None: all); invalid ones touch nothing.
      lr, b1, b2, eps: Adam's step size, decay rates and epsilon (as `optax.adam`); `lr`
        may be a schedule, called with the count of steps before this one.
      unique: the valid entries of `rows` are known to be distinct (a deduplicated
        level sampled from distinct seeds: a seed given twice stays twice in every
        level), so they are used as they are, without the merge of repeats.
      repeats: each valid id is known to appear at most this many times (the rows of
        several devices, each device's distinct): repeats are merged by one sort and a
        sum over that many sorted neighbours (`_merge_sorted`), without
        `jnp.unique`'s scatter of every gradient row. None: any number of times.
      taken: bool (scalar, may be traced): the step counts in the bias correction; a
        step not taken passes no valid row, and leaves everything as it was.
      kernels: a `Kernels` or its spec: which implementation runs the row update
        ("row_adam": the XLA form, or
        the Pallas kernel that writes the rows in place); None: XLA.

    Returns:
      (table, state) with the touched rows updated and every other row, first and
      second moment bit-unchanged.
    """
    _check_arguments(table, state, rows, valid)
    n, r = table.shape[0], rows.shape[0]
    if grads.shape != (r, *table.shape[1:]):
        raise ValueError(f"grads must be [{r}, {', '.join(map(str, table.shape[1:]))}] "
                         f"(one row per id), got {list(grads.shape)}")
    # an id outside [0, N) touches nothing (-1, a common padding, wrapped to row N - 1)
    live = (rows >= 0) & (rows < n) & (True if valid is None else valid)
    ids = jnp.where(live, rows, n)  # n sorts last and marks a slot unused
    if unique:
        uniq, g = ids, grads
    elif repeats is not None:
        uniq, g = _merge_sorted(ids, grads, n, repeats)
    elif n <= TABLE_MERGE_ROWS * r:
        uniq, g = _merge_by_table(ids, grads, n)
    else:
        g = jnp.where(_rows_mask(live, grads), grads.astype(jnp.float32), 0.0)
        uniq, inverse = jnp.unique(ids, return_inverse=True, size=r, fill_value=n)
        g = jax.ops.segment_sum(g, inverse.reshape(-1), num_segments=r)
    rate = lr(state.count) if callable(lr) else lr
    count = state.count + jnp.asarray(taken, jnp.int32)
    kernels = given_kernels(kernels or XLA)
    update = implementation(kernels, "row_adam") or row_adam_rows_reference
    # rows of any shape as flat [N, D] rows (the Pallas kernel takes those alone)
    width = math.prod(table.shape[1:])
    flat = lambda a: a.reshape(a.shape[0], width)
    new, mu, nu = update(flat(table), flat(state.mu), flat(state.nu), uniq, uniq < n,
                         flat(g), count, lr=rate, b1=b1, b2=b2, eps=eps)
    back = lambda a: a.reshape(table.shape)
    return back(new), RowAdamState(back(mu), back(nu), count)


def _check_arguments(table, state, rows, valid) -> None:
    """ValueError, in one line, for a state that is not this table's lazy Adam state, or
    row ids and `valid` that are not one flag per id."""
    if not isinstance(state, RowAdamState):
        raise ValueError(f"state must be the RowAdamState of row_adam_init(table) (or of a "
                         f"previous step), got {type(state).__name__}")
    if state.mu.shape != table.shape or state.nu.shape != table.shape:
        raise ValueError(f"state holds moments of shape {list(state.mu.shape)}, the table "
                         f"is {list(table.shape)}: give the state row_adam_init made for "
                         f"this table")
    if state.mu.dtype != jnp.float32 or state.nu.dtype != jnp.float32:
        # (the XLA form would keep them in their dtype, the Pallas kernel refused them)
        raise ValueError(f"state holds moments of dtype {state.mu.dtype} and "
                         f"{state.nu.dtype}; lazy Adam keeps them in float32 whatever the "
                         f"table's dtype: give the state row_adam_init made for this table")
    if rows.ndim != 1 or not jnp.issubdtype(rows.dtype, jnp.integer):
        raise ValueError(f"rows must be 1-D integer row ids [R], got "
                         f"{rows.dtype}{list(rows.shape)}")
    if valid is not None and jnp.shape(valid) != rows.shape:
        raise ValueError(f"valid must hold one flag per row id ({list(rows.shape)}), got "
                         f"{list(jnp.shape(valid))}")


def _merge_by_table(ids: jax.Array, grads: jax.Array, n: int
                    ) -> tuple[jax.Array, jax.Array]:
    """(int32[R] ids, float32[R, ...] gradient sums): each valid id's gradient rows
    summed into the slot of its first occurrence, found through a table of N positions
    (a scatter-min of the slots by id, read back at each slot), the other slots and the
    invalid ones (id n) marked n, unused. One pass over the ids and one scatter-add of
    the rows: no sort. An invalid slot adds its row to itself (no index leaves [0, R);
    the update reads no unused slot's sum)."""
    r = ids.shape[0]
    pos = jnp.arange(r, dtype=jnp.int32)
    valid = ids < n
    # an invalid slot writes the table's own fill, R, at a spread id: a no-op for the min
    first = jnp.full((n,), r, jnp.int32).at[jnp.where(valid, ids, pos % n)].min(
        jnp.where(valid, pos, r))
    owner = jnp.where(valid, first[jnp.where(valid, ids, 0)], pos)
    total = jnp.zeros(grads.shape, jnp.float32).at[owner].add(grads.astype(jnp.float32))
    return jnp.where(valid & (owner == pos), ids, n), total


def _merge_sorted(ids: jax.Array, grads: jax.Array, n: int, repeats: int
                  ) -> tuple[jax.Array, jax.Array]:
    """(int32[R] ids, float32[R, ...] gradient sums): `ids` (invalid ones n) sorted, each
    run of equal valid ids summed into its first slot (the others and the invalid ones
    marked n, unused), where no id appears more than `repeats` times. Every slot sums
    the gradient rows of its next `repeats` - 1 sorted neighbours that hold its id,
    gathered by position: gathers and adds, no scatter."""
    r = ids.shape[0]
    order = jnp.argsort(ids, stable=True)
    ids_sorted = ids[order]
    total = grads[order].astype(jnp.float32)
    for k in range(1, min(repeats, r)):
        same = jnp.concatenate([ids_sorted[k:], jnp.full((k,), n, ids.dtype)]) == ids_sorted
        at = jnp.concatenate([order[k:], jnp.zeros((k,), order.dtype)])
        total = total + jnp.where(_rows_mask(same, grads), grads[at].astype(jnp.float32),
                                  0.0)
    first = jnp.concatenate([jnp.ones((1,), bool), ids_sorted[1:] != ids_sorted[:-1]])
    return jnp.where(first, ids_sorted, n), total


def _rows_mask(used: jax.Array, rows: jax.Array) -> jax.Array:
    return used.reshape(used.shape[0], *(1,) * (rows.ndim - 1))


def row_adam_rows_reference(table: jax.Array, mu: jax.Array, nu: jax.Array, ids: jax.Array,
                            used: jax.Array, grads: jax.Array, count: jax.Array, *,
                            lr: float, b1: float, b2: float, eps: float):
    """(table, mu, nu) after Adam's step `count` on the rows `ids` where `used` (distinct
    among the used slots), with gradient rows `grads`; every other row as it was.

    The XLA form: gather the rows and both moments, compute, scatter the three back. Its
    Pallas twin (`pallas/row_adam.py`) writes them in place."""
    n, r = table.shape[0], ids.shape[0]
    g = jnp.where(_rows_mask(used, grads), grads.astype(jnp.float32), 0.0)
    safe = jnp.where(used, ids, 0)
    mu_rows = b1 * mu[safe] + (1.0 - b1) * g
    nu_rows = b2 * nu[safe] + (1.0 - b2) * jnp.square(g)
    t = count.astype(jnp.float32)
    step = lr * (mu_rows / (1.0 - b1**t)) / (jnp.sqrt(nu_rows / (1.0 - b2**t)) + eps)
    new_rows = (table[safe].astype(jnp.float32) - step).astype(table.dtype)
    # Unused slots go out of range, each to its own row past the end, where the scatters
    # drop them: every target is then distinct, which the scatters are told (XLA may then
    # write rows in parallel without ordering repeats).
    target = jnp.where(used, ids, n + jnp.arange(r, dtype=ids.dtype))
    put = lambda full, part: full.at[target].set(part, mode="drop", unique_indices=True)
    return put(table, new_rows), put(mu, mu_rows), put(nu, nu_rows)
