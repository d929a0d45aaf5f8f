"""The scan engine: a chunk of training steps as one compiled XLA program.

Inside a chunk nothing returns to the host: seeds come from an on-device permutation,
sampling sizes are device scalars, and a step whose sample overflows the envelope
applies no update (nor does any later step of the chunk). Between chunks the host
reads the metrics once; after an overflow it grows the envelope, recompiles (programs
are cached per envelope) and resumes at the failed step. Sampling does not depend on
capacities, so the result equals a run that had the larger envelope all along.
"""

from __future__ import annotations

import dataclasses
import time

import jax
import jax.numpy as jnp
import numpy as np

from zerognn_jax._src.sampling.envelope import DEFAULT_POLICY, Envelope, EnvelopePolicy, grow
from zerognn_jax._src.sampling.seeds import epoch_seeds, num_steps, step_keys, step_seeds
from zerognn_jax._src.training.program import DeviceData, StepProgram, TrainState
from zerognn_jax._src.training.step import EpochResult, step_metrics, train_step


def scan_step(program: StepProgram, state: TrainState, step, data: DeviceData, perm, epoch,
              total_steps, capacities) -> tuple[TrainState, dict]:
    """One step of the scan: sample, train, and keep the update only if nothing overflowed.

    Steps at or past `total_steps` (the padding of the last chunk) change nothing.
    """
    dp = program.parallel
    batch_index = step if dp is None else dp.batch_index(step)
    items, valid = step_seeds(perm, batch_index, program.batch_size)
    active = step < total_steps
    key, drop_key = step_keys(program.seed, epoch, batch_index)
    batch, mb = program.sample(data, items, valid & active, key, capacities)
    candidate, out = train_step(program, state, data, batch, mb, drop_key)
    overflow = mb.overflow if dp is None else dp.sum(mb.overflow.astype(jnp.int32)) > 0
    bad = active & overflow
    ok = active & ~overflow & ~state.overflowed
    pick = lambda new, old: jax.tree_util.tree_map(lambda a, b: jnp.where(ok, a, b), new, old)
    new_state = TrainState(
        pick(candidate.params, state.params), pick(candidate.batch_stats, state.batch_stats),
        pick(candidate.opt_state, state.opt_state), state.overflowed | bad,
        jnp.where(bad & ~state.overflowed, step, state.failed_step))
    metrics = step_metrics(program, out, mb)
    return new_state, {**metrics, "overflow": bad, "applied": ok}


@dataclasses.dataclass(eq=False)
class ScanEngine:
    """Runs epochs as chunks of `chunk_steps` steps (0: the whole epoch) per program.

    Compiled chunk programs are cached here per (envelope, chunk length);
    `compile_seconds` adds up the time spent compiling them.
    """

    program: StepProgram
    chunk_steps: int = 0
    policy: EnvelopePolicy = DEFAULT_POLICY
    compile_seconds: float = 0.0

    def __post_init__(self):
        self._programs = {}

    def chunk_program(self, envelope: Envelope, chunk_steps: int, args):
        """The compiled chunk `(state, data, perm, epoch, start, total) -> (state, metrics)`.

        Compiled ahead of time for `args` and cached; `state` is donated. With a mesh
        the program is one SPMD program over it.
        """
        key = (envelope, chunk_steps)
        if key not in self._programs:
            program, caps = self.program, envelope.capacities

            def run(state, data, perm, epoch, start, total):
                steps = start + jnp.arange(chunk_steps, dtype=jnp.int32)
                body = lambda s, step: scan_step(program, s, step, data, perm, epoch, total,
                                                 caps)
                return jax.lax.scan(body, state, steps)

            if program.parallel is not None:
                run = program.parallel.shard_chunk(run, args[1])
            t0 = time.perf_counter()
            self._programs[key] = jax.jit(run, donate_argnums=0).lower(*args).compile()
            self.compile_seconds += time.perf_counter() - t0
        return self._programs[key]

    def _args(self, state, data, perm, epoch, start, total) -> tuple:
        scalars = (perm, jnp.int32(epoch), jnp.int32(start), jnp.int32(total))
        dp = self.program.parallel
        if dp is None:
            return (state, data, *scalars)
        dp.check_placed(data)  # moving the data every chunk would be slow
        return (dp.replicate(state), data, *dp.replicate(scalars))

    def run_epoch(self, state: TrainState, data: DeviceData, train_idx, epoch: int,
                  envelope: Envelope, *, on_progress=None) -> EpochResult:
        """Runs one epoch chunk by chunk, growing the envelope on overflow.

        `on_progress(done, total)` is called after every chunk (for progress bars). With
        a mesh, `data` must have been placed by `program.parallel.place_data`.
        """
        program = self.program
        train_idx = jnp.asarray(train_idx, jnp.int32)
        total = num_steps(train_idx.shape[0], program.global_batch)
        chunk = total if self.chunk_steps <= 0 else min(self.chunk_steps, total)
        perm = epoch_seeds(train_idx, program.global_batch, program.seed, epoch)
        start, overflows, chunks, parts = 0, 0, 0, []
        while start < total:
            args = self._args(state, data, perm, epoch, start, total)
            state, metrics = self.chunk_program(envelope, chunk, args)(*args)
            metrics, overflowed, failed = jax.device_get((metrics, state.overflowed,
                                                          state.failed_step))
            chunks += 1
            parts.append({k: v[metrics["applied"]] for k, v in metrics.items()})
            if overflowed:
                overflows += 1
                envelope = grow(envelope, metrics["counts"][failed - start], self.policy)
                state = state._replace(overflowed=jnp.array(False), failed_step=jnp.int32(0))
                start = int(failed)
            else:
                start += chunk
            if on_progress is not None:
                on_progress(min(start, total), total)
        merged = {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}
        return EpochResult.of(state, envelope, merged, overflows=overflows, chunks=chunks)
