"""Your own loop on a typed graph against `zg.train`: mag-like, relational SAGE.

    PYTHONPATH=. python3 benchmarks/hetero_loop.py --scale 1 --epochs 3 --ahead 1,4,8

Three ways through the same epochs of training papers (fanouts per relation, batch 1024,
Adam), each timed as the median epoch after the first (compiles excluded):
- `zg.train`: the whole epoch as one compiled scan (the featureless types' rows
  trained by lazy Adam inside it);
- the loader alone: iterating `zg.HeteroNeighborLoader` (sampling, the feature rows
  gathered, one overflow flag read per call of `sample_ahead` batches), no model;
- your own loop: that loader and a jitted step written as a user would, the featureless
  types' rows as ordinary parameters under `optax.adam` (a dense update of every row).
The last two for each `sample_ahead` of `--ahead` (the same batches; the steps'
scatter-adds on a GPU are not deterministic, so accuracies differ a little). Then each
trained model's test accuracy: `zg.train`'s sampled evaluation, the loop's over a
loader of the test papers in order (both at the training fanouts). One JSON line per
measurement on stdout (and `--out`), then a table.
"""

from __future__ import annotations

import argparse
import json
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax

import zerognn_jax as zg


def emit(out: str | None, record: dict) -> None:
    line = json.dumps(record)
    print(line, flush=True)
    if out:
        with open(out, "a") as f:
            f.write(line + "\n")


def median_after_first(times: list[float]) -> float:
    return float(np.median(times[1:] if len(times) > 1 else times))


def own_loop(ds, args, ahead: int) -> dict:
    """The loader and a user's jitted step; epoch times and test accuracy."""
    fanouts = tuple(int(f) for f in args.fanouts.split(","))
    loader = zg.HeteroNeighborLoader(ds.graph, (ds.target_type, ds.train_idx),
                                     fanouts=fanouts, batch_size=args.batch_size, key=0,
                                     features=ds.features, targets=np.maximum(ds.labels, 0),
                                     kernels=args.kernels, sample_ahead=ahead)
    bare = []
    for epoch in range(args.epochs):  # the loader alone
        t = time.perf_counter()
        for _ in loader.epoch(epoch):
            pass
        bare.append(time.perf_counter() - t)
    model = zg.make_hetero_model("rsage", hidden=args.hidden, num_layers=len(fanouts),
                                 num_classes=ds.num_classes, target_type=ds.target_type,
                                 relations=ds.graph.relations)
    counts = ds.graph.num_nodes
    featureless = [t for t in ds.graph.node_types if t not in ds.features]
    key = jax.random.key(1)
    rows = {t: 0.1 * jax.random.normal(jax.random.fold_in(key, i), (counts[t], args.hidden))
            for i, t in enumerate(featureless)}

    def inputs(rows, batch):
        return {**batch.x, **{t: rows[t][ids] for t, ids in batch.input_nodes.items()
                              if t in rows}}

    first = next(iter(loader.epoch(0)))
    params = {"model": model.init(key, inputs(rows, first), first.layers(),
                                  train=False)["params"], "rows": rows}
    tx = optax.adam(args.lr)
    opt = tx.init(params)

    @jax.jit
    def step(params, opt, batch):
        def loss_fn(p):
            logits = model.apply({"params": p["model"]}, inputs(p["rows"], batch),
                                 batch.layers(), train=True,
                                 rngs={"dropout": batch.dropout_key})
            ce = optax.softmax_cross_entropy_with_integer_labels(logits, batch.y)
            w = batch.seed_mask.astype(jnp.float32)
            return jnp.sum(ce * w) / jnp.maximum(jnp.sum(w), 1.0)
        loss, grads = jax.value_and_grad(loss_fn)(params)
        updates, opt = tx.update(grads, opt, params)
        return optax.apply_updates(params, updates), opt, loss

    times, losses = [], []
    for epoch in range(args.epochs):
        t, total = time.perf_counter(), []
        for batch in loader.epoch(epoch):
            params, opt, loss = step(params, opt, batch)
            total.append(loss)
        jax.block_until_ready(params)
        times.append(time.perf_counter() - t)
        losses.append(float(np.mean([float(v) for v in total])))
    test = zg.HeteroNeighborLoader(ds.graph, (ds.target_type, ds.test_idx), fanouts=fanouts,
                                   batch_size=4096, key=7, shuffle=False,
                                   features=ds.features, targets=np.maximum(ds.labels, 0),
                                   kernels=args.kernels)
    apply = jax.jit(lambda p, b: model.apply({"params": p["model"]}, inputs(p["rows"], b),
                                             b.layers(), train=False))
    right = total = 0
    for batch in test:
        live = np.asarray(batch.seed_mask)
        pred = np.asarray(apply(params, batch)).argmax(1)
        right += int((pred == np.asarray(batch.y))[live].sum())
        total += int(live.sum())
    return {"ahead": ahead, "loader_epochs": bare, "loop_epochs": times, "loop_losses": losses,
            "loader_compiles": len(loader._programs),  # > 1: the envelope grew in a timed epoch
            "loop_test_acc": right / total, "test_nodes": total, "steps": len(loader)}


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--scale", type=float, default=1.0)
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--fanouts", default="25,20")
    p.add_argument("--batch-size", type=int, default=1024)
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--kernels", default="auto", help="the loader's (TrainConfig.kernels' "
                                                     "spec); zg.train runs auto")
    p.add_argument("--ahead", default="4", help="the loaders' sample_ahead values, "
                                                "comma-separated")
    p.add_argument("--root", default=None, help="folder caching the generated graph")
    p.add_argument("--out", default=None, help="JSON lines, appended as measured")
    args = p.parse_args(argv)
    ds = zg.load_hetero_dataset("mag-like", args.root, scale=args.scale)
    fanouts = tuple(int(f) for f in args.fanouts.split(","))
    cfg = zg.TrainConfig(dataset="mag-like", scale=args.scale, model="rsage",
                         hidden=args.hidden, layers=len(fanouts), fanouts=fanouts,
                         batch_size=args.batch_size, epochs=args.epochs, lr=args.lr,
                         eval_mode="sampled", eval_every=0, progress=False)
    result = zg.train(cfg, ds)
    scan = {"train_epochs": [h["epoch_seconds"] for h in result.history],
            "train_losses": [h["loss"] for h in result.history],
            "train_test_acc": result.summary["test_acc"]}
    emit(args.out, {"stage": "zg.train", "device": result.summary["device"], **scan})
    del result
    rows = [("`zg.train` (one scan an epoch)", median_after_first(scan["train_epochs"]),
             scan["train_test_acc"])]
    for ahead in (int(a) for a in args.ahead.split(",")):
        loop = own_loop(ds, args, ahead)
        emit(args.out, {"stage": "own loop", **loop})
        rows += [(f"`HeteroNeighborLoader` alone (no model), sample_ahead={ahead}",
                  median_after_first(loop["loader_epochs"]), None),
                 (f"`HeteroNeighborLoader` + a jitted step, dense Adam on the rows, "
                  f"sample_ahead={ahead}", median_after_first(loop["loop_epochs"]),
                  loop["loop_test_acc"])]
    print(f"| mag-like scale {args.scale}, {loop['steps']} steps | epoch (median after the "
          f"first) | test accuracy after {args.epochs} epochs |\n|---|---|---|")
    for name, seconds, acc in rows:
        print(f"| {name} | {seconds:.3f} s | {'' if acc is None else f'{100 * acc:.2f} %'} |")


if __name__ == "__main__":
    main()
