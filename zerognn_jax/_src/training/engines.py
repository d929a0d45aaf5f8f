"""The training engines by name: the scan engine and the host-mediated baselines."""

from __future__ import annotations

from zerognn_jax._src.sampling.envelope import DEFAULT_POLICY, EnvelopePolicy
from zerognn_jax._src.training.host import HostEngine
from zerognn_jax._src.training.program import StepProgram
from zerognn_jax._src.training.scan import ScanEngine

ENGINES = ("scan", "host-exact", "host-bucketed")


def make_engine(name: str, program: StepProgram, *, chunk_steps: int = 0,
                max_steps: int | None = None,
                policy: EnvelopePolicy = DEFAULT_POLICY,
                sample_ahead: int | None = 1,
                read_ahead_bytes: int | None = None,
                gemm_backend: str = "cublas") -> ScanEngine | HostEngine:
    """The engine called `name` for `program`; `chunk_steps` (the steps one compiled
    program runs; 0: the whole epoch), `sample_ahead` and `read_ahead_bytes` apply to
    the scan engine (None: its defaults for the data and the device, `steps_ahead`,
    `read_ahead_limit`), `max_steps` (the first steps of each epoch alone; None: all)
    to the host engines, `policy` (the envelope's margin and growth) and
    `gemm_backend` (xla_options.py) to both.

    Every engine offers `run_epoch(state, data, items, epoch, envelope,
    on_progress=None) -> EpochResult` and `compile_seconds`.
    """
    if name == "scan":
        return ScanEngine(program, chunk_steps, policy, sample_ahead=sample_ahead,
                          gemm_backend=gemm_backend, read_ahead_bytes=read_ahead_bytes)
    if name in ("host-exact", "host-bucketed"):
        return HostEngine(program, name.removeprefix("host-"), max_steps, policy,
                          gemm_backend=gemm_backend)
    raise ValueError(f"unknown engine {name!r}; choose one of {', '.join(ENGINES)}")
