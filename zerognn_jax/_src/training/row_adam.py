"""Row-sparse ("lazy") Adam for embedding tables: a step reads and writes only its rows.

A learnable table of one row per node (`N x D`, millions of rows) gets gradient in the
few thousand rows a sampled step gathered. Dense Adam would read and write the whole
table and both moment tables every step, more bytes than the step itself moves. Lazy
Adam (PyTorch's `SparseAdam`, TensorFlow Addons' `LazyAdam`) instead updates, for the
rows a step touched, the row, its first and second moments, and leaves every other row
and its moments as they are; the step count and so the bias correction are global.

`row_adam_update` takes the step's row ids (duplicates allowed: their gradients are
summed first, as a dense gradient would have them; padding marked invalid) and their
gradient rows, and works at a static number of rows R: unique ids come from
`jnp.unique(size=R)`, moments are gathered and scattered for those R slots only. It is
pure and jit-compatible; inside a scan the carry holds the table and `RowAdamState`.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp


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
                    grads: jax.Array, valid: jax.Array | None = None, *, lr: float,
                    b1: float = 0.9, b2: float = 0.999, eps: float = 1e-8,
                    unique: bool = False, taken=True) -> tuple[jax.Array, RowAdamState]:
    """One lazy Adam step on the rows `rows` of `table`.

    Args:
      table: [N, D], any float dtype (updates are computed in float32, stored in it).
      state: from `row_adam_init` or a previous step.
      rows: int32[R] row ids; repeats allowed.
      grads: [R, D], the gradient of each entry of `rows`.
      valid: bool[R], entries that count (None: all); invalid ones touch nothing.
      lr, b1, b2, eps: Adam's step size, decay rates and epsilon (as `optax.adam`).
      unique: the valid entries of `rows` are known to be distinct (a deduplicated
        level), so they are used as they are, without the sort that merges repeats.
      taken: bool (scalar, may be traced): the step counts in the bias correction; a
        step not taken passes no valid row, and leaves everything as it was.

    Returns:
      (table, state) with the touched rows updated and every other row, first and
      second moment bit-unchanged.
    """
    n, r = table.shape[0], rows.shape[0]
    if grads.shape != (r, *table.shape[1:]):
        raise ValueError(f"grads must be [{r}, {', '.join(map(str, table.shape[1:]))}] "
                         f"(one row per id), got {list(grads.shape)}")
    live = jnp.ones((r,), bool) if valid is None else valid
    ids = jnp.where(live, rows, n)  # n sorts last and marks a slot unused
    g = jnp.where(live.reshape(r, *(1,) * (grads.ndim - 1)), grads.astype(jnp.float32), 0.0)
    if unique:
        uniq = ids
    else:
        uniq, inverse = jnp.unique(ids, return_inverse=True, size=r, fill_value=n)
        g = jax.ops.segment_sum(g, inverse.reshape(-1), num_segments=r)
    used = uniq < n
    safe = jnp.where(used, uniq, 0)
    count = state.count + jnp.asarray(taken, jnp.int32)
    mu = b1 * state.mu[safe] + (1.0 - b1) * g
    nu = b2 * state.nu[safe] + (1.0 - b2) * jnp.square(g)
    t = count.astype(jnp.float32)
    step = lr * (mu / (1.0 - b1**t)) / (jnp.sqrt(nu / (1.0 - b2**t)) + eps)
    new_rows = (table[safe].astype(jnp.float32) - step).astype(table.dtype)
    # Unused slots go out of range, each to its own row past the end, where the scatters
    # drop them: every target is then distinct, which the scatters are told (XLA may then
    # write rows in parallel without ordering repeats).
    target = jnp.where(used, uniq, n + jnp.arange(r, dtype=uniq.dtype))
    put = lambda full, part: full.at[target].set(part, mode="drop", unique_indices=True)
    return put(table, new_rows), RowAdamState(put(state.mu, mu), put(state.nu, nu), count)
