"""`zerognn train` in a process that tests/test_recovery.py can make fail on cue.

  python tests/_fault_child.py [--signal-in-compile PHASE:SIGNAL[:COUNT[:held]]]
                               [--kill-at POINT] [--kill-in-save EPOCH:WHEN]
                               [--signal-after-save EPOCH:SIGNAL] -- ZEROGNN_ARGS...

Every fault lands at a chosen point of the run, never after a wall-clock delay, so it
does the same on an idle machine and on a loaded one.

--signal-in-compile sends SIGNAL (SIGINT, SIGTERM) to this process COUNT times (default
  once, 0.3 s apart), starting 0.3 s into the longest XLA compilation of PHASE (seconds
  on a CPU): "calibration" (its sampling scan) or "training" (the chunk program). That
  compilation returns only once every signal is sent, so all land inside the phase.
  With "held", the main thread blocks SIGNAL and waits for every signal to be sent before
  it compiles, as a thread held in native code the whole time does: Python runs no
  handler of its own until then.
--kill-at ends the process with SIGKILL at the safe point (`interrupts.check`) that
  follows POINT: "loading the data", "calibration", "initialisation", "step S of epoch
  E" (after each chunk but the epoch's last), "training epoch E" (after its checkpoint,
  before its evaluation) or "epoch E" (after its evaluation and record).
--kill-in-save ends the process with SIGKILL while the checkpoint of EPOCH is written:
  WHEN is N, at the N-th Python function call of the save on the main thread (at the
  save's end if it makes fewer; a save of a small state makes about 6,000 and orbax
  commits it after about 5,600, so the recovery test draws N below 5,000), or "commit"
  for the moment orbax renames the finished temporary folder into place.
--signal-after-save sends SIGNAL (SIGKILL, SIGTERM, SIGINT) to this process as soon as
  the checkpoint of EPOCH is written.
"""

from __future__ import annotations

import argparse
import itertools
import os
import signal
import sys
import threading
import time


def _signal_in_compile(spec: str) -> None:
    import jax._src.compiler as compiler

    phase, name, *more = spec.split(":")
    sig, count = getattr(signal, name), int(more[0]) if more else 1
    held = more[1:] == ["held"]
    # The longest compilation of each phase: calibration's sampling scan, the first chunk.
    program = {"calibration": "jit__epoch_counts", "training": "jit_run"}[phase]
    compile_and_load = compiler.backend_compile_and_load

    def send():
        for _ in range(count):
            time.sleep(0.3)
            os.kill(os.getpid(), sig)

    def hooked(backend, module, *args, **kwargs):
        if str(module.operation.attributes["sym_name"]).strip('"') == program:
            print(f"fault: {name} x{count} while compiling {program}", file=sys.stderr,
                  flush=True)
            sender = threading.Thread(target=send, daemon=True)
            if held:  # the threads already running still take the signal
                signal.pthread_sigmask(signal.SIG_BLOCK, {sig})
                sender.start()
                sender.join()  # a wait in native code that no signal interrupts
                signal.pthread_sigmask(signal.SIG_UNBLOCK, {sig})
                return compile_and_load(backend, module, *args, **kwargs)
            sender.start()
            try:
                return compile_and_load(backend, module, *args, **kwargs)
            finally:  # a fast compile must not let the phase end before every signal
                sender.join()
        return compile_and_load(backend, module, *args, **kwargs)

    compiler.backend_compile_and_load = hooked


def _kill() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def _kill_at(point: str) -> None:
    from zerognn_jax._src.training import interrupts

    check = interrupts.check

    def hooked(after, *args, **kwargs):
        if after == point:
            _kill()
        return check(after, *args, **kwargs)

    interrupts.check = hooked


def _hook_save(epoch: int, around) -> None:
    """Runs the saves of `epoch` through `around(save, *args, **kwargs)`."""
    from zerognn_jax._src.training import checkpoint

    save = checkpoint.Checkpointer.save

    def hooked(self, e, *args, **kwargs):
        if e == epoch:
            return around(save, self, e, *args, **kwargs)
        return save(self, e, *args, **kwargs)

    checkpoint.Checkpointer.save = hooked


def _kill_in_save(spec: str) -> None:
    epoch, when = spec.split(":")
    if when == "commit":
        rename = os.rename

        def renaming(src, dst, *args, **kwargs):
            if os.path.basename(str(dst)) == epoch:
                _kill()
            return rename(src, dst, *args, **kwargs)

        os.rename = renaming
        return
    calls = itertools.count()
    at = int(when)

    def count(frame, event, arg):
        if event == "call" and next(calls) == at:
            _kill()

    def around(save, *args, **kwargs):
        sys.setprofile(count)
        try:
            save(*args, **kwargs)
        finally:
            _kill()  # the save made fewer calls: at its end

    _hook_save(int(epoch), around)


def _signal_after_save(spec: str) -> None:
    epoch, name = spec.split(":")

    def around(save, *args, **kwargs):
        out = save(*args, **kwargs)
        os.kill(os.getpid(), getattr(signal, name))
        return out

    _hook_save(int(epoch), around)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--signal-in-compile")
    parser.add_argument("--kill-at")
    parser.add_argument("--kill-in-save")
    parser.add_argument("--signal-after-save")
    parser.add_argument("rest", nargs=argparse.REMAINDER)
    args = parser.parse_args()
    if args.signal_in_compile:
        _signal_in_compile(args.signal_in_compile)
    if args.kill_at:
        _kill_at(args.kill_at)
    if args.kill_in_save:
        _kill_in_save(args.kill_in_save)
    if args.signal_after_save:
        _signal_after_save(args.signal_after_save)
    from zerognn_jax.cli import main as zerognn

    rest = args.rest[1:] if args.rest[:1] == ["--"] else args.rest
    return zerognn(rest)


if __name__ == "__main__":
    sys.exit(main())
