"""Edge blocks (`SamplerConfig.edge_blocks`): a hop's live slots as one compacted edge
list. They hold the row form's edges, give its model outputs, keep LABOR's inclusion
probabilities, and an edge budget too small overflows and is recovered exactly."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from conftest import random_graph
from scipy import stats

from pallas_kernels import counter_hash
from zerognn_jax import (
    DeviceData,
    Envelope,
    EnvelopePolicy,
    SamplerConfig,
    ScanEngine,
    StepProgram,
    TrainConfig,
    init_state,
    make_model,
    sample_minibatch,
)
from zerognn_jax._src.nn.views import EdgeView
from zerognn_jax._src.sampling.compact import compact_rows
from zerognn_jax._src.sampling.envelope import grow
from zerognn_jax._src.training.program import views_for
from zerognn_jax._src.training.tasks.link import exclude_pairs

_sample = jax.jit(sample_minibatch, static_argnames=("config", "capacities", "edges"))
_SEEDS = jnp.arange(0, 60, 3, dtype=jnp.int32)
_VALID = jnp.arange(20) < 18
_KEY = counter_hash.step_key(0, 1, 4, 0)


def _configs(graph, flat: bool):
    rows = SamplerConfig((4, 3), method="labor", flat_outer=flat).resolve(graph.max_degree())
    return rows, dataclasses.replace(rows, edge_blocks=True)


def _live_rows(block):
    """(row, neighbour, edge id) of the row form's live slots, row by row."""
    mask = np.asarray(block.mask)
    rows = np.nonzero(mask)[0]
    return rows, np.asarray(block.nbr)[mask], np.asarray(block.eid)[mask]


@pytest.mark.parametrize("flat", [False, True])
def test_edge_blocks_hold_the_row_forms_live_slots(small_graph, flat):
    rows_cfg, edge_cfg = (dataclasses.replace(c, edge_ids=True)
                          for c in _configs(small_graph, flat))
    g = small_graph.to_device()
    rows = _sample(g, _SEEDS, _VALID, _KEY, rows_cfg, (256, 1024))
    edges = _sample(g, _SEEDS, _VALID, _KEY, edge_cfg, (256, 1024))
    hops = rows_cfg.num_hops
    np.testing.assert_array_equal(np.asarray(edges.counts)[:hops],
                                  np.asarray(rows.counts)[:hops])
    for hop, (r, e) in enumerate(zip(rows.blocks, edges.blocks)):
        row, nbr, eid = _live_rows(r)
        n = int(edges.counts[hops + 1 + hop])
        assert n == row.size and np.asarray(e.mask).sum() == n and np.asarray(e.mask)[:n].all()
        np.testing.assert_array_equal(np.asarray(e.dst)[:n], row)
        np.testing.assert_array_equal(np.asarray(e.eid)[:n], eid)
        src_r = np.asarray(rows.nodes[hop + 1])[nbr]
        src_e = np.asarray(edges.nodes[hop + 1])[np.asarray(e.nbr)[:n]]
        np.testing.assert_array_equal(src_e, src_r)
        assert (np.asarray(e.dst)[n:] == rows.nodes[hop].shape[0]).all()
    assert edges.nodes[-1].shape[0] == (rows.nodes[-2].shape[0] + rows.blocks[-1].mask.size
                                        if flat else 1024)


def _labelled(graph, classes=4, seed=0):
    rs = np.random.default_rng(seed)
    labels = rs.integers(0, classes, graph.num_nodes).astype(np.int32)
    feats = np.eye(classes, dtype=np.float32)[labels] + rs.normal(size=(graph.num_nodes,
                                                                        classes))
    return jnp.asarray(feats.astype(np.float32)), jnp.asarray(labels)


@pytest.mark.parametrize("model", ["sage", "gcn", "gat"])
@pytest.mark.parametrize("flat", [False, True])
def test_edge_blocks_give_the_row_forms_outputs(small_graph, model, flat):
    feats, _ = _labelled(small_graph)
    net = make_model(model, hidden=8, num_layers=2, num_classes=4, dropout=0.0, heads=2)
    outs = []
    for cfg in _configs(small_graph, flat):
        mb = _sample(small_graph.to_device(), _SEEDS, _VALID, _KEY, cfg, (256, 1024))
        views = views_for(mb, positional=cfg.positional)
        x = feats[mb.nodes[-1]]
        params = net.init(jax.random.PRNGKey(0), x, views, train=False)
        outs.append(np.asarray(net.apply(params, x, views, train=False)))
    assert isinstance(views[0], EdgeView)
    np.testing.assert_allclose(outs[1][:18], outs[0][:18], rtol=1e-5, atol=1e-6)


def test_edge_blocks_keep_labors_inclusion_probability():
    """A star's centre of degree 12, fanout 3, in edge form: each neighbour is an edge
    with probability 1/4 (chi-square over the 12), the mean count is the fanout."""
    d, fanout, draws = 12, 3, 4000
    from zerognn_jax import from_edge_list
    star = from_edge_list(np.zeros(d, np.int64), np.arange(1, d + 1), d + 1)
    cfg = SamplerConfig((fanout,), method="labor", edge_blocks=True).resolve(d)
    g = star.to_device()
    fn = lambda k: sample_minibatch(g, jnp.zeros(1, jnp.int32), jnp.ones(1, bool), k, cfg,
                                    (16,), edges=(16,))
    keys = counter_hash.hash2(jnp.uint32(5), jnp.arange(draws, dtype=jnp.uint32))
    mb = jax.jit(jax.vmap(fn))(keys)
    block, nodes = mb.blocks[0], np.asarray(mb.nodes[1])
    mask = np.asarray(block.mask)
    ids = np.take_along_axis(nodes, np.asarray(block.nbr), axis=1)[mask]
    counts = np.bincount(ids - 1, minlength=d)
    p = fanout / d
    chi2 = np.sum((counts - draws * p) ** 2 / (draws * p * (1 - p)))
    assert stats.chi2.sf(chi2, d) > 1e-4
    z = (mask.sum(1).mean() - fanout) / np.sqrt(d * p * (1 - p) / draws)
    assert abs(z) < 4.5


def _program(graph, flat: bool):
    cfg = _configs(graph, flat)[1]
    feats, labels = _labelled(graph)
    data = DeviceData(graph.to_device(), feats, labels)
    net = make_model("sage", hidden=16, num_layers=2, num_classes=4, dropout=0.1)
    return data, StepProgram(net, optax.adam(1e-2), cfg, 32, seed=3)


@pytest.mark.parametrize("flat", [False, True])
def test_a_too_small_edge_budget_recovers_exactly(flat):
    """Edge budgets of 8 overflow at once; the run grows them, replays, and ends where
    a run with room to spare ends, losses bit for bit."""
    graph = random_graph(400, 2400, seed=0)
    data, program = _program(graph, flat)
    train_idx = np.arange(200)
    fit = program.sampler.fit_envelope
    results = {}
    for name, edges in (("tiny", (8, 8)), ("large", (2048, 4096))):
        env = fit(Envelope(32, (512, 512), edges))
        state = init_state(program, data, fit(Envelope(32, (512, 512), (2048, 4096))),
                           train_idx)
        engine = ScanEngine(program, 3, EnvelopePolicy(multiple=8))
        results[name] = engine.run_epoch(state, data, train_idx, 0, env)
    tiny, large = results["tiny"], results["large"]
    assert tiny.overflows >= 1 and large.overflows == 0
    assert min(tiny.envelope.edges) > 8
    assert (tiny.steps, tiny.max_counts, tiny.sampled_edges) == (
        large.steps, large.max_counts, large.sampled_edges)
    assert tiny.loss == large.loss
    for x, y in zip(jax.tree_util.tree_leaves(tiny.state.params),
                    jax.tree_util.tree_leaves(large.state.params)):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


def test_grow_raises_an_overflowed_edge_budget_and_the_levels_after_it():
    env = Envelope(8, (16, 32), (40, 40))
    grown = grow(env, [8, 16, 30, 100, 20], EnvelopePolicy(margin=1.0, multiple=1))
    assert grown.edges == (100, 100) and grown.capacities == (40, 80)  # all by 100 / 40


def test_bad_edge_block_inputs(small_graph):
    with pytest.raises(ValueError, match="edge blocks need deduplicated levels"):
        SamplerConfig((3,), method="labor", dedup=False, edge_blocks=True)
    with pytest.raises(ValueError, match="edge blocks need deduplicated levels"):
        TrainConfig(sampler="labor", dedup=False, edge_blocks=True)
    with pytest.raises(ValueError, match="one edge budget >= 1 per hop"):
        Envelope(8, (16, 32), (40,))
    with pytest.raises(ValueError, match="capacity of at least 1"):
        compact_rows((jnp.zeros((2, 3), jnp.int32),), jnp.ones((2, 3), bool), 0)
    cfg = _configs(small_graph, False)[1]
    with pytest.raises(ValueError, match="2 hops need 2 edge budgets"):
        sample_minibatch(small_graph.to_device(), _SEEDS, _VALID, _KEY, cfg, (256, 1024),
                         edges=(64,))
    mb = _sample(small_graph.to_device(), _SEEDS, _VALID, _KEY, cfg, (256, 1024))
    with pytest.raises(ValueError, match="needs row-form blocks"):
        exclude_pairs(mb, jnp.zeros((1, 2), jnp.int32), jnp.ones(1, bool))
    view = EdgeView(jnp.zeros(5, jnp.int32), jnp.zeros(5, jnp.int32), jnp.ones(5, bool),
                    jnp.ones(2, bool), jnp.ones(2), jnp.ones(7), 2, positional=True)
    with pytest.raises(ValueError, match="reads 7 source rows, got 6"):
        view.src_of_edges(jnp.zeros((6, 3)))
