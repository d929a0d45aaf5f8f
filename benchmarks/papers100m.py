"""papers100M-like on one GPU: generation, loading, training, inference, accuracy.

    python benchmarks/papers100m.py --root DIR [--scale 1] [--dtype bfloat16] \\
        [--store-dtype DTYPE] [--epochs 2] [--deadline 530] [--out FILE.jsonl]
    python benchmarks/papers100m.py --curve --root DIR [--curve-scales 0.25,1,4] ...

Default mode, one record per phase (JSON lines on stdout, and appended to `--out`), then a
table; progress lines with timestamps go to stderr:

  generate  papers100m-like at `--scale` with `--store-dtype` features (default: `--dtype`),
            written to the dataset directory `<root>/papers100m-like-<scale>-<seed>-<store-dtype>`
            (data/papers.py); reused when it is already there (`reused: true`, no time).
            float32 features on the device from bfloat16 on disk (`--dtype float32
            --store-dtype bfloat16`) keep the directory at 42 GB instead of 70 GB
  load      `load_dir` of that directory: memory maps and validation (one read)
  upload    `trainer.prepare`: sampler set-up, graph and features onto the device
  train     SAGE 3x256, fanouts [15,10,5], batch 1024, scan engine, no evaluation:
            calibration, compile time, each epoch's time (compilation excluded), steps,
            envelope / ideal bytes, the memory plan (`check_fits`), peak device memory
  fraction  one more epoch under the profiler: the GPU execution fraction (busy time of the
            device streams over the epoch's wall time; bench/profiling.py); with
            `--kernels N`, also the step's device time by phase and its N busiest kernels,
            from two more epochs compiled without command buffers (one traced)
  sampled   sampled inference of the test nodes (the training fanouts): time, accuracy
  mlp       the MLP baseline, same width, depth, epochs and device data: test accuracy
            (sampled evaluation; the MLP reads only the seeds' own rows)
  exact     exact layer-wise inference of every node (`layerwise_logits`), chunked;
            with `--offload auto`, when the device cannot hold every layer's input and
            output at once, the device is emptied (graph put back, features read from
            the host) and the outputs that do not fit go to host memory (`offload="auto"`;
            `--offload on`: all of them): time, peak memory, test accuracy; skipped, with
            the reason, when the offloaded outputs would not fit the host's memory

`--curve`: epoch and step time of products-like at `--curve-scales` and papers100m-like at
`--scale`, same model and step, one table (and `<out>.png` with matplotlib).

`--skip fraction,mlp` leaves those phases out (recorded as skipped).
`--deadline SECONDS` (from the start of the script): a phase starts only if its estimate
(scaled with the graph) fits in what is left; a skipped phase is recorded with
`status: "skipped"` and the reason. Peak device memory is the allocator's peak so far in
the process (JAX cannot reset it), so each phase's figure includes the earlier ones.
On an 80 GB GPU, exact inference at full scale needs the allocator to hold the graph
plus a layer's 256-wide input (~70 GB): run with XLA_PYTHON_CLIENT_MEM_FRACTION=0.95.

CPU smoke run (about two minutes each on 2 cores):

    python benchmarks/papers100m.py --root /tmp/p --scale 0.0005 --hidden 32 --offload on
    python benchmarks/papers100m.py --curve --root /tmp/p --scale 0.0005 \\
        --curve-scales 0.002,0.004 --hidden 32
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import json
import math
import resource
import sys
import tempfile
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from zerognn_jax._src.bench import profiling
from zerognn_jax._src.data import papers
from zerognn_jax._src.data.loaders import load_dataset
from zerognn_jax._src.data.storage import is_dataset_dir, load_arrays, load_dir
from zerognn_jax._src.nn.models import make_model
from zerognn_jax._src.sampling.calibrate import choose_envelope
from zerognn_jax._src.training import memory, trainer
from zerognn_jax._src.training.config import TrainConfig
from zerognn_jax._src.training.engines import make_engine
from zerognn_jax._src.training.evaluate import layerwise_logits, sampled_logits
from zerognn_jax._src.training.placement import available_host_bytes
from zerognn_jax._src.training.program import init_state
from zerognn_jax._src.training.scan import ScanEngine
from zerognn_jax._src.training.tasks.node import accuracy

# Seconds each phase may take at scale 1 on an H100 (a phase is skipped when its estimate,
# scaled with the graph and never below MIN_ESTIMATE, no longer fits the deadline).
ESTIMATES = {"generate": 150, "load": 40, "upload": 40, "train": 120, "epoch": 8,
             "fraction": 30, "sampled": 20, "mlp": 60, "exact": 120}
MIN_ESTIMATE = 5.0


class Clock:
    """Elapsed time, the deadline, and timestamped progress lines on stderr
    (`[HH:MM:SS +seconds] message`, the seconds written by `seconds_format`; also
    benchmarks/hetero.py's progress lines)."""

    def __init__(self, deadline: float | None, seconds_format: str = "{:6.1f}s"):
        self.t0 = time.perf_counter()
        self.deadline = deadline
        self.seconds_format = seconds_format

    def elapsed(self) -> float:
        return time.perf_counter() - self.t0

    def log(self, message: str) -> None:
        stamp = time.strftime("%H:%M:%S")
        seconds = self.seconds_format.format(self.elapsed())
        print(f"[{stamp} +{seconds}] {message}", file=sys.stderr, flush=True)

    def skip_reason(self, phase: str, estimate: float) -> str | None:
        """Why `phase` must not start (it would end past the deadline), or None."""
        if self.deadline is None:
            return None
        left = self.deadline - self.elapsed()
        if estimate <= left:
            return None
        return (f"would start too late: {left:.0f} s left of --deadline {self.deadline:g}, "
                f"estimate {estimate:.0f} s")


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--root", required=True, help="folder of the generated dataset directories")
    p.add_argument("--scale", type=float, default=1.0, help="papers100m-like size factor")
    p.add_argument("--seed", type=int, default=0, help="generator and training seed")
    p.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float32"),
                   help="stored and device features, and the model's computation dtype")
    p.add_argument("--store-dtype", default=None, choices=("bfloat16", "float32"),
                   help="features as generated and stored on disk (default: --dtype)")
    p.add_argument("--epochs", type=int, default=2, help="training epochs (SAGE and MLP)")
    p.add_argument("--hidden", type=int, default=256, help="hidden units per layer")
    p.add_argument("--fanouts", default="15,10,5", help="comma-separated, seeds' hop first")
    p.add_argument("--batch-size", type=int, default=1024, help="seeds per step")
    p.add_argument("--offload", default="auto", choices=("auto", "on", "off"),
                   help="exact inference: layer outputs to host memory (auto: when needed)")
    p.add_argument("--infer-budget", type=int, default=1 << 30,
                   help="exact inference: bytes of gathered edge rows per chunk")
    p.add_argument("--skip", default="", help="comma-separated optional phases not to run "
                   "(fraction, sampled, mlp, exact)")
    p.add_argument("--deadline", type=float, default=None,
                   help="seconds from the start; later phases are skipped, with the reason")
    p.add_argument("--kernels", type=int, default=0,
                   help="the fraction phase also records the step's device time by phase "
                        "and this many of its busiest kernels (default: none)")
    p.add_argument("--out", default=None, help="append every record to this JSONL file")
    p.add_argument("--curve", action="store_true", help="the cost-vs-size curve instead")
    p.add_argument("--curve-scales", default="0.25,1,4",
                   help="--curve: products-like scales (papers100m-like runs at --scale)")
    return p.parse_args(argv)


def emit(args, record: dict) -> dict:
    line = json.dumps(record, default=float)
    print(line, flush=True)
    if args.out:
        with open(args.out, "a") as f:
            f.write(line + "\n")
    return record


def peak_fields() -> dict:
    host = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux: KiB
    return {"peak_device_bytes": memory.device_peak_bytes(), "peak_host_rss_bytes": host}


def train_config(args, dataset: str, model: str = "sage", scale: float = 1.0) -> TrainConfig:
    fanouts = tuple(int(f) for f in args.fanouts.split(","))
    return TrainConfig(dataset=dataset, root=args.root, scale=scale, model=model,
                       hidden=args.hidden, layers=len(fanouts), fanouts=fanouts,
                       batch_size=args.batch_size, dtype=args.dtype, epochs=args.epochs,
                       seed=args.seed, engine="scan", eval_mode="none", progress=False)


# ------------------------------------------------------------------ phases


def generate(args, clock: Clock) -> tuple[Path, dict]:
    store = args.store_dtype or args.dtype
    path = Path(args.root) / f"papers100m-like-{args.scale:g}-{args.seed}-{store}"
    record = {"phase": "generate", "path": str(path), "reused": is_dataset_dir(path)}
    if not record["reused"]:
        clock.log(f"generating papers100m-like at scale {args.scale:g} on "
                  f"{jax.devices()[0].device_kind} into {path}")
        t0 = time.perf_counter()
        papers.write_papers100m_like(path, args.scale, args.seed, feature_dtype=store,
                                     log=clock.log)
        record["generate_seconds"] = time.perf_counter() - t0
    _, arrays = load_arrays(path)
    record.update(nodes=int(arrays["indptr"].shape[0] - 1),
                  directed_edges=int(arrays["indices"].shape[0]),
                  offset_dtype=arrays["indptr"].dtype.name,
                  feature_dtype=arrays["features"].dtype.name,
                  disk_bytes=sum(int(a.nbytes) for a in arrays.values()))
    return path, record


def train_sage(cfg: TrainConfig, dataset, data, program, clock: Clock):
    """Calibration, the memory plan, compile and `cfg.epochs` epochs: (state, record)."""
    t0 = time.perf_counter()
    env, cal = choose_envelope(data.graph, dataset.train_idx, cfg.batch_size, program.sampler,
                               seed=cfg.seed, policy=cfg.envelope_policy,
                               kernels=program.kernels)
    calibrate = time.perf_counter() - t0
    clock.log(f"calibrated in {calibrate:.1f} s: envelope {list(env.levels)}")
    dims = trainer.level_dims(cfg, dataset, program.task, program.model)
    resident = memory.resident_bytes(data.graph, dataset.features.shape[1], cfg.dtype, dims)
    memory.check_fits(env, program.sampler.slots, dims, memory.device_memory_limit(),
                      resident=resident)
    state = init_state(program, data, env, dataset.train_idx)
    state, record = run_epochs(cfg, program, state, data, dataset, env, clock, "sage")
    # Tree mode (the default where its levels are small against the graph) has exact
    # sizes and no calibration to compare them with.
    ratio = None if cal is None else memory.memory_report(
        env, cal.max_counts, program.sampler.slots, dims)["ratio"]
    record.update(calibrate_seconds=calibrate,
                  calibrate_compile_seconds=calibrate + record["compile_seconds"],
                  envelope=list(env.levels), envelope_over_ideal=ratio,
                  dedup=program.sampler.dedup,
                  resident_bytes=dataclasses.asdict(resident), **peak_fields())
    return state, env, record


def run_epochs(cfg, program, state, data, dataset, env, clock: Clock, name: str):
    runner = make_engine("scan", program, chunk_steps=cfg.chunk_steps,
                         policy=cfg.envelope_policy)
    times, steps, losses = [], 0, []
    for epoch in range(cfg.epochs):
        before, t0 = runner.compile_seconds, time.perf_counter()
        res = runner.run_epoch(state, data, dataset.train_idx, epoch, env)
        jax.block_until_ready(res.state.params)
        times.append(time.perf_counter() - t0 - (runner.compile_seconds - before))
        state, env, steps = res.state, res.envelope, res.steps
        losses.append(res.loss)
        clock.log(f"{name} epoch {epoch}: {times[-1]:.3f} s, {steps} steps, "
                  f"loss {res.loss:.4f}, overflows {res.overflows}")
    last = times[-1] if times else None
    return state, {"compile_seconds": runner.compile_seconds, "epoch_seconds": times,
                   "epoch_seconds_last": last, "steps": steps, "loss": losses,
                   "step_ms": 1e3 * last / steps if steps else None}


def traced_epoch(cfg, program, state, data, dataset, env, untraced_seconds, top: int = 0):
    """The GPU execution fraction of an epoch under the profiler (after one untraced, which
    compiles): busy time over the traced window, and over `untraced_seconds` (the last
    timed epoch: the profiler's overhead lengthens the window, not the device's work);
    with `top`, the step's device time by phase and its `top` busiest kernels
    (`profiling.step_profile`). The epochs consume `state`'s buffers."""
    runner = make_engine("scan", program, chunk_steps=cfg.chunk_steps,
                         policy=cfg.envelope_policy)
    res = runner.run_epoch(state, data, dataset.train_idx, cfg.epochs, env)  # compiles
    state, env = res.state, res.envelope
    with tempfile.TemporaryDirectory() as log_dir:
        with profiling.traced_window(log_dir):
            res = runner.run_epoch(state, data, dataset.train_idx, cfg.epochs + 1, env)
            jax.block_until_ready(res.state.params)
        trace = profiling.find_trace(log_dir)
        prof = profiling.execution_fraction(trace)
        if prof is None:
            return {"status": "skipped", "reason": "no device stream lines in the trace: "
                    + "; ".join(profiling.line_names(trace))[:300]}
    kernels = _kernels(cfg, program, res.state, data, dataset, res.envelope, top) if top \
        else {}
    return {
        "gpu_fraction": prof["fraction"], "gpu_busy_seconds": prof["busy_seconds"],
        "traced_seconds": prof["window_seconds"], "untraced_seconds": untraced_seconds,
        "gpu_fraction_untraced": prof["busy_seconds"] / untraced_seconds,
        "compile_seconds": runner.compile_seconds, **kernels}


def _kernels(cfg, program, state, data, dataset, env, top: int) -> dict:
    """The step's device time by phase and its `top` busiest kernels, from one more
    epoch traced without command buffers (whose kernels a trace shows as one event
    each), after one that compiles it (`profiling.step_profile`)."""
    runner = ScanEngine(program, chunk_steps=cfg.chunk_steps, policy=cfg.envelope_policy,
                        compiler_options=profiling.NO_COMMAND_BUFFERS)
    res = runner.run_epoch(state, data, dataset.train_idx, cfg.epochs + 2, env)
    with tempfile.TemporaryDirectory() as log_dir:
        with profiling.traced_window(log_dir):
            res = runner.run_epoch(res.state, data, dataset.train_idx, cfg.epochs + 3,
                                   res.envelope)
            jax.block_until_ready(res.state.params)
        text = next(c.as_text() for (e, *_), c in runner.programs.items()
                    if e == res.envelope)
        out = profiling.step_profile(profiling.find_trace(log_dir), text, res.steps,
                                     profiling.step_phase, top)
    out["top_kernels"] = out.pop("kernels")
    return {**out, "kernels_command_buffers": False}


def variables_of(state) -> dict:
    out = {"params": state.params}
    if state.batch_stats:
        out["batch_stats"] = state.batch_stats
    return out


def sampled_test(cfg, program, variables, data, dataset) -> dict:
    t0 = time.perf_counter()
    logits = sampled_logits(program, variables, data, dataset.test_idx,
                            batch_size=cfg.eval_batch_size, seed=cfg.seed)
    acc = accuracy(logits, dataset.labels[dataset.test_idx])
    return {"seconds": time.perf_counter() - t0, "test_acc": acc, "nodes": len(dataset.test_idx)}


def train_mlp(args, cfg, program, data, dataset, env, clock: Clock) -> dict:
    """The MLP baseline on the same device data, envelope and epochs."""
    mlp = make_model("mlp", hidden=cfg.hidden, num_layers=cfg.layers,
                     num_classes=dataset.num_classes, dropout=cfg.dropout,
                     dtype=jnp.dtype(cfg.dtype))
    program = dataclasses.replace(program, model=mlp)
    state = init_state(program, data, env, dataset.train_idx)
    state, record = run_epochs(cfg, program, state, data, dataset, env, clock, "mlp")
    record.update(sampled_test(cfg, program, variables_of(state), data, dataset))
    return record


def exact_plan(args, data, dataset, program) -> dict:
    """Bytes exact inference keeps on the device, without and with offloading."""
    n = dataset.num_nodes
    graph = sum(int(a.nbytes) for a in data.graph if a is not None)
    item = jnp.dtype(args.dtype).itemsize
    widths = [dataset.features.shape[1]] + [args.hidden] * (program.model.num_layers - 1)
    outs = [(args.hidden, item)] * (program.model.num_layers - 1) + [(dataset.num_classes, 4)]
    layer_in = [w * item * n for w in widths]
    layer_out = [w * b * n for w, b in outs]
    chunk = 2 * args.infer_budget
    return {"graph": graph,
            "device": graph + max(i + o for i, o in zip(layer_in, layer_out)) + chunk,
            "offloaded": graph + max(layer_in) + 2 * chunk,
            "host_offloaded": max(layer_out)}


def exact_inference(args, program, variables, data, dataset, clock: Clock) -> dict:
    plan = exact_plan(args, data, dataset, program)
    limit = memory.device_memory_limit()
    # "auto": when the plan does not fit, the library streams the layers that do not.
    offload = {"on": True, "off": False}.get(args.offload, limit is not None
                                             and plan["device"] > limit and "auto")
    record = {"offload": offload, "plan_bytes": plan, "device_limit_bytes": limit}
    gib = lambda b: f"{b / 2**30:.1f} GiB"
    if offload and limit is not None and plan["offloaded"] > limit:
        record.update(status="skipped", reason=(
            f"does not fit: graph plus a layer's input need {gib(plan['offloaded'])}, the "
            f"allocator holds {gib(limit)} (raise XLA_PYTHON_CLIENT_MEM_FRACTION)"))
        return record
    host = available_host_bytes()
    # The host holds the graph (moved out and back, below), then one layer's output.
    if offload and host is not None and plan["graph"] + plan["host_offloaded"] > host:
        record.update(status="skipped", reason=(
            f"does not fit the host: the graph and a layer's output need "
            f"{gib(plan['graph'] + plan['host_offloaded'])} of host memory, {gib(host)} is "
            f"available"))
        return record
    if offload:
        # The device keeps the graph and layers, features read from the host.
        # Training's arrays scattered over the heap leave no contiguous room for a 53 GiB
        # layer (papers100M, H100: allocation failed with 59 GiB free): empty the device
        # and put the graph back first.
        variables, graph = jax.device_get((variables, data.graph))
        for array in jax.live_arrays():
            array.delete()
        variables = jax.device_put(variables)
        data = data._replace(graph=jax.block_until_ready(jax.device_put(graph)),
                             features=dataset.features, targets=None)
        del graph  # the host copy: a layer's output needs the room
    clock.log(f"exact inference over {dataset.num_nodes:,} nodes (offload={offload})")
    t0 = time.perf_counter()
    logits = layerwise_logits(program, variables, data, budget_bytes=args.infer_budget,
                              offload=offload, log=clock.log)
    jax.block_until_ready(logits)
    record["seconds"] = time.perf_counter() - t0
    idx = dataset.test_idx
    record["test_acc"] = float(np.mean(
        np.asarray(jnp.argmax(jnp.asarray(logits[idx]), -1)) == dataset.labels[idx]))
    record.update(peak_fields())
    return record


# ------------------------------------------------------------------ modes


def estimate(phase: str, scale: float) -> float:
    return max(MIN_ESTIMATE, ESTIMATES[phase] * scale)


def run_phase(args, clock: Clock, records: list, phase: str, fn, scale: float,
              extra: float = 0.0):
    """Runs `fn()` -> (result, record) unless the deadline forbids; emits the record."""
    reason = ("left out by --skip" if phase in args.skip.split(",")
              else clock.skip_reason(phase, estimate(phase, scale) + extra))
    if reason:
        clock.log(f"skipping {phase}: {reason}")
        records.append(emit(args, {"phase": phase, "status": "skipped", "reason": reason}))
        return None
    clock.log(f"{phase} ...")
    t0 = time.perf_counter()
    result, record = fn()
    record = {"phase": phase, "status": record.pop("status", "ok"), **record,
              "wall_seconds": time.perf_counter() - t0}
    records.append(emit(args, record))
    clock.log(f"{phase} done in {record['wall_seconds']:.1f} s")
    return result


def timed(fn):
    t0 = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - t0


def main_run(args, clock: Clock) -> list[dict]:
    records: list[dict] = []
    s = args.scale
    path = run_phase(args, clock, records, "generate", lambda: generate(args, clock), s)
    if path is None:
        return records
    dataset = run_phase(args, clock, records, "load", lambda: _load(path), s)
    if dataset is None:
        return records
    cfg = train_config(args, str(path))
    prepared = run_phase(args, clock, records, "upload", lambda: _upload(cfg, dataset), s)
    if prepared is None:
        return records
    dataset, data, program = prepared
    trained = run_phase(args, clock, records, "train",
                        lambda: _pair(train_sage(cfg, dataset, data, program, clock)), s,
                        extra=estimate("epoch", s) * args.epochs)
    if trained is None:
        return records
    state, env = trained
    # Evaluated after the timed epochs alone, as the MLP is: a copy, since the fraction
    # phase's epochs consume the state.
    variables = jax.tree_util.tree_map(jnp.copy, variables_of(state))
    untraced = records[-1]["epoch_seconds_last"]
    if untraced:
        run_phase(args, clock, records, "fraction", lambda: (None, traced_epoch(
            cfg, program, state, data, dataset, env, untraced, args.kernels)), s)
    run_phase(args, clock, records, "sampled", lambda: (None, sampled_test(
        cfg, program, variables, data, dataset)), s)
    run_phase(args, clock, records, "mlp", lambda: (None, train_mlp(
        args, cfg, program, data, dataset, env, clock)), s,
        extra=estimate("epoch", s) * args.epochs)
    run_phase(args, clock, records, "exact", lambda: (None, exact_inference(
        args, program, variables, data, dataset, clock)), s)
    return records


def _pair(trained):
    state, env, record = trained
    return (state, env), record


def _load(path):
    dataset, seconds = timed(lambda: load_dir(path))
    return dataset, {"load_seconds": seconds, "feature_dtype": str(dataset.features.dtype),
                     **peak_fields()}


def _upload(cfg, dataset):
    (dataset, data, program), seconds = timed(lambda: _prepared(cfg, dataset))
    return (dataset, data, program), {"upload_seconds": seconds, **peak_fields()}


def _prepared(cfg, dataset):
    out = trainer.prepare(cfg, dataset)
    jax.block_until_ready(out[1])
    return out


def curve_run(args, clock: Clock) -> list[dict]:
    """Epoch and step time against graph size: products-like scales, then papers100m-like."""
    points = [("products-like", float(s)) for s in args.curve_scales.split(",")]
    points.append(("papers100m-like", args.scale))
    records: list[dict] = []
    for name, scale in points:
        # products-like generates on the host: ~4x papers100m-like's cost per edge.
        size = scale * (0.04 if name == "products-like" else 1.0)
        need = sum(estimate(p, size) for p in ("generate", "load", "upload", "train"))
        reason = clock.skip_reason(name, need + estimate("epoch", size) * args.epochs)
        if reason:
            clock.log(f"skipping {name} at scale {scale:g}: {reason}")
            records.append(emit(args, {"phase": "curve", "dataset": name, "scale": scale,
                                       "status": "skipped", "reason": reason}))
            continue
        clock.log(f"curve: {name} at scale {scale:g}")
        records.append(emit(args, curve_point(args, name, scale, clock)))
        gc.collect()
    return records


def curve_point(args, name: str, scale: float, clock: Clock) -> dict:
    t0 = time.perf_counter()
    if name == "papers100m-like":
        path, _ = generate(args, clock)
        dataset, cfg = load_dir(path), train_config(args, str(path))
    else:
        dataset = load_dataset(name, args.root, scale=scale, seed=args.seed)
        cfg = train_config(args, name, scale=scale)
    ready = time.perf_counter() - t0
    dataset, data, program = _prepared(cfg, dataset)
    _, _, record = train_sage(cfg, dataset, data, program, clock)
    for array in jax.tree_util.tree_leaves(data):
        array.delete()
    return {"phase": "curve", "status": "ok", "dataset": name, "scale": scale,
            "nodes": dataset.num_nodes, "directed_edges": dataset.graph.num_edges,
            "data_seconds": ready, **{k: record[k] for k in (
                "epoch_seconds_last", "steps", "step_ms", "compile_seconds",
                "calibrate_seconds", "envelope_over_ideal", "peak_device_bytes")}}


# ------------------------------------------------------------------ report


def _fmt(value, digits: int = 3) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.{digits}f}" if math.isfinite(value) else str(value)
    return str(value)


def _gib(nbytes) -> str:
    return "-" if nbytes is None else f"{nbytes / 2**30:.2f} GiB"


def main_table(records: list[dict]) -> str:
    by = {r["phase"]: r for r in records}
    get = lambda phase, key: by.get(phase, {}).get(key)
    skipped = [f"{r['phase']} ({r['reason']})" for r in records if r["status"] == "skipped"]
    rows = [
        ("graph", f"{get('generate', 'nodes'):,} nodes, {get('generate', 'directed_edges'):,}"
                  f" directed edges, {get('generate', 'offset_dtype')} offsets"
         if get("generate", "nodes") else "-"),
        ("generation s", "reused" if get("generate", "reused")
         else _fmt(get("generate", "generate_seconds"), 1)),
        ("load s", _fmt(get("load", "load_seconds"), 1)),
        ("device upload s", _fmt(get("upload", "upload_seconds"), 1)),
        ("calibration s", _fmt(get("train", "calibrate_seconds"), 1)),
        ("compile s", _fmt(get("train", "compile_seconds"), 1)),
        ("epoch s (last)", _fmt(get("train", "epoch_seconds_last"))),
        ("steps", _fmt(get("train", "steps"))),
        ("step ms", _fmt(get("train", "step_ms"), 2)),
        ("envelope / ideal", _fmt(get("train", "envelope_over_ideal"), 2)),
        ("GPU execution fraction, traced / untraced", (
            f"{_fmt(get('fraction', 'gpu_fraction'))} / "
            f"{_fmt(get('fraction', 'gpu_fraction_untraced'))}")),
        ("peak device memory (train)", _gib(get("train", "peak_device_bytes"))),
        ("sampled inference s (test)", _fmt(get("sampled", "seconds"), 2)),
        ("SAGE test acc, sampled", _fmt(get("sampled", "test_acc"), 4)),
        ("exact inference s", _fmt(get("exact", "seconds"), 1)),
        ("exact offload", _fmt(get("exact", "offload"))),
        ("peak device memory (so far, exact)", _gib(get("exact", "peak_device_bytes"))),
        ("SAGE test acc, exact", _fmt(get("exact", "test_acc"), 4)),
        ("MLP test acc (sampled eval)", _fmt(get("mlp", "test_acc"), 4)),
        ("MLP epoch s (last)", _fmt(get("mlp", "epoch_seconds_last"))),
    ]
    lines = ["| measure | value |", "|---|---|", *(f"| {k} | {v} |" for k, v in rows)]
    if skipped:
        lines.append("\nskipped: " + "; ".join(skipped))
    return "\n".join(lines)


def curve_table(records: list[dict]) -> str:
    lines = ["| dataset | scale | nodes | directed edges | epoch s | steps | step ms | "
             "compile s | envelope/ideal |", "|---|---|---|---|---|---|---|---|---|"]
    for r in records:
        if r["status"] != "ok":
            lines.append(f"| {r['dataset']} | {r['scale']:g} | skipped: {r['reason']} |")
            continue
        lines.append(f"| {r['dataset']} | {r['scale']:g} | {r['nodes']:,} | "
                     f"{r['directed_edges']:,} | {_fmt(r['epoch_seconds_last'])} | "
                     f"{r['steps']} | {_fmt(r['step_ms'], 2)} | "
                     f"{_fmt(r['compile_seconds'], 1)} | "
                     f"{_fmt(r['envelope_over_ideal'], 2)} |")
    return "\n".join(lines)


def curve_plot(records: list[dict], path: Path) -> Path | None:
    """Step time against directed edges, log-log; None without matplotlib or points."""
    if not any(r["status"] == "ok" for r in records):
        return None
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    fig, ax = plt.subplots(figsize=(6, 4))
    for name, marker in (("products-like", "o"), ("papers100m-like", "s")):
        pts = [(r["directed_edges"], r["step_ms"]) for r in records
               if r["status"] == "ok" and r["dataset"] == name]
        if pts:
            ax.plot(*zip(*pts), marker=marker, label=name)
    ax.set(xscale="log", yscale="log", xlabel="directed edges", ylabel="step time (ms)",
           title="step time vs graph size (fixed fanouts and batch)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def main(argv=None) -> int:
    args = parse_args(argv)
    clock = Clock(args.deadline)
    Path(args.root).mkdir(parents=True, exist_ok=True)
    clock.log(f"JAX {jax.__version__} on {jax.devices()[0].device_kind}; "
              f"device memory limit {_gib(memory.device_memory_limit())}")
    if args.curve:
        records = curve_run(args, clock)
        print(curve_table(records))
        plot = curve_plot(records, Path(args.out or Path(args.root) / "curve").with_suffix(
            ".png"))
        if plot:
            clock.log(f"plot written to {plot}")
    else:
        records = main_run(args, clock)
        print(main_table(records))
    clock.log("done")
    return 0


if __name__ == "__main__":
    sys.exit(main())
