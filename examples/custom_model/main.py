"""Your own Flax model (Linen or NNX), optax optimizer and loss, trained by `zg.train`.

A model is called as `model(x, views, train=...)`: `x` holds the features of the
outermost sampled level, `views[i]` is layer i's edges (outermost hop first) and offers
`weighted_sum`, `max`, `softmax`, `src_of_edges`, `dst_of_edges`, and `num_dst` (its
destinations are the first `num_dst` rows of its sources). Return the outputs of the
seeds (the first `views[-1].num_dst` rows). docs/api.md has the details.

    python examples/custom_model/main.py --epochs 5            # Flax Linen
    python examples/custom_model/main.py --epochs 5 --nnx      # the same model in NNX
"""

import argparse
import json

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax
from flax import nnx

import zerognn_jax as zg


class MeanConcat(nn.Module):
    """Each layer: [own features, mean of sampled neighbours] -> Dense -> ReLU."""

    hidden: int
    num_classes: int

    @nn.compact
    def __call__(self, x, views, *, train):
        h = x
        for i, view in enumerate(views):
            neigh = view.weighted_sum(h[:, None, :], zg.mean_weights(view))[:, 0, :]
            h = jnp.concatenate([h[: view.num_dst], neigh], axis=-1)
            last = i == len(views) - 1
            h = nn.Dense(self.num_classes if last else self.hidden)(h)
            h = h if last else nn.Dropout(0.2, deterministic=not train)(nn.relu(h))
        return h


class NNXMeanConcat(nnx.Module):
    """The same model in Flax NNX (`zg.train` wraps it with `flax.nnx.bridge`)."""

    def __init__(self, in_features, hidden, num_classes, num_layers=2, *, rngs):
        widths = [in_features] + [hidden] * (num_layers - 1) + [num_classes]
        self.dense = nnx.List([nnx.Linear(2 * a, b, rngs=rngs)
                               for a, b in zip(widths[:-1], widths[1:])])
        self.drop = nnx.Dropout(0.2, rngs=rngs)

    def __call__(self, x, views, *, train):
        h = x
        for i, (view, dense) in enumerate(zip(views, self.dense)):
            neigh = view.weighted_sum(h[:, None, :], zg.mean_weights(view))[:, 0, :]
            h = dense(jnp.concatenate([h[: view.num_dst], neigh], axis=-1))
            if i < len(views) - 1:
                h = self.drop(nnx.relu(h))
        return h


def smoothed_cross_entropy(logits, labels):
    """Per-row loss: cross-entropy against labels smoothed by 0.1."""
    onehot = optax.smooth_labels(jax.nn.one_hot(labels, logits.shape[-1]), 0.1)
    return optax.softmax_cross_entropy(logits, onehot)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dataset", default="tiny")
    p.add_argument("--epochs", type=int, default=5)
    p.add_argument("--nnx", action="store_true", help="the Flax NNX model")
    args = p.parse_args(argv)
    dataset = zg.load_dataset(args.dataset)
    if args.nnx:
        model = NNXMeanConcat(dataset.features.shape[1], 64, dataset.num_classes,
                              rngs=nnx.Rngs(0))
    else:
        model = MeanConcat(64, dataset.num_classes)
    tx = optax.chain(optax.clip_by_global_norm(1.0),
                     optax.adamw(optax.cosine_decay_schedule(3e-3, 50 * args.epochs)))
    cfg = zg.TrainConfig(layers=2, fanouts=(10, 5), batch_size=128, epochs=args.epochs,
                         progress=False)
    result = zg.train(cfg, dataset, model=model, optimizer=tx, loss=smoothed_cross_entropy)
    for record in result.history:
        print(json.dumps({k: record[k] for k in ("epoch", "loss", "train_batch_acc")}))
    print(json.dumps({k: result.summary[k] for k in ("model", "eval_mode", "test_acc")}))
    return result.summary["test_acc"]


if __name__ == "__main__":
    main()
