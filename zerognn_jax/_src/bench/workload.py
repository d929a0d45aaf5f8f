"""The measurements behind `zerognn bench`, on one shared workload.

`Workbench` loads the data, builds the base StepProgram, calibrates the envelope and
initialises the model once; `measure` times one configuration on it (see bench.py
for the protocol); `check_equivalence` puts the scan and host engines side by side;
`phase_timings` splits an epoch into sampling, gathering and the rest and sets it
against a bytes-moved floor; `batch_sweep` times steps over batch sizes.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import pathlib
import statistics
import subprocess
import sys
import tempfile
import time

import jax
import jax.numpy as jnp
import numpy as np
from tqdm.auto import tqdm

from zerognn_jax._src.bench import profiling
from zerognn_jax._src.data.writes import atomic_write
from zerognn_jax._src.nn.models import count_params
from zerognn_jax._src.ops.gather import gather_rows
from zerognn_jax._src.ops.registry import Kernels
from zerognn_jax._src.sampling.calibrate import Calibration, choose_envelope
from zerognn_jax._src.sampling.envelope import Envelope
from zerognn_jax._src.sampling.seeds import epoch_items, num_steps
from zerognn_jax._src.sampling.steps import sample_step
from zerognn_jax._src.training import memory, trainer
from zerognn_jax._src.training.engines import make_engine
from zerognn_jax._src.training.host import HostEngine
from zerognn_jax._src.training.layout import choose_layout
from zerognn_jax._src.training.program import DeviceData, TrainState, init_state
from zerognn_jax._src.training.scan import ScanEngine, chunk_scalars

REPO = pathlib.Path(__file__).resolve().parents[3]
CMDBUF_FLAGS = ("--xla_gpu_enable_command_buffer=+WHILE,+CONDITIONAL "
                "--xla_enable_command_buffers_during_profiling=true")


@dataclasses.dataclass(frozen=True)
class Variant:
    """One benchmark configuration: engine, kernels, sampling mode, dtype, XLA flags.

    `dedup` None takes the library's choice for the scan engine (`TrainConfig.dedup`);
    the host engines always deduplicate."""

    name: str
    engine: str = "scan"
    kernels: str = "xla"
    dedup: bool | None = None
    dtype: str = "float32"
    xla_flags: str = ""


VARIANTS = {v.name: v for v in (
    Variant("host-exact", engine="host-exact"),
    Variant("host-bucketed", engine="host-bucketed"),
    Variant("scan-xla"),
    Variant("scan-pallas", kernels="pallas"),
    Variant("scan-auto", kernels="auto"),
    Variant("scan-auto-bf16", kernels="auto", dtype="bfloat16"),
    Variant("scan-tree", dedup=False),
    Variant("scan-dedup", dedup=True),
    Variant("scan-dedup-bf16", kernels="auto", dtype="bfloat16", dedup=True),
    Variant("scan-bf16", dtype="bfloat16"),
    Variant("scan-cmdbuf", xla_flags=CMDBUF_FLAGS),
)}


def unmeasured_here(variant: Variant) -> str | None:
    """Why `variant` is not measured on this backend: Pallas kernels off a GPU. Their
    interpreter sums ids repeated within one program's block wrongly (docs/kernels.md),
    so an interpreted epoch would time, and train on, wrong gradients."""
    if "pallas" in variant.kernels and jax.default_backend() != "gpu":
        return (f"Pallas kernels need an NVIDIA GPU (backend here: {jax.default_backend()}; "
                f"their interpreter is for the kernels' tests)")
    return None


FIELDS = (
    "kind", "config", "status", "reason", "engine", "kernels", "dedup", "dtype", "xla_flags",
    "sampler", "dataset", "scale", "batch_size", "devices", "global_batch", "fanouts",
    "steps_per_epoch", "steps_timed",
    "extrapolated", "epoch_seconds", "epoch_seconds_runs", "compile_seconds",
    "warmup_seconds", "shapes_compiled", "steps_per_second", "sampled_edges_per_second",
    "loss", "overflows", "gpu_fraction", "gpu_fraction_untraced", "gpu_busy_seconds",
    "traced_seconds", "peak_bytes_in_use", "peak_scope", "envelope", "envelope_bytes",
    "ideal_bytes", "envelope_over_ideal", "device", "jax_version", "git_commit",
)


@functools.cache
def git_commit() -> str | None:
    """The checkout's commit, with "+dirty" when tracked files differ from it; None
    outside a git checkout of this repository (a copied tree whose files differ says
    so, not a clean id; an installed copy in a virtual environment inside some other
    repository gave that repository's commit)."""
    if not (REPO / "pyproject.toml").is_file() or not (REPO / "zerognn_jax").is_dir():
        return None
    git = ["git", "-C", str(REPO)]
    try:
        head = subprocess.run([*git, "rev-parse", "HEAD"], check=True, capture_output=True,
                              text=True, timeout=10).stdout.strip()
        dirty = subprocess.run([*git, "diff", "--quiet", "HEAD", "--"], capture_output=True,
                               timeout=30).returncode != 0
    except (OSError, subprocess.SubprocessError):
        return None
    return (head + "+dirty" if dirty else head) or None


def blank_record(kind: str, name: str, options, batch_size: int | None = None) -> dict:
    """A record with every field present (None until measured) and the run's identity
    (its batch `batch_size`, default the run's)."""
    record = dict.fromkeys(FIELDS)
    cfg = options.train
    record.update(kind=kind, config=name, status="ok", dataset=cfg.dataset,
                  scale=cfg.scale, batch_size=batch_size or cfg.batch_size,
                  fanouts=list(cfg.fanouts), sampler=cfg.sampler, jax_version=jax.__version__,
                  git_commit=git_commit())
    variant = VARIANTS.get(name)
    if variant is not None:
        record.update(engine=variant.engine, kernels=variant.kernels, dedup=variant.dedup,
                      dtype=variant.dtype, xla_flags=variant.xla_flags)
    return record


def timed(fn, reps: int = 3) -> float:
    """Median seconds of `fn()` (ended by a device sync) after one warm-up call."""
    jax.block_until_ready(fn())
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        jax.block_until_ready(fn())
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


class Workbench:
    """The workload every measurement shares: data, base program, envelope, first state."""

    def __init__(self, options):
        self.options = options
        cfg = dataclasses.replace(options.train, eval_mode="none", progress=False)
        self.dataset, self.data, self.program = trainer.prepare(cfg)
        # a batch above the training items is lowered to them, as `zg.train` does
        # (`trainer.fit_batch`): the program's; the configs, the phases and the records
        # take it too (they calibrated and timed the batch asked, with its padding)
        cfg = dataclasses.replace(cfg, batch_size=self.program.batch_size)
        self.cfg = trainer.with_model(cfg, self.program.task, self.dataset)
        self.train_idx = jnp.asarray(self.dataset.train_idx, jnp.int32)
        self._calibrations = {}
        self._data = {"float32": self.data}
        self.envelope, self.calibration = self.calibrated(self.cfg.batch_size)
        self.state = init_state(self.program, self.data, self.envelope,
                                       self.dataset.train_idx)

    def fresh_state(self) -> TrainState:
        """A copy of the first state (engines donate the state they are given)."""
        return jax.tree_util.tree_map(jnp.copy, self.state)

    def _cache_key(self, batch_size: int) -> dict:  # what a cached envelope must match
        c = self.cfg
        return {"dataset": c.dataset, "scale": c.scale, "fanouts": list(c.fanouts),
                "sampler": c.sampler, "replace": c.replace, "envelope": c.envelope,
                "margin": c.margin, "multiple": c.multiple, "batch_size": batch_size,
                "seed": c.seed}

    def calibrated(self, batch_size: int):
        """(envelope, Calibration) at `batch_size`; shared through `envelope_cache` if set.

        Calibrated with every hop deduplicated, so the counts are unique nodes (what the
        bytes floor and the ideal memory count); the envelope is the calibrated one, or
        the conservative bound where `cfg.envelope` asks for it; `program_for` fits a
        variant's positional levels onto it."""
        if batch_size not in self._calibrations:
            path = self.options.envelope_cache
            path = pathlib.Path(path) if path and batch_size == self.cfg.batch_size \
                else None
            cached = _read_cache(path) if path else None
            if cached and cached.get("key") == self._cache_key(batch_size):
                env = Envelope(batch_size, tuple(cached["capacities"]))
                cal = Calibration(env, tuple(cached["max_counts"]),
                                               tuple(cached["mean_counts"]), cached["steps"])
            else:
                pick = functools.partial(
                    choose_envelope, self.data.graph, self.dataset.train_idx, batch_size,
                    self.dedup_program.sampler, seed=self.cfg.seed,
                    policy=self.cfg.envelope_policy, kernels=self.program.kernels)
                env, cal = pick()
                if self.cfg.envelope == "conservative":
                    env = pick(method="conservative")[0]
                if path:
                    with atomic_write(path, "envelope cache") as f:  # whole or not at all
                        f.write(json.dumps({
                            "key": self._cache_key(batch_size),
                            "capacities": env.capacities, "max_counts": cal.max_counts,
                            "mean_counts": cal.mean_counts, "steps": cal.steps}).encode())
            self._calibrations[batch_size] = env, cal
        return self._calibrations[batch_size]

    def data_for(self, variant: Variant) -> DeviceData:
        """The device data with the feature table in the variant's dtype."""
        if variant.dtype not in self._data:
            self._data[variant.dtype] = self.data._replace(
                features=self.data.features.astype(variant.dtype))
        return self._data[variant.dtype]

    @functools.cached_property
    def dedup_program(self):
        """The base program with every hop deduplicated (no flat outer hop)."""
        sampler = dataclasses.replace(self.program.sampler, dedup=True, flat_outer=False)
        return dataclasses.replace(self.program, sampler=sampler)

    def program_for(self, variant: Variant, batch_size: int):
        """(StepProgram, starting envelope) of a variant at `batch_size`.

        The host engines sample every hop deduplicated (`dedup_program`); their exact and
        bucketed levels are cut from it. The scan engine samples as the library would at
        `batch_size` (tree mode or dedup, `layout.choose_layout`) unless the variant sets
        `dedup`; dedup'd, its outermost hop is flat where the library makes it so.
        """
        kernels = Kernels.parse(variant.kernels)
        base = self.dedup_program
        sampler = base.sampler
        if variant.engine == "scan":
            sampler = choose_layout(self.cfg, base.task, sampler, batch_size,
                                    self.dataset.num_nodes, dedup=variant.dedup).apply(sampler)
        program = dataclasses.replace(base, batch_size=batch_size, kernels=kernels,
                                      sampler=sampler,
                                      model=self.program.model.clone(dtype=variant.dtype))
        if sampler.dedup:
            return program, sampler.fit_envelope(self.calibrated(batch_size)[0])
        return program, choose_envelope(self.data.graph, self.dataset.train_idx, batch_size,
                                        sampler)[0]

    def memory_fields(self, program, envelope) -> dict:
        """Envelope bytes against exact-size bytes at the largest calibrated counts."""
        calibration = self.calibrated(envelope.batch_size)[1]
        report = memory.memory_report(envelope, calibration.max_counts,
                                            program.sampler.slots,
                                            trainer.level_dims(self.cfg, self.dataset,
                                                               program.task))
        return {"envelope": list(envelope.levels), "envelope_bytes": report["envelope_bytes"],
                "ideal_bytes": report["ideal_bytes"], "envelope_over_ideal": report["ratio"]}


def measure(wb: Workbench, variant: Variant, *, kind: str = "config",
            batch_size: int | None = None, epochs: int | None = None,
            profile: bool = True) -> dict:
    """Times one variant: warm-up epoch, timed replays, a profiled replay; one record."""
    options = wb.options
    batch_size = batch_size or wb.cfg.batch_size
    epochs = epochs or wb.cfg.epochs
    program, env = wb.program_for(variant, batch_size)
    host = variant.engine != "scan"
    runner = make_engine(variant.engine, program, chunk_steps=wb.cfg.chunk_steps,
                         policy=wb.cfg.envelope_policy,
                         max_steps=options.host_steps if host else None,
                         sample_ahead=wb.cfg.sample_ahead,
                         read_ahead_bytes=wb.cfg.read_ahead_bytes,
                         gemm_backend=wb.cfg.gemm_backend)
    bar = tqdm(total=epochs + 1 + profile, desc=f"{variant.name} b={batch_size}",
               unit="epoch", file=sys.stderr, disable=not options.train.progress, leave=False)
    last = [None]

    def run(on_progress=None):
        state, envelope = (last[0].state, last[0].envelope) if last[0] else (
            wb.fresh_state(), env)
        last[0] = runner.run_epoch(state, wb.data_for(variant), wb.train_idx, 0, envelope,
                                   on_progress=on_progress)
        jax.block_until_ready(last[0].state.params)
        bar.update(1)

    t0 = time.perf_counter()
    run(lambda done, steps: bar.set_postfix(step=f"{done}/{steps}"))
    record = blank_record(kind, variant.name, options)
    record.update(warmup_seconds=time.perf_counter() - t0,
                  compile_seconds=runner.compile_seconds,
                  shapes_compiled=getattr(runner, "num_programs", None))
    runs = []
    for _ in range(epochs):
        compiled, t0 = runner.compile_seconds, time.perf_counter()
        run()
        runs.append(time.perf_counter() - t0 - (runner.compile_seconds - compiled))
    result, median = last[0], statistics.median(runs)
    total = num_steps(wb.train_idx.shape[0], program.global_batch)  # over every device
    scale = total / result.steps
    record.update(
        batch_size=batch_size, devices=program.num_shards,
        global_batch=program.global_batch, steps_per_epoch=total, steps_timed=result.steps,
        extrapolated=result.steps < total, epoch_seconds=median * scale,
        epoch_seconds_runs=[r * scale for r in runs], steps_per_second=result.steps / median,
        sampled_edges_per_second=result.sampled_edges / median, loss=result.loss,
        overflows=result.overflows, device=jax.devices()[0].device_kind,
        dedup=program.sampler.dedup,
        **wb.memory_fields(program, result.envelope))
    if profile:
        record.update(_profile_fields(run, variant.name, median, options.trace_dir))
    bar.close()
    return record


def _profile_fields(run, name: str, median: float, trace_dir: str | None) -> dict:
    """GPU execution fraction of one more replay (fields stay None without a device)."""
    with tempfile.TemporaryDirectory() as tmp:
        log_dir = pathlib.Path(trace_dir) / name if trace_dir else tmp
        with profiling.traced_window(log_dir):
            run()
        trace = profiling.find_trace(log_dir)
        prof = profiling.execution_fraction(trace)
        if prof is None:
            lines = "; ".join(profiling.line_names(trace))
            return {} if jax.default_backend() == "cpu" else {
                "gpu_fraction_error": f"no device stream lines; trace lines: {lines}"[:1500]}
    return {"gpu_fraction": prof["fraction"], "gpu_busy_seconds": prof["busy_seconds"],
            "traced_seconds": prof["window_seconds"],
            "gpu_fraction_untraced": prof["busy_seconds"] / median}


def check_equivalence(wb: Workbench, steps: int) -> dict:
    """The scan and host-exact engines over the first `steps` steps of epoch 0.

    The same sampled subgraphs give equal per-level counts and sampled edges at every
    step; losses agree to float rounding (the host computes on exact shapes). Both
    deduplicate every hop (the host engine cuts levels to their counts).
    """
    program, env = wb.dedup_program, wb.envelope
    total = num_steps(wb.train_idx.shape[0], program.batch_size)
    steps = min(steps, total)
    perm = epoch_items(wb.train_idx, program.batch_size, program.seed, 0)
    args = (wb.fresh_state(), wb.data, perm, chunk_scalars(0, 0, total, program.seed))
    scan = jax.device_get(ScanEngine(program).chunk_program(env, steps, args)(*args)[1])
    host = HostEngine(program, "exact")
    _, _, exact, _ = host.run_steps(wb.fresh_state(), wb.data, perm, 0, env, steps)
    rel = np.abs(scan["loss"] - exact["loss"]) / np.maximum(np.abs(scan["loss"]), 1e-12)
    record = blank_record("check", "scan-vs-host-exact", wb.options)
    record.update(steps_timed=steps, device=jax.devices()[0].device_kind,
                  counts_equal=bool(np.array_equal(scan["counts"], exact["counts"])),
                  edges_equal=bool(np.array_equal(scan["edges"], exact["edges"])),
                  loss_rel_diff_first=float(rel[0]), loss_rel_diff_max=float(rel.max()),
                  scan_overflow=bool(np.any(scan["overflow"])))
    passed = record["counts_equal"] and record["edges_equal"] and rel[0] < 1e-3 \
        and rel.max() < 1e-2
    record["status"] = "ok" if passed else "failed"
    return record


@functools.partial(jax.jit, static_argnames=("batch_size", "config", "envelope", "kernels"))
def _sample_epoch(graph, perm, seed, epoch, *, batch_size, config, envelope, kernels):
    """Sampling of every step of an epoch; returns a checksum of the sampled ids. (The
    level counts alone do not depend on the draws in tree layout, and XLA left the
    sampling out of a program that returned only them: 0.000 s an epoch.)"""

    def body(total, step):
        mb = sample_step(graph, perm, step, seed=seed, epoch=epoch, batch_size=batch_size,
                         config=config, envelope=envelope, kernels=kernels).mb
        return total + sum(jnp.sum(jnp.where(v, n, 0)) for n, v in zip(mb.nodes, mb.valid)), \
            None

    steps = perm.shape[0] // batch_size
    return jax.lax.scan(body, jnp.int32(0), jnp.arange(steps, dtype=jnp.int32))[0]


@functools.partial(jax.jit, static_argnames=("batch_size", "config", "envelope", "kernels"))
def _sample_gather_epoch(graph, features, perm, seed, epoch, *, batch_size, config,
                         envelope, kernels):
    """Sampling plus the feature gather of every step of an epoch; returns a checksum."""

    def body(total, step):
        mb = sample_step(graph, perm, step, seed=seed, epoch=epoch, batch_size=batch_size,
                         config=config, envelope=envelope, kernels=kernels).mb
        x = gather_rows(kernels, features, mb.nodes[-1], mb.valid[-1])
        return total + jnp.sum(x), None

    steps = perm.shape[0] // batch_size
    return jax.lax.scan(body, jnp.float32(0), jnp.arange(steps, dtype=jnp.int32))[0]


def copy_bandwidth(num_bytes: int) -> float:
    """Device memory bandwidth in bytes/s (read plus write) of an elementwise pass."""
    x = jax.random.uniform(jax.random.PRNGKey(0), (num_bytes // 4,), jnp.float32)
    bump = jax.jit(lambda a: a + 1.0)
    return 2 * x.nbytes / timed(lambda: bump(x), reps=5)


def step_bytes(wb: Workbench) -> dict:
    """Bytes one step must move at the mean counts, each input read once, outputs once.

    features: the outermost level's rows; csr: two offsets and f ids per sampled node;
    activations: each layer's output written, read back and its gradient written;
    optimizer: Adam reads params, grads and two moments and writes three of them.
    """
    counts = wb.calibration.mean_counts
    fanouts = wb.program.sampler.fanouts
    dims = trainer.level_dims(wb.cfg, wb.dataset, wb.program.task)
    hops = len(fanouts)
    parts = {
        "features": counts[hops] * dims[hops] * 4,
        "csr": sum(counts[h] * (8 + 4 * f) for h, f in enumerate(fanouts)),
        "activations": sum(counts[h] * dims[h] * 4 * 3 for h in range(hops)),
        "optimizer": count_params(wb.state.params) * 4 * 7,
    }
    return {k: int(v) for k, v in parts.items()}


def phase_timings(wb: Workbench) -> dict:
    """Sampling-only and sampling+gather epochs, copy bandwidth and the bytes floor."""
    program, env = wb.program, wb.envelope
    perm = epoch_items(wb.train_idx, program.batch_size, program.seed, 0)
    static = dict(batch_size=program.batch_size, config=program.sampler,
                  envelope=env, kernels=program.kernels)
    sample = timed(lambda: _sample_epoch(wb.data.graph, perm, program.seed, 0, **static))
    gather = timed(lambda: _sample_gather_epoch(
        wb.data.graph, wb.data.features, perm, program.seed, 0, **static))
    bandwidth = copy_bandwidth(1 << (30 if jax.default_backend() == "gpu" else 26))
    parts = step_bytes(wb)
    steps = num_steps(wb.train_idx.shape[0], program.batch_size)
    record = blank_record("phases", "phases", wb.options)
    record.update(device=jax.devices()[0].device_kind, steps_per_epoch=steps,
                  sample_epoch_seconds=sample, sample_gather_epoch_seconds=gather,
                  copy_bandwidth_bytes_per_second=bandwidth, bytes_per_step=parts,
                  floor_epoch_seconds=sum(parts.values()) * steps / bandwidth)
    return record


def sweep_point(wb: Workbench, name: str, batch_size: int) -> dict:
    """One point of the step-time-vs-batch-size sweep: `name` at `batch_size`, one epoch."""
    record = measure(wb, VARIANTS[name], kind="sweep", batch_size=batch_size, epochs=1,
                     profile=False)
    record["step_seconds"] = record["epoch_seconds"] / record["steps_per_epoch"]
    return record


def _read_cache(path: pathlib.Path) -> dict | None:
    """The envelope cache at `path`, or None where there is none to use (missing,
    unreadable or not a JSON object: calibrated again and written over)."""
    try:
        cached = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    keys = ("key", "capacities", "max_counts", "mean_counts", "steps")
    return cached if isinstance(cached, dict) and all(k in cached for k in keys) else None
