"""`zg.predict(result, nodes, dataset=...)` on another graph of one node type: the run's
model over a graph it never saw, prepared as the run prepared its own."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import assert_same_rankings, assert_same_runs, random_graph

import zerognn_jax as zg
from zerognn_jax._src.data.shop import make_shop
from zerognn_jax._src.ops.host_rows import is_host_resident
from zerognn_jax._src.training.inductive import other_graph

BASE = dict(model="sage", layers=2, fanouts=(4, 4), hidden=16, batch_size=32, epochs=1,
            eval_mode="none", progress=False)


def _dataset(name, graph, features, classes=3):
    n = graph.num_nodes
    labels = np.arange(n) % classes
    return zg.make_dataset(name, graph.indptr, graph.indices, features, labels,
                           np.arange(n // 2), [], [], classes)


def assert_own_rows(result, nodes, dataset):
    """The run's rows of `nodes` over `dataset` are those of its own graph."""
    assert_same_runs(zg.predict(result, nodes, dataset=dataset), zg.predict(result, nodes))


def _two_parts():
    """A graph of two parts with no edge between them (nodes 0-119 and 120-199)."""
    a, b = random_graph(120, 500, seed=1), random_graph(80, 300, seed=2)
    src = np.r_[np.repeat(np.arange(120), np.diff(a.indptr)),
                120 + np.repeat(np.arange(80), np.diff(b.indptr))]
    dst = np.r_[np.asarray(a.indices), 120 + np.asarray(b.indices)]
    return zg.from_edge_list(src, dst, 200), a


def test_a_part_of_the_graph_gives_its_nodes_the_rows_the_whole_did():
    """The run's model over the first part alone (a graph it never saw as such) gives
    that part's nodes the rows the whole graph gave them, exactly and sampled (every
    neighbour taken); the run's own graph given as `dataset` gives its own rows."""
    whole, part = _two_parts()
    features = np.random.default_rng(0).normal(size=(200, 6)).astype(np.float32)
    ds = _dataset("whole", whole, features)
    result = zg.train(zg.TrainConfig(**BASE), ds)
    nodes = np.arange(120)
    own = np.asarray(zg.predict(result, nodes))
    alone = _dataset("part", part, features[:120])
    np.testing.assert_allclose(np.asarray(zg.predict(result, nodes, dataset=alone)), own,
                               rtol=1e-5, atol=1e-6)
    assert_same_runs(zg.predict(result, nodes, dataset=ds), own)
    every = zg.train(zg.TrainConfig(**{**BASE, "fanouts": (-1, -1)}), ds)
    sampled = np.asarray(zg.predict(every, nodes, mode="sampled"))
    np.testing.assert_allclose(np.asarray(zg.predict(every, nodes, mode="sampled",
                                                     dataset=alone)), sampled,
                               rtol=1e-5, atol=1e-6)
    # one program a sampler: the passes compiled for a graph serve its next request
    first, _ = other_graph(every, alone, "sampled")
    assert other_graph(every, alone, "sampled")[0] is first
    # (the run's own where -1 resolves as it did: the part's largest degree is the whole's)
    assert (first is every.program) == (first.sampler == every.program.sampler)
    spokes = np.arange(1, 60)
    hub = zg.from_edge_list(np.r_[0, spokes], np.r_[0, 0 * spokes], 200,
                            make_undirected=True)  # node 0 of degree 60, beside a loop
    wide = _dataset("hub", hub, features)
    grown, _ = other_graph(every, wide, "sampled")
    assert grown is not every.program and other_graph(every, wide, "sampled")[0] is grown
    # a run whose table is in host memory reads the other graph's from there too
    host = zg.train(zg.TrainConfig(**BASE, feature_placement="host"), ds)
    assert is_host_resident(other_graph(host, alone, "full")[1].features)
    np.testing.assert_allclose(np.asarray(zg.predict(host, nodes, dataset=alone)),
                               np.asarray(zg.predict(host, nodes)), rtol=1e-5, atol=1e-6)


def test_the_graph_is_prepared_as_the_runs_was():
    """A gcn run drops self-loops (it adds each node's own term itself) and, told to,
    divides feature rows by their sums: the same graph given with self-loops and raw
    rows gives the run's own rows."""
    g = random_graph(150, 600, seed=3)
    rows = np.random.default_rng(1).random((150, 5)).astype(np.float32)
    src = np.r_[np.repeat(np.arange(150), np.diff(g.indptr)), np.arange(150)]
    dst = np.r_[np.asarray(g.indices), np.arange(150)]
    looped = zg.from_edge_list(src, dst, 150)
    ds = _dataset("looped", looped, rows)
    result = zg.train(zg.TrainConfig(**{**BASE, "model": "gcn"}, normalize_features=True), ds)
    assert result.program.self_loops_dropped
    nodes = np.arange(150)
    assert_own_rows(result, nodes, ds)
    with pytest.raises(ValueError, match=r"each divided by its sum, which needs values >= "
                                         r"0, and the features of dataset 'negative' hold "
                                         r"-0\.99"):
        zg.predict(result, nodes, dataset=_dataset("negative", looped, rows - 1))


def test_a_link_runs_encoder_embeds_another_graphs_nodes():
    """A link run's embeddings, pair scores and rankings over its own message-passing
    graph, given as another dataset, are the run's own; pairs of another graph are of
    its nodes."""
    g = random_graph(160, 700, seed=4)
    ds = _dataset("links", g, np.random.default_rng(2).normal(size=(160, 4)))
    result = zg.train(zg.TrainConfig(**BASE, task="link"), ds)
    trained = result.program.task.split.graph
    again = _dataset("again", trained, np.asarray(ds.features))
    nodes = np.arange(160)
    assert_own_rows(result, nodes, again)
    pairs = result.program.task.split.test.pos
    assert_same_runs(zg.score_pairs(result, pairs, dataset=again),
                     zg.score_pairs(result, pairs))
    # "train" on another graph leaves out its edges: here the training pairs again
    (got, got_scores), (own, own_scores) = (zg.recommend(result, nodes[:30], 12, dataset=again),
                                            zg.recommend(result, nodes[:30], 12))
    assert_same_rankings(got, got_scores, own, own_scores)
    with pytest.raises(ValueError, match=r"exclude names the run's splits, which another "
                                         r"graph has not: give 'train' \(its edges\)"):
        zg.recommend(result, [0], dataset=again, exclude=("train", "val"))
    with pytest.raises(ValueError, match=r"pairs' source ids must lie in \[0, 50\)"):
        zg.score_pairs(result, [[60, 0]], dataset=_dataset(
            "small", random_graph(50, 100, seed=6), np.zeros((50, 4))))


def test_what_cannot_be_applied_to_another_graph_is_refused():
    g = random_graph(100, 400, seed=5)
    features = np.random.default_rng(3).normal(size=(100, 4))
    ds = _dataset("d", g, features)
    result = zg.train(zg.TrainConfig(**BASE), ds)
    with pytest.raises(ValueError, match=r"the model trained on 4 feature columns; dataset "
                                         r"'wide' has 5"):
        zg.predict(result, [0], dataset=_dataset("wide", g, np.zeros((100, 5))))
    with pytest.raises(ValueError, match="dataset must be a Dataset of the graph to predict"):
        zg.predict(result, [0], dataset=g)
    with pytest.raises(ValueError, match=r"nodes must lie in \[0, 50\)"):
        zg.predict(result, [60], dataset=_dataset("small", random_graph(50, 100, seed=6),
                                                  np.zeros((50, 4))))
    embedded = zg.train(zg.TrainConfig(**BASE, embedding_dim=4), ds)
    with pytest.raises(ValueError, match=r"learned a row per node of its own graph "
                                         r"\(embedding_dim 4\)"):
        zg.predict(embedded, [0], dataset=ds)
    shop = make_shop(40, 30, 2, per_user=4, dim=4, name="shop")
    typed = zg.train(zg.TrainConfig(task="link", model="rsage", hidden=8, layers=1,
                                    fanouts=(3,), batch_size=32, epochs=1, eval_mode="none",
                                    progress=False, multiple=8, link_relation="buys"), shop)
    # a typed run's other graph is typed (tests/test_typed_inductive.py)
    typed_graph = r"dataset must be a HeteroDataset of the typed graph to predict"
    with pytest.raises(ValueError, match=typed_graph):
        zg.predict(typed, [0], node_type="user", dataset=ds)
    with pytest.raises(ValueError, match=typed_graph):
        zg.score_pairs(typed, [[0, 0]], dataset=ds)
    with pytest.raises(ValueError, match=typed_graph):
        zg.recommend(typed, [0], dataset=ds)


def test_a_weighted_samplers_run_predicts_a_graph_without_weights_exactly():
    """Exact rows read no edge weights; sampled ones draw by them, and are refused for a
    graph that has none."""
    g = random_graph(100, 400, seed=7)
    rs = np.random.default_rng(4)
    weighted = g._replace(weights=rs.random(g.indices.shape[0]).astype(np.float32))
    features = rs.normal(size=(100, 4))
    ds = zg.make_dataset("w", weighted.indptr, weighted.indices, features,
                         np.arange(100) % 3, np.arange(50), [], [], 3,
                         weights=weighted.weights)
    result = zg.train(zg.TrainConfig(**BASE, sampler="weighted"), ds)
    bare = _dataset("bare", g, features)
    nodes = np.arange(100)
    assert_own_rows(result, nodes, bare)
    with pytest.raises(ValueError, match=r"samples neighbours by edge weight \(sampler "
                                         r"'weighted'\), and the graph of dataset 'bare' "
                                         r"has no weights"):
        zg.predict(result, nodes, mode="sampled", dataset=bare)
