"""Layers 0 and 1 of a tree-layout SAGE step as one op ("the layer pair"), whose backward
gives layer 0's weights their gradient over layer 1's slot rows by a Mosaic GPU kernel
that never writes those rows' output gradient: alone, and inside papers100m-like's step
(docs/benchmarks.md, "The layer pair: layer 0's backward as a Mosaic GPU kernel";
slower in the step, not in the library).

The kernel: a program loads a block of layer 0's output Z and input X for one slot of
64 parents (TMA copies, pipelined), builds dZ (layer 1's gradient times the slot's
weight, ReLU', dropout's counter hash) in shared memory in place of Z, and accumulates
dZ^T X and dZ^T 1 (the bias) with wgmma; programs over (64 of Z's columns, a split of
the parents), partial sums added after.

The level pair (docs/benchmarks.md, "The level pair"; built, not yet run on a GPU): the
same op without the split, layer 0's product over the whole level as the library
computes it, and a kernel (`level_gradient`) that walks the level in its own row order,
laying layer 1's gradient rows onto each tile's rows by a 0/1 product.

Alone: the whole layer-0 backward at papers100m-like's tree-layout shapes (level 2's
180,224 rows, the first 16,384 layer 1's own, the rest its 10 slots each; 256 input and
output columns; bfloat16), `layer0_backward.reference` against the layer pair's kernel
plus an XLA product for the own rows and against the level kernel (the own rows its own;
2 and 3 pipeline stages); checked, then timed as `layer0_backward.timed` does. In the
step (`--step`): papers100m-like generated once (benchmarks/papers100m.py's preset and
training configuration), then epochs of each form in turn, one process, one upload:

  auto        the library (layers 0 and 1 apart)
  pair        the layer pair, its slot gradient by the kernel
  pair-xla    the layer pair, its slot gradient in XLA
  level       the level pair: layer 0 as the library computes it, its weight gradient by
              the level kernel (`level_gradient`: the whole level as it lies, own rows
              and slot rows, no split)
  level-xla   the level pair, its weight gradient in XLA

    python3 benchmarks/layer0_mosaic.py                    # a GPU: alone
    python3 benchmarks/layer0_mosaic.py --step --root DIR  # a GPU: in the step
"""

from __future__ import annotations

import argparse
import functools
import importlib.util
import json
import pathlib

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu
from layer0_backward import RATE, inputs, keep_mask, reference, relative_error, timed, with_own_rows

from zerognn_jax._src.nn.models import hash_dropout

FORMS = ("auto", "pair", "pair-xla", "level", "level-xla")
TILE = 64  # Z's columns a program takes, and the parents of a block

# ------------------------------------------------------------------ the kernel


def _transforms(cols: int, dtype):
    bits = jnp.dtype(dtype).itemsize * 8
    swizzle = plgpu.find_swizzle(cols * bits)
    return (plgpu.TilingTransform((8, swizzle * 8 // bits)), plgpu.SwizzleTransform(swizzle))


def _splits(blocks: int, tiles: int) -> int:
    """The parents' splits: the most that divide `blocks` and keep all programs in one
    wave on the device's multiprocessors."""
    cores = getattr(jax.devices()[0], "core_count", 132) or 132
    return max(d for d in range(1, blocks + 1) if blocks % d == 0 and d * tiles <= max(
        cores, tiles))


def _write_sums(acc, accb, out_smem, dw_gmem, db_gmem, s, t) -> None:
    """A program's partial sums out through shared memory: dW^T's [TILE, F] a tile of
    columns at a time into split s's rows of tile t, then the bias's."""
    rows, f = pl.ds(t * TILE, TILE), acc.shape[1]
    for q in range(f // TILE + 1):
        plgpu.wait_smem_to_gmem(0)
        last = q == f // TILE
        out_smem[...] = accb if last else acc[:, q * TILE:(q + 1) * TILE]
        plgpu.commit_smem()
        plgpu.copy_smem_to_gmem(out_smem, db_gmem.at[s, rows] if last else
                                dw_gmem.at[s, rows, pl.ds(q * TILE, TILE)])
    plgpu.wait_smem_to_gmem(0)


def _launch(body, operands, seed, *, splits: int, h: int, f: int, dtype,
            tiles_e: tuple = ()):
    """Runs a kernel `body` over (H / TILE column tiles, `splits`) programs, each writing
    its partial dW^T and bias sums; returns their totals (dW [F, H], db [H]). Scratch:
    a TILE x TILE block of ones (the bias's product), one of float32 for the sums out,
    and one of `dtype` per name in `tiles_e`."""
    tile = lambda: plgpu.SMEM((TILE, TILE), dtype, transforms=_transforms(TILE, dtype))
    kernel = plgpu.kernel(
        body,
        out_type=(jax.ShapeDtypeStruct((splits, h, f), jnp.float32),
                  jax.ShapeDtypeStruct((splits, h, TILE), jnp.float32)),
        grid=(h // TILE, splits), grid_names=("t", "s"),
        scratch_types=dict(ones_smem=tile(), **{name: tile() for name in tiles_e},
                           out_smem=plgpu.SMEM((TILE, TILE), jnp.float32)),
        compiler_params=plgpu.CompilerParams(
            lowering_semantics=plgpu.LoweringSemantics.Warpgroup),
    )
    dw_t, db_t = kernel(*operands, jnp.reshape(seed, (1,)).astype(jnp.uint32))
    return dw_t.sum(0).T, db_t.sum(0)[:, 0]


def slot_gradient(z3, x3, g, wt, seed, *, c: int, k: int, rate: float, stages: int = 2):
    """(dW float32[F, H], db float32[H]) of `slot_gradient_reference`'s arguments, by the
    kernel (Hopper: TMA and wgmma; JAX 0.10's CPU lowers it for CUDA but cannot run it)."""
    h, f = z3.shape[1] // k, x3.shape[1] // k
    if c % TILE or h % TILE or f % TILE:
        raise ValueError(f"the layer_pair kernel takes C, H and F in multiples of {TILE}, "
                         f"got C={c}, H={h}, F={f}")
    tiles, blocks = h // TILE, c // TILE
    splits = _splits(blocks, tiles)
    per = blocks // splits
    scale = 1.0 / (1.0 - rate)

    def body(z_gmem, x_gmem, g_gmem, w_gmem, seed_gmem, dw_gmem, db_gmem, ones_smem,
             out_smem):
        t, s = lax.axis_index("t"), lax.axis_index("s")
        seed_v = seed_gmem[0]
        ones_smem[...] = jnp.ones((TILE, TILE), ones_smem.dtype)
        plgpu.commit_smem()

        def step(idx, z_smem, x_smem, g_smem, w_smem, acc_ref, accb_ref):
            i, j = idx
            z = z_smem[...].astype(jnp.float32)
            grad = g_smem[...].astype(jnp.float32)
            w = plgpu.load(w_smem.at[0], (), layout=plgpu.Layout.WGMMA.reduce(1))
            parent = (s * per + i) * TILE + plgpu.layout_cast(
                lax.broadcasted_iota(jnp.int32, (TILE, TILE), 0), plgpu.Layout.WGMMA)
            col = t * TILE + plgpu.layout_cast(
                lax.broadcasted_iota(jnp.int32, (TILE, TILE), 1), plgpu.Layout.WGMMA)
            row = c + parent * k + j  # the row in the whole level
            keep = keep_mask(seed_v, row, col, h, rate)
            weight = lax.broadcast_in_dim(w, (TILE, TILE), (0,)) * scale
            z_smem[...] = jnp.where(keep & (z > 0), grad * weight, 0.0).astype(z_smem.dtype)
            plgpu.commit_smem()
            dz_t = plgpu.transpose_ref(z_smem, (1, 0))
            plgpu.wgmma(acc_ref, dz_t, x_smem)
            plgpu.wgmma(accb_ref, dz_t, ones_smem)
            plgpu.wgmma_wait(0)

        def accumulate(acc_ref, accb_ref):
            plgpu.emit_pipeline(
                lambda idx, *refs: step(idx, *refs, acc_ref, accb_ref),
                grid=(per, k),
                in_specs=[
                    plgpu.BlockSpec((TILE, TILE), lambda i, j: (s * per + i, j * tiles + t),
                                    transforms=_transforms(TILE, z3.dtype)),
                    plgpu.BlockSpec((TILE, f), lambda i, j: (s * per + i, j),
                                    transforms=_transforms(f, x3.dtype)),
                    plgpu.BlockSpec((TILE, TILE), lambda i, j: (s * per + i, t),
                                    transforms=_transforms(TILE, g.dtype)),
                    plgpu.BlockSpec((1, TILE), lambda i, j: (j, s * per + i)),
                ],
                max_concurrent_steps=stages,
            )(z_gmem, x_gmem, g_gmem, w_gmem)
            return acc_ref[...], accb_ref[...]

        acc, accb = pl.run_scoped(accumulate, plgpu.ACC((TILE, f)), plgpu.ACC((TILE, TILE)))
        _write_sums(acc, accb, out_smem, dw_gmem, db_gmem, s, t)

    return _launch(body, (z3, x3, g.astype(z3.dtype), wt.astype(jnp.float32)), seed,
                   splits=splits, h=h, f=f, dtype=x3.dtype)


def _source_block(u, *, c: int, k: int):
    """For row tile u (TILE rows of the level): the TILE-row block of the gradient source
    rows [layer 1's own rows' gradient ; its aggregate gradient] that holds the tile's
    first source row (its others lie in that block or the next)."""
    first = jnp.where(u * TILE < c, u * TILE, c + (u * TILE - c) // k)
    return first // TILE


def level_gradient(z, x, gsrc, wrow, seed, *, c: int, k: int, rate: float,
                   stages: int = 2):
    """(dW float32[F, H], db float32[H]) of `level_gradient_reference`'s arguments, by
    the kernel, over the whole level in its own row order: a program takes row tiles of
    Z [R, H] and X [R, F] as they lie (no slot rows apart), reads each tile's rows of
    layer 1's gradient `gsrc` [2C, H] as two TILE-row blocks (`_source_block` and the
    next), and lays them onto the tile's rows by a product with a 0/1 matrix (row r takes
    source row r below C, C + (r - C) // K above), times `wrow` [R] (1 for the own rows,
    the slot's mean weight, 0 where dead), through dropout's hash and ReLU'."""
    (r, h), f = z.shape, x.shape[1]
    if c % TILE or r % TILE or h % TILE or f % TILE:
        raise ValueError(f"the level kernel takes C, R, H and F in multiples of {TILE}, "
                         f"got C={c}, R={r}, H={h}, F={f}")
    tiles, blocks = h // TILE, r // TILE
    splits = _splits(blocks, tiles)
    per = blocks // splits
    scale = 1.0 / (1.0 - rate)

    def body(z_gmem, x_gmem, g_gmem, w_gmem, seed_gmem, dw_gmem, db_gmem, ones_smem,
             lo_e, hi_e, out_smem):
        t, s = lax.axis_index("t"), lax.axis_index("s")
        seed_v = seed_gmem[0]
        ones_smem[...] = jnp.ones((TILE, TILE), ones_smem.dtype)
        plgpu.commit_smem()

        def step(idx, z_smem, x_smem, lo_smem, hi_smem, w_smem, acc_ref, accb_ref):
            (i,) = idx
            u = s * per + i
            rows = u * TILE + plgpu.layout_cast(
                lax.broadcasted_iota(jnp.int32, (TILE, TILE), 0), plgpu.Layout.WGMMA)
            q = plgpu.layout_cast(lax.broadcasted_iota(jnp.int32, (TILE, TILE), 1),
                                  plgpu.Layout.WGMMA)
            source = jnp.where(rows < c, rows, c + (rows - c) // k)
            source = source - _source_block(u, c=c, k=k) * TILE
            lo_e[...] = (source == q).astype(lo_e.dtype)
            hi_e[...] = (source == q + TILE).astype(hi_e.dtype)
            plgpu.commit_smem()

            def laid(acc_ref):  # the source rows onto the tile's rows: a 0/1 product
                plgpu.wgmma(acc_ref, lo_e, lo_smem)
                plgpu.wgmma(acc_ref, hi_e, hi_smem)
                plgpu.wgmma_wait(0)
                return acc_ref[...]

            grad = pl.run_scoped(laid, plgpu.ACC((TILE, TILE)))
            z = z_smem[...].astype(jnp.float32)
            w = plgpu.load(w_smem.at[0], (), layout=plgpu.Layout.WGMMA.reduce(1))
            keep = keep_mask(seed_v, rows, t * TILE + q, h, rate)
            weight = lax.broadcast_in_dim(w, (TILE, TILE), (0,)) * scale
            z_smem[...] = jnp.where(keep & (z > 0), grad * weight, 0.0).astype(z_smem.dtype)
            plgpu.commit_smem()
            dz_t = plgpu.transpose_ref(z_smem, (1, 0))
            plgpu.wgmma(acc_ref, dz_t, x_smem)
            plgpu.wgmma(accb_ref, dz_t, ones_smem)
            plgpu.wgmma_wait(0)

        def accumulate(acc_ref, accb_ref):
            first = lambda i: _source_block(s * per + i, c=c, k=k)
            plgpu.emit_pipeline(
                lambda idx, *refs: step(idx, *refs, acc_ref, accb_ref),
                grid=(per,),
                in_specs=[
                    plgpu.BlockSpec((TILE, TILE), lambda i: (s * per + i, t),
                                    transforms=_transforms(TILE, z.dtype)),
                    plgpu.BlockSpec((TILE, f), lambda i: (s * per + i, 0),
                                    transforms=_transforms(f, x.dtype)),
                    plgpu.BlockSpec((TILE, TILE), lambda i: (first(i), t),
                                    transforms=_transforms(TILE, z.dtype)),
                    plgpu.BlockSpec((TILE, TILE), lambda i: (
                        jnp.minimum(first(i) + 1, 2 * c // TILE - 1), t),
                                    transforms=_transforms(TILE, z.dtype)),
                    plgpu.BlockSpec((1, TILE), lambda i: (s * per + i, 0)),
                ],
                max_concurrent_steps=stages,
            )(z_gmem, x_gmem, g_gmem, g_gmem, w_gmem)
            return acc_ref[...], accb_ref[...]

        acc, accb = pl.run_scoped(accumulate, plgpu.ACC((TILE, f)), plgpu.ACC((TILE, TILE)))
        _write_sums(acc, accb, out_smem, dw_gmem, db_gmem, s, t)

    return _launch(body, (z, x, gsrc.astype(z.dtype), wrow.reshape(blocks, TILE)), seed,
                   splits=splits, h=h, f=f, dtype=x.dtype, tiles_e=("lo_e", "hi_e"))


# ------------------------------------------------------------- the op and its reference


def _keep(seed, rows: int, width: int, first_row: int, rate: float):
    """hash_dropout's keep mask (nn/models.py) at rows `first_row..` of a [*, width] array."""
    return keep_mask(seed, jnp.arange(first_row, first_row + rows)[:, None],
                     jnp.arange(width)[None, :], width, rate)


def _slot_dz(z_slots, g, w, seed, *, c: int, k: int, rate: float) -> jax.Array:
    """The slot rows' output gradient [C * K, H] in z's dtype: layer 1's aggregate
    gradient `g` [C, H] times each slot's weight `w` [C, K] (0: dead), through dropout
    (rows numbered from C, as in the whole level) and ReLU'."""
    h, dt = z_slots.shape[1], z_slots.dtype
    rows = (g.astype(jnp.float32)[:, None, :] * w[..., None]).astype(dt).reshape(c * k, h)
    keep = _keep(seed, c * k, h, c, rate) & (z_slots > 0)
    return jnp.where(keep, rows / (1.0 - rate), jnp.zeros((), dt))


def slot_gradient_reference(z3, x3, g, wt, seed, *, c: int, k: int, rate: float):
    """(dW float32[F, H], db float32[H]): layer 0's weight and bias gradient over the slot
    rows. z3: layer 0's output there [C, K * H] (destination p's slot j in columns j*H..),
    x3: its input [C, K * F], g: layer 1's aggregate gradient [C, H], wt: the slots'
    weights float32[K, C] (0: dead), seed: layer 1's dropout seed."""
    h, f = z3.shape[1] // k, x3.shape[1] // k
    dz = _slot_dz(z3.reshape(c * k, h), g, wt.T, seed, c=c, k=k, rate=rate)
    x = x3.reshape(c * k, f)
    return (jnp.dot(x.T, dz, preferred_element_type=jnp.float32),
            jnp.sum(dz.astype(jnp.float32), axis=0))


def _dense(x, kernel, bias):
    """flax.linen.Dense at x's dtype (parameters cast to it)."""
    y = lax.dot_general(x, kernel.astype(x.dtype), (((x.ndim - 1,), (0,)), ((), ())))
    return y + bias.astype(x.dtype)


def layer_pair_forward(rate, x_self, x_slots, kernel, bias, w, mask, seed):
    """((h_dst, agg), (z_self, z_slots)) in plain JAX (autodiff's form): layer 0's Dense
    on the C own rows and on the C x K slot rows, ReLU, dropout at `rate`, layer 1's
    destinations and its mean (weights `w` [C, K], live slots `mask`) over their slots."""
    c, k = w.shape
    z_self, z_slots = _dense(x_self, kernel, bias), _dense(x_slots, kernel, bias)
    h, zero = z_self.shape[1], jnp.zeros((), z_self.dtype)
    h_dst = jnp.where(_keep(seed, c, h, 0, rate), jax.nn.relu(z_self) / (1.0 - rate),
                      zero)
    dropped = jnp.where(_keep(seed, c * k, h, c, rate),
                        jax.nn.relu(z_slots) / (1.0 - rate), zero)
    rows = jnp.where(mask[..., None], dropped.reshape(c, k, h), zero)
    agg = jnp.sum(rows.astype(jnp.float32) * w[..., None], axis=1).astype(z_slots.dtype)
    return (h_dst, agg), (z_self, z_slots)


@functools.cache
def layer_pair(rate: float, kernel: bool):
    """(x_self, x_slots, kernel, bias, w, mask, seed) -> (h_dst, agg) of
    `layer_pair_forward`, differentiated by its own backward: the own rows' gradient in
    XLA, the slot rows' weight gradient by `slot_gradient` (kernel) or
    `slot_gradient_reference`; the inputs' gradient apart (dropped where unread)."""
    gradient = slot_gradient if kernel else slot_gradient_reference
    forward = functools.partial(layer_pair_forward, rate)

    @jax.custom_vjp
    def op(x_self, x_slots, kernel, bias, w, mask, seed):
        return forward(x_self, x_slots, kernel, bias, w, mask, seed)[0]

    def fwd(x_self, x_slots, kernel, bias, w, mask, seed):
        out, (z_self, z_slots) = forward(x_self, x_slots, kernel, bias, w, mask, seed)
        return out, (x_self, x_slots, kernel, z_self, z_slots, w, mask, seed)

    def bwd(res, cts):
        x_self, x_slots, kernel, z_self, z_slots, w, mask, seed = res
        g_self, g_agg = cts
        (c, k), (_, h), dt = w.shape, z_self.shape, z_self.dtype
        live_w = jnp.where(mask, w, 0.0)
        dz_self = jnp.where(_keep(seed, c, h, 0, rate) & (z_self > 0),
                            g_self.astype(dt) / (1.0 - rate), jnp.zeros((), dt))
        dw, db = gradient(z_slots.reshape(c, k * h), x_slots.reshape(c, -1),
                          g_agg.astype(dt), live_w.T, seed, c=c, k=k, rate=rate)
        dw = dw + jnp.dot(x_self.T, dz_self, preferred_element_type=jnp.float32)
        db = db + jnp.sum(dz_self.astype(jnp.float32), axis=0)
        kb = kernel.astype(dt).T
        dz_slots = _slot_dz(z_slots, g_agg, live_w, seed, c=c, k=k, rate=rate)
        return (jnp.dot(dz_self, kb).astype(x_self.dtype),
                jnp.dot(dz_slots, kb).astype(x_slots.dtype),
                dw.astype(kernel.dtype), db.astype(kernel.dtype), jnp.zeros_like(w), None,
                None)

    op.defvjp(fwd, bwd)
    return op


def _level_dz(z, gsrc, wrow, seed, *, c: int, k: int, rate: float) -> jax.Array:
    """Layer 0's output gradient over the whole level [R, H] in z's dtype: row r takes
    row r of `gsrc` below C, row C + (r - C) // K above, times `wrow[r]`, through
    dropout's hash and ReLU'."""
    r, h = z.shape
    row = jnp.arange(r)
    source = jnp.where(row < c, row, c + (row - c) // k)
    g = (gsrc.astype(jnp.float32)[source] * wrow[:, None]).astype(z.dtype)
    keep = _keep(seed, r, h, 0, rate) & (z > 0)
    return jnp.where(keep, g / (1.0 - rate), jnp.zeros((), z.dtype))


def level_gradient_reference(z, x, gsrc, wrow, seed, *, c: int, k: int, rate: float):
    """(dW float32[F, H], db float32[H]) in plain JAX: layer 0's output Z [R, H] and input
    X [R, F] over the whole level, `gsrc` [2C, H] layer 1's gradient of its own rows then
    of its aggregate, `wrow` float32[R] each row's weight (1 for the own rows)."""
    dz = _level_dz(z, gsrc, wrow, seed, c=c, k=k, rate=rate)
    return (jnp.dot(x.T, dz, preferred_element_type=jnp.float32),
            jnp.sum(dz.astype(jnp.float32), axis=0))


def level_pair_forward(rate, x, kernel, bias, w, seed):
    """((h_dst, agg), z) as the library's layers compute them: layer 0's Dense over the
    whole level x [R, F], ReLU, hash dropout over the level, layer 1's destinations (the
    first C rows) and its mean (weights `w` [C, K], 0 where dead) over its slot rows."""
    c, k = w.shape
    z = _dense(x, kernel, bias)
    level = hash_dropout(jax.nn.relu(z), rate, seed)
    rows = level[c:c * (1 + k)].reshape(c, k, -1).astype(jnp.float32)
    agg = jnp.sum(rows * w[..., None], axis=1).astype(z.dtype)
    return (level[:c], agg), z


@functools.cache
def level_pair(rate: float, kernel: bool):
    """(x, kernel, bias, w, seed) -> (h_dst, agg) of `level_pair_forward`, whose backward
    gives layer 0's weights their gradient by `level_gradient` (kernel) or
    `level_gradient_reference` over the level as it lies; x's gradient apart (dropped
    where unread)."""
    gradient = level_gradient if kernel else level_gradient_reference
    forward = functools.partial(level_pair_forward, rate)

    @jax.custom_vjp
    def op(x, kernel, bias, w, seed):
        return forward(x, kernel, bias, w, seed)[0]

    def fwd(x, kernel, bias, w, seed):
        out, z = forward(x, kernel, bias, w, seed)
        return out, (x, kernel, z, w, seed)

    def bwd(res, cts):
        x, kernel, z, w, seed = res
        c, k = w.shape
        gsrc = jnp.concatenate([g.astype(z.dtype) for g in cts])
        wrow = jnp.concatenate([jnp.ones(c, jnp.float32), w.reshape(-1)])
        dw, db = gradient(z, x, gsrc, wrow, seed, c=c, k=k, rate=rate)
        dx = jnp.dot(_level_dz(z, gsrc, wrow, seed, c=c, k=k, rate=rate),
                     kernel.astype(z.dtype).T)
        return (dx.astype(x.dtype), dw.astype(kernel.dtype), db.astype(kernel.dtype),
                jnp.zeros_like(w), None)

    op.defvjp(fwd, bwd)
    return op


# ------------------------------------------------------------------ in the step

MODE = {"form": "auto"}  # which of FORMS the patched model runs


def patch_gnn() -> list:
    """GNN.__call__ with layers 0 and 1 through `layer_pair` where MODE names a pair form
    and the model and views allow it (SAGE mean, ReLU, no norm, hidden dropout, a plain
    input, training, both views positional, widths in multiples of 64). Returns a list
    that grows by one each time the pair is traced."""
    from zerognn_jax._src.nn import models
    from zerognn_jax._src.nn.views import mean_weights

    original = models.GNN.__call__
    taken = []

    def fits(self, x, views, train) -> bool:
        if (MODE["form"] == "auto" or self.is_initializing() or not train
                or self.conv != "sage" or self.aggregator != "mean"
                or self.activation != "relu" or self.norm != "none" or self.num_layers < 2
                or isinstance(x, tuple) or self.input_dropout > 0.0
                or not 0.0 < self.dropout < 1.0 or len(views) != self.num_layers):
            return False
        v0, v1 = views[0], views[1]
        c, k = v1.nbr.shape
        return (v0.positional and v1.positional and c % TILE == 0 and self.hidden % TILE == 0
                and (2 * x.shape[-1]) % TILE == 0 and v0.num_dst == c * (1 + k)
                and not self.convs[0]._projects_first(x, v0))

    def call(self, x, views, *, train):
        if not fits(self, x, views, train):
            return original(self, x, views, train=train)
        taken.append(True)
        v0, v1 = views[0], views[1]
        c = v1.num_dst
        h_src = x.astype(self.dtype)
        agg = self.convs[0].aggregate(h_src, v0).astype(self.dtype)
        p0 = self.convs[0].variables["params"]["linear"]
        seed = models.dropout_seed(self.drop_hidden.make_rng("dropout"))
        if MODE["form"].startswith("level"):
            level = jnp.concatenate([h_src[:v0.num_dst], agg], axis=-1)
            h_dst, agg1 = level_pair(float(self.dropout), MODE["form"] == "level")(
                level, p0["kernel"], p0["bias"], mean_weights(v1)[..., 0], seed)
        else:
            x_self = jnp.concatenate([h_src[:c], agg[:c]], axis=-1)
            x_slots = jnp.concatenate([h_src[c:v0.num_dst], agg[c:]], axis=-1)
            h_dst, agg1 = layer_pair(float(self.dropout), MODE["form"] == "pair")(
                x_self, x_slots, p0["kernel"], p0["bias"], mean_weights(v1)[..., 0],
                v1.mask, seed)
        p1 = self.convs[1].variables["params"]["linear"]
        out = _dense(jnp.concatenate([h_dst, agg1], axis=-1), p1["kernel"], p1["bias"])
        h = out.astype(jnp.float32) if self.num_layers == 2 else jax.nn.relu(out)
        for i in range(2, self.num_layers):
            h = self.layer(i, h, None, views[i], train=train)
        return h

    models.GNN.__call__ = call
    return taken


def with_kernel(x, h0, g_self, g_slots, live, seed, *, c: int, k: int):
    """`reference`'s (dW, db), the slot rows' share by the kernel."""
    dw, db = slot_gradient(h0[c:].reshape(c, -1), x[c:].reshape(c, -1), g_slots,
                           live.reshape(c, k).T.astype(jnp.float32), seed, c=c, k=k,
                           rate=RATE)
    return with_own_rows(dw, db, x, h0, g_self, seed, c=c)


def with_level_kernel(x, h0, g_self, g_slots, live, seed, *, c: int, k: int,
                      stages: int = 2):
    """`reference`'s (dW, db) by the level kernel, the own rows included."""
    wrow = jnp.concatenate([jnp.ones(c, jnp.float32), live.astype(jnp.float32)])
    return level_gradient(h0, x, jnp.concatenate([g_self, g_slots]), wrow, seed, c=c, k=k,
                          rate=RATE, stages=stages)


def alone(lower_only: bool) -> None:
    c, k, f, h = 16384, 10, 256, 256
    args = inputs(c * (1 + k), c, f, h, jnp.bfloat16)
    kernels = {"kernel": with_kernel, "level kernel": with_level_kernel,
               "level kernel, 3 stages": functools.partial(with_level_kernel, stages=3)}
    if lower_only:
        for form, fn in kernels.items():
            text = jax.jit(functools.partial(fn, c=c, k=k)).trace(*args).lower(
                lowering_platforms=("cuda",)).as_text()
            print(json.dumps({"form": form, "lowered_chars": len(text)}))
        return
    print(json.dumps(dict(device=jax.devices()[0].device_kind, jax=jax.__version__)))
    want, us = timed(jax.jit(functools.partial(reference, c=c, k=k)), args)
    print(json.dumps({"form": "xla", "us": round(us, 1)}), flush=True)
    for form, fn in kernels.items():
        got, us = timed(jax.jit(functools.partial(fn, c=c, k=k)), args)
        print(json.dumps({"form": form, "us": round(us, 1),
                          "rel_err": relative_error(want, got)}), flush=True)


def in_the_step(a) -> None:
    spec = importlib.util.spec_from_file_location(
        "papers100m", pathlib.Path(__file__).with_name("papers100m.py"))
    pm = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(pm)
    args = pm.parse_args(["--root", a.root, "--scale", str(a.scale), "--epochs",
                          str(a.epochs), "--fanouts", a.fanouts,
                          "--skip", "fraction,sampled,mlp,exact"])
    clock = pm.Clock(None)
    path, record = pm.generate(args, clock)
    print(json.dumps(record), flush=True)
    host, _ = pm._load(path)
    cfg = pm.train_config(args, str(path))
    dataset, data, program = pm._prepared(cfg, host)
    taken = patch_gnn()
    for form in a.forms.split(","):
        if form not in FORMS:
            raise SystemExit(f"unknown form {form!r}; choose from {FORMS}")
        MODE["form"] = form
        jax.clear_caches()  # the step is traced again, through this form
        before = len(taken)
        state, env, rec = pm.train_sage(cfg, dataset, data, program, clock)
        print(json.dumps(dict(form=form, pair_traced=len(taken) > before,
                              epochs=rec["epoch_seconds"], step_ms=rec["step_ms"],
                              steps=rec["steps"], loss=rec["loss"],
                              compile=rec["compile_seconds"])), flush=True)
        if a.profile and form in a.profile_forms.split(","):
            # two more epochs, the second traced without command buffers
            print(json.dumps(dict(form=form, **pm._kernels(cfg, program, state, data, dataset,
                                                           env, a.profile))), flush=True)
        del state


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--lower-only", action="store_true",
                   help="alone: lower the kernel's form for CUDA and stop (any machine)")
    p.add_argument("--step", action="store_true", help="papers100m-like epochs per form")
    p.add_argument("--forms", default="auto,pair,pair-xla,auto,pair",
                   help=f"comma-separated, of {FORMS}")
    p.add_argument("--root", default="/tmp/p", help="--step: the datasets' folder")
    p.add_argument("--scale", type=float, default=1.0, help="--step: papers100m-like scale")
    p.add_argument("--epochs", type=int, default=3, help="--step: epochs per form")
    p.add_argument("--fanouts", default="15,10,5",
                   help="--step: comma-separated, seeds' hop first (small ones give a CPU "
                        "run the tree layout the pair needs)")
    p.add_argument("--profile", type=int, default=0,
                   help="--step: each form's step by phase and its this many busiest kernels")
    p.add_argument("--profile-forms", default=",".join(FORMS),
                   help="--step, --profile: the forms profiled (comma-separated)")
    a = p.parse_args()
    if a.step:
        in_the_step(a)
    else:
        alone(a.lower_only)


if __name__ == "__main__":
    main()
