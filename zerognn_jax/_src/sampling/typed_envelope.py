"""The typed execution envelope: a static capacity per (hop, node type), and its sizing.

The same policy as the homogeneous envelope (envelope.py): a conservative bound that is
always safe, calibration to the largest counts seen times the margin (typed_calibrate.py),
growth after an overflow. Capacities are keyed by level and node type: level 0 holds
the batch's seeds (one type, B rows; or, for a link task, each end's type with its own
capacity); level h + 1 holds, per type, that type's level h
as its prefix and the new nodes after it, so a type's capacity never decreases from one
level to the next. A homogeneous envelope is the typed one with one type
(`TypedEnvelope.from_envelope`, `as_envelope`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

from zerognn_jax._src.sampling.envelope import (
    DEFAULT_POLICY,
    Envelope,
    EnvelopePolicy,
    bucket,
    check_capacity,
    round_up,
)
from zerognn_jax._src.sampling.typed_config import TypedSamplerConfig


@dataclasses.dataclass(frozen=True)
class TypedEnvelope:
    """Static buffer capacities per level and node type.

    Attributes:
      seed_type: the type of level 0; batch_size: B, its capacity. Or a tuple of
        distinct types and a tuple of their capacities (a link task's ends).
      capacities: per hop h, ((type, C_{h+1, type}), ...) for the types of level h + 1
        (`TypedSamplerConfig.plan`'s order).
    """

    seed_type: str | tuple[str, ...]
    batch_size: int | tuple[int, ...]
    capacities: tuple[tuple[tuple[str, int], ...], ...]

    def __post_init__(self):
        caps = tuple(tuple((str(t), int(c)) for t, c in level) for level in self.capacities)
        object.__setattr__(self, "capacities", caps)
        if isinstance(self.seed_type, str) == isinstance(self.batch_size, tuple | list):
            raise ValueError(f"one seed type takes one capacity, a tuple of them a tuple: "
                             f"got {self.seed_type!r}, {self.batch_size!r}")
        if not isinstance(self.seed_type, str):
            object.__setattr__(self, "seed_type", tuple(self.seed_type))
            object.__setattr__(self, "batch_size", tuple(int(b) for b in self.batch_size))
            if len(set(self.seed_type)) != len(self.seed_type) or \
                    len(self.seed_type) != len(self.batch_size):
                raise ValueError(f"seed types must be distinct, one capacity each: got "
                                 f"{self.seed_type}, {self.batch_size}")
        prev = self.level(0)
        if min(prev.values()) < 1:
            raise ValueError(f"batch_size must be at least 1, got {self.batch_size}")
        for hop, level in enumerate(caps):
            now = dict(level)
            for t, c in now.items():
                check_capacity(f"{t} at level {hop + 1}", c)
            for t, c in prev.items():
                if now.get(t, -1) < c:
                    raise ValueError(f"capacity of {t} at level {hop + 1} ({now.get(t)}) is "
                                     f"below that at level {hop} ({c}); capacities must not "
                                     "decrease")
            prev = now

    @property
    def num_hops(self) -> int:
        return len(self.capacities)

    def level(self, level: int) -> dict[str, int]:
        """{type: capacity} of level `level` (0: the seeds)."""
        if level == 0:
            return seed_level(self.seed_type, self.batch_size)
        return dict(self.capacities[level - 1])

    @property
    def levels(self) -> tuple[dict[str, int], ...]:
        return tuple(self.level(lvl) for lvl in range(self.num_hops + 1))

    @classmethod
    def from_envelope(cls, envelope: Envelope, node_type: str = "_N") -> TypedEnvelope:
        """The one-type envelope of a homogeneous one."""
        return cls(node_type, envelope.batch_size,
                   tuple(((node_type, c),) for c in envelope.capacities))

    def as_envelope(self) -> Envelope:
        """The homogeneous envelope of a one-type envelope."""
        if any(len(level) != 1 for level in self.capacities):
            raise ValueError("only an envelope of one node type is homogeneous")
        return Envelope(self.batch_size, tuple(level[0][1] for level in self.capacities))


def seed_level(seed_type, batch_size) -> dict[str, int]:
    """{type: capacity} of level 0: one type and B, or tuples of types and capacities."""
    if isinstance(seed_type, str):
        return {seed_type: batch_size}
    return dict(zip(seed_type, batch_size))


def _sizes_from(config: TypedSamplerConfig, seed_type, batch_size,
                want) -> TypedEnvelope:
    """The envelope whose level h + 1 capacity of type t is `want(hop, t)`, made
    non-decreasing per type; positional hops get their exact sizes."""
    levels, prev = [], seed_level(seed_type, batch_size)
    for hop, step in enumerate(config.plan(seed_type)):
        caps = {}
        for t in step.types:
            exact = prev.get(t, 0) + sum(prev[r[2]] * config.slots(r, hop)
                                         for r in step.relations if r[0] == t)
            size = exact if config.positional[hop] else want(hop, t)
            caps[t] = max(size, prev.get(t, 0), 1)
        levels.append(tuple(caps.items()))
        prev = caps
    return TypedEnvelope(seed_type, batch_size, tuple(levels))


def typed_conservative(config: TypedSamplerConfig, seed_type, batch_size,
                       num_nodes: Mapping[str, int],
                       policy: EnvelopePolicy = DEFAULT_POLICY) -> TypedEnvelope:
    """The always-safe bound: per type, b_{h+1} = min(N_type, b_h + sum over the
    relations into it of b_{h,dst} K), rounded up to the policy's multiple (one type:
    the homogeneous `conservative`, to the entry)."""
    bounds, b = [], seed_level(seed_type, batch_size)
    for hop, step in enumerate(config.plan(seed_type)):
        b = {t: min(num_nodes[t], b.get(t, 0) + sum(b[r[2]] * config.slots(r, hop)
                                                    for r in step.relations if r[0] == t))
             for t in step.types}
        bounds.append(b)
    return _sizes_from(config, seed_type, batch_size,
                       lambda hop, t: round_up(max(bounds[hop][t], 1), policy.multiple))


def typed_tree_sizes(config: TypedSamplerConfig, seed_type, batch_size) -> TypedEnvelope:
    """The exact sizes of tree (no-dedup) sampling."""
    exact = dataclasses.replace(config, dedup=False)
    return _sizes_from(exact, seed_type, batch_size, None)


def fit_typed_envelope(config: TypedSamplerConfig, envelope: TypedEnvelope) -> TypedEnvelope:
    """`envelope` with every positional hop at its exact size, and every level holding at
    least the capacities before it."""
    caps = {hop: dict(level) for hop, level in enumerate(envelope.capacities)}
    return _sizes_from(config, envelope.seed_type, envelope.batch_size,
                       lambda hop, t: caps[hop][t])


def typed_from_counts(config: TypedSamplerConfig, seed_type, batch_size,
                      counts: Mapping[str, list], safe: TypedEnvelope,
                      policy: EnvelopePolicy = DEFAULT_POLICY) -> TypedEnvelope:
    """Capacities margin x `counts[type][level]` (the largest counts seen), rounded up
    and capped by the safe envelope `safe`."""
    bound = {hop: dict(level) for hop, level in enumerate(safe.capacities)}
    return _sizes_from(config, seed_type, batch_size, lambda hop, t: min(
        round_up(max(int(counts[t][hop + 1]), 1) * policy.margin, policy.multiple),
        bound[hop][t]))


def typed_served(config: TypedSamplerConfig, envelope: TypedEnvelope, safe: TypedEnvelope,
                 before: TypedEnvelope | None = None) -> TypedEnvelope:
    """`envelope` for a request of varying size (`zg.predict`): each capacity rounded up
    to a size that requests share (`bucket`, at most `safe`'s) and at least `before`'s
    (what earlier requests of the same seeds were served with, or None), so that
    requests seldom need a program of their own; positional hops at their exact sizes."""
    def size(hop, t):
        cap = min(bucket(envelope.level(hop + 1)[t]), safe.level(hop + 1)[t])
        return cap if before is None else max(cap, before.level(hop + 1)[t])

    return _sizes_from(config, envelope.seed_type, envelope.batch_size, size)


def grow_typed(envelope: TypedEnvelope, config: TypedSamplerConfig,
               counts: Mapping[str, list], policy: EnvelopePolicy = DEFAULT_POLICY, *,
               num_nodes: Mapping[str, int] | None = None) -> TypedEnvelope:
    """Capacities after an overflow seen with `counts` ({type: (n_0, ..., n_L)}).

    As the homogeneous `grow`: the first level where some type overflowed gets margin x
    its count for that type; every later level, whose counts were cut short by it, grows
    by at least the largest ratio so far (and by `policy.growth` where it overflowed
    itself). The ratio takes effect from the level after the one that set it: types of
    one level are computed from the level before, not from each other. With
    `num_nodes`, no level of a type grows past that type's node count (rounded up), its
    capacity now, or its count, whichever is largest: a deduplicated level holds each
    node once unless the seeds themselves repeat.
    """
    ratio, sizes = 1.0, {}
    for hop, level in enumerate(envelope.capacities):
        grown = ratio
        for t, cap in level:
            want, cnt = cap * ratio, int(counts[t][hop + 1])
            if cnt > cap:
                want = max(want, cnt * policy.margin,
                           cap * (policy.growth if ratio > 1.0 else 1.0))
                grown = max(grown, want / cap)
            sizes[hop, t] = want
        ratio = grown
    def size(hop, t):
        grown = round_up(max(sizes[hop, t], 1), policy.multiple)
        if num_nodes is None:
            return grown
        most = max(round_up(num_nodes[t], policy.multiple), envelope.level(hop + 1)[t],
                   round_up(int(counts[t][hop + 1]), policy.multiple))
        return min(grown, most)

    return _sizes_from(config, envelope.seed_type, envelope.batch_size, size)
