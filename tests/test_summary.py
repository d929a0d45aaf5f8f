"""A run's summary, task by task: the sampling entries only where the task samples
neighbours, where the feature table went and why, and the warning for a device cache
asked of a table that stays on the device. Runs of no epochs: each builds, calibrates
and summarises, and compiles no epoch."""

from __future__ import annotations

import dataclasses
import json
import re
import warnings

import numpy as np
import pytest
from conftest import labelled_dataset

import zerognn_jax as zg
from zerognn_jax._src.data.hetero import as_hetero
from zerognn_jax._src.data.hetero_dataset import HeteroDataset
from zerognn_jax._src.training import memory, progress, trainer
from zerognn_jax._src.training.memory import Resident
from zerognn_jax._src.training.placement import choose_placement
from zerognn_jax._src.training.tasks import typed_node

QUICK = dict(hidden=8, layers=2, fanouts=(3, 2), batch_size=32, epochs=0,
             eval_mode="none", progress=False)
NO_LIMIT = {"feature_placement": "device",
            "feature_placement_why": "the device reports no memory limit"}
# the homogeneous summary's keys before "start_epoch", in order, as they were
HEAD = ["summary", "dataset", "task", "model", "params", "kernels", "fanouts", "sampler",
        "batch_size", "devices", "processes", "global_batch", "shard_features", "epochs",
        "epochs_run", "median_epoch_seconds", "engine", "layout", "start_epoch"]


@pytest.fixture(scope="module")
def homo():
    return labelled_dataset("small", 120, 4, 2, seed=0, edges=400)


@pytest.fixture(scope="module")
def typed(homo):
    """`homo` as a typed graph of one node type and one relation."""
    return HeteroDataset("small-typed", as_hetero(homo.graph), {"_N": homo.features}, "_N",
                         np.asarray(homo.labels), homo.train_idx, homo.val_idx,
                         homo.test_idx, homo.num_classes)


@pytest.fixture
def no_limit(monkeypatch):
    """A device that reports no memory limit, as a CPU does, whatever runs the tests."""
    monkeypatch.setattr(memory, "device_memory_limit", lambda: None)
    monkeypatch.setattr(typed_node, "device_memory_limit", lambda: None)


def placement_warnings(run) -> list[str]:
    """The messages of the `zg.PlacementWarning`s `run()` gives, every one counted; each
    must name the caller's line (here), not the library's."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        run()
    placed = [w for w in caught if w.category is zg.PlacementWarning]
    assert {w.filename for w in placed} <= {__file__}
    return [str(w.message) for w in placed]


def placement_of(summary: dict) -> dict:
    return {k: summary[k] for k in ("feature_placement", "feature_placement_why")}


def as_json(summary: dict) -> dict:
    return json.loads(json.dumps(summary, allow_nan=False))


def test_a_node_summary_keeps_its_sampling_entries_and_says_why_the_table_is_there(
        homo, no_limit):
    summary = zg.train(zg.TrainConfig(**QUICK), homo).summary
    assert list(summary)[:len(HEAD)] == HEAD
    assert summary["fanouts"] == [3, 2] and summary["sampler"] == "uniform"
    assert set(summary["layout"]) == {"layout", "why"} and summary["layout"]["why"]
    assert placement_of(summary) == NO_LIMIT
    assert summary["features_row_normalized"] is False
    # the dataset given, not cfg.dataset's default "tiny", which the run never read
    assert summary["config"]["dataset"] == summary["dataset"] == "small"
    assert as_json(summary) == summary


@pytest.mark.parametrize("name, changes, normalized", [
    ("cora", {}, True),  # Planetoid's, by name
    ("cora", {"normalize_features": False}, False),
    ("cora", {"task": "link"}, False),  # as GAE trains
    ("small", {"normalize_features": True}, True),
])
def test_the_summary_says_whether_the_features_were_row_normalized(homo, name, changes,
                                                                    normalized):
    """By default a dataset named as a Planetoid one trains on row-normalised features,
    which `result.data.features` holds and an exported model must be served with; the
    summary said nothing of it."""
    dataset = dataclasses.replace(homo, name=name, features=np.abs(homo.features))
    result = zg.train(zg.TrainConfig(**{**QUICK, **changes}), dataset)
    assert result.summary["features_row_normalized"] is normalized
    sums = np.asarray(result.data.features).sum(1)
    assert np.allclose(sums, 1, atol=1e-6) == normalized


def test_a_graph_summary_has_no_sampling_entries():
    molecules = zg.molhiv_like(0.008, seed=3, positive_rate=0.3)
    cfg = zg.TrainConfig(task="graph", dataset="molhiv-like", model="gine", hidden=8,
                         layers=1, batch_size=24, epochs=0, eval_mode="sampled",
                         progress=False, sample_ahead=1)
    with pytest.warns(zg.IgnoredOptionWarning, match="evaluates whole graphs"):
        summary = zg.train(cfg, molecules).summary
    assert summary["eval_mode"] == "full"  # how it evaluates, whatever was asked
    assert not {"fanouts", "sampler", "layout", "features_row_normalized"} & set(summary)
    assert placement_of(summary) == {
        "feature_placement": "device",
        "feature_placement_why": "graph tasks keep their graphs' features there"}
    assert summary["envelope"] and as_json(summary) == summary


def test_a_typed_summary_names_its_layout_and_placement(typed, no_limit):
    summary = zg.train(zg.TrainConfig(**QUICK, model="rsage"), typed).summary
    assert summary["layout"] == {"layout": "dedup", "why": "dedup: typed graphs deduplicate "
                                 "every level per type unless dedup=False; flat_outer=False"}
    assert summary["fanouts"] == [3, 2] and summary["sampler"] == "uniform"
    assert placement_of(summary) == NO_LIMIT
    assert as_json(summary) == summary
    tree = zg.TrainConfig(**QUICK, model="rsage", dedup=False)
    assert trainer.prepare(tree, typed)[2].layout.describe() == {
        "layout": "tree", "why": "dedup=False asks for tree mode"}


def test_a_typed_table_kept_for_exact_evaluation_says_so(typed, monkeypatch):
    """"auto" would put the table on the host of a 1 KiB device; exact evaluation by a
    model that reads the whole table keeps it on the device, which the program's
    placement (the summary's entry) says, and a cache asked for is said to be unused. A
    model that takes chunks (the built-in ones) leaves it on the host."""
    monkeypatch.setattr(typed_node, "device_memory_limit", lambda: 1 << 10)
    cfg = zg.TrainConfig(**{**QUICK, "eval_mode": "full"}, model="rsage")
    assert trainer.prepare(cfg, typed)[2].placement.describe()["feature_placement"] == "host"
    monkeypatch.setattr(zg.HeteroGNN, "chunked_exact", False)
    cfg = dataclasses.replace(cfg, feature_cache_gib=0.5)
    got = []
    messages = placement_warnings(lambda: got.append(trainer.prepare(cfg, typed)))
    placed = got[0][2].placement.describe()
    why = placed["feature_placement_why"]
    assert placed["feature_placement"] == "device"
    assert why.startswith("kept for exact evaluation, although graph ")
    assert why.endswith("; eval_mode 'sampled' would put them on the host")
    assert messages == [f"feature_cache_gib 0.5 is ignored: the feature table is on the "
                        f"device ({why}), so no cache of its rows is sized"]


def test_a_cache_for_a_table_on_the_device_is_warned_of_once(homo, typed, tmp_path,
                                                             no_limit):
    """Not refused (a benchmark and older checkpoints set both): one warning naming the
    value and why the table is on the device, for a train and for a restore of its
    checkpoint; none for no cache (None or 0)."""
    unused = lambda gib, why: (f"feature_cache_gib {gib} is ignored: the feature table is "
                               f"on the device ({why}), so no cache of its rows is sized")
    cfg = zg.TrainConfig(**{**QUICK, "epochs": 1}, feature_placement="device",
                         feature_cache_gib=2.0, checkpoint_dir=str(tmp_path / "ck"))
    asked = unused(2.0, "asked for (feature_placement)")
    assert placement_warnings(lambda: zg.train(cfg, homo)) == [asked]
    restore = lambda: zg.restore(cfg.checkpoint_dir, dataset=homo, for_inference=True)
    assert placement_warnings(restore) == [asked]
    auto = zg.TrainConfig(**QUICK, feature_cache_gib=0.25)
    assert placement_warnings(lambda: trainer.prepare(auto, homo)) == [
        unused(0.25, "the device reports no memory limit")]
    typed_cfg = zg.TrainConfig(**QUICK, model="rsage", feature_placement="device",
                               feature_cache_gib=1.0)
    assert placement_warnings(lambda: trainer.prepare(typed_cfg, typed)) == [
        unused(1.0, "asked for (feature_placement)")]
    graphs = zg.molhiv_like(0.002, seed=3)
    graph_cfg = zg.TrainConfig(task="graph", dataset="molhiv-like", model="gine",
                               hidden=8, layers=1, batch_size=8, progress=False,
                               feature_cache_gib=1.0)
    assert placement_warnings(lambda: trainer.prepare(graph_cfg, graphs)) == [
        unused(1.0, "graph tasks keep their graphs' features there")]
    for gib in (None, 0.0):
        quiet = zg.TrainConfig(**QUICK, feature_placement="device", feature_cache_gib=gib)
        assert placement_warnings(lambda q=quiet: trainer.prepare(q, homo)) == []
    for data, extra in ((homo, {}), (typed, {"model": "rsage"})):  # a row order, likewise
        ordered = zg.TrainConfig(**QUICK, **extra, feature_placement="device",
                                 host_row_order="degree")
        assert placement_warnings(lambda c=ordered, d=data: trainer.prepare(c, d)) == [
            "host_row_order 'degree' is ignored: the feature table is on the device "
            "(asked for (feature_placement)), so no host rows are laid out"]
        read = zg.TrainConfig(**QUICK, **extra, feature_placement="device",
                              read_ahead_gib=1.0)  # was silent
        assert placement_warnings(lambda c=read, d=data: trainer.prepare(c, d)) == [
            "read_ahead_gib 1.0 is ignored: the feature table is on the device (asked for "
            "(feature_placement)), so no rows are read from the host"]


def test_a_sharded_table_says_why_it_is_on_the_device():
    small = Resident(1, 1, 1, "float32", 1)
    assert choose_placement("auto", small, 80 << 30, sharded=True) == (
        "device", "shard_features splits it across the devices", False)


def test_a_table_split_over_one_device_is_said_to_stay_whole(homo, typed):
    """shard_features with devices 1 (in one process) was accepted silently."""
    said = ("shard_features splits the feature table over one device here, which keeps all "
            "of it: train on more devices (devices 0 takes all of this process's) or "
            "processes for the split to save memory")  # ("--shard-features True" before)
    for data, extra in ((homo, {}), (typed, {"model": "rsage"})):
        split = zg.TrainConfig(**QUICK, **extra, shard_features=True)
        assert placement_warnings(lambda c=split, d=data: trainer.prepare(c, d)) == [said]


def test_an_evaluated_epoch_records_how_long_its_evaluation_took(homo, no_limit):
    """`eval_seconds` in the records of the epochs evaluated, none in the others, none
    without evaluation."""
    cfg = zg.TrainConfig(**{**QUICK, "epochs": 3, "eval_mode": "full", "eval_every": 2})
    history = zg.train(cfg, homo).history
    assert [("eval_seconds" in r, "val_acc" in r) for r in history] == [
        (False, False), (True, True), (True, True)]
    assert all(r["eval_seconds"] > 0 for r in history[1:])
    quiet = zg.train(zg.TrainConfig(**{**QUICK, "epochs": 1}), homo).history
    assert "eval_seconds" not in quiet[0]


def test_the_progress_bar_names_the_phases_that_show_no_steps(homo, capfd, monkeypatch):
    """The bar stood at 0 epochs through the first epoch's compilation, and showed the
    last loss through every evaluation (a typed run's exact pass, tens of seconds): it
    says "compiling" and "evaluating" while they run (tqdm writes each state; stderr
    taken for a terminal)."""
    monkeypatch.setattr(progress, "_is_terminal", lambda stream: True)
    zg.train(zg.TrainConfig(**{**QUICK, "epochs": 1, "eval_mode": "full",
                               "progress": True}), homo)
    err = capfd.readouterr().err
    assert "0/1 [" in err and err.index("compiling") < err.index("1/1 [")
    assert re.search(r"1/1 \[[^\]]*, loss=[0-9.]+, evaluating\]", err)
    assert re.search(r"1/1 \[[^\]]*, loss=[0-9.]+, val_acc=[0-9.]+\]\s*$", err)


def test_progress_written_to_a_file_is_a_line_an_epoch(homo, capfd):
    """Not on a terminal (a batch job's log), tqdm's bar was one line of carriage
    returns, 4 states an epoch; there a run says what it does before its first epoch,
    then each epoch once, with its final figures."""
    zg.train(zg.TrainConfig(**{**QUICK, "epochs": 3, "eval_every": 2, "eval_mode": "full",
                               "progress": True}), homo)
    lines = capfd.readouterr().err.splitlines()
    epochs = [line for line in lines if line.startswith("epochs: ")]
    assert "\r" not in "".join(lines) and len(epochs) == 4, lines
    assert re.fullmatch(r"epochs: 0/3 \[[0-9.]+ s\] compiling", epochs[0])
    assert re.fullmatch(r"epochs: 1/3 \[[0-9.]+ s\] loss=[0-9.]+", epochs[1])
    for line, n in ((epochs[2], 2), (epochs[3], 3)):  # evaluated: the second and the last
        assert re.fullmatch(rf"epochs: {n}/3 \[[0-9.]+ s\] loss=[0-9.]+, "
                            rf"val_acc=[0-9.e+-]+", line)
    # a Jupyter kernel's stream says it is no terminal, and there tqdm draws its widget
    kernel_stream = type("OutStream", (), {"__module__": "ipykernel.iostream"})()
    assert progress._is_terminal(kernel_stream)
