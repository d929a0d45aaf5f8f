"""Your own loop on products-like: the loaders by batches sampled per call.

    PYTHONPATH=. python3 benchmarks/loader.py --ahead 1,2,4,8 --root /tmp/c
    PYTHONPATH=. python3 benchmarks/loader.py --task link --steps 300 --ahead 1,4,8

For each `sample_ahead`, the epoch (median after the first; compiles excluded) of the
loader alone (sampling, feature rows gathered, one overflow flag read per call, no
model) and of a loop with a user's jitted step (SAGE 3x256 as `zg.make_model` builds it,
[15, 10, 5], batch 1024, Adam 3e-3, float32). `--task node`: `NeighborLoader` over the
training nodes, then `zg.train`'s epoch on the same workload for reference. `--task
link`: `LinkNeighborLoader` over `zg.random_link_split`'s training edges, one negative
each, a dot product of the ends' embeddings and a weighted binary cross-entropy, the
first `--steps` batches of each epoch (`benchmarks/link.py` times `zg.train`'s link
steps). The loop's losses must not depend on `sample_ahead` beyond the GPU's
nondeterministic scatter-adds (the batches are the same); each run prints its last
epoch's mean loss. `--check` first compares every array of the first batches of an
epoch sampled one at a time and `max(--ahead)` at a time, on the device, and fails the
run if one differs. One JSON line per measurement on stdout (and `--out`), then a table.
"""

from __future__ import annotations

import argparse
import itertools
import time

import jax
import jax.numpy as jnp
import optax
from hetero_loop import emit, median_after_first  # benchmarks/, the script's folder

import zerognn_jax as zg

FANOUTS = (15, 10, 5)


def node_loss(model, params, batch):
    logits = model.apply({"params": params}, batch.x, batch.views, train=True,
                         rngs={"dropout": batch.dropout_key})
    ce = optax.softmax_cross_entropy_with_integer_labels(logits, batch.y)
    w = batch.seed_mask.astype(jnp.float32)
    return jnp.sum(ce * w) / jnp.maximum(jnp.sum(w), 1.0)


def link_loss(model, params, batch):
    h = model.apply({"params": params}, batch.x, batch.views, train=True,
                    rngs={"dropout": batch.dropout_key})
    scores = jnp.sum(h[batch.pairs[:, 0]] * h[batch.pairs[:, 1]], -1)
    bce = optax.sigmoid_binary_cross_entropy(scores, batch.labels)
    return jnp.sum(bce * batch.weight) / jnp.maximum(jnp.sum(batch.weight), 1.0)


def make_loader(ds, split, ahead: int, **kw):
    common = dict(fanouts=FANOUTS, batch_size=1024, key=0, features=ds.features,
                  sample_ahead=ahead, **kw)
    if split is None:
        return zg.NeighborLoader(ds.graph, ds.train_idx, targets=ds.labels.clip(0), **common)
    return zg.LinkNeighborLoader(split.graph, split.train, num_negatives=1, **common)


def check(ds, split, ahead: int, steps: int) -> dict:
    """Arrays compared and unequal over the first `steps` batches of epoch 1 (fewer where
    the epoch has fewer: `batches` counts those compared), sampled one at a time and
    `ahead` at a time at one envelope."""
    one = make_loader(ds, split, 1)
    many = make_loader(ds, split, ahead, envelope=one.envelope)
    batches = compared = unequal = 0
    for a, b in itertools.islice(zip(one.epoch(1), many.epoch(1)), steps):
        batches += 1
        for x, y in zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b)):
            compared += 1
            unequal += not bool(jnp.array_equal(x, y))
    return {"ahead": ahead, "batches": batches, "compared": compared, "unequal": unequal}


def loop(ds, split, ahead: int, args) -> dict:
    """The loader alone, then the loader and a jitted step, `args.epochs` epochs each
    (of at most `args.steps` batches)."""
    loader = make_loader(ds, split, ahead)
    outputs, loss_of = (ds.num_classes, node_loss) if split is None else (256, link_loss)
    model = zg.make_model("sage", hidden=256, num_layers=len(FANOUTS), num_classes=outputs,
                          dropout=0.5)
    steps = min(len(loader), args.steps or len(loader))

    def batches(epoch):
        return itertools.islice(loader.epoch(epoch), steps)

    bare = []
    for epoch in range(args.epochs):
        t = time.perf_counter()
        for _ in batches(epoch):
            pass
        bare.append(time.perf_counter() - t)
    tx = optax.adam(3e-3)

    @jax.jit
    def step(params, opt, batch):
        loss, grads = jax.value_and_grad(lambda p: loss_of(model, p, batch))(params)
        updates, opt = tx.update(grads, opt, params)
        return optax.apply_updates(params, updates), opt, loss

    first = next(loader.epoch(0))
    params = model.init(jax.random.key(1), first.x, first.views, train=False)["params"]
    opt = tx.init(params)
    times, loss = [], None
    for epoch in range(args.epochs):
        t, total = time.perf_counter(), []
        for batch in batches(epoch):
            params, opt, value = step(params, opt, batch)
            total.append(value)
        jax.block_until_ready(params)
        times.append(time.perf_counter() - t)
        loss = float(jnp.mean(jnp.stack(total)))
    return {"ahead": ahead, "loader_epochs": bare, "loop_epochs": times, "last_loss": loss,
            "programs": len(loader._programs), "steps": steps}


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--ahead", default="1,2,4,8", help="sample_ahead values, comma-separated")
    p.add_argument("--task", default="node", choices=("node", "link"))
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--steps", type=int, default=0, help="batches an epoch (0: all)")
    p.add_argument("--check", action="store_true",
                   help="first compare batches sampled one and max(--ahead) at a time")
    p.add_argument("--scale", type=float, default=1.0)
    p.add_argument("--root", default=None, help="products-like cache folder")
    p.add_argument("--out", default=None, help="JSON lines, appended as measured")
    args = p.parse_args(argv)
    ds = zg.load_dataset("products-like", args.root, scale=args.scale)
    split = zg.random_link_split(ds.graph, seed=0) if args.task == "link" else None
    aheads = [int(a) for a in args.ahead.split(",")]
    if args.check:
        same = check(ds, split, max(aheads), args.steps or 20)
        emit(args.out, {"stage": "check", "task": args.task, **same})
        if same["unequal"]:
            raise SystemExit(f"batches sampled {max(aheads)} at a time differ: {same}")
    rows = []
    for ahead in aheads:
        run = loop(ds, split, ahead, args)
        emit(args.out, {"stage": "own loop", "task": args.task,
                        "device": str(jax.devices()[0]), **run})
        rows.append(run)
    print(f"| products-like {args.task}, {rows[0]['steps']} steps | loader alone | loader + "
          f"a jitted step | last epoch's loss |\n|---|---|---|---|")
    for r in rows:
        print(f"| sample_ahead={r['ahead']} | {median_after_first(r['loader_epochs']):.3f} s | "
              f"{median_after_first(r['loop_epochs']):.3f} s | {r['last_loss']:.4f} |")
    if args.task == "node":
        cfg = zg.TrainConfig(dataset="products-like", root=args.root, scale=args.scale,
                             epochs=args.epochs, eval_mode="none", progress=False)
        train = [h["epoch_seconds"] for h in zg.train(cfg, ds).history]
        emit(args.out, {"stage": "zg.train", "train_epochs": train})
        print(f"| `zg.train` (one scan an epoch) | | {median_after_first(train):.3f} s | |")


if __name__ == "__main__":
    main()
