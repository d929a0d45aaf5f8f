"""Layer 0's backward as one Pallas Triton kernel, against XLA, timed alone.

A candidate for #36's step (docs/benchmarks.md, "Layer 0's backward as one Pallas kernel,
timed alone"; not in the library): the output gradient `dZ` of layer 0 is built block by
block (layer 1's small gradient broadcast to its K slots, ReLU' of layer 0's output, the
dropout mask from the counter hash, the live-slot mask) inside the kernel that sums
`[h ; agg]^T dZ` and the bias gradient, so `dZ` is never written. Shapes: products-like's
tree layout (level 2's R rows, the first C of them layer 1's own, whose dense gradient
goes to one XLA product). Each form is checked against the plain-JAX reference, then
timed as the median of five rounds of 40 calls queued back to back (one sync a round).

    python3 benchmarks/layer0_backward.py            # a GPU: every form, one JSON line each
    python3 benchmarks/layer0_backward.py --small    # any machine: the interpreter's check
"""

from __future__ import annotations

import argparse
import functools
import json
import time

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plt

from zerognn_jax._src.pallas.counter_hash import mix32

RATE = 0.5  # dropout on layer 0's output
FORMS = ("full", "dz-transposed", "no-prologue", "no-product")


def keep_mask(seed, rows, cols, width: int, rate: float):
    """Dropout's keep mask of `hash_dropout` (nn/models.py) at the given rows and columns."""
    idx = rows.astype(jnp.uint32) * jnp.uint32(width) + cols.astype(jnp.uint32)
    threshold = min(int(rate * 2**32), 2**32 - 1)
    return mix32(seed ^ (idx * jnp.uint32(0x9E3779B9))) >= jnp.uint32(threshold)


def reference(x, h0, g_self, g_slots, live, seed, *, c: int, k: int):
    """(dW float32[F, H], db float32[H]) in plain JAX."""
    r, h = h0.shape
    g = jnp.concatenate([g_self, g_slots[jnp.arange(r - c) // k]
                         * live[:, None].astype(g_slots.dtype)], 0)
    keep = keep_mask(seed, jnp.arange(r)[:, None], jnp.arange(h)[None, :], h, RATE)
    dz = jnp.where(keep & (h0 > 0), g.astype(jnp.float32) / (1 - RATE), 0).astype(x.dtype)
    return jnp.dot(x.T, dz, preferred_element_type=jnp.float32), dz.astype(jnp.float32).sum(0)


def _kernel(x_ref, h0_ref, gs_ref, live_ref, seed_ref, dw_ref, db_ref, *, c, k, f, fp, h,
            ht, bk, per, r_all, form):
    p, t = pl.program_id(0), pl.program_id(1)
    hc = t * ht + jnp.arange(ht, dtype=jnp.int32)
    fc = jnp.arange(fp, dtype=jnp.int32)
    seed, start = seed_ref[0], c + p * per

    def block(i, carry):
        acc, bias = carry
        r = start + i * bk + jnp.arange(bk, dtype=jnp.int32)
        ok = r < r_all
        xb = plt.load(x_ref.at[r[:, None], fc[None, :]], mask=ok[:, None] & (fc < f)[None, :],
                      other=0)
        hb = plt.load(h0_ref.at[r[:, None], hc[None, :]], mask=ok[:, None], other=0)
        gb = plt.load(gs_ref.at[((r - c) // k)[:, None], hc[None, :]], mask=ok[:, None],
                      other=0)
        lv = plt.load(live_ref.at[r - c], mask=ok, other=0)
        keep = keep_mask(seed, r[:, None], hc[None, :], h, RATE)
        dz = jnp.where(keep & (hb > 0) & (lv[:, None] != 0),
                       gb.astype(jnp.float32) / (1 - RATE), 0.0).astype(x_ref.dtype)
        if form == "no-prologue":
            dz = hb
        if form == "no-product":
            acc = acc + jnp.sum(xb.astype(jnp.float32), axis=0)[:, None]
        elif form == "dz-transposed":
            acc = acc + jnp.dot(dz.T, xb, preferred_element_type=jnp.float32).T
        else:
            acc = acc + jnp.dot(xb.T, dz, preferred_element_type=jnp.float32)
        return acc, bias + jnp.sum(dz.astype(jnp.float32), axis=0)

    acc, bias = lax.fori_loop(0, per // bk, block, (jnp.zeros((fp, ht), jnp.float32),
                                                    jnp.zeros((ht,), jnp.float32)))
    plt.store(dw_ref.at[p, fc[:, None], hc[None, :]], acc, mask=(fc < f)[:, None])
    plt.store(db_ref.at[p, hc], bias)


def fused(x, h0, g_self, g_slots, live, seed, *, c: int, k: int, programs: int, ht: int,
          bk: int, warps: int, stages: int, form: str = "full", interpret: bool = False):
    """`reference`'s (dW, db): the slot rows in the Pallas kernel (partial sums per
    program, added after), layer 1's own rows in one XLA product."""
    r_all, f = x.shape
    h = h0.shape[1]
    per = (r_all - c) // programs
    if per * programs != r_all - c or per % bk:
        raise ValueError(f"{r_all - c} slot rows do not split into {programs} programs of "
                         f"whole {bk}-row blocks")
    kernel = functools.partial(_kernel, c=c, k=k, f=f, fp=1 << (f - 1).bit_length(), h=h,
                               ht=ht, bk=bk, per=per, r_all=r_all, form=form)
    dw, db = pl.pallas_call(
        kernel, out_shape=(jax.ShapeDtypeStruct((programs, f, h), jnp.float32),
                           jax.ShapeDtypeStruct((programs, h), jnp.float32)),
        grid=(programs, h // ht), interpret=interpret, name="layer0_backward",
        compiler_params=plt.CompilerParams(num_warps=warps, num_stages=stages),
    )(x, h0, g_slots, live.astype(jnp.int8), jnp.reshape(seed, (1,)))
    return with_own_rows(dw.sum(0), db.sum(0), x, h0, g_self, seed, c=c)


def with_own_rows(dw, db, x, h0, g_self, seed, *, c: int):
    """The slot rows' (dW, db) with layer 1's own C rows added, in one XLA product."""
    h = h0.shape[1]
    keep = keep_mask(seed, jnp.arange(c)[:, None], jnp.arange(h)[None, :], h, RATE)
    dz = jnp.where(keep & (h0[:c] > 0), g_self.astype(jnp.float32) / (1 - RATE),
                   0).astype(x.dtype)
    return (dw + jnp.dot(x[:c].T, dz, preferred_element_type=jnp.float32),
            db + dz.astype(jnp.float32).sum(0))


def inputs(r: int, c: int, f: int, h: int, dtype):
    keys = jax.random.split(jax.random.PRNGKey(0), 5)
    return (jax.random.normal(keys[0], (r, f), dtype), jax.random.normal(keys[1], (r, h), dtype),
            (jax.random.normal(keys[2], (c, h), dtype) * 0.01).astype(dtype),
            (jax.random.normal(keys[3], (c, h), dtype) * 0.01).astype(dtype),
            jax.random.uniform(keys[4], (r - c,)) < 0.8, jnp.uint32(12345))


def timed(f, args, calls: int = 40) -> tuple:
    """(f's output, its median time a call in us over five rounds of `calls` queued calls)."""
    out = jax.block_until_ready(f(*args))
    rounds = []
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(calls):
            last = f(*args)
        jax.block_until_ready(last)
        rounds.append((time.perf_counter() - t0) / calls)
    return out, float(np.median(rounds)) * 1e6


def relative_error(want, got) -> float:
    return max(float(jnp.abs(w - g).max() / jnp.abs(w).max()) for w, g in zip(want, got))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--small", action="store_true",
                   help="a small case in the Pallas interpreter, checked (no timing)")
    p.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float32"))
    a = p.parse_args()
    dtype = jnp.dtype(a.dtype)
    if a.small:
        c, k = 16, 4
        args = inputs(c * (1 + k), c, 20, 32, dtype)
        got = fused(*args, c=c, k=k, programs=4, ht=16, bk=8, warps=4, stages=1,
                    interpret=True)
        error = relative_error(reference(*args, c=c, k=k), got)
        print(json.dumps({"form": "interpreted", "rel_err": error}))
        assert error < 2e-2, error
        return
    c, k = 16384, 10  # products-like's layer 1 rows and its fanout; 200 and 256 columns
    args = inputs(c * (1 + k), c, 200, 256, dtype)
    want, us = timed(jax.jit(functools.partial(reference, c=c, k=k)), args)
    print(json.dumps({"form": "xla", "us": round(us, 1)}), flush=True)
    configs = [(256, 128, 64, 8, 3), (256, 128, 64, 8, 2), (512, 128, 64, 8, 3),
               (256, 128, 64, 4, 3), (128, 128, 32, 8, 3)]
    for form in FORMS:
        for programs, ht, bk, warps, stages in configs[:5 if form == "full" else 3]:
            row = dict(form=form, programs=programs, ht=ht, bk=bk, warps=warps, stages=stages)
            f = jax.jit(functools.partial(fused, c=c, k=k, programs=programs, ht=ht, bk=bk,
                                          warps=warps, stages=stages, form=form))
            try:
                got, us = timed(f, args)
                row.update(us=round(us, 1), rel_err=relative_error(want, got))
            except Exception as err:  # noqa: BLE001 - a configuration that does not compile
                row["error"] = str(err).splitlines()[0][:160]
            print(json.dumps(row), flush=True)
    dz = jax.random.normal(jax.random.PRNGKey(9), args[1].shape, dtype)
    _, us = timed(jax.jit(lambda x, d: jnp.dot(x.T, d, preferred_element_type=jnp.float32)),
                  (args[0], dz))
    print(json.dumps({"form": "xla product of a given dZ", "us": round(us, 1)}), flush=True)
    _, us = timed(jax.jit(lambda d: d * 2), (dz,))
    print(json.dumps({"form": "xla read and write of one [R, H] array", "us": round(us, 1)}))


if __name__ == "__main__":
    main()
