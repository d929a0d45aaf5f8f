"""L-hop neighbour sampling of a mini-batch into fixed-capacity buffers.

Level 0 is the seed batch (capacity B); sampling level l with fanout f_l gives level
l + 1 (capacity C_{l+1}, the execution envelope). Real sizes are device scalars, so one
compiled program serves every batch; a level whose real size exceeds its capacity sets
the `overflow` flag instead of raising.
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

import jax
import jax.numpy as jnp

from pallas_kernels import counter_hash
from zerognn_jax._src.data.graph import CSRGraph
from zerognn_jax._src.ops.registry import XLA, Kernels
from zerognn_jax._src.ops.relabel import relabel
from zerognn_jax._src.sampling.uniform import sample_neighbors

MAX_HOPS = 8


@dataclasses.dataclass(frozen=True)
class SamplerConfig:
    """What to sample; static (hashable).

    Attributes:
      fanouts: neighbours per node for each hop, seeds' hop first (e.g. (15, 10, 5)).
        A fanout of -1 takes every neighbour (full neighbourhood); it is resolved to
        the graph's largest degree by `resolve`.
      replace: sample with replacement.
      dedup: deduplicate each level (False: tree mode, exact static sizes, no metadata).
      all_neighbors: per hop, take every neighbour; set by `resolve` for -1 fanouts.
    """

    fanouts: tuple[int, ...]
    replace: bool = False
    dedup: bool = True
    all_neighbors: tuple[bool, ...] = ()

    def __post_init__(self):
        fanouts = tuple(int(f) for f in self.fanouts)
        object.__setattr__(self, "fanouts", fanouts)
        if not 1 <= len(fanouts) <= MAX_HOPS:
            raise ValueError(f"need between 1 and {MAX_HOPS} hops, got {len(fanouts)}: {fanouts}")
        for hop, f in enumerate(fanouts):
            if f <= 0 and f != -1:
                raise ValueError(f"fanout of hop {hop} must be positive or -1 (all), got {f}")

    @property
    def num_hops(self) -> int:
        return len(self.fanouts)

    def resolve(self, max_degree: int) -> SamplerConfig:
        """Replaces -1 fanouts by `max_degree` (at least 1), marking those hops as full."""
        full = tuple(f == -1 for f in self.fanouts)
        fanouts = tuple(max(max_degree, 1) if f == -1 else f for f in self.fanouts)
        return dataclasses.replace(self, fanouts=fanouts, all_neighbors=full)


class Block(NamedTuple):
    """Edges from level l (destinations) into level l + 1 (sources).

    Attributes:
      nbr: int32[C_l, K], positions of the sampled neighbours in level l + 1; 0 where masked.
      mask: bool[C_l, K], valid slots.
    """

    nbr: jax.Array
    mask: jax.Array


class MiniBatch(NamedTuple):
    """A sampled L-hop computation graph, all fixed shapes.

    Attributes:
      nodes: L + 1 arrays int32[C_l], global node ids per level; level 0 is the seeds,
        level l is a prefix of level l + 1.
      valid: L + 1 arrays bool[C_l], which entries are real nodes.
      degrees: L + 1 arrays int32[C_l], full-graph degree of each node (0 when padded).
      blocks: L Blocks; block l maps level l onto level l + 1.
      counts: int32[L + 1], real size of each level (may exceed capacity on overflow).
      overflow: bool scalar, some level did not fit its capacity.
    """

    nodes: tuple
    valid: tuple
    degrees: tuple
    blocks: tuple
    counts: jax.Array
    overflow: jax.Array

    def num_edges(self) -> jax.Array:
        """int32 scalar: sampled edges (valid neighbour slots) over every hop."""
        return sum(jnp.sum(b.mask.astype(jnp.int32)) for b in self.blocks)


def _degrees(indptr, ids, valid):
    return jnp.where(valid, (indptr[ids + 1] - indptr[ids]).astype(jnp.int32), 0)


def sample_minibatch(
    graph: CSRGraph,
    seeds: jax.Array,
    seed_valid: jax.Array,
    key: jax.Array,
    config: SamplerConfig,
    capacities: tuple[int, ...],
    kernels: Kernels = XLA,
) -> MiniBatch:
    """Samples the L-hop neighbourhood of `seeds` (jit-compatible, no host reads).

    Args:
      graph: device CSRGraph with N nodes.
      seeds: int32[B], seed ids; seed_valid: bool[B], True on a prefix (the padding of
        a last batch comes at the end). Valid seeds must be distinct.
      key: uint32 scalar for this step (`counter_hash.step_key(seed, epoch, step, 0)`); hop h
        uses `counter_hash.hash2(key, h)`.
      config: fanouts etc., with no -1 left (see `SamplerConfig.resolve`).
      capacities: (C_1, ..., C_L), non-decreasing and >= B. Ignored in tree mode,
        whose sizes are exact: C_{l+1} = C_l * (1 + f_l).
    """
    if any(f < 1 for f in config.fanouts):
        raise ValueError(f"unresolved fanouts {config.fanouts}: call SamplerConfig.resolve")
    n = graph.num_nodes
    ids = jnp.where(seed_valid, seeds, 0).astype(jnp.int32)
    valid = seed_valid
    count = jnp.sum(seed_valid.astype(jnp.int32))
    nodes, valids, degs, blocks, counts = [ids], [valid], [], [], [count]
    full = config.all_neighbors or (False,) * config.num_hops
    for hop, fanout in enumerate(config.fanouts):
        degs.append(_degrees(graph.indptr, ids, valid))
        nbr, mask = sample_neighbors(
            kernels, graph.indptr, graph.indices, ids, valid, counter_hash.hash2(key, hop), fanout,
            replace=config.replace, all_neighbors=full[hop],
        )
        if config.dedup:
            out = relabel(kernels, ids, count, nbr, mask, capacities[hop], n)
            ids, count, local = out.frontier, out.count, out.nbr_local
            valid = jnp.arange(ids.shape[0]) < count
        else:
            c = ids.shape[0]
            local = c + jnp.arange(c * fanout, dtype=jnp.int32).reshape(c, fanout)
            ids = jnp.concatenate([ids, nbr.reshape(-1)])
            valid = jnp.concatenate([valid, mask.reshape(-1)])
            count = jnp.sum(valid.astype(jnp.int32))
        blocks.append(Block(jnp.where(mask, local, 0), mask))
        nodes.append(ids)
        valids.append(valid)
        counts.append(count)
    degs.append(_degrees(graph.indptr, ids, valid))
    counts = jnp.stack(counts)
    caps = jnp.asarray([c.shape[0] for c in nodes], jnp.int32)
    overflow = jnp.any(counts > caps) if config.dedup else jnp.array(False)
    return MiniBatch(tuple(nodes), tuple(valids), tuple(degs), tuple(blocks), counts, overflow)


def tree_sizes(batch_size: int, fanouts) -> tuple[int, ...]:
    """Level sizes of tree (no-dedup) sampling: exact, (B, B(1+f_0), ...)."""
    sizes = [batch_size]
    for f in fanouts:
        sizes.append(sizes[-1] * (1 + f))
    return tuple(sizes)
