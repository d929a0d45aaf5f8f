"""Writing files: one error naming the path and the errno, and nothing half-written.

Every file the library writes (datasets, metrics, checkpoints, bench records) goes
through `atomic_write` or `writing`, so a full disk, a lost mount or a read-only folder
ends in one `WriteError` (an OSError) instead of an error that names neither the file
nor the cause, and a temporary file is removed rather than left beside the target.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import re
import shutil
import socket
import stat
import sys
import tempfile
import warnings
import zipfile
from collections.abc import Iterator
from pathlib import Path

import numpy as np

# How C++ layers (tensorstore under orbax) report an errno in their messages.
_ERRNO_IN_TEXT = re.compile(r"os_error_code='?(\d+)|\[Errno (\d+)\]")


class WriteError(OSError):
    """A file or folder could not be written. `errno` is the cause's, when known; the
    message names what was written, the path, the cause and the errno."""


def _errno_of(err: BaseException) -> int | None:
    """The errno of `err` or of what caused it (OSError, or one named in the text)."""
    seen = set()
    while err is not None and id(err) not in seen:
        seen.add(id(err))
        if isinstance(err, OSError) and err.errno:
            return err.errno
        match = _ERRNO_IN_TEXT.search(str(err))
        if match:
            return int(match.group(1) or match.group(2))
        err = err.__cause__ or err.__context__
    return None


def write_error(what: str, path: str | os.PathLike, err: BaseException, *,
                failed: str = "write", outcome: str = "") -> WriteError:
    """A WriteError for `err`, raised while writing `what` at `path` (or doing what
    `failed` names to it: "remove"); `outcome`, if given, ends the message (what was
    done all the same)."""
    if isinstance(err, WriteError):
        return err
    code = _errno_of(err)
    if code is None:
        text = str(err).strip().splitlines()
        cause = f"{type(err).__name__}: {text[0][:200] if text else ''}"
    else:
        cause = f"{os.strerror(code)} ({errno.errorcode.get(code, '?')}, errno {code})"
    if code in (errno.EEXIST, errno.ENOTDIR):  # a folder on the way is a file
        blocking = next((p for p in Path(path).parents if p.exists() and not p.is_dir()),
                        None)
        if blocking is not None:
            cause = f"{blocking} is a file, not a folder ({cause})"
    out = WriteError(f"could not {failed} {what} {path}: {cause}"
                     f"{f'; {outcome}' if outcome else ''}")
    out.errno = code
    return out


@contextlib.contextmanager
def writing(what: str, path: str | os.PathLike) -> Iterator[None]:
    """Turns an OSError raised in the block into a `WriteError` naming `what` and
    `path`."""
    try:
        yield
    except OSError as err:
        raise write_error(what, path, err) from None


def print_line(text: str, what: str) -> None:
    """Prints `text` to standard output; a failed write (a closed pipe, a full disk) is a
    WriteError naming `what`, standard output then pointed at the null device so that
    Python's own flush at exit does not fail a second time with a traceback."""
    try:
        with writing(what, "to standard output"):
            print(text, flush=True)
    except WriteError:
        with contextlib.suppress(OSError, ValueError, AttributeError):  # (no descriptor)
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        raise


class CacheWarning(UserWarning):
    """A dataset's cache that could not be written: the data are used without it."""


def read_cache(read, path: Path):
    """`read(path)` of a preset's cache; where it cannot be read (truncated, another
    kind of file), the ValueError says to remove it: the cache is never overwritten
    unasked, as the file may be the user's."""
    try:
        return read(path)
    except (ValueError, FileNotFoundError) as err:  # (a folder without its meta.json)
        raise ValueError(f"{err}; it stands where the preset's cache goes under the "
                         f"data folder: remove it, and the data are generated again") from None


def keep_cache(data, save, path: str | os.PathLike, made: str = "read from their files"):
    """`data`, just read or generated, after `save(data, path, overwrite=True)` wrote
    its cache `path`. A cache that cannot be written (a read-only folder shared by a team,
    a full disk) is warned about (`CacheWarning`), and the data are used without it:
    they are `made` again next time ("read from their files", "generated")."""
    try:
        save(data, path, overwrite=True)
    except OSError as err:
        warnings.warn(f"could not write the cache {path} ({err}); the data are used "
                      f"without it, and {made} again next time", CacheWarning, stacklevel=3)
    return data


def source_files(folder: Path) -> list[Path]:
    """The files an OGB folder's parse reads: those under `raw/` and `split/`."""
    return sorted(p for sub in ("raw", "split") for p in (folder / sub).rglob("*")
                  if p.is_file())


def _record(cache: Path) -> Path:
    return cache.with_name(cache.name + ".sources.json")


def _fingerprint(folder: Path) -> list:
    return [[str(p.relative_to(folder)), p.stat().st_size, p.stat().st_mtime_ns]
            for p in source_files(folder)]


def cache_current(cache: Path, stamp: Path, folder: Path) -> bool:
    """Whether the parsed `cache` of `folder`'s files (`stamp`: its file written last)
    was made from them as they are: its record `<cache>.sources.json` lists each file's
    path, size and time as they are now. A re-extracted archive keeps its files' old
    times, which a comparison of ages took for files unchanged; a cache written before
    records existed is still judged by its age."""
    if not stamp.is_file():
        return False
    try:
        return json.loads(_record(cache).read_text()) == _fingerprint(folder)
    except FileNotFoundError:
        return all(p.stat().st_mtime <= stamp.stat().st_mtime for p in source_files(folder))
    except (OSError, ValueError):
        return False


def read_current_cache(cache: Path, stamp: Path, folder: Path, read):
    """`read(cache)` where the cache was made from `folder`'s files as they are
    (`cache_current`), else None; None too, with a CacheWarning, where it does not read
    (cut short by a copy, written by another version): it is parsed from the files
    again, as a stale one is, rather than refused on every load."""
    if not cache_current(cache, stamp, folder):
        return None
    try:
        return read(cache)
    except (OSError, ValueError, EOFError, zipfile.BadZipFile) as err:
        first = (str(err).strip().splitlines() or [type(err).__name__])[0]
        warnings.warn(f"the parsed cache {cache} does not read ({first[:300]}): the "
                      f"dataset is parsed from its files again", CacheWarning, stacklevel=3)
        return None


def parse_into_cache(cache: Path, stamp: Path, folder: Path, parse):
    """`parse()`, which reads `folder`'s files and writes `cache` (`keep_cache`; `stamp`:
    its file written last), then the cache's record of those files. The old cache,
    judged not current, and its record go first: a parse that fails, or a cache that
    cannot be written anew, leaves none to pass for current."""
    for old in (_record(cache), cache):
        with contextlib.suppress(OSError):
            shutil.rmtree(old) if old.is_dir() else old.unlink()
    seen = _fingerprint(folder)
    data = parse()
    if stamp.is_file():
        with contextlib.suppress(OSError), atomic_write(_record(cache), "a cache record") as f:
            f.write(json.dumps(seen).encode())
    return data


def open_filled(file: Path, dtype, shape) -> np.memmap:
    """A new `.npy` at `file` memory-mapped for writing, its blocks allocated on disk
    first: a mapping of a file with holes meets a full disk as SIGBUS, which killed the
    process without a word, where the allocation raises an OSError (ENOSPC). A file
    system that allocates no blocks ahead (EOPNOTSUPP, EINVAL) is mapped as it is."""
    out = np.lib.format.open_memmap(file, "w+", dtype, tuple(shape))
    try:
        with open(file, "r+b") as f:
            os.posix_fallocate(f.fileno(), 0, os.fstat(f.fileno()).st_size)
    except OSError as err:
        if err.errno not in (errno.EOPNOTSUPP, errno.EINVAL):
            del out  # (the mapping, before the caller's folder goes)
            raise
    return out


def part_prefix(path: Path) -> str:
    """The name start of a temporary file or folder written for `path`: hidden, and
    naming the host and process that write it, so that a later write to `path` knows a
    leftover of a writer that was killed (`remove_stale_parts`)."""
    return f".{path.name}.{socket.gethostname()}-{os.getpid()}."


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # it runs, under another user
        return True
    return True


def remove_stale_parts(path: Path) -> None:
    """Removes the temporary files and folders beside `path` that writers killed before
    they could remove them left (SIGKILL, an out-of-memory kill, a lost machine): those
    of this host whose process no longer runs. Others' are left alone, and so are
    those of unknown writers (names from before the host and process were in them)."""
    head = f".{path.name}.{socket.gethostname()}-"
    try:
        siblings = list(path.parent.iterdir())
    except OSError:
        return
    for entry in siblings:
        if not (entry.name.startswith(head) and entry.name.endswith(".part")):
            continue
        pid = entry.name[len(head):].split(".", 1)[0]
        if pid.isdigit() and int(pid) != os.getpid() and not _alive(int(pid)):
            remove_path(entry)


@contextlib.contextmanager
def atomic_write(path: str | os.PathLike, what: str = "file", *,
                 keep_mode: bool = False) -> Iterator:
    """Yields a binary file object whose content replaces `path` only on success.

    The data go to a temporary file in the same folder, which is renamed over `path`
    once the block ends without an exception and removed otherwise, so readers never
    see a half-written file. The leftovers of earlier writers that were killed go first
    (`remove_stale_parts`), so that on a disk with room for one copy the write that
    follows a kill finds it. The file gets the permissions the umask leaves of 0o666,
    as `open` would give it, or with `keep_mode` those of the file it replaces, if any.

    Raises:
      WriteError: an OSError while writing (a full disk, ...), naming `what` and `path`.
    """
    path = Path(path)
    remove_stale_parts(path)
    with writing(what, path), parents_made(path):
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=part_prefix(path), suffix=".part")
        try:
            old = path.stat() if keep_mode and path.exists() else None
            # mkstemp makes it 0600
            os.fchmod(fd, stat.S_IMODE(old.st_mode) if old else 0o666 & ~umask())
            with os.fdopen(fd, "wb") as f:
                yield f
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise


@contextlib.contextmanager
def parents_made(path: Path) -> Iterator[None]:
    """Makes the missing folders above `path` for the block, and removes those it made
    (while empty) when the block fails: a failed write leaves no folder behind."""
    missing = [p for p in path.parents if not p.exists()]
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        yield
    except BaseException:
        for folder in missing:  # the deepest first
            with contextlib.suppress(OSError):
                folder.rmdir()
        raise



# What marks a file or folder as a dataset this library wrote: an .npz with a
# format_version entry beside a graph's indptr (datasets) or a meta entry naming its kind
# (typed datasets), or a meta entry whose JSON names the graph collections' format; a
# folder of .npy files and a meta.json that lists its arrays with a format_version (or a
# kind), or names the collections' format. (A format_version alone is anyone's key.)
META = "meta.json"
GRAPHS_FORMAT = "zerognn-graphs"


def _ours(meta) -> bool:
    return isinstance(meta, dict) and (
        ("format_version" in meta and isinstance(meta.get("arrays"), dict))
        or meta.get("format") == GRAPHS_FORMAT)


def written_here(path: Path) -> bool:
    """Whether `path` is a dataset file or folder this library wrote (its format marks
    above), or an empty folder: one a new dataset may replace. Unreadable: False."""
    try:
        if path.is_dir():
            entries = list(path.iterdir())
            if not entries:
                return True
            files = all(e.is_file() and (e.name == META or e.suffix == ".npy") for e in entries)
            return files and (path / META).is_file() and _ours(
                json.loads((path / META).read_text()))
        with zipfile.ZipFile(path) as archive:
            names = set(archive.namelist())
        meta = archive_meta(path)
        if "format_version.npy" in names:
            return "indptr.npy" in names or (isinstance(meta, dict) and "kind" in meta)
        return _ours(meta)
    except (OSError, ValueError, zipfile.BadZipFile):
        return False


def archive_meta(path: str | os.PathLike):
    """The JSON value an .npz archive holds as its `meta` entry (a string array), or
    None where it holds none. Raises OSError, ValueError or BadZipFile for a file that
    is no such archive."""
    with zipfile.ZipFile(path) as archive:
        if "meta.npy" not in archive.namelist():
            return None
        with archive.open("meta.npy") as f:
            return json.loads(str(np.lib.format.read_array(f)))


def require_npz_suffix(path: str | os.PathLike, writer: str) -> None:
    """ValueError unless `path` ends in .npz, which is how `load_dataset` and the
    command line tell an archive that `writer` wrote from a dataset folder."""
    if not str(path).endswith(".npz"):
        raise ValueError(f"{writer} writes a .npz archive, which load_dataset and zerognn "
                         f"train know by its suffix: name the file with .npz at the end, "
                         f"got {str(path)!r}")


def file_on_the_way(path: str | os.PathLike) -> Path | None:
    """The nearest existing folder above `path` where that is not a folder (a file): the
    folders a write of `path` would make would fail there; None where it is a folder."""
    above = next((p for p in Path(path).parents if os.path.lexists(p)), None)
    return None if above is None or above.is_dir() else above


def refuse_foreign(path: str | os.PathLike, what: str, *, folder: bool) -> None:
    """FileExistsError (or an OSError of reading it) when `path` exists but is not a
    dataset this library wrote of the kind to be written (`folder`, or a file), so that
    writing `what` there would destroy a file or folder of someone else's or fail after
    the work; the current folder is refused too, and PermissionError where the folder
    the write would go into cannot be written. A dataset written here is replaced."""
    path = Path(path)
    above = file_on_the_way(path)
    if above is not None:  # the folders to make would fail
        raise FileExistsError(f"{what} {path}: {above} is a file, not a folder")
    # (a write goes through a new file in the folder, replacing what is there)
    folder_above = next((p for p in path.parents if os.path.lexists(p)), None)
    if folder_above is not None and not os.access(folder_above, os.W_OK | os.X_OK):
        raise PermissionError(f"{what} {path}: the folder {folder_above} is not writable "
                              f"(by this user, or on a read-only file system)")
    if not os.path.lexists(path):
        return
    if path.exists() and Path.cwd().is_relative_to(path.resolve()):
        raise FileExistsError(f"{what} {path} is the current folder or holds it; give the "
                              f"path of a new folder")
    if path.is_dir() != folder:
        want = "a folder's" if folder else "a file's"
        raise FileExistsError(f"{what} {path} is a {'folder' if path.is_dir() else 'file'}; "
                              f"give {want} path")
    if written_here(path):
        return
    if folder:
        names = sorted(e.name for e in path.iterdir())
        more = f" and {len(names) - 3} more" if len(names) > 3 else ""
        found = f"a folder holding {', '.join(names[:3])}{more}, not a dataset"
    else:
        found = "a file, not a dataset archive"
    raise FileExistsError(f"{what} {path} is {found} written by zerognn-jax; give a new "
                          f"path or remove it first")


def swap_in(tmp: Path, path: Path, what: str, *, overwrite: bool) -> None:
    """Renames the finished folder `tmp` to `path`; an older `path` (checked again by
    `refuse_foreign` unless `overwrite`) goes aside first and is removed only once the new
    one is in place, as is a leftover of a swap killed between its renames."""
    if not overwrite:  # the writing may have run for hours
        refuse_foreign(path, what, folder=True)
    old = path.with_name(f".{path.name}.old")
    remove_path(old)
    if os.path.lexists(path):
        os.replace(path, old)
    os.replace(tmp, path)
    remove_path(old)


@contextlib.contextmanager
def staged_dir(path: Path, what: str, *, overwrite: bool) -> Iterator[Path]:
    """Yields a new empty folder beside `path` for the block to fill; it replaces `path`.

    The folder gets the permissions the umask leaves of 0o777. Once the block ends
    without an exception, its files are synced and it is renamed into place (`swap_in`,
    which `overwrite` is passed to); otherwise it is deleted: readers see a complete
    folder or none. Killed writers' leftovers go first (`remove_stale_parts`). An
    OSError becomes a `WriteError` naming `what` and `path`.
    """
    remove_stale_parts(path)
    with writing(what, path), parents_made(path):
        tmp = Path(tempfile.mkdtemp(dir=path.parent, prefix=part_prefix(path), suffix=".part"))
        try:
            os.chmod(tmp, 0o777 & ~umask())  # mkdtemp makes it 0700
            yield tmp
            for file in tmp.iterdir():
                with open(file, "rb+") as f:
                    os.fsync(f.fileno())
            swap_in(tmp, path, what, overwrite=overwrite)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise


def remove_path(path: Path) -> None:
    """Removes a file, link or folder tree at `path`, if any (errors ignored)."""
    if path.is_symlink() or path.is_file():
        path.unlink(missing_ok=True)
    elif path.exists():
        shutil.rmtree(path, ignore_errors=True)


def umask() -> int:
    """The process's umask: from /proc where Linux shows it, else by setting it and
    setting it back (which races with other threads creating files)."""
    with contextlib.suppress(OSError, ValueError, StopIteration):
        with open("/proc/self/status") as status:
            line = next(x for x in status if x.startswith("Umask:"))
        return int(line.split()[1], 8)
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def not_json_lines(path: str | os.PathLike) -> str | None:
    """The start of the first line of the file at `path` if the file does not begin as
    JSON lines of records do (with "{"), else None (an empty file too). Reads 4 KiB at
    most, so a large file given by mistake is not read through."""
    with open(path, "rb") as f:
        text = f.read(4096).decode("utf-8", "replace").lstrip()
    if not text or text.startswith("{"):
        return None
    return text.split("\n", 1)[0][:40]


class AppendFile:
    """Appends text to `path` (created if missing) in whole writes: a write that fails
    midway is taken back (the file is cut to its length before it) and raises a
    `WriteError` naming `what` and `path`, so the file never ends in half a record.
    A file it created is removed when closed still empty (a run refused before its
    first record leaves none behind)."""

    def __init__(self, path: str | os.PathLike, what: str):
        self.path, self.what = path, what
        self._line_start = False  # whether the file is known to end a line
        with writing(what, path):
            fd = None
            with contextlib.suppress(FileExistsError):
                fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_EXCL, 0o666)
            self._created = fd is not None
            self._file = open(path, "a+b", buffering=0) if fd is None \
                else os.fdopen(fd, "a+b", buffering=0)  # noqa: SIM115 (closed by close())

    def write(self, text: str) -> None:
        data = text.encode("utf-8", "surrogateescape")
        fd = self._file.fileno()
        with writing(self.what, self.path):
            end = os.lseek(fd, 0, os.SEEK_END)
            # a file whose last line has no newline would take the first record onto it
            if not self._line_start and end and os.pread(fd, 1, end - 1) != b"\n":
                data = b"\n" + data
            data = memoryview(data)
            try:
                while data:
                    data = data[os.write(fd, data):]
            except OSError:
                with contextlib.suppress(OSError):
                    os.ftruncate(fd, end)
                raise
            self._line_start = True

    def flush(self) -> None:
        """Nothing to do: every `write` reaches the file at once."""

    def close(self) -> None:
        empty = self._created and os.fstat(self._file.fileno()).st_size == 0
        self._file.close()
        if empty:
            with contextlib.suppress(OSError):
                os.unlink(self.path)

    def __enter__(self) -> AppendFile:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


# Each kind of data and its savers, for `require_kind`'s hint.
_SAVERS = {"Dataset": "zg.save_npz or zg.save_dir",
           "HeteroDataset": "zg.save_hetero_npz or zg.save_hetero_dir",
           "GraphCollection": "zg.save_graphs"}


def require_kind(value, cls: type, saver: str) -> None:
    """TypeError unless `value` is a `cls`, naming `saver` and, for another kind of
    this library's data, its saver (an AttributeError from deep in the write, before)."""
    if isinstance(value, cls):
        return
    got = type(value).__name__
    hint = f"; save it with {_SAVERS[got]}" if got in _SAVERS else ""
    raise TypeError(f"{saver} saves a {cls.__name__}, got a {got}{hint}")
