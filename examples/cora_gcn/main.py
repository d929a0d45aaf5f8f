"""Two-layer GCN on Cora with Kipf & Welling's settings (published test accuracy 81.5 %).

    python examples/cora_gcn/main.py --root path/to/planetoid --seeds 5
"""

import argparse
import json

import numpy as np

import zerognn_jax as zg
from zerognn_jax.cli.flags import run_main


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False)
    p.add_argument("--root", default=None,
                   help="folder with the ind.cora.* files (default: download to the cache)")
    p.add_argument("--seeds", type=int, default=1, help="independent runs to average")
    p.add_argument("--epochs", type=int, default=200)
    args = p.parse_args(argv)
    if args.seeds < 1:
        p.error(f"--seeds must be at least 1, got {args.seeds}")
    dataset = zg.load_dataset("cora", args.root, download=args.root is None)
    accs = []
    for seed in range(args.seeds):
        config = zg.TrainConfig(dataset="cora", model="gcn", hidden=16, layers=2,
                                fanouts=(-1, -1), batch_size=140, lr=0.01, weight_decay=5e-4,
                                dropout=0.5, input_dropout=0.5, epochs=args.epochs,
                                eval_every=0, seed=seed)
        accs.append(zg.train(config, dataset).summary["test_acc"])
    print(json.dumps({"test_acc_per_seed": accs, "mean": float(np.mean(accs))}))
    return accs


if __name__ == "__main__":
    run_main(main)
