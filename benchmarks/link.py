"""Link prediction throughput: positive edges per second and epoch time, scan vs host.

    PYTHONPATH=. python3 benchmarks/link.py --dataset products-like --root .cache/zerognn \
        --out link.jsonl                       # full scale, one GPU
    PYTHONPATH=. python3 benchmarks/link.py --scale 0.002 --steps 8 --host-steps 4 \
        --hidden 32 --out /tmp/link.jsonl      # tiny, runs on a CPU

The workload is the node benchmark's (GraphSAGE-mean, fanouts 15,10,5, hidden 256, Adam
3e-3) with the link task: `--batch-size` positive edges per step from a random 85/5/10
split, `--negatives` per positive (destination corruption), the default decoder (the
scaled dot product), seed edges masked out of message passing. A full products-like
epoch has ~51k steps of 1024 positives, so each engine trains on the first `--steps`
(scan) or `--host-steps` (host) steps of a fixed order; the epoch time is extrapolated
from the time per step (`--full-epoch` times the scan engine over a whole epoch
instead). Timings follow docs/benchmarks.md (the scan engine samples `sample_ahead`
steps at once, as `zg.train` does): after a warm-up run (compilation, and every shape
host-bucketed meets), `--repeats` timed runs ended by a device sync, each less what the
engine compiled during it (host-exact compiles the new shapes of each epoch's order);
compile time reported apart. The envelope, level 0 (the seed frontier) included, is calibrated on
the measured steps. The host engines deduplicate every level (they cut each to its
count): where the run's layout has a flat outer hop, theirs does not. One JSON line per
engine.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import time

import jax
import numpy as np
from bench_rows import names_of  # this folder: run as `python benchmarks/link.py`

from zerognn_jax._src.sampling.calibrate import choose_envelope
from zerognn_jax._src.sampling.seeds import num_steps
from zerognn_jax._src.training.config import TrainConfig
from zerognn_jax._src.training.engines import make_engine
from zerognn_jax._src.training.program import init_state
from zerognn_jax._src.training.trainer import prepare


def _timed(engine, state, data, items, env, repeats: int):
    """(median seconds, result): warm-up, then `repeats` timed runs, each less what the
    engine compiled during it (host-exact meets new shapes in every epoch's order)."""
    res = engine.run_epoch(state, data, items, 0, env)
    jax.block_until_ready(res.state.params)
    times = []
    for r in range(repeats):
        compiled, t0 = engine.compile_seconds, time.perf_counter()
        res = engine.run_epoch(res.state, data, items, r + 1, res.envelope)
        jax.block_until_ready(res.state.params)
        times.append(time.perf_counter() - t0 - (engine.compile_seconds - compiled))
    return float(np.median(times)), res


ENGINES = ("scan", "host-exact", "host-bucketed")


def main(argv=None) -> list[dict]:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dataset", default="products-like")
    p.add_argument("--root", default=None)
    p.add_argument("--scale", type=float, default=1.0)
    p.add_argument("--engines", default="scan,host-bucketed",
                   type=lambda text: names_of(text, ENGINES, "engine"),
                   help="comma-separated: scan, host-exact, host-bucketed")
    p.add_argument("--batch-size", type=int, default=1024, help="positive edges per step")
    p.add_argument("--negatives", type=int, default=1)
    p.add_argument("--fanouts", default="15,10,5")
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--steps", type=int, default=2000, help="steps the scan engine times")
    p.add_argument("--host-steps", type=int, default=300, help="steps the host engine times")
    p.add_argument("--full-epoch", action="store_true", help="time a whole scan epoch")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--kernels", default="auto")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=None, help="append the JSON lines here as they come")
    args = p.parse_args(argv)
    fanouts = tuple(int(f) for f in args.fanouts.split(","))
    cfg = TrainConfig(dataset=args.dataset, root=args.root, scale=args.scale, task="link",
                      model="sage", hidden=args.hidden, layers=len(fanouts), fanouts=fanouts,
                      batch_size=args.batch_size, lr=3e-3, dropout=0.5,
                      negatives=args.negatives, kernels=args.kernels, seed=args.seed,
                      progress=False)
    t0 = time.perf_counter()
    dataset, data, program = prepare(cfg)
    prepare_seconds = time.perf_counter() - t0
    train = program.task.train_items(dataset)
    full_steps = num_steps(train.shape[0], args.batch_size)
    rows = []
    for name in args.engines:
        host = name.startswith("host")
        steps = full_steps if args.full_epoch and not host else \
            min(args.host_steps if host else args.steps, full_steps)
        items = train[: steps * args.batch_size]
        run = program
        if host and program.sampler.flat_outer:  # the host engine cuts every level
            sampler = dataclasses.replace(program.sampler, flat_outer=False)
            run = dataclasses.replace(program, sampler=sampler,
                                      task=program.task.with_sampler(sampler))
        env, _ = choose_envelope(data.graph, items, args.batch_size, run.sampler,
                                 seed=args.seed, policy=cfg.envelope_policy,
                                 kernels=run.kernels, source=run.task)
        engine = make_engine(name, run, sample_ahead=cfg.sample_ahead)
        state = init_state(run, data, env, items)
        seconds, res = _timed(engine, state, data, items, env, args.repeats)
        per_step = seconds / res.steps
        row = {"engine": name, "dataset": args.dataset, "scale": args.scale,
               "device": jax.devices()[0].device_kind, "batch_size": args.batch_size,
               "negatives": args.negatives, "fanouts": list(fanouts),
               "train_edges": int(train.shape[0]), "steps_timed": res.steps,
               "ms_per_step": 1e3 * per_step,
               "positive_edges_per_second": res.steps * args.batch_size / seconds,
               "epoch_seconds": per_step * full_steps, "epoch_steps": full_steps,
               "epoch_measured": bool(args.full_epoch and not host),
               "compile_seconds": engine.compile_seconds, "envelope": list(res.envelope.levels),
               "max_counts": list(res.max_counts), "overflows": res.overflows,
               "loss": res.loss, "prepare_seconds": prepare_seconds,
               "jax_version": jax.__version__}
        rows.append(row)
        print(json.dumps(row), flush=True)
        if args.out:
            with open(args.out, "a") as f:
                f.write(json.dumps(row) + "\n")
    return rows


if __name__ == "__main__":
    main()
