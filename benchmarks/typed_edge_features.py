"""What edge features cost a typed run: mag-like, R-GAT 2 x 256 (4 heads), [25, 20],
batch 1024, bfloat16, the same seed, three runs in one process:

  rgat                            mag-like as generated (no edge features)
  rgat + edge features            8 random float32 features on every edge of cites,
                                  writes and rev_writes, read by their attention
                                  (`edge_features=True`)
  rgat, table present, flag off   the same tables in the dataset, `edge_features=False`

    PYTHONPATH=. python3 benchmarks/typed_edge_features.py [--scale 1] [--epochs 3]

Prints a JSON line per run (epoch seconds, losses, sampled test accuracy, the
process's peak device bytes so far, wall seconds) and a table. The features are random,
so they carry nothing to learn: the accuracies say only that the runs learn alike.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import time

import numpy as np

import zerognn_jax as zg

READ = ("cites", "writes", "rev_writes")  # relations (by name) given edge features


def with_edge_features(ds, width: int, seed: int = 0):
    """`ds` with `width` standard-normal float32 features on every edge of READ."""
    rs = np.random.default_rng(seed)
    graphs = tuple(g._replace(edge_features=rs.standard_normal((g.num_edges, width))
                              .astype(np.float32)) if r[1] in READ else g
                   for r, g in ds.graph.items())
    return dataclasses.replace(ds, graph=dataclasses.replace(ds.graph, graphs=graphs))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--scale", type=float, default=1.0)
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--width", type=int, default=8, help="edge features per edge")
    args = p.parse_args()
    mag = zg.load_hetero_dataset("mag-like", scale=args.scale, seed=0)
    tables = with_edge_features(mag, args.width)
    base = dict(dataset="mag-like", model="rgat", hidden=256, heads=4, layers=2,
                fanouts=(25, 20), batch_size=1024, lr=3e-3, epochs=args.epochs,
                dtype="bfloat16", eval_mode="sampled", progress=False, seed=0)
    rows = []
    for name, ds, edges in (("rgat", mag, False), ("rgat + edge features", tables, True),
                            ("rgat, table present, flag off", tables, False)):
        start = time.time()
        result = zg.train(zg.TrainConfig(**base, edge_features=edges), ds)
        rows.append((name, [h["epoch_seconds"] for h in result.history],
                     [round(h["loss"], 4) for h in result.history],
                     result.summary.get("test_acc"), result.summary.get("peak_bytes_in_use"),
                     round(time.time() - start, 1)))
        print(json.dumps(rows[-1]), flush=True)
    print("| run | epochs s | losses | test acc | peak bytes so far | wall s |")
    for row in rows:
        print("| " + " | ".join(str(x) for x in row) + " |")


if __name__ == "__main__":
    main()
