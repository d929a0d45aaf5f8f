"""The execution envelope: a static capacity per sampled level, chosen tight.

`conservative` is always safe and far too large; `calibrate` runs sampling alone over
real batches as one device scan and keeps the largest count per level plus a margin;
`grow` enlarges the capacities after an overflow. `memory_report` compares the
envelope's buffer bytes with what an exact-size allocator needs at the largest step.
"""

from __future__ import annotations

import dataclasses
import functools
import math

import jax
import jax.numpy as jnp
import numpy as np

from zerognn_jax._src import kernels as kernels_lib
from zerognn_jax._src import rng
from zerognn_jax._src.graph import CSRGraph
from zerognn_jax._src.sampler import SamplerConfig, sample_minibatch


@dataclasses.dataclass(frozen=True)
class Envelope:
    """Static buffer capacities. `capacities[l]` is C_{l+1}, the size of level l + 1."""

    batch_size: int
    capacities: tuple[int, ...]

    def __post_init__(self):
        object.__setattr__(self, "capacities", tuple(int(c) for c in self.capacities))
        if self.batch_size < 1:
            raise ValueError(f"batch_size must be at least 1, got {self.batch_size}")
        prev = self.batch_size
        for hop, cap in enumerate(self.capacities):
            if cap < prev:
                raise ValueError(
                    f"capacity of level {hop + 1} ({cap}) is below that of level {hop} ({prev}); "
                    "capacities must not decrease"
                )
            prev = cap

    @property
    def levels(self) -> tuple[int, ...]:
        """(B, C_1, ..., C_L)."""
        return (self.batch_size, *self.capacities)


def round_up(x: float, multiple: int) -> int:
    return int(math.ceil(x / multiple) * multiple)


def _monotone(batch_size, sizes, multiple) -> Envelope:
    caps, prev = [], batch_size
    for size in sizes:
        prev = max(prev, round_up(max(size, 1), multiple))
        caps.append(prev)
    return Envelope(batch_size, tuple(caps))


def conservative(batch_size: int, fanouts, num_nodes: int, multiple: int = 128) -> Envelope:
    """The always-safe bound C_{l+1} = min(N, C_l (1 + f_l)), rounded up."""
    sizes, c = [], batch_size
    for f in fanouts:
        c = min(num_nodes, c * (1 + f))
        sizes.append(c)
    return _monotone(batch_size, sizes, multiple)


def epoch_seeds(train_idx: jax.Array, batch_size: int, seed, epoch) -> jax.Array:
    """int32[steps * B]: the epoch's shuffled training ids, padded at the end with -1."""
    steps = num_steps(train_idx.shape[0], batch_size)
    key = jax.random.fold_in(jax.random.PRNGKey(seed), epoch)
    perm = jax.random.permutation(key, train_idx.astype(jnp.int32))
    pad = steps * batch_size - perm.shape[0]
    return jnp.concatenate([perm, jnp.full((pad,), -1, jnp.int32)])


def num_steps(num_train: int, batch_size: int) -> int:
    return max(1, -(-num_train // batch_size))


def step_seeds(perm: jax.Array, step, batch_size: int):
    """(seeds int32[B], valid bool[B]) for step `step` of a padded permutation."""
    seeds = jax.lax.dynamic_slice(perm, (step * batch_size,), (batch_size,))
    return jnp.maximum(seeds, 0), seeds >= 0


@functools.partial(jax.jit, static_argnames=("batch_size", "config", "capacities", "kernels"))
def sample_epoch_counts(graph, perm, seed, epoch, *, batch_size, config, capacities, kernels):
    """Samples every step of one epoch in one scan; returns per-step statistics.

    Returns (counts int32[steps, L + 1], edges int32[steps], overflow bool[steps]).
    """
    steps = perm.shape[0] // batch_size

    def body(_, step):
        seeds, valid = step_seeds(perm, step, batch_size)
        key = rng.step_key(seed, epoch, step, 0)
        mb = sample_minibatch(graph, seeds, valid, key, config, capacities, kernels)
        edges = sum(jnp.sum(b.mask.astype(jnp.int32)) for b in mb.blocks)
        return None, (mb.counts, edges, mb.overflow)

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
    margin: float = 1.1,
    multiple: int = 128,
    kernels: kernels_lib.Kernels = kernels_lib.XLA,
) -> Calibration:
    """Chooses tight capacities from the real batches of the first `epochs` epochs.

    Sampling runs on the device under the conservative envelope (so every count is
    exact); the host reads the counts once per epoch.
    """
    if margin < 1.0:
        raise ValueError(f"margin must be >= 1.0, got {margin}")
    train_idx = jnp.asarray(train_idx, jnp.int32)
    safe = conservative(batch_size, config.fanouts, graph.num_nodes, multiple)
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
    env = _monotone(batch_size, [m * margin for m in max_counts[1:]], multiple)
    env = Envelope(batch_size, tuple(min(c, s) for c, s in zip(env.capacities, safe.capacities)))
    return Calibration(
        env, tuple(int(m) for m in max_counts), tuple(float(m) for m in counts.mean(axis=0)),
        int(counts.shape[0]),
    )


def grow(envelope: Envelope, counts, *, margin: float = 1.1, multiple: int = 128,
         factor: float = 2.0) -> Envelope:
    """Capacities after an overflow seen with per-level `counts` (B, n_1, ..., n_L).

    The first level that overflowed gets margin x its count; every later level, whose
    count was cut short by that overflow, grows by at least the same ratio (and by
    `factor` if it overflowed itself).
    """
    counts = [int(c) for c in counts[1:]]
    sizes, ratio = [], 1.0
    for cap, cnt in zip(envelope.capacities, counts):
        want = cap * ratio
        if cnt > cap:
            want = max(want, cnt * margin, cap * (factor if ratio > 1.0 else 1.0))
            ratio = max(ratio, want / cap)
        sizes.append(want)
    return _monotone(envelope.batch_size, sizes, multiple)


def level_bytes(fanouts, level_dims) -> tuple[int, ...]:
    """Bytes each node costs per level: ids, mask, degree, its block row, activations.

    `level_dims[l]` is the feature width held at level l (the input features at level
    L, hidden widths in between, the classes at level 0); activations are counted
    twice, for the forward value and its gradient.
    """
    per = []
    for level, dim in enumerate(level_dims):
        block = 5 * fanouts[level] if level < len(fanouts) else 0
        per.append(9 + block + 8 * dim)
    return tuple(per)


def memory_report(envelope: Envelope, max_counts, fanouts, level_dims) -> dict:
    """Envelope bytes against the exact-size bytes at the largest counts seen."""
    per = level_bytes(fanouts, level_dims)
    env_bytes = sum(c * b for c, b in zip(envelope.levels, per))
    ideal = sum(min(int(m), c) * b for m, c, b in zip(max_counts, envelope.levels, per))
    return {
        "levels": [
            {"level": i, "capacity": c, "max_observed": int(m), "bytes_per_node": b}
            for i, (c, m, b) in enumerate(zip(envelope.levels, max_counts, per))
        ],
        "envelope_bytes": int(env_bytes),
        "ideal_bytes": int(ideal),
        "ratio": env_bytes / max(ideal, 1),
    }


def check_fits(envelope: Envelope, fanouts, level_dims, limit_bytes: int | None) -> None:
    """Raises ValueError naming the level whose buffers cannot fit `limit_bytes`."""
    if limit_bytes is None:
        return
    per = level_bytes(fanouts, level_dims)
    total = 0
    for level, (cap, b) in enumerate(zip(envelope.levels, per)):
        total += cap * b
        if total > limit_bytes:
            raise ValueError(
                f"the envelope does not fit device memory: level {level} (hop {level}) needs "
                f"capacity {cap:,} nodes x {b} bytes = {cap * b / 2**30:.2f} GiB, bringing "
                f"the step's buffers to {total / 2**30:.2f} GiB of {limit_bytes / 2**30:.2f} "
                "GiB available; lower the batch size or fanouts, or calibrate the envelope"
            )


def _memory_stat(name: str, device=None) -> int | None:
    device = device or jax.local_devices()[0]
    stats = device.memory_stats() if hasattr(device, "memory_stats") else None
    return int(stats[name]) if stats and name in stats else None


def device_memory_limit(device=None) -> int | None:
    """Bytes the device's allocator may use, or None where JAX does not say (CPU)."""
    return _memory_stat("bytes_limit", device)


def device_peak_bytes(device=None) -> int | None:
    """The device allocator's peak use so far in this process, or None (CPU)."""
    return _memory_stat("peak_bytes_in_use", device)
