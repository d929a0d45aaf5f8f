"""Lines that say a dataset is being built rather than read.

Generating a synthetic preset or parsing an OGB folder takes from seconds to many
minutes (products-like at scale 1: about 40 s on a 2-core machine, written to its cache
included), and a run that prints nothing meanwhile looks hung. The loaders take a `log`
callable and build inside `announcing`, which tells it what is being built once the
build has taken ANNOUNCE_AFTER_S seconds, and how long it took when it ends. A build
shorter than that (a small preset, a cache read, an option refused before any work)
logs nothing, so that quick runs and their errors stay as they were. `zg.train`
announces its calibration the same way (training/trainer.py).
"""

from __future__ import annotations

import contextlib
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import TypeVar

T = TypeVar("T")
Log = Callable[[str], None]

ANNOUNCE_AFTER_S = 1.0


def stderr_log(enabled: bool) -> Log | None:
    """A `log` that prints each line to stderr at once, or None when not `enabled`."""
    if not enabled:
        return None
    return lambda line: print(line, file=sys.stderr, flush=True)


def preset_label(name: str, scale: float, seed: int) -> str:
    """How the lines name a synthetic preset: "products-like at scale 1 (seed 0)"."""
    return f"{name} at scale {scale:g} (seed {seed})"


class _Start:
    """The line "`what`: `doing`[, into PATH]", logged at most once, and never after the
    build has ended (a timer thread and the building thread may both ask)."""

    def __init__(self, log: Log, line: str):
        self._log, self._line = log, line
        self._lock = threading.Lock()
        self.logged = self._ended = False

    def __call__(self) -> None:
        with self._lock:
            if not (self.logged or self._ended):
                self._log(self._line)
                self.logged = True

    def end(self) -> bool:
        """Whether the line was logged; none will be from now on."""
        with self._lock:
            self._ended = True
            return self.logged


@contextlib.contextmanager
def announcing(what: str, log: Log | None, *, into=None, doing: str = "generating",
               after: float | None = None) -> Iterator[Log | None]:
    """Builds in the `with` block, telling `log` "`what`: `doing`[, into PATH]" once the
    block has run `after` seconds (default ANNOUNCE_AFTER_S; 0: at once) and, if it did,
    "`what`: done in S s" when the block ends without an error (its error says why it
    stopped). Yields the log for the build's own lines (None without one): the first
    of them brings the start line forward, so that it comes first."""
    if log is None:
        yield None
        return
    start = _Start(log, f"{what}: {doing}" + (f", into {into}" if into is not None else ""))
    after = ANNOUNCE_AFTER_S if after is None else after
    timer = None
    if after <= 0:
        start()
    else:
        timer = threading.Timer(after, start)
        timer.daemon = True
        timer.start()

    def inner(line: str) -> None:
        start()
        log(line)

    began = time.perf_counter()
    try:
        yield inner
    finally:
        if timer is not None:
            timer.cancel()
        logged = start.end()
    if logged:
        log(f"{what}: done in {time.perf_counter() - began:.1f} s")


def announced(what: str, build: Callable[[], T], log: Log | None, **how) -> T:
    """`build()` inside `announcing(what, log, **how)`, for a build that logs nothing of
    its own."""
    with announcing(what, log, **how):
        return build()
