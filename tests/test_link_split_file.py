"""`TrainConfig.link_split`: a link run trains and evaluates on a split file of the
user's (`LinkSplit.save`, `TypedLinkSplit.save`) instead of the random split by seed;
its checkpoints hold the split by its pairs' digest, and restore reads the file the run
named."""

from __future__ import annotations

import dataclasses
import re
import warnings

import numpy as np
import pytest
from conftest import assert_same_runs, random_graph

import zerognn_jax as zg
from zerognn_jax._src.data.checks import LibraryWarning
from zerognn_jax._src.data.hetero_links import relation_pairs, reverse_of
from zerognn_jax._src.data.shop import make_shop
from zerognn_jax._src.training.tasks.link import warn_split_file

LINK = dict(task="link", model="sage", layers=2, fanouts=(5, 5), hidden=16, batch_size=64,
            progress=False, chunk_steps=1)  # one step a program: the quickest compile


@pytest.fixture(scope="module")
def small():
    g = random_graph(200, 900, seed=2)
    rs = np.random.default_rng(0)
    return zg.make_dataset("small", g.indptr, g.indices, rs.normal(size=(200, 8)),
                           rs.integers(0, 3, 200), np.arange(100), np.arange(100, 150),
                           np.arange(150, 200), 3)


def _losses(result) -> list[float]:
    return [r["loss"] for r in result.history]


def test_a_saved_split_trains_as_the_split_it_keeps(small, tmp_path):
    """The random split of seed 0, saved and named by `link_split`, trains bit for bit as
    the run that drew it; another seed's split, saved, gives another run, whose test
    pairs are the file's."""
    cfg = zg.TrainConfig(**LINK, epochs=2, eval_every=2)
    drawn = zg.train(cfg, small)
    drew = zg.random_link_split(small.graph, seed=0)
    # built by hand from lists, as a split of one's own is: MRR's destinations left out
    evals = [zg.EvalEdges(e.pos.tolist(), e.neg.tolist()) for e in (drew.val, drew.test)]
    zg.LinkSplit(drew.train, drew.graph, *evals, small.num_nodes).save(tmp_path / "s0")
    read = zg.train(dataclasses.replace(cfg, link_split=str(tmp_path / "s0")), small)
    assert_same_runs(np.array([*_losses(read), read.summary["test_auc"]]),
                     np.array([*_losses(drawn), drawn.summary["test_auc"]]))
    other = zg.random_link_split(small.graph, seed=7)
    other.save(tmp_path / "s7.npz")
    run = zg.train(dataclasses.replace(cfg, link_split=str(tmp_path / "s7.npz")), small)
    np.testing.assert_array_equal(run.program.task.split.test.pos, other.test.pos)
    assert _losses(run) != _losses(drawn)


def test_a_checkpoint_holds_the_split_by_its_pairs(small, tmp_path):
    """A run resumes from its pairs saved elsewhere (in another integer dtype too); other
    pairs saved at the
    same path, or no file (the seed's split), are refused naming the digest; restore
    reads the file the run named, and a moved file is named with the way to give it."""
    split = tmp_path / "mine.npz"
    zg.random_link_split(small.graph, seed=3).save(split)
    ckpt = tmp_path / "ck"
    cfg = zg.TrainConfig(**LINK, epochs=1, eval_mode="none", link_split=str(split),
                         checkpoint_dir=str(ckpt))
    zg.train(cfg, small)
    moved = tmp_path / "elsewhere" / "same.npz"  # the same pairs, saved as int64
    moved.parent.mkdir()
    kept = zg.LinkSplit.load(split)
    wide = [zg.EvalEdges(*(a.astype(np.int64) for a in (e.pos, e.neg, e.neg_dst)))
            for e in (kept.val, kept.test)]
    zg.LinkSplit(kept.train.astype(np.int64), kept.graph, *wide, kept.num_nodes).save(moved)
    resumed = zg.train(dataclasses.replace(cfg, epochs=2, link_split=str(moved)), small)
    assert resumed.summary["start_epoch"] == 1
    restored = zg.restore(str(ckpt), dataset=small, for_inference=True)  # moved's
    assert restored.summary["config"]["link_split"] == str(moved)  # (absolute)
    np.testing.assert_array_equal(restored.program.task.split.train,
                                  zg.LinkSplit.load(split).train)
    digest = re.escape("link_split (the digest of its file's pairs) 'sha256:")
    zg.random_link_split(small.graph, seed=4).save(moved)
    for other in (str(moved), None):
        with pytest.raises(zg.CheckpointMismatch, match=digest):
            zg.train(dataclasses.replace(cfg, epochs=3, link_split=other), small)
    with pytest.raises(zg.CheckpointMismatch, match=digest):
        zg.restore(str(ckpt), dataset=small, for_inference=True)
    moved.unlink()
    with pytest.raises(FileNotFoundError, match=rf"link_split '{re.escape(str(moved))}': no "
                                                rf"split file there; .* give restore the "
                                                rf"run's cfg with link_split naming"):
        zg.restore(str(ckpt), dataset=small, for_inference=True)
    again = zg.restore(str(ckpt), dataclasses.replace(cfg, link_split=str(split)), small,
                       for_inference=True)
    assert again.summary["epoch"] == 1


def test_a_split_file_that_cannot_serve_is_refused_before_training(small, tmp_path):
    with pytest.raises(ValueError, match=r"link_split \(--link-split\) 'x.npz' is a split of "
                                         r"pairs for the link task; this run trains task "
                                         r"'node'"):
        zg.train(zg.TrainConfig(epochs=1, progress=False, link_split="x.npz"), small)
    missing = str(tmp_path / "none")
    with pytest.raises(FileNotFoundError, match=rf"link_split '{re.escape(missing)}': no "
                                                rf"split file there nor at "
                                                rf"'{re.escape(missing)}.npz'"):
        zg.train(zg.TrainConfig(**LINK, epochs=1, link_split=missing), small)
    ring = zg.from_edge_list(np.arange(50), (np.arange(50) + 1) % 50, 50,
                             make_undirected=True)
    zg.random_link_split(ring, seed=0).save(tmp_path / "ring")
    with pytest.raises(ValueError, match=r"splits the pairs of 50 nodes; dataset 'small' "
                                         r"has 200"):
        zg.train(zg.TrainConfig(**LINK, epochs=1, link_split=str(tmp_path / "ring")), small)
    zg.random_link_split(small.graph, seed=0).save(tmp_path / "auc")
    with pytest.raises(ValueError, match=r"the split file .*auc's val split has no "
                                         r"negatives per positive"):
        zg.train(zg.TrainConfig(**LINK, epochs=1, link_metric="mrr",
                                link_split=str(tmp_path / "auc")), small)
    with pytest.raises(ValueError, match=r"link_split must be a path \(left unset: none\), "
                                         r"got ' '"):
        zg.TrainConfig(**LINK, link_split=" ")
    with pytest.raises(FileNotFoundError, match=r"\(a folder\): no split file there"):
        zg.train(zg.TrainConfig(**LINK, epochs=1, link_split=str(tmp_path)), small)
    with pytest.raises(ValueError, match="ogbl-collab is read with OGB's own split"):
        zg.train(zg.TrainConfig(**LINK, epochs=1, dataset="ogbl-collab", root=str(tmp_path),
                                link_split=str(tmp_path / "auc")))


def test_a_typed_split_file_trains_as_the_split_it_keeps(tmp_path):
    """A typed graph's split of seed 0, saved, trains bit for bit as the run that drew
    it; a link_relation other than the file's relation is refused naming both."""
    shop = make_shop(120, 90, 3, per_user=6, dim=8, name="shop")
    cfg = zg.TrainConfig(task="link", model="rsage", hidden=16, layers=2, fanouts=(4, 4),
                         batch_size=64, epochs=1, progress=False, multiple=8,
                         link_relation="buys")
    drawn = zg.train(cfg, shop)
    zg.typed_link_split(shop.graph, "buys", seed=0).save(tmp_path / "buys")
    read = zg.train(dataclasses.replace(cfg, link_split=str(tmp_path / "buys"),
                                        link_relation=None), shop)
    assert _losses(read) == _losses(drawn)
    assert read.summary["test_auc"] == drawn.summary["test_auc"]
    with pytest.raises(ValueError, match=r"holds pairs of user__buys__item; link_relation "
                                         r"'similar' names item__similar__item"):
        zg.train(dataclasses.replace(cfg, link_split=str(tmp_path / "buys"),
                                     link_relation="similar"), shop)


def test_a_typed_split_of_fewer_pairs_passes_messages_over_those_alone(tmp_path):
    """A split by time trains on the older half of the purchases: the newer ones leave
    the relation and its reverse, as held-out pairs do (they had stayed, in reach of
    every step); the other relations keep theirs."""
    shop = make_shop(120, 90, 3, per_user=6, dim=8, name="shop")
    drawn = zg.typed_link_split(shop.graph, "buys", seed=0)
    older = drawn.train[: len(drawn.train) // 2]
    zg.TypedLinkSplit(drawn.relation, older, drawn.graph, drawn.val,
                      drawn.test).save(tmp_path / "older")
    graph = zg.TypedLinkSplit.load(tmp_path / "older", shop.graph).graph
    buys = relation_pairs(graph[drawn.relation])
    assert sorted(map(tuple, buys.tolist())) == sorted(map(tuple, older.tolist()))
    reverse = reverse_of(shop.graph, drawn.relation)
    assert sorted(map(tuple, relation_pairs(graph[reverse])[:, ::-1].tolist())) == \
        sorted(map(tuple, older.tolist()))
    similar = ("item", "similar", "item")
    np.testing.assert_array_equal(graph[similar].indices, shop.graph[similar].indices)


def test_a_split_built_without_edge_tables_takes_the_datasets(tmp_path):
    """A split built over a graph of its training pairs alone keeps no edge features or
    weights; trained on a dataset that has them, its training edges take the dataset's
    (its edge model had found no table)."""
    rs = np.random.default_rng(1)
    g = random_graph(80, 300, seed=5)
    src, dst = np.repeat(np.arange(80), np.diff(g.indptr)), np.asarray(g.indices)
    g = zg.from_edge_list(src, dst, 80, edge_features=rs.normal(size=(len(src), 3)),
                          weights=rs.random(len(src)).astype(np.float32))
    ds = zg.make_dataset("ef", g.indptr, g.indices, rs.normal(size=(80, 4)),
                         np.zeros(80, np.int32), np.arange(40), [], [], 1, weights=g.weights,
                         edge_features=g.edge_features)
    drew = zg.random_link_split(g, seed=0)
    bare = zg.from_edge_list(drew.train[:, 0], drew.train[:, 1], 80, make_undirected=True)
    zg.LinkSplit(drew.train, bare, drew.val, drew.test, 80).save(tmp_path / "bare")
    result = zg.train(zg.TrainConfig(**{**LINK, "model": "gat"}, epochs=1, eval_mode="none",
                                     edge_features=True, heads=2,
                                     link_split=str(tmp_path / "bare")), ds)
    kept = result.program.task.split.graph
    for name in ("edge_features", "weights"):
        np.testing.assert_array_equal(np.asarray(getattr(kept, name)),
                                      np.asarray(getattr(drew.graph, name)))
    # a pair given the other way round takes its edge's rows; a pair that is no edge
    # cannot, and a run that reads them is told which
    turned = drew.train[:, ::-1]
    zg.LinkSplit(turned, bare, drew.val, drew.test, 80).save(tmp_path / "turned")
    cfg = zg.TrainConfig(**{**LINK, "model": "gat"}, epochs=1, eval_mode="none",
                         edge_features=True, heads=2, link_split=str(tmp_path / "turned"))
    assert zg.train(cfg, ds).program.task.split.graph.edge_features is not None
    edges = set(zip(src.tolist(), dst.tolist()))
    u, v = next((a, b) for a in range(80) for b in range(a + 1, 80)
                if (a, b) not in edges and (b, a) not in edges)
    more = np.concatenate([drew.train, [[u, v]]]).astype(np.int32)
    zg.LinkSplit(more, bare, drew.val, drew.test, 80).save(tmp_path / "more")
    with pytest.raises(ValueError, match=rf"its training pair \({u}, {v}\) is no edge of "
                                         rf"dataset 'ef', whose edge_features and weights"):
        zg.train(dataclasses.replace(cfg, link_split=str(tmp_path / "more")), ds)


def test_evaluation_pairs_are_taken_as_arrays_of_node_ids():
    edges = zg.EvalEdges([[0, 1], [2, 3]], [[1, 2]])
    assert edges.pos.shape == (2, 2) and edges.neg_dst.shape == (2, 0)
    with pytest.raises(ValueError, match="pos must hold integer node ids, got float64"):
        zg.EvalEdges([[0.5, 1.0]], [[1, 2]])
    with pytest.raises(ValueError, match=r"neg must be \[n, 2\], got \(3,\)"):
        zg.EvalEdges([[0, 1]], [1, 2, 3])
    with pytest.raises(ValueError, match="train must hold integer node ids, got float32"):
        zg.LinkSplit(np.array([[0.5, 1.5]], np.float32), None, edges, edges, 4)


def test_a_split_file_without_evaluation_pairs_is_warned_of(small, tmp_path):
    drew = zg.random_link_split(small.graph, seed=0)
    none = zg.EvalEdges(np.zeros((0, 2), np.int32), np.zeros((0, 2), np.int32))
    zg.LinkSplit(drew.train, drew.graph, none, none, small.num_nodes).save(tmp_path / "e")
    with pytest.warns(zg.EmptySplitWarning, match=r"holds no val and no test pairs: the "
                                                  r"run's metrics are null"):
        result = zg.train(zg.TrainConfig(**LINK, epochs=1, link_split=str(tmp_path / "e")),
                          small)
    assert result.summary["test_auc"] is None


def test_a_split_file_that_evaluates_training_pairs_is_warned_of(small, tmp_path):
    """Test positives that are training pairs, given either way round, are named; a
    typed split's pairs of two node types count in their own order alone."""
    drew = zg.random_link_split(small.graph, seed=0)
    test = zg.EvalEdges(np.concatenate([drew.test.pos, drew.train[:3, ::-1]]), drew.test.neg)
    zg.LinkSplit(drew.train, drew.graph, drew.val, test, small.num_nodes).save(tmp_path / "t")
    u, v = drew.train[0, ::-1]
    with pytest.warns(LibraryWarning, match=rf"3 of its {len(test.pos)} test positives "
                                               rf"are training pairs too \(the first: "
                                               rf"\({u}, {v}\)\)"):
        zg.train(zg.TrainConfig(**LINK, epochs=1, link_split=str(tmp_path / "t")), small)
    shop = make_shop(40, 30, 3, per_user=4, dim=4, name="shop")
    typed = zg.typed_link_split(shop.graph, "buys", seed=0)
    cfg = zg.TrainConfig(task="link", link_split="f.npz")
    pairs = set(map(tuple, typed.train.tolist()))
    flipped = np.array([(v, u) for u, v in pairs if (v, u) not in pairs][:2])
    backwards = dataclasses.replace(typed, test=zg.EvalEdges(flipped, typed.test.neg))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        warn_split_file(backwards, cfg)  # (item, user) pairs are none of (user, item)'s
    again = dataclasses.replace(typed, test=zg.EvalEdges(typed.train[:2], typed.test.neg))
    with pytest.warns(LibraryWarning, match=r"2 of its 2 test positives"):
        warn_split_file(again, cfg)


def test_pairs_in_pygs_layout_and_pickles_are_named(tmp_path):
    with pytest.raises(ValueError, match=r"pos must be \[n, 2\], got \(2, 5\) \(PyG's "
                                         r"\[2, E\] edge_index\? an evaluation split takes"):
        zg.EvalEdges(np.zeros((2, 5), np.int64), np.zeros((0, 2), np.int64))
    np.save(tmp_path / "objects.npy", np.array([{"a": 1}], dtype=object))
    with pytest.raises(ValueError, match=r"objects.npy is not a link split written by "
                                         r"LinkSplit.save: it holds pickled objects, which "
                                         r"no split file does$"):
        zg.LinkSplit.load(tmp_path / "objects.npy")
