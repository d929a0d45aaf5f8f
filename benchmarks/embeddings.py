"""products-like with a learnable node embedding: epoch time of row-sparse (lazy) Adam
against no embedding and against dense Adam over the whole table, one JSON line per
variant and a table at the end.

    PYTHONPATH=. python3 benchmarks/embeddings.py [--dim 64] [--epochs 4] [--root /tmp/c]
        [--scale 1] [--dtype float32] [--variants none,sparse,sparse-dedup,dense]
        [--kernels auto]

Variants (the library's defaults otherwise: SAGE 3x256, [15, 10, 5], batch 1024):
  none          no embedding
  sparse        `embedding_dim=dim`: the step's rows and their moments only (the layout
                the library picks: tree mode, whose outer level repeats nodes, so its
                ids are sorted and merged first)
  sparse-dedup  the same on deduplicated levels, the outer one too (distinct rows: no
                sort)
  dense         the same table, but every step runs Adam over all N rows and both
                moment tables (the gradient scattered into a dense [N, dim] array): the
                cost row-sparse updates avoid
  no-update     the rows gathered and differentiated, the table never written: the
                share of the backward into the input rows

`--kernels` as `TrainConfig.kernels`: `auto` (on a GPU the Pallas sampler and the row
update written in place by its Pallas kernel, `pallas_kernels/row_adam.py`), or
`sample=pallas` for the row update's XLA form.
"""

from __future__ import annotations

import argparse
import dataclasses
import json

import jax.numpy as jnp
import numpy as np

from zerognn_jax import TrainConfig, load_dataset, train
from zerognn_jax._src.training import trainer
from zerognn_jax._src.training.embeddings import NodeEmbedding
from zerognn_jax._src.training.row_adam import RowAdamState


@dataclasses.dataclass(frozen=True)
class DenseAdamEmbedding(NodeEmbedding):
    """Dense Adam over the whole table every step (for timing contrast only: a step the
    engine drops would still move the table by its momentum)."""

    def update(self, table, opt, ids, grads, valid, *, unique, taken=True, kernels=None):
        n, b1, b2, eps = table.shape[0], 0.9, 0.999, 1e-8
        g = jnp.zeros(table.shape, jnp.float32).at[jnp.where(valid, ids, n)].add(
            grads.astype(jnp.float32), mode="drop")
        count = opt.count + 1
        mu, nu = b1 * opt.mu + (1 - b1) * g, b2 * opt.nu + (1 - b2) * g * g
        t = count.astype(jnp.float32)
        step = self.lr * (mu / (1 - b1**t)) / (jnp.sqrt(nu / (1 - b2**t)) + eps)
        return (table.astype(jnp.float32) - step).astype(table.dtype), \
            RowAdamState(mu, nu, count)


@dataclasses.dataclass(frozen=True)
class FrozenEmbedding(NodeEmbedding):
    """Rows gathered and differentiated, but never written (how much of the cost is the
    backward into the input rows rather than the update)."""

    def update(self, table, opt, ids, grads, valid, *, unique, taken=True, kernels=None):
        return table, opt


VARIANTS = {"none": {}, "sparse": {}, "sparse-dedup": dict(dedup=True, flat_outer=False),
            "dense": {}, "no-update": {}}


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--dim", type=int, default=64)
    p.add_argument("--epochs", type=int, default=4)
    p.add_argument("--dtype", default="float32")
    p.add_argument("--root", default="/tmp/c")
    p.add_argument("--scale", type=float, default=1.0)
    p.add_argument("--variants", default="none,sparse,sparse-dedup,dense")
    p.add_argument("--kernels", default="auto")
    args = p.parse_args(argv)
    dataset = load_dataset("products-like", root=args.root, scale=args.scale)
    rows = []
    for name in args.variants.split(","):
        trainer.NodeEmbedding = {"dense": DenseAdamEmbedding,
                                 "no-update": FrozenEmbedding}.get(name, NodeEmbedding)
        cfg = TrainConfig(dataset="products-like", root=args.root, scale=args.scale,
                          epochs=args.epochs,
                          dtype=args.dtype, eval_mode="none", progress=False,
                          kernels=args.kernels,
                          embedding_dim=0 if name == "none" else args.dim,
                          **VARIANTS[name])
        res = train(cfg, dataset)
        times = [h["epoch_seconds"] for h in res.history[1:]]
        rows.append({"variant": name, "dim": cfg.embedding_dim, "dtype": args.dtype,
                     "kernels": res.summary.get("kernels"),
                     "layout": res.summary.get("layout"), "epochs": times,
                     "median": float(np.median(times)),
                     "losses": [h["loss"] for h in res.history]})
        print(json.dumps(rows[-1]), flush=True)
    trainer.NodeEmbedding = NodeEmbedding
    base = next((r["median"] for r in rows if r["variant"] == "none"), None)
    print("| variant | epoch (s) | vs none |\n|---|---|---|")
    for r in rows:
        ratio = f"{r['median'] / base:.2f}x" if base else "-"
        print(f"| {r['variant']} | {r['median']:.4f} | {ratio} |")


if __name__ == "__main__":
    main()
