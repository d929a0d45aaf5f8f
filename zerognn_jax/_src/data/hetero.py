"""Typed graphs: node types with their counts, and relations with one CSRGraph each.

A relation is a triple `(src_type, name, dst_type)`. It carries messages from nodes of
`src_type` to nodes of `dst_type`, PyG's convention for an edge type: its edges are
given as (src ids of `src_type`, dst ids of `dst_type`), `edge_index[0]` and
`edge_index[1]`. Its `CSRGraph` has one row per `dst_type` node listing the `src_type`
nodes that row aggregates from, which is what row v of a homogeneous CSRGraph holds, so
`indptr` is [N_dst + 1] and `indices` lie in [0, N_src). Samplers start from
destinations and draw their sources, relation by relation (sampling/typed.py).

A homogeneous graph is the typed graph with one node type and one relation
(`as_hetero`, DGL's default names "_N" and "_E"): every relation is an ordinary
CSRGraph with its edge weights, edge-feature table and edge ids, not a second kind.

The node types and the relations are static (the graph's pytree aux data): their order
is the order they were given in, which fixes the order relations are sampled in.

Every relation is built by `from_edge_list` (rows dst, neighbours src); one whose edges
carry no weights or features takes its fast path, sorted keys on several threads.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Mapping

import jax
import numpy as np

from zerognn_jax._src.data.checks import is_whole
from zerognn_jax._src.data.graph import (
    CSRGraph,
    csr_from_arrays,
    from_edge_list,
    to_edge_list,
    validate_csr,
)

Relation = tuple[str, str, str]
_INT32_MAX = np.iinfo(np.int32).max


def relation_name(relation: Relation) -> str:
    """"src__name__dst", how a relation is written in messages and file names."""
    return "__".join(relation)


def named_relation(relations, key: str, what: str) -> Relation:
    """The one relation of `relations` that `key` names ("src__name__dst", or a name
    only one relation has); ValueError naming `what` (the option that gave `key`) and
    the relations otherwise."""
    if not isinstance(key, str):  # (an array compared with names is no bool)
        raise ValueError(f"{what} must name a relation (a string), got "
                         f"{type(key).__name__}")
    hits = [r for r in relations if key in (relation_name(r), r[1])]
    if not hits:
        raise ValueError(f"{what} {key!r} names no relation of the graph (it has "
                         f"{', '.join(map(relation_name, relations))})")
    if len(hits) > 1:
        raise ValueError(f"{what} {key!r} names more than one relation of the graph "
                         f"({', '.join(map(relation_name, hits))}): give one of these names")
    return hits[0]


@functools.partial(jax.tree_util.register_dataclass, data_fields=["graphs"],
                   meta_fields=["node_counts", "relations"])
@dataclasses.dataclass(frozen=True, eq=False)
class HeteroGraph:
    """Node types with counts, and relations with their CSR (module docstring).

    Attributes:
      node_counts: ((type, N_type), ...), static, in the order given.
      relations: ((src_type, name, dst_type), ...), static, in the order given.
      graphs: one CSRGraph per relation: int32[N_dst + 1] offsets (uint32 past 2**31
        edges), int32[E] source ids in [0, N_src), optional float32[E] weights and
        [E, D] edge features. NumPy on the host, JAX arrays after `to_device()`.
    """

    node_counts: tuple[tuple[str, int], ...]
    relations: tuple[Relation, ...]
    graphs: tuple[CSRGraph, ...]

    @property
    def node_types(self) -> tuple[str, ...]:
        return tuple(t for t, _ in self.node_counts)

    @property
    def num_nodes(self) -> dict[str, int]:
        """{type: N_type}."""
        return dict(self.node_counts)

    @property
    def num_edges(self) -> dict[Relation, int]:
        """{relation: E_relation}."""
        return {r: g.num_edges for r, g in zip(self.relations, self.graphs)}

    def __getitem__(self, relation: Relation) -> CSRGraph:
        try:
            return self.graphs[self.relations.index(tuple(relation))]
        except ValueError:
            raise KeyError(f"no relation {tuple(relation)}; the graph has "
                           f"{', '.join(map(relation_name, self.relations))}") from None

    def items(self):
        """(relation, CSRGraph) pairs in the graph's order."""
        return zip(self.relations, self.graphs)

    def into(self, dst_type: str) -> tuple[Relation, ...]:
        """The relations whose destinations are `dst_type` nodes."""
        return tuple(r for r in self.relations if r[2] == dst_type)

    def to_device(self, device=None) -> HeteroGraph:
        """The same graph with its arrays on `device` (default: JAX's default device)."""
        return jax.device_put(self, device)

    def homogeneous(self) -> CSRGraph:
        """The CSRGraph of a graph with one node type and one relation."""
        if len(self.node_counts) != 1 or len(self.relations) != 1:
            raise ValueError(f"only a graph of one node type and one relation is homogeneous; "
                             f"this one has {len(self.node_counts)} types and "
                             f"{len(self.relations)} relations")
        return self.graphs[0]

    def stats(self) -> dict:
        """Types with their counts and relations with their edge counts, largest
        in-degree and edge-feature width (where they have a table), as a
        JSON-serialisable dict."""
        return {"node_types": {t: int(n) for t, n in self.node_counts},
                "relations": {relation_name(r): _relation_stats(g) for r, g in self.items()}}


def _relation_stats(g: CSRGraph) -> dict:
    table = {} if g.edge_features is None else {"edge_features": int(g.edge_features.shape[1])}
    return {"edges": int(g.num_edges), "max_degree": g.max_degree(), **table}


def validate_hetero_graph(graph: HeteroGraph) -> None:
    """Raises ValueError naming the relation and the first problem of its CSR: offsets
    not [N_dst + 1], source ids outside [0, N_src), or what `validate_csr` refuses."""
    counts = dict(check_node_counts(graph.num_nodes))
    if len(graph.relations) != len(graph.graphs):
        raise ValueError(f"{len(graph.relations)} relations but {len(graph.graphs)} graphs")
    check_relation_names(graph.relations)
    for rel, g in graph.items():
        rel = check_relation(rel, counts)
        rows = np.shape(g.indptr)[0] - 1
        if rows != counts[rel[2]]:
            raise ValueError(f"relation {relation_name(rel)}: indptr has {rows + 1} entries, "
                             f"expected {counts[rel[2]] + 1} ({rel[2]} nodes + 1)")
        _check_sources(rel, g, counts)
        try:
            validate_csr(g.indptr, g.indices, g.weights, g.edge_features,
                         num_columns=counts[rel[0]])
        except (TypeError, ValueError) as err:
            raise ValueError(f"relation {relation_name(rel)}: {err}") from None


def _check_sources(rel: Relation, g: CSRGraph, counts: dict) -> None:
    """ValueError naming the source type where a relation's CSR `indices` (1-D integers:
    other shapes and dtypes are `validate_csr`'s to name) hold an id outside it."""
    indices = np.asarray(g.indices)
    if indices.ndim == 1 and np.issubdtype(indices.dtype, np.integer):
        check_type_ids(f"relation {relation_name(rel)}: indices", indices, rel[0],
                       counts[rel[0]])


def check_relation_names(relations) -> None:
    """ValueError unless every relation has a name of its own (`relation_name`): the
    names key models' parameters, fanouts and exported arguments."""
    named = {}
    for rel in relations:
        name = relation_name(rel)
        if name in named and named[name] == rel:
            raise ValueError(f"relation {name} is given twice")
        other = named.setdefault(name, rel)
        if other != rel:
            raise ValueError(f"relations {other} and {rel} have one name, {name}: rename a "
                             "type or relation (a '__' in a name joins up with the "
                             "separator)")


def check_node_counts(num_nodes: Mapping[str, int]) -> tuple[tuple[str, int], ...]:
    """`num_nodes` as ((type, count), ...), each type a non-empty string and each count
    an integer in [0, 2**31 - 1]; ValueError naming the first that is not."""
    if not isinstance(num_nodes, Mapping) or not num_nodes:
        raise ValueError(f"num_nodes must be a non-empty mapping {{type: count}}, got "
                         f"{type(num_nodes).__name__}")
    out = []
    for t, n in num_nodes.items():
        if not isinstance(t, str) or not t:
            raise ValueError(f"node types must be non-empty strings, got {t!r}")
        if not is_whole(n):
            raise ValueError(f"the count of node type {t!r} must be an integer, got {n!r}")
        if not 0 <= int(n) <= _INT32_MAX:
            raise ValueError(f"the count of node type {t!r} must lie in [0, 2**31 - 1], "
                             f"got {int(n)}")
        out.append((t, int(n)))
    return tuple(out)


def check_relation(relation, counts: Mapping[str, int]) -> Relation:
    """`relation` as a (src_type, name, dst_type) tuple of known types; ValueError."""
    if (not isinstance(relation, tuple) or len(relation) != 3
            or not all(isinstance(p, str) and p for p in relation)):
        raise ValueError(f"a relation must be a (src_type, name, dst_type) tuple of "
                         f"non-empty strings, got {relation!r}")
    for end in (relation[0], relation[2]):
        if end not in counts:
            raise ValueError(f"relation {relation_name(relation)} names node type {end!r}, "
                             f"which is not among the node types ({', '.join(counts)})")
    return relation


def check_type_ids(what: str, ids: np.ndarray, node_type: str, count: int) -> None:
    """Raises ValueError "<what> has <type> id <v> at position <i>, out of range for
    <count> <type> nodes", naming the first such entry as given (before any cast that
    could wrap it), unless every entry of `ids` lies in [0, count)."""
    if ids.size == 0 or (ids.min() >= 0 and ids.max() < count):
        return
    pos = int(np.argmax((ids < 0) | (ids >= count)))
    raise ValueError(f"{what} has {node_type} id {int(ids[pos])} at position {pos}, "
                     f"out of range for {count} {node_type} nodes")


def _edge_pair(relation: Relation, edges):
    """(src, dst) integer arrays, as given, from a (src, dst) pair or an int[2, E]
    edge_index."""
    name = relation_name(relation)
    if isinstance(edges, tuple | list) and len(edges) == 2:
        src, dst = np.asarray(edges[0]), np.asarray(edges[1])
    else:
        arr = np.asarray(edges)
        if arr.ndim != 2 or arr.shape[0] != 2:
            raise ValueError(f"relation {name}: edges must be (src, dst) or an edge_index "
                             f"[2, E], got shape {list(arr.shape)}")
        src, dst = arr
    for end, ids in (("src", src), ("dst", dst)):
        if ids.ndim != 1:
            raise ValueError(f"relation {name}: {end} must be one-dimensional, got shape "
                             f"{list(ids.shape)}")
        if ids.size and not np.issubdtype(ids.dtype, np.integer):
            raise ValueError(f"relation {name}: {end} ids must be integers, got {ids.dtype}")
    if src.shape != dst.shape:
        raise ValueError(f"relation {name}: src and dst differ in length: {src.shape[0]} vs "
                         f"{dst.shape[0]}")
    return src, dst


def hetero_graph(num_nodes: Mapping[str, int], edges: Mapping, *, weights: Mapping | None = None,
                 edge_features: Mapping | None = None, add_reverse: bool = False) -> HeteroGraph:
    """A HeteroGraph from plain dicts, checked at the boundary.

    Args:
      num_nodes: {type: count}.
      edges: {(src_type, name, dst_type): (src, dst)} with int arrays of one length E,
        src ids of src_type and dst ids of dst_type; an int[2, E] edge_index (PyG's
        layout) may stand for the pair.
      weights: {relation: float[E]}, optional per relation.
      edge_features: {relation: float[E, D]}, optional per relation (row i for edge i).
      add_reverse: add every relation's reverse (`add_reverse_relations`).

    Raises:
      ValueError: one line naming the relation and the problem: an unknown type, ids out
        of range of their type (with the id and its position), lengths that differ,
        non-integer ids, a weight or feature table of the wrong length, a relation given
        twice, or a weight/feature entry for a relation that has no edges given.
    """
    counts = dict(check_node_counts(num_nodes))
    relations, graphs = [], []
    for extra, table in (("weights", weights), ("edge_features", edge_features)):
        for rel in (table or {}):
            if tuple(rel) not in {tuple(r) for r in edges}:
                raise ValueError(f"{extra} are given for {rel!r}, which has no edges")
    for rel, pair in edges.items():
        rel = check_relation(tuple(rel) if isinstance(rel, list) else rel, counts)
        if rel in relations:
            raise ValueError(f"relation {relation_name(rel)} is given twice")
        src, dst = _edge_pair(rel, pair)
        check_type_ids(f"relation {relation_name(rel)}: src", src, rel[0], counts[rel[0]])
        check_type_ids(f"relation {relation_name(rel)}: dst", dst, rel[2], counts[rel[2]])
        src, dst = src.astype(np.int64, copy=False), dst.astype(np.int64, copy=False)
        w, f = (weights or {}).get(rel), (edge_features or {}).get(rel)
        try:
            graph = from_edge_list(dst, src, counts[rel[2]], num_columns=counts[rel[0]],
                                   weights=w, edge_features=f)
        except (TypeError, ValueError) as err:
            raise ValueError(f"relation {relation_name(rel)}: {err}") from None
        relations.append(rel)
        graphs.append(graph)
    graph = HeteroGraph(tuple(counts.items()), tuple(relations), tuple(graphs))
    graph = add_reverse_relations(graph) if add_reverse else graph
    check_relation_names(graph.relations)
    return graph


def hetero_from_csr(num_nodes: Mapping[str, int], csr: Mapping) -> HeteroGraph:
    """A HeteroGraph from {relation: CSRGraph or (indptr, indices)} already in CSR form
    (rows are destinations), validated: offsets [N_dst + 1], sources below N_src."""
    counts = dict(check_node_counts(num_nodes))
    relations, graphs = [], []
    for rel, g in csr.items():
        rel = check_relation(rel, counts)
        if rel in relations:
            raise ValueError(f"relation {relation_name(rel)} is given twice")
        g = g if isinstance(g, CSRGraph) else CSRGraph(*g)
        rows = np.shape(g.indptr)[0] - 1
        if rows != counts[rel[2]]:
            raise ValueError(f"relation {relation_name(rel)}: indptr has {rows + 1} entries, "
                             f"expected {counts[rel[2]] + 1} ({rel[2]} nodes + 1)")
        _check_sources(rel, g, counts)
        try:
            g = csr_from_arrays(g.indptr, g.indices, g.weights, edge_features=g.edge_features,
                                num_columns=counts[rel[0]])
        except (TypeError, ValueError) as err:
            raise ValueError(f"relation {relation_name(rel)}: {err}") from None
        relations.append(rel)
        graphs.append(g)
    check_relation_names(relations)
    return HeteroGraph(tuple(counts.items()), tuple(relations), tuple(graphs))


def as_hetero(graph: CSRGraph, node_type: str = "_N", name: str = "_E") -> HeteroGraph:
    """A homogeneous CSRGraph as the typed graph of one node type and one relation
    (node_type, name, node_type); the CSRGraph is kept as it is."""
    if not isinstance(graph, CSRGraph):
        raise TypeError(f"as_hetero takes a CSRGraph (zg.from_edge_list, ...), got "
                        f"{type(graph).__name__}")
    return HeteroGraph(((node_type, graph.num_nodes),), ((node_type, name, node_type),),
                       (graph,))


def add_reverse_relations(graph: HeteroGraph, *, prefix: str = "rev_",
                          merge: bool = True) -> HeteroGraph:
    """`graph` with every relation's reverse, as PyG's `ToUndirected` gives it.

    A relation (s, name, d) between two types gets (d, prefix + name, s), its edges
    turned round with their weights and edge features. With `merge`, a relation within
    one type (paper cites paper) becomes symmetric instead: its edges both ways, each
    pair once (the first listing kept). A reverse whose name is already taken is a
    ValueError.
    """
    relations, graphs = list(graph.relations), list(graph.graphs)
    counts = graph.num_nodes
    for i, (rel, g) in enumerate(graph.items()):
        rows, cols = to_edge_list(g)  # rows: dst ids, cols: src ids
        host = [None if a is None else np.asarray(a) for a in (g.weights, g.edge_features)]
        if merge and rel[0] == rel[2]:
            graphs[i] = from_edge_list(rows, cols, counts[rel[2]], weights=host[0],
                                       edge_features=host[1], make_undirected=True,
                                       remove_duplicates=True)
            continue
        rev = (rel[2], prefix + rel[1], rel[0])
        if rev in graph.relations:
            raise ValueError(f"the reverse of {relation_name(rel)} would be "
                             f"{relation_name(rev)}, which the graph already has: leave "
                             f"add_reverse off for a graph that holds its reverses (as "
                             f"PyG's ToUndirected leaves it), or give another prefix")
        relations.append(rev)
        graphs.append(from_edge_list(cols, rows, counts[rel[0]], num_columns=counts[rel[2]],
                                     weights=host[0], edge_features=host[1]))
    return HeteroGraph(graph.node_counts, tuple(relations), tuple(graphs))


