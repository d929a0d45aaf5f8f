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
from typing import Any, NamedTuple

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax

from zerognn_jax._src import envelope as envelope_lib
from zerognn_jax._src import kernels as kernels_lib
from zerognn_jax._src import parallel, rng
from zerognn_jax._src.blocks import EllView
from zerognn_jax._src.graph import CSRGraph
from zerognn_jax._src.sampler import MiniBatch, SamplerConfig, sample_minibatch


class DeviceData(NamedTuple):
    """Everything a step reads, on the device: graph, float[N, d] features, int32[N] labels."""

    graph: CSRGraph
    features: jax.Array
    labels: jax.Array


class TrainState(NamedTuple):
    """The scan carry.

    Attributes:
      params, batch_stats: model variables; opt_state: optax state.
      overflowed: bool scalar, a step of this chunk overflowed (no updates since).
      failed_step: int32 scalar, the first step that overflowed (valid if overflowed).
    """

    params: Any
    batch_stats: Any
    opt_state: Any
    overflowed: jax.Array
    failed_step: jax.Array


def views_for(mb: MiniBatch, kernels: kernels_lib.Kernels) -> tuple[EllView, ...]:
    """One EllView per layer, outermost hop first (layer i reads block L - 1 - i)."""
    num_hops = len(mb.blocks)
    views = []
    for i in range(num_hops):
        hop = num_hops - 1 - i
        block = mb.blocks[hop]
        views.append(EllView(block.nbr, block.mask, mb.valid[hop], mb.degrees[hop],
                             mb.degrees[hop + 1], kernels))
    return tuple(views)


def step_keys(seed: int, epoch, batch_index) -> tuple[jax.Array, jax.Array]:
    """(sampling key, dropout key) of one batch index; every engine derives them here."""
    key = rng.step_key(seed, epoch, batch_index, 0)
    drop_key = jax.random.fold_in(jax.random.fold_in(jax.random.PRNGKey(seed), epoch),
                                  batch_index)
    return key, drop_key


def masked_cross_entropy(logits, labels, weight) -> jax.Array:
    """Mean softmax cross-entropy over the rows whose float `weight` is 1."""
    ce = optax.softmax_cross_entropy_with_integer_labels(logits, labels)
    return jnp.sum(ce * weight) / jnp.maximum(jnp.sum(weight), 1.0)


@dataclasses.dataclass(frozen=True, eq=False)
class StepProgram:
    """The pieces a step needs that are not arrays; builds and caches chunk programs."""

    model: nn.Module
    tx: optax.GradientTransformation
    sampler: SamplerConfig
    batch_size: int
    seed: int
    kernels: kernels_lib.Kernels = kernels_lib.XLA
    axis_name: str | None = None
    num_shards: int = 1
    mesh: jax.sharding.Mesh | None = None
    shard_features: bool = False

    @property
    def global_batch(self) -> int:
        """Seeds per step over all data-parallel shards."""
        return self.batch_size * self.num_shards

    def _shard_reduce(self, fn, tree):
        return jax.tree_util.tree_map(lambda x: fn(x, self.axis_name), tree) \
            if self.axis_name else tree

    def __post_init__(self):
        object.__setattr__(self, "_programs", {})
        object.__setattr__(self, "compile_seconds", 0.0)

    def forward(self, variables, data: DeviceData, seeds, valid, key, capacities, *,
                train: bool, dropout_key=None):
        """Samples around `seeds` and runs the model; returns (logits, new_vars, minibatch)."""
        mb = sample_minibatch(data.graph, seeds, valid, key, self.sampler, capacities,
                              self.kernels)
        logits, new_vars = self.apply_model(variables, data, mb, train=train,
                                            dropout_key=dropout_key)
        return logits, new_vars, mb

    def apply_model(self, variables, data: DeviceData, mb: MiniBatch, *, train: bool,
                    dropout_key=None):
        """Gathers the outermost level's features and runs the model; (logits, new_vars).

        Shapes follow `mb`: the scan engine passes envelope-sized levels, the host
        engine (host_engine.py) levels cut to their real or bucketed sizes.
        """
        if self.shard_features:
            x = parallel.gather_sharded_rows(self.kernels, data.features, mb.nodes[-1],
                                             mb.valid[-1], self.axis_name)
        else:
            x = kernels_lib.gather_rows(self.kernels, data.features, mb.nodes[-1],
                                        mb.valid[-1])
        views = views_for(mb, self.kernels)
        mutable = ["batch_stats"] if train and variables.get("batch_stats") else False
        rngs = {"dropout": dropout_key} if train else {}
        out = self.model.apply(variables, x, views, train=train, rngs=rngs, mutable=mutable)
        return out if mutable else (out, {})

    def _step(self, state: TrainState, step, data, perm, epoch, num_steps, capacities):
        # Shard d of D takes batch index step * D + d (of size B) from the permutation
        # padded for the global batch: its seeds and its random stream are exactly those
        # of that batch index in a one-device run with batch size B.
        shard = jax.lax.axis_index(self.axis_name) if self.axis_name else 0
        batch_index = step * self.num_shards + shard
        seeds, valid = envelope_lib.step_seeds(perm, batch_index, self.batch_size)
        active = step < num_steps
        valid = valid & active
        key, drop_key = step_keys(self.seed, epoch, batch_index)
        labels = data.labels[seeds]
        weight = valid.astype(jnp.float32)

        def loss_fn(params):
            variables = {"params": params, "batch_stats": state.batch_stats}
            logits, new_vars, mb = self.forward(variables, data, seeds, valid, key, capacities,
                                                train=True, dropout_key=drop_key)
            return masked_cross_entropy(logits, labels, weight), (logits, new_vars, mb)

        (loss, (logits, new_vars, mb)), grads = jax.value_and_grad(loss_fn, has_aux=True)(
            state.params)
        grads = self._shard_reduce(jax.lax.pmean, grads)
        overflow = self._shard_reduce(jax.lax.psum, mb.overflow.astype(jnp.int32)) > 0
        updates, opt_state = self.tx.update(grads, state.opt_state, state.params)
        params = optax.apply_updates(state.params, updates)
        batch_stats = self._shard_reduce(jax.lax.pmean,
                                         new_vars.get("batch_stats", state.batch_stats))
        bad = active & overflow
        ok = active & ~overflow & ~state.overflowed
        pick = lambda new, old: jax.tree_util.tree_map(lambda a, b: jnp.where(ok, a, b), new, old)
        new_state = TrainState(
            pick(params, state.params), pick(batch_stats, state.batch_stats),
            pick(opt_state, state.opt_state), state.overflowed | bad,
            jnp.where(bad & ~state.overflowed, step, state.failed_step),
        )
        correct = jnp.sum((jnp.argmax(logits, -1) == labels) * weight)
        edges = sum(jnp.sum(b.mask.astype(jnp.int32)) for b in mb.blocks)
        seen = jnp.sum(weight)
        loss_sum, correct, seen, edges = self._shard_reduce(
            jax.lax.psum, (loss * seen, correct, seen, edges))
        metrics = {"loss": loss_sum / jnp.maximum(seen, 1.0), "correct": correct,
                   "seeds": seen, "counts": self._shard_reduce(jax.lax.pmax, mb.counts),
                   "edges": edges, "overflow": bad, "applied": ok}
        return new_state, metrics

    def chunk_program(self, envelope: envelope_lib.Envelope, chunk_steps: int, args):
        """The compiled chunk `(state, data, perm, epoch, start, num_steps) -> (state, metrics)`.

        Compiled ahead of time for `args` and cached per (envelope, chunk length); `state`
        is donated. Compilation time accumulates in `self.compile_seconds`. With a mesh
        the program is one SPMD program over it (`parallel.shard_chunk`).
        """
        key = (envelope, chunk_steps)
        if key not in self._programs:
            caps = envelope.capacities

            def run(state, data, perm, epoch, start, num_steps):
                steps = start + jnp.arange(chunk_steps, dtype=jnp.int32)
                body = lambda s, step: self._step(s, step, data, perm, epoch, num_steps, caps)
                return jax.lax.scan(body, state, steps)

            if self.mesh is not None:
                run = parallel.shard_chunk(run, self, args[1])
            t0 = time.perf_counter()
            self._programs[key] = jax.jit(run, donate_argnums=0).lower(*args).compile()
            object.__setattr__(self, "compile_seconds",
                               self.compile_seconds + time.perf_counter() - t0)
        return self._programs[key]


def init_state(program: StepProgram, data: DeviceData, envelope: envelope_lib.Envelope,
               train_idx) -> TrainState:
    """Initialises model variables on a real first batch, and the optimizer.

    With a mesh the state comes back replicated on it.
    """
    perm = envelope_lib.epoch_seeds(jnp.asarray(train_idx, jnp.int32), program.global_batch,
                                    program.seed, 0)

    def init(data, perm):
        seeds, valid = envelope_lib.step_seeds(perm, 0, program.batch_size)
        key = rng.step_key(program.seed, 0, 0, 0)
        mb = sample_minibatch(data.graph, seeds, valid, key, program.sampler,
                              envelope.capacities, program.kernels)
        x = kernels_lib.gather_rows(program.kernels, data.features, mb.nodes[-1], mb.valid[-1])
        init_key = jax.random.PRNGKey(program.seed)
        return program.model.init({"params": init_key, "dropout": init_key}, x,
                                  views_for(mb, program.kernels), train=False)

    variables = jax.jit(init)(data, perm)
    params = variables["params"]
    batch_stats = variables.get("batch_stats", {})
    state = TrainState(params, batch_stats, program.tx.init(params), jnp.array(False),
                       jnp.array(0, jnp.int32))
    return state if program.mesh is None else parallel.replicate(state, program.mesh)


@dataclasses.dataclass
class EpochResult:
    """Host-side summary of one epoch."""

    state: TrainState
    envelope: envelope_lib.Envelope
    loss: float
    train_acc: float
    steps: int
    overflows: int
    max_counts: tuple[int, ...]
    sampled_edges: int
    chunks: int


def run_epoch(program: StepProgram, state: TrainState, data: DeviceData, train_idx,
              epoch: int, envelope: envelope_lib.Envelope, *, chunk_steps: int = 0,
              margin: float = 1.1, multiple: int = 128, on_chunk=None) -> EpochResult:
    """Runs one epoch chunk by chunk, growing the envelope on overflow.

    `chunk_steps=0` runs the whole epoch as one program. `on_chunk(done, total)` is
    called after every chunk (for progress bars). With a mesh, `data` must have been
    placed by `parallel.place_data`.
    """
    train_idx = jnp.asarray(train_idx, jnp.int32)
    total = envelope_lib.num_steps(train_idx.shape[0], program.global_batch)
    chunk = total if chunk_steps <= 0 else min(chunk_steps, total)
    perm = envelope_lib.epoch_seeds(train_idx, program.global_batch, program.seed, epoch)
    start, overflows, chunks, parts = 0, 0, 0, []
    while start < total:
        args = (state, data, perm, jnp.int32(epoch), jnp.int32(start), jnp.int32(total))
        if program.mesh is not None:
            args = parallel.place_args(program, args)
        state, metrics = program.chunk_program(envelope, chunk, args)(*args)
        metrics, overflowed, failed = jax.device_get((metrics, state.overflowed,
                                                      state.failed_step))
        chunks += 1
        applied = metrics["applied"]
        parts.append({k: v[applied] for k, v in metrics.items()})
        if overflowed:
            overflows += 1
            envelope = envelope_lib.grow(envelope, metrics["counts"][failed - start],
                                         margin=margin, multiple=multiple)
            state = state._replace(overflowed=jnp.array(False), failed_step=jnp.int32(0))
            start = int(failed)
        else:
            start += chunk
        if on_chunk is not None:
            on_chunk(min(start, total), total)
    merged = {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}
    seeds = max(float(merged["seeds"].sum()), 1.0)
    return EpochResult(
        state=state, envelope=envelope,
        loss=float((merged["loss"] * merged["seeds"]).sum() / seeds),
        train_acc=float(merged["correct"].sum() / seeds), steps=int(merged["loss"].shape[0]),
        overflows=overflows,
        max_counts=tuple(int(c) for c in merged["counts"].max(axis=0)),
        sampled_edges=int(merged["edges"].sum()), chunks=chunks,
    )
