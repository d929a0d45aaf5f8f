"""Link prediction from Python with your own encoder: `zg.train(task="link")`, or your
own loop over `zg.LinkNeighborLoader` (`--loop`).

The encoder is any Flax model with the node interface (`model(x, views, train=...)`
gives one embedding row per level-0 node). `zg.train` wraps it with the default
decoder (the dot product over sqrt(width)), draws negatives on the device and hides each
step's own edges from its message passing (docs/link_prediction.md). This encoder has
no per-layer form (`layer`), so it is evaluated on sampled neighbourhoods, which full
fanouts (`--fanouts=-1,-1`) make exact (slow on a CPU: every neighbour of every node,
two hops). With `--loop` the same happens in a loop of your own: the loader hands out
each batch's pairs, labels and weights, and the test edges of the same split are scored
from every node's embedding (a `NeighborLoader` over all nodes, in order).

    python examples/link_encoder/main.py --dataset cora --root path/to/planetoid
    python examples/link_encoder/main.py --loop         # your own loop
    python examples/link_encoder/main.py --builtin      # the built-in SAGE encoder
"""

import argparse
import dataclasses
import json

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax

import zerognn_jax as zg
from zerognn_jax.cli.flags import int_tuple, parse_args, run_main


class MeanEncoder(nn.Module):
    """Each layer: Dense([own ; mean of neighbours]), ReLU between layers."""

    hidden: int

    @nn.compact
    def __call__(self, x, views, *, train):
        for i, view in enumerate(views):
            neigh = view.weighted_sum(x[:, None, :], zg.mean_weights(view))[:, 0, :]
            x = nn.Dense(self.hidden)(jnp.concatenate([x[: view.num_dst], neigh], -1))
            x = x if i == len(views) - 1 else nn.relu(x)
        return x


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False)
    p.add_argument("--dataset", default="tiny", help="a dataset name or .npz file")
    p.add_argument("--root", default=None, help="folder with the dataset files")
    p.add_argument("--epochs", type=int, default=10)
    p.add_argument("--fanouts", type=int_tuple, default="5,5", help="per hop; -1 = all neighbours")
    p.add_argument("--hidden", type=int, default=32)
    which = p.add_mutually_exclusive_group()
    which.add_argument("--builtin", action="store_true", help="the built-in SAGE encoder")
    which.add_argument("--loop", action="store_true",
                       help="your own loop over LinkNeighborLoader")
    args = parse_args(p, argv)
    for name in ("epochs", "hidden"):  # (a loop of no epoch reports an untrained model)
        if getattr(args, name) < 1:
            p.error(f"--{name} must be at least 1, got {getattr(args, name)}")
    fanouts = args.fanouts
    if args.loop:
        report = own_loop(zg.load_dataset(args.dataset, args.root), fanouts, args.hidden,
                          args.epochs)
        print(json.dumps(report))
        return report
    cfg = zg.TrainConfig(dataset=args.dataset, root=args.root, task="link",
                         hidden=args.hidden, layers=len(fanouts), fanouts=fanouts,
                         batch_size=512, lr=0.01, epochs=args.epochs, eval_every=0,
                         normalize_features=False, progress=False, flat_outer=False)
    if args.builtin:  # without dropout, as the encoder below
        summary = zg.train(dataclasses.replace(cfg, model="sage", dropout=0.0)).summary
    else:
        summary = zg.train(cfg, model=MeanEncoder(args.hidden)).summary
    report = {k: summary[k] for k in ("model", "eval_mode", "test_auc", "test_ap")}
    print(json.dumps(report))
    return report


def own_loop(ds, fanouts, hidden: int, epochs: int) -> dict:
    """Trains `MeanEncoder` with a dot product over `LinkNeighborLoader` batches (the
    split `zg.train` makes: seed 0) and scores the split's test edges."""
    split = zg.random_link_split(ds.graph, seed=0)
    loader = zg.LinkNeighborLoader(split.graph, split.train, fanouts=fanouts, batch_size=512,
                                   key=0, features=ds.features)
    encoder, tx = MeanEncoder(hidden), optax.adam(0.01)

    @jax.jit
    def step(params, opt_state, batch):
        def loss_fn(params):
            h = encoder.apply({"params": params}, batch.x, batch.views, train=True)
            scores = jnp.sum(h[batch.pairs[:, 0]] * h[batch.pairs[:, 1]], -1)
            ce = optax.sigmoid_binary_cross_entropy(scores, batch.labels)
            return jnp.sum(ce * batch.weight) / jnp.maximum(jnp.sum(batch.weight), 1.0)

        loss, grads = jax.value_and_grad(loss_fn)(params)
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    first = next(loader.epoch(0))
    params = encoder.init(jax.random.key(0), first.x, first.views, train=False)["params"]
    opt_state, losses = tx.init(params), []
    for _ in range(epochs):
        epoch_losses = []
        for batch in loader:
            params, opt_state, loss = step(params, opt_state, batch)
            epoch_losses.append(loss)
        losses.append(float(jnp.mean(jnp.stack(epoch_losses))))
    h = embeddings(encoder, params, split.graph, ds.features, fanouts)
    score = lambda pairs: np.sum(h[pairs[:, 0]] * h[pairs[:, 1]], -1)
    return {"model": "MeanEncoder (own loop)", "losses": losses,
            "test_auc": zg.roc_auc(score(split.test.pos), score(split.test.neg)),
            "test_ap": zg.average_precision(score(split.test.pos), score(split.test.neg))}


def embeddings(encoder, params, graph, features, fanouts) -> np.ndarray:
    """Every node's embedding, batches in node order (`shuffle=False`)."""
    loader = zg.NeighborLoader(graph, np.arange(graph.num_nodes), fanouts=fanouts,
                               batch_size=512, key=0, shuffle=False, features=features,
                               envelope="conservative")
    apply = jax.jit(lambda params, b: encoder.apply({"params": params}, b.x,
                                                    b.inference_views(), train=False))
    return np.concatenate([np.asarray(apply(params, b))[np.asarray(b.seed_mask)]
                           for b in loader])


if __name__ == "__main__":
    run_main(main)
