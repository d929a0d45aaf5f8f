"""A link split of one relation of a typed graph: the edges to train on, the graph that
message passing reads, and fixed evaluation pairs.

The predicted relation (src, name, dst) gives pairs (u, v) of a src node and a dst
node; its distinct pairs are split at random (85/5/10 by default). When both ends are
one type, a pair is unordered, {u, v}, as for homogeneous links: a relation made
symmetric (mag's cites) stores both directions, and (u, v) and (v, u) are one pair,
which lands in one split only (else a test pair's other direction would be trained
on), and a node's pair with itself is no pair to predict (its edges stay in the
message-passing graph; `random_link_split` drops them too). Val and test pairs leave
the message-passing graph (one type: in both directions): from the relation itself
and from its reverse, (dst, "rev_" + name, src) as `add_reverse_relations` names it
(or, for a relation called "rev_<name>", the relation it reverses), where the graph
has one; another relation joining the two types keeps the held-out pairs it has as
edges, and a warning says so. Edge features and weights of the edges
kept stay with them. Each evaluation split gets one negative per positive (uniform
pairs that are not pairs of the relation, none repeated, no (u, u) for one type) and,
with `mrr_negatives`, that many negative destinations per positive. The same (graph,
relation, fractions, seed) give the same split. `TypedLinkSplit.save` keeps a split's
pairs in a `.npz`, and `load` takes them back over the graph they were split from.
"""

from __future__ import annotations

import dataclasses
import json
import os
import warnings

import numpy as np

from zerognn_jax._src.data.checks import LibraryWarning, check_seed
from zerognn_jax._src.data.graph import CSRGraph, to_edge_list
from zerognn_jax._src.data.hetero import HeteroGraph, Relation, named_relation, relation_name
from zerognn_jax._src.data.links import (
    EVAL_KEYS,
    SPLITS,
    EvalEdges,
    check_fractions,
    check_mrr_negatives,
    destination_negatives,
    npz_path,
    require_graph,
    require_ids_in,
    require_train,
    sample_non_edges,
    saved_evals,
    split_archive,
    split_file,
    warn_empty_splits,
)
from zerognn_jax._src.data.writes import atomic_write

REVERSE_PREFIX = "rev_"


@dataclasses.dataclass(frozen=True)
class TypedLinkSplit:
    """Training pairs, the message-passing graph, and the evaluation splits.

    Attributes:
      relation: the predicted relation (src, name, dst).
      train: int32[E, 2] (src id, dst id), each in its type's ids.
      graph: the HeteroGraph without the val and test pairs (module docstring).
      val, test: EvalEdges in the same ids.
    """

    relation: Relation
    train: np.ndarray
    graph: HeteroGraph
    val: EvalEdges
    test: EvalEdges

    @property
    def ends(self) -> tuple[str, str]:
        return self.relation[0], self.relation[2]

    def save(self, path: str | os.PathLike) -> None:
        """Writes the split (its relation, the two ends' node counts, the training pairs
        and the evaluation pairs with their fixed negatives; not the graph) to a `.npz`
        (atomically; ".npz" is added to a path without it, as `np.savez` does).

        Raises:
          WriteError: the file could not be written (an OSError naming it).
        """
        src, _, dst = self.relation
        counts = self.graph.num_nodes
        meta = {"kind": "typed_link", "relation": list(self.relation),
                "num_nodes": {src: counts[src], dst: counts[dst]}}
        arrays = {"meta": np.array(json.dumps(meta)), "train": self.train}
        for key in EVAL_KEYS:
            split, part = key.split("_", 1)
            arrays[key] = getattr(getattr(self, split), part)
        with atomic_write(npz_path(path), "link split file") as f:
            np.savez(f, **arrays)

    @classmethod
    def load(cls, path: str | os.PathLike, graph: HeteroGraph) -> TypedLinkSplit:
        """Reads a split written by `save` (at `path`, or at `path` + ".npz" as `save`
        names it). Its message-passing graph is `graph` (the typed graph it was split
        from, or that split's own graph) whose relation and its reverse keep the
        training pairs alone (and a one-type relation's (u, u) edges, no pairs to
        predict), as `typed_link_split` leaves them: a split of one's own that trains on
        fewer pairs than the graph holds (the older ones of a split by time) passes no
        message over the others. ValueError naming the file when it is no such split,
        or when `graph` lacks its relation or has other node counts."""
        require_graph("TypedLinkSplit.load", graph, HeteroGraph)
        with split_archive(path, "typed_link", ("meta", "train", *EVAL_KEYS)) as f:
            try:
                relation, evals, train = _read_split(f, graph)
            except ValueError as err:
                raise ValueError(f"{split_file(path)}: {err}") from None
        untrained = {"val": _untrained(graph, relation, train),
                     "test": np.zeros((0, 2), np.int64)}
        return cls(relation, train, _message_graph(graph, relation, untrained),
                   evals["val"], evals["test"])


def _untrained(graph: HeteroGraph, relation: Relation, train: np.ndarray) -> np.ndarray:
    """int64[Q, 2] the pairs of `relation` in `graph` that `train` lacks (either way
    round where both ends are one type, whose (u, u) pairs are no pairs to hold out)."""
    n_dst = graph.num_nodes[relation[2]]
    trained = train.astype(np.int64)
    if relation[0] == relation[2]:
        trained = np.concatenate([trained, trained[:, ::-1]])
    pairs = relation_pairs(graph[relation])
    out = ~np.isin(pairs[:, 0] * n_dst + pairs[:, 1], trained[:, 0] * n_dst + trained[:, 1])
    if relation[0] == relation[2]:
        out &= pairs[:, 0] != pairs[:, 1]
    return pairs[out]


def _read_split(f, graph: HeteroGraph) -> tuple[Relation, dict, np.ndarray]:
    """(relation, {"val": EvalEdges, "test": ...}, train) of a saved split's open `.npz`,
    each array checked against `graph` (its ends' counts, ids in range); ValueError."""
    meta = json.loads(str(f["meta"]))
    try:
        relation, sizes = tuple(meta["relation"]), dict(meta["num_nodes"])
    except (KeyError, TypeError, ValueError):
        raise ValueError(f"its meta entry is no split's (relation and num_nodes): "
                         f"{str(f['meta'])[:200]}") from None
    if relation not in graph.relations:
        raise ValueError(f"it splits {relation_name(relation)}, which the graph lacks (it "
                         f"has {', '.join(map(relation_name, graph.relations))})")
    counts = graph.num_nodes
    for end, count in sizes.items():
        if counts[end] != count:
            raise ValueError(f"it was split from a graph of {count} {end} nodes; this one "
                             f"has {counts[end]}")
    n_src, n_dst = counts[relation[0]], counts[relation[2]]
    train = f["train"]
    require_train(train)
    evals = saved_evals(f)
    ends = {"train": train, **{f"{s}_{k}": getattr(evals[s], k) for s in SPLITS
                               for k in ("pos", "neg")}}
    for name, pairs in ends.items():
        for column, (end, n) in enumerate(((relation[0], n_src), (relation[2], n_dst))):
            require_ids_in(name, pairs[:, column], n, end)
    for s in SPLITS:
        require_ids_in(f"{s}_neg_dst", evals[s].neg_dst, n_dst, relation[2])
    # the training pairs are edges of the graph split and of the split's own graph alike
    pairs = relation_pairs(graph[relation])
    if relation[0] == relation[2]:  # unordered pairs, stored as (min, max)
        pairs = np.sort(pairs, axis=1)
    absent = ~np.isin(train[:, 0].astype(np.int64) * n_dst + train[:, 1],
                      pairs[:, 0] * n_dst + pairs[:, 1])
    if absent.any():
        u, v = (int(x) for x in train[np.flatnonzero(absent)[0]])
        raise ValueError(f"{int(absent.sum())} of its {len(train)} training pairs are no "
                         f"edges of {relation_name(relation)} in this graph (the first: "
                         f"({u}, {v})): it was split from another graph")
    return relation, evals, train


def find_relation(graph: HeteroGraph, key: str | None) -> Relation:
    """The relation `key` names ("src__name__dst", or its name where unique); None
    names the graph's one relation. ValueError, listing the relations, otherwise."""
    if key is None:
        if len(graph.relations) == 1:
            return graph.relations[0]
        names = ", ".join(map(relation_name, graph.relations))
        raise ValueError(f"link prediction on a typed graph needs the relation to predict "
                         f"(link_relation, --link-relation): one of {names}")
    return named_relation(graph.relations, key, "link_relation")


def reverse_of(graph: HeteroGraph, relation: Relation) -> Relation | None:
    """The graph's reverse of `relation` by name (module docstring), or None."""
    src, name, dst = relation
    names = [REVERSE_PREFIX + name]
    if name.startswith(REVERSE_PREFIX):
        names.append(name[len(REVERSE_PREFIX):])
    for candidate in names:
        if (dst, candidate, src) in graph.relations and (dst, candidate, src) != relation:
            return dst, candidate, src
    return None


def _warn_kept(graph: HeteroGraph, relation: Relation, reverse, held_keys: np.ndarray
               ) -> None:
    """Warns of each relation other than `relation` and its `reverse` that joins the
    same two types (either way) and has an edge that is a pair held out of training
    (`held_keys`, src * n_dst + dst: evaluated, or in a split file's graph but not its
    training pairs): it stays there, where message passing reads it while the held-out
    pairs are evaluated (a `views` relation holding every `buys` pair, say, or a reverse
    not named as `reverse_of` finds it)."""
    src, _, dst = relation
    n_dst = graph.num_nodes[dst]
    for rel, g in graph.items():
        if rel in (relation, reverse) or {rel[0], rel[2]} != {src, dst} or not g.num_edges:
            continue
        pairs = relation_pairs(g)
        # (one type: the held-out keys hold both directions already)
        forward = (rel[0], rel[2]) == (src, dst)
        kept = _held(pairs if forward else pairs[:, ::-1], held_keys, n_dst).sum()
        if kept:
            warnings.warn(f"link split of {relation_name(relation)}: {int(kept)} edges of "
                          f"{relation_name(rel)} are pairs held out of training, which stay "
                          f"there (only the relation and its reverse, named "
                          f"{REVERSE_PREFIX}{relation[1]}, lose them): the model reads them "
                          f"while it is evaluated on the held-out pairs; remove them from "
                          f"{relation_name(rel)}", LibraryWarning, stacklevel=4)


def relation_pairs(g: CSRGraph) -> np.ndarray:
    """int64[E, 2] (source, destination) of every edge of a relation's CSR (rows are
    destinations), in CSR order."""
    rows, sources = to_edge_list(g)
    return np.stack([sources, rows], 1).astype(np.int64)


def _without(g: CSRGraph, drop: np.ndarray) -> CSRGraph:
    """`g` without the edges at the CSR positions where `drop` holds, order kept."""
    keep = ~drop
    rows, indices = to_edge_list(g)
    counts = np.bincount(rows[keep], minlength=g.num_nodes)
    indptr = np.concatenate([[0], np.cumsum(counts)]).astype(np.asarray(g.indptr).dtype)
    pick = lambda a: None if a is None else np.asarray(a)[keep]
    return CSRGraph(indptr, indices[keep], pick(g.weights), pick(g.edge_features))


def _held(pairs: np.ndarray, held_keys: np.ndarray, n_dst: int) -> np.ndarray:
    """bool[len(pairs)]: which (src, dst) rows have their key among the sorted keys."""
    if not held_keys.size:
        return np.zeros(pairs.shape[0], bool)
    keys = pairs[:, 0] * n_dst + pairs[:, 1]
    at = np.minimum(np.searchsorted(held_keys, keys), held_keys.size - 1)
    return held_keys[at] == keys


def typed_link_split(graph: HeteroGraph, relation: Relation | str, *, val: float = 0.05,
                     test: float = 0.10, seed: int = 0, mrr_negatives: int = 0
                     ) -> TypedLinkSplit:
    """A random split of `relation`'s distinct pairs (module docstring); `relation` is a
    (src, name, dst) triple, or a string as `named_relation` reads it ("src__name__dst",
    or a name only one relation has). `val` and `test` are the shares of the pairs held
    out for each (their sum below 1), drawn with `seed`; `mrr_negatives` > 0 gives each
    held-out pair that many negative destinations for MRR and Hits@K."""
    require_graph("typed_link_split", graph, HeteroGraph)
    check_fractions(val, test)
    seed = check_seed(seed)
    if isinstance(relation, str):
        relation = named_relation(graph.relations, relation, "relation")
    elif tuple(relation) not in graph.relations:
        raise ValueError(f"relation {relation!r} is not one of the graph's "
                         f"({', '.join(map(relation_name, graph.relations))})")
    src_t, _, dst_t = relation = tuple(relation)
    counts = graph.num_nodes
    n_src, n_dst = counts[src_t], counts[dst_t]
    if n_src < 1 or n_dst < 2:
        raise ValueError(f"a link split of {relation_name(relation)} needs a source and two "
                         f"destinations, got {n_src} {src_t} and {n_dst} {dst_t} nodes")
    same = src_t == dst_t
    pairs = relation_pairs(graph[relation])
    if same:  # unordered: {u, v} as (min, max), no (u, u)
        pairs = np.sort(pairs[pairs[:, 0] != pairs[:, 1]], axis=1)
    keys = np.unique(pairs[:, 0] * n_dst + pairs[:, 1])
    rng = np.random.default_rng(seed)
    keys_perm = keys[rng.permutation(keys.size)]
    n_val, n_test = int(val * keys.size), int(test * keys.size)
    mrr_negatives = check_mrr_negatives(mrr_negatives, n_val, n_test)
    held = n_val + n_test
    if keys.size - held < 1:
        raise ValueError(f"{relation_name(relation)} has {keys.size} distinct pairs"
                         f"{' of two nodes' if same else ''}: none left to train")
    warn_empty_splits(val, test, n_val, n_test, keys.size,
                      f"distinct pairs of {relation_name(relation)}")
    as_pairs = lambda k: np.stack([k // n_dst, k % n_dst], 1).astype(np.int32)
    positives = {"val": as_pairs(keys_perm[:n_val]), "test": as_pairs(keys_perm[n_val:held])}
    message = _message_graph(graph, relation, positives)  # (warns of pairs kept elsewhere)
    evals = {}
    for name, pos in positives.items():
        neg = sample_non_edges(rng, pos.shape[0], n_dst, keys,
                               num_sources=None if same else n_src,
                               relation=relation_name(relation))
        evals[name] = EvalEdges(pos, neg, destination_negatives(rng, pos, n_dst,
                                                                mrr_negatives))
    return TypedLinkSplit(relation, as_pairs(keys_perm[held:]), message, evals["val"],
                          evals["test"])


def _message_graph(graph: HeteroGraph, relation: Relation, positives: dict) -> HeteroGraph:
    """`graph` without the held-out `positives` (int[P, 2] (src, dst) pairs of
    `relation` by split): from the relation itself and from its reverse, both directions
    where both ends are one type (module docstring); other relations that hold such a
    pair are warned of (`_warn_kept`)."""
    n_dst = graph.num_nodes[relation[2]]
    held = np.concatenate([positives[s] for s in SPLITS]).astype(np.int64)
    if relation[0] == relation[2]:  # both directions of a held-out pair leave
        held = np.concatenate([held, held[:, ::-1]])
    held_keys = np.unique(held[:, 0] * n_dst + held[:, 1])
    reverse = reverse_of(graph, relation)
    _warn_kept(graph, relation, reverse, held_keys)
    graphs = []
    for rel, g in graph.items():
        if rel == relation:
            g = _without(g, _held(relation_pairs(g), held_keys, n_dst))
        elif rel == reverse:  # its (source, destination) is the relation's (dst, src)
            g = _without(g, _held(relation_pairs(g)[:, ::-1], held_keys, n_dst))
        graphs.append(g)
    return HeteroGraph(graph.node_counts, graph.relations, tuple(graphs))
