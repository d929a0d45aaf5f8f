"""The loaders' options (issue #35 item 1): every sampler, tree layout, input order,
drop_last, features and targets fetched on the device, one hop order for views and
blocks, and the link loader (negatives on the device, seed edges hidden), each with
the envelope's overflow recovery."""

from __future__ import annotations

import jax
import numpy as np
import pytest
from conftest import random_graph

import zerognn_jax as zg


@pytest.fixture(scope="module")
def graph():
    g = random_graph(300, 1500, seed=7, isolated=3)
    weights = np.random.default_rng(0).uniform(0.1, 2.0, g.num_edges).astype(np.float32)
    return g._replace(weights=weights)


def _edges_are_real(graph, mb):
    indptr, indices = np.asarray(graph.indptr), np.asarray(graph.indices)
    for hop, block in enumerate(mb.blocks):
        src = np.asarray(mb.nodes[hop])
        nbr = np.asarray(mb.nodes[hop + 1])[np.asarray(block.nbr)]
        mask = np.asarray(block.mask)
        for row in np.flatnonzero(np.asarray(mb.valid[hop])):
            u = src[row]
            assert np.isin(nbr[row][mask[row]], indices[indptr[u]:indptr[u + 1]]).all()


@pytest.mark.parametrize("sampler", ["weighted", "labor"])
def test_every_sampler_grows_a_small_envelope_and_samples_the_same(graph, sampler):
    """Failed before: the loader sampled uniformly only."""
    nodes = np.arange(0, 300, 3)
    kw = dict(fanouts=(4, 3), batch_size=50, key=jax.random.key(1), sampler=sampler)
    small = zg.NeighborLoader(graph, nodes, envelope=zg.Envelope(50, (50, 50)), **kw)
    large = zg.NeighborLoader(graph, nodes, envelope="conservative", sample_ahead=1, **kw)
    for a, b in zip(small.epoch(0), large.epoch(0), strict=True):
        ma, mb = a.minibatch, b.minibatch
        np.testing.assert_array_equal(ma.counts, mb.counts)
        n = int(ma.counts[-1])
        np.testing.assert_array_equal(np.asarray(ma.nodes[-1])[:n], np.asarray(mb.nodes[-1])[:n])
        _edges_are_real(graph, ma)
    assert small.envelope.capacities[0] > 50
    assert small.sampler.method == sampler


def test_input_order_drop_last_and_device_fetching(graph):
    """Failed before: no shuffle=False, drop_last, features or targets."""
    nodes = np.arange(299, 99, -1)  # 200 seeds, descending
    feats = np.random.default_rng(1).normal(size=(300, 5)).astype(np.float32)
    labels = np.arange(300) % 7
    loader = zg.NeighborLoader(graph, nodes, fanouts=(3, 2), batch_size=64, key=0,
                               shuffle=False, drop_last=True, features=feats, targets=labels,
                               replace=True, envelope="conservative", sample_ahead=1)
    batches = list(loader)
    assert len(loader) == len(batches) == 3  # 200 // 64; the last 8 seeds dropped
    seeds = np.concatenate([np.asarray(b.seeds)[np.asarray(b.seed_mask)] for b in batches])
    np.testing.assert_array_equal(seeds, nodes[:192])
    for b in batches:
        valid = np.asarray(b.minibatch.valid[-1])
        want = np.where(valid[:, None], feats[np.asarray(b.input_nodes)], 0.0)
        np.testing.assert_array_equal(np.asarray(b.x), want)
        np.testing.assert_array_equal(np.asarray(b.y), labels[np.asarray(b.seeds)])
    assert len(zg.NeighborLoader(graph, nodes, fanouts=(3,), batch_size=64, key=0,
                                 envelope="conservative")) == 4


@pytest.mark.parametrize("dedup, flat_outer", [(True, False), (False, False), (True, True)])
def test_views_and_blocks_share_the_layer_order(graph, dedup, flat_outer):
    """Failed before: `views` ran outermost hop first, `blocks` seeds first."""
    loader = zg.NeighborLoader(graph, np.arange(40), fanouts=(4, 3), batch_size=20, key=3,
                               dedup=dedup, flat_outer=flat_outer,
                               features=np.ones((300, 2), np.float32), envelope="conservative",
                               sample_ahead=2)  # each layout sampled in a group
    batch = next(iter(loader))
    mb = batch.minibatch
    assert len(batch.views) == len(batch.blocks) == 2
    for i, (view, block) in enumerate(zip(batch.views, batch.blocks)):
        assert block is mb.blocks[1 - i]
        np.testing.assert_array_equal(np.asarray(view.nbr), np.asarray(block.nbr))
        assert view.positional == (not dedup or (flat_outer and i == 0))
    assert batch.views[-1].num_dst == batch.seeds.shape[0]
    assert batch.x.shape[0] == batch.input_nodes.shape[0]


def _edge_set(edges):
    return {(min(a, b), max(a, b)) for a, b in np.asarray(edges).tolist()}


def test_link_loader_draws_negatives_and_hides_the_seed_edges(graph):
    """Failed before: there was no loader for edges."""
    rs = np.random.default_rng(2)
    u, v = np.asarray(graph.indptr), np.asarray(graph.indices)
    src = np.repeat(np.arange(300), np.diff(u))
    edges = np.stack([src, v], 1)[rs.choice(len(v), 150, replace=False)]
    kw = dict(fanouts=(5, 3), batch_size=40, key=9, num_negatives=2, replace=True,
              features=np.eye(300, 4, dtype=np.float32))
    small = zg.LinkNeighborLoader(graph, edges, envelope=zg.Envelope(96, (160, 200)),
                                  sample_ahead=3, **kw)
    large = zg.LinkNeighborLoader(graph, edges, envelope="conservative", sample_ahead=1, **kw)
    seen = []
    for a, b in zip(small.epoch(0), large.epoch(0), strict=True):
        assert a.pairs.shape == (120, 2) and a.labels.shape == (120,)
        np.testing.assert_array_equal(np.asarray(a.edges), np.asarray(b.edges))
        np.testing.assert_array_equal(np.asarray(a.edges),
                                      np.asarray(a.seeds)[np.asarray(a.pairs)])
        real = np.asarray(a.weight[:40]) > 0
        positives = np.asarray(a.edges[:40])[real]
        seen.append(positives)
        neg = np.asarray(a.edges[40:]).reshape(40, 2, 2)[real]
        assert (neg[:, :, 0] == positives[:, None, 0]).all()  # destination corrupted
        assert (neg[:, :, 1] != positives[:, None, 1]).all()
        np.testing.assert_array_equal(np.asarray(a.labels), [1.0] * 40 + [0.0] * 80)
        mb = a.minibatch
        hidden = _edge_set(positives)
        for hop, block in enumerate(mb.blocks):  # no slot reads a positive edge
            rows = np.asarray(mb.nodes[hop])[:, None].repeat(block.nbr.shape[1], 1)
            cols = np.asarray(mb.nodes[hop + 1])[np.asarray(block.nbr)]
            live = np.asarray(block.mask)
            assert not hidden & _edge_set(np.stack([rows[live], cols[live]], 1))
        _edges_are_real(graph, mb)
    assert sorted(map(tuple, np.concatenate(seen).tolist())) == sorted(map(tuple, edges.tolist()))
    assert small.envelope.batch_size > 96  # level 0, the endpoints, grew too


def test_loaders_reject_bad_input(graph):
    with pytest.raises(ValueError, match=r"edges must be a non-empty integer \[E, 2\]"):
        zg.LinkNeighborLoader(graph, np.zeros((3,), np.int32), fanouts=(2,), batch_size=4,
                              key=0)
    with pytest.raises(ValueError, match=r"edges must lie in \[0, 300\)"):
        zg.LinkNeighborLoader(graph, [[0, 300]], fanouts=(2,), batch_size=4, key=0)
    with pytest.raises(ValueError, match=r"features must have one row per node \(300\)"):
        zg.NeighborLoader(graph, [1, 2], fanouts=(2,), batch_size=4, key=0,
                          features=np.ones((3, 2)))
    # the option and the ways to give weights are named (no built-in dataset has any)
    unweighted = (r"^sampler 'weighted' draws neighbours by edge weight, and this graph has "
                  r"none \(CSRGraph.weights is None; no built-in dataset has weights\): "
                  r".* or use sampler 'uniform' or 'labor'$")
    with pytest.raises(ValueError, match=unweighted):
        zg.NeighborLoader(graph._replace(weights=None), [1, 2], fanouts=(2,), batch_size=4,
                          key=0, sampler="weighted")
    with pytest.raises(ValueError, match=unweighted):
        zg.train(zg.TrainConfig(dataset="tiny", sampler="weighted", fanouts=(2,), layers=1,
                                epochs=1, progress=False))
    with pytest.raises(ValueError, match="bad kernel spec 'nope'"):
        zg.NeighborLoader(graph, [1, 2], fanouts=(2,), batch_size=4, key=0, kernels="nope")
    # a dict of tables (the typed loaders' layout) crashed in the first batch's gather
    with pytest.raises(ValueError, match=r"^features must be one float\[N, d\] table, got a "
                                         r"dict of 'x': tables per node type are "
                                         r"zg.HeteroNeighborLoader's$"):
        zg.NeighborLoader(graph, [1, 2], fanouts=(2,), batch_size=4, key=0,
                          features={"x": np.ones((300, 2), np.float32)})
    # an integer key past int32 replayed the batches of the key 2**31 below it
    for key in (2**31 + 5, -1):  # (a negative one was told [0, 2**32))
        with pytest.raises(ValueError, match=r"an integer key must lie in \[0, 2\*\*31\)"):
            zg.NeighborLoader(graph, [1, 2], fanouts=(2,), batch_size=4, key=key)
    if jax.default_backend() != "gpu":  # Pallas kernels run there
        with pytest.raises(ValueError, match="runs sample as Pallas kernels, which need an "
                                             "NVIDIA GPU"):
            zg.LinkNeighborLoader(graph, [[0, 1]], fanouts=(2,), batch_size=4, key=0,
                                  kernels="sample=pallas")


def test_interpreted_kernels_that_sum_repeated_ids_wrongly_are_refused(graph):
    """The interpreter sums ids repeated within a block wrongly; a loader that took such
    kernels handed out wrong relabels and gradients. The sampler, exact there, is taken."""
    with pytest.raises(ValueError, match="interprets relabel, weighted_sum, max as Pallas "
                                         "kernels, which the interpreter computes wrongly"):
        zg.NeighborLoader(graph, [1, 2], fanouts=(2,), batch_size=4, key=0,
                          kernels=zg.Kernels.parse("pallas", interpret=True))
    loader = zg.NeighborLoader(graph, [1, 2], fanouts=(2,), batch_size=4, key=0,
                               kernels=zg.Kernels(sample="pallas", interpret=True))
    assert next(iter(loader)).views[0].nbr.shape[1] == 2


def test_a_jitted_step_over_the_batches_traces_once(graph):
    loader = zg.NeighborLoader(graph, np.arange(200), fanouts=(3, 2), batch_size=64, key=0,
                               features=np.ones((300, 4), np.float32), targets=np.arange(300),
                               envelope="conservative", sample_ahead=1)
    traces = []

    @jax.jit
    def step(batch):
        traces.append(1)  # a Python side effect: runs once per trace
        return jax.numpy.sum(batch.x) + batch.views[0].nbr.sum() + batch.y.sum()

    sums = [int(step(b)) for _ in range(2) for b in loader]
    assert len(sums) == 8 and len(traces) == 1
