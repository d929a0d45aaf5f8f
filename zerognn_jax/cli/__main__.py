"""`python -m zerognn_jax.cli ...`, the same as the `zerognn` command."""

import sys

from zerognn_jax._src.training.interrupts import exit_on_signal
from zerognn_jax.cli import main

code = main()
exit_on_signal(code)  # the work done: a signal while the process exits keeps the code
sys.exit(code)
