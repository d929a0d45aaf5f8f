"""SIGINT, SIGTERM and SIGHUP that end a run between phases, never inside a JAX call.

Why. XLA compiles on a worker thread while the main thread waits. Python's default
SIGINT handler raises KeyboardInterrupt in the waiting thread, the process starts to
exit, and the compile still running on the worker touches a runtime that is being torn
down: the process dies with SIGSEGV seconds after printing that it was interrupted.

What instead. Inside `deferred()` (the `zerognn` command wraps every run in it) the
first SIGINT, SIGTERM or SIGHUP only records the signal and says so on stderr; the training loop
calls `check()` between phases and after every chunk of steps, which raises
`Interrupted` once the call in progress has returned and the device is idle. A second
signal ends the process at once with `os._exit`, which skips the interpreter's shutdown
and so cannot crash in it either. Outside `deferred()` signals keep their usual
meaning, and `check()` raises only for another process's signal (below).

Several processes. In a run over several processes (`jax.distributed`), `check()` asks
every process whether it had a signal, and all stop at that point if one did: a
scheduler or a user that signals one process of a run stops the run, where the others
had gone on into a collective that waited for it.

Why a watcher thread. Python runs signal handlers on the main thread only, between
bytecodes: while that thread is held in native code (a long compile, a wait for the
device) two signals leave one handler call behind, so the second was lost and the first
said nothing until the call returned. Python's C-level handler also writes one byte per
signal to the wakeup fd (`signal.set_wakeup_fd`), whatever the main thread does; a
thread reading it announces the first signal and exits on the second at once. Each
signal counts once, in the block it arrived in: a nested block changes nothing, a byte
read after its block ended is not counted, and a forked child's signals stay its own
(tests/test_recovery.py, `_BLOCKS`).
"""

from __future__ import annotations

import atexit
import collections
import contextlib
import os
import select
import signal
import sys
import threading
from collections.abc import Iterator

import jax
import numpy as np

# SIGHUP: the terminal a run was started from closed (a dropped ssh session); where the
# process ignores it (`nohup`), it stays ignored, as any ignored signal here. A hang-up
# comes twice (the shell passes it on to its jobs, the kernel sends it as the shell
# exits) and is no second signal; the terminal it leaves fails every write (EIO), so the
# block's streams that were terminals are pointed at /dev/null (`_hung_up`).
HANGUP = getattr(signal, "SIGHUP", None)
SIGNALS = (signal.SIGINT, signal.SIGTERM, *(() if HANGUP is None else (HANGUP,)))
_received: list[int] = []  # signals seen inside `deferred()`, first one first


class Interrupted(KeyboardInterrupt):
    """A run stopped at a safe point after SIGINT, SIGTERM or SIGHUP.

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


class _Block:
    """One outermost `deferred()` block: the wakeup fd it replaced and what its signals
    have done. Whoever takes `say` first (the main thread's handler or the watcher)
    writes the announcement, and nobody waits for it: a second signal can interrupt the
    first one's handler inside that write, and a handler that blocked there would hang.
    `said` is set once the line is out; `check()` waits for it, so the line comes before
    the stop's."""

    def __init__(self, forward: int):
        self.forward = forward
        self.say = threading.Lock()
        self.said = threading.Event()
        self.seen = 0  # signals the watcher read, counted while the block runs
        self.active = True


_leaving = threading.Lock()
_current: list[_Block | None] = [None]  # the block running; a nested one changes nothing
_terminals: list[int] = []  # stdout and stderr where they were terminals at block entry


def _hung_up() -> None:
    """After a hang-up, the block's terminal streams write to /dev/null: the terminal
    is gone, and a progress bar's or the stop's line written there would fail the run
    with an OSError (EIO) before its next safe point. Once for the block."""
    while _terminals:
        fd = _terminals.pop()
        with contextlib.suppress(OSError):
            null = os.open(os.devnull, os.O_WRONLY)
            os.dup2(null, fd)
            os.close(null)


# On a terminal, a line is said from its start, over a progress bar being drawn there
# (the bar draws itself again on the next line); a terminal without cursor controls
# (TERM=dumb, as Emacs' shell sets) gets a new line instead of the escape.
_CLEAR_LINE = b"\r\x1b[K"


def _line_start() -> bytes:
    if not os.isatty(2):
        return b""
    return b"\n" if os.environ.get("TERM") == "dumb" else _CLEAR_LINE


def _say(text: bytes) -> None:
    """`text` on stderr if it takes it now, else nothing: never raises, never blocks (a
    broken pipe after `| tee` died with the Ctrl-C, or a full one nobody reads, must not
    keep a signal from stopping the process). os.write, not print: the main thread may
    be inside a write to sys.stderr."""
    with contextlib.suppress(OSError, ValueError):
        if select.select([], [2], [], 0)[1]:
            os.write(2, _line_start() + text)


def _announce(block: _Block, signum: int) -> None:
    if block.say.acquire(blocking=False):
        try:
            _say(f"zerognn: {signal.Signals(signum).name} received; stopping after the "
                 f"current phase (send it again to exit at once)\n".encode())
        finally:
            block.said.set()


def _exit_now(signum: int) -> None:
    if _leaving.acquire(blocking=False):  # the other thread may be exiting already
        try:
            _say(b"zerognn: second interrupt, exiting now\n")
        finally:
            os._exit(128 + signum)


def _on_signal(signum, frame) -> None:
    if signum == HANGUP:
        _hung_up()
    if _received:
        if signum != HANGUP:
            _exit_now(signum)
        return
    _received.append(signum)  # first: a signal that interrupts the line below exits
    if _current[0] is not None:
        _announce(_current[0], signum)


# One wakeup pipe and one reader for the process, made at the first block, so that a
# block's exit only sets flags and restores handlers: no call there lets another thread
# run before the caller goes on (a failed checkpoint read leaves tensorstore threads
# waiting to print). Each block's entry writes a marker byte (0) ahead of its signals'
# bytes and queues its `_Block`, so the reader knows whose bytes it reads, however late.
_pipe: list[int] = []  # [write end, read end]
_blocks: collections.deque = collections.deque()


def _after_fork_in_child() -> None:
    """A forked child has the pipe but not its reader: its signals must not reach the
    parent's pipe (one Ctrl-C to both would count twice there), and the parent's signal
    so far is not its own."""
    _received.clear()
    if _current[0] is not None:
        forward = _current[0].forward
        _current[0] = _Block(forward)
        with contextlib.suppress(ValueError):  # forked from another thread: not ours
            signal.set_wakeup_fd(forward)
    for fd in _pipe:
        with contextlib.suppress(OSError):
            os.close(fd)
    _pipe.clear()
    _blocks.clear()


os.register_at_fork(after_in_child=_after_fork_in_child)


def _watch(fd: int) -> None:
    """Reads the wakeup pipe: a 0 starts the next queued block; any other byte is one
    delivered signal, passed on to the fd that block replaced (its owner still sees its
    signals), and counted while the block runs."""
    block = None
    while data := os.read(fd, 64):
        for byte in data:
            if byte == 0:
                block = _blocks.popleft()
                continue
            if block is None:
                continue
            if block.forward >= 0 and block.forward != _pipe[0]:
                with contextlib.suppress(OSError):
                    os.write(block.forward, bytes([byte]))
            if block.active and byte == HANGUP:
                _hung_up()
            if block.active and byte in SIGNALS:
                block.seen += 1
                if block.seen == 1:
                    _announce(block, byte)
                elif byte != HANGUP:  # (a hang-up's second delivery)
                    _exit_now(byte)


def _restore_wakeup(fd: int) -> int:
    """`signal.set_wakeup_fd(fd)`, or -1 where `fd` no longer takes it (closed, or
    reopened blocking since); returns the fd it replaced."""
    try:
        return signal.set_wakeup_fd(fd)
    except (ValueError, OSError):
        return signal.set_wakeup_fd(-1)


@contextlib.contextmanager
def deferred() -> Iterator[None]:
    """Within the block, SIGINT, SIGTERM and SIGHUP are recorded for `check()` (main thread only;
    elsewhere, and inside another such block, it changes nothing)."""
    if threading.current_thread() is not threading.main_thread() or _current[0]:
        yield
        return
    if not _pipe:
        read, write = os.pipe()
        os.set_blocking(write, False)
        threading.Thread(target=_watch, args=(read,), daemon=True,
                         name="zerognn-signals").start()
        _pipe.extend((write, read))
    forward = signal.set_wakeup_fd(-1)
    block = _Block(-1 if forward == _pipe[0] else forward)  # (left there by another)
    _blocks.append(block)
    try:
        os.write(_pipe[0], b"\0")  # ahead of any signal's byte
    except OSError:
        _blocks.pop()
        _restore_wakeup(forward)
        raise
    _received.clear()
    _current[0] = block
    _terminals[:] = [fd for fd in (1, 2) if os.isatty(fd)]
    # a signal the process ignores stays ignored: a job a script starts with `&` (a
    # shell without job control ignores SIGINT for it) must not stop on the Ctrl-C
    # meant for the script
    previous = {s: signal.signal(s, _on_signal) for s in SIGNALS
                if signal.getsignal(s) is not signal.SIG_IGN}
    signal.set_wakeup_fd(_pipe[0], warn_on_full_buffer=False)
    try:
        yield
    finally:
        block.active = False
        if _pipe:  # (not in a forked child)
            ours = _restore_wakeup(block.forward)
            if ours != _pipe[0]:  # replaced during the block: its owner's stays
                _restore_wakeup(ours)
        _current[0] = None
        _received.clear()
        _terminals.clear()
        # handlers last, SIGINT's last of all: a signal pending here meets the handler
        # it would meet outside the block, with the block's state already put back
        for s in sorted(previous, key=lambda s: s == signal.SIGINT):
            signal.signal(s, previous[s])


def check(after: str, wait_for=None) -> None:
    """Raises `Interrupted` if a signal arrived, once the arrays in `wait_for` (device work
    still in flight) are ready; a no-op otherwise. In a run over several processes every
    one of them calls it at the same points, and all stop there if any had a signal
    (`_from_any_process`)."""
    signum, source = _from_any_process(_received[0] if _received else 0)
    if not signum:
        return
    block = _current[0]
    if _received and block is not None:  # the announcement first (`_Block`), made here
        _announce(block, _received[0])  # if no one has begun it (a signal in the entry)
        block.said.wait(timeout=5)
    if wait_for is not None:
        jax.block_until_ready(wait_for)
    err = Interrupted(signum, after)
    if source is not None and source != jax.process_index():
        err.add_note(f"process {source} of this run received it; every process stops at "
                     f"the same point")
    raise err


def _from_any_process(signum: int) -> tuple[int, int | None]:
    """(the signal to stop on, the process that received it) in a run over several
    processes: the lowest-numbered one's that had a signal, else 0. A process that
    stopped alone left the others waiting in their next collective, until JAX's runtime
    aborted them or for good. One all-gather of an int where the device is idle (between
    phases and chunks). Elsewhere (`signum`, None), without starting JAX's backend."""
    if not jax.distributed.is_initialized() or jax.process_count() == 1:
        return signum, None
    from jax.experimental import multihost_utils

    every = np.asarray(multihost_utils.process_allgather(np.int32(signum))).reshape(-1)
    first = np.flatnonzero(every)
    return (int(every[first[0]]), int(first[0])) if first.size else (0, None)


def exit_on_signal(code: int) -> None:
    """For the rest of a command's process, whose work is done and whose exit status
    is `code`: SIGINT, SIGTERM or SIGHUP ends it at once with `code`, its output flushed first.
    Python's own handlers would make a finished run's signal a KeyboardInterrupt inside
    the interpreter's shutdown (a traceback from an exit handler, JAX's among them) or,
    for SIGTERM, a death with status 143 after the summary was printed. A signal the
    process ignores stays ignored. The command's entry points call it (`zerognn`,
    `python -m zerognn_jax`), from the main thread; a caller of `cli.main` in a
    process that goes on (a notebook, a test) keeps its own handlers.

    Once the interpreter shuts down (its exit handlers, JAX's among them), such a signal
    is ignored instead: no Python handler runs there, and the one Python leaves at the
    end, the system's, ended a finished command as killed by the signal (status -2 for
    SIGINT, after a dataset was written whole)."""
    def leave(signum, frame):
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):  # a closed or broken stream
                stream.flush()
        os._exit(code)

    caught = [s for s in SIGNALS if signal.getsignal(s) is not signal.SIG_IGN]
    for signum in caught:
        signal.signal(signum, leave)
    # (an ignored signal stays ignored through the interpreter's end: Python resets only
    # the handlers of its own to the system's)
    atexit.register(lambda: [signal.signal(s, signal.SIG_IGN) for s in caught])
