"""The host-mediated baseline: same subgraphs and training as the scan engine."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from conftest import random_graph

import zerognn_jax as zg
from zerognn_jax import (
    DeviceData,
    Envelope,
    EnvelopePolicy,
    HostEngine,
    SamplerConfig,
    ScanEngine,
    StepProgram,
    TrainConfig,
    init_state,
    make_dataset,
    make_engine,
    make_model,
    sample_minibatch,
    train,
)
from zerognn_jax._src.training import host as host_engine

TRAIN_IDX = np.arange(100)  # 4 steps of 32: the last one is cut short
ENVELOPE = Envelope(32, (256, 512))


def _data(num_nodes=300, classes=4, seed=0, signal=1.0):
    graph = random_graph(num_nodes, 1800, seed=seed)
    rs = np.random.default_rng(seed)
    labels = rs.integers(0, classes, num_nodes).astype(np.int32)
    feats = signal * np.eye(classes, dtype=np.float32)[labels] + rs.normal(
        size=(num_nodes, classes))
    feats = np.concatenate([feats, rs.normal(size=(num_nodes, 4))], 1).astype(np.float32)
    return graph, feats, labels


@pytest.fixture(scope="module")
def problem():
    graph, feats, labels = _data()
    data = DeviceData(graph.to_device(), jnp.asarray(feats), jnp.asarray(labels))
    net = make_model("sage", hidden=16, num_layers=2, num_classes=4, dropout=0.2)
    program = StepProgram(net, optax.adam(1e-2), SamplerConfig((4, 3)), 32, seed=1)
    return program, data, init_state(program, data, ENVELOPE, TRAIN_IDX)


def _copy(state):
    return jax.tree_util.tree_map(jnp.copy, state)


@pytest.mark.parametrize("mode, counts, levels, want", [
    ("exact", (32, 200, 450), (32, 256, 512), (32, 200, 450)),
    ("exact", (7, 0, 0), (32, 256, 512), (7, 1, 1)),
    ("bucketed", (32, 200, 450), (32, 256, 512), (32, 256, 512)),
    ("bucketed", (20, 129, 300), (32, 256, 512), (32, 256, 512)),
    ("bucketed", (32, 250, 390), (32, 256, 400), (32, 256, 400)),  # capped at capacity
])
def test_level_sizes(mode, counts, levels, want):
    assert host_engine.level_sizes(counts, levels, mode) == want


def test_level_sizes_rejects_unknown_mode():
    with pytest.raises(ValueError, match="mode must be one of"):
        host_engine.level_sizes((1, 2), (4, 8), "tight")


def test_cut_batch_gives_the_same_logits(problem):
    program, data, state = problem
    seeds = jnp.arange(32, dtype=jnp.int32)
    valid = seeds < 27
    mb = jax.jit(sample_minibatch, static_argnums=(4, 5))(
        data.graph, seeds, valid, jnp.uint32(5), program.sampler, ENVELOPE.capacities)
    variables = {"params": state.params}
    logits = jax.jit(lambda mb: program.apply_model(variables, data, mb, train=False)[0])
    full = logits(mb)
    counts = tuple(int(c) for c in mb.counts)
    for mode in host_engine.MODES:
        sizes = host_engine.level_sizes(counts, ENVELOPE.levels, mode)
        cut = logits(host_engine.slice_levels(mb, sizes))
        assert cut.shape[0] == sizes[0]
        np.testing.assert_allclose(cut[:27], full[:27], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name", ["host-exact", "host-bucketed"])
def test_host_engine_trains_like_the_scan_engine(problem, name):
    program, data, state = problem
    host = make_engine(name, program)
    scan = ScanEngine(program).run_epoch(_copy(state), data, TRAIN_IDX, 1, ENVELOPE)
    res = host.run_epoch(_copy(state), data, TRAIN_IDX, 1, ENVELOPE)
    # Same seeds and keys: the same subgraphs, step for step, and the same updates.
    assert (res.steps, res.max_counts, res.sampled_edges) == (
        scan.steps, scan.max_counts, scan.sampled_edges)
    assert res.loss == pytest.approx(scan.loss, rel=1e-5)
    jax.tree_util.tree_map(lambda a, b: np.testing.assert_allclose(a, b, atol=1e-5),
                           scan.state.params, res.state.params)
    # Exact sizes change from step to step; buckets repeat.
    assert host.num_programs >= res.steps if name == "host-exact" else host.num_programs <= 3
    assert host.compile_seconds > 0


def test_host_engine_grows_a_small_envelope(problem):
    program, data, state = problem
    host = HostEngine(program, "bucketed", max_steps=1, policy=EnvelopePolicy(multiple=8))
    small = host.run_epoch(_copy(state), data, TRAIN_IDX, 0, Envelope(32, (64, 160)))
    large = host.run_epoch(_copy(state), data, TRAIN_IDX, 0, ENVELOPE)
    assert small.overflows >= 1 and large.overflows == 0 and small.steps == 1
    assert small.envelope.capacities != (64, 160)
    assert (small.max_counts, small.sampled_edges) == (large.max_counts, large.sampled_edges)
    assert small.loss == pytest.approx(large.loss, rel=1e-5)


def test_a_state_an_epoch_consumed_is_refused_by_name(problem):
    """Both engines donate the state they are given; passing it again raised JAX's
    "Array has been deleted", which named neither the call nor the fix."""
    program, data, state = problem
    host = HostEngine(program, "bucketed", max_steps=1, policy=EnvelopePolicy(multiple=8))
    given = _copy(state)
    host.run_epoch(given, data, TRAIN_IDX, 0, ENVELOPE)
    with pytest.raises(ValueError, match=r"consumed by an earlier run_epoch .* pass that "
                                         r"call's result\.state"):
        host.run_epoch(given, data, TRAIN_IDX, 1, ENVELOPE)
    scan = ScanEngine(program)
    given = _copy(state)
    scan.run_epoch(given, data, TRAIN_IDX, 0, ENVELOPE)
    with pytest.raises(ValueError, match="consumed by an earlier run_epoch"):
        scan.run_epoch(given, data, TRAIN_IDX, 1, ENVELOPE)


def test_a_feature_table_short_of_the_graphs_nodes_is_refused(problem):
    """A table of fewer rows than nodes trained without an error: the gather reads the
    missing rows as zeros. Both engines refuse it before any step (a host table too)."""
    program, data, state = problem
    table = np.asarray(data.features)[:-10]
    for short in (data._replace(features=jnp.asarray(table)),
                  data._replace(features=zg.HostTable(table.copy()))):
        for engine in (HostEngine(program, "bucketed", max_steps=1), ScanEngine(program)):
            with pytest.raises(ValueError, match=r"data\.features must have one row per "
                                                 r"node of data\.graph \(300\), got shape "
                                                 r"\(290, 8\)"):
                engine.run_epoch(state, short, TRAIN_IDX, 0, ENVELOPE)
    assert not any(leaf.is_deleted() for leaf in jax.tree_util.tree_leaves(state))


def test_host_engine_refuses_positional_levels(problem):
    program = problem[0]
    tree = StepProgram(program.model, program.tx, SamplerConfig((4, 3), dedup=False), 32, 1)
    with pytest.raises(ValueError, match="every hop deduplicated"):
        HostEngine(tree)
    flat = StepProgram(program.model, program.tx, SamplerConfig((4, 3), flat_outer=True), 32, 1)
    with pytest.raises(ValueError, match="slot order"):
        HostEngine(flat)
    with pytest.raises(ValueError, match="drop flat_outer and keep dedup"):
        TrainConfig(engine="host-exact", flat_outer=True)
    with pytest.raises(ValueError, match="unknown engine"):
        make_engine("host", program)


def test_train_runs_the_host_engine():
    graph, feats, labels = _data(seed=2, signal=3.0)
    dataset = make_dataset("toy", graph.indptr, graph.indices, feats, labels, TRAIN_IDX,
                           np.arange(150, 200), np.arange(200, 300), 4)
    cfg = TrainConfig(hidden=16, layers=2, fanouts=(4, 3), batch_size=32, epochs=3,
                      lr=3e-2, dropout=0.1, engine="host-bucketed", eval_mode="full",
                      progress=False)
    summary = train(cfg, dataset).summary
    assert summary["engine"] == "host-bucketed" and summary["compile_seconds"] > 0
    # Chance is 0.25; the features alone separate the classes well.
    assert summary["test_acc"] > 0.7
