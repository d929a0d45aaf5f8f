"""Times the dedup methods (scatter-min table vs stable sort) inside a sampling-only epoch.

    PYTHONPATH=. python3 benchmarks/relabel_methods.py --root .cache/zerognn [--scale 1] \
        [--dataset products-like]

Both methods must give identical per-step counts (checked); prints the median epoch time
of each over several repeats, with the XLA and the Pallas sampler. The table method
fills an N-entry table per hop, so the graph's size, not only the batch's, sets its cost.
"""

import argparse
import json
import time

import jax
import jax.numpy as jnp
import numpy as np

from zerognn_jax._src.data.loaders import load_dataset
from zerognn_jax._src.ops.registry import Kernels
from zerognn_jax._src.ops.relabel import relabel_sorted
from zerognn_jax._src.sampling.calibrate import calibrate, sample_epoch_counts
from zerognn_jax._src.sampling.minibatch import SamplerConfig
from zerognn_jax._src.sampling.seeds import epoch_seeds


def _time_epoch(graph, perm, config, envelope, kernels, repeats):
    run = lambda: sample_epoch_counts(
        graph, perm, 0, 0, batch_size=envelope.batch_size, config=config,
        envelope=envelope, kernels=kernels)
    counts = jax.block_until_ready(run())[0]
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        jax.block_until_ready(run())
        times.append(time.perf_counter() - t0)
    return float(np.median(times)), np.asarray(counts)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--root", default=None)
    p.add_argument("--dataset", default="products-like")
    p.add_argument("--scale", type=float, default=1.0)
    p.add_argument("--batch-size", type=int, default=1024)
    p.add_argument("--repeats", type=int, default=5)
    args = p.parse_args()
    ds = load_dataset(args.dataset, args.root, scale=args.scale)
    graph = ds.graph.to_device()
    train_idx = jnp.asarray(ds.train_idx)
    perm = epoch_seeds(train_idx, args.batch_size, 0, 0)
    config = SamplerConfig((15, 10, 5))
    env = calibrate(graph, ds.train_idx, args.batch_size, config).envelope
    reference = None
    samplers = ("xla", "pallas") if jax.default_backend() == "gpu" else ("xla",)
    for sampler in samplers:
        for method, relabel in (("table", "xla"), ("sort", relabel_sorted)):
            kernels = Kernels(sample=sampler, relabel=relabel)
            seconds, counts = _time_epoch(graph, perm, config, env, kernels, args.repeats)
            reference = counts if reference is None else reference
            print(json.dumps({"dataset": args.dataset, "nodes": ds.num_nodes,
                              "sampler": sampler, "relabel": method, "epoch_seconds": seconds,
                              "counts_equal": bool(np.array_equal(counts, reference)),
                              "device": jax.devices()[0].device_kind}))


if __name__ == "__main__":
    main()
