"""Envelope: conservative bound, calibration, growth, memory figures, bad input."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest

from zerognn_jax import Envelope, SamplerConfig, calibrate, conservative, grow
from zerognn_jax._src import envelope as envelope_lib


def test_conservative_bound_is_capped_and_rounded():
    env = conservative(64, (15, 10), num_nodes=5000, multiple=128)
    assert env.levels == (64, 1024, 5120)  # 64*16 = 1024; min(5000, 1024*11) -> 5120


def test_calibrated_envelope_covers_every_training_step(small_graph):
    g = small_graph.to_device()
    cfg = SamplerConfig((4, 3))
    cal = calibrate(g, np.arange(200), 16, cfg, multiple=8, margin=1.1)
    safe = conservative(16, (4, 3), 300, multiple=8)
    assert all(c <= s for c, s in zip(cal.envelope.capacities, safe.capacities))
    assert all(c >= m for c, m in zip(cal.envelope.levels, cal.max_counts))
    perm = envelope_lib.epoch_seeds(jnp.arange(200), 16, 0, 0)
    counts, edges, overflow = envelope_lib.sample_epoch_counts(
        g, perm, 0, 0, batch_size=16, config=cfg, capacities=cal.envelope.capacities,
        kernels=envelope_lib.kernels_lib.XLA)
    assert not np.asarray(overflow).any()
    assert np.asarray(counts).max(axis=0).tolist() == list(cal.max_counts)
    assert cal.steps == 13 and np.all(np.asarray(edges) > 0)


def test_grow_covers_the_failed_counts():
    env = Envelope(32, (128, 256))
    bigger = grow(env, (32, 300, 280), margin=1.1, multiple=128)
    assert bigger.capacities[0] >= 330
    # The later level was cut short by the first overflow, so it grows too.
    assert bigger.capacities[1] > 256


def test_memory_report_ratio():
    env = Envelope(10, (128, 256))
    report = envelope_lib.memory_report(env, (10, 100, 200), (5, 3), (7, 16, 32))
    per = envelope_lib.level_bytes((5, 3), (7, 16, 32))
    assert report["envelope_bytes"] == 10 * per[0] + 128 * per[1] + 256 * per[2]
    assert report["ideal_bytes"] == 10 * per[0] + 100 * per[1] + 200 * per[2]
    assert report["ratio"] == pytest.approx(report["envelope_bytes"] / report["ideal_bytes"])


def test_envelope_that_cannot_fit_names_the_level():
    env = Envelope(1024, (20_000, 2_000_000))
    with pytest.raises(ValueError, match=r"level 2 \(hop 2\) needs capacity 2,000,000"):
        envelope_lib.check_fits(env, (15, 10), (47, 256, 100), limit_bytes=1 << 30)
    envelope_lib.check_fits(env, (15, 10), (47, 256, 100), limit_bytes=1 << 40)


@pytest.mark.parametrize("kwargs, match", [
    ({"batch_size": 0, "capacities": (128,)}, "batch_size must be at least 1"),
    ({"batch_size": 256, "capacities": (128,)}, "capacities must not decrease"),
    ({"batch_size": 8, "capacities": (256, 128)}, "capacities must not decrease"),
])
def test_bad_envelopes(kwargs, match):
    with pytest.raises(ValueError, match=match):
        Envelope(**kwargs)


def test_bad_margin(small_graph):
    with pytest.raises(ValueError, match="margin must be >= 1.0"):
        calibrate(small_graph.to_device(), np.arange(10), 4, SamplerConfig((2,)), margin=0.5)
