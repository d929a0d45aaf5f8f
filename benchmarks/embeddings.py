"""products-like with a learnable node embedding: epoch time of row-sparse (lazy) Adam
against no embedding and against dense Adam over the whole table, one JSON line per
variant and a table at the end.

    PYTHONPATH=. python3 benchmarks/embeddings.py [--dim 64] [--epochs 4] [--root /tmp/c]
        [--scale 1] [--dtype float32] [--variants none,sparse,sparse-tree,dense]
        [--kernels auto] [--profile sparse,...] [--top 14]

Variants (the library's defaults otherwise: SAGE 3x256, [15, 10, 5], batch 1024):
  none          no embedding (tree layout, the library's choice for it)
  sparse        `embedding_dim=dim`: the step's rows and their moments only, on the
                layout the library picks with an embedding: deduplicated levels, the
                outer one too (distinct rows: no sort)
  sparse-tree   the same in tree mode, whose outer level repeats nodes, so its ids are
                sorted and merged first
  dense         the same table, but every step runs Adam over all N rows and both
                moment tables (the gradient scattered into a dense [N, dim] array): the
                cost row-sparse updates avoid
  no-update     the rows gathered and read by the model, the table never written (their
                gradient unused, so XLA drops the backward into them)
  grad-only     the rows differentiated too (the gradient summed into a flag), the
                table never written: the backward into the rows without the update

`--kernels` as `TrainConfig.kernels`: `auto` (on a GPU the Pallas sampler and the row
update written in place by its Pallas kernel, `zerognn_jax/_src/pallas/row_adam.py`), or
`sample=pallas` for the row update's XLA form.

`--profile`: for those variants, one more epoch on the scan engine as `zg.train` runs it
(at the envelope an untimed first epoch ends with, `sample_ahead` steps sampled at
once), compiled without command buffers (whose kernels a trace does not name), under
`jax.profiler`:
device time per step split into phases by the named scopes of each kernel's operation
(`profiling.step_phase`: the embedding's row gather and its row update apart from the
rest) and the busiest kernels with the operation each came from
(`profiling.profile_training_epoch`). On a CPU everything runs but the device lines.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import tempfile

import jax.numpy as jnp
import numpy as np
from bench_rows import names_of  # this folder: run as `python benchmarks/embeddings.py`

from zerognn_jax import TrainConfig, load_dataset, train
from zerognn_jax._src.bench import profiling
from zerognn_jax._src.training import trainer
from zerognn_jax._src.training.embeddings import NodeEmbedding
from zerognn_jax._src.training.row_adam import RowAdamState


@dataclasses.dataclass(frozen=True)
class DenseAdamEmbedding(NodeEmbedding):
    """Dense Adam over the whole table every step (for timing contrast only: a step the
    engine drops would still move the table by its momentum)."""

    def update(self, table, opt, ids, grads, valid, *, unique, repeats=None, taken=True,
               kernels=None):
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
    """Rows gathered and read by the model, never written: their gradient is unused, so
    XLA drops the backward into them (the cost of reading the rows)."""

    def update(self, table, opt, ids, grads, valid, *, unique, repeats=None, taken=True,
               kernels=None):
        return table, opt


@dataclasses.dataclass(frozen=True)
class GradientOnlyEmbedding(NodeEmbedding):
    """Rows read and differentiated, never written: the gradient rows are summed into a
    flag no value depends on (the cost of the backward into the rows, without the
    update)."""

    def update(self, table, opt, ids, grads, valid, *, unique, repeats=None, taken=True,
               kernels=None):
        never = jnp.sum(grads.astype(jnp.float32)) == jnp.inf
        return table, opt._replace(count=opt.count + never.astype(opt.count.dtype))


VARIANTS = {"none": {}, "sparse": {}, "sparse-tree": dict(dedup=False), "dense": {},
            "no-update": {}, "grad-only": {}}
STAND_INS = {"dense": DenseAdamEmbedding, "no-update": FrozenEmbedding,
             "grad-only": GradientOnlyEmbedding}


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--dim", type=int, default=64)
    p.add_argument("--epochs", type=int, default=4)
    p.add_argument("--dtype", default="float32")
    p.add_argument("--root", default="/tmp/c")
    p.add_argument("--scale", type=float, default=1.0)
    p.add_argument("--variants", default="none,sparse,sparse-tree,dense",
                   type=lambda text: names_of(text, VARIANTS, "variant"),
                   help=f"comma-separated, of {', '.join(VARIANTS)}")
    p.add_argument("--kernels", default="auto")
    p.add_argument("--profile", default="", help="variants to profile, comma-separated")
    p.add_argument("--top", type=int, default=14, help="kernels listed per profile")
    args = p.parse_args(argv)
    dataset = load_dataset("products-like", root=args.root, scale=args.scale)
    rows = []
    for name in args.variants:
        trainer.NodeEmbedding = STAND_INS.get(name, NodeEmbedding)
        cfg = TrainConfig(dataset="products-like", root=args.root, scale=args.scale,
                          epochs=args.epochs,
                          dtype=args.dtype, eval_mode="none", progress=False,
                          kernels=args.kernels,
                          embedding_dim=0 if name == "none" else args.dim,
                          **VARIANTS[name])
        res = train(cfg, dataset)
        times = [h["epoch_seconds"] for h in res.history]
        times = times[1:] or times  # after the first, unless it is the only one
        rows.append({"variant": name, "dim": cfg.embedding_dim, "dtype": args.dtype,
                     "kernels": res.summary.get("kernels"),
                     "layout": res.summary.get("layout"), "epochs": times,
                     "median": float(np.median(times)),
                     "losses": [h["loss"] for h in res.history]})
        if name in args.profile.split(","):
            with tempfile.TemporaryDirectory() as tmp:
                rows[-1].update(profiling.profile_training_epoch(cfg, dataset, tmp,
                                                                 top=args.top))
        print(json.dumps(rows[-1]), flush=True)
    trainer.NodeEmbedding = NodeEmbedding
    base = next((r["median"] for r in rows if r["variant"] == "none"), None)
    phases = []
    for r in rows:
        phases += [p for p in r.get("phases_us_per_step", {}) if p not in phases]
    print("| variant | epoch (s) | vs none |" + "".join(f" {p} us |" for p in phases))
    print("|---|---|---|" + "---|" * len(phases))
    for r in rows:
        ratio = f"{r['median'] / base:.2f}x" if base else "-"
        got = r.get("phases_us_per_step", {})
        print(f"| {r['variant']} | {r['median']:.4f} | {ratio} |" +
              "".join(f" {got[p][0]:.0f} |" if p in got else " |" for p in phases))


if __name__ == "__main__":
    main()
