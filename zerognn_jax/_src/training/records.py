"""What a run writes besides checkpoints: strict JSON records and the metrics log.

Records are strict JSON (RFC 8259): a value that is undefined, such as the accuracy of an
empty split or the loss of a diverged step, is written as `null`, never as `NaN`.

The metrics log (`metrics_out`) holds one record per line: per-epoch records, then a
summary (`"summary": true`) when a run finishes. The records after the last summary
belong to the run in progress. A run resumed from a checkpoint replaces them by the
history stored in that checkpoint, so every epoch appears once, whatever happened
between the checkpoint and the interruption; a line cut short by a kill is dropped.

`tensorboard_dir` adds TensorBoard event files: each epoch record's numbers as scalars
at step = epoch, written through tensorboardX (the optional `tensorboard` extra).
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import stat
import tempfile
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from zerognn_jax._src.data.writes import AppendFile, atomic_write, not_json_lines, writing
from zerognn_jax._src.training.lock import checkpoint_name


def strict(value):
    """`value` with NumPy scalars and arrays (JAX's too: a task's `evaluate` may give
    `jnp.mean(...)`) made Python numbers and lists, and non-finite floats made None."""
    if isinstance(value, dict):
        return {k: strict(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [strict(v) for v in value]
    if hasattr(value, "__array__") and not isinstance(value, np.generic):
        return strict(np.asarray(value).tolist())
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def dumps(record: dict) -> str:
    """One line of strict JSON."""
    return json.dumps(strict(record), allow_nan=False)


def check_output_paths(metrics_out: str | None, checkpoint_dir: str | None) -> list[Path]:
    """Raises ValueError naming the path and the problem if the run could not write its
    metrics file or its checkpoints. Creates missing folders, which it returns (for
    `remove_if_empty`; on failure it removes them itself); writes nothing else."""
    if metrics_out and Path(metrics_out).is_dir():
        raise ValueError(f"metrics_out {metrics_out} is a directory; give a file path")
    if metrics_out and checkpoint_dir and \
            os.path.abspath(metrics_out) == os.path.abspath(checkpoint_dir):
        raise ValueError(f"metrics_out {metrics_out} is the folder checkpoint_dir names; "
                         f"give a file path")
    if metrics_out and checkpoint_dir and \
            (taken := checkpoint_name(metrics_out, checkpoint_dir)) is not None:
        raise ValueError(f"metrics_out {metrics_out} takes a name the run writes in "
                         f"checkpoint_dir ({taken}: its checkpoints would replace or remove "
                         f"the file); give another name")
    created = []
    try:
        if checkpoint_dir:
            _check_checkpoint_folder(Path(checkpoint_dir))
            created += _check_folder("checkpoint_dir", Path(checkpoint_dir))
        if metrics_out:
            path = Path(metrics_out)
            created += _check_folder("the folder of metrics_out", path.parent)
            if path.exists() and not path.is_file():
                raise ValueError(f"metrics_out {metrics_out} is {_file_kind(path)}, not a "
                                 f"regular file: a run reads its records back and rewrites "
                                 f"the file when it resumes; give a file path")
            if path.exists():
                try:
                    open(path, "a").close()  # appending nothing changes nothing
                except OSError as err:
                    raise ValueError(f"metrics_out {metrics_out} is not writable: "
                                     f"{err.strerror}") from None
                _refuse_foreign_metrics(path)
    except BaseException:
        remove_if_empty(created)
        raise
    return created


def _file_kind(path: Path) -> str:
    """What `path` (which exists, and is neither a regular file nor a folder) names.
    (Read back, a terminal or a pipe blocked the run, /dev/zero filled memory; rewritten,
    /dev/null became a regular file.)"""
    mode = path.stat().st_mode
    for test, kind in ((stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
                       (stat.S_ISFIFO, "a pipe"), (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return kind
    return "no regular file"


def _refuse_foreign_metrics(path: Path) -> None:
    """ValueError if the file at `path` holds a line that is not a JSON object, as every
    record of a metrics file is (a cut-off last line excepted if it begins like one): a
    run rewrites the file when it starts, and would lose such lines. A file that does not
    begin as records do is refused before it is read through."""
    first = not_json_lines(path)
    if first is not None:
        raise ValueError(f"metrics_out {path} holds lines that are not a run's records "
                         f"(it begins {first!r}); give another file, or remove this one")
    text = path.read_text(errors="surrogateescape")
    complete, tail = text[: text.rfind("\n") + 1], text[text.rfind("\n") + 1:]
    for number, line in enumerate(complete.split("\n")[:-1], 1):
        try:
            record = json.loads(line)
        except ValueError:
            record = None
        if not isinstance(record, dict):
            raise ValueError(f"metrics_out {path} holds lines that are not a run's records "
                             f"(line {number}: {line[:40]!r}); give another file, or "
                             "remove this one")
    if tail and not tail.lstrip().startswith("{"):
        raise ValueError(f"metrics_out {path} ends in a line that is not a run's record "
                         f"({tail[:40]!r}); give another file, or remove this one")


def remove_if_empty(folders: list[Path]) -> None:
    """Removes each of `folders` that holds nothing (the folders a run created for its
    outputs, when it fails before writing there), a folder emptied by removing another
    included, in whatever order they come."""
    left = list(folders)
    while left:
        kept = []
        for folder in left:
            try:
                folder.rmdir()
            except FileNotFoundError:
                pass
            except OSError:  # not empty (yet: another of `left` may be inside it)
                kept.append(folder)
        if len(kept) == len(left):
            return
        left = kept


def _make_folders(path: Path) -> list[Path]:
    """Creates `path` and any missing parents, one level at a time from the top, and
    returns the levels this call created: a level that exists (or that another process
    makes meanwhile) is not counted, however the path is spelled ("a/../b")."""
    made = []
    try:
        for level in [*reversed(path.parents), path]:
            try:
                os.mkdir(level)
                made.append(level)
            except FileExistsError:
                pass
    except BaseException:
        remove_if_empty(made)
        raise
    return made


# What a checkpoint writes into an epoch's folder: the run's items and orbax's records.
CHECKPOINT_TRACES = ("meta", "state", "_CHECKPOINT_METADATA", "commit_success.txt")


def holds_checkpoint(path: Path) -> bool:
    """Whether `path` is (or was: damaged) one epoch's checkpoint folder: it holds one of
    the entries a checkpoint writes (`CHECKPOINT_TRACES`)."""
    return path.is_dir() and any((path / name).exists() for name in CHECKPOINT_TRACES)


def epoch_folder_of(path: Path) -> tuple[Path, bool] | None:
    """(the run's checkpoint folder, whether `path` is its best checkpoint's) where
    `path` is one epoch's checkpoint folder of a run (`<run>/<n>` or `<run>/best/<n>`);
    None otherwise."""
    if not (path.name.isdigit() and holds_checkpoint(path)):
        return None
    best = path.parent.name == "best"
    return (path.parent.parent if best else path.parent), best


def runs_inside(path: Path) -> list[Path]:
    """The folders directly inside `path` that are runs' checkpoint folders (holding an
    epoch's checkpoint), where `path` holds none of its own; [] otherwise."""
    if not path.is_dir():
        return []
    subs = [entry for entry in _entries(path) if entry.is_dir()]
    if any(sub.name.isdigit() and holds_checkpoint(sub) for sub in subs):
        return []
    return [sub for sub in subs if sub.name != "best" and any(
        entry.name.isdigit() and holds_checkpoint(entry) for entry in _entries(sub))]


def _entries(folder: Path) -> list[Path]:
    """`folder`'s entries, sorted; none where it cannot be read (a volume's lost+found
    is no run)."""
    try:
        return sorted(folder.iterdir())
    except OSError:
        return []


def _check_checkpoint_folder(path: Path) -> None:
    """ValueError for a checkpoint folder that is one epoch's checkpoint of another
    run's folder (a run there would write its epochs inside that checkpoint), or that
    holds a folder named by a number with files of its own and no trace of a checkpoint
    (read as an epoch's, it was set aside as damaged). An empty numbered folder is left
    to the checkpoints' own recovery (set aside as `<n>.corrupt`)."""
    if (found := epoch_folder_of(path)) is not None:
        run = found[0]
        raise ValueError(f"checkpoint_dir {path} is epoch {path.name}'s checkpoint of the "
                         f"run folder {run}: give {run} to resume that run, or another "
                         f"folder for a new one")
    if nested := runs_inside(path):
        raise ValueError(f"checkpoint_dir {path} holds another run's checkpoint folder, "
                         f"{nested[0]}, and no checkpoint of its own: give {nested[0]} to "
                         f"resume that run, or another folder for a new one")
    if not path.is_dir():
        return
    for entry in sorted(path.iterdir()):
        if (entry.name.isdigit() and entry.is_dir() and not holds_checkpoint(entry)
                and any(entry.iterdir())):
            raise ValueError(f"checkpoint_dir {path} holds the folder {entry.name}, which is "
                             f"no checkpoint (nothing a checkpoint writes is in it), where "
                             f"the run keeps its epochs' checkpoints by number: move it out "
                             f"of checkpoint_dir, or give another folder")


def _check_folder(what: str, path: Path) -> list[Path]:
    """Creates `path` if needed and proves it writable by creating and removing a file;
    returns the folders it created."""
    if path.exists() and not path.is_dir():
        raise ValueError(f"{what} {path} is not a directory")
    made = []
    try:
        made = _make_folders(path)
        fd, probe = tempfile.mkstemp(dir=path, prefix=".zerognn-probe-")
        os.close(fd)
        os.unlink(probe)
    except OSError as err:
        remove_if_empty(made)
        raise ValueError(f"{what} {path} is not writable: {err.strerror}") from None
    return made


class MetricsLog:
    """Appends strict JSON lines to a file (or nowhere when `path` is None)."""

    def __init__(self, path: str | None, history: Sequence[dict] = ()):
        """A log appending to `path`. Before its first record, it drops a cut-off last
        line and makes the records after the file's last summary those of `history` (a
        resumed run's; none for a fresh run: a run that failed or diverged left them).
        A run that writes no record leaves the file as it was."""
        self._path, self._history, self._file = path, tuple(history), None

    def write(self, record: dict) -> None:
        """Appends `record` as one line; a line that cannot be written whole is taken
        back and raises WriteError (an OSError) naming the file."""
        if self._path is None:
            return
        if self._file is None:
            lines = _complete_lines(Path(self._path))
            last_summary = max((i for i, line in enumerate(lines) if _is_summary(line)),
                               default=-1)
            lines = lines[: last_summary + 1] + [dumps(r) + "\n" for r in self._history]
            with writing("metrics_out", self._path):
                _replace(Path(self._path), "".join(lines))
            self._file = AppendFile(self._path, "metrics_out")
        self._file.write(dumps(record) + "\n")

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None


def _complete_lines(path: Path) -> list[str]:
    if not path.exists():
        return []
    text = path.read_text(errors="surrogateescape")
    complete = text[: text.rfind("\n") + 1]  # what follows the last newline was cut off
    return [line + "\n" for line in complete.split("\n")[:-1]]


def _is_summary(line: str) -> bool:
    try:
        record = json.loads(line)
    except ValueError:
        return False
    return isinstance(record, dict) and record.get("summary") is True


def _replace(path: Path, text: str) -> None:
    """Writes `text` to `path` (`atomic_write`), the file a link points to, keeping its
    permissions; a file that holds `text` already is left as it is."""
    path = path.resolve()
    if path.exists() and path.read_text(errors="surrogateescape") == text:
        return
    with atomic_write(path, "metrics_out", keep_mode=True) as f:
        f.write(text.encode(errors="surrogateescape"))


TENSORBOARD_HINT = "pip install 'zerognn-jax[tensorboard]' (or pip install tensorboardX)"


def check_tensorboard(logdir: str | None) -> list[Path]:
    """Raises ImportError (with the install command) if `logdir` is set and tensorboardX
    is missing, and ValueError if `logdir` cannot be written. Returns the folders it
    created (`check_output_paths`)."""
    if not logdir:
        return []
    try:
        import tensorboardX  # noqa: F401
    except ImportError as err:
        raise ImportError(f"tensorboard_dir needs tensorboardX: {TENSORBOARD_HINT}") from err
    return _check_folder("tensorboard_dir", Path(logdir))


class TensorBoardLog:
    """Writes each record's finite numbers (bools and None left out) as scalars at step
    `record["epoch"]`; nothing when `logdir` is None."""

    def __init__(self, logdir: str | None):
        self._writer, self._logdir = None, logdir
        if logdir:
            check_tensorboard(logdir)
            from tensorboardX import SummaryWriter

            with writing("tensorboard_dir", logdir):
                self._writer = SummaryWriter(logdir)

    def write(self, record: dict) -> None:
        """Writes `record`'s scalars and flushes them. Raises WriteError (an OSError)
        naming the folder where the events file cannot be written (a full disk); the log
        then writes nothing more."""
        if self._writer is None:
            return
        step = int(record["epoch"])
        try:
            with writing("tensorboard_dir", self._logdir):
                for name, value in strict(record).items():
                    if name != "epoch" and isinstance(value, (int, float)) \
                            and not isinstance(value, bool):
                        self._writer.add_scalar(name, value, step)
                self._writer.flush()
        except OSError:
            self._abandon()
            raise

    def _abandon(self) -> None:
        """Drops a writer whose events file cannot be written. tensorboardX closes each
        file writer at exit, which would fail again (a traceback after the run's one
        line): its event writers are marked closed (its own flag, which makes `close` a
        no-op) and their threads stopped."""
        for file_writer in (self._writer.all_writers or {}).values():
            events = getattr(file_writer, "event_writer", None)
            if events is None or getattr(events, "_closed", True):
                continue
            events._closed = True
            with contextlib.suppress(Exception):
                events._worker.stop()
        self._writer = None

    def close(self) -> None:
        if self._writer is not None:
            try:
                with writing("tensorboard_dir", self._logdir):
                    self._writer.close()
            except OSError:
                self._abandon()
                raise
            self._writer = None
