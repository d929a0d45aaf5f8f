"""The `zerognn` command's entry point, outside the `zerognn_jax` package: importing the
package (JAX, Flax) takes a few seconds, and a Ctrl-C in that time would
otherwise end in a traceback instead of the command line's one line and exit code 130
(`zerognn_jax.cli.main`)."""

from __future__ import annotations

import signal
import sys


def main() -> int:
    arrived = []

    def stop(signum, frame):
        arrived.append(signum)
        raise KeyboardInterrupt

    def unraisable(report):
        if not isinstance(report.exc_value, KeyboardInterrupt):
            hook(report)

    # A KeyboardInterrupt raised inside a callback the import runs (JAX's garbage
    # collection hook) is handed to `sys.unraisablehook`, whose default prints it with a
    # traceback, and dropped, and the import goes on: that report is kept quiet, and the
    # signal, recorded, ends the command all the same. A SIGINT the process ignores (a
    # job a script starts with `&`) stays ignored.
    previous, hook = signal.getsignal(signal.SIGINT), sys.unraisablehook
    if previous is not signal.SIG_IGN:
        signal.signal(signal.SIGINT, stop)
        sys.unraisablehook = unraisable
    try:
        from zerognn_jax.cli import main as run
    except KeyboardInterrupt:
        arrived.append(signal.SIGINT)
    finally:
        signal.signal(signal.SIGINT, previous)
        sys.unraisablehook = hook
    if arrived:
        print("zerognn: interrupted while starting", file=sys.stderr)
        return 130
    code = run()
    from zerognn_jax._src.training.interrupts import exit_on_signal  # (imported by run)

    exit_on_signal(code)  # the work done: a signal while the process exits keeps the code
    return code
