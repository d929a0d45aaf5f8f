"""Pallas kernels against their XLA twins at products-like sizes (GPU; ~40 s on an H100).

    PYTHONPATH=. python3 benchmarks/kernels.py --out kernels.jsonl

Setup, all on the device: a power-law graph of ogbn-products' size (2,449,029 nodes,
~124M directed edges, log-normal degrees, neighbours drawn in proportion to degree, so
hubs recur as in real graphs), 100 float32 features per node, and one sampled mini-batch
(1024 seeds, fanouts 15/10/5) built with the XLA ops; every buffer is cut to the real
count of its hop rounded up to 128. Then, per op and hop, both implementations run:

- check: sample, relabel and gather must match exactly; aggregations and their gradients
  to float32 tolerance (max |diff| / max |ref|).
- time: one jitted `fori_loop` with one call of the op per iteration, its inputs
  perturbed by a zero that XLA cannot fold (`optimization_barrier` of the loop index,
  shifted right by 31); the loop carries the output. So XLA can neither hoist the call
  nor drop it, and no two calls share a kernel (XLA fuses nothing across iterations;
  calls unrolled inside one iteration get merged into shared kernels). The median over
  `--reps` runs of `--iters` iterations, per call. The perturbation is a scalar for
  sample (key) and relabel (count), an elementwise pass over the small int inputs
  otherwise (fused into XLA's kernels, one extra small kernel before a Pallas call).
  `floor_us` (setup line) is the same loop around a one-element op: the loop and launch
  cost included in every row, which dominates the smallest ops.
- sweep (`--sweep`): the aggregation kernels at hops 1 and 2 also run with the tilings
  in SWEEP (rows `pallas[<label>]`), against the same XLA output; the frozen defaults in
  `zerognn_jax/_src/pallas/aggregate.py` were picked from such a sweep.
- bandwidth: `bytes` is what the op must move at least (inputs read once, outputs
  written once, each gathered row read once, no table or temporary), reported as GB/s
  and as a fraction of the measured device-to-device copy bandwidth.

Each result is one JSON line in `--out`; a table goes to stdout. A failing kernel is
recorded with its error and the run goes on. `--interpret` runs the Pallas kernels in
the interpreter (a CPU smoke test of this script at a small `--scale`; atomics with
duplicate indices are not emulated there, so the backward passes, the `+grad` rows,
mismatch; relabel checks out at small scales).
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import statistics
import sys
import time
import traceback

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from zerognn_jax._src.ops import aggregate, gather, relabel
from zerognn_jax._src.pallas import aggregate as pk_aggregate
from zerognn_jax._src.pallas import counter_hash
from zerognn_jax._src.pallas import gather as pk_gather
from zerognn_jax._src.pallas import relabel as pk_relabel
from zerognn_jax._src.pallas import sample as pk_sample
from zerognn_jax._src.pallas.common import Tiling
from zerognn_jax._src.sampling import uniform as sampling

NODES, EDGES, FEATURES, HIDDEN = 2_449_029, 123_718_280, 100, 256
FANOUTS = (15, 10, 5)
SWEEP = {  # alternatives to the defaults (8 rows x 128 lanes, 4 warps) of the aggregations
    "r4": Tiling(block_rows=4, block_cols=128, num_warps=4),
    "r16": Tiling(block_rows=16, block_cols=128, num_warps=4),
    "r32": Tiling(block_rows=32, block_cols=128, num_warps=4),
}


# ------------------------------------------------------------------------------------- setup


def _round_up(n: int, multiple: int = 128) -> int:
    return -(-n // multiple) * multiple


@functools.partial(jax.jit, static_argnums=(1, 2))
def power_law_graph(key, n: int, e: int):
    """int32 CSR (indptr[n + 1], indices[e]) with log-normal degrees, hub-biased neighbours."""
    k_deg, k_nbr = jax.random.split(key)
    weight = jnp.exp(1.2 * jax.random.normal(k_deg, (n,)))
    deg = jnp.floor(weight * (e / jnp.sum(weight))).astype(jnp.int32)
    indptr = jnp.concatenate([jnp.zeros(1, jnp.int32), jnp.cumsum(deg, dtype=jnp.int32)])
    stub = jax.random.randint(k_nbr, (e,), 0, indptr[-1])
    indices = jnp.searchsorted(indptr, stub, side="right").astype(jnp.int32) - 1
    return indptr, indices


def sampled_batch(indptr, indices, seeds, num_nodes: int):
    """The hops of one mini-batch with the XLA ops: frontiers, counts, sampled blocks."""
    frontier, count = seeds, jnp.int32(seeds.shape[0])
    hops = []
    for hop, fanout in enumerate(FANOUTS):
        valid = jnp.arange(frontier.shape[0]) < count
        key = counter_hash.step_key(0, 0, 0, hop)
        nbr, mask = jax.jit(sampling.sample_neighbors_reference, static_argnums=5)(
            indptr, indices, frontier, valid, key, fanout
        )
        bound = min(num_nodes, frontier.shape[0] * (fanout + 1))
        nxt = jax.jit(relabel.relabel_reference, static_argnums=(4, 5))(
            frontier, count, nbr, mask, bound, num_nodes
        )
        cap = min(bound, _round_up(int(nxt.count)))
        hops.append(dict(frontier=frontier, count=count, valid=valid, key=key,
                         nbr=nbr, mask=mask, local=nxt.nbr_local, next_capacity=cap))
        frontier, count = nxt.frontier[:cap], nxt.count
    return hops, frontier, count


# ----------------------------------------------------------------------------------- timing


def time_op(op, args, *, iters: int, reps: int):
    """(median seconds per call, output of one call) of `op(args, zero)` in a jitted loop."""

    @jax.jit
    def loop(args):
        def body(i, _):
            return op(args, lax.optimization_barrier(i) >> 31)

        shapes = jax.eval_shape(op, args, jnp.int32(0))
        init = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), shapes)
        return lax.fori_loop(0, iters, body, init)

    out = jax.block_until_ready(loop(args))
    samples = []
    for _ in range(reps):
        start = time.perf_counter()
        jax.block_until_ready(loop(args))
        samples.append((time.perf_counter() - start) / iters)
    return statistics.median(samples), out


def copy_bandwidth(args) -> float:
    """Device-to-device copy bandwidth in bytes/s (read + write) over a 1 GiB buffer."""
    x = jnp.ones((1 << 28,), jnp.float32)
    seconds, _ = time_op(lambda x, z: x + z.astype(x.dtype), x, iters=args.iters, reps=args.reps)
    return 2 * x.nbytes / seconds


def launch_floor(args) -> float:
    """Seconds per call of the timing loop around a one-element op."""
    one = jnp.zeros((1,), jnp.int32)
    seconds, _ = time_op(lambda x, z: x + z, one, iters=args.iters, reps=args.reps)
    return seconds


def pallas_ops(interpret: bool, tiling: Tiling | None = None) -> dict:
    """The Pallas twins (in the interpreter for the CPU smoke test; aggregations tiled)."""
    fns = {
        "sample": pk_sample.sample_neighbors,
        "relabel": pk_relabel.relabel,
        "gather": pk_gather.gather_rows,
        "weighted_sum": functools.partial(pk_aggregate.weighted_sum, tiling=tiling),
        "max": functools.partial(pk_aggregate.neighbor_max, tiling=tiling),
    }
    return {name: functools.partial(fn, interpret=interpret) for name, fn in fns.items()}


XLA_OPS = {
    "sample": sampling.sample_neighbors_reference,
    "relabel": relabel.relabel_reference,
    "gather": gather.gather_rows_reference,
    "weighted_sum": aggregate.weighted_sum_reference,
    "max": aggregate.max_reference,
}


# ------------------------------------------------------------------------------------ cases


def _compare(got, want, exact: bool) -> tuple[bool, float]:
    """(ok, max |diff| / max |want|) over the leaves of two pytrees."""
    err = 0.0
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
        a, b = np.asarray(a), np.asarray(b)
        if exact:
            err = max(err, float(np.count_nonzero(a != b)))
        else:
            diff = np.max(np.abs(a.astype(np.float64) - b), initial=0.0)
            err = max(err, float(diff / max(1e-30, np.max(np.abs(b), initial=0.0))))
    return (err == 0.0 if exact else err < 1e-5), err


def _case(name, level, shape, nbytes, exact, op, args, impls, **static):
    """One benchmark case: `op(fns, args, zero, **static)` with each implementation's ops."""
    calls = {impl: (functools.partial(op, fns, **static), args) for impl, fns in impls.items()}
    return dict(name=name, level=level, shape=shape, bytes=nbytes, exact=exact, calls=calls)


def _sample(fns, args, z, *, fanout):
    *graph_args, key = args
    return fns["sample"](*graph_args, key ^ z.astype(jnp.uint32), fanout)


def _relabel(fns, args, z, *, capacity, num_nodes):
    frontier, count, nbr, mask = args
    return tuple(fns["relabel"](frontier, count + z, nbr, mask, capacity, num_nodes))


def _gather(fns, args, z):
    table, ids, valid = args
    return fns["gather"](table, ids + z, valid)


def _ws(fns, args, z):
    h, nbr, w, _ = args
    return fns["weighted_sum"](h, nbr + z, w)


def _ws_grad(fns, args, z):
    h, nbr, w, ct = args
    loss = lambda h, w: jnp.sum(fns["weighted_sum"](h, nbr + z, w) * ct)
    return jax.value_and_grad(loss, (0, 1))(h, w)


def _max(fns, args, z):
    h, nbr, mask, _ = args
    return fns["max"](h, nbr + z, mask)


def _max_grad(fns, args, z):
    h, nbr, mask, ct = args
    return jax.value_and_grad(lambda h: jnp.sum(fns["max"](h, nbr + z, mask) * ct))(h)


def build_cases(graph, x, hops, last_frontier, last_count, num_nodes, impls, sweep):
    """Every benchmark case, in the order they run (smallest hop first within an op)."""
    indptr, indices = graph
    cases = []
    for level, hop in enumerate(hops):
        c, k = hop["nbr"].shape
        sampled = int(jnp.sum(hop["mask"]))
        args = (indptr, indices, hop["frontier"], hop["valid"], hop["key"])
        nbytes = c * 13 + c * k * 5 + sampled * 4
        shape = f"{c}x{k}"
        cases.append(_case("sample", level, shape, nbytes, True, _sample, args, impls, fanout=k))
    for level, hop in enumerate(hops):
        c, k = hop["nbr"].shape
        cap = hop["next_capacity"]
        args = (hop["frontier"], hop["count"], hop["nbr"], hop["mask"])
        nbytes = c * 4 + c * k * 9 + cap * 4
        shape = f"{c}x{k}->{cap}"
        static = dict(capacity=cap, num_nodes=num_nodes)
        cases.append(_case("relabel", level, shape, nbytes, True, _relabel, args, impls, **static))
    cap = last_frontier.shape[0]
    args = (x, last_frontier, jnp.arange(cap) < last_count)
    nbytes = cap * 5 + (int(last_count) + cap) * FEATURES * 4
    shape = f"{cap}x{FEATURES}"
    cases.append(_case("gather", len(hops), shape, nbytes, True, _gather, args, impls))
    caps = [hop["frontier"].shape[0] for hop in hops] + [cap]
    for level, hop in enumerate(hops):
        width = FEATURES if level == len(hops) - 1 else HIDDEN
        tiled = impls if level == 0 else {**impls, **sweep}
        cases += _aggregation_cases(level, hop, caps[level + 1], width, 1, tiled)
    cases += _aggregation_cases(1, hops[1], caps[2], HIDDEN, 4, {**impls, **sweep})
    return cases


def _aggregation_cases(level, hop, src_rows, width, heads, impls):
    """Weighted sum (mean weights) and max of one layer, forward and forward+backward."""
    nbr, mask = hop["local"], hop["mask"]
    c, k = nbr.shape
    deg = jnp.maximum(jnp.sum(mask, axis=1, keepdims=True), 1)
    w = jnp.broadcast_to((mask / deg)[..., None], (c, k, heads)).astype(jnp.float32)
    k_h, k_ct = jax.random.split(jax.random.key(level))
    h = jax.nn.relu(jax.random.normal(k_h, (src_rows, heads, width // heads), jnp.float32))
    ct = jax.random.normal(k_ct, (c, heads, width // heads), jnp.float32)
    slots = int(jnp.sum(mask))
    rows = slots * width * 4  # the gathered source rows
    # Forward: ids, per-slot weights (or mask bytes), rows, output. Backward on top: the
    # output cotangent, the rows again (d weights / ties), their scatter-add, d h_src
    # written once, d weights.
    out = c * width * 4
    fwd = {"ws": c * k * (4 + 4 * heads) + rows + out, "max": c * k * 5 + rows + out}
    bwd = out + 2 * rows + src_rows * width * 4
    grad = {"ws": fwd["ws"] + bwd + c * k * heads * 4, "max": fwd["max"] + bwd}
    shape = f"{c}x{k}x{width}" + (f"/{heads}h" if heads > 1 else "")
    name = "weighted_sum" if heads == 1 else "weighted_sum_heads"
    ws_args = (h, nbr, w, ct)
    cases = [
        _case(name, level, shape, fwd["ws"], False, _ws, ws_args, impls),
        _case(name + "+grad", level, shape, grad["ws"], False, _ws_grad, ws_args, impls),
    ]
    if heads == 1:
        mx_args = (h.reshape(src_rows, width), nbr, mask, ct.reshape(c, width))
        cases += [
            _case("max", level, shape, fwd["max"], False, _max, mx_args, impls),
            _case("max+grad", level, shape, grad["max"], False, _max_grad, mx_args, impls),
        ]
    return cases


# ------------------------------------------------------------------------------------- main


def run_case(case, args, bandwidth, meta):
    """Times every implementation of one case and checks it against XLA's; one row each."""
    nbytes = case["bytes"]
    rows, outputs = [], {}
    for impl, (op, op_args) in case["calls"].items():
        row = dict(meta, op=case["name"], hop=case["level"], shape=case["shape"], impl=impl,
                   bytes=nbytes)
        try:
            seconds, outputs[impl] = time_op(
                op, op_args, iters=args.iters, reps=args.reps
            )
            row.update(time_us=seconds * 1e6, gbps=nbytes / seconds / 1e9,
                       copy_fraction=nbytes / seconds / bandwidth)
        except Exception as err:  # noqa: BLE001 - a failing kernel is a result, not a crash
            row["error"] = f"{type(err).__name__}: {err}"[:2000]
            traceback.print_exc()
        rows.append(row)
    for row in rows:
        if row["impl"] != "xla" and row["impl"] in outputs and "xla" in outputs:
            ok, err = _compare(outputs[row["impl"]], outputs["xla"], case["exact"])
            row.update(check="exact" if case["exact"] else "rel_err", ok=ok, mismatch=err)
    return rows


def print_table(rows):
    """One line per Pallas run: its time against XLA's, bandwidth and check."""
    print(f"\n{'op':<24}{'hop':>4} {'shape':<20}{'pallas':<15}{'xla us':>9}{'pallas us':>11}"
          f"{'speedup':>9}{'GB/s':>7}{'% copy':>8}  check")
    xla = {(r["op"], r["hop"]): r for r in rows if r["impl"] == "xla"}
    for p in rows:
        if p["impl"] == "xla":
            continue
        xt = xla.get((p["op"], p["hop"]), {}).get("time_us", math.nan)
        pt = p.get("time_us", math.nan)
        check = "ERROR" if "error" in p else f"{'ok' if p.get('ok') else 'MISMATCH'} "
        check += "" if "error" in p else f"({p.get('check')} {p.get('mismatch', 0):.2g})"
        print(f"{p['op']:<24}{p['hop']:>4} {p['shape']:<20}{p['impl']:<15}{xt:>9.1f}{pt:>11.1f}"
              f"{xt / pt:>9.2f}{p.get('gbps', math.nan):>7.0f}"
              f"{100 * p.get('copy_fraction', math.nan):>8.1f}  {check}")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="JSON-lines file to write")
    parser.add_argument("--scale", type=float, default=1.0, help="graph size relative to products")
    parser.add_argument("--batch", type=int, default=1024, help="seed nodes")
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--iters", type=int, default=32)
    parser.add_argument("--budget-s", type=float, default=200.0,
                        help="skip the remaining cases once this many seconds have passed")
    parser.add_argument("--interpret", action="store_true", help="Pallas interpreter (CPU)")
    parser.add_argument("--sweep", action="store_true", help="also time the SWEEP tilings")
    args = parser.parse_args(argv)
    if jax.default_backend() == "cpu" and not args.interpret:
        parser.error("the Pallas kernels need an NVIDIA GPU; on a CPU, --interpret runs "
                     "them in the interpreter (a smoke test at a small --scale)")
    start = time.perf_counter()
    nodes = max(1000, round(NODES * args.scale))
    edges = max(10_000, round(EDGES * args.scale))

    device = jax.devices()[0]
    meta = dict(device=device.device_kind, jax=jax.__version__, date=time.strftime("%Y-%m-%d"))
    bandwidth, floor = copy_bandwidth(args), launch_floor(args)
    key = jax.random.key(0)
    graph = jax.block_until_ready(power_law_graph(key, nodes, edges))
    x = jax.random.normal(jax.random.fold_in(key, 1), (nodes, FEATURES), jnp.float32)
    seeds = jax.random.choice(jax.random.fold_in(key, 2), nodes, (args.batch,), replace=False)
    hops, last_frontier, last_count = sampled_batch(*graph, seeds.astype(jnp.int32), nodes)
    counts = [int(h["count"]) for h in hops] + [int(last_count)]
    setup = dict(meta, kind="setup", nodes=nodes, edges=int(graph[0][-1]), counts=counts,
                 copy_gbps=bandwidth / 1e9, floor_us=floor * 1e6,
                 setup_s=time.perf_counter() - start)
    print(json.dumps(setup), flush=True)

    rows = []
    with open(args.out, "w") as out:
        out.write(json.dumps(setup) + "\n")
        impls = {"xla": XLA_OPS, "pallas": pallas_ops(args.interpret)}
        sweep = {f"pallas[{k}]": pallas_ops(args.interpret, t) for k, t in SWEEP.items()}
        sweep = sweep if args.sweep else {}
        cases = build_cases(graph, x, hops, last_frontier, last_count, nodes, impls, sweep)
        for case in cases:
            if time.perf_counter() - start > args.budget_s:
                skipped = dict(meta, op=case["name"], hop=case["level"], skipped="budget")
                out.write(json.dumps(skipped) + "\n")
                print(f"skipped {case['name']} hop {case['level']}: time budget", flush=True)
                continue
            for row in run_case(case, args, bandwidth, meta):
                rows.append(row)
                out.write(json.dumps(row) + "\n")
                out.flush()
                print(json.dumps(row), flush=True)
    print_table(rows)
    print(f"\ntotal {time.perf_counter() - start:.0f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
