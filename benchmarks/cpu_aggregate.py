"""Times the reference weighted sum against the same sum over two-axis rows, on any
backend (written for the CPU, where the reference's three-axis form is slow).

    PYTHONPATH=. python3 benchmarks/cpu_aggregate.py [--rows 2432] [--slots 1920] \
        [--fanout 5] [--width 1433] [--repeats 5]

The defaults are a Cora link batch's layer 0 (batch 256, fanouts [10, 5]). Random
rows, slots, a 10 % share of dead slots and weights; prints each form's median time and
whether their outputs are bit-equal (and the largest difference). docs/kernels.md, last
section, gives the figures.
"""

import argparse
import json
import time

import jax
import jax.numpy as jnp
import numpy as np

from zerognn_jax._src.ops.aggregate import gather_live, weighted_sum_reference


def two_axis(h_src, nbr, weights):
    """`weighted_sum_reference` for one head, its rows gathered as [K, C, F]."""
    live = jnp.any(weights != 0, axis=-1)
    rows = gather_live(h_src[:, 0], nbr.T, live.T)
    return jnp.sum(rows * jnp.swapaxes(weights[..., 0], 0, 1)[..., None], axis=0)[:, None]


def median_ms(fn, args, repeats: int) -> float:
    jax.block_until_ready(fn(*args))  # compiled first
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        jax.block_until_ready(fn(*args))
        times.append(time.perf_counter() - start)
    return float(np.median(times)) * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=2432)
    parser.add_argument("--slots", type=int, default=1920)
    parser.add_argument("--fanout", type=int, default=5)
    parser.add_argument("--width", type=int, default=1433)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    h = jnp.asarray(rng.standard_normal((args.rows, 1, args.width)), jnp.float32)
    nbr = jnp.asarray(rng.integers(0, args.rows, (args.slots, args.fanout)), jnp.int32)
    live = rng.random((args.slots, args.fanout)) < 0.9
    w = jnp.asarray(np.where(live, rng.random(live.shape), 0.0)[..., None], jnp.float32)
    forms = {"reference": jax.jit(weighted_sum_reference), "two-axis": jax.jit(two_axis)}
    outs = {name: fn(h, nbr, w) for name, fn in forms.items()}
    diff = float(jnp.max(jnp.abs(outs["reference"] - outs["two-axis"])))
    print(json.dumps({
        "backend": jax.default_backend(), "jax": jax.__version__,
        **{f"{name}_ms": round(median_ms(fn, (h, nbr, w), args.repeats), 1)
           for name, fn in forms.items()},
        "bit_equal": bool(jnp.all(outs["reference"] == outs["two-axis"])),
        "max_abs_difference": diff}))


if __name__ == "__main__":
    main()
