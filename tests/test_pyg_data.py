"""`zg.dataset_from_pyg` / `zg.dataset_to_pyg`: a PyG `Data` (duck-typed here: torch is
not installed on the CPU machines) read as the `Dataset` it describes, and back."""

from __future__ import annotations

import types

import numpy as np
import pytest
from conftest import random_graph

import zerognn_jax as zg


def _dataset(n=40, edges=160, weighted=False):
    graph = random_graph(n, edges, seed=3)
    rng = np.random.default_rng(0)
    labels = rng.integers(0, 4, n)
    labels[5] = -1  # unlabelled, in no split
    ids = np.setdiff1d(np.arange(n), [5])
    e = graph.indices.shape[0]
    return zg.make_dataset("toy", graph.indptr, graph.indices,
                           rng.normal(size=(n, 6)).astype(np.float32), labels, ids[:20],
                           ids[20:30], ids[30:], 5,
                           rng.random(e).astype(np.float32) if weighted else None,
                           edge_features=rng.normal(size=(e, 2)).astype(np.float32))


def _as_data(ds, **fields):
    """A stand-in for `torch_geometric.data.Data` holding `ds` as PyG lays it out."""
    n = ds.graph.num_nodes
    masks = {}
    for split in ("train", "val", "test"):
        masks[f"{split}_mask"] = np.zeros(n, bool)
        masks[f"{split}_mask"][getattr(ds, f"{split}_idx")] = True
    data = dict(x=ds.features, edge_index=zg.to_edge_index(ds.graph), y=ds.labels,
                num_nodes=n, edge_attr=ds.graph.edge_features, **masks)
    if ds.graph.weights is not None:
        data["edge_weight"] = ds.graph.weights
    data.update(fields)
    return types.SimpleNamespace(**{k: v for k, v in data.items() if v is not None})


def _same(a, b):
    for name in ("indptr", "indices", "weights", "edge_features"):
        x, y = getattr(a.graph, name), getattr(b.graph, name)
        assert (x is None) == (y is None), name
        if x is not None:
            np.testing.assert_array_equal(np.asarray(x), np.asarray(y), err_msg=name)
    for name in ("features", "labels", "train_idx", "val_idx", "test_idx"):
        np.testing.assert_array_equal(getattr(a, name), getattr(b, name), err_msg=name)
    assert a.num_classes == b.num_classes


@pytest.mark.parametrize("weighted", [False, True])
def test_a_datas_graph_features_labels_and_masks_are_the_datasets(weighted):
    ds = _dataset(weighted=weighted)
    back = zg.dataset_from_pyg(_as_data(ds), name="toy", num_classes=5)
    _same(ds, back)
    # num_classes from the labels (the largest + 1) where neither it nor data gives it
    assert zg.dataset_from_pyg(_as_data(ds)).num_classes == 4
    assert zg.dataset_from_pyg(_as_data(ds, num_nodes=None)).graph.num_nodes == 40  # x's


def test_edges_in_any_order_keep_their_rows_and_a_last_isolated_node_counts():
    """PyG's edges come in any order: each edge's weight and edge_attr row follow it into
    the CSR order; num_nodes past the largest id keeps isolated nodes; y [N, 1] holds
    class ids; a 1-D edge_attr is one column."""
    ds = _dataset(weighted=True)
    data = _as_data(ds)
    order = np.random.default_rng(2).permutation(data.edge_index.shape[1])
    data.edge_index, data.edge_weight = data.edge_index[:, order], data.edge_weight[order]
    data.edge_attr, data.y = data.edge_attr[order], ds.labels[:, None]
    _same(ds, zg.dataset_from_pyg(data, num_classes=5))
    data.edge_attr = data.edge_attr[:, 0]
    back = zg.dataset_from_pyg(data, num_classes=5)
    np.testing.assert_array_equal(back.graph.edge_features, ds.graph.edge_features[:, :1])
    lone = _as_data(ds, num_nodes=43, x=None, y=None)
    for split in ("train", "val", "test"):
        delattr(lone, f"{split}_mask")
    assert zg.dataset_from_pyg(lone).graph.num_nodes == 43


def test_data_without_labels_or_features_is_a_graph_for_link_prediction():
    ds = _dataset()
    data = _as_data(ds, x=None)
    for key in ("y", "train_mask", "val_mask", "test_mask"):
        delattr(data, key)
    back = zg.dataset_from_pyg(data)
    assert back.features.shape == (40, 0) and (back.labels == -1).all()
    assert back.train_idx.size == back.val_idx.size == back.test_idx.size == 0


def test_float_y_gives_targets_of_the_kind_named():
    ds = _dataset()
    y = (np.random.default_rng(1).random((40, 3)) > 0.5).astype(np.float32)
    back = zg.dataset_from_pyg(_as_data(ds, y=y), target_kind="multilabel")
    np.testing.assert_array_equal(back.targets, y)
    assert back.target_kind == "multilabel" and back.num_classes == 3
    with pytest.raises(ValueError, match=r"^the data has float32 labels \(y\): give "
                                         r'target_kind="multilabel" or "regression"'):
        zg.dataset_from_pyg(_as_data(ds, y=y))


@pytest.mark.parametrize(("change", "message"), [
    (dict(edge_index=None), r"^the data has no edge_index: a graph's edges are its \[2, E\]"),
    (dict(x=None, num_nodes=None), r"^the data has no num_nodes and no x to count its "
                                   r"nodes: set data.num_nodes$"),
    (dict(val_mask=np.arange(10)), r"^val_mask of the data must be a boolean mask of shape "
                                   r"\(40,\), one entry per node; got int64"),
    (dict(edge_index=np.zeros((3, 4), np.int64)), r"edge_index must have shape \[2, E\]"),
    # (row 1's largest id sets the count: row 0's alone gave a count that still failed)
    (dict(edge_index=np.array([[0, 39], [45, 1]])), r"^edge_index holds node id 45, and the "
                                                    r"data has 40 nodes: set data.num_nodes "
                                                    r"to 46 or more$"),
])
def test_malformed_data_is_named(change, message):
    data = _as_data(_dataset())
    for key, value in change.items():
        if value is None:
            delattr(data, key)
        else:
            setattr(data, key, value)
    with pytest.raises(ValueError, match=message):
        zg.dataset_from_pyg(data)


def test_to_pyg_and_back_keeps_the_dataset():
    pytest.importorskip("torch_geometric")
    ds = _dataset(weighted=True)
    data = zg.dataset_to_pyg(ds)
    assert data.num_nodes == 40 and int(data.num_classes) == 5
    _same(ds, zg.dataset_from_pyg(data, name="toy"))
