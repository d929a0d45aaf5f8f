"""Recommendation as link prediction on a typed graph: users who buy items (shop-like),
relational SAGE encoding both types, trained to tell a user's purchases from random
items with the whole epoch on the device; then, for some users with held-out purchases,
the top k items they have not bought, against the most bought items.

    python examples/recommend/main.py                                # shop-like, scale 1
    python examples/recommend/main.py --scale 0.002 --epochs 3       # tiny, on a CPU

Prints the test AUC, then the share of those users' held-out purchases found in their
top k: the model's ranking (the dot decoder: a user's embedding times each item's)
against popularity's; returns the training result, with both shares in its summary.
"""

from __future__ import annotations

import argparse

import numpy as np

import zerognn_jax as zg


def parse(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--scale", type=float, default=1.0, help="shop-like size factor")
    p.add_argument("--root", default=None, help="folder caching the generated graph")
    p.add_argument("--fanouts", default="10,5", help="per hop, for every relation")
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--batch-size", type=int, default=1024, help="purchases a step")
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--users", type=int, default=500, help="users whose top k is checked")
    p.add_argument("--k", type=int, default=10)
    return p.parse_args(argv)


def hits(ranked: np.ndarray, held_out: list[np.ndarray]) -> float:
    """The share of the held-out items (one array per user) in the user's ranked row."""
    found = sum(np.isin(items, row).sum() for row, items in zip(ranked, held_out))
    return float(found / sum(items.size for items in held_out))


def top_k(scores: np.ndarray, bought: list[np.ndarray], k: int) -> np.ndarray:
    """int[U, k]: each user's k best items by `scores` (float[U, items]), leaving out
    the items it bought in training."""
    scores = scores.copy()
    for row, items in zip(scores, bought):
        row[items] = -np.inf
    return np.argsort(-scores, axis=1, kind="stable")[:, :k]


def main(argv=None) -> zg.TrainResult:
    args = parse(argv)
    ds = zg.load_hetero_dataset("shop-like", args.root, scale=args.scale)
    fanouts = tuple(int(f) for f in args.fanouts.split(","))
    cfg = zg.TrainConfig(task="link", dataset="shop-like", scale=args.scale,
                         link_relation="buys", model="rsage", hidden=args.hidden,
                         layers=len(fanouts), fanouts=fanouts, batch_size=args.batch_size,
                         epochs=args.epochs, progress=False)
    result = zg.train(cfg, ds)
    print(f"test AUC {result.summary['test_auc']:.3f} (random scores: 0.5)")

    split = result.program.task.split  # the users' training and held-out purchases
    test_users = np.unique(split.test.pos[:, 0])[:args.users]
    held_out = [split.test.pos[split.test.pos[:, 0] == u, 1] for u in test_users]
    bought = [split.train[split.train[:, 0] == u, 1] for u in test_users]
    num_items = ds.graph.num_nodes["item"]
    h_user = np.asarray(zg.predict(result, test_users, node_type="user"), np.float32)
    h_item = np.asarray(zg.predict(result, np.arange(num_items), node_type="item"),
                        np.float32)
    model = hits(top_k(h_user @ h_item.T, bought, args.k), held_out)
    popularity = np.bincount(split.train[:, 1], minlength=num_items).astype(np.float64)
    baseline = hits(top_k(np.tile(popularity, (test_users.size, 1)), bought, args.k),
                    held_out)
    result.summary.update({"hits": model, "popular_hits": baseline})
    print(f"{test_users.size} users: {model:.3f} of their held-out purchases in the "
          f"model's top {args.k}, {baseline:.3f} in the {args.k} most bought items")
    return result


if __name__ == "__main__":
    main()
