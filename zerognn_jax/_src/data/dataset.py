"""The node dataset container shared by every loader and the trainer.

Node targets are integer class labels (`labels`, the default), or float targets
(`targets`, `target_kind`): several binary labels per node ("multilabel") or real values
("regression").
"""

from __future__ import annotations

import dataclasses

import numpy as np

from zerognn_jax._src.data.checks import (
    arrays_not_lists,
    id_array,
    is_count,
    is_whole,
    require_ids,
)
from zerognn_jax._src.data.graph import CSRGraph, csr_from_arrays, validate_csr
from zerognn_jax._src.data.tables import (
    BFLOAT16,
    FINITE_BLOCK,
    check_finite_rows,
    narrow_to_float32,
    require_real,
)

TARGET_KINDS = ("classes", "multilabel", "regression")
_FINITE_BLOCK = FINITE_BLOCK  # feature entries checked at a time (tests shrink it)


@dataclasses.dataclass(frozen=True)
class Dataset:
    """A graph with node features, targets and a train/val/test split, held on the host.

    Attributes:
      name: short identifier ("cora", "products-like", ...).
      graph: CSRGraph with NumPy arrays; row v lists the neighbours v aggregates from.
        Edge features, when the dataset has them, are `graph.edge_features` (aligned
        with the CSR edges; docs/datasets.md says why they live on the graph).
      features: float32[N, d] or bfloat16[N, d] (kept as given: half the host and
        device bytes), finite.
      labels: int32[N], class ids in [0, num_classes); -1 marks an unlabelled node.
      train_idx, val_idx, test_idx: int32[*], disjoint node ids; train is non-empty.
        (Labels and ids given in another integer dtype are narrowed to int32.)
      num_classes: number of classes.
      targets: None (the targets are `labels`), or float32[N, T]: T binary labels per
        node in {0, 1} ("multilabel") or T real values ("regression"), NaN where an
        entry is missing (left out of the loss and the metrics; infinities are refused).
        With targets, `labels` are not trained on and may be -1 everywhere.
      target_kind: "classes" (targets None), "multilabel" or "regression".
    """

    name: str
    graph: CSRGraph
    features: np.ndarray
    labels: np.ndarray
    train_idx: np.ndarray
    val_idx: np.ndarray
    test_idx: np.ndarray
    num_classes: int
    targets: np.ndarray | None = None
    target_kind: str = "classes"

    def __post_init__(self):
        validate_dataset(self)
        # other integer dtypes (int64, ...) narrowed to the int32 that storage keeps: the
        # checks above put every value in int32's range
        for name in ("labels", "train_idx", "val_idx", "test_idx"):
            object.__setattr__(self, name, getattr(self, name).astype(np.int32, copy=False))

    @property
    def num_nodes(self) -> int:
        return self.graph.num_nodes

    def __repr__(self) -> str:  # its sizes, not its arrays (a notebook prints it)
        x, targets = self.features, self.targets
        extra = "" if targets is None else f", targets={self.target_kind}{list(targets.shape)}"
        return (f"Dataset({self.name!r}, nodes={self.num_nodes:,}, "
                f"edges={self.graph.num_edges:,}, features={x.dtype}{list(x.shape)}, "
                f"classes={self.num_classes}, {split_sizes(self)}{extra})")

    @property
    def output_dim(self) -> int:
        """Output units a model needs: num_classes, or the targets' T."""
        return self.num_classes if self.targets is None else int(self.targets.shape[1])

    def with_targets(self, targets, kind: str) -> Dataset:
        """This dataset with float node targets: float[N] or float[N, T] (a 1-D array
        becomes [N, 1]), `kind` "multilabel" ({0, 1} values) or "regression".

        Raises:
          ValueError: another kind, a shape that is not [N] or [N, T], non-numeric or
            infinite values, or multi-label values other than 0 and 1 (NaN marks a
            missing entry).
        """
        if kind not in TARGET_KINDS[1:]:
            raise ValueError(f"target kind must be multilabel or regression, got {kind!r}")
        return dataclasses.replace(self, targets=float_targets(targets),
                                   target_kind=kind)

    def stats(self) -> dict:
        """The dataset's statistics as a JSON-serialisable dict."""
        g = self.graph
        nbytes = sum(
            int(np.asarray(a).nbytes)
            for a in (g.indptr, g.indices, g.weights, g.edge_features, self.features,
                      self.labels, self.targets)
            if a is not None
        )
        edges = {} if g.edge_features is None else {
            "edge_features": int(g.edge_features.shape[1]),
            "edge_feature_dtype": str(g.edge_features.dtype)}
        return {
            "name": self.name,
            "nodes": int(g.num_nodes),
            "directed_edges": int(g.num_edges),
            "features": int(self.features.shape[1]),
            "classes": int(self.num_classes),
            **labelled_count(self.labels, self.target_kind, self.targets),
            "target_kind": self.target_kind,
            "outputs": self.output_dim,
            "train": int(self.train_idx.size),
            "val": int(self.val_idx.size),
            "test": int(self.test_idx.size),
            "feature_dtype": str(self.features.dtype),
            "max_degree": g.max_degree(),
            "bytes": nbytes,
            **edges,
        }


def labelled_count(labels, target_kind: str, targets=None) -> dict:
    """{"labelled": nodes whose class label is not -1} for class targets (a graph kept
    for link prediction alone labels none and still records 1 class); for float
    `targets` {"missing_targets": their NaN entries} where there are any, else {}."""
    if target_kind != "classes":
        missing = 0 if targets is None else int(np.count_nonzero(np.isnan(targets)))
        return {"missing_targets": missing} if missing else {}
    return {"labelled": int(np.count_nonzero(np.asarray(labels) >= 0))}


# Labels are stored as int32: classes number at most this.
MAX_CLASSES = 2**31


def check_num_classes(num_classes, least: int = 0) -> int:
    """`num_classes` as an int; ValueError unless it is a whole number from `least` (1
    for node labels, the model's output width; a graph collection's binary or regression
    targets record 0) to MAX_CLASSES (a larger one would pass labels that int32 storage
    wraps)."""
    if not is_whole(num_classes):
        raise ValueError(f"num_classes must be an integer, got {num_classes!r}")
    if int(num_classes) < least:
        raise ValueError(f"num_classes must be at least {least} (the width of the model's "
                         f"output), got {int(num_classes)}")
    if int(num_classes) > MAX_CLASSES:
        raise ValueError(f"num_classes must be at most 2**31 (labels are stored as int32), "
                         f"got {int(num_classes)}")
    return int(num_classes)


def _check_range(problem: str, values: np.ndarray, lo: int, hi: int) -> None:
    """Raises ValueError "<problem> [lo, hi), found range [min, max]" unless every entry
    of `values` lies in [lo, hi)."""
    if values.size and (values.min() < lo or values.max() >= hi):
        raise ValueError(f"{problem} [{lo}, {hi}), found range "
                         f"[{int(values.min())}, {int(values.max())}]")


def check_labels(labels: np.ndarray, num_classes: int) -> None:
    """`_check_range` of class labels: ids from 0 to num_classes - 1, or -1 for a node
    without one; labels that run from 1 to num_classes are named as numbered from 1."""
    try:
        _check_range("labels must lie in", labels, -1, num_classes)
    except ValueError as err:
        if labels.min() >= 1 and labels.max() == num_classes:
            raise ValueError(f"{err}: they look numbered from 1; class ids run from 0 "
                             f"(give labels - 1), and -1 marks a node without one") from None
        raise


def validate_dataset(ds: Dataset) -> None:
    """Raises ValueError naming the first inconsistency found in `ds`."""
    if not isinstance(ds.name, str) or not ds.name:
        raise ValueError(f"name must be a non-empty string (it names the dataset in "
                         f"metrics, checkpoints and files), got {ds.name!r}")
    arrays_not_lists(ds, ("features", "labels", "train_idx", "val_idx", "test_idx"),
                     "make_dataset")
    g = ds.graph
    if not isinstance(g, CSRGraph):
        raise ValueError(f"graph must be a CSRGraph, got {type(g).__name__} (build one with "
                         f"zg.from_edge_list or zg.from_edge_index; make_dataset takes "
                         f"indptr and indices)")
    for what in ("indptr", "indices"):
        if isinstance(getattr(g, what), list | tuple):
            raise ValueError(f"graph.{what} must be an array, got a "
                             f"{type(getattr(g, what)).__name__}: a CSRGraph holds arrays "
                             f"(zg.from_edge_list takes lists)")
    try:
        validate_csr(g.indptr, g.indices, g.weights, g.edge_features)
    except TypeError as err:
        raise ValueError(str(err)) from None
    n = g.num_nodes
    feats = ds.features
    if feats.ndim != 2:
        raise ValueError(f"features must be 2-D [num_nodes, dim], got shape {feats.shape}")
    one_per_node("features have", feats.shape[0], "rows", n)
    if not (np.issubdtype(feats.dtype, np.floating) or feats.dtype == BFLOAT16):
        raise ValueError(f"features must be floating point, got {feats.dtype}")
    check_finite_rows("features", feats, _FINITE_BLOCK)  # as given: an overflow is named
    if feats.dtype not in (np.dtype(np.float32), BFLOAT16):
        raise ValueError(f"features must be float32 or bfloat16, got {feats.dtype} "
                         f"(make_dataset narrows other real dtypes to float32)")
    labels = ds.labels
    check_targets(ds.targets, ds.target_kind, n)
    if labels.ndim != 1:
        raise ValueError(f"labels must have shape ({n},), got {labels.shape}")
    one_per_node("labels have", labels.shape[0], "entries", n)
    if not np.issubdtype(labels.dtype, np.integer):
        raise ValueError(f"labels must be integers, got {labels.dtype}")
    if not is_count(ds.num_classes) or ds.num_classes < 1:  # (make_dataset takes 3.0)
        raise ValueError(f"num_classes must be a positive integer, got {ds.num_classes!r}")
    check_num_classes(ds.num_classes)
    check_labels(labels, ds.num_classes)
    check_splits({"train": ds.train_idx, "val": ds.val_idx, "test": ds.test_idx}, n,
                 labels if ds.targets is None else None)


def one_per_node(what: str, count: int, unit: str, n: int) -> None:
    """ValueError unless a table has one row (`unit`) per node of the graph's n, naming
    both counts: "<what> 8 rows but the graph has 7 nodes". More rows than nodes are
    mostly a graph built from edges, which counts its nodes up to the largest id + 1
    and so leaves out an isolated last node: the message says to give num_nodes."""
    if count == n:
        return
    fix = (f"; the graph's nodes are its indptr's entries less one ({n + 1} - 1), and a "
           f"graph built from edges has the largest id + 1 nodes unless told: pass "
           f"from_edge_index(..., num_nodes={count})" if count > n
           else "; give one per node")
    raise ValueError(f"{what} {count} {unit} but the graph has {n} nodes{fix}")


def check_splits(splits: dict, n: int, labels: np.ndarray | None) -> None:
    """Raises ValueError naming the first problem of the split ids `splits` ({"train":
    int[*], "val": ..., "test": ...}) of n nodes: not 1-D integers, out of [0, n), a
    node listed twice, an unlabelled node (label -1 in `labels`, unless None: float
    targets), an empty train split where a node is labelled (a graph of no labels at
    all serves link prediction alone), or two splits that overlap."""
    for name, idx in splits.items():
        require_ids(f"{name}_idx", idx)
        _check_range(f"{name}_idx has node ids outside", idx, 0, n)
        ordered = np.sort(idx)  # np.unique is ~100x slower than a sort on NumPy 2.4
        twice = np.flatnonzero(ordered[1:] == ordered[:-1])
        if twice.size:
            raise ValueError(f"{name}_idx lists node {int(ordered[twice[0]])} more than once")
        unlabelled = idx[labels[idx] < 0] if idx.size and labels is not None else idx[:0]
        if unlabelled.size:
            raise ValueError(f"{name}_idx contains {unlabelled.size} unlabelled nodes (label "
                             f"-1; first: node {int(unlabelled[0])})")
    if splits["train"].size == 0 and (labels is None or bool(np.any(labels >= 0))):
        raise ValueError("train_idx is empty: there is nothing to train on")
    for a, b in (("train", "val"), ("train", "test"), ("val", "test")):
        both = np.intersect1d(splits[a], splits[b], assume_unique=True)
        if both.size:
            raise ValueError(
                f"{a} and {b} splits overlap in {both.size} nodes (first: {int(both[0])})"
            )


def check_targets(t: np.ndarray | None, kind: str, n: int) -> None:
    """Raises ValueError naming the first problem of float targets `t` of `kind` for n
    nodes: an unknown kind, targets missing for a float kind or given for "classes",
    not float32[n, T] (T >= 1), infinite entries, multi-label values other than 0 and 1
    (NaN marks a missing entry)."""
    if kind not in TARGET_KINDS:
        raise ValueError(f"target_kind must be one of {', '.join(TARGET_KINDS)}, "
                         f"got {kind!r}")
    if (t is None) != (kind == "classes"):
        raise ValueError(f"target_kind {kind!r} "
                         + ("takes no targets (the labels are the targets)" if t is not None
                            else "needs targets: float[N, T]"))
    if t is None:
        return
    if not isinstance(t, np.ndarray) or t.ndim != 2 or t.shape[0] != n or t.shape[1] < 1:
        raise ValueError(f"targets must be a NumPy array of shape ({n}, T), T >= 1, got "
                         f"{getattr(t, 'shape', type(t).__name__)}")
    if t.dtype != np.float32:
        raise ValueError(f"targets must be float32, got {t.dtype}")
    bad = np.isinf(t)
    if bad.any():
        row, col = (int(i) for i in np.argwhere(bad)[0])
        raise ValueError(f"targets contain inf ({int(bad.sum())} entries; first at row "
                         f"{row}, column {col}); mark a missing entry with NaN")
    wrong = (t != 0) & (t != 1) & ~np.isnan(t)
    if kind == "multilabel" and np.any(wrong):
        row, col = (int(i) for i in np.argwhere(wrong)[0])
        raise ValueError(f"multilabel targets must be 0 or 1 (NaN: missing), found "
                         f"{float(t[row, col])} at row {row}, column {col}")


def float_targets(targets) -> np.ndarray:
    """`targets` as float32[N, T] (a 1-D array becomes one column); the rest is checked
    by `check_targets`."""
    t = np.asarray(targets)
    if not (np.issubdtype(t.dtype, np.number) or t.dtype == np.bool_):
        raise ValueError(f"targets must be numeric, got {t.dtype}")
    # a finite value past float32's range is named as such (the cast would make it inf);
    # NaN (a missing entry) and inf are `check_targets`'s
    return narrow_to_float32("targets", t[:, None] if t.ndim == 1 else t, missing=True)




def make_dataset(name, indptr, indices, features, labels, train_idx, val_idx, test_idx,
                 num_classes, weights=None, *, targets=None,
                 target_kind: str | None = None, edge_features=None) -> Dataset:
    """Builds and validates a Dataset from plain arrays, casting to the canonical dtypes.

    The graph comes as its CSR arrays `indptr` and `indices` (of a CSRGraph `g`:
    `g.indptr, g.indices`, with `weights=g.weights, edge_features=g.edge_features`).

    Ids and labels are checked before they are narrowed to int32 (a cast must not wrap
    an out-of-range value into range); non-integer ids, labels or num_classes are refused.

    Float node targets: pass `targets` (float[N] or float[N, T]) and `target_kind`
    ("multilabel" or "regression"); `labels` may then be None (all -1) and
    `num_classes` None (T).

    Edge features: `edge_features` float[E, D] aligned with `indices` (row i for the
    edge at CSR position i), kept in bfloat16 or made float32; see `CSRGraph`.
    """
    graph = csr_from_arrays(_csr_array("indptr", indptr), _csr_array("indices", indices),
                            weights, edge_features=edge_features)
    if (targets is None) != (target_kind is None):
        raise ValueError("give targets and target_kind together (float targets), or neither "
                         "(integer labels)")
    if targets is not None:
        targets = float_targets(targets)
        if num_classes is None:
            num_classes = targets.shape[1] if targets.ndim == 2 else 1
        if labels is None:
            labels = np.full(graph.num_nodes, -1, np.int32)
    elif labels is None:
        raise ValueError("labels are required unless float targets are given")
    num_classes = check_num_classes(num_classes, least=1)
    labels = _integers("labels", labels)
    features = np.asarray(features)
    if features.ndim != 2:  # (a 1-D table's length is no row count)
        raise ValueError(f"features must be 2-D [num_nodes, dim], got shape {features.shape}")
    # the tables' lengths before the splits: a graph short of nodes (from_edge_index
    # without num_nodes) was named by the first split that reached past it
    for what, table, unit in (("features have", features, "rows"),
                              ("labels have", labels, "entries"),
                              ("targets have", targets, "rows")):
        if table is not None and table.ndim:
            one_per_node(what, table.shape[0], unit, graph.num_nodes)
    check_labels(labels, num_classes)
    splits = {}
    for split, idx in (("train", train_idx), ("val", val_idx), ("test", test_idx)):
        splits[split] = id_array(f"{split}_idx", idx)
        _check_range(f"{split}_idx has node ids outside", splits[split], 0, graph.num_nodes)
    require_real("features", features)
    if features.dtype != BFLOAT16:  # bfloat16 stays as given (no widening copy)
        features = narrow_to_float32("features", features)
    return Dataset(
        name=name,
        graph=graph,
        features=features,
        labels=labels.astype(np.int32),
        train_idx=splits["train"].astype(np.int32),
        val_idx=splits["val"].astype(np.int32),
        test_idx=splits["test"].astype(np.int32),
        num_classes=num_classes,
        targets=targets,
        target_kind=target_kind or "classes",
    )


def _csr_array(name: str, value) -> np.ndarray:
    """make_dataset's `indptr` or `indices` as a NumPy array; TypeError naming what was
    given and what to pass where it is a graph (a CSRGraph was a NumPy error about an
    inhomogeneous shape) or anything else NumPy does not read as numbers. Numeric
    arrays go on as given: `validate_csr` checks them."""
    try:
        arr = None if isinstance(value, CSRGraph) else np.asarray(value)
    except (ValueError, TypeError):
        arr = None
    if arr is not None and arr.dtype != object:
        return arr
    tables = ", weights=g.weights, edge_features=g.edge_features" if isinstance(
        value, CSRGraph) else ""
    raise TypeError(f"make_dataset takes the graph as its CSR arrays, got "
                    f"{type(value).__name__} as {name}: for a graph g (a CSRGraph, a SciPy "
                    f"CSR matrix) pass g.indptr, g.indices{tables}")


def _integers(name: str, values) -> np.ndarray:
    """`values` (labels) as a 1-D NumPy array of an integer dtype (an empty list is
    fine); node ids are `id_array`'s."""
    arr = np.asarray(values)
    if arr.size == 0:
        return arr.reshape(0).astype(np.int64)
    if arr.ndim != 1 or not np.issubdtype(arr.dtype, np.integer):
        raise ValueError(f"{name} must be a 1-D array of integers, got {arr.dtype}{arr.shape}")
    return arr


def split_sizes(ds) -> str:
    """"train/val/test=a/b/c" of a dataset's split, for its repr."""
    sizes = "/".join(f"{len(ix):,}" for ix in (ds.train_idx, ds.val_idx, ds.test_idx))
    return f"train/val/test={sizes}"
