"""Typed datasets: ogbn-mag read from a tiny folder in OGB's layout, the mag-like,
igbh-like and shop-like presets' shapes, `zerognn data` on typed datasets, and float targets kept by
storage and by PyG HeteroData in and out."""

from __future__ import annotations

import dataclasses
import functools
import gzip
import json
import re
import sys
import types

import jax.numpy as jnp
import numpy as np
import pytest
from test_cli_data import run
from test_hetero_graph import _dataset, _FakeHeteroData, _same

import zerognn_jax as zg
from zerognn_jax._src.data import hetero_synthetic
from zerognn_jax._src.data.hetero_synthetic import MAG, igbh_like, mag_like
from zerognn_jax._src.data.shop import BUYS, SIMILAR, make_shop

MAG_RELATIONS = [("author", "affiliated_with", "institution"), ("author", "writes", "paper"),
                 ("paper", "cites", "paper"), ("paper", "has_topic", "field_of_study")]


def _csv(path, rows, header=None):
    path.parent.mkdir(parents=True, exist_ok=True)
    with gzip.open(path, "wt") as f:
        if header:
            f.write(",".join(header) + "\n")
        for row in rows:
            f.write(",".join(str(v) for v in np.atleast_1d(row)) + "\n")


def _write_mag(root, rs):
    raw = root / "ogbn_mag" / "raw"
    counts = {"author": 6, "field_of_study": 3, "institution": 2, "paper": 8}
    _csv(raw / "num-node-dict.csv.gz", [list(counts.values())], header=list(counts))
    _csv(raw / "triplet-type-list.csv.gz", [list(r) for r in MAG_RELATIONS])
    edges = {}
    for rel in MAG_RELATIONS:
        m = 10
        src = rs.integers(0, counts[rel[0]], m)
        dst = rs.integers(0, counts[rel[2]], m)
        edges[rel] = (src, dst)
        _csv(raw / "relations" / "___".join(rel) / "edge.csv.gz", np.stack([src, dst], 1))
        _csv(raw / "relations" / "___".join(rel) / "num-edge-list.csv.gz", [m])
    feats = rs.standard_normal((8, 4)).round(3)
    _csv(raw / "node-feat" / "paper" / "node-feat.csv.gz", feats)
    years = np.array([2015, 2016, 2017, 2017, 2018, 2018, 2019, 2019])
    _csv(raw / "node-feat" / "paper" / "node_year.csv.gz", years)
    labels = rs.integers(0, 349, 8)
    _csv(raw / "node-label" / "paper" / "node-label.csv.gz", labels)
    split = root / "ogbn_mag" / "split" / "time" / "paper"
    for part, ids in (("train", [0, 1, 2, 3]), ("valid", [4, 5]), ("test", [6, 7])):
        _csv(split / f"{part}.csv.gz", ids)
    return counts, edges, feats, years, labels


def test_ogbn_mag_is_read_from_ogb_layout_and_cached(tmp_path):
    counts, edges, feats, years, labels = _write_mag(tmp_path, np.random.default_rng(0))
    ds = zg.load_hetero_dataset("ogbn-mag", tmp_path)
    assert ds.graph.num_nodes == counts and ds.num_classes == 349
    assert ds.graph.relations[:4] == tuple(MAG_RELATIONS)
    assert ("paper", "rev_writes", "author") in ds.graph.relations  # reverses added
    rows, cols = zg.to_edge_list(ds.graph[("author", "writes", "paper")])
    src, dst = edges[("author", "writes", "paper")]
    assert sorted(zip(cols.tolist(), rows.tolist())) == sorted(zip(src.tolist(), dst.tolist()))
    np.testing.assert_allclose(ds.features["paper"], feats.astype(np.float32))
    np.testing.assert_array_equal(ds.labels, labels)
    np.testing.assert_array_equal(ds.node_info["paper"]["year"], years)
    np.testing.assert_array_equal(ds.val_idx, [4, 5])
    cache = tmp_path / "ogbn_mag" / "processed" / "zerognn-typed.npz"
    assert cache.is_file()
    again = zg.load_hetero_dataset("ogbn-mag", tmp_path)
    np.testing.assert_array_equal(again.graph[("paper", "cites", "paper")].indices,
                                  ds.graph[("paper", "cites", "paper")].indices)


def test_ogbn_mag_names_a_missing_file(tmp_path):
    _write_mag(tmp_path, np.random.default_rng(1))
    (tmp_path / "ogbn_mag" / "raw" / "node-feat" / "paper" / "node_year.csv.gz").unlink()
    with pytest.raises(FileNotFoundError, match="node_year.csv.gz not found"):
        zg.load_hetero_dataset("ogbn-mag", tmp_path)


@pytest.mark.parametrize("counts, message", [
    ({"author": "x", "paper": 8}, "num-node-dict.csv.gz: a node count is not a count (a "
                                  "whole number >= 0): 'x'"),  # int()'s, naming no file
    ({"author": 6, "institution": 2}, "num-node-dict.csv.gz lists no 'paper' node type (it "
                                      "lists author, institution)"),  # was "-1 papers"
])
def test_ogbn_mag_names_a_node_count_file_it_cannot_use(tmp_path, counts, message):
    _write_mag(tmp_path, np.random.default_rng(1))
    _csv(tmp_path / "ogbn_mag" / "raw" / "num-node-dict.csv.gz", [list(counts.values())],
         header=list(counts))
    with pytest.raises(ValueError, match=re.escape(message)):
        zg.load_hetero_dataset("ogbn-mag", tmp_path)


def test_ogbn_mag_names_the_file_or_folder_of_a_bad_value(tmp_path):
    """A label file's row count was reported under raw/node-feat/paper; a year file of
    two columns as twice the rows; a value the dataset refuses named no file or folder."""
    _write_mag(tmp_path, np.random.default_rng(1))
    raw = tmp_path / "ogbn_mag" / "raw"
    label_file = raw / "node-label" / "paper" / "node-label.csv.gz"
    _csv(label_file, [1, 2])
    with pytest.raises(ValueError, match=rf"^{re.escape(str(label_file))} has 2 rows, "
                                         rf"num-node-dict says 8 papers$"):
        zg.load_hetero_dataset("ogbn-mag", tmp_path)
    _csv(label_file, [349] + [0] * 7)  # a venue past the 349
    with pytest.raises(ValueError, match=rf"^{re.escape(str(tmp_path / 'ogbn_mag'))} holds "
                                         rf"an invalid dataset: labels must lie in"):
        zg.load_hetero_dataset("ogbn-mag", tmp_path)
    _csv(label_file, [0] * 8)
    year_file = raw / "node-feat" / "paper" / "node_year.csv.gz"
    _csv(year_file, [[2015, 1]] * 8)
    with pytest.raises(ValueError, match=r"node_year\.csv\.gz has 2 columns, expected 1"):
        zg.load_hetero_dataset("ogbn-mag", tmp_path)


def test_mag_like_has_ogbn_mags_shape_at_scale():
    scale = 0.004
    ds = mag_like(scale, add_reverse=False)
    for t, n in MAG.nodes.items():
        assert ds.graph.num_nodes[t] == max(4, round(n * scale))
    for rel, m, _ in MAG.relations:
        assert abs(ds.graph[rel].num_edges - round(m * scale)) <= 0.01 * m * scale + 1
    assert ds.num_classes == 349 and ds.feature_dims == {"paper": 128}
    years = ds.node_info["paper"]["year"]
    assert np.all(years[ds.train_idx] <= 2017) and np.all(years[ds.test_idx] == 2019)
    n = ds.graph.num_nodes["paper"]
    assert abs(ds.test_idx.size - n * 41_939 / 736_389) <= 1
    again = mag_like(scale, add_reverse=False)
    np.testing.assert_array_equal(again.graph.graphs[1].indices, ds.graph.graphs[1].indices)
    np.testing.assert_array_equal(again.features["paper"], ds.features["paper"])


def test_shop_like_users_buy_mostly_in_their_items_group(tmp_path):
    """shop-like's buys are distinct pairs, about `inside` of them (plus chance) within
    the user's group, which shows in the groups of the items a user bought; similar
    items share a group, none is similar to itself; cached under root, scale checked
    (one too small to hold out pairs refused)."""
    ds = zg.load_hetero_dataset("shop-like", tmp_path, scale=0.002)
    counts = ds.graph.num_nodes
    assert counts == {"user": 2000, "item": 500} and ds.feature_dims == {"item": 64}
    assert (tmp_path / "shop-like-0.002-0.npz").is_file()
    again = zg.load_hetero_dataset("shop-like", tmp_path, scale=0.002)  # from the cache
    np.testing.assert_array_equal(again.graph[BUYS].indices, ds.graph[BUYS].indices)
    assert sorted(np.r_[ds.train_idx, ds.val_idx, ds.test_idx].tolist()) == list(range(500))

    shop = make_shop(300, 200, 5, per_user=12, inside=0.8, seed=1)
    buys, similar = shop.graph[BUYS], shop.graph[SIMILAR]
    items = np.repeat(np.arange(200), np.diff(buys.indptr))  # CSR rows are destinations
    users = np.asarray(buys.indices)
    keys = users * 200 + items
    assert np.unique(keys).size == keys.size
    group = shop.labels
    # a user's group: the commonest group among its items; inside + (1 - inside) / G
    majority = np.array([np.bincount(group[items[users == u]], minlength=5).argmax()
                         for u in range(300)])
    share = np.mean(group[items] == majority[users])
    assert 0.8 + 0.2 / 5 - 0.05 < share < 0.95, share
    dst = np.repeat(np.arange(200), np.diff(similar.indptr))
    assert np.all(group[dst] == group[similar.indices])
    assert not np.any(dst == similar.indices)
    for kwargs, message in (
            (dict(groups=4, items=3), r"groups must be at most the items \(3\), got 4"),
            (dict(users=0), "users must be at least 1, got 0"),
            (dict(inside=1.5), r"inside must lie in \[0, 1\], got 1.5"),
            (dict(noise=-1.0), "noise must be at least 0, got -1.0")):
        with pytest.raises(ValueError, match=message):
            make_shop(**{"users": 10, "items": 6, "groups": 2, **kwargs})
    with pytest.raises(ValueError, match="scale must be positive and finite, got inf"):
        zg.load_hetero_dataset("shop-like", scale=float("inf"))
    # 1e-9 gave 2 users and 2 items, with nothing held out
    with pytest.raises(ValueError, match=r"^scale=1e-09 gives 2 user nodes; shop-like needs "
                                         r">= 100$"):
        zg.load_hetero_dataset("shop-like", scale=1e-9)
    with pytest.raises(ValueError, match="scale applies to mag-like, igbh-like, shop-like, got"):
        zg.load_hetero_dataset("ogbn-mag", scale=0.5)


def test_igbh_like_has_bfloat16_features_on_every_type():
    ds = zg.load_hetero_dataset("igbh-like", scale=0.0005)
    assert set(ds.graph.node_types) == {"paper", "author", "fos", "institute", "journal",
                                        "conference"}
    assert all(f.dtype == jnp.bfloat16 and f.shape[1] == 1024 for f in ds.features.values())
    assert ds.num_classes == 2983 and len(ds.graph.relations) == 11  # cites merged
    share = (ds.labels >= 0).mean()
    assert 0.5 < share < 0.67


def test_igbh_like_does_not_depend_on_the_thread_count(monkeypatch):
    monkeypatch.setattr(hetero_synthetic, "_CHUNK", 1 << 12)  # feature blocks of 4 rows
    monkeypatch.setattr(hetero_synthetic, "_DRAWS", 1 << 12)  # ~16 blocks of cites
    one, three = igbh_like(0.0005, threads=1), igbh_like(0.0005, threads=3)
    assert one.graph.relations == three.graph.relations
    for a, b in zip(one.graph.graphs, three.graph.graphs):
        np.testing.assert_array_equal(a.indptr, b.indptr)
        np.testing.assert_array_equal(a.indices, b.indices)
    for t in one.features:
        np.testing.assert_array_equal(one.features[t].view(np.uint16),
                                      three.features[t].view(np.uint16))
    np.testing.assert_array_equal(one.labels, three.labels)
    np.testing.assert_array_equal(one.train_idx, three.train_idx)


def test_igbh_like_features_carry_their_class_centroid():
    # Two halves of a class have correlated means (its centroid); two classes do not.
    ds = igbh_like(0.002)
    x = ds.features["paper"].astype(np.float32)
    assert abs(x.mean()) < 0.01 and abs(x.std() - np.hypot(1, 0.07)) < 0.01  # unit noise
    halves = []
    for c in range(3):  # the largest classes (Zipf prior): ~1,150, ~570, ~380 papers
        ids = np.flatnonzero(ds.labels == c)
        halves.append([x[ids[0::2]].mean(0), x[ids[1::2]].mean(0)])
    corr = lambda a, b: np.corrcoef(a, b)[0, 1]
    for c in range(3):
        assert corr(*halves[c]) > 0.3  # ~0.5 to ~0.7 expected; noise alone ~0 +- 0.03
        for d in range(c):
            assert abs(corr(halves[c][0], halves[d][1])) < 0.15


def test_cli_info_and_generate_list_types_and_relations(tmp_path, capsys):
    out = tmp_path / "mag.npz"
    assert run(["data", "generate", "mag-like", "--scale", "0.002", "--out", str(out)]) == 0
    capsys.readouterr()
    assert run(["data", "info", str(out)]) == 0
    stats = json.loads(capsys.readouterr().out)
    assert stats["node_types"]["paper"] == {"nodes": 1473, "features": 128,
                                            "feature_dtype": "float32"}
    assert set(stats["relations"]) >= {"author__writes__paper", "paper__rev_writes__author"}
    assert stats["target_type"] == "paper" and stats["classes"] == 349
    assert 0 < stats["labelled"] <= 1473
    assert run(["data", "info", "ogbn-mag"]) == 2
    assert "ogbn-mag needs root=" in capsys.readouterr().err
    with pytest.raises(ValueError, match="is a typed .* load_hetero_dataset"):
        zg.load_dataset(str(out))


def test_cli_generates_igbh_like_in_the_feature_dtype_asked(tmp_path, capsys):
    """igbh-like's features in --feature-dtype (its default bfloat16 without it), the
    same values as the generator gives in that dtype."""
    out = tmp_path / "igbh.npz"
    argv = ["data", "generate", "igbh-like", "--scale", "0.0005", "--out", str(out)]
    assert run([*argv, "--feature-dtype", "float32"]) == 0
    stats = json.loads(capsys.readouterr().out)
    assert {t["feature_dtype"] for t in stats["node_types"].values()} == {"float32"}
    saved = zg.load_hetero_dataset(str(out))
    want = igbh_like(0.0005, feature_dtype="float32")
    for t, x in want.features.items():
        np.testing.assert_array_equal(np.asarray(saved.features[t]), x)
    assert run(argv) == 0
    stats = json.loads(capsys.readouterr().out)
    assert {t["feature_dtype"] for t in stats["node_types"].values()} == {"bfloat16"}


def test_pool_draws_land_where_a_binary_search_puts_them():
    """The guide-table walk of the generators' pools equals np.searchsorted(side="right")
    on the cumulative propensities: random draws, draws exactly on each boundary, just
    below it, and 0."""
    rng = np.random.default_rng(3)
    community = rng.integers(0, 5, 300)
    pool = hetero_synthetic._Pool(community, 1.0 + rng.pareto(1.5, 300), 5)
    u = np.concatenate([rng.random(2000) * pool.cum[-1], pool.cum[:-1],
                        np.nextafter(pool.cum, 0), [0.0]])
    want = pool.order[np.minimum(np.searchsorted(pool.cum, u, side="right"), 299)]
    np.testing.assert_array_equal(pool._at(u), want)


def _targets(kind: str, shape=(5, 3)) -> np.ndarray:
    """Float targets of `kind` for the toy graph's 5 papers (test_hetero_graph's _dataset)."""
    rs = np.random.default_rng(0)
    values = rs.random(shape) > 0.5 if kind == "multilabel" else rs.normal(size=shape)
    return values.astype(np.float32)


def _float_dataset(kind: str, **kw) -> zg.HeteroDataset:
    return _dataset(labels=None, targets=_targets(kind), target_kind=kind, **kw)


@pytest.mark.parametrize("fmt", ["npz", "dir"])
@pytest.mark.parametrize("kind", ["multilabel", "regression", "classes"])
def test_saved_typed_datasets_keep_float_targets(tmp_path, kind, fmt):
    """Both formats keep the targets bit for bit (memory-mapped from a directory) and
    their kind; without targets the stored metadata has no "target_kind", as files
    written before float targets, and loads as "classes"."""
    ds = _dataset() if kind == "classes" else _float_dataset(kind)
    path = tmp_path / ("t.npz" if fmt == "npz" else "t")
    (zg.save_hetero_npz if fmt == "npz" else zg.save_hetero_dir)(ds, path)
    back = zg.load_hetero(path)
    _same(ds, back)
    assert back.target_kind == kind and back.output_dim == 3
    if kind == "classes":
        meta = (json.loads(str(np.load(path)["meta"])) if fmt == "npz"
                else json.loads((path / "meta.json").read_text()))
        assert back.targets is None and "target_kind" not in meta
        return
    assert back.targets.dtype == np.float32 and back.targets.shape == (5, 3)
    np.testing.assert_array_equal(back.targets.view(np.uint32), ds.targets.view(np.uint32))
    assert isinstance(back.targets, np.memmap) == (fmt == "dir")


def test_a_graph_without_labels_serves_link_prediction_alone():
    """As recommendation data comes (a PyG HeteroData with no y): no labels and no split
    ids give unlabelled target nodes and empty splits, which a link run trains on and a
    node run refuses by name; split ids without labels name the labels missing. (Labels
    and a made-up train split were needed; the messages said labels are required.)"""
    ds = _dataset(node_info={})
    data = _FakeHeteroData(ds)
    for key in ("y", "train_mask", "val_mask", "test_mask"):
        del data["paper"][key]
    back = zg.from_hetero_data(data, name="toy")
    assert back.target_type == "author" and back.num_classes == 1  # the first type
    assert (back.labels == -1).all() and back.labels.shape == (4,)
    assert back.train_idx.size == back.val_idx.size == back.test_idx.size == 0
    assert back.stats()["labelled"] == 0 and ds.stats()["labelled"] == 5  # data info's
    with pytest.raises(ValueError, match=r"^train_idx, test_idx split nodes that no labels "
                                         r"are given for: give labels \(or float targets "
                                         r"and target_kind\); a graph for link prediction "
                                         r"alone takes neither labels nor split ids$"):
        zg.make_hetero_dataset("toy", {"author": 4, "paper": 5},
                               {("author", "writes", "paper"): ([0, 1], [1, 2])},
                               target_type="paper", train_idx=[0], test_idx=[1])
    base = dict(hidden=8, layers=1, fanouts=(3,), batch_size=4, epochs=1, eval_mode="none",
                progress=False)
    with pytest.raises(ValueError, match=r"^dataset 'toy' labels none of its 'author' "
                                         r"nodes: a node task has nothing to train on"):
        zg.train(zg.TrainConfig(**base), back)
    with pytest.warns(zg.EmptySplitWarning, match="leaves val and test empty"):  # 5 pairs
        run = zg.train(zg.TrainConfig(task="link", link_relation="writes", **base), back)
    assert np.isfinite(run.history[-1]["loss"])


def test_from_hetero_data_reads_float_y_as_targets():
    """A float y [N, T] gives T target columns, a 1-D one a single column; labels are
    then all -1 and num_classes T."""
    ds = _float_dataset("multilabel", node_info={})
    data = _FakeHeteroData(ds)
    data["paper"]["y"] = ds.targets.astype(np.float64)
    back = zg.from_hetero_data(data, name="toy", target_kind="multilabel")
    _same(ds, back)
    assert back.target_kind == "multilabel" and back.num_classes == 3
    np.testing.assert_array_equal(back.targets, ds.targets)
    data["paper"]["y"] = np.array([0.5, -1.0, 2.0, 0.0, 3.5])
    back = zg.from_hetero_data(data, name="toy", target_kind="regression")
    assert back.target_kind == "regression" and back.output_dim == 1
    np.testing.assert_array_equal(back.targets, [[0.5], [-1.0], [2.0], [0.0], [3.5]])


def test_from_hetero_data_counts_a_type_without_num_nodes_by_its_x():
    """A duck-typed store without num_nodes was a bare AttributeError."""
    ds = _dataset(node_info={})
    data = _FakeHeteroData(ds)
    del data["paper"]["num_nodes"]
    _same(ds, zg.from_hetero_data(data, name="toy"))
    bare = next(t for t in data.node_types if "x" not in data[t])
    del data[bare]["num_nodes"]
    with pytest.raises(ValueError, match=rf"^node type '{bare}' has no num_nodes and no x to "
                                         rf"count: set data\['{bare}'\]\.num_nodes$"):
        zg.from_hetero_data(data, name="toy")


def test_from_hetero_data_float_y_needs_a_target_kind():
    data = _FakeHeteroData(_dataset(node_info={}))
    data["paper"]["y"] = np.ones((5, 2), np.float32)
    with pytest.raises(ValueError, match=r"node type 'paper' has float32 labels \(y\): give "
                                         r'target_kind="multilabel" or "regression" for float '
                                         r"targets \(class ids"):
        zg.from_hetero_data(data)
    with pytest.raises(ValueError, match=r"for float targets, not 'classes'"):
        zg.from_hetero_data(data, target_kind="classes")


def test_float_targets_of_the_kind_classes_are_refused_as_such():
    """It was reported as a labels-range error (the all -1 labels made for targets)."""
    with pytest.raises(ValueError, match=r"^target_kind 'classes' takes no targets \(the labels "
                                         r"are the targets\): give \"multilabel\""):
        _dataset(labels=None, targets=_targets("regression"), target_kind="classes")
    with pytest.raises(ValueError, match=r"^target_kind must be one of classes, multilabel"):
        _dataset(labels=None, targets=_targets("regression"), target_kind="binary")


def test_from_hetero_data_integer_y_refuses_a_float_target_kind():
    data = _FakeHeteroData(_dataset(node_info={}))
    with pytest.raises(ValueError, match=r"target_kind='regression' needs float labels \(y\), "
                                         r"but node type 'paper' has int32 y \(class ids\)"):
        zg.from_hetero_data(data, target_kind="regression")
    assert zg.from_hetero_data(data, target_kind="classes").targets is None


def test_from_hetero_data_takes_class_ids_of_one_column_only():
    """[N, 1] class ids (ogbn-mag's layout) are read as [N]; more integer columns are
    refused (the first column alone was read, the others dropped without a word)."""
    ds = _dataset(node_info={})
    data = _FakeHeteroData(ds)
    data["paper"]["y"] = ds.labels[:, None].astype(np.int64)
    np.testing.assert_array_equal(zg.from_hetero_data(data).labels, ds.labels)
    data["paper"]["y"] = np.stack([ds.labels, ds.labels], 1).astype(np.int64)
    with pytest.raises(ValueError, match=r"^node type 'paper' has int64 labels \(y\) of shape "
                                         r"\(5, 2\): class ids take one column; for "
                                         r"multi-label targets make y float"):
        zg.from_hetero_data(data)


@pytest.mark.parametrize("mask, got", [
    (np.array([0, 3]), r"int64 of shape \(2,\)"),  # node ids, not a mask
    (np.ones(2, bool), r"bool of shape \(2,\)"),
    (np.ones((5, 1), bool), r"bool of shape \(5, 1\)"),
])
def test_from_hetero_data_needs_boolean_masks_of_the_nodes(mask, got):
    data = _FakeHeteroData(_dataset(node_info={}))
    data["paper"]["train_mask"] = mask
    with pytest.raises(ValueError, match=r"train_mask of node type 'paper' must be a boolean "
                                         r"mask of shape \(5,\), one entry per node; got "
                                         + got):
        zg.from_hetero_data(data)


class _PyGStore(dict):
    """A PyG node or edge store for `to_hetero_data`: attributes set and read as items."""

    __getattr__ = dict.__getitem__
    __setattr__ = dict.__setitem__


class _PyGHeteroData(dict):
    """torch_geometric's HeteroData as far as `to_hetero_data` and `from_hetero_data` use
    it: a store per node type (str) or edge type (tuple), made on first use."""

    def __missing__(self, key):
        store = self[key] = _PyGStore()
        return store

    node_types = property(lambda self: [k for k in self if isinstance(k, str)])
    edge_types = property(lambda self: [k for k in self if isinstance(k, tuple)])


def test_to_hetero_data_gives_float_targets_as_y(monkeypatch):
    """Without torch: torch.from_numpy as the identity, HeteroData as dicts."""
    monkeypatch.setitem(sys.modules, "torch", types.SimpleNamespace(from_numpy=lambda a: a))
    monkeypatch.setitem(sys.modules, "torch_geometric", types.ModuleType("torch_geometric"))
    monkeypatch.setitem(sys.modules, "torch_geometric.data",
                        types.SimpleNamespace(HeteroData=_PyGHeteroData))
    ds = _float_dataset("regression", node_info={},
                        features={"paper": np.ones((5, 2), np.float32)})
    data = zg.to_hetero_data(ds)
    y = data["paper"].y
    assert y.dtype == np.float32 and y.shape == (5, 3) and y is not ds.targets
    back = zg.from_hetero_data(data, name="toy", target_kind="regression")
    _same(ds, back)
    np.testing.assert_array_equal(back.targets, ds.targets)
    labels = zg.to_hetero_data(_dataset(node_info={}))["paper"].y
    assert labels.dtype == np.int64 and labels.shape == (5,)


def test_relation_stats_give_the_edge_feature_width_where_a_table_exists():
    edges = {("a", "r", "b"): (np.array([0, 1]), np.array([1, 0])),
             ("b", "s", "a"): (np.array([0]), np.array([1]))}
    graph = zg.hetero_graph({"a": 2, "b": 2}, edges,
                            edge_features={("a", "r", "b"): np.ones((2, 3), np.float32)})
    stats = graph.stats()["relations"]
    assert stats["a__r__b"] == {"edges": 2, "max_degree": 1, "edge_features": 3}
    assert "edge_features" not in stats["b__s__a"]


@pytest.mark.parametrize("indices, message", [
    (np.array([0.6, 1.7, 2.9]), "indices must have an integer dtype, got float64"),
    (np.array([0, 1, 2**32 + 2]), "indices has node id 4294967298 at position 2, out of "
                                  "range for num_nodes=2147483648"),
])
def test_stored_typed_ids_are_checked_before_they_are_narrowed(tmp_path, indices, message):
    ds = zg.make_hetero_dataset("h", {"a": 3, "b": 2}, {("a", "ab", "b"): ([0, 1, 2],
                                                                          [0, 1, 1])},
                                target_type="b", labels=[0, 1], train_idx=[0], val_idx=[1],
                                test_idx=[])
    arrays = dict(np.load(zg.save_hetero_npz(ds, tmp_path / "h.npz")), r0_indices=indices)
    np.savez(tmp_path / "bad.npz", **arrays)
    with pytest.raises(ValueError, match=rf"bad.npz holds an invalid typed dataset: {message}"):
        zg.load_hetero(tmp_path / "bad.npz")


def test_a_stored_typed_dataset_without_an_array_names_what_it_lacks(tmp_path):
    ds = zg.make_hetero_dataset("h", {"a": 3, "b": 2}, {("a", "ab", "b"): ([0, 1, 2],
                                                                          [0, 1, 1])},
                                target_type="b", labels=[0, 1], train_idx=[0], val_idx=[1],
                                test_idx=[])
    arrays = dict(np.load(zg.save_hetero_npz(ds, tmp_path / "h.npz")))
    del arrays["r0_indices"]
    np.savez(tmp_path / "bad.npz", **arrays)
    with pytest.raises(ValueError, match="bad.npz is not a readable typed dataset file: it "
                                         "lacks r0_indices, which its meta lists$"):
        zg.load_hetero(tmp_path / "bad.npz")
    meta = json.loads(str(arrays["meta"]))
    del meta["stored"]  # a file written before its meta listed its arrays
    np.savez(tmp_path / "old.npz", **{**arrays, "meta": np.str_(json.dumps(meta))})
    with pytest.raises(ValueError, match="old.npz holds an invalid typed dataset: it lacks "
                                         "'r0_indices'$"):  # the bare key, before
        zg.load_hetero(tmp_path / "old.npz")


def test_a_typed_directory_names_its_own_arrays_when_meta_lists_another(tmp_path):
    """meta.json of a typed directory naming an array it cannot hold lists the typed
    names (it listed the homogeneous dataset's)."""
    ds = zg.make_hetero_dataset("h", {"a": 3, "b": 2}, {("a", "ab", "b"): ([0, 1, 2],
                                                                          [0, 1, 1])},
                                target_type="b", labels=[0, 1], train_idx=[0], val_idx=[1],
                                test_idx=[])
    folder = zg.save_hetero_dir(ds, tmp_path / "h")
    meta = json.loads((folder / "meta.json").read_text())
    meta["arrays"]["indptr"] = meta["arrays"]["r0_indptr"]
    (folder / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(ValueError, match=r"must map array names \(r<k>_indptr, r<k>_indices, "
                                         r".*test_idx, targets\) .*bad entries: indptr$"):
        zg.load_hetero(folder)


@pytest.mark.parametrize("change, message", [
    # each was a traceback (AttributeError, "'venue' is not in list") or read quietly
    (dict(node_info=["x"]), r"its node_info must map node types to column names, got \['x'\]"),
    (dict(node_info={"venue": ["y"]}), r"its node_info names 'venue', which is not a node "
                                       r"type \(a, b\)"),
    (dict(node_types=[["a", 4.7], ["b", 2]]), r"its node count of 'a' must be an integer, "
                                              r"got 4\.7"),
    (dict(num_classes="3"), r"its num_classes must be an integer, got '3'"),
    # Python's own words before ("'int' object is not iterable")
    (dict(relations=5), r"its relations must be a list of \[source type, name, destination "
                        r"type\] triples, got 5$"),
    (dict(node_types=[["a", 3, 1]]), r"its node_types must be a list of \[node type, count\] "
                                     r"pairs, got \[\['a', 3, 1\]\]$"),
    (dict(relations=[["a", "ab", "b"], ["a", "ab", "b"]]), r"relation a__ab__b is given twice"),
    # read without the relation before
    (dict(relations=[]), r"it holds arrays its record names no relation, node type or column "
                         r"for: r0_indices, r0_indptr$"),
])
def test_a_stored_typed_dataset_with_a_bad_record_is_named(tmp_path, change, message):
    ds = zg.make_hetero_dataset("h", {"a": 3, "b": 2}, {("a", "ab", "b"): ([0, 1, 2],
                                                                          [0, 1, 1])},
                                target_type="b", labels=[0, 1], train_idx=[0], val_idx=[1],
                                test_idx=[])
    arrays = dict(np.load(zg.save_hetero_npz(ds, tmp_path / "h.npz")))
    meta = {**json.loads(str(arrays["meta"])), **change}
    if change.get("relations") == [["a", "ab", "b"]] * 2:  # the second's arrays: the first's
        arrays.update({k.replace("r0_", "r1_"): v for k, v in arrays.items()
                       if k.startswith("r0_")})
    np.savez(tmp_path / "bad.npz", **{**arrays, "meta": np.array(json.dumps(meta))})
    with pytest.raises(ValueError, match=rf"bad.npz holds an invalid typed dataset: {message}"):
        zg.load_hetero(tmp_path / "bad.npz")


def test_node_info_of_python_objects_is_refused():
    """An object column (strings with a None, as a pandas column often is) would save
    into a file that only pickle reads."""
    with pytest.raises(ValueError, match=r"node_info 'a'/'title' holds Python objects \(dtype "
                                         r"object\): give numbers or strings"):
        zg.make_hetero_dataset("h", {"a": 2}, {("a", "r", "a"): ([0], [1])}, target_type="a",
                               labels=[0, 1], train_idx=[0], val_idx=[1], test_idx=[],
                               node_info={"a": {"title": np.array(["x", None], object)}})


def test_relations_of_one_name_and_bad_dataset_fields_are_refused():
    edges = {("a", "b__c", "d"): ([0, 1], [0, 2]), ("a__b", "c", "d"): ([0, 1], [1, 3])}
    with pytest.raises(ValueError, match=r"relations \('a', 'b__c', 'd'\) and \('a__b', 'c', "
                                         r"'d'\) have one name, a__b__c__d"):
        zg.hetero_graph({"a": 4, "a__b": 4, "d": 6}, edges)
    # the CSR constructor too (its relations shared one set of a model's weights)
    csr = {("a", "b__c", "d"): ([0, 0, 0, 0, 0, 0, 1], [2]),
           ("a__b", "c", "d"): ([0, 1, 1, 1, 1, 1, 1], [3])}
    with pytest.raises(ValueError, match=r"have one name, a__b__c__d"):
        zg.hetero_from_csr({"a": 4, "a__b": 4, "d": 6}, csr)
    # a source id out of its type's range is named with the type, as in edge lists
    with pytest.raises(ValueError, match=r"^relation a__w__p: indices has a id 3 at position "
                                         r"2, out of range for 3 a nodes$"):
        zg.hetero_from_csr({"a": 3, "p": 2}, {("a", "w", "p"): ([0, 1, 3], [0, 1, 3])})
    make = functools.partial(zg.make_hetero_dataset, num_nodes={"a": 2},
                             edges={("a", "r", "a"): ([0], [1])}, target_type="a",
                             labels=[0, 1], train_idx=[0], val_idx=[1], test_idx=[])
    for name in ("", 3):
        with pytest.raises(ValueError, match="name must be a non-empty string"):
            make(name)
    with pytest.raises(ValueError, match="node_info must map node types to"):
        make("h", node_info={"year": np.array([1, 2])})
    with pytest.raises(ValueError, match=r"^labels hold no class \(every 'a' label is -1, "
                                         r"unlabelled\), so num_classes cannot be read off "
                                         r"them: give num_classes"):
        make("h", labels=[-1, -1], train_idx=[], val_idx=[])
    # without num_classes the bound named was int32's: [-1, 2147483648)
    with pytest.raises(ValueError, match=r"^labels must be class ids, or -1 for an "
                                         r"unlabelled node; found -2$"):
        make("h", labels=[0, -2])
    with pytest.raises(ValueError, match=r"^num_classes must be a positive integer, got 1\.5$"):
        dataclasses.replace(make("h"), num_classes=1.5)
    # a wrong count of labels was named as a split id out of range
    with pytest.raises(ValueError, match=r"^labels must be integers of shape \(2,\) \(one per "
                                         r"a node\), got int64\(3,\)$"):
        make("h", labels=[0, 1, 0], test_idx=[2])
    with pytest.raises(ValueError, match=r"^targets must be a NumPy array of shape \(2, T\), "
                                         r"T >= 1, got \(3, 1\)$"):
        make("h", labels=None, targets=np.zeros(3), target_kind="regression", test_idx=[2])
    with pytest.raises(ValueError, match=r"^train_idx must be a 1-D integer array, got "
                                         r"bool\[2\]; a boolean mask\? pass "
                                         r"np\.flatnonzero\(mask\)$"):
        make("h", train_idx=np.array([True, False]))


def test_typed_ids_past_int64_are_named_as_given():
    src = np.array([0, 2**63 + 1], np.uint64)  # as int64: -9223372036854775807
    with pytest.raises(ValueError, match=r"relation a__r__b: src has a id 9223372036854775809 "
                                         r"at position 1, out of range for 2 a nodes"):
        zg.hetero_graph({"a": 2, "b": 2}, {("a", "r", "b"): (src, np.array([0, 1]))})


def test_finite_typed_features_past_float32_are_named_as_an_overflow():
    make = functools.partial(zg.make_hetero_dataset, "h", {"a": 2},
                             {("a", "r", "a"): ([0], [1])}, target_type="a", labels=[0, 1],
                             train_idx=[0], val_idx=[1], test_idx=[])
    with pytest.raises(ValueError, match=r"^features of 'a' overflow float32: 1e\+300 at row 1, "
                                         r"column 0 is past its largest magnitude "
                                         r"\(3\.40282e\+38\)$"):
        make(features={"a": np.array([[1.0], [1e300]])})
    with pytest.raises(ValueError, match=r"^relation a__r__a: edge_features overflow float32: "
                                         r"-1e\+39 at row 0, column 1 "):
        make(edge_features={("a", "r", "a"): np.array([[1.0, -1e39]])})
    with pytest.raises(ValueError, match=r"^features of 'a' contain NaN or inf \(1 entries; "
                                         r"first at row 1, column 0\)$"):
        make(features={"a": np.array([[1.0], [np.inf]])})
