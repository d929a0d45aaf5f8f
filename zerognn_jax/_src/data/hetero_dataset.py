"""The typed node dataset: a HeteroGraph, features per node type, targets of one type.

Node classification on a typed graph predicts the labels of one node type (papers in
ogbn-mag), the *target type*; the others are context. Like a homogeneous `Dataset`, the
target type may have float targets instead (`targets`, `target_kind`): several binary
labels per node ("multilabel") or real values ("regression"). Each node type has a feature
table of its own width and dtype (float32 or bfloat16) or none (featureless types:
models give them learnable embeddings). `node_info` holds further per-node columns
that are not model inputs (ogbn-mag's publication years).

`make_hetero_dataset` builds one from plain dicts; `from_hetero_data` from a PyG
`HeteroData` (duck-typed: torch is never imported here), and `to_hetero_data` back
(needs torch_geometric).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

import numpy as np

from zerognn_jax._src.data.checks import id_array, is_count
from zerognn_jax._src.data.dataset import (
    MAX_CLASSES,
    TARGET_KINDS,
    _check_range,
    _integers,
    check_labels,
    check_num_classes,
    check_splits,
    check_targets,
    float_targets,
    labelled_count,
    split_sizes,
)
from zerognn_jax._src.data.graph import to_edge_list
from zerognn_jax._src.data.hetero import (
    HeteroGraph,
    check_type_ids,
    hetero_graph,
    validate_hetero_graph,
)
from zerognn_jax._src.data.optional import need
from zerognn_jax._src.data.tables import BFLOAT16, check_finite_rows, node_feature_table

SPLITS = ("train", "val", "test")


@dataclasses.dataclass(frozen=True, eq=False)
class HeteroDataset:
    """A typed graph with node features, the target type's labels and a split (host).

    Attributes:
      name: short identifier ("ogbn-mag", "mag-like", ...).
      graph: HeteroGraph (NumPy arrays).
      features: {type: float32[N_type, d_type] or bfloat16[...]}, finite; featureless
        types are absent.
      target_type: the node type whose labels are predicted.
      labels: int32[N_target], class ids in [0, num_classes); -1 marks unlabelled.
      train_idx, val_idx, test_idx: int32[*], disjoint ids of target_type nodes, all
        labelled; train is non-empty.
      num_classes: number of classes.
      node_info: {type: {column: [N_type] numeric}}, per-node data that is no model
        input (ogbn-mag: {"paper": {"year": int32[N]}}).
      targets: None (the targets are `labels`), or float32[N_target, T]: T binary
        labels per node in {0, 1} ("multilabel") or T real values ("regression"), NaN
        where an entry is missing; `labels` are then not trained on and may be -1
        everywhere.
      target_kind: "classes" (targets None), "multilabel" or "regression".
    """

    name: str
    graph: HeteroGraph
    features: dict
    target_type: str
    labels: np.ndarray
    train_idx: np.ndarray
    val_idx: np.ndarray
    test_idx: np.ndarray
    num_classes: int
    node_info: dict = dataclasses.field(default_factory=dict)
    targets: np.ndarray | None = None
    target_kind: str = "classes"

    def __post_init__(self):
        validate_hetero_dataset(self)

    @property
    def output_dim(self) -> int:
        """Output units a model needs: num_classes, or the targets' T."""
        return self.num_classes if self.targets is None else int(self.targets.shape[1])

    def with_targets(self, targets, kind: str) -> HeteroDataset:
        """This dataset with float targets of its target type: float[N_target] or
        float[N_target, T] (a 1-D array becomes [N_target, 1]), `kind` "multilabel"
        ({0, 1} values) or "regression" (`Dataset.with_targets`'s checks)."""
        if kind not in TARGET_KINDS[1:]:
            raise ValueError(f"target kind must be multilabel or regression, got {kind!r}")
        return dataclasses.replace(self, targets=float_targets(targets), target_kind=kind)

    def __repr__(self) -> str:  # its sizes, not its arrays (a notebook prints it)
        nodes = ", ".join(f"{t!r}: {n:,}" for t, n in self.num_nodes.items())
        targets = self.targets
        extra = "" if targets is None else f", targets={self.target_kind}{list(targets.shape)}"
        return (f"HeteroDataset({self.name!r}, nodes={{{nodes}}}, "
                f"relations={len(self.graph.relations)}, target_type={self.target_type!r}, "
                f"classes={self.num_classes}, {split_sizes(self)}{extra})")

    @property
    def num_nodes(self) -> dict[str, int]:
        return self.graph.num_nodes

    @property
    def feature_dims(self) -> dict[str, int]:
        """{type: d_type} of the types that have features."""
        return {t: int(f.shape[1]) for t, f in self.features.items()}

    def stats(self) -> dict:
        """The dataset's statistics as a JSON-serialisable dict: all nodes, the feature
        widths {type: d}, per node type its count and feature width (0 for none) and
        dtype, per relation its edges (a checkpoint's identity reads some)."""
        arrays = [self.labels, self.train_idx, self.val_idx, self.test_idx,
                  *([] if self.targets is None else [self.targets]), *self.features.values(),
                  *(c for cols in self.node_info.values() for c in cols.values())]
        for g in self.graph.graphs:
            arrays += [a for a in (g.indptr, g.indices, g.weights, g.edge_features)
                       if a is not None]
        types = {t: {"nodes": n, "features": self.feature_dims.get(t, 0),
                     **({"feature_dtype": str(self.features[t].dtype)}
                        if t in self.features else {})}
                 for t, n in self.graph.node_counts}
        return {"name": self.name, "nodes": int(sum(self.num_nodes.values())),
                "features": self.feature_dims, "node_types": types,
                "relations": self.graph.stats()["relations"],
                "directed_edges": int(sum(self.graph.num_edges.values())),
                "target_type": self.target_type, "classes": int(self.num_classes),
                **labelled_count(self.labels, self.target_kind, self.targets),
                "target_kind": self.target_kind, "outputs": self.output_dim,
                **{s: int(getattr(self, f"{s}_idx").size) for s in SPLITS},
                "bytes": int(sum(np.asarray(a).nbytes for a in arrays))}


def _check_info_layout(node_info) -> None:
    if not isinstance(node_info, Mapping) or not all(
            isinstance(cols, Mapping) for cols in node_info.values()):
        raise ValueError("node_info must map node types to {column: array [N_type]}, got "
                         f"{type(node_info).__name__} {node_info!r:.60}")


def validate_hetero_dataset(ds: HeteroDataset) -> None:
    """Raises ValueError naming the first inconsistency of `ds`."""
    if not isinstance(ds.name, str) or not ds.name:
        raise ValueError(f"name must be a non-empty string (it names the dataset in "
                         f"metrics, checkpoints and files), got {ds.name!r}")
    _check_info_layout(ds.node_info)
    if not isinstance(ds.graph, HeteroGraph):
        raise ValueError(f"graph must be a HeteroGraph, got {type(ds.graph).__name__}")
    validate_hetero_graph(ds.graph)
    counts = ds.graph.num_nodes
    for t, table in ds.features.items():
        if t not in counts:
            raise ValueError(f"features are given for {t!r}, which is not a node type "
                             f"({', '.join(counts)})")
        if not isinstance(table, np.ndarray) or table.ndim != 2 or table.shape[0] != counts[t]:
            raise ValueError(f"features of {t!r} must be a NumPy array [{counts[t]}, d], got "
                             f"{getattr(table, 'shape', type(table).__name__)}")
        if table.dtype not in (np.dtype(np.float32), BFLOAT16):
            raise ValueError(f"features of {t!r} must be float32 or bfloat16, got {table.dtype}")
        check_finite_rows(f"features of {t!r}", table)
    if ds.target_type not in counts:
        raise ValueError(f"target_type {ds.target_type!r} is not a node type "
                         f"({', '.join(counts)})")
    n = counts[ds.target_type]
    labels = ds.labels
    _check_labels_shape(labels, ds.target_type, n)
    if not is_count(ds.num_classes) or ds.num_classes < 1:
        raise ValueError(f"num_classes must be a positive integer, got {ds.num_classes!r}")
    check_num_classes(ds.num_classes)
    check_labels(labels, ds.num_classes)
    check_targets(ds.targets, ds.target_kind, n)
    check_splits({s: getattr(ds, f"{s}_idx") for s in SPLITS}, n,
                 labels if ds.targets is None else None)
    for t, cols in ds.node_info.items():
        for col, values in cols.items():
            if t not in counts or np.shape(values) != (counts[t],):
                raise ValueError(f"node_info {t!r}/{col!r} must be an array [N_{t}] of a node "
                                 f"type, got shape {np.shape(values)}")
            if np.asarray(values).dtype.hasobject:  # .npy files would need pickle
                raise ValueError(f"node_info {t!r}/{col!r} holds Python objects (dtype "
                                 "object): give numbers or strings (np.str_; fill missing "
                                 "entries, e.g. with '')")


def _check_labels_shape(labels: np.ndarray, target_type: str, n: int) -> None:
    if labels.ndim != 1 or labels.shape[0] != n or not np.issubdtype(labels.dtype, np.integer):
        raise ValueError(f"labels must be integers of shape ({n},) (one per {target_type} "
                         f"node), got {labels.dtype}{labels.shape}")


def make_hetero_dataset(name: str, num_nodes: Mapping[str, int], edges: Mapping, *,
                        target_type: str, labels=None, train_idx=None, val_idx=None,
                        test_idx=None,
                        num_classes: int | None = None, features: Mapping | None = None,
                        weights: Mapping | None = None, edge_features: Mapping | None = None,
                        add_reverse: bool = False, node_info: Mapping | None = None,
                        targets=None, target_kind: str | None = None) -> HeteroDataset:
    """Builds and validates a HeteroDataset from plain dicts (see `hetero_graph` for
    `num_nodes`, `edges`, `weights`, `edge_features` and `add_reverse`).

    `features` maps a node type to float[N_type, d] (bfloat16 kept, other numbers made
    float32); `labels` are integers [N_target] (-1 unlabelled); the split ids are ids of
    `target_type` nodes; `num_classes` defaults to the largest label + 1. Ids and labels
    are checked before they are narrowed to int32.

    Float targets: pass `targets` (float[N_target] or float[N_target, T]) and
    `target_kind` ("multilabel" or "regression"); `labels` may then be None (all -1)
    and `num_classes` None (T).

    A graph for link prediction alone (a relation's pairs predicted, `task="link"`)
    takes neither labels nor split ids: left out, every `target_type` node is
    unlabelled (-1), the splits are empty and `num_classes` is 1; a node task refuses
    such a dataset.
    """
    graph = hetero_graph(num_nodes, edges, weights=weights, edge_features=edge_features,
                         add_reverse=add_reverse)
    counts = graph.num_nodes
    if target_type not in counts:
        raise ValueError(f"target_type {target_type!r} is not a node type ({', '.join(counts)})")
    if counts[target_type] == 0:  # (else named by its labels or splits, as if given wrong)
        raise ValueError(f"target_type {target_type!r} has no nodes (num_nodes[{target_type!r}] "
                         f"is 0): a node task labels and splits nodes of that type")
    tables = {}
    for t, values in (features or {}).items():
        if t not in counts:
            raise ValueError(f"features are given for {t!r}, which is not a node type "
                             f"({', '.join(counts)})")
        tables[t] = node_feature_table(f"features of {t!r}", values, counts[t])
    if (targets is None) != (target_kind is None):
        raise ValueError("give targets and target_kind together (float targets), or neither "
                         "(integer labels)")
    if targets is not None:
        if target_kind not in TARGET_KINDS[1:]:  # (before labels, which it would explain)
            check_targets(None, target_kind, counts[target_type])
            raise ValueError(f"target_kind {target_kind!r} takes no targets (the labels are "
                             f"the targets): give \"multilabel\" or \"regression\" with "
                             f"float targets")
        targets = float_targets(targets)
        num_classes = targets.shape[1] if num_classes is None else num_classes
        labels = np.full(counts[target_type], -1) if labels is None else labels
    elif labels is None:
        given = [f"{s}_idx" for s, idx in zip(SPLITS, (train_idx, val_idx, test_idx))
                 if idx is not None and np.size(idx)]
        if given:
            raise ValueError(f"{', '.join(given)} split nodes that no labels are given for: "
                             f"give labels (or float targets and target_kind); a graph for "
                             f"link prediction alone takes neither labels nor split ids")
        labels = np.full(counts[target_type], -1)
        num_classes = 1 if num_classes is None else num_classes
    labels = _integers("labels", labels)
    if num_classes is None:
        if labels.size and labels.min() < -1:  # (no class count to name: none was given)
            raise ValueError(f"labels must be class ids, or -1 for an unlabelled node; "
                             f"found {int(labels.min())}")
        _check_range("labels must lie in", labels, -1, MAX_CLASSES)  # (int32 storage)
        num_classes = int(labels.max(initial=-1)) + 1
        if num_classes == 0:  # (the check below would name a number nobody gave)
            raise ValueError(f"labels hold no class (every {target_type!r} label is -1, "
                             f"unlabelled), so num_classes cannot be read off them: give "
                             f"num_classes, or label some nodes (a graph for link "
                             f"prediction alone: leave labels out)")
    _check_range("labels must lie in", labels, -1, check_num_classes(num_classes, least=1))
    n = counts[target_type]
    # one per target node, named before the splits (whose ids the wrong count would fail)
    _check_labels_shape(labels, target_type, n)
    if targets is not None:
        check_targets(targets, target_kind, n)
    splits = {}
    for split, idx in zip(SPLITS, (train_idx, val_idx, test_idx)):
        splits[split] = id_array(f"{split}_idx", np.zeros(0, np.int32) if idx is None else idx)
        check_type_ids(f"{split}_idx", splits[split], target_type, n)
    _check_info_layout(node_info or {})
    info = {t: {c: np.asarray(v) for c, v in cols.items()} for t, cols in (node_info or {}).items()}
    return HeteroDataset(name, graph, tables, target_type, labels.astype(np.int32),
                         *(splits[s].astype(np.int32) for s in SPLITS), int(num_classes), info,
                         targets, target_kind or "classes")


def as_numpy(value) -> np.ndarray:
    """A torch tensor (bfloat16 included: its bits) or any array as a NumPy array."""
    if hasattr(value, "detach"):
        value = value.detach().cpu()
        if str(value.dtype) == "torch.bfloat16":  # NumPy has no bfloat16: take its bits
            import torch  # the value is a torch tensor, so torch is installed

            return value.view(torch.int16).numpy().view(BFLOAT16)
        return value.numpy()
    return np.asarray(value)


def store_has(store, key: str) -> bool:
    try:
        return key in store
    except TypeError:
        return getattr(store, key, None) is not None


def _y_targets(y: np.ndarray, who: str, target_kind: str | None) -> dict:
    """`make_hetero_dataset`'s target arguments for the target type's `y` (`who` in
    messages: "node type 'paper'", or a one-type graph's "the data"): integer y gives
    `labels` (y of one column: [N] or [N, 1]), floating-point y float `targets` (a 1-D y
    one column) of
    `target_kind`, which float y needs ("multilabel" or "regression") and integer y
    refuses (but for "classes")."""
    if not (np.issubdtype(y.dtype, np.floating) or y.dtype == BFLOAT16):
        if target_kind not in (None, "classes"):
            raise ValueError(f"target_kind={target_kind!r} needs float labels (y), but "
                             f"{who} has {y.dtype} y (class ids)")
        columns = y.reshape(y.shape[0], -1).shape[1]
        if columns != 1:
            raise ValueError(f"{who} has {y.dtype} labels (y) of shape "
                             f"{y.shape}: class ids take one column; for multi-label "
                             f"targets make y float and give target_kind=\"multilabel\"")
        return {"labels": y.reshape(-1)}
    if target_kind not in TARGET_KINDS[1:]:
        raise ValueError(f"{who} has {y.dtype} labels (y): give "
                         f"target_kind=\"multilabel\" or \"regression\" for float targets"
                         + ("" if target_kind is None else f", not {target_kind!r}")
                         + " (class ids: make y an integer tensor)")
    if y.dtype == BFLOAT16:  # `float_targets` reads NumPy's own float dtypes
        y = y.astype(np.float32)
    return {"targets": y, "target_kind": target_kind}


def _node_count(store, node_type: str, x) -> int:
    """A node store's `num_nodes` (PyG infers it from x), else its x's rows; ValueError
    naming the type when it has neither (PyG then holds None)."""
    n = getattr(store, "num_nodes", None)
    if n is None and x is not None:
        n = len(x)
    if n is None:
        raise ValueError(f"node type {node_type!r} has no num_nodes and no x to count: set "
                         f"data[{node_type!r}].num_nodes")
    return int(n)


def from_hetero_data(data, target_type: str | None = None, *, name: str = "hetero",
                     num_classes: int | None = None, add_reverse: bool = False,
                     target_kind: str | None = None) -> HeteroDataset:
    """A HeteroDataset from a PyG `HeteroData` (torch optional: read by duck typing).

    Reads every node type's `num_nodes` and `x` (when present), every edge type's
    `edge_index` (row 0 sources, row 1 destinations), `edge_weight` and `edge_attr`
    (when present), and the target type's `y` with `train_mask`, `val_mask` and
    `test_mask`. `target_type` defaults to the one node type that has `y`. Data without
    any `y` (a graph for link prediction alone, as recommendation data comes) gives a
    dataset without labels or splits (`make_hetero_dataset`), its `target_type` the
    first node type unless given.

    An integer `y` holds class ids ([N] or [N, 1]). A floating-point `y`
    ([N] or [N, T]) holds float targets of `target_kind`, which it then needs:
    "multilabel" or "regression"; `num_classes` then defaults to T. Class ids take
    `num_classes` from the target type's `num_classes` where it has one (`to_hetero_data`
    writes it: classes no node is labelled with would be lost), else the largest + 1.
    """
    types = list(data.node_types)
    if target_type is None:
        with_y = [t for t in types if store_has(data[t], "y")]
        if len(with_y) > 1:
            raise ValueError(f"give target_type: node types with labels (y) are {with_y}")
        target_type = (with_y or types or [None])[0]
    features = {t: as_numpy(data[t].x) for t in types if store_has(data[t], "x")}
    counts = {t: _node_count(data[t], t, features.get(t)) for t in types}
    edges, weights, tables = {}, {}, {}
    for rel in data.edge_types:
        store = data[rel]
        edges[tuple(rel)] = as_numpy(store.edge_index)
        if store_has(store, "edge_weight"):
            weights[tuple(rel)] = as_numpy(store.edge_weight)
        if store_has(store, "edge_attr"):
            tables[tuple(rel)] = as_numpy(store.edge_attr)
    if target_type not in counts:
        raise ValueError(f"target_type {target_type!r} is not a node type "
                         f"({', '.join(counts)})")
    given, splits = {}, {}  # none: a graph for link prediction alone
    if any(store_has(data[t], "y") for t in types):
        given, splits, num_classes = labels_and_splits(
            data[target_type], f"node type {target_type!r}", counts[target_type],
            target_kind, num_classes)
    return make_hetero_dataset(name, counts, edges, target_type=target_type, **given,
                               **splits, num_classes=num_classes, features=features,
                               weights=weights or None, edge_features=tables or None,
                               add_reverse=add_reverse)


def labels_and_splits(target, who: str, n: int, target_kind, num_classes):
    """`make_hetero_dataset`'s label (or target) and split arguments from the target
    type's store of a `HeteroData` (`who` in messages), or of a PyG `Data`: its `y` and
    masks; and `num_classes` (the store's where class ids leave it unset)."""
    if not store_has(target, "y"):
        raise ValueError(f"{who} has no labels (y)")
    y = as_numpy(target.y)
    if y.ndim == 0 or y.shape[0] != n:
        raise ValueError(f"{who} has {n} nodes but its "
                         f"labels (y) have shape {y.shape}: one label per node")
    given = _y_targets(y, who, target_kind)
    if num_classes is None and "labels" in given and store_has(target, "num_classes"):
        num_classes = target.num_classes
    splits = {}
    for split in SPLITS:
        if not store_has(target, f"{split}_mask"):
            raise ValueError(f"{who} has no {split}_mask")
        mask = as_numpy(getattr(target, f"{split}_mask"))
        if mask.dtype != np.bool_ or mask.shape != (n,):  # node ids would read as a mask
            raise ValueError(f"{split}_mask of {who} must be a boolean "
                             f"mask of shape ({n},), one entry per node; got {mask.dtype} "
                             f"of shape {mask.shape}")
        splits[f"{split}_idx"] = np.flatnonzero(mask)
    return given, splits, num_classes


def to_hetero_data(ds: HeteroDataset):
    """The dataset as a PyG `HeteroData` (needs torch and torch_geometric): the inverse
    of `from_hetero_data`, edges in CSR order; bfloat16 features become float32. The
    target type's `y` holds the labels (int64[N]) and its `num_classes` their count, or
    float targets (float32[N, T])."""
    torch = need("torch", "to_hetero_data")
    HeteroData = need("torch_geometric.data", "to_hetero_data").HeteroData

    out = HeteroData()
    for t, n in ds.graph.node_counts:
        out[t].num_nodes = n
        if t in ds.features:
            out[t].x = torch.from_numpy(np.array(ds.features[t], np.float32))  # a copy
    for rel, g in ds.graph.items():
        rows, cols = to_edge_list(g)
        out[rel].edge_index = torch.from_numpy(np.stack([cols, rows]).astype(np.int64))
        if g.weights is not None:
            out[rel].edge_weight = torch.from_numpy(np.array(g.weights, np.float32))
        if g.edge_features is not None:
            out[rel].edge_attr = torch.from_numpy(np.array(g.edge_features, np.float32))
    target = out[ds.target_type]
    target.y = torch.from_numpy(ds.labels.astype(np.int64) if ds.targets is None
                                else np.array(ds.targets, np.float32))  # a copy
    if ds.targets is None:  # classes no node is labelled with are not in y
        target.num_classes = int(ds.num_classes)
    for split in SPLITS:
        mask = np.zeros(ds.labels.shape[0], bool)
        mask[getattr(ds, f"{split}_idx")] = True
        setattr(target, f"{split}_mask", torch.from_numpy(mask))
    return out
