"""The `zerognn` command's entry point, outside the `zerognn_jax` package: importing the
package (JAX, Flax, orbax) takes a second or two, and a Ctrl-C in that time would
otherwise end in a traceback instead of the command line's one line and exit code 130
(`zerognn_jax.cli.main`)."""

from __future__ import annotations

import sys


def main() -> int:
    try:
        from zerognn_jax.cli import main as run
    except KeyboardInterrupt:
        print("zerognn: interrupted while starting", file=sys.stderr)
        return 130
    return run()
