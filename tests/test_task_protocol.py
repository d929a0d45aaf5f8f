"""A third task written against the `Task` protocol alone, in this file only.

`DegreeTask` is node regression: predict log(1 + degree) of the training nodes. It is
registered with `register_task` and trained by `train` on the scan engine, the host
engine (bucketed) and two virtual CPU devices, and a run stopped after an epoch resumes
from its checkpoint to the result of an uninterrupted run. Nothing outside this file
knows it.

The multi-device run needs `jax_num_cpu_devices` before JAX starts its backends, so it
runs this file as a script in a fresh process (`python test_task_protocol.py OUT`).
"""

from __future__ import annotations

import dataclasses
import json
import os
import pathlib
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from conftest import assert_same_runs

import zerognn_jax as zg

HERE = pathlib.Path(__file__).resolve()


@dataclasses.dataclass(frozen=True, eq=False)
class DegreeTask:
    """Predict log(1 + degree) per node: one output unit, squared error, MSE metrics."""

    name = "degree"
    dedups_seeds = False
    tree_by_default = False
    row_normalizes_planetoid = False
    score = None
    score_name = "acc"  # no score: the record's train_batch_acc is None

    @staticmethod
    def loss(outputs, targets):
        return jnp.square(outputs[:, 0].astype(jnp.float32) - targets)

    @classmethod
    def build(cls, cfg, dataset, *, loss=None, kernels=None):
        del kernels
        if dataset is None or loss is not None:
            raise ValueError("the degree task trains on a given dataset, with its own loss")
        return cls(), dataset

    def output_dim(self, cfg, dataset) -> int:
        return 1

    def wrap_model(self, model, cfg):
        return model

    def device_targets(self, dataset):
        return np.log1p(np.diff(np.asarray(dataset.graph.indptr)).astype(np.float32))

    def train_items(self, dataset):
        return dataset.train_idx

    def seed_capacity(self, batch_size: int) -> int:
        return batch_size

    def seed_level(self, items, valid, key, capacity: int):
        return zg.ITEM_SEEDS.seed_level(items, valid, key, capacity)

    def batch(self, data, items, valid, key, level):
        return zg.TaskBatch(data.targets[items], valid.astype(jnp.float32), {}, level)

    def restrict(self, mb, batch):
        return mb

    def metric_names(self, dataset):
        return ("mse",)

    def evaluate(self, predictor, dataset) -> dict:
        targets = self.device_targets(dataset)
        out = {}
        for split in ("val", "test"):
            idx = np.asarray(getattr(dataset, f"{split}_idx"))
            pred = np.asarray(predictor.outputs(idx))[:, 0]
            out[f"{split}_mse"] = float(np.mean(np.square(pred - targets[idx])))
        return out


def make_dataset():
    """300 nodes of power-law-ish degrees; the first feature is a noisy log-degree."""
    rs = np.random.default_rng(3)
    n = 300
    weight = rs.pareto(1.5, n) + 1
    src = rs.choice(n, 2400, p=weight / weight.sum())
    g = zg.from_edge_list(src, rs.integers(0, n, 2400), n, make_undirected=True,
                          remove_self_loops=True, remove_duplicates=True)
    deg = np.log1p(np.diff(np.asarray(g.indptr)).astype(np.float32))
    feats = np.c_[deg + rs.normal(scale=0.3, size=n), rs.normal(size=(n, 3))]
    order = rs.permutation(n)
    return zg.make_dataset("degrees", g.indptr, g.indices, feats.astype(np.float32),
                           np.zeros(n, np.int32), order[:192], order[192:246], order[246:], 1)


def config(**overrides) -> zg.TrainConfig:
    base = dict(task="degree", model="sage", hidden=16, layers=2, fanouts=(5, 3),
                batch_size=32, epochs=3, dropout=0.0, lr=1e-2, progress=False)
    return zg.TrainConfig(**{**base, **overrides})


@pytest.fixture(scope="module")
def dataset():
    zg.register_task(DegreeTask)
    return make_dataset()


def test_the_task_satisfies_the_protocol_it_is_written_against(dataset):
    task, same = DegreeTask.build(config(), dataset)
    assert same is dataset and zg.TASKS["degree"] is DegreeTask
    declared = {n for n in dir(zg.Task) if not n.startswith("_")} | set(
        zg.Task.__annotations__)
    assert {"build", "seed_level", "batch", "evaluate", "loss", "name"} <= declared
    for name in declared:
        assert hasattr(task, name), name


def _untrained_mse(dataset, **overrides) -> float:
    """The test MSE of the freshly initialised model (epochs=0): what training beats."""
    return zg.train(config(epochs=0, **overrides), dataset).summary["test_mse"]


@pytest.mark.parametrize("engine", ["scan", "host-bucketed"])
def test_degree_task_trains_on_both_engines(dataset, engine):
    """The task's batch, loss and targets through the scan and the host engine. The host
    engine runs bucketed: "host-exact" takes the same task path and differs only in
    cutting levels to exact sizes (a compile per step, 5x the time here), which
    test_host_engine.py covers for both modes."""
    result = zg.train(config(engine=engine, epochs=6), dataset)
    losses = [h["loss"] for h in result.history]
    assert losses[-1] < losses[0]
    assert result.history[-1]["train_batch_acc"] is None  # no score
    assert result.summary["task"] == "degree"
    assert result.summary["test_mse"] < _untrained_mse(dataset) / 10


def test_degree_task_resumes_from_its_checkpoint(dataset, tmp_path):
    straight = zg.train(config(), dataset)
    zg.train(config(epochs=1, checkpoint_dir=str(tmp_path)), dataset)
    resumed = zg.train(config(checkpoint_dir=str(tmp_path)), dataset)
    assert resumed.summary["start_epoch"] == 1
    assert_same_runs([h["loss"] for h in resumed.history],
                     [h["loss"] for h in straight.history])
    assert_same_runs(straight.variables["params"], resumed.variables["params"])


class _Bare:
    name = "bare"


@pytest.mark.parametrize(("cls", "error", "message"), [
    (DegreeTask(), TypeError, "register_task takes a task class, got a DegreeTask instance"),
    (type("Numbered", (DegreeTask,), {"name": 5}), ValueError,
     "a task's name must be a non-empty string .*got 5 on Numbered"),
    (type("Blank", (DegreeTask,), {"name": ""}), ValueError, "got '' on Blank"),
    (_Bare, TypeError, "task _Bare lacks build, output_dim, .* of the Task protocol"),
    (type("Unnamed", (DegreeTask,), {"name": "unnamed", "score_name": None}), ValueError,
     "a task's score_name must be a non-empty string .*got None on Unnamed"),
])
def test_register_task_refuses_what_could_not_train(cls, error, message):
    """An instance, a name that is not a string (after which every unknown task name
    failed with a TypeError from the message's join), a class without the protocol's
    members (an AttributeError once training began) and a score_name of None (records
    named "train_batch_None") are refused at registration, and nothing is registered."""
    before = dict(zg.TASKS)
    with pytest.raises(error, match=message):
        zg.register_task(cls)
    assert zg.TASKS == before
    with pytest.raises(ValueError, match=r"got 'nope' \(a task of your own joins them by "
                                         r"zg.register_task"):
        zg.TrainConfig(task="nope")


def _variant(name: str, **methods):
    return dataclasses.dataclass(frozen=True, eq=False)(
        type(name, (DegreeTask,), {"name": name, **methods}))


@pytest.mark.parametrize(("methods", "message"), [
    (dict(train_items=lambda self, d: np.zeros(0, np.int32)),
     r"the task bad gives no training items \(train_items int32\[0\]\): there is "
     r"nothing to train on"),
    (dict(train_items=lambda self, d: np.asarray(d.train_idx, np.float32)),
     r"the task bad's train_items must be integer ids, got float32\[192\]"),
    (dict(train_items=lambda self, d: np.asarray(d.train_idx) - 5),
     r"the task bad's train_items hold a negative id \(-5\)"),
    (dict(output_dim=lambda self, cfg, d: 0),
     r"the task bad's output_dim is 0; a model's output rows need a positive integer"),
    (dict(batch=lambda self, data, items, valid, key, level: zg.TaskBatch(
        data.targets[items], valid.astype(jnp.float32)[:, None], {}, level)),
     r"the task bad's batch gives weight float32\[32, 1\]; it must be one weight a row"),
    (dict(batch=lambda self, data, items, valid, key, level: zg.TaskBatch(
        data.targets[items], valid.astype(jnp.float32)[:10], {}, level)),
     r"the task bad's batch gives targets float32\[32\] and weight float32\[10\]"),
])
def test_a_task_of_ones_own_that_could_not_train_is_refused_first(dataset, monkeypatch,
                                                                   methods, message):
    """Items, widths and batches a task of one's own gets wrong were trained on
    silently (ids clamped by the gathers; no items: an epoch of one empty step), failed
    deep in Flax (output_dim 0), gave a loss 32 times too large (a [rows, 1] weight
    broadcast to [rows, rows]), or blamed the model (a weight of other rows); each is
    one line before anything compiles."""
    monkeypatch.setitem(zg.TASKS, "bad", _variant("bad", **methods))
    with pytest.raises(ValueError, match=f"^{message}"):
        zg.train(config(task="bad", epochs=1), dataset)


def test_weights_summing_below_one_give_the_weighted_mean(dataset, monkeypatch):
    """The step's loss divided by at least 1: a step whose weights summed to 0.032 gave
    a loss 0.032 times the weighted mean, and the records divided so too. 0/1 masks give
    what they gave; a run of weights 0.001 a row trains and records as one of 1s."""
    from zerognn_jax._src.training.tasks.losses import masked_mean

    small = _variant("small", batch=lambda self, data, items, valid, key, level:
                     zg.TaskBatch(data.targets[items], valid.astype(jnp.float32) * 1e-3,
                                  {}, level))
    monkeypatch.setitem(zg.TASKS, "small", small)
    runs = [zg.train(config(task=task, epochs=2, eval_mode="none"), dataset,
                     optimizer=optax.sgd(0.05)) for task in ("degree", "small")]
    np.testing.assert_allclose(*([h["loss"] for h in r.history] for r in runs), rtol=1e-5)

    rows = jnp.array([1.0, 3.0, 5.0, 7.0])
    assert float(masked_mean(rows, jnp.full(4, 0.001))) == pytest.approx(4.0)
    assert float(masked_mean(rows, jnp.array([1.0, 0.0, 1.0, 0.0]))) == 3.0
    assert float(masked_mean(rows, jnp.zeros(4))) == 0.0


def test_two_partials_of_one_loss_are_two_losses_to_a_checkpoint():
    """Both were named "partial": a run resumed under another loss was not refused."""
    import functools

    from zerognn_jax._src.training.tasks.node import fn_name

    def smoothed(outputs, targets, eps):
        return outputs

    here = "test_two_partials_of_one_loss_are_two_losses_to_a_checkpoint.<locals>.smoothed"
    assert fn_name(functools.partial(smoothed, eps=0.1)) == f"partial({here}, eps=0.1)"
    assert fn_name(functools.partial(smoothed, eps=0.2)) == f"partial({here}, eps=0.2)"
    assert fn_name(functools.partial(smoothed, np.ones(3))) == f"partial({here}, ndarray)"


def test_an_evaluation_in_jax_scalars_is_recorded_as_numbers():
    """A task's `evaluate` giving `jnp.mean(...)` broke the metrics file (TypeError: not
    JSON serializable) after an epoch of training."""
    from zerognn_jax._src.training.records import dumps

    got = json.loads(dumps({"val_mse": jnp.float32(0.5), "per": jnp.array([1.0, jnp.nan]),
                            "n": np.int64(3)}))
    assert got == {"val_mse": 0.5, "per": [1.0, None], "n": 3}


def test_degree_task_trains_on_two_devices(tmp_path):
    from conftest import FAST_XLA

    env = {**os.environ, "JAX_PLATFORMS": "cpu", "XLA_FLAGS": FAST_XLA,
           "PYTHONPATH": os.pathsep.join([str(HERE.parents[1]), str(HERE.parent)])}
    proc = subprocess.run([sys.executable, str(HERE), str(tmp_path)], env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["devices"] == 2 and summary["global_batch"] == 64
    assert summary["losses"][-1] < summary["losses"][0]
    assert summary["test_mse"] < summary["untrained_mse"] / 10
    # weights of 0.001 a row: each device's gradient was scaled back by at least 1, so
    # two devices stepped about twice as far as one at the same global batch (SGD; whole
    # neighbourhoods, so that both sample alike)
    one, two = summary["small_weights"]
    np.testing.assert_allclose(two, one, rtol=1e-4)


def _two_device_run(out: pathlib.Path) -> None:
    jax.config.update("jax_num_cpu_devices", 2)
    zg.register_task(DegreeTask)
    data = make_dataset()
    result = zg.train(config(devices=2, epochs=6), data)
    record = {k: result.summary[k] for k in ("devices", "global_batch", "test_mse")}
    record["losses"] = [h["loss"] for h in result.history]
    record["untrained_mse"] = _untrained_mse(data, devices=2)
    small = _variant("degree_small", batch=lambda self, data, items, valid, key, level:
                     zg.TaskBatch(data.targets[items], valid.astype(jnp.float32) * 1e-3,
                                  {}, level))
    zg.register_task(small)
    record["small_weights"] = [
        [h["loss"] for h in zg.train(config(task="degree_small", devices=d, epochs=2,
                                            batch_size=64 // d, eval_mode="none",
                                            fanouts=(-1, -1)),
                                     data, optimizer=optax.sgd(0.05)).history]
        for d in (1, 2)]  # (Adam would not see a scaled gradient)
    (out / "summary.json").write_text(json.dumps(record))


if __name__ == "__main__":
    _two_device_run(pathlib.Path(sys.argv[1]))
