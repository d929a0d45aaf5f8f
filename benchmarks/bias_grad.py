"""Times the epoch with the dense layers' bias gradient computed other ways.

    PYTHONPATH=. XLA_PYTHON_CLIENT_MEM_FRACTION=0.95 python3 benchmarks/bias_grad.py OUT \
        [--scale 1] [--only papers|products]

The built-in models' dense layer (`nn/models.py`'s `dense`) is swapped for one whose
bias add has a `jax.custom_vjp`, its bias gradient (the column sum of the output
gradient) computed as: `base` (no swap: XLA fuses the sum into layer 0's backward
select fusion), `f32` (a float32 sum), `split` (float32 sums of blocks of 1,024 rows,
then of the blocks), `ones` (a ones-vector product, `lax.dot`) or `barrier` (the sum
behind an optimization barrier). Each form trains three epochs of papers100m-like
(`benchmarks/papers100m.py`'s preset and training config, bfloat16, under `--root`
/tmp/p) and of products-like (bfloat16, kernels auto); `base` runs first and last, and
on a GPU `base` and `ones` are profiled kernel by kernel. One JSON line a run goes to
OUT/log.txt and stdout; a table ends it. docs/benchmarks.md, "Layer 0's bias gradient,
five ways", has the figures.
"""

from __future__ import annotations

import argparse
import functools
import gc
import json
import sys
import time
from pathlib import Path

import flax.linen as nn
import jax
import jax.numpy as jnp
from jax import lax

sys.path.insert(0, str(Path(__file__).parent))
import papers100m  # noqa: E402

from zerognn_jax._src.data.loaders import load_dataset  # noqa: E402
from zerognn_jax._src.nn import models  # noqa: E402
from zerognn_jax._src.sampling.calibrate import choose_envelope  # noqa: E402
from zerognn_jax._src.training.config import TrainConfig  # noqa: E402
from zerognn_jax._src.training.engines import make_engine  # noqa: E402
from zerognn_jax._src.training.program import init_state  # noqa: E402

BLOCK = 1024  # rows a split sum adds first
FORM = ["base"]  # the form the swapped dense layer computes (set per run)


def bias_gradient(form: str, g: jax.Array) -> jax.Array:
    """float32[features]: the column sum of the output gradient g [rows, features]."""
    f32 = jnp.float32
    if form == "split" and g.shape[0] % BLOCK == 0:
        return g.reshape(-1, BLOCK, g.shape[1]).astype(f32).sum(1).sum(0)
    if form == "ones":
        return lax.dot(jnp.ones((g.shape[0],), g.dtype), g, preferred_element_type=f32)
    if form == "barrier":
        return lax.optimization_barrier(g).astype(f32).sum(0)
    return g.astype(f32).sum(0)  # "f32" (and "split" of rows no block divides)


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def add_bias(form: str, y: jax.Array, b: jax.Array) -> jax.Array:
    return y + b


add_bias.defvjp(lambda form, y, b: (y + b, None),
                lambda form, _, g: (g, bias_gradient(form, g).astype(g.dtype)))


class FormDense(nn.Dense):
    """`nn.Dense` whose bias gradient is `bias_gradient(FORM[0], ...)`."""

    @nn.compact
    def __call__(self, inputs):
        kernel = self.param("kernel", self.kernel_init, (inputs.shape[-1], self.features),
                            self.param_dtype)
        bias = self.param("bias", self.bias_init, (self.features,), self.param_dtype)
        inputs, kernel, bias = self.promote_dtype(inputs, kernel, bias, dtype=self.dtype)
        y = lax.dot_general(inputs, kernel, (((inputs.ndim - 1,), (0,)), ((), ())))
        return add_bias(FORM[0], y, bias)


library_dense = models.dense


def form_dense(features, fan_in, init, dtype, name=None):
    if FORM[0] == "base":
        return library_dense(features, fan_in, init, dtype, name)
    return FormDense(features, dtype=dtype, name=name)


def run(graph, cfg, dataset, data, program, forms, log, profile=()):
    """One JSON row per form: three epochs' seconds (compile excluded), losses, and on a
    GPU for the forms of `profile` the busiest kernels of a step."""
    env, _ = choose_envelope(data.graph, dataset.train_idx, cfg.batch_size, program.sampler,
                             seed=cfg.seed, policy=cfg.envelope_policy,
                             kernels=program.kernels)
    rows = []
    for form in forms:
        FORM[0] = form
        state = init_state(program, data, env, dataset.train_idx)
        engine = make_engine("scan", program, chunk_steps=cfg.chunk_steps,
                             policy=cfg.envelope_policy)
        times, losses = [], []
        for epoch in range(3):
            compiled, start = engine.compile_seconds, time.perf_counter()
            res = engine.run_epoch(state, data, dataset.train_idx, epoch, env)
            jax.block_until_ready(res.state.params)
            times.append(time.perf_counter() - start - (engine.compile_seconds - compiled))
            state, env = res.state, res.envelope
            losses.append(float(res.loss))
        row = {"graph": graph, "form": form, "epochs": times, "best": min(times[1:]),
               "loss": losses, "steps": res.steps}
        if form in profile and jax.default_backend() == "gpu":
            kernels = papers100m._kernels(cfg, program, state, data, dataset, env, 6)
            row["phases"] = kernels["phases_us_per_step"]
            row["top"] = kernels["top_kernels"][:6]
        log(json.dumps(row, default=str))
        rows.append(row)
        del state, res
        gc.collect()
    return rows


def main(argv=None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--scale", default="1")
    parser.add_argument("--only", choices=("papers", "products"), default=None)
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    started = time.time()

    def log(line: str) -> None:
        line = f"[{time.time() - started:6.1f}] {line}"
        print(line, flush=True)
        with open(args.out / "log.txt", "a") as f:
            f.write(line + "\n")

    models.dense = form_dense
    rows = []
    if args.only != "products":
        pargs = papers100m.parse_args(["--root", "/tmp/p", "--scale", args.scale,
                                       "--dtype", "bfloat16"])
        path, record = papers100m.generate(pargs, papers100m.Clock(None))
        log(f"generated {record}")
        cfg = papers100m.train_config(pargs, str(path))
        dataset, data, program = papers100m._prepared(cfg, papers100m.load_dir(path))
        rows += run("papers", cfg, dataset, data, program,
                    ["base", "ones", "split", "barrier", "f32", "base"], log,
                    profile=("base", "ones"))
        del dataset, data, program
        gc.collect()
    if args.only != "papers":
        cfg = TrainConfig(dataset="products-like", dtype="bfloat16", kernels="auto",
                          engine="scan", eval_mode="none", progress=False, hidden=256,
                          layers=3, fanouts=(15, 10, 5), batch_size=1024, epochs=3)
        dataset = load_dataset("products-like", scale=float(args.scale), seed=0)
        dataset, data, program = papers100m._prepared(cfg, dataset)
        rows += run("products", cfg, dataset, data, program,
                    ["base", "ones", "split", "base"], log)
    for r in rows:
        print(f"{r['graph']:9} {r['form']:8} best {r['best']:.4f}  losses "
              f"{[round(x, 4) for x in r['loss']]}")
    return rows


if __name__ == "__main__":
    main()
