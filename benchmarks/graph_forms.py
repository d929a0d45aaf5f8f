"""Graph-level epochs under alternative forms of the model (#33), form against form.

    python benchmarks/graph_forms.py [--dataset molhiv-like] [--scale 1]
        [--batch-sizes 256,32] [--forms library,FORM,...]
        [--repeats 2] [--epochs 3] [--dtype bfloat16] [--loss-tolerance 0.02] [--out DIR]

The workload of benchmarks/graph.py (GINE-virtual 5 x 300, mean readout, dropout 0.5,
Adam 1e-3). `library` is the model as it stands; every other form swaps one piece:

- `split-encoders`: each layer's bond encoder computes its multi-hot codes itself, from
  the bond ids read through an optimisation barrier of its own. On a GPU, XLA's dot
  merger joins the five layers' encoder products, whose codes are one value, into one
  product and their table gradients into another, which can start only once layer 0's
  backward, the last, is done (docs/graph_tasks.md, "Not yet"); kept apart, four of
  the five gradients may run beside the rest of the backward. The same function: the
  same parameters, the same products. Not kept: on an H200 (2026-12-04) within the
  library's spread at batch 256, 0.993x at 32 (docs/benchmarks.md).
- `saved-masks`: each dropout site's keep mask is computed once and kept (behind an
  optimisation barrier) for the backward, which otherwise recomputes the counter hash
  inside its fusions (an H100 profile of a batch-256 step: four backward fusions that
  recompute batch norm and the dropout hash, 33 us each). The same masks, so the same
  function. Not kept: 1-2 % slower on an H200 (2026-12-04).
- `vn-materialised`: each layer's virtual-node rows, gathered to the nodes, are written
  out behind an optimisation barrier before they are added. Without the virtual node,
  XLA's priority fusion took 3.9 s of the epoch's compile instead of 20.2 s (H200,
  benchmarks/compile_time.py); the lead is that the gather fuses into each of its
  consumers. The same function. Not kept: 1.004x at batch 256 on an H200 (2026-12-04),
  its compile no shorter (docs/benchmarks.md).
- `product-pooling`: sums and means over each graph's nodes (the virtual node's input,
  the readout) and the virtual node's rows gathered back to the nodes are products
  with the batch's [nodes, graphs] membership matrix, as cuBLAS computes them, instead
  of sorted scatter-adds and gathers (the H100 profile above: nine scatter-adds of
  pooling at 10-17 us each; a product of [7872, 257] by [7872, 300] is ~1.2 GFLOP, a
  few us). The same function up to the order of float32 sums. Not kept: 0.806x at
  batch 256 on an H200 (2026-12-04).

For each batch size the forms run in turn, `--repeats` rounds, each run training
`--epochs` epochs from the same seed. One JSON line a run (also appended to
DIR/graph_forms.jsonl): graphs per second over the median epoch after the first,
compile seconds, every epoch's loss and the test ROC-AUC. Then a table, each form's
median graphs/s against library's, and whether each run's first-epoch loss is within
`--loss-tolerance` (relative) of library's first run: a form that only reformulates
must agree up to rounding (GPU sums run in varying order); exit code 1 if one does not.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import pathlib
import statistics
import sys
import zlib

import jax
import jax.numpy as jnp
from bench_rows import each, record

import zerognn_jax as zg
from zerognn_jax._src.data.graph_datasets import PRESETS
from zerognn_jax._src.nn import graph_models
from zerognn_jax._src.nn.models import hash_dropout

# The library's pieces that forms call, kept before any form replaces them
_library_broadcast, _library_pool = graph_models.broadcast, graph_models.pool


class _SplitEncoder(graph_models.CategoricalEncoder):
    """The library's `CategoricalEncoder`, reading its ids through an optimisation
    barrier tagged with this encoder's own path: no two encoders' codes are one value."""

    def __call__(self, x):
        tag = jnp.uint32(zlib.crc32("/".join(self.scope.path).encode()))
        x, _ = jax.lax.optimization_barrier((x, tag))
        return super().__call__(x)


def _saved_mask_dropout(x, rate, seed):
    """`hash_dropout` with its keep mask materialised: the same mask (the library's
    dropout of ones), through a barrier the backward cannot recompute behind."""
    keep = jax.lax.optimization_barrier(
        hash_dropout(jnp.ones_like(x), rate, seed) != 0)
    return jnp.where(keep, x / (1.0 - rate), jnp.zeros((), x.dtype))


def _materialised_broadcast(rows, graphs):
    """The library's `broadcast`, its output written out behind a barrier: no consumer
    of a node's virtual-node row fuses the gather that reads it."""
    return jax.lax.optimization_barrier(_library_broadcast(rows, graphs))


def _membership(graphs, dtype):
    """[Nc, B + 1] in `dtype`: 1 where node row n belongs to graph slot g."""
    return jax.nn.one_hot(graphs.node_graph, graphs.num_graphs, dtype=dtype)


def _product_pool(h, graphs, how):
    """The library's `pool` with sums and means as one product of the membership's
    transpose with `h` (float32 accumulation, as the library's sums); max as it is."""
    if how not in ("sum", "mean"):
        return _library_pool(h, graphs, how)
    acc = graph_models._widened(h).dtype
    out = jnp.einsum("ng,nd->gd", _membership(graphs, h.dtype), h, preferred_element_type=acc,
                     precision=jax.lax.Precision.HIGHEST)
    if how == "mean":
        out = out / jnp.maximum(graphs.n_node, 1).astype(acc)[:, None]
    return out.astype(h.dtype)


def _product_broadcast(rows, graphs):
    """The library's `broadcast` as one product of the membership with `rows` (one
    nonzero term a row: exact)."""
    return jnp.dot(_membership(graphs, rows.dtype), rows, precision=jax.lax.Precision.HIGHEST)


# Each form: the graph_models pieces it replaces while its models are built.
FORMS = {"library": {}, "split-encoders": {"CategoricalEncoder": _SplitEncoder},
         "saved-masks": {"hash_dropout": _saved_mask_dropout},
         "vn-materialised": {"broadcast": _materialised_broadcast},
         "product-pooling": {"pool": _product_pool, "broadcast": _product_broadcast}}


@contextlib.contextmanager
def swapped(form: str):
    """Models built inside use `form`'s pieces in place of graph_models' own (the
    module's names, which its model classes read when they are called)."""
    library = {name: getattr(graph_models, name) for name in FORMS[form]}
    for name, piece in FORMS[form].items():
        setattr(graph_models, name, piece)
    try:
        yield
    finally:
        for name, piece in library.items():
            setattr(graph_models, name, piece)


def run(data, form: str, batch_size: int, args) -> dict:
    """One run of `form`: its JSON record."""
    cfg = zg.TrainConfig(task="graph", dataset=data.name, model="gine-virtual", hidden=300,
                         layers=5, dropout=0.5, readout="mean", batch_size=batch_size,
                         epochs=args.epochs, lr=1e-3, progress=False, eval_every=0,
                         dtype=args.dtype)
    with swapped(form):
        result = zg.train(cfg, data)
    epochs = [h["epoch_seconds"] for h in result.history]
    epoch_s = statistics.median(epochs[1:] or epochs)
    return {"form": form, "batch_size": batch_size, "dtype": args.dtype,
            "dataset": data.name, "graphs_per_s": data.train_idx.size / epoch_s,
            "epoch_seconds": epochs, "compile_s": result.summary["compile_seconds"],
            "losses": [h["loss"] for h in result.history],
            "test_rocauc": result.summary["test_rocauc"],
            "device": result.summary["device"], "jax": jax.__version__}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--dataset", default="molhiv-like", choices=tuple(PRESETS))
    p.add_argument("--scale", type=float, default=1.0)
    p.add_argument("--batch-sizes", default="256,32")
    p.add_argument("--forms", default=",".join(FORMS), help=f"any of {', '.join(FORMS)}")
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--dtype", default="bfloat16", choices=("float32", "bfloat16"))
    p.add_argument("--loss-tolerance", type=float, default=0.02)
    p.add_argument("--out", default=os.environ.get("OUT", "."))
    args = p.parse_args(argv)
    forms = args.forms.split(",")
    unknown = [f for f in forms if f not in FORMS]
    if unknown or "library" not in forms:
        p.error(f"--forms takes library and any of {', '.join(FORMS)}; got {args.forms}")
    data = zg.load_graphs(args.dataset, scale=args.scale)
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rows = []
    for b in (int(x) for x in args.batch_sizes.split(",")):
        for _ in range(args.repeats):
            for form in forms:
                row = run(data, form, b, args)
                rows.append(row)
                record(row, out, "graph_forms.jsonl")
    ok = True
    print("| batch | form | graphs/s (runs) | vs library | compile s | first-epoch loss | "
          "within tolerance | test ROC-AUC |")
    print("|---|---|---|---|---|---|---|---|")
    for b in sorted({r["batch_size"] for r in rows}, reverse=True):
        mine = [r for r in rows if r["batch_size"] == b]
        base = [r for r in mine if r["form"] == "library"]
        ref_loss = base[0]["losses"][0]
        base_speed = statistics.median(r["graphs_per_s"] for r in base)
        for form in forms:
            runs = [r for r in mine if r["form"] == form]
            speed = statistics.median(r["graphs_per_s"] for r in runs)
            close = all(abs(r["losses"][0] - ref_loss) <= args.loss_tolerance * abs(ref_loss)
                        for r in runs)
            ok &= close
            first = ", ".join(f"{r['losses'][0]:.4f}" for r in runs)
            print(f"| {b} | {form} | {each(runs, 'graphs_per_s', ',.0f')} | "
                  f"{speed / base_speed:.3f}x | {each(runs, 'compile_s', '.1f')} | "
                  f"{first} | {close} | {each(runs, 'test_rocauc', '.4f')} |")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
