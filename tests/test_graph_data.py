"""Graph collections: validation (one error per problem), storage, jraph and PyG round
trips, OGB's graph-property layout on a tiny folder, the synthetic presets."""

from __future__ import annotations

import dataclasses
import gzip
import json
import os
import re
import sys
import types
import warnings

import ml_dtypes
import numpy as np
import pytest

import zerognn_jax as zg


def tiny(target_kind="binary"):
    """Three graphs: a triangle, an edge, a lone node; 2 binary tasks (one missing)."""
    targets = {"binary": [[1, np.nan], [0, 1], [1, 0]], "classes": [2, 0, 1],
               "regression": [[0.5], [1.5], [-2.0]]}[target_kind]
    return zg.make_collection(
        "tiny", [3, 2, 1], [6, 2, 0], [0, 1, 1, 2, 2, 0, 0, 1], [1, 0, 2, 1, 0, 2, 1, 0],
        np.arange(12, dtype=np.float32).reshape(6, 2), targets, target_kind,
        edge_features=np.ones((8, 3), np.float32), splits=([0, 1], [2], []),
        num_classes=3 if target_kind == "classes" else 0)


def same(a, b) -> bool:
    keys = ("node_offsets", "edge_offsets", "senders", "receivers", "node_features",
            "edge_features", "targets", "train_idx", "val_idx", "test_idx")
    return all(np.array_equal(getattr(a, k), getattr(b, k), equal_nan=True) for k in keys)


def test_accessors_and_stats():
    c = tiny()
    assert (c.num_graphs, c.num_nodes, c.num_edges, c.output_dim) == (3, 6, 8, 2)
    np.testing.assert_array_equal(c.graph(1)["senders"], [0, 1])
    assert c.stats()["positive_rate"] == pytest.approx(3 / 5)


BAD = [
    ("node_offsets", np.array([1, 3, 5, 6]), "node_offsets must start at 0, got 1"),
    ("node_offsets", np.array([0, 3, 2, 6]), "node_offsets must not decrease"),
    ("node_offsets", np.array([0, 3, 5, 7]), "ends at 7 but node_features has 6 rows"),
    ("edge_offsets", np.array([0, 6, 8]), "edge_offsets has 3 entries"),
    ("senders", np.array([0, 1, 1, 2, 2, 3, 0, 1]), "senders[5] = 3 is not a node of graph 0"),
    ("receivers", np.array([1, 0, 2, 1, 0, 2, 1, 2]),
     "receivers[7] = 2 is not a node of graph 1"),
    ("edge_features", np.ones((7, 3), np.float32), "edge_features must be [E, d]"),
    ("targets", np.zeros((2, 2), np.float32), "targets have 2 rows but there are 3 graphs"),
    ("targets", np.array([[0, 2], [0, 1], [1, 0]], np.float32), "binary target [0, 1] is 2.0"),
    ("targets", np.array([[0, np.inf], [0, 1], [1, 0]], np.float32), "infinite value"),
    ("target_kind", "ranks", "target_kind must be one of"),
    ("train_idx", np.array([0, 3], np.int32), "train_idx holds graph 3, outside [0, 3)"),
    ("val_idx", np.array([1, 1], np.int32), "val_idx lists graph 1 twice"),
    ("val_idx", np.array([1], np.int32), "train and val splits overlap in 1 graphs (first: 1)"),
    ("node_features", np.full((6, 2), np.nan, np.float32),
     "node_features contain NaN or inf (12 entries; first at row 0, column 0)"),
    ("edge_features", np.full((8, 3), np.inf, np.float32), "edge_features contain NaN or inf"),
    ("node_features", np.zeros((6, 2), np.int32), "need their vocabulary sizes"),
    ("node_features", np.float32(1.0), "node_features must be 2-D [N, d], got shape ()"),
    ("senders", np.array([0, 1, 1, 2, 2, 0, 0, 0.5]), "senders must hold integers, got float64"),
    ("train_idx", np.array([0.7, 1.2]), "train_idx must hold integers, got float64"),
    ("name", "", "name must be a non-empty string (it names the collection in metrics, "
                 "checkpoints and files), got ''"),
    ("num_classes", 5, "num_classes is for class targets; these are binary, got "
                       "num_classes=5"),
    ("edge_features", None, "edge_vocab [2, 3] describes edge features, and this "
                            "collection has none"),
    # zero-width tables failed in Flax's initializer (a division by zero)
    ("node_features", np.zeros((6, 0), np.float32), "node_features have no columns (shape "
                                                     "(6, 0)): a graph model reads"),
    ("edge_features", np.zeros((8, 0), np.float32), "edge_features have no columns (shape "
                                                     "(8, 0)): give None"),
    # training blamed missing (NaN) labels that a target of no columns does not hold
    ("targets", np.zeros((3, 0), np.float32), "binary targets have no columns (shape "
                                              "[3, 0])"),
]


@pytest.mark.parametrize("field,value,message", BAD, ids=[f"{b[0]}-{i}" for i, b in
                                                          enumerate(BAD)])
def test_validation_names_the_problem(field, value, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        given = tiny()
        if field == "edge_features" and value is None:  # a vocabulary left without them
            given = dataclasses.replace(given, edge_features=np.zeros((8, 2), np.int32),
                                        edge_vocab=(2, 3))
        dataclasses.replace(given, **{field: value})


MAKE = dict(name="t", n_node=[3, 2], n_edge=[1, 1], senders=[0, 0], receivers=[1, 1],
            node_features=np.ones((5, 2), np.float32), targets=[0, 1], target_kind="classes",
            num_classes=2, splits=([0], [1], []))


@pytest.mark.parametrize("field,value,message", [
    ("senders", np.array([0, 2**32 + 1]), "senders holds 4294967297, outside the range of "
                                          "int32"),
    ("splits", ([2**32], [1], []), "train_idx holds 4294967296, outside the range of int32"),
    ("targets", [2**32 + 1, 0], "class targets holds 4294967297, outside"),
    ("targets", [1.7, 0.2], "class targets must be integers within int32, got 1.7 (dtype "
                            "float64)"),
    ("targets", [np.nan, 0], "class targets must be integers within int32, got nan"),
    ("targets", np.array([2.0**31], np.float32), "within int32, got 2147483648.0"),
    ("n_node", [3.0, 2.7], "n_node must be integers within int64, got 2.7"),
    # counts of two axes were read as four graphs
    ("n_node", [[3], [2]], "n_node must be one count per graph, int[G], got shape [2, 1]"),
    ("targets", None, "targets are needed, a row per graph ([G] or [G, T] of 'classes'); a "
                      "collection only to predict holds any (they are not read)"),
    ("targets", 1, "targets must hold a row per graph ([G] or [G, T]), got one number (1)"),
    ("splits", ([0], [1]), "splits must be (train, val, test) graph ids, got 2 entries"),
    ("num_classes", 2.5, "num_classes must hold whole numbers, got 2.5"),
    # a mask was read as the ids 0 and 1 (two graphs: graph 1 trained, silently)
    ("splits", (np.array([True, False]), [], []), "train_idx must be graph ids, got "
                                                  "bool[2] (a mask? np.flatnonzero(mask)"),
    ("node_vocab", (4, True), "node_vocab must hold whole numbers, got True"),
    # two folds stacked were read as one split, flattened
    ("splits", (np.array([[0], [1]]).reshape(1, 2), [], []), "train_idx must be a 1-D list "
                                                             "of graph ids, got shape [1, 2]"),
    # float64 past float32's range: named with its value, not as the inf the cast makes
    ("node_features", np.array([[1.0], [1.0], [1.0], [1e300], [1.0]]),
     "node_features overflow float32: 1e+300 at row 3, column 0 is past its largest"),
])
def test_make_collection_refuses_what_a_cast_would_change(field, value, message):
    """Ids and counts that NumPy's cast to int32 would wrap or round are refused."""
    with pytest.raises(ValueError, match=re.escape(message)):
        zg.make_collection(**{**MAKE, field: value})
    zg.make_collection(**{**MAKE, "n_node": [3.0, 2.0]})  # whole floats are counts
    zg.make_collection(**{**MAKE, "targets": np.array([False, True])})  # bools are 0 and 1
    zg.make_collection(**{**MAKE, "senders": np.array([0, 0], object)})  # Python ints
    zg.make_collection(**{**MAKE, "splits": ([[0]], [[1]], [])})  # one column: a list
    column = zg.make_collection(**{**MAKE, "targets": [[1], [0]]})  # jraph's globals
    np.testing.assert_array_equal(column.targets, [1, 0])


@pytest.mark.parametrize("given,message", [
    (dict(node_features=np.ones(5, np.float32)),
     "got shape (5,) (one feature a node: node_features.reshape(-1, 1))"),
    (dict(edge_features=np.ones(2, np.float32)),
     "got shape (2,) (one feature an edge: edge_features.reshape(-1, 1))"),
    (dict(targets=[[1, 0], [0, 1]]),
     "got int32[2, 2]; one-hot rows give their classes by targets.argmax(1)"),
    (dict(targets=[[0.0], [2.0]], target_kind="binary", num_classes=0),
     "(missing); class ids take target_kind='classes' with num_classes"),
    (dict(targets=[0, 2], target_kind="classes", num_classes=0),
     "class targets need num_classes >= 1, got 0 (the largest class id here is 2: give "
     "num_classes=3, or more)"),
    (dict(node_vocab=(2, 2)), "got float32 (these are whole numbers: cast them with "
                              ".astype(np.int64))"),
])
def test_make_collection_says_how_pyg_shaped_data_is_given(given, message):
    """Shapes and dtypes PyG's `Data` holds (a 1-D `edge_attr`, one-hot `y`, class ids
    under the default binary kind, categories as floats) are refused with the change
    that fits them."""
    with pytest.raises(ValueError, match=re.escape(message) + "$"):
        zg.make_collection(**{**MAKE, **given})
    fractions = {**MAKE, "node_features": np.full((5, 2), 0.5, np.float32),
                 "node_vocab": (2, 2)}
    with pytest.raises(ValueError, match="must be integer category ids, got float32$"):
        zg.make_collection(**fractions)


def test_node_features_in_bfloat16_are_read_and_bools_named():
    """bfloat16 rows were refused as integer codes without their vocabulary; they are
    floats (widened to float32 exactly), and a bool table gets the choices it has."""
    rows = np.linspace(-2, 2, 10).reshape(5, 2).astype(ml_dtypes.bfloat16)
    c = zg.make_collection(**{**MAKE, "node_features": rows})
    assert c.node_features.dtype == np.float32
    np.testing.assert_array_equal(c.node_features, rows.astype(np.float32))
    with pytest.raises(ValueError, match=re.escape("node features are bool: give float32 "
                                                   "features, or integer category ids with "
                                                   "their vocabulary sizes (node_vocab)")):
        zg.make_collection(**{**MAKE, "node_features": np.ones((5, 2), bool)})


def test_regression_targets_past_float32_are_named_and_missing_ones_kept():
    """1e39 was cast to inf with NumPy's RuntimeWarning, then refused as an infinite
    value; NaN, a missing label, stays."""
    make = {k: v for k, v in MAKE.items() if k != "num_classes"}
    make["target_kind"] = "regression"
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no cast warning either
        with pytest.raises(ValueError, match=r"^regression targets overflow float32: 1e\+39 "
                                             r"at row 1, column 0 is past its largest"):
            zg.make_collection(**{**make, "targets": np.array([0.5, 1e39])})
        kept = zg.make_collection(**{**make, "targets": np.array([[0.5], [np.nan]])})
    np.testing.assert_array_equal(kept.targets, np.array([[0.5], [np.nan]], np.float32))


def test_a_collection_of_empty_graphs_only_is_refused():
    """It failed in training, in a gather of no rows."""
    with pytest.raises(ValueError, match=re.escape("the collection holds no nodes")):
        zg.make_collection("c", [0, 0], [0, 0], [], [], np.zeros((0, 3)), [0, 1], "classes",
                           num_classes=2)


def test_a_collection_of_no_graphs_is_refused():
    """Float64 targets of no rows failed in NumPy's reshape."""
    with pytest.raises(ValueError, match=re.escape("the collection holds no graphs")):
        zg.make_collection("c", [], [], [], [], np.zeros((0, 3)), np.zeros((0, 1)), "binary")


def test_validation_of_classes_and_vocab():
    with pytest.raises(ValueError, match=r"class target of graph 0 is 3, outside \[0, 3\)"):
        dataclasses.replace(tiny("classes"), targets=np.array([3, 0, 1], np.int32))
    ids = np.array([[0, 1]] * 5 + [[0, 4]], np.int32)
    with pytest.raises(ValueError, match=r"node features column 1 holds 4, outside \[0, 4\)"):
        dataclasses.replace(tiny(), node_features=ids, node_vocab=(2, 4))


def test_targets_and_arrays_of_the_wrong_kind_are_named(tmp_path):
    with pytest.raises(ValueError, match="regression targets must be numbers: could not "
                                         "convert string to float: 'a'"):
        zg.make_collection(**{**MAKE, "targets": ["a", "b"], "target_kind": "regression",
                              "num_classes": 0})
    c = tiny()
    with pytest.raises(ValueError, match=r"node_offsets must be an array, got a list "
                                         r"\(make_collection takes lists"):
        dataclasses.replace(c, node_offsets=c.node_offsets.tolist())
    # a file saved before num_classes was refused for binary targets still loads
    path = zg.save_graphs(c, tmp_path / "old")
    meta = json.loads((path / "meta.json").read_text())
    (path / "meta.json").write_text(json.dumps({**meta, "num_classes": 5}))
    assert zg.load_graphs(str(path)).num_classes == 0


@pytest.mark.parametrize("suffix", [".npz", "_dir"])
def test_storage_round_trip(tmp_path, suffix):
    for kind in ("binary", "classes", "regression"):
        c = tiny(kind)
        path = zg.save_graphs(c, tmp_path / f"{kind}{suffix}")
        back = zg.load_graphs(str(path))
        assert same(c, back) and back.target_kind == kind


def test_a_saved_directory_has_every_file_synced(tmp_path, monkeypatch):
    """As a dataset directory's: a crash after the swap leaves no file half on disk."""
    synced, real_fsync = set(), os.fsync

    def fsync(fd):
        synced.add(os.fstat(fd).st_ino)  # a rename keeps a file's inode
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    saved = zg.save_graphs(tiny(), tmp_path / "d")
    assert synced == {f.stat().st_ino for f in saved.iterdir()}


def test_storage_refuses_other_files(tmp_path):
    (tmp_path / "x.npz").write_bytes(b"not a zip")
    with pytest.raises(ValueError, match="not a readable graph collection"):
        zg.load_graphs_file(tmp_path / "x.npz")
    with pytest.raises(ValueError, match="unknown graph dataset 'nothing'"):
        zg.load_graphs("nothing")
    (tmp_path / "folder").mkdir()  # the names alone, before: no word of the folder
    with pytest.raises(ValueError, match=r"unknown graph dataset .*; the folder .*folder holds "
                                         r"no meta.json, which save_graphs writes$"):
        zg.load_graphs(str(tmp_path / "folder"))
    (tmp_path / "empty.npz").write_bytes(b"")  # asking which kind of file it is: EOFError
    for load in (zg.load_graphs, zg.load_dataset, zg.load_hetero_dataset):
        with pytest.raises(ValueError, match=r"empty.npz is not a readable .*No data left"):
            load(str(tmp_path / "empty.npz"))
    saved = zg.save_graphs(tiny(), tmp_path / "d")
    meta = json.loads((saved / "meta.json").read_text())
    for edit, message in (({k: v for k, v in meta.items() if k != "name"},
                           "holds an invalid graph collection: no entry 'name'"),
                          ([1], r"is not a readable graph collection: its meta is not a JSON "
                                r"object: \[1\]")):
        (saved / "meta.json").write_text(json.dumps(edit))
        with pytest.raises(ValueError, match=message):
            zg.load_graphs_file(saved)
    saved = zg.save_graphs(tiny(), tmp_path / "d", overwrite=True)
    (saved / "senders.npy").write_bytes(b"not an array" * 8)  # NumPy: "unpickle it"
    with pytest.raises(ValueError, match=r"d is not a readable graph collection: senders.npy "
                                         r"is unreadable: it is not a .npy file \(it lacks "
                                         r"NumPy's header\)$"):
        zg.load_graphs_file(saved)


def test_jraph_round_trip():
    pytest.importorskip("jraph")
    c = tiny()
    gt = zg.collection_to_jraph(c)
    np.testing.assert_array_equal(gt.senders, [0, 1, 1, 2, 2, 0, 3, 4])
    back = zg.collection_from_jraph(gt, name="tiny", splits=(c.train_idx, c.val_idx,
                                                              c.test_idx))
    assert same(c, back)
    # categorical columns: the vocabularies, which a GraphsTuple cannot hold, given back
    # as collection_to_jraph's docstring says
    m = zg.molhiv_like(0.001, seed=0)
    back = zg.collection_from_jraph(
        zg.collection_to_jraph(m), name=m.name, target_kind=m.target_kind,
        num_classes=m.num_classes, splits=(m.train_idx, m.val_idx, m.test_idx),
        node_vocab=m.node_vocab, edge_vocab=m.edge_vocab)
    assert m.node_vocab and same(m, back)
    with pytest.raises(ValueError, match=r"the GraphsTuple's globals are a dict \(keys "
                                         r"\['y'\]\); the targets must be one array"):
        zg.collection_from_jraph(gt._replace(globals={"y": gt.globals}))


def test_jraph_padding_graphs_are_left_out_by_the_mask():
    jraph = pytest.importorskip("jraph")
    c = tiny()
    padded = jraph.pad_with_graphs(zg.collection_to_jraph(c), n_node=16, n_edge=20,
                                   n_graph=6)
    mask = np.asarray(jraph.get_graph_padding_mask(padded))
    assert mask.tolist() == [True] * 3 + [False] * 3
    splits = (c.train_idx, c.val_idx, c.test_idx)
    back = zg.collection_from_jraph(padded, name="tiny", graph_mask=mask, splits=splits)
    assert same(c, back)
    # targets of the real graphs only do as well; other counts are refused
    real_only = zg.collection_from_jraph(padded, name="tiny", graph_mask=mask, splits=splits,
                                         targets=c.targets)
    assert same(c, real_only)
    with pytest.raises(ValueError, match=r"targets must give a row per graph of the tuple "
                                         r"\(6\) or per real graph \(3\), got 2"):
        zg.collection_from_jraph(padded, graph_mask=mask, targets=c.targets[:2])
    # without the mask, jraph's padding graphs are graphs like any other, warned of:
    # with graphs of no nodes after the padding nodes' graph, or with padding edges alone
    for n_graph, n_edge in ((6, 20), (4, 20), (6, 8)):
        padded = jraph.pad_with_graphs(zg.collection_to_jraph(c), n_node=16, n_edge=n_edge,
                                       n_graph=n_graph)
        which = "last graph looks" if n_graph == 4 else f"last {n_graph - 3} graphs look"
        with pytest.warns(zg.PaddingGraphsWarning, match=f"^the GraphsTuple's {which} like "):
            assert zg.collection_from_jraph(padded, name="tiny").n_node.size == n_graph
    # an unpadded tuple, or one whose last graph is real, is not warned of
    with warnings.catch_warnings():
        warnings.simplefilter("error", zg.PaddingGraphsWarning)
        zg.collection_from_jraph(zg.collection_to_jraph(c), name="tiny")
        zero = c.node_features.copy()
        zero[5:] = 0  # the lone last node: zero rows, a zero target, no edge
        lone = zg.collection_to_jraph(dataclasses.replace(c, node_features=zero))
        zg.collection_from_jraph(lone._replace(globals=np.where(
            np.arange(3)[:, None] == 2, 0.0, lone.globals)), name="tiny")
        # graphs of no nodes after a graph with rows are the collection's own
        empty_last = zg.make_collection("e", [2, 2, 0], [1, 1, 0], [0, 1], [1, 0],
                                        np.ones((4, 2), np.float32), [[1.0], [0.0], [0.0]],
                                        "binary")
        zg.collection_from_jraph(zg.collection_to_jraph(empty_last))
    padded = jraph.pad_with_graphs(zg.collection_to_jraph(c), n_node=16, n_edge=20, n_graph=6)
    with pytest.raises(ValueError, match=r"graph_mask must be bool\[6\], one entry per "
                                         r"graph of the tuple, got int64\[3\]"):
        zg.collection_from_jraph(padded, graph_mask=np.ones(3, np.int64))


@pytest.mark.parametrize("nodes", [None, {"x": np.ones((4, 2))}])
def test_a_graphs_tuple_without_a_node_table_is_refused(nodes):
    graphs = types.SimpleNamespace(nodes=nodes, edges=None, senders=np.array([0, 2]),
                                   receivers=np.array([1, 3]), n_node=np.array([2, 2]),
                                   n_edge=np.array([1, 1]), globals=np.zeros((2, 1)))
    with pytest.raises(ValueError, match=r"the GraphsTuple's nodes must be one array \[N, d\] "
                                         rf"of node features .* got {type(nodes).__name__}"):
        zg.collection_from_jraph(graphs)


def test_a_graphs_tuple_with_edge_features_in_a_dict_is_refused():
    graphs = types.SimpleNamespace(nodes=np.ones((4, 2)), edges={"bond": np.ones((2, 1))},
                                   senders=np.array([0, 2]), receivers=np.array([1, 3]),
                                   n_node=np.array([2, 2]), n_edge=np.array([1, 1]),
                                   globals=np.zeros((2, 1)))
    with pytest.raises(ValueError, match=r"edges must be one array \[E, d\] of edge features "
                                         r"or None, got a dict \(keys \['bond'\]\)"):
        zg.collection_from_jraph(graphs)


@pytest.mark.parametrize(("change", "message"), [
    (dict(senders=np.array([0, 1])), r"senders has 2 rows but its n_edge sums to 3$"),
    (dict(n_edge=np.array([2, 2])), r"senders has 3 rows but its n_edge sums to 4$"),
    (dict(n_node=np.array([3, 3])), r"nodes has 5 rows but its n_node sums to 6$"),
    (dict(edges=np.ones((2, 1))), r"edges has 2 rows but its n_edge sums to 3$"),
    (dict(n_node=np.array([[3], [2]])), r"n_node must be integers \[G\], one per graph, "
                                        r"got int64\[2, 1\]$"),
    (dict(n_edge=np.array([3])), r"n_node counts 2 graphs but n_edge 1$"),
    (dict(receivers=np.array([1, 2, 2])), r"^receivers\[2\] = 2 leaves its graph 1, whose "
                                          r"nodes are \[3, 5\) of the tuple$"),
])
def test_a_graphs_tuple_whose_counts_disagree_is_named(change, message):
    """Raw NumPy errors (shapes that do not broadcast, a boolean index) before; and an
    edge leaving its graph was named by its id less its graph's first node."""
    graphs = types.SimpleNamespace(
        nodes=np.ones((5, 2)), edges=np.ones((3, 1)), senders=np.array([0, 1, 3]),
        receivers=np.array([1, 2, 4]), n_node=np.array([3, 2]), n_edge=np.array([2, 1]),
        globals=np.array([[1.0], [0.0]]))
    assert zg.collection_from_jraph(graphs).num_graphs == 2
    with pytest.raises(ValueError, match=message):
        zg.collection_from_jraph(types.SimpleNamespace(**{**vars(graphs), **change}),
                                 graph_mask=np.array([True, True]))


def test_pyg_round_trip():
    pytest.importorskip("torch")
    pytest.importorskip("torch_geometric")
    from torch_geometric.data import Batch

    c = tiny()
    data = zg.collection_to_pyg(c)
    assert len(data) == 3 and data[0].edge_index.shape == (2, 6)
    splits = (c.train_idx, c.val_idx, c.test_idx)
    assert same(c, zg.collection_from_pyg(data, name="tiny", splits=splits))
    assert same(c, zg.collection_from_pyg(Batch.from_data_list(data), splits=splits))


def _pyg_like(c):
    """`c`'s graphs as objects with PyG `Data`'s fields, holding NumPy arrays."""
    out = []
    for g in range(c.num_graphs):
        part = c.graph(g)
        out.append(types.SimpleNamespace(
            x=part["nodes"], edge_attr=part["edges"],
            edge_index=np.stack([part["senders"], part["receivers"]]),
            y=part["target"], num_nodes=part["nodes"].shape[0]))
    return out


def test_graphs_from_pyg_need_the_same_fields_in_every_graph():
    """Arrays convert as tensors do; a graph without a field the others have (edge_attr
    in graph 0 only was dropped from every graph, or crashed on the first without it)
    is named."""
    c = tiny()
    splits = (c.train_idx, c.val_idx, c.test_idx)
    assert same(c, zg.collection_from_pyg(_pyg_like(c), name="tiny", splits=splits))
    for graph, field, message in (
            (2, "edge_attr", "graph 2 has no edge_attr: graph 0 has it"),
            (0, "edge_attr", "graph 1 has edge_attr and graph 0 has none"),
            (1, "y", "graph 1 has no y: every graph needs x, edge_index and y"),
            (0, "x", "graph 0 has no x")):
        data = _pyg_like(c)
        setattr(data[graph], field, None)
        with pytest.raises(ValueError, match=message):
            zg.collection_from_pyg(data)
    data = _pyg_like(c)  # the edges as rows, [E, 2]: read as [2, E] before
    g = int(np.argmax([d.edge_index.shape[1] for d in data]))
    data[g].edge_index = data[g].edge_index.T.copy()
    assert data[g].edge_index.shape[0] > 2
    with pytest.raises(ValueError, match=rf"graph {g}'s edge_index must be \[2, E\] \(row 0 "
                                         rf"the sources\), got \[{data[g].edge_index.shape[0]}, "
                                         r"2\]"):
        zg.collection_from_pyg(data)
    # a stand-in without num_nodes counts its x's rows; one lacking edge_attr after graph 0
    # lacked it (an AttributeError before) is named as one set to None is
    data = _pyg_like(c)
    for d in data:
        del d.num_nodes
    assert same(c, zg.collection_from_pyg(data, name="tiny", splits=splits))
    del data[0].edge_attr
    with pytest.raises(ValueError, match="graph 1 has edge_attr and graph 0 has none"):
        zg.collection_from_pyg(data)
    # a field of other columns in one graph is named (NumPy's concatenation error was)
    data = _pyg_like(c)
    data[1].x = np.concatenate([data[1].x, data[1].x], axis=1)
    with pytest.raises(ValueError, match=r"^graph 1's x is \[\d+, \d+\] and graph 0's "
                                         r"\[\d+, \d+\]: every graph's x needs the same "
                                         r"columns$"):
        zg.collection_from_pyg(data)
    # a num_nodes past its x's rows is named with its graph (the collection's offsets
    # were, without the graph)
    data = _pyg_like(c)
    data[1].num_nodes += 2
    with pytest.raises(ValueError, match=rf"^graph 1 has num_nodes {data[1].num_nodes} but "
                                         rf"its x has {data[1].num_nodes - 2} rows"):
        zg.collection_from_pyg(data)


@pytest.mark.parametrize("convert, module, hint", [
    (lambda: zg.collection_to_jraph(tiny()), "jraph", "collection_to_jraph needs jraph, "
     "which is not installed here: pip install 'zerognn-jax[jraph]'"),
    (lambda: zg.collection_to_pyg(tiny()), "torch", "collection_to_pyg needs torch, "
     "which is not installed here: pip install 'zerognn-jax[pyg]'"),
    (lambda: zg.to_networkx(zg.from_edge_list([0], [1], 2)), "networkx", "to_networkx "
     "needs networkx, which is not installed here: pip install 'zerognn-jax[networkx]'"),
])
def test_a_conversion_without_its_library_says_what_to_install(monkeypatch, convert,
                                                                module, hint):
    monkeypatch.setitem(sys.modules, module, None)  # `import module` fails
    with pytest.raises(ImportError, match=re.escape(hint)):
        convert()


def test_a_broken_install_gives_its_own_import_error(monkeypatch):
    """Only a missing module is reported as not installed: one whose own import fails
    (a dependency of it missing) raises that error."""
    from zerognn_jax._src.data import optional

    def broken(name):
        raise ModuleNotFoundError("No module named 'scipy'", name="scipy")

    monkeypatch.setattr(optional.importlib, "import_module", broken)
    with pytest.raises(ModuleNotFoundError, match="No module named 'scipy'"):
        optional.need("networkx", "to_networkx")


def _write_csv(path, rows):
    path.parent.mkdir(parents=True, exist_ok=True)
    with gzip.open(path, "wt") as f:
        f.write("".join(",".join(str(v) for v in row) + "\n" for row in rows))


def test_ogbg_layout_on_a_tiny_folder(tmp_path):
    raw, split = tmp_path / "ogbg_molpcba" / "raw", tmp_path / "ogbg_molpcba" / "split"
    _write_csv(raw / "num-node-list.csv.gz", [[3], [2]])
    _write_csv(raw / "num-edge-list.csv.gz", [[2], [1]])
    _write_csv(raw / "edge.csv.gz", [[0, 1], [1, 2], [0, 1]])
    _write_csv(raw / "node-feat.csv.gz", [[5, 0, 1, 5, 3, 0, 2, 0, 0]] * 5)
    _write_csv(raw / "edge-feat.csv.gz", [[0, 0, 0], [1, 0, 1], [3, 0, 1]])
    label_row = lambda first: [first] + [""] * 126 + [1]
    _write_csv(raw / "graph-label.csv.gz", [label_row(0), label_row("")])
    for part, ids in (("train", [0]), ("valid", [1]), ("test", [])):
        _write_csv(split / "scaffold" / f"{part}.csv.gz", [[i] for i in ids])
    c = zg.load_graphs("ogbg-molpcba", str(tmp_path))
    assert (c.num_graphs, c.num_nodes, c.num_edges) == (2, 5, 6)
    np.testing.assert_array_equal(c.senders, [0, 1, 1, 2, 0, 1])
    np.testing.assert_array_equal(c.receivers, [1, 0, 2, 1, 1, 0])
    np.testing.assert_array_equal(c.edge_features[:, 0], [0, 0, 1, 1, 3, 3])
    assert np.isnan(c.targets[1, 0]) and c.targets[0, 0] == 0 and c.targets[1, 127] == 1
    assert c.node_vocab == (119, 5, 12, 12, 10, 6, 6, 2, 2) and c.edge_vocab == (5, 6, 2)
    np.testing.assert_array_equal(c.val_idx, [1])
    assert (tmp_path / "ogbg_molpcba" / "processed" / "zerognn-graphs.npz").is_file()
    assert same(c, zg.load_graphs("ogbg-molpcba", str(tmp_path)))  # from the cache
    # text in a label field is no missing label (it was read as one, silently)
    for typo in ("yes", "O"):
        _write_csv(raw / "graph-label.csv.gz", [label_row(0), label_row(typo)])
        with pytest.raises(ValueError, match=f"graph-label.csv.gz is not a readable OGB file: "
                                             f"could not convert string '{typo}'"):
            zg.read_ogbg("ogbg-molpcba", tmp_path)
    _write_csv(raw / "graph-label.csv.gz", [label_row(0), label_row("")])
    # no bond in any graph: tables of no rows keep their widths (they were read as 1 wide)
    _write_csv(raw / "num-edge-list.csv.gz", [[0], [0]])
    for name in ("edge.csv.gz", "edge-feat.csv.gz"):
        _write_csv(raw / name, [])
    assert zg.read_ogbg("ogbg-molpcba", tmp_path).edge_features.shape == (0, 3)
    _write_csv(raw / "num-edge-list.csv.gz", [[2], [2]])
    _write_csv(raw / "edge.csv.gz", [[0, 1], [1, 2], [0, 1]])
    with pytest.raises(ValueError, match="edge.csv.gz has 3 rows, the count lists say 4"):
        zg.read_ogbg("ogbg-molpcba", tmp_path)
    # a bond outside its molecule is named by its row of the file (it was named by a
    # directed edge's index, bonds doubled), a split's fault by the folder
    _write_csv(raw / "num-edge-list.csv.gz", [[2], [1]])
    _write_csv(raw / "edge.csv.gz", [[0, 1], [1, 2], [0, 2]])
    _write_csv(raw / "edge-feat.csv.gz", [[0, 0, 0], [1, 0, 1], [3, 0, 1]])
    with pytest.raises(ValueError, match=r"edge.csv.gz row 2: bond \[0, 2\] names an atom "
                                         r"outside molecule 1, which has 2 atoms"):
        zg.read_ogbg("ogbg-molpcba", tmp_path)
    _write_csv(raw / "edge.csv.gz", [[0, 1], [1, 2], [0, 1]])
    _write_csv(split / "scaffold" / "train.csv.gz", [[0], [0]])
    with pytest.raises(ValueError, match=r"ogbg_molpcba holds an invalid ogbg-molpcba: "
                                         r"train_idx lists graph 0 twice \(in its raw/ or "
                                         r"split/scaffold/ files\)"):
        zg.read_ogbg("ogbg-molpcba", tmp_path)


@pytest.mark.parametrize("text, tasks, graphs, want", [
    ("0\n1\n\n", 1, None, [[0], [1]]),  # blank lines at the end are no graphs
    ("0, \n1,\n", 2, None, [[0, "nan"], [1, "nan"]]),  # blanks: a missing label, as nothing
    ("1,,0\n,1,\n", 3, None, [[1, "nan", 0], ["nan", 1, "nan"]]),
    ("0\r\n\r\n1\r\n", 1, None, [[0], ["nan"], [1]]),  # a blank line inside: missing
    ("", 2, None, np.zeros((0, 2))),
    # ... unless the count lists have a graph for them: a last graph of no label (its
    # blank line went with the file's last newline, and the counts disagreed)
    ("1\n1\n\n", 1, 3, [[1], [1], ["nan"]]),
    ("1\n\n\n\n", 1, 2, [[1], ["nan"]]),
])
def test_ogb_graph_labels_read_empty_fields_as_missing(tmp_path, text, tasks, graphs, want):
    from zerognn_jax._src.data.ogbg import _read_labels

    path = tmp_path / "graph-label.csv.gz"
    with gzip.open(path, "wt", newline="") as f:
        f.write(text)
    got = _read_labels(path, tasks, graphs)
    np.testing.assert_array_equal(got, np.asarray(want, np.float32).reshape(-1, tasks))


def test_molhiv_like_shape():
    c = zg.molhiv_like(0.05, seed=1)
    stats = c.stats()
    assert stats["graphs"] == round(41_127 * 0.05)
    assert 23 < stats["mean_nodes"] < 28 and 25 < c.num_edges / 2 / c.num_graphs < 30
    assert 0.025 < stats["positive_rate"] < 0.045
    assert c.node_features.shape[1] == 9 and c.edge_features.shape[1] == 3
    again = zg.molhiv_like(0.05, seed=1)
    assert same(c, again)


def test_molpcba_like_has_missing_labels():
    c = zg.molpcba_like(0.002)
    assert c.targets.shape == (876, 128)
    missing = np.isnan(c.targets).mean()
    assert 0.3 < missing < 0.7


def test_cli_generates_and_reads_a_graph_preset(tmp_path, capsys):
    from zerognn_jax.cli import main

    out = tmp_path / "mh.npz"
    assert main(["data", "generate", "molhiv-like", "--scale", "0.002", "--out", str(out)]) == 0
    assert main(["data", "info", str(out)]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == 2 and '"graphs": 82' in lines[1]


def test_ids_numbered_across_graphs_are_named_so():
    """Edges numbered as dgl.batch numbers them (graph 1's nodes from 3) get a hint."""
    args = ([3, 3], [2, 2], [0, 1, 3, 4], [1, 2, 4, 5], np.ones((6, 2), np.float32), [0, 1],
            "classes")
    with pytest.raises(ValueError, match=r"senders\[2\] = 3 is not a node of graph 1, which "
                       r"has 3 nodes: the ids look numbered across all graphs"):
        zg.make_collection("g", *args, num_classes=2)
    plain = ([3, 3], [2, 2], [0, 1, 0, 7], [1, 2, 1, 2], *args[4:])
    with pytest.raises(ValueError, match=r"senders\[3\] = 7 is not a node of graph 1, which "
                       r"has 3 nodes$"):
        zg.make_collection("g", *plain, num_classes=2)
