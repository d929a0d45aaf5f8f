"""Layer 0's backward as a Mosaic GPU kernel (TMA-pipelined loads, wgmma), timed alone."""
import argparse
import functools
import json

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu
from layer0_backward import RATE, inputs, keep_mask, reference, relative_error, timed

from zerognn_jax._src.pallas.counter_hash import mix32


def _transforms(cols, dtype):
    bits = jnp.dtype(dtype).itemsize * 8
    swizzle = plgpu.find_swizzle(cols * bits)
    return (plgpu.TilingTransform((8, swizzle * 8 // bits)), plgpu.SwizzleTransform(swizzle))


def slot_gradient(z3, x3, g, wt, seed, *, c, k, rate=RATE, bp=64, splits=32, stages=2,
                  overlap=False):
    """(dW float32[F, H], db float32[H]) over layer 1's slot rows, one Mosaic GPU kernel.

    z3: layer 0's output at the slot rows, [C, K * H] (parent p's slot j in columns
    j*H..), x3: layer 0's input there, [C, K * F]; g: layer 1's gradient of its
    aggregate [C, H]; wt: the slots' weights transposed, float32[K, C] (0: a dead
    slot); seed: the dropout seed of layer 1's input (rows numbered from C, as in the
    whole level). dZ = keep & (z > 0) ? g * w / (1 - rate) : 0, rounded to z's dtype,
    is built in place in shared memory and never written out. Programs over (H tile
    of 64, split of the parents); each pipelines its (parent block, slot) steps and
    accumulates dZ^T X and dZ^T 1 with wgmma (`overlap`: a step's products still run
    while the next step builds its dZ, their blocks released a step later)."""
    h = z3.shape[1] // k
    f = x3.shape[1] // k
    ht = 64
    n_ht = h // ht
    nblocks = c // bp
    per = nblocks // splits
    if per * splits != nblocks or c % bp or h % ht or f % 64:
        raise ValueError(f"shapes C={c}, H={h}, F={f} do not tile by {bp} x {splits}")
    seed_arr = jnp.reshape(seed, (1,)).astype(jnp.uint32)
    thr = min(int(rate * 2**32), 2**32 - 1)
    scale = 1.0 / (1 - rate)

    def body(z_gmem, x_gmem, g_gmem, live_gmem, seed_gmem, dw_gmem, db_gmem,
             ones_smem, out_smem):
        t = lax.axis_index("t")
        s = lax.axis_index("s")
        seed_v = seed_gmem[0]
        ones_smem[...] = jnp.ones((bp, 64), ones_smem.dtype)
        plgpu.commit_smem()

        def acc_scope(acc_ref, accb_ref):
            def step(idx, z_smem, x_smem, g_smem, live_smem):
                i, j = idx
                z = z_smem[...].astype(jnp.float32)
                g = g_smem[...].astype(jnp.float32)
                lv = plgpu.load(live_smem.at[0], (), layout=plgpu.Layout.WGMMA.reduce(1))
                prow = lax.broadcasted_iota(jnp.int32, (bp, ht), 0)
                col = lax.broadcasted_iota(jnp.int32, (bp, ht), 1)
                prow = plgpu.layout_cast(prow, plgpu.Layout.WGMMA)
                col = plgpu.layout_cast(col, plgpu.Layout.WGMMA)
                parent = (s * per + i) * bp + prow
                row = (c + parent * k + j).astype(jnp.uint32)
                hcol = (t * ht + col).astype(jnp.uint32)
                word = seed_v ^ ((row * jnp.uint32(h) + hcol) * jnp.uint32(0x9E3779B9))
                keep = mix32(word) >= jnp.uint32(thr)
                lvb = lax.broadcast_in_dim(lv, (bp, ht), (0,))
                dz = jnp.where(keep & (z > 0), g * (lvb * scale), 0.0)
                z_smem[...] = dz.astype(z_smem.dtype)
                plgpu.commit_smem()
                zt = plgpu.transpose_ref(z_smem, (1, 0))
                plgpu.wgmma(acc_ref, zt, x_smem)
                plgpu.wgmma(accb_ref, zt, ones_smem)
                plgpu.wgmma_wait(2 if overlap else 0)

            plgpu.emit_pipeline(
                step,
                grid=(per, k),
                in_specs=[
                    plgpu.BlockSpec((bp, ht), lambda i, j: (s * per + i, j * n_ht + t),
                                    transforms=_transforms(ht, z3.dtype),
                                    delay_release=int(overlap)),
                    plgpu.BlockSpec((bp, f), lambda i, j: (s * per + i, j),
                                    transforms=_transforms(f, x3.dtype),
                                    delay_release=int(overlap)),
                    plgpu.BlockSpec((bp, ht), lambda i, j: (s * per + i, t),
                                    transforms=_transforms(ht, g.dtype)),
                    plgpu.BlockSpec((1, bp), lambda i, j: (j, s * per + i)),
                ],
                max_concurrent_steps=stages,
            )(z_gmem, x_gmem, g_gmem, live_gmem)
            return acc_ref[...], accb_ref[...]

        acc, accb = pl.run_scoped(acc_scope, plgpu.ACC((ht, f)), plgpu.ACC((ht, 64)))
        rows = pl.ds(t * ht, ht)
        for q in range(f // 64 + 1):  # the product 64 columns at a time, then the bias
            plgpu.wait_smem_to_gmem(0)
            out_smem[...] = acc[:, q * 64:(q + 1) * 64] if q < f // 64 else accb
            plgpu.commit_smem()
            plgpu.copy_smem_to_gmem(out_smem, dw_gmem.at[s, rows, pl.ds(q * 64, 64)]
                                    if q < f // 64 else db_gmem.at[s, rows])
        plgpu.wait_smem_to_gmem(0)

    kernel = plgpu.kernel(
        body,
        out_type=(jax.ShapeDtypeStruct((splits, h, f), jnp.float32),
                  jax.ShapeDtypeStruct((splits, h, 64), jnp.float32)),
        grid=(n_ht, splits), grid_names=("t", "s"),
        scratch_types=dict(
            ones_smem=plgpu.SMEM((bp, 64), x3.dtype, transforms=_transforms(64, x3.dtype)),
            out_smem=plgpu.SMEM((ht, 64), jnp.float32)),
        compiler_params=plgpu.CompilerParams(
            lowering_semantics=plgpu.LoweringSemantics.Warpgroup),
    )
    dwt, dbt = kernel(z3, x3, g, wt, seed_arr)
    return dwt.sum(0).T, dbt.sum(0)[:, 0]


def mosaic_slots(x, h0, g_slots, live, seed, *, c, k, **kw):
    """(dW, db) of the slot rows (rows C..) of `reference`'s inputs by `slot_gradient`."""
    return slot_gradient(h0[c:].reshape(c, -1), x[c:].reshape(c, -1), g_slots,
                         live.reshape(c, k).T.astype(jnp.float32), seed, c=c, k=k, **kw)


def fused(x, h0, g_self, g_slots, live, seed, *, c, k, **kw):
    dw, db = mosaic_slots(x, h0, g_slots, live, seed, c=c, k=k, **kw)
    h = h0.shape[1]
    keep = keep_mask(seed, jnp.arange(c)[:, None], jnp.arange(h)[None, :], h, RATE)
    dz = jnp.where(keep & (h0[:c] > 0), g_self.astype(jnp.float32) / (1 - RATE),
                   0).astype(x.dtype)
    return (dw + jnp.dot(x[:c].T, dz, preferred_element_type=jnp.float32),
            db + dz.astype(jnp.float32).sum(0))


# ------------------------------------------------------------- inside the training step

def _keep(seed, rows: int, width: int, first_row: int, rate: float):
    """hash_dropout's keep mask for `rows` rows of a [*, width] array from `first_row`."""
    return keep_mask(seed, jnp.arange(first_row, first_row + rows)[:, None],
                     jnp.arange(width)[None, :], width, rate)


def _dense(x, kernel, bias):
    """flax.linen.Dense at x's dtype (parameters cast to it)."""
    y = lax.dot_general(x, kernel.astype(x.dtype), (((x.ndim - 1,), (0,)), ((), ())))
    return y + bias.astype(x.dtype)


def relu_dropout_mean_forward(rate, x_self, x_slots, kernel, bias, w, mask, seed):
    """((h_dst, agg), (z_self, z_slots)): layer 0's Dense on layer 1's own rows and on
    its slot rows, ReLU, layer 1's input dropout (the counter hash over the whole level,
    slot rows numbered from C) and layer 1's mean over its slots, as the library's
    layers compute them; plain JAX, which autodiff differentiates."""
    c, k = w.shape
    z_self, z_slots = _dense(x_self, kernel, bias), _dense(x_slots, kernel, bias)
    h = z_self.shape[1]
    zero = jnp.zeros((), z_self.dtype)
    d_self = jnp.where(_keep(seed, c, h, 0, rate), jax.nn.relu(z_self) / (1.0 - rate), zero)
    d_slots = jnp.where(_keep(seed, c * k, h, c, rate), jax.nn.relu(z_slots) / (1.0 - rate),
                        zero)
    rows = jnp.where(mask[..., None], d_slots.reshape(c, k, h), zero)
    agg = jnp.sum(rows.astype(jnp.float32) * w[..., None], axis=1).astype(d_slots.dtype)
    return (d_self, agg), (z_self, z_slots)


@functools.cache
def relu_dropout_mean(rate: float, use_kernel: bool, settings: tuple = ()):
    """(x_self, x_slots, kernel, bias, weights, mask, seed) -> (h_dst, agg) of
    `relu_dropout_mean_forward`, with a backward that gives the Dense's parameters their
    gradient through `slot_gradient` (use_kernel) or plain XLA, never writing dZ of the
    slot rows in the first; the inputs' gradient (dZ W^T) is computed apart, and XLA
    drops it where nothing reads it (the features)."""
    forward = functools.partial(relu_dropout_mean_forward, rate)

    @jax.custom_vjp
    def op(x_self, x_slots, kernel, bias, w, mask, seed):
        return forward(x_self, x_slots, kernel, bias, w, mask, seed)[0]

    def fwd(x_self, x_slots, kernel, bias, w, mask, seed):
        out, (z_self, z_slots) = forward(x_self, x_slots, kernel, bias, w, mask, seed)
        return out, (x_self, x_slots, kernel, z_self, z_slots, w, mask, seed)

    def bwd(res, cts):
        x_self, x_slots, kernel, z_self, z_slots, w, mask, seed = res
        g_self, g_agg = cts
        c, k = w.shape
        h = z_self.shape[1]
        dt = z_self.dtype
        zero = jnp.zeros((), dt)
        dz_self = jnp.where(_keep(seed, c, h, 0, rate) & (z_self > 0),
                            g_self.astype(dt) / (1.0 - rate), zero)
        g_rows = (g_agg.astype(jnp.float32)[:, None, :] * w[..., None]).astype(dt)
        g_rows = jnp.where(mask[..., None], g_rows, zero).reshape(c * k, h)
        dz_slots = jnp.where(_keep(seed, c * k, h, c, rate) & (z_slots > 0),
                             g_rows / (1.0 - rate), zero)
        if use_kernel:
            dw, db = slot_gradient(z_slots.reshape(c, k * h), x_slots.reshape(c, -1),
                                   g_agg.astype(dt), (w * mask).T.astype(jnp.float32),
                                   seed, c=c, k=k, rate=rate, **dict(settings))
        else:
            dw = jnp.dot(x_slots.T, dz_slots, preferred_element_type=jnp.float32)
            db = dz_slots.astype(jnp.float32).sum(0)
        dw = dw + jnp.dot(x_self.T, dz_self, preferred_element_type=jnp.float32)
        db = db + dz_self.astype(jnp.float32).sum(0)
        kb = kernel.astype(dt)
        dx_self = jnp.dot(dz_self, kb.T).astype(x_self.dtype)
        dx_slots = jnp.dot(dz_slots, kb.T).astype(x_slots.dtype)  # dropped unless used
        return dx_self, dx_slots, dw, db, jnp.zeros_like(w), None, None

    op.defvjp(fwd, bwd)
    return op


MODE = {"form": "library"}  # "library", "xla" (the fused op, its XLA backward), or a KERNELS key
# slot_gradient's settings for each kernel form of the step
KERNELS = {"kernel": {}, "kernel-overlap": dict(stages=3, overlap=True)}


def patch_gnn():
    """GNN.__call__ with layers 0 and 1 through `relu_dropout_mean` where the model and
    views allow it (SAGE mean, ReLU, no norm, tree views, a plain input, training) and
    MODE["form"] is not "library". Returns a list that grows by one per call taken."""
    from zerognn_jax._src.nn import models
    from zerognn_jax._src.nn.views import mean_weights

    original = models.GNN.__call__
    taken = []

    def fits(self, x, views, train):
        if (self.is_initializing() or not train or self.conv != "sage"
                or self.aggregator != "mean" or self.activation != "relu"
                or self.norm != "none" or self.num_layers < 2 or isinstance(x, tuple)
                or self.input_dropout > 0.0 or not 0.0 < self.dropout < 1.0
                or len(views) != self.num_layers):
            return False
        v0, v1 = views[0], views[1]
        c, k = v1.nbr.shape
        f = 2 * x.shape[-1]
        return (v0.positional and v1.positional and c % 64 == 0 and f % 64 == 0
                and self.hidden % 64 == 0 and v0.num_dst == c * (1 + k)
                and not self.convs[0]._projects_first(x, v0))

    def call(self, x, views, *, train):
        if MODE["form"] == "library" or not fits(self, x, views, train):
            return original(self, x, views, train=train)
        taken.append(True)
        v0, v1 = views[0], views[1]
        c, k = v1.nbr.shape
        s1 = v0.num_dst
        h_src = x.astype(self.dtype)
        agg0 = self.convs[0].aggregate(h_src, v0).astype(self.dtype)
        x_self = jnp.concatenate([h_src[:c], agg0[:c]], axis=-1)
        x_slots = jnp.concatenate([h_src[c:s1], agg0[c:]], axis=-1)
        p0 = self.convs[0].variables["params"]["linear"]
        seed = models.dropout_seed(self.drop_hidden.make_rng("dropout"))
        w = mean_weights(v1)[..., 0]
        h_dst, agg = relu_dropout_mean(
            float(self.dropout), MODE["form"] in KERNELS,
            tuple(sorted(KERNELS.get(MODE["form"], {}).items())))(
            x_self, x_slots, p0["kernel"], p0["bias"], w, v1.mask, seed)
        p1 = self.convs[1].variables["params"]["linear"]
        out = _dense(jnp.concatenate([h_dst, agg], axis=-1), p1["kernel"], p1["bias"])
        h = out.astype(jnp.float32) if self.num_layers == 2 else jax.nn.relu(out)
        for i in range(2, self.num_layers):
            h = self.layer(i, h, None, views[i], train=train)
        return h

    models.GNN.__call__ = call
    return taken


def step_main(a):
    """papers100m-like's epochs with each form in turn, one process, one dataset."""
    import importlib.util
    import pathlib

    spec = importlib.util.spec_from_file_location(
        "papers100m", pathlib.Path(__file__).with_name("papers100m.py"))
    pm = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(pm)
    args = pm.parse_args(["--root", a.root, "--scale", str(a.scale), "--epochs",
                          str(a.epochs), "--skip", "fraction,sampled,mlp,exact"])
    clock = pm.Clock(None)
    path, record = pm.generate(args, clock)
    print(json.dumps(record), flush=True)
    host, _ = pm._load(path)
    cfg = pm.train_config(args, str(path))
    taken = patch_gnn()
    dataset, data, program = pm._prepared(cfg, host)
    for form in a.forms.split(","):
        MODE["form"] = form
        jax.clear_caches()  # the step is traced again, through this form
        before = len(taken)
        state, env, rec = pm.train_sage(cfg, dataset, data, program, clock)
        print(json.dumps(dict(form=form, fused_calls=len(taken) - before,
                              epochs=rec["epoch_seconds"], step_ms=rec["step_ms"],
                              steps=rec["steps"], loss=rec["loss"],
                              compile=rec["compile_seconds"])), flush=True)
        del state, env


def main():
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--features", type=int, default=256, help="columns of [h ; agg]")
    p.add_argument("--lower-only", action="store_true",
                   help="lower every configuration for CUDA and stop (any machine)")
    p.add_argument("--step", action="store_true",
                   help="papers100m-like epochs with each of --forms instead")
    p.add_argument("--forms", default="library,kernel,xla,kernel-overlap,library,kernel")
    p.add_argument("--root", default="/tmp/p")
    p.add_argument("--scale", type=float, default=1.0)
    p.add_argument("--epochs", type=int, default=3)
    a = p.parse_args()
    if a.step:
        step_main(a)
        return
    c, k, f, h = 16384, 10, a.features, 256
    args = inputs(c * (1 + k), c, f, h, jnp.bfloat16)
    if not a.lower_only:
        print(json.dumps(dict(device=str(jax.devices()[0].device_kind), jax=jax.__version__)))
        want, us = timed(jax.jit(functools.partial(reference, c=c, k=k)), args)
        print(json.dumps({"form": "xla", "us": round(us, 1)}), flush=True)
    configs = [(64, 32, 2, False), (64, 32, 3, True), (64, 32, 4, True), (64, 32, 3, False),
               (64, 64, 3, True), (128, 32, 2, False)]
    for bp, splits, stages, overlap in configs:
        kw = dict(bp=bp, splits=splits, stages=stages, overlap=overlap)
        row = dict(form="mosaic", **kw)
        fn = jax.jit(functools.partial(fused, c=c, k=k, **kw))
        try:
            if a.lower_only:
                row["chars"] = len(fn.trace(*args).lower(lowering_platforms=("cuda",)).as_text())
            else:
                got, us = timed(fn, args)
                row.update(us=round(us, 1), rel_err=relative_error(want, got))
                _, row["kernel_us"] = timed(jax.jit(functools.partial(
                    mosaic_slots, c=c, k=k, **kw)), args)
        except Exception as err:  # noqa: BLE001 - a configuration that does not compile
            row["error"] = " | ".join(str(err).splitlines()[:3])[:400]
        print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
