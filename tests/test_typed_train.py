"""Typed node classification through `zg.train`: learning, overflow recovery, the
one-type case against the homogeneous run, checkpoints, and the refused options."""

import argparse
import dataclasses
import logging
import re
import shutil
from types import SimpleNamespace

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import assert_grown_run_agrees, assert_same_runs, runs_rtol

import zerognn_jax as zg
from zerognn_jax._src.data.hetero import as_hetero
from zerognn_jax._src.data.hetero_dataset import HeteroDataset
from zerognn_jax._src.sampling.typed_envelope import TypedEnvelope
from zerognn_jax._src.training.placement import hottest_first
from zerognn_jax._src.training.tasks.losses import row_weights
from zerognn_jax._src.training.tasks.typed_eval import typed_logits
from zerognn_jax._src.training.tasks.typed_node import TypedNodeTask

BASE = dict(dataset="mag-like", scale=0.002, model="rsage", hidden=32, layers=2,
            fanouts=(5, 5), batch_size=64, lr=0.01, progress=False, multiple=8,
            sample_ahead=1)


@pytest.fixture(scope="module")
def mag():
    return zg.load_hetero_dataset("mag-like", scale=0.002, seed=0)


@pytest.fixture(scope="module")
def whole(mag, tmp_path_factory):
    """Three epochs of rsage without a stop (exact evaluation after the last)."""
    root = tmp_path_factory.mktemp("typed")
    return zg.train(zg.TrainConfig(**BASE, epochs=3, checkpoint_dir=str(root / "whole")), mag)


@pytest.fixture(scope="module")
def stopped(mag, tmp_path_factory):
    """The same run stopped after epoch 0 (no evaluation), its checkpoint in `ckpt`: the
    resume test resumes a copy of it, the overflow test compares against it."""
    root = tmp_path_factory.mktemp("typed")
    cfg = zg.TrainConfig(**BASE, epochs=1, eval_mode="none", checkpoint_dir=str(root / "ckpt"))
    return zg.train(cfg, mag), root / "ckpt"


def test_rsage_learns_above_chance(whole):
    losses = [h["loss"] for h in whole.history]
    assert losses[-1] < losses[0]
    # 349 classes: the most common venue is 13 % of the test papers (this run: 32 %). Not a
    # bound on reading the graph: an MLP on a paper's own features, 3 epochs at these
    # settings, gives 23 to 26 % (seeds 0-3), and so does rsage at seeds 1-3 (21 to 27 %).
    assert whole.summary["test_acc"] > 0.2
    assert whole.summary["envelope_over_ideal"] >= 1.0
    assert isinstance(whole.program.task, TypedNodeTask)
    # authors, institutions and fields: one stacked 32-wide table and two moments
    assert whole.summary["embedding_bytes"] == whole.state.embedding.size * 12


def _venue_columns(mag) -> np.ndarray:
    """float32[N_paper, 4]: column k is 1 where a paper's venue class is k modulo 4 (a
    function of the venue, which mag-like's typed neighbourhood predicts)."""
    label = np.maximum(mag.labels, 0)
    return np.stack([label % 4 == k for k in range(4)], axis=1).astype(np.float32)


def test_multilabel_targets_of_the_target_type_learn(mag):
    """Float targets on a typed graph train through the node task's loss (binary
    cross-entropy) and report its metrics: 4 outputs, ROC-AUC well above chance. A
    third of the entries are missing (NaN), left out of the loss and the metrics."""
    columns = _venue_columns(mag)
    columns[np.random.default_rng(0).random(columns.shape) < 0.3] = np.nan
    ds = mag.with_targets(columns, "multilabel")
    result = zg.train(zg.TrainConfig(**BASE, epochs=3), ds)
    assert result.program.task.weight is row_weights  # (rows weighed by their given entries)
    losses = [h["loss"] for h in result.history]
    assert losses[-1] < 0.8 * losses[0]
    assert result.program.model.model.num_classes == ds.output_dim == 4
    assert {"test_acc", "test_f1", "test_rocauc"} <= set(result.summary)
    assert result.summary["test_rocauc"] > 0.65


def test_regression_targets_of_the_target_type_beat_their_mean(mag):
    """Regression (squared error) on one column: the test error ends below the test
    targets' variance, the error of predicting their mean."""
    y = _venue_columns(mag)[:, 0]
    result = zg.train(zg.TrainConfig(**BASE, epochs=3), mag.with_targets(y, "regression"))
    assert set(result.summary) >= {"val_mse", "test_mse"} and "test_acc" not in result.summary
    assert result.summary["test_mse"] < 0.9 * float(np.var(y[mag.test_idx]))


def test_rgat_trains(mag, caplog):
    """MLPerf's model, with a relation left out of the second hop (R-GCN and relational
    SAGE share its path; nn-level tests cover each model). The feature table goes to the
    device as it is: `jnp.asarray` would compile a program that copies it there (jit of
    `stage`), holding two tables at once (igbh-like at scale 1: 2 x 35 GB)."""
    cfg = zg.TrainConfig(**{**BASE, "model": "rgat", "hidden": 8}, epochs=1, eval_mode="none",
                         relation_fanouts={"cites": (3, 0)})
    with caplog.at_level(logging.WARNING), jax.log_compiles():
        result = zg.train(cfg, mag)
    assert np.isfinite(result.history[-1]["loss"])
    rows = sum(n for t, n in mag.graph.node_counts if t in mag.features)
    table = f"float32[{rows},{max(mag.feature_dims.values())}]"
    compiled = [r.getMessage() for r in caplog.records if "Compiling" in r.getMessage()]
    assert any("run" in m for m in compiled)  # the log is captured
    assert not [m for m in compiled if "stage" in m and table in m]


def test_small_envelope_overflows_and_matches_a_large_one(mag, stopped, monkeypatch):
    """Forced small capacities overflow, grow and give the losses and parameters of a
    run whose envelope never overflowed (the calibrated one of `stopped`, asserted below;
    a conservative envelope gave the same loss at a compile more)."""
    big, _ = stopped
    real = TypedNodeTask.choose_envelope

    def tiny(self, program, data, dataset, cfg):
        env, cal = real(self, program, data, dataset, cfg)
        small = tuple(tuple((t, max(1, c // 4)) for t, c in level) for level in env.capacities)
        small = tuple(tuple((t, max(c, prev)) for t, c in level)
                      for level, prev in zip(small, [env.batch_size] * len(small)))
        return TypedEnvelope(env.seed_type, env.batch_size, small), cal

    monkeypatch.setattr(TypedNodeTask, "choose_envelope", tiny)
    small = zg.train(zg.TrainConfig(**BASE, epochs=1, eval_mode="none"), mag)
    assert_grown_run_agrees(small, big)


def test_one_type_trains_as_the_homogeneous_run():
    """The tiny graph as a typed graph of one type: rsage with the SAGE model's initial
    parameters gives its losses (dropout off: Flax draws dropout masks per module path,
    which differ between the two models; conservative envelopes, which never overflow,
    spare calibrating two samplers)."""
    homo = zg.load_dataset("tiny")
    typed = HeteroDataset("tiny-typed", as_hetero(homo.graph), {"_N": homo.features}, "_N",
                          np.asarray(homo.labels), homo.train_idx, homo.val_idx,
                          homo.test_idx, homo.num_classes)
    common = dict(hidden=16, layers=2, fanouts=(4, 3), batch_size=128, epochs=2,
                  dropout=0.0, progress=False, dedup=True, flat_outer=False, multiple=64,
                  eval_mode="none", envelope="conservative")
    first = zg.train(zg.TrainConfig(dataset="tiny", model="sage", **{**common, "epochs": 0}),
                     homo)
    params = jax.tree_util.tree_leaves(first.variables["params"])
    start = zg.train(zg.TrainConfig(dataset="tiny", model="sage", **common), homo,
                     variables={"params": first.variables["params"]})
    probe = zg.train(zg.TrainConfig(dataset="tiny", model="rsage", **{**common, "epochs": 0}),
                     typed)
    tree = jax.tree_util.tree_structure(probe.variables["params"])
    mapped = jax.tree_util.tree_unflatten(tree, params)
    got = zg.train(zg.TrainConfig(dataset="tiny", model="rsage", **common), typed,
                   variables={"params": mapped})
    for a, b in zip(got.history, start.history):
        np.testing.assert_allclose(a["loss"], b["loss"], rtol=1e-5)
        assert a["max_counts"] == b["max_counts"]


def test_predict_gives_the_target_types_logits(mag, whole):
    """zg.predict on a typed run: the target type's logits, exact ones reproducing the
    evaluation's test accuracy, sampled ones of the same shape; ids checked against
    the target type's count; the homogeneous graph's lower-level calls name predict."""
    test = np.asarray(mag.test_idx)
    exact = np.asarray(zg.predict(whole, test))
    assert exact.shape == (test.size, mag.num_classes)
    labels = np.asarray(mag.labels)[test]
    assert np.mean(exact.argmax(1) == labels) == pytest.approx(whole.summary["test_acc"])
    assert np.asarray(zg.predict(whole, test[:5], mode="sampled")).shape == (5, mag.num_classes)
    papers = mag.num_nodes["paper"]
    with pytest.raises(ValueError, match=rf"\[0, {papers}\) \('paper' ids\)"):
        zg.predict(whole, [papers])
    assert_same_runs(np.asarray(zg.predict(whole, test[:3], node_type="paper")), exact[:3])
    with pytest.raises(ValueError, match="predicts the nodes of its target type 'paper'; "
                                         "got node_type 'author'"):
        zg.predict(whole, [0], node_type="author")
    typed = "this run's graph is typed: zg.predict\\(result, nodes\\) gives its 'paper'"
    with pytest.raises(TypeError, match="sampled_logits evaluates a graph of one node type; "
                                        + typed):
        zg.sampled_logits(whole.program, whole.variables, whole.data, test[:5], batch_size=8)
    with pytest.raises(TypeError, match="layerwise_logits evaluates .*" + typed):
        zg.layerwise_logits(whole.program, whole.variables, whole.data)
    with pytest.raises(TypeError, match="evaluate_splits evaluates .*" + typed):
        zg.evaluate_splits(whole.program, whole.variables, whole.data, mag)
    with pytest.raises(TypeError, match="node_embeddings evaluates .*" + typed):
        zg.node_embeddings(whole.program, whole.variables, whole.data)



def test_sampled_evaluation_scores_each_split_as_predict_gives_it(mag, whole, monkeypatch):
    """A typed run's sampled evaluation sampled train, val and test as one list, so a
    val node's draws followed the size of train and the batch it fell in, and its
    metrics were not `zg.predict`'s of the split (docs/api.md says they are). The splits
    run through one compiled pass (each compiled its own)."""
    from zerognn_jax._src.training.evaluate import Predictor
    from zerognn_jax._src.training.tasks import typed_eval

    run, programs = typed_eval._sampled_pass, []

    def record(*args, envelope, **kwargs):
        programs.append((args[3].shape, envelope))
        return run(*args, envelope=envelope, **kwargs)

    monkeypatch.setattr(typed_eval, "_sampled_pass", record)
    batch = 16
    sampled = Predictor(whole.program, whole.variables, whole.data, "sampled", batch, 3)
    metrics = whole.program.task.evaluate(sampled, mag)
    assert len(programs) > 3 and len(set(programs)) == 1  # calls of three splits
    for split in ("val", "test"):
        ids = np.asarray(getattr(mag, f"{split}_idx"))
        assert ids.size > batch  # several batches, the train split before them
        logits = np.asarray(zg.predict(whole, ids, mode="sampled", batch_size=batch, seed=3))
        assert metrics[f"{split}_acc"] == np.mean(logits.argmax(1) == mag.labels[ids])


def test_sampled_predictions_of_nearby_sizes_share_a_program(mag, whole, monkeypatch):
    """Typed `zg.predict` in sampled mode calibrated an exact envelope for every request
    and compiled its pass again (a probe: 20 s a request on a CPU). A request's batch,
    steps and capacities are rounded up to shared sizes and never below what earlier
    requests took, so requests A, B, A of nearby sizes run at most two programs, the
    second A on B's; every output equals the unrounded pass's (to the rounding that
    other shapes give the products), and a paper in both requests gets one row."""
    from zerognn_jax._src.training.tasks import typed_eval

    run, seen = typed_eval._sampled_pass, []

    def record(*args, envelope, **kwargs):
        seen.append((args[3].shape[0], envelope))
        return run(*args, envelope=envelope, **kwargs)

    test = np.asarray(mag.test_idx)
    a, b = test[:50], test[20:73]
    plain = {}
    for ids in (a, b):
        plain[ids.size] = typed_eval.sampled_logits(whole.program.task, whole.program,
                                                    whole.variables, whole.data, ids,
                                                    batch_size=64)
    # the 30 papers both ask for have their own samples, whichever request draws them
    np.testing.assert_allclose(plain[50][20:], plain[53][:30], rtol=1e-5, atol=1e-5)
    monkeypatch.setattr(typed_eval, "_sampled_pass", record)
    for ids in (a, b, a):
        got = np.asarray(zg.predict(whole, ids, mode="sampled", batch_size=64))
        np.testing.assert_allclose(got, plain[ids.size], rtol=1e-5, atol=1e-5)  # shapes
    # 50 and 53 seeds: one step of 64 each (a power of two, the batch size here)
    assert [rows for rows, _ in seen] == [64, 64, 64]
    first, second, again = (env for _, env in seen)
    assert all(second.level(h)[t] >= c for h, level in enumerate(first.levels)
               for t, c in level.items())
    assert again == second == typed_eval._SERVED[whole.program.task][64]

def test_resume_from_checkpoint(mag, whole, stopped, tmp_path):
    """A run stopped after epoch 0 resumes to the uninterrupted run's losses, and
    `restore` gives back the resumed variables, the featureless types' table and its
    lazy Adam state included (the table alone for inference)."""
    shutil.copytree(stopped[1], tmp_path / "ckpt")  # the fixture's own stays as it was
    # naming no model takes rsage on a typed graph, the model of the checkpoint's run
    cfg = zg.TrainConfig(**{**BASE, "model": None}, epochs=3,
                         checkpoint_dir=str(tmp_path / "ckpt"))
    resumed = zg.train(cfg, mag)
    assert resumed.summary["start_epoch"] == 1
    assert "envelope_over_ideal" not in resumed.summary  # the checkpoint's: no calibration
    np.testing.assert_allclose([h["loss"] for h in resumed.history],
                               [h["loss"] for h in whole.history], rtol=runs_rtol())
    back = zg.restore(cfg.checkpoint_dir, cfg, mag)
    assert "embedding" in back.variables
    for a, b in zip(jax.tree_util.tree_leaves((back.variables, back.state.embedding_opt)),
                    jax.tree_util.tree_leaves((resumed.variables,
                                               resumed.state.embedding_opt))):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    ready = zg.restore(cfg.checkpoint_dir, cfg, mag, for_inference=True)
    np.testing.assert_array_equal(np.asarray(ready.variables["embedding"]),
                                  np.asarray(resumed.variables["embedding"]))


def test_node_types_listed_in_another_order_are_another_dataset(mag, stopped, tmp_path):
    """The featureless types' rows lie in one table in the order of the types: the same
    graph with its types listed in another order had restored and resumed with those
    rows read as another type's, unremarked."""
    g = mag.graph
    order = ("paper", "field_of_study", "institution", "author")
    moved = dataclasses.replace(mag, graph=dataclasses.replace(
        g, node_counts=tuple((t, g.num_nodes[t]) for t in order)))
    assert moved.graph.node_types == order != g.node_types
    shutil.copytree(stopped[1], tmp_path / "ckpt")
    cfg = zg.TrainConfig(**{**BASE, "model": None}, epochs=2,
                         checkpoint_dir=str(tmp_path / "ckpt"))
    told = r"dataset.node_types \[\['paper', \d+\], \['author', \d+\]"
    for run in (lambda: zg.restore(cfg.checkpoint_dir, dataset=moved, for_inference=True),
                lambda: zg.train(cfg, moved)):
        with pytest.raises(zg.CheckpointMismatch, match=told):
            run()
    # another typed graph is named as such, before its envelope is built from the
    # checkpoint's capacities by type (a capacity message, or a KeyError, before)
    shop = zg.load_hetero_dataset("shop-like", scale=0.0005)
    with pytest.raises(zg.CheckpointMismatch, match="dataset.name 'mag-like' there, "
                                                    "'shop-like' here"):
        zg.restore(cfg.checkpoint_dir, dataset=shop, for_inference=True)


def test_rgcn_bases_over_sources_of_two_widths_name_the_width_to_set(mag):
    """The featureless types' rows are `hidden` wide, the papers' features 128: R-GCN's
    bases need one width, and the message (it said "a batch of graphs") says which."""
    model = zg.make_hetero_model("rgcn", hidden=32, num_layers=2,
                                 num_classes=mag.num_classes, target_type="paper",
                                 relations=mag.graph.relations, num_bases=2)
    with pytest.raises(ValueError, match=r"fails on its first batch \(a typed batch\): "
                                         r"ValueError: R-GCN bases need one source width per "
                                         r"layer, got \[32, 128\] \(.*author__writes__paper "
                                         r"32.*paper__cites__paper 128.*\).*TrainConfig."
                                         r"hidden wide.*need padding to one"):
        zg.train(zg.TrainConfig(**BASE, epochs=1), mag, model=model)


def test_a_model_of_another_target_type_is_told_what_the_batch_holds(mag):
    """A model built for authors on a paper task failed with a bare KeyError: 'author'."""
    model = zg.make_hetero_model("rsage", hidden=16, num_layers=2,
                                 num_classes=mag.num_classes, target_type="author",
                                 relations=mag.graph.relations)
    with pytest.raises(ValueError, match=r"KeyError: 'author' \(the batch's seeds are 'paper' "
                                         r"nodes and its relations .*writes.*: does the model "
                                         r"name the dataset's target type and relations\?\)"):
        zg.train(zg.TrainConfig(**BASE, epochs=1), mag, model=model)


@pytest.mark.parametrize("change, message", [
    (dict(model="sage"), "model 'sage' is a model of one-type graphs; this node task of a "
                         "typed graph takes one of rsage, rgcn, rgat"),
    (dict(engine="host-exact"), "typed graphs train on the scan engine"),
    (dict(relation_fanouts={"nope": (1, 1)}), "relation_fanouts key 'nope' names no"),
    (dict(relation_fanouts={"cites": (1,)}),
     "relation_fanouts['cites'] is (1,)"),
    (dict(relation_fanouts={"cites": (1, 1), "paper__cites__paper": (2, 2)}),
     "relation_fanouts names paper__cites__paper twice, as 'cites' and "
     "'paper__cites__paper'"),
    (dict(task="graph"), "task 'graph' does not train typed datasets"),
    (dict(edge_features=True, model="rgat"), "no relation of 'mag-like' has any"),
])
def test_refused_options(mag, change, message):
    with pytest.raises(ValueError) as err:
        zg.train(zg.TrainConfig(**{**BASE, **change}, epochs=1), mag)
    assert message in str(err.value) and "\n" not in str(err.value)


def test_features_on_the_host_train_as_on_the_device(mag, stopped, capsys, monkeypatch):
    """The stacked feature table in host memory, laid out by `TypedInputs.degrees` and
    read by the host gather per type (its 50 hottest rows cached on the device, the
    others read over PCIe, 10 steps sampled at once and their rows of every type read
    together): the same epoch loss as `stopped`'s, the table on the device and each
    step sampled alone inside its step, to float rounding (the samples and their dropout
    units the same: each type's units were drawn in the dict's order, which differed
    when the sample crossed a jit boundary, 6.045 against 6.022). Two groups of 10 make
    the epoch's 20 steps: a host table's default, 16, would compile the step again for
    the last 4 (tests/test_host_rows.py runs that default)."""
    row_gib = max(mag.feature_dims.values()) * 4 / 2**30  # a row of the stacked table
    cfg = zg.TrainConfig(**{**BASE, "progress": True, "sample_ahead": 10}, epochs=1,
                         eval_mode="full", feature_placement="host",
                         feature_cache_gib=50 * row_gib)
    res = zg.train(cfg, mag)
    assert re.search(r"rows by degree: a copy of .* fits the host's .* available; its 50 "
                     r"rows of highest degree \(", capsys.readouterr().err)
    assert res.summary["feature_placement"] == "host"
    assert res.summary["sample_ahead"] == 10 and res.history[0]["steps"] == 20
    assert res.summary["host_row_order"] == "degree"
    # a paper's uses as a source (only papers have features): cites, has_topic and
    # rev_writes, all three drawn at the second hop; or only those of the relations named
    task = res.program.task
    heat = task.inputs.degrees(mag.graph, {r for h in task.sampler.plan("paper")
                                           for r in h.relations})
    papers = mag.num_nodes["paper"]
    uses = {r: np.bincount(g.indices, minlength=papers)
            for r, g in mag.graph.items() if r[0] == "paper"}
    assert len(uses) == 3
    np.testing.assert_array_equal(heat, sum(uses.values()))
    cites = ("paper", "cites", "paper")
    np.testing.assert_array_equal(task.inputs.degrees(mag.graph, {cites}), uses[cites])
    table = task.inputs.table(mag, np.dtype(np.float32), False)
    np.testing.assert_array_equal(np.asarray(res.data.features.rows),
                                  table[hottest_first(heat, 50)])
    assert [r["loss"] for r in res.history] == \
        pytest.approx([r["loss"] for r in stopped[0].history], rel=runs_rtol())
    # exact evaluation reads the host table onto the device: the logits of the same
    # variables over the table on the device, bit for bit, and the run's test accuracy
    exact = SimpleNamespace(mode="full", program=res.program, variables=res.variables,
                            data=res.data, batch_size=64, seed=0)
    on_device = SimpleNamespace(**{**vars(exact),
                                   "data": res.data._replace(features=jnp.asarray(table))})
    logits = typed_logits(task, on_device, mag.test_idx)
    assert_same_runs(typed_logits(task, exact, mag.test_idx), logits)
    assert res.summary["test_acc"] == np.mean(logits.argmax(1) == mag.labels[mag.test_idx])
    from zerognn_jax._src.training.tasks import typed_eval

    # the table's bytes are what count: one byte less, and the rows are read in chunks
    # (tests/test_typed_embeddings.py), the same logits
    for free in (table.nbytes, table.nbytes - 1):
        monkeypatch.setattr(typed_eval, "device_free_bytes", lambda free=free: free)
        np.testing.assert_allclose(typed_logits(task, exact, mag.test_idx), logits,
                                   rtol=1e-5, atol=1e-5)


def test_placement_on_a_small_device(mag, monkeypatch, capsys):
    """"auto" on a device too small for the table: the host with sampled evaluation, or
    with exact evaluation by a model that takes chunks; the device, and a line saying
    why, with exact evaluation by a model that reads the whole table onto the device.
    The host asked for with exact evaluation by such a model: the default cache leaves
    the table room beside graph and model, and a device too small for all three stops
    the run. On a device with room, "auto" gives the device, and a line saying so."""
    from zerognn_jax._src.training.tasks import typed_node

    f32 = np.dtype(np.float32)
    monkeypatch.setattr(typed_node, "device_memory_limit", lambda: 1 << 20)
    graph = typed_node.prepare_typed_graph(mag.graph, TypedNodeTask.build(
        zg.TrainConfig(**BASE), mag)[0].sampler)
    for mode, where in (("sampled", zg.HostTable), ("full", np.ndarray)):
        cfg = zg.TrainConfig(**{**BASE, "progress": True}, eval_mode=mode)
        task = TypedNodeTask.build(cfg, mag)[0]
        table = task.inputs.table(mag, f32, False)
        assert isinstance(task._placed(cfg, graph, table, f32)[0], where)
    err = capsys.readouterr().err
    assert "features on the host (" in err and "would leave the step less than 25%" in err
    assert re.search(r"features on the device \(0\.\d\d GiB\): kept for exact evaluation, "
                     r"although graph .* eval_mode 'sampled' would put them on the host", err)
    host = dataclasses.replace(cfg, feature_placement="host")
    with pytest.raises(ValueError, match=r"exceed its 0\.00 GiB: set eval_mode 'sampled'"):
        task._placed(host, graph, table, f32)
    # a model that evaluates in chunks reads a table too large for the device by chunks:
    # "auto" follows the step's memory, and the host with exact evaluation stands
    for chosen in (cfg, host):
        assert isinstance(task._placed(chosen, graph, table, f32, whole_table=False)[0],
                          zg.HostTable)
    # room for graph, table, model and 10 rows in three quarters of the device
    row = table.shape[1] * 4
    total = (sum(int(a.nbytes) for a in jax.tree_util.tree_leaves(graph)) + table.nbytes
             + task.inputs.embedded_rows * cfg.hidden * (4 + 8))
    limit = (total + 10 * row + row // 2) * 4 // 3
    monkeypatch.setattr(typed_node, "device_memory_limit", lambda: limit)
    assert task._placed(host, graph, table, f32)[0].rows.shape[0] == 10
    monkeypatch.setattr(typed_node, "device_memory_limit", lambda: 64 << 30)
    assert isinstance(task._placed(cfg, graph, table, f32)[0], np.ndarray)
    assert re.search(r"features on the device \(0\.00 GiB\): graph .* fit",
                     capsys.readouterr().err)


def test_a_typed_group_reads_every_types_rows_in_one_call():
    """Three steps' outermost rows of every type with features (igbh-like: all six)
    read from a host table in one call, each type's block equal to that step's own
    gather of it; the memory check's rows a step: the featured types' outermost
    capacities."""
    from zerognn_jax._src.training import scan

    igbh = zg.load_hetero_dataset("igbh-like", scale=0.0005, seed=0)
    cfg = zg.TrainConfig(**{**BASE, "dataset": "igbh-like", "scale": 0.0005, "hidden": 8,
                            "fanouts": (3, 2), "batch_size": 32},
                         epochs=1, eval_mode="none", feature_placement="host",
                         feature_cache_gib=0, envelope="conservative")
    task, ds = TypedNodeTask.build(cfg, igbh)
    data, program = task.prepare_run(cfg, ds, model=None, tx=None,
                                     kernels=zg.Kernels.parse("xla"))
    env, _ = task.choose_envelope(program, data, ds, cfg)
    perm = jnp.asarray(ds.train_idx, jnp.int32)
    sampled = jax.jit(jax.vmap(lambda s: scan.sample_step(program, s, data, perm, 0, 3,
                                                          env)))(jnp.arange(3, dtype=jnp.int32))
    ids, valid = sampled.mb.nodes[-1], sampled.mb.valid[-1]
    assert len(ids) == len(task.inputs.widths) > 1
    assert task.feature_rows(env) == sum(i[0].size for i in ids)
    assert scan.steps_per_read(data, sampled, 1 << 30) == 3
    rows = scan.read_ahead(program, data, sampled).rows
    for k in range(3):
        for got, i, v in zip(rows, ids, valid):
            np.testing.assert_array_equal(np.asarray(got[k]),
                                          np.asarray(data.features.gather(i[k], v[k])))


def test_a_users_relational_model_trains(mag):
    """R-GCN with basis decomposition, which no TrainConfig field asks for, built by the
    user (`make_hetero_model(num_bases=)`) and trained through `zg.train(cfg, ds,
    model=...)`: its bases are parameters, the summary names the model, and the loss
    falls."""
    width = mag.feature_dims["paper"]  # bases need one source width: embeddings are hidden
    cfg = zg.TrainConfig(**{**BASE, "model": "rgcn", "hidden": width}, epochs=2,
                         eval_mode="none")
    model = zg.make_hetero_model("rgcn", hidden=width, num_layers=2,
                                 num_classes=mag.num_classes, target_type="paper",
                                 relations=mag.graph.relations, num_bases=2)
    res = zg.train(cfg, mag, model=model)
    bases = [v.shape for k, v in jax.tree_util.tree_flatten_with_path(
        res.variables["params"])[0] if "bases" in jax.tree_util.keystr(k)]
    # a layer's conv per destination type: author, field and paper, then paper
    assert [b[0] for b in bases] == [2, 2, 2, 2]
    assert res.summary["model"].endswith("HeteroGNN")
    assert res.history[1]["loss"] < res.history[0]["loss"]


def test_config_and_flag_of_relation_fanouts():
    with pytest.raises(ValueError, match=r"relation_fanouts\['cites'\] must be >= 0"):
        zg.TrainConfig(**BASE, relation_fanouts={"cites": (-2, 1)})
    from zerognn_jax.cli.flags import fanout_dict

    assert fanout_dict("cites=25,20; writes=10,0") == {"cites": (25, 20), "writes": (10, 0)}
    with pytest.raises(argparse.ArgumentTypeError,
                       match=r"relation 'cites' is given twice in 'cites=1,1; cites=2,2'"):
        fanout_dict("cites=1,1; cites=2,2")
    assert fanout_dict("cites=25,20;;") == {"cites": (25, 20)}  # empty entries skipped
    with pytest.raises(argparse.ArgumentTypeError, match=r"relation 'cites' has no fanouts"):
        fanout_dict("cites=; writes=1,1")
    with pytest.raises(argparse.ArgumentTypeError, match=r"entries separated by ';', got ' ; '"):
        fanout_dict(" ; ")


def test_a_run_over_device_memory_stops_before_compiling(mag, monkeypatch):
    """The memory check of graph batches serves typed steps too: the tables, the state
    as allocated and the envelope's rows against the device's memory; with a host table,
    the rows read ahead too, and the advice to read fewer steps ahead."""
    from zerognn_jax._src.training import memory

    monkeypatch.setattr(memory, "device_memory_limit", lambda device=None: 1 << 20)
    with pytest.raises(ValueError, match=r"does not fit device memory: graph .* features "
                                         r".* step buffers .*now 64\)"):
        zg.train(zg.TrainConfig(**BASE, epochs=1, eval_mode="none"), mag)
    # a bfloat16 host table (nothing of it on the device) read 16 steps ahead
    with pytest.raises(ValueError, match=r"features 0\.00 GiB \(bfloat16, cached rows of the "
                                         r"host table\)"
                                         r".*To fit: sampling fewer steps ahead \(--sample-"
                                         r"ahead 1: none\) drops up to 0\.0[0-9] GiB of feature "
                                         r"rows read ahead from the host table; a smaller batch"):
        zg.train(zg.TrainConfig(**{**BASE, "sample_ahead": None}, epochs=1, eval_mode="none",
                                dtype="bfloat16", feature_placement="host",
                                feature_cache_gib=0), mag)


def _with_ghosts(relations: bool = True) -> HeteroDataset:
    """Authors write papers; "ghost", a type without nodes, haunts papers (no edges)."""
    rs = np.random.default_rng(0)
    edges = {("author", "writes", "paper"): (rs.integers(0, 50, 300), rs.integers(0, 100, 300)),
             ("ghost", "haunts", "paper"): (np.zeros(0, int), np.zeros(0, int))}
    order = rs.permutation(100)
    return zg.make_hetero_dataset(
        "ghosts", {"author": 50, "paper": 100, "ghost": 0}, edges if relations else {},
        target_type="paper", labels=rs.integers(0, 3, 100), num_classes=3,
        features={"paper": rs.normal(size=(100, 8)).astype(np.float32)},
        train_idx=order[:60], val_idx=order[60:80], test_idx=order[80:])


def test_a_type_without_nodes_may_source_a_relation():
    """Its relation draws nothing (the pooled relabel's id table of such a type had no
    entry, and sampling failed in JAX's gather)."""
    cfg = zg.TrainConfig(**{**BASE, "fanouts": (3, 3), "hidden": 8, "batch_size": 32},
                         epochs=1)
    result = zg.train(cfg, _with_ghosts())
    assert np.isfinite(result.history[0]["loss"]) and result.summary["test_acc"] is not None


def test_a_typed_graph_without_relations_is_refused_in_one_line():
    with pytest.raises(ValueError, match=r"^the typed graph has no relations, so a relational "
                                         r"model has no neighbours to sample \(its node types: "
                                         r"author, paper, ghost\): give it at least one$"):
        zg.train(zg.TrainConfig(**BASE, epochs=1), _with_ghosts(relations=False))


def test_normalize_features_names_the_type_and_row_of_a_negative_value():
    """Typed tables are normalised block by block: the row is the type's own."""
    with pytest.raises(ValueError, match=r"^normalize_features divides each row of the "
                                         r"'paper' features by its sum, which needs values "
                                         r">= 0 \(counts, bags of words\); found -[\d.]+ at "
                                         r"row \d+, column \d+"):
        zg.train(zg.TrainConfig(**BASE, epochs=1, normalize_features=True), _with_ghosts())


def test_typed_slots_past_int32_are_named():
    with pytest.raises(ValueError, match=r"^hop 1 would sample 34,359,738,368 slots of "
                                         r"'author' nodes, more than int32 positions reach"):
        zg.train(zg.TrainConfig(**{**BASE, "fanouts": (2**30, 2**30), "batch_size": 32},
                                replace=True, epochs=1), _with_ghosts())


def test_a_featureless_type_without_nodes_trains():
    """Its learnable rows were a table of none, which the step's gather refused."""
    ds = zg.make_hetero_dataset(
        "toy", {"author": 0, "paper": 8},
        {("author", "writes", "paper"): (np.array([], int), np.array([], int)),
         ("paper", "cites", "paper"): (np.array([0, 1, 3, 5, 6]), np.array([1, 2, 4, 6, 7]))},
        target_type="paper", labels=np.arange(8) % 2, train_idx=[0, 1, 2, 3],
        val_idx=[4, 5], test_idx=[6, 7],
        features={"paper": np.random.default_rng(0).normal(size=(8, 3))})
    res = zg.train(zg.TrainConfig(hidden=8, layers=2, fanouts=(3, 2), batch_size=4, epochs=1,
                                  eval_mode="none", progress=False), ds)
    assert np.isfinite(res.history[-1]["loss"])



def test_a_typed_modules_layer_of_the_homogeneous_signature_is_refused_first(mag):
    """A typed graph's module whose `layer` took a homogeneous model's (i, h_src, h_dst,
    view) trained every epoch, then failed in exact evaluation with a bare TypeError
    (its training lost without a checkpoint); it is refused before training."""
    import flax.linen as nn

    class HomogeneousLayer(nn.Module):
        num_layers: int = 2

        def __call__(self, x, layers, *, train):
            raise AssertionError("not called: refused before training")

        def layer(self, i, h_src, h_dst, view, *, train):
            raise AssertionError("not called")

    cfg = zg.TrainConfig(**{**BASE, "model": None}, epochs=1)
    with pytest.raises(ValueError, match=r"HomogeneousLayer's layer\(i, h_src, h_dst, view, "
                                         r"\*, train\) cannot take a typed graph's layer\(i, "
                                         r"h, layer, \*, train\) \(missing a required "
                                         r"argument: 'view'\), which exact evaluation calls "
                                         r"after training"):
        zg.train(cfg, mag, model=HomogeneousLayer())


def _nnx_relational(mag, *, with_layer: bool):
    """A relational NNX model of a user's: per layer and destination type, a dense map of
    its own rows plus one of the mean of each relation's sources; with `with_layer`, the
    typed per-layer protocol (`num_layers`, `layer(i, h, layer)`) too."""
    from flax import nnx

    types = sorted(mag.graph.num_nodes)
    widths = {t: mag.feature_dims.get(t, 16) for t in types}  # featureless: hidden-wide
    out = (16, mag.num_classes)

    class Relational(nnx.Module):
        def __init__(self, rngs):
            self.own = nnx.Dict({f"{i}{t}": nnx.Linear(widths[t] if i == 0 else 16, out[i],
                                                       rngs=rngs)
                                 for i in range(2) for t in types})
            self.rel = nnx.Dict({f"{i}{'_'.join(r)}": nnx.Linear(
                widths[r[0]] if i == 0 else 16, out[i], rngs=rngs)
                for i in range(2) for r in mag.graph.relations})

        def _layer(self, i, h, layer):
            new = {}
            for t, _ in layer.num_dst:
                acc = self.own[f"{i}{t}"](layer.dst_rows(t, h[t]))
                for r, view in layer.views.items():
                    if r[2] == t:
                        mean = view.weighted_sum(h[r[0]][:, None, :], zg.mean_weights(view))
                        acc = acc + self.rel[f"{i}{'_'.join(r)}"](mean[:, 0, :])
                new[t] = acc if i == 1 else nnx.relu(acc)
            return new

        def __call__(self, x, layers, *, train):
            for i, layer in enumerate(layers):
                x = self._layer(i, x, layer)
            return x["paper"]

    class WithLayers(Relational):
        num_layers = 2
        traced = []  # the layers exact inference traced (a Python side effect)

        def layer(self, i, h, layer, *, train):
            WithLayers.traced.append(i)
            return self._layer(i, h, layer)

    return (WithLayers if with_layer else Relational)(nnx.Rngs(0))


@pytest.mark.parametrize("with_layer", [True, False])
def test_a_users_nnx_relational_model_is_evaluated(mag, with_layer):
    """An NNX model on a typed graph trained its epoch, then its exact evaluation called
    the wrapper's homogeneous `layer(i, h_src, h_dst, view)` with a typed layer's
    arguments (TypeError), with or without a `layer` of the module's own: now the
    module's typed `layer` runs exact inference, and a module without one is evaluated
    on sampled neighbourhoods, as its summary says."""
    cfg = zg.TrainConfig(**{**BASE, "model": None, "hidden": 16}, epochs=1)
    model = _nnx_relational(mag, with_layer=with_layer)
    if with_layer:  # two layers and one hop: it ran one and gave its hidden rows, which
        # were named as outputs of the wrong width
        with pytest.raises(ValueError, match=r"^the model's num_layers is 2 and the run "
                                             r"samples 1 hops"):
            zg.train(dataclasses.replace(cfg, layers=1, fanouts=(5,)), mag, model=model)
    res = zg.train(cfg, mag, model=model)
    assert res.summary["model"].endswith("WithLayers" if with_layer else ".Relational")
    assert 0 <= res.summary["test_acc"] <= 1
    assert hasattr(res.program.model.model, "layer") == with_layer  # what exact asks
    if with_layer:  # the evaluation ran the module's own layers, each of them
        assert sorted(set(type(model).traced)) == [0, 1]
        assert res.summary["eval_mode"] == "full" and "eval_note" not in res.summary
    else:  # the summary said "full", as if the figures were exact
        assert res.summary["eval_mode"] == "sampled"
        assert res.summary["eval_note"].startswith("the model ") and res.summary[
            "eval_note"].endswith(" has no layer(i, h, layer, *, train), which a typed "
                                  "graph's exact layer-wise inference needs "
                                  "(docs/hetero.md): evaluated on sampled neighbourhoods "
                                  "(the training fanouts)")
