"""Items of step s -> level 0 -> sampled blocks: the one path every driver of steps takes.

Training (both engines), calibration, sampled evaluation and the `NeighborLoader` all
turn step `s` of an epoch's shuffled items into a sampled minibatch the same way:
slice the step's items from the permutation, derive the step's keys from (seed, epoch,
batch index), let a `SeedSource` build level 0 (the frontier the sampler starts from)
from the items, and sample the hops around it. Only the seed source differs between
tasks: node tasks start from the items themselves; link prediction deduplicates the
endpoints of positive and negative pairs into a frontier of its own capacity.
"""

from __future__ import annotations

from typing import NamedTuple, Protocol

import jax

from zerognn_jax._src.data.graph import CSRGraph
from zerognn_jax._src.ops.registry import XLA, Kernels
from zerognn_jax._src.sampling.envelope import Envelope
from zerognn_jax._src.sampling.minibatch import MiniBatch, SamplerConfig, sample_minibatch
from zerognn_jax._src.sampling.seeds import step_items, step_keys


class SeedLevel(Protocol):
    """Level 0 of a step, as a seed source builds it.

    Attributes:
      seeds: int32[S] node ids; valid: bool[S], the real ones.
      count: int32 scalar, the real number of seeds when the source deduplicates them
        (it may exceed S: level 0 overflowed); None: the count of `valid`.
    """

    @property
    def seeds(self) -> jax.Array: ...

    @property
    def valid(self) -> jax.Array: ...

    @property
    def count(self) -> jax.Array | None: ...


class SeedSource(Protocol):
    """What builds level 0 from a step's items (a task, or `ITEM_SEEDS`).

    `dedups_seeds`: level 0 is a deduplicated frontier whose real size varies per step
    (calibration then sizes it like any other level); False: it is the step's items.
    """

    dedups_seeds: bool

    def seed_capacity(self, batch_size: int) -> int:
        """The safe size of level 0 for `batch_size` items per step."""
        ...

    def seed_level(self, items: jax.Array, valid: jax.Array, key: jax.Array,
                   capacity: int) -> SeedLevel:
        """Level 0 of the step whose items are `items` (bool[B] `valid`), at `capacity`
        (the envelope's level 0), drawing from the step's sampling `key`."""
        ...


class ItemLevel(NamedTuple):
    """Level 0 made of the step's items (see `SeedLevel`)."""

    seeds: jax.Array
    valid: jax.Array
    count: jax.Array | None = None


class ItemSeeds:
    """The seed source of node tasks: the step's items are its seeds (capacity B)."""

    dedups_seeds = False

    def seed_capacity(self, batch_size: int) -> int:
        return batch_size

    def seed_level(self, items, valid, key, capacity: int) -> ItemLevel:
        del key, capacity  # the items are the seeds: nothing drawn, the batch's size
        return ItemLevel(items, valid)


ITEM_SEEDS = ItemSeeds()


class StepSample(NamedTuple):
    """One step's items, keys, level 0 and sampled minibatch.

    Attributes:
      items: int32[B, ...] the step's rows of the permutation (padding rows hold 0);
      valid: bool[B], the real ones. key: uint32 sampling key; drop_key: the dropout key.
      level: the seed source's level 0. mb: the minibatch sampled around it; with a
        deduplicated level 0 its count is level 0's and a count above S overflows.
    """

    items: jax.Array
    valid: jax.Array
    key: jax.Array
    drop_key: jax.Array
    level: SeedLevel
    mb: MiniBatch


def sample_step(graph: CSRGraph, perm, batch_index, *, seed, epoch, batch_size: int,
                config: SamplerConfig, envelope: Envelope, kernels: Kernels = XLA,
                source: SeedSource = ITEM_SEEDS, active=None, key_step=None) -> StepSample:
    """Samples batch `batch_index` of the padded permutation `perm` (jit-compatible).

    `active` (bool, optional) masks every item of a padding step. The keys depend only
    on (seed, epoch, step), never on the envelope: the step is `batch_index`, or
    `key_step` where given (evaluation keys every batch alike, so that a node's sample,
    drawn by its id, is the same in whichever batch it comes).
    """
    items, valid = step_items(perm, batch_index, batch_size)
    if active is not None:
        valid = valid & active
    key, drop_key = step_keys(seed, epoch, batch_index if key_step is None else key_step)
    level = source.seed_level(items, valid, key, envelope.batch_size)
    mb = sample_minibatch(graph, level.seeds, level.valid, key, config, envelope.capacities,
                          kernels)
    if level.count is not None:
        mb = mb._replace(counts=mb.counts.at[0].set(level.count),
                         overflow=mb.overflow | (level.count > level.seeds.shape[0]))
    return StepSample(items, valid, key, drop_key, level, mb)
