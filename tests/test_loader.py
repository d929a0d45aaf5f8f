"""The public loader over the device sampler, and keys of every kind."""

from __future__ import annotations

import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import random_graph

import zerognn_jax as zg
from zerognn_jax._src.ops.aggregate import weighted_sum_reference


@pytest.fixture(scope="module")
def graph():
    return random_graph(300, 1500, seed=3, isolated=4)


def _seeds_of(batch):
    mb = batch.minibatch
    return np.asarray(mb.nodes[0])[np.asarray(mb.valid[0])]


@pytest.mark.parametrize("make_key", [lambda: jax.random.key(0), lambda: jax.random.PRNGKey(0),
                                      lambda: 0])
def test_loader_covers_every_node_once_per_epoch(graph, make_key):
    nodes = np.arange(0, 300, 2)  # 150 seeds, batches of 64: the last one is padded
    loader = zg.NeighborLoader(graph, nodes, fanouts=(4, 3), batch_size=64, key=make_key(),
                               sample_ahead=1)
    assert len(loader) == 3
    first = list(loader)
    seen = np.concatenate([_seeds_of(b) for b in first])
    assert sorted(seen.tolist()) == nodes.tolist()
    assert [b.step for b in first] == [0, 1, 2] and {b.epoch for b in first} == {0}
    second = list(loader)  # the next epoch: another order
    assert second[0].epoch == 1
    assert not np.array_equal(_seeds_of(first[0]), _seeds_of(second[0]))
    for b in first:  # every sampled slot is a real edge of the graph
        mb = b.minibatch
        src = np.asarray(mb.nodes[0])
        nbr = np.asarray(mb.nodes[1])[np.asarray(mb.blocks[0].nbr)]
        for row, (u, ok) in enumerate(zip(src, np.asarray(mb.valid[0]))):
            if ok:
                mask = np.asarray(mb.blocks[0].mask)[row]
                neighbours = graph.indices[graph.indptr[u]:graph.indptr[u + 1]]
                assert np.isin(nbr[row][mask], neighbours).all()


def test_typed_and_legacy_keys_give_the_same_batches(graph):
    nodes = np.arange(100)
    typed = zg.NeighborLoader(graph, nodes, fanouts=(3,), batch_size=32, key=jax.random.key(7),
                              sample_ahead=1)
    legacy = zg.NeighborLoader(graph, nodes, fanouts=(3,), batch_size=32,
                               key=jax.random.PRNGKey(7), sample_ahead=1)
    for a, b in zip(typed.epoch(2), legacy.epoch(2), strict=True):
        for x, y in zip(jax.tree_util.tree_leaves(a.minibatch),
                        jax.tree_util.tree_leaves(b.minibatch)):
            np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


def test_batches_sampled_ahead_are_those_sampled_one_at_a_time(graph):
    """Five batches in calls of two (the last call repeats step 4), seeds in order of
    degree, from an envelope that the first call fits and the second overflows: the
    same nodes as calls of one; at the grown envelope, the same arrays bit for bit
    (blocks, features, dropout keys)."""
    nodes = np.argsort(np.diff(np.asarray(graph.indptr)), kind="stable")[::3]
    features = np.random.default_rng(0).standard_normal((graph.num_nodes, 4)).astype(
        np.float32)
    kw = dict(fanouts=(4, 3), batch_size=20, key=jax.random.key(1), features=features,
              shuffle=False)
    large = zg.NeighborLoader(graph, nodes, envelope="conservative", sample_ahead=1, **kw)
    want = list(large.epoch(0))
    first = np.max([np.asarray(b.minibatch.counts) for b in want[:2]], 0)
    envelope = zg.Envelope(20, tuple(int(c) for c in first[1:]))
    ahead = zg.NeighborLoader(graph, nodes, envelope=envelope, sample_ahead=2, **kw)
    batches = ahead.epoch(0)
    got = [next(batches), next(batches)]
    assert ahead.envelope == envelope  # the first call fit
    got += list(batches)
    assert ahead.envelope.capacities[1] > envelope.capacities[1]  # a later one grew it
    assert [b.step for b in got] == [0, 1, 2, 3, 4]
    for a, b in zip(got, want, strict=True):
        np.testing.assert_array_equal(a.minibatch.counts, b.minibatch.counts)
        for level, count in enumerate(np.asarray(a.minibatch.counts)):
            np.testing.assert_array_equal(np.asarray(a.minibatch.nodes[level])[:count],
                                          np.asarray(b.minibatch.nodes[level])[:count])
    alone = zg.NeighborLoader(graph, nodes, envelope=ahead.envelope, sample_ahead=1, **kw)
    for a, b in zip(ahead.epoch(1), alone.epoch(1), strict=True):
        for x, y in zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b)):
            np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
    assert ahead.envelope == alone.envelope


def test_an_epoch_of_no_full_batch_samples_nothing_and_says_so(graph):
    with pytest.warns(UserWarning, match=r"^drop_last leaves out the last batch when it is "
                                         r"not full, and the 5 items make no full batch of "
                                         r"8: the loader yields none$") as caught:
        loader = zg.NeighborLoader(graph, np.arange(5), fanouts=(2,), batch_size=8, key=0,
                                   drop_last=True, envelope="conservative")
    assert caught[0].filename == __file__  # the user's line
    assert len(loader) == 0 and list(loader) == [] and not loader._programs


def test_sample_minibatch_takes_jax_keys(graph):
    g = graph.to_device()
    seeds, valid = jnp.arange(20, dtype=jnp.int32), jnp.ones(20, bool)
    cfg = zg.SamplerConfig((3,))
    word = zg.counter_key(jax.random.key(4))
    out = [zg.sample_minibatch(g, seeds, valid, k, cfg, (128,))
           for k in (jax.random.key(4), jax.random.PRNGKey(4), word)]
    for other in out[1:]:
        np.testing.assert_array_equal(np.asarray(out[0].nodes[1]), np.asarray(other.nodes[1]))
    with pytest.raises(ValueError, match="expected a jax.random key"):
        zg.counter_key(jnp.zeros((3,), jnp.float32))


@pytest.mark.parametrize("kwargs, match", [
    ({"nodes": np.array([], np.int32)}, "non-empty 1-D integer array"),
    ({"nodes": []}, r"^nodes must be a non-empty 1-D integer array, got none \(an empty "
                    r"array\)$"),  # it said float64[0], NumPy's reading of []
    ({"nodes": np.arange(300) < 40}, r"^nodes must be a non-empty 1-D integer array, got "
                                     r"bool\[300\]; a boolean mask\? pass "
                                     r"np\.flatnonzero\(mask\)$"),
    ({"nodes": np.array([0, 300])}, r"nodes must lie in \[0, 300\)"),
    ({"batch_size": 0}, "batch_size must be an integer >= 1, got 0"),
    ({"batch_size": 2.5}, "batch_size must be an integer >= 1, got 2.5"),
    ({"batch_size": True}, "batch_size must be an integer >= 1, got True"),
    ({"sample_ahead": 0}, "sample_ahead must be an integer >= 1, got 0"),
    ({"sample_ahead": 2.0}, "sample_ahead must be an integer >= 1, got 2.0"),
    ({"fanouts": (2.5,)}, "fanouts must be whole numbers"),
    ({"features": np.ones(300, np.float32)}, r"features must be 2-D \[num_nodes, d\], got "
                                             r"shape \(300,\)"),
    ({"features": np.ones((299, 4), np.float32)}, r"features must have one row per node "
                                                  r"\(300\), got shape \(299, 4\)"),
    ({"targets": 3}, "targets must be an array"),
    # JAX's own messages named neither the argument nor the value
    ({"key": None}, r"expected a jax.random key, .* got None"),
    ({"key": "abc"}, r"expected a jax.random key, .* got 'abc'"),
    ({"key": jax.random.split(jax.random.key(0), 2)},
     r"^expected one jax.random key, got a batch of them, shape \[2\]"),
    # taken as an overflow: level 0 grew to twice the batch
    ({"envelope": zg.Envelope(2, (8,))}, r"^the envelope's level 0 holds 2 seeds, this "
                                         r"loader's batches 4: give an envelope made for "
                                         r"batch_size 4"),
])
def test_loader_rejects_bad_input(graph, kwargs, match):
    args = dict(nodes=np.arange(10), fanouts=(2,), batch_size=4, key=0) | kwargs
    with pytest.raises(ValueError, match=match):
        zg.NeighborLoader(graph, **args)


def test_a_loaders_kernels_reach_its_views(graph):
    """Sampling and gathers ran the loader's kernels, its batches' views XLA's (a user
    trial: a weighted_sum of their own was never called)."""
    calls = []

    def mine(h_src, nbr, weights):
        calls.append(h_src.shape)
        return weighted_sum_reference(h_src, nbr, weights)

    kernels = zg.Kernels(weighted_sum=mine)
    for loader in (zg.NeighborLoader(graph, np.arange(40), fanouts=(3, 2), batch_size=16,
                                     key=0, kernels=kernels),
                   zg.LinkNeighborLoader(graph, np.stack(zg.to_edge_list(graph), 1)[:40],
                                         fanouts=(3, 2), batch_size=8,
                                         key=0, kernels=kernels)):
        batch = next(iter(loader))
        view = batch.views[0]
        assert view.kernels == kernels and batch.inference_views()[0].kernels == kernels
        view.weighted_sum(jnp.ones((view.nbr.shape[0] * 4, 1, 2)), zg.mean_weights(view))
    assert len(calls) == 2


def test_direct_ops_take_kernel_specs_and_check_what_they_are_given(graph):
    """A spec string was an AttributeError ('str' object has no attribute 'sample'); a
    seed mask that is no prefix gave wrong levels; the XLA aggregation broadcast rows
    without a head axis into a wrongly shaped result, where the Pallas one refused it."""
    cfg = zg.SamplerConfig((3,)).resolve(graph)
    g = graph.to_device()
    mb = zg.sample_minibatch(g, jnp.arange(4), jnp.ones(4, bool), 0, cfg, (16,), "xla")
    view = zg.views_for(mb, "xla")[0]
    with pytest.raises(ValueError, match=r"^seed_valid must mark a prefix of the seeds "
                                         r"\(padding at the end\); seed 0 is marked padding"):
        zg.sample_minibatch(g, jnp.arange(4), jnp.array([False, True, False, True]), 0, cfg,
                            (16,))
    h = jnp.ones((16, 5))
    tree = zg.views_for(mb, "xla", positional=(True,))[0]  # read by position, no op call
    for v in (view, tree):
        with pytest.raises(ValueError, match=r"^weighted_sum needs h_src \[S, H, F\] and "
                                             r"weights \[4, 3\] \+ \[H\]; got h_src "
                                             r"\[16, 5\]"):
            v.weighted_sum(h, zg.mean_weights(v))
        with pytest.raises(ValueError, match=r"^max needs h_src \[S, d\], got \[16, 1, 5\]"):
            v.max(h[:, None])
    table = jnp.zeros((8, 2))
    step = lambda k: zg.row_adam_update(table, zg.row_adam_init(table), jnp.arange(3),
                                        jnp.ones((3, 2)), lr=0.1, kernels=k)[0]
    np.testing.assert_array_equal(step("xla"), step(zg.Kernels()))
    assert float(step("xla")[0, 0]) != 0.0


def test_link_loaders_hint_at_pyg_layout_for_transposed_edges(graph):
    """PyG's [2, E] edge_label_index, given as it is: the transpose named."""
    with pytest.raises(ValueError, match=r"got int64\[2, 3\] \(PyG's \[2, E\] "
                                         r"edge_index\? this takes \[E, 2\]"):
        zg.LinkNeighborLoader(graph, np.array([[0, 1, 2], [1, 2, 3]]), fanouts=(2,),
                              batch_size=4, key=0)


def test_link_loaders_refuse_a_step_past_int32(graph):
    """Negatives x batch past int32 node ids: one line before calibrating (an
    OverflowError's traceback from the frontier before)."""
    message = (r"^num_negatives 5000000 with batch_size 512 gives a step 2,560,001,024 node "
               r"ids \(each pair's ends, negatives included\), past int32's 2\*\*31 - 1")
    with pytest.raises(ValueError, match=message):
        zg.LinkNeighborLoader(graph, np.array([[0, 1]]), fanouts=(2,), batch_size=512, key=0,
                              num_negatives=5_000_000)
    typed = zg.make_hetero_dataset("h", {"a": 3, "b": 2}, {("a", "ab", "b"): ([0, 1, 2],
                                                                             [0, 1, 1])},
                                   target_type="b", labels=[0, 1], train_idx=[0],
                                   val_idx=[1], test_idx=[]).graph
    with pytest.raises(ValueError, match=message):
        zg.HeteroLinkNeighborLoader(typed, "ab", np.array([[0, 1]]), fanouts=(2,),
                                    batch_size=512, key=0, num_negatives=5_000_000)


def test_loaders_name_what_they_got_where_they_take_a_graph(graph):
    """A Dataset was read as a graph up to `max_degree` (an AttributeError naming
    neither); the message says what to pass."""
    n = graph.num_nodes
    ds = zg.make_dataset("d", graph.indptr, graph.indices, np.ones((n, 2), np.float32),
                         np.zeros(n, np.int64), [0, 1], [2], [3], 1)
    fix = r"pass dataset\.graph \(and features=dataset\.features for batch\.x\)$"
    with pytest.raises(TypeError, match=rf"^NeighborLoader takes a CSRGraph as graph, got "
                                        rf"Dataset: {fix}"):
        zg.NeighborLoader(ds, np.arange(10), fanouts=(2,), batch_size=4, key=0)
    with pytest.raises(TypeError, match=rf"^LinkNeighborLoader takes a CSRGraph as graph, "
                                        rf"got Dataset: {fix}"):
        zg.LinkNeighborLoader(ds, np.array([[0, 1]]), fanouts=(2,), batch_size=4, key=0)
    with pytest.raises(TypeError, match=r"^NeighborLoader takes a CSRGraph as graph, got "
                                        r"tuple: pass a CSRGraph, e\.g\. "
                                        r"zg\.from_edge_index\(edge_index, num_nodes=N\)$"):
        zg.NeighborLoader((graph.indptr, graph.indices), np.arange(10), fanouts=(2,),
                          batch_size=4, key=0)
    with pytest.raises(TypeError, match=r"^HeteroNeighborLoader takes a HeteroGraph as graph, "
                                        r"got Dataset: a Dataset's graph is sampled by "
                                        r"zg\.NeighborLoader$"):
        zg.HeteroNeighborLoader(ds, ("a", np.arange(10)), fanouts=(2,), batch_size=4, key=0)


def test_an_epoch_is_a_whole_number(graph):
    loader = zg.NeighborLoader(graph, np.arange(10), fanouts=(2,), batch_size=4, key=0)
    for epoch in (1.5, -1):  # both were taken as given
        with pytest.raises(ValueError, match=f"^epoch must be an integer >= 0, got {epoch}$"):
            next(loader.epoch(epoch))
    assert len(list(loader.epoch(np.int64(1)))) == 3


def test_loader_takes_lists_and_a_bare_fanout(graph):
    loader = zg.NeighborLoader(graph, np.arange(10), fanouts=2, batch_size=4, key=0,
                               envelope="conservative", targets=[0] * graph.num_nodes)
    batch = next(iter(loader))
    assert loader.sampler.fanouts == (2,) and np.asarray(batch.y).shape == (4,)


def test_direct_sampling_calls_check_what_they_are_given(graph):
    g = graph.to_device()
    cfg = zg.SamplerConfig((3, 2)).resolve(graph.max_degree())
    seeds, valid = jnp.array([0, 300], jnp.int32), jnp.array([True, True])
    with pytest.raises(ValueError, match=r"seeds must lie in \[0, 300\), found \[0, 300\]"):
        zg.sample_minibatch(g, seeds, valid, 0, cfg, (64, 128))
    zg.sample_minibatch(g, seeds, jnp.array([True, False]), 0, cfg, (64, 128))  # padding
    with pytest.raises(ValueError, match=r"capacities must give one level per hop \(2\), "
                                         r"got \(64,\)"):
        zg.sample_minibatch(g, seeds[:1], valid[:1], 0, cfg, (64,))
    with pytest.raises(ValueError, match="the envelope has 1 levels past the seeds, the "
                                         "sampler 2 hops"):
        cfg.fit_envelope(zg.Envelope(2, (8,)))
    with pytest.raises(ValueError, match="capacities and batch_size must be integers, got 4.5"):
        zg.Envelope(4.5, (64,))
    with pytest.raises(ValueError, match=r"items must be node ids in \[0, 300\), found "
                                         r"\[0, 399\]"):
        zg.calibrate(g, np.array([0, 399]), 2, cfg)
    with pytest.raises(ValueError, match="epochs must be an integer >= 1, got 0"):
        zg.calibrate(g, np.arange(4), 2, cfg, epochs=0)


def test_from_edge_index_follows_pyg_direction():
    """A directed toy graph 0 -> 1 -> 2, 0 -> 2 in PyG's edge_index: with flow
    source_to_target node 2 aggregates from 0 and 1, node 0 from nobody."""
    edge_index = np.array([[0, 1, 0], [1, 2, 2]])
    g = zg.from_edge_index(edge_index, 3)
    rows = {v: sorted(g.indices[g.indptr[v]:g.indptr[v + 1]].tolist()) for v in range(3)}
    assert rows == {0: [], 1: [0], 2: [0, 1]}
    back = zg.from_edge_index(edge_index, 3, flow="target_to_source")
    rows = {v: sorted(back.indices[back.indptr[v]:back.indptr[v + 1]].tolist())
            for v in range(3)}
    assert rows == {0: [1, 2], 1: [2], 2: []}
    with pytest.raises(ValueError, match="flow must be"):
        zg.from_edge_index(edge_index, flow="both")
    with pytest.raises(ValueError, match=r"shape \[2, E\], got \[3, 1\]"):
        zg.from_edge_index(np.zeros((3, 1), np.int64))


@pytest.mark.parametrize(("edge_index", "kwargs", "error", "match"), [
    # PyG's source row is edge_index[0], whichever way messages flow
    ([[0, -1], [1, 0]], {}, ValueError,
     r"^edge_index\[0\] has a negative node id -1 at position 1$"),
    ([[0, 1], [1, -3]], dict(flow="target_to_source"), ValueError,
     r"^edge_index\[1\] has a negative node id -3 at position 1$"),
    ([[0, 1, 2], [1, 2, 6]], dict(num_nodes=6), ValueError,
     r"^edge_index\[1\] has node id 6 at position 2, out of range for num_nodes=6; pass "
     r"num_nodes=7 or more$"),
    ([[0, 7], [1, 2]], dict(num_nodes=6, flow="target_to_source"), ValueError,
     r"^edge_index\[0\] has node id 7 at position 1, out of range for num_nodes=6; pass "
     r"num_nodes=8 or more$"),
    ([[0, 3], [1, 1]], dict(num_nodes=2, num_columns=3), ValueError,
     r"^edge_index\[0\] has node id 3 at position 1, out of range for num_columns=3; pass "
     r"num_columns=4 or more$"),
    ([[0, 1], [1.0, 2.0]], dict(num_nodes=3), TypeError,
     r"^edge_index\[0\] must have an integer dtype, got float64 \(cast explicitly"),
])
def test_from_edge_index_names_the_row_of_a_bad_id_as_given(edge_index, kwargs, error,
                                                             match):
    """`from_edge_list` names its `src` (the CSR row, PyG's edge_index[1]) and `dst`:
    an id of edge_index[0] was reported as dst's."""
    with pytest.raises(error, match=match):
        zg.from_edge_index(np.array(edge_index), **kwargs)


def test_the_feature_table_is_an_argument_not_a_constant(graph):
    """The batch program takes the feature table as an argument: closed over, it would be
    compiled in as a constant (its bytes in the program's text, and a copy of it)."""
    from zerognn_jax._src.sampling.seeds import ordered_items

    # 600 KB: wider than the text of the program, which samples sample_ahead batches
    features = np.random.default_rng(0).standard_normal((graph.num_nodes, 512)).astype(
        np.float32)
    loader = zg.NeighborLoader(graph, np.arange(40), fanouts=(3,), batch_size=8,
                               key=jax.random.key(0), features=features, envelope="conservative")
    batch = next(iter(loader))
    np.testing.assert_array_equal(np.asarray(batch.x)[np.asarray(batch.minibatch.valid[-1])],
                                  features[np.asarray(batch.minibatch.nodes[-1])[
                                      np.asarray(batch.minibatch.valid[-1])]])
    text = loader._program(loader.envelope).lower(
        loader.graph, (loader.features, loader.targets), ordered_items(loader.items, 8),
        jnp.int32(0), jnp.zeros(loader.sample_ahead, jnp.int32)).as_text()
    assert len(text) < features.nbytes


def test_repeated_seeds_grow_past_the_node_count():
    """Seeds given twice stay twice in the seed level, so a level may hold more rows
    than the graph has nodes: an overflow then grows the level to its count (held to
    the node count, growth would never end)."""
    n = 100
    src, dst = np.nonzero(~np.eye(n, dtype=bool))
    graph = zg.from_edge_list(src, dst, num_nodes=n)
    loader = zg.NeighborLoader(graph, np.arange(64) % 8, fanouts=(30,), batch_size=64, key=0,
                               envelope=zg.Envelope(64, (104,)),
                               policy=zg.EnvelopePolicy(multiple=8), sample_ahead=1)
    counts = np.asarray(next(iter(loader)).minibatch.counts)
    assert counts[1] > n and loader.envelope.capacities[0] >= counts[1]


_SAMPLES_DIGEST = r"""
import hashlib
import jax
import numpy as np
import zerognn_jax as zg
from zerognn_jax._src.data.synthetic import products_like

graph = products_like(0.002, seed=0).graph
digest = hashlib.sha256()
loaders = [zg.NeighborLoader(graph, np.arange(0, 600, 2), fanouts=(4, 3), batch_size=64,
                             key=0, sampler=s, sample_ahead=4) for s in ("uniform", "labor")]
src, dst = np.asarray(graph.indptr), np.asarray(graph.indices)
edges = np.stack([np.repeat(np.arange(src.size - 1), np.diff(src)), dst], 1)[:400]
loaders.append(zg.LinkNeighborLoader(graph, edges, fanouts=(4, 3), batch_size=64, key=0,
                                     sample_ahead=4))
for loader in loaders:
    for batch in loader:
        for leaf in jax.tree_util.tree_leaves(batch.minibatch):
            digest.update(np.asarray(leaf).tobytes())
print(digest.hexdigest())
"""


@pytest.mark.skipif(jax.default_backend() != "gpu", reason="a flag of XLA:GPU's")
def test_samples_are_the_same_under_xla_gpus_determinism_flag():
    """`--xla_gpu_exclude_nondeterministic_ops=true` makes XLA:GPU's scatters
    deterministic by flattening their indices; under `vmap` (steps sampled together) an
    index past the end of one batch's row then wrote the next batch's first entry, and
    relabelled frontiers, LABOR's packed rows and the link mask came out wrong (an H200,
    2026-12-01). The samplers now write no index out of range (ops/relabel.py, SPARE)."""
    digests = []
    inherited = " ".join(f for f in os.environ.get("XLA_FLAGS", "").split()
                         if "exclude_nondeterministic_ops" not in f)  # the baseline's off
    for flags in ("", "--xla_gpu_exclude_nondeterministic_ops=true"):
        env = {**os.environ, "XLA_FLAGS": f"{inherited} {flags}".strip()}  # XLA takes no " "
        done = subprocess.run([sys.executable, "-c", _SAMPLES_DIGEST], env=env,
                              capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, done.stderr[-3000:]
        digests.append(done.stdout.strip())
    assert digests[0] == digests[1]
