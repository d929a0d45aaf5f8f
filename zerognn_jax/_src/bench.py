"""`zerognn bench`: the scan engine against the host-mediated baseline, and its ablations.

Configurations (`--configs`): host-exact and host-bucketed (host_engine.py), scan-xla,
scan-pallas, scan-tree (no dedup), scan-bf16 (bfloat16 features and activations) and
scan-cmdbuf (the scan engine with XLA command buffers over its loop,
`bench_workload.CMDBUF_FLAGS`; it runs in a child process, since XLA reads its flags
once at start). Each is measured the same way:

1. warm-up: epoch 0, which compiles what the epoch needs (`compile_seconds`);
2. `--epochs` timed replays of epoch 0, each ended by a device sync; their median,
   less any compile time inside, is `epoch_seconds`. Replays keep the warm-up's
   shapes, so host-exact runs compiled programs: its epoch time is the best case of a
   framework whose shape changes are free, and `compile_seconds` is what each new
   epoch costs it on top. With `--host-steps N` the host engines run the first N steps
   of the epoch and their times are scaled to the whole epoch (`extrapolated`);
3. one more replay under `jax.profiler`: the GPU execution fraction (profiling.py).

Every record is one JSON line on stdout and in `--out`; a table ends the output.
`--isolate` runs each configuration in its own process, so that its peak device
memory is its own (`peak_scope` "config"; otherwise "process", the peak so far).
`--check-steps`, `--phases` and `--batch-sizes` add the scan-vs-host subgraph check,
the split of an epoch into sampling, gathering and the rest with a roofline, and
the step-time-vs-batch-size sweep.
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import json
import os
import pathlib
import subprocess
import sys
import tempfile
import threading
import time

from zerognn_jax._src.bench_workload import REPO, VARIANTS, blank_record

DATASETS_HELP = "products-like (default), tiny (CPU), or any name `zerognn data info` takes"


@dataclasses.dataclass(frozen=True)
class BenchOptions:
    """What to run; the `zerognn bench` flags map onto these fields one to one."""

    dataset: str = "products-like"
    root: str | None = None
    scale: float = 1.0
    model: str = "sage"
    hidden: int = 256
    layers: int = 3
    fanouts: tuple[int, ...] = (15, 10, 5)
    batch_size: int = 1024
    lr: float = 3e-3
    seed: int = 0
    epochs: int = 3
    configs: tuple[str, ...] = tuple(VARIANTS)
    host_steps: int | None = None
    check_steps: int = 0
    phases: bool = False
    batch_sizes: tuple[int, ...] = ()
    isolate: bool = False
    deadline: float | None = None
    out: str | None = None
    plot: str | None = None
    trace_dir: str | None = None
    envelope_cache: str | None = None
    progress: bool = True

    def __post_init__(self):
        for name in ("fanouts", "batch_sizes"):
            object.__setattr__(self, name, tuple(int(v) for v in getattr(self, name)))
        object.__setattr__(self, "configs", tuple(self.configs))
        unknown = [c for c in self.configs if c not in VARIANTS]
        checks = [
            (not unknown, f"unknown configs {unknown}; choose from {', '.join(VARIANTS)}"),
            (self.epochs >= 1, f"epochs must be >= 1, got {self.epochs}"),
            (self.host_steps is None or self.host_steps >= 1,
             f"host_steps must be >= 1, got {self.host_steps}"),
            (self.check_steps >= 0, f"check_steps must be >= 0, got {self.check_steps}"),
            (all(b >= 1 for b in self.batch_sizes),
             f"batch sizes must be >= 1, got {self.batch_sizes}"),
        ]
        for ok, message in checks:
            if not ok:
                raise ValueError(message)

    def child(self, config: str, envelope_cache: str | None) -> BenchOptions:
        """The options of a child process that measures `config` alone."""
        return dataclasses.replace(self, configs=(config,), check_steps=0, phases=False,
                                   batch_sizes=(), isolate=False, deadline=None, plot=None,
                                   envelope_cache=envelope_cache)


class _Run:
    """One `run`: the records so far, the output file, the clock for `deadline`."""

    def __init__(self, options: BenchOptions, out):
        self.options, self.out = options, out
        self.records, self.started = [], time.perf_counter()

    def left(self) -> float | None:
        if self.options.deadline is None:
            return None
        return self.options.deadline - (time.perf_counter() - self.started)

    def out_of_time(self) -> bool:
        left = self.left()
        return left is not None and left <= 0

    def emit(self, record: dict) -> None:
        self.records.append(record)
        line = json.dumps(record)
        print(line, flush=True)
        if self.out is not None:
            self.out.write(line + "\n")
            self.out.flush()

    def skip(self, kind: str, name: str, reason: str) -> None:
        self.emit(dict(blank_record(kind, name, self.options), status="skipped",
                       reason=reason))


def _needs_child(options: BenchOptions, name: str) -> bool:
    flags = VARIANTS[name].xla_flags
    return options.isolate or bool(flags) and flags not in os.environ.get("XLA_FLAGS", "")


def run(options: BenchOptions) -> list[dict]:
    """Runs what `options` asks for; returns the records (also printed and written)."""
    from zerognn_jax._src import bench_report

    with open(options.out, "a") if options.out else _nowhere() as out:
        state = _Run(options, out)
        with tempfile.TemporaryDirectory() as tmp:
            cache = options.envelope_cache or str(pathlib.Path(tmp) / "envelope.json")
            options = dataclasses.replace(options, envelope_cache=cache)
            state.options = options
            children = [c for c in options.configs if _needs_child(options, c)]
            for name in children:  # before this process takes the device
                _measure_in_child(state, name)
            _run_here(state, [c for c in options.configs if c not in children])
        summary = bench_report.summarize(state.records)
        if summary is not None:
            state.emit(summary)
    print(bench_report.format_table(state.records), flush=True)
    if options.plot:
        bench_report.plot(state.records, options.plot)
    return state.records


def _nowhere():
    return open(os.devnull, "w")  # noqa: SIM115


def _run_here(state: _Run, configs: list[str]) -> None:
    """Measures in this process: the check, the configs, the phases, the sweep."""
    options = state.options
    if not (configs or options.check_steps or options.phases or options.batch_sizes):
        return
    from zerognn_jax._src import bench_workload as workload
    from zerognn_jax._src.envelope import device_peak_bytes

    wb = workload.Workbench(options)
    if options.check_steps:
        _guarded(state, "check", "scan-vs-host-exact",
                 lambda: workload.check_equivalence(wb, options.check_steps))
    for name in configs:
        if state.out_of_time():
            state.skip("config", name, "time budget (--deadline) spent")
            continue
        _guarded(state, "config", name, lambda name=name: dict(
            workload.measure(wb, VARIANTS[name]), peak_bytes_in_use=device_peak_bytes(),
            peak_scope="process"))
    if options.phases:
        _guarded(state, "phases", "phases", lambda: workload.phase_timings(wb))
    for batch_size in options.batch_sizes:
        for name in ("scan-xla", "host-bucketed"):
            if state.out_of_time():
                state.skip("sweep", name, f"time budget (--deadline) spent (b={batch_size})")
                continue
            _guarded(state, "sweep", name,
                     lambda b=batch_size, name=name: workload.sweep_point(wb, name, b))


def _guarded(state: _Run, kind: str, name: str, measure) -> None:
    """Emits `measure()`'s record, or a skipped/error record if it raises."""
    try:
        record = measure()
    except ImportError as err:
        state.skip(kind, name, f"kernels not importable: {err}")
        return
    except Exception as err:  # noqa: BLE001 - one failed measurement must not end the run
        state.emit(dict(blank_record(kind, name, state.options), status="error",
                        reason=f"{type(err).__name__}: {err}"[:600]))
        return
    state.emit(record)


def _measure_in_child(state: _Run, name: str) -> None:
    if state.out_of_time():
        state.skip("config", name, "time budget (--deadline) spent")
        return
    child = state.options.child(name, state.options.envelope_cache)
    for record in run_child(child, VARIANTS[name].xla_flags, timeout=state.left()):
        state.emit(record)


def _pump(stream, tail: collections.deque) -> None:
    """Copies a child's stderr to ours as it comes (progress bars) and keeps its end."""
    for chunk in iter(lambda: stream.read(256), ""):
        sys.stderr.write(chunk)
        tail.append(chunk)


def child_env(xla_flags: str = "") -> dict:
    """Our environment with `xla_flags` added to XLA_FLAGS and the repo on PYTHONPATH.

    XLA reads a non-empty XLA_FLAGS that does not start with "--" as a file name, so
    the variable is left out when there are no flags.
    """
    env = dict(os.environ)
    flags = " ".join(filter(None, [env.pop("XLA_FLAGS", "").strip(), xla_flags.strip()]))
    if flags:
        env["XLA_FLAGS"] = flags
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    return env


def run_child(options: BenchOptions, xla_flags: str = "",
              timeout: float | None = None) -> list[dict]:
    """Runs `options` in a fresh Python process, `xla_flags` added to XLA_FLAGS.

    Returns the child's records; if it fails, one error record per config with the
    end of its stderr as the reason.
    """
    with tempfile.TemporaryDirectory() as tmp:
        out, spec = pathlib.Path(tmp) / "records.jsonl", pathlib.Path(tmp) / "options.json"
        spec.write_text(json.dumps(dataclasses.asdict(dataclasses.replace(
            options, out=str(out)))))
        env = child_env(xla_flags)
        cmd = [sys.executable, "-m", "zerognn_jax._src.bench", "--options-json", str(spec)]
        proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL,
                                stderr=subprocess.PIPE, text=True)
        tail = collections.deque(maxlen=64)
        pump = threading.Thread(target=_pump, args=(proc.stderr, tail), daemon=True)
        pump.start()
        try:
            code = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            code = "timeout"
        pump.join(timeout=10)
        records = [json.loads(line) for line in out.read_text().splitlines()] \
            if out.is_file() else []
    records = [r for r in records if r["kind"] != "summary"]
    if code == 0 and records:
        return [dict(r, peak_scope="config") for r in records]
    what = "timed out" if code == "timeout" else f"exited with {code}"
    reason = f"child process {what}: " + " ".join("".join(tail).split())[-600:]
    return [dict(blank_record("config", c, options), status="error", reason=reason)
            for c in options.configs]


def _ints(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(p) for p in text.split(",") if p.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected comma-separated integers, got {text!r}") from None


def _names(text: str) -> tuple[str, ...]:
    return tuple(p.strip() for p in text.split(",") if p.strip())


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The `zerognn bench` flags (defaults: BenchOptions)."""
    d = BenchOptions()
    add = parser.add_argument
    add("--preset", "--dataset", dest="dataset", default=d.dataset, help=DATASETS_HELP)
    add("--root", default=d.root, help="dataset folder; generated presets are cached there")
    add("--scale", type=float, default=d.scale, help="size factor of synthetic presets")
    add("--model", default=d.model, help="sage, gcn, gat, ... (as `zerognn train`)")
    add("--hidden", type=int, default=d.hidden)
    add("--layers", type=int, default=d.layers)
    add("--fanouts", type=_ints, default=d.fanouts, help="comma-separated, seeds' hop first")
    add("--batch-size", type=int, default=d.batch_size)
    add("--lr", type=float, default=d.lr)
    add("--seed", type=int, default=d.seed)
    add("--epochs", type=int, default=d.epochs, help="timed epochs per configuration")
    add("--configs", type=_names, default=d.configs,
        help=f"comma-separated subset of {','.join(VARIANTS)} (default: all)")
    add("--host-steps", type=int, default=d.host_steps,
        help="host engines run only the first N steps of an epoch, scaled to the epoch")
    add("--check-steps", type=int, default=d.check_steps,
        help="first compare the scan and host-exact engines over N steps")
    add("--phases", action=argparse.BooleanOptionalAction, default=d.phases,
        help="time sampling-only and sampling+gather epochs, copy bandwidth, roofline")
    add("--batch-sizes", type=_ints, default=d.batch_sizes,
        help="step time vs batch size for scan-xla and host-bucketed, e.g. 256,1024,8192")
    add("--isolate", action=argparse.BooleanOptionalAction, default=d.isolate,
        help="one process per configuration (peak memory per configuration)")
    add("--deadline", type=float, default=d.deadline,
        help="seconds after which remaining measurements are skipped")
    add("--out", default=d.out, help="append the JSON lines to this file")
    add("--plot", default=d.plot, help="write a PNG of the results here (needs matplotlib)")
    add("--trace-dir", default=d.trace_dir, help="keep the profiler traces here")
    add("--envelope-cache", default=d.envelope_cache,
        help="JSON file to share the calibrated envelope between processes")
    add("--progress", action=argparse.BooleanOptionalAction, default=d.progress,
        help="progress bars on stderr")


def options_from_args(args: argparse.Namespace) -> BenchOptions:
    fields = {f.name for f in dataclasses.fields(BenchOptions)}
    return BenchOptions(**{k: v for k, v in vars(args).items() if k in fields})


def _cmd_bench(args) -> int:
    records = run(options_from_args(args))
    return 0 if all(r["status"] in ("ok", "skipped") for r in records) else 1


def add_bench_command(subparsers) -> argparse.ArgumentParser:
    """Adds `bench` to the `zerognn` subcommands (from `parser.add_subparsers()`)."""
    parser = subparsers.add_parser(
        "bench", help="time the scan engine against the host-mediated baseline",
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(parser)
    parser.set_defaults(handler=_cmd_bench)
    return parser


def main(argv=None) -> int:
    """`python -m zerognn_jax._src.bench`: the bench flags, or a child's `--options-json`."""
    parser = argparse.ArgumentParser(prog="zerognn-bench")
    add_arguments(parser)
    parser.add_argument("--options-json", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.options_json:
        spec = json.loads(pathlib.Path(args.options_json).read_text())
        run(BenchOptions(**spec))
        return 0
    return _cmd_bench(args)


if __name__ == "__main__":
    sys.exit(main())
