"""The scan engine: overflow recovery, envelope independence, no recompiles, learning."""

from __future__ import annotations

import dataclasses
import types

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from conftest import random_graph

from zerognn_jax import (
    DeviceData,
    Envelope,
    EnvelopePolicy,
    EpochResult,
    HostTable,
    SamplerConfig,
    ScanEngine,
    StepProgram,
    init_state,
    make_model,
)
from zerognn_jax._src.training.embeddings import NodeEmbedding
from zerognn_jax._src.training.scan import chunk_scalars


def _problem(num_nodes=400, classes=4, seed=0):
    graph = random_graph(num_nodes, 2400, seed=seed)
    rs = np.random.default_rng(seed)
    labels = rs.integers(0, classes, num_nodes).astype(np.int32)
    feats = np.eye(classes, dtype=np.float32)[labels] + rs.normal(size=(num_nodes, classes))
    feats = np.concatenate([feats, rs.normal(size=(num_nodes, 8))], 1).astype(np.float32)
    return DeviceData(graph.to_device(), jnp.asarray(feats), jnp.asarray(labels))


def _program(batch_size=32, fanouts=(5, 3), model="sage", dropout=0.1):
    net = make_model(model, hidden=16, num_layers=len(fanouts), num_classes=4, dropout=dropout)
    return StepProgram(net, optax.adam(1e-2), SamplerConfig(fanouts), batch_size, seed=3)


def _train(data, env, epochs=2, program=None, chunk_steps=0):
    train_idx = np.arange(200)
    program = program or _program()
    state = init_state(program, data, Envelope(32, (512, 512)), train_idx)
    engine = ScanEngine(program, chunk_steps, EnvelopePolicy(multiple=8))
    results = []
    for epoch in range(epochs):
        res = engine.run_epoch(state, data, train_idx, epoch, env)
        state, env = res.state, res.envelope
        results.append(res)
    return engine, results


@pytest.fixture(scope="module")
def large_run():
    """Two epochs of the default problem and program, in chunks of 3 steps, under an
    envelope that never overflows: the reference both tiny-envelope runs are held to,
    trained once (the tests read its results, they do not modify them)."""
    return _train(_problem(), Envelope(32, (512, 512)), chunk_steps=3)[1]


@pytest.fixture(scope="module")
def device_run():
    """Three epochs of the default problem and program, one chunk an epoch, under an
    envelope that never overflows: the engine whose compiled programs one test counts,
    and the one-by-one sampling another test's grouped host reads are held to (an
    engine compiles its own programs: sharing the run spares a compile)."""
    return _train(_problem(), Envelope(32, (512, 512)), epochs=3)


def test_tiny_envelope_recovers_and_matches_a_large_one(large_run):
    data = _problem()
    _, tiny = _train(data, Envelope(32, (40, 40)), chunk_steps=3)
    large = large_run
    assert tiny[0].overflows >= 1 and sum(r.overflows for r in large) == 0
    assert tiny[-1].envelope.capacities[0] > 40
    for a, b in zip(tiny, large):
        # Same steps, same sampled subgraphs, same losses: no step lost or repeated.
        assert (a.steps, a.max_counts, a.sampled_edges) == (b.steps, b.max_counts,
                                                            b.sampled_edges)
        assert a.loss == pytest.approx(b.loss, rel=1e-5)
    # Parameters agree to float32 rounding: XLA's matmul transposes accumulate over the
    # padded rows in an order that depends on the capacity, so bits may differ.
    for x, y in zip(jax.tree_util.tree_leaves(tiny[-1].state.params),
                    jax.tree_util.tree_leaves(large[-1].state.params)):
        np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=2e-5, atol=1e-6)


def test_tiny_envelope_recovery_writes_no_embedding_row_twice():
    """A node embedding under overflow and replay: the table and its lazy Adam state
    end as with an envelope that never overflows (a dropped step writes no row)."""
    data = _problem()
    program = dataclasses.replace(_program(), embedding=NodeEmbedding(4, 0.05))
    _, tiny = _train(data, Envelope(32, (40, 40)), epochs=1, program=program, chunk_steps=3)
    _, large = _train(data, Envelope(32, (512, 512)), epochs=1, program=program,
                      chunk_steps=3)
    assert tiny[0].overflows >= 1
    a, b = tiny[0].state, large[0].state
    assert int(a.embedding_opt.count) == int(b.embedding_opt.count) == tiny[0].steps
    for x, y in ((a.embedding, b.embedding), (a.embedding_opt.nu, b.embedding_opt.nu)):
        np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=2e-5, atol=1e-6)


def test_overflowing_step_applies_no_update():
    data = _problem()
    program = _program()
    env = Envelope(32, (40, 40))
    state = init_state(program, data, Envelope(32, (512, 512)), np.arange(200))
    before = jax.tree_util.tree_map(np.asarray, state.params)
    perm = jnp.arange(224, dtype=jnp.int32)
    args = (state, data, perm, chunk_scalars(0, 0, 7, program.seed))  # epoch, step 0, 7 steps
    out, metrics = ScanEngine(program).chunk_program(env, 7, args)(*args)
    assert bool(out.overflowed) and int(out.failed_step) == 0
    assert not np.asarray(metrics["applied"]).any()
    for x, y in zip(jax.tree_util.tree_leaves(before), jax.tree_util.tree_leaves(out.params)):
        np.testing.assert_array_equal(x, np.asarray(y))


def test_second_epoch_reuses_the_compiled_program(device_run):
    engine, results = device_run
    assert len(engine._programs) == 1
    assert all(r.overflows == 0 and r.chunks == 1 for r in results)


def test_batch_larger_than_training_set_is_padded():
    """20 training nodes in a batch of 64: one step whose padding rows count for nothing,
    so its loss and update are those of a batch of exactly the 20 (the same draws: they
    depend on the node, not its place in the batch; no dropout)."""
    data = _problem()
    runs = {}
    for batch in (64, 20):
        program = _program(batch_size=batch, dropout=0.0)
        state = init_state(program, data, Envelope(batch, (512, 512)), np.arange(20))
        runs[batch] = ScanEngine(program).run_epoch(state, data, np.arange(20), 0,
                                                    Envelope(batch, (512, 512)))
    padded, exact = runs[64], runs[20]
    assert padded.steps == exact.steps == 1 and padded.overflows == 0
    assert padded.loss == pytest.approx(exact.loss, rel=1e-6)
    for x, y in zip(jax.tree_util.tree_leaves(padded.state.params),
                    jax.tree_util.tree_leaves(exact.state.params), strict=True):
        np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("model", ["sage", "gcn", "gat", "sage-max", "mlp"])
def test_loss_decreases(model):
    data = _problem(seed=2)
    program = _program(model=model, dropout=0.0)
    _, results = _train(data, Envelope(32, (512, 512)), epochs=6, program=program)
    assert results[-1].loss < results[0].loss - 0.05


def test_flat_outer_hop_trains_as_dedup_does(large_run):
    """A flat outer hop recovers from a tiny envelope, keeps that level at its exact
    size C (1 + K) as the envelope grows, and trains on the same subgraphs with the
    same losses as deduplicated sampling (`large_run`)."""
    flat = dataclasses.replace(_program(), sampler=SamplerConfig((5, 3), flat_outer=True))
    _, tiny = _train(_problem(), Envelope(32, (40, 40)), program=flat, chunk_steps=3)
    dedup = large_run
    assert tiny[0].overflows >= 1
    caps = tiny[-1].envelope.capacities
    assert caps[0] > 40 and caps[1] == caps[0] * 4
    for a, b in zip(tiny, dedup):
        assert (a.steps, a.sampled_edges, a.max_counts[:2]) == (b.steps, b.sampled_edges,
                                                                b.max_counts[:2])
        assert a.max_counts[2] > b.max_counts[2]  # the flat level keeps repeated nodes
        assert a.loss == pytest.approx(b.loss, rel=1e-5)


def test_sampling_ahead_gives_the_same_training():
    """Steps sampled in vmapped groups of 4 in chunks of 5 (7 steps: a chunk of 4 + 1,
    then a chunk of 2, shorter than a group), overflow recovery included, train exactly
    as steps sampled one by one."""
    data, chunk = _problem(), 5
    train_idx = np.arange(200)
    program = _program()
    results = {}
    for ahead in (1, 4):
        state = init_state(program, data, Envelope(32, (512, 512)), train_idx)
        engine = ScanEngine(program, chunk, EnvelopePolicy(multiple=8), sample_ahead=ahead)
        res = engine.run_epoch(state, data, train_idx, 0, Envelope(32, (40, 40)))
        results[ahead] = res
    one, four = results[1], results[4]
    assert one.overflows >= 1 and (four.steps, four.overflows) == (one.steps, one.overflows)
    assert (four.max_counts, four.sampled_edges) == (one.max_counts, one.sampled_edges)
    assert four.loss == pytest.approx(one.loss, rel=1e-6)
    for x, y in zip(jax.tree_util.tree_leaves(four.state.params),
                    jax.tree_util.tree_leaves(one.state.params)):
        np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=1e-6, atol=1e-7)
    with pytest.raises(ValueError, match="drop prefetch"):
        ScanEngine(program, sample_ahead=2, prefetch=True)
    with pytest.raises(ValueError, match="sample_ahead must be >= 1, got 0"):
        ScanEngine(program, sample_ahead=0)


def test_a_group_reads_its_host_rows_in_one_call(device_run, monkeypatch):
    """With a host table, a group's outermost rows are read for as many steps a call as
    the byte budget holds (at least two), each step's rows equal to its own gather; a
    device table, or a budget under two steps' rows, leave the reads to the steps; the
    engine trains a group of four read two steps at a time as it trains them one by
    one."""
    from zerognn_jax._src.training import scan

    data = _problem()
    host = data._replace(features=HostTable(np.asarray(data.features)))
    program = _program()
    env = Envelope(32, (512, 512))
    perm = jnp.arange(200, dtype=jnp.int32)
    sampled = jax.vmap(lambda step: scan.sample_step(program, step, host, perm, 0, 6, env))(
        jnp.arange(3, dtype=jnp.int32))
    ids, valid = sampled.mb.nodes[-1], sampled.mb.valid[-1]
    big = 1 << 30
    assert scan.steps_per_read(host, sampled, big) == 3
    assert scan.steps_per_read(data, sampled, big) == 0
    got = scan.read_ahead(program, host, sampled).rows
    assert got.shape == (*ids.shape, 12)
    for k in range(3):
        want = host.features.gather(ids[k], valid[k])
        np.testing.assert_array_equal(np.asarray(got[k]), np.asarray(want))
    step_bytes = ids[0].size * 12 * 4
    assert scan.steps_per_read(host, sampled, 2 * step_bytes) == 2
    reads = []
    real = scan.read_ahead
    monkeypatch.setattr(scan, "read_ahead", lambda *a: reads.append(1) or real(*a))
    train_idx = np.arange(200)
    state = init_state(program, host, env, train_idx)
    engine = ScanEngine(program, 0, EnvelopePolicy(multiple=8), sample_ahead=4,
                        read_ahead_bytes=2 * step_bytes)
    grouped = engine.run_epoch(state, host, train_idx, 0, env)
    assert len(reads) == 4  # 7 steps: a group of 4 (2 reads), a group of 3 (2 reads)
    # the device table's first epoch, sampled one by one (a device table reads nothing
    # ahead, so the read-ahead limit is no part of it)
    assert grouped.loss == pytest.approx(device_run[1][0].loss, rel=1e-6)
    assert scan.steps_per_read(host, sampled, 2 * step_bytes - 1) == 0


def test_host_tables_sample_and_read_more_steps_at_once(monkeypatch):
    """sample_ahead None: the engine samples 16 steps a group for a host table, 1 for a
    table on a CPU and 8 on any other device; the read-ahead bytes the memory check
    counts: the steps one call reads (the group, or what the read-ahead limit holds,
    none under two) times their rows' bytes, none on the device; the engine hands its
    limit to the chunk."""
    from zerognn_jax._src.training import scan

    class Traced(Exception):
        pass

    def chunk(*args, ahead, read_limit, **kw):
        seen.append((ahead, read_limit))
        raise Traced

    data = _problem()
    host = data._replace(features=HostTable(np.asarray(data.features)))
    program, env, train_idx, seen = _program(), Envelope(32, (512, 512)), np.arange(200), []
    monkeypatch.setattr(scan, "scan_chunk", chunk)
    for d, limit in ((data, None), (host, 12345)):
        engine = ScanEngine(program, 0, EnvelopePolicy(multiple=8), sample_ahead=None,
                            read_ahead_bytes=limit)
        with pytest.raises(Traced):
            engine.run_epoch(init_state(program, d, env, train_idx), d, train_idx, 0, env)
    on_device = 1 if jax.default_backend() == "cpu" else 8
    assert seen == [(on_device, None), (16, 12345)]
    assert scan.steps_ahead(None, None) == on_device  # no table: JAX's devices
    monkeypatch.setattr(jax, "devices", lambda: [types.SimpleNamespace(platform="gpu")])
    assert scan.steps_ahead(None, None) == 8
    step = 512 * 12 * 4  # a step's outermost rows
    assert scan.read_ahead_bytes(data.features, 512, None) == 0
    assert scan.read_ahead_bytes(host.features, 512, None) == 16 * step
    assert scan.read_ahead_bytes(host.features, 512, 4, 5 * step + 1) == 4 * step
    assert scan.read_ahead_bytes(host.features, 512, None, 5 * step + 1) == 5 * step
    assert scan.read_ahead_bytes(host.features, 512, None, 2 * step - 1) == 0
    with pytest.raises(ValueError, match="read_ahead_bytes must be positive, got 0"):
        ScanEngine(program, read_ahead_bytes=0)


def test_the_read_ahead_limit_follows_the_device_memory(monkeypatch):
    """Unset, the read-ahead limit is an eighth of the device's memory rounded down to a
    power of two within [1, 4] GiB, 2 GiB where JAX does not say; set, it is the value."""
    from zerognn_jax._src.training import scan

    gib = 1 << 30
    for limit, want in ((None, 2 * gib), (4 * gib, gib), (15 * gib, gib), (18 * gib, 2 * gib),
                        (60 * 10**9, 4 * gib), (140 * gib, 4 * gib)):
        monkeypatch.setattr(scan, "device_memory_limit", lambda limit=limit: limit)
        assert scan.read_ahead_limit() == want, limit
    assert scan.read_ahead_limit(12345) == 12345


def test_metrics_come_back_bit_for_bit_in_one_packed_copy():
    """The chunk's metrics and flags travel as one uint32 vector (`_packed`) and come
    back with their shapes, dtypes and bits (NaN, -0.0, negative ints, bools, scalars)."""
    from zerognn_jax._src.training.scan import _packed, _unpacked

    tree = ({"loss": jnp.array([1.5, np.nan, -0.0, np.inf], jnp.float32),
             "counts": jnp.array([[1, -2], [2**31 - 1, 0]], jnp.int32),
             "edges": jnp.array([7, 2**32 - 1], jnp.uint32),
             "applied": jnp.array([True, False, True])},
            (jnp.array(True), jnp.int32(-5)))
    got = _unpacked(np.asarray(_packed(tree)), tree)
    want = jax.device_get(tree)
    assert jax.tree_util.tree_structure(got) == jax.tree_util.tree_structure(want)
    for a, b in zip(jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(want)):
        assert a.dtype == b.dtype and a.shape == b.shape
        np.testing.assert_array_equal(np.atleast_1d(a).view(np.uint8),
                                      np.atleast_1d(b).view(np.uint8))


def test_an_epoch_compiles_nothing_its_engine_does_not_count():
    """The epoch's shuffle and the metrics' packing compiled on first use inside the
    epoch, so the first epoch's `epoch_seconds` (its wall less `compile_seconds`) held
    their compiles; every program an epoch compiles is now the engine's, and counted
    (the packing compiled for the chunk's outputs before it runs is the one it runs:
    no third helper)."""
    import jax.monitoring

    data, train_idx = _problem(), np.arange(200)
    program = _program(batch_size=24)  # shapes no other test compiled in this process
    state = init_state(program, data, Envelope(24, (512, 512)), train_idx)
    engine = ScanEngine(program, 0, EnvelopePolicy(multiple=8))
    compiles = []

    def listener(event, seconds, **_):
        if event == "/jax/core/compile/backend_compile_duration":
            compiles.append(seconds)

    jax.monitoring.register_event_duration_secs_listener(listener)
    try:
        engine.run_epoch(state, data, train_idx, 0, Envelope(24, (512, 512)))
    finally:
        jax.monitoring.unregister_event_duration_listener(listener)
    # the chunk, the packing, and the shuffle (which init_state's calibration compiled
    # already: its program comes from JAX's cache, with no compile of its own)
    assert len(engine._programs) + len(engine._helpers) == 3
    assert len(compiles) <= 2 and engine.compile_seconds >= sum(compiles)


def test_epoch_loss_of_large_finite_step_losses_is_finite():
    """Finite float32 step losses whose sum passes float32's range make a finite epoch
    loss (the mean is summed in float64), not an infinity the run cannot report."""
    steps = 8
    metrics = {"loss": np.full(steps, 1e37, np.float32), "seeds": np.full(steps, 64.0),
               "correct": np.full(steps, np.nan, np.float32),
               "counts": np.ones((steps, 2), np.int32), "edges": np.zeros(steps, np.int32)}
    res = EpochResult.of(None, None, metrics, overflows=0, chunks=1)
    assert res.first_nonfinite is None
    assert res.loss == pytest.approx(1e37, rel=1e-6)
