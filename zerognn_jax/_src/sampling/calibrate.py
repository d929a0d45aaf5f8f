"""Calibration: choosing a tight envelope from the real batches of the first epoch(s).

Sampling runs alone, as one device scan per epoch, under the conservative envelope (so
every count is exact); the host reads the counts once per epoch. `choose_envelope` is
the one place that picks a run's starting envelope.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np

from zerognn_jax._src.data.graph import CSRGraph
from zerognn_jax._src.ops.registry import XLA, Kernels
from zerognn_jax._src.sampling.envelope import (
    DEFAULT_POLICY,
    Envelope,
    EnvelopePolicy,
    conservative,
    monotone,
)
from zerognn_jax._src.sampling.minibatch import SamplerConfig, sample_minibatch, tree_sizes
from zerognn_jax._src.sampling.seeds import epoch_seeds, step_keys, step_seeds


@functools.partial(jax.jit, static_argnames=("batch_size", "config", "capacities", "kernels"))
def sample_epoch_counts(graph, perm, seed, epoch, *, batch_size, config, capacities, kernels):
    """Samples every step of one epoch in one scan; returns per-step statistics.

    Returns (counts int32[steps, L + 1], edges int32[steps], overflow bool[steps]).
    """
    steps = perm.shape[0] // batch_size

    def body(_, step):
        seeds, valid = step_seeds(perm, step, batch_size)
        key, _ = step_keys(seed, epoch, step)
        mb = sample_minibatch(graph, seeds, valid, key, config, capacities, kernels)
        return None, (mb.counts, mb.num_edges(), mb.overflow)

    _, out = jax.lax.scan(body, None, jnp.arange(steps, dtype=jnp.int32))
    return out


@dataclasses.dataclass(frozen=True)
class Calibration:
    """What calibration saw: per level (B, C_1, ..., C_L), the max and mean real sizes."""

    envelope: Envelope
    max_counts: tuple[int, ...]
    mean_counts: tuple[float, ...]
    steps: int


def calibrate(
    graph: CSRGraph,
    train_idx,
    batch_size: int,
    config: SamplerConfig,
    *,
    seed: int = 0,
    epochs: int = 1,
    policy: EnvelopePolicy = DEFAULT_POLICY,
    kernels: Kernels = XLA,
) -> Calibration:
    """Chooses tight capacities from the real batches of the first `epochs` epochs.

    Sampling runs on the device under the conservative envelope (so every count is
    exact); the host reads the counts once per epoch.
    """
    train_idx = jnp.asarray(train_idx, jnp.int32)
    safe = conservative(batch_size, config.slots, graph.num_nodes, policy)
    all_counts = []
    for epoch in range(epochs):
        perm = epoch_seeds(train_idx, batch_size, seed, epoch)
        counts, _, _ = sample_epoch_counts(
            graph, perm, seed, epoch, batch_size=batch_size, config=config,
            capacities=safe.capacities, kernels=kernels,
        )
        all_counts.append(np.asarray(counts))
    counts = np.concatenate(all_counts)
    max_counts = counts.max(axis=0)
    env = monotone(batch_size, [m * policy.margin for m in max_counts[1:]], policy.multiple)
    env = Envelope(batch_size, tuple(min(c, s) for c, s in zip(env.capacities, safe.capacities)))
    return Calibration(
        env, tuple(int(m) for m in max_counts), tuple(float(m) for m in counts.mean(axis=0)),
        int(counts.shape[0]),
    )


def choose_envelope(graph: CSRGraph, train_idx, batch_size: int, config: SamplerConfig, *,
                    method: str = "calibrate", seed: int = 0,
                    policy: EnvelopePolicy = DEFAULT_POLICY,
                    kernels: Kernels = XLA) -> tuple[Envelope, Calibration | None]:
    """A run's starting envelope, and the calibration record when it was calibrated.

    Tree (no-dedup) sampling has exact sizes; otherwise `method` is "calibrate" (tight,
    measured) or "conservative" (the safe bound).
    """
    if not config.dedup:
        return Envelope(batch_size, tree_sizes(batch_size, config.slots)[1:]), None
    if method == "conservative":
        return conservative(batch_size, config.slots, graph.num_nodes, policy), None
    if method != "calibrate":
        raise ValueError(f"envelope must be calibrate or conservative, got {method!r}")
    cal = calibrate(graph, train_idx, batch_size, config, seed=seed, policy=policy,
                    kernels=kernels)
    return cal.envelope, cal
