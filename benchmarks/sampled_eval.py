"""Sampled against exact evaluation of one trained model, per sampling layout and batch.

    python benchmarks/sampled_eval.py [--scale 1] [--epochs 1] [--dtype float32] \\
        [--batch-sizes 1024,4096] [--nodes 200000] [--out FILE.jsonl]

Trains products-like once with the library's defaults (SAGE 3x256, [15, 10, 5], batch
1024: tree layout at scale 1), then scores the first `--nodes` test nodes with exact
layer-wise inference and with `sampled_logits` under each layout (tree, dedup with a flat
outer hop, dedup) and evaluation batch. Every layout samples the same subgraphs (the
randomness hangs on node ids, not on positions), so at one evaluation batch their logits
must agree to rounding: the table gives each one's largest logit difference from the
dedup layout's, and its accuracy against the exact one. One JSON line per row goes to
`--out`; the table is printed last.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time

import jax
import numpy as np

from zerognn_jax._src.training.config import TrainConfig
from zerognn_jax._src.training.evaluate import layerwise_logits, sampled_logits
from zerognn_jax._src.training.tasks.node import accuracy
from zerognn_jax._src.training.trainer import train

LAYOUTS = {"tree": {"dedup": False, "flat_outer": False},
           "flat": {"dedup": True, "flat_outer": True},
           "dedup": {"dedup": True, "flat_outer": False}}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--dataset", default="products-like")
    p.add_argument("--scale", type=float, default=1.0)
    p.add_argument("--root", default=None)
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--dtype", default="float32")
    p.add_argument("--kernels", default="auto")
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--batch-sizes", default="1024,4096")
    p.add_argument("--nodes", type=int, default=200_000, help="test nodes scored (0: all)")
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)
    cfg = TrainConfig(dataset=args.dataset, scale=args.scale, root=args.root,
                      epochs=args.epochs, dtype=args.dtype, kernels=args.kernels,
                      hidden=args.hidden, eval_mode="none", progress=False)
    t0 = time.perf_counter()
    res = train(cfg)
    print(f"trained {args.epochs} epoch(s) in {time.perf_counter() - t0:.1f} s; layout "
          f"dedup={res.program.sampler.dedup} flat_outer={res.program.sampler.flat_outer}",
          file=sys.stderr, flush=True)
    ds, data, variables = res.dataset, res.data, res.variables
    nodes = ds.test_idx if not args.nodes else ds.test_idx[: args.nodes]
    labels = ds.labels[nodes]
    exact = layerwise_logits(res.program, variables, data)
    exact_acc = accuracy(np.asarray(exact)[nodes], labels)
    rows = []
    for batch in (int(b) for b in args.batch_sizes.split(",")):
        logits = {}
        for name, layout in LAYOUTS.items():
            program = dataclasses.replace(
                res.program, sampler=dataclasses.replace(res.program.sampler, **layout))
            t0 = time.perf_counter()
            out = jax.block_until_ready(sampled_logits(program, variables, data, nodes,
                                                       batch_size=batch, seed=cfg.seed))
            seconds = time.perf_counter() - t0
            logits[name] = np.asarray(out)
            rows.append({"layout": name, "eval_batch": batch, "seconds": seconds,
                         "sampled_acc": accuracy(out, labels),
                         "exact_acc": exact_acc})
        for row in rows[-len(LAYOUTS):]:
            row["max_logit_diff_vs_dedup"] = float(
                np.max(np.abs(logits[row["layout"]] - logits["dedup"])))
    meta = {"device": jax.devices()[0].device_kind, "jax": jax.__version__,
            "dataset": args.dataset, "scale": args.scale, "epochs": args.epochs,
            "dtype": args.dtype, "kernels": args.kernels, "nodes": int(len(nodes))}
    if args.out:
        with open(args.out, "a") as f:
            for row in rows:
                f.write(json.dumps({**meta, **row}) + "\n")
    print(json.dumps(meta))
    print("| layout | eval batch | sampled acc | exact acc | gap (points) | "
          "max logit diff vs dedup | seconds |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        gap = 100 * (r["sampled_acc"] - r["exact_acc"])
        print(f"| {r['layout']} | {r['eval_batch']} | {r['sampled_acc']:.4f} | "
              f"{r['exact_acc']:.4f} | {gap:+.2f} | {r['max_logit_diff_vs_dedup']:.3g} | "
              f"{r['seconds']:.1f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
