"""zerognn-jax's link prediction on the peers' split file: steps timed, then the metrics.

benchmarks/link.py measures the scan engine's throughput but rebuilds its split from
the generated graph (about two minutes on the host at full scale) and evaluates
nothing. This runs the same engine, task and step on the split file the peers read
(link_data.py; the split link.py would build for the same dataset, scale and seed),
trains `--steps` steps from the initial parameters, as the peers do, and scores the
same fixed negatives.

The split enters through the task seam: `SavedLinkTask` is zerognn-jax's `LinkTask`
whose `build` reads the file named by `TrainConfig.dataset` instead of splitting a
graph; it is registered under the task name "link-file" (`register_task`), so
`prepare` builds the model, sampler, envelope and engine exactly as for "link".

Timing follows benchmarks/link.py: the engine samples `sample_ahead` steps at once, as
`zg.train` does; the envelope is calibrated on the steps' positives;
a warm-up run compiles; each of `--repeats` timed runs starts again from the initial
parameters and trains the `--steps` steps, ended by a device sync; the median is
reported. The metrics come from the last run's parameters.

    PYTHONPATH=. python3 benchmarks/peers/zerognn_link.py --data F.npz --steps 300 \
        [--dtype bfloat16]
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import time

import common
import jax
import link_data
import numpy as np

import zerognn_jax as zg
from zerognn_jax._src.data.links import EvalEdges
from zerognn_jax._src.nn.link_heads import DECODERS
from zerognn_jax._src.nn.models import INITS
from zerognn_jax._src.ops.registry import XLA
from zerognn_jax._src.training.trainer import evaluate, prepare


def saved_split(path) -> tuple[zg.Dataset, zg.LinkSplit]:
    """(dataset whose graph is the split's message-passing graph, LinkSplit) of a file."""
    data = link_data.load(path)
    n = data.num_nodes
    dataset = zg.make_dataset(data.name, data.indptr, data.indices, data.features,
                              np.zeros(n, np.int32), np.arange(n), [], [], 1)
    evals = {s: EvalEdges(*(data.evals[s][k].astype(np.int32) for k in link_data.EVAL_KEYS))
             for s in link_data.SPLITS}
    split = zg.LinkSplit(data.train.astype(np.int32), dataset.graph, evals["val"],
                         evals["test"], n)
    return dataset, split


class SavedLinkTask(zg.LinkTask):
    """`LinkTask` on a split read from `TrainConfig.dataset` (a link_data.py file)."""

    name = "link-file"

    @classmethod
    def build(cls, cfg, dataset=None, *, loss=None, kernels=None):
        if dataset is not None or loss is not None:
            raise ValueError("the link-file task reads its dataset and split from "
                             "TrainConfig.dataset and trains with its own loss")
        dataset, split = saved_split(cfg.dataset)
        return cls(split, cfg.negatives, cfg.negative_mode, cfg.link_metric,
                   kernels=kernels or XLA), dataset


def config(args, metric: str) -> zg.TrainConfig:
    fanouts = tuple(int(f) for f in args.fanouts.split(","))
    return zg.TrainConfig(
        dataset=args.data, task=SavedLinkTask.name, model="sage", hidden=args.hidden,
        layers=len(fanouts), fanouts=fanouts, batch_size=args.batch, lr=args.lr,
        dropout=args.dropout, negatives=args.negatives, link_metric=metric,
        decoder=args.decoder,
        kernels=args.kernels, dtype=args.dtype, seed=args.seed, init=args.init,
        progress=False,
        dedup={"auto": None, "tree": False, "dedup": True}[args.layout])


def timed_runs(program, data, items, env, repeats: int, sample_ahead: int):
    """(seconds of each timed run, the last run's result, compile seconds)."""
    engine = zg.make_engine("scan", program, sample_ahead=sample_ahead)
    res = engine.run_epoch(zg.init_state(program, data, env, items), data, items, 0, env)
    jax.block_until_ready(res.state.params)
    times = []
    for _ in range(repeats):
        state = zg.init_state(program, data, res.envelope, items)
        jax.block_until_ready(state.params)
        t0 = time.perf_counter()
        res = engine.run_epoch(state, data, items, 0, res.envelope)
        jax.block_until_ready(res.state.params)
        times.append(time.perf_counter() - t0)
    return times, res, engine.compile_seconds


def add_workload_arguments(p: argparse.ArgumentParser) -> None:
    """The workload's flags, which `config` reads (benchmarks/link_profile.py too)."""
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--fanouts", default="15,10,5")
    p.add_argument("--batch", type=int, default=1024, help="positive edges per step")
    p.add_argument("--negatives", type=int, default=1)
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--dropout", type=float, default=0.5)
    p.add_argument("--kernels", default="auto")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--decoder", default="scaled-dot", choices=DECODERS)
    p.add_argument("--init", default="flax", choices=INITS,
                   help="how the encoder's layers start (TrainConfig.init)")


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--data", required=True, help="link split file (link_data.py)")
    add_workload_arguments(p)
    p.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"))
    p.add_argument("--layout", default="auto", choices=("auto", "tree", "dedup"),
                   help="the hops' layout (auto: the library's choice)")
    p.add_argument("--out", default=None, help="append the JSON line here")
    args = p.parse_args(argv)
    zg.register_task(SavedLinkTask)
    t0 = time.perf_counter()
    metric = "mrr" if link_data.load(args.data).has_mrr else "auc"
    cfg = config(args, metric)
    dataset, data, program = prepare(cfg)
    train = program.task.train_items(dataset)
    epoch_steps = math.ceil(train.shape[0] / args.batch)
    items = train[: min(args.steps, epoch_steps) * args.batch]
    env, _ = zg.choose_envelope(data.graph, items, args.batch, program.sampler,
                                seed=args.seed, policy=cfg.envelope_policy,
                                kernels=program.kernels, source=program.task)
    setup = time.perf_counter() - t0
    times, res, compile_seconds = timed_runs(program, data, items, env, args.repeats,
                                             cfg.sample_ahead)
    seconds = float(np.median(times))
    t1 = time.perf_counter()
    metrics = evaluate(cfg, program, {"params": res.state.params}, data, dataset)
    if metric == "mrr":  # the split's pairs too, as the peers report both
        metrics.update(evaluate(dataclasses.replace(cfg, link_metric="auc"), program,
                                {"params": res.state.params}, data, dataset))
    system = "zerognn-jax" + ("" if args.dtype == "float32" else f", {args.dtype}")
    record = {
        "summary": True, "task": "link", "system": system, "dataset": dataset.name,
        "train_edges": int(train.shape[0]), "negatives": args.negatives,
        "steps": res.steps, "timed_steps": res.steps, "timed_seconds_runs": times,
        "ms_per_step": 1e3 * seconds / res.steps,
        "positive_edges_per_second": res.steps * args.batch / seconds,
        "epoch_steps": epoch_steps, "epoch_seconds": seconds / res.steps * epoch_steps,
        "extrapolated": True, "loss": res.loss, "overflows": res.overflows,
        "envelope": list(res.envelope.levels), "compile_seconds": compile_seconds,
        "setup_seconds": setup, "eval_seconds": time.perf_counter() - t1,
        "fanouts": list(cfg.fanouts), "batch": args.batch, "hidden": args.hidden,
        "layers": cfg.layers, "lr": args.lr, "dropout": args.dropout, "dtype": args.dtype,
        "init": args.init, "decoder": args.decoder,
        "seed": args.seed, "device_name": jax.devices()[0].device_kind,
        "jax_version": jax.__version__, **metrics,
    }
    common.JsonLines(args.out).write(record)
    return record


if __name__ == "__main__":
    main()
