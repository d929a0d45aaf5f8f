"""Sampling and dedup: real edges, uniformity, capacity independence, bad input."""

from __future__ import annotations

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import random_graph
from scipy import stats

from zerognn_jax import SamplerConfig, from_edge_list, sample_minibatch
from zerognn_jax._src.ops import relabel
from zerognn_jax._src.pallas import counter_hash
from zerognn_jax._src.sampling import uniform as sampling


def _rows(graph):
    indptr, indices = np.asarray(graph.indptr), np.asarray(graph.indices)
    return [indices[indptr[v]:indptr[v + 1]] for v in range(graph.num_nodes)]


@pytest.mark.parametrize("fanout", [1, 3, 7, 40])
@pytest.mark.parametrize("use_jit", [False, True])
def test_samples_are_real_distinct_edges(small_graph, fanout, use_jit):
    g = small_graph.to_device()
    rows = _rows(small_graph)
    frontier = jnp.arange(0, 300, 3, dtype=jnp.int32)
    valid = jnp.arange(frontier.shape[0]) < 90  # last rows are padding
    fn = sampling.sample_neighbors_reference
    if use_jit:
        fn = jax.jit(fn, static_argnames=("fanout", "replace", "all_neighbors"))
    key = counter_hash.step_key(0, 1, 2, 3)
    nbr, mask = fn(g.indptr, g.indices, frontier, valid, key, fanout=fanout)
    nbr, mask = np.asarray(nbr), np.asarray(mask)
    assert not mask[90:].any()
    for i, v in enumerate(np.asarray(frontier)[:90]):
        picked = nbr[i][mask[i]]
        assert len(set(picked.tolist())) == picked.size, "duplicate neighbour without replacement"
        assert set(picked.tolist()) <= set(rows[v].tolist())
        assert picked.size == min(fanout, rows[v].size)
        if rows[v].size <= fanout:  # the whole neighbourhood, in CSR order
            np.testing.assert_array_equal(picked, rows[v])


def test_degree_zero_rows_are_empty(small_graph):
    g = small_graph.to_device()
    isolated = jnp.arange(295, 300, dtype=jnp.int32)
    for replace in (False, True):
        _, mask = sampling.sample_neighbors_reference(
            g.indptr, g.indices, isolated, jnp.ones(5, bool), jnp.uint32(7), 4, replace=replace)
        assert not np.asarray(mask).any()


def _star(degree):
    return from_edge_list(np.zeros(degree, np.int64), np.arange(1, degree + 1), degree + 1)


def test_without_replacement_subsets_are_uniform():
    """Every 3-subset of 8 neighbours is equally likely (chi-square over all 56)."""
    degree, fanout, draws = 8, 3, 11200
    g = _star(degree).to_device()
    keys = counter_hash.hash2(jnp.uint32(123), jnp.arange(draws, dtype=jnp.uint32))
    sample = jax.vmap(lambda k: sampling.sample_neighbors_reference(
        g.indptr, g.indices, jnp.zeros(1, jnp.int32), jnp.ones(1, bool), k, fanout)[0][0])
    picks = np.sort(np.asarray(sample(keys)), axis=1)
    subsets = {s: i for i, s in enumerate(itertools.combinations(range(1, degree + 1), fanout))}
    counts = np.bincount([subsets[tuple(p)] for p in picks], minlength=len(subsets))
    assert counts.sum() == draws
    assert stats.chisquare(counts).pvalue > 1e-4


def test_with_replacement_is_uniform_per_slot():
    degree, fanout, draws = 6, 4, 6000
    g = _star(degree).to_device()
    keys = counter_hash.hash2(jnp.uint32(9), jnp.arange(draws, dtype=jnp.uint32))
    sample = jax.vmap(lambda k: sampling.sample_neighbors_reference(
        g.indptr, g.indices, jnp.zeros(1, jnp.int32), jnp.ones(1, bool), k, fanout,
        replace=True)[0][0])
    picks = np.asarray(sample(keys))
    for slot in range(fanout):
        counts = np.bincount(picks[:, slot] - 1, minlength=degree)
        assert stats.chisquare(counts).pvalue > 1e-4
    repeats = np.mean([len(set(row)) < fanout for row in picks.tolist()])
    assert repeats > 0.5  # with replacement, repeats are the common case here


def test_uniform_below_stays_in_range():
    bits = jnp.asarray([0, 1, 2**31, 2**32 - 1], jnp.uint32)
    for n in (1, 2, 7, 2**31 - 1):
        out = np.asarray(counter_hash.uniform_below(bits, jnp.uint32(n)))
        assert out.min() >= 0 and out.max() < n


@pytest.mark.parametrize("method", ["table", "sort"])
def test_relabel_matches_numpy(small_graph, method):
    g = small_graph.to_device()
    frontier = jnp.asarray([5, 17, 42, 99, 0, 0], jnp.int32)
    nbr, mask = sampling.sample_neighbors_reference(
        g.indptr, g.indices, frontier, jnp.arange(6) < 4, jnp.uint32(3), 6)
    out = relabel.relabel_reference(frontier, jnp.int32(4), nbr, mask, 64, 300, method=method)
    nodes, local = np.asarray(out.frontier), np.asarray(out.nbr_local)
    m, ids = np.asarray(mask), np.asarray(nbr)
    expected = [5, 17, 42, 99]
    for v in ids[m]:  # first-occurrence order, row by row
        if v not in expected:
            expected.append(int(v))
    assert int(out.count) == len(expected)
    np.testing.assert_array_equal(nodes[: len(expected)], expected)
    assert not nodes[len(expected):].any()
    np.testing.assert_array_equal(nodes[local][m], ids[m])


def test_relabel_methods_agree_on_random_inputs():
    rs = np.random.default_rng(5)
    for trial in range(5):
        n, c, k = 50, 16, 5
        frontier = jnp.asarray(np.concatenate([rs.permutation(n)[:10], np.zeros(6)]), jnp.int32)
        nbr = jnp.asarray(rs.integers(0, n, (c, k)), jnp.int32)
        mask = jnp.asarray(rs.random((c, k)) < 0.7) & (jnp.arange(c) < 10)[:, None]
        a = relabel.relabel_reference(frontier, jnp.int32(10), nbr, mask, 96, n, method="table")
        b = relabel.relabel_reference(frontier, jnp.int32(10), nbr, mask, 96, n, method="sort")
        for x, y in zip(a, b):
            np.testing.assert_array_equal(np.asarray(x), np.asarray(y), err_msg=f"trial {trial}")


# Under jit: one compile per (config, capacities) rather than every op dispatched eagerly.
_sample_minibatch = jax.jit(sample_minibatch, static_argnames=("config", "capacities"))


def _sample(graph, capacities, fanouts=(4, 3), dedup=True, seeds=None, flat_outer=False):
    seeds = jnp.arange(0, 40, 2, dtype=jnp.int32) if seeds is None else seeds
    cfg = SamplerConfig(fanouts, dedup=dedup, flat_outer=flat_outer)
    return _sample_minibatch(graph, seeds, jnp.arange(seeds.shape[0]) < 17,
                             counter_hash.step_key(0, 0, 5, 0), cfg, capacities)


def test_larger_capacities_give_identical_samples(small_graph):
    g = small_graph.to_device()
    small, large = _sample(g, (128, 256)), _sample(g, (512, 1024))
    counts = np.asarray(small.counts)
    np.testing.assert_array_equal(counts, np.asarray(large.counts))
    assert not bool(small.overflow) and not bool(large.overflow)
    for level, n in enumerate(counts):
        np.testing.assert_array_equal(np.asarray(small.nodes[level])[:n],
                                      np.asarray(large.nodes[level])[:n])
    for level, (a, b) in enumerate(zip(small.blocks, large.blocks)):
        rows = counts[level]
        np.testing.assert_array_equal(np.asarray(a.nbr)[:rows], np.asarray(b.nbr)[:rows])
        np.testing.assert_array_equal(np.asarray(a.mask)[:rows], np.asarray(b.mask)[:rows])


def test_overflow_is_flagged_not_raised(small_graph):
    mb = _sample(small_graph.to_device(), (24, 24))
    assert bool(mb.overflow)
    assert int(mb.counts[1]) > 24


def test_tree_mode_has_exact_sizes_and_same_neighbours(small_graph):
    g = small_graph.to_device()
    tree = _sample(g, (), dedup=False)
    assert [n.shape[0] for n in tree.nodes] == [20, 100, 400]
    dedup = _sample(g, (512, 1024))
    # The seeds' sampled neighbours are the same global ids in both modes.
    tree_ids = np.asarray(tree.nodes[1])[np.asarray(tree.blocks[0].nbr)]
    dedup_ids = np.asarray(dedup.nodes[1])[np.asarray(dedup.blocks[0].nbr)]
    m = np.asarray(tree.blocks[0].mask)
    np.testing.assert_array_equal(m, np.asarray(dedup.blocks[0].mask))
    np.testing.assert_array_equal(tree_ids[m], dedup_ids[m])
    assert not bool(tree.overflow)


def test_flat_outer_level_is_its_slots_in_order(small_graph):
    """With `flat_outer` the last level is the level before it, then every slot's
    global id in slot order (the capacity given for it is ignored); the hops before
    are deduplicated as usual and every hop samples the same neighbours."""
    g = small_graph.to_device()
    flat = _sample(g, (512, 8), flat_outer=True)
    dedup = _sample(g, (512, 1024))
    for a, b in zip(flat.nodes[:2], dedup.nodes[:2]):
        np.testing.assert_array_equal(a, b)
    prev, last, block = np.asarray(flat.nodes[1]), np.asarray(flat.nodes[2]), flat.blocks[1]
    mask = np.asarray(block.mask)
    assert last.shape == (512 * 4,)
    np.testing.assert_array_equal(last[:512], prev)
    np.testing.assert_array_equal(np.asarray(flat.valid[2])[512:], mask.reshape(-1))
    slots = 512 + np.arange(512 * 3).reshape(512, 3)
    np.testing.assert_array_equal(np.asarray(block.nbr), np.where(mask, slots, 0))
    dedup_ids = np.asarray(dedup.nodes[2])[np.asarray(dedup.blocks[1].nbr)]
    np.testing.assert_array_equal(last[slots][mask], dedup_ids[mask])
    assert int(flat.counts[2]) == int(flat.counts[1]) + mask.sum()
    assert not bool(flat.overflow)


def test_isolated_seeds_sample_nothing():
    g = random_graph(60, 200, seed=3, isolated=10).to_device()
    seeds = jnp.arange(50, 60, dtype=jnp.int32)
    mb = sample_minibatch(g, seeds, jnp.ones(10, bool), jnp.uint32(1), SamplerConfig((3,)),
                          (128,))
    assert int(mb.counts[1]) == 10
    assert not np.asarray(mb.blocks[0].mask).any()


def test_second_call_does_not_retrace(small_graph):
    traces = []

    @jax.jit
    def run(key):
        traces.append(1)
        return _sample(small_graph.to_device(), (128, 256)).counts

    run(jnp.uint32(1))
    run(jnp.uint32(2))
    assert len(traces) == 1


@pytest.mark.parametrize("fanouts, match", [
    ((0,), "fanout of hop 0 must be positive"),
    ((5, -3), "fanout of hop 1 must be positive"),
    ((), "between 1 and 8 hops"),
    ((2,) * 9, "between 1 and 8 hops"),
])
def test_bad_fanouts(fanouts, match):
    with pytest.raises(ValueError, match=match):
        SamplerConfig(fanouts)


def test_flat_outer_needs_deduplicated_levels():
    with pytest.raises(ValueError, match="dedup=False .tree mode. lays out every hop so"):
        SamplerConfig((4, 3), dedup=False, flat_outer=True)


def test_unresolved_full_fanout_is_rejected(small_graph):
    with pytest.raises(ValueError, match="unresolved fanouts"):
        sample_minibatch(small_graph.to_device(), jnp.zeros(4, jnp.int32), jnp.ones(4, bool),
                         jnp.uint32(0), SamplerConfig((-1,)), (128,))


def test_full_fanout_resolves_to_the_whole_neighbourhood(small_graph):
    cfg = SamplerConfig((-1,)).resolve(small_graph.max_degree())
    assert cfg.fanouts == (small_graph.max_degree(),) and cfg.all_neighbors == (True,)
    assert SamplerConfig((-1,)).resolve(small_graph) == cfg  # the graph, as typed configs take
    g = small_graph.to_device()
    seeds = jnp.arange(30, dtype=jnp.int32)
    mb = sample_minibatch(g, seeds, jnp.ones(30, bool), jnp.uint32(0), cfg, (512,))
    rows = _rows(small_graph)
    got = np.asarray(mb.nodes[1])[np.asarray(mb.blocks[0].nbr)]
    for v in range(30):
        np.testing.assert_array_equal(got[v][np.asarray(mb.blocks[0].mask)[v]], rows[v])
