"""Feature tables kept in host memory, read row by row from inside the compiled step.

JAX cannot gather random rows of a `pinned_host` array inside `jit` (indexing one fails,
and XLA's host offloader would turn device ops on it into host compute), so the step
reads them with a kernel of ours: `csrc/host_rows.cc`, an XLA FFI call whose CUDA
handler loads the step's rows straight from page-locked host memory over PCIe
(zero-copy: no staging copy, no host thread on the critical path, command-buffer
compatible) and whose CPU handler copies them (tests, CPU runs). The table is never an
XLA buffer: the call carries its number, row count and row size as attributes. Each
`HostTable` takes the next number of the process (0, 1, ...) and binds it to its address
in the library until it is collected; a program holds the number, not the address, so
runs that make the same tables in the same order compile the same programs, which JAX's
persistent compilation cache then reads back (training/compile_cache.py).

`HostTable` owns such a table. It is a pytree whose one leaf is its optional row map
(`position`, for tables laid out hottest first by `reordered_table`), so a `DeviceData`
holding one passes through `jit` and `lax.scan`, and `ops/gather.gather_rows` reads it
with `HostTable.gather`; its twin is the same table on the device (`to_device`).
`CachedTable` adds device copies of the hottest rows (`cache_hot_rows`: by degree in
training), so that only the others cross PCIe.

The other way, `write_rows` (the `zerognn_rows_to_host` call) stores device rows into a
page-locked table from inside a compiled loop, and `uploaded` reads a whole table back:
exact inference streams the layers that do not fit the device through them, into a
`PinnedBuffer` (fresh memory locked piece by piece on a thread, training/evaluate.py).

The handlers are compiled at first use, with the C++ compiler (`$CXX`, else `g++`) on
a CPU-only JAX and with `nvcc` (`$NVCC`, else `nvcc` on the PATH or in CUDA's home) on a
GPU, against the installed jaxlib's FFI headers, into `$ZEROGNN_CACHE` (default
`$XDG_CACHE_HOME/zerognn-jax/host_rows`, or `~/.cache/...` without it: beside the compile
cache), keyed by the source, the jaxlib version and the GPU's compute
capability; later runs load the built library.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import itertools
import mmap
import os
import shutil
import subprocess
import tempfile
import threading
import time
import weakref
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import NamedTuple

import jax
import jax.numpy as jnp
import jaxlib.version
import numpy as np

from zerognn_jax._src.data.cache_dirs import cache_dir
from zerognn_jax._src.data.writes import part_prefix, remove_stale_parts

_TARGET = "zerognn_host_rows"
_WRITE = "zerognn_rows_to_host"
_SOURCE = Path(__file__).parent / "csrc" / "host_rows.cc"
# Bytes page-locked per registration; the driver may refuse much larger single ranges.
_PIECE = 1 << 32
# (address, bytes) of each page-locked table -> [live HostTables over it, its pieces].
_LOCKED: dict[tuple[int, int], list] = {}
# The numbers programs know tables by; never reused, so a program compiled for a
# collected table cannot read another one.
_NUMBERS = itertools.count()


def _cache_dir() -> Path:
    if os.environ.get("ZEROGNN_CACHE"):
        return Path(os.environ["ZEROGNN_CACHE"])
    return cache_dir("host_rows")


def _gpu_arch() -> str | None:
    """"sm_XY" of the first GPU, or None without one."""
    if jax.default_backend() != "gpu":
        return None
    cap = getattr(jax.devices()[0], "compute_capability", None)
    if not cap:
        raise RuntimeError("cannot build the host-row kernel: JAX does not report the "
                           "GPU's compute capability")
    return "sm_" + str(cap).replace(".", "")


class BuildError(OSError):
    """The host-row gather could not be built: no compiler, or it failed. An OSError (of
    the machine, not of the run's values), which the command line reports in one line."""


def _compiler(arch: str | None) -> str:
    """The compiler that builds the handlers for `arch`: $CXX or g++ for the CPU, nvcc
    for a GPU; BuildError when there is none."""
    if arch is None:
        cxx = os.environ.get("CXX", "g++")
        if shutil.which(cxx) is None:
            raise BuildError(f"host-resident features need a C++ compiler to build their "
                             f"row gather, and {cxx!r} is not on the PATH: install g++, "
                             "set $CXX, or keep the features on the device "
                             "(feature_placement 'device')")
        return cxx
    nvcc = os.environ.get("NVCC") or shutil.which("nvcc")
    if nvcc is None:
        home = os.environ.get("CUDA_HOME", "/usr/local/cuda")
        nvcc = str(Path(home) / "bin" / "nvcc") if (Path(home) / "bin" / "nvcc").exists() \
            else None
    if nvcc is None:
        raise BuildError("host-resident features need nvcc to build their GPU row "
                         "gather, and none was found ($NVCC, the PATH, $CUDA_HOME/bin): "
                         "install CUDA's compiler or keep the features on the device "
                         "(feature_placement 'device')")
    return nvcc


def _flags(arch: str | None) -> list[str]:
    """The compiler's arguments for `arch` (without source and output)."""
    include = ["-I", jax.ffi.include_dir()]
    if arch is None:
        return ["-O2", "-std=c++17", "-shared", "-fPIC", "-w", "-x", "c++", *include]
    code = arch.removeprefix("sm_")
    return ["-O2", "-std=c++17", "-shared", "-Xcompiler", "-fPIC", "-w",
            f"-gencode=arch=compute_{code},code=[sm_{code},compute_{code}]", "-x", "cu",
            *include]


@functools.cache
def _library(arch: str | None) -> ctypes.CDLL:
    """The built handlers for `arch` (None: CPU only), built once per cache key: the
    source, the jax and jaxlib versions (the FFI headers are jaxlib's) and the flags
    (the compiler is looked for only then: a machine without one uses a library built
    already). A library whose bytes no longer match the digest written beside it when
    it was built (cut short or damaged: loading such a file killed the process with a
    bus error) is built again."""
    flags = _flags(arch)
    source = _SOURCE.read_bytes()
    versions = [jax.__version__, jaxlib.version.__version__]
    key = hashlib.sha256(source + " ".join([*versions, *flags]).encode())
    path = _cache_dir() / f"host_rows-{arch or 'cpu'}-{key.hexdigest()[:16]}.so"
    digest = path.with_name(path.name + ".sha256")
    if not _intact(path, digest):
        command = [_compiler(arch), *flags]
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            # Built beside its final name and renamed: a run stopped mid-build, or two
            # runs building at once, never leave a half-written library under that name;
            # what builds killed mid-compile left (this host's, their process gone) goes.
            remove_stale_parts(path)
            fd, tmp = tempfile.mkstemp(prefix=part_prefix(path), suffix=".part",
                                       dir=path.parent)
        except OSError as err:
            raise BuildError(f"the host-row gather cannot be built into {path.parent} "
                             f"({err.strerror}): set $ZEROGNN_CACHE to a writable folder, "
                             f"or keep the features on the device (feature_placement="
                             f"\"device\")") from None
        os.close(fd)
        try:
            done = subprocess.run([*command, str(_SOURCE), "-o", tmp], capture_output=True,
                                  text=True)
            if done.returncode:
                raise BuildError(f"building the host-row gather failed ({command[0]} exit "
                                   f"{done.returncode}):\n{done.stderr[-4000:]}")
            built = hashlib.sha256(Path(tmp).read_bytes()).hexdigest()
            os.replace(tmp, path)
            Path(tmp).write_text(built)  # the digest, renamed into place as well
            os.replace(tmp, digest)
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
    return ctypes.CDLL(str(path))


def _intact(path: Path, digest: Path) -> bool:
    """Whether the library `path` exists with the bytes its `digest` file records."""
    try:
        return hashlib.sha256(path.read_bytes()).hexdigest() == digest.read_text().strip()
    except OSError:  # either missing or unreadable: built again
        return False


_REGISTERING = threading.Lock()


def _register_targets() -> ctypes.CDLL:
    """Registers the FFI handlers with XLA for this process's platforms (once, whichever
    thread asks first); the library."""
    with _REGISTERING:
        return _registered()


@functools.cache
def _registered() -> ctypes.CDLL:
    arch = _gpu_arch()
    lib = _library(arch)
    for target, handler in ((_TARGET, "ZgHostRows"), (_WRITE, "ZgRowsToHost")):
        jax.ffi.register_ffi_target(target, jax.ffi.pycapsule(getattr(lib, handler + "Cpu")),
                                    platform="cpu")
        if arch is not None:
            jax.ffi.register_ffi_target(
                target, jax.ffi.pycapsule(getattr(lib, handler + "Cuda")), platform="CUDA")
    lib.zg_bind.argtypes = [ctypes.c_int64, ctypes.c_int64]
    lib.zg_unbind.argtypes = [ctypes.c_int64]
    if arch is not None:
        lib.zg_register.restype = ctypes.c_char_p
        lib.zg_register.argtypes = [ctypes.c_int64, ctypes.c_int64, ctypes.c_int32]
        lib.zg_unregister.argtypes = [ctypes.c_int64]
    return lib


def _pieces(address: int, nbytes: int) -> list[tuple[int, int]]:
    """[address, address + nbytes) cut at page-aligned multiples of `_PIECE`."""
    out, start, end = [], address, address + nbytes
    while start < end:
        stop = min(end, (start // _PIECE + 1) * _PIECE)
        out.append((start, stop - start))
        start = stop
    return out


def _page_lock(lib: ctypes.CDLL, address: int, nbytes: int, read_only: bool) -> list[int]:
    """Page-locks the range for the GPU (as read-only memory with `read_only`); the
    registered pieces' addresses. On failure nothing stays registered and RuntimeError
    says why."""
    done = []
    for start, size in _pieces(address, nbytes):
        try:
            _register_piece(lib, start, size, (address, nbytes), read_only)
        except RuntimeError as error:
            for piece in done:
                lib.zg_unregister(piece)
            raise RuntimeError(f"{error} (a table overlapping another one in use, a view "
                               f"of it, is refused: pass the whole array)") from None
        done.append(start)
    return done


def _register_piece(lib: ctypes.CDLL, start: int, size: int, span: tuple[int, int],
                    read_only: bool = False) -> None:
    """Page-locks one piece of `span`; RuntimeError naming the byte where it failed."""
    err = lib.zg_register(start, size, int(read_only)).decode()
    if err:
        kind = "read-only " if read_only else ""
        raise RuntimeError(f"page-locking {span[1] / 2**30:.2f} GiB of {kind}host memory for "
                           f"the GPU failed at byte {start - span[0]:,}: {err}")


def _locked_span(address: int, nbytes: int) -> tuple[int, int] | None:
    """The page-locked span holding [address, address + nbytes), if any."""
    for start, size in list(_LOCKED):  # a locking thread's finalizer may drop one
        if start <= address and address + nbytes <= start + size:
            return start, size
    return None


class PageLock:
    """Holds `array`'s memory page-locked for the GPU (nothing on a CPU-only process)
    while the lock lives. Locks over the same memory, or over a part of memory already
    locked, share that locking; the last one collected undoes it. An array NumPy may not
    write (a file memory-mapped for reading) is registered as read-only memory."""

    def __init__(self, array: np.ndarray):
        lib = _register_targets()
        self.locked = _gpu_arch() is not None and array.nbytes > 0
        if self.locked:
            span = _locked_span(array.ctypes.data, array.nbytes)
            if span is None:
                span = (array.ctypes.data, array.nbytes)
                _LOCKED[span] = [0, _page_lock(lib, *span, not array.flags.writeable)]
            _LOCKED[span][0] += 1
            weakref.finalize(self, _release, lib, span)


class PinnedBuffer:
    """uint8[nbytes] of fresh host memory, page-locked for the GPU piece by piece (at most
    4 GiB each, in address order) on a thread of its own, so that the first pieces serve
    while later ones are still being locked: `ready(end)` waits until bytes [0, end) are.

    Locking takes fresh memory's page faults one by one (the kernel zeroes every page as
    it pins it): the buffer asks for transparent huge pages (512x fewer faults where the
    system allows them) and each piece is first touched by several threads at once.
    Tables over parts of the buffer (`HostTable`) share its locking; a program may read or
    write such a table only below what `ready` has confirmed. On a CPU-only process
    nothing is locked and `ready` returns at once.
    """

    def __init__(self, nbytes: int):
        memory = mmap.mmap(-1, max(nbytes, 1), flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        if hasattr(mmap, "MADV_HUGEPAGE"):
            memory.madvise(mmap.MADV_HUGEPAGE)
        self.array = np.frombuffer(memory, np.uint8)[:nbytes]
        self.locked = _gpu_arch() is not None and nbytes > 0
        self._progress = _Progress(0 if self.locked else nbytes)
        if self.locked:
            span = (self.array.ctypes.data, nbytes)
            _LOCKED[span] = [1, []]  # held by the buffer; pieces are added as they lock
            # The thread holds the array and the progress, not the buffer: collecting the
            # buffer waits for the thread (`_finish`), then drops its hold.
            thread = threading.Thread(target=_lock_pieces,
                                      args=(self.array, span, self._progress), daemon=True)
            thread.start()
            weakref.finalize(self, _finish, thread, span)

    @property
    def nbytes(self) -> int:
        return self.array.nbytes

    def ready(self, end: int) -> float:
        """Waits until bytes [0, end) are page-locked; the seconds waited. Raises what
        went wrong if locking failed."""
        t0 = time.perf_counter()
        progress = self._progress
        with progress.cond:
            progress.cond.wait_for(lambda: progress.done >= end or progress.error is not None)
        if progress.done < end:
            raise RuntimeError(str(progress.error)) from progress.error
        return time.perf_counter() - t0


class _Progress:
    """How far a `PinnedBuffer`'s locking has come (bytes), or what stopped it."""

    def __init__(self, done: int):
        self.cond = threading.Condition()
        self.done, self.error = done, None

    def report(self, done: int = 0, error: Exception | None = None) -> None:
        with self.cond:
            self.done, self.error = max(self.done, done), error
            self.cond.notify_all()


def _lock_pieces(array: np.ndarray, span: tuple[int, int], progress: _Progress) -> None:
    """Touches (by threads: NumPy's copy loops release the GIL) and page-locks `array`'s
    pieces in address order, reporting each to `progress`. A piece is locked once its
    pages are touched, never while others are being touched (on an H200, 71 GiB locked
    as the pieces beyond were being touched took 24.5 s; touched one piece after another,
    each then locked, 17.5 s). While the handlers are being built (a machine's first use:
    nvcc, 8-11 s) the pieces are touched ahead, and locked when the build is done (71 GiB
    in 10.8 s in all, the build included)."""
    workers = min(16, os.cpu_count() or 1)
    with ThreadPoolExecutor(workers) as pool, ThreadPoolExecutor(1) as build:
        handlers = build.submit(_register_targets)
        touched = []
        try:
            for start, size in _pieces(*span):
                piece = array[start - span[0]:start - span[0] + size]
                list(pool.map(_touch, np.array_split(piece, workers)))
                touched.append((start, size))
                if handlers.done():
                    _lock_touched(handlers.result(), touched, span, progress)
            _lock_touched(handlers.result(), touched, span, progress)
        except Exception as error:  # noqa: BLE001 (handed to the thread that waits)
            progress.report(error=error)


def _lock_touched(lib: ctypes.CDLL, touched: list, span: tuple[int, int],
                  progress: _Progress) -> None:
    """Page-locks the `touched` pieces of `span` in order, reporting each; empties the
    list."""
    for start, size in touched:
        _register_piece(lib, start, size, span)
        _LOCKED[span][1].append(start)
        progress.report(start + size - span[0])
    touched.clear()


def _touch(part: np.ndarray) -> None:
    """Faults in `part`'s pages: one write to each."""
    part[::mmap.PAGESIZE].fill(0)


def _finish(thread: threading.Thread, span: tuple[int, int]) -> None:
    """A collected `PinnedBuffer`: its locking thread ends, then its hold is dropped."""
    thread.join()
    _release(_register_targets(), span)


class HostTable:
    """A table float[N, d] left in host memory (page-locked when the process has a GPU),
    whose rows compiled programs read with `gather` (and write with `write_rows`).

    The table is not copied: keep `array` unchanged, and the table itself, while
    programs that read it may run (the step reads it when it runs; block on their
    results before dropping it: a program run after the table is collected fails).
    `copy.copy` gives a table over the same memory, `copy.deepcopy` one over a copy of
    it. Tables over the same array, or over a part of an
    array another table has locked, share its page-locking, undone when the last of
    them is collected. Equal only to itself: a new table traces a new program, which
    holds the table's number (the process's count of tables so far), not its address.

    Node n's row is row n of `array`, or with `position` (int32[N], a permutation of
    [0, N), kept on the device) row position[n]: `reordered_table` lays a table out
    that way, hottest rows first, so that a step's reads over PCIe fall into less of
    host memory (docs/host_features.md). Positions are checked to be a permutation
    where they lie (on the host, or by one program on their device), but for the
    library's own (`_checked`).
    """

    def __init__(self, array: np.ndarray, position=None, *, _checked: bool = False):
        if not isinstance(array, np.ndarray) or array.ndim != 2:
            raise ValueError(f"a host feature table must be a 2-D NumPy array, got "
                             f"{type(array).__name__} of shape {np.shape(array)}")
        if not array.flags.c_contiguous:
            raise ValueError("a host feature table must be C-contiguous (rows laid out one "
                             "after another); np.ascontiguousarray makes it so")
        if not jnp.issubdtype(array.dtype, jnp.floating):
            raise ValueError(f"a host feature table holds floats, got {array.dtype}")
        if array.shape[1] == 0:
            raise ValueError(f"a host feature table needs at least one column, got shape "
                             f"{array.shape}")
        if position is not None:
            if not isinstance(position, jax.Array):
                position = _permutation(np.asarray(position), array.shape[0], "positions")
            elif position.shape != (array.shape[0],) or not jnp.issubdtype(position.dtype,
                                                                           jnp.integer):
                raise ValueError(f"a host table's row positions must be int"
                                 f"[{array.shape[0]}], got {position.dtype}"
                                 f"{list(position.shape)}")
            elif not _checked and (missing := int(_rows_missed(position))):
                raise _not_every_row("positions", array.shape[0], missing)  # checked there
        self.array = array
        self.shape = array.shape
        self.dtype = jnp.dtype(array.dtype)
        self.ndim = 2
        self.position = None if position is None else jax.device_put(
            position.astype(np.int32) if isinstance(position, np.ndarray)
            else position.astype(jnp.int32))
        self._lock = PageLock(array)  # registers the handlers too
        self.page_locked = self._lock.locked
        lib = _register_targets()
        self.number = next(_NUMBERS)
        lib.zg_bind(self.number, array.ctypes.data)
        weakref.finalize(self, lib.zg_unbind, self.number)
        self._static = _Static(self)

    @property
    def nbytes(self) -> int:
        return self.array.nbytes

    def __array__(self, dtype=None, copy=None):
        # (np.asarray would make a 0-d object array of the table, which reads as a table
        # until it is used; with `position`, `array` alone is not in node order)
        order = "" if self.position is None else (
            ", laid out by `position` (node n is row position[n]; an artifact's "
            "ExportedModel.data_arguments gives its rows in node order)")
        raise TypeError(f"a HostTable is no array: its rows are its `array`{order}")

    def __repr__(self) -> str:
        where = "page-locked host" if self.page_locked else "host"
        order = "" if self.position is None else ", rows reordered"
        return f"HostTable({self.dtype.name}{list(self.shape)} in {where} memory{order})"

    def gather(self, ids: jax.Array, valid: jax.Array) -> jax.Array:
        """float[C, d]: the rows of nodes `ids` (int32[C]), zero where `valid` (bool[C])
        is False or an id lies outside [0, N). The rows are read in ascending address
        order (an argsort on the device first): a GPU reads host memory over PCIe
        1.8-2.4x faster in address order than at random (docs/host_features.md)."""
        ids = jnp.asarray(ids, jnp.int32)
        valid = jnp.asarray(valid, bool)
        if self.position is not None and self.shape[0]:
            valid = valid & (ids >= 0) & (ids < self.shape[0])
            ids = self.position[jnp.where(valid, ids, 0)]
        return self.read_at(ids, valid)

    def read_at(self, rows: jax.Array, valid: jax.Array) -> jax.Array:
        """float[C, d]: rows `rows` of `array` as it lies (not mapped by `position`), read
        as `gather` reads them; zero where `valid` is False or a row lies outside [0, N)."""
        order = jnp.argsort(jnp.where(valid, rows, jnp.iinfo(jnp.int32).max)).astype(jnp.int32)
        return read_rows(self, rows, valid, order)

    def __copy__(self) -> HostTable:
        return self._with_position(self.position)

    def __deepcopy__(self, memo) -> HostTable:
        return HostTable(self.array.copy(), self.position, _checked=True)

    def _with_position(self, position) -> HostTable:
        """This table with `position` in place of its own (jit's tracers, device_put's
        copies: the pytree), holding the original, whose collection frees the memory."""
        table = object.__new__(HostTable)
        table.__dict__.update(self.__dict__)
        table.position = position
        table._origin = self._static.table()
        return table


@jax.jit
def _rows_missed(position: jax.Array) -> jax.Array:
    """int32 scalar: the rows of [0, N) that no entry of `position` (int[N]) names, on
    the device that holds it (0: a permutation)."""
    n, position = position.shape[0], position.astype(jnp.int32)  # int8's n overflows
    inside = (position >= 0) & (position < n)
    hits = jnp.zeros(n, jnp.int32).at[jnp.where(inside, position, n)].add(1, mode="drop")
    return jnp.sum(hits == 0)


def _permutation(values: np.ndarray, n: int, what: str) -> np.ndarray:
    """`values` if they are a permutation of [0, n) (int[n]), else ValueError naming `what`
    and what is wrong."""
    if values.shape != (n,) or not np.issubdtype(values.dtype, np.integer):
        raise ValueError(f"a host table's row {what} for {n} rows must be int[{n}], got "
                         f"{values.dtype}{list(values.shape)}")
    seen = np.zeros(n, bool)
    inside = (values >= 0) & (values < n)
    seen[values[inside]] = True
    if not inside.all() or not seen.all():
        raise _not_every_row(what, n, int(n - seen.sum()))
    return values


def _not_every_row(what: str, n: int, missing: int) -> ValueError:
    return ValueError(f"a host table's row {what} must hold every row of [0, {n}) once; "
                      f"{missing:,} are missing")


def reordered_table(source, order, dtype=None, *, log=None) -> HostTable:
    """A `HostTable` of `source`'s rows (float[N, d], any array NumPy can slice: a
    memory-mapped file too) in `dtype` (default: `source`'s), laid out in `order`
    (int[N], a permutation of [0, N): row r holds node order[r]), in fresh host memory.

    `source` is read once, in row blocks in its own order (sequential reads of a file),
    each block scattered to its rows by up to 16 threads. `log`, if given, gets a line
    at each tenth of the rows.
    """
    if np.ndim(source) != 2:
        raise ValueError(f"a host feature table must be 2-D, got shape {np.shape(source)}")
    n, width = np.shape(source)
    order = _permutation(np.asarray(order), n, "order")
    position = np.empty(n, np.int32)
    position[order] = np.arange(n, dtype=np.int32)
    dtype = np.dtype(dtype or np.asarray(source[:0]).dtype)
    out = np.empty((n, width), dtype)
    block = 1 << 16
    starts = range(0, n, block)
    done = [0, 0]  # rows written, tenths reported
    report = threading.Lock()

    def fill(start: int) -> None:
        rows = np.asarray(source[start:start + block]).astype(dtype, copy=False)
        out[position[start:start + rows.shape[0]]] = rows
        if log is not None:
            with report:
                done[0] += rows.shape[0]
                if done[0] * 10 >= (done[1] + 1) * n:
                    done[1] = done[0] * 10 // n
                    log(f"host table reordered: {done[0]:,} of {n:,} rows")

    with ThreadPoolExecutor(min(16, os.cpu_count() or 1)) as pool:
        list(pool.map(fill, starts))
    return HostTable(out, jax.device_put(position), _checked=True)  # built here


def read_rows(table: HostTable, ids: jax.Array, valid: jax.Array,
              order: jax.Array) -> jax.Array:
    """The FFI call behind `HostTable.gather`, reading the rows in `order` (int32[C], a
    permutation of [0, C)) as given."""
    out = jax.ShapeDtypeStruct((ids.shape[0], table.shape[1]), table.dtype)
    return jax.ffi.ffi_call(_TARGET, out)(
        ids, valid, order, table=np.int64(table.number),
        rows=np.int64(table.shape[0]), row_bytes=np.int64(table.shape[1] * table.dtype.itemsize))


def write_rows(table: HostTable, block: jax.Array, first: jax.Array) -> jax.Array:
    """int32[]: how many rows of `block` (float[R, d], the table's dtype and width) were
    stored into the table's rows [first, first + R) (`first` an int32 scalar; the rows
    outside [0, N) are skipped). A side effect of the compiled program: the table holds
    the rows once the program has run (block on the returned count)."""
    if table.position is not None:
        raise ValueError("rows are written to a host table in its stored order; this one's "
                         "rows are reordered (position)")
    if not table.array.flags.writeable:  # (a write into read-only pages kills the process)
        raise ValueError("rows are written to a host table over a writable array; this "
                         "one's is read-only (a memory map opened with mode 'r'?)")
    if block.ndim != 2 or block.shape[1] != table.shape[1] or block.dtype != table.dtype:
        raise ValueError(f"rows written to a {table.dtype.name}{list(table.shape)} host table "
                         f"must be {table.dtype.name}[R, {table.shape[1]}], got "
                         f"{block.dtype}{list(block.shape)}")
    count = jax.ShapeDtypeStruct((), jnp.int32)
    return jax.ffi.ffi_call(_WRITE, count, has_side_effect=True)(
        block, jnp.asarray(first, jnp.int32), table=np.int64(table.number),
        rows=np.int64(table.shape[0]), row_bytes=np.int64(table.shape[1] * table.dtype.itemsize))


@functools.partial(jax.jit, static_argnames=("rows",))
def _upload(table: HostTable, *, rows: int) -> jax.Array:
    """float[N, d]: the host table on the device (node n's row at row n), read `rows`
    rows at a time by the host gather into one device array, filled in place."""
    n, width = table.shape
    ids = jnp.arange(rows, dtype=jnp.int32)

    def body(j, out):
        first = jnp.minimum(j * rows, n - rows)
        every = jnp.ones((rows,), bool)
        if table.position is None:  # already in address order
            block = read_rows(table, first + ids, every, ids)
        else:
            block = table.gather(first + ids, every)
        return jax.lax.dynamic_update_slice(out, block, (first, jnp.zeros_like(first)))

    out = jnp.zeros((n, width), table.dtype)
    return jax.lax.fori_loop(0, -(-n // rows), body, out)


def uploaded(table: HostTable, block_bytes: int = 256 << 20) -> jax.Array:
    """The host table `table` copied to the device, about `block_bytes` at a time."""
    if table.shape[0] == 0:
        return jnp.zeros(table.shape, table.dtype)
    row_bytes = table.shape[1] * table.dtype.itemsize
    return _upload(table, rows=min(table.shape[0], max(1, block_bytes // row_bytes)))


def _release(lib: ctypes.CDLL, span: tuple[int, int]) -> None:
    """Drops one table's hold on `span`; the last one out unlocks its pages."""
    held = _LOCKED[span]
    held[0] -= 1
    if held[0] == 0:
        del _LOCKED[span]
        for piece in held[1]:
            lib.zg_unregister(piece)


class _Static:
    """A `HostTable`'s static part in its pytree: equal only to itself, and holding the
    table weakly, so that jit's caches, which keep the static parts of every argument
    they saw, keep no table (and its host memory) alive after its last use."""

    __slots__ = ("table", "__weakref__")

    def __init__(self, table: HostTable):
        self.table = weakref.ref(table)

    def rebuilt(self, position) -> HostTable:
        table = self.table()
        if table is None:
            raise RuntimeError("a host table was rebuilt from a pytree after it was "
                               "collected; keep the table while programs use it")
        return table._with_position(position)


# The row positions are the table's one leaf (None without them); the rest, the memory
# included, is static, and every table rebuilt from one keeps the same static part.
jax.tree_util.register_pytree_node(HostTable, lambda t: ((t.position,), t._static),
                                   lambda static, leaves: static.rebuilt(leaves[0]))


class CachedTable(NamedTuple):
    """A `HostTable` with copies of some of its rows on the device (the hottest: most
    often sampled), read from there instead of over PCIe.

    Attributes:
      rows: float[K, d], the cached rows on the device.
      slot: int32[N], each node's row in `rows`, or -1 where it is not cached
        (`cache_hot_rows`); or None where `rows` are the first K rows of the host
        table's layout (`cache_leading_rows`), which its own row positions find.
      host: the whole table, in host memory.
    """

    rows: jax.Array
    slot: jax.Array | None
    host: HostTable

    @property
    def shape(self) -> tuple[int, int]:
        return self.host.shape

    @property
    def dtype(self):
        return self.host.dtype

    @property
    def array(self) -> np.ndarray:
        return self.host.array

    @property
    def nbytes(self) -> int:
        return self.host.nbytes

    def cached(self, ids: jax.Array) -> jax.Array:
        """bool[C]: whether each node of `ids` (in [0, N)) has its row cached."""
        ids = jnp.asarray(ids, jnp.int32)
        if self.slot is not None:
            return self.slot[ids] >= 0
        row = ids if self.host.position is None else self.host.position[ids]
        return row < self.rows.shape[0]

    def gather(self, ids: jax.Array, valid: jax.Array) -> jax.Array:
        """`HostTable.gather`, cached rows read from the device and only the others over
        PCIe; the same values, bit for bit."""
        ids = jnp.asarray(ids, jnp.int32)
        valid = jnp.asarray(valid, bool) & (ids >= 0) & (ids < self.shape[0])
        safe = jnp.where(valid, ids, 0)
        if self.slot is None:  # the layout's first K rows: one map read, the host's own
            row = safe if self.host.position is None else self.host.position[safe]
            hit = valid & (row < self.rows.shape[0])
            cached = self.rows[jnp.where(hit, row, 0)]
            missed = self.host.read_at(row, valid & ~hit)
        else:
            slot = jnp.where(valid, self.slot[safe], -1)
            hit = slot >= 0
            cached = self.rows[jnp.maximum(slot, 0)]
            missed = self.host.gather(ids, valid & ~hit)
        return jnp.where(hit[:, None], cached, missed)


def cache_hot_rows(host: HostTable, hot: np.ndarray) -> CachedTable:
    """`host` with its rows `hot` (distinct node ids) copied to the device (read over
    PCIe by the host gather), cached row k holding node hot[k]."""
    hot = np.asarray(hot, np.int32)
    count = hot.shape[0]
    slot = np.full(host.shape[0], -1, np.int32)
    slot[hot] = np.arange(count, dtype=np.int32)
    # the table as an argument: closed over, its row map would become a constant
    rows = jax.jit(lambda t, i, v: t.gather(i, v))(host, jnp.asarray(hot), jnp.ones(count, bool))
    return CachedTable(rows, jnp.asarray(slot), host)


def cache_leading_rows(host: HostTable, count: int) -> CachedTable:
    """`host` with the first `count` rows of its layout copied to the device: its hottest
    where `reordered_table` laid it out by degree. Unlike `cache_hot_rows` it keeps no
    node -> slot map (4 bytes a node on the device): a node's copy is found through the
    table's own row positions."""
    count = min(int(count), host.shape[0])
    if count < 1:
        raise ValueError(f"a cache holds at least one row, got {count}")
    read = jax.jit(lambda t, r, v: t.read_at(r, v))
    rows = read(host, jnp.arange(count, dtype=jnp.int32), jnp.ones(count, bool))
    return CachedTable(rows, None, host)


def to_device(array, dtype=None) -> jax.Array:
    """`array` on the default device (in `dtype`; anything but a NumPy array by
    `jnp.asarray`): a NumPy array by `jax.device_put`, or by the host gather
    (`uploaded`) when its memory lies in memory a `HostTable` or
    `PinnedBuffer` holds page-locked: JAX's `device_put` of such memory fails on a GPU
    with CUDA_ERROR_INVALID_VALUE where it spans more than one locked piece (JAX 0.11.2,
    docs/benchmarks.md). `device_put` moves the rows straight in (`jnp.asarray` would
    also run a copy on the device: twice a 57 GB table)."""
    if not isinstance(array, np.ndarray):
        return jnp.asarray(array, dtype)
    array = array.astype(dtype or array.dtype, copy=False)
    locked = (array.nbytes > 0 and array.ndim == 2 and array.flags.c_contiguous
              and _locked_span(array.ctypes.data, array.nbytes) is not None)
    if not locked:
        return jax.device_put(array)
    table = HostTable(array)  # held until its rows are read: its number goes with it
    return jax.block_until_ready(uploaded(table))


def is_host_resident(table) -> bool:
    """Whether `table` is read by the host gather (a `HostTable`, cached or not)."""
    return isinstance(table, (HostTable, CachedTable))


def host_table(table) -> HostTable:
    """The `HostTable` a host-resident `table` reads its rows from: itself, or a
    `CachedTable`'s whole table."""
    return table.host if isinstance(table, CachedTable) else table


def device_bytes(table) -> int:
    """Bytes a host-resident feature table holds in device memory: a `HostTable`'s row
    positions (4 bytes a node) if it has them; a `CachedTable`'s cached rows and node ->
    slot map besides."""
    if isinstance(table, CachedTable):
        slot = 0 if table.slot is None else table.slot.nbytes
        return table.rows.nbytes + slot + device_bytes(table.host)
    if not isinstance(table, HostTable):
        raise TypeError(f"device_bytes reads host-resident tables, got {type(table).__name__}")
    return 0 if table.position is None else table.position.nbytes
