"""proteins-like with and without edge features: epoch time and test ROC-AUC, one JSON
line per variant and a table at the end.

    PYTHONPATH=. python3 benchmarks/edge_features.py [--scale 1] [--epochs 10]
        [--root /tmp/c] [--npz-out F.npz] [--variants gat,gat-edges,gine-edges]

Variants (same sampler, batch, hidden width, optimizer, epochs):
  gat         GAT, heads 4, the edge-feature table left on the host
  gat-edges   the same GAT reading edge features in its attention (PyG's
              `GATConv(edge_dim)`)
  gine-edges  GINE, edge features in its messages
  sage        GraphSAGE-mean, no edge features (a reference point)
proteins-like has no node features (a constant column), so a model's outputs can only
vary through what it reads of the edges (docs/datasets.md, "proteins-like", says what
follows for GAT). `--npz-out` also writes the graph as an .npz for the PyG peer
(benchmarks/peers/pyg_gat_edges.py). Epoch time: median over the epochs after the
first; ROC-AUC after the last epoch (`--eval-mode`: exact layer-wise inference, or
sampled at the training fanouts, which a model that sums over its sampled edges, as
GINE does, needs: summed over all neighbours its inputs grow with the degree over the
fanout), OGB's metric (mean over the 112 targets).
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np

from zerognn_jax import TrainConfig, load_dataset, save_npz, train

VARIANTS = {
    "gat": dict(model="gat"),
    "gat-edges": dict(model="gat", edge_features=True),
    "gine-edges": dict(model="gine", edge_features=True),
    "sage": dict(model="sage"),
}


def run(name: str, dataset, args) -> dict:
    cfg = TrainConfig(dataset="proteins-like", hidden=args.hidden, heads=4, layers=2,
                      fanouts=(15, 10), batch_size=1024, epochs=args.epochs, lr=3e-3,
                      dropout=0.0, eval_every=0, eval_mode=args.eval_mode, progress=False,
                      dtype=args.dtype, **VARIANTS[name])
    t0 = time.perf_counter()
    res = train(cfg, dataset)
    times = [h["epoch_seconds"] for h in res.history[1:]]
    last = res.history[-1]
    return {"variant": name, "epoch_seconds": float(np.median(times)),
            "epochs": len(res.history), "loss": last["loss"],
            "test_rocauc": last.get("test_rocauc"), "val_rocauc": last.get("val_rocauc"),
            "compile_seconds": res.history[0].get("compile_seconds"),
            "wall_seconds": time.perf_counter() - t0}


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--scale", type=float, default=1.0)
    p.add_argument("--epochs", type=int, default=10)
    p.add_argument("--hidden", type=int, default=128)
    p.add_argument("--dtype", default="float32")
    p.add_argument("--root", default="/tmp/c")
    p.add_argument("--npz-out", default=None)
    p.add_argument("--eval-mode", default="full", help="full (exact) or sampled")
    p.add_argument("--variants", default="gat,gat-edges,gine-edges")
    args = p.parse_args(argv)
    t0 = time.perf_counter()
    dataset = load_dataset("proteins-like", root=args.root, scale=args.scale)
    print(json.dumps({"dataset": dataset.name, "nodes": dataset.graph.num_nodes,
                      "edges": dataset.graph.num_edges,
                      "load_seconds": time.perf_counter() - t0}), flush=True)
    if args.npz_out:
        save_npz(dataset, args.npz_out)
    rows = []
    for name in args.variants.split(","):
        rows.append(run(name, dataset, args))
        print(json.dumps(rows[-1]), flush=True)
    print("| variant | epoch (s) | test ROC-AUC | val ROC-AUC |\n|---|---|---|---|")
    for r in rows:
        print(f"| {r['variant']} | {r['epoch_seconds']:.3f} | {r['test_rocauc']:.4f} | "
              f"{r['val_rocauc']:.4f} |")


if __name__ == "__main__":
    main()
