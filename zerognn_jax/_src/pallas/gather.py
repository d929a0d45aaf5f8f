"""Feature-row gather as a Pallas kernel: the twin of `aggregate.gather_rows_reference`.

A program copies a block of rows by a tile of feature lanes (the feature axis is tiled
in powers of two and masked at its end); invalid rows are written as zeros without
reading the table. XLA's own gather is already a single bandwidth-bound kernel, so this
one is kept for the ablation and is not the default (see `docs/kernels.md`).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plt

from zerognn_jax._src.pallas.common import Tiling, cdiv, launch, next_pow2

TILING = Tiling(block_rows=32, block_cols=128, num_warps=4)


def _gather_kernel(table_ref, ids_ref, valid_ref, out_ref, *, c, d, rows, cols):
    r = pl.program_id(0) * rows + jnp.arange(rows, dtype=jnp.int32)
    col = pl.program_id(1) * cols + jnp.arange(cols, dtype=jnp.int32)
    live = r < c
    ok = plt.load(valid_ref.at[r], mask=live, other=False) & live
    ids = plt.load(ids_ref.at[r], mask=ok, other=0)
    lanes = (col < d)[None, :]
    x = plt.load(table_ref.at[ids[:, None], col[None, :]], mask=ok[:, None] & lanes, other=0)
    plt.store(out_ref.at[r[:, None], col[None, :]], x, mask=live[:, None] & lanes)


def gather_rows(
    table: jax.Array, ids: jax.Array, valid: jax.Array, *, interpret: bool = False
) -> jax.Array:
    """Pallas twin of `aggregate.gather_rows_reference`: float[C, d], zero where invalid."""
    if table.ndim != 2 or ids.ndim != 1 or valid.shape != ids.shape:
        raise ValueError(
            f"need table [N, d], ids [C] and valid [C]; got {table.shape}, {ids.shape}, "
            f"{valid.shape}"
        )
    c, d = ids.shape[0], table.shape[1]
    cols = min(next_pow2(d), TILING.block_cols)
    col_tiles = cdiv(d, cols)
    rows, params = launch(TILING, c, cols, col_tiles)
    return pl.pallas_call(
        functools.partial(_gather_kernel, c=c, d=d, rows=rows, cols=cols),
        out_shape=jax.ShapeDtypeStruct((c, d), table.dtype),
        grid=(cdiv(c, rows), col_tiles),
        compiler_params=params,
        interpret=interpret,
        name="zerognn_gather_rows",
    )(table, ids.astype(jnp.int32), valid.astype(jnp.bool_))
