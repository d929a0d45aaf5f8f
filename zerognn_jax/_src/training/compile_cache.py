"""Compiled programs kept on disk between runs: JAX's persistent compilation cache.

A run compiles its epoch, calibration and evaluation programs before it trains (seconds
on a GPU, most of a small run on a CPU). With the cache on, a program compiled once (in
this process or an earlier one, with the same shapes, configuration and XLA flags) is
read back instead of compiled again. JAX keys each entry by the program's text, the
compiler's options and the devices, so a stale entry is never used for another program.
The `zerognn` command turns it on by default; a library user calls `use_compile_cache`.
"""

from __future__ import annotations

import importlib.util
import os
import pathlib
import warnings

import jax
from jax.experimental.compilation_cache import compilation_cache

from zerognn_jax._src.data.cache_dirs import cache_dir
from zerognn_jax._src.training.user_frames import user_stacklevel

# The folder's size bound, in GiB: beyond it JAX removes the entries read least recently.
DEFAULT_MAX_GIB = 4.0
# Programs compiled in less time than this are not written (JAX's default is 1 s): a
# run's calibration and evaluation programs take 0.2-1 s each on a CPU, and reading one
# back takes milliseconds.
MIN_COMPILE_SECONDS = 0.2
JAX_MIN_COMPILE_SECONDS = 1.0


class CompileCacheWarning(UserWarning):
    """The compile cache could not be used as asked; the run goes on without it."""


def default_cache_dir() -> pathlib.Path:
    """`$XDG_CACHE_HOME/zerognn-jax/xla`, or `~/.cache/zerognn-jax/xla`."""
    return cache_dir("xla")


def use_compile_cache(path: str | os.PathLike | None = None, *,
                      max_gib: float | None = DEFAULT_MAX_GIB) -> pathlib.Path | None:
    """Keeps this process's compiled programs in `path`, and reads them back from there.

    `path` None: the folder JAX was given (`JAX_COMPILATION_CACHE_DIR`, or
    `jax.config.update("jax_compilation_cache_dir", ...)`) if any, used as it is; else
    `default_cache_dir()`. A folder given here or the default one is bounded to
    `max_gib` GiB (least recently read entries removed first; None: unbounded) unless
    JAX was given a bound of its own, cleared of entries left half-written (`_repair`),
    and programs that compile in 0.2 s or more are written to it (JAX's default: 1 s,
    kept if it was changed). Returns the folder in use, or None where the cache stays
    off: JAX's cache was turned off (`JAX_ENABLE_COMPILATION_CACHE=false`), or the
    folder cannot be created or written (a warning says why; the run compiles as
    without a cache).

    The setting is the process's (JAX's configuration): every later compile in it uses
    the folder. A compile already made stays in memory only. The folder's entries are
    programs the process runs: keep it where only you can write.
    """
    if max_gib is not None and not max_gib > 0:
        raise ValueError(f"max_gib must be positive (or None: unbounded), got {max_gib!r}")
    if not jax.config.jax_enable_compilation_cache:
        if path is not None:
            _warn(f"compiled programs are not kept in {str(path)!r}: JAX's compilation "
                  f"cache is turned off (JAX_ENABLE_COMPILATION_CACHE)")
        return None
    current = jax.config.jax_compilation_cache_dir
    if path is None and current:
        return pathlib.Path(current)
    # One folder, one spelling: JAX's key holds a path derived from it.
    folder = pathlib.Path(default_cache_dir() if path is None else path).expanduser()
    try:
        folder = folder.resolve()
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        if not os.access(folder, os.W_OK | os.X_OK):
            raise PermissionError(f"not writable: {str(folder)!r}")
    except (OSError, RuntimeError) as err:  # RuntimeError: a loop of links (resolve)
        _warn(f"compiled programs are not kept between runs: the compile cache folder "
              f"{str(folder)!r} cannot be used ({err})")
        return None
    _bound(max_gib)
    if jax.config.jax_compilation_cache_max_size != -1:
        _repair(folder)
    if jax.config.jax_persistent_cache_min_compile_time_secs == JAX_MIN_COMPILE_SECONDS:
        jax.config.update("jax_persistent_cache_min_compile_time_secs", MIN_COMPILE_SECONDS)
    jax.config.update("jax_compilation_cache_dir", str(folder))
    compilation_cache.reset_cache()  # JAX opens its folder once: this one from now on
    return folder


# The size bound this module gave JAX (replaced by a later call), as opposed to one the
# user gave JAX (kept).
_given = {"max_size": None}


def _bound(max_gib: float | None) -> None:
    current = jax.config.jax_compilation_cache_max_size
    if current not in (-1, _given["max_size"]):
        return  # the user's own
    size = -1 if max_gib is None else int(max_gib * 2**30)
    if size != -1 and importlib.util.find_spec("filelock") is None:  # JAX's bound needs it
        _warn("the compile cache folder is not bounded in size: install the filelock "
              "package (a dependency of zerognn-jax)")
        size = -1
    jax.config.update("jax_compilation_cache_max_size", size)
    _given["max_size"] = size


def _repair(folder: pathlib.Path) -> None:
    """Removes the entries of `folder` that have no `-atime` file beside their `-cache`
    file: a write cut short (a full disk, a killed process), or an entry an unbounded
    writer made. JAX would fail to read the first on every later run without replacing
    it, and a bounded JAX reads every entry's `-atime` before it writes, so either makes
    every later write fail. Holds JAX's lock of the folder (a bounded writer writes both
    files under it); skipped if another process holds it for 10 s."""
    import filelock

    try:
        with filelock.FileLock(str(folder / ".lockfile"), timeout=10):
            for entry in folder.glob("*-cache"):
                if not entry.with_name(entry.name.removesuffix("-cache") + "-atime").exists():
                    entry.unlink(missing_ok=True)
    except (filelock.Timeout, OSError):
        pass  # left for JAX to warn about, entry by entry


def _warn(message: str) -> None:
    warnings.warn(message, CompileCacheWarning, stacklevel=user_stacklevel())
