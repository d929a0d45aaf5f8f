"""Interrupts, checkpoints and resuming (issue 17).

A run stopped by SIGINT or SIGTERM at any phase ends with a message and exit code
130 / 143 (never SIGSEGV); a checkpoint of another configuration is refused in one line;
a corrupt latest checkpoint falls back to the previous one; the metrics log lists every
epoch once after a resume; and runs killed at random points (SIGKILL included, during
checkpoint writes too) resume to the same final parameters as an uninterrupted run.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import re
import select
import shutil
import signal
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
import pytest

import zerognn_jax as zg
from zerognn_jax import CheckpointWarning, TrainConfig, restore, save_npz, train
from zerognn_jax._src.data.synthetic import products_like
from zerognn_jax._src.training import interrupts, trainer
from zerognn_jax._src.training.checkpoint import (
    ADDED_SINCE,
    FREE_ON_RESUME,
    Checkpointer,
    CheckpointMismatch,
    identity,
)
from zerognn_jax._src.training.checksums import check_checksums, state_checksums
from zerognn_jax.cli import main

CHILD = Path(__file__).with_name("_fault_child.py")
EPOCHS = 6
EVAL_EVERY = 3  # of the child runs (train_args)


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
    """The parameters saved at `epoch`, on this process's device whatever saved them (the
    child processes train on the CPU)."""
    saved = Checkpointer(str(ckpt), create=False)
    try:
        state = saved.restore_as_saved(epoch)
    finally:
        saved.close()
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
            "--eval-every", str(EVAL_EVERY), "--no-progress", "--checkpoint-dir", str(run / "ck"),
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


@pytest.fixture(scope="module")
def reference(npz, tmp_path_factory):
    """An uninterrupted run: its final parameters and summary, and the environment whose
    compilation cache it filled (the reruns below find their programs there)."""
    root = tmp_path_factory.mktemp("reference")
    env = child_env(root / "jax-cache")
    code, out, err = finish(child(train_args(npz, root / "run"), env=env))
    assert code == 0, err
    return {"params": final_params(root / "run" / "ck"), "env": env,
            "summary": json.loads(out), "records": strict_records(root / "run" / "m.jsonl")}


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
@pytest.mark.parametrize("held", ["", ":held"])
def test_second_signal_exits_at_once(npz, tmp_path, held):
    """Also while the main thread is held in native code the whole time (":held"), where
    Python's own handler runs once for both signals: seen on the GPU machine, where the
    second signal was lost until the compile returned."""
    code, _, err = finish(child(train_args(npz, tmp_path), "--signal-in-compile",
                                f"calibration:SIGINT:2{held}", env=child_env()))
    assert code == 130, err
    assert err.strip().splitlines()[-1] == "zerognn: second interrupt, exiting now"
    assert "Traceback" not in err


@pytest.mark.parametrize(("sig", "command", "code"), [
    ("SIGINT", ["data", "info", "tiny"], 0),
    ("SIGTERM", ["data", "info", "tiny"], 0),
    ("SIGINT", ["data", "info", "cora", "--root", "MISSING"], 2),
])
def test_a_signal_after_the_command_leaves_its_exit_code(tmp_path, sig, command, code):
    """A signal in the moment between a command's last line and the process's end was a
    KeyboardInterrupt's traceback from JAX's exit handler (SIGINT) or a silent exit 143
    (SIGTERM) after a finished run; now the command's own exit code stands (the
    `zerognn` entry point's handler; it had been installed on failures alone)."""
    argv = ["zerognn", *(str(tmp_path) if a == "MISSING" else a for a in command)]
    script = (
        "import os, signal, sys\n"
        f"sys.argv = {argv!r}\n"
        "import zerognn_cli\n"
        "code = zerognn_cli.main()\n"
        "print('finished with', code)\n"  # flushed on the way out
        f"os.kill(os.getpid(), signal.{sig})\n"
        "signal.pause()\n"  # (never returns: the handler ends the process)
        "sys.exit(99)\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == code, done.stderr
    assert done.stdout.endswith(f"finished with {code}\n")
    assert "Traceback" not in done.stderr


def test_a_finished_commands_shutdown_ignores_signals():
    """Past the exit handlers no Python handler runs, and Python leaves the system's:
    a SIGINT in the interpreter's last ~0.15 s after `data generate` had written its
    dataset ended the process as killed by it (status -2). From the exit handlers on,
    the entry point's signals are ignored (an atexit hook registered before the command
    runs after the entry point's; it sees SIG_IGN, and its own signal changes nothing)."""
    script = (
        "import atexit, os, signal, sys\n"
        "def late():\n"
        "    print('at exit', signal.getsignal(signal.SIGINT) is signal.SIG_IGN,"
        " signal.getsignal(signal.SIGTERM) is signal.SIG_IGN, flush=True)\n"
        "    os.kill(os.getpid(), signal.SIGINT)\n"
        "atexit.register(late)\n"
        "sys.argv = ['zerognn', 'data', 'info', 'tiny']\n"
        "import zerognn_cli\n"
        "sys.exit(zerognn_cli.main())\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout.endswith("at exit True True\n")


def test_main_called_from_python_leaves_the_signal_handlers_as_they_were(tmp_path,
                                                                        monkeypatch):
    """A notebook or test harness that calls `cli.main()` (argv from sys.argv) goes on
    after it: the exit-at-once handler is the entry point's alone."""
    monkeypatch.setattr(sys, "argv", ["zerognn", "data", "info", "cora", "--root",
                                      str(tmp_path)])
    before = [signal.getsignal(s) for s in interrupts.SIGNALS]
    assert main() == 2
    assert [signal.getsignal(s) for s in interrupts.SIGNALS] == before


def test_a_line_said_on_a_terminal_starts_over_the_progress_bar(monkeypatch):
    """On a terminal the announcement clears the line a progress bar is drawn on (it was
    written after the bar's text); a terminal without cursor controls (TERM=dumb) gets
    a new line instead of the escape; elsewhere it is written as it is."""
    said = []
    monkeypatch.setattr(interrupts.select, "select", lambda r, w, x, t: (r, w, x))
    monkeypatch.setattr(interrupts.os, "write", lambda fd, data: said.append((fd, data)))
    for tty, term in ((True, "xterm-256color"), (True, "dumb"), (False, "xterm")):
        monkeypatch.setattr(interrupts.os, "isatty", lambda fd, tty=tty: tty and fd == 2)
        monkeypatch.setenv("TERM", term)
        interrupts._say(b"zerognn: second interrupt, exiting now\n")
    assert said == [(2, b"\r\x1b[Kzerognn: second interrupt, exiting now\n"),
                    (2, b"\nzerognn: second interrupt, exiting now\n"),
                    (2, b"zerognn: second interrupt, exiting now\n")]


def test_deferred_passes_signals_on_to_the_wakeup_fd_it_replaced():
    """An event loop's wakeup fd (asyncio's signal handling) still sees the signals that
    arrive inside the block, and is put back after it."""
    read, write = os.pipe()
    os.set_blocking(write, False)
    before = signal.set_wakeup_fd(write)
    try:
        with interrupts.deferred():
            os.kill(os.getpid(), signal.SIGINT)
            assert select.select([read], [], [], 30)[0], "the signal was not passed on"
            assert os.read(read, 16) == bytes([signal.SIGINT])
            with pytest.raises(interrupts.Interrupted, match="after a test's kill"):
                interrupts.check("a test's kill")
    finally:
        put_back = signal.set_wakeup_fd(before)
        os.close(read)
        os.close(write)
    assert put_back == write


# Child scripts for `deferred()` itself (a review's findings, each hung or ended the
# process wrongly before): what each must print, and its exit code.
_BLOCKS = {
    # one signal inside a nested block: the outer block's, not a second signal
    "nested": ("""
with I.deferred():
    with I.deferred():
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(0.3)
        check("the inner block")
""", ["caught: interrupted by SIGINT after the inner block"], 0, 1),
    # one signal in each of two blocks, and a byte of the first that the reader gets only
    # after that block ended (written here as the wakeup fd would have): it neither
    # announces after the block nor counts in the next one as a second signal
    "two blocks": ("""
for i in range(2):
    try:
        with I.deferred():
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.3 * i)
            I.check(f"block {i}")
    except I.Interrupted as e:
        print("caught:", e)
    if i == 0:
        os.write(I._pipe[0], bytes([signal.SIGINT]))
    time.sleep(0.05)
""", ["caught: interrupted by SIGINT after block 0",
      "caught: interrupted by SIGINT after block 1"], 0, 2),
    # a child forked inside the block gets the same Ctrl-C: the parent counts one
    "fork": ("""
with I.deferred():
    if os.fork() == 0:
        time.sleep(2)
        os._exit(0)
    time.sleep(0.3)
    os.killpg(os.getpgrp(), signal.SIGINT)
    time.sleep(0.5)
    check("the fork")
""", ["caught: interrupted by SIGINT after the fork"], 0, 2),  # the child's own too
    # a second signal while the first one's announcement is written exits (a lock taken
    # there had hung the process for good); sent on the first write to stderr, whichever
    # thread writes it (the main thread's handler, or the watcher woken by the first
    # signal, which a stalled main thread leaves to write it)
    "in the announcement": ("""
real, sent = os.write, []
def write(fd, data):
    if fd == 2 and not sent:
        sent.append(fd)
        os.kill(os.getpid(), signal.SIGINT)
    return real(fd, data)
I.os = types.SimpleNamespace(**{**vars(os), "write": write})
with I.deferred():
    os.kill(os.getpid(), signal.SIGINT)
    for _ in range(10 ** 8):
        pass
print("not exited")
""", [], 130, None),
    # stderr that cannot be written (a pipe whose reader died with the Ctrl-C, `| tee`):
    # the announcement's error had escaped into the run and the second signal did nothing
    "stderr gone": ("""
os.close(2)
with I.deferred():
    os.kill(os.getpid(), signal.SIGINT)
    os.kill(os.getpid(), signal.SIGINT)
    for _ in range(10 ** 8):
        pass
print("not exited")
""", [], 130, None),
    # a hang-up comes twice (the shell passes it on, the kernel sends it as the shell
    # exits): no second signal, which had exited at once
    "hang-up twice": ("""
signal.signal(signal.SIGHUP, signal.SIG_DFL)  # (as a terminal leaves it; nohup ignores it)
with I.deferred():
    os.kill(os.getpid(), signal.SIGHUP)
    os.kill(os.getpid(), signal.SIGHUP)
    time.sleep(0.3)
    check("a hang-up")
""", ["caught: interrupted by SIGHUP after a hang-up"], 0, None),
    # after a hang-up the terminal fails every write (EIO): the block's terminal streams
    # write nowhere, so a progress bar's lines do not end the run before its safe point
    "hung-up terminal": ("""
import pty
signal.signal(signal.SIGHUP, signal.SIG_DFL)
master, slave = pty.openpty()
result = os.dup(1)  # the test's pipe
os.dup2(slave, 1)
os.dup2(slave, 2)
with I.deferred():
    os.close(master)  # the terminal is gone
    os.kill(os.getpid(), signal.SIGHUP)
    time.sleep(0.3)
    for i in range(2000):
        print("a progress line", i, flush=True)
    try:
        I.check("the hang-up")
    except I.Interrupted as e:
        os.write(result, f"caught: {e}\\n".encode())
""", ["caught: interrupted by SIGHUP after the hang-up"], 0, None),
    # a signal the process ignores (SIGINT in a job started with `&`, SIGHUP under
    # `nohup`) stays ignored in a block
    "ignored": ("""
for s in (signal.SIGINT, signal.SIGHUP):
    signal.signal(s, signal.SIG_IGN)
with I.deferred():
    os.kill(os.getpid(), signal.SIGINT)
    os.kill(os.getpid(), signal.SIGHUP)
    time.sleep(0.3)
    check("an ignored signal")
    print("ignored")
""", ["ignored"], 0, 0),
}


@pytest.mark.parametrize("case", list(_BLOCKS))
def test_deferred_blocks_count_each_signal_once(case):
    script, lines, code, announced = _BLOCKS[case]
    head = ("import os, signal, threading, time, types\n"
            "from zerognn_jax._src.training import interrupts as I\n"
            "def check(after):\n"
            "    try:\n"
            "        I.check(after)\n"
            "    except I.Interrupted as e:\n"
            "        print('caught:', e)\n")
    done = subprocess.run([sys.executable, "-c", head + script], capture_output=True,
                          text=True, timeout=120, env=child_env(), start_new_session=True)
    assert done.returncode == code, done.stderr[-2000:]
    assert done.stdout.splitlines() == lines, done.stderr[-2000:]
    if announced is not None:
        assert done.stderr.count("SIGINT received; stopping") == announced, done.stderr


def test_sigint_between_epochs_keeps_the_checkpoint_and_resumes(npz, tmp_path, reference):
    args = train_args(npz, tmp_path)
    code, _, err = finish(child(args, "--signal-after-save", "2:SIGINT",
                                env=reference["env"]))
    assert code == 130, err
    assert checkpoints(tmp_path / "ck") == [1, 2]
    # epoch 2 is due an evaluation (--eval-every 3): the signal stops the run after the
    # epoch's checkpoint, before that evaluation, and the resumed run evaluates it first
    assert err.strip().splitlines()[-1] == (
        f"zerognn: interrupted by SIGINT after training epoch 2; the checkpoint of epoch 2 "
        f"in {tmp_path / 'ck'} is kept; run the same command again to resume")
    code, out, err = finish(child(args, env=reference["env"]))
    assert code == 0, err
    summary = json.loads(out)
    assert summary["start_epoch"] == 3 and summary["epochs"] == EPOCHS
    assert summary["epochs_run"] == EPOCHS - 3
    assert_same_params(final_params(tmp_path / "ck"), reference["params"])
    records = last_run(strict_records(tmp_path / "m.jsonl"))
    assert "val_acc" in records[2]
    for got, want in zip(records[:-1], reference["records"][:-1]):
        assert {k: v for k, v in got.items() if k.endswith("_acc")} == \
            {k: v for k, v in want.items() if k.endswith("_acc")}


# ------------------------------------------------------- fault injection


def _next_epoch(ckpt: Path, rng) -> int:
    """A random epoch that has no checkpoint yet."""
    done = max(checkpoints(ckpt), default=-1)
    assert done < EPOCHS - 1, "a fault before the last left no epoch to break"
    return int(rng.integers(done + 1, EPOCHS))


def _kill_at_a_random_point(args, ckpt, rng, env, save):
    """SIGKILL at a safe point: after loading, calibration, initialisation, a chunk of
    an epoch not saved yet, or, unless it is the last, that whole epoch or, when it is
    due an evaluation, its training (its checkpoint saved, its evaluation not run)."""
    epoch = _next_epoch(ckpt, rng)
    points = ["loading the data", "calibration", "initialisation", f"step 2 of epoch {epoch}"]
    points += [f"epoch {epoch}"] if epoch < EPOCHS - 1 else []
    if epoch < EPOCHS - 1 and (epoch + 1) % EVAL_EVERY == 0:  # checkpointed, not evaluated
        points.append(f"training epoch {epoch}")
    point = points[rng.integers(len(points))]
    return (child(args, "--kill-at", point, env=env), f"SIGKILL after {point}",
            -signal.SIGKILL)


def _kill_in_save(args, ckpt, rng, env, save):
    epoch = _next_epoch(ckpt, rng)
    when = "commit" if save == "commit" else str(int(rng.integers(0, 5000)))
    return (child(args, "--kill-in-save", f"{epoch}:{when}", env=env),
            f"SIGKILL in the save of epoch {epoch} at {when}", -signal.SIGKILL)


def _signal_after_checkpoint(args, ckpt, rng, env, save):
    epoch = _next_epoch(ckpt, rng)
    sig = [signal.SIGKILL, signal.SIGTERM, signal.SIGINT][rng.integers(3)]
    expected = -sig if sig == signal.SIGKILL else 128 + sig
    return (child(args, "--signal-after-save", f"{epoch}:{sig.name}", env=env),
            f"{sig.name} after the checkpoint of epoch {epoch}", expected)


# The faults each seed draws: seed 6, SIGKILL after step 2 of epoch 2, at the commit of
# epoch 4's save, SIGINT after epoch 4's checkpoint; seed 2, SIGKILL after calibration,
# at call 1,492 of epoch 0's save (no checkpoint yet), SIGINT after epoch 2's checkpoint.
# Other seeds draw no other kind of state (a SIGKILL or SIGTERM just after a checkpoint
# leaves what a SIGINT there leaves: the checkpoint, not its evaluation or record); a
# seed costs four child processes, ~35 s of CPU. (Step 4 of an epoch, its last chunk,
# is no safe point: a signal there stops the run after the epoch's checkpoint.)
@pytest.mark.parametrize(("seed", "save"), [(6, "commit"), (2, "calls")])
def test_runs_killed_at_random_points_resume_to_the_same_parameters(npz, tmp_path, reference,
                                                                    seed, save):
    """Three failures per seed, each followed by a rerun of the same command that is the
    next one to fail: SIGKILL at a random safe point; SIGKILL inside the write of a
    checkpoint not saved yet (at a random Python call of it, or just before orbax commits
    it); SIGKILL, SIGTERM or SIGINT just after a random checkpoint. Each fault lands at
    its point (tests/_fault_child.py), whatever the machine's load. A last rerun
    finishes: its final parameters equal the uninterrupted run's bit for bit, its metrics
    log lists every epoch once, its accuracies are the same, and no temporary folder of
    a killed save is left."""
    rng = np.random.default_rng(seed)
    args, ckpt = train_args(npz, tmp_path), tmp_path / "ck"
    for fault in (_kill_at_a_random_point, _kill_in_save, _signal_after_checkpoint):
        proc, what, expected = fault(args, ckpt, rng, reference["env"], save)
        code, _, err = finish(proc)
        print(f"{what}: exit {code}, checkpoints {checkpoints(ckpt)}")
        assert code == expected, err
        assert "Traceback" not in err, err
    code, out, err = finish(child(args, env=reference["env"]))
    assert code == 0, err
    assert_same_params(final_params(ckpt), reference["params"])
    records = last_run(strict_records(tmp_path / "m.jsonl"))
    assert [r["epoch"] for r in records[:-1]] == list(range(EPOCHS))
    summary = json.loads(out)
    assert records[-1] == summary and summary["epochs"] == EPOCHS
    for key in ("train_acc", "val_acc", "test_acc"):
        assert summary[key] == reference["summary"][key]
    assert not list(ckpt.glob("*.orbax-checkpoint-tmp*"))


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


def test_other_settings_are_refused_in_one_line(npz, run, capfd, monkeypatch):
    base = ["train", "--dataset", str(npz), "--hidden", "16", "--layers", "2", "--fanouts",
            "5,5", "--batch-size", "32", "--eval-mode", "none", "--no-progress",
            "--checkpoint-dir", str(run / "ck")]
    assert main([*base, "--hidden", "32", "--lr", "0.01", "--epochs", "5"]) == 2
    err = capfd.readouterr().err
    assert err == (f"zerognn: error: --checkpoint-dir {run / 'ck'} holds a run with other "
                   f"settings (epoch 2): --hidden 16 there, 32 here; --lr 0.003 there, 0.01 "
                   f"here; resume with the same settings or use another --checkpoint-dir\n")
    assert main([*base, "--model", "gcn", "--epochs", "5"]) == 2
    assert "model 'sage' there, 'gcn' here" in capfd.readouterr().err
    # the folder as it was given, relative too (the other messages spell it so; this one
    # spelled it absolute)
    monkeypatch.chdir(run)
    assert main([*base[:-1], "ck", "--model", "gcn", "--epochs", "5"]) == 2
    assert capfd.readouterr().err.startswith("zerognn: error: --checkpoint-dir ck holds a run")
    assert main([*base, "--batch-size", "64", "--epochs", "5"]) == 2
    assert ("global_batch (--batch-size as asked x devices x processes) 32 there, 64 here"
            in capfd.readouterr().err)
    # More epochs, the data from a file, another chunk size, kernels and evaluation: the
    # same run, resumed.
    assert main([*base, "--epochs", "4", "--chunk-steps", "1", "--kernels", "xla"]) == 0
    assert json.loads(capfd.readouterr().out)["start_epoch"] == 3


def test_fewer_epochs_than_the_checkpoint_holds_is_refused_in_one_line(npz, run, capfd):
    """It trained nothing and reported the checkpoint's epochs as its own (issue 34)."""
    assert main(["train", "--dataset", str(npz), "--hidden", "16", "--layers", "2",
                 "--fanouts", "5,5", "--batch-size", "32", "--eval-mode", "none",
                 "--no-progress", "--checkpoint-dir", str(run / "ck"), "--epochs", "1"]) == 2
    assert capfd.readouterr().err == (
        f"zerognn: error: --epochs 1 is below the 3 epochs that --checkpoint-dir "
        f"{run / 'ck'} holds, so nothing would be trained; ask for --epochs 4 or more to "
        f"train on (3 to evaluate it again), or use another --checkpoint-dir to start "
        f"afresh\n")


def test_steps_sampled_ahead_are_free_on_resume(tmp_path):
    """sample_ahead leaves the samples unchanged, so a checkpoint resumes under another
    value, and one written while it was part of the identity (8, the default then)
    resumes under today's default; other fields still have to match."""
    ck = Checkpointer(str(tmp_path))
    stats = {"name": "x", "nodes": 5}
    ident = identity(TrainConfig(), stats, 32)
    assert identity(TrainConfig(sample_ahead=16), stats, 32) == ident
    before = {**ident, "sample_ahead": 8}
    ck.check(1, {"identity": before}, ident)
    with pytest.raises(CheckpointMismatch, match="hidden 64 there, 256 here"):
        ck.check(1, {"identity": {**before, "hidden": 64}}, ident)


def test_a_presets_scale_is_free_on_resume(tmp_path):
    """The data are compared by their counts: a run of products-like at scale 0.002
    resumes from the file `zerognn data generate` wrote of it (read at scale 1, which
    only presets take), and another graph of the preset is still refused."""
    ck = Checkpointer(str(tmp_path))
    stats = {"name": "products-like", "nodes": 4898}
    ident = identity(TrainConfig(dataset="products-like", scale=0.002), stats, 32)
    ck.check(1, {"identity": ident}, identity(TrainConfig(dataset="p.npz"), stats, 32))
    with pytest.raises(CheckpointMismatch, match="dataset.nodes 4898 there, 2449 here"):
        ck.check(1, {"identity": ident}, identity(TrainConfig(dataset="p.npz"),
                                                  {**stats, "nodes": 2449}, 32))


def test_a_relation_resumes_under_its_name_or_its_full_name(tmp_path):
    """relation_fanouts and link_relation name a relation by its unique name or in full:
    either spelling resumes the other's checkpoint, one written before identities named
    relations in full included; another relation's fanouts are still refused."""
    ck = Checkpointer(str(tmp_path))
    rels = (("paper", "cites", "paper"), ("author", "writes", "paper"))
    stats = {"name": "x", "nodes": 5}
    run = lambda fanouts, link: TrainConfig(fanouts=(2, 2), layers=2, relation_fanouts=fanouts,
                                            task="link", link_relation=link)
    short = run({"cites": (1, 0)}, "writes")
    full = run({"paper__cites__paper": (1, 0)}, "author__writes__paper")
    ident = identity(full, stats, 32, relations=rels)
    assert identity(short, stats, 32, relations=rels) == ident
    assert ident["relation_fanouts"] == {"paper__cites__paper": [1, 0]}
    assert ident["link_relation"] == "author__writes__paper"
    older = identity(short, stats, 32)  # as written before: the names as given
    assert older["link_relation"] == "writes"
    ck.check(1, {"identity": older}, ident, rels)
    with pytest.raises(CheckpointMismatch, match="relation_fanouts"):
        ck.check(1, {"identity": older}, ident)  # compared without the graph's relations
    other = identity(run({"writes": (1, 0)}, "writes"), stats, 32, relations=rels)
    with pytest.raises(CheckpointMismatch, match=r"relation_fanouts \{'paper__cites__paper'"):
        ck.check(1, {"identity": older}, other, rels)
    # on a graph of one relation, link_relation None names it
    one = rels[1:]
    named = identity(run(None, "writes"), stats, 32, relations=one)
    assert identity(run(None, None), stats, 32, relations=one) == named
    ck.check(1, {"identity": identity(run(None, None), stats, 32)}, named, one)
    assert identity(run(None, None), stats, 32, relations=rels)["link_relation"] is None


def test_a_field_added_since_the_checkpoint_resumes_at_what_runs_did_before(tmp_path):
    """A checkpoint written before `init` existed records no `init`: it resumes under
    "flax" (what every run did then, `ADDED_SINCE`), not under another value; another
    field it lacks is still refused."""
    ck = Checkpointer(str(tmp_path))
    stats = {"name": "x", "nodes": 5}
    older = {k: v for k, v in identity(TrainConfig(), stats, 32).items() if k != "init"}
    ck.check(1, {"identity": older}, identity(TrainConfig(), stats, 32))
    with pytest.raises(CheckpointMismatch, match="init 'flax' there, 'torch' here"):
        ck.check(1, {"identity": older}, identity(TrainConfig(init="torch"), stats, 32))
    with pytest.raises(CheckpointMismatch, match=r"flat_outer absent there, unset \(the "
                                                 r"default\) here"):
        ck.check(1, {"identity": {k: v for k, v in older.items() if k != "flat_outer"}},
                 identity(TrainConfig(), stats, 32))


def test_a_checkpoint_before_the_optimizer_options_resumes_and_is_read_for_inference(
        tmp_path):
    """A checkpoint that predates lr_schedule and the other optimizer options resumes
    under their defaults (and not under a schedule), and restores for inference under
    any of them (what only trains is not compared there); `zerognn predict` of such a
    checkpoint named the defaults as differences ("False there, absent here")."""
    from zerognn_jax._src.training.inference import _compared

    ck = Checkpointer(str(tmp_path))
    stats = {"name": "x", "nodes": 5}
    new = ("decoupled_weight_decay", "lr_schedule", "warmup_epochs", "grad_clip")
    older = {k: v for k, v in identity(TrainConfig(), stats, 32).items() if k not in new}
    now = identity(TrainConfig(), stats, 32)
    ck.check(1, {"identity": older}, now)
    ck.check(1, {"identity": older}, _compared(now, {"identity": older}))
    cosine = identity(TrainConfig(lr_schedule="cosine", grad_clip=1.0), stats, 32)
    ck.check(1, {"identity": older}, _compared(cosine, {"identity": older}))
    with pytest.raises(CheckpointMismatch, match="lr_schedule 'constant' there, 'cosine' "
                                                 "here; grad_clip 0.0 there, 1.0 here"):
        ck.check(1, {"identity": older}, cosine)


# TrainConfig's fields as of this test; a field added later must say how checkpoints
# written before it resume (checkpoint.ADDED_SINCE, or FREE_ON_RESUME) before it joins.
KNOWN_FIELDS = frozenset({
    "balance_window", "batch_size", "best_metric", "checkpoint_dir", "chunk_steps",
    "decoupled_weight_decay", "grad_clip", "lr_schedule", "warmup_epochs", "activation",
    "attention_dropout",
    "output_heads",
    "dataset", "decoder", "dedup", "devices", "dropout", "dtype", "edge_features",
    "embedding_dim", "engine", "envelope", "epochs", "eval_batch_size", "eval_every",
    "eval_mode", "fanouts", "feature_cache_gib", "feature_placement", "flat_outer",
    "gemm_backend", "graph_aggregation", "heads", "hidden", "host_row_order", "init",
    "input_dropout", "kernels", "layers", "link_metric", "link_relation", "link_split", "lr",
    "margin", "metrics_out", "model", "multiple", "negative_mode", "negatives", "norm",
    "normalize_features",
    "progress", "readout", "relation_fanouts", "replace", "root", "sample_ahead",
    "sampler", "scale", "seed", "shard_features", "task", "tensorboard_dir",
    "weight_decay"})


def test_a_partial_loss_recorded_before_its_arguments_were_named_resumes(tmp_path):
    """Checkpoints written before 2026-12-02 named every functools.partial loss
    "partial": one resumes under the partial given now (as it did then); another
    loss's is still refused."""
    ck = Checkpointer(str(tmp_path))
    stats = {"name": "x", "nodes": 5}
    now = identity(TrainConfig(), stats, 32, {"loss": "partial(f, eps=0.1)"})
    ck.check(1, {"identity": identity(TrainConfig(), stats, 32, {"loss": "partial"})}, now)
    with pytest.raises(CheckpointMismatch, match="custom.loss 'g' there, 'partial"):
        ck.check(1, {"identity": identity(TrainConfig(), stats, 32, {"loss": "g"})}, now)


def test_a_new_option_says_how_older_checkpoints_resume():
    """Every TrainConfig field not in KNOWN_FIELDS is free on resume or listed in
    ADDED_SINCE with what runs did before it; otherwise checkpoints written before the
    field existed could no longer resume."""
    new = {f.name for f in dataclasses.fields(TrainConfig)} - KNOWN_FIELDS
    unsaid = sorted(new - FREE_ON_RESUME - set(ADDED_SINCE))
    assert not unsaid, (f"TrainConfig fields {unsaid}: add each to checkpoint.ADDED_SINCE "
                        f"(with the value runs had before it) or FREE_ON_RESUME, then to "
                        f"KNOWN_FIELDS")
    assert set(ADDED_SINCE) <= {f.name for f in dataclasses.fields(TrainConfig)}


def test_another_dataset_is_refused(run):
    other = products_like(0.0006, seed=0)
    with pytest.raises(CheckpointMismatch, match=r"dataset\.nodes 1225 there, 1469 here"):
        train(config(run, 4), other)


def truncate_arrays(step: Path):
    for f in (step / "state").rglob("*"):
        if f.is_file() and f.parent.name == "d":
            f.write_bytes(f.read_bytes()[:10])


def flip_bits(step: Path):
    for f in (step / "state").rglob("*"):
        if f.is_file() and f.parent.name == "d":
            data = bytearray(f.read_bytes())
            data[::97] = bytes(b ^ 0x10 for b in data[::97])
            f.write_bytes(bytes(data))


def flip_one_value_bit(step: Path):
    """One bit of the largest array's values changed, written back through the storage
    itself, which then reads it without complaint (the checksums find it). A byte
    flipped in a data file lands in compressed bytes or in values by the order the
    arrays were written in, which varies from run to run."""
    with ocp.StandardCheckpointer() as storage:
        leaves, tree = jax.tree_util.tree_flatten(storage.restore(step / "state"))
    largest = max(range(len(leaves)), key=lambda i: np.asarray(leaves[i]).nbytes)
    values = np.array(leaves[largest])
    values.reshape(-1).view(np.uint8)[values.nbytes // 2] ^= 0x10
    leaves[largest] = values
    shutil.rmtree(step / "state")
    with ocp.StandardCheckpointer() as storage:
        storage.save(step / "state", jax.tree_util.tree_unflatten(tree, leaves))


def copy_of_the_epoch_before(step: Path):
    """The folder replaced by a copy of the previous epoch's (a backup put back under
    the wrong number): whole and readable, but not this epoch's. It was resumed as this
    epoch, training one epoch short, and restored and exported as it."""
    shutil.rmtree(step)
    shutil.copytree(step.parent / str(int(step.name) - 1), step)


CORRUPTIONS = {
    "arrays cut short": truncate_arrays,
    "arrays bit-flipped": flip_bits,
    "one value bit-flipped": flip_one_value_bit,
    "record not JSON": lambda step: (step / "meta" / "metadata").write_text("{not json"),
    "another epoch's copy": copy_of_the_epoch_before,
}


def test_a_checksum_changes_with_any_single_bit_of_any_dtype():
    """Every bit of every array, whatever its dtype, is in its checksum: flipping one
    (each leaf, a random position and bit) is named by its path; the same state passes."""
    rs = np.random.default_rng(0)
    state = {"f": rs.normal(size=(5, 3)).astype(np.float32),
             "h": rs.normal(size=7).astype(jnp.bfloat16),
             "m": {"b": rs.random(4) < 0.5, "i": rs.integers(-9, 9, 6).astype(np.int8)},
             "u": np.uint32(7), "e": np.zeros((0, 3), np.float32),
             "d": rs.normal(size=3), "l": rs.integers(-2**40, 2**40, 4)}  # 8-byte, as given
    sums = state_checksums(state)
    check_checksums(2, state, sums)
    check_checksums(2, state, None)  # a checkpoint written before checksums
    for path in ("['f']", "['h']", "['m']['b']", "['m']['i']", "['u']", "['d']", "['l']"):
        leaves = jax.tree_util.tree_flatten_with_path(state)[0]
        flipped = []
        for p, leaf in leaves:
            leaf = np.array(leaf)
            if jax.tree_util.keystr(p) == path:
                bits = leaf.reshape(-1).view(np.uint8)
                at = rs.integers(bits.size)
                bits[at] ^= np.uint8(1 << (rs.integers(1) if leaf.dtype == bool
                                             else rs.integers(8)))
            flipped.append(leaf)
        changed = jax.tree_util.tree_unflatten(jax.tree_util.tree_structure(state), flipped)
        with pytest.raises(ValueError, match=rf"checkpoint 2 holds other bytes than were "
                                             rf"written in 1 of its 8 arrays \(first "
                                             rf"{re.escape(path)}\): damaged on disk"):
            check_checksums(2, changed, sums)


@pytest.mark.parametrize("corrupt", CORRUPTIONS.values(), ids=CORRUPTIONS.keys())
def test_corrupt_latest_checkpoint_falls_back_to_the_previous(dataset, run, four_epochs,
                                                              capfd, corrupt):
    ckpt = run / "ck"
    assert checkpoints(ckpt) == [1, 2]
    corrupt(ckpt / "2")
    capfd.readouterr()
    with pytest.warns(CheckpointWarning, match=rf"unreadable checkpoint in {re.escape(str(ckpt))} "
                                               rf"\(epoch 2: .+\); set aside as 2\.corrupt, "
                                               rf"resuming from the one before") as caught:
        result = train(config(run, 4), dataset)
    # (on a GPU, JAX's deprecation of the Pallas Triton backend is caught too)
    message = next(str(w.message) for w in caught if w.category is CheckpointWarning)
    if corrupt is CORRUPTIONS["one value bit-flipped"]:  # read back, then compared
        assert "checkpoint 2 holds other bytes than were written in 1 of its " in message
    elif corrupt is CORRUPTIONS["another epoch's copy"]:
        assert "(epoch 2: ValueError: its record is of epoch 1: a folder copied" in message
    elif corrupt is not CORRUPTIONS["record not JSON"]:  # tensorstore's message, whole
        assert f'local file "{ckpt}/2/state/' in message and "tensorstore_spec" not in message
    assert result.summary["start_epoch"] == 2
    assert (ckpt / "2.corrupt").is_dir() and checkpoints(ckpt) == [2, 3]
    assert_same_params(params_of(result), four_epochs)
    records = last_run(strict_records(run / "m.jsonl"))
    assert [r["epoch"] for r in records[:-1]] == [0, 1, 2, 3]
    err = capfd.readouterr().err
    assert "Traceback" not in err and "Exception ignored" not in err and "absl" not in err


def test_restoring_a_checkpoint_that_records_another_epoch_is_one_line(dataset, run):
    """A folder that holds another epoch's checkpoint was restored as its own epoch.
    Restored to train on, it was set aside as 2.corrupt and epoch 1 handed back with a
    warning: a read changed the run's folder. Both restores refuse it, and leave it."""
    copy_of_the_epoch_before(run / "ck" / "2")
    refused = rf"^checkpoint 2 in {re.escape(str(run / 'ck'))} does not read \(ValueError: " \
              rf"its record is of epoch 1: a folder copied or renamed from another epoch's\)"
    with pytest.raises(ValueError, match=refused):
        restore(str(run / "ck"), dataset=dataset, for_inference=True)
    with pytest.raises(ValueError, match=refused):
        restore(str(run / "ck"), dataset=dataset)
    assert checkpoints(run / "ck") == [1, 2] and not (run / "ck" / "2.corrupt").exists()
    assert restore(str(run / "ck"), dataset=dataset, epoch=1,
                   for_inference=True).summary["epoch"] == 1
    assert restore(str(run / "ck"), dataset=dataset, epoch=1).summary["epoch"] == 1


def test_a_checkpoint_of_another_format_is_refused_not_set_aside(dataset, run):
    """A checkpoint whose record names another format was resumed, restored and exported
    as if this version wrote it; it is refused in one line, kept where it is."""
    record = run / "ck" / "2" / "meta" / "metadata"
    meta = json.loads(record.read_text())
    assert meta["written_by"] == {"zerognn_jax": zg.__version__, "jax": jax.__version__}
    meta["written_by"]["zerognn_jax"] = "9.0"
    record.write_text(json.dumps({**meta, "format": 99}))
    refused = r"holds a checkpoint of format 99 \(epoch 2, written by zerognn-jax 9.0\); " \
              r"this version of zerognn-jax reads format 1"
    with pytest.raises(CheckpointMismatch, match=refused):
        train(config(run, 4), dataset)
    with pytest.raises(CheckpointMismatch, match=refused):
        restore(str(run / "ck"), dataset=dataset, for_inference=True)
    assert checkpoints(run / "ck") == [1, 2] and not (run / "ck" / "2.corrupt").exists()


def test_restoring_for_inference_compares_the_variables_checksums(dataset, run):
    """`restore(for_inference=True)` reads the model's variables only, and checks them
    against the checksums their checkpoint recorded (here the record's, changed)."""
    record = run / "ck" / "2" / "meta" / "metadata"
    meta = json.loads(record.read_text())
    key = next(k for k in meta["checksums"] if k.startswith("['params']"))
    meta["checksums"][key] ^= 1
    record.write_text(json.dumps(meta))
    with pytest.raises(ValueError, match=rf"checkpoint 2 in .+ does not read \(ValueError: "
                                         rf"checkpoint 2 holds other bytes than were written "
                                         rf"in 1 of its \d+ arrays \(first {re.escape(key)}"):
        restore(str(run / "ck"), dataset=dataset, for_inference=True)


def test_orbax_teardown_noise_is_dropped_while_a_checkpointer_is_open(tmp_path, monkeypatch,
                                                                     caplog):
    """A failed read or write leaves tensorstore callbacks that reach orbax's closed event
    loop, printed as a dozen "RuntimeError: Event loop is closed" tracebacks, and tasks
    whose failure asyncio logs again; an open Checkpointer drops those, nothing else."""
    seen = []
    monkeypatch.setattr(sys, "unraisablehook", seen.append)
    closed = SimpleNamespace(exc_value=RuntimeError("Event loop is closed"), object=None)
    other = SimpleNamespace(exc_value=RuntimeError("something else"), object=None)
    orbax_task = ("Task exception was never retrieved\nfuture: <Task finished coro=<"
                  "async_serialize_from_host() done, defined at /x/orbax/checkpoint/y.py:1>>")
    orbax_shutdown = ("unhandled exception during asyncio.run() shutdown\ntask: <Task finished "
                      "coro=<_read_array_index_and_device_put() done, defined at "
                      "/x/orbax/checkpoint/y.py:1>>")
    tensorstore_future = ("Future exception was never retrieved\nfuture: <Future finished "
                          "exception=ValueError('OUT_OF_RANGE: Error reading \"a/0.0\" in "
                          "OCDBT database at local file \"/x/\"')>")
    ckpt = Checkpointer(str(tmp_path / "ck"))
    try:
        sys.unraisablehook(closed)
        sys.unraisablehook(other)
        logging.getLogger("asyncio").error(orbax_task)
        logging.getLogger("asyncio").error(orbax_shutdown)
        logging.getLogger("asyncio").error(tensorstore_future)
        logging.getLogger("asyncio").error("Task exception was never retrieved: mine")
    finally:
        ckpt.close()
    assert seen == [other] and sys.unraisablehook == seen.append
    assert [r.getMessage() for r in caplog.records] == [
        "Task exception was never retrieved: mine"]


def test_no_readable_checkpoint_is_an_error(dataset, run):
    for epoch in (1, 2):
        CORRUPTIONS["record not JSON"](run / "ck" / str(epoch))
    with pytest.raises(ValueError, match=r"no readable checkpoint in .*\(epoch 2: "
                                         r"JSONDecodeError.*; epoch 1: JSONDecodeError"):
        train(config(run, 4), dataset)


def test_a_resumed_run_says_so_and_what_is_left(dataset, run, capfd):
    """With progress on, a resumed run says where it resumes and what is left: a finished
    run's rerun trained nothing, and printed the same summary as if it had trained."""
    train(config(run, 3, progress=True), dataset)
    err = capfd.readouterr().err
    assert (f"resuming from the checkpoint of epoch 2 in {run / 'ck'}: nothing is left to "
            f"train at epochs=3 (more epochs train on; another checkpoint_dir starts "
            f"afresh)\n") in err
    train(config(run, 4, progress=True), dataset)
    err = capfd.readouterr().err
    assert f"resuming from the checkpoint of epoch 2 in {run / 'ck'}: epoch 3 left to " \
           f"train\n" in err
    train(config(run, 4), dataset)  # progress off: nothing said
    assert "resuming" not in capfd.readouterr().err


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
    assert summary["epochs_run"] == 1
    assert summary["compile_seconds"] == pytest.approx(this_run[3]["compile_seconds"])
    assert summary["compile_seconds"] < sum(r["compile_seconds"] for r in this_run[:-1])
    assert_same_params(params_of(result), four_epochs)


@pytest.mark.parametrize("older", [False, True])
def test_a_resumed_run_takes_its_checkpoints_envelope_without_calibrating(
        dataset, run, four_epochs, monkeypatch, older):
    """A resumed run calibrated its envelope and then took the checkpoint's (4.8 s of a
    22.9 s typed resume on a CPU): it takes the checkpoint's from the start now, and its
    summary has no calibration fields. A checkpoint written before checkpoints recorded
    their seeds per device calibrates first, as before; both end where the uninterrupted
    run does (tests/test_typed_train.py checks a calibrated envelope's summary)."""
    if older:  # the meta without the field, as each of the two reads gives it
        read, restore_ = Checkpointer.read_meta, Checkpointer.restore

        def without_seeds(meta):
            del meta["envelope"]["seeds_per_device"]
            return meta

        monkeypatch.setattr(Checkpointer, "read_meta",
                            lambda self, epoch: without_seeds(read(self, epoch)))
        monkeypatch.setattr(Checkpointer, "restore", lambda self, epoch, like: (
            lambda state, meta: (state, without_seeds(meta)))(*restore_(self, epoch, like)))
    applies, taken = trainer._envelope_applies, []
    monkeypatch.setattr(trainer, "_envelope_applies", lambda program, saved, env: (
        taken.append("seeds_per_device" in saved) or applies(program, saved, env)))
    choose, calls = trainer.starting_envelope, []

    def calibrating(*args, **kwargs):
        calls.append(1)
        return choose(*args, **kwargs)

    monkeypatch.setattr(trainer, "starting_envelope", calibrating)
    result = train(config(run, 4), dataset)
    assert result.summary["start_epoch"] == 3 and len(calls) == int(older)
    assert taken == [not older]  # the restored meta, as written then
    assert_same_params(params_of(result), four_epochs)


def test_a_batch_beyond_the_training_items_is_fitted_and_its_checkpoints_resume(
        dataset, tmp_path):
    """One step takes all 98 training nodes either way, but the step's buffers were sized
    by the batch asked (a probe: 45x the epoch and 7x the memory at 200000 on 2,938
    nodes). The program takes 98; the options and the checkpoints' identity keep 10,000
    (what checkpoints written before recorded), so the run resumes and restores, and it
    trains as a batch of 98 does."""
    big = train(config(tmp_path / "big", 1, batch_size=10_000), dataset)
    exact = train(config(tmp_path / "exact", 1, batch_size=98), dataset)
    assert big.summary["batch_size"] == 98 and big.summary["config"]["batch_size"] == 10_000
    assert big.history[0]["envelope"][0] == 98 and big.history[0]["steps"] == 1
    assert big.history[0]["loss"] == exact.history[0]["loss"]
    meta = Checkpointer(str(tmp_path / "big" / "ck")).read_meta(0)
    assert meta["identity"]["global_batch"] == 10_000
    resumed = train(config(tmp_path / "big", 2, batch_size=10_000), dataset)
    assert resumed.summary["start_epoch"] == 1
    assert_same_params(params_of(restore(str(tmp_path / "big" / "ck"), dataset=dataset)),
                       params_of(resumed))


@pytest.mark.parametrize("sig", ["SIGINT", "SIGHUP"])
def test_a_signal_inside_deferred_interrupts_stops_train_after_the_epoch(dataset, tmp_path,
                                                                        sig):
    """The public block (`zg.deferred_interrupts`, as the command line runs `train`): a
    SIGINT sent during epoch 0 (from its callback) stops the run after that epoch, with
    `zg.Interrupted` naming it, its checkpoint kept; so does a SIGHUP (a closed
    terminal), which had ended the process at once."""
    import zerognn_jax as zg

    if not hasattr(signal, sig):
        pytest.skip(f"no {sig} on this platform")
    signum = getattr(signal, sig)

    def kill(record):
        os.kill(os.getpid(), signum)

    before = signal.signal(signum, signal.SIG_DFL)  # (pytest under nohup ignores SIGHUP)
    try:
        with zg.deferred_interrupts():
            with pytest.raises(zg.Interrupted,
                               match=f"interrupted by {sig} after epoch 0") as err:
                train(config(tmp_path, 3), dataset, callbacks=(kill,))
    finally:
        signal.signal(signum, before)
    assert err.value.exit_code == 128 + signum
    assert Checkpointer(str(tmp_path / "ck")).all_epochs() == [0]


def test_a_signal_after_the_last_epochs_training_lets_the_run_finish(dataset, tmp_path):
    """A SIGINT during the last epoch's evaluation (sent here from its callback, which
    runs after it) stopped the run before its summary: without a checkpoint folder the
    whole run was lost. All that is left then is the summary, so the run finishes."""
    import zerognn_jax as zg

    def kill(record):
        if record["epoch"] == 1:
            os.kill(os.getpid(), signal.SIGINT)

    with zg.deferred_interrupts():
        result = train(config(tmp_path, 2, checkpoint_dir=None, eval_every=1), dataset,
                       callbacks=(kill,))
    assert result.summary["epochs_run"] == 2 and "test_acc" in result.summary
    assert strict_records(tmp_path / "m.jsonl")[-1]["summary"]


def test_a_run_stopped_in_its_last_evaluation_keeps_the_epoch(dataset, tmp_path, monkeypatch,
                                                               three_epochs):
    """The epoch's checkpoint is written before its evaluation: a run stopped during a
    long final evaluation keeps the epoch's training, and the rerun only evaluates it,
    to the uninterrupted run's figures and parameters, and offers it to the best
    checkpoint."""
    evaluate = trainer.evaluate

    def stopped(*args, **kwargs):
        raise interrupts.Interrupted(signal.SIGTERM, "a test's evaluation")

    cfg = config(tmp_path, 3, best_metric="val_acc")
    monkeypatch.setattr(trainer, "evaluate", stopped)
    with pytest.raises(interrupts.Interrupted):
        train(cfg, dataset)
    assert Checkpointer(str(tmp_path / "ck")).all_epochs() == [1, 2]
    assert len((tmp_path / "m.jsonl").read_text().splitlines()) == 2  # epochs 0 and 1
    # a record of another run's epoch 2 is not taken for this one's
    (tmp_path / "ck" / "evaluation.json").write_text(json.dumps(
        {"trained": {"epoch": 2, "loss": 1.0, "epoch_seconds": 1.0},
         "evaluation": {"val_acc": 0.0, "test_acc": 0.0}}))
    monkeypatch.setattr(trainer, "evaluate", evaluate)
    seen = []
    result = train(cfg, dataset, callbacks=(lambda r: seen.append(r) and False,))
    assert [r["epoch"] for r in seen] == [2] and "test_acc" in seen[0]  # completed now
    assert result.summary["start_epoch"] == 3 and result.summary["epochs_run"] == 0
    assert result.summary["best"]["epoch"] == 2  # the best checkpoint was offered it
    want = last_run(strict_records(three_epochs / "m.jsonl"))
    got = last_run(strict_records(tmp_path / "m.jsonl"))
    assert [r["epoch"] for r in got[:-1]] == [0, 1, 2]
    for key in ("val_acc", "test_acc"):
        assert got[2][key] == want[2][key] == result.summary[key]
    assert_same_params(final_params(tmp_path / "ck", 2), final_params(three_epochs / "ck", 2))


def test_a_resume_keeps_the_best_checkpoints_metric(dataset, tmp_path):
    """`best/` holds the best epoch by the metric that kept it: a resume naming another
    is refused before any training; a run that kept no best checkpoint before starts
    one from the epochs it trains (the epochs before have no state to keep)."""
    kept = tmp_path / "kept"
    train(config(kept, 2, best_metric="val_acc"), dataset)
    with pytest.raises(CheckpointMismatch, match=r"best_metric 'train_acc' is not the metric "
                                                 r"of the best checkpoint in checkpoint_dir "
                                                 r".+ \(epoch 1, kept by 'val_acc'\): resume "
                                                 r"with best_metric 'val_acc'"):
        train(config(kept, 3, best_metric="train_acc"), dataset)
    assert Checkpointer(str(kept / "ck")).all_epochs() == [0, 1]
    late = tmp_path / "late"
    train(config(late, 2, eval_every=1), dataset)
    res = train(config(late, 3, eval_every=1, best_metric="val_acc"), dataset)
    assert res.summary["best"]["epoch"] == 2
    assert Checkpointer(str(late / "ck" / "best")).all_epochs() == [2]


def test_a_signal_in_an_epochs_last_chunk_keeps_the_epoch(dataset, run, four_epochs,
                                                         monkeypatch):
    """A signal that arrives while an epoch's last chunk runs stops the run once that
    epoch is checkpointed (before, the check after the chunk dropped the whole epoch);
    the checkpoint holds the uninterrupted run's parameters."""
    make_engine = trainer.make_engine

    def signalled_engine(*args, **kwargs):
        runner = make_engine(*args, **kwargs)
        run_epoch = runner.run_epoch

        def run_with_signal(*a, on_progress, **k):
            def progress(done, total):
                if done == total:  # arrived during the chunk that ends the epoch
                    interrupts._received.append(signal.SIGINT)
                on_progress(done, total)
            return run_epoch(*a, on_progress=progress, **k)

        runner.run_epoch = run_with_signal
        return runner

    monkeypatch.setattr(interrupts, "_received", [])
    monkeypatch.setattr(trainer, "make_engine", signalled_engine)
    kept = "after training epoch 3\nthe checkpoint of epoch 3 "
    with pytest.raises(interrupts.Interrupted, match=kept):
        train(config(run, 4), dataset)
    assert Checkpointer(str(run / "ck")).all_epochs()[-1] == 3
    assert_same_params(final_params(run / "ck", 3), four_epochs)


def test_an_extended_run_takes_its_last_evaluation_from_the_record(dataset, run, monkeypatch):
    """A finished run's last checkpoint precedes its evaluation; resumed to train one
    more epoch, the run reads that evaluation from evaluation.json instead of running it
    again: one evaluation (the new last epoch's), the same figures in the log."""
    before = last_run(strict_records(run / "m.jsonl"))
    calls = []
    evaluate = trainer.evaluate
    monkeypatch.setattr(trainer, "evaluate", lambda *a, **k: calls.append(1) or evaluate(*a, **k))
    train(config(run, 4), dataset)
    assert len(calls) == 1
    after = last_run(strict_records(run / "m.jsonl"))
    assert [r["epoch"] for r in after[:-1]] == [0, 1, 2, 3]
    assert after[2] == before[2] and "test_acc" in after[2]


def test_an_evaluation_record_holding_no_number_is_evaluated_again(dataset, run,
                                                                   monkeypatch):
    """evaluation.json carries no checksum: a figure edited or damaged into something
    that is no number was put in the resumed run's log as it was ("abc")."""
    record = run / "ck" / "evaluation.json"
    saved = json.loads(record.read_text())
    want = saved["evaluation"]["test_acc"]
    saved["evaluation"]["test_acc"] = "abc"
    record.write_text(json.dumps(saved))
    calls = []
    evaluate = trainer.evaluate
    monkeypatch.setattr(trainer, "evaluate", lambda *a, **k: calls.append(1) or evaluate(*a, **k))
    train(config(run, 4), dataset)
    assert len(calls) == 2  # epoch 2's again, and the new last epoch's
    after = last_run(strict_records(run / "m.jsonl"))
    assert after[2]["test_acc"] == want


def test_restore_reads_the_last_epochs_evaluation(dataset, three_epochs):
    """The last checkpoint precedes its epoch's evaluation; `restore` completes the
    epoch's record from evaluation.json, so its summary has the figures."""
    result = restore(str(three_epochs / "ck"), config(three_epochs, 3), dataset)
    want = last_run(strict_records(three_epochs / "m.jsonl"))[2]
    assert result.summary["epoch"] == 2
    for key in ("train_acc", "val_acc", "test_acc"):
        assert result.summary[key] == want[key]
