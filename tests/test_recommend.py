"""`zg.recommend`: each source's k best destinations, against every pair scored by
`zg.score_pairs` and ranked on the host."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import random_graph

import zerognn_jax as zg
from zerognn_jax._src.data.shop import make_shop
from zerognn_jax._src.training import recommend as recommend_module


@pytest.fixture(scope="module")
def link_run():
    g = random_graph(120, 600, seed=4)
    rs = np.random.default_rng(0)
    ds = zg.make_dataset("small", g.indptr, g.indices, rs.normal(size=(120, 8)),
                         rs.integers(0, 3, 120), np.arange(60), np.arange(60, 90),
                         np.arange(90, 120), 3)
    return zg.train(zg.TrainConfig(task="link", decoder="mlp", model="sage", layers=2,
                                   fanouts=(-1, -1), hidden=16, batch_size=64, epochs=1,
                                   eval_mode="none", progress=False), ds)


def brute_force(result, sources, n_dst, left_out):
    """float32[S, n_dst]: every pair's `score_pairs` score, -inf where left out."""
    pairs = np.stack(np.meshgrid(sources, np.arange(n_dst), indexing="ij"), -1)
    scores = zg.score_pairs(result, pairs.reshape(-1, 2)).reshape(len(sources), n_dst)
    for row, s in enumerate(sources):
        scores[row, sorted(left_out.get(int(s), ()))] = -np.inf
    return scores


def assert_top_k(ids, scores, expected):
    """`ids`/`scores` are each row's k best of `expected` ([S, n] scores), by
    descending score, -1 where none is left."""
    k = ids.shape[1]
    best = -np.sort(-expected, axis=1)[:, :k]
    np.testing.assert_allclose(scores, best, rtol=1e-5, atol=1e-6)
    for row, (got, exp) in enumerate(zip(ids, expected)):
        real = got[got >= 0]
        np.testing.assert_allclose(exp[real], scores[row, :real.size], rtol=1e-5, atol=1e-6)
        assert (got[real.size:] == -1).all() and np.isneginf(scores[row, real.size:]).all()
        assert len(set(real.tolist())) == real.size


def unordered(pairs) -> dict:
    out = {}
    for u, v in np.asarray(pairs):
        out.setdefault(int(u), set()).add(int(v))
        out.setdefault(int(v), set()).add(int(u))
    return out


def test_a_link_runs_ranking_is_its_scores_ranked(link_run, monkeypatch):
    """The training pairs (both ways round) and the source itself are left out by
    default; with exclude=None only the source; any k up to every node; blocks of few
    destinations and sources give the one-block ranking."""
    sources = np.array([0, 5, 5, 77, 119])
    train = unordered(link_run.program.task.split.train)
    left = {s: train.get(s, set()) | {s} for s in range(120)}
    ids, scores = zg.recommend(link_run, sources, k=7)
    assert ids.dtype == np.int64 and scores.dtype == np.float32 and ids.shape == (5, 7)
    expected = brute_force(link_run, sources, 120, left)
    assert_top_k(ids, scores, expected)
    np.testing.assert_array_equal(ids[1], ids[2])
    none = zg.recommend(link_run, [], k=3)  # no sources asked: no rows
    assert none[0].shape == none[1].shape == (0, 3) and none[0].dtype == np.int64
    free = zg.recommend(link_run, sources, k=3, exclude=None)
    assert_top_k(*free, brute_force(link_run, sources, 120, {s: {s} for s in range(120)}))
    whole = zg.recommend(link_run, sources, k=120)
    assert_top_k(*whole, expected)  # each row ends in -1 where its pairs were left out
    monkeypatch.setattr(recommend_module, "MAX_DESTINATIONS", 16)
    monkeypatch.setattr(recommend_module, "MAX_SOURCES", 2)
    blocked = zg.recommend(link_run, sources, k=7)
    np.testing.assert_array_equal(blocked[0], ids)
    np.testing.assert_allclose(blocked[1], scores, rtol=1e-6)


def test_pairs_of_ones_own_are_left_out(link_run):
    split = link_run.program.task.split
    sources = np.unique(split.val.pos)[:20]
    named = zg.recommend(link_run, sources, k=10, exclude=("train", "val"))
    listed = zg.recommend(link_run, sources, k=10,
                          exclude=np.concatenate([split.train, split.val.pos]))
    np.testing.assert_array_equal(named[0], listed[0])
    # ranked among every node: the validation partners gone, kept by "train" alone
    partners = unordered(split.val.pos)
    without = zg.recommend(link_run, sources, k=120, exclude=("train", "val"))[0]
    within = zg.recommend(link_run, sources, k=120)[0]
    for s, out, kept in zip(sources, without, within):
        assert not partners[int(s)] & set(out.tolist())
        assert partners[int(s)] <= set(kept.tolist())
    ids, _ = zg.recommend(link_run, [3], k=5, exclude=None)
    drop = [[3, int(ids[0, 0])], [int(ids[0, 1]), 3]]  # one pair either way round
    again, _ = zg.recommend(link_run, [3], k=5, exclude=drop)
    assert ids[0, 0] not in again[0] and ids[0, 1] not in again[0]
    np.testing.assert_array_equal(again[0, :3], ids[0, 2:])


def test_candidates_are_the_only_destinations_ranked(link_run, monkeypatch):
    """Ranked among the candidates, in any order: the full ranking's scores of those
    columns, the source itself and its training partners left out as before; k up to
    the candidates' count, in blocks alike."""
    sources = np.array([0, 5, 77])
    candidates = np.array([100, 5, 3, 60, 0, 41, 17, 77, 99, 8])
    train = unordered(link_run.program.task.split.train)
    left = {s: train.get(s, set()) | {s} for s in range(120)}
    expected = np.full((3, 120), -np.inf, np.float32)
    expected[:, candidates] = brute_force(link_run, sources, 120, left)[:, candidates]
    ids, scores = zg.recommend(link_run, sources, k=10, candidates=candidates)
    assert_top_k(ids, scores, expected)
    assert set(ids[ids >= 0].tolist()) <= set(candidates.tolist())
    monkeypatch.setattr(recommend_module, "MAX_DESTINATIONS", 4)
    blocked = zg.recommend(link_run, sources, k=3, candidates=candidates)
    np.testing.assert_array_equal(blocked[0], ids[:, :3])


@pytest.mark.parametrize("call, message", [
    (dict(sources=[0], k=4, candidates=[1, 2, 3]), "k must be at most the 3 candidates, "
                                                   "got 4"),
    (dict(sources=[0], candidates=[1, 7, 1, 1]), "candidates must be distinct ids; 1 is "
                                                 "given 3 times"),
    (dict(sources=[0], candidates=[]), "candidates holds no destination id"),
    (dict(sources=[0], candidates=[5, 120]), r"candidates must lie in \[0, 120\)"),
    (dict(sources=[120]), r"sources must lie in \[0, 120\), found \[120, 120\]"),
    (dict(sources=[0], k=0), "k must be an integer >= 1, got 0"),
    (dict(sources=[0], k=121), "k must be at most the 120 destinations, got 121"),
    (dict(sources=[0], exclude=("train", "valid")), "splits are named 'train', 'val' and "
                                                    "'test', got 'valid'"),
    (dict(sources=[0], exclude=[[0, 1, 2]]), r"int\[Q, 2\] \(source, destination\) pairs, "
                                             r"got int64\[1, 3\]"),
    (dict(sources=[0], exclude=np.zeros((2, 10), np.int32)), r"int32\[2, 10\] \(PyG's "
                                                             r"\[2, E\] edge_index\? exclude "
                                                             r"takes \[E, 2\]"),
    (dict(sources=[0], exclude=[[0, 500]]), r"exclude's destination ids must lie in "
                                            r"\[0, 120\)"),
    (dict(sources=[0], mode="exact"), "mode must be 'full' or 'sampled', got 'exact'"),
])
def test_requests_it_cannot_serve_are_refused_naming_the_value(link_run, call, message):
    with pytest.raises(ValueError, match=message):
        zg.recommend(link_run, **call)


def test_a_typed_run_ranks_its_relations_destinations():
    """Users' best items on shop-like: only the (user, item) training pairs are left out
    (the two ends are of two types); k above what is left ends rows in -1."""
    shop = make_shop(60, 40, 2, per_user=6, dim=8, name="shop")
    result = zg.train(zg.TrainConfig(task="link", model="rsage", hidden=16, layers=2,
                                     fanouts=(4, 4), batch_size=64, epochs=1,
                                     eval_mode="none", progress=False, multiple=8,
                                     link_relation="buys"), shop)
    bought = {}
    for u, i in result.program.task.split.train:
        bought.setdefault(int(u), set()).add(int(i))
    users = np.array([0, 1, 59])
    expected = brute_force(result, users, 40, bought)
    assert_top_k(*zg.recommend(result, users, k=5), expected)
    ids, scores = zg.recommend(result, users, k=40)
    assert_top_k(ids, scores, expected)
    assert (ids[0] == -1).sum() == len(bought.get(0, ()))
    items = np.array([30, 2, 9, 0, 39])  # candidates among the items, by item ids
    among = np.full_like(expected, -np.inf)
    among[:, items] = expected[:, items]
    assert_top_k(*zg.recommend(result, users, k=5, candidates=items), among)
    with pytest.raises(ValueError, match=r"sources must lie in \[0, 60\) \('user' ids\)"):
        zg.recommend(result, [60])


def test_a_node_run_is_refused(tmp_path):
    result = zg.train(zg.TrainConfig(hidden=8, layers=1, fanouts=(3,), epochs=1,
                                     eval_mode="none", progress=False, batch_size=64))
    with pytest.raises(ValueError, match="recommend ranks the destinations of a link run "
                                         r"\(task 'link'\); this run's task is NodeTask"):
        zg.recommend(result, [0])
