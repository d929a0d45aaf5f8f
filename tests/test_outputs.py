"""What a run writes, under faults (issue 34): one run at a time per checkpoint folder and
metrics file, leftovers of killed saves removed, write errors in one line with nothing
half-written left behind, files made with the umask's permissions."""

from __future__ import annotations

import errno
import fcntl
import json
import signal
import socket
import subprocess
import sys

import pytest

from zerognn_jax._src.training import lock as lock_module
from zerognn_jax._src.training.lock import LOCK_NAME, OutputsInUse, hold_outputs
from zerognn_jax.cli import main

HOLDER = """
import sys
from zerognn_jax._src.training.lock import hold_outputs
with hold_outputs(sys.argv[1], sys.argv[2]):
    print("held", flush=True)
    sys.stdin.read()
"""


def in_use(what: str, pid: int) -> str:
    return (f"zerognn: error: {what} is in use by another run (pid {pid} on host "
            f"{socket.gethostname()}); wait for it to end, stop it, or use another path\n")


def test_a_second_run_is_refused_until_the_first_is_killed(tmp_path, capsys):
    """A live holder (another process) refuses a run on its checkpoint folder or on its
    metrics file, naming its pid and host; once it is killed with SIGKILL its lock file
    stays behind, stale, and the next run takes it over."""
    ckpt, metrics = tmp_path / "ck", tmp_path / "m.jsonl"
    ckpt.mkdir()
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(ckpt), str(metrics)],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline() == "held\n"
        assert main(["train", "--no-progress", "--checkpoint-dir", str(ckpt)]) == 2
        assert capsys.readouterr().err == in_use(f"checkpoint_dir {ckpt}", holder.pid)
        assert main(["train", "--no-progress", "--metrics-out", str(metrics)]) == 2
        assert capsys.readouterr().err == in_use(f"metrics_out {metrics}", holder.pid)
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    stale = json.loads((ckpt / LOCK_NAME).read_text())
    assert stale == {"pid": holder.pid, "host": socket.gethostname()}
    with hold_outputs(str(ckpt), str(metrics)):
        assert json.loads((ckpt / LOCK_NAME).read_text())["pid"] != holder.pid
    assert not (ckpt / LOCK_NAME).exists() and not list(tmp_path.glob(".m.jsonl.lock"))


def test_one_process_cannot_hold_a_folder_twice(tmp_path):
    with hold_outputs(str(tmp_path), None), pytest.raises(OutputsInUse, match="pid"):
        with hold_outputs(str(tmp_path), None):
            pass
    with hold_outputs(str(tmp_path), None):  # released: free again
        pass


def test_without_flock_a_dead_pid_of_this_host_is_stale(tmp_path, monkeypatch):
    def no_flock(fd, op):
        raise OSError(errno.ENOLCK, "No locks available")

    monkeypatch.setattr(fcntl, "flock", no_flock)
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)
    record = {"pid": int(gone.stdout), "host": socket.gethostname()}
    (tmp_path / LOCK_NAME).write_text(json.dumps(record))
    with hold_outputs(str(tmp_path), None), \
            pytest.raises(OutputsInUse, match=rf"pid {lock_module.os.getpid()} on host"):
        with hold_outputs(str(tmp_path), None):
            pass


def test_leftovers_of_killed_saves_are_removed_when_the_folder_is_taken(tmp_path):
    kept = [tmp_path / "3", tmp_path / "best" / "2", tmp_path / "notes.orbax"]
    leftovers = [tmp_path / "4.orbax-checkpoint-tmp-1763", tmp_path / "best" /
                 "5.orbax-checkpoint-tmp-1764"]
    for folder in kept + leftovers:
        (folder / "state").mkdir(parents=True)
    with hold_outputs(str(tmp_path), None):
        assert all(f.is_dir() for f in kept) and not any(f.exists() for f in leftovers)
