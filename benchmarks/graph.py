"""Graph-level training throughput of zerognn-jax on molhiv-like (issue #33).

    python benchmarks/graph.py [--scale 1] [--epochs 5] [--batch-sizes 32,256]
                               [--model gine-virtual] [--out DIR]

GINE with a virtual node (OGB's molecule "gin-virtual": bond-aware GIN), 5 layers x 300,
mean readout, dropout 0.5, Adam lr 1e-3, `--epochs` epochs per batch size. Per batch
size one JSON line (also appended to DIR/graph.jsonl): graphs per second (training
graphs over the median epoch time after the first), the envelope, envelope bytes over
the ideal padded bytes (largest batch seen), test ROC-AUC after the last epoch, compile
time; then a Markdown table. Runs anywhere (a CPU at a small --scale).
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib

import jax

import zerognn_jax as zg


def run(data, batch_size: int, args) -> dict:
    cfg = zg.TrainConfig(task="graph", dataset=data.name, model=args.model, hidden=300,
                         layers=5, dropout=0.5, readout="mean", batch_size=batch_size,
                         epochs=args.epochs, lr=1e-3, progress=False, seed=args.seed,
                         eval_every=0, balance_window=args.balance_window)
    s = zg.train(cfg, data).summary
    epoch_s = s["median_epoch_seconds"]
    return {"system": "zerognn", "batch_size": batch_size, "model": args.model,
            "graphs_per_s": data.train_idx.size / epoch_s, "epoch_s": epoch_s,
            "envelope": s["envelope"], "envelope_over_ideal": s["envelope_over_ideal"],
            "test_rocauc": s["test_rocauc"], "compile_s": s["compile_seconds"],
            "epochs": args.epochs, "device": s["device"], "jax": jax.__version__}


def main(argv=None) -> list[dict]:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--scale", type=float, default=1.0)
    p.add_argument("--epochs", type=int, default=5)
    p.add_argument("--batch-sizes", default="32,256")
    p.add_argument("--model", default="gine-virtual", choices=zg.GRAPH_MODELS)
    p.add_argument("--balance-window", type=int, default=0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=os.environ.get("OUT", "."))
    args = p.parse_args(argv)
    data = zg.molhiv_like(args.scale)
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rows = []
    for b in (int(x) for x in args.batch_sizes.split(",")):
        row = run(data, b, args)
        rows.append(row)
        print(json.dumps(row), flush=True)
        with open(out / "graph.jsonl", "a") as f:
            f.write(json.dumps(row) + "\n")
    print("| batch | graphs/s | epoch s | envelope | envelope/ideal | test ROC-AUC |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['batch_size']} | {r['graphs_per_s']:,.0f} | {r['epoch_s']:.3f} | "
              f"{r['envelope']} | {r['envelope_over_ideal']:.3f} | {r['test_rocauc']:.4f} |")
    return rows


if __name__ == "__main__":
    main()
