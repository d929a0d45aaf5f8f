"""Your own training loop on the device sampler: `NeighborLoader` as a data loader.

The loader shuffles the seeds every epoch and yields sampled subgraphs of static shape
(so the jitted step below compiles once per envelope), with the input nodes' features
(`batch.x`) and the seeds' labels (`batch.y`) fetched on the device; any sampler of the
trainer ("uniform", "weighted" by edge weight, "labor"). The loop, the loss and the
optimizer are yours. The test nodes are then predicted in their own order
(`shuffle=False`), over full neighbourhoods with `--eval-fanouts=-1,-1` (exact). `zerognn train` /
`zg.train` run a whole epoch as one program instead, without the per-batch return to
Python this loop makes.

    python examples/own_loop/main.py --epochs 3
    python examples/own_loop/main.py --epochs 3 --sampler labor
"""

import argparse
import json

import jax
import jax.numpy as jnp
import numpy as np
import optax

import zerognn_jax as zg
from zerognn_jax.cli.flags import int_tuple, parse_args, run_main


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False)
    p.add_argument("--dataset", default="tiny", help="a dataset name or .npz file")
    p.add_argument("--root", default=None,
                   help="folder of a named dataset's files (Planetoid's ind.* files, OGB's "
                        "folders)")
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--sampler", default="uniform", choices=zg.SAMPLERS)
    p.add_argument("--fanouts", type=int_tuple, default="10,5", help="per hop, seeds' hop first")
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--eval-fanouts", type=int_tuple, default=None,
                   help="per hop, for the test nodes (default: the training fanouts; -1 = all "
                        "neighbours, exact; one per layer)")
    args = parse_args(p, argv)
    for name in ("epochs", "hidden"):  # (a loop of no epoch reports an untrained model)
        if getattr(args, name) < 1:
            p.error(f"--{name} must be at least 1, got {getattr(args, name)}")
    if args.eval_fanouts and len(args.eval_fanouts) != len(args.fanouts):
        p.error(f"--eval-fanouts needs one fanout per layer, {len(args.fanouts)} as "
                f"--fanouts gives, got {len(args.eval_fanouts)}")
    ds = zg.load_dataset(args.dataset, args.root)
    fanouts = args.fanouts
    graph = ds.graph
    if args.sampler == "weighted" and graph.weights is None:  # some weights to sample by
        graph = graph._replace(weights=np.ones(graph.num_edges, np.float32))
    labels = ds.labels.clip(0)
    loader = zg.NeighborLoader(graph, ds.train_idx, fanouts=fanouts, batch_size=128,
                               key=jax.random.key(0), sampler=args.sampler,
                               features=ds.features, targets=labels)
    model = zg.make_model("sage", hidden=args.hidden, num_layers=len(fanouts),
                          num_classes=ds.num_classes, dropout=0.2)
    tx = optax.adam(args.lr)

    @jax.jit
    def step(params, opt_state, batch):
        def loss_fn(params):
            logits = model.apply({"params": params}, batch.x, batch.views, train=True,
                                 rngs={"dropout": batch.dropout_key})
            ce = optax.softmax_cross_entropy_with_integer_labels(logits, batch.y)
            weight = batch.seed_mask.astype(jnp.float32)  # the last batch is padded
            return jnp.sum(ce * weight) / jnp.maximum(jnp.sum(weight), 1.0)

        loss, grads = jax.value_and_grad(loss_fn)(params)
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    first = next(loader.epoch(0))
    params = model.init(jax.random.key(1), first.x, first.views, train=False)["params"]
    opt_state = tx.init(params)
    losses = []
    for _ in range(args.epochs):
        epoch_losses = []
        for batch in loader:
            params, opt_state, loss = step(params, opt_state, batch)
            epoch_losses.append(loss)
        losses.append(float(jnp.mean(jnp.stack(epoch_losses))))
        print(json.dumps({"epoch": len(losses) - 1, "loss": losses[-1]}))
    eval_fanouts = args.eval_fanouts or args.fanouts
    test_acc = evaluate(model, params, graph, ds, eval_fanouts)
    print(json.dumps({"sampler": args.sampler, "test_acc": test_acc}))
    return {"losses": losses, "test_acc": test_acc}


def evaluate(model, params, graph, ds, fanouts) -> float:
    """Test accuracy, batches in the test nodes' order (`shuffle=False`)."""
    loader = zg.NeighborLoader(graph, ds.test_idx, fanouts=fanouts, batch_size=256,
                               key=0, shuffle=False, features=ds.features,
                               envelope="conservative")
    apply = jax.jit(lambda params, batch: model.apply(
        {"params": params}, batch.x, batch.inference_views(), train=False))
    preds = [np.asarray(jnp.argmax(apply(params, b), -1))[np.asarray(b.seed_mask)]
             for b in loader]
    return float(np.mean(np.concatenate(preds) == ds.labels[ds.test_idx]))


if __name__ == "__main__":
    run_main(main)
