"""L-hop neighbour sampling of a typed mini-batch into fixed-capacity buffers per type.

Each hop runs, for every relation of the static plan (`TypedSamplerConfig.plan`), the
homogeneous per-hop sampler (`sample_hop`: uniform, weighted, LABOR, full) on that
relation's CSRGraph from the destinations of its type, then builds each node type of the
next level from that type's level before it and the sources drawn into it by every
relation: deduplicated by the relabel op (one call per type, the relations' draws
pooled), or laid out by position (tree mode). A Python loop over relations and types
inside the trace: the number of launches is fixed by the plan, not by the data.

Keys. Relation i of the graph (its order) draws hop h from
`counter_hash.hash2(key, h + MAX_HOPS * i)`, so relation 0 draws what the homogeneous
sampler draws, and a graph of one type and one relation gives exactly the homogeneous
`sample_minibatch` (nodes, blocks, edge ids, counts, overflow; a test holds it).

Pooling. The relabel op dedups a frontier of C rows and a [C, K] draw. The draws of the
relations into one type are flattened in relation order and padded (masked) to a
multiple of the type's frontier size; an absent type gets a one-row empty frontier. The
new frontier keeps the old one as its prefix, then the new ids in order of first
occurrence: relation by relation, row by row. With one relation nothing is padded.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from zerognn_jax._src.data.hetero import HeteroGraph, relation_name
from zerognn_jax._src.ops.registry import XLA, Kernels
from zerognn_jax._src.ops.relabel import relabel
from zerognn_jax._src.pallas import counter_hash
from zerognn_jax._src.sampling.envelope import check_slots
from zerognn_jax._src.sampling.minibatch import MAX_HOPS, Block, prepare_graph, sample_hop
from zerognn_jax._src.sampling.seeds import counter_key, step_items, step_keys
from zerognn_jax._src.sampling.typed_config import TypedSamplerConfig
from zerognn_jax._src.sampling.typed_envelope import TypedEnvelope


class TypedMiniBatch(NamedTuple):
    """A sampled typed L-hop computation graph, all fixed shapes.

    Attributes:
      nodes: L + 1 dicts {type: int32[C_{l,t}]}, global ids (of their type) per level;
        level 0 is {seed_type: seeds} (or the seeds of each seed type); a type's level
        l is a prefix of its level l + 1.
      valid: L + 1 dicts {type: bool[C_{l,t}]}, which entries are real nodes.
      degrees: L + 1 dicts {relation: int32[C_{l,dst}]}, for every relation whose
        destination type is in level l: the full in-degree in that relation of each
        level-l node of that type (0 when padded).
      blocks: L dicts {relation: Block}; block l of relation (s, n, d) maps level l's
        d nodes onto level l + 1's s nodes: nbr int32[C_{l,d}, K] positions in
        `nodes[l + 1][s]`, mask bool[C_{l,d}, K], eid (with `edge_ids`) each slot's
        CSR position in the relation's graph.
      counts: {type: int32[L + 1]}, real size of each level of the type (0 where the
        type is absent; may exceed the capacity on overflow).
      overflow: bool scalar, some (level, type) did not fit its capacity.
    """

    nodes: tuple
    valid: tuple
    degrees: tuple
    blocks: tuple
    counts: dict
    overflow: jax.Array

    def num_edges(self) -> jax.Array:
        """int32 scalar: sampled edges (valid slots) over every hop and relation."""
        return sum(jnp.sum(b.mask.astype(jnp.int32)) for hop in self.blocks
                   for b in hop.values())


def prepare_typed_graph(graph: HeteroGraph, config: TypedSamplerConfig) -> HeteroGraph:
    """The graph as `sample_typed` reads it: for weighted sampling, the weights of every
    relation that is sampled at some hop turned into its cumulative table
    (`prepare_graph`); host-side, once."""
    config = config.resolve(graph)
    graphs = tuple(prepare_graph(g, config.relation_config(r), f"relation {relation_name(r)}")
                   if any(config.fanout(r, h) for h in range(config.num_hops)) else g
                   for r, g in graph.items())
    return HeteroGraph(graph.node_counts, graph.relations, graphs)


def _degrees(indptr, ids, valid):
    return jnp.where(valid, (indptr[ids + 1] - indptr[ids]).astype(jnp.int32), 0)


def _pooled_relabel(kernels: Kernels, frontier, count, draws, capacity: int, num_nodes: int):
    """(next frontier, real count, [local positions [C_r, K_r] per draw]): the relabel
    op over the draws [(nbr, mask), ...] into one type, pooled (module docstring)."""
    if frontier.shape[0] == 0:
        frontier = jnp.zeros((1,), jnp.int32)
    c = frontier.shape[0]
    ids = jnp.concatenate([nbr.reshape(-1) for nbr, _ in draws])
    live = jnp.concatenate([mask.reshape(-1) for _, mask in draws])
    m = ids.shape[0]
    k = -(-m // c)
    ids = jnp.pad(ids, (0, c * k - m)).reshape(c, k)
    live = jnp.pad(live, (0, c * k - m)).reshape(c, k)
    # a type without nodes draws nothing; its id table still needs an entry
    out = relabel(kernels, frontier, count, ids, live, capacity, max(num_nodes, 1))
    flat, parts, start = out.nbr_local.reshape(-1), [], 0
    for nbr, _ in draws:
        parts.append(flat[start:start + nbr.size].reshape(nbr.shape))
        start += nbr.size
    return out.frontier, out.count, parts


def _positional(frontier, valid, draws):
    """Tree layout of one type: the level before, then each draw's slots in order."""
    ids = jnp.concatenate([frontier] + [nbr.reshape(-1) for nbr, _ in draws])
    live = jnp.concatenate([valid] + [mask.reshape(-1) for _, mask in draws])
    parts, start = [], frontier.shape[0]
    for nbr, _ in draws:
        parts.append(start + jnp.arange(nbr.size, dtype=jnp.int32).reshape(nbr.shape))
        start += nbr.size
    return ids, live, jnp.sum(live.astype(jnp.int32)), parts


def sample_typed(graph: HeteroGraph, seeds: jax.Array, seed_valid: jax.Array, key: jax.Array,
                 config: TypedSamplerConfig, envelope: TypedEnvelope,
                 kernels: Kernels = XLA) -> TypedMiniBatch:
    """Samples the typed L-hop neighbourhood of `seeds` (jit-compatible, no host reads).

    Args:
      graph: device HeteroGraph (`prepare_typed_graph` first for weighted sampling).
      seeds: int32[B] ids of `envelope.seed_type` nodes; seed_valid: bool[B], True on a
        prefix. Valid seeds must be distinct. Or dicts {type: int32[B_t]},
        {type: bool[B_t]} of level 0's types (several: a tuple `envelope.seed_type`).
      key: uint32 scalar for this step (or a `jax.random` key; `counter_key`).
      config: resolved against `graph` (`TypedSamplerConfig.resolve`).
      envelope: capacities per (level, type) for `config.plan(envelope.seed_type)`
        (`typed_conservative`, calibration); positional hops must hold their exact
        sizes (`fit_typed_envelope`).
      kernels: which implementation runs each op (sample, relabel, ...): XLA or Pallas
        (`Kernels`, ops/registry.py).
    """
    key = counter_key(key)
    if not config.resolved or config.relations != graph.relations:
        raise ValueError("sample_typed needs fanouts resolved against this graph: pass "
                         "config.resolve(graph) (outside jit: it reads the degrees)")
    plan = config.plan(envelope.seed_type)
    if len(plan) != envelope.num_hops:
        raise ValueError(f"the envelope has {envelope.num_hops} hops, the fanouts {len(plan)}")
    index = {r: i for i, r in enumerate(graph.relations)}
    counts_n = graph.num_nodes
    if not isinstance(seeds, dict):
        seeds, seed_valid = {envelope.seed_type: seeds}, {envelope.seed_type: seed_valid}
    ids = {t: jnp.where(seed_valid[t], seeds[t], 0).astype(jnp.int32)
           for t in envelope.level(0)}
    valid = {t: seed_valid[t] for t in ids}
    count = {t: jnp.sum(valid[t].astype(jnp.int32)) for t in ids}
    nodes, valids, counts, degrees, blocks = [ids], [valid], [count], [], []
    for hop, step in enumerate(plan):
        degrees.append({r: _degrees(g.indptr, ids[r[2]], valid[r[2]])
                        for r, g in graph.items() if r[2] in ids})
        drawn = {r: sample_hop(graph[r], ids[r[2]], valid[r[2]],
                               counter_hash.hash2(key, hop + MAX_HOPS * index[r]),
                               config.relation_config(r), hop, kernels)
                 for r in step.relations}
        caps = envelope.level(hop + 1)
        new_ids, new_valid, new_count, local = {}, {}, {}, {}
        for t in step.types:
            into = [r for r in step.relations if r[0] == t]
            prev = ids.get(t, jnp.zeros((0,), jnp.int32))
            if not into:  # a type that only carries over
                new_ids[t] = jnp.pad(prev, (0, caps[t] - prev.shape[0]))
                new_valid[t] = jnp.pad(valid[t], (0, caps[t] - prev.shape[0]))
                new_count[t] = count[t]
                continue
            draws = [drawn[r][:2] for r in into]
            check_slots(f"hop {hop + 1}", sum(nbr.size for nbr, _ in draws),
                        f" of {t!r} nodes")
            if config.positional[hop]:
                prev_valid = valid.get(t, jnp.zeros((0,), bool))
                new_ids[t], new_valid[t], new_count[t], parts = _positional(prev, prev_valid,
                                                                            draws)
            else:
                new_ids[t], new_count[t], parts = _pooled_relabel(
                    kernels, prev, count.get(t, jnp.int32(0)), draws, caps[t], counts_n[t])
                new_valid[t] = jnp.arange(caps[t]) < new_count[t]
            local.update(zip(into, parts))
        blocks.append({r: Block(jnp.where(drawn[r][1], local[r], 0), drawn[r][1], drawn[r][2])
                       for r in step.relations})
        ids, valid, count = new_ids, new_valid, new_count
        nodes.append(ids)
        valids.append(valid)
        counts.append(count)
    degrees.append({r: _degrees(g.indptr, ids[r[2]], valid[r[2]])
                    for r, g in graph.items() if r[2] in ids})
    return TypedMiniBatch(tuple(nodes), tuple(valids), tuple(degrees), tuple(blocks),
                          *_counts(counts, nodes, config.dedup))


def _counts(counts: list, nodes: list, dedup: bool):
    """({type: int32[L + 1]}, overflow) from per-level {type: count} dicts."""
    types = list(dict.fromkeys(t for level in counts for t in level))
    zero = jnp.int32(0)
    stacked = {t: jnp.stack([level.get(t, zero) for level in counts]).astype(jnp.int32)
               for t in types}
    caps = {t: jnp.asarray([lvl[t].shape[0] if t in lvl else 0 for lvl in nodes], jnp.int32)
            for t in types}
    overflow = jnp.array(False)
    if dedup:
        overflow = jnp.any(jnp.stack([jnp.any(stacked[t] > caps[t]) for t in types]))
    return stacked, overflow


class TypedStepSample(NamedTuple):
    """One step's items (int32[B] seeds), valid mask, keys and typed minibatch."""

    items: jax.Array
    valid: jax.Array
    key: jax.Array
    drop_key: jax.Array
    mb: TypedMiniBatch


def sample_typed_step(graph: HeteroGraph, perm, batch_index, *, seed, epoch, batch_size: int,
                      config: TypedSamplerConfig, envelope: TypedEnvelope,
                      kernels: Kernels = XLA, active=None, level0=None,
                      key_step=None) -> TypedStepSample:
    """Samples batch `batch_index` of the padded permutation `perm` of seed-type ids,
    with the keys `sample_step` uses (jit-compatible; `key_step` as there). `level0`,
    where the items are not the seeds themselves (a link task's edges): a static
    callable (items, valid, key, envelope) -> (seeds, seed_valid) as `sample_typed`
    takes them."""
    items, valid = step_items(perm, batch_index, batch_size)
    if active is not None:
        valid = valid & active
    key, drop_key = step_keys(seed, epoch, batch_index if key_step is None else key_step)
    seeds, seed_valid = (items, valid) if level0 is None else level0(items, valid, key,
                                                                     envelope)
    mb = sample_typed(graph, seeds, seed_valid, key, config, envelope, kernels)
    return TypedStepSample(items, valid, key, drop_key, mb)


def host_counts(mb_counts: dict) -> dict[str, np.ndarray]:
    """{type: int64[..., L + 1]} on the host, from a minibatch's (or a scan's) counts."""
    return {t: np.asarray(c) for t, c in mb_counts.items()}
