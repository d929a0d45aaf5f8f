"""Calibration of the typed envelope from the real batches of the first epoch(s).

As for homogeneous graphs (calibrate.py): sampling alone runs as one device scan per
epoch under the conservative envelope, so every count is exact; the host reads the
counts per (step, level, type) once per epoch and keeps, per (level, type), the largest
times the policy's margin, rounded and capped by the conservative bound.
`choose_typed_envelope` is the one place a typed run's starting envelope is chosen.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from zerognn_jax._src.data.hetero import HeteroGraph, check_type_ids
from zerognn_jax._src.ops.jitting import jit_per_object
from zerognn_jax._src.ops.registry import XLA, Kernels
from zerognn_jax._src.sampling.envelope import DEFAULT_POLICY, EnvelopePolicy
from zerognn_jax._src.sampling.seeds import epoch_items
from zerognn_jax._src.sampling.typed_config import TypedSamplerConfig, seed_types
from zerognn_jax._src.sampling.typed_envelope import (
    TypedEnvelope,
    fit_typed_envelope,
    typed_conservative,
    typed_from_counts,
    typed_tree_sizes,
)
from zerognn_jax._src.sampling.typed_minibatch import sample_typed_step


def sample_typed_epoch_counts(graph, perm, seed, epoch, *, batch_size: int,
                              config: TypedSamplerConfig, envelope: TypedEnvelope,
                              kernels: Kernels, level0=None, key_step=None):
    """Samples every step of one epoch in one scan; returns per-step statistics:
    ({type: int32[steps, L + 1]} counts, int32[steps] edges, bool[steps] overflow).
    `level0` and `key_step`: as `sample_typed_step` takes them (the scan is jitted per
    `level0`, a run's object, and freed with it: `jit_per_object`)."""
    return _typed_epoch_counts(level0, graph, perm, seed, epoch, batch_size=batch_size,
                               config=config, envelope=envelope, kernels=kernels,
                               key_step=key_step)


@jit_per_object(static_argnames=("batch_size", "config", "envelope", "kernels"))
def _typed_epoch_counts(level0, graph, perm, seed, epoch, *, batch_size: int,
                        config: TypedSamplerConfig, envelope: TypedEnvelope, kernels: Kernels,
                        key_step):
    steps = perm.shape[0] // batch_size

    def body(_, step):
        mb = sample_typed_step(graph, perm, step, seed=seed, epoch=epoch,
                               batch_size=batch_size, config=config, envelope=envelope,
                               kernels=kernels, level0=level0, key_step=key_step).mb
        return None, (mb.counts, mb.num_edges(), mb.overflow)

    _, out = jax.lax.scan(body, None, jnp.arange(steps, dtype=jnp.int32))
    return out


@dataclasses.dataclass(frozen=True, eq=False)
class TypedCalibration:
    """What calibration saw: per type, per level, the largest and mean real sizes."""

    envelope: TypedEnvelope
    max_counts: dict
    mean_counts: dict
    steps: int


def calibrate_typed(graph: HeteroGraph, items, batch_size: int, config: TypedSamplerConfig, *,
                    seed_type, seed: int = 0, epochs: int = 1,
                    policy: EnvelopePolicy = DEFAULT_POLICY,
                    kernels: Kernels = XLA, seeds=None) -> TypedCalibration:
    """Chooses tight capacities per (level, type) from the real batches of the first
    `epochs` epochs of `items` (ids of `seed_type` nodes), as `calibrate` does.

    With several seed types (a link task), `items` are whatever a step slices (edges),
    `seeds` is the pair (level 0's capacities, the static callable making level 0 from
    a step's items: `sample_typed_step`'s `level0`), and level 0 keeps its capacities.
    """
    _check_seeds(graph, seed_type, items if seeds is None else None)
    config = config.resolve(graph)
    items = jnp.asarray(items, jnp.int32)
    first, level0 = (batch_size, None) if seeds is None else seeds
    safe = typed_conservative(config, seed_type, first, graph.num_nodes, policy)
    seen: dict[str, list] = {}
    for epoch in range(epochs):
        perm = epoch_items(items, batch_size, seed, epoch)
        counts, _, _ = sample_typed_epoch_counts(graph, perm, seed, epoch,
                                                 batch_size=batch_size, config=config,
                                                 envelope=safe, kernels=kernels,
                                                 level0=level0)
        for t, c in counts.items():
            seen.setdefault(t, []).append(np.asarray(c))
    stacked = {t: np.concatenate(c) for t, c in seen.items()}
    max_counts = {t: tuple(int(m) for m in c.max(axis=0)) for t, c in stacked.items()}
    env = typed_from_counts(config, seed_type, first, max_counts, safe, policy)
    return TypedCalibration(fit_typed_envelope(config, env), max_counts,
                            {t: tuple(float(m) for m in c.mean(axis=0))
                             for t, c in stacked.items()},
                            int(next(iter(stacked.values())).shape[0]))


def choose_typed_envelope(graph: HeteroGraph, items, batch_size: int,
                          config: TypedSamplerConfig, *, seed_type,
                          method: str = "calibrate", seed: int = 0,
                          policy: EnvelopePolicy = DEFAULT_POLICY, kernels: Kernels = XLA,
                          seeds=None) -> tuple[TypedEnvelope, TypedCalibration | None]:
    """A typed run's starting envelope, and the calibration record when calibrated: tree
    mode's exact sizes, or `method` "calibrate" (tight, measured) or "conservative".
    `seeds`: as `calibrate_typed` takes it."""
    _check_seeds(graph, seed_type)
    config = config.resolve(graph)
    first = batch_size if seeds is None else seeds[0]
    if not config.dedup:
        return typed_tree_sizes(config, seed_type, first), None
    if method == "conservative":
        return typed_conservative(config, seed_type, first, graph.num_nodes, policy), None
    if method != "calibrate":
        raise ValueError(f"envelope must be calibrate or conservative, got {method!r}")
    cal = calibrate_typed(graph, items, batch_size, config, seed_type=seed_type, seed=seed,
                          policy=policy, kernels=kernels, seeds=seeds)
    return cal.envelope, cal


def _check_seeds(graph: HeteroGraph, seed_type, items=None) -> None:
    """ValueError unless each type of `seed_type` (one, or a link task's tuple) is a node
    type of `graph` and, when given, every id of `items` (a node task's seeds) lies in
    [0, N_seed_type): naming the unknown type, or the first id out of range."""
    counts = graph.num_nodes
    for t in seed_types(seed_type):
        if t not in counts:
            raise ValueError(f"seed_type {t!r} is not a node type of the graph "
                             f"({', '.join(counts)})")
    if items is not None:
        check_type_ids("items (the seed nodes)", np.asarray(items), seed_type,
                       counts[seed_type])
