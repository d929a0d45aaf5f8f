"""`zg.predict` answering requests of varying sizes in one process: seconds a request.

    PYTHONPATH=. python3 benchmarks/predict_requests.py TAG [--dataset mag-like]
        [--scale 0.01] [--requests 100,110,105,900,1000,700,100] [--batch-size 256]

Trains the dataset's default node model for one epoch (no evaluation), then asks
`zg.predict(..., mode="sampled")` for the given numbers of target nodes in turn (drawn
at random, a fixed seed) and prints one JSON line: each request's wall time (compiles
included, outputs on the host) and the first request's outputs' checksum. A serving
process that compiled a program for every request size pays a compile a request; one
that rounds sizes pays one for the first request of each rounded size. Run from two
exported trees in turn to compare them (docs/benchmarks.md).
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np

import zerognn_jax as zg


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("tag", help="a name for the tree or variant, copied to the output")
    p.add_argument("--dataset", default="mag-like")
    p.add_argument("--scale", type=float, default=0.01)
    p.add_argument("--requests", default="100,110,105,900,1000,700,100")
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--root", default="/tmp/c")
    args = p.parse_args(argv)
    cfg = zg.TrainConfig(dataset=args.dataset, scale=args.scale, root=args.root, epochs=1,
                         eval_mode="none", progress=False)
    result = zg.train(cfg)
    test = np.asarray(result.dataset.test_idx)
    rng = np.random.default_rng(0)
    seconds, first = [], None
    for size in (int(s) for s in args.requests.split(",")):
        ids = rng.choice(test, min(size, test.size), replace=False)
        t0 = time.perf_counter()
        out = np.asarray(zg.predict(result, ids, mode="sampled", batch_size=args.batch_size))
        seconds.append(round(time.perf_counter() - t0, 3))
        first = float(np.abs(out).sum()) if first is None else first
    print(json.dumps({"tag": args.tag, "dataset": args.dataset, "scale": args.scale,
                      "requests": args.requests, "seconds": seconds,
                      "total": round(sum(seconds), 2), "first_checksum": first}), flush=True)


if __name__ == "__main__":
    main()
