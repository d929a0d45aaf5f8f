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

# The folder's size bound, in GiB: beyond it JAX removes the entries read least recently.
DEFAULT_MAX_GIB = 4.0
# Programs compiled in less time than this are not written (JAX's default is 1 s): a
# run's calibration and evaluation programs take 0.2-1 s each on a CPU, and reading one
# back takes milliseconds.
MIN_COMPILE_SECONDS = 0.2


class CompileCacheWarning(UserWarning):
    """The compile cache could not be used as asked; the run goes on without it."""


def default_cache_dir() -> pathlib.Path:
    """`$XDG_CACHE_HOME/zerognn-jax/xla`, or `~/.cache/zerognn-jax/xla`."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return pathlib.Path(base) / "zerognn-jax" / "xla"


def use_compile_cache(path: str | os.PathLike | None = None, *,
                      max_gib: float | None = DEFAULT_MAX_GIB) -> pathlib.Path | None:
    """Keeps this process's compiled programs in `path`, and reads them back from there.

    `path` None: the folder JAX was given (`JAX_COMPILATION_CACHE_DIR`, or
    `jax.config.update("jax_compilation_cache_dir", ...)`) if any, else
    `default_cache_dir()`. The folder is bounded to `max_gib` GiB (least recently read
    entries removed first; None: unbounded) unless JAX was given a bound already.
    Returns the folder in use, or None where the cache stays off: JAX's cache was turned
    off (`JAX_ENABLE_COMPILATION_CACHE=false`), or the folder cannot be created or
    written (a warning says why; the run compiles as without a cache).

    The setting is the process's (JAX's configuration): every later compile in it uses
    the folder. A compile already made stays in memory only.
    """
    if max_gib is not None and not max_gib > 0:
        raise ValueError(f"max_gib must be positive (or None: unbounded), got {max_gib!r}")
    if not jax.config.jax_enable_compilation_cache:
        return None
    current = jax.config.jax_compilation_cache_dir
    if path is None and current:
        return pathlib.Path(current)
    folder = pathlib.Path(default_cache_dir() if path is None else path).expanduser()
    try:
        folder.mkdir(parents=True, exist_ok=True)
        if not os.access(folder, os.W_OK | os.X_OK):
            raise PermissionError(f"not writable: {str(folder)!r}")
    except OSError as err:
        warnings.warn(f"compiled programs are not kept between runs: the compile cache "
                      f"folder {str(folder)!r} cannot be used ({err})", CompileCacheWarning,
                      stacklevel=2)
        return None
    if max_gib is not None and jax.config.jax_compilation_cache_max_size == -1:
        if importlib.util.find_spec("filelock") is None:  # JAX's bound needs it
            warnings.warn("the compile cache folder is not bounded in size: install the "
                          "filelock package (a dependency of zerognn-jax)",
                          CompileCacheWarning, stacklevel=2)
        else:
            jax.config.update("jax_compilation_cache_max_size", int(max_gib * 2**30))
    if jax.config.jax_persistent_cache_min_compile_time_secs > MIN_COMPILE_SECONDS:
        jax.config.update("jax_persistent_cache_min_compile_time_secs", MIN_COMPILE_SECONDS)
    jax.config.update("jax_compilation_cache_dir", str(folder))
    compilation_cache.reset_cache()  # JAX opens its folder once: this one from now on
    return folder
