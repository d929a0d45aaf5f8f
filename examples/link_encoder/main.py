"""Link prediction from Python with your own encoder: `zg.train(task="link")`.

The encoder is any Flax model with the node interface (`model(x, views, train=...)`
gives one embedding row per level-0 node); the task wraps it with a decoder, draws
negatives on the device and hides each step's own edges from its message passing
(docs/link_prediction.md). This encoder has no per-layer form (`layer`), so it is
evaluated on sampled neighbourhoods, which the full fanouts (-1) make exact.

    python examples/link_encoder/main.py --dataset cora --root ../shared/datasets/planetoid
    python examples/link_encoder/main.py --builtin      # the built-in GCN encoder
"""

import argparse
import json

import flax.linen as nn
import jax.numpy as jnp

import zerognn_jax as zg


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
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dataset", default="tiny", help="a dataset name or .npz file")
    p.add_argument("--root", default=None, help="folder with the dataset files")
    p.add_argument("--epochs", type=int, default=10)
    p.add_argument("--fanouts", default="-1,-1", help="per hop; -1 = all neighbours")
    p.add_argument("--hidden", type=int, default=32)
    p.add_argument("--builtin", action="store_true", help="the built-in SAGE encoder")
    args = p.parse_args(argv)
    fanouts = tuple(int(f) for f in args.fanouts.split(","))
    cfg = zg.TrainConfig(dataset=args.dataset, root=args.root, task="link", model="sage",
                         hidden=args.hidden, layers=len(fanouts), fanouts=fanouts,
                         batch_size=512, lr=0.01, dropout=0.0, epochs=args.epochs,
                         eval_every=0, normalize_features=False, progress=False,
                         flat_outer=False)
    model = None if args.builtin else MeanEncoder(args.hidden)
    summary = zg.train(cfg, model=model).summary
    report = {k: summary[k] for k in ("model", "eval_mode", "test_auc", "test_ap")}
    print(json.dumps(report))
    return report


if __name__ == "__main__":
    main()
