"""Fused gather + aggregation over the fanout axis, forward and backward in Pallas.

Twins of `aggregate.weighted_sum_reference` and `aggregate.max_reference`. A program
owns a block of destination rows by a tile of feature lanes and loops over the K slots:
it gathers the K source rows straight from `h_src` and reduces them in registers, so the
[C, K, d] tensor that the XLA reference builds for autodiff is never materialised.

Backward, also in Pallas (`jax.custom_vjp`):
- weighted sum: d h_src is a scatter-add of `w * dout` into the source rows with float32
  atomics; d weights are per-head dot products of `dout` with the gathered source rows
  (one partial per feature tile, summed by XLA).
- max: the forward also stores, per output element, how many valid slots attain the
  maximum; the backward gathers the source rows again and adds `dout / count` to every
  tied slot, which is exactly how `jax.grad` of `jnp.max` splits a gradient among ties
  (ties are common: ReLU features hold many exact zeros).
Sums are accumulated in float32; gradients through atomics are order-nondeterministic
in the last bits.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plt

from zerognn_jax._src.pallas.common import Tiling, atomic, cdiv, fanout_loop, launch, next_pow2

# Forward and backward launch configurations, picked by the sweep in benchmarks/kernels.py
# (docs/kernels.md); `tiling=` overrides both.
TILING = Tiling(block_rows=8, block_cols=128, num_warps=4)
BACKWARD_TILING = Tiling(block_rows=8, block_cols=128, num_warps=4)
_F32 = jnp.float32


def _tiles(c: int, d: int, tiling: Tiling):
    cols = min(next_pow2(d), tiling.block_cols)
    col_tiles = cdiv(d, cols)
    rows, params = launch(tiling, c, cols, col_tiles)
    return rows, cols, (cdiv(c, rows), col_tiles), params


def _coords(c, d, rows, cols):
    """Row ids [R], lane ids [1, L], live rows [R] and the live tile [R, L] of a program."""
    r = pl.program_id(0) * rows + jnp.arange(rows, dtype=jnp.int32)
    col = (pl.program_id(1) * cols + jnp.arange(cols, dtype=jnp.int32))[None, :]
    live = r < c
    return r, col, live, live[:, None] & (col < d)


def _call(kernel, out_shape, grid, params, interpret, name, aliases=None):
    return pl.pallas_call(
        kernel,
        out_shape=out_shape,
        grid=grid,
        input_output_aliases=aliases or {},
        compiler_params=params,
        interpret=interpret,
        name=name,
    )


# ----------------------------------------------------------------------------- weighted sum


def _slot_weights(w_ref, r, j, head, live, tile):
    """float32 weights of slot j, [R, 1] for one head (one load per row), else [R, L]."""
    if w_ref.shape[2] == 1:
        return plt.load(w_ref.at[r, j, 0], mask=live, other=0).astype(_F32)[:, None]
    return plt.load(w_ref.at[r[:, None], j, head], mask=tile, other=0).astype(_F32)


def _ws_fwd_kernel(h_ref, nbr_ref, w_ref, out_ref, *, c, k, d, f, rows, cols):
    r, col, live, tile = _coords(c, d, rows, cols)
    head = col // f

    def step(j, acc):
        idx = plt.load(nbr_ref.at[r, j], mask=live, other=0)
        w = _slot_weights(w_ref, r, j, head, live, tile)
        x = plt.load(h_ref.at[idx[:, None], col], mask=tile & (w != 0), other=0).astype(_F32)
        return acc + w * x

    acc = fanout_loop(k, step, jnp.zeros((rows, cols), _F32))
    plt.store(out_ref.at[r[:, None], col], acc.astype(out_ref.dtype), mask=tile)


def _ws_bwd_kernel(
    h_ref, nbr_ref, w_ref, g_ref, _, dh_ref, dw_ref, *, c, k, d, f, heads, rows, cols, interpret
):
    r, col, live, tile = _coords(c, d, rows, cols)
    head = col // f
    hcol = jnp.arange(next_pow2(heads), dtype=jnp.int32)[None, :]
    tile_id = pl.program_id(1)  # read outside the loop: the interpreter needs it there
    g = plt.load(g_ref.at[r[:, None], col], mask=tile, other=0).astype(_F32)

    def step(j, carry):
        idx = plt.load(nbr_ref.at[r, j], mask=live, other=0)
        w = _slot_weights(w_ref, r, j, head, live, tile)
        upd = (idx[:, None], col)
        atomic(plt.atomic_add, dh_ref, upd, w * g, tile & (w != 0), interpret=interpret)
        x = plt.load(h_ref.at[upd], mask=tile, other=0).astype(_F32)
        prod = x * g
        dw = jnp.zeros((rows, hcol.shape[1]), _F32)
        for h in range(heads):
            per_head = jnp.sum(jnp.where(head == h, prod, 0), axis=1)
            dw = jnp.where(hcol == h, per_head[:, None], dw)
        at = (tile_id, r[:, None], j, hcol)
        plt.store(dw_ref.at[at], dw, mask=live[:, None] & (hcol < heads))
        return carry

    fanout_loop(k, step, ())


def _ws_forward(h_src, nbr, weights, interpret, tiling):
    s, heads, f = h_src.shape
    c, k = nbr.shape
    d = heads * f
    rows, cols, grid, params = _tiles(c, d, tiling or TILING)
    kernel = functools.partial(_ws_fwd_kernel, c=c, k=k, d=d, f=f, rows=rows, cols=cols)
    out = _call(
        kernel, jax.ShapeDtypeStruct((c, d), h_src.dtype), grid, params, interpret,
        "zerognn_weighted_sum",
    )(h_src.reshape(s, d), nbr, weights)
    return out.reshape(c, heads, f)


def _ws_backward(h_src, nbr, weights, g, interpret, tiling):
    s, heads, f = h_src.shape
    c, k = nbr.shape
    d = heads * f
    rows, cols, grid, params = _tiles(c, d, tiling or BACKWARD_TILING)
    kernel = functools.partial(
        _ws_bwd_kernel, c=c, k=k, d=d, f=f, heads=heads, rows=rows, cols=cols,
        interpret=interpret,
    )
    out_shape = (
        jax.ShapeDtypeStruct((s, d), _F32),
        jax.ShapeDtypeStruct((grid[1], c, k, heads), _F32),
    )
    dh, dw = _call(
        kernel, out_shape, grid, params, interpret, "zerognn_weighted_sum_bwd", aliases={4: 0}
    )(h_src.reshape(s, d), nbr, weights, g.reshape(c, d), jnp.zeros((s, d), _F32))
    return dh.reshape(h_src.shape).astype(h_src.dtype), dw.sum(0).astype(weights.dtype)


@functools.partial(jax.custom_vjp, nondiff_argnums=(3, 4))
def _weighted_sum(h_src, nbr, weights, interpret, tiling):
    return _ws_forward(h_src, nbr, weights, interpret, tiling)


def _weighted_sum_fwd(h_src, nbr, weights, interpret, tiling):
    return _ws_forward(h_src, nbr, weights, interpret, tiling), (h_src, nbr, weights)


def _weighted_sum_bwd(interpret, tiling, res, g):
    h_src, nbr, weights = res
    dh, dw = _ws_backward(h_src, nbr, weights, g, interpret, tiling)
    # As the reference: a slot whose weights are all zero is not read, so it has no
    # weight gradient either.
    live = jnp.any(weights != 0, axis=-1, keepdims=True)
    return dh, None, jnp.where(live, dw, jnp.zeros((), dw.dtype))


_weighted_sum.defvjp(_weighted_sum_fwd, _weighted_sum_bwd)


def weighted_sum(
    h_src: jax.Array,
    nbr: jax.Array,
    weights: jax.Array,
    *,
    interpret: bool = False,
    tiling: Tiling | None = None,
) -> jax.Array:
    """Pallas twin of `aggregate.weighted_sum_reference`: float[C, H, F], differentiable.

    out[c, h] = sum_k weights[c, k, h] * h_src[nbr[c, k], h]; weights are zero in masked
    slots, and a zero weight skips its source row's read in the forward pass. `tiling`
    replaces TILING and BACKWARD_TILING (benchmark sweeps).
    """
    if h_src.ndim != 3 or nbr.ndim != 2 or weights.shape != (*nbr.shape, h_src.shape[1]):
        raise ValueError(
            f"need h_src [S, H, F], nbr [C, K] and weights [C, K, H]; got h_src "
            f"{h_src.shape}, nbr {nbr.shape}, weights {weights.shape}"
        )
    return _weighted_sum(h_src, nbr.astype(jnp.int32), weights, interpret, tiling)


# ------------------------------------------------------------------------------------- max


def _max_fwd_kernel(h_ref, nbr_ref, mask_ref, out_ref, cnt_ref, *, c, k, d, rows, cols):
    r, col, live, tile = _coords(c, d, rows, cols)

    def step(j, carry):
        best, cnt = carry
        idx = plt.load(nbr_ref.at[r, j], mask=live, other=0)
        hit = plt.load(mask_ref.at[r, j], mask=live, other=False)[:, None] & tile
        x = plt.load(h_ref.at[idx[:, None], col], mask=hit, other=-jnp.inf).astype(_F32)
        above = hit & ((x > best) | (x != x))  # a NaN wins and stays, as jnp.max's
        cnt = jnp.where(above, 1, cnt + (hit & (x == best)).astype(jnp.int32))
        return jnp.where(above, x, best), cnt

    init = (jnp.full((rows, cols), -jnp.inf, _F32), jnp.zeros((rows, cols), jnp.int32))
    best, cnt = fanout_loop(k, step, init)
    out = (r[:, None], col)
    plt.store(out_ref.at[out], jnp.where(cnt > 0, best, 0).astype(out_ref.dtype), mask=tile)
    plt.store(cnt_ref.at[out], cnt.astype(cnt_ref.dtype), mask=tile)


def _max_bwd_kernel(
    h_ref, nbr_ref, mask_ref, out_ref, cnt_ref, g_ref, _, dh_ref, *, c, k, d, rows, cols,
    interpret
):
    r, col, live, tile = _coords(c, d, rows, cols)
    at = (r[:, None], col)
    cnt = plt.load(cnt_ref.at[at], mask=tile, other=0).astype(jnp.int32)
    tile = tile & (cnt > 0)
    best = plt.load(out_ref.at[at], mask=tile, other=0).astype(_F32)
    g = plt.load(g_ref.at[at], mask=tile, other=0).astype(_F32)
    # a NaN maximum sends NaN to every live slot of its row, as jnp.max's gradient does
    nan = best != best
    share = jnp.where(nan, jnp.nan, g / jnp.maximum(cnt, 1).astype(_F32))

    def step(j, carry):
        idx = plt.load(nbr_ref.at[r, j], mask=live, other=0)
        hit = plt.load(mask_ref.at[r, j], mask=live, other=False)[:, None] & tile
        upd = (idx[:, None], col)
        x = plt.load(h_ref.at[upd], mask=hit, other=0).astype(_F32)
        atomic(plt.atomic_add, dh_ref, upd, share, hit & ((x == best) | nan),
               interpret=interpret)
        return carry

    fanout_loop(k, step, ())


def _count_dtype(k: int):
    return jnp.int8 if k < 128 else jnp.int32


def _max_forward(h_src, nbr, mask, interpret, tiling):
    d, (c, k) = h_src.shape[1], nbr.shape
    rows, cols, grid, params = _tiles(c, d, tiling or TILING)
    kernel = functools.partial(_max_fwd_kernel, c=c, k=k, d=d, rows=rows, cols=cols)
    out_shape = (
        jax.ShapeDtypeStruct((c, d), h_src.dtype),
        jax.ShapeDtypeStruct((c, d), _count_dtype(k)),
    )
    return _call(kernel, out_shape, grid, params, interpret, "zerognn_neighbor_max")(
        h_src, nbr, mask
    )


@functools.partial(jax.custom_vjp, nondiff_argnums=(3, 4))
def _neighbor_max(h_src, nbr, mask, interpret, tiling):
    return _max_forward(h_src, nbr, mask, interpret, tiling)[0]


def _neighbor_max_fwd(h_src, nbr, mask, interpret, tiling):
    out, cnt = _max_forward(h_src, nbr, mask, interpret, tiling)
    return out, (h_src, nbr, mask, out, cnt)


def _neighbor_max_bwd(interpret, tiling, res, g):
    h_src, nbr, mask, out, cnt = res
    (s, d), (c, k) = h_src.shape, nbr.shape
    rows, cols, grid, params = _tiles(c, d, tiling or BACKWARD_TILING)
    kernel = functools.partial(
        _max_bwd_kernel, c=c, k=k, d=d, rows=rows, cols=cols, interpret=interpret
    )
    dh = _call(
        kernel, jax.ShapeDtypeStruct((s, d), _F32), grid, params, interpret,
        "zerognn_neighbor_max_bwd", aliases={6: 0},
    )(h_src, nbr, mask, out, cnt, g, jnp.zeros((s, d), _F32))
    return dh.astype(h_src.dtype), None, None


_neighbor_max.defvjp(_neighbor_max_fwd, _neighbor_max_bwd)


def neighbor_max(
    h_src: jax.Array,
    nbr: jax.Array,
    mask: jax.Array,
    *,
    interpret: bool = False,
    tiling: Tiling | None = None,
) -> jax.Array:
    """Pallas twin of `aggregate.max_reference`: float[C, d], 0 for empty rows, differentiable.

    The gradient splits among tied maxima as `jax.grad` of the reference does (for finite
    inputs; a row whose maximum is -inf is outside that promise). `tiling` as for
    `weighted_sum`.
    """
    if h_src.ndim != 2 or nbr.ndim != 2 or mask.shape != nbr.shape:
        raise ValueError(
            f"need h_src [S, d], nbr [C, K] and mask [C, K]; got h_src {h_src.shape}, "
            f"nbr {nbr.shape}, mask {mask.shape}"
        )
    mask = mask.astype(jnp.bool_)
    return _neighbor_max(h_src, nbr.astype(jnp.int32), mask, interpret, tiling)
