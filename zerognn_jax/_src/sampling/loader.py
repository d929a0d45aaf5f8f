"""A data loader over the device sampler, for users who write their own training loop.

`NeighborLoader` plays the part of PyG's `NeighborLoader` or DGL's `DataLoader`: it
shuffles the seed nodes every epoch and yields one sampled subgraph (`MiniBatch`) per
batch, with static shapes (the envelope) so a jitted step compiles once. Unlike the scan
engine it returns to Python after every batch and reads one flag to catch an overflow
(then grows the envelope and samples the batch again, with the same randomness), so a
loop written on it pays a host synchronisation per step; `train()` does not.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from zerognn_jax._src.data.graph import CSRGraph
from zerognn_jax._src.ops.registry import XLA, Kernels
from zerognn_jax._src.sampling.calibrate import choose_envelope
from zerognn_jax._src.sampling.envelope import DEFAULT_POLICY, Envelope, EnvelopePolicy, grow
from zerognn_jax._src.sampling.minibatch import MiniBatch, SamplerConfig
from zerognn_jax._src.sampling.seeds import counter_key, epoch_items, num_steps
from zerognn_jax._src.sampling.steps import sample_step


class LoaderBatch(NamedTuple):
    """One batch of a `NeighborLoader`.

    Attributes:
      minibatch: the sampled subgraph; `minibatch.nodes[0]` are the seeds (padding rows
        hold id 0) and `minibatch.valid[0]` marks the real ones.
      dropout_key: a `jax.random` key for this batch (from the loader's key, the epoch
        and the step), for the model's dropout.
      epoch, step: where the batch sits.
    """

    minibatch: MiniBatch
    dropout_key: jax.Array
    epoch: int
    step: int


class NeighborLoader:
    """Sampled mini-batches of `nodes` from `graph`, on the device.

    Args:
      graph: a CSRGraph (host or device arrays).
      nodes: int[M], the seed nodes (e.g. the training split).
      fanouts: neighbours per hop, seeds' hop first; -1 takes every neighbour.
      batch_size: seeds per batch; the last batch of an epoch is padded (masked).
      key: a `jax.random.key`, a legacy `jax.random.PRNGKey` or an integer.
      envelope: "calibrate" (tight, measured on the first epoch), "conservative", or an
        `Envelope`. It grows by itself when a batch does not fit.
      replace, dedup: as in `SamplerConfig`. kernels: which op implementations run.

    Iterating gives the batches of the next epoch (0, 1, ...); `epoch(e)` gives those of
    epoch `e`. The same key gives the same batches.
    """

    def __init__(self, graph: CSRGraph, nodes, *, fanouts, batch_size: int, key,
                 envelope: Envelope | str = "calibrate", replace: bool = False,
                 dedup: bool = True, policy: EnvelopePolicy = DEFAULT_POLICY,
                 kernels: Kernels = XLA):
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        nodes = np.asarray(nodes)
        if nodes.ndim != 1 or nodes.size == 0 or not np.issubdtype(nodes.dtype, np.integer):
            raise ValueError(f"nodes must be a non-empty 1-D integer array, got "
                             f"{nodes.dtype}{list(nodes.shape)}")
        if nodes.min() < 0 or nodes.max() >= graph.num_nodes:
            raise ValueError(f"nodes must lie in [0, {graph.num_nodes}), found "
                             f"[{nodes.min()}, {nodes.max()}]")
        # The run's seed as the engines take it: a non-negative int32 (its top bit dropped).
        self.seed = int(counter_key(key)) & 0x7FFFFFFF
        self.graph = graph.to_device()
        self.nodes = jnp.asarray(nodes, jnp.int32)
        self.batch_size, self.policy, self.kernels = batch_size, policy, kernels
        self.sampler = SamplerConfig(tuple(fanouts), replace=replace, dedup=dedup).resolve(
            graph.max_degree())
        if isinstance(envelope, str):
            envelope, _ = choose_envelope(self.graph, nodes, batch_size, self.sampler,
                                          method=envelope, seed=self.seed, policy=policy,
                                          kernels=kernels)
        self.envelope = envelope
        self._next_epoch = 0
        self._programs = {}

    def __len__(self) -> int:
        return num_steps(self.nodes.shape[0], self.batch_size)

    def __iter__(self) -> Iterator[LoaderBatch]:
        epoch, self._next_epoch = self._next_epoch, self._next_epoch + 1
        return self.epoch(epoch)

    def epoch(self, epoch: int) -> Iterator[LoaderBatch]:
        """The batches of epoch `epoch`, in order."""
        perm = epoch_items(self.nodes, self.batch_size, self.seed, epoch)
        for step in range(len(self)):
            yield self._batch(perm, epoch, step)

    def _sample(self, envelope: Envelope):
        if envelope not in self._programs:
            def sample(graph, perm, epoch, step):
                out = sample_step(graph, perm, step, seed=self.seed, epoch=epoch,
                                  batch_size=self.batch_size, config=self.sampler,
                                  envelope=envelope, kernels=self.kernels)
                return out.mb, out.drop_key
            self._programs[envelope] = jax.jit(sample)
        return self._programs[envelope]

    def _batch(self, perm, epoch: int, step: int) -> LoaderBatch:
        while True:
            mb, drop_key = self._sample(self.envelope)(
                self.graph, perm, jnp.int32(epoch), jnp.int32(step))
            if not bool(mb.overflow):  # one host read per batch
                return LoaderBatch(mb, drop_key, epoch, step)
            self.envelope = grow(self.envelope, np.asarray(mb.counts), self.policy)
