"""Recommendation as link prediction on a typed graph: users who buy items (shop-like),
relational SAGE encoding both types, trained to tell a user's purchases from random
items with the whole epoch on the device; then, for some users with held-out (test)
purchases, the k items the model ranks first among those they have not bought.

    python examples/recommend/main.py                                # shop-like, scale 1; a GPU
    python examples/recommend/main.py --scale 0.002 --epochs 3       # tiny, on a CPU

Prints the test AUC, then the share of those users' test purchases found in their top
k (`zg.recommend`: the decoder's ranking of every item, on the device, leaving out
what the user bought in training and validation), beside the share a random ranking
finds on average (k over the items left to rank; shop-like's items have no popularity
skew, so the most bought items are no stronger baseline); returns the training result,
with both shares in its summary.
"""

from __future__ import annotations

import argparse

import numpy as np

import zerognn_jax as zg
from zerognn_jax.cli.flags import int_tuple, parse_args, run_main


def parse(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False)
    p.add_argument("--scale", type=float, default=1.0, help="shop-like size factor")
    p.add_argument("--root", default=None, help="folder caching the generated graph")
    p.add_argument("--fanouts", type=int_tuple, default="10,5", help="per hop, for every relation")
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--batch-size", type=int, default=1024, help="purchases a step")
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--users", type=int, default=500, help="users whose top k is checked")
    p.add_argument("--k", type=int, default=10)
    args = parse_args(p, argv)
    for name in ("users", "k"):  # (checked before training, which they follow)
        if getattr(args, name) < 1:
            p.error(f"--{name} must be at least 1, got {getattr(args, name)}")
    return args


def items_of(pairs: np.ndarray, users: np.ndarray) -> list[np.ndarray]:
    """Each user's items among `pairs` (int[P, 2] user, item)."""
    pairs = pairs[np.argsort(pairs[:, 0], kind="stable")]
    lo, hi = (np.searchsorted(pairs[:, 0], users, side=s) for s in ("left", "right"))
    return [pairs[a:b, 1] for a, b in zip(lo, hi)]


def main(argv=None) -> zg.TrainResult:
    args = parse(argv)
    ds = zg.load_hetero_dataset("shop-like", args.root, scale=args.scale)
    if args.k >= ds.num_nodes["item"]:
        raise SystemExit(f"--k {args.k} leaves nothing to rank out: shop-like has "
                         f"{ds.num_nodes['item']} items at --scale {args.scale:g}")
    fanouts = args.fanouts
    cfg = zg.TrainConfig(task="link", dataset="shop-like", scale=args.scale,
                         link_relation="buys", model="rsage",
                         hidden=args.hidden, layers=len(fanouts), fanouts=fanouts,
                         batch_size=args.batch_size, epochs=args.epochs, progress=False)
    result = zg.train(cfg, ds)
    print(f"test AUC {result.summary['test_auc']:.3f} (random scores: 0.5)")

    split = result.program.task.split  # the purchases trained on, validated and tested
    users = np.unique(split.test.pos[:, 0])[:args.users]
    held_out = items_of(split.test.pos, users)
    bought = np.concatenate([split.train, split.val.pos])  # what no ranking offers
    known = items_of(bought, users)
    num_items = ds.graph.num_nodes["item"]
    ranked, _ = zg.recommend(result, users, args.k, exclude=("train", "val"))
    found = sum(np.isin(items, row).sum() for row, items in zip(ranked, held_out))
    total = sum(items.size for items in held_out)
    chance = sum(items.size * args.k / (num_items - seen.size)
                 for items, seen in zip(held_out, known))
    hits, random_hits = found / max(total, 1), chance / max(total, 1)
    result.summary.update({"hits": hits, "random_hits": random_hits})
    print(f"{users.size} users: {hits:.3f} of their test purchases in the model's top "
          f"{args.k}, {random_hits:.3f} expected of a random ranking")
    return result


if __name__ == "__main__":
    run_main(main)
