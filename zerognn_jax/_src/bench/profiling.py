"""GPU execution fraction from a `jax.profiler` trace.

`traced_window` records a region under the profiler and marks it with a host
annotation; `execution_fraction` reads the Chrome-format `*.trace.json.gz` that the
profiler writes (`<log_dir>/plugins/profile/<run>/<host>.trace.json.gz`), takes every
event on a device stream line ("Stream #..." threads of a "/device:..." process:
kernels, copies and memsets as CUPTI reports them, not the derived "XLA Modules" or
"XLA Ops" lines, which span idle gaps), and divides the length of the union of their
intervals, clipped to the annotated window, by the window's length.

A program compiled with command buffers (XLA's default on a GPU) shows in a trace of
JAX 0.11.2 as `command_buffer_N` events that name no instruction (seen on an H100,
2026-11-25); compile what is to be profiled kernel by kernel with `NO_COMMAND_BUFFERS`
(or `XLA_FLAGS=--xla_gpu_enable_command_buffer=`).
"""

from __future__ import annotations

import collections
import contextlib
import gzip
import json
import pathlib
import re

import jax

from zerognn_jax._src.bench import hlo_bytes
from zerognn_jax._src.training import trainer
from zerognn_jax._src.training.program import init_state
from zerognn_jax._src.training.scan import ScanEngine

WINDOW = "zerognn_profiled_window"
# compiler options (`Compiled`'s, `ScanEngine.compiler_options`) for a program whose
# kernels a trace should name one by one
NO_COMMAND_BUFFERS = {"xla_gpu_enable_command_buffer": ""}
_STREAM = re.compile(r"^\s*stream\b", re.IGNORECASE)
_INSTRUCTION = re.compile(r"^\s*(?:ROOT\s+)?%?([\w.\-]+)\s*=")
_OP_NAME = re.compile(r'op_name="([^"]*)"')


@contextlib.contextmanager
def traced_window(log_dir: str | pathlib.Path):
    """Profiles the block into `log_dir`, marked by a host annotation named WINDOW.

    The block should end with a device sync, so that its device work lies inside.
    """
    with jax.profiler.trace(str(log_dir)), jax.profiler.TraceAnnotation(WINDOW):
        yield


def find_trace(log_dir: str | pathlib.Path) -> pathlib.Path:
    """The newest `*.trace.json.gz` under `log_dir`; FileNotFoundError if none."""
    found = sorted(pathlib.Path(log_dir).glob("plugins/profile/*/*.trace.json.gz"),
                   key=lambda p: p.stat().st_mtime)
    if not found:
        raise FileNotFoundError(f"no *.trace.json.gz under {log_dir}/plugins/profile")
    return found[-1]


def load_events(path: str | pathlib.Path) -> list[dict]:
    """The `traceEvents` list of a Chrome-format trace (gzipped or not)."""
    opener = gzip.open if str(path).endswith(".gz") else open
    with opener(path, "rt") as handle:
        return json.load(handle)["traceEvents"]


def stream_lines(events: list[dict]) -> dict[tuple, str]:
    """{(pid, tid): "process / thread"} for the stream lines of device processes."""
    processes, threads = {}, {}
    for e in events:
        if e.get("ph") != "M":
            continue
        if e.get("name") == "process_name":
            processes[e["pid"]] = e["args"]["name"]
        elif e.get("name") == "thread_name":
            threads[(e["pid"], e["tid"])] = e["args"]["name"]
    return {key: f"{processes[key[0]]} / {name}" for key, name in threads.items()
            if processes.get(key[0], "").startswith("/device:") and _STREAM.match(name)}


def line_names(path: str | pathlib.Path) -> list[str]:
    """Every "process / thread" name of a trace (to diagnose a trace with no device)."""
    events = load_events(path)
    processes = {e["pid"]: e["args"]["name"] for e in events
                 if e.get("ph") == "M" and e.get("name") == "process_name"}
    return sorted({f"{processes.get(e['pid'], e['pid'])} / {e['args']['name']}"
                   for e in events if e.get("ph") == "M" and e.get("name") == "thread_name"})


def union_length(intervals) -> float:
    """Total length covered by (start, end) intervals, overlaps counted once."""
    total, reach = 0.0, float("-inf")
    for start, end in sorted(intervals):
        if end > reach:
            total += end - max(start, reach)
            reach = end
    return total


def _window(events: list[dict]) -> tuple[float, float]:
    marks = [e for e in events if e.get("ph") == "X" and e.get("name") == WINDOW]
    if not marks:
        raise ValueError(f"the trace holds no {WINDOW!r} annotation")
    mark = max(marks, key=lambda e: e["dur"])
    return float(mark["ts"]), float(mark["ts"] + mark["dur"])


def execution_fraction(path: str | pathlib.Path) -> dict | None:
    """Device busy time over the annotated window, or None if the trace has no device.

    Returns {"fraction", "busy_seconds", "window_seconds", "events", "lines"}: the
    union of device stream events clipped to the window, over the window's length.
    """
    events = load_events(path)
    lines = stream_lines(events)
    if not lines:
        return None
    lo, hi = _window(events)
    spans = [(max(float(e["ts"]), lo), min(float(e["ts"] + e["dur"]), hi)) for e in events
             if e.get("ph") == "X" and (e.get("pid"), e.get("tid")) in lines]
    spans = [(a, b) for a, b in spans if b > a]
    busy = union_length(spans)
    return {"fraction": busy / max(hi - lo, 1e-9), "busy_seconds": busy * 1e-6,
            "window_seconds": (hi - lo) * 1e-6, "events": len(spans),
            "lines": sorted(set(lines.values()))}


def kernel_table(path: str | pathlib.Path, top: int = 20) -> list[dict]:
    """The `top` device event names by total time inside the annotated window:
    [{"name", "seconds", "count", "share"}]; share: of all device event time there."""
    events = load_events(path)
    lines = stream_lines(events)
    if not lines:
        return []
    lo, hi = _window(events)
    totals = {}
    for e in events:
        if e.get("ph") != "X" or (e.get("pid"), e.get("tid")) not in lines:
            continue
        dur = min(float(e["ts"] + e["dur"]), hi) - max(float(e["ts"]), lo)
        if dur > 0:
            seconds, count = totals.get(e["name"], (0.0, 0))
            totals[e["name"]] = (seconds + dur * 1e-6, count + 1)
    busy = max(sum(s for s, _ in totals.values()), 1e-12)
    ranked = sorted(totals.items(), key=lambda kv: -kv[1][0])[:top]
    return [{"name": name, "seconds": s, "count": c, "share": s / busy}
            for name, (s, c) in ranked]


def collective_breakdown(path: str | pathlib.Path, pattern: str = "nccl") -> dict:
    """Per device of a multi-device trace: where its time went between its first and
    last stream event.

    Returns {device: {"span_seconds", "busy_seconds", "idle_seconds",
    "collective_seconds", "collectives"}}: the union of the device's stream events,
    the gaps in it, and the total length and count of the events whose name contains
    `pattern` (NCCL kernels: they spin until every peer has arrived, so their time
    beyond a collective's own cost is waiting for the slowest device).
    """
    events = load_events(path)
    lines = stream_lines(events)
    out = {}
    for device in sorted({name.split(" / ")[0] for name in lines.values()}):
        keys = {k for k, name in lines.items() if name.startswith(device + " / ")}
        mine = [e for e in events if e.get("ph") == "X" and (e.get("pid"), e.get("tid")) in keys]
        if not mine:
            continue
        spans = [(float(e["ts"]), float(e["ts"] + e["dur"])) for e in mine]
        lo, hi = min(a for a, _ in spans), max(b for _, b in spans)
        busy = union_length(spans)
        coll = [e for e in mine if pattern.lower() in e.get("name", "").lower()]
        out[device] = {"span_seconds": (hi - lo) * 1e-6, "busy_seconds": busy * 1e-6,
                       "idle_seconds": (hi - lo - busy) * 1e-6,
                       "collective_seconds": union_length(
                           (float(e["ts"]), float(e["ts"] + e["dur"])) for e in coll) * 1e-6,
                       "collectives": len(coll)}
    return out


def _device_kernels(path):
    """Every device stream event of a trace as (kernel key, microseconds): the key is
    the HLO instruction the event ran (`hlo_op`), spelt as `hlo_bytes.kernel_key`
    spells it, else the event's own name (library kernels outside any instruction)."""
    events = load_events(path)
    lines = stream_lines(events)
    for e in events:
        if e.get("ph") == "X" and (e.get("pid"), e.get("tid")) in lines:
            yield hlo_bytes.kernel_key(e.get("args", {}).get("hlo_op") or e["name"]), \
                float(e["dur"])


def step_kernel_table(path: str | pathlib.Path, hlo_text: str, steps: int,
                      limit: int = 16) -> dict:
    """The busiest device kernels of a profiled run of `steps` steps, per step, beside
    the bytes their HLO instructions move (`hlo_bytes`), and the step's totals.

    Rows: [name, us per step, launches per step, MB per step, GB/s]; MB and GB/s are
    None for kernels that match no instruction (library kernels named by their own
    code, e.g. cuBLAS GEMMs)."""
    sizes = {hlo_bytes.kernel_key(k): v
             for k, v in hlo_bytes.instruction_bytes(hlo_text).items()}
    us, launches = collections.Counter(), collections.Counter()
    for name, dur in _device_kernels(path):
        us[name] += dur
        launches[name] += 1
    moved = {n: launches[n] * sizes[n] for n in us if n in sizes}
    rows = []
    for name, t in us.most_common(limit):
        mb = moved[name] / steps / 1e6 if name in moved else None
        rows.append([name[:60], round(t / steps, 1), round(launches[name] / steps, 2),
                     None if mb is None else round(mb, 1),
                     None if mb is None else round(moved[name] / (t * 1e3), 1)])
    busy = sum(us.values())
    if not us:  # no device stream lines (a CPU): nothing measured, rather than zeros
        return {"kernels": [], "busy_us_per_step": None, "kernels_per_step": None,
                "hlo_mb_per_step": None, "time_share_with_bytes": None}
    return {"kernels": rows, "busy_us_per_step": round(busy / steps, 1),
            "kernels_per_step": round(sum(launches.values()) / steps, 1),
            "hlo_mb_per_step": round(sum(moved.values()) / steps / 1e6, 1),
            "time_share_with_bytes": round(sum(us[n] for n in moved) / busy, 3)}


def op_names(hlo_text: str) -> dict[str, str]:
    """{kernel key: op_name} of every instruction of an HLO text whose metadata records
    the JAX operation it came from (with its `jax.named_scope`s and transformations,
    e.g. "jit(run)/while/body/transpose(jvp(...))/dot_general")."""
    out = {}
    for line in hlo_text.splitlines():
        name, op = _INSTRUCTION.match(line), _OP_NAME.search(line)
        if name and op:
            out[hlo_bytes.kernel_key(name.group(1))] = op.group(1)
    return out


def step_profile(path: str | pathlib.Path, hlo_text: str, steps: int, phase_of,
                 top: int) -> dict:
    """A profiled run's "phases_us_per_step" (`phase_table`) and `step_kernel_table`
    of its `top` kernels, each kernel row ending with the operation it came from (the
    last 90 characters of its op_name, "" if none)."""
    out = {"phases_us_per_step": phase_table(path, hlo_text, steps, phase_of)}
    out.update(step_kernel_table(path, hlo_text, steps, top))
    names = op_names(hlo_text)
    for row in out["kernels"]:
        row.append(names.get(row[0], "")[-90:])
    return out


def scope_phase(op_name: str | None, scopes) -> str:
    """The phase of a kernel whose instruction came from `op_name` (None: a library
    kernel outside any instruction, "unnamed"): that of the first (named scope, phase)
    in `scopes` whose scope is a whole component of the name ("transpose" marks the
    backward pass), else "forward and other"."""
    if op_name is None:
        return "unnamed"
    for scope, phase in scopes:
        if re.search(rf"(^|[/(]){re.escape(scope)}([/()]|$)", op_name):
            return phase
    return "forward and other"


# The named scopes of a training step (training/step.py, program.py, scan.py) as
# (scope, phase), the first match winning; "transpose" marks the backward pass.
STEP_SCOPES = (("embedding_update", "embedding update"), ("embedding_rows", "embedding rows"),
               ("restrict", "seed-edge mask"), ("sample", "sampling"), ("update", "optimizer"),
               ("transpose", "backward"), ("features", "feature gather"))


def step_phase(op_name: str | None) -> str:
    """The phase of a training step's kernel from its operation's op_name (STEP_SCOPES)."""
    return scope_phase(op_name, STEP_SCOPES)


def phase_table(path: str | pathlib.Path, hlo_text: str, steps: int,
                phase_of) -> dict[str, list]:
    """{phase: [us per step, launches per step]}: the device time of a profiled run of
    `steps` steps, each kernel put in the phase that `phase_of(op_name or None)` names
    from its instruction's op_name (`op_names`); None for kernels with no instruction.
    A fusion carries the op_name of one of the operations it fused, so the split is
    approximate where a fusion spans phases."""
    names = op_names(hlo_text)
    us, launches = collections.Counter(), collections.Counter()
    for kernel, dur in _device_kernels(path):
        phase = phase_of(names.get(kernel))
        us[phase] += dur
        launches[phase] += 1
    return {phase: [round(t / steps, 1), round(launches[phase] / steps, 2)]
            for phase, t in us.most_common()}


def profile_training_epoch(cfg, dataset, log_dir: str | pathlib.Path, *, top: int = 14,
                           phase_of=step_phase, hlo_out=None) -> dict:
    """Phases and busiest kernels per step (`step_profile`) of one epoch of `cfg`'s
    training on `dataset`, run by the scan engine as `zg.train` runs it with
    `engine="scan"` (`sample_ahead`, chunks, GEMM backend) but compiled with
    `NO_COMMAND_BUFFERS`, traced into `log_dir`.

    A first epoch from the envelope `zg.train` starts from compiles and grows it where a
    step overflows; the profiled epoch then starts afresh at the envelope that epoch
    ended with, and must not overflow (its kernels would mix two
    programs: RuntimeError). On a CPU everything runs but the device lines are empty.
    `hlo_out`: a file to write the profiled program's optimized HLO text to.
    """
    _, data, program = trainer.prepare(cfg, dataset)
    items = program.task.train_items(dataset)
    envelope, _ = trainer.starting_envelope(cfg, program, data, dataset)
    engine = ScanEngine(program, chunk_steps=cfg.chunk_steps, policy=cfg.envelope_policy,
                        sample_ahead=cfg.sample_ahead, gemm_backend=cfg.gemm_backend,
                        read_ahead_bytes=cfg.read_ahead_bytes,
                        compiler_options=NO_COMMAND_BUFFERS)
    res = engine.run_epoch(init_state(program, data, envelope, items), data, items, 0,
                           envelope)
    envelope = res.envelope
    jax.block_until_ready(res.state.params)
    del res  # one state at a time, as in training
    state = init_state(program, data, envelope, items)  # the engine donated the first one
    jax.block_until_ready(state.params)
    with traced_window(log_dir):
        res = engine.run_epoch(state, data, items, 0, envelope)
        jax.block_until_ready(res.state.params)
    if res.overflows:
        raise RuntimeError(f"the profiled epoch overflowed {res.overflows} times at "
                           f"{envelope}; its kernels would mix two programs")
    (text,) = [c.as_text() for (env, *_), c in engine.programs.items() if env == envelope]
    if hlo_out is not None:
        pathlib.Path(hlo_out).write_text(text)
    out = step_profile(find_trace(log_dir), text, res.steps, phase_of, top)
    out["top_kernels"] = out.pop("kernels")  # "kernels" names a run's kernel choice
    return out
