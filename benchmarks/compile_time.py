"""Where compiling a graph-level epoch goes, variant by variant (#33's workload).

    python benchmarks/compile_time.py [--dataset molhiv-like] [--scale 1] [--batch-size 256]
        [--variants bf16,f32,bf16-segment,bf16-ell,bf16-gine,bf16-gin-virtual,bf16-nodrop,
         bf16-ahead1,bf16-ahead3] [--epochs 2] [--out DIR]

On a GPU, compiling GINE-virtual 5 x 300's epoch takes 25-45 s against 3-5 s on a
2-core CPU, most of it in XLA's priority fusion pass, and most of that on the virtual
node (an H200 run of this script: docs/benchmarks.md, "Compiling an epoch, second
round"). Each variant changes one thing of the workload of benchmarks/graph.py (bfloat16
unless named "f32"): the aggregation (`segment`, `ell`), the model (`gine`: no virtual
node; `gin-virtual`: no edge encoders), no dropout (`nodrop`), or N steps sampled a call
(`aheadN`; the default is 8: `ahead1`, or `ahead3` for batch 256's 129 steps, gives an
epoch with one copy of the step, not two). It trains `--epochs` epochs in a child
process of its own whose XLA logs each HLO pass's time
(`TF_CPP_VMODULE=hlo_pass_pipeline=1,gpu_compiler=1`, set before JAX starts), and the
parent reads back, for the epoch program (module `jit_run`): the time in priority
fusion, in multi-output fusion, in all HLO passes and in code generation (the last two
from the GPU compiler's own timers),
beside the run's `compile_seconds` (the logging adds to it: 34.5 s where unlogged runs
took 27-31 s on an H200) and its last epoch's graphs per second. One JSON line a
variant (also appended to DIR/compile_time.jsonl), then a table. On a CPU every
variant runs (no priority fusion there: the CPU compiler fuses otherwise).
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import re
import subprocess
import sys
from collections import defaultdict

from zerognn_jax._src.data.graph_datasets import PRESETS

DTYPES = {"bf16": "bfloat16", "f32": "float32"}
CHANGES = {
    "segment": {"graph_aggregation": "segment"},
    "ell": {"graph_aggregation": "ell"},
    "gine": {"model": "gine"},
    "gin-virtual": {"model": "gin-virtual"},
    "nodrop": {"dropout": 0.0},
}
MODULE = "jit_run"  # the scan engine's chunk program (training/scan.py)

_PIPELINE = re.compile(r"Running HLO pass pipeline on module (\S+?):")
_PASS = re.compile(r"HLO pass: (\S+) time: ([0-9.]+) (us|ms|s) ")
_PHASE = re.compile(r"GpuCompiler::(RunHloPasses|RunBackend) for (\S+) time: "
                    r"([0-9.]+) (us|ms|s) ")
_UNIT = {"us": 1e-6, "ms": 1e-3, "s": 1.0}


def variant_config(name: str) -> dict:
    """The TrainConfig fields `name` ("DTYPE" or "DTYPE-CHANGE") sets over the workload;
    CHANGE "aheadN" samples N steps a call."""
    dtype, _, change = name.partition("-")
    ahead = re.fullmatch(r"ahead([1-9][0-9]*)", change)
    if dtype not in DTYPES or (change and change not in CHANGES and not ahead):
        raise ValueError(f"variant {name!r}: expected DTYPE or DTYPE-CHANGE with DTYPE one "
                         f"of {', '.join(DTYPES)} and CHANGE one of {', '.join(CHANGES)} "
                         "or aheadN")
    change = {"sample_ahead": int(ahead.group(1))} if ahead else CHANGES.get(change, {})
    return {"dtype": DTYPES[dtype], **change}


def pass_seconds(log: str, module: str = MODULE) -> dict:
    """{pass name: seconds} summed over `module`'s HLO pass pipelines in an XLA log
    written with `hlo_pass_pipeline=1` (a nested pipeline is listed too, beside its own
    passes), plus the GPU compiler's phases from `gpu_compiler=1` where the log has them:
    "RunHloPasses" (all HLO passes) and "RunBackend" (code generation). A pass belongs to
    the module whose pipeline the log last said was running."""
    current, seconds = None, defaultdict(float)
    for line in log.splitlines():
        if m := _PIPELINE.search(line):
            current = m.group(1)
        elif (m := _PASS.search(line)) and current == module:
            seconds[m.group(1)] += float(m.group(2)) * _UNIT[m.group(3)]
        elif (m := _PHASE.search(line)) and m.group(2) == module:
            seconds[m.group(1)] += float(m.group(3)) * _UNIT[m.group(4)]
    return dict(seconds)


def child(args) -> None:
    """Trains one variant and prints its JSON line (the XLA log goes to stderr)."""
    import jax

    import zerognn_jax as zg

    data = zg.load_graphs(args.dataset, scale=args.scale)
    fields = dict(task="graph", dataset=data.name, model="gine-virtual", hidden=300,
                  layers=5, dropout=0.5, readout="mean", batch_size=args.batch_size,
                  epochs=args.epochs, lr=1e-3, progress=False, eval_every=0)
    result = zg.train(zg.TrainConfig(**{**fields, **variant_config(args.child)}), data)
    last = result.history[-1]["epoch_seconds"]
    print(json.dumps({"variant": args.child, "compile_s": result.summary["compile_seconds"],
                      "graphs_per_s": data.train_idx.size / last,
                      "device": result.summary["device"], "jax": jax.__version__}),
          flush=True)


def measure(variant: str, args) -> dict:
    """One variant in a child process; its JSON line with the epoch program's pass times."""
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "0",
           "TF_CPP_VMODULE": "hlo_pass_pipeline=1,gpu_compiler=1"}
    cmd = [sys.executable, __file__, "--child", variant, "--dataset", args.dataset,
           "--scale", str(args.scale), "--batch-size", str(args.batch_size),
           "--epochs", str(args.epochs)]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True)
    lines = [x for x in done.stdout.splitlines() if x.startswith("{")]
    if done.returncode or not lines:
        tail = "\n".join(done.stderr.splitlines()[-15:])
        raise RuntimeError(f"variant {variant} failed (exit code {done.returncode}):\n{tail}")
    row = json.loads(lines[-1])
    seconds = pass_seconds(done.stderr)
    passes, backend = seconds.pop("RunHloPasses", None), seconds.pop("RunBackend", None)
    row.update({"priority_fusion_s": seconds.get("priority-fusion"),
                "multi_output_fusion_s": seconds.get("multi_output_fusion"),
                "passes_s": passes, "backend_s": backend,
                "slowest_passes": sorted(seconds.items(), key=lambda kv: -kv[1])[:5],
                "dataset": args.dataset, "scale": args.scale,
                "batch_size": args.batch_size})
    return row


def main(argv=None) -> list[dict]:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--dataset", default="molhiv-like", choices=tuple(PRESETS))
    p.add_argument("--scale", type=float, default=1.0)
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--variants", default="bf16,f32,bf16-segment,bf16-ell,bf16-gine,"
                   "bf16-gin-virtual,bf16-nodrop,bf16-ahead1,bf16-ahead3")
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--out", default=os.environ.get("OUT", "."))
    p.add_argument("--child", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        child(args)
        return []
    variants = args.variants.split(",")
    for v in variants:
        variant_config(v)  # every name checked before the first run
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rows = []
    for v in variants:
        row = measure(v, args)
        rows.append(row)
        print(json.dumps(row), flush=True)
        with open(out / "compile_time.jsonl", "a") as f:
            f.write(json.dumps(row) + "\n")
    fmt = lambda x: "n/a" if x is None else f"{x:.2f}"
    print("| variant | compile s | priority fusion s | multi-output fusion s | HLO passes s | "
          "code generation s | graphs/s (last epoch) |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['variant']} | {r['compile_s']:.2f} | {fmt(r['priority_fusion_s'])} | "
              f"{fmt(r['multi_output_fusion_s'])} | {fmt(r['passes_s'])} | "
              f"{fmt(r['backend_s'])} | {r['graphs_per_s']:,.0f} |")
    return rows


if __name__ == "__main__":
    main()
