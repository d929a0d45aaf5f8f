"""The host-mediated baseline, and `make_runner`, which picks a training engine by name.

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
import optax

from zerognn_jax._src import engine
from zerognn_jax._src import envelope as envelope_lib
from zerognn_jax._src.sampler import Block, MiniBatch, sample_minibatch

ENGINES = ("scan", "host-exact", "host-bucketed")
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
    blocks = tuple(Block(b.nbr[:s], b.mask[:s]) for b, s in zip(mb.blocks, sizes))
    return MiniBatch(cut(mb.nodes), cut(mb.valid), cut(mb.degrees), blocks, mb.counts,
                     mb.overflow)


def _metrics(loss, logits, labels, weight, mb) -> dict:
    seen = jnp.sum(weight)
    return {"loss": loss, "correct": jnp.sum((jnp.argmax(logits, -1) == labels) * weight),
            "seeds": seen, "counts": mb.counts,
            "edges": sum(jnp.sum(b.mask.astype(jnp.int32)) for b in mb.blocks)}


@dataclasses.dataclass(eq=False)
class HostEngine:
    """Runs epochs step by step from Python; programs are compiled per shape and cached.

    Attributes:
      program: the scan engine's StepProgram (model, optimizer, sampler, kernels);
        one device, dedup sampling.
      mode: "exact" or "bucketed" (see `level_sizes`).
      max_steps: run only the first `max_steps` steps of each epoch (None: all), for
        benchmarks at scales where compiling every shape would take too long.
      compile_seconds: total time spent compiling, for every shape seen so far.
    """

    program: engine.StepProgram
    mode: str = "exact"
    max_steps: int | None = None
    compile_seconds: float = 0.0

    def __post_init__(self):
        if self.mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {self.mode!r}")
        if self.program.num_shards != 1 or self.program.mesh is not None:
            raise ValueError("the host-mediated engine runs on one device; got a program "
                             f"over {self.program.num_shards} shards")
        if not self.program.sampler.dedup:
            raise ValueError("the host-mediated engine needs dedup sampling: tree-mode "
                             "levels are not prefixes, so they cannot be cut to their counts")
        self._samplers, self._steps = {}, {}

    @property
    def num_programs(self) -> int:
        """Train-step programs compiled so far (one per distinct shape)."""
        return len(self._steps)

    def _compiled(self, cache: dict, key, fn, args, **jit_kwargs):
        if key not in cache:
            t0 = time.perf_counter()
            cache[key] = jax.jit(fn, **jit_kwargs).lower(*args).compile()
            self.compile_seconds += time.perf_counter() - t0
        return cache[key]

    def _sample(self, graph, perm, epoch, step, *, capacities):
        program = self.program
        seeds, valid = envelope_lib.step_seeds(perm, step, program.batch_size)
        key, _ = engine.step_keys(program.seed, epoch, step)
        return sample_minibatch(graph, seeds, valid, key, program.sampler, capacities,
                                program.kernels)

    def _train(self, state, data, mb, epoch, step, *, sizes):
        program = self.program
        mb = slice_levels(mb, sizes)
        _, drop_key = engine.step_keys(program.seed, epoch, step)
        labels = data.labels[mb.nodes[0]]
        weight = mb.valid[0].astype(jnp.float32)

        def loss_fn(params):
            variables = {"params": params, "batch_stats": state.batch_stats}
            logits, new_vars = program.apply_model(variables, data, mb, train=True,
                                                   dropout_key=drop_key)
            return engine.masked_cross_entropy(logits, labels, weight), (logits, new_vars)

        (loss, (logits, new_vars)), grads = jax.value_and_grad(loss_fn, has_aux=True)(
            state.params)
        updates, opt_state = program.tx.update(grads, state.opt_state, state.params)
        new_state = state._replace(
            params=optax.apply_updates(state.params, updates), opt_state=opt_state,
            batch_stats=new_vars.get("batch_stats", state.batch_stats))
        return new_state, _metrics(loss, logits, labels, weight, mb)

    def sample(self, data: engine.DeviceData, perm, epoch: int, step: int,
               envelope: envelope_lib.Envelope) -> MiniBatch:
        """The envelope-sized minibatch of one step (asynchronous, nothing read)."""
        args = (data.graph, perm, np.int32(epoch), np.int32(step))
        fn = functools.partial(self._sample, capacities=envelope.capacities)
        return self._compiled(self._samplers, envelope.capacities, fn, args)(*args)

    def _fitting_sample(self, data, perm, epoch, step, envelope, margin, multiple):
        """Samples one step, growing the envelope until it fits; (mb, counts, envelope, grown)."""
        grown = 0
        while True:
            mb = self.sample(data, perm, epoch, step, envelope)
            counts = np.asarray(mb.counts)  # the host read that defines this engine
            if np.all(counts <= np.asarray(envelope.levels)):
                return mb, counts, envelope, grown
            envelope = envelope_lib.grow(envelope, counts, margin=margin, multiple=multiple)
            grown += 1

    def run_steps(self, state: engine.TrainState, data: engine.DeviceData, perm, epoch: int,
                  envelope: envelope_lib.Envelope, steps: int, *, margin: float = 1.1,
                  multiple: int = 128, on_step=None):
        """Trains steps 0 .. steps - 1 of an epoch's padded permutation `perm`.

        Returns (state, envelope, per-step metrics as NumPy arrays, overflows). The
        metrics are read once, after the last step.
        """
        outs, overflows = [], 0
        for step in range(steps):
            mb, counts, envelope, grown = self._fitting_sample(data, perm, epoch, step,
                                                               envelope, margin, multiple)
            overflows += grown
            sizes = level_sizes(counts, envelope.levels, self.mode)
            args = (state, data, mb, np.int32(epoch), np.int32(step))
            fn = functools.partial(self._train, sizes=sizes)
            step_fn = self._compiled(self._steps, (envelope.capacities, sizes), fn, args,
                                     donate_argnums=0)
            state, metrics = step_fn(*args)
            outs.append(metrics)
            if on_step is not None:
                on_step(step + 1, steps)
        merged = {k: np.stack([m[k] for m in jax.device_get(outs)]) for k in outs[0]}
        return state, envelope, merged, overflows

    def run_epoch(self, state: engine.TrainState, data: engine.DeviceData, train_idx,
                  epoch: int, envelope: envelope_lib.Envelope, *, margin: float = 1.1,
                  multiple: int = 128, on_step=None) -> engine.EpochResult:
        """One epoch (its first `max_steps` steps if set); the scan engine's EpochResult."""
        train_idx = jnp.asarray(train_idx, jnp.int32)
        program = self.program
        total = envelope_lib.num_steps(train_idx.shape[0], program.batch_size)
        steps = total if self.max_steps is None else min(self.max_steps, total)
        perm = envelope_lib.epoch_seeds(train_idx, program.batch_size, program.seed, epoch)
        state, envelope, m, overflows = self.run_steps(
            state, data, perm, epoch, envelope, steps, margin=margin, multiple=multiple,
            on_step=on_step)
        seeds = max(float(m["seeds"].sum()), 1.0)
        return engine.EpochResult(
            state=state, envelope=envelope,
            loss=float((m["loss"] * m["seeds"]).sum() / seeds),
            train_acc=float(m["correct"].sum() / seeds), steps=steps, overflows=overflows,
            max_counts=tuple(int(c) for c in m["counts"].max(axis=0)),
            sampled_edges=int(m["edges"].sum()), chunks=steps)


@dataclasses.dataclass(eq=False)
class ScanRunner:
    """The scan engine behind the interface `HostEngine` offers (`run_epoch`, compile time)."""

    program: engine.StepProgram
    chunk_steps: int = 0

    @property
    def compile_seconds(self) -> float:
        return self.program.compile_seconds

    def run_epoch(self, state, data, train_idx, epoch, envelope, *, margin: float = 1.1,
                  multiple: int = 128, on_step=None) -> engine.EpochResult:
        return engine.run_epoch(self.program, state, data, train_idx, epoch, envelope,
                                chunk_steps=self.chunk_steps, margin=margin,
                                multiple=multiple, on_chunk=on_step)


def make_runner(name: str, program: engine.StepProgram, *, chunk_steps: int = 0,
                max_steps: int | None = None):
    """The engine called `name` ("scan", "host-exact" or "host-bucketed") for `program`."""
    if name == "scan":
        return ScanRunner(program, chunk_steps)
    if name in ("host-exact", "host-bucketed"):
        return HostEngine(program, name.removeprefix("host-"), max_steps)
    raise ValueError(f"unknown engine {name!r}; choose one of {', '.join(ENGINES)}")
