"""A graph-level model served through its `jax.export` artifact (molhiv-like).

    PYTHONPATH=. python3 benchmarks/serve_graphs.py [--scale 1] [--batch-sizes 32,256]
                                                    [--dtypes float32,bfloat16]

Per dtype, GINE-virtual 5 x 300 trained one epoch at batch 256, then per batch size B
and per form of the sums (scatter-adds, or gathers over K listed edges a node with K
the collection's largest degree: `max_degree`) exported (`zg.export_model`, B graphs
a call in B x 40 node and B x 90 edge rows) and loaded back from bytes. Checks the
artifact's outputs for the first B test graphs against evaluation's (`graph_outputs`),
then times serving the test split's whole batches (packed by `zg.graph_arguments`
beforehand and put on the device: the calls alone, one dispatch each, best of 3)
against evaluation's own pass over the same graphs (one scan, tight capacities), and
prints a Markdown table.
"""

from __future__ import annotations

import argparse
import time

import jax
import jax.numpy as jnp
import numpy as np

import zerognn_jax as zg
from zerognn_jax._src.sampling.graph_batch import max_degrees
from zerognn_jax._src.training.tasks.graph import graph_outputs


def best_of(repeats: int, fn) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        jax.block_until_ready(fn())
        times.append(time.perf_counter() - start)
    return min(times)


def measure(mol, res, b: int, degree: int | None) -> dict:
    test = np.asarray(mol.test_idx)
    start = time.perf_counter()
    art = zg.export_model(res.program, res.variables, res.data, batch_size=b,
                          max_nodes=b * 40, max_edges=b * 90, max_degree=degree)
    call = jax.jit(jax.export.deserialize(art.serialize()).call)
    export_s = time.perf_counter() - start
    n = (test.size // b) * b
    batches = [tuple(jnp.asarray(a) for a in zg.graph_arguments(art, mol, test[i:i + b]))
               for i in range(0, n, b)]
    want = graph_outputs(res.program, res.variables, res.data, test[:b], mol, batch_size=b)
    diff = float(np.max(np.abs(np.asarray(call(*batches[0])) - want)))
    served = best_of(3, lambda: [call(*args) for args in batches])
    evaluate = lambda: graph_outputs(res.program, res.variables, res.data, test[:n], mol,
                                     batch_size=b)
    evaluate()  # compiled once for these capacities
    return {"batch": b, "sums": "scatter-adds" if degree is None else f"{degree} listed",
            "graphs": n, "export_s": export_s, "diff": diff,
            "largest": float(np.max(np.abs(want))), "served": n / served,
            "evaluation": n / best_of(3, evaluate)}


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--scale", type=float, default=1.0)
    p.add_argument("--batch-sizes", default="32,256")
    p.add_argument("--dtypes", default="float32,bfloat16")
    args = p.parse_args(argv)
    print(jax.__version__, jax.devices()[0].device_kind, flush=True)
    mol = zg.molhiv_like(args.scale, seed=0)
    largest = int(max_degrees(mol).max())
    rows = []
    for dtype in args.dtypes.split(","):
        cfg = zg.TrainConfig(task="graph", dataset="molhiv-like", model="gine-virtual",
                             hidden=300, layers=5, batch_size=256, epochs=1,
                             eval_mode="none", progress=False, dtype=dtype)
        res = zg.train(cfg, mol)
        for b in map(int, args.batch_sizes.split(",")):
            for degree in (None, largest):
                rows.append({"dtype": dtype, **measure(mol, res, b, degree)})
                print(rows[-1], flush=True)
    print("| dtype | graphs a call | sums | test graphs | export s | max abs diff from "
          "evaluation (largest output) | served graphs/s | evaluation graphs/s |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['dtype']} | {r['batch']} | {r['sums']} | {r['graphs']} | "
              f"{r['export_s']:.1f} | "
              f"{r['diff']:.2e} ({r['largest']:.2f}) | {r['served']:,.0f} | "
              f"{r['evaluation']:,.0f} |")


if __name__ == "__main__":
    main()
