"""Link prediction: a 2-layer GCN encoder and a dot-product decoder on a random 85/5/10
edge split (GAE's Planetoid protocol; Kipf & Welling report test AUC 91.0 on Cora).

    python examples/link_prediction/main.py --root path/to/planetoid --seeds 5

Every step trains on a slice of the shuffled training edges with negatives drawn on the
device, inside one compiled scan per epoch (docs/link_prediction.md).
"""

import argparse
import json

import numpy as np

import zerognn_jax as zg
from zerognn_jax.cli.flags import int_tuple, parse_args, run_main


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False)
    p.add_argument("--dataset", default="cora", help="cora, citeseer, pubmed, or any dataset "
                   "name of `zerognn train` (tiny, a .npz file; a preset at full size: "
                   "`zerognn data generate products-like --scale 0.01 --out p.npz` writes a "
                   "small one; beyond Planetoid's graphs give smaller --fanouts, as every "
                   "neighbour of hubs is slow on a CPU)")
    p.add_argument("--root", default=None, help="folder with the dataset files")
    p.add_argument("--seeds", type=int, default=1, help="independent runs (splits) to average")
    p.add_argument("--epochs", type=int, default=10)
    p.add_argument("--decoder", default="dot", choices=("dot", "scaled-dot", "mlp"),
                   help="dot (GAE's, this example's default), scaled-dot (the library's "
                   "default: the product over sqrt(width)) or mlp")
    p.add_argument("--fanouts", type=int_tuple, default="-1,-1",
                   help="per hop; -1 = all neighbours")
    args = parse_args(p, argv)
    if args.seeds < 1:
        p.error(f"--seeds must be at least 1, got {args.seeds}")
    fanouts = args.fanouts
    results = []
    for seed in range(args.seeds):
        config = zg.TrainConfig(dataset=args.dataset, root=args.root, task="link",
                                model="gcn", hidden=32, layers=len(fanouts), fanouts=fanouts,
                                batch_size=1024, lr=0.01, dropout=0.0, epochs=args.epochs,
                                normalize_features=False,  # raw, as GAE
                                decoder=args.decoder, eval_every=0, seed=seed,
                                progress=False)
        summary = zg.train(config).summary
        results.append({"seed": seed, "test_auc": summary["test_auc"],
                        "test_ap": summary["test_ap"]})
    mean = {k: float(np.mean([r[k] for r in results])) for k in ("test_auc", "test_ap")}
    print(json.dumps({"runs": results, "mean": mean}))
    return results


if __name__ == "__main__":
    run_main(main)
