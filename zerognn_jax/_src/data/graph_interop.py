"""Conversion of a `GraphCollection` from and to jraph's `GraphsTuple` and PyTorch
Geometric's `Data` / `Batch`: interop only; jraph and torch are imported when called.

A `GraphsTuple` is the collection as one disjoint union (senders and receivers index
the concatenated nodes); its `globals` carry the targets. PyG's graphs keep local
`edge_index` [2, E] (row 0 the sources) per `Data`, targets in `y`.
"""

from __future__ import annotations

import warnings

import numpy as np

from zerognn_jax._src.data.graphs import GraphCollection, make_collection
from zerognn_jax._src.data.optional import need


def _shift(c: GraphCollection) -> np.ndarray:
    """int64[E]: each edge's graph's first node row."""
    return np.repeat(c.node_offsets[:-1], c.n_edge)


def collection_to_jraph(collection: GraphCollection):
    """The collection as one `jraph.GraphsTuple` (NumPy arrays): nodes, edges (None
    without edge features), global senders/receivers, n_node, n_edge, and the targets
    as `globals` (one row per graph). A GraphsTuple has no place for the rest: the
    name, target kind, number of classes, splits and the categorical columns'
    vocabularies are given back to `collection_from_jraph` by hand
    (`collection_from_jraph(t, name=c.name, target_kind=c.target_kind,
    num_classes=c.num_classes, splits=(c.train_idx, c.val_idx, c.test_idx),
    node_vocab=c.node_vocab, edge_vocab=c.edge_vocab)`)."""
    jraph = need("jraph", "collection_to_jraph")
    c = collection
    shift = _shift(c)
    return jraph.GraphsTuple(
        nodes=c.node_features, edges=c.edge_features,
        senders=(c.senders + shift).astype(np.int32),
        receivers=(c.receivers + shift).astype(np.int32),
        n_node=c.n_node.astype(np.int32), n_edge=c.n_edge.astype(np.int32),
        globals=c.targets)


def collection_from_jraph(graphs, *, name: str = "jraph", target_kind: str = "binary",
                          targets=None, graph_mask=None, splits=None, num_classes: int = 0,
                          node_vocab=(), edge_vocab=()) -> GraphCollection:
    """A collection from a `jraph.GraphsTuple` of several graphs (senders and receivers
    global, as `jraph.batch` leaves them). Targets are `targets` if given, else the
    tuple's `globals`: one row per graph of the tuple.

    A tuple padded by `jraph.pad_with_graphs` holds padding graphs that would otherwise
    become graphs of the collection: pass `graph_mask` (bool[G], True for the real
    graphs: `jraph.get_graph_padding_mask(graphs)`) to leave them out with their nodes,
    edges and targets (`targets` may then also give one row per real graph); `splits`
    then number the graphs kept.

    Raises ValueError if the tuple has no node features, edge features in a dict, no
    targets (globals missing or a dict, and no `targets`), an edge leaves its graph,
    `graph_mask` does not hold one entry per graph, or `targets` fits neither count."""
    if graphs.nodes is None or isinstance(graphs.nodes, dict):
        raise ValueError(f"the GraphsTuple's nodes must be one array [N, d] of node features "
                         f"(a collection's graphs carry them), got "
                         f"{type(graphs.nodes).__name__}")
    if isinstance(graphs.edges, dict):
        raise ValueError(f"the GraphsTuple's edges must be one array [E, d] of edge features "
                         f"or None, got a dict (keys {sorted(graphs.edges)})")
    n_node, n_edge = _jraph_counts(graphs)
    start = np.concatenate([[0], np.cumsum(n_node)[:-1]])
    shift = np.repeat(start, n_edge)
    for field in ("senders", "receivers"):  # named with the ids the tuple holds
        ids = np.asarray(getattr(graphs, field), np.int64)
        out = np.flatnonzero((ids < shift) | (ids >= shift + np.repeat(n_node, n_edge)))
        if out.size:
            e = int(out[0])
            g = int(np.searchsorted(np.cumsum(n_edge), e, side="right"))
            raise ValueError(f"{field}[{e}] = {int(ids[e])} leaves its graph {g}, whose nodes "
                             f"are [{int(start[g])}, {int(start[g] + n_node[g])}) of the tuple")
    if targets is None:
        if graphs.globals is None:
            raise ValueError("the GraphsTuple has no globals: pass targets=")
        if isinstance(graphs.globals, dict):
            raise ValueError(f"the GraphsTuple's globals are a dict (keys "
                             f"{sorted(graphs.globals)}); the targets must be one array, "
                             f"one row per graph: pass targets=")
        targets = graphs.globals
    arrays = {"nodes": graphs.nodes, "edges": graphs.edges, "targets": targets,
              "senders": np.asarray(graphs.senders) - shift,
              "receivers": np.asarray(graphs.receivers) - shift}
    arrays = {k: None if v is None else np.asarray(v) for k, v in arrays.items()}
    if graph_mask is None and (padding := _padding_graphs(arrays, n_node, n_edge)):
        which = "last graph looks" if padding == 1 else f"last {padding} graphs look"
        warnings.warn(f"the GraphsTuple's {which} like the padding of "
                      f"jraph.pad_with_graphs (a graph of zero rows whose edges join its "
                      f"first node to itself, and any graphs of no nodes after it), kept as "
                      f"graphs of the collection: if the tuple was padded so, pass "
                      f"graph_mask=jraph.get_graph_padding_mask(graphs) to leave them out",
                      PaddingGraphsWarning, stacklevel=2)
    if graph_mask is not None:
        keep = np.asarray(graph_mask)
        if keep.dtype != bool or keep.shape != n_node.shape:
            raise ValueError(f"graph_mask must be bool[{n_node.size}], one entry per graph "
                             f"of the tuple, got {keep.dtype}{list(keep.shape)}")
        real = int(keep.sum())
        if len(arrays["targets"]) not in (keep.size, real):
            raise ValueError(f"targets must give a row per graph of the tuple ({keep.size}) "
                             f"or per real graph ({real}), got {len(arrays['targets'])}")
        whole = len(arrays["targets"]) == keep.size
        rows = {"nodes": np.repeat(keep, n_node), "targets": keep if whole else slice(None)}
        rows.update(dict.fromkeys(("edges", "senders", "receivers"), np.repeat(keep, n_edge)))
        arrays = {k: None if v is None else v[rows[k]] for k, v in arrays.items()}
        n_node, n_edge = n_node[keep], n_edge[keep]
    return make_collection(name, n_node, n_edge, arrays["senders"], arrays["receivers"],
                           arrays["nodes"], arrays["targets"], target_kind,
                           edge_features=arrays["edges"], splits=splits,
                           num_classes=num_classes, node_vocab=node_vocab,
                           edge_vocab=edge_vocab)


class PaddingGraphsWarning(UserWarning):
    """A GraphsTuple converted without its `graph_mask` ends as jraph pads one."""


def _padding_graphs(arrays: dict, n_node: np.ndarray, n_edge: np.ndarray) -> int:
    """How many graphs at the end of a tuple's `arrays` (senders and receivers local)
    look like `jraph.pad_with_graphs`' padding: the graph of the padding nodes (jraph
    pads with at least one), whose node rows and target row are zeros and whose edges
    (at least one, or graphs of no nodes after it) all join its first node to itself,
    and the graphs of no nodes after it. 0 where the tuple would have no graph left, or
    ends otherwise (graphs of no nodes after a graph with rows are a collection's own)."""
    empty = len(n_node) - len(np.trim_zeros(n_node, "b"))
    last = len(n_node) - empty - 1  # the graph that would hold the padding nodes
    if last < 1 or len(arrays["targets"]) != len(n_node):
        return 0
    nodes = arrays["nodes"][int(n_node[:last].sum()):]
    edges = slice(int(n_edge[:last].sum()), int(n_edge[:last + 1].sum()))
    loops = not (arrays["senders"][edges].any() or arrays["receivers"][edges].any())
    zeros = not (nodes.any() or np.asarray(arrays["targets"][last]).any())
    return empty + 1 if zeros and loops and (n_edge[last] > 0 or empty) else 0


def _jraph_counts(graphs) -> tuple[np.ndarray, np.ndarray]:
    """(n_node, n_edge) of a GraphsTuple as int64[G], checked against its arrays: one
    count of each per graph, non-negative whole numbers, the node rows and the edges
    they sum to. ValueError naming the field and both counts otherwise."""
    counts = {}
    for field in ("n_node", "n_edge"):
        c = np.asarray(getattr(graphs, field))
        if c.ndim != 1 or not (np.issubdtype(c.dtype, np.integer) or c.size == 0):
            raise ValueError(f"the GraphsTuple's {field} must be integers [G], one per graph, "
                             f"got {c.dtype}{list(c.shape)}")
        if c.size and c.min() < 0:
            raise ValueError(f"the GraphsTuple's {field} holds a negative count {int(c.min())}")
        counts[field] = c.astype(np.int64)
    if counts["n_node"].size != counts["n_edge"].size:
        raise ValueError(f"the GraphsTuple's n_node counts {counts['n_node'].size} graphs but "
                         f"n_edge {counts['n_edge'].size}")
    edges = int(counts["n_edge"].sum())
    sizes = {"nodes": (np.shape(graphs.nodes)[:1], int(counts["n_node"].sum()), "n_node"),
             "senders": (np.shape(graphs.senders), edges, "n_edge"),
             "receivers": (np.shape(graphs.receivers), edges, "n_edge")}
    if graphs.edges is not None and not isinstance(graphs.edges, dict):
        sizes["edges"] = (np.shape(graphs.edges)[:1], edges, "n_edge")
    for field, (shape, want, by) in sizes.items():
        if field in ("senders", "receivers") and len(shape) != 1:
            raise ValueError(f"the GraphsTuple's {field} must be 1-D, got shape {list(shape)}")
        if shape[0] != want:
            raise ValueError(f"the GraphsTuple's {field} has {shape[0]} rows but its {by} "
                             f"sums to {want}")
    return counts["n_node"], counts["n_edge"]


def collection_to_pyg(collection: GraphCollection) -> list:
    """One `torch_geometric.data.Data` per graph: x, edge_index (local, [2, E], row 0
    the senders), edge_attr (if any) and y ([1, T], or [1] class ids)."""
    torch = need("torch", "collection_to_pyg")
    Data = need("torch_geometric.data", "collection_to_pyg").Data

    c, out = collection, []
    for g in range(c.num_graphs):
        part = c.graph(g)
        edge_index = torch.from_numpy(np.stack([part["senders"], part["receivers"]]).astype(
            np.int64))
        y = np.asarray(part["target"])
        y = torch.from_numpy(y[None] if y.ndim else y.reshape(1))
        extra = {} if part["edges"] is None else {"edge_attr": torch.from_numpy(
            np.ascontiguousarray(part["edges"]))}
        out.append(Data(x=torch.from_numpy(np.ascontiguousarray(part["nodes"])),
                        edge_index=edge_index, y=y, **extra))
    return out


def _joined(parts: list, name: str) -> np.ndarray:
    """The graphs' `name` arrays stacked by rows; ValueError naming the first graph whose
    columns differ from graph 0's (NumPy's error named neither the field nor the
    graph)."""
    for i, part in enumerate(parts):
        if part.shape[1:] != parts[0].shape[1:]:
            raise ValueError(f"graph {i}'s {name} is {list(part.shape)} and graph 0's "
                             f"{list(parts[0].shape)}: every graph's {name} needs the same "
                             f"columns")
    return np.concatenate(parts)


def collection_from_pyg(graphs, *, name: str = "pyg", target_kind: str = "binary", splits=None,
             num_classes: int = 0, node_vocab=(), edge_vocab=()) -> GraphCollection:
    """A collection from a PyG `Batch` or a sequence of `Data` (each with x,
    edge_index, y and optionally edge_attr, as tensors or arrays; edge_attr in every
    graph or in none). `target_kind`, `splits`, `num_classes` and the categorical
    columns' vocabulary sizes `node_vocab` / `edge_vocab` are `make_collection`'s."""
    if hasattr(graphs, "to_data_list"):
        graphs = graphs.to_data_list()
    graphs = list(graphs)
    if not graphs:
        raise ValueError("collection_from_pyg needs at least one graph")
    has_edges = getattr(graphs[0], "edge_attr", None) is not None

    def field(i, d, name):
        """Graph i's `name` as a NumPy array; ValueError naming both if it has none."""
        t = getattr(d, name, None)
        if t is None:
            why = ("graph 0 has it, and every graph needs the same fields"
                   if name == "edge_attr" else "every graph needs x, edge_index and y")
            raise ValueError(f"graph {i} has no {name}: {why}")
        return t.detach().cpu().numpy() if hasattr(t, "detach") else np.asarray(t)

    index = [field(i, d, "edge_index") for i, d in enumerate(graphs)]
    for i, e in enumerate(index):  # [E, 2] read as [2, E] kept two edges of the first two
        if e.ndim != 2 or e.shape[0] != 2:
            raise ValueError(f"graph {i}'s edge_index must be [2, E] (row 0 the sources), "
                             f"got {list(e.shape)}")
    xs = [field(i, d, "x") for i, d in enumerate(graphs)]
    x = _joined(xs, "x")
    # PyG's `num_nodes` (its x's rows unless set); a stand-in without it: its x's rows
    n_node = [int(len(xs[i]) if getattr(d, "num_nodes", None) is None else d.num_nodes)
              for i, d in enumerate(graphs)]
    wrong = next((i for i in range(len(graphs)) if n_node[i] != len(xs[i])), None)
    if wrong is not None:
        raise ValueError(f"graph {wrong} has num_nodes {n_node[wrong]} but its x has "
                         f"{len(xs[wrong])} rows: every node needs its row of features")
    n_edge = [int(e.shape[1]) for e in index]
    edge_index = np.concatenate(index, axis=1)
    if not has_edges and any(getattr(d, "edge_attr", None) is not None for d in graphs):
        first = next(i for i, d in enumerate(graphs)
                     if getattr(d, "edge_attr", None) is not None)
        raise ValueError(f"graph {first} has edge_attr and graph 0 has none: every graph "
                         f"needs the same fields")
    edges = _joined([field(i, d, "edge_attr") for i, d in enumerate(graphs)], "edge_attr") \
        if has_edges else None
    y = _joined([field(i, d, "y").reshape(1, -1) for i, d in enumerate(graphs)], "y")
    if target_kind == "classes":
        y = y.reshape(-1)
    return make_collection(name, n_node, n_edge, edge_index[0], edge_index[1], x, y,
                           target_kind, edge_features=edges, splits=splits,
                           num_classes=num_classes, node_vocab=node_vocab,
                           edge_vocab=edge_vocab)
