"""Negative pairs for link prediction, drawn on the device, and a step's seed frontier.

Negatives come from the counter hash: slot `s` of a step (negative `j` of positive `i`
is slot `i * K + j`) draws from `hash(key, salt, s)`, where `key` is the step's sampling
key (`seeds.step_keys`: a function of seed, epoch and step). So a step's negatives
depend only on (seed, epoch, step, slot), never on a capacity or on another step.

Modes:
  "destination": uniform destination corruption. Negative (u, v') of positive (u, v)
    keeps u and draws v' uniformly from the N - 1 nodes other than v (never equal to
    the positive's destination).
  "pairs": uniform random pairs (u', v'), both ends uniform over the N nodes.
  "shared": the step draws K destinations uniformly over the N nodes, and every
    positive (u, v) of the step is paired with each of them: (u, d_1) ... (u, d_K). A
    negative whose destination is its positive's own v is dropped (weight 0). The step's
    frontier then holds at most 2B + K nodes rather than B (2 + K), so many negatives
    per positive cost little more encoder work than one; they are correlated within a
    step (every positive meets the same K), as with the shared negatives of
    knowledge-graph and recommendation training.

`seed_frontier` deduplicates the endpoints of the positives and negatives into the
step's level 0 with the relabel op (ops/relabel.py): positives' endpoints first, in
order of first occurrence, so the frontier does not depend on its capacity either.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from zerognn_jax._src.ops.registry import XLA, Kernels
from zerognn_jax._src.ops.relabel import relabel
from zerognn_jax._src.pallas import counter_hash

NEGATIVE_MODES = ("destination", "pairs", "shared")
# The negatives' stream under a step key; the sampler's hops use the words 0 .. L - 1.
NEGATIVE_SALT = 0x4E454721


def frontier_size(batch_size: int, num_negatives: int, mode: str) -> int:
    """Node ids the pairs of `batch_size` positives and their negatives hold, at most."""
    check_mode(mode)
    if mode == "shared":
        return 2 * batch_size + num_negatives
    return batch_size * (2 + (num_negatives if mode == "destination" else 2 * num_negatives))


def check_frontier(batch_size: int, num_negatives: int, mode: str,
                   negatives_name: str = "num_negatives") -> None:
    """ValueError when the node ids of a step's pairs (`frontier_size`) would not fit
    int32 indices, naming both numbers (`negatives_name`: the caller's name for K)."""
    ids = frontier_size(batch_size, num_negatives, mode)
    if ids >= 2**31:
        raise ValueError(f"{negatives_name} {num_negatives} with batch_size {batch_size} "
                         f"gives a step {ids:,} node ids (each pair's ends, negatives "
                         f"included), past int32's 2**31 - 1: lower either")


def check_mode(mode: str) -> None:
    if mode not in NEGATIVE_MODES:
        raise ValueError(f"negative mode must be one of {', '.join(NEGATIVE_MODES)}, "
                         f"got {mode!r}")


def negative_pairs(key, positives: jax.Array, valid: jax.Array, num_nodes: int,
                   num_negatives: int, mode: str = "destination", *,
                   num_sources: int | None = None) -> tuple[jax.Array, jax.Array]:
    """K negatives per positive (jit-compatible).

    Args:
      key: uint32 scalar, the step's sampling key.
      positives: int32[B, 2] (source, destination); valid: bool[B].
      num_nodes: N >= 2, static: the destinations' count. num_negatives: K >= 1,
        static. mode: see the module. num_sources: the sources' count where they are
        nodes of another type (a typed graph's relation; "pairs" draws them from it).

    Returns:
      (int32[B * K, 2] pairs, bool[B * K] valid): rows i*K .. i*K + K - 1 belong to
      positive i and are valid where it is ("shared": and where the destination is not
      the positive's own).
    """
    check_mode(mode)
    if num_nodes < 2 or num_negatives < 1:
        raise ValueError(f"need num_nodes >= 2 and num_negatives >= 1, got {num_nodes}, "
                         f"{num_negatives}")
    b, k = positives.shape[0], num_negatives
    stream = counter_hash.hash2(key, NEGATIVE_SALT)
    slot = jnp.arange(b * k, dtype=jnp.uint32)
    row = jnp.repeat(positives, k, axis=0)
    if mode == "destination":
        draw = counter_hash.uniform_below(counter_hash.slot_bits(stream, slot, 0),
                                          jnp.int32(num_nodes - 1))
        dst = draw + (draw >= row[:, 1]).astype(jnp.int32)  # skips the true destination
        pairs = jnp.stack([row[:, 0], dst], axis=1)
    elif mode == "shared":
        shared = counter_hash.uniform_below(
            counter_hash.slot_bits(stream, jnp.arange(k, dtype=jnp.uint32), 3),
            jnp.int32(num_nodes))
        dst = jnp.tile(shared, b)
        pairs = jnp.stack([row[:, 0], dst], axis=1)
        return pairs.astype(jnp.int32), jnp.repeat(valid, k) & (dst != row[:, 1])
    else:
        sources = num_nodes if num_sources is None else num_sources
        src = counter_hash.uniform_below(counter_hash.slot_bits(stream, slot, 1),
                                         jnp.int32(sources))
        dst = counter_hash.uniform_below(counter_hash.slot_bits(stream, slot, 2),
                                         jnp.int32(num_nodes))
        pairs = jnp.stack([src, dst], axis=1)
    return pairs.astype(jnp.int32), jnp.repeat(valid, k)


class SeedFrontier(NamedTuple):
    """A step's level 0 built from pairs.

    Attributes:
      seeds: int32[S], distinct endpoint ids first (padding 0).
      valid: bool[S], True on a prefix of `count` entries.
      count: int32 scalar, distinct endpoints (may exceed S: overflow).
      pairs: int32[P, 2], each pair's endpoints as positions in `seeds`
        (meaningless when count > S).
    """

    seeds: jax.Array
    valid: jax.Array
    count: jax.Array
    pairs: jax.Array


def seed_frontier(pairs: jax.Array, valid: jax.Array, capacity: int, num_nodes: int,
                  kernels: Kernels = XLA) -> SeedFrontier:
    """Deduplicates the endpoints of `pairs` (int32[P, 2], bool[P] valid) into `capacity`
    slots with the relabel op (first occurrence order, row by row)."""
    p = pairs.shape[0]
    out = frontier_of(pairs, jnp.repeat(valid, 2).reshape(p, 2), capacity, num_nodes,
                      kernels)
    return out._replace(pairs=out.pairs.reshape(p, 2))


def frontier_of(ids: jax.Array, valid: jax.Array, capacity: int, num_nodes: int,
                kernels: Kernels = XLA) -> SeedFrontier:
    """Deduplicates the ids (int32[...], bool[...] valid) into `capacity` slots with the
    relabel op (first occurrence order); `pairs` holds each id's position, flat."""
    # An empty current frontier of one (masked) slot: every id is a "new" one.
    out = relabel(kernels, jnp.zeros((1,), jnp.int32), jnp.int32(0), ids.reshape(1, -1),
                  valid.reshape(1, -1), capacity, num_nodes)
    seeds_valid = jnp.arange(capacity) < out.count
    return SeedFrontier(out.frontier, seeds_valid, out.count, out.nbr_local.reshape(-1))
