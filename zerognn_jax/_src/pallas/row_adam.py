"""Lazy Adam's row update in place, as a Pallas kernel: the twin of `row_adam_rows_reference`.

The XLA form gathers a step's rows of the table and both moments, computes their new
values into fresh [R, D] buffers, then scatters the three back: every byte of the new
rows is written twice and read once more. Here a program reads a block of distinct rows
(by a tile of feature lanes) of the table, its moments and the gradient, and writes the
new values straight back into the same buffers (`input_output_aliases`), so the update
moves each row once each way. Row ids must be distinct among the used slots (the caller
merges repeats first), so no two programs write one row.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plt

from zerognn_jax._src.pallas.common import Tiling, cdiv, launch, next_pow2, scatter

TILING = Tiling(block_rows=16, block_cols=128, num_warps=4)


def _kernel(coef_ref, ids_ref, used_ref, grads_ref, _t, _m, _v, table_ref, mu_ref, nu_ref,
            *, r, d, rows, cols, b1, b2, eps, interpret):
    i = pl.program_id(0) * rows + jnp.arange(rows, dtype=jnp.int32)
    col = pl.program_id(1) * cols + jnp.arange(cols, dtype=jnp.int32)
    live = i < r
    ok = plt.load(used_ref.at[i], mask=live, other=False) & live
    ids = plt.load(ids_ref.at[i], mask=ok, other=0)
    mask = ok[:, None] & (col < d)[None, :]
    at = (ids[:, None], col[None, :])
    g = plt.load(grads_ref.at[i[:, None], col[None, :]], mask=mask, other=0)
    g = g.astype(jnp.float32)
    mu = b1 * plt.load(mu_ref.at[at], mask=mask, other=0.0) + (1.0 - b1) * g
    nu = b2 * plt.load(nu_ref.at[at], mask=mask, other=0.0) + (1.0 - b2) * (g * g)
    old = plt.load(table_ref.at[at], mask=mask, other=0).astype(jnp.float32)
    # The XLA form's expression, term by term: lr * (mu / c1) / (sqrt(nu / c2) + eps).
    step = coef_ref[2] * (mu / coef_ref[0]) / (jnp.sqrt(nu / coef_ref[1]) + eps)
    scatter(table_ref, at, (old - step).astype(table_ref.dtype), mask, interpret=interpret)
    scatter(mu_ref, at, mu, mask, interpret=interpret)
    scatter(nu_ref, at, nu, mask, interpret=interpret)


def row_adam_rows(table: jax.Array, mu: jax.Array, nu: jax.Array, ids: jax.Array,
                  used: jax.Array, grads: jax.Array, count: jax.Array, *, lr,
                  b1: float, b2: float, eps: float, interpret: bool = False):
    """Pallas twin of `row_adam.row_adam_rows_reference`: (table, mu, nu) with the rows
    `ids` where `used` updated, in place."""
    if table.ndim != 2 or mu.shape != table.shape or nu.shape != table.shape:
        raise ValueError(f"need a table [N, D] and moments of its shape; got "
                         f"{table.shape}, {mu.shape}, {nu.shape}")
    if mu.dtype != jnp.float32 or nu.dtype != jnp.float32:
        raise ValueError(f"the moments must be float32 (row_adam_init makes them so); got "
                         f"{mu.dtype} and {nu.dtype}")
    r, d = ids.shape[0], table.shape[1]
    if used.shape != (r,) or grads.shape != (r, d):
        raise ValueError(f"need ids [R], used [R] and grads [R, D]; got {ids.shape}, "
                         f"{used.shape}, {grads.shape} with D = {d}")
    t = count.astype(jnp.float32)
    # the step size among them (a schedule's is traced); four, a power of two for Triton
    coef = jnp.stack([1.0 - b1**t, 1.0 - b2**t, jnp.asarray(lr, jnp.float32),
                      jnp.zeros((), jnp.float32)])
    cols = min(next_pow2(d), TILING.block_cols)
    col_tiles = cdiv(d, cols)
    rows, params = launch(TILING, r, cols, col_tiles)
    kernel = functools.partial(_kernel, r=r, d=d, rows=rows, cols=cols, b1=b1, b2=b2,
                               eps=eps, interpret=interpret)
    shapes = tuple(jax.ShapeDtypeStruct(a.shape, a.dtype) for a in (table, mu, nu))
    return pl.pallas_call(
        kernel,
        out_shape=shapes,
        grid=(cdiv(r, rows), col_tiles),
        input_output_aliases={4: 0, 5: 1, 6: 2},
        compiler_params=params,
        interpret=interpret,
        name="zerognn_row_adam",
    )(coef, ids.astype(jnp.int32), used.astype(jnp.bool_), grads, table, mu, nu)
