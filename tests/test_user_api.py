"""Your model, your optimizer, your loss: `train()` with a user's Flax Linen or NNX model,
optax optimizer and per-row loss; float targets (multi-label, regression); `restore`;
the best-validation checkpoint; epoch callbacks; TensorBoard scalars (docs/api.md)."""

from __future__ import annotations

import dataclasses
import struct
import sys
import types
from pathlib import Path

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from conftest import assert_same_runs
from flax import nnx

import zerognn_jax as zg

N, D, CLASSES = 300, 8, 3


def graph_arrays(seed=0):
    rs = np.random.default_rng(seed)
    g = zg.from_edge_list(rs.integers(0, N, 1200), rs.integers(0, N, 1200), N,
                          make_undirected=True, remove_self_loops=True, remove_duplicates=True)
    x = rs.normal(size=(N, D)).astype(np.float32)
    order = rs.permutation(N)
    return g, x, np.sort(order[:180]), np.sort(order[180:240]), np.sort(order[240:])


@pytest.fixture(scope="module")
def classes():
    """Labels that the nodes' own features decide (learnable in a few epochs)."""
    g, x, tr, va, te = graph_arrays()
    labels = np.argmax(x[:, :CLASSES], -1)
    return zg.make_dataset("classes", g.indptr, g.indices, x, labels, tr, va, te, CLASSES)


def config(tmp_path=None, **changes):
    base = dict(hidden=16, layers=2, fanouts=(4, 4), batch_size=32, epochs=2, progress=False,
                eval_mode="sampled", eval_batch_size=64)
    if tmp_path is not None:
        base.update(checkpoint_dir=str(tmp_path / "ck"), metrics_out=str(tmp_path / "m.jsonl"))
    return zg.TrainConfig(**{**base, **changes})


class LinenSage(nn.Module):
    """A user's Linen model: [own ; mean of neighbours] -> Dense per layer, BatchNorm."""

    hidden: int
    out: int

    @nn.compact
    def __call__(self, x, views, *, train):
        h = x
        for i, view in enumerate(views):
            neigh = view.weighted_sum(h[:, None, :], zg.mean_weights(view))[:, 0, :]
            h = nn.Dense(self.out if i == len(views) - 1 else self.hidden)(
                jnp.concatenate([h[: view.num_dst], neigh], -1))
            if i < len(views) - 1:
                h = nn.relu(nn.BatchNorm(use_running_average=not train)(h))
        return h


class NNXSage(nnx.Module):
    """The same model in Flax NNX, with dropout and batch norm left in their default
    modes: the wrapper switches them from `train`."""

    def __init__(self, din, hidden, out, *, rngs: nnx.Rngs):
        self.convs = nnx.List([nnx.Linear(2 * din, hidden, rngs=rngs),
                               nnx.Linear(2 * hidden, out, rngs=rngs)])
        self.norm = nnx.BatchNorm(hidden, rngs=rngs)
        self.drop = nnx.Dropout(0.1, rngs=rngs)

    def __call__(self, x, views, *, train):
        h = x
        for i, (view, conv) in enumerate(zip(views, self.convs)):
            neigh = view.weighted_sum(h[:, None, :], zg.mean_weights(view))[:, 0, :]
            h = conv(jnp.concatenate([h[: view.num_dst], neigh], -1))
            if i == 0:
                h = self.drop(nnx.relu(self.norm(h)))
        return h


def make_user_model(kind):
    if kind == "linen":
        return LinenSage(16, CLASSES)
    return NNXSage(D, 16, CLASSES, rngs=nnx.Rngs(0))


def user_optimizer():
    schedule = optax.warmup_cosine_decay_schedule(1e-3, 1e-2, 4, 40)
    return optax.chain(optax.clip_by_global_norm(1.0), optax.adamw(schedule, 1e-4))


def smoothed_cross_entropy(logits, labels):
    """A user's per-row loss: cross-entropy with label smoothing."""
    onehot = optax.smooth_labels(jax.nn.one_hot(labels, logits.shape[-1]), 0.1)
    return optax.softmax_cross_entropy(logits, onehot)


def split_scores(record):
    """An epoch record's evaluated scores: what the summary's best names of its epoch."""
    return {k: v for k, v in record.items() if k.startswith(("train_", "val_", "test_"))
            and not k.startswith("train_batch_")}


def leaves(tree):
    return [np.asarray(x) for x in jax.tree_util.tree_leaves(tree)]


# ------------------------------------------------- a user's model, optimizer and loss


@pytest.mark.parametrize("kind", ["linen", "nnx"])
def test_user_model_trains_resumes_and_restores(kind, classes, tmp_path):
    cfg = config(tmp_path, epochs=2, best_metric="val_acc")
    parts = dict(model=make_user_model(kind), optimizer=user_optimizer(),
                 loss=smoothed_cross_entropy)
    first = zg.train(cfg, classes, **parts)
    s = first.summary
    assert s["model"] == ("LinenSage" if kind == "linen" else "NNXSage")
    assert s["custom"] == {"model": s["model"], "optimizer": "custom",
                           "loss": "smoothed_cross_entropy"}
    assert s["eval_mode"] == "sampled" and "batch_stats" in first.variables
    # Resumed with one epoch more: only that epoch trains.
    cfg3 = config(tmp_path, epochs=3, best_metric="val_acc")
    res = zg.train(cfg3, classes, **parts)
    assert res.summary["start_epoch"] == 2 and [h["epoch"] for h in res.history] == [0, 1, 2]
    assert res.history[-1]["loss"] < res.history[0]["loss"]
    assert res.summary["val_acc"] > 0.5, res.summary
    assert res.summary["best"]["value"] == max(h["val_acc"] for h in res.history)
    # the best epoch's every score, an epoch of the run before the resume's included
    assert res.summary["best"]["scores"] == split_scores(res.history[res.summary["best"]["epoch"]])
    # The checkpoint of another model is refused.
    other = "nnx" if kind == "linen" else "linen"
    with pytest.raises(zg.CheckpointMismatch, match="model"):
        zg.train(cfg3, classes, **{**parts, "model": make_user_model(other)})
    # Restored for inference: the same variables, the same test accuracy.
    # (Linen: without the config, which the checkpoint records.)
    back = zg.restore(cfg3.checkpoint_dir, cfg3 if kind == "nnx" else None, classes,
                      best=kind == "nnx", **parts)
    want = res.summary["best"]["epoch"] if kind == "nnx" else 2
    assert back.summary["epoch"] == want
    if kind == "linen":
        for a, b in zip(leaves(back.variables), leaves(res.variables)):
            np.testing.assert_array_equal(a, b)
        logits = zg.sampled_logits(back.program, back.variables, back.data, classes.test_idx,
                                   batch_size=cfg3.eval_batch_size, seed=cfg3.seed)
        hits = np.argmax(np.asarray(logits), -1) == classes.labels[classes.test_idx]
        assert float(np.mean(hits)) == res.summary["test_acc"]
    else:  # the best-validation checkpoint: the epoch and value the summary names
        assert back.summary["best"] == {"metric": "val_acc",
                                        "value": res.summary["best"]["value"]}
    # The model alone, for inference: an NNX model's `nnx.List` layers (keys 0, 1, read
    # back as "0", "1") were refused as other variables; the summary named "sage"
    model_only = zg.restore(cfg3.checkpoint_dir, cfg3, classes, model=parts["model"],
                            for_inference=True)
    assert model_only.summary["model"] == s["model"] and model_only.summary["epoch"] == 2
    for a, b in zip(leaves(model_only.variables), leaves(res.variables)):
        np.testing.assert_array_equal(a, b)


def test_fine_tuning_starts_from_given_variables(classes, tmp_path):
    cfg = config(epochs=1, eval_mode="none")
    first = zg.train(cfg, classes, model=LinenSage(16, CLASSES))
    tuned = zg.train(cfg, classes, model=LinenSage(16, CLASSES), variables=first.variables,
                     optimizer=optax.sgd(0.0))  # lr 0: the given variables come back
    for a, b in zip(leaves(tuned.variables["params"]), leaves(first.variables["params"])):
        np.testing.assert_array_equal(a, b)
    # a checkpoint of the run wins over them: said (a silent resume before)
    held = config(tmp_path, epochs=1, eval_mode="none")
    zg.train(held, classes, model=LinenSage(16, CLASSES))
    with pytest.warns(zg.CheckpointWarning, match=rf"^checkpoint_dir {held.checkpoint_dir} "
                                                  rf"holds this run's epoch 0: the run "
                                                  rf"resumes from it, and the variables"):
        zg.train(dataclasses.replace(held, epochs=2), classes, model=LinenSage(16, CLASSES),
                 variables=first.variables)
    with pytest.raises(ValueError, match=r"^variables do not fit the model: the model has "
                                         r"\['batch_stats'\]\['BatchNorm_0'\]\['mean'\] \[8\],"
                                         r".* and 4 more; the variables have \['batch_stats'\]"
                                         r"\['BatchNorm_0'\]\['mean'\] \[16\], .* and 4 more$"):
        zg.train(config(epochs=0, eval_mode="none"), classes, model=LinenSage(8, CLASSES),
                 variables=first.variables)
    # an encoder's parameters from one's own loop, for a link run (whose model nests the
    # encoder's under "encoder"): told where they go
    link = config(epochs=0, eval_mode="none", task="link")
    with pytest.raises(ValueError, match=r"\(the model's variables are all under "
                                         r"\['encoder'\] in their collection: nest yours "
                                         r"there\)$"):
        zg.train(link, classes, model=LinenSage(16, CLASSES), variables=first.variables)
    zg.train(link, classes, model=LinenSage(16, CLASSES),
             variables={name: {"encoder": first.variables[name]}
                        for name in ("params", "batch_stats")})


def test_a_misfit_names_a_scope_only_where_nesting_there_would_fit():
    """A model of one submodule has its paths' common prefix as that submodule's own
    path: variables rooted elsewhere were told to nest under it."""
    from zerognn_jax._src.training.user import _misfit

    one = {"['params']['convs_0']['linear']['bias']": (3,),
           "['params']['convs_0']['linear']['kernel']": (16, 3)}
    encoder = {p.replace("['params']", "['params']['encoder']"): s for p, s in one.items()}
    assert "nest yours" not in _misfit(one, encoder)
    assert "nest yours" not in _misfit(one, {"['params']['Dense_0']['bias']": (3,)})
    assert _misfit(encoder, one).endswith("(the model's variables are all under "
                                          "['encoder'] in their collection: nest yours "
                                          "there)")


def test_restore_without_config_uses_the_recorded_one(tmp_path):
    cfg = config(tmp_path, dataset="tiny", epochs=1, eval_mode="none")
    zg.train(cfg)
    back = zg.restore(cfg.checkpoint_dir)
    assert back.summary["epoch"] == 0 and back.dataset.name == "tiny"
    assert back.program.model.hidden == 16
    with pytest.raises(FileNotFoundError, match="best"):
        zg.restore(cfg.checkpoint_dir, best=True)


# ------------------------------------------------------------- float targets


def multilabel_dataset():
    g, x, tr, va, te = graph_arrays(1)
    targets = (x[:, :4] > 0).astype(np.float32)
    return zg.make_dataset("ml", g.indptr, g.indices, x, None, tr, va, te, None,
                           targets=targets, target_kind="multilabel")


def test_multilabel_targets_train_and_evaluate():
    ds = multilabel_dataset()
    assert ds.output_dim == 4 and ds.stats()["target_kind"] == "multilabel"
    res = zg.train(config(epochs=8, eval_mode="full", lr=1e-2, dropout=0.0), ds)
    s = res.summary
    assert s["eval_mode"] == "full" and "eval_note" not in s
    assert {"train_acc", "train_f1", "val_acc", "val_f1", "test_acc", "test_f1"} <= set(s)
    assert s["val_f1"] > 0.7 and s["val_acc"] > 0.7, s
    assert 0.0 <= res.history[0]["train_batch_acc"] <= 1.0
    assert res.history[-1]["loss"] < res.history[0]["loss"]


def test_missing_targets_are_left_out_of_the_loss_and_the_metrics():
    """NaN marks a missing entry of float node targets: the run's loss is the mean over
    the given entries (rows weighed by their count, padding by 0), whose outputs alone
    get a gradient; the metrics skip it; a dataset without NaN keeps the plain loss."""
    from zerognn_jax._src.training.tasks import losses
    from zerognn_jax._src.training.tasks.node import node_task, split_metrics

    ds = multilabel_dataset()
    plain = node_task(None, ds)  # as before: no weight
    assert plain.loss is losses.sigmoid_cross_entropy and plain.weight is None
    rng = np.random.default_rng(1)
    targets = ds.targets.copy()
    targets[rng.random(targets.shape) < 0.4] = np.nan
    targets[0] = np.nan  # a node of no given entry weighs nothing
    holed = ds.with_targets(targets, "multilabel")
    task = node_task(None, holed)
    assert task.weight is losses.row_weights and task.loss is losses.masked_sigmoid
    items = jnp.array([0, 1, 2, 3])
    batch = task.batch(types.SimpleNamespace(targets=jnp.asarray(targets)), items,
                       jnp.array([True, True, True, False]), None, None)
    known = ~np.isnan(targets[:4])
    np.testing.assert_array_equal(batch.weight, [0, known[1].sum(), known[2].sum(), 0])
    # the split's loss: binary cross-entropy averaged over every given entry
    ids = np.arange(40)
    out = rng.standard_normal((40, 4)).astype(np.float32)
    t, given = targets[ids], ~np.isnan(targets[ids])
    ce = np.maximum(out, 0) - out * np.nan_to_num(t) + np.log1p(np.exp(-np.abs(out)))
    got = split_metrics(out, holed, ids, task)
    np.testing.assert_allclose(got["loss"], ce[given].mean(), rtol=1e-5)
    right = (out > 0) == (t > 0.5)
    np.testing.assert_allclose(got["acc"], right[given].mean(), rtol=1e-6)
    # a missing entry's output gets no gradient
    grad = jax.grad(lambda o: jnp.sum(losses.masked_sigmoid(o, jnp.asarray(t))))(out)
    assert np.all(grad[~given] == 0) and np.all(grad[given] != 0)
    res = zg.train(config(epochs=8, eval_mode="full", lr=1e-2, dropout=0.0), holed)
    s = res.summary
    assert np.isfinite([h["loss"] for h in res.history]).all()
    assert res.history[-1]["loss"] < res.history[0]["loss"]
    assert s["val_f1"] > 0.7 and s["val_rocauc"] > 0.8, s


def test_missing_regression_targets_train_resume_and_are_refused_where_unusable(tmp_path):
    """Regression with missing entries trains by the masked squared error, and its
    checkpoint resumes under the same (default) loss and no other; a NodeTask of a loss
    that reads every entry is refused, and so is a run whose training nodes have no
    given entry. A graph collection's checkpoint identity keeps its own rule."""
    from zerognn_jax._src.training.user import user_identity

    g, x, tr, va, te = graph_arrays(2)
    y = x[:, :2] @ np.array([[1.0, -0.5], [0.5, 2.0]], np.float32)
    y[np.random.default_rng(0).random(y.shape) < 0.3] = np.nan
    base = zg.make_dataset("reg", g.indptr, g.indices, x, np.zeros(N, int), tr, va, te, 1)
    ds = base.with_targets(y, "regression")
    cfg = config(tmp_path, epochs=1, lr=1e-2, dropout=0.0, eval_mode="full")
    first = zg.train(cfg, ds)
    assert np.isfinite(first.summary["val_mse"]) and np.isfinite(first.summary["val_loss"])
    more = zg.train(dataclasses.replace(cfg, epochs=2), ds)
    assert [h["epoch"] for h in more.history] == [0, 1]  # (resumed: its identity matched)
    with pytest.raises(zg.CheckpointMismatch, match="loss"):
        zg.train(dataclasses.replace(cfg, epochs=3), ds,
                 loss=lambda out, t: jnp.nanmean(jnp.abs(out - t), -1))
    with pytest.raises(ValueError, match=r"the loss squared_error reads every target entry, "
                                         r"and dataset 'reg' has missing \(NaN\) ones: use "
                                         r"zg.NodeTask.named\('mse', missing=True\)"):
        zg.train(config(epochs=1), ds, loss=zg.NodeTask.named("mse"))
    # a loss that masks the NaN targets' terms only after computing them: a NaN gradient,
    # whatever the learning rate, named as the targets' missing entries
    careless = lambda out, t: jnp.where(jnp.isnan(t), 0.0, jnp.square(out - t)).sum(-1)
    with pytest.raises(zg.Diverged, match=r"The targets have missing entries, which your "
                                          r"loss receives as NaN"):
        zg.train(config(epochs=1, lr=1e-8), ds, loss=careless)
    unknown = y.copy()
    unknown[tr] = np.nan
    with pytest.raises(ValueError, match=r"^dataset 'reg' gives no target entry for its 180 "
                                         r"training nodes"):
        zg.train(config(epochs=1), base.with_targets(unknown, "regression"))
    graphs = zg.make_collection("c", [2, 2], [1, 1], [0, 0], [1, 1], np.ones((4, 3)),
                                [[1.0], [np.nan]], "regression")
    mse = zg.NodeTask.named("mse", missing=True)  # (the graph task's "mse" function)
    assert user_identity(None, None, mse, graphs) == {"loss": "masked_squared_error"}


def test_a_node_task_is_made_of_functions_and_its_score_fits_the_targets():
    """A NodeTask given a built-in loss by name is refused where it is made, naming the
    constructor that takes names (it failed in training, as "the loss str fails"); one
    whose default score (class accuracy) fails on multi-label targets says to give it
    another or None."""
    with pytest.raises(TypeError, match=r"NodeTask's loss must be a function, got str "
                                        r"'sigmoid'; a built-in loss by name is "
                                        r"NodeTask.named\('sigmoid'\)"):
        zg.NodeTask(loss="sigmoid")
    with pytest.raises(TypeError, match=r"NodeTask's score must be a function or None"):
        zg.NodeTask(score="acc")
    mine = zg.NodeTask(loss=lambda out, t: jnp.mean(jnp.abs(out - t), -1))
    with pytest.raises(ValueError, match=r"the score class_accuracy fails on outputs "
                                         r"float32\[3, 4\] .+ \(give your NodeTask a score for "
                                         r"these targets, or score=None"):
        zg.train(config(epochs=1), multilabel_dataset(), loss=mine)


def test_missing_targets_survive_storage(tmp_path):
    """A dataset's NaN target entries are kept by .npz files and dataset folders."""
    ds = multilabel_dataset()
    targets = ds.targets.copy()
    targets[::3, 1] = np.nan
    holed = ds.with_targets(targets, "multilabel")
    assert holed.stats()["missing_targets"] == 100 and "missing_targets" not in ds.stats()
    for back in (zg.load_npz(zg.save_npz(holed, tmp_path / "d.npz")),
                 zg.load_dir(zg.save_dir(holed, tmp_path / "d"))):
        np.testing.assert_array_equal(back.targets, targets)  # (NaN where NaN)


def test_float_targets_with_an_empty_split_evaluate_to_null():
    """An empty validation split crashed the first evaluation of float targets (a reshape
    of 0 rows); class labels gave null already. Outputs of another width than the
    targets are refused (they broadcast into a number)."""
    for kind in ("multilabel", "regression"):
        assert all(np.isnan(v) for v in zg.target_metrics(np.zeros((0, 2)), np.zeros((0, 2)),
                                                            kind).values())
    # outputs of another width (a user's loss may read a mean and a variance): no metric,
    # said (they broadcast into a number; an error, the first version, ended such a run)
    with pytest.warns(UserWarning, match=r"outputs \[5, 3\] and targets \[5, 1\] differ"):
        assert np.isnan(zg.target_metrics(np.zeros((5, 3)), np.zeros((5, 1)),
                                          "regression")["mse"])
    ds = multilabel_dataset()
    empty = dataclasses.replace(ds, val_idx=np.zeros(0, np.int32))
    s = zg.train(config(epochs=1, eval_mode="full"), empty).summary
    assert s["val_f1"] is None and s["val_acc"] is None and s["test_f1"] is not None
    assert s["val_loss"] is None and s["test_loss"] is not None  # (it failed on no rows)


def test_each_split_reports_the_tasks_loss():
    """The mean per-row loss of the task over a split's nodes, the user's loss where one
    was given: PyG users stop on val_loss, which no node task reported."""
    from zerognn_jax._src.training.tasks.node import split_metrics

    rng = np.random.default_rng(0)
    outputs = rng.standard_normal((6, 3)).astype(np.float32)
    labels = np.array([2, 0, 1, 1, -1, 0])
    ds = types.SimpleNamespace(targets=None, labels=labels)
    ids = np.array([0, 2, 3])
    want = -np.mean(jax.nn.log_softmax(outputs[:3])[np.arange(3), labels[ids]])
    got = split_metrics(outputs[:3], ds, ids, zg.NodeTask())
    assert got["acc"] == np.mean(outputs[:3].argmax(-1) == labels[ids])
    np.testing.assert_allclose(got["loss"], want, rtol=1e-6)
    targets = types.SimpleNamespace(targets=outputs[::-1] + 1.0, target_kind="regression")
    l1 = split_metrics(outputs[:2], targets, np.arange(2),
                       zg.NodeTask(lambda out, t: jnp.mean(jnp.abs(out - t), -1), None))
    np.testing.assert_allclose(l1["loss"], np.mean(np.abs(outputs[:2] - outputs[::-1][:2] - 1)),
                               rtol=1e-6)
    assert np.isnan(split_metrics(outputs[:0], ds, ids[:0], zg.NodeTask())["loss"])


def test_a_run_evaluated_before_split_losses_resumes_ranked_by_val_loss(classes, tmp_path,
                                                                       monkeypatch):
    """A checkpoint whose last evaluation has no val_loss (written before node tasks
    reported it) resumed with best_metric="val_loss": the resume raised that the metric
    was not evaluated; that epoch is now left unranked and the next ones are."""
    from zerognn_jax._src.training.tasks import node

    split_metrics = node.split_metrics
    monkeypatch.setattr(node, "split_metrics", lambda *args: {
        k: v for k, v in split_metrics(*args).items() if k != "loss"})
    cfg = config(tmp_path, epochs=1, eval_mode="full")
    assert "val_loss" not in zg.train(cfg, classes).summary
    monkeypatch.setattr(node, "split_metrics", split_metrics)
    more = zg.train(dataclasses.replace(cfg, epochs=2, best_metric="val_loss"), classes)
    assert more.summary["best"] == {"metric": "val_loss", "epoch": 1,
                                    "value": more.history[1]["val_loss"],
                                    "scores": split_scores(more.history[1])}


def test_regression_targets_train_and_evaluate():
    g, x, tr, va, te = graph_arrays(2)
    y = x[:, :2] @ np.array([[1.0, -0.5], [0.5, 2.0]], np.float32)
    base = zg.make_dataset("reg", g.indptr, g.indices, x, np.zeros(N, int), tr, va, te, 1)
    ds = base.with_targets(y, "regression")
    res = zg.train(config(epochs=8, lr=1e-2, dropout=0.0), ds,
                   loss=lambda out, t: jnp.mean(jnp.abs(out - t), -1))  # a per-row L1 loss
    s = res.summary
    assert res.history[0]["train_batch_acc"] is None  # nothing to score
    assert {"train_mse", "val_mse", "test_mse"} <= set(s) and "val_acc" not in s
    assert {"train_loss", "val_loss", "test_loss"} <= set(s)
    assert s["val_mse"] < 0.5 * float(np.var(y[va])), s
    # evaluated again from the result: the run's task and loss (a TypeError before, the
    # default NodeTask reading float targets as classes, and softmax cross-entropy)
    again = zg.evaluate_splits(res.program, res.variables, res.data, ds, mode="sampled",
                               batch_size=64)
    assert again["val_mse"] == pytest.approx(s["val_mse"], rel=1e-5)
    assert again["val_loss"] == pytest.approx(s["val_loss"], rel=1e-5)
    one_column = base.with_targets(y[:, 0], "regression")
    assert one_column.targets.shape == (N, 1) and one_column.output_dim == 1


@pytest.mark.parametrize(("targets", "kind", "message"), [
    (np.full((N, 2), 0.5), "multilabel", "must be 0 or 1"),
    (np.full((N, 2), np.inf), "regression", r"targets contain inf \(600 entries; first at row "
                                             r"0, column 0\); mark a missing entry with NaN"),
    (np.where(np.eye(N, 2) > 0, 2.0, np.nan), "multilabel",
     r"must be 0 or 1 \(NaN: missing\), found 2.0 at row 0, column 0"),
    (np.full(N, 1e300), "regression", r"targets overflow float32: 1e\+300 at row 0"),
    (np.zeros((N - 1, 2)), "regression", r"shape \(300, T\)"),
    (np.zeros((N, 2)), "classes", "multilabel or regression"),
    (np.array(["a"] * N), "regression", "numeric"),
])
def test_bad_targets_are_refused(classes, targets, kind, message):
    with pytest.raises(ValueError, match=message):
        classes.with_targets(targets, kind)


@pytest.mark.parametrize(("loss", "error", "message"), [
    ("mse", ValueError, "needs float targets"),
    (lambda out, y: jnp.mean(optax.softmax_cross_entropy_with_integer_labels(out, y)),
     ValueError, r"one value per row, .* gave shape \(\) \(the engine averages .*: drop a "
                 r"final \.mean\(\)\)"),
    (lambda out, y: optax.softmax_cross_entropy_with_integer_labels(out, y)[:, None],
     ValueError, r"gave shape \(3, 1\) \(drop its last axis\)"),  # (.mean() was told)
    (42, TypeError, "loss must be"),
])
def test_bad_losses_are_refused_before_training(classes, loss, error, message):
    with pytest.raises(error, match=message):
        zg.train(config(), classes, loss=loss)


def test_bad_models_and_optimizers_are_refused(classes):
    with pytest.raises(TypeError, match="pass an instance"):
        zg.train(config(), classes, model=NNXSage)
    # a Linen class said "got type", naming neither the class nor the fix
    with pytest.raises(TypeError, match=r"^model is the Linen class LinenSage, not an "
                                        r"instance; pass an instance, e.g. LinenSage\(\.\.\.\)$"):
        zg.train(config(), classes, model=LinenSage)
    with pytest.raises(TypeError, match=r"^model must be a flax\.linen\.Module or a "
                                        r"flax\.nnx\.Module instance, got the class dict$"):
        zg.train(config(), classes, model=dict)
    with pytest.raises(TypeError, match="optax.GradientTransformation"):
        zg.train(config(), classes, optimizer=optax.adam)


# ------------------------------------------------------- callbacks, TensorBoard


def test_callback_sees_every_epoch_and_can_stop(classes, tmp_path):
    seen = []

    def stop_after_two(record):
        seen.append(record)
        return record["epoch"] == 1

    res = zg.train(config(tmp_path, epochs=5), classes, callbacks=[stop_after_two])
    assert [r["epoch"] for r in seen] == [0, 1] and "val_acc" in seen[0]
    assert len(res.history) == 2
    assert res.summary["stopped_early"] == {"epoch": 1, "by": "stop_after_two"}
    assert res.summary["val_acc"] == res.history[-1]["val_acc"]  # evaluated once


def test_a_stop_at_an_epoch_left_unevaluated_evaluates_it_for_the_best_checkpoint(
        classes, tmp_path):
    """The summary evaluated it, but the best checkpoint never saw that evaluation, nor
    did the epoch's record: `best` could name a worse epoch than the one the run ended on
    (eval_every=2 evaluates epochs 1 and 3; the run stops at 0)."""
    cfg = config(tmp_path, epochs=4, eval_every=2, best_metric="val_acc")
    res = zg.train(cfg, classes, callbacks=[lambda record: True])
    assert len(res.history) == 1 and res.summary["val_acc"] == res.history[0]["val_acc"]
    assert res.summary["best"] == {"metric": "val_acc", "epoch": 0,
                                   "value": res.history[0]["val_acc"],
                                   "scores": split_scores(res.history[0])}
    assert zg.restore(cfg.checkpoint_dir, cfg, classes, best=True).summary["epoch"] == 0
    back = zg.restore(cfg.checkpoint_dir, cfg, classes)  # the latest holds it too
    assert back.history[0]["val_acc"] == res.history[0]["val_acc"] == back.summary["val_acc"]
    # resumed, the run knows that evaluation: best is still a checkpoint best/ holds
    more = zg.train(dataclasses.replace(cfg, epochs=2), classes)
    assert more.history[0]["val_acc"] == res.history[0]["val_acc"]
    kept = zg.restore(cfg.checkpoint_dir, cfg, classes, best=True).summary
    assert more.summary["best"]["epoch"] == kept["epoch"]
    assert more.summary["best"]["value"] == kept["val_acc"]


@pytest.mark.parametrize("changes, why", [
    ({"eval_mode": "none"}, "eval_mode is 'none' \\(it would never stop the run\\): set "
                            "eval_mode 'full' or 'sampled'"),
    ({"epochs": 3, "eval_every": 0}, "eval_every 0 evaluates the last of 3 epochs alone "
                                     "\\(it would never stop the run\\): evaluate more "
                                     "often \\(a smaller eval_every\\)"),
    ({"epochs": 3, "eval_every": 3}, "eval_every 3 evaluates the last of 3 epochs alone "
                                     "\\(it would never stop the run\\): evaluate more "
                                     "often \\(a smaller eval_every\\)"),
])
def test_early_stopping_on_an_evaluated_metric_without_evaluation_is_refused(classes, changes,
                                                                             why):
    """It was accepted, and could never stop the run (best_metric is refused so); with
    the last epoch alone evaluated, as with none."""
    with pytest.raises(ValueError, match=f"EarlyStopping's metric 'val_acc' needs evaluation, "
                                         f"and {why}, or watch one of loss, "
                                         f"train_batch_acc"):
        zg.train(config(**changes), classes, callbacks=[zg.EarlyStopping("val_acc")])


def test_a_metric_of_an_empty_split_is_refused_before_training(tmp_path, classes):
    """An EarlyStopping on val_acc with no validation split trained every epoch and never
    stopped, silently; a best_metric there warned after the first epoch and kept no best
    checkpoint. Both are known before training."""
    no_val = dataclasses.replace(classes, val_idx=np.zeros(0, np.int32))
    with pytest.raises(ValueError, match=r"^EarlyStopping's metric 'val_acc' scores the val "
                                         r"split, and 'classes' has none \(an empty val_idx\): "
                                         r"it would never stop the run; "):
        zg.train(config(), no_val, callbacks=[zg.EarlyStopping("val_acc")])
    with pytest.raises(ValueError, match=r"^best_metric 'val_acc' scores the val split, and "
                                         r"'classes' has none .+ never keep a best checkpoint"):
        zg.train(config(tmp_path, best_metric="val_acc"), no_val)
    assert not (tmp_path / "ck").exists()
    with pytest.warns(UserWarning, match="stops the run by the test split"):
        zg.train(config(epochs=1), no_val, callbacks=[zg.EarlyStopping("test_acc")])


def test_one_early_stopping_serves_run_after_run(classes):
    """It kept the best value of the run before: the second run, whose first loss ties the
    first run's best, was stopped at its epoch 0."""
    stop = zg.EarlyStopping("loss", patience=1, mode="max")  # epoch 0 stays best
    cfg = config(epochs=4, eval_mode="none")
    for _ in range(2):
        assert zg.train(cfg, classes, callbacks=[stop]).summary["stopped_early"] == \
            {"epoch": 1, "by": "EarlyStopping"}


def test_early_stopping_counts_on_across_a_resume(tmp_path, classes):
    """A fresh EarlyStopping on resume restarted its patience (the resumed run stopped two
    epochs later than the uninterrupted one), and rerunning a run it had stopped trained
    on to `epochs`. The records a run holds are replayed to it first."""
    watch = lambda: zg.EarlyStopping("loss", patience=2, mode="max")  # epoch 0 stays best
    cfg = config(tmp_path, epochs=6, eval_mode="none")
    whole = zg.train(cfg, classes, callbacks=[watch()])
    assert whole.summary["stopped_early"] == {"epoch": 2, "by": "EarlyStopping"}
    again = zg.train(cfg, classes, callbacks=[watch()])  # the same call: nothing trains
    assert again.summary["epochs_run"] == 0 and len(again.history) == 3
    assert again.summary["stopped_early"] == whole.summary["stopped_early"]

    def crash(record):
        if record["epoch"] == 1:
            raise RuntimeError("stopped from outside")

    other = dataclasses.replace(cfg, checkpoint_dir=str(tmp_path / "other"), metrics_out=None)
    with pytest.raises(RuntimeError, match="stopped from outside"):
        zg.train(other, classes, callbacks=[watch(), crash])
    resumed = zg.train(other, classes, callbacks=[watch()])
    assert [h["loss"] for h in resumed.history] == [h["loss"] for h in whole.history]
    assert resumed.summary["stopped_early"] == whole.summary["stopped_early"]


def test_early_stopping_replayed_stops_only_if_its_patience_is_out_at_the_last_record():
    """One added on resume, whose patience ran out at an earlier record but which
    improved since, does not stop a run that went on; other callbacks are not called."""
    from zerognn_jax._src.training.callbacks import replay_early_stopping

    records = [{"epoch": 0, "m": 1.0}, {"epoch": 1, "m": 0.0}, {"epoch": 2, "m": 2.0}]
    seen = []
    assert replay_early_stopping([zg.EarlyStopping("m", 1), seen.append], records) is None
    assert replay_early_stopping([zg.EarlyStopping("m", 1)], records[:2]) == "EarlyStopping"
    assert seen == []


def test_early_stopping():
    stop = zg.EarlyStopping("val_mse", patience=2)
    assert stop.mode == "min"
    # the training loss too is better lower (it was taken as higher: a run stopped as its
    # loss fell)
    assert zg.EarlyStopping("loss").mode == "min" and zg.EarlyStopping("val_acc").mode == "max"
    values = [1.0, 0.5, 0.6, None, 0.5]  # a tie is no improvement; None is skipped
    assert [stop({"epoch": i, "val_mse": v}) for i, v in enumerate(values)] == \
        [False, False, False, False, True]
    assert stop.best == 0.5 and stop.best_epoch == 1


@pytest.mark.parametrize("args, kwargs, message", [
    ((5,), {}, r"metric must be the name of a record's metric \(e.g. 'val_acc'\), got 5"),
    (("val_acc", 2.5), {}, r"patience must be an integer >= 1, got 2.5"),
    (("val_acc", 0), {}, r"patience must be an integer >= 1, got 0"),
    (("val_acc",), {"min_delta": -1}, r"min_delta must be a finite number >= 0, got -1"),
    (("val_acc",), {"min_delta": float("nan")}, r"min_delta must be a finite number >= 0"),
])
def test_early_stopping_names_a_bad_argument(args, kwargs, message):
    """An int metric raised AttributeError from str.endswith; the others were taken."""
    with pytest.raises(ValueError, match=f"^{message}"):
        zg.EarlyStopping(*args, **kwargs)


def _scalar_tags(path) -> set[str]:
    """Tags of the scalars in a TensorBoard event file (TFRecord framing, Event protos)."""
    from tensorboardX.proto import event_pb2

    data, tags, at = path.read_bytes(), set(), 0
    while at < len(data):
        (length,) = struct.unpack("<Q", data[at:at + 8])
        event = event_pb2.Event.FromString(data[at + 12:at + 12 + length])
        tags.update(v.tag for v in event.summary.value)
        at += 16 + length
    return tags


def test_tensorboard_scalars_are_written(classes, tmp_path):
    pytest.importorskip("tensorboardX")
    logdir = tmp_path / "tb"
    zg.train(config(epochs=2, tensorboard_dir=str(logdir)), classes)
    files = list(logdir.glob("events.out.tfevents.*"))
    assert len(files) == 1
    assert {"loss", "train_batch_acc", "val_acc", "epoch_seconds"} <= _scalar_tags(files[0])


def test_tensorboard_without_the_extra_says_how_to_install(classes, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "tensorboardX", None)
    with pytest.raises(ImportError, match=r"zerognn-jax\[tensorboard\]"):
        zg.train(config(tensorboard_dir=str(tmp_path / "tb")), classes)


@pytest.mark.parametrize("given", [zg.EarlyStopping, [zg.EarlyStopping], 3])
def test_a_callback_that_is_a_class_or_no_callable_is_refused_before_any_work(given):
    """The class was accepted, and the run loaded its data and built its model before
    EarlyStopping.reset failed for want of `self`."""
    from zerognn_jax._src.training.callbacks import check_callbacks

    message = (r"got the class EarlyStopping: pass an instance, EarlyStopping\(\.\.\.\)$"
               if given != 3 else r"^callbacks must be a callable or a sequence of "
                                  r"callables, got int$")
    with pytest.raises(TypeError, match=message):
        check_callbacks(given)


def test_patience_stops_the_run_as_an_early_stopping_callback_would(classes, tmp_path):
    """`patience` is an `EarlyStopping` on best_metric (else val_loss) among the callbacks:
    the run stops at the epoch the callback stops it, with the same records."""
    cfg = config(epochs=8, lr=0.05, patience=1)
    res = zg.train(cfg, classes)
    by_hand = zg.train(dataclasses.replace(cfg, patience=0), classes,
                       callbacks=[zg.EarlyStopping("val_loss", 1)])
    assert 1 < len(res.history) < 8
    assert res.summary["stopped_early"] == {**by_hand.summary["stopped_early"],
                                            "by": "patience"}
    assert_same_runs([r["val_loss"] for r in res.history],
                     [r["val_loss"] for r in by_hand.history])
    ranked = config(tmp_path, epochs=8, lr=0.05, patience=1, best_metric="val_acc")
    assert zg.train(ranked, classes).summary["stopped_early"]["by"] == "patience"


@pytest.mark.parametrize("changes, message", [
    ({"patience": -1}, r"patience must be >= 0 \(0: no early stop\), got -1"),
    ({"patience": 2, "eval_mode": "none"},
     r"patience 2 counts evaluated epochs: eval_mode is 'none'"),
])
def test_a_bad_patience_is_refused(changes, message):
    with pytest.raises(ValueError, match=message):
        config(**changes)


def test_patience_on_a_task_without_a_loss_among_its_metrics_watches_its_first_score(
        classes):
    """A link run reports val_auc and val_ap, no val_loss (refused before)."""
    cfg = config(task="link", epochs=8, patience=1, lr=0.05)
    res = zg.train(cfg, classes)
    by_hand = zg.train(dataclasses.replace(cfg, patience=0), classes,
                       callbacks=[zg.EarlyStopping("val_auc", 1)])
    assert len(res.history) < 8  # it stopped (the auc fell)
    assert res.summary["stopped_early"] == {**by_hand.summary["stopped_early"],
                                            "by": "patience"}
    assert_same_runs([r["val_auc"] for r in res.history],
                     [r["val_auc"] for r in by_hand.history])


def test_patience_with_the_last_epoch_alone_evaluated_is_refused(classes):
    with pytest.raises(ValueError, match=r"patience 3's metric 'val_loss' needs evaluation, "
                                         r"and eval_every 0 evaluates the last of 4 epochs "
                                         r"alone \(it would never stop the run\): evaluate "
                                         r"more often \(a smaller eval_every\)$"):
        zg.train(config(epochs=4, eval_every=0, patience=3), classes)


def test_a_checkpoint_folder_keeps_the_latest_checkpoint_keep_epochs(classes, tmp_path):
    for keep, kept in ((3, [1, 2, 3]), (1, [3])):
        cfg = config(tmp_path / str(keep), epochs=4, eval_mode="none", checkpoint_keep=keep)
        zg.train(cfg, classes)
        assert sorted(int(p.name) for p in Path(cfg.checkpoint_dir).iterdir()
                      if p.name.isdigit()) == kept
    with pytest.raises(ValueError, match=r"checkpoint_keep must be >= 1 \(the latest epochs "
                                         r"a checkpoint_dir keeps\), got 0"):
        config(checkpoint_keep=0)
