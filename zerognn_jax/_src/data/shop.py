"""shop-like: a synthetic recommendation graph, users who buy items, for link prediction
on a typed graph (and node classification of its items).

The model behind it: items fall into G groups (categories), users prefer one group each.

  1. Every user and every item gets a group, uniform over G.
  2. Each user buys `per_user` items: with probability `inside` an item of its own group
     (uniform among them), else any item. So a user's taste shows only through what it
     bought: users have no features.
  3. Items have features, their group's centre (N(0, 1) per coordinate) plus Gaussian
     noise of standard deviation `noise`, and are `similar` to items of their own group
     (`similar_per_item` x items pairs drawn, each from a uniform item to an item of its
     group; both directions stored).
  4. Repeated pairs and an item's pairs with itself are dropped; `rev_buys` is added
     (items to the users who bought them), as PyG's ToUndirected does.

The task it was built for: predict (user, buys, item) pairs (`--task link
--link-relation buys`); a model that reads the items a user bought can tell its group
apart, and so which items it will buy, where the pairs alone give nothing to a new user.
Items carry their group as a label, and all items are in the node-classification split
(train 80 %, val 10 %, test 10 % at random; at five items or fewer the last splits are
empty), so the graph also serves node tasks. Item popularity has no skew: within a
group every item is as likely to be bought.

At `scale=1`: 1,000,000 users, 250,000 items, 100 groups, 10 purchases drawn a user
(9,985,505 distinct buys pairs), 4 similar pairs drawn per item (1,996,018 directed
edges), 64 float32 features per item. Users and items scale with `scale`, groups with
its square root (at least 2, at most the items); the output is a function of the sizes,
the seed and the NumPy version.
"""

from __future__ import annotations

import numpy as np

from zerognn_jax._src.data.hetero_dataset import HeteroDataset, make_hetero_dataset
from zerognn_jax._src.data.synthetic import check_scale

BUYS = ("user", "buys", "item")
SIMILAR = ("item", "similar", "item")
SHOP = dict(users=1_000_000, items=250_000, groups=100, per_user=10, dim=64)


_MIN_USERS = 100


def shop_like(scale: float = 1.0, seed: int = 0) -> HeteroDataset:
    """The shop-like graph (module docstring) at `scale` of its sizes."""
    check_scale(scale)
    users, items = (max(2, round(SHOP[k] * scale)) for k in ("users", "items"))
    if users < _MIN_USERS:  # (a scale of 1e-9 gave 2 users and empty held-out splits)
        raise ValueError(f"scale={scale} gives {users} user nodes; shop-like needs >= "
                         f"{_MIN_USERS}")
    groups = min(items, max(2, round(SHOP["groups"] * scale ** 0.5)))
    return make_shop(users, items, groups, per_user=SHOP["per_user"], dim=SHOP["dim"],
                     seed=seed)


def make_shop(users: int, items: int, groups: int, *, per_user: int = 8,
              inside: float = 0.9, dim: int = 8, noise: float = 0.8,
              similar_per_item: int = 4, seed: int = 0,
              name: str = "shop-like") -> HeteroDataset:
    """A users-buy-items graph of these sizes (module docstring)."""
    sizes = dict(users=users, items=items, groups=groups, per_user=per_user, dim=dim,
                 similar_per_item=similar_per_item)
    for key, value in sizes.items():
        if value < 1:
            raise ValueError(f"{key} must be at least 1, got {value}")
    if groups > items:
        raise ValueError(f"groups must be at most the items ({items}), got {groups}")
    if not 0 <= inside <= 1:
        raise ValueError(f"inside must lie in [0, 1], got {inside}")
    if not noise >= 0:
        raise ValueError(f"noise must be at least 0, got {noise}")
    rng = np.random.default_rng(seed)
    user_group, item_group = rng.integers(0, groups, users), rng.integers(0, groups, items)
    centre = rng.normal(size=(groups, dim))
    features = (centre[item_group] + noise * rng.normal(size=(items, dim))).astype(np.float32)
    by_group = np.argsort(item_group, kind="stable")
    start = np.searchsorted(item_group[by_group], np.arange(groups + 1))

    def member_of(group: np.ndarray) -> np.ndarray:
        """A uniform item of each group in `group` (any item where a group has none)."""
        size = start[group + 1] - start[group]
        pick = start[group] + (rng.random(group.size) * size).astype(np.int64)
        return np.where(size > 0, by_group[np.minimum(pick, items - 1)],
                        rng.integers(0, items, group.size))

    src = np.repeat(np.arange(users), per_user)
    own = rng.random(src.size) < inside
    dst = np.where(own, member_of(user_group[src]), rng.integers(0, items, src.size))
    src, dst = _distinct(src, dst, items)
    a = rng.integers(0, items, similar_per_item * items)
    b = member_of(item_group[a])
    a, b = _distinct(np.minimum(a, b)[a != b], np.maximum(a, b)[a != b], items)
    order = rng.permutation(items)
    cut = (round(0.8 * items), round(0.9 * items))
    return make_hetero_dataset(
        name, {"user": users, "item": items},
        {BUYS: (src, dst), SIMILAR: (np.r_[a, b], np.r_[b, a])},
        target_type="item", labels=item_group, num_classes=groups,
        train_idx=np.sort(order[:cut[0]]), val_idx=np.sort(order[cut[0]:cut[1]]),
        test_idx=np.sort(order[cut[1]:]), features={"item": features}, add_reverse=True)


def _distinct(src: np.ndarray, dst: np.ndarray, num_dst: int) -> tuple[np.ndarray, np.ndarray]:
    """The distinct (src, dst) pairs, ordered by src then dst."""
    keys = np.unique(src.astype(np.int64) * num_dst + dst)
    return keys // num_dst, keys % num_dst
