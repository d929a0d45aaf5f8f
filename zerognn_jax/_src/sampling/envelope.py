"""The execution envelope: a static capacity per sampled level, and the policy that sizes it.

`conservative` is always safe and far too large; calibration (calibrate.py) measures
real batches and keeps the largest count per level plus the policy's margin; `grow`
enlarges the capacities after an overflow.
"""

from __future__ import annotations

import dataclasses
import math

from zerognn_jax._src.data.checks import is_int


@dataclasses.dataclass(frozen=True)
class EnvelopePolicy:
    """How capacities are sized: one frozen value shared by calibration, growth and engines.

    Attributes:
      margin: capacity = margin x the largest count seen (>= 1).
      multiple: capacities are rounded up to a multiple of this (>= 1).
      growth: after an overflow, a level that overflowed although an earlier level had
        already grown grows by at least this factor (> 1).
    """

    margin: float = 1.1
    multiple: int = 128
    growth: float = 2.0

    def __post_init__(self):
        if not (self.margin >= 1.0 and math.isfinite(self.margin)):
            raise ValueError(f"margin must be a finite number >= 1, got {self.margin}")
        if self.multiple < 1:
            raise ValueError(f"multiple must be >= 1, got {self.multiple}")
        if not self.growth > 1.0:
            raise ValueError(f"growth must be > 1, got {self.growth}")


DEFAULT_POLICY = EnvelopePolicy()
MAX_CAPACITY = 2**31 - 1  # positions in a level are int32


class PastInt32(ValueError):
    """A level or a hop's slots past int32 positions. `fact` is the message without its
    advice, for a caller whose remedies are others (an export: the batch size alone)."""

    def __init__(self, fact: str, advice: str):
        super().__init__(f"{fact}: {advice}")
        self.fact = fact


def check_capacity(where: str, capacity: int) -> None:
    """ValueError unless a level of `capacity` rows (`where`: which one) is addressable by
    int32 positions: tree levels multiply the batch by (1 + K) each hop."""
    if capacity > MAX_CAPACITY:
        raise PastInt32(f"{where} would hold {capacity:,} rows, more than int32 positions "
                        f"reach ({MAX_CAPACITY:,})", "lower the fanouts or the batch size, "
                        "or deduplicate the levels (dedup=True, flat_outer=False)")


def check_slots(where: str, slots: int, detail: str) -> None:
    """ValueError unless a hop's `slots` sampled entries (`where`: which hop; `detail`:
    of what, as " (R rows x K)") are addressable by int32 positions; a level's own size
    is checked by its envelope (`check_capacity`), its candidates here."""
    if slots > MAX_CAPACITY:
        raise PastInt32(f"{where} would sample {slots:,} slots{detail}, more than int32 "
                        f"positions reach ({MAX_CAPACITY:,})",
                        "lower the fanouts or the batch size")


@dataclasses.dataclass(frozen=True)
class Envelope:
    """Static buffer capacities. `capacities[l]` is C_{l+1}, the size of level l + 1."""

    batch_size: int
    capacities: tuple[int, ...]

    def __post_init__(self):
        for c in (self.batch_size, *self.capacities):
            if not is_int(c):
                raise ValueError(f"capacities and batch_size must be integers, got {c!r}")
        object.__setattr__(self, "batch_size", int(self.batch_size))
        object.__setattr__(self, "capacities", tuple(int(c) for c in self.capacities))
        if self.batch_size < 1:
            raise ValueError(f"batch_size must be at least 1, got {self.batch_size}")
        prev = self.batch_size
        for hop, cap in enumerate(self.capacities):
            check_capacity(f"level {hop + 1}", cap)
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


def bucket(n: int) -> int:
    """`n` (>= 1) rounded up to a size that requests of any size share: itself below 8,
    else a multiple of a quarter of the power of two below it (under 25 % more; four
    sizes an octave)."""
    n = int(n)
    step = 1 << max(n.bit_length() - 3, 0)
    return -(-n // step) * step


def monotone(batch_size, sizes, multiple) -> Envelope:
    """An envelope holding `sizes`, each rounded up to `multiple`, made non-decreasing."""
    caps, prev = [], batch_size
    for size in sizes:
        prev = max(prev, round_up(max(size, 1), multiple))
        caps.append(prev)
    return Envelope(batch_size, tuple(caps))


def conservative(batch_size: int, slots, num_nodes: int,
                 policy: EnvelopePolicy = DEFAULT_POLICY) -> Envelope:
    """The always-safe bound C_{l+1} = min(N, C_l (1 + K_l)), rounded up.

    `slots` are the slots K per row of each hop (`SamplerConfig.slots`; the fanouts
    themselves except under LABOR, whose rows may hold more than the fanout)."""
    sizes, c = [], batch_size
    for k in slots:
        c = min(num_nodes, c * (1 + k))
        sizes.append(c)
    return monotone(batch_size, sizes, policy.multiple)


def grow(envelope: Envelope, counts, policy: EnvelopePolicy = DEFAULT_POLICY, *,
         num_nodes: int | None = None) -> Envelope:
    """Capacities after an overflow seen with per-level `counts` (n_0, n_1, ..., n_L).

    The first level that overflowed gets margin x its count; every later level, whose
    count was cut short by that overflow, grows by at least the same ratio (and by
    `policy.growth` if it overflowed itself). Level 0 grows only when its count exceeds
    it: a task that deduplicates its seeds into a frontier (link prediction) overflowed.
    With `num_nodes`, no level grows past the graph's node count (rounded up), its
    capacity now, or its count, whichever is largest: a deduplicated level holds each
    node once unless the seeds themselves repeat (a level then keeps every seed row), and
    a positional level's size is set by the sampler's `fit_envelope`, not here.
    """
    margin, factor = policy.margin, policy.growth
    base, ratio, seen = envelope.batch_size, 1.0, [int(c) for c in counts]
    if int(counts[0]) > base:
        base = round_up(int(counts[0]) * margin, policy.multiple)
        ratio = base / envelope.batch_size
    counts = [int(c) for c in counts[1:]]
    sizes = []
    for cap, cnt in zip(envelope.capacities, counts):
        want = cap * ratio
        if cnt > cap:
            want = max(want, cnt * margin, cap * (factor if ratio > 1.0 else 1.0))
            ratio = max(ratio, want / cap)
        sizes.append(want)
    grown = monotone(base, sizes, policy.multiple)
    if num_nodes is None:
        return grown
    most, caps = round_up(num_nodes, policy.multiple), []
    for c, cap, cnt in zip(grown.levels, envelope.levels, seen):
        caps.append(max(min(c, max(most, cap, round_up(cnt, policy.multiple))),
                        caps[-1] if caps else 0))
    return Envelope(caps[0], tuple(caps[1:]))
