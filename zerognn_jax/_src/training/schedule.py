"""The built-in optimizer of a run: Adam (or AdamW) at a learning rate that may warm up
and follow a cosine, with the gradient's global norm clipped on request.

A schedule counts optimizer steps, so a run's rate is fixed once its steps per epoch are
known (its training items over the global batch); learnable embedding rows, stepped by
lazy Adam outside the optimizer, take the same rate at the same step.
"""

from __future__ import annotations

import dataclasses
import math

import jax.numpy as jnp
import optax

from zerognn_jax._src.sampling.seeds import num_steps
from zerognn_jax._src.training.parallel import run_shards

SCHEDULES = ("constant", "cosine")


@dataclasses.dataclass(frozen=True)
class StepSize:
    """A learning rate by step; static (hashable), called with the count of updates
    before the step (0 at the first, as optax's schedules are).

    Attributes:
      peak: the rate after warmup. kind: "constant" (then `peak`) or "cosine" (from
        `peak` down to 0 at step `total`). warmup: steps rising linearly to `peak`, the
        first at peak / warmup. total: the run's steps (its epochs').
    """

    peak: float
    kind: str = "constant"
    warmup: int = 0
    total: int = 0

    def __call__(self, count) -> jnp.ndarray:
        t = jnp.asarray(count, jnp.float32)
        rate = jnp.asarray(self.peak, jnp.float32)
        if self.kind == "cosine":
            done = jnp.clip((t - self.warmup) / max(self.total - self.warmup, 1), 0.0, 1.0)
            rate = rate * 0.5 * (1.0 + jnp.cos(math.pi * done))
        if self.warmup:
            rate = rate * jnp.minimum((t + 1.0) / self.warmup, 1.0)
        return rate


def epoch_steps(cfg, task, dataset) -> int:
    """Steps in one of the run's epochs: the task's training items over the global batch
    (`cfg.batch_size` on each of `cfg.devices` devices of every process)."""
    return num_steps(len(task.train_items(dataset)), cfg.batch_size * run_shards(cfg.devices))


def step_size(cfg, task, dataset) -> float | StepSize:
    """The run's learning rate: `cfg.lr` itself where it stays constant from the first
    step (the optimizer is then the one runs had before schedules), else its `StepSize`
    over the run's steps."""
    if cfg.lr_schedule == "constant" and not cfg.warmup_epochs:
        return cfg.lr
    steps = epoch_steps(cfg, task, dataset)
    return StepSize(cfg.lr, cfg.lr_schedule, cfg.warmup_epochs * steps, cfg.epochs * steps)


def make_optimizer(cfg, rate: float | StepSize | None = None) -> optax.GradientTransformation:
    """The built-in optimizer of the run `cfg` (a `TrainConfig`) at `rate` (None:
    `cfg.lr`): Adam, with L2 weight decay on every parameter added to the gradient,
    or AdamW's decoupled decay (`decoupled_weight_decay`); the gradient first clipped to
    a global norm of `grad_clip` where set (the model's parameters': learnable embedding
    rows are stepped apart, by lazy Adam, unclipped). A schedule is injected, so that
    the state holds the rate of each step (the epoch records' `learning_rate`)."""
    rate = cfg.lr if rate is None else rate
    decoupled = bool(cfg.decoupled_weight_decay and cfg.weight_decay)
    base = optax.adamw if decoupled else optax.adam
    decay = {"weight_decay": cfg.weight_decay} if decoupled else {}
    adam = optax.inject_hyperparams(base)(learning_rate=rate, **decay) \
        if callable(rate) else base(rate, **decay)
    parts = [optax.clip_by_global_norm(cfg.grad_clip)] if cfg.grad_clip else []
    if cfg.weight_decay and not decoupled:
        parts.append(optax.add_decayed_weights(cfg.weight_decay))
    return optax.chain(*parts, adam) if parts else adam


def peak_rate(rate: float | StepSize) -> float:
    """The largest rate of `rate` (a number, or a `StepSize`'s peak)."""
    return rate.peak if isinstance(rate, StepSize) else rate
