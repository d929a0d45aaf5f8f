"""`zerognn train` in a process that tests/test_recovery.py can make fail on cue.

  python tests/_fault_child.py [--signal-in-compile PHASE:SIGNAL[:COUNT]]
                               [--kill-in-save EPOCH:WHEN] -- ZEROGNN_ARGS...

--signal-in-compile sends SIGNAL (SIGINT, SIGTERM) to this process COUNT times (default
  once, 0.3 s apart), starting 0.3 s into the longest XLA compilation of PHASE (seconds
  on a CPU): "calibration" (its sampling scan) or "training" (the chunk program). That
  compilation returns only once every signal is sent, so all land inside the phase.
--kill-in-save ends the process with SIGKILL while the checkpoint of EPOCH is written:
  WHEN is a delay in milliseconds after the save starts, or "commit" for the moment
  orbax renames the finished temporary folder into place.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
import time


def _signal_in_compile(spec: str) -> None:
    import jax._src.compiler as compiler

    phase, name, *count = spec.split(":")
    sig, count = getattr(signal, name), int(count[0]) if count else 1
    # The longest compilation of each phase: calibration's sampling scan, the first chunk.
    program = {"calibration": "jit_sample_epoch_counts", "training": "jit_run"}[phase]
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
            sender.start()
            try:
                return compile_and_load(backend, module, *args, **kwargs)
            finally:  # a fast compile must not let the phase end before every signal
                sender.join()
        return compile_and_load(backend, module, *args, **kwargs)

    compiler.backend_compile_and_load = hooked


def _kill_in_save(spec: str) -> None:
    from zerognn_jax._src.training import checkpoint

    epoch, when = spec.split(":")
    epoch, save = int(epoch), checkpoint.Checkpointer.save
    kill = lambda: os.kill(os.getpid(), signal.SIGKILL)

    def hooked(self, e, *args, **kwargs):
        if e == epoch and when != "commit":
            threading.Timer(int(when) / 1000, kill).start()
        return save(self, e, *args, **kwargs)

    checkpoint.Checkpointer.save = hooked
    if when == "commit":
        rename = os.rename

        def renaming(src, dst, *args, **kwargs):
            if os.path.basename(str(dst)) == str(epoch):
                kill()
            return rename(src, dst, *args, **kwargs)

        os.rename = renaming


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--signal-in-compile")
    parser.add_argument("--kill-in-save")
    parser.add_argument("rest", nargs=argparse.REMAINDER)
    args = parser.parse_args()
    if args.signal_in_compile:
        _signal_in_compile(args.signal_in_compile)
    if args.kill_in_save:
        _kill_in_save(args.kill_in_save)
    from zerognn_jax.cli import main as zerognn

    rest = args.rest[1:] if args.rest[:1] == ["--"] else args.rest
    return zerognn(rest)


if __name__ == "__main__":
    sys.exit(main())
