"""Restoring for inference with the model only, from what the checkpoint records, and
`predict` on a subset of nodes (issue #35 item 4)."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from conftest import labelled_dataset, mean_layer

import zerognn_jax as zg
from zerognn_jax.cli import main


class MeanConcat(nn.Module):
    """A user's model without the per-layer protocol (predict samples)."""

    hidden: int
    out: int

    @nn.compact
    def __call__(self, x, views, *, train):
        for i, view in enumerate(views):
            last = i == len(views) - 1
            dense = nn.Dense(self.out if last else self.hidden)
            x = mean_layer(dense, x, None, view)
            x = x if last else nn.relu(x)
        return x


def smoothed(logits, labels):
    onehot = optax.smooth_labels(jnp.eye(logits.shape[-1])[labels], 0.1)
    return optax.softmax_cross_entropy(logits, onehot)


def test_restore_for_inference_needs_the_model_only(planetoid_root, tmp_path, capsys):
    """Failed before: `CheckpointMismatch: custom.optimizer 'custom' there, absent here`,
    and without the config the dataset was searched for under ~/.cache."""
    cfg = zg.TrainConfig(dataset="cora", root=planetoid_root, model="gcn", hidden=16,
                         layers=2, fanouts=(5, 5), batch_size=140, epochs=1, lr=0.01,
                         eval_every=0, progress=False, envelope="conservative",
                         checkpoint_dir=str(tmp_path / "ck"))
    model = MeanConcat(16, 7)
    result = zg.train(cfg, model=model, optimizer=optax.sgd(0.05), loss=smoothed)
    back = zg.restore(cfg.checkpoint_dir, model=MeanConcat(16, 7), for_inference=True)
    assert back.summary["epoch"] == 0 and back.dataset.name == "cora"
    assert back.summary["written_by"] == {"zerognn_jax": zg.__version__, "jax": jax.__version__}
    for a, b in zip(jax.tree_util.tree_leaves(back.variables),
                    jax.tree_util.tree_leaves(result.variables), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    logits = zg.predict(back, [5, 700, 2000, 12], mode="sampled", batch_size=64)
    assert logits.shape == (4, 7) and np.isfinite(np.asarray(logits)).all()
    with pytest.raises(zg.CheckpointMismatch) as other:
        zg.restore(cfg.checkpoint_dir, model=MeanConcat(8, 7), for_inference=True)
    # each variable that differs, with its shape there and here (it was a raw set
    # difference of both sides' entries, cut after three, so a pair could show half)
    assert str(other.value) == (
        f"checkpoint_dir {tmp_path / 'ck'} holds other model variables (epoch 0): "
        "['params']['Dense_0']['bias'] [[16], 'float32'] there, [[8], 'float32'] here; "
        "['params']['Dense_0']['kernel'] [[2866, 16], 'float32'] there, [[2866, 8], "
        "'float32'] here; ['params']['Dense_1']['kernel'] [[32, 7], 'float32'] there, "
        "[[16, 7], 'float32'] here; restore it with the settings, dataset and model it "
        "was trained with")
    with pytest.raises(zg.CheckpointMismatch, match=r"holds a run with other settings "
                       r"\(epoch 0\): lr 0\.01 there, 0\.1 here; restore it with the "
                       r"settings, dataset and model it was trained with$"):
        zg.restore(cfg.checkpoint_dir, cfg=dataclasses.replace(cfg, lr=0.1),
                   model=MeanConcat(16, 7), optimizer=optax.sgd(0.05), loss=smoothed)
    with pytest.raises(ValueError, match=r"nodes must lie in \[0, 2708\)"):
        zg.predict(back, [2708])
    # without the model: said before the dataset is loaded or a model built, and the
    # command, which builds built-in models only, says where such a run is exported
    with pytest.raises(zg.CheckpointMismatch, match=r"ck holds a run of a model of your "
                       r"own, MeanConcat \(epoch 0\): pass it as model=$"):
        zg.restore(cfg.checkpoint_dir, for_inference=True)
    out = tmp_path / "model.bin"
    assert main(["export", cfg.checkpoint_dir, "--out", str(out)]) == 2
    assert capsys.readouterr().err == (
        f"zerognn: error: {cfg.checkpoint_dir} holds a run of a model of your own "
        "(MeanConcat); this command builds the built-in models only: export it from "
        "Python, zg.export_model on zg.restore(..., model=..., for_inference=True)\n")
    assert not out.exists()
    assert main(["predict", cfg.checkpoint_dir, "--out", str(tmp_path / "p.npz")]) == 2
    assert capsys.readouterr().err.endswith(
        "built-in models only: call zg.predict from Python on zg.restore(..., model=..., "
        "for_inference=True)\n")
    assert not (tmp_path / "p.npz").exists()
    with pytest.raises(ValueError, match="node_type picks a node type of a typed graph's "
                                         "run; this run's graph has one type \\(its task "
                                         "'node'\\)$"):  # (it named the class, NodeTask)
        zg.predict(back, [0], node_type="paper")


def test_a_resume_with_another_optimizer_or_model_names_what_differs(tmp_path):
    """Another optimizer's state was called "other model variables"; another model's
    showed its optimizer's moments first (sorted before the parameters), three of them,
    and no remedy."""
    cfg = zg.TrainConfig(dataset="tiny", layers=2, fanouts=(2, 2), batch_size=512,
                         epochs=1, eval_mode="none", progress=False,
                         checkpoint_dir=str(tmp_path / "ck"))
    zg.train(cfg, model=MeanConcat(8, 47), optimizer=optax.adam(1e-3))
    resumed = dataclasses.replace(cfg, epochs=2)
    with pytest.raises(zg.CheckpointMismatch) as other:
        zg.train(resumed, model=MeanConcat(8, 47), optimizer=optax.sgd(1e-3))
    assert str(other.value).startswith(
        f"checkpoint_dir {cfg.checkpoint_dir} holds another optimizer's state (another "
        f"optimizer, or a schedule where there was none, or the reverse) (epoch 0): "
        f"['opt_state'][0].count [[], 'int32'] there, absent here; ")
    assert str(other.value).endswith(" more); resume with the same settings or use another "
                                     "checkpoint_dir")
    with pytest.raises(zg.CheckpointMismatch) as other:
        zg.train(resumed, model=MeanConcat(16, 47), optimizer=optax.adam(1e-3))
    assert "holds other model variables (epoch 0): ['params']" in str(other.value)
    assert "opt_state" not in str(other.value)


def test_a_given_dataset_is_asked_for_by_name(tmp_path, capsys):
    n = 120
    ds = labelled_dataset("mine", n, 4, 2, seed=0, edges=400)
    cfg = zg.TrainConfig(hidden=8, layers=1, fanouts=(3,), batch_size=40, epochs=1,
                         progress=False, eval_mode="none", envelope="conservative",
                         model="gcn", checkpoint_dir=str(tmp_path / "ck"))
    result = zg.train(cfg, ds)
    with pytest.raises(ValueError, match="trained on a dataset passed to train.*'mine'"):
        zg.restore(cfg.checkpoint_dir, for_inference=True)
    back = zg.restore(cfg.checkpoint_dir, dataset=ds, for_inference=True)
    # the run's task and model, as train's result names them (None and None before)
    assert repr(back).startswith("TrainResult(dataset='mine', task='node', model='gcn', ")
    exact = zg.predict(back, np.arange(n))  # GCN: exact layer-wise
    np.testing.assert_allclose(np.asarray(exact),
                               np.asarray(zg.layerwise_logits(result.program,
                                                              result.variables,
                                                              result.data)), atol=1e-6)
    # the command line exports such a run from the dataset's saved file
    out, saved = tmp_path / "m.bin", zg.save_npz(ds, tmp_path / "mine.npz")
    export = ["export", cfg.checkpoint_dir, "--out", str(out), "--batch-size", "8"]
    assert main(export) == 2 and not out.exists()
    assert ("(zerognn export and predict: --dataset and the file it was saved to)"
            in capsys.readouterr().err)
    assert main([*export, "--dataset", str(saved)]) == 0
    assert json.loads(capsys.readouterr().out)["bytes"] == out.stat().st_size > 0
    with pytest.raises(FileNotFoundError, match=r"no checkpoint 3 in .*ck \(it holds epochs "
                                                r"\[0\]\)"):
        zg.restore(cfg.checkpoint_dir, dataset=ds, epoch=3)
    with pytest.raises(ValueError, match="epoch must be an integer .*, got '0'"):
        zg.restore(cfg.checkpoint_dir, dataset=ds, epoch="0")
    # a damaged checkpoint is named, with the cause's first line
    shapes = tmp_path / "ck" / "0" / "state" / "_METADATA"
    shapes.write_bytes(shapes.read_bytes()[:100])  # cut short: orbax reads it as None
    with pytest.raises(ValueError, match=r"checkpoint 0 in .*ck does not read \(ValueError: "
                                         r"the record of its arrays' shapes \(.*_METADATA\) "
                                         r"does not read: damaged on disk\); pick another "
                                         r"\(epoch= or best=True; on the command line "
                                         r"--epoch or --best\)"):
        zg.restore(cfg.checkpoint_dir, dataset=ds, for_inference=True)
    shutil.rmtree(tmp_path / "ck" / "0" / "state")
    with pytest.raises(ValueError, match=r"checkpoint 0 in .*ck does not read \("):
        zg.restore(cfg.checkpoint_dir, dataset=ds, for_inference=True)
    (tmp_path / "ck" / "0" / "meta" / "metadata").write_text('{"x":')
    with pytest.raises(ValueError, match=r"checkpoint 0 in .*ck does not read \("):
        zg.restore(cfg.checkpoint_dir, dataset=ds, for_inference=True)


def test_a_dataset_read_from_a_relative_path_is_found_from_any_folder(tmp_path,
                                                                     monkeypatch):
    """The checkpoint records the dataset's file absolute, as it does the root: a restore
    from another folder reads the same file (it had looked for it there)."""
    (tmp_path / "data").mkdir()
    zg.save_npz(labelled_dataset("mine", 90, 4, 2, seed=1, edges=300),
                tmp_path / "data" / "mine.npz")
    monkeypatch.chdir(tmp_path)
    cfg = zg.TrainConfig(dataset=os.path.join("data", "mine.npz"), hidden=8, layers=1,
                         fanouts=(3,), batch_size=30, epochs=1, progress=False,
                         eval_mode="none", model="gcn", checkpoint_dir="ck")
    result = zg.train(cfg)
    monkeypatch.chdir(tmp_path / "data")
    back = zg.restore(tmp_path / "ck", for_inference=True)
    assert back.dataset.num_nodes == 90
    np.testing.assert_allclose(np.asarray(zg.predict(back, np.arange(90))),
                               np.asarray(zg.layerwise_logits(result.program,
                                                              result.variables,
                                                              result.data)), atol=1e-6)
    # a dataset folder named as a preset is read as the folder (node tasks), and so
    # recorded; the preset `tiny` has 4,898 nodes
    monkeypatch.chdir(tmp_path)
    zg.save_dir(zg.load_npz(tmp_path / "data" / "mine.npz"), tmp_path / "tiny")
    zg.train(dataclasses.replace(cfg, dataset="tiny", checkpoint_dir="ck2"))
    monkeypatch.chdir(tmp_path / "data")
    assert zg.restore(tmp_path / "ck2", for_inference=True).dataset.num_nodes == 90


@pytest.mark.skipif(not os.path.exists("/proc/self/io"), reason="needs Linux's /proc/self/io")
def test_inference_reads_the_model_and_not_the_optimizers_moments(tmp_path):
    """`restore(for_inference=True)` (and `zerognn export`) read the parameters and batch
    statistics only: counted by the bytes this process reads from files (`rchar`, all its
    threads), which for Adam's moments of a wide table were 2,000 times the model's."""
    from zerognn_jax._src.training.checkpoint import Checkpointer

    def bytes_read():
        with open("/proc/self/io") as io:
            return next(int(line.split()[1]) for line in io if line.startswith("rchar"))

    rng = np.random.default_rng(0)
    table = lambda: jnp.asarray(rng.normal(size=(2000, 1000)), jnp.float32)
    state = {"params": {"w": jnp.asarray(rng.normal(size=(16, 16)), jnp.float32)},
             "batch_stats": {}, "opt_state": ({"mu": table(), "nu": table()},)}
    saving = Checkpointer(str(tmp_path / "ck"))
    saving.save(0, state, {"epoch": 0})
    saving.close()
    ckpt = Checkpointer(str(tmp_path / "ck"), create=False)
    try:
        start = bytes_read()
        whole = ckpt.restore_as_saved(0)
        middle = bytes_read()
        model = ckpt.restore_as_saved(0, ("params", "batch_stats"))
        end = bytes_read()
    finally:
        ckpt.close()
    assert sorted(model) == ["batch_stats", "params"]
    np.testing.assert_array_equal(np.asarray(model["params"]["w"]),
                                  np.asarray(state["params"]["w"]))
    np.testing.assert_array_equal(np.asarray(whole["opt_state"][0]["nu"]),
                                  np.asarray(state["opt_state"][0]["nu"]))
    assert middle - start > 8_000_000  # the moments, compressed
    assert end - middle < 200_000, end - middle


def test_an_older_kept_epoch_is_restored_with_its_evaluation(tmp_path):
    """A checkpoint is saved before its epoch's evaluation, which the folder's file keeps
    for the newest epoch alone: an older epoch came back without its figures, which a
    newer checkpoint's records hold."""
    ds = labelled_dataset("mine", 120, 4, 2, seed=0, edges=400)
    cfg = zg.TrainConfig(hidden=8, layers=1, fanouts=(3,), batch_size=40, epochs=3,
                         progress=False, envelope="conservative", model="gcn",
                         checkpoint_dir=str(tmp_path / "ck"))
    result = zg.train(cfg, ds)
    older = zg.restore(cfg.checkpoint_dir, dataset=ds, epoch=1, for_inference=True)
    assert older.summary["epoch"] == 1
    assert older.summary["val_acc"] == result.history[1]["val_acc"] is not None
    assert older.history[-1]["test_acc"] == result.history[1]["test_acc"]


def test_an_empty_best_folder_says_why_no_epoch_was_kept(tmp_path):
    """A run whose best metric was null every epoch (molhiv-like's validation graphs of
    one class) keeps an empty best/: restore said only "it holds []"."""
    (tmp_path / "ck" / "best").mkdir(parents=True)
    with pytest.raises(FileNotFoundError, match=r"\(none at all\); no epoch was kept as best: "
                                                r"the best metric had no value"):
        zg.restore(tmp_path / "ck", best=True)
    (tmp_path / "other").mkdir()
    with pytest.raises(FileNotFoundError, match=r"no checkpoint folder .*other/best \(only a "
                                                r"run trained with best_metric, "
                                                r"--best-metric, keeps a best checkpoint\)$"):
        zg.restore(tmp_path / "other", best=True)
    with pytest.raises(FileNotFoundError, match=r"no checkpoint folder .*/gone$"):
        zg.restore(tmp_path / "gone", best=True)  # the run's folder is what is missing


def test_a_checkpoint_a_live_run_removes_while_it_is_read_is_not_called_damaged(
        tmp_path, monkeypatch):
    """`zerognn export` of a folder a run still trains into read a checkpoint that the
    run's rotation then removed, and called it damaged ("pick another ..., or
    retrain"). The latest is read again; an epoch asked for names the live run."""
    import socket

    from zerognn_jax._src.training.checkpoint import Checkpointer
    from zerognn_jax._src.training.lock import LOCK_NAME

    ds = labelled_dataset("mine", 120, 4, 2, seed=0, edges=400)
    cfg = zg.TrainConfig(hidden=8, layers=1, fanouts=(3,), batch_size=40, epochs=3,
                         progress=False, envelope="conservative", model="gcn",
                         checkpoint_dir=str(tmp_path / "ck"))
    zg.train(cfg, ds)
    ck = tmp_path / "ck"
    assert sorted(int(p.name) for p in ck.iterdir() if p.name.isdigit()) == [1, 2]
    (ck / LOCK_NAME).write_text(json.dumps({"pid": os.getpid(),
                                            "host": socket.gethostname()}))
    read = Checkpointer.restore_as_saved

    def rotated_away(self, epoch, *args, **kwargs):  # the run removes it mid-read
        shutil.rmtree(ck / str(epoch))
        monkeypatch.setattr(Checkpointer, "restore_as_saved", read)
        raise ValueError("Truncated Zstd-compressed stream; at byte 0")

    monkeypatch.setattr(Checkpointer, "restore_as_saved", rotated_away)
    assert zg.restore(ck, dataset=ds, for_inference=True).summary["epoch"] == 1
    monkeypatch.setattr(Checkpointer, "restore_as_saved", rotated_away)
    with pytest.raises(ValueError, match=rf"^checkpoint 1 in {ck} was removed while it was "
                                         rf"read by the run training into it \(pid "
                                         rf"{os.getpid()} on host .+\), which keeps its "
                                         rf"latest checkpoints"):
        zg.restore(ck, dataset=ds, epoch=1, for_inference=True)
