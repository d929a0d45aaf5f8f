"""Typed graphs and datasets: construction, validation at the boundary (a test per
error), reverse relations, storage round trips, PyG HeteroData in and out."""

from __future__ import annotations

import dataclasses
import re

import jax.numpy as jnp
import numpy as np
import pytest
from conftest import lexsort_csr

import zerognn_jax as zg

COUNTS = {"author": 4, "paper": 5, "field": 3}
WRITES = ("author", "writes", "paper")
CITES = ("paper", "cites", "paper")
TOPIC = ("paper", "has_topic", "field")


def _edges():
    return {WRITES: (np.array([0, 1, 1, 3, 2]), np.array([0, 0, 2, 4, 1])),
            CITES: np.array([[0, 1, 2, 3], [1, 2, 3, 4]]),
            TOPIC: (np.array([0, 1, 4]), np.array([2, 2, 0]))}


def _dataset(**kw):
    args = dict(target_type="paper", labels=np.array([0, 1, 2, 1, 0]), train_idx=[0, 1, 2],
                val_idx=[3], test_idx=[4],
                features={"paper": np.arange(10, dtype=np.float64).reshape(5, 2),
                          "author": np.ones((4, 3), jnp.bfloat16)},
                node_info={"paper": {"year": np.arange(2010, 2015)}})
    args.update(kw)
    return zg.make_hetero_dataset("toy", COUNTS, _edges(), **args)


def test_relations_hold_destination_rows_of_source_ids():
    g = zg.hetero_graph(COUNTS, _edges())
    writes = g[WRITES]
    assert writes.num_nodes == 5 and writes.num_edges == 5  # one row per paper
    rows, cols = zg.to_edge_list(writes)
    assert sorted(zip(cols.tolist(), rows.tolist())) == sorted(zip(*map(list, _edges()[WRITES])))
    assert g.num_nodes == COUNTS and g.relations == (WRITES, CITES, TOPIC)
    assert g.into("paper") == (WRITES, CITES)


def test_reversing_a_graph_that_holds_its_reverses_says_what_to_do():
    g = zg.hetero_graph(COUNTS, _edges(), add_reverse=True)
    with pytest.raises(ValueError, match=r"^the reverse of author__writes__paper would be "
                                         r"paper__rev_writes__author, which the graph already "
                                         r"has: leave add_reverse off .* another prefix$"):
        zg.add_reverse_relations(g)
    again = zg.add_reverse_relations(g, prefix="back_")
    assert ("paper", "back_writes", "author") in again.relations


def test_reverse_relations_turn_edges_round_and_merge_same_type():
    w = {WRITES: np.arange(5, dtype=np.float32)}
    g = zg.hetero_graph(COUNTS, _edges(), weights=w, add_reverse=True)
    rev = g[("paper", "rev_writes", "author")]
    assert rev.num_nodes == 4
    rows, cols = zg.to_edge_list(rev)
    src, dst = _edges()[WRITES]
    pairs = {(int(a), int(p)): float(x) for a, p, x in zip(src, dst, w[WRITES])}
    got = {(int(r), int(c)): float(x) for r, c, x in zip(rows, cols, rev.weights)}
    assert got == pairs  # row author a lists paper p with the edge's weight
    cites = g[CITES]
    assert cites.num_edges == 8  # symmetric, merged into the one relation
    assert ("paper", "rev_cites", "paper") not in g.relations
    unmerged = zg.add_reverse_relations(zg.hetero_graph(COUNTS, _edges()), merge=False)
    assert unmerged[("paper", "rev_cites", "paper")].num_edges == 4


@pytest.mark.parametrize("chunk", [None, 8])  # 8: keys sorted in chunks, then merged
@pytest.mark.parametrize("relation", [WRITES, CITES])
def test_bare_relations_and_their_reverses_are_sorted_csr(relation, chunk, monkeypatch):
    # without weights or features from_edge_list sorts keys (not an argsort): same arrays
    from zerognn_jax._src.data import graph

    if chunk:
        monkeypatch.setattr(graph, "_KEY_CHUNK", chunk)
    rng = np.random.default_rng(0)
    n_src, n_dst = COUNTS[relation[0]], COUNTS[relation[2]]
    src, dst = rng.integers(0, n_src, 40), rng.integers(0, n_dst, 40)  # repeats, loops
    g = zg.hetero_graph(COUNTS, {relation: (src, dst)}, add_reverse=True)
    if relation[0] == relation[2]:
        pairs = [(g[relation], lexsort_csr(dst, src, n_dst, undirected=True, distinct=True))]
    else:
        pairs = [(g[(relation[2], "rev_" + relation[1], relation[0])],
                  lexsort_csr(src, dst, n_src)),
                 (g[relation], lexsort_csr(dst, src, n_dst))]
    for got, (indptr, indices) in pairs:
        assert got.indptr.dtype == np.int32 and got.indices.dtype == np.int32
        np.testing.assert_array_equal(got.indptr, indptr)
        np.testing.assert_array_equal(got.indices, indices)


def test_homogeneous_graph_is_the_one_type_case():
    csr = zg.from_edge_list([0, 1, 2], [1, 2, 0], 3)
    g = zg.as_hetero(csr)
    assert g.homogeneous() is csr and g.relations == (("_N", "_E", "_N"),)
    moved = g.to_device()
    assert isinstance(moved.graphs[0].indptr, type(jnp.zeros(1)))
    assert moved.relations == g.relations


@pytest.mark.parametrize("num_nodes, edges, match", [
    ({"a": -1}, {}, r"count of node type 'a' must lie in \[0, 2\*\*31 - 1\], got -1"),
    ({"a": 2.5}, {}, r"count of node type 'a' must be an integer, got 2.5"),
    ({"": 2}, {}, r"node types must be non-empty strings, got ''"),
    ({"a": 2}, {("a", "x"): ([0], [1])}, r"must be a \(src_type, name, dst_type\) tuple"),
    ({"a": 2}, {("a", "x", "b"): ([0], [1])}, r"a__x__b names node type 'b', which is not"),
    ({"a": 2, "b": 3}, {("a", "x", "b"): ([0, 2], [1, 1])},
     r"a__x__b: src has a id 2 at position 1, out of range for 2 a nodes"),
    ({"a": 2, "b": 3}, {("a", "x", "b"): ([0, 1], [-1, 1])},
     r"a__x__b: dst has b id -1 at position 0, out of range for 3 b nodes"),
    ({"a": 2, "b": 3}, {("a", "x", "b"): ([0, 1], [1])},
     r"a__x__b: src and dst differ in length: 2 vs 1"),
    ({"a": 2, "b": 3}, {("a", "x", "b"): ([0.0], [1])}, r"a__x__b: src ids must be integers"),
    ({"a": 2, "b": 3}, {("a", "x", "b"): np.zeros((3, 2), int)},
     r"a__x__b: edges must be \(src, dst\) or an edge_index \[2, E\], got shape \[3, 2\]"),
])
def test_graph_errors_name_the_problem(num_nodes, edges, match):
    with pytest.raises(ValueError, match=match):
        zg.hetero_graph(num_nodes, edges)


def test_weights_of_the_wrong_length_and_of_no_relation_are_refused():
    with pytest.raises(ValueError, match=r"author__writes__paper: weights has shape \(2,\)"):
        zg.hetero_graph(COUNTS, _edges(), weights={WRITES: np.ones(2)})
    with pytest.raises(ValueError, match=r"weights are given for \('a', 'b', 'c'\)"):
        zg.hetero_graph(COUNTS, _edges(), weights={("a", "b", "c"): np.ones(2)})


def test_a_reverse_whose_name_is_taken_is_refused():
    edges = {WRITES: ([0], [0]), ("paper", "rev_writes", "author"): ([0], [0])}
    with pytest.raises(ValueError, match="paper__rev_writes__author, which the graph already"):
        zg.hetero_graph(COUNTS, edges, add_reverse=True)


def test_a_dataset_checks_a_graph_built_by_hand():
    g = zg.hetero_graph(COUNTS, _edges())
    bad = zg.HeteroGraph(g.node_counts, g.relations, (g.graphs[2],) + g.graphs[1:])
    with pytest.raises(ValueError, match=r"author__writes__paper: indptr has 4 entries, "
                                         r"expected 6 \(paper nodes \+ 1\)"):
        dataclasses.replace(_dataset(), graph=bad)


def test_csr_input_is_checked_against_both_types():
    good = zg.hetero_from_csr({"a": 2, "b": 3}, {("a", "x", "b"): ([0, 1, 1, 2], [0, 1])})
    assert good[("a", "x", "b")].num_edges == 2
    with pytest.raises(ValueError, match=r"indptr has 3 entries, expected 4 \(b nodes \+ 1\)"):
        zg.hetero_from_csr({"a": 2, "b": 3}, {("a", "x", "b"): ([0, 1, 2], [0, 1])})
    with pytest.raises(ValueError, match="indices has a id 2 at position 1, out of range "
                                         "for 2 a nodes"):
        zg.hetero_from_csr({"a": 2, "b": 3}, {("a", "x", "b"): ([0, 1, 1, 2], [0, 2])})


@pytest.mark.parametrize("change, match", [
    (dict(target_type="venue"), r"target_type 'venue' is not a node type"),
    (dict(features={"venue": np.ones((2, 2))}), r"features are given for 'venue'"),
    (dict(features={"paper": np.ones((4, 2))}), r"features of 'paper' have 4 rows, expected 5"),
    (dict(features={"paper": np.ones(5)}), r"features of 'paper' must be 2-D \[N, d\]"),
    (dict(features={"paper": np.full((5, 1), np.nan)}), r"features of 'paper' contain NaN"),
    (dict(features={"paper": np.array([["a"]] * 5)}), r"features of 'paper' must be real"),
    (dict(features={"paper": np.ones((5, 2), np.complex64)}),
     r"features of 'paper' must be real numbers, got complex64"),
    (dict(labels=np.array([0, 1, 2])), r"labels must be integers of shape \(5,\)"),
    (dict(labels=np.array([0, 1, 2, 1, 0]), num_classes=2), r"labels must lie in \[-1, 2\)"),
    # past int32, named as given (a label of 2**32 became class 0 before)
    (dict(labels=np.array([0, 1, 2, 1, 2**32]), num_classes=None),
     r"labels must lie in \[-1, 2147483648\), found range \[0, 4294967296\]"),
    (dict(num_classes=2**32 + 1), r"num_classes must be at most 2\*\*31 \(labels are stored "
                                  r"as int32\), got 4294967297"),
    (dict(train_idx=[0, 7]), r"train_idx has paper id 7 at position 1, out of range for 5"),
    (dict(val_idx=[1]), r"train and val splits overlap in 1 nodes \(first: 1\)"),
    (dict(train_idx=[0, 0]), r"train_idx lists node 0 more than once"),
    (dict(labels=np.array([0, -1, 2, 1, 0]), num_classes=3),
     r"train_idx contains 1 unlabelled nodes \(label -1; first: node 1\)"),
    (dict(node_info={"paper": {"year": np.arange(3)}}), r"node_info 'paper'/'year' must be"),
    (dict(num_classes=0), r"^num_classes must be at least 1 \(the width of the model's "
                          r"output\), got 0$"),
])
def test_dataset_errors_name_the_problem(change, match):
    with pytest.raises(ValueError, match=match):
        _dataset(**change)


def test_a_target_type_without_nodes_is_named():
    """It was named by its labels ("labels hold no class"), then, with num_classes
    given, by an empty train_idx."""
    for classes in (None, 3):
        with pytest.raises(ValueError, match=r"^target_type 'paper' has no nodes "
                                             r"\(num_nodes\['paper'\] is 0\)"):
            zg.make_hetero_dataset("h", {"author": 6, "paper": 0},
                                   {("author", "writes", "paper"): ([], [])},
                                   target_type="paper", labels=np.zeros(0, np.int64),
                                   train_idx=[], val_idx=[], test_idx=[], num_classes=classes)


def test_dataset_keeps_dtypes_and_reports_types_and_relations():
    ds = _dataset()
    assert ds.features["paper"].dtype == np.float32
    assert ds.features["author"].dtype == jnp.bfloat16
    assert ds.feature_dims == {"paper": 2, "author": 3}
    stats = ds.stats()
    assert stats["node_types"]["field"] == {"nodes": 3, "features": 0}
    assert stats["relations"]["author__writes__paper"]["edges"] == 5
    assert stats["directed_edges"] == 12 and stats["classes"] == 3


def _same(a: zg.HeteroDataset, b: zg.HeteroDataset):
    assert a.graph.node_counts == b.graph.node_counts and a.graph.relations == b.graph.relations
    for x, y in zip(a.graph.graphs, b.graph.graphs):
        for f in ("indptr", "indices", "weights", "edge_features"):
            u, v = getattr(x, f), getattr(y, f)
            assert (u is None) == (v is None)
            if u is not None:
                np.testing.assert_array_equal(np.asarray(u), np.asarray(v))
    assert a.features.keys() == b.features.keys()
    for t in a.features:
        assert a.features[t].dtype == b.features[t].dtype
        np.testing.assert_array_equal(a.features[t], b.features[t])
    for f in ("labels", "train_idx", "val_idx", "test_idx"):
        np.testing.assert_array_equal(getattr(a, f), getattr(b, f))
    assert {t: list(c) for t, c in a.node_info.items()} == \
        {t: list(c) for t, c in b.node_info.items()}
    for t, cols in a.node_info.items():
        for c in cols:
            np.testing.assert_array_equal(cols[c], b.node_info[t][c])
    assert (a.name, a.target_type, a.num_classes) == (b.name, b.target_type, b.num_classes)


@pytest.mark.parametrize("suffix", [".npz", ""])
def test_storage_round_trip(tmp_path, suffix):
    ds = _dataset(weights={TOPIC: np.array([1.0, 2.0, 3.0])},
                  edge_features={WRITES: np.ones((5, 2), jnp.bfloat16)})
    path = tmp_path / f"toy{suffix}"
    (zg.save_hetero_npz if suffix else zg.save_hetero_dir)(ds, path)
    assert zg.is_hetero_path(path)
    back = zg.load_hetero(path)
    _same(ds, back)
    if not suffix:
        assert isinstance(back.features["paper"], np.memmap)
        with pytest.raises(ValueError, match="holds a typed .* read it with load_hetero"):
            zg.load_dir(path)


def test_a_typed_file_short_of_an_array_its_meta_lists_is_refused(tmp_path):
    """A file without one type's features (or a relation's weights) loaded without
    them, silently: a directory's meta.json named every array, an .npz's meta none."""
    ds = _dataset(weights={TOPIC: np.array([1.0, 2.0, 3.0])})
    zg.save_hetero_npz(ds, tmp_path / "t.npz")
    with np.load(tmp_path / "t.npz") as f:
        arrays = {k: f[k] for k in f.files}
    for gone, named in (("x0", "x0 (the features of 'author')"),
                        (next(k for k in arrays if k.endswith("_weights")), "_weights")):
        np.savez(tmp_path / "short.npz", **{k: v for k, v in arrays.items() if k != gone})
        with pytest.raises(ValueError, match=rf"short.npz is not a readable typed dataset "
                                             rf"file: it lacks .*{re.escape(named)}, which "
                                             rf"its meta lists$"):
            zg.load_hetero(tmp_path / "short.npz")


def test_typed_and_homogeneous_files_name_their_reader(tmp_path):
    homogeneous = zg.make_dataset("h", [0, 1, 2], [1, 0], np.ones((2, 1)), [0, 1], [0], [1],
                                  [], 2)
    zg.save_npz(homogeneous, tmp_path / "h.npz")
    assert not zg.is_hetero_path(tmp_path / "h.npz")
    with pytest.raises(ValueError, match=r"h.npz is not a readable typed dataset file: it "
                                         r"holds a homogeneous dataset; read it with "
                                         r"zg.load_dataset$"):
        zg.load_hetero(tmp_path / "h.npz")
    with pytest.raises(FileNotFoundError, match="does not exist"):
        zg.load_hetero(tmp_path / "none.npz")


class _Store(dict):
    """A stand-in for PyG's node and edge stores: attributes over a dict."""

    def __getattr__(self, key):
        try:
            return self[key]
        except KeyError:  # what PyG's stores raise for a field they lack
            raise AttributeError(key) from None


class _FakeHeteroData:
    def __init__(self, ds: zg.HeteroDataset):
        self.stores = {}
        for t, n in ds.graph.node_counts:
            self.stores[t] = _Store(num_nodes=n, **({"x": ds.features[t]}
                                                    if t in ds.features else {}))
        for rel, g in ds.graph.items():
            rows, cols = zg.to_edge_list(g)
            self.stores[rel] = _Store(edge_index=np.stack([cols, rows]))
        target = self.stores[ds.target_type]
        target["y"] = ds.labels[:, None]
        for split in ("train", "val", "test"):
            mask = np.zeros(ds.labels.shape[0], bool)
            mask[getattr(ds, f"{split}_idx")] = True
            target[f"{split}_mask"] = mask
        self.node_types = [t for t, _ in ds.graph.node_counts]
        self.edge_types = list(ds.graph.relations)

    def __getitem__(self, key):
        return self.stores[key]


def test_from_hetero_data_reads_pyg_layout():
    ds = _dataset(node_info={})
    back = zg.from_hetero_data(_FakeHeteroData(ds), name="toy")
    assert back.target_type == "paper" and back.num_classes == 3
    _same(ds, back)


def test_from_hetero_data_takes_the_target_types_num_classes():
    """`to_hetero_data` writes the class count beside the labels: read back, a dataset
    of 5 classes whose labels reach 2 had 3 (mag-like at scale 0.001: 344 of 349), and a
    model built from it another output width."""
    data = _FakeHeteroData(_dataset(node_info={}))
    data["paper"]["num_classes"] = 5
    assert zg.from_hetero_data(data).num_classes == 5
    assert zg.from_hetero_data(data, num_classes=4).num_classes == 4  # given wins


def test_from_hetero_data_names_a_bad_target_or_labels():
    ds = _dataset(node_info={})
    with pytest.raises(ValueError, match=r"target_type 'venue' is not a node type "
                                         r"\(author, paper, field\)"):
        zg.from_hetero_data(_FakeHeteroData(ds), target_type="venue")
    data = _FakeHeteroData(ds)
    data["paper"]["y"] = data["paper"]["y"][:3]
    with pytest.raises(ValueError, match=r"node type 'paper' has 5 nodes but its labels \(y\) "
                                         r"have shape \(3, 1\): one label per node"):
        zg.from_hetero_data(data)


def test_hetero_data_round_trip_with_torch():
    pytest.importorskip("torch")
    pytest.importorskip("torch_geometric")
    ds = _dataset(node_info={}, features={"paper": np.ones((5, 2), np.float32)})
    back = zg.from_hetero_data(zg.to_hetero_data(ds), name="toy")
    for rel in ds.graph.relations:
        np.testing.assert_array_equal(ds.graph[rel].indptr, back.graph[rel].indptr)
        np.testing.assert_array_equal(ds.graph[rel].indices, back.graph[rel].indices)
    np.testing.assert_array_equal(ds.train_idx, back.train_idx)
    wider = dataclasses.replace(ds, num_classes=7)  # classes no node is labelled with
    assert zg.from_hetero_data(zg.to_hetero_data(wider)).num_classes == 7
