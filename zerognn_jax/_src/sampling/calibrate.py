"""Calibration: choosing a tight envelope from the real batches of the first epoch(s).

Sampling runs alone, as one device scan per epoch, under the conservative envelope (so
every count is exact); the host reads the counts once per epoch. `choose_envelope` is
the one place that picks a run's starting envelope.

Level 0 is built by a `SeedSource` (steps.py). For node tasks (`ITEM_SEEDS`, the
default) it is the batch's items (capacity B). A task that builds its own seed frontier
per step (link prediction: the deduplicated endpoints of the positive and negative
pairs) is its own seed source, of a safe size S (`seed_capacity`); level 0 is then
calibrated like every other level.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from zerognn_jax._src.data.checks import at_least_one, require_ids
from zerognn_jax._src.data.graph import CSRGraph
from zerognn_jax._src.ops.jitting import jit_per_object
from zerognn_jax._src.ops.registry import XLA, Kernels
from zerognn_jax._src.sampling.envelope import (
    DEFAULT_POLICY,
    Envelope,
    EnvelopePolicy,
    conservative,
    monotone,
    round_up,
)
from zerognn_jax._src.sampling.minibatch import SamplerConfig, tree_sizes
from zerognn_jax._src.sampling.seeds import epoch_items
from zerognn_jax._src.sampling.steps import ITEM_SEEDS, SeedSource, sample_step


def sample_epoch_counts(graph, perm, seed, epoch, *, batch_size, config, envelope, kernels,
                        source: SeedSource = ITEM_SEEDS):
    """Samples every step of one epoch in one scan; returns per-step statistics.

    `source` (static) builds each step's level 0 from its items (module docstring); the
    scan is jitted per source, a run's task, and freed with it (`jit_per_object`).
    Returns (counts int32[steps, L + 1], edges int32[steps], overflow bool[steps]).
    """
    return _epoch_counts(source, graph, perm, seed, epoch, batch_size=batch_size,
                         config=config, envelope=envelope, kernels=kernels)


@jit_per_object(static_argnames=("batch_size", "config", "envelope", "kernels"))
def _epoch_counts(source, graph, perm, seed, epoch, *, batch_size, config, envelope, kernels):
    steps = perm.shape[0] // batch_size

    def body(_, step):
        mb = sample_step(graph, perm, step, seed=seed, epoch=epoch, batch_size=batch_size,
                         config=config, envelope=envelope, kernels=kernels,
                         source=source).mb
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
    items,
    batch_size: int,
    config: SamplerConfig,
    *,
    seed: int = 0,
    epochs: int = 1,
    policy: EnvelopePolicy = DEFAULT_POLICY,
    kernels: Kernels = XLA,
    source: SeedSource = ITEM_SEEDS,
) -> Calibration:
    """Chooses tight capacities from the real batches of the first `epochs` epochs.

    Sampling runs on the device under the conservative envelope (so every count is
    exact); the host reads the counts once per epoch. With a deduplicating `source`
    (module docstring) level 0 is calibrated too: `Calibration.envelope.batch_size` is
    then the seed frontier's capacity, not `batch_size` (the items per step).
    """
    epochs, batch_size = at_least_one(epochs, "epochs"), at_least_one(batch_size, "batch_size")
    given = np.asarray(items)
    if source is ITEM_SEEDS:  # node ids (a boolean mask was read as ids 0 and 1)
        require_ids("items", given)
        if given.size and (given.min() < 0 or given.max() >= graph.num_nodes):
            raise ValueError(f"items must be node ids in [0, {graph.num_nodes}), found "
                             f"[{given.min()}, {given.max()}]")
    items = jnp.asarray(items, jnp.int32)
    level0 = source.seed_capacity(batch_size)
    safe = conservative(level0, config.slots, graph.num_nodes, policy)
    all_counts = []
    for epoch in range(epochs):
        perm = epoch_items(items, batch_size, seed, epoch)
        counts, _, _ = sample_epoch_counts(
            graph, perm, seed, epoch, batch_size=batch_size, config=config,
            envelope=safe, kernels=kernels, source=source,
        )
        all_counts.append(np.asarray(counts))
    counts = np.concatenate(all_counts)
    max_counts = counts.max(axis=0)
    if source.dedups_seeds:  # else level 0 holds the step's items: B rows, always
        level0 = min(level0, round_up(max(max_counts[0], 1) * policy.margin, policy.multiple))
    env = monotone(level0, [m * policy.margin for m in max_counts[1:]], policy.multiple)
    caps = tuple(max(min(c, s), level0) for c, s in zip(env.capacities, safe.capacities))
    env = config.fit_envelope(Envelope(level0, caps))
    return Calibration(
        env, tuple(int(m) for m in max_counts), tuple(float(m) for m in counts.mean(axis=0)),
        int(counts.shape[0]),
    )


def choose_envelope(graph: CSRGraph, items, batch_size: int, config: SamplerConfig, *,
                    method: str = "calibrate", seed: int = 0,
                    policy: EnvelopePolicy = DEFAULT_POLICY, kernels: Kernels = XLA,
                    source: SeedSource = ITEM_SEEDS) -> tuple[Envelope, Calibration | None]:
    """A run's starting envelope, and the calibration record when it was calibrated.

    Tree (no-dedup) sampling has exact sizes; otherwise `method` is "calibrate" (tight,
    measured) or "conservative" (the safe bound). `source` builds level 0 (module
    docstring); level 0 is its safe size (conservative, tree) or calibrated.
    """
    level0 = source.seed_capacity(batch_size)
    if not config.dedup:
        return Envelope(level0, tree_sizes(level0, config.slots)[1:]), None
    if method == "conservative":
        return config.fit_envelope(conservative(level0, config.slots, graph.num_nodes,
                                                policy)), None
    if method != "calibrate":
        raise ValueError(f"envelope must be calibrate or conservative, got {method!r}")
    cal = calibrate(graph, items, batch_size, config, seed=seed, policy=policy,
                    kernels=kernels, source=source)
    return cal.envelope, cal
