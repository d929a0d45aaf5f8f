"""What a run writes, under faults (issue 34): one run at a time per checkpoint folder and
metrics file, leftovers of killed saves removed, write errors in one line with nothing
half-written left behind, files made with the umask's permissions."""

from __future__ import annotations

import errno
import fcntl
import json
import logging
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import pytest

import zerognn_jax as zg
from zerognn_jax._src.data import graph_storage as storage_graphs
from zerognn_jax._src.data import storage
from zerognn_jax._src.data.molecules import molhiv_like
from zerognn_jax._src.data.synthetic import products_like
from zerognn_jax._src.data.writes import WriteError
from zerognn_jax._src.training import lock as lock_module
from zerognn_jax._src.training.lock import LOCK_NAME, OutputsInUse, hold_outputs
from zerognn_jax._src.training.records import MetricsLog
from zerognn_jax.cli import data as cli_data
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
        assert capsys.readouterr().err == in_use(f"--checkpoint-dir {ckpt}", holder.pid)
        assert main(["train", "--no-progress", "--metrics-out", str(metrics)]) == 2
        assert capsys.readouterr().err == in_use(f"--metrics-out {metrics}", holder.pid)
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    stale = json.loads((ckpt / LOCK_NAME).read_text())
    assert stale == {"pid": holder.pid, "host": socket.gethostname()}
    with hold_outputs(str(ckpt), str(metrics)):
        assert json.loads((ckpt / LOCK_NAME).read_text())["pid"] != holder.pid
    assert not (ckpt / LOCK_NAME).exists() and not list(tmp_path.glob(".m.jsonl.lock"))


def test_one_process_cannot_hold_a_folder_twice(tmp_path):
    held = rf"another run of this process \(pid {os.getpid()}\)"
    with hold_outputs(str(tmp_path), None), pytest.raises(OutputsInUse, match=held):
        with hold_outputs(str(tmp_path), None):
            pass
    with hold_outputs(str(tmp_path), None):  # released: free again
        pass


def test_a_lock_file_that_cannot_be_removed_leaves_the_runs_own_error(tmp_path,
                                                                      monkeypatch):
    """A folder turned read-only during a run: the checkpoint's write failed, then the
    lock's removal did, and its EPERM replaced the error that named the checkpoint."""
    real_unlink = os.unlink

    def refused(path, *args, **kwargs):
        if str(path).endswith(LOCK_NAME):
            raise PermissionError(1, "Operation not permitted", str(path))
        return real_unlink(path, *args, **kwargs)

    monkeypatch.setattr(os, "unlink", refused)
    with pytest.raises(OSError, match="could not write the checkpoint"):
        with hold_outputs(str(tmp_path), None):
            raise OSError("could not write the checkpoint of epoch 5")
    monkeypatch.setattr(os, "unlink", real_unlink)
    assert (tmp_path / LOCK_NAME).exists()  # left, unlocked: the next run takes it
    with hold_outputs(str(tmp_path), None):
        pass
    assert not (tmp_path / LOCK_NAME).exists()


def test_a_lock_file_that_cannot_be_written_is_named(tmp_path, monkeypatch):
    """A full disk passes the check that a folder is writable (an empty file) and fails
    first at the lock's pid record: the error named no path. The lock stays free."""
    def full(fd, data, offset):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    with monkeypatch.context() as patch:
        patch.setattr(lock_module.os, "pwrite", full)
        with pytest.raises(OSError, match=rf"^could not write the lock file of checkpoint_dir "
                                          rf"{tmp_path}, {tmp_path / LOCK_NAME}: No space "
                                          rf"left on device \(ENOSPC, errno 28\)$"), \
                hold_outputs(str(tmp_path), None):
            pass
    with hold_outputs(str(tmp_path), None):
        pass


def test_an_interrupt_while_the_lock_is_taken_leaves_it_free(tmp_path, monkeypatch):
    """A notebook's interrupt landing after the flock and before the holder kept its
    descriptor left the folder locked until the process ended."""
    def interrupted(fd, data, offset):
        raise KeyboardInterrupt

    with monkeypatch.context() as patch:
        patch.setattr(lock_module.os, "pwrite", interrupted)
        with pytest.raises(KeyboardInterrupt), hold_outputs(str(tmp_path), None):
            pass
    with hold_outputs(str(tmp_path), None):  # not held by the lost call
        pass
    taken = lock_module._Lock.acquire

    def interrupted_as_it_returns(lock):
        taken(lock)
        raise KeyboardInterrupt

    with monkeypatch.context() as patch:
        patch.setattr(lock_module._Lock, "acquire", interrupted_as_it_returns)
        with pytest.raises(KeyboardInterrupt), hold_outputs(str(tmp_path), None):
            pass
    with hold_outputs(str(tmp_path), None):
        pass


def test_a_metrics_file_is_held_however_a_link_names_it(tmp_path):
    """A link and its target took two locks: two runs wrote one file, and the second's
    rewrite left the first appending to a file no name reached (its records lost)."""
    (tmp_path / "runs").mkdir()
    (tmp_path / "runs" / "link.jsonl").symlink_to(tmp_path / "m.jsonl")
    with hold_outputs(None, str(tmp_path / "m.jsonl")), pytest.raises(OutputsInUse):
        with hold_outputs(None, str(tmp_path / "runs" / "link.jsonl")):
            pass


def test_a_lock_file_that_is_a_folder_is_named(tmp_path):
    (tmp_path / LOCK_NAME).mkdir()
    with pytest.raises(ValueError, match=rf"^checkpoint_dir {tmp_path}: its lock file "
                                         rf"{tmp_path / LOCK_NAME} is a folder; remove it"):
        with hold_outputs(str(tmp_path), None):
            pass


def test_a_tensorboard_folder_that_fills_up_is_a_write_error(tmp_path, monkeypatch):
    """It was a bare OSError, and tensorboardX's close at exit failed again in a
    traceback."""
    pytest.importorskip("tensorboardX")
    import tensorboardX.event_file_writer as events

    from zerognn_jax._src.training.records import TensorBoardLog

    log = TensorBoardLog(str(tmp_path / "tb"))
    writer = log._writer
    monkeypatch.setattr(events.EventsWriter, "flush", lambda self: full_disk())
    with pytest.raises(WriteError, match=rf"^could not write tensorboard_dir "
                                         rf"{tmp_path / 'tb'}: {re.escape(ENOSPC)}$"):
        log.write({"epoch": 0, "loss": 1.0})
    for file_writer in writer.all_writers.values():  # what the exit-time close reads
        assert file_writer.event_writer._closed
    log.write({"epoch": 1, "loss": 1.0})  # writes nothing more
    log.close()


def test_a_lock_file_removed_during_the_run_still_releases(tmp_path):
    with hold_outputs(str(tmp_path), None):
        (tmp_path / ".zerognn.lock").unlink()  # e.g. the folder was cleaned meanwhile
    with hold_outputs(str(tmp_path), None):  # the lock was let go, not left held
        pass


def test_a_folder_removed_before_its_lock_is_taken_is_made_again(tmp_path):
    """A refused run removes the empty folder it made (trainer.train) while another run
    on the same path is between its path check and its lock: that run takes the lock."""
    folder = tmp_path / "ck"  # checked by the second run, then removed by the first
    with hold_outputs(str(folder), None):
        assert (folder / LOCK_NAME).exists()
    assert not (folder / LOCK_NAME).exists()


def test_without_flock_a_dead_pid_of_this_host_is_stale(tmp_path, monkeypatch):
    def no_flock(fd, op):
        raise OSError(errno.ENOLCK, "No locks available")

    monkeypatch.setattr(fcntl, "flock", no_flock)
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)
    record = {"pid": int(gone.stdout), "host": socket.gethostname()}
    (tmp_path / LOCK_NAME).write_text(json.dumps(record))
    with hold_outputs(str(tmp_path), None), \
            pytest.raises(OutputsInUse, match=rf"this process \(pid {lock_module.os.getpid()}\)"):
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


# ------------------------------------------------------- full disks


ENOSPC = "No space left on device (ENOSPC, errno 28)"


def full_disk(*args, **kwargs):
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


def test_data_generate_on_a_full_disk_is_one_line_and_leaves_no_file(tmp_path, monkeypatch,
                                                                    capsys):
    out = tmp_path / "r.npz"

    def savez(file, **arrays):  # part of the file gets written, then the disk is full
        file.write(b"PK\x03\x04 half a zip")
        full_disk()

    monkeypatch.setattr(storage.np, "savez", savez)
    assert main(["data", "generate", "rmat", "--scale", str(2**-9), "--out", str(out)]) == 1
    assert capsys.readouterr().err == (f"zerognn: error: could not write dataset file {out}: "
                                       f"{ENOSPC}\n")
    assert list(tmp_path.iterdir()) == []
    # nor the folders it made on the way (they stayed, empty)
    deep = tmp_path / "a" / "b" / "r.npz"
    assert main(["data", "generate", "rmat", "--scale", str(2**-9), "--out", str(deep)]) == 1
    assert list(tmp_path.iterdir()) == []


def test_save_dir_on_a_full_disk_names_the_folder_and_leaves_nothing(tmp_path, monkeypatch):
    dataset = products_like(0.0005, seed=0)
    put = storage.DatasetWriter.put

    def put_then_full(self, key, values):
        put(self, key, values)
        if key == "features":
            full_disk()

    monkeypatch.setattr(storage.DatasetWriter, "put", put_then_full)
    with pytest.raises(WriteError, match=rf"^could not write dataset directory "
                                         rf"{tmp_path / 'd'}: {re.escape(ENOSPC)}$"):
        storage.save_dir(dataset, tmp_path / "d")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(("make", "save", "load", "what", "table"), [
    (lambda: products_like(0.0005, seed=0), storage.save_dir, storage.load_dir,
     "dataset directory", "features"),
    # np.save's partial write on a full disk was "OSError: 11160 requested and 4064
    # written", no errno: a collection's arrays are allocated first too
    (lambda: molhiv_like(0.002, seed=0), storage_graphs.save_graphs,
     storage_graphs.load_graphs_file, "graph collection directory", "node_features"),
])
def test_a_mapped_array_allocates_its_blocks_before_it_is_filled(tmp_path, monkeypatch, make,
                                                                 save, load, what, table):
    """Filling a mapping of a file with holes on a full disk died of SIGBUS, printing
    nothing and leaving the staging folder: the blocks are allocated first, and the
    allocation's ENOSPC is the one line. A file system that allocates nothing ahead is
    written as before."""
    data = make()
    monkeypatch.setattr(os, "posix_fallocate", full_disk)
    with pytest.raises(WriteError, match=rf"^could not write {what} "
                                         rf"{tmp_path / 'd'}: {re.escape(ENOSPC)}$"):
        save(data, tmp_path / "d")
    assert list(tmp_path.iterdir()) == []

    def unsupported(*args):
        raise OSError(errno.EOPNOTSUPP, os.strerror(errno.EOPNOTSUPP))

    monkeypatch.setattr(os, "posix_fallocate", unsupported)
    back = load(save(data, tmp_path / "d"))
    np.testing.assert_array_equal(getattr(back, table), getattr(data, table))


def test_a_folder_or_file_not_written_here_is_never_replaced(tmp_path, capsys, monkeypatch):
    """Writing a dataset over a folder of the user's (or a file that is no dataset
    archive, or the current folder) is refused before anything is generated; a dataset
    written here, or an empty folder, is replaced."""
    mine = tmp_path / "mine"
    (mine / "figs").mkdir(parents=True)
    (mine / "thesis.tex").write_text("chapter 1")
    (tmp_path / "keep.npz").write_text("not an archive")
    for name in ("load_graphs", "load_dataset"):  # generating would fail loudly
        monkeypatch.setattr(cli_data, name, None)
    generate = ["data", "generate", "molhiv-like", "--scale", "0.002", "--out"]
    assert main([*generate, str(mine)]) == 2
    err = capsys.readouterr().err
    assert err == (f"zerognn: error: --out {mine} is a folder holding figs, thesis.tex, not "
                   f"a dataset written by zerognn-jax; give a new path or remove it first\n")
    assert main(["data", "generate", "rmat", "--scale", str(2**-9), "--out",
                 str(tmp_path / "keep.npz")]) == 2
    assert "keep.npz is a file, not a dataset archive" in capsys.readouterr().err
    dataset = products_like(0.0005, seed=0)
    with pytest.raises(FileExistsError, match="is a folder holding figs, thesis.tex"):
        storage.save_dir(dataset, mine)
    with pytest.raises(FileExistsError, match="is a file, not a dataset archive"):
        storage.save_npz(dataset, tmp_path / "keep.npz")
    assert sorted(p.name for p in mine.iterdir()) == ["figs", "thesis.tex"]
    assert (tmp_path / "keep.npz").read_text() == "not an archive"
    monkeypatch.chdir(mine)
    assert main([*generate, "."]) == 2
    assert "is the current folder or holds it" in capsys.readouterr().err
    assert sorted(p.name for p in mine.iterdir()) == ["figs", "thesis.tex"]
    # arrays of one's own saved the common ways, with a `meta` of their own
    exp = tmp_path / "exp"
    exp.mkdir()
    (exp / "meta.json").write_text('{"lr": 0.1}')
    np.save(exp / "weights.npy", np.ones(3))
    np.savez(tmp_path / "run.npz", meta=np.str_('{"lr": 0.1}'), results=np.ones(3))
    with pytest.raises(FileExistsError, match="is a folder holding meta.json, weights.npy"):
        storage.save_dir(dataset, exp)
    with pytest.raises(FileExistsError, match="run.npz is a file, not a dataset archive"):
        storage.save_npz(dataset, tmp_path / "run.npz")
    with pytest.raises(FileExistsError, match="exp is a folder; give a file's path"):
        storage.save_npz(dataset, exp)
    # a format_version of one's own is no mark of a dataset (it passed for one)
    np.savez(tmp_path / "versioned.npz", format_version=np.int64(1), precious=np.ones(3))
    (exp / "meta.json").write_text('{"format_version": 1}')
    with pytest.raises(FileExistsError, match="versioned.npz is a file, not a dataset archive"):
        storage.save_npz(dataset, tmp_path / "versioned.npz")
    with pytest.raises(FileExistsError, match="is a folder holding meta.json, weights.npy"):
        storage.save_dir(dataset, exp)
    storage.save_npz(dataset, tmp_path / "run.npz", overwrite=True)  # the caches' way
    with pytest.raises(ValueError, match=r"save_npz writes a \.npz archive, which "
                                         r"load_dataset .+ got '.+/nosuffix'$"):
        storage.save_npz(dataset, tmp_path / "nosuffix")  # load_dataset would refuse it
    assert not (tmp_path / "nosuffix").exists()
    assert storage.load_npz(tmp_path / "run.npz").name == dataset.name
    (tmp_path / "empty").mkdir()
    (tmp_path / ".empty.old").mkdir()  # left by a write killed between its renames
    for out in (tmp_path / "empty", tmp_path / "empty", tmp_path / "d.npz", tmp_path / "d.npz"):
        assert (storage.save_npz if out.suffix else storage.save_dir)(dataset, out) == out
    assert storage.load_dir(tmp_path / "empty").name == dataset.name
    assert not (tmp_path / ".empty.old").exists()


def test_a_metrics_line_cut_by_a_full_disk_is_taken_back(tmp_path, monkeypatch):
    path = tmp_path / "m.jsonl"
    log = MetricsLog(str(path))
    log.write({"epoch": 0})
    mine, write = log._file._file.fileno(), os.write

    def half_then_full(fd, data):
        if fd != mine:
            return write(fd, data)
        write(fd, bytes(data[:7]))
        full_disk()

    monkeypatch.setattr(os, "write", half_then_full)
    with pytest.raises(WriteError, match=rf"^could not write metrics_out {path}: "
                                         rf"{re.escape(ENOSPC)}$"):
        log.write({"epoch": 1})
    monkeypatch.undo()
    log.close()
    assert path.read_text() == '{"epoch": 0}\n'


def test_checkpoint_on_a_full_disk_is_one_line_exit_1(tmp_path, monkeypatch, capfd):
    """Orbax reports tensorstore's failed write as a ValueError carrying the errno, after
    logging it from several threads, while its metadata thread goes on to write into the
    temporary folder and log its own failure; the run ends with one line, and the save's
    temporary folder is removed once that thread is done (it was left, holding the
    thread's file, and the thread's traceback followed the line)."""
    import orbax.checkpoint as ocp

    class Metadata(threading.Thread):  # as orbax's threads are, by their module
        __module__ = "orbax.checkpoint.fake"

        def __init__(self, tmp):
            super().__init__(daemon=True)
            self.tmp = tmp

        def run(self):
            time.sleep(0.3)
            (self.tmp / "state").mkdir(parents=True, exist_ok=True)  # as tensorstore does
            (self.tmp / "state" / "_sharding").write_text("{}")
            logging.getLogger("absl").error("write_metadata_after_commits raised")

    threads = []

    def save(self, step, *args, **kwargs):
        tmp = Path(self.directory) / f"{step}.orbax-checkpoint-tmp"
        (tmp / "state").mkdir(parents=True)
        logging.getLogger("absl").error("_SignalingThread.run() raised an exception")
        threads.append(Metadata(tmp))
        threads[-1].start()
        raise ValueError(f"RESOURCE_EXHAUSTED: Error writing \"params\" in OCDBT database at "
                         f"local file \"{tmp}/state\": No space left on device "
                         f"[os_error_code='28']")

    monkeypatch.setattr(ocp.CheckpointManager, "save", save)
    ckpt = tmp_path / "ck"
    capfd.readouterr()
    # A small model: the save fails after the first epoch whatever was trained.
    assert main(["train", "--no-progress", "--epochs", "1", "--eval-mode", "none",
                 "--hidden", "8", "--layers", "1", "--fanouts", "2", "--batch-size", "512",
                 "--checkpoint-dir", str(ckpt)]) == 1
    threads[0].join()
    assert capfd.readouterr().err == (f"zerognn: error: could not write the checkpoint of "
                                      f"epoch 0 in --checkpoint-dir {ckpt}: {ENOSPC}\n")
    assert not ckpt.exists()  # nothing written: the folder made for the run goes too


def test_a_failure_after_the_checkpoint_is_written_is_not_called_a_write_failure(
        tmp_path, monkeypatch):
    """orbax's save also removes checkpoints past the ones kept; a removal that failed
    (a folder made read-only) was reported as the new checkpoint's write failing, though
    it was whole and a rerun resumed from it."""
    import orbax.checkpoint as ocp

    real = ocp.CheckpointManager.save

    def save(self, step, *args, **kwargs):
        real(self, step, *args, **kwargs)
        if step == 2:
            raise PermissionError(errno.EPERM, "Operation not permitted",
                                  str(Path(self.directory) / "0"))
        return True

    monkeypatch.setattr(ocp.CheckpointManager, "save", save)
    ckpt = tmp_path / "ck"
    cfg = zg.TrainConfig(dataset="tiny", hidden=8, layers=1, fanouts=(2,), batch_size=512,
                         epochs=3, eval_mode="none", progress=False, checkpoint_dir=str(ckpt))
    with pytest.raises(OSError) as caught:
        zg.train(cfg)
    assert str(caught.value) == (
        f"could not remove an older checkpoint in checkpoint_dir {ckpt}: Operation not "
        f"permitted (EPERM, errno 1); the checkpoint of epoch 2 was written, and a rerun "
        f"resumes from it")
    assert caught.value.errno == errno.EPERM
    monkeypatch.setattr(ocp.CheckpointManager, "save", real)
    assert zg.train(cfg).summary["start_epoch"] == 3


# ------------------------------------------------------- permissions


@pytest.fixture(params=[0o022, 0o077, 0o002])
def mask(request):
    old = os.umask(request.param)
    yield request.param
    os.umask(old)


def mode(path: Path) -> int:
    return path.stat().st_mode & 0o777


def test_datasets_are_written_with_the_umasks_permissions(tmp_path, mask, capsys):
    """As `open` and `mkdir` do: 0644 files and 0755 folders under umask 022, readable by
    the rest of a team (they were 0600 and 0700 whatever the umask)."""
    out = tmp_path / "r.npz"
    assert main(["data", "generate", "rmat", "--scale", str(2**-9), "--out", str(out)]) == 0
    assert mode(out) == 0o666 & ~mask
    folder = storage.save_dir(products_like(0.0005, seed=0), tmp_path / "d")
    assert mode(folder) == 0o777 & ~mask
    assert {mode(f) for f in folder.iterdir()} == {0o666 & ~mask}


def test_an_output_path_that_cannot_be_written_is_one_line_before_any_work(tmp_path,
                                                                           capsys):
    """A file where a folder should be, or a folder that does not exist: the bench
    refuses its --out before measuring (exit 2; it was exit 1 at the first write)."""
    (tmp_path / "file").write_text("x")
    out = tmp_path / "file" / "bench.jsonl"
    assert main(["bench", "--out", str(out), "--no-progress"]) == 2
    assert capsys.readouterr().err == (f"zerognn: error: --out {out}: {tmp_path / 'file'} is "
                                       f"a file, not a folder\n")
    gone = tmp_path / "gone" / "bench.jsonl"
    assert main(["bench", "--out", str(gone), "--no-progress"]) == 2
    assert capsys.readouterr().err == (f"zerognn: error: --out {gone}: its folder "
                                       f"{gone.parent} does not exist\n")
    # a dataset's folder on the way that is a file: refused before the data are made (it
    # was refused by the write, after generating, with exit 1), as is --out for a file
    graphs = tmp_path / "file" / "g.npz"
    assert main(["data", "generate", "molhiv-like", "--scale", "0.001", "--out",
                 str(graphs)]) == 2
    assert capsys.readouterr().err == (f"zerognn: error: --out {graphs}: {tmp_path / 'file'} "
                                       f"is a file, not a folder\n")
    with pytest.raises(FileExistsError, match=f"{tmp_path / 'file'} is a file, not a folder"):
        storage_graphs.save_graphs(molhiv_like(0.001), graphs)


def test_a_record_appended_to_a_file_whose_last_line_has_no_newline_starts_its_own():
    """`bench --out` (and metrics_out) onto a JSON-lines file without its last newline
    glued the first record onto that line, and the file no longer read back."""
    from zerognn_jax._src.data.writes import AppendFile

    for before, want in (('{"a": 1}', '{"a": 1}\n{"b": 2}\n{"c": 3}\n'),
                         ('{"a": 1}\n', '{"a": 1}\n{"b": 2}\n{"c": 3}\n'),
                         ("", '{"b": 2}\n{"c": 3}\n')):
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "m.jsonl"
            path.write_text(before)
            with AppendFile(path, "bench output") as out:
                out.write('{"b": 2}\n')
                out.write('{"c": 3}\n')
            assert path.read_text() == want


def test_a_metrics_path_that_is_no_regular_file_is_refused(tmp_path):
    """A pipe blocked the run's read-back (and a resume renamed a file over a device such
    as /dev/null); each is refused before anything is opened."""
    from zerognn_jax._src.training.records import check_output_paths

    fifo = tmp_path / "m.fifo"
    os.mkfifo(fifo)
    for path, kind in ((fifo, "a pipe"), (Path(os.devnull), "a character device")):
        with pytest.raises(ValueError, match=rf"^metrics_out {path} is {kind}, not a regular "
                                             rf"file: a run reads its records back"):
            check_output_paths(str(path), None)
    assert fifo.exists() and Path(os.devnull).is_char_device()


@pytest.mark.parametrize("name", ["2", "3.corrupt", "best", "evaluation.json",
                                  ".zerognn.lock"])
def test_a_metrics_file_named_as_a_checkpoint_folders_own_is_refused(tmp_path, capsys, name):
    """`--metrics-out CK/2` was taken, and removed by the save of epoch 2 (the records
    after it went to a deleted file); CK/evaluation.json was overwritten, the lock's name
    unlinked at the end. Refused before the run, as `zerognn export --out` is."""
    from zerognn_jax.cli import main

    ck = tmp_path / "ck"
    argv = ["train", "--epochs", "1", "--no-progress", "--checkpoint-dir", str(ck),
            "--metrics-out", str(ck / name)]
    assert main(argv) == 2
    assert capsys.readouterr().err == (
        f"zerognn: error: --metrics-out {ck / name} takes a name the run writes in "
        f"--checkpoint-dir ({name}: its checkpoints would replace or remove the file); give "
        f"another name\n")
    assert not ck.exists()


def test_a_run_inside_a_checkpoint_folder_is_found_past_unreadable_folders(tmp_path,
                                                                          monkeypatch):
    """An unreadable folder (a volume's lost+found) is no run, and raised PermissionError
    from train's check; a run's best/ alone is not taken for a nested run."""
    from zerognn_jax._src.training.records import runs_inside

    (tmp_path / "lost+found").mkdir()
    (tmp_path / "kept" / "best" / "3" / "meta").mkdir(parents=True)
    real = Path.iterdir

    def iterdir(self):
        if self.name == "lost+found":
            raise PermissionError(errno.EACCES, "Permission denied")
        return real(self)

    monkeypatch.setattr(Path, "iterdir", iterdir)
    assert runs_inside(tmp_path) == [] and runs_inside(tmp_path / "kept") == []
    (tmp_path / "other" / "0" / "state").mkdir(parents=True)
    assert runs_inside(tmp_path) == [tmp_path / "other"]
    (tmp_path / "2" / "meta").mkdir(parents=True)  # its own checkpoint: a run resumed there
    assert runs_inside(tmp_path) == []


def test_a_metrics_file_of_other_lines_is_refused_and_left_as_it_was(tmp_path, capsys):
    """A run rewrites its metrics file when it starts: one holding lines that are no
    run's records is refused, untouched; a link to a file of records stays a link, and
    that file keeps its permissions."""
    from zerognn_jax._src.training.records import check_output_paths

    notes = tmp_path / "notes.txt"
    for text, shown in (("precious line 1\n{\"epoch\": 99}\n", "it begins 'precious line 1'"),
                        ('{"epoch": 0}\nno newline at the end', "ends in a line")):
        notes.write_text(text)
        assert main(["train", "--dataset", "tiny", "--epochs", "1", "--metrics-out",
                     str(notes), "--no-progress"]) == 2
        err = capsys.readouterr().err
        assert err.startswith("zerognn: error:") and shown in err, err
        assert notes.read_text() == text
    records = tmp_path / "runs" / "m.jsonl"
    records.parent.mkdir()
    records.write_text('{"epoch": 0}\n{"epoch": 1, "summary": true}\n{"epoch": 2')
    records.chmod(0o640)
    link = tmp_path / "m.jsonl"
    link.symlink_to(records)
    check_output_paths(str(link), None)  # a cut-off record is no other line
    MetricsLog(str(link)).close()  # a run that wrote no record leaves the file as it was
    assert records.read_text().endswith('{"epoch": 2')
    log = MetricsLog(str(link))
    log.write({"epoch": 0})
    log.close()
    assert link.is_symlink() and records.read_text().endswith('"summary": true}\n'
                                                              '{"epoch": 0}\n')
    assert records.stat().st_mode & 0o777 == 0o640


def test_a_signal_while_generating_or_exporting_stops_at_a_safe_point(tmp_path, capsys,
                                                                      monkeypatch):
    """SIGINT in the middle of generating a dataset, loading one for `data info`, or
    reading a checkpoint to export, is held until that work is done: exit 130, one line,
    nothing (or only the whole cache) written."""
    import zerognn_jax as zg
    from zerognn_jax.cli import export as cli_export

    def then_signal(module, name):  # `module.name` that sends SIGINT once it has run
        real = getattr(module, name)

        def call(*args, **kwargs):
            result = real(*args, **kwargs)
            os.kill(os.getpid(), signal.SIGINT)
            return result

        monkeypatch.setattr(module, name, call)

    then_signal(cli_data, "load_dataset")
    out = tmp_path / "rmat.npz"
    assert main(["data", "generate", "rmat", "--scale", str(2**-9), "--out", str(out)]) == 130
    assert capsys.readouterr().err == ("zerognn: interrupted by SIGINT after generating "
                                       "rmat; nothing was written\n")
    assert not out.exists()
    # data info too, its cache under --root written before it stops
    assert main(["data", "info", "rmat", "--scale", str(2**-9), "--root",
                 str(tmp_path / "data")]) == 130
    got = capsys.readouterr()
    assert got.err.endswith("zerognn: interrupted by SIGINT after loading rmat\n")
    cached = [p.name for p in (tmp_path / "data").iterdir()]
    assert got.out == "" and len(cached) == 1 and cached[0].startswith("rmat-"), cached

    zg.train(zg.TrainConfig(dataset="tiny", hidden=8, layers=1, fanouts=(3,), epochs=1,
                            eval_mode="none", progress=False,
                            checkpoint_dir=str(tmp_path / "ck")))
    then_signal(cli_export, "restore")
    assert main(["export", str(tmp_path / "ck"), "--out", str(tmp_path / "m.bin")]) == 130
    assert capsys.readouterr().err == ("zerognn: interrupted by SIGINT after reading the "
                                       "checkpoint; nothing was written\n")
    assert not (tmp_path / "m.bin").exists()
