"""Where a graph-level training step's time goes (issue #33): molhiv-like, GINE-virtual
5 x 300, each aggregation (segment: scatter-adds; ell: gathers over listed edges) at
each batch size, on one GPU.

    python benchmarks/graph_profile.py [--scale 1] [--batch-sizes 32,256] [--epochs 3]
        [--aggregations segment,ell] [--dtype float32] [--top 12] [--no-trace] [--out DIR]

Per (batch size, aggregation), from the same initial parameters and seed: `--epochs`
epochs on the scan engine as `zg.train` runs it (`sample_ahead` steps sampled at once;
the first epoch compiles; graphs/s from the median of the others), then one more under
`jax.profiler` (set `XLA_FLAGS=--xla_gpu_enable_command_buffer=` for kernels named one by
one: bench/profiling.py): the GPU execution fraction of that epoch (busy over wall
time) and busy time over the untraced median epoch, device events per step, and the
`--top` kernels by time. Each record is a
JSON line (also appended to DIR/graph_profile.jsonl); a table ends the output, with each
aggregation's speedup over the first and whether the first step's loss and gradient
agree across the aggregations (relative differences below `--loss-tolerance` and
`--grad-tolerance`: the sums are the same, their rounding is not). Exit code 1 if they
do not. On a CPU (small --scale) everything runs but the fraction.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import statistics
import sys
import tempfile
import time

import jax
import numpy as np

import zerognn_jax as zg
from zerognn_jax._src.bench import profiling
from zerognn_jax._src.training.program import sample_batch
from zerognn_jax._src.training.tasks.losses import masked_mean
from zerognn_jax._src.training.trainer import prepare


def config(data, batch_size: int, aggregation: str, epochs: int, seed: int,
           dtype: str = "float32"):
    """The workload of benchmarks/graph.py with one aggregation."""
    return zg.TrainConfig(task="graph", dataset=data.name, model="gine-virtual", hidden=300,
                          layers=5, dropout=0.5, readout="mean", batch_size=batch_size,
                          epochs=epochs, lr=1e-3, progress=False, seed=seed, eval_every=0,
                          graph_aggregation=aggregation, dtype=dtype)


def traced_epoch(engine, state, data, items, epoch: int, envelope, log_dir) -> tuple:
    """(epoch result, execution fraction record or None, trace path) of one epoch run
    under the profiler; `engine` must have compiled that envelope's program already."""
    with profiling.traced_window(log_dir):
        res = engine.run_epoch(state, data, items, epoch, envelope)
        jax.block_until_ready(res.state.params)
    trace = profiling.find_trace(log_dir)
    return res, profiling.execution_fraction(trace), trace


def first_step(program, state, dev, items, envelope, seed: int) -> tuple:
    """(loss, flat gradient) of the first training step of epoch 0 (dropout on), as
    the step body computes them."""
    perm = zg.epoch_items(jax.numpy.asarray(items, jax.numpy.int32), program.batch_size,
                          seed, 0)

    def loss(params):
        batch, mb, key = sample_batch(program, dev, perm, 0, 0, envelope)
        variables = {"params": params, "batch_stats": state.batch_stats}
        out, _ = program.apply_model(variables, dev, mb, train=True, dropout_key=key,
                                     inputs=batch.model_inputs)
        return masked_mean(program.task.loss(out, batch.targets), batch.weight)

    value, grads = jax.jit(jax.value_and_grad(loss))(state.params)
    flat = np.concatenate([np.ravel(g) for g in jax.tree_util.tree_leaves(grads)])
    return float(value), flat


def measure(data, batch_size: int, aggregation: str, args, log_dir) -> dict:
    """One (batch size, aggregation) record (module docstring), with the first step's
    loss and gradient under "_first" (for `agreement`)."""
    cfg = config(data, batch_size, aggregation, args.epochs, args.seed, args.dtype)
    _, dev, program = prepare(cfg, data)
    items = program.task.train_items(data)
    env, cal = program.task.choose_envelope(program, dev, data, cfg)
    state = zg.init_state(program, dev, env, items)
    first = first_step(program, state, dev, items, env, args.seed)
    engine = zg.ScanEngine(program, sample_ahead=cfg.sample_ahead)
    losses, seconds = [], []
    for epoch in range(args.epochs):
        t0 = time.perf_counter()
        res = engine.run_epoch(state, dev, items, epoch, env)
        jax.block_until_ready(res.state.params)
        seconds.append(time.perf_counter() - t0)
        state, env = res.state, res.envelope
        losses.append(res.loss)
    epoch_s = statistics.median(seconds[1:] or seconds)
    steps = res.steps
    record = {"batch_size": batch_size, "aggregation": aggregation, "dtype": args.dtype,
              "graphs_per_s": len(items) / epoch_s, "epoch_s": epoch_s,
              "ms_per_step": 1e3 * epoch_s / steps, "steps": steps, "losses": losses,
              "compile_s": engine.compile_seconds, "envelope": list(env.levels),
              "envelope_over_ideal": program.task.memory_report(program, env, cal)["ratio"],
              "device": jax.devices()[0].device_kind, "jax": jax.__version__,
              "first_step_loss": first[0], "_first": first}
    if args.no_trace:
        return record
    _, prof, trace = traced_epoch(engine, state, dev, items, args.epochs, env, log_dir)
    if prof is not None:
        record.update(gpu_fraction=prof["fraction"],
                      busy_over_epoch=prof["busy_seconds"] / epoch_s,
                      events_per_step=prof["events"] / steps,
                      top_kernels=profiling.kernel_table(trace, args.top))
    return record


def agreement(rows: list[dict]) -> tuple[float, float]:
    """The largest relative differences, between the aggregations at one batch size, of
    the first step's loss and of its gradient (as a vector: the norm of the difference
    over the norm). The sums agree to rounding; the gradient's rounding grows through
    ten batch norms (on a CPU, 5e-4 at scale 0.01 while both sums of every batch were
    equal to the bit). Whole epochs drift further apart, as any two roundings of a
    training run do (Adam turns the noise of near-zero gradients into full steps)."""
    loss_diff = grad_diff = 0.0
    for b in {r["batch_size"] for r in rows}:
        runs = [r["_first"] for r in rows if r["batch_size"] == b]
        base_loss, base_grad = runs[0]
        for loss, grad in runs[1:]:
            loss_diff = max(loss_diff, abs(loss - base_loss) / abs(base_loss))
            grad_diff = max(grad_diff, float(np.linalg.norm(grad - base_grad) /
                                             np.linalg.norm(base_grad)))
    return loss_diff, grad_diff


def _cell(row: dict, key: str, fmt: str) -> str:
    return format(row[key], fmt) if key in row else "n/a"


def print_table(rows: list[dict], diffs: tuple, ok: bool) -> None:
    first = {}
    print("| batch | aggregation | graphs/s | epoch s | ms/step | speedup | GPU fraction "
          "(traced) | busy / epoch | events/step | envelope/ideal | losses |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        base = first.setdefault(r["batch_size"], r["graphs_per_s"])
        frac, busy, events = (_cell(r, k, f) for k, f in (
            ("gpu_fraction", ".3f"), ("busy_over_epoch", ".3f"), ("events_per_step", ".0f")))
        losses = ", ".join(f"{v:.5f}" for v in r["losses"])
        print(f"| {r['batch_size']} | {r['aggregation']} | {r['graphs_per_s']:,.0f} | "
              f"{r['epoch_s']:.3f} | {r['ms_per_step']:.3f} | "
              f"{r['graphs_per_s'] / base:.2f}x | {frac} | {busy} | {events} | "
              f"{r['envelope_over_ideal']:.3f} | {losses} |")
    print(f"\nfirst step's loss and gradient across aggregations: {'agree' if ok else 'DISAGREE'}, "
          f"largest relative differences: loss {diffs[0]:.2e}, gradient {diffs[1]:.2e}")
    for r in rows:
        if r.get("top_kernels"):
            print(f"\ntop kernels, batch {r['batch_size']}, {r['aggregation']} "
                  f"(one traced epoch of {r['steps']} steps):")
            for k in r["top_kernels"]:
                print(f"  {1e3 * k['seconds']:9.2f} ms {100 * k['share']:5.1f}% "
                      f"x{k['count']:<7d} {k['name'][:90]}")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--scale", type=float, default=1.0)
    p.add_argument("--batch-sizes", default="32,256")
    p.add_argument("--aggregations", default="segment,ell")
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"))
    p.add_argument("--top", type=int, default=12)
    p.add_argument("--loss-tolerance", type=float, default=1e-4)
    p.add_argument("--grad-tolerance", type=float, default=1e-2)
    p.add_argument("--no-trace", action="store_true")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=os.environ.get("OUT", "."))
    args = p.parse_args(argv)
    data = zg.molhiv_like(args.scale)
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rows = []
    for b in (int(x) for x in args.batch_sizes.split(",")):
        for agg in args.aggregations.split(","):
            with tempfile.TemporaryDirectory() as tmp:
                row = measure(data, b, agg, args, tmp)
            rows.append(row)
            line = json.dumps({k: v for k, v in row.items() if k != "_first"})
            print(line, flush=True)
            with open(out / "graph_profile.jsonl", "a") as f:
                f.write(line + "\n")
    diffs = agreement(rows)
    ok = diffs[0] <= args.loss_tolerance and diffs[1] <= args.grad_tolerance
    print_table(rows, diffs, ok)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
