"""Data-parallel scaling: epoch time on one device against all local devices.

    PYTHONPATH=. python3 benchmarks/scaling.py --out scaling.jsonl [--scale 1] [--root DIR]

Workload (DESIGN.md's products-like preset): GraphSAGE-mean 3 x 256, fanouts 15/10/5,
Adam 3e-3, a batch of `--batch-size` seeds per device and step, so D devices run an
epoch in ceil(train / (B D)) steps. Configurations (`--configs`): "1" (one device),
"all" (every local device, replicated features) and "all-split" (features split by
rows, `--shard-features`). Each trains `--epochs` epochs through `zerognn_jax.train`
(evaluation off); the epoch time is the median over the epochs after the first
`--warmup` (compilation is excluded by the trainer; the first epoch also pays NCCL's
set-up). Speedup = T(1 device) / T(config); efficiency = speedup / devices.
`step_ms` = epoch time / steps: with equal work per device and step, the excess of a
D-device step over a one-device step (`step_overhead_ms`) is what data parallelism
costs per step (gradient all-reduce, metric reductions, the row exchange of split
features); `allreduce_us` times one gradient all-reduce alone (a chain of `pmean`s of
a tree shaped like the parameters).

One JSON line per configuration goes to `--out` as soon as it is measured (a failing
configuration is recorded with its error), then a table to stdout. `--cpu-devices N`
fakes N CPU devices, for a smoke test on a machine without GPUs.
"""

from __future__ import annotations

import argparse
import datetime
import json
import statistics
import sys
import time
import traceback


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True, help="JSON lines output file (appended)")
    p.add_argument("--scale", type=float, default=1.0, help="products-like size factor")
    p.add_argument("--root", default=".cache/zerognn", help="dataset cache folder")
    p.add_argument("--configs", default="1,all,all-split",
                   help="comma-separated: 1, all, all-split, or a device count N[-split]")
    p.add_argument("--epochs", type=int, default=4)
    p.add_argument("--warmup", type=int, default=1, help="epochs left out of the median")
    p.add_argument("--batch-size", type=int, default=1024, help="seeds per device and step")
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--layers", type=int, default=3)
    p.add_argument("--fanouts", default="15,10,5")
    p.add_argument("--kernels", default="xla")
    p.add_argument("--cpu-devices", type=int, default=0,
                   help="fake this many CPU devices (smoke tests without GPUs)")
    args = p.parse_args(argv)
    if args.epochs <= args.warmup:
        p.error(f"--epochs {args.epochs} leaves no timed epoch after --warmup {args.warmup}")
    return args


def parse_config(text: str) -> tuple[int, bool]:
    """(devices, shard_features) from "1", "all", "all-split", "4", "4-split"."""
    count, _, split = text.strip().partition("-")
    if split not in ("", "split") or not (count == "all" or count.isdigit()):
        raise ValueError(f"bad configuration {text!r}: expected N, all, N-split or all-split")
    return (0 if count == "all" else int(count)), split == "split"


def measure(args, dataset, devices: int, shard: bool) -> dict:
    """Trains one configuration; returns its record (times in seconds)."""
    import jax

    from zerognn_jax import TrainConfig, train

    cfg = TrainConfig(
        dataset=dataset.name, model="sage", hidden=args.hidden, layers=args.layers,
        fanouts=tuple(int(f) for f in args.fanouts.split(",")), batch_size=args.batch_size,
        epochs=args.epochs, kernels=args.kernels, eval_mode="none", progress=False,
        devices=devices, shard_features=shard)
    result = train(cfg, dataset)
    times = [h["epoch_seconds"] for h in result.history]
    timed = times[args.warmup:]
    steps = result.history[-1]["steps"]
    epoch = statistics.median(timed)
    s = result.summary
    allreduce = allreduce_microseconds(result.variables["params"], devices) \
        if s["devices"] > 1 else 0.0
    return {
        "devices": s["devices"], "shard_features": shard, "global_batch": s["global_batch"],
        "batch_per_device": args.batch_size, "steps": steps, "epoch_seconds": epoch,
        "epoch_seconds_all": times, "step_ms": 1e3 * epoch / steps,
        "seeds_per_second": len(dataset.train_idx) / epoch,
        "compile_seconds": s["compile_seconds"], "calibrate_seconds": s["calibrate_seconds"],
        "overflows": s["overflows"], "envelope": s["envelope"],
        "allreduce_us": allreduce,
        "final_loss": result.history[-1]["loss"], "device": s["device"],
        "jax_version": jax.__version__,
    }


def allreduce_microseconds(params, devices: int, iters: int = 200) -> float:
    """Time of one gradient all-reduce (a `pmean` of a tree shaped like `params`)."""
    import jax
    from jax.sharding import PartitionSpec as P

    from zerognn_jax._src.training import parallel

    mesh = parallel.make_mesh(devices)

    def chain(tree):
        step = lambda _, t: jax.tree_util.tree_map(lambda x: jax.lax.pmean(x, parallel.AXIS), t)
        return jax.lax.fori_loop(0, iters, step, tree)

    run = jax.jit(jax.shard_map(chain, mesh=mesh, in_specs=P(), out_specs=P(),
                                check_vma=False))
    tree = jax.device_put(params, parallel.replicated(mesh))
    jax.block_until_ready(run(tree))
    t0 = time.perf_counter()
    jax.block_until_ready(run(tree))
    return 1e6 * (time.perf_counter() - t0) / iters


def add_scaling(records: list[dict]) -> None:
    """Speedup and efficiency of every record against the one-device record, in place."""
    base = next((r for r in records if r.get("devices") == 1 and not r["shard_features"]
                 and "error" not in r), None)
    for r in records:
        if base is not None and "error" not in r:
            r["speedup"] = base["epoch_seconds"] / r["epoch_seconds"]
            r["efficiency"] = r["speedup"] / r["devices"]
            r["step_overhead_ms"] = r["step_ms"] - base["step_ms"]


def table(records: list[dict]) -> str:
    head = (f"{'config':<14}{'devices':>8}{'global B':>10}{'steps':>7}{'epoch s':>10}"
            f"{'step ms':>9}{'speedup':>9}{'effic.':>8}{'allred us':>10}{'compile s':>11}")
    lines = [head, "-" * len(head)]
    for r in records:
        if "error" in r:
            lines.append(f"{r['config']:<14}failed: {r['error']}")
            continue
        lines.append(
            f"{r['config']:<14}{r['devices']:>8}{r['global_batch']:>10}{r['steps']:>7}"
            f"{r['epoch_seconds']:>10.4f}{r['step_ms']:>9.3f}{r.get('speedup', 0):>8.2f}x"
            f"{r.get('efficiency', 0):>8.2f}{r['allreduce_us']:>10.1f}"
            f"{r['compile_seconds']:>11.1f}")
    return "\n".join(lines)


def main(argv=None) -> int:
    args = parse_args(argv)
    configs = [(text.strip(), *parse_config(text)) for text in args.configs.split(",")]
    import jax

    if args.cpu_devices:
        jax.config.update("jax_num_cpu_devices", args.cpu_devices)
    from zerognn_jax._src.data.loaders import load_dataset

    t0 = time.perf_counter()
    dataset = load_dataset("products-like", args.root, scale=args.scale)
    print(f"products-like scale {args.scale:g}: {dataset.num_nodes:,} nodes, "
          f"{dataset.graph.num_edges:,} directed edges, {len(dataset.train_idx):,} train, "
          f"loaded in {time.perf_counter() - t0:.1f} s; {jax.local_device_count()} "
          f"{jax.devices()[0].device_kind} device(s), jax {jax.__version__}", flush=True)
    stamp = {"benchmark": "scaling", "dataset": "products-like", "scale": args.scale,
             "date": datetime.date.today().isoformat(), "command": " ".join(sys.argv)}
    records = []
    with open(args.out, "a") as out:
        for name, devices, shard in configs:
            t0 = time.perf_counter()
            try:
                record = {"config": name, **measure(args, dataset, devices, shard)}
            except Exception as err:  # noqa: BLE001 - record it, measure the others
                traceback.print_exc()
                record = {"config": name, "shard_features": shard,
                          "error": f"{type(err).__name__}: {str(err)[:300]}"}
            record["wall_seconds"] = time.perf_counter() - t0
            records.append(record)
            add_scaling(records)
            out.write(json.dumps({**stamp, **record}) + "\n")
            out.flush()
            print(f"{name}: {json.dumps(record)}", flush=True)
    print(table(records))
    return 0


if __name__ == "__main__":
    sys.exit(main())
