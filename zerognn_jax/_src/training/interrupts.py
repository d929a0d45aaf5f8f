"""SIGINT and SIGTERM that end a run between phases, never inside a JAX call.

Why. XLA compiles on a worker thread while the main thread waits. Python's default
SIGINT handler raises KeyboardInterrupt in the waiting thread, the process starts to
exit, and the compile still running on the worker touches a runtime that is being torn
down: the process dies with SIGSEGV seconds after printing that it was interrupted.

What instead. Inside `deferred()` (the `zerognn` command wraps every run in it) the
first SIGINT or SIGTERM only records the signal and says so on stderr; the training loop
calls `check()` between phases and after every chunk of steps, which raises
`Interrupted` once the call in progress has returned and the device is idle. A second
signal ends the process at once with `os._exit`, which skips the interpreter's shutdown
and so cannot crash in it either. Outside `deferred()`, `check()` does nothing and
signals keep their usual meaning.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from collections.abc import Iterator

import jax

SIGNALS = (signal.SIGINT, signal.SIGTERM)
_received: list[int] = []  # signals seen inside `deferred()`, first one first


class Interrupted(KeyboardInterrupt):
    """A run stopped at a safe point after SIGINT or SIGTERM.

    Attributes:
      signum: the signal; `exit_code` is the shell's convention, 128 + signum.
      after: what had finished when the run stopped ("calibration", "epoch 3", ...).
    """

    def __init__(self, signum: int, after: str):
        self.signum, self.after = signum, after
        super().__init__(f"interrupted by {signal.Signals(signum).name} after {after}")

    @property
    def exit_code(self) -> int:
        return 128 + self.signum


def _on_signal(signum, frame) -> None:
    # os.write, not print: the main thread may be inside a write to sys.stderr.
    if _received:
        os.write(2, b"zerognn: second interrupt, exiting now\n")
        os._exit(128 + signum)
    _received.append(signum)
    os.write(2, f"zerognn: {signal.Signals(signum).name} received; stopping after the "
                f"current phase (send it again to exit at once)\n".encode())


@contextlib.contextmanager
def deferred() -> Iterator[None]:
    """Within the block, SIGINT and SIGTERM are recorded for `check()` (main thread only;
    elsewhere the block changes nothing)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {s: signal.signal(s, _on_signal) for s in SIGNALS}
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
        _received.clear()


def check(after: str, wait_for=None) -> None:
    """Raises `Interrupted` if a signal arrived, once the arrays in `wait_for` (device work
    still in flight) are ready; a no-op otherwise."""
    if _received:
        if wait_for is not None:
            jax.block_until_ready(wait_for)
        raise Interrupted(_received[0], after)
