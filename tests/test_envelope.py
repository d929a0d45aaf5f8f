"""Envelope: conservative bound, calibration, growth, memory figures, bad input."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest

from zerognn_jax import (
    Envelope,
    EnvelopePolicy,
    Kernels,
    SamplerConfig,
    TypedEnvelope,
    calibrate,
    conservative,
    epoch_seeds,
    grow,
)
from zerognn_jax._src.sampling.calibrate import sample_epoch_counts
from zerognn_jax._src.training import memory


def test_conservative_bound_is_capped_and_rounded():
    env = conservative(64, (15, 10), num_nodes=5000, policy=EnvelopePolicy(multiple=128))
    assert env.levels == (64, 1024, 5120)  # 64*16 = 1024; min(5000, 1024*11) -> 5120


def test_calibration_refuses_a_boolean_mask_for_node_ids(small_graph):
    """It was read as the ids 0 and 1."""
    g = small_graph.to_device()
    with pytest.raises(ValueError, match=r"items must be a 1-D integer array, got bool\[200\]; "
                                         r"a boolean mask\? pass np.flatnonzero\(mask\)"):
        calibrate(g, np.arange(200) < 100, 16, SamplerConfig((3, 2)))


def test_calibrated_envelope_covers_every_training_step(small_graph):
    g = small_graph.to_device()
    cfg = SamplerConfig((4, 3))
    policy = EnvelopePolicy(margin=1.1, multiple=8)
    cal = calibrate(g, np.arange(200), 16, cfg, policy=policy)
    safe = conservative(16, (4, 3), 300, policy)
    assert all(c <= s for c, s in zip(cal.envelope.capacities, safe.capacities))
    assert all(c >= m for c, m in zip(cal.envelope.levels, cal.max_counts))
    perm = epoch_seeds(jnp.arange(200), 16, 0, 0)
    counts, edges, overflow = sample_epoch_counts(
        g, perm, 0, 0, batch_size=16, config=cfg, envelope=cal.envelope,
        kernels=Kernels())
    assert not np.asarray(overflow).any()
    assert np.asarray(counts).max(axis=0).tolist() == list(cal.max_counts)
    assert cal.steps == 13 and np.all(np.asarray(edges) > 0)


def test_grow_covers_the_failed_counts():
    env = Envelope(32, (128, 256))
    bigger = grow(env, (32, 300, 280), EnvelopePolicy(margin=1.1, multiple=128))
    assert bigger.capacities[0] >= 330
    # The later level was cut short by the first overflow, so it grows too.
    assert bigger.capacities[1] > 256


def test_growth_stops_at_the_node_count_but_never_shrinks():
    env, policy = Envelope(32, (128, 256)), EnvelopePolicy(margin=1.1, multiple=128)
    counts = (32, 300, 280)
    assert grow(env, counts, policy).capacities == (384, 768)
    assert grow(env, counts, policy, num_nodes=500).capacities == (384, 512)  # 500 -> 512
    assert grow(env, counts, policy, num_nodes=10**6).capacities == (384, 768)
    # below a capacity already there, the level keeps it (capacities only grow)
    fine = EnvelopePolicy(margin=1.1, multiple=8)
    assert grow(Envelope(32, (64, 256)), (32, 100, 90), fine).capacities == (112, 448)
    assert grow(Envelope(32, (64, 256)), (32, 100, 90), fine,
                num_nodes=100).capacities == (104, 256)
    # a frontier (level 0) that grew is held to the node count too
    assert grow(env, (450, 300, 280), policy, num_nodes=500).levels == (512, 512, 512)
    # repeated seeds: a level may hold more rows than the graph has nodes; it still
    # grows to its count, or an overflow would never end
    repeated = grow(Envelope(64, (104,)), (64, 150), EnvelopePolicy(multiple=8), num_nodes=100)
    assert repeated.capacities[0] >= 150


def test_memory_report_ratio():
    env = Envelope(10, (128, 256))
    report = memory.memory_report(env, (10, 100, 200), (5, 3), (7, 16, 32))
    per = memory.level_bytes((5, 3), (7, 16, 32))
    assert report["envelope_bytes"] == 10 * per[0] + 128 * per[1] + 256 * per[2]
    assert report["ideal_bytes"] == 10 * per[0] + 100 * per[1] + 200 * per[2]
    assert report["ratio"] == pytest.approx(report["envelope_bytes"] / report["ideal_bytes"])


def test_envelope_that_cannot_fit_names_the_level():
    env = Envelope(1024, (20_000, 2_000_000))
    with pytest.raises(ValueError, match=r"level 2 \(hop 2\) needs capacity 2,000,000"):
        memory.check_fits(env, (15, 10), (47, 256, 100), limit_bytes=1 << 30)
    memory.check_fits(env, (15, 10), (47, 256, 100), limit_bytes=1 << 40)


def test_data_parallel_embedding_rows_count_as_step_buffers():
    """Each of D devices gathers every device's touched embedding rows (ids, flags,
    gradients) and updates all D R of them with their two float32 moments: at least
    those arrays' bytes; nothing on one device or without a table."""
    assert memory.gathered_rows_bytes(1000, 64, "float32", 1) == 0
    assert memory.gathered_rows_bytes(1000, 0, "float32", 8) == 0
    for dtype, itemsize in (("float32", 4), ("bfloat16", 2)):
        for devices in (2, 4):
            rows = devices * 1000  # every device's 1000 rows
            gathered = rows * (4 + 1 + 64 * itemsize)  # int32 ids, bool flags, gradients
            moments = rows * 64 * 8
            assert memory.gathered_rows_bytes(1000, 64, dtype, devices) >= gathered + moments
    env = Envelope(1024, (20_000, 200_000))
    levels = sum(c * b for c, b in zip(env.levels, memory.level_bytes((15, 10), (47, 256, 100))))
    resident = memory.Resident(graph=1 << 20, features=1 << 20, model=1 << 20)
    limit = resident.total + levels + 100
    memory.check_fits(env, (15, 10), (47, 256, 100), limit, resident=resident,
                      extra_step_bytes=100)
    with pytest.raises(ValueError, match="step buffers"):
        memory.check_fits(env, (15, 10), (47, 256, 100), limit, resident=resident,
                          extra_step_bytes=101)
    # rows read ahead count as step buffers, and the advice says how to drop them
    memory.check_fits(env, (15, 10), (47, 256, 100), limit, resident=resident,
                      extra_step_bytes=40, read_ahead_bytes=60)
    with pytest.raises(ValueError, match=r"--sample-ahead 1: none\) drops up to 0\.00 GiB"):
        memory.check_fits(env, (15, 10), (47, 256, 100), limit, resident=resident,
                          extra_step_bytes=40, read_ahead_bytes=61)
    # a table in host memory holds no device rows: no lever on them is offered (it said
    # to split them over devices, which such a table refuses)
    hosted = memory.Resident(graph=1 << 20, features=0, model=1 << 20)
    with pytest.raises(ValueError) as err:
        memory.check_fits(env, (15, 10), (47, 256, 100), hosted.total + levels, resident=hosted,
                          extra_step_bytes=40, read_ahead_bytes=61)
    assert "--shard-features" not in str(err.value) and "bfloat16" not in str(err.value)
    with pytest.raises(ValueError, match="--shard-features --devices N, now 1"):
        memory.check_fits(env, (15, 10), (47, 256, 100), limit, resident=resident,
                          extra_step_bytes=40, read_ahead_bytes=61)
    # a device table is told of the host placement; a host table's cached rows are
    # named as such, with the cache's size as their lever (it was told to shard them)
    with pytest.raises(ValueError, match=r"keeping the feature table in host memory "
                                         r"\(--feature-placement host\) frees up to"):
        memory.check_fits(env, (15, 10), (47, 256, 100), limit, resident=resident,
                          extra_step_bytes=101)
    cached = memory.Resident(graph=1 << 20, features=1 << 20, model=1 << 20, host_table=True)
    with pytest.raises(ValueError) as err:
        memory.check_fits(env, (15, 10), (47, 256, 100), limit, resident=cached,
                          extra_step_bytes=101)
    assert "(float32, cached rows of the host table)" in str(err.value)
    assert "a smaller cache of the host table's rows (--feature-cache-gib, 0: none)" in \
        str(err.value)
    assert "--shard-features" not in str(err.value) and "bfloat16" not in str(err.value)


@pytest.mark.parametrize("kwargs, match", [
    ({"batch_size": 0, "capacities": (128,)}, "batch_size must be at least 1"),
    ({"batch_size": 256, "capacities": (128,)}, "capacities must not decrease"),
    ({"batch_size": 8, "capacities": (256, 128)}, "capacities must not decrease"),
    ({"batch_size": 1024, "capacities": (2**31,)},
     "level 1 would hold 2,147,483,648 rows, more than int32 positions reach"),
])
def test_bad_envelopes(kwargs, match):
    with pytest.raises(ValueError, match=match):
        Envelope(**kwargs)


def test_a_typed_level_past_int32_is_refused():
    with pytest.raises(ValueError, match="paper at level 1 would hold 3,000,000,000 rows"):
        TypedEnvelope("paper", 8, ((("paper", 3_000_000_000),),))


@pytest.mark.parametrize("kwargs, match", [
    ({"margin": 0.5}, "margin must be a finite number >= 1, got 0.5"),
    ({"margin": float("nan")}, "margin must be a finite number >= 1"),
    ({"multiple": 0}, "multiple must be >= 1, got 0"),
    ({"multiple": -128}, "multiple must be >= 1, got -128"),
    ({"growth": 1.0}, "growth must be > 1, got 1.0"),
])
def test_bad_policy(kwargs, match):
    with pytest.raises(ValueError, match=match):
        EnvelopePolicy(**kwargs)


def test_epoch_seeds_take_python_device_and_traced_scalars():
    """The same permutation whether seed and epoch come as Python ints (one host array),
    device scalars, or values traced inside a caller's jit; padded with -1 to whole
    batches."""
    import jax

    items = jnp.arange(50, dtype=jnp.int32)
    want = np.asarray(epoch_seeds(items, 16, 3, 2))
    assert want.shape == (64,) and (want[50:] == -1).all()
    assert sorted(want[:50].tolist()) == list(range(50))
    np.testing.assert_array_equal(epoch_seeds(items, 16, jnp.int32(3), jnp.int32(2)), want)
    traced = jax.jit(lambda s, e: epoch_seeds(items, 16, s, e))(3, 2)
    np.testing.assert_array_equal(traced, want)
    assert not np.array_equal(np.asarray(epoch_seeds(items, 16, 3, 1)), want)
