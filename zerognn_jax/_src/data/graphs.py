"""A collection of many small graphs (molecules, events, circuits): the data of
graph-level tasks, validated when built.

The graphs lie back to back. Graph g owns the node rows [node_offsets[g],
node_offsets[g + 1]) of the node table and the edge rows [edge_offsets[g],
edge_offsets[g + 1]) of the edge arrays; its edges name their endpoints by their
position inside the graph (OGB's layout: local ids), so a graph reads the same wherever
it lies. One target row per graph, of one of three kinds:

  "binary"      float32[G, T] in {0, 1}, NaN where a label is missing (molhiv T = 1,
                molpcba T = 128): ROC-AUC and AP, averaged over the tasks.
  "classes"     int32[G] class ids in [0, num_classes): accuracy.
  "regression"  float32[G, T], NaN where missing: mean absolute error.

Node and edge features are float tables, or integer tables of categorical columns
whose vocabulary sizes are `node_vocab` / `edge_vocab` (OGB's atom and bond features:
each column a category id, embedded by the models' categorical encoders).
"""

from __future__ import annotations

import dataclasses

import numpy as np

from zerognn_jax._src.data.checks import arrays_not_lists, is_whole
from zerognn_jax._src.data.dataset import split_sizes
from zerognn_jax._src.data.tables import BFLOAT16, check_finite_rows, narrow_to_float32

TARGET_KINDS = ("binary", "classes", "regression")


@dataclasses.dataclass(frozen=True, eq=False)
class GraphCollection:
    """Many small graphs with one target row each; checked by `validate_collection`.

    Attributes:
      name: what the collection is called (summaries, checkpoints).
      node_offsets: int64[G + 1], graph g's nodes are rows node_offsets[g:g + 2].
      edge_offsets: int64[G + 1], graph g's edges are rows edge_offsets[g:g + 2].
      senders, receivers: int32[E], each edge's endpoints as local ids of its graph
        (messages flow sender -> receiver).
      node_features: float32[N, d] or int[N, d] categorical (`node_vocab`).
      edge_features: float32[E, d_e] or int[E, d_e] categorical, or None.
      targets: float32[G, T] ("binary", "regression"; NaN marks a missing label) or
        int32[G] ("classes").
      target_kind: one of `TARGET_KINDS`.
      train_idx, val_idx, test_idx: int32 graph ids of each split.
      num_classes: classes of "classes" targets (0 for the other kinds).
      node_vocab, edge_vocab: per categorical column its number of categories, or ().
    """

    name: str
    node_offsets: np.ndarray
    edge_offsets: np.ndarray
    senders: np.ndarray
    receivers: np.ndarray
    node_features: np.ndarray
    edge_features: np.ndarray | None
    targets: np.ndarray
    target_kind: str
    train_idx: np.ndarray
    val_idx: np.ndarray
    test_idx: np.ndarray
    num_classes: int = 0
    node_vocab: tuple[int, ...] = ()
    edge_vocab: tuple[int, ...] = ()

    def __post_init__(self):
        validate_collection(self)

    def __repr__(self) -> str:  # its sizes, not its arrays (a notebook prints it)
        return (f"GraphCollection({self.name!r}, graphs={self.num_graphs:,}, "
                f"nodes={self.num_nodes:,}, edges={self.num_edges:,}, "
                f"targets={self.target_kind}{list(self.targets.shape)}, {split_sizes(self)})")

    @property
    def num_graphs(self) -> int:
        return self.node_offsets.shape[0] - 1

    @property
    def num_nodes(self) -> int:
        return int(self.node_offsets[-1])

    @property
    def num_edges(self) -> int:
        return int(self.edge_offsets[-1])

    @property
    def n_node(self) -> np.ndarray:
        """int64[G]: nodes per graph."""
        return np.diff(self.node_offsets)

    @property
    def n_edge(self) -> np.ndarray:
        """int64[G]: edges per graph."""
        return np.diff(self.edge_offsets)

    @property
    def output_dim(self) -> int:
        """Output units of a model: classes, or target columns."""
        if self.target_kind == "classes":
            return self.num_classes
        return self.targets.shape[1]

    def graph(self, g: int) -> dict:
        """Graph `g` alone: {"nodes", "edges", "senders", "receivers", "target"}."""
        n0, n1 = self.node_offsets[g:g + 2]
        e0, e1 = self.edge_offsets[g:g + 2]
        edges = None if self.edge_features is None else self.edge_features[e0:e1]
        return {"nodes": self.node_features[n0:n1], "edges": edges,
                "senders": self.senders[e0:e1], "receivers": self.receivers[e0:e1],
                "target": self.targets[g]}

    def stats(self) -> dict:
        """Counts and shapes, JSON-ready (the CLI prints them; checkpoints record them)."""
        n_node = self.n_node
        positives = None
        if self.target_kind == "binary":
            labelled = ~np.isnan(self.targets)
            positives = float(np.nansum(self.targets) / max(int(labelled.sum()), 1))
        return {"name": self.name, "graphs": self.num_graphs, "nodes": self.num_nodes,
                "edges": self.num_edges,
                "mean_nodes": float(n_node.mean()) if n_node.size else 0.0,
                "max_nodes": int(n_node.max(initial=0)),
                "max_edges": int(self.n_edge.max(initial=0)),
                "node_features": int(self.node_features.shape[1]),
                "edge_features": 0 if self.edge_features is None
                else int(self.edge_features.shape[1]),
                "target_kind": self.target_kind, "outputs": self.output_dim,
                "positive_rate": positives,
                **{s: int(getattr(self, f"{s}_idx").shape[0]) for s in ("train", "val", "test")}}


def _fail(message: str) -> None:
    raise ValueError(message)


def _check_offsets(what: str, offsets: np.ndarray, rows: int, table: str) -> None:
    if offsets.ndim != 1 or offsets.shape[0] < 1:
        _fail(f"{what} must be a 1-D array of G + 1 offsets, got shape {offsets.shape}")
    if offsets[0] != 0:
        _fail(f"{what} must start at 0, got {int(offsets[0])}")
    step = np.diff(offsets)
    if step.size and step.min() < 0:
        g = int(np.argmin(step))
        _fail(f"{what} must not decrease: graph {g} has {int(step[g])} rows")
    if offsets[-1] != rows:
        _fail(f"{what} ends at {int(offsets[-1])} but {table} has {rows} rows")


def _check_local(what: str, ids: np.ndarray, c: GraphCollection) -> None:
    graph_of_edge = np.repeat(np.arange(c.num_graphs), np.diff(c.edge_offsets))
    size = np.diff(c.node_offsets)[graph_of_edge]
    bad = np.flatnonzero((ids < 0) | (ids >= size))
    if bad.size:
        e = int(bad[0])
        _fail(f"{what}[{e}] = {int(ids[e])} is not a node of graph {int(graph_of_edge[e])}, "
              f"which has {int(size[e])} nodes{_global_hint(ids, graph_of_edge, size, c)}")


def _global_hint(ids: np.ndarray, graph_of_edge: np.ndarray, size: np.ndarray,
                 c: GraphCollection) -> str:
    """A hint where every id is a node of its graph once counted from the collection's
    first node (dgl.batch's and a PyG Batch's numbering) rather than from its graph's."""
    local = ids - c.node_offsets[:-1][graph_of_edge]
    if not np.all((local >= 0) & (local < size)):
        return ""
    return (": the ids look numbered across all graphs (as dgl.batch and a PyG Batch "
            "number them); give each graph's ids from 0, i.e. subtract its first node's "
            "offset")


def _check_vocab(what: str, table: np.ndarray, vocab: tuple[int, ...]) -> None:
    if not vocab:
        if np.issubdtype(table.dtype, np.integer):
            _fail(f"{what} are {table.dtype}: integer (categorical) features need their "
                  f"vocabulary sizes ({what.split()[0]}_vocab)")
        if not np.issubdtype(table.dtype, np.floating):
            _fail(f"{what} are {table.dtype}: give float32 features, or integer category "
                  f"ids with their vocabulary sizes ({what.split()[0]}_vocab)")
        return
    if not np.issubdtype(table.dtype, np.integer):
        whole = np.issubdtype(table.dtype, np.floating) and bool(
            np.all(np.isfinite(table)) and np.all(table == np.round(table)))
        hint = " (these are whole numbers: cast them with .astype(np.int64))" if whole else ""
        _fail(f"{what} with a vocabulary must be integer category ids, got "
              f"{table.dtype}{hint}")
    if len(vocab) != table.shape[1]:
        _fail(f"{what} have {table.shape[1]} columns but {len(vocab)} vocabulary sizes")
    if table.size:
        low, high = table.min(0), table.max(0)
        for col, (lo, hi, v) in enumerate(zip(low, high, vocab)):
            if lo < 0 or hi >= v:
                _fail(f"{what} column {col} holds {int(lo if lo < 0 else hi)}, outside "
                      f"[0, {v})")


def _counts(name: str, counts) -> np.ndarray:
    """int64[G]: one count per graph (a single number: one graph); ValueError for an
    array of more axes, whose rows were read as more graphs."""
    counts = _ints(name, counts, np.int64)
    if counts.ndim > 1:
        _fail(f"{name} must be one count per graph, int[G], got shape {list(counts.shape)}")
    return counts.reshape(-1)


def _check_targets(c: GraphCollection) -> None:
    t, g = c.targets, c.num_graphs
    if c.target_kind not in TARGET_KINDS:
        _fail(f"target_kind must be one of {', '.join(TARGET_KINDS)}, got {c.target_kind!r}")
    if t.ndim == 0:
        _fail(f"targets must hold a row per graph ([G] or [G, T]), got one number "
              f"({t.item()!r})")
    if t.shape[0] != g:
        _fail(f"targets have {t.shape[0]} rows but there are {g} graphs")
    if c.target_kind == "classes":
        if t.ndim != 1 or not np.issubdtype(t.dtype, np.integer):
            hint = ("; one-hot rows give their classes by targets.argmax(1)"
                    if t.ndim == 2 and t.shape[1] > 1 else "")
            _fail(f"class targets must be int[G], got {t.dtype}{list(t.shape)}{hint}")
        if c.num_classes < 1:
            top = f" (the largest class id here is {int(t.max())}: give num_classes=" \
                  f"{int(t.max()) + 1}, or more)" if t.size and t.max() >= 0 else ""
            _fail(f"class targets need num_classes >= 1, got {c.num_classes}{top}")
        bad = np.flatnonzero((t < 0) | (t >= c.num_classes))
        if bad.size:
            _fail(f"class target of graph {int(bad[0])} is {int(t[bad[0]])}, outside "
                  f"[0, {c.num_classes})")
        return
    if c.num_classes:
        _fail(f"num_classes is for class targets; these are {c.target_kind}, got "
              f"num_classes={c.num_classes}")
    if t.ndim != 2 or t.dtype != np.float32:
        _fail(f"{c.target_kind} targets must be float32[G, T], got {t.dtype}{list(t.shape)}")
    if t.shape[1] == 0:
        _fail(f"{c.target_kind} targets have no columns (shape {list(t.shape)}): each graph "
              f"needs at least one target")
    if np.isinf(t).any():
        _fail("targets hold an infinite value (mark a missing label with NaN)")
    if c.target_kind == "binary":
        bad = ~np.isnan(t) & (t != 0) & (t != 1)
        if bad.any():
            row, col = (int(i[0]) for i in np.nonzero(bad))
            value = float(t[row, col])
            hint = ("; class ids take target_kind='classes' with num_classes"
                    if t.shape[1] == 1 and value.is_integer() and value > 1 else "")
            _fail(f"binary target [{row}, {col}] is {value}; binary targets are "
                  f"0, 1 or NaN (missing){hint}")


def validate_collection(c: GraphCollection) -> None:
    """Raises ValueError, one line naming the problem and the value, unless `c` is a
    consistent collection (module docstring)."""
    if not isinstance(c.name, str) or not c.name:
        _fail(f"name must be a non-empty string (it names the collection in metrics, "
              f"checkpoints and files), got {c.name!r}")
    arrays_not_lists(c, ("node_offsets", "edge_offsets", "senders", "receivers",
                         "node_features", "targets", "train_idx", "val_idx", "test_idx"),
                     "make_collection")
    if c.node_features.ndim != 2:
        one = " (one feature a node: node_features.reshape(-1, 1))" \
            if c.node_features.ndim == 1 else ""
        _fail(f"node_features must be 2-D [N, d], got shape {c.node_features.shape}{one}")
    if c.node_features.shape[1] == 0:
        _fail(f"node_features have no columns (shape {c.node_features.shape}): a graph "
              f"model reads each node's features; give each node one (a constant 1.0)")
    num_nodes = c.node_features.shape[0]
    if num_nodes == 0:
        _fail("the collection holds no nodes (node_features has 0 rows): its graphs are "
              "all empty")
    for what in ("node_offsets", "edge_offsets", "senders", "receivers", "train_idx",
                 "val_idx", "test_idx"):
        values = getattr(c, what)
        if values.size and not np.issubdtype(values.dtype, np.integer):
            _fail(f"{what} must hold integers, got {values.dtype}")
    _check_offsets("node_offsets", c.node_offsets, num_nodes, "node_features")
    if c.senders.shape != c.receivers.shape or c.senders.ndim != 1:
        _fail(f"senders and receivers must be 1-D of one length, got shapes "
              f"{c.senders.shape} and {c.receivers.shape}")
    _check_offsets("edge_offsets", c.edge_offsets, c.senders.shape[0], "senders")
    if c.edge_offsets.shape[0] != c.node_offsets.shape[0]:
        _fail(f"edge_offsets has {c.edge_offsets.shape[0]} entries but node_offsets "
              f"{c.node_offsets.shape[0]}: both need one per graph plus one")
    _check_local("senders", c.senders, c)
    _check_local("receivers", c.receivers, c)
    _check_vocab("node features", c.node_features, c.node_vocab)
    if c.edge_features is None and c.edge_vocab:
        _fail(f"edge_vocab {list(c.edge_vocab)} describes edge features, and this "
              f"collection has none")
    if c.edge_features is not None:
        if c.edge_features.ndim != 2 or c.edge_features.shape[0] != c.senders.shape[0]:
            one = " (one feature an edge: edge_features.reshape(-1, 1))" \
                if c.edge_features.shape == c.senders.shape else ""
            _fail(f"edge_features must be [E, d] with E = {c.senders.shape[0]} edges, got "
                  f"shape {c.edge_features.shape}{one}")
        if c.edge_features.shape[1] == 0:
            _fail(f"edge_features have no columns (shape {c.edge_features.shape}): give "
                  f"None for a collection without edge features")
        _check_vocab("edge features", c.edge_features, c.edge_vocab)
    _check_targets(c)
    for split in ("train", "val", "test"):
        idx = getattr(c, f"{split}_idx")
        bad = np.flatnonzero((idx < 0) | (idx >= c.num_graphs))
        if bad.size:
            _fail(f"{split}_idx holds graph {int(idx[bad[0]])}, outside [0, {c.num_graphs})")
        seen, counts = np.unique(idx, return_counts=True)
        if (counts > 1).any():
            _fail(f"{split}_idx lists graph {int(seen[counts > 1][0])} twice")
    for a, b in (("train", "val"), ("train", "test"), ("val", "test")):
        both = np.intersect1d(getattr(c, f"{a}_idx"), getattr(c, f"{b}_idx"))
        if both.size:
            _fail(f"{a} and {b} splits overlap in {both.size} graphs (first: {int(both[0])})")
    for what, table in (("node_features", c.node_features), ("edge_features", c.edge_features)):
        if table is not None and np.issubdtype(table.dtype, np.floating):  # 2-D, checked above
            check_finite_rows(what, table)


def _float32(what: str, values) -> np.ndarray:
    """`values` as an array, a copy in float32 where it is floating point
    (`narrow_to_float32`)."""
    table = np.asarray(values)
    if table.dtype == BFLOAT16:  # (NumPy counts it among no floating types)
        return table.astype(np.float32)
    if not np.issubdtype(table.dtype, np.floating):
        return table
    return narrow_to_float32(what, table, copy=True)


def _ints(what: str, values, dtype) -> np.ndarray:
    """`values` as `dtype` integers (bools as 0 and 1); ValueError for values that are
    not whole numbers or do not fit (NumPy's cast would round or wrap them silently)."""
    a = np.asarray(values)
    if a.dtype == object:  # Python ints (or anything else) in an object array
        a = np.asarray(a.tolist())
    if a.dtype == np.bool_:
        a = a.astype(np.int64)
    limits = np.iinfo(dtype)
    if a.size and np.issubdtype(a.dtype, np.integer):
        low, high = a.min(), a.max()
        if low < limits.min or high > limits.max:
            _fail(f"{what} holds {low if low < limits.min else high}, outside the range of "
                  f"{np.dtype(dtype).name}")
    elif a.size:
        if not np.issubdtype(a.dtype, np.floating):
            _fail(f"{what} must be integers, got dtype {a.dtype}")
        f = a.astype(np.float64).reshape(-1)
        # float64 bounds, exact as powers of two: the upper one is 2**(bits - 1)
        bad = ~np.isfinite(f) | (f != np.round(f)) | (f < limits.min) | (f >= -limits.min)
        if bad.any():
            _fail(f"{what} must be integers within {np.dtype(dtype).name}, got "
                  f"{f[np.flatnonzero(bad)[0]]} (dtype {a.dtype})")
    return a.astype(dtype)


def make_collection(name: str, n_node, n_edge, senders, receivers, node_features,
                    targets, target_kind: str, *, edge_features=None, splits=None,
                    num_classes: int = 0, node_vocab=(), edge_vocab=()) -> GraphCollection:
    """A validated collection from per-graph node and edge counts (`n_node`, `n_edge`:
    int[G]) and arrays in any array-like form, converted to the stored dtypes.

    `name`, `senders` and `receivers` (each edge's local endpoints within its graph),
    `node_features`, `edge_features` (or None), `targets`, `target_kind` ("binary",
    "classes" or "regression"), `num_classes` (of "classes" targets; 0 for the others)
    and `node_vocab`, `edge_vocab` (each categorical column's number of categories; ()
    for float features) become the `GraphCollection` attributes of those names.
    `splits` is (train, val, test) graph ids; None puts every graph in train. Class
    targets may come as one column ([G, 1], as jraph's globals hold them). Floating
    features of any width (float64, float16, bfloat16) are stored as float32.
    """
    n_node, n_edge = (_counts(name, counts) for name, counts in (("n_node", n_node),
                                                               ("n_edge", n_edge)))
    if n_node.shape != n_edge.shape:
        _fail(f"n_node and n_edge must list the same graphs, got {n_node.size} and "
              f"{n_edge.size} counts")
    if n_node.size == 0:
        _fail("the collection holds no graphs (n_node and n_edge are empty)")
    offsets = lambda counts: np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
    node_features = _float32("node_features", node_features)
    if edge_features is not None:
        edge_features = _float32("edge_features", edge_features)
    if targets is None:
        _fail(f"targets are needed, a row per graph ([G] or [G, T] of {target_kind!r}); a "
              f"collection only to predict holds any (they are not read)")
    if target_kind == "classes":
        targets = _ints("class targets", targets, np.int32)
        if targets.ndim == 2 and targets.shape[1] == 1:  # a column (jraph's globals)
            targets = targets[:, 0]
    else:
        try:
            given = np.asarray(targets)
            if given.dtype.kind not in "fiub":
                given = np.asarray(targets, np.float32)  # (its error names a value)
        except (TypeError, ValueError) as err:
            _fail(f"{target_kind} targets must be numbers: {err}")
        # NaN marks a missing label: only finite values past float32's range are named
        # here, NaN and inf by the validation below
        targets = narrow_to_float32(f"{target_kind} targets",
                                    given[:, None] if given.ndim == 1 else given,
                                    copy=True, missing=True)
    if splits is None:
        splits = (np.arange(n_node.size), np.zeros(0), np.zeros(0))
    if len(splits) != 3:
        _fail(f"splits must be (train, val, test) graph ids, got {len(splits)} entries")
    for split, ids in zip(("train", "val", "test"), splits):
        if np.asarray(ids).dtype == np.bool_:
            _fail(f"{split}_idx must be graph ids, got bool{list(np.shape(ids))} (a mask? "
                  f"np.flatnonzero(mask) gives its ids)")
        shape = np.shape(ids)  # one column ([n, 1], as a file may read) is a list too
        if len(shape) > 2 or (len(shape) == 2 and shape[1] != 1):
            _fail(f"{split}_idx must be a 1-D list of graph ids, got shape {list(shape)} "
                  f"(several folds stacked? give one)")
    train, val, test = (_ints(f"{split}_idx", s, np.int32).reshape(-1)
                        for split, s in zip(("train", "val", "test"), splits))
    for what, values in (("num_classes", (num_classes,)), ("node_vocab", node_vocab),
                         ("edge_vocab", edge_vocab)):
        for v in values:
            if not is_whole(v):
                _fail(f"{what} must hold whole numbers, got {v!r}")
    return GraphCollection(name, offsets(n_node), offsets(n_edge),
                           _ints("senders", senders, np.int32),
                           _ints("receivers", receivers, np.int32),
                           node_features, edge_features, targets, target_kind, train, val,
                           test, int(num_classes), tuple(int(v) for v in node_vocab),
                           tuple(int(v) for v in edge_vocab))
