"""Sampling-only epochs per sampler: time per step, unique vertices per hop, LABOR's cut.

    PYTHONPATH=. python3 benchmarks/samplers.py --dataset products-like --root .cache/zerognn \
        --samplers uniform,labor --out samplers.jsonl
    PYTHONPATH=. python3 benchmarks/samplers.py --dataset rmat --root .cache/zerognn \
        --samplers uniform,weighted,weighted-replace --out samplers.jsonl

Per sampler: calibrate the envelope (one sampling-only epoch), then time `--repeats`
sampling-only epochs (sample and dedup of every hop, no features, no model), each one
device scan ended by a sync. One JSON line per sampler: median epoch seconds and ms per
step, mean and max unique vertices per level, sampled edges per step, the envelope, the
row widths (slots); for LABOR the fraction of rows per hop that kept more neighbours
than their slots (measured on the first `--cut-steps` steps); for weighted sampling the
binary-search steps. A graph without edge weights gets lognormal(0, 1) weights (seeded)
for the weighted samplers: what a draw costs does not depend on the values.
"""

from __future__ import annotations

import argparse
import json
import time

import jax
import jax.numpy as jnp
import numpy as np

from zerognn_jax._src.data.loaders import load_dataset
from zerognn_jax._src.ops.registry import Kernels
from zerognn_jax._src.pallas import counter_hash
from zerognn_jax._src.sampling import labor, weighted
from zerognn_jax._src.sampling.calibrate import calibrate, sample_epoch_counts
from zerognn_jax._src.sampling.minibatch import SamplerConfig, prepare_graph, sample_minibatch
from zerognn_jax._src.sampling.seeds import epoch_seeds, step_keys, step_seeds


def _config(name: str, fanouts, max_degree: int, span: int, tail: float) -> SamplerConfig:
    method, _, mode = name.partition("-")
    return SamplerConfig(fanouts, replace=mode == "replace", method=method, span=span,
                         slot_tail=tail).resolve(max_degree)


def _time_epochs(graph, perm, config, env, kernels, repeats):
    run = lambda: sample_epoch_counts(graph, perm, 0, 0, batch_size=env.batch_size,
                                      config=config, envelope=env,
                                      kernels=kernels)
    counts, edges, overflow = jax.block_until_ready(run())
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        jax.block_until_ready(run())
        times.append(time.perf_counter() - t0)
    return float(np.median(times)), np.asarray(counts), np.asarray(edges), np.asarray(overflow)


def _labor_cut(graph, perm, config, env, steps):
    """Per hop: the fraction of real rows that kept more neighbours than their slots."""

    @jax.jit
    def cut(step):
        seeds, valid = step_seeds(perm, step, env.batch_size)
        key, _ = step_keys(0, 0, step)
        mb = sample_minibatch(graph, seeds, valid, key, config, env.capacities)
        out = []
        for hop, fanout in enumerate(config.fanouts):
            counts = labor.row_counts(graph.indptr, graph.indices, mb.nodes[hop],
                                      mb.valid[hop], counter_hash.hash2(key, hop), fanout,
                                      span=config.labor_span(hop))
            out.append((jnp.sum(counts > config.slots[hop]), jnp.sum(mb.valid[hop])))
        return out

    totals = np.zeros((config.num_hops, 2))
    for step in range(steps):
        totals += np.asarray(jax.device_get(cut(jnp.int32(step))), np.float64)
    return [float(c / max(r, 1)) for c, r in totals]


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dataset", default="products-like")
    p.add_argument("--root", default=None)
    p.add_argument("--scale", type=float, default=1.0)
    p.add_argument("--fanouts", default="15,10,5")
    p.add_argument("--batch-size", type=int, default=1024)
    p.add_argument("--samplers", default="uniform,labor",
                   help="comma-separated: uniform, uniform-replace, weighted, "
                        "weighted-replace, labor")
    p.add_argument("--kernels", default="xla", help="kernel spec (auto: Pallas sampler on GPU)")
    p.add_argument("--labor-span", type=int, default=128)
    p.add_argument("--slot-tail", type=float, default=1e-3)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--cut-steps", type=int, default=20)
    p.add_argument("--out", default=None, help="append the JSON lines to this file")
    args = p.parse_args()
    fanouts = tuple(int(f) for f in args.fanouts.split(","))
    ds = load_dataset(args.dataset, args.root, scale=args.scale)
    host_graph = ds.graph
    if host_graph.weights is None:
        rs = np.random.default_rng(0)
        host_graph = host_graph._replace(
            weights=rs.lognormal(0.0, 1.0, host_graph.num_edges).astype(np.float32))
    max_degree = host_graph.max_degree()
    perm = epoch_seeds(jnp.asarray(ds.train_idx), args.batch_size, 0, 0)
    kernels = Kernels.parse(args.kernels)
    for name in args.samplers.split(","):
        config = _config(name, fanouts, max_degree, args.labor_span, args.slot_tail)
        t0 = time.perf_counter()
        graph = prepare_graph(host_graph if config.method == "weighted" else ds.graph, config)
        graph = graph.to_device()
        prepare_seconds = time.perf_counter() - t0
        cal = calibrate(graph, ds.train_idx, args.batch_size, config, kernels=kernels)
        env = cal.envelope
        seconds, counts, edges, overflow = _time_epochs(graph, perm, config, env, kernels,
                                                        args.repeats)
        steps = counts.shape[0]
        record = {
            "dataset": ds.name, "scale": args.scale, "sampler": name,
            "fanouts": list(fanouts), "slots": list(config.slots),
            "batch_size": args.batch_size, "kernels": kernels.describe(),
            "num_nodes": ds.num_nodes, "num_edges": ds.graph.num_edges,
            "max_degree": max_degree, "steps": steps, "epoch_seconds": seconds,
            "ms_per_step": 1e3 * seconds / steps,
            "mean_counts": [float(c) for c in counts.mean(0)],
            "max_counts": [int(c) for c in counts.max(0)],
            "sampled_edges_per_step": float(edges.mean()), "overflows": int(overflow.sum()),
            "envelope": list(env.levels), "prepare_seconds": prepare_seconds,
            "device": jax.devices()[0].device_kind, "jax_version": jax.__version__,
        }
        if config.method == "labor":
            record.update(labor_span=[config.labor_span(h) for h in range(config.num_hops)],
                          rows_cut=_labor_cut(graph, perm, config, env, args.cut_steps))
        if config.method == "weighted":
            record["search_steps"] = weighted.search_steps(max_degree)
        line = json.dumps(record)
        print(line, flush=True)
        if args.out:
            with open(args.out, "a") as f:
                f.write(line + "\n")
        del graph


if __name__ == "__main__":
    main()
