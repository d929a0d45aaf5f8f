"""One run at a time per checkpoint folder and metrics file.

A run holds an exclusive `flock` on `<checkpoint_dir>/.zerognn.lock` (and, for a metrics
file, on `.<name>.lock` beside it) from before it reads its data until it returns. The
lock file records the holder's pid and host, which a second run names when it is
refused (`OutputsInUse`). The kernel drops a `flock` when its holder dies, so the file
of a killed run is a stale lock: the next run takes it over. On a file system without
`flock` the recorded pid decides: a pid of this host that is gone is stale.

Holding the checkpoint folder also makes what a killed save left there safe to remove:
orbax's temporary folders (`*.orbax-checkpoint-tmp*`) are deleted when the lock is taken.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import shutil
import socket
from collections.abc import Iterator
from pathlib import Path

from zerognn_jax._src.data.writes import writing

LOCK_NAME = ".zerognn.lock"
BEST = "best"  # the sub-folder of the best-validation checkpoint
EVALUATION = "evaluation.json"  # the last evaluated epoch's evaluation
ORBAX_TMP = "*.orbax-checkpoint-tmp*"
_NO_FLOCK = (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL)


class OutputsInUse(ValueError):
    """Another run, alive, holds the checkpoint folder or the metrics file."""


def _holder(fd: int) -> dict:
    """The {"pid", "host"} recorded in an open lock file ({} if unreadable)."""
    try:
        record = json.loads(os.pread(fd, 4096, 0) or b"{}")
    except (OSError, ValueError):
        return {}
    return record if isinstance(record, dict) else {}


def _alive_here(holder: dict) -> bool:
    """Whether `holder` may still run: its pid exists on this host, or it is elsewhere."""
    if holder.get("host") != socket.gethostname() or not isinstance(holder.get("pid"), int):
        return bool(holder)
    try:
        os.kill(holder["pid"], 0)  # signal 0: no signal, only the check that it exists
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # it exists, as another user's process
    return True


def live_holder(directory) -> dict | None:
    """The {"pid", "host"} of the run that holds the checkpoint folder `directory`, as
    its lock file records it, where that run may still be running (`_alive_here`); None
    where no run holds it. Read only, never locked: a reader must not stand in the way
    of a run that starts."""
    try:
        with open(Path(directory) / LOCK_NAME, "rb") as f:
            holder = _holder(f.fileno())
    except OSError:
        return None
    return holder if holder and _alive_here(holder) else None


class _Lock:
    """An exclusive lock on the file `path`, naming `what` when refused. `release` is
    registered before `acquire` runs, so that an interrupt at any point of taking the
    lock leaves it free (a descriptor lost with the flock on it held the folder until
    the process ended)."""

    def __init__(self, path: Path, what: str):
        self.path, self.what = path, what
        self._fd: int | None = None
        self._held = False

    def acquire(self) -> None:
        while True:  # the holder may unlink the file between our open and our flock
            try:
                self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o666)
            except FileNotFoundError:  # a refused run removed the empty folder it made
                self.path.parent.mkdir(parents=True, exist_ok=True)
                continue
            except IsADirectoryError:
                raise ValueError(f"{self.what}: its lock file {self.path} is a folder; "
                                 f"remove it (a run keeps its lock there)") from None
            self._flock(self._fd, self.what)
            if os.path.exists(self.path) and \
                    os.path.samestat(os.fstat(self._fd), os.stat(self.path)):
                break
            fd, self._fd = self._fd, None
            os.close(fd)
        self._held = True
        record = json.dumps({"pid": os.getpid(), "host": socket.gethostname()}).encode()
        with writing(f"the lock file of {self.what},", self.path):  # (a full disk)
            os.ftruncate(self._fd, 0)
            os.pwrite(self._fd, record, 0)

    @staticmethod
    def _flock(fd: int, what: str) -> None:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            holder = _holder(fd)
        except OSError as err:
            if err.errno not in _NO_FLOCK:
                raise
            holder = _holder(fd)  # no flock here: a live recorded pid holds it
            if not _alive_here(holder):
                return
        if holder.get("pid") == os.getpid() and holder.get("host") == socket.gethostname():
            raise OutputsInUse(
                f"{what} is in use by another run of this process (pid {os.getpid()}); "
                f"wait for it to end or use another path")
        raise OutputsInUse(
            f"{what} is in use by another run (pid {holder.get('pid', '?')} on host "
            f"{holder.get('host', '?')}); wait for it to end, stop it, or use another path")

    def release(self) -> None:
        """Frees the lock, if `acquire` got as far as opening the file; its file is
        removed only where the lock was taken (a refused run's is the holder's)."""
        fd, self._fd = self._fd, None
        if fd is None:
            return
        try:  # unlink before unlocking: a waiting run then finds a new file
            if self._held:
                os.unlink(self.path)
        except OSError:
            # the folder went away, or turned read-only, during the run: the file stays,
            # unlocked (a later run takes it), and the run's own error, if it is ending
            # on one, is the one raised
            pass
        finally:
            os.close(fd)


def remove_orbax_leftovers(folder: Path) -> None:
    """Deletes the temporary folders of saves that never finished, in `folder` and its
    best-checkpoint sub-folder. Only the holder of the folder's lock may call it."""
    for tmp in [*folder.glob(ORBAX_TMP), *folder.glob(f"*/{ORBAX_TMP}")]:
        shutil.rmtree(tmp, ignore_errors=True)


@contextlib.contextmanager
def hold_outputs(checkpoint_dir: str | None, metrics_out: str | None) -> Iterator[None]:
    """Holds the locks of a run's checkpoint folder and metrics file (either may be None;
    both folders exist: `records.check_output_paths`) for the block, after removing the
    leftovers of killed saves from the checkpoint folder.

    Raises:
      OutputsInUse: another live run holds one of them; the message names the path and
        the holder's pid and host.
    """
    with contextlib.ExitStack() as stack:
        locks = []
        if checkpoint_dir:
            locks.append(_Lock(Path(checkpoint_dir) / LOCK_NAME,
                               f"checkpoint_dir {checkpoint_dir}"))
        if metrics_out:  # the lock of the file itself, however a link names it
            path = Path(metrics_out).resolve()
            locks.append(_Lock(path.with_name(f".{path.name}.lock"), f"metrics_out {metrics_out}"))
        for lock in locks:
            stack.callback(lock.release)
            lock.acquire()
        if checkpoint_dir:
            remove_orbax_leftovers(Path(checkpoint_dir))
        yield


def checkpoint_name(path: str | os.PathLike, checkpoint_dir: str | os.PathLike) -> str | None:
    """The name in `checkpoint_dir` that `path` takes where it is one a run writes or
    replaces there (an epoch's number or its set-aside copy, the best checkpoint's
    folder, the evaluation record, the lock), else None: another output put there
    would be lost to a run that writes the folder."""
    path, folder = Path(path).resolve(), Path(checkpoint_dir).resolve()
    if not path.is_relative_to(folder) or path == folder:
        return None
    first = path.relative_to(folder).parts[0]
    if first.split(".")[0].isdigit() or first in (BEST, EVALUATION, LOCK_NAME):
        return first
    return None
