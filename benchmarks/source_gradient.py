"""Times a neighbour gather's source gradient (`ops.aggregate.source_gradient`, the
backward of a deduplicated level) against two forms that pack the repeated slots first.

    PYTHONPATH=. python3 benchmarks/source_gradient.py [--repeats 50] [--link FILE]
        [--e2e] [--epochs 3] [--dtypes bfloat16,float32] [--out F]

The library's form takes each row's first slot by a gather and scatter-adds the other
("repeated") slots on top, in a walk over all C x K slots that drops every first one,
into a float32 gradient which the step then rounds to the layer's dtype. `packed`
moves the repeated slots' ids into a list of C x K / 2 first (a prefix sum and an int32
scatter) and scatter-adds that list alone (every slot walked past it, in a `lax.cond`);
`packed-rows`, its form for a bfloat16 layer, also sums each row's repeated slots in a
float32 buffer of such rows and writes every row once, in bfloat16, so that no float32
[S, H, F] gradient is written or read.

Blocks are drawn as a deduplicated level holds them: each of C x K slots live with
probability 0.95 and reading a node drawn by a power law over 2.4M nodes, rows numbered
by first reading. Each form is checked against a float64 NumPy sum, then timed
(median of `--repeats` calls, jitted, float32 sums, the gradient ending in bfloat16).

`--link FILE` times products-like's link workload (`benchmarks/peers/zerognn_link.py`
in bfloat16, its split in FILE, written by `link_data.py` if absent) and `--e2e`
trains products-like with a 64-wide learnable embedding (in each of `--dtypes`; the
layout the library picks for it: deduplicated levels) for `--epochs` epochs, each
with the library's form and `packed` (`packed-rows` for bfloat16 layers) in turn,
twice over, the XLA weighted sum's backward swapped (`use`). `--link-forms` may name
`packed-nocond` too: `packed` without its fallback (timing only: wrong once more than
half the slots repeat). docs/benchmarks.md,
"A deduplicated level's gradient with its repeated slots packed", has the figures.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from zerognn_jax._src.ops import aggregate

# (name, C, K, S, power-law exponent): link's level 2 at products-like's fanouts and
# 1024 positives (3,072 seeds: 47,104 rows of level 1, 337,920 of level 2 as the
# envelope fits them); a node run's outer level at batch 1024. The exponent leaves
# about 71 % and 62 % of the live slots distinct, near the counts the envelope
# records for those levels (docs/link_prediction.md, docs/benchmarks.md)
SHAPES = (("link-level2", 47_104, 10, 337_920, 0.7),
          ("node-level3", 180_224, 5, 620_000, 0.7))


def packed(g, nbr, weights, live, num_src: int, dtype=None, *, fallback=True):
    """The library's source gradient with its repeated slots packed into a list of
    C x K / 2 before the scatter (every slot walked past it, in a `lax.cond`), then
    rounded to `dtype`; in a narrower `dtype`, `packed_rows` instead."""
    narrow = None if dtype is None or jnp.dtype(dtype) == g.dtype else jnp.dtype(dtype)
    return _repeated_slots(g, nbr, weights, live, num_src, narrow, fallback)


def packed_rows(g, nbr, weights, live, num_src: int, dtype):
    """Each row with repeated slots sums them in a packed float32 buffer of such rows;
    every row is written once, its first slot plus that sum, in `dtype`."""
    return _repeated_slots(g, nbr, weights, live, num_src, jnp.dtype(dtype), True)


def _repeated_slots(g, nbr, weights, live, num_src, narrow, fallback):
    c, k = nbr.shape
    n = c * k
    capacity = max(1, n // 2)
    slot = jnp.arange(n, dtype=jnp.int32)
    target = jnp.where(live, nbr, num_src).reshape(-1)
    first = jnp.full((num_src,), n, jnp.int32).at[target].min(slot, mode="drop")
    has = first < n
    row, col = jnp.where(has, first // k, 0), jnp.where(has, first % k, 0)
    first_of_target = jnp.take(first, target, mode="fill", fill_value=-1)
    repeated = (target < num_src) & (first_of_target != slot)
    out = g.dtype if narrow is None else narrow

    def own():  # each row's first slot (made in each branch: no [S, H, F] operand)
        return jnp.where(has[:, None, None], weights[row, col][..., None] * g[row], 0)

    def listed():
        at = jnp.cumsum(repeated, dtype=jnp.int32) - 1
        ids = jnp.full((capacity,), n, jnp.int32).at[
            jnp.where(repeated, at, capacity)].set(slot, mode="drop")
        s = jnp.where(ids < n, ids, 0)
        to = jnp.where(ids < n, target[s], num_src)
        terms = weights.reshape(n, -1)[s][..., None] * g[s // k]
        if narrow is None:
            return own().at[to].add(terms, mode="drop")
        several = jnp.zeros((num_src,), bool).at[to].set(True, mode="drop")
        slot_row = jnp.cumsum(several, dtype=jnp.int32) - 1
        more = jnp.zeros((capacity, *g.shape[1:]), g.dtype).at[
            jnp.take(slot_row, to, mode="fill", fill_value=capacity)].add(terms, mode="drop")
        return (own() + jnp.take(more, jnp.where(several, slot_row, capacity), axis=0,
                                 mode="fill", fill_value=0)).astype(out)

    def every():
        terms = (weights[..., None] * g[:, None]).reshape(n, *g.shape[1:])
        return own().at[jnp.where(repeated, target, num_src)].add(
            terms, mode="drop").astype(out)

    if not fallback:  # (timing only: wrong once more than C x K / 2 slots repeat)
        return listed()
    return jax.lax.cond(jnp.sum(repeated) <= capacity, listed, every)


LIBRARY = aggregate.source_gradient


def _packed_bwd(res, g, fallback=True):
    """`aggregate._weighted_sum_bwd` with `packed` for the source gradient, given the
    rows' dtype (as the in-library form that was timed took it)."""
    h_src, nbr, weights = res
    acc = aggregate._accumulator(h_src.dtype)
    live = jnp.any(weights != 0, axis=-1)
    g, w = aggregate.row_major(g.astype(acc)), weights.astype(acc)
    dh = aggregate.row_major(packed(g, nbr, w, live, h_src.shape[0], h_src.dtype,
                                    fallback=fallback))
    rows = aggregate.gather_live(h_src.astype(acc), nbr, live)  # [C, K, H, F]
    dw = jnp.sum(rows * g[:, None], axis=-1)
    return dh, None, dw.astype(weights.dtype)


def use(form: str) -> None:
    """Makes the XLA weighted sum's backward compute its source gradient as `form`."""
    bwd = {"library": aggregate._weighted_sum_bwd, "packed": _packed_bwd,
           "packed-nocond": functools.partial(_packed_bwd, fallback=False)}[form]
    aggregate.weighted_sum_reference.defvjp(aggregate._weighted_sum_fwd, bwd)


FORMS = {  # each ends in bfloat16, as the step rounds the gradient for its rows
    "library": lambda *a: LIBRARY(*a).astype(jnp.bfloat16),
    "packed": lambda *a: packed(*a).astype(jnp.bfloat16),
    "packed-rows": lambda *a: packed_rows(*a, jnp.bfloat16),
}


def draw_block(c, k, s, exponent, seed=0):
    """(nbr int32[C, K], live bool[C, K], rows used): slots reading power-law nodes,
    rows numbered by first reading, as a deduplicated level holds them."""
    rng = np.random.default_rng(seed)
    universe = 2_400_000
    p = 1.0 / np.arange(1, universe + 1) ** exponent
    nodes = rng.choice(universe, size=c * k, p=p / p.sum())
    live = rng.random(c * k) < 0.95
    _, first_at, inverse = np.unique(nodes[live], return_index=True, return_inverse=True)
    order = np.argsort(first_at)  # rows numbered by first reading
    rank = np.empty_like(order)
    rank[order] = np.arange(order.size)
    nbr = np.zeros(c * k, np.int64)
    nbr[live] = rank[inverse]
    if order.size > s:
        raise SystemExit(f"{order.size} distinct rows exceed the level's {s}")
    return nbr.reshape(c, k).astype(np.int32), live.reshape(c, k), order.size


def reference(g, nbr, w, live, s):
    out = np.zeros((s, *g.shape[1:]), np.float64)
    contrib = w[..., None].astype(np.float64) * g[:, None].astype(np.float64)
    np.add.at(out, nbr[live], contrib[live])
    return out


def micro(repeats: int) -> list[dict]:
    rows = []
    for name, c, k, s, exponent in SHAPES:
        nbr, live, used = draw_block(c, k, s, exponent)
        key = jax.random.key(0)
        g = jax.random.normal(key, (c, 1, 256), jnp.float32).astype(jnp.bfloat16)
        w = jnp.where(jnp.asarray(live)[..., None], 1.0 / k, 0.0).astype(jnp.float32)
        ref = reference(np.asarray(g.astype(jnp.float32)), nbr, np.asarray(w), live, s)
        repeated = int(live.sum()) - used
        args = (g.astype(jnp.float32), jnp.asarray(nbr), w, jnp.asarray(live))
        for form, fn in FORMS.items():
            f = jax.jit(lambda g, nb, w, lv, fn=fn, s=s: fn(g, nb, w, lv, s))
            out = np.asarray(jax.block_until_ready(f(*args)).astype(jnp.float32))
            err = float(np.max(np.abs(out - ref) / (np.abs(ref) + 1e-3)))
            if err > 2 ** -7:  # more than bfloat16's rounding of a float32 sum
                raise SystemExit(f"{name}: {form} is off the float64 sum by {err:.2e}")
            times = []
            for _ in range(repeats):
                t0 = time.perf_counter()
                jax.block_until_ready(f(*args))
                times.append(time.perf_counter() - t0)
            row = {"shape": name, "form": form, "slots": c * k, "live": int(live.sum()),
                   "rows": used, "repeated": repeated, "max_rel_err": err,
                   "us": round(float(np.median(times)) * 1e6, 1)}
            rows.append(row)
            print(json.dumps(row), flush=True)
    return rows


def e2e(forms, epochs: int, scale: float, dtypes) -> list[dict]:
    from zerognn_jax import TrainConfig, load_dataset, train
    data = load_dataset("products-like", root="/tmp/c", scale=scale)
    rows = []
    for dtype, form in ((d, f) for d in dtypes for f in forms):
        use(form)
        cfg = TrainConfig(epochs=epochs, dtype=dtype, embedding_dim=64, seed=0,
                          eval_mode="none")
        res = train(cfg, data)
        h = res.history
        row = {"form": form, "dtype": dtype, "epochs_s": [round(e["epoch_seconds"], 4) for e in h],
               "losses": [round(e["loss"], 4) for e in h]}
        rows.append(row)
        print(json.dumps(row), flush=True)
    use("library")
    return rows


def link(path: str, forms) -> list[dict]:
    """products-like's link workload (benchmarks/peers/zerognn_link.py, bfloat16) with
    each form in turn; its split written to `path` first unless there."""
    sys.path.insert(0, str(Path(__file__).parent / "peers"))
    import link_data
    import zerognn_link
    if not os.path.exists(path):
        link_data.main(["--out", path, "--root", "/tmp/c"])
    rows = []
    for form in forms:
        use(form)
        r = zerognn_link.main(["--data", path, "--dtype", "bfloat16"])
        row = {"form": form, "workload": "link", "ms_per_step": round(r["ms_per_step"], 4),
               "positives_per_s": round(r["positive_edges_per_second"]),
               "runs_s": r["timed_seconds_runs"], "loss": r["loss"],
               "test_auc": r.get("test_auc")}
        rows.append(row)
        print(json.dumps(row), flush=True)
    use("library")
    return rows


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=50)
    p.add_argument("--e2e", action="store_true")
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--scale", type=float, default=1.0, help="products-like's, for --e2e")
    p.add_argument("--link", default=None, metavar="FILE",
                   help="also time the link workload, its split in FILE (written if absent)")
    p.add_argument("--link-forms", default="library,packed,library,packed",
                   help="--link's forms in turn (also packed-nocond: no fallback)")
    p.add_argument("--dtypes", default="bfloat16", help="--e2e's, comma-separated")
    p.add_argument("--skip-micro", action="store_true")
    p.add_argument("--out", default=None)
    a = p.parse_args(argv)
    rows = [] if a.skip_micro else micro(a.repeats)
    print("\n| shape | form | live slots | rows | repeated | max rel err | us |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['shape']} | {r['form']} | {r['live']:,} | {r['rows']:,} | "
              f"{r['repeated']:,} | {r['max_rel_err']:.2e} | {r['us']} |")
    if a.link:
        rows += link(a.link, a.link_forms.split(","))
    if a.e2e:
        rows += e2e(["library", "packed"] * 2, a.epochs, a.scale, a.dtypes.split(","))
    if a.out:
        with open(a.out, "w") as f:
            f.writelines(json.dumps(r) + "\n" for r in rows)


if __name__ == "__main__":
    main()
