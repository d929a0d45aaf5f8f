"""Graph-level and link epochs on one device against several, through `zg.train`.

    python benchmarks/task_devices.py [--tasks graph,link] [--devices 1,2] [--repeats 2]
        [--epochs 3] [--dtype bfloat16] [--graph-dataset molhiv-like] [--graph-scale 1]
        [--graph-batch 256] [--link-dataset products-like] [--link-scale 0.05]
        [--link-batch 1024] [--out DIR]

Node classification's scaling has its own script (benchmarks/scaling.py); this one runs
the two other tasks' data-parallel programs as a user gets them, `zg.train(cfg, data)`
with `devices=D`, at a fixed batch per device (a step of D devices trains D times the
items, an epoch has 1/D of the steps):

- graph: #33's workload (GINE-virtual 5 x 300, mean readout, dropout 0.5, Adam 1e-3),
  `--graph-batch` graphs per device and step; items are training graphs.
- link: #37's (SAGE 3 x 256, fanouts 15, 10, 5, one destination-corrupted negative per
  positive, Adam 3e-3), `--link-batch` positive edges per device and step, on a
  products-like graph at `--link-scale` so that an epoch over every training edge stays
  short (scale 1 has ~51k steps an epoch); items are training edges.

Each (task, devices) pair runs `--repeats` times, alternated, from the same seed. One
JSON line a run (also appended to DIR/task_devices.jsonl): items per second over the
median epoch after the first, compile seconds, every epoch's loss and the test metric.
Then a table with each device count's median against one device's. On a CPU, fake
devices with XLA_FLAGS=--xla_force_host_platform_device_count=N (and tiny scales).
"""

from __future__ import annotations

import argparse
import os
import pathlib
import statistics
import sys

import jax
from bench_rows import each, record

import zerognn_jax as zg

METRIC = {"graph": "test_rocauc", "link": "test_auc"}


def config(task: str, devices: int, args) -> zg.TrainConfig:
    common = dict(epochs=args.epochs, progress=False, eval_every=0, dtype=args.dtype,
                  devices=devices, seed=args.seed)
    if task == "graph":
        return zg.TrainConfig(task="graph", dataset=args.graph_dataset, model="gine-virtual",
                              hidden=300, layers=5, dropout=0.5, readout="mean",
                              batch_size=args.graph_batch, lr=1e-3, **common)
    return zg.TrainConfig(task="link", dataset=args.link_dataset, model="sage", hidden=256,
                          layers=3, fanouts=(15, 10, 5), dropout=0.5,
                          batch_size=args.link_batch, lr=3e-3, **common)


def run(task: str, data, devices: int, args) -> dict:
    """One run: its JSON record."""
    result = zg.train(config(task, devices, args), data)
    s, history = result.summary, result.history
    epochs = [h["epoch_seconds"] for h in history]
    median = statistics.median(epochs[1:] or epochs)
    # The graph task's items are its training graphs; the link task's, its training
    # edges (every step full but an epoch's last: steps x global batch counts that one
    # as full, an overcount of under one batch)
    items = (data.train_idx.size if task == "graph"
             else history[-1]["steps"] * s["global_batch"])
    return {"task": task, "devices": s["devices"], "batch_size": s["batch_size"],
            "global_batch": s["global_batch"], "dtype": args.dtype,
            "dataset": data.name, "items": int(items), "items_per_s": items / median,
            "epoch_seconds": epochs, "steps": history[-1]["steps"],
            "compile_s": s["compile_seconds"], "overflows": s["overflows"],
            "losses": [h["loss"] for h in history], "metric": METRIC[task],
            "test_metric": s[METRIC[task]], "device": s["device"], "jax": jax.__version__}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tasks", default="graph,link")
    p.add_argument("--devices", default="1,2")
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--dtype", default="bfloat16", choices=("float32", "bfloat16"))
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--graph-dataset", default="molhiv-like")
    p.add_argument("--graph-scale", type=float, default=1.0)
    p.add_argument("--graph-batch", type=int, default=256)
    p.add_argument("--link-dataset", default="products-like")
    p.add_argument("--link-scale", type=float, default=0.05)
    p.add_argument("--link-batch", type=int, default=1024)
    p.add_argument("--out", default=os.environ.get("OUT", "."))
    args = p.parse_args(argv)
    tasks = args.tasks.split(",")
    counts = [int(d) for d in args.devices.split(",")]
    if set(tasks) - set(METRIC) or not counts or min(counts) < 1:
        p.error(f"--tasks takes graph and link, --devices counts >= 1; got {args.tasks!r}, "
                f"{args.devices!r}")
    if max(counts) > jax.local_device_count():
        p.error(f"--devices {args.devices} asks for {max(counts)} devices; this process "
                f"sees {jax.local_device_count()}")
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rows = []
    for task in tasks:
        data = (zg.load_graphs(args.graph_dataset, scale=args.graph_scale) if task == "graph"
                else zg.load_dataset(args.link_dataset, scale=args.link_scale))
        for _ in range(args.repeats):
            for devices in counts:
                row = run(task, data, devices, args)
                rows.append(row)
                record(row, out, "task_devices.jsonl")
    print("| task | devices | global batch | steps | items/s (runs) | vs 1 device | "
          "compile s | test metric |")
    print("|---|---|---|---|---|---|---|---|")
    for task in tasks:
        mine = [r for r in rows if r["task"] == task]
        base = statistics.median(r["items_per_s"] for r in mine if r["devices"] == counts[0])
        for devices in counts:
            runs = [r for r in mine if r["devices"] == devices]
            speed = statistics.median(r["items_per_s"] for r in runs)
            print(f"| {task} | {devices} | {runs[0]['global_batch']} | {runs[0]['steps']} | "
                  f"{each(runs, 'items_per_s', ',.0f')} | {speed / base:.2f}x | "
                  f"{each(runs, 'compile_s', '.1f')} | {runs[0]['metric']} "
                  f"{each(runs, 'test_metric', '.4f')} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
