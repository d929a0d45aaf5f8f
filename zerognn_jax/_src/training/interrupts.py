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

Why a watcher thread. Python runs signal handlers on the main thread only, between
bytecodes: while that thread is held in native code (a long compile, a wait for the
device) two signals leave one handler call behind, so the second was lost and the first
said nothing until the call returned. Python's C-level handler also writes one byte per
signal to the wakeup fd (`signal.set_wakeup_fd`), whatever the main thread does; a
thread reading it announces the first signal and exits on the second at once.
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


_say = threading.Lock()  # the first signal is announced once, by whoever comes first
_said = threading.Event()
_leaving = threading.Lock()


def _announce(signum: int) -> None:
    # os.write, not print: the main thread may be inside a write to sys.stderr.
    with _say:
        if not _said.is_set():
            os.write(2, f"zerognn: {signal.Signals(signum).name} received; stopping after the "
                        f"current phase (send it again to exit at once)\n".encode())
            _said.set()


def _exit_now(signum: int) -> None:
    if _leaving.acquire(blocking=False):  # the other thread may be exiting already
        os.write(2, b"zerognn: second interrupt, exiting now\n")
        os._exit(128 + signum)


def _on_signal(signum, frame) -> None:
    if _received:
        _exit_now(signum)
        return
    _announce(signum)
    _received.append(signum)


# The wakeup pipe's write end, and the fd it replaced while a `deferred()` block runs.
# One pipe and one reader for the process, made at the first block: a block's exit
# then makes no system call, so it lets no other thread run before the caller goes on
# (a failed checkpoint read leaves tensorstore threads waiting to print).
_pipe: list[int] = []
_forward = [-1]
_seen = [0]
os.register_at_fork(after_in_child=_pipe.clear)  # a child has the fds but not the reader


def _watch(fd: int) -> None:
    """Reads the wakeup pipe; every byte is one delivered signal. Bytes go on to the fd
    that was there before, so its owner still sees its signals."""
    while data := os.read(fd, 64):
        if _forward[0] >= 0:
            with contextlib.suppress(OSError):
                os.write(_forward[0], data)
        for signum in data:
            if signum in SIGNALS:
                _seen[0] += 1
                if _seen[0] == 1:
                    _announce(signum)
                else:
                    _exit_now(signum)


@contextlib.contextmanager
def deferred() -> Iterator[None]:
    """Within the block, SIGINT and SIGTERM are recorded for `check()` (main thread only;
    elsewhere the block changes nothing)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    if not _pipe:
        read, write = os.pipe()
        os.set_blocking(write, False)
        threading.Thread(target=_watch, args=(read,), daemon=True,
                         name="zerognn-signals").start()
        _pipe.append(write)
    previous = {s: signal.signal(s, _on_signal) for s in SIGNALS}
    _forward[0] = signal.set_wakeup_fd(_pipe[0], warn_on_full_buffer=False)
    try:
        yield
    finally:
        signal.set_wakeup_fd(_forward[0])
        _forward[0] = -1
        for s, handler in previous.items():
            signal.signal(s, handler)
        _received.clear()
        _said.clear()
        _seen[0] = 0


def check(after: str, wait_for=None) -> None:
    """Raises `Interrupted` if a signal arrived, once the arrays in `wait_for` (device work
    still in flight) are ready; a no-op otherwise."""
    if _received:
        if wait_for is not None:
            jax.block_until_ready(wait_for)
        raise Interrupted(_received[0], after)
