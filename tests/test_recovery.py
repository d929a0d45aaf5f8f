"""Interrupts, checkpoints and resuming (issue 17).

A run stopped by SIGINT or SIGTERM at any phase ends with a message and exit code
130 / 143 (never SIGSEGV); a checkpoint of another configuration is refused in one line;
a corrupt latest checkpoint falls back to the previous one; the metrics log lists every
epoch once after a resume; and runs killed at random points (SIGKILL included, during
checkpoint writes too) resume to the same final parameters as an uninterrupted run.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import jax
import numpy as np
import orbax.checkpoint as ocp
import pytest

from zerognn_jax import TrainConfig, save_npz, train
from zerognn_jax._src.data.synthetic import products_like
from zerognn_jax._src.training.checkpoint import CheckpointMismatch, CheckpointWarning
from zerognn_jax.cli import main

CHILD = Path(__file__).with_name("_fault_child.py")
EPOCHS = 6


def strict_records(path: Path) -> list[dict]:
    def refuse(constant):
        raise ValueError(f"not strict JSON: {constant}")
    return [json.loads(line, parse_constant=refuse) for line in path.read_text().splitlines()]


def last_run(records: list[dict]) -> list[dict]:
    """The records of the last run: those after the summary before the last one."""
    ends = [i for i, r in enumerate(records) if r.get("summary")]
    start = ends[-2] + 1 if len(ends) > 1 else 0
    return records[start:]


def final_params(ckpt: Path, epoch: int = EPOCHS - 1) -> list[np.ndarray]:
    state = ocp.StandardCheckpointer().restore((ckpt / str(epoch) / "state").absolute())
    return [np.asarray(x) for x in jax.tree_util.tree_leaves(state["params"])]


def assert_same_params(a, b):
    assert len(a) == len(b)
    for x, y in zip(a, b):
        np.testing.assert_array_equal(x, y)


# ------------------------------------------------------- child processes


@pytest.fixture(scope="module")
def npz(tmp_path_factory) -> Path:
    """products-like at 1,225 nodes: 98 training nodes, 4 steps of 32 per epoch."""
    path = tmp_path_factory.mktemp("data") / "small.npz"
    save_npz(products_like(0.0005, seed=0), path)
    return path


def train_args(npz: Path, run: Path, epochs: int = EPOCHS) -> list[str]:
    # --dedup: this small graph would otherwise be sampled as a tree, which has no
    # calibration phase to interrupt.
    return ["train", "--dataset", str(npz), "--hidden", "16", "--layers", "2", "--fanouts",
            "5,5", "--dedup", "--batch-size", "32", "--chunk-steps", "2", "--epochs", str(epochs),
            "--eval-every", "3", "--no-progress", "--checkpoint-dir", str(run / "ck"),
            "--metrics-out", str(run / "m.jsonl")]


def child_env(cache: Path | None = None) -> dict:
    """The environment of a child; with `cache`, JAX's persistent compilation cache there
    (restarts then skip most of the compiling)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("JAX_COMPILATION_CACHE")}
    env.update(PYTHONUNBUFFERED="1", JAX_PLATFORMS="cpu")
    if cache is not None:
        env.update(JAX_COMPILATION_CACHE_DIR=str(cache),
                   JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0",
                   JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES="0")
    return env


def child(args: list[str], *fault: str, env: dict) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, str(CHILD), *fault, "--", *args],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)


def finish(proc: subprocess.Popen, timeout: float = 300) -> tuple[int, str, str]:
    out, err = proc.communicate(timeout=timeout)
    return proc.returncode, out, err


def checkpoints(ckpt: Path) -> list[int]:
    return sorted(int(p.name) for p in ckpt.glob("*") if p.name.isdigit())


def wait_for_checkpoint(proc, ckpt: Path, epoch: int, timeout: float = 300) -> bool:
    """True once the checkpoint of `epoch` (or a later one) exists; False if the process
    ended first."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if any(e >= epoch for e in checkpoints(ckpt)):
            return True
        if proc.poll() is not None:
            return False
        time.sleep(0.01)
    pytest.fail("no checkpoint appeared in time")


@pytest.fixture(scope="module")
def reference(npz, tmp_path_factory):
    """An uninterrupted run: its final parameters, summary and compilation cache, and the
    wall time of a run that finds its programs in that cache (as the reruns below do)."""
    root = tmp_path_factory.mktemp("reference")
    env = child_env(root / "jax-cache")
    code, out, err = finish(child(train_args(npz, root / "cold"), env=env))
    assert code == 0, err
    t0 = time.monotonic()
    code, _, err = finish(child(train_args(npz, root / "warm"), env=env))
    assert code == 0, err
    params = final_params(root / "cold" / "ck")
    assert_same_params(final_params(root / "warm" / "ck"), params)
    return {"params": params, "seconds": time.monotonic() - t0, "env": env,
            "summary": json.loads(out)}


# --------------------------------------------------------------- signals


def _has_compile_hook() -> bool:
    import jax._src.compiler as compiler

    return hasattr(compiler, "backend_compile_and_load")


needs_compile_hook = pytest.mark.skipif(
    not _has_compile_hook(),
    reason="this JAX has no jax._src.compiler.backend_compile_and_load to hook")


@needs_compile_hook
@pytest.mark.parametrize(("phase", "sig", "after"), [
    ("calibration", "SIGINT", "calibration"),
    ("training", "SIGTERM", "step 2 of epoch 0"),
])
def test_signal_during_compilation_ends_cleanly(npz, tmp_path, phase, sig, after):
    """A signal while XLA compiles on its worker thread used to kill the process with
    SIGSEGV once Python began to exit (issue 17); now the compilation finishes and the
    run stops after it. (Resuming: the tests below.)"""
    args = train_args(npz, tmp_path)
    code, _, err = finish(child(args, "--signal-in-compile", f"{phase}:{sig}",
                                env=child_env()))
    assert code == 128 + getattr(signal, sig), err
    lines = err.strip().splitlines()
    assert lines[-2] == (f"zerognn: {sig} received; stopping after the current phase (send "
                         f"it again to exit at once)")
    assert lines[-1] == f"zerognn: interrupted by {sig} after {after}"
    assert "Traceback" not in err and not checkpoints(tmp_path / "ck")
    metrics = tmp_path / "m.jsonl"  # nothing finished, so nothing is recorded
    assert not (metrics.exists() and metrics.read_text())


@needs_compile_hook
def test_second_signal_exits_at_once(npz, tmp_path):
    code, _, err = finish(child(train_args(npz, tmp_path), "--signal-in-compile",
                                "calibration:SIGINT:2", env=child_env()))
    assert code == 130
    assert err.strip().splitlines()[-1] == "zerognn: second interrupt, exiting now"
    assert "Traceback" not in err


def test_sigint_between_epochs_keeps_the_checkpoint_and_resumes(npz, tmp_path, reference):
    args = train_args(npz, tmp_path)
    proc = child(args, env=reference["env"])
    assert wait_for_checkpoint(proc, tmp_path / "ck", 2)
    proc.send_signal(signal.SIGINT)
    code, _, err = finish(proc)
    assert code == 130, err
    last = max(checkpoints(tmp_path / "ck"))
    assert re.fullmatch(
        rf"zerognn: interrupted by SIGINT after (epoch {last}|step \d of epoch {last + 1}); the "
        rf"checkpoint of epoch {last} in {re.escape(str(tmp_path / 'ck'))} is kept; run the "
        rf"same command again to resume", err.strip().splitlines()[-1]), err
    code, out, err = finish(child(args, env=reference["env"]))
    assert code == 0, err
    summary = json.loads(out)
    assert summary["start_epoch"] == last + 1 and summary["epochs"] == EPOCHS
    assert_same_params(final_params(tmp_path / "ck"), reference["params"])


# ------------------------------------------------------- fault injection


def _next_epoch(ckpt: Path, rng) -> int:
    """A random epoch that has no checkpoint yet (the last one if all but it have)."""
    done = max(checkpoints(ckpt), default=-1)
    return int(rng.integers(min(done + 1, EPOCHS - 1), EPOCHS))


def _kill_at_random_time(args, ckpt, rng, env, seconds, save):
    proc = child(args, env=env)
    time.sleep(rng.uniform(0.2, seconds))
    proc.send_signal(signal.SIGKILL)
    return proc, "SIGKILL at a random time"


def _kill_in_save(args, ckpt, rng, env, seconds, save):
    epoch = _next_epoch(ckpt, rng)
    when = "commit" if save == "commit" else str(int(rng.integers(0, 60)))
    return (child(args, "--kill-in-save", f"{epoch}:{when}", env=env),
            f"SIGKILL in the save of epoch {epoch} at {when}")


def _signal_after_checkpoint(args, ckpt, rng, env, seconds, save):
    proc = child(args, env=env)
    epoch = _next_epoch(ckpt, rng)
    sig = [signal.SIGKILL, signal.SIGTERM, signal.SIGINT][rng.integers(3)]
    if wait_for_checkpoint(proc, ckpt, epoch):
        time.sleep(rng.uniform(0.0, 0.05))
        proc.send_signal(sig)
    return proc, f"{sig.name} after the checkpoint of epoch {epoch}"


@pytest.mark.parametrize(("seed", "save"), [(0, "commit"), (1, "delay"), (2, "delay")])
def test_runs_killed_at_random_points_resume_to_the_same_parameters(npz, tmp_path, reference,
                                                                    seed, save):
    """Three failures per seed, each followed by a rerun of the same command that is the
    next one to fail: SIGKILL at a random time; SIGKILL inside the write of a checkpoint
    not saved yet (a random delay into it, or just before orbax commits it); SIGKILL,
    SIGTERM or SIGINT just after a random checkpoint. A last rerun finishes: its final
    parameters equal the uninterrupted run's bit for bit, its metrics log lists every
    epoch once, and its accuracies are the same."""
    rng = np.random.default_rng(seed)
    args, ckpt = train_args(npz, tmp_path), tmp_path / "ck"
    for fault in (_kill_at_random_time, _kill_in_save, _signal_after_checkpoint):
        proc, what = fault(args, ckpt, rng, reference["env"], reference["seconds"], save)
        code, _, err = finish(proc)
        print(f"{what}: exit {code}, checkpoints {checkpoints(ckpt)}")
        assert code in (0, 130, 143, -signal.SIGKILL), err
        assert "Traceback" not in err, err
        if fault is _kill_in_save:
            assert code == -signal.SIGKILL, err  # the save it was set to break did run
    code, out, err = finish(child(args, env=reference["env"]))
    assert code == 0, err
    assert_same_params(final_params(ckpt), reference["params"])
    records = last_run(strict_records(tmp_path / "m.jsonl"))
    assert [r["epoch"] for r in records[:-1]] == list(range(EPOCHS))
    summary = json.loads(out)
    assert records[-1] == summary and summary["epochs"] == EPOCHS
    for key in ("train_acc", "val_acc", "test_acc"):
        assert summary[key] == reference["summary"][key]


# ----------------------------------------- checkpoints, in this process


@pytest.fixture(scope="module")
def dataset():
    return products_like(0.0005, seed=0)


def config(run: Path, epochs: int, **changes) -> TrainConfig:
    return TrainConfig(**{**dict(
        hidden=16, layers=2, fanouts=(5, 5), batch_size=32, epochs=epochs, eval_every=0,
        progress=False, checkpoint_dir=str(run / "ck"), metrics_out=str(run / "m.jsonl")),
        **changes})


def params_of(result) -> list[np.ndarray]:
    return [np.asarray(x) for x in jax.tree_util.tree_leaves(result.variables["params"])]


@pytest.fixture(scope="module")
def four_epochs(dataset, tmp_path_factory):
    """Parameters after four uninterrupted epochs."""
    return params_of(train(config(tmp_path_factory.mktemp("four"), 4), dataset))


@pytest.fixture(scope="module")
def three_epochs(dataset, tmp_path_factory) -> Path:
    """A finished three-epoch run: checkpoints of epochs 1 and 2, and its metrics log."""
    run = tmp_path_factory.mktemp("three")
    train(config(run, 3), dataset)
    return run


@pytest.fixture()
def run(three_epochs, tmp_path) -> Path:
    """A copy of the three-epoch run to resume, break or extend."""
    return Path(shutil.copytree(three_epochs, tmp_path / "run"))


def test_other_settings_are_refused_in_one_line(npz, run, capfd):
    base = ["train", "--dataset", str(npz), "--hidden", "16", "--layers", "2", "--fanouts",
            "5,5", "--batch-size", "32", "--eval-mode", "none", "--no-progress",
            "--checkpoint-dir", str(run / "ck")]
    assert main([*base, "--hidden", "32", "--lr", "0.01", "--epochs", "5"]) == 2
    err = capfd.readouterr().err
    assert err == (f"zerognn: error: checkpoint_dir {run / 'ck'} holds a run with other "
                   f"settings (epoch 2): hidden 16 there, 32 here; lr 0.003 there, 0.01 here; "
                   f"resume with the same settings or use another checkpoint_dir\n")
    assert main([*base, "--model", "gcn", "--epochs", "5"]) == 2
    assert "model 'sage' there, 'gcn' here" in capfd.readouterr().err
    assert main([*base, "--batch-size", "64", "--epochs", "5"]) == 2
    assert "global_batch 32 there, 64 here" in capfd.readouterr().err
    # More epochs, the data from a file, another chunk size, kernels and evaluation: the
    # same run, resumed.
    assert main([*base, "--epochs", "4", "--chunk-steps", "1", "--kernels", "xla"]) == 0
    assert json.loads(capfd.readouterr().out)["start_epoch"] == 3


def test_another_dataset_is_refused(run):
    other = products_like(0.0006, seed=0)
    with pytest.raises(CheckpointMismatch, match=r"dataset\.nodes 1225 there, 1469 here"):
        train(config(run, 4), other)


def truncate_arrays(step: Path):
    for f in (step / "state").rglob("*"):
        if f.is_file() and f.parent.name == "d":
            f.write_bytes(f.read_bytes()[:10])


CORRUPTIONS = {
    "arrays cut short": truncate_arrays,
    "record not JSON": lambda step: (step / "meta" / "metadata").write_text("{not json"),
}


@pytest.mark.parametrize("corrupt", CORRUPTIONS.values(), ids=CORRUPTIONS.keys())
def test_corrupt_latest_checkpoint_falls_back_to_the_previous(dataset, run, four_epochs,
                                                              capfd, corrupt):
    ckpt = run / "ck"
    assert checkpoints(ckpt) == [1, 2]
    corrupt(ckpt / "2")
    capfd.readouterr()
    with pytest.warns(CheckpointWarning, match=rf"unreadable checkpoint in {re.escape(str(ckpt))} "
                                               rf"\(epoch 2: .+\); set aside as 2\.corrupt, "
                                               rf"resuming from the one before"):
        result = train(config(run, 4), dataset)
    assert result.summary["start_epoch"] == 2
    assert (ckpt / "2.corrupt").is_dir() and checkpoints(ckpt) == [2, 3]
    assert_same_params(params_of(result), four_epochs)
    records = last_run(strict_records(run / "m.jsonl"))
    assert [r["epoch"] for r in records[:-1]] == [0, 1, 2, 3]
    err = capfd.readouterr().err
    assert "Traceback" not in err and "Exception ignored" not in err and "absl" not in err


def test_no_readable_checkpoint_is_an_error(dataset, run):
    for epoch in (1, 2):
        CORRUPTIONS["record not JSON"](run / "ck" / str(epoch))
    with pytest.raises(ValueError, match=r"no readable checkpoint in .*\(epoch 2: "
                                         r"JSONDecodeError.*; epoch 1: JSONDecodeError"):
        train(config(run, 4), dataset)


def test_metrics_log_after_resume_lists_every_epoch_once(dataset, run, four_epochs):
    """A kill can leave the log behind its checkpoints or cut a line short; the resumed
    run rewrites the records of the run in progress from its checkpoint. Its summary's
    compile_seconds counts this process only."""
    metrics = run / "m.jsonl"
    lines = metrics.read_text().splitlines(keepends=True)
    assert len(lines) == 4  # epochs 0, 1, 2 and the summary
    # As if killed while writing epoch 1's record, with epoch 2's checkpoint saved (a
    # state the trainer's order never leaves; a copied or hand-edited log can):
    metrics.write_text('{"summary": true, "note": "an earlier run"}\n' + lines[0]
                       + lines[1][:25])
    result = train(config(run, 4), dataset)
    records = strict_records(metrics)
    assert records[0] == {"summary": True, "note": "an earlier run"}
    this_run = last_run(records)
    assert [r["epoch"] for r in this_run[:-1]] == [0, 1, 2, 3]
    summary = this_run[-1]
    assert summary["start_epoch"] == 3 and summary["epochs"] == 4
    assert summary["compile_seconds"] == pytest.approx(this_run[3]["compile_seconds"])
    assert summary["compile_seconds"] < sum(r["compile_seconds"] for r in this_run[:-1])
    assert_same_params(params_of(result), four_epochs)
