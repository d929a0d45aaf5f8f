"""The runner behind `zerognn bench`: the scan engine against the host-mediated baseline,
and its ablations (flags in `zerognn_jax/cli/bench.py`).

Configurations (`--configs`, `workload.VARIANTS`): host-exact and host-bucketed
(`training/host.py`), scan-xla, scan-pallas, scan-auto (the library's kernel choice),
scan-auto-bf16, scan-tree (no dedup), scan-dedup (every hop deduplicated, as the host
engines sample), scan-dedup-bf16, scan-bf16 (bfloat16 features and activations) and
scan-cmdbuf (the scan engine with XLA command buffers over its loop,
`workload.CMDBUF_FLAGS`; it runs in a child process, since XLA reads its flags once at
start). Each is measured the same way:

1. warm-up: epoch 0, which compiles what the epoch needs (`compile_seconds`);
2. `--epochs` timed replays of epoch 0, each ended by a device sync; their median,
   less any compile time inside, is `epoch_seconds`. Replays keep the warm-up's
   shapes, so host-exact runs compiled programs: its epoch time is the best case of a
   framework whose shape changes are free, and `compile_seconds` is what each new
   epoch costs it on top. With `--host-steps N` the host engines run the first N steps
   of the epoch and their times are scaled to the whole epoch (`extrapolated`);
3. one more replay under `jax.profiler`: the GPU execution fraction (profiling.py).

Every record is one JSON line on stdout and in `--out`; a table ends the output. Under
`zerognn bench` a SIGINT, SIGTERM or SIGHUP stops the run after the measurement in
progress, keeping the records written so far (exit code 130, 143 or 129).
`--isolate` runs each configuration in its own process, so that its peak device
memory is its own (`peak_scope` "config"; otherwise "process", the peak so far).
`--check-steps`, `--phases` and `--batch-sizes` add the scan-vs-host subgraph check,
the split of an epoch into sampling, gathering and the rest with a roofline, and
the step-time-vs-batch-size sweep.
"""

from __future__ import annotations

import collections
import dataclasses
import json
import math
import os
import pathlib
import subprocess
import sys
import tempfile
import threading
import time

from zerognn_jax._src.bench.report import PLOT_NEEDS
from zerognn_jax._src.bench.workload import REPO, VARIANTS, blank_record
from zerognn_jax._src.data.writes import AppendFile, file_on_the_way, not_json_lines
from zerognn_jax._src.training import interrupts
from zerognn_jax._src.training.config import TrainConfig


def bench_defaults() -> TrainConfig:
    """The workload `zerognn bench` measures unless told otherwise: products-like at full
    scale, SAGE 3x256, fanouts 15,10,5, batch 1024 (TrainConfig's defaults), 3 timed
    epochs per configuration, no evaluation."""
    return TrainConfig(dataset="products-like", epochs=3, eval_mode="none")


# What `--plot` can write (matplotlib's raster and vector formats most used).
PLOT_SUFFIXES = (".png", ".pdf", ".svg", ".jpg", ".jpeg")


def check_dataset_kind(dataset: str) -> None:
    """Refuses a graph collection or a typed graph, which have benchmarks of their own
    (the command line checks this before the training config, which would ask for
    another task)."""
    from zerognn_jax._src.data.graph_datasets import is_graph_dataset
    from zerognn_jax._src.data.loaders import is_typed

    if is_graph_dataset(dataset):
        raise ValueError(f"zerognn bench times node classification; {dataset} is a "
                         f"collection of graphs: run benchmarks/graph.py")
    if is_typed(dataset):
        raise ValueError(f"zerognn bench times graphs of one node type; for typed "
                         f"graphs ({dataset}) run benchmarks/hetero.py")


@dataclasses.dataclass(frozen=True)
class BenchOptions:
    """What to run: the training workload (`train`; its `epochs` are the timed epochs per
    configuration) and what to measure on it. The `zerognn bench` flags map onto these."""

    train: TrainConfig = dataclasses.field(default_factory=bench_defaults)
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

    def __post_init__(self):
        if isinstance(self.train, dict):  # from JSON (a child process's options)
            object.__setattr__(self, "train", TrainConfig(**self.train))
        object.__setattr__(self, "batch_sizes", tuple(int(v) for v in self.batch_sizes))
        object.__setattr__(self, "configs", tuple(self.configs))
        unknown = [c for c in self.configs if c not in VARIANTS]
        checks = [
            (not unknown, f"unknown configs {unknown}; choose from {', '.join(VARIANTS)}"),
            (self.train.epochs >= 1, f"train.epochs must be >= 1, got {self.train.epochs}"),
            (self.host_steps is None or self.host_steps >= 1,
             f"host_steps must be >= 1, got {self.host_steps}"),
            (self.check_steps >= 0, f"check_steps must be >= 0, got {self.check_steps}"),
            (all(1 <= b < 2**31 for b in self.batch_sizes),
             f"batch_sizes must be in [1, 2**31), got {self.batch_sizes}"),
            (bool(self.configs or self.check_steps or self.phases or self.batch_sizes),
             "configs must name at least one configuration (or ask for check_steps, "
             "phases or batch_sizes alone)"),
            (self.deadline is None or (math.isfinite(self.deadline) and self.deadline > 0),
             f"deadline must be a positive number of seconds, got {self.deadline}"),
        ]
        for name in ("out", "plot", "trace_dir", "envelope_cache"):
            value = getattr(self, name)
            checks.append((value is None or bool(value), f"{name} must not be an empty path"))
        for ok, message in checks:
            if not ok:
                raise ValueError(message)
        self._check_workload()
        self._check_paths()

    def _check_workload(self) -> None:
        """The bench times node classification on a graph of one node type; other
        workloads have scripts of their own (docs/benchmarks.md). A dataset that cannot be
        read is refused here, before child processes load it."""
        from zerognn_jax._src.data.loaders import require_readable

        if self.train.task == "link":
            raise ValueError("zerognn bench times node classification; for link "
                             "prediction run benchmarks/link.py")
        if self.train.task == "graph":
            raise ValueError("zerognn bench times node classification; for graph-level "
                             "tasks run benchmarks/graph.py")
        check_dataset_kind(self.train.dataset)
        require_readable(self.train.dataset)

    def _check_paths(self) -> None:
        """Output paths that could only fail after the measurements fail now."""
        if self.plot:
            plot = pathlib.Path(self.plot)
            if plot.suffix.lower() not in PLOT_SUFFIXES:
                raise ValueError(f"plot must end in one of {', '.join(PLOT_SUFFIXES)}, got "
                                 f"{self.plot!r}")
            if plot.is_dir():
                raise ValueError(f"plot {self.plot!r} is a folder, not a file")
            if (above := file_on_the_way(plot)) is not None:
                raise ValueError(f"plot {self.plot!r}: {above} is a file, not a folder")
            if not plot.parent.is_dir():
                raise ValueError(f"plot {self.plot!r} names a folder that does not exist "
                                 f"({plot.parent})")
            try:  # (missing, it failed after the runs)
                import matplotlib  # noqa: F401
            except ImportError:
                raise ValueError(PLOT_NEEDS) from None
        if self.trace_dir and pathlib.Path(self.trace_dir).exists() and \
                not pathlib.Path(self.trace_dir).is_dir():
            raise ValueError(f"trace_dir {self.trace_dir} is a file, not a folder")
        if self.trace_dir and (above := file_on_the_way(self.trace_dir)) is not None:
            raise ValueError(f"trace_dir {self.trace_dir}: {above} is a file, not a folder")
        if self.out:
            out, above = pathlib.Path(self.out), file_on_the_way(self.out)
            if out.is_dir():
                raise ValueError(f"out {self.out} is a folder, not a file")
            if above is not None:
                raise ValueError(f"out {self.out}: {above} is a file, not a folder")
            if not out.parent.is_dir():
                raise ValueError(f"out {self.out}: its folder {out.parent} does not exist")
            first = not_json_lines(out) if out.is_file() else None
            if first is not None:
                raise ValueError(f"out {self.out} holds something other than JSON lines "
                                 f"(it begins {first!r}), and the records would be "
                                 f"appended to it; give another file")
        if self.envelope_cache:
            cache, above = pathlib.Path(self.envelope_cache), file_on_the_way(
                self.envelope_cache)
            if cache.is_dir():
                raise ValueError(f"envelope_cache {self.envelope_cache} is a folder, not a "
                                 f"file")
            if above is not None:
                raise ValueError(f"envelope_cache {self.envelope_cache}: {above} is a file, "
                                 f"not a folder")
            first = not_json_lines(cache) if cache.is_file() else None
            if first is not None:  # (it was written over)
                raise ValueError(f"envelope_cache {self.envelope_cache} holds something "
                                 f"other than a cached envelope (it begins {first!r}), and "
                                 f"would be written over; give another file")

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

    def skip(self, kind: str, name: str, reason: str, batch_size: int | None = None) -> None:
        self.emit(dict(blank_record(kind, name, self.options, batch_size), status="skipped",
                       reason=reason))


def _needs_child(options: BenchOptions, name: str) -> bool:
    flags = VARIANTS[name].xla_flags
    return options.isolate or bool(flags) and flags not in os.environ.get("XLA_FLAGS", "")


def run(options: BenchOptions) -> list[dict]:
    """Runs what `options` asks for; returns the records (also printed and written)."""
    from zerognn_jax._src.bench import report as bench_report

    with AppendFile(options.out, "bench output") if options.out else _nowhere() as out:
        state, stopped, refused = _Run(options, out), None, False
        try:
            with tempfile.TemporaryDirectory() as tmp:
                cache = options.envelope_cache or str(pathlib.Path(tmp) / "envelope.json")
                options = dataclasses.replace(options, envelope_cache=cache)
                state.options = options
                children = [c for c in options.configs if _needs_child(options, c)]
                for name in children:  # before this process takes the device
                    _measure_in_child(state, name)
                _run_here(state, [c for c in options.configs if c not in children])
        except interrupts.Interrupted as err:
            stopped = err
            raise
        except Exception:
            refused = not state.records  # (the workload refused before any measurement:
            raise  # no run, so no summary record either)
        finally:  # every run ends with its summary, an interrupted one too: a file of
            # appended runs is cut at them (report.runs_of)
            summary = (bench_report.summarize(state.records)
                       or {"kind": "summary", "status": "nothing measured", "goals": {}})
            if stopped is not None:  # ("ok" had hidden the measurements never made)
                summary.update(status="interrupted", stopped_after=stopped.after)
            if not refused:
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
    from zerognn_jax._src.bench import workload
    from zerognn_jax._src.training.memory import device_peak_bytes

    wb = workload.Workbench(options)
    if options.check_steps:
        _guarded(state, "check", "scan-vs-host-exact",
                 lambda: workload.check_equivalence(wb, options.check_steps))
    for name in configs:
        if state.out_of_time():
            state.skip("config", name, "time budget (--deadline) spent")
            continue
        if reason := workload.unmeasured_here(VARIANTS[name]):
            state.skip("config", name, reason)
            continue
        _guarded(state, "config", name, lambda name=name: dict(
            workload.measure(wb, VARIANTS[name]), peak_bytes_in_use=device_peak_bytes(),
            peak_scope="process"))
    if options.phases:
        _guarded(state, "phases", "phases", lambda: workload.phase_timings(wb))
    items = -(-len(wb.dataset.train_idx) // wb.program.num_shards)  # a device's
    for batch_size in options.batch_sizes:
        for name in ("scan-xla", "host-bucketed"):
            if state.out_of_time():
                state.skip("sweep", name, "time budget (--deadline) spent", batch_size)
                continue
            if batch_size > items:  # one step takes them all, the rest padding
                state.skip("sweep", name, f"batch {batch_size} is above the {items} "
                                          f"training items a device takes", batch_size)
                continue
            _guarded(state, "sweep", name,
                     lambda b=batch_size, name=name: workload.sweep_point(wb, name, b))


def _guarded(state: _Run, kind: str, name: str, measure) -> None:
    """Emits `measure()`'s record, or a skipped/error record if it raises; then stops the
    run if a signal arrived meanwhile (`interrupts`: records so far are kept)."""
    _measure(state, kind, name, measure)
    interrupts.check(f"{kind} {name}")


def _measure(state: _Run, kind: str, name: str, measure) -> None:
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
    interrupts.check(f"config {name}")


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

    Returns the child's records, also those of a child that SIGINT, SIGTERM or SIGHUP stopped
    after the config in progress (a terminal's Ctrl-C reaches it with us); if it fails,
    one error record per config with the end of its stderr as the reason.
    """
    with tempfile.TemporaryDirectory() as tmp:
        out, spec = pathlib.Path(tmp) / "records.jsonl", pathlib.Path(tmp) / "options.json"
        spec.write_text(json.dumps(dataclasses.asdict(dataclasses.replace(
            options, out=str(out)))))
        env = child_env(xla_flags)
        cmd = [sys.executable, "-m", "zerognn_jax.cli", "bench", "--options-json", str(spec)]
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
    stopped = {128 + int(s): s.name for s in interrupts.SIGNALS}.get(code)
    # (a child exits 1 where its measurement's record is an error: the record says why)
    if records and (code in (0, 1) or stopped):
        return [dict(r, peak_scope="config") for r in records]
    if stopped:
        return [dict(blank_record("config", c, options), status="skipped",
                     reason=f"its child process was stopped by {stopped} before it "
                            f"measured it") for c in options.configs]
    if code == "timeout":  # as a measurement the deadline leaves no time for
        return [dict(blank_record("config", c, options), status="skipped",
                     reason=f"time budget (--deadline) spent: its child process was "
                            f"stopped after {timeout:.1f} s") for c in options.configs]
    reason = f"child process exited with {code}: " + " ".join("".join(tail).split())[-600:]
    return [dict(blank_record("config", c, options), status="error", reason=reason)
            for c in options.configs]
