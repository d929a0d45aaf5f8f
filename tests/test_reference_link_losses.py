"""Same seed, same link losses: link-prediction runs recorded before the task seam was
typed (branch `seam` from 16c12f3, CPU, JAX 0.10) must come out unchanged.

Bit for bit on the machines they were recorded on. On another x86 CPU (an AMD EPYC
without AVX2, 2026-12-01) XLA:CPU rounds two of these losses differently in the last
one or two bits, and 16c12f3 itself, run there, differs from its own record as much
(and from today's code by one bit in another run): float32 sums whose order the CPU
decides. So a loss may differ from its record by at most 2 units in the last place,
and the test AUC must be equal. The runs that name `decoder="dot"` ran with the default
decoder then; the default is "scaled-dot" now (docs/link_prediction.md)."""

from __future__ import annotations

import jax
import numpy as np
import pytest

import zerognn_jax as zg

# Recorded on a CPU: XLA:GPU adds in other orders, so a GPU's losses differ in the last
# digits (seen on an H200, 2026-12-01).
pytestmark = pytest.mark.skipif(jax.default_backend() != "cpu",
                                reason="losses recorded on a CPU, compared bit for bit")

# Per run: per-epoch training losses and the final test AUC.
RECORDED = {
    "gcn-mlp-scan-chunks": ([0.6931200623512268, 0.6927083134651184], 0.48578700951248516),
    "sage-dot-host-exact": ([0.891755223274231, 0.7363060712814331], 0.5084348989298454),
    "sage-dot-scan": ([0.891755223274231, 0.7363060116767883], 0.5084348989298454),
    "sage-pairs-conservative": ([0.8854917287826538, 0.7322677373886108], 0.5001486325802617),
}
RUNS = {
    "sage-dot-scan": dict(model="sage", decoder="dot"),
    "gcn-mlp-scan-chunks": dict(model="gcn", decoder="mlp", chunk_steps=2, negatives=2),
    # one epoch: the host engine compiles every step's shapes anew (~25 s an epoch)
    "sage-dot-host-exact": dict(model="sage", decoder="dot", engine="host-exact", epochs=1),
    "sage-pairs-conservative": dict(model="sage", decoder="dot", negative_mode="pairs",
                                    envelope="conservative"),
}


def make_dataset():
    rs = np.random.default_rng(11)
    n = 300
    src, dst = rs.integers(0, n, 2400), rs.integers(0, n, 2400)
    g = zg.from_edge_list(src, dst, n, make_undirected=True, remove_self_loops=True,
                          remove_duplicates=True)
    labels = rs.integers(0, 3, n)
    feats = rs.normal(size=(n, 8)).astype(np.float32) + labels[:, None] * 0.3
    perm = rs.permutation(n)
    return zg.make_dataset("ref-link", g.indptr, g.indices, feats, labels, perm[:200],
                           perm[200:250], perm[250:], 3)


def all_runs() -> dict:
    """{run: (per-epoch losses, test AUC)} of every run, trained here."""
    dataset, out = make_dataset(), {}
    for name, run in RUNS.items():
        run = {"epochs": 2, **run}
        cfg = zg.TrainConfig(task="link", hidden=16, layers=2, fanouts=(5, 3),
                             batch_size=64, progress=False, **run)
        result = zg.train(cfg, dataset)
        out[name] = ([h["loss"] for h in result.history], result.summary["test_auc"])
    return out


@pytest.mark.parametrize("name", sorted(RUNS))
def test_link_losses_match_recorded(start_flag_runs, name):
    """Trained under the flags the suite started with (XLA's defaults unless XLA_FLAGS
    was set, as recorded; the suite's own flags change the last bits: conftest.py)."""
    losses, test_auc = start_flag_runs[name]
    recorded, recorded_auc = RECORDED[name]
    assert len(losses) == RUNS[name].get("epochs", 2)
    np.testing.assert_array_max_ulp(np.float32(losses), np.float32(recorded[:len(losses)]),
                                    maxulp=2)
    if len(losses) == 2:  # the AUC was recorded after two epochs
        assert test_auc == recorded_auc
