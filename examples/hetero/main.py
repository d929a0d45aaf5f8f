"""Typed (heterogeneous) node classification: relational SAGE, R-GCN, R-GAT or a
relational module of your own on mag-like (ogbn-mag's shape: papers, authors,
institutions, fields), the venue of each paper, the whole epoch on the device; then the
model exported for serving and called.

    python examples/hetero/main.py                                   # mag-like, rsage; a GPU
    python examples/hetero/main.py --scale 0.002 --epochs 3          # tiny, on a CPU
    python examples/hetero/main.py --model rgat --embedding-dim 32   # rows for every type
    python examples/hetero/main.py --own-model                       # RelationalMean below

Prints the test accuracy beside the share of the most common training venue among the
test papers, then the classes the exported artifact gives a few test papers beside the
exact model's; returns the training result.
"""

from __future__ import annotations

import argparse

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

import zerognn_jax as zg
from zerognn_jax.cli.flags import int_tuple, parse_args, run_main


def parse(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False)
    p.add_argument("--scale", type=float, default=1.0, help="mag-like size factor")
    p.add_argument("--root", default=None, help="folder caching the generated graph")
    p.add_argument("--model", default=None, choices=zg.HETERO_MODELS,
                   help="a built-in typed model (default: rsage)")
    p.add_argument("--own-model", action="store_true",
                   help="train RelationalMean (this file) instead of --model")
    p.add_argument("--fanouts", type=int_tuple, default="25,20", help="per hop, for every relation")
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--embedding-dim", type=int, default=0,
                   help="learnable rows for every type (0: the featureless types' only)")
    p.add_argument("--batch-size", type=int, default=1024)
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--serve", type=int, default=8, help="test papers the artifact scores")
    args = parse_args(p, argv)
    if args.serve < 1:  # (checked before training, which it follows)
        p.error(f"--serve must be at least 1, got {args.serve}")
    if args.own_model and args.model is not None:
        p.error(f"--own-model trains RelationalMean, not --model {args.model}: give one")
    args.model = args.model or "rsage"
    return args


class RelationalMean(nn.Module):
    """A relational module of your own: per layer and node type of the level, a dense map
    of each destination's own row plus, per relation into the type, a dense map of the
    mean of its sampled sources; ReLU between layers. `zg.train` calls it as
    `model(x, layers, train=...)`: `x` {type: rows} of the outermost level (features,
    or a featureless type's learnable rows, `hidden` wide), `layers` one `zg.TypedLayer`
    a layer, outermost hop first. Its `layer` method, one layer of it, is what exact
    layer-wise inference calls with whole-graph views (docs/hetero.md)."""

    hidden: int
    num_classes: int
    num_layers: int
    target_type: str

    def __call__(self, x, layers, *, train):
        for i, layer in enumerate(layers):
            x = self.layer(i, x, layer, train=train)
        return x[self.target_type]

    @nn.compact
    def layer(self, i, h, layer, *, train):
        last = i == self.num_layers - 1
        width = self.num_classes if last else self.hidden
        out = {}
        for t, _ in layer.num_dst:  # every type of the level, one no relation reaches too
            z = nn.Dense(width, name=f"own{i}_{t}")(layer.dst_rows(t, h[t]))
            for (src, name, dst), view in layer.views.items():  # views by relation triple
                if dst == t:
                    mean = view.weighted_sum(h[src][:, None, :], zg.mean_weights(view))
                    z = z + nn.Dense(width, name=f"rel{i}_{src}_{name}_{dst}")(mean[:, 0, :])
            out[t] = z if last else nn.relu(z)
        return out


def majority_share(ds: zg.HeteroDataset) -> float:
    """The share of test papers in the venue most common among the training papers."""
    top = np.bincount(ds.labels[ds.train_idx]).argmax()
    return float(np.mean(ds.labels[ds.test_idx] == top))


def serve(result: zg.TrainResult, papers: np.ndarray) -> np.ndarray:
    """Classes of `papers` from the exported artifact, serialized and loaded back."""
    art = zg.export_model(result.program, result.variables, result.data,
                          batch_size=papers.size)
    call = jax.export.deserialize(art.serialize()).call
    logits = call(*art.data_arguments(result.data), jnp.asarray(papers, jnp.int32),
                  jnp.ones(papers.size, bool), jnp.uint32(0))
    return np.asarray(jnp.argmax(logits, axis=1))


def main(argv=None) -> zg.TrainResult:
    args = parse(argv)
    ds = zg.load_hetero_dataset("mag-like", args.root, scale=args.scale)
    fanouts = args.fanouts
    model = None
    if args.own_model:
        model = RelationalMean(args.hidden, ds.num_classes, len(fanouts), "paper")
    builtin = {} if args.own_model else {"model": args.model}  # (one of yours replaces it)
    cfg = zg.TrainConfig(dataset="mag-like", scale=args.scale, hidden=args.hidden,
                         layers=len(fanouts), fanouts=fanouts,
                         embedding_dim=args.embedding_dim, batch_size=args.batch_size,
                         epochs=args.epochs, progress=False, **builtin)
    result = zg.train(cfg, ds, model=model)
    result.summary["majority_share"] = majority_share(ds)
    print(f"test accuracy {result.summary['test_acc']:.3f}, most common venue "
          f"{result.summary['majority_share']:.3f}")
    papers = ds.test_idx[:args.serve]
    served = serve(result, papers)
    exact = np.asarray(jnp.argmax(zg.predict(result, papers), axis=1))
    result.summary["served_agree"] = float(np.mean(served == exact))
    print(f"exported artifact on {papers.size} test papers: {served.tolist()}; the exact "
          f"model: {exact.tolist()}")
    return result


if __name__ == "__main__":
    run_main(main)
