"""The memory model of a step's buffers, the fit check, and the device's memory stats."""

from __future__ import annotations

import jax

from zerognn_jax._src.sampling.envelope import Envelope


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
