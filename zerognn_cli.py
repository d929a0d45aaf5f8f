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

    # A KeyboardInterrupt raised inside a callback the import runs (JAX's garbage
    # collection hook) is printed and dropped by Python, and the import goes on: the
    # signal is recorded as well, so that it ends the command all the same. A SIGINT
    # the process ignores (a job a script starts with `&`) stays ignored.
    previous = signal.getsignal(signal.SIGINT)
    if previous is not signal.SIG_IGN:
        signal.signal(signal.SIGINT, stop)
    try:
        from zerognn_jax.cli import main as run
    except KeyboardInterrupt:
        arrived.append(signal.SIGINT)
    finally:
        signal.signal(signal.SIGINT, previous)
    if arrived:
        print("zerognn: interrupted while starting", file=sys.stderr)
        return 130
    return run()
