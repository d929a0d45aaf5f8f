"""A one-type graph's `Dataset` from a PyG `Data` and back: the form a PyG user's node
or link data comes in (`Planetoid(...)[0]`, an OGB `PygNodePropPredDataset`'s graph
with its split as masks), read by duck typing so that torch is needed only to write
one. The typed counterpart is hetero_dataset.py's `from_hetero_data`, whose readers of
`y`, the masks and torch tensors this shares."""

from __future__ import annotations

import numpy as np

from zerognn_jax._src.data.dataset import Dataset, make_dataset
from zerognn_jax._src.data.graph import from_edge_index, to_edge_index
from zerognn_jax._src.data.hetero_dataset import SPLITS, as_numpy, labels_and_splits, store_has
from zerognn_jax._src.data.optional import need


def dataset_from_pyg(data, *, name: str = "pyg", num_classes: int | None = None,
                     target_kind: str | None = None) -> Dataset:
    """A `Dataset` of a PyG `Data` (torch tensors or arrays).

    Reads `edge_index` ([2, E], row 0 the sources: PyG's "source_to_target" flow, so a
    node aggregates from the sources of its incoming edges), `num_nodes` (PyG counts
    it from `x`), `x` (none: zero feature columns, for a run of `embedding_dim`), and
    where present `edge_weight` (the weighted sampler's) and `edge_attr` (edge features,
    row i for column i; [E] is one column). `y` with `train_mask`, `val_mask` and
    `test_mask` gives the labels and splits: integer `y` class ids ([N] or [N, 1];
    `num_classes` defaults to `data.num_classes` where set, else the largest + 1), float
    `y` ([N] or [N, T]) float targets of `target_kind` ("multilabel" or "regression").
    Without `y` the dataset has no labels or splits: a graph for link prediction alone.

    Raises:
      ValueError: no `edge_index`, or a malformed one; no node count (neither
        `num_nodes` nor `x`); a `y` without one of the masks, masks that are not
        boolean per node, float `y` without `target_kind`.
    """
    if not store_has(data, "edge_index"):
        raise ValueError("the data has no edge_index: a graph's edges are its [2, E] "
                         "edge_index (row 0 the sources)")
    x = as_numpy(data.x) if store_has(data, "x") else None
    n = getattr(data, "num_nodes", None)
    n = int(n) if n is not None else None if x is None else len(x)
    if n is None:
        raise ValueError("the data has no num_nodes and no x to count its nodes: set "
                         "data.num_nodes")
    optional = {key: as_numpy(getattr(data, field)) for key, field in (
        ("weights", "edge_weight"), ("edge_features", "edge_attr"))
        if store_has(data, field)}
    if "edge_features" in optional and optional["edge_features"].ndim == 1:
        optional["edge_features"] = optional["edge_features"][:, None]  # PyG's [E]: one
    edge_index = as_numpy(data.edge_index)
    if np.size(edge_index) and np.issubdtype(edge_index.dtype, np.integer) and \
            int(edge_index.max()) >= n:  # (from_edge_index's hint names its own argument)
        raise ValueError(f"edge_index holds node id {int(edge_index.max())}, and the data "
                         f"has {n} nodes: set data.num_nodes to "
                         f"{int(edge_index.max()) + 1} or more")
    graph = from_edge_index(edge_index, n, **optional)
    features = np.zeros((n, 0), np.float32) if x is None else x
    given = {"labels": np.full(n, -1, np.int32)}
    splits = {f"{s}_idx": np.zeros(0, np.int64) for s in SPLITS}
    if store_has(data, "y"):
        given, splits, num_classes = labels_and_splits(data, "the data", n, target_kind,
                                                       num_classes)
    if num_classes is None and "targets" not in given:
        labels = given["labels"]
        num_classes = int(labels.max()) + 1 if labels.size and labels.max() >= 0 else 1
    return make_dataset(name, graph.indptr, graph.indices, features,
                        given.get("labels"), splits["train_idx"], splits["val_idx"],
                        splits["test_idx"], num_classes, graph.weights,
                        targets=given.get("targets"), target_kind=given.get("target_kind"),
                        edge_features=graph.edge_features)


def dataset_to_pyg(ds: Dataset):
    """The dataset as a PyG `Data` (needs torch and torch_geometric): the inverse of
    `dataset_from_pyg`, edges in CSR order; bfloat16 features become float32. `y` holds
    the labels (int64[N]; -1 where unlabelled) and `num_classes` their count, or the
    float targets (float32[N, T]); the splits are boolean masks."""
    torch = need("torch", "dataset_to_pyg")
    Data = need("torch_geometric.data", "dataset_to_pyg").Data

    g = ds.graph
    out = Data(x=torch.from_numpy(np.array(ds.features, np.float32)),  # a copy
               edge_index=torch.from_numpy(to_edge_index(g)), num_nodes=g.num_nodes)
    if g.weights is not None:
        out.edge_weight = torch.from_numpy(np.array(g.weights, np.float32))
    if g.edge_features is not None:
        out.edge_attr = torch.from_numpy(np.array(g.edge_features, np.float32))
    out.y = torch.from_numpy(ds.labels.astype(np.int64) if ds.targets is None
                             else np.array(ds.targets, np.float32))
    if ds.targets is None:  # classes no node is labelled with are not in y
        out.num_classes = int(ds.num_classes)
    for split in SPLITS:
        mask = np.zeros(g.num_nodes, bool)
        mask[getattr(ds, f"{split}_idx")] = True
        setattr(out, f"{split}_mask", torch.from_numpy(mask))
    return out
