"""The node-classification dataset container shared by every loader and the trainer."""

from __future__ import annotations

import dataclasses

import numpy as np

from zerognn_jax._src.data.graph import CSRGraph, csr_from_arrays, validate_csr


@dataclasses.dataclass(frozen=True)
class Dataset:
    """A graph with node features, labels and a train/val/test split, held on the host.

    Attributes:
      name: short identifier ("cora", "products-like", ...).
      graph: CSRGraph with NumPy arrays; row v lists the neighbours v aggregates from.
      features: float32[N, d], finite.
      labels: int32[N], class ids in [0, num_classes); -1 marks an unlabelled node.
      train_idx, val_idx, test_idx: int32[*], disjoint node ids; train is non-empty.
      num_classes: number of classes.
    """

    name: str
    graph: CSRGraph
    features: np.ndarray
    labels: np.ndarray
    train_idx: np.ndarray
    val_idx: np.ndarray
    test_idx: np.ndarray
    num_classes: int

    def __post_init__(self):
        validate_dataset(self)

    @property
    def num_nodes(self) -> int:
        return self.graph.num_nodes

    def stats(self) -> dict:
        """The dataset's statistics as a JSON-serialisable dict."""
        g = self.graph
        nbytes = sum(
            int(np.asarray(a).nbytes)
            for a in (g.indptr, g.indices, g.weights, self.features, self.labels)
            if a is not None
        )
        return {
            "name": self.name,
            "nodes": int(g.num_nodes),
            "directed_edges": int(g.num_edges),
            "features": int(self.features.shape[1]),
            "classes": int(self.num_classes),
            "train": int(self.train_idx.size),
            "val": int(self.val_idx.size),
            "test": int(self.test_idx.size),
            "feature_dtype": str(self.features.dtype),
            "max_degree": g.max_degree(),
            "bytes": nbytes,
        }


def _check_range(problem: str, values: np.ndarray, lo: int, hi: int) -> None:
    """Raises ValueError "<problem> [lo, hi), found range [min, max]" unless every entry
    of `values` lies in [lo, hi)."""
    if values.size and (values.min() < lo or values.max() >= hi):
        raise ValueError(f"{problem} [{lo}, {hi}), found range "
                         f"[{int(values.min())}, {int(values.max())}]")


def validate_dataset(ds: Dataset) -> None:
    """Raises ValueError naming the first inconsistency found in `ds`."""
    g = ds.graph
    try:
        validate_csr(g.indptr, g.indices, g.weights)
    except TypeError as err:
        raise ValueError(str(err)) from None
    n = g.num_nodes
    feats = ds.features
    if feats.ndim != 2:
        raise ValueError(f"features must be 2-D [num_nodes, dim], got shape {feats.shape}")
    if feats.shape[0] != n:
        raise ValueError(f"features have {feats.shape[0]} rows but the graph has {n} nodes")
    if not np.issubdtype(feats.dtype, np.floating):
        raise ValueError(f"features must be floating point, got {feats.dtype}")
    wide = feats.dtype.itemsize > 4  # the device holds float32 (or narrower): check that
    with np.errstate(over="ignore"):
        bad = ~np.isfinite(feats.astype(np.float32) if wide else feats)
    if bad.any():
        row, col = (int(i) for i in np.argwhere(bad)[0])
        raise ValueError(
            f"features contain NaN or inf ({int(bad.sum())} entries; first at row {row}, "
            f"column {col}{'; as float32' if wide else ''})"
        )
    labels = ds.labels
    if labels.ndim != 1 or labels.shape[0] != n:
        raise ValueError(f"labels must have shape ({n},), got {labels.shape}")
    if not np.issubdtype(labels.dtype, np.integer):
        raise ValueError(f"labels must be integers, got {labels.dtype}")
    if ds.num_classes < 1:
        raise ValueError(f"num_classes must be positive, got {ds.num_classes}")
    _check_range("labels must lie in", labels, -1, ds.num_classes)
    splits = {"train": ds.train_idx, "val": ds.val_idx, "test": ds.test_idx}
    for name, idx in splits.items():
        if idx.ndim != 1 or not np.issubdtype(idx.dtype, np.integer):
            raise ValueError(f"{name}_idx must be a 1-D integer array, got {idx.dtype}{idx.shape}")
        _check_range(f"{name}_idx has node ids outside", idx, 0, n)
        ordered = np.sort(idx)  # np.unique is ~100x slower than a sort on NumPy 2.4
        if np.any(ordered[1:] == ordered[:-1]):
            raise ValueError(f"{name}_idx lists a node more than once")
        if idx.size and np.any(labels[idx] < 0):
            raise ValueError(f"{name}_idx contains unlabelled nodes (label -1)")
    if ds.train_idx.size == 0:
        raise ValueError("train_idx is empty: there is nothing to train on")
    for a, b in (("train", "val"), ("train", "test"), ("val", "test")):
        both = np.intersect1d(splits[a], splits[b], assume_unique=True)
        if both.size:
            raise ValueError(
                f"{a} and {b} splits overlap in {both.size} nodes (first: {int(both[0])})"
            )


def make_dataset(name, indptr, indices, features, labels, train_idx, val_idx, test_idx,
                 num_classes, weights=None) -> Dataset:
    """Builds and validates a Dataset from plain arrays, casting to the canonical dtypes.

    Ids and labels are checked before they are narrowed to int32 (a cast must not wrap
    an out-of-range value into range); non-integer ids, labels or num_classes are refused.
    """
    graph = csr_from_arrays(indptr, indices, weights)
    if not (np.ndim(num_classes) == 0 and float(num_classes).is_integer()):
        raise ValueError(f"num_classes must be an integer, got {num_classes!r}")
    num_classes = int(num_classes)
    labels = _integers("labels", labels)
    _check_range("labels must lie in", labels, -1, max(num_classes, 0))
    splits = {}
    for split, idx in (("train", train_idx), ("val", val_idx), ("test", test_idx)):
        splits[split] = _integers(f"{split}_idx", idx)
        _check_range(f"{split}_idx has node ids outside", splits[split], 0, graph.num_nodes)
    features = np.asarray(features)
    if not np.issubdtype(features.dtype, np.number) or features.dtype == np.bool_:
        raise ValueError(f"features must be numeric, got {features.dtype}")
    with np.errstate(over="ignore"):  # values past float32's range become inf: refused below
        features = np.ascontiguousarray(features, dtype=np.float32)
    return Dataset(
        name=name,
        graph=graph,
        features=features,
        labels=labels.astype(np.int32),
        train_idx=splits["train"].astype(np.int32),
        val_idx=splits["val"].astype(np.int32),
        test_idx=splits["test"].astype(np.int32),
        num_classes=num_classes,
    )


def _integers(name: str, values) -> np.ndarray:
    """`values` as a 1-D NumPy array of an integer dtype (an empty list is fine)."""
    arr = np.asarray(values)
    if arr.size == 0:
        return arr.reshape(0).astype(np.int64)
    if arr.ndim != 1 or not np.issubdtype(arr.dtype, np.integer):
        raise ValueError(f"{name} must be a 1-D array of integers, got {arr.dtype}{arr.shape}")
    return arr
