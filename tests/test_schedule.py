"""The built-in optimizer's options: a learning rate that warms up and follows a cosine,
AdamW's decoupled decay and gradient clipping, against optax's own forms; the rate
reaching learnable embedding rows; a cosine's length held on resume."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from conftest import assert_same_runs

import zerognn_jax as zg
from zerognn_jax import Kernels, row_adam_init, row_adam_update
from zerognn_jax._src.training.schedule import StepSize, make_optimizer

BASE = dict(dataset="tiny", hidden=8, layers=2, fanouts=(3, 3), batch_size=128, epochs=3,
            progress=False, eval_mode="none")


def test_a_cosine_after_warmup_is_optaxs_cosine_and_warmup_a_line_to_the_peak():
    rate = StepSize(0.1, "cosine", warmup=4, total=20)
    counts = np.arange(0, 24)
    got = np.asarray(jax.vmap(rate)(jnp.asarray(counts)))
    np.testing.assert_allclose(got[:4], 0.1 * (counts[:4] + 1) / 4, rtol=1e-6)
    cosine = optax.cosine_decay_schedule(0.1, decay_steps=16)
    np.testing.assert_allclose(got[4:], [float(cosine(t - 4)) for t in counts[4:]],
                               rtol=1e-5, atol=1e-9)
    assert got[19] > 0 and got[20] == got[23] == 0.0  # 0 from the run's last step on
    flat = jax.vmap(StepSize(0.1, "constant", warmup=3))(jnp.arange(6))
    np.testing.assert_allclose(np.asarray(flat), [0.1 / 3, 0.2 / 3, 0.1, 0.1, 0.1, 0.1],
                               rtol=1e-6)


def _steps(tx, steps=4, seed=0):
    """Parameters after `steps` updates of `tx` on random gradients of a small tree."""
    rs = np.random.default_rng(seed)
    params = {"w": jnp.asarray(rs.normal(size=(3, 4)), jnp.float32),
              "b": jnp.asarray(rs.normal(size=(4,)), jnp.float32)}
    state = tx.init(params)
    for _ in range(steps):
        grads = jax.tree.map(lambda p: jnp.asarray(3 * rs.normal(size=p.shape), p.dtype),
                             params)
        updates, state = tx.update(grads, state, params)
        params = optax.apply_updates(params, updates)
    return params


@pytest.mark.parametrize("changes,theirs", [
    ({}, lambda: optax.adam(0.01)),
    ({"weight_decay": 0.1}, lambda: optax.chain(optax.add_decayed_weights(0.1),
                                                optax.adam(0.01))),
    ({"weight_decay": 0.1, "decoupled_weight_decay": True},
     lambda: optax.adamw(0.01, weight_decay=0.1)),
    ({"grad_clip": 0.5}, lambda: optax.chain(optax.clip_by_global_norm(0.5),
                                             optax.adam(0.01))),
], ids=["adam", "l2", "adamw", "clipped"])
def test_the_built_in_optimizer_steps_as_optaxs_own(changes, theirs):
    cfg = zg.TrainConfig(**{**BASE, "lr": 0.01, **changes})
    for a, b in zip(jax.tree.leaves(_steps(make_optimizer(cfg))),
                    jax.tree.leaves(_steps(theirs()))):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    # the default stays the optimizer runs had before these options: no other state
    if not changes:
        params = {"w": jnp.zeros(2)}
        assert jax.tree.structure(make_optimizer(cfg).init(params)) == \
            jax.tree.structure(optax.adam(0.01).init(params))


def test_a_scheduled_rate_steps_as_adam_given_the_schedule():
    cfg = zg.TrainConfig(**{**BASE, "lr": 0.01})
    rate = StepSize(0.01, "cosine", warmup=2, total=5)
    for a, b in zip(jax.tree.leaves(_steps(make_optimizer(cfg, rate), steps=5)),
                    jax.tree.leaves(_steps(optax.adam(rate), steps=5))):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("kernels", [None, Kernels(row_adam="pallas", interpret=True)],
                         ids=["xla", "pallas"])
def test_embedding_rows_take_the_schedules_rate_at_each_step(kernels):
    """Lazy Adam given a schedule equals lazy Adam given, at each step, the number the
    schedule has for it (the XLA form and the Pallas kernel, whose rate is now traced)."""
    rs = np.random.default_rng(1)
    n, d, r = 30, 4, 12
    table = jnp.asarray(rs.normal(size=(n, d)), jnp.float32)
    rate = StepSize(0.05, "cosine", warmup=1, total=4)
    ours = theirs = (table, row_adam_init(table))
    for t in range(4):
        rows = jnp.asarray(rs.permutation(n)[:r], jnp.int32)
        grads = jnp.asarray(rs.normal(size=(r, d)), jnp.float32)
        valid = jnp.asarray(rs.random(r) < 0.8)
        ours = row_adam_update(*ours, rows, grads, valid, lr=rate, unique=True,
                               kernels=kernels)
        theirs = row_adam_update(*theirs, rows, grads, valid, lr=float(rate(t)),
                                 unique=True, kernels=kernels)
        for a, b in zip(jax.tree.leaves(ours), jax.tree.leaves(theirs)):
            np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_a_run_records_each_epochs_last_rate_and_its_embedding_follows():
    cfg = zg.TrainConfig(**BASE, lr=0.01, lr_schedule="cosine", warmup_epochs=1,
                         embedding_dim=4, grad_clip=1.0)
    res = zg.train(cfg)
    steps = res.history[0]["steps"]
    rate = StepSize(0.01, "cosine", warmup=steps, total=3 * steps)
    got = [h["learning_rate"] for h in res.history]
    np.testing.assert_allclose(got, [float(rate(steps * (e + 1) - 1)) for e in range(3)],
                               rtol=1e-6)
    assert got[0] == pytest.approx(0.01) and got[2] < 1e-4
    assert res.history[-1]["loss"] < res.history[0]["loss"]
    # the embedding's lazy Adam steps at the same rate, step for step
    assert res.program.embedding.lr == rate
    assert int(res.state.embedding_opt.count) == 3 * steps


def test_a_typed_graphs_embedded_types_follow_the_schedule():
    """mag-like's featureless types take learnable rows: their lazy Adam gets the run's
    rate (the typed task builds its program apart)."""
    cfg = zg.TrainConfig(dataset="mag-like", scale=0.001, model="rsage", hidden=8, layers=2,
                         fanouts=(2, 2), batch_size=256, epochs=2, progress=False,
                         eval_mode="none", lr=0.01, lr_schedule="cosine")
    res = zg.train(cfg)
    steps = res.history[0]["steps"]
    assert res.program.embedding.lr == StepSize(0.01, "cosine", total=2 * steps)
    assert res.history[-1]["learning_rate"] == pytest.approx(
        float(StepSize(0.01, "cosine", total=2 * steps)(2 * steps - 1)))


def test_a_cosine_run_stopped_and_resumed_trains_as_one_run(tmp_path):
    """Stopped after its first epoch (a callback) and resumed with the same options, a
    cosine run with warmup, clipping and an embedding gives the losses, rates and
    variables of a run never stopped; other epochs are refused (the curve would bend)."""
    cfg = zg.TrainConfig(**BASE, lr_schedule="cosine", warmup_epochs=1, grad_clip=1.0,
                         embedding_dim=4)
    whole = zg.train(cfg)
    stopped = dataclasses.replace(cfg, checkpoint_dir=str(tmp_path / "ck"))
    assert len(zg.train(stopped, callbacks=[lambda record: True]).history) == 1
    with pytest.raises(zg.CheckpointMismatch,
                       match=r"epochs \(the length of lr_schedule 'cosine'\) 3 there, 4 here"):
        zg.train(dataclasses.replace(stopped, epochs=4))
    resumed = zg.train(stopped)
    assert resumed.summary["start_epoch"] == 1
    for key in ("loss", "learning_rate"):
        np.testing.assert_allclose([h[key] for h in resumed.history],
                                   [h[key] for h in whole.history], rtol=1e-6)
    assert_same_runs((resumed.variables, resumed.state.embedding),
                     (whole.variables, whole.state.embedding))


def test_a_constant_rate_resumes_with_more_epochs_and_a_schedule_change_is_named(tmp_path):
    flat = zg.TrainConfig(**{**BASE, "epochs": 2}, checkpoint_dir=str(tmp_path / "c"))
    zg.train(flat)
    assert zg.train(dataclasses.replace(flat, epochs=3)).summary["start_epoch"] == 2
    # another schedule is named once, not with the cosine's length beside it
    with pytest.raises(zg.CheckpointMismatch) as caught:
        zg.train(dataclasses.replace(flat, epochs=4, lr_schedule="cosine"))
    assert "lr_schedule 'constant' there, 'cosine' here;" in str(caught.value)
    assert "length of lr_schedule" not in str(caught.value)


@pytest.mark.parametrize("changes,match", [
    ({"decoupled_weight_decay": True}, r"decoupled_weight_decay applies weight_decay, "
                                       r"which is 0: set weight_decay \(--weight-decay\)"),
    ({"warmup_epochs": -1}, r"warmup_epochs must be >= 0 \(0: none\), got -1"),
    ({"lr_schedule": "cosine", "warmup_epochs": 3},
     r"lr_schedule 'cosine' decays after warmup_epochs 3, and the run has 3 epochs"),
    ({"grad_clip": float("inf")}, r"grad_clip must be >= 0 and finite \(0: no clipping\), "
                                  r"got inf"),
    ({"lr_schedule": "linear"}, r"lr_schedule"),
    ({"warmup_epochs": 4}, r"warmup_epochs 4 is more than the run's 3 epochs: the rate "
                           r"would never reach lr; warm up for 3 at most"),
])
def test_optimizer_options_that_cannot_work_are_refused(changes, match):
    with pytest.raises(ValueError, match=match):
        zg.TrainConfig(**{**BASE, **changes})


def test_the_flags_reach_the_config():
    from zerognn_jax._src.training.config import TrainConfig
    from zerognn_jax.cli import build_parser
    from zerognn_jax.cli.flags import config_from_args

    args = build_parser().parse_args(["train", "--lr-schedule", "cosine", "--warmup-epochs",
                                      "1", "--grad-clip", "2.5", "--weight-decay", "0.01",
                                      "--decoupled-weight-decay"])
    cfg = config_from_args(TrainConfig, args)
    assert (cfg.lr_schedule, cfg.warmup_epochs, cfg.grad_clip, cfg.decoupled_weight_decay) \
        == ("cosine", 1, 2.5, True)
    with pytest.raises(SystemExit):
        build_parser().parse_args(["train", "--lr-schedule", "step"])
