"""Data-parallel scaling: epoch time on one device against all local devices, per variant.

    PYTHONPATH=. python3 benchmarks/scaling.py --out scaling.jsonl [--scale 1] [--root DIR]

Workload (products-like, as docs/benchmarks.md): GraphSAGE-mean 3 x 256, fanouts 15/10/5,
Adam 3e-3, dropout 0.5, a batch of `--batch-size` seeds per device and step, so D devices
run an epoch in ceil(train / (B D)) steps. Every variant trains `--epochs` epochs from
the same initial state with the same envelope (calibrated once, for batch B); the epoch
time is the median over the epochs after the first `--warmup` (compilation excluded;
the first epoch also pays NCCL's set-up). Speedup = T(1 device) / T(variant);
efficiency = speedup / devices; `excess_ms` = step time minus the one-device step time
(what data parallelism costs per step, at equal work per device and step); `seeds_per_s`
counts training seeds (the last, partial global batch is padding, not seeds).

A variant is `DEVICES[-split][:COLLECTIVES][+OPTION...]` (`--variants`, comma-separated):

- DEVICES: `1`, `all` (every local device, one process), `N`, or `procs` (one process
  per local device, joined by `jax.distributed` over a local coordinator; each process
  sees one GPU through CUDA_VISIBLE_DEVICES). `-split` splits the feature table by rows.
- COLLECTIVES (`Collectives.parse`): `optimised` (default: one flat all-reduce per step
  carrying gradients, target weight and overflow flag; metrics summed on the host per
  chunk), `baseline` (tree.psum.late: a collective per leaf, per metric, and for the
  flag), or `GRADS.METRICS.OVERFLOW` (`flat|tree`, `host|psum`, `packed|early|late`).
- OPTION: `prefetch` (step i samples step i + 1, so XLA may overlap sampling with the
  all-reduce); `lhs` (XLA:GPU's latency-hiding scheduler for the chunk program);
  `cmdbuf` (command buffers that include collectives, while loops and conditionals);
  `serial` (kernels inside a command buffer in XLA's own order, `LHS`, where every
  training program compiles with the concurrent mode: xla_options.py).
  XLA options are passed per compiled program (`ScanEngine.compiler_options`), never
  through XLA_FLAGS: a name this XLA does not know fails only that variant.

The parent process never starts a JAX backend: it makes sure the dataset is cached under
`--root`, runs the one-process variants in one child (which also calibrates the
envelope), then the `procs` variants in one child per device, and prints one table.
Correctness: each variant's per-epoch losses and final parameters are compared with the
first variant on the same number of devices (`dparams`: max |a - b| / max |b| over
leaves; the variants do the same math, so this is float rounding: ~2e-7 in the CPU
smoke test).
Records go to `<out>.partial` as they are measured (kept if the run is killed; removed
once they are in `--out`) and, with speedups, to `--out` at the end; a failing variant
is recorded with its error. Datasets are cached under `--root` (default /tmp/c).
`--cpu-devices N` (or XLA_FLAGS=--xla_force_host_platform_device_count=N) fakes N CPU
devices; a smoke test without GPUs (about a minute on 2 cores):

    PYTHONPATH=. python3 benchmarks/scaling.py --out /tmp/s.jsonl --cpu-devices 2 \
        --scale 0.005 --batch-size 64 --hidden 32 --layers 2 --fanouts 5,5 --epochs 2 \
        --variants 1,all:baseline,all:optimised,procs:optimised
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import datetime
import json
import os
import pathlib
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import traceback

DEFAULT_VARIANTS = (
    "1,all:baseline,all:flat.psum.late,all:flat.host.late,all:flat.host.early,all:optimised,"
    "all:optimised+prefetch,all:optimised+lhs,all:optimised+prefetch+lhs,"
    "procs:baseline,procs:optimised,procs:optimised+prefetch+lhs")
COMMAND_BUFFER = "FUSION,CUBLAS,CUBLASLT,CUSTOM_CALL,CUDNN,COLLECTIVES,WHILE,CONDITIONAL"
OPTION_SETS = {
    "prefetch": {},
    "lhs": {"xla_gpu_enable_latency_hiding_scheduler": True},
    "cmdbuf": {"xla_gpu_enable_command_buffer": COMMAND_BUFFER},
    "serial": {"xla_gpu_command_buffer_scheduling_mode": "LHS"},
}


@dataclasses.dataclass(frozen=True)
class Variant:
    name: str
    devices: int  # per process; 0 = all local devices
    procs: bool
    split: bool
    collectives: str
    options: tuple[str, ...]

    @classmethod
    def parse(cls, text: str) -> Variant:
        from zerognn_jax._src.training.parallel import Collectives

        head, *options = text.strip().split("+")
        where, _, collectives = head.partition(":")
        count, _, split = where.partition("-")
        if split not in ("", "split") or not (count in ("all", "procs") or count.isdigit()):
            raise ValueError(f"bad variant {text!r}: DEVICES is 1, all, N or procs, "
                             "optionally -split")
        for option in options:
            if option not in OPTION_SETS:
                raise ValueError(f"bad variant {text!r}: options are {', '.join(OPTION_SETS)}")
        collectives = collectives or "optimised"
        Collectives.parse(collectives)  # raises on a bad spec
        devices = 1 if count == "procs" else 0 if count == "all" else int(count)
        return cls(text.strip(), devices, count == "procs", split == "split", collectives,
                   tuple(options))

    @property
    def compiler_options(self) -> dict | None:
        merged = {k: v for option in self.options for k, v in OPTION_SETS[option].items()}
        return merged or None


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True, help="JSON lines output file (appended)")
    p.add_argument("--scale", type=float, default=1.0, help="products-like size factor")
    p.add_argument("--root", default="/tmp/c", help="dataset cache folder")
    p.add_argument("--variants", default=DEFAULT_VARIANTS, help="comma-separated variants")
    p.add_argument("--epochs", type=int, default=4)
    p.add_argument("--warmup", type=int, default=1, help="epochs left out of the median")
    p.add_argument("--batch-size", type=int, default=1024, help="seeds per device and step")
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--layers", type=int, default=3)
    p.add_argument("--fanouts", default="15,10,5")
    p.add_argument("--kernels", default="xla")
    p.add_argument("--cpu-devices", type=int, default=0,
                   help="fake this many CPU devices (smoke tests without GPUs)")
    p.add_argument("--timeout", type=int, default=480,
                   help="seconds for all child processes together (past it they are killed)")
    p.add_argument("--trace", help="folder for jax.profiler traces of the last epoch of "
                   "the --trace-variants (one subfolder each)")
    p.add_argument("--trace-variants", default="all:baseline,all:optimised",
                   help="comma-separated variants to trace when --trace is given")
    # Set by the parent for its children.
    p.add_argument("--child", choices=("single", "procs"), help=argparse.SUPPRESS)
    p.add_argument("--workdir", help=argparse.SUPPRESS)
    p.add_argument("--envelope", help=argparse.SUPPRESS)
    p.add_argument("--coordinator", help=argparse.SUPPRESS)
    p.add_argument("--num-processes", type=int, help=argparse.SUPPRESS)
    p.add_argument("--process-id", type=int, help=argparse.SUPPRESS)
    p.add_argument("--cpu-collectives", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.epochs <= args.warmup:
        p.error(f"--epochs {args.epochs} leaves no timed epoch after --warmup {args.warmup}")
    try:
        args.variant_list = [Variant.parse(v) for v in args.variants.split(",") if v.strip()]
    except ValueError as err:
        p.error(str(err))
    return args


# ---------------------------------------------------------------- in a child process


def start_jax(args):
    """Configures JAX before its backends start; joins the processes of a procs child."""
    import jax

    if args.child == "procs" and args.cpu_collectives:
        jax.config.update("jax_num_cpu_devices", 1)
        jax.config.update("jax_cpu_collectives_implementation", "gloo")
    elif args.cpu_devices:
        jax.config.update("jax_num_cpu_devices", args.cpu_devices)
    if args.child == "procs":
        from zerognn_jax._src.training.parallel import initialize_distributed

        initialize_distributed(args.coordinator, args.num_processes, args.process_id,
                               timeout_s=120)
    return jax


def train_config(args, variant: Variant):
    from zerognn_jax import TrainConfig

    return TrainConfig(
        dataset="products-like", model="sage", hidden=args.hidden, layers=args.layers,
        fanouts=tuple(int(f) for f in args.fanouts.split(",")), batch_size=args.batch_size,
        kernels=args.kernels, eval_mode="none", progress=False, devices=variant.devices,
        shard_features=variant.split)


def with_collectives(program, text: str):
    from zerognn_jax._src.training.parallel import Collectives

    if program.parallel is None:
        return program
    parallel = dataclasses.replace(program.parallel, collectives=Collectives.parse(text))
    return dataclasses.replace(program, parallel=parallel)


def allreduce_microseconds(params, mesh, grads: str, iters: int = 200) -> float:
    """Time of one gradient all-reduce of a tree shaped like `params`: one `psum` per
    leaf ("tree") or one flat buffer ("flat"), in a loop of `iters` on the mesh."""
    import jax
    import jax.numpy as jnp
    from jax.sharding import PartitionSpec as P

    from zerognn_jax._src.training import parallel

    def once(tree):
        if grads == "flat":
            return parallel.psum_flat(tree, jnp.zeros(1, jnp.float32))[0]
        return jax.tree_util.tree_map(lambda x: jax.lax.psum(x, parallel.AXIS), tree)

    def chain(tree):
        return jax.lax.fori_loop(0, iters, lambda _, t: once(t), tree)

    run = jax.jit(jax.shard_map(chain, mesh=mesh, in_specs=P(), out_specs=P(),
                                check_vma=False))
    tree = jax.device_put(params, parallel.replicated(mesh))
    jax.block_until_ready(run(tree))
    t0 = time.perf_counter()
    jax.block_until_ready(run(tree))
    return 1e6 * (time.perf_counter() - t0) / iters


class Child:
    """Measures variants in this process; data are placed once per device layout."""

    def __init__(self, args, dataset):
        self.args, self.dataset, self.placed, self.allreduce = args, dataset, {}, {}
        self.train_idx = dataset.train_idx

    def prepared(self, variant: Variant):
        from zerognn_jax._src.training.trainer import prepare

        key = (variant.devices, variant.split)
        if key not in self.placed:
            _, data, program = prepare(train_config(self.args, variant), self.dataset)
            self.placed[key] = (data, program)
        return self.placed[key]

    def envelope(self, variant: Variant):
        from zerognn_jax import Envelope, choose_envelope

        if self.args.envelope:
            caps = tuple(int(c) for c in self.args.envelope.split(","))
            return Envelope(self.args.batch_size, caps), 0.0
        data, program = self.prepared(variant)
        t0 = time.perf_counter()
        env, _ = choose_envelope(data.graph, self.train_idx, self.args.batch_size,
                                 program.sampler, kernels=program.kernels)
        return env, time.perf_counter() - t0

    def measure(self, variant: Variant, env) -> tuple[dict, dict]:
        """Trains one variant; (record, flat final parameters)."""
        import jax

        from zerognn_jax import ScanEngine, init_state

        data, program = self.prepared(variant)
        program = with_collectives(program, variant.collectives)
        state = init_state(program, data, env, self.train_idx)
        engine = ScanEngine(program, prefetch="prefetch" in variant.options,
                            compiler_options=variant.compiler_options)
        times, losses, overflows = [], [], 0
        for epoch in range(self.args.epochs):
            compiled, t0 = engine.compile_seconds, time.perf_counter()
            res = engine.run_epoch(state, data, self.train_idx, epoch, env)
            times.append(time.perf_counter() - t0 - (engine.compile_seconds - compiled))
            state, env, overflows = res.state, res.envelope, overflows + res.overflows
            losses.append(res.loss)
        with self.tracing(variant) as traced:  # one more epoch, not timed
            if traced:
                engine.run_epoch(jax.tree_util.tree_map(jax.numpy.copy, state), data,
                                 self.train_idx, self.args.epochs, env)
        devices = program.num_shards
        epoch_s = statistics.median(times[self.args.warmup:])
        record = {
            "devices": devices, "processes": jax.process_count(), "global_batch":
            program.global_batch, "batch_per_device": self.args.batch_size, "steps": res.steps,
            "epoch_seconds": epoch_s, "epoch_seconds_all": times,
            "step_ms": 1e3 * epoch_s / res.steps, "seeds_per_s": len(self.train_idx) / epoch_s,
            "padding_seeds": res.steps * program.global_batch - len(self.train_idx),
            "compile_seconds": engine.compile_seconds, "overflows": overflows,
            "envelope": list(env.levels), "losses": losses,
            "collectives": program.parallel.collectives.describe() if devices > 1 else None,
            "options": list(variant.options), "shard_features": variant.split,
            "allreduce_us": self.allreduce_us(program, state.params, variant),
            "device": jax.devices()[0].device_kind, "jax_version": jax.__version__}
        return record, flat(state.params)

    @contextlib.contextmanager
    def tracing(self, variant: Variant):
        """Yields True inside a jax.profiler trace into --trace/<variant>[-p<process>] if
        the variant is to be traced, else False. (Command buffers show in a trace as
        events that name no kernel: bench/profiling.py.)"""
        import jax

        wanted = [v.strip() for v in self.args.trace_variants.split(",")]
        if not (self.args.trace and variant.name in wanted):
            yield False
            return
        name = "".join(c if c.isalnum() or c in "-." else "_" for c in variant.name)
        if jax.process_count() > 1:
            name += f"-p{jax.process_index()}"
        with jax.profiler.trace(os.path.join(self.args.trace, name)):
            yield True

    def allreduce_us(self, program, params, variant: Variant) -> float:
        if program.parallel is None:
            return 0.0
        grads = program.parallel.collectives.grads
        if (program.num_shards, grads) not in self.allreduce:
            self.allreduce[program.num_shards, grads] = allreduce_microseconds(
                params, program.parallel.mesh, grads)
        return self.allreduce[program.num_shards, grads]


def flat(params) -> dict:
    import jax
    import numpy as np

    leaves = jax.tree_util.tree_leaves_with_path(jax.device_get(params))
    return {jax.tree_util.keystr(path): np.asarray(x) for path, x in leaves}


def child_main(args) -> int:
    import numpy as np

    jax = start_jax(args)
    from zerognn_jax._src.data.loaders import load_dataset

    lead = jax.process_index() == 0
    work = pathlib.Path(args.workdir)
    dataset = load_dataset("products-like", args.root, scale=args.scale)
    child = Child(args, dataset)
    env, calibrate_s = child.envelope(args.variant_list[0])
    if lead:
        meta = {"local_devices": jax.local_device_count(), "platform": jax.default_backend(),
                "envelope": list(env.capacities), "calibrate_seconds": calibrate_s,
                "train": int(len(dataset.train_idx)), "nodes": dataset.num_nodes,
                "edges": dataset.graph.num_edges}
        (work / f"meta-{args.child}.json").write_text(json.dumps(meta))
        print(f"[{args.child}] {jax.process_count()} process(es), {jax.device_count()} "
              f"{jax.devices()[0].device_kind} device(s); envelope {list(env.levels)}",
              flush=True)
    for i, variant in enumerate(args.variant_list):
        t0 = time.perf_counter()
        try:
            record, params = child.measure(variant, env)
            if lead:
                record["params_file"] = str(work / f"params-{args.child}-{i}.npz")
                np.savez(record["params_file"], **params)
        except Exception as err:  # noqa: BLE001 - record it, measure the others
            traceback.print_exc()
            record = {"error": f"{type(err).__name__}: {str(err)[:300]}"}
        record = {"variant": variant.name, **record, "wall_seconds": time.perf_counter() - t0}
        if lead:
            line = json.dumps(record)
            for path in (work / "records.jsonl", pathlib.Path(args.out + ".partial")):
                with open(path, "a") as f:
                    f.write(line + "\n")
            print(f"[{args.child}] {variant.name}: {summary(record)}", flush=True)
    if args.child == "procs":
        jax.distributed.shutdown()
    return 0


def summary(r: dict) -> str:
    if "error" in r:
        return f"failed: {r['error']}"
    return (f"{r['epoch_seconds']:.4f} s/epoch, {r['step_ms']:.3f} ms/step, "
            f"{r['seeds_per_s']:,.0f} seeds/s, compile {r['compile_seconds']:.1f} s")


# ---------------------------------------------------------------- the parent process


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def child_command(args, kind: str, variants: list[Variant], *extra: str) -> list[str]:
    command = [sys.executable, "-X", "faulthandler", os.path.abspath(__file__), "--child",
               kind, "--workdir", args.workdir, "--variants",
               ",".join(v.name for v in variants)]
    for flag in ("out", "scale", "root", "epochs", "warmup", "batch_size", "hidden", "layers",
                 "fanouts", "kernels", "cpu_devices", "trace", "trace_variants"):
        if getattr(args, flag) is not None:
            command += [f"--{flag.replace('_', '-')}", str(getattr(args, flag))]
    return command + list(extra)


def run_children(commands: list[tuple[list[str], dict]], deadline: float) -> list[int]:
    """Starts every command at once (the first one's output shows here, the others' go to
    log files in the work folder) and waits for all; a child still running at `deadline`
    (`time.monotonic()`) is killed."""
    procs = []
    for i, (command, env) in enumerate(commands):
        out = None if i == 0 else open(pathlib.Path(env["SCALING_LOG"]), "w")
        procs.append(subprocess.Popen(command, env=env, stdout=out, stderr=out))
    codes = []
    for proc in procs:
        try:
            codes.append(proc.wait(timeout=max(1.0, deadline - time.monotonic())))
        except subprocess.TimeoutExpired:
            proc.kill()
            codes.append(proc.wait())
    return codes


def child_env(**extra) -> dict:
    repo = str(pathlib.Path(__file__).resolve().parents[1])
    path = os.pathsep.join(p for p in (repo, os.environ.get("PYTHONPATH")) if p)
    return {**os.environ, "PYTHONPATH": path, "PYTHONUNBUFFERED": "1", **extra}


def run_procs(args, variants: list[Variant], meta: dict, deadline: float) -> None:
    """The `procs` variants: one process per local device, over a local coordinator."""
    count = meta["local_devices"]
    if count < 2:
        print(f"procs variants need >= 2 local devices, have {count}: skipped", flush=True)
        return
    coordinator = f"127.0.0.1:{free_port()}"
    envelope = ",".join(str(c) for c in meta["envelope"])
    commands = []
    for pid in range(count):
        extra = {"SCALING_LOG": f"{args.out}.procs{pid}.log"}  # process 0 prints here
        flags = ["--envelope", envelope, "--coordinator", coordinator, "--num-processes",
                 str(count), "--process-id", str(pid)]
        if meta["platform"] == "gpu":
            extra["CUDA_VISIBLE_DEVICES"] = str(pid)
        elif meta["platform"] == "cpu":
            flags.append("--cpu-collectives")  # gloo, one CPU device per process
        commands.append((child_command(args, "procs", variants, *flags), child_env(**extra)))
    codes = run_children(commands, deadline)
    if any(codes):
        print(f"procs children exited with {codes}; logs of processes 1+: "
              f"{args.out}.procs*.log", flush=True)


def compare(records: list[dict]) -> None:
    """Speedup against the one-device variant; losses and parameters against the first
    variant on as many devices. In place."""
    import numpy as np

    good = [r for r in records if "error" not in r]
    base = next((r for r in good if r["devices"] == 1 and not r["shard_features"]), None)
    refs: dict[int, dict] = {}
    for r in good:
        if base is not None:
            r["speedup"] = base["epoch_seconds"] / r["epoch_seconds"]
            r["efficiency"] = r["speedup"] / r["devices"]
            r["excess_ms"] = r["step_ms"] - base["step_ms"]
        ref = refs.setdefault(r["devices"], r)
        r["reference"] = ref["variant"]
        r["dloss"] = float(np.max(np.abs(np.subtract(r["losses"], ref["losses"]))
                                  / np.abs(ref["losses"])))
        if "params_file" in r and "params_file" in ref:
            with np.load(r["params_file"]) as a, np.load(ref["params_file"]) as b:
                r["dparams"] = max(float(np.max(np.abs(a[k] - b[k])) / np.max(np.abs(b[k])))
                                   for k in b.files)


def table(records: list[dict]) -> str:
    """One line per variant; `excess ms` per step over one device, `allred us` one
    gradient all-reduce alone, `dloss`/`dparams` against the reference variant."""
    cols = [("variant", "<30", "variant", ""), ("dev", ">4", "devices", ""),
            ("proc", ">5", "processes", ""), ("glob B", ">7", "global_batch", ""),
            ("steps", ">6", "steps", ""), ("epoch s", ">9", "epoch_seconds", ".4f"),
            ("step ms", ">9", "step_ms", ".3f"), ("seeds/s", ">11", "seeds_per_s", ",.0f"),
            ("speedup", ">8", "speedup", ".3f"), ("effic", ">7", "efficiency", ".3f"),
            ("excess ms", ">10", "excess_ms", ".3f"), ("allred us", ">10", "allreduce_us", ".1f"),
            ("compile s", ">10", "compile_seconds", ".1f"), ("dloss", ">9", "dloss", ".1e"),
            ("dparams", ">9", "dparams", ".1e")]
    head = "".join(f"{title:{align}}" for title, align, _, _ in cols)
    lines = [head, "-" * len(head)]
    for r in records:
        if "error" in r:
            lines.append(f"{r['variant']:<30}failed: {r['error'][:100]}")
            continue
        cells = []
        for _, align, key, fmt in cols:
            value = r.get(key)
            cells.append(f"{'-' if value is None else format(value, fmt):{align}}")
        lines.append("".join(cells))
    return "\n".join(lines)


def parent_main(args) -> int:
    from zerognn_jax._src.data.loaders import load_dataset  # NumPy only: no JAX backend

    t0 = time.perf_counter()
    dataset = load_dataset("products-like", args.root, scale=args.scale)
    print(f"products-like scale {args.scale:g}: {dataset.num_nodes:,} nodes, "
          f"{dataset.graph.num_edges:,} directed edges, {len(dataset.train_idx):,} train, "
          f"ready in {time.perf_counter() - t0:.1f} s", flush=True)
    del dataset
    deadline = time.monotonic() + args.timeout
    single = [v for v in args.variant_list if not v.procs]
    procs = [v for v in args.variant_list if v.procs]
    with tempfile.TemporaryDirectory(prefix="scaling-") as work:
        args.workdir = work
        command = child_command(args, "single", single or [Variant.parse("1")])
        code = run_children([(command, child_env())], deadline)[0]
        meta_path = pathlib.Path(work) / "meta-single.json"
        if code or not meta_path.is_file():
            print(f"the one-process child exited with {code}", flush=True)
        if procs and meta_path.is_file():
            run_procs(args, procs, json.loads(meta_path.read_text()), deadline)
        records_path = pathlib.Path(work) / "records.jsonl"
        records = [json.loads(line) for line in records_path.read_text().splitlines()] \
            if records_path.is_file() else []
        if not single:
            records = [r for r in records if r["variant"] != "1"]
        compare(records)
        meta = json.loads(meta_path.read_text()) if meta_path.is_file() else {}
    stamp = {"benchmark": "scaling", "dataset": "products-like", "scale": args.scale,
             "date": datetime.date.today().isoformat(), "command": " ".join(sys.argv), **meta}
    with open(args.out, "a") as out:
        for r in records:
            r.pop("params_file", None)
            out.write(json.dumps({**stamp, **r}) + "\n")
    pathlib.Path(args.out + ".partial").unlink(missing_ok=True)  # its records are in --out
    print(table(records))
    return 0 if records and not any("error" in r for r in records) else 1


def main(argv=None) -> int:
    args = parse_args(argv)
    return child_main(args) if args.child else parent_main(args)


if __name__ == "__main__":
    sys.exit(main())
