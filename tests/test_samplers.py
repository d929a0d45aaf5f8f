"""Weighted and LABOR sampling: real edges, the distributions they promise, consistency
across rows, capacity independence, and the options that select them."""

from __future__ import annotations

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from conftest import random_graph
from scipy import stats

from zerognn_jax import (
    CSRGraph,
    DeviceData,
    Envelope,
    EnvelopePolicy,
    SamplerConfig,
    ScanEngine,
    StepProgram,
    TrainConfig,
    from_edge_list,
    init_state,
    make_dataset,
    make_model,
    prepare_graph,
    sample_minibatch,
    train,
)
from zerognn_jax._src.pallas import counter_hash
from zerognn_jax._src.sampling import labor, weighted
from zerognn_jax._src.sampling.minibatch import tree_sizes

DRAWS = 6000
_sample_minibatch = jax.jit(sample_minibatch, static_argnames=("config", "capacities"))


def _rows(graph):
    indptr, indices = np.asarray(graph.indptr), np.asarray(graph.indices)
    return [indices[indptr[v]:indptr[v + 1]] for v in range(graph.num_nodes)]


def _keys(n, salt=0):
    return counter_hash.hash2(jnp.uint32(salt), jnp.arange(n, dtype=jnp.uint32))


def _with_weights(graph, seed=0, zero_fraction=0.25):
    """The graph with lognormal edge weights, a fraction of them zero."""
    rs = np.random.default_rng(seed)
    w = rs.lognormal(0.0, 1.0, graph.num_edges).astype(np.float32)
    w[rs.random(graph.num_edges) < zero_fraction] = 0.0
    return graph._replace(weights=w)


def _star(weights):
    weights = np.asarray(weights, np.float32)
    d = weights.size
    return from_edge_list(np.zeros(d, np.int64), np.arange(1, d + 1), d + 1, weights=weights)


def _draw_star(graph, fanout, *, replace, draws=DRAWS, salt=1):
    """int32[draws, fanout] neighbour ids (1..d) of node 0 under independent keys."""
    g = prepare_graph(graph, SamplerConfig((fanout,), method="weighted")).to_device()
    fn = lambda k: weighted.sample_weighted_reference(
        g.indptr, g.indices, g.weights, jnp.zeros(1, jnp.int32), jnp.ones(1, bool), k,
        fanout, replace=replace, steps=weighted.search_steps(graph.max_degree()))
    nbr, mask = jax.jit(jax.vmap(fn))(_keys(draws, salt))
    return np.asarray(nbr)[:, 0], np.asarray(mask)[:, 0]


# --- weighted ----------------------------------------------------------------------


@pytest.mark.parametrize("replace", [False, True])
@pytest.mark.parametrize("fanout", [1, 3, 40])
def test_weighted_samples_are_real_edges_of_nonzero_weight(small_graph, fanout, replace):
    graph = _with_weights(small_graph)
    g = prepare_graph(graph, SamplerConfig((fanout,), method="weighted")).to_device()
    indptr, w = np.asarray(graph.indptr), np.asarray(graph.weights)
    frontier = jnp.arange(0, 300, 3, dtype=jnp.int32)
    valid = jnp.arange(100) < 90
    nbr, mask = jax.jit(weighted.sample_weighted_reference,
                        static_argnames=("fanout", "replace", "steps"))(
        g.indptr, g.indices, g.weights, frontier, valid, jnp.uint32(77), fanout=fanout,
        replace=replace, steps=weighted.search_steps(graph.max_degree()))
    nbr, mask = np.asarray(nbr), np.asarray(mask)
    assert not mask[90:].any()
    rows = _rows(graph)
    for i, v in enumerate(np.asarray(frontier)[:90]):
        heavy = set(rows[v][w[indptr[v]:indptr[v + 1]] > 0].tolist())
        picked = nbr[i][mask[i]].tolist()
        assert set(picked) <= heavy, "an edge of weight zero (or no edge) was drawn"
        assert np.all(mask[i][:len(picked)]), "the valid slots are not a prefix"
        if replace:
            assert len(picked) == (fanout if heavy else 0)
        else:
            assert len(set(picked)) == len(picked) == min(fanout, len(heavy))


def _successive_probability(w, sequence):
    p, left = 1.0, w.sum()
    for i in sequence:
        p *= w[i] / left
        left -= w[i]
    return p


def test_weighted_without_replacement_is_successive_sampling():
    """3 of 6 neighbours (one of weight zero): chi-square over the 10 possible subsets,
    with torch.multinomial's probabilities, and the first draw proportional to weight."""
    w = np.array([1.0, 2.0, 0.0, 3.0, 4.0, 0.5])
    picks, mask = _draw_star(_star(w), 3, replace=False)
    assert mask.all() and not (picks == 3).any()  # neighbour 3 has weight zero
    heavy = [i for i in range(6) if w[i] > 0]
    subsets = list(itertools.combinations(heavy, 3))
    expected = np.array([sum(_successive_probability(w, s) for s in itertools.permutations(c))
                         for c in subsets])
    index = {c: i for i, c in enumerate(subsets)}
    observed = np.bincount([index[tuple(sorted(p - 1))] for p in picks], minlength=len(subsets))
    assert expected.sum() == pytest.approx(1.0)
    assert stats.chisquare(observed, expected * DRAWS).pvalue > 1e-4
    first = np.bincount(picks[:, 0] - 1, minlength=6)[heavy]
    assert stats.chisquare(first, w[heavy] / w.sum() * DRAWS).pvalue > 1e-4


def test_weighted_with_replacement_matches_the_weights():
    w = np.array([0.0, 5.0, 1.0, 0.0, 2.5, 0.25, 1.25])
    picks, mask = _draw_star(_star(w), 4, replace=True)
    assert mask.all()
    heavy = w > 0
    for slot in range(4):
        counts = np.bincount(picks[:, slot] - 1, minlength=w.size)
        assert counts[~heavy].sum() == 0
        assert stats.chisquare(counts[heavy], w[heavy] / w.sum() * DRAWS).pvalue > 1e-4


@pytest.mark.parametrize("replace", [False, True])
def test_a_hub_row_is_sampled_by_weight(replace):
    """A row of 5000 neighbours (cost: 13 search steps per draw, not 5000 reads):
    the first draw falls in each tenth of the row in proportion to its weight."""
    rs = np.random.default_rng(4)
    w = rs.lognormal(0.0, 1.5, 5000)
    w[rs.random(5000) < 0.3] = 0.0
    picks, _ = _draw_star(_star(w), 5, replace=replace, draws=4000)
    assert (w[picks - 1] > 0).all()
    bins = np.arange(5000) // 500
    observed = np.bincount(bins[picks[:, 0] - 1], minlength=10)
    expected = np.bincount(bins, weights=w, minlength=10) / w.sum() * 4000
    assert stats.chisquare(observed, expected).pvalue > 1e-4


def test_rows_without_weight_sample_nothing():
    g = from_edge_list([0, 0, 1], [1, 2, 2], 3, weights=[0.0, 0.0, 1.0])
    cfg = SamplerConfig((2,), method="weighted")
    mb = _sample_minibatch(prepare_graph(g, cfg).to_device(), jnp.asarray([0, 1, 2], jnp.int32),
                          jnp.ones(3, bool), jnp.uint32(3), cfg, (8,))
    np.testing.assert_array_equal(np.asarray(mb.blocks[0].mask),
                                  [[False, False], [True, False], [False, False]])


def test_cumulative_table_is_exact_integers():
    table = weighted.cumulative_table([0, 3, 3, 5], [1.0, 0.0, 3.0, 2.0, 2.0])
    assert table.dtype == np.uint32
    np.testing.assert_array_equal(table, [2**29 + 1, 2**29 + 1, 2**31 + 2, 2**30 + 1, 2**31 + 2])
    with pytest.raises(ValueError, match="non-negative"):
        weighted.cumulative_table([0, 2], [1.0, -1.0])



def test_all_zero_weights_are_refused_where_a_hop_draws_by_them():
    g = from_edge_list([0, 0, 1], [1, 2, 2], 3, weights=[0.0, 0.0, 0.0])
    with pytest.raises(ValueError, match="all 3 edge weights of the graph are zero"):
        prepare_graph(g, SamplerConfig((2,), method="weighted").resolve(g.max_degree()))
    full = SamplerConfig((-1,), method="weighted").resolve(g.max_degree())
    assert prepare_graph(g, full).weights.dtype == np.uint32  # -1 reads no weight


def test_integer_weights_are_weights_and_a_graph_without_edges_is_prepared():
    """uint32 weights were taken for a prepared table and sampled by a wrong law; an
    edgeless graph's table failed in NumPy's divide (bincount's int64 of no edges)."""
    counts = CSRGraph(np.array([0, 4, 4, 4, 4, 4]), np.arange(1, 5, dtype=np.int32),
                      np.array([3, 1, 2, 4], np.uint32))
    as_float = counts._replace(weights=counts.weights.astype(np.float32))
    config = SamplerConfig((1,), method="weighted")
    np.testing.assert_array_equal(prepare_graph(counts, config).weights,
                                  prepare_graph(as_float, config).weights)
    bare = CSRGraph(np.zeros(4, np.int32), np.zeros(0, np.int32), np.zeros(0, np.float32))
    table = prepare_graph(bare, config).weights
    assert table.dtype == np.uint32 and table.shape == (0,)


def test_weighted_sampling_needs_a_prepared_weighted_graph(small_graph):
    cfg = SamplerConfig((3,), method="weighted")
    seeds, valid = jnp.zeros(2, jnp.int32), jnp.ones(2, bool)
    with pytest.raises(ValueError, match="has none"):
        prepare_graph(small_graph, cfg)
    with pytest.raises(ValueError, match="prepare_graph"):
        _sample_minibatch(_with_weights(small_graph).to_device(), seeds, valid, jnp.uint32(0),
                         cfg, (64,))


# --- LABOR ---------------------------------------------------------------------------


def _labor(graph, frontier, valid, key, fanout, *, slots, span):
    g = graph.to_device()
    fn = jax.jit(labor.sample_labor_reference, static_argnames=("fanout", "slots", "span"))
    nbr, mask = fn(g.indptr, g.indices, frontier, valid, key, fanout=fanout, slots=slots,
                   span=span)
    return np.asarray(nbr), np.asarray(mask)


def test_labor_keeps_the_neighbours_whose_vertex_number_is_below_fanout_over_degree(
        small_graph):
    """Row s keeps t iff r_t < min(1, f / d_s), r_t one number per vertex for the whole
    hop: two rows that share t agree on it (the lower-degree row keeps it whenever the
    other does)."""
    fanout, span = 3, small_graph.max_degree()
    frontier = jnp.arange(295, dtype=jnp.int32)
    key = counter_hash.step_key(0, 2, 7, 1)
    nbr, mask = _labor(small_graph, frontier, jnp.ones(295, bool), key, fanout, slots=span,
                       span=span)
    rows = _rows(small_graph)
    r = np.asarray(labor.vertex_uniform(key, jnp.arange(300, dtype=jnp.int32)))
    kept = {}
    for s in range(295):
        d = rows[s].size
        want = {int(t) for t in rows[s] if r[t] < min(1.0, fanout / d)}
        got = nbr[s][mask[s]].tolist()
        assert len(got) == len(set(got)) and set(got) == want, s
        kept[s] = want
    agree = 0
    for s1, s2 in itertools.combinations(range(295), 2):
        if rows[s1].size < rows[s2].size:
            s1, s2 = s2, s1  # s1 has the larger degree, the lower threshold
        for t in set(kept[s1]) & set(rows[s2].tolist()):
            assert t in kept[s2], (s1, s2, t)
            agree += 1
    assert agree > 100


def test_labor_inclusion_probability_and_expected_count():
    """A row of 12 neighbours, fanout 3: each kept with probability 1/4, independently
    (r_t of distinct vertices), so the per-neighbour counts give chi-square(12); the
    mean count is the fanout."""
    d, fanout = 12, 3
    g = _star(np.ones(d)).to_device()
    fn = lambda k: labor.sample_labor_reference(g.indptr, g.indices, jnp.zeros(1, jnp.int32),
                                                jnp.ones(1, bool), k, fanout, slots=d, span=d)
    nbr, mask = jax.jit(jax.vmap(fn))(_keys(DRAWS, 5))
    nbr, mask = np.asarray(nbr)[:, 0], np.asarray(mask)[:, 0]
    counts = np.bincount(nbr[mask] - 1, minlength=d)
    p = fanout / d
    chi2 = np.sum((counts - DRAWS * p) ** 2 / (DRAWS * p * (1 - p)))
    assert stats.chi2.sf(chi2, d) > 1e-4
    per_row = mask.sum(1)
    z = (per_row.mean() - fanout) / np.sqrt(d * p * (1 - p) / DRAWS)
    assert abs(z) < 4.5


def test_labor_expected_count_per_row_is_the_fanout(small_graph):
    """Every row of a random graph, over 300 keys: mean count min(d, fanout)."""
    fanout, span, draws = 4, small_graph.max_degree(), 300
    g = small_graph.to_device()
    frontier = jnp.arange(295, dtype=jnp.int32)
    fn = lambda k: labor.sample_labor_reference(g.indptr, g.indices, frontier,
                                                jnp.ones(295, bool), k, fanout, slots=span,
                                                span=span)[1].sum(1)
    counts = np.asarray(jax.jit(jax.vmap(fn))(_keys(draws, 8)))
    d = np.asarray(small_graph.degrees())[:295]
    p = np.minimum(1.0, fanout / np.maximum(d, 1))
    mean = counts.mean(0)
    np.testing.assert_array_equal(mean[d <= fanout], d[d <= fanout])
    big = d > fanout
    z = (mean[big] - fanout) / np.sqrt(d[big] * p[big] * (1 - p[big]) / draws)
    assert big.sum() > 100 and np.abs(z).max() < 4.5


def test_a_hub_row_scans_a_window_with_the_same_inclusion_probability():
    """Degree 64, span 16, fanout 4: a random window of 16 with threshold 4/16, so every
    neighbour still has probability 4/64 and the row still expects 4."""
    d, span, fanout = 64, 16, 4
    g = _star(np.ones(d)).to_device()
    fn = lambda k: labor.sample_labor_reference(g.indptr, g.indices, jnp.zeros(1, jnp.int32),
                                                jnp.ones(1, bool), k, fanout, slots=span,
                                                span=span)
    nbr, mask = jax.jit(jax.vmap(fn))(_keys(DRAWS, 6))
    nbr, mask = np.asarray(nbr)[:, 0], np.asarray(mask)[:, 0]
    p = fanout / d
    z = (np.bincount(nbr[mask] - 1, minlength=d) - DRAWS * p) / np.sqrt(DRAWS * p * (1 - p))
    assert np.abs(z).max() < 4.5
    per_row = mask.sum(1)
    assert abs(per_row.mean() - fanout) < 4.5 * np.sqrt(fanout / DRAWS)


@pytest.mark.parametrize("fanout", [200, 600])
def test_labor_fanouts_above_the_span_keep_their_inclusion_probability(fanout):
    """A row of 400 neighbours under a config of span 128 (the default): a fanout of 200
    keeps each neighbour with probability 1/2 (its window widens to the fanout), one of
    600, above the largest degree, keeps the whole row; both were cut to a window of 128
    kept whole (probability 0.32 each)."""
    d = 400
    g = _star(np.ones(d)).to_device()
    cfg = SamplerConfig((fanout,), method="labor").resolve(d)
    assert cfg.labor_span(0) == min(fanout, d)
    draw = jax.jit(jax.vmap(lambda k: sample_minibatch(
        g, jnp.zeros(1, jnp.int32), jnp.ones(1, bool), k, cfg, (1024,)).blocks[0].mask[0]))
    kept = np.asarray(draw(_keys(400, 9))).sum(1)
    # each hop's window is its own: a full hop or a wide one leaves the others at span
    assert SamplerConfig((-1, fanout, 10), method="labor").resolve(d).labor_span(2) == 128
    if fanout >= d:
        assert (kept == d).all()
    else:
        p = fanout / d
        assert abs(kept.mean() - fanout) < 4.5 * np.sqrt(d * p * (1 - p) / 400)


def test_labor_rows_cut_to_their_slots_stay_uniform():
    """Degree 20, fanout 10, 10 slots: about half the rows keep more than fit; the cut
    keeps every neighbour equally likely."""
    d, fanout, slots = 20, 10, 10
    g = _star(np.ones(d)).to_device()
    args = (g.indptr, g.indices, jnp.zeros(1, jnp.int32), jnp.ones(1, bool))
    fn = lambda k: labor.sample_labor_reference(*args, k, fanout, slots=slots, span=d)
    nbr, mask = jax.jit(jax.vmap(fn))(_keys(DRAWS, 7))
    nbr, mask = np.asarray(nbr)[:, 0], np.asarray(mask)[:, 0]
    before = np.asarray(jax.vmap(lambda k: labor.row_counts(*args, k, fanout, span=d))(
        _keys(DRAWS, 7)))[:, 0]
    assert (before > slots).mean() > 0.3
    np.testing.assert_array_equal(mask.sum(1), np.minimum(before, slots))
    for row, m in zip(nbr, mask):
        assert len(set(row[m].tolist())) == m.sum()
    assert stats.chisquare(np.bincount(nbr[mask] - 1, minlength=d)).pvalue > 1e-4


def test_labor_slots_cover_the_poisson_tail():
    for fanout in (1, 3, 5, 10, 15, 25):
        k = labor.labor_slots(fanout, 10_000)
        assert stats.poisson.sf(k, fanout) <= 1e-3 < stats.poisson.sf(k - 1, fanout)
    assert labor.labor_slots(15, 20) == 20  # never more than it scans
    assert labor.labor_slots(4, 256, 0.05) < labor.labor_slots(4, 256)


def test_labor_reaches_fewer_vertices_than_uniform_sampling():
    graph = random_graph(3000, 45000, seed=2)
    g = graph.to_device()
    seeds = jnp.arange(0, 3000, 12, dtype=jnp.int32)
    means = {}
    for method in ("uniform", "labor"):
        cfg = SamplerConfig((5, 5), method=method).resolve(graph.max_degree())
        fn = jax.jit(lambda k, cfg=cfg: _sample_minibatch(
            g, seeds, jnp.ones(250, bool), k, cfg, (2000, 3000)).counts)
        means[method] = np.mean([np.asarray(fn(counter_hash.step_key(0, 0, s, 0)))
                                 for s in range(4)], axis=0)
    assert means["labor"][2] < 0.6 * means["uniform"][2], means


# --- the mini-batch, the envelope, the options ---------------------------------------


def _graph_for(method, graph):
    cfg = SamplerConfig((4, 3), method=method).resolve(graph.max_degree())
    return cfg, prepare_graph(_with_weights(graph), cfg).to_device()


@pytest.mark.parametrize("method", ["weighted", "labor"])
def test_larger_capacities_give_identical_samples(small_graph, method):
    cfg, g = _graph_for(method, small_graph)
    seeds = jnp.arange(0, 40, 2, dtype=jnp.int32)
    run = lambda caps: _sample_minibatch(g, seeds, jnp.arange(20) < 17,
                                        counter_hash.step_key(0, 0, 5, 0), cfg, caps)
    small, large = run((128, 256)), run((512, 1024))
    counts = np.asarray(small.counts)
    np.testing.assert_array_equal(counts, np.asarray(large.counts))
    assert not bool(small.overflow)
    for level, n in enumerate(counts):
        np.testing.assert_array_equal(np.asarray(small.nodes[level])[:n],
                                      np.asarray(large.nodes[level])[:n])
    for level, (a, b) in enumerate(zip(small.blocks, large.blocks)):
        assert a.nbr.shape[1] == cfg.slots[level]
        np.testing.assert_array_equal(np.asarray(a.nbr)[:counts[level]],
                                      np.asarray(b.nbr)[:counts[level]])


def test_labor_tree_mode_uses_the_slot_widths(small_graph):
    cfg = SamplerConfig((4, 3), method="labor", dedup=False).resolve(small_graph.max_degree())
    assert cfg.slots[0] > 4
    mb = _sample_minibatch(small_graph.to_device(), jnp.arange(20, dtype=jnp.int32),
                          jnp.ones(20, bool), jnp.uint32(9), cfg, ())
    assert tuple(n.shape[0] for n in mb.nodes) == tree_sizes(20, cfg.slots)


def _problem(method, num_nodes=400, classes=4, seed=0):
    graph = _with_weights(random_graph(num_nodes, 2400, seed=seed), seed)
    rs = np.random.default_rng(seed)
    labels = rs.integers(0, classes, num_nodes).astype(np.int32)
    feats = np.eye(classes, dtype=np.float32)[labels] + rs.normal(size=(num_nodes, classes))
    cfg = SamplerConfig((5, 3), method=method).resolve(graph.max_degree())
    data = DeviceData(prepare_graph(graph, cfg).to_device(),
                      jnp.asarray(feats.astype(np.float32)), jnp.asarray(labels))
    net = make_model("sage", hidden=16, num_layers=2, num_classes=classes, dropout=0.1)
    return data, StepProgram(net, optax.adam(1e-2), cfg, 32, seed=3)


@pytest.mark.parametrize("method", ["weighted", "labor"])
def test_tiny_envelope_recovers_and_matches_a_large_one(method):
    """The scan engine's envelope property (tests/test_engine.py) for every sampler."""
    data, program = _problem(method)
    train_idx = np.arange(200)
    results = {}
    for name, env in (("tiny", Envelope(32, (40, 40))), ("large", Envelope(32, (512, 512)))):
        state = init_state(program, data, Envelope(32, (512, 512)), train_idx)
        engine = ScanEngine(program, 3, EnvelopePolicy(multiple=8))
        results[name] = engine.run_epoch(state, data, train_idx, 0, env)
    tiny, large = results["tiny"], results["large"]
    assert tiny.overflows >= 1 and large.overflows == 0
    assert (tiny.steps, tiny.max_counts, tiny.sampled_edges) == (
        large.steps, large.max_counts, large.sampled_edges)
    assert tiny.loss == pytest.approx(large.loss, rel=1e-5)
    for x, y in zip(jax.tree_util.tree_leaves(tiny.state.params),
                    jax.tree_util.tree_leaves(large.state.params)):
        np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=2e-5, atol=1e-6)


def test_bad_sampler_options():
    with pytest.raises(ValueError, match=r"the sampler \(method\) must be one of uniform, "
                                         r"weighted, labor, got 'importance'"):
        SamplerConfig((3,), method="importance")
    with pytest.raises(ValueError, match="without replacement"):
        SamplerConfig((3,), method="labor", replace=True)
    with pytest.raises(ValueError, match="sampler must be one of"):
        TrainConfig(sampler="bogus")
    with pytest.raises(ValueError, match=r"drop replace \(--replace\)"):
        TrainConfig(sampler="labor", replace=True)


def test_full_hops_take_every_neighbour_whatever_the_method(small_graph):
    cfg = SamplerConfig((-1,), method="labor").resolve(small_graph.max_degree())
    assert cfg.slots == cfg.fanouts == (small_graph.max_degree(),)
    mb = _sample_minibatch(small_graph.to_device(), jnp.arange(10, dtype=jnp.int32),
                          jnp.ones(10, bool), jnp.uint32(0), cfg, (512,))
    np.testing.assert_array_equal(np.asarray(mb.blocks[0].mask).sum(1),
                                  np.asarray(small_graph.degrees())[:10])


@pytest.mark.parametrize("method", ["weighted", "labor"])
def test_train_runs_with_each_sampler(method):
    graph = _with_weights(random_graph(300, 1500, seed=1), 1)
    rs = np.random.default_rng(0)
    labels = rs.integers(0, 3, 300)
    feats = np.eye(3)[labels] + rs.normal(size=(300, 3))
    ds = make_dataset("weighted-random", graph.indptr, graph.indices, feats, labels,
                      np.arange(200), np.arange(200, 250), np.arange(250, 300), 3,
                      weights=graph.weights)
    cfg = TrainConfig(sampler=method, hidden=8, layers=2, fanouts=(4, 3), batch_size=64,
                      epochs=1, eval_mode="sampled", progress=False)
    summary = train(cfg, ds).summary
    assert summary["sampler"] == method and summary["overflows"] == 0
    assert 0.0 <= summary["test_acc"] <= 1.0


def test_the_cli_offers_the_samplers(capsys):
    from zerognn_jax.cli import build_parser
    from zerognn_jax.cli.flags import config_from_args

    parser = build_parser()
    args = parser.parse_args(["train", "--sampler", "labor", "--fanouts", "5,5", "--layers", "2"])
    assert config_from_args(TrainConfig, args).sampler == "labor"
    with pytest.raises(SystemExit):
        parser.parse_args(["train", "--sampler", "importance"])
    assert "invalid choice: 'importance'" in capsys.readouterr().err


@pytest.mark.parametrize("method", ["uniform", "weighted"])
def test_a_fanout_above_the_largest_degree_gets_that_many_slots(small_graph, method):
    """Without replacement no row fills more slots than its degree: `resolve` gives such a
    hop D slots (D the largest degree), and the samples are those of the wide rows."""
    top = small_graph.max_degree()
    wide = SamplerConfig((top + 40,), method=method, max_degree=top)
    cfg = wide.resolve(top)
    assert cfg.fanouts == (top,) and cfg.full == (False,)  # it samples on wider graphs
    assert SamplerConfig((top + 40,), replace=True).resolve(top).fanouts == (top + 40,)
    g = prepare_graph(_with_weights(small_graph), cfg).to_device()
    seeds, valid = jnp.arange(0, 60, 3, dtype=jnp.int32), jnp.arange(20) < 18
    key = counter_hash.step_key(0, 0, 2, 0)
    narrow = _sample_minibatch(g, seeds, valid, key, cfg, (320,))
    broad = _sample_minibatch(g, seeds, valid, key, wide, (320,))
    mask = np.asarray(broad.blocks[0].mask)
    assert not mask[:, top:].any()
    np.testing.assert_array_equal(np.asarray(narrow.blocks[0].mask), mask[:, :top])
    assert not bool(broad.overflow)
    np.testing.assert_array_equal(np.asarray(narrow.nodes[1]), np.asarray(broad.nodes[1]))
    np.testing.assert_array_equal(np.asarray(narrow.blocks[0].nbr),
                                  np.asarray(broad.blocks[0].nbr)[:, :top])


def test_every_neighbour_is_taken_once_with_replacement_too():
    """A fanout of -1 takes each row whole, in CSR order, whatever `replace` says (with
    replacement it drew max-degree slots at random: a degree-3 row got many repeats).
    Every method's -1 hop is this one (`sample_hop`)."""
    from zerognn_jax._src.sampling.minibatch import sample_hop

    graph = random_graph(60, 240, seed=4)
    indptr, indices = np.asarray(graph.indptr), np.asarray(graph.indices)
    ids = jnp.arange(60, dtype=jnp.int32)
    for replace in (False, True):
        config = SamplerConfig((-1,), replace=replace).resolve(int(np.diff(indptr).max()))
        nbr, mask, _ = sample_hop(graph.to_device(), ids, jnp.ones(60, bool), jnp.uint32(7),
                                  config, 0)
        for row in range(60):
            got = np.asarray(nbr[row])[np.asarray(mask[row])]
            np.testing.assert_array_equal(got, indices[indptr[row]:indptr[row + 1]])
