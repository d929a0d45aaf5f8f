"""Median epoch time of the library's default products-like run, as one JSON line.

    PYTHONPATH=. python3 benchmarks/default_epochs.py TAG [--dtype bfloat16] [--root DIR]
        [--scale 1.0]

`zg.train` with the defaults (SAGE 3x256, [15, 10, 5], batch 1024, the layout the
library picks), `--epochs` epochs without evaluation; the median of the epochs after the
first (`epoch_seconds`, compilation excluded), every epoch's loss and the time spent
compiling. Run from two
exported trees in turn to compare them on one GPU (docs/benchmarks.md, "The task seam").
"""

from __future__ import annotations

import argparse
import json

import numpy as np

from zerognn_jax import TrainConfig, train


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("tag", help="a name for the tree or variant, copied to the output")
    p.add_argument("--dtype", default="float32")
    p.add_argument("--root", default="/tmp/c", help="products-like cache folder")
    p.add_argument("--epochs", type=int, default=4)
    p.add_argument("--scale", type=float, default=1.0,
                   help="products-like's size factor (0.01 for a quick run on a CPU)")
    args = p.parse_args(argv)
    cfg = TrainConfig(dataset="products-like", root=args.root, scale=args.scale,
                      epochs=args.epochs,
                      dtype=args.dtype, eval_mode="none", progress=False)
    res = train(cfg)
    times = [h["epoch_seconds"] for h in res.history]
    first, times = times[0], times[1:] or times  # after the first, unless the only one
    print(json.dumps({"tag": args.tag, "dtype": args.dtype, "first_epoch": first,
                      "epochs": times,
                      "median": float(np.median(times)),
                      "compile_seconds": res.summary["compile_seconds"],
                      "losses": [h["loss"] for h in res.history]}), flush=True)


if __name__ == "__main__":
    main()
