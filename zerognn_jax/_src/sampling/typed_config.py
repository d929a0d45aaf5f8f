"""What to sample on a typed graph: fanouts per relation and hop, and the static plan.

Fanouts are given in one of three layouts and kept as one, per relation a tuple over
hops (seeds' hop first):

  (15, 10)                              every relation takes 15, then 10 per destination
  {("author", "writes", "paper"): (15, 10), ...}      PyG's hetero `num_neighbors`
  [{("author", "writes", "paper"): 15, ...}, {...}]   one dict per hop, seeds' hop first

The third is DGL's shape in the opposite order: DGL's `NeighborSampler` lists its dicts
(and its ints) by layer, input layer first, so its last entry is the seeds' hop; pass
`list(reversed(dgl_fanouts))`.

A dict's keys may also be names: "author__writes__paper", or "writes" where only one
relation has that name (`named_relation`; mapped when the config is resolved).
Fanouts are whole numbers.

How these count, against PyG and DGL: a fanout f of relation r at hop h draws up to f
sources of r for every destination node of hop h, independently of the other relations
into the same type, so a paper with fanouts {writes: 10, cites: 5} draws up to 15
neighbours. PyG's `NeighborLoader` with a dict `num_neighbors` and DGL's
`MultiLayerNeighborSampler([{etype: f}])` / `sample_neighbors(fanout={etype: f})` count
the same way: per destination, per edge type, per hop. A relation with fanout 0 at a hop
is not sampled there (PyG and DGL skip 0 too); -1 takes every neighbour of that relation
(as in both), resolved to the relation's largest in-degree. A relation the dict layouts
leave out is an error here (PyG's `NumNeighbors` fills it from its `default`; DGL
wants one per edge type): every relation needs its fanouts stated, 0 included.

The plan is static: level 0 holds the seed type (or types: a link task's two ends); a
hop samples every relation whose destination type is in its level and whose fanout
there is positive, and level h + 1 holds the types of level h plus the sources of the
relations sampled. Types keep the order of first appearance; relations keep the graph's
order.
"""

from __future__ import annotations

import dataclasses
import numbers
from collections.abc import Mapping, Sequence
from typing import NamedTuple

from zerognn_jax._src.data.hetero import HeteroGraph, Relation, named_relation, relation_name
from zerognn_jax._src.sampling.minibatch import (
    MAX_HOPS,
    SAMPLERS,
    SamplerConfig,
    fanout_count,
    hop_width,
)


class HopPlan(NamedTuple):
    """One hop of the static plan: the relations it samples (graph order) and the node
    types of the level it builds (those of the level before it first)."""

    relations: tuple[Relation, ...]
    types: tuple[str, ...]


def seed_types(seed_type: str | tuple[str, ...]) -> tuple[str, ...]:
    """The types of level 0: one type, or a tuple of distinct types in order."""
    return (seed_type,) if isinstance(seed_type, str) else tuple(dict.fromkeys(seed_type))


def _key(relation) -> Relation | str:
    """A fanouts key: a (src, name, dst) triple, or a string naming one as
    `named_relation` reads it (mapped to the graph's relation by `resolve`)."""
    return relation if isinstance(relation, str) else tuple(relation)


def _shown(key) -> str:
    return key if isinstance(key, str) else relation_name(key)


def _normalize(fanouts) -> tuple:
    """Fanouts in a hashable layout: a tuple of ints, or ((relation, (f_0, ...)), ...)."""
    if isinstance(fanouts, Mapping):
        per_hop = lambda v: v if isinstance(v, Sequence) else (v,)
        return tuple((_key(r), tuple(fanout_count(f) for f in per_hop(v)))
                     for r, v in fanouts.items())
    if isinstance(fanouts, numbers.Real | str):
        raise ValueError(f"fanouts must list one fanout per hop (e.g. (15, 10)), or give "
                         f"them per relation; got {fanouts!r}")
    fanouts = tuple(fanouts)
    if fanouts and all(isinstance(f, Mapping) for f in fanouts):  # DGL: one dict per hop
        rels = list(dict.fromkeys(_key(r) for hop in fanouts for r in hop))
        named = [{_key(k) for k in hop} for hop in fanouts]
        missing = [(h, r) for h, hop in enumerate(named) for r in rels if r not in hop]
        if missing:
            h, r = missing[0]
            given = [str(g) for g, hop in enumerate(named) if r in hop]
            raise ValueError(f"the fanouts name relation {_shown(r)} at hop"
                             f"{'s' * (len(given) > 1)} {', '.join(given)} but not "
                             f"at hop {h}: give each relation at every hop (0 skips it), "
                             "spelled the same way at each (a triple or the same name: the "
                             "hops' keys are compared before the graph names them), and "
                             "check the name")
        return tuple((r, tuple(fanout_count({_key(k): v for k, v in hop.items()}[r])
                               for hop in fanouts)) for r in rels)
    if fanouts and isinstance(fanouts[0], tuple):
        return fanouts  # already normalized
    return tuple(fanout_count(f) for f in fanouts)


@dataclasses.dataclass(frozen=True)
class TypedSamplerConfig:
    """What to sample on a typed graph; static (hashable).

    Attributes:
      fanouts: per hop for every relation (a tuple of ints), or per relation a tuple
        over hops (the module docstring's layouts, normalized). `resolve` makes it
        the second, in the graph's relation order, with -1 replaced.
      replace, dedup, flat_outer, method, span, slot_tail, edge_ids: as
        `SamplerConfig`, for every relation. `dedup` deduplicates each level per node
        type; tree mode (False) lays each type's level out as the level before it
        followed by the sampled sources of each relation into the type, in relation
        order, slot order within.
      max_degrees, all_neighbors: per relation, its largest in-degree and per hop
        whether it takes every neighbour; set by `resolve`.
    """

    fanouts: tuple
    replace: bool = False
    dedup: bool = True
    flat_outer: bool = False
    method: str = "uniform"
    span: int = 128
    slot_tail: float = 1e-3
    edge_ids: bool = False
    max_degrees: tuple = ()
    all_neighbors: tuple = ()

    def __post_init__(self):
        object.__setattr__(self, "fanouts", _normalize(self.fanouts))
        hops = {len(f) for _, f in self.fanouts} if self.by_relation else {len(self.fanouts)}
        if len(hops) != 1 or not 1 <= min(hops) <= MAX_HOPS:
            raise ValueError(f"every relation needs the same number of hops, between 1 and "
                             f"{MAX_HOPS}; got {self.fanouts}")
        pairs = self.fanouts if self.by_relation else (("all", self.fanouts),)
        for rel, per_hop in pairs:
            for hop, f in enumerate(per_hop):
                if f < -1:
                    where = rel if rel == "all" else _shown(rel)
                    raise ValueError(f"fanout of {where} at hop {hop} must be >= 0 or -1 "
                                     f"(all), got {f}")
        for hop in range(self.num_hops):
            if all(per_hop[hop] == 0 for _, per_hop in pairs):
                raise ValueError(f"hop {hop} samples no relation (every fanout there is 0), "
                                 f"so its layer would see no neighbour: give a fanout above 0 "
                                 f"(or -1, all) to some relation there, or fewer hops")
        if self.method not in SAMPLERS:
            raise ValueError(f"the sampler (method) must be one of {', '.join(SAMPLERS)}, "
                             f"got {self.method!r}")
        self.relation_config(None)  # the shared options, checked by SamplerConfig

    @property
    def by_relation(self) -> bool:
        return bool(self.fanouts) and isinstance(self.fanouts[0], tuple)

    @property
    def num_hops(self) -> int:
        return len(self.fanouts[0][1]) if self.by_relation else len(self.fanouts)

    @property
    def resolved(self) -> bool:
        return bool(self.max_degrees)

    @property
    def relations(self) -> tuple[Relation, ...]:
        """The relations named, in order (after `resolve`: the graph's)."""
        return tuple(r for r, _ in self.fanouts) if self.by_relation else ()

    def fanout(self, relation: Relation, hop: int) -> int:
        """The fanout of `relation` at `hop` (after `resolve`: never -1)."""
        if not self.by_relation:
            return self.fanouts[hop]
        return dict(self.fanouts)[relation][hop]

    def resolve(self, graph: HeteroGraph) -> TypedSamplerConfig:
        """Fanouts for every relation of `graph` in its order, each as `hop_width` gives
        it for the relation's largest in-degree (-1, and a fanout above that degree
        without replacement, become the degree; the result belongs to that graph, as
        `SamplerConfig.resolve`'s does); ValueError for a relation named that
        the graph lacks, or one of the graph's left out."""
        if self.resolved and self.relations == graph.relations:
            return self
        given = {}
        for key, per_hop in self.fanouts if self.by_relation else ():
            rel = named_relation(graph.relations, key, "fanouts") if isinstance(key, str) \
                else key
            if rel in given:
                raise ValueError(f"fanouts give relation {relation_name(rel)} twice")
            given[rel] = per_hop
        unknown = [r for r in given if r not in graph.relations]
        if unknown:
            raise ValueError(f"fanouts name {relation_name(unknown[0])}, which the graph lacks "
                             f"(it has {', '.join(map(relation_name, graph.relations))})")
        missing = [r for r in graph.relations if self.by_relation and r not in given]
        if missing:
            raise ValueError(f"fanouts leave out relation {relation_name(missing[0])}; give "
                             "every relation its fanouts (0 skips it at a hop)")
        fanouts, full, degrees = [], [], []
        for rel, g in graph.items():
            per_hop = given[rel] if self.by_relation else self.fanouts
            top = g.max_degree()
            widths = [hop_width(f, top, self.method, self.replace) for f in per_hop]
            fanouts.append((rel, tuple(f for f, _ in widths)))
            full.append((rel, tuple(whole for _, whole in widths)))
            degrees.append((rel, top))
        return dataclasses.replace(self, fanouts=tuple(fanouts), all_neighbors=tuple(full),
                                   max_degrees=tuple(degrees))

    def relation_config(self, relation: Relation | None) -> SamplerConfig:
        """The homogeneous `SamplerConfig` that samples `relation` (after `resolve`), so
        each relation goes through the one per-hop sampler (`sample_hop`). A hop where
        the relation's fanout is 0 holds 1 there and is never sampled."""
        if relation is None:
            per_hop, full, top = (1,) * self.num_hops, (), 0
        else:
            per_hop = tuple(max(f, 1) for f in dict(self.fanouts)[relation])
            full, top = dict(self.all_neighbors)[relation], dict(self.max_degrees)[relation]
        return SamplerConfig(per_hop, replace=self.replace, dedup=self.dedup,
                             flat_outer=self.flat_outer, all_neighbors=full,
                             method=self.method, span=self.span, slot_tail=self.slot_tail,
                             max_degree=top, edge_ids=self.edge_ids)

    def slots(self, relation: Relation, hop: int) -> int:
        """Width K of `relation`'s block at `hop` (`SamplerConfig.slots`)."""
        return self.relation_config(relation).slots[hop]

    @property
    def positional(self) -> tuple[bool, ...]:
        """Per hop, whether its level is laid out by position (tree mode, a flat outer
        hop): no dedup, exact sizes (see `TypedSamplerConfig.dedup`)."""
        last = self.num_hops - 1
        return tuple(not self.dedup or (self.flat_outer and hop == last)
                     for hop in range(self.num_hops))

    def plan(self, seed_type: str | tuple[str, ...]) -> tuple[HopPlan, ...]:
        """The static plan of a batch whose seeds are `seed_type` nodes, or nodes of
        each type of a tuple (a link task's two ends; module doc)."""
        if not self.resolved:
            raise ValueError("unresolved typed fanouts: call TypedSamplerConfig.resolve(graph)")
        types, out = seed_types(seed_type), []
        for hop in range(self.num_hops):
            rels = tuple(r for r, f in self.fanouts if r[2] in types and f[hop] > 0)
            if not rels:  # (the hops' own check sees fanouts, not which types they reach)
                into = [relation_name(r) for r, _ in self.fanouts if r[2] in types]
                raise ValueError(
                    f"hop {hop} samples no relation into the {', '.join(map(repr, types))} "
                    f"nodes a batch of {seed_type!r} seeds holds there "
                    + (f"(the fanouts of {', '.join(into)} are 0 at that hop)" if into else
                       "(no relation of the graph leads into them)")
                    + ", so its layer would see no neighbour: give one of them a fanout "
                      "above 0 (or -1, all) there, or fewer hops")
            types = tuple(dict.fromkeys(types + tuple(r[0] for r in rels)))
            out.append(HopPlan(rels, types))
        return tuple(out)
