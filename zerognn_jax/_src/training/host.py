"""The host-mediated baseline engine.

What PyG and DGL do, with the scan engine's sampler, model, loss and optimizer: Python
drives every step. It samples (one jitted program at the envelope's capacities), reads
the per-level counts to the host (the one synchronisation that defines this engine),
cuts every level to the exact count ("host-exact": a new compile for every new shape)
or to a power-of-two bucket ("host-bucketed"), and calls a jitted train step compiled
for those sizes. Sampling is the scan engine's, keyed by the same (seed, epoch, step),
so both engines see the same subgraphs; dropout masks depend on a row's index and
not on the buffer length, so they agree too.
"""

from __future__ import annotations

import dataclasses
import functools
import time

import jax
import jax.numpy as jnp
import numpy as np

from zerognn_jax._src.sampling.envelope import DEFAULT_POLICY, Envelope, EnvelopePolicy, grow
from zerognn_jax._src.sampling.minibatch import Block, MiniBatch
from zerognn_jax._src.sampling.seeds import epoch_items, num_steps
from zerognn_jax._src.training.program import (
    DeviceData,
    StepProgram,
    TaskSample,
    TrainState,
    require_live,
    require_rows,
    sample_batch,
)
from zerognn_jax._src.training.step import (
    EpochResult,
    step_metrics,
    train_step,
    update_embedding,
)
from zerognn_jax._src.training.xla_options import check_gemm_backend, compiler_options

MODES = ("exact", "bucketed")


def level_sizes(counts, levels, mode: str) -> tuple[int, ...]:
    """Static size of every level for one step.

    Args:
      counts: real sizes (n_0, ..., n_L), none above its capacity.
      levels: capacities (B, C_1, ..., C_L).
      mode: "exact" (the counts themselves) or "bucketed" (the next power of two,
        capped at the capacity). Both keep sizes non-decreasing, as levels nest.
    """
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    sizes = []
    for count, cap in zip(counts, levels):
        count = max(int(count), 1)
        size = count if mode == "exact" else 1 << (count - 1).bit_length()
        sizes.append(min(size, int(cap)))
    return tuple(sizes)


def slice_levels(mb: MiniBatch, sizes) -> MiniBatch:
    """`mb` with level l cut to its first `sizes[l]` rows (each at least that level's count).

    Levels are prefixes of the next and padding rows are masked, so the cut batch
    computes the same logits on its real rows as the full one.
    """
    cut = lambda arrays: tuple(a[:s] for a, s in zip(arrays, sizes))
    blocks = tuple(Block(*(None if a is None else a[:s] for a in b))
                   for b, s in zip(mb.blocks, sizes))
    return MiniBatch(cut(mb.nodes), cut(mb.valid), cut(mb.degrees), blocks, mb.counts,
                     mb.overflow)


@dataclasses.dataclass(eq=False)
class HostEngine:
    """Runs epochs step by step from Python; programs are compiled per shape and cached.

    Attributes:
      program: the StepProgram (model, optimizer, sampler, kernels); one device, dedup
        sampling.
      mode: "exact" or "bucketed" (see `level_sizes`).
      max_steps: run only the first `max_steps` steps of each epoch (None: all), for
        benchmarks at scales where compiling every shape would take too long.
      policy: how the envelope grows when a step does not fit.
      compile_seconds: total time spent compiling, for every shape seen so far.
      gemm_backend: whose matrix products the programs use on a GPU (xla_options.py),
        as the scan engine's, so that the two compare on equal kernels.
    """

    program: StepProgram
    mode: str = "exact"
    max_steps: int | None = None
    policy: EnvelopePolicy = DEFAULT_POLICY
    compile_seconds: float = 0.0
    gemm_backend: str = dataclasses.field(default="cublas", kw_only=True)

    def __post_init__(self):
        check_gemm_backend(self.gemm_backend)
        if self.mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {self.mode!r}")
        if self.program.parallel is not None:
            raise ValueError("the host-mediated engine runs on one device; got a program "
                             f"over {self.program.num_shards} devices")
        if any(self.program.sampler.positional):
            raise ValueError("the host-mediated engine needs every hop deduplicated: tree "
                             "mode and a flat outer hop lay levels out in slot order, which "
                             "cutting them to their counts would break")
        self._samplers, self._steps = {}, {}

    @property
    def num_programs(self) -> int:
        """Train-step programs compiled so far (one per distinct shape)."""
        return len(self._steps)

    def _compiled(self, cache: dict, key, fn, args, **jit_kwargs):
        if key not in cache:
            t0 = time.perf_counter()
            cache[key] = jax.jit(fn, **jit_kwargs).lower(*args).compile(
                compiler_options=compiler_options(self.gemm_backend))
            self.compile_seconds += time.perf_counter() - t0
        return cache[key]

    def _sample(self, data, perm, epoch, step, *, envelope):
        return sample_batch(self.program, data, perm, step, epoch, envelope)

    def _train(self, state, data, batch, mb, drop_key, *, sizes):
        mb = slice_levels(mb, sizes)
        new_state, out = train_step(self.program, state, data, batch, mb, drop_key)
        new_state = update_embedding(self.program, new_state, out, jnp.bool_(True))
        return new_state, step_metrics(self.program, out, mb)

    def sample(self, data: DeviceData, perm, epoch: int, step: int,
               envelope: Envelope) -> TaskSample:
        """The task batch, envelope-sized minibatch and dropout key of one step
        (asynchronous, nothing read)."""
        args = (data, perm, np.int32(epoch), np.int32(step))
        fn = functools.partial(self._sample, envelope=envelope)
        return self._compiled(self._samplers, envelope.levels, fn, args)(*args)

    def _fitting_sample(self, data, perm, epoch, step, envelope):
        """Samples one step, growing the envelope until it fits; (sample, counts,
        envelope, grown)."""
        grown = 0
        while True:
            sampled = self.sample(data, perm, epoch, step, envelope)
            counts = np.asarray(sampled.mb.counts)  # the host read that defines this engine
            if np.all(counts <= np.asarray(envelope.levels)):
                return sampled, counts, envelope, grown
            envelope = grow(envelope, counts, self.policy, num_nodes=data.graph.num_nodes)
            grown += 1

    def run_steps(self, state: TrainState, data: DeviceData, perm, epoch: int,
                  envelope: Envelope, steps: int, *, on_progress=None):
        """Trains steps 0 .. steps - 1 of an epoch's padded permutation `perm`.

        Returns (state, envelope, per-step metrics as NumPy arrays, overflows). The
        metrics are read once, after the last step.
        """
        outs, overflows = [], 0
        for step in range(steps):
            sampled, counts, envelope, grown = self._fitting_sample(data, perm, epoch, step,
                                                                    envelope)
            overflows += grown
            # level 0 keeps its capacity (the task's targets have a row per seed slot);
            # the levels after it nest around it
            seen = np.maximum.accumulate([envelope.levels[0], *counts[1:]])
            sizes = level_sizes(seen, envelope.levels, self.mode)
            args = (state, data, *sampled)
            fn = functools.partial(self._train, sizes=sizes)
            step_fn = self._compiled(self._steps, (envelope.levels, sizes), fn, args,
                                     donate_argnums=0)
            state, metrics = step_fn(*args)
            outs.append(metrics)
            if on_progress is not None:
                on_progress(step + 1, steps)
        merged = {k: np.stack([m[k] for m in jax.device_get(outs)]) for k in outs[0]}
        return state, envelope, merged, overflows

    def run_epoch(self, state: TrainState, data: DeviceData, items, epoch: int,
                  envelope: Envelope, *, on_progress=None) -> EpochResult:
        """One epoch over the task's training `items` (its first `max_steps` steps if
        set), summed as the scan engine's. `state` is donated, as the scan engine's."""
        require_live(state)
        require_rows(data)
        items = jnp.asarray(items, jnp.int32)
        program = self.program
        total = num_steps(items.shape[0], program.batch_size)
        steps = total if self.max_steps is None else min(self.max_steps, total)
        perm = epoch_items(items, program.batch_size, program.seed, epoch)
        state, envelope, metrics, overflows = self.run_steps(
            state, data, perm, epoch, envelope, steps, on_progress=on_progress)
        return EpochResult.of(state, envelope, metrics, overflows=overflows, chunks=steps)
