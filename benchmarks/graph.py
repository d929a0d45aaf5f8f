"""Graph-level training throughput of zerognn-jax on molhiv-like or molpcba-like (#33).

    python benchmarks/graph.py [--dataset molhiv-like] [--scale 1] [--epochs 5]
                               [--batch-sizes 32,256] [--model gine-virtual]
                               [--dtype float32] [--sample-ahead S] [--no-trace]
                               [--out DIR]

GINE with a virtual node (OGB's molecule "gin-virtual": bond-aware GIN), 5 layers x 300,
mean readout, dropout 0.5, Adam lr 1e-3, `--epochs` epochs per batch size,
`--sample-ahead` batches packed by one call (the library's default when not given). Per
batch size one JSON line (also appended to DIR/graph.jsonl): graphs per second (training
graphs over the median epoch time after the first; until 2026-12-04 this script took the
run summary's median over every epoch, epoch 0 included), each epoch's time, the
envelope, envelope bytes over the ideal padded bytes (largest batch seen), test ROC-AUC
and AP (OGB's metric for molpcba: the mean over tasks of each task's average precision)
after the last epoch, compile time, and the GPU execution fraction of one more epoch
replayed under `jax.profiler` after training (busy over wall time; also busy time over
the median untraced epoch; `--no-trace` skips it); then a Markdown table.
Runs anywhere (a CPU at a small --scale: no fraction).
"""

from __future__ import annotations

import argparse
import os
import pathlib
import statistics
import tempfile

import jax
from bench_rows import record
from graph_profile import traced_epoch

import zerognn_jax as zg
from zerognn_jax._src.data.graph_datasets import PRESETS
from zerognn_jax.cli.flags import int_tuple


def run(data, batch_size: int, args) -> dict:
    cfg = zg.TrainConfig(task="graph", dataset=data.name, model=args.model, hidden=300,
                         layers=5, dropout=0.5, readout="mean", batch_size=batch_size,
                         epochs=args.epochs, lr=1e-3, progress=False, seed=args.seed,
                         eval_every=0, balance_window=args.balance_window, dtype=args.dtype,
                         sample_ahead=args.sample_ahead)
    result = zg.train(cfg, data)
    s = result.summary
    epochs = [h["epoch_seconds"] for h in result.history]
    # After the first, as the peers take it; the summary's median counts epoch 0 too
    epoch_s = statistics.median(epochs[1:] or epochs)
    row = {"system": "zerognn", "dataset": data.name, "batch_size": batch_size,
           "model": args.model, "dtype": args.dtype, "sample_ahead": s["sample_ahead"],
           "graphs_per_s": data.train_idx.size / epoch_s, "epoch_s": epoch_s,
           "epoch_seconds": epochs,
           "envelope": s["envelope"], "envelope_over_ideal": s["envelope_over_ideal"],
           "test_rocauc": s["test_rocauc"], "test_ap": s["test_ap"],
           "compile_s": s["compile_seconds"], "epochs": args.epochs, "device": s["device"],
           "jax": jax.__version__}
    if not args.no_trace:
        row.update(gpu_fraction(result, args.epochs, epoch_s, cfg.sample_ahead))
    return row


def gpu_fraction(result, epoch: int, epoch_s: float, sample_ahead: int) -> dict:
    """{"gpu_fraction", "gpu_busy_over_epoch"} of epoch `epoch`, run after training at
    the run's last envelope (once untraced, to compile, then traced), sampling
    `sample_ahead` steps at once as training did; {} without a device."""
    program, data = result.program, result.data
    levels = result.summary["envelope"]
    envelope = zg.Envelope(levels[0], tuple(levels[1:]))
    items = program.task.train_items(result.dataset)
    engine = zg.ScanEngine(program, sample_ahead=sample_ahead)
    state = engine.run_epoch(result.state, data, items, epoch, envelope).state
    with tempfile.TemporaryDirectory() as tmp:
        _, prof, _ = traced_epoch(engine, state, data, items, epoch + 1, envelope, tmp)
    if prof is None:
        return {}
    return {"gpu_fraction": prof["fraction"],
            "gpu_busy_over_epoch": prof["busy_seconds"] / epoch_s}


def main(argv=None) -> list[dict]:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--dataset", default="molhiv-like", choices=tuple(PRESETS))
    p.add_argument("--scale", type=float, default=1.0)
    p.add_argument("--epochs", type=int, default=5)
    p.add_argument("--batch-sizes", default=(32, 256), type=int_tuple)
    p.add_argument("--model", default="gine-virtual", choices=zg.GRAPH_MODELS)
    p.add_argument("--balance-window", type=int, default=0)
    p.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"),
                   help="the model's compute dtype (batch-norm statistics stay float32)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--sample-ahead", type=int, default=None)
    p.add_argument("--no-trace", action="store_true")
    p.add_argument("--out", default=os.environ.get("OUT", "."))
    args = p.parse_args(argv)
    data = zg.load_graphs(args.dataset, scale=args.scale)
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rows = []
    for b in args.batch_sizes:
        row = run(data, b, args)
        rows.append(row)
        record(row, out, "graph.jsonl")
    print("| batch | graphs/s | epoch s | envelope | envelope/ideal | test ROC-AUC | test AP | "
          "GPU fraction (traced) | busy / epoch |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        frac, busy = (format(r[k], ".3f") if k in r else "n/a"
                      for k in ("gpu_fraction", "gpu_busy_over_epoch"))
        print(f"| {r['batch_size']} | {r['graphs_per_s']:,.0f} | {r['epoch_s']:.3f} | "
              f"{r['envelope']} | {r['envelope_over_ideal']:.3f} | {r['test_rocauc']:.4f} | "
              f"{r['test_ap']:.4f} | {frac} | {busy} |")
    return rows


if __name__ == "__main__":
    main()
