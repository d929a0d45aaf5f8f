"""`python -m zerognn_jax ...`: the `zerognn` command."""

from zerognn_jax._src.training.interrupts import exit_on_signal
from zerognn_jax.cli import main

code = main()
exit_on_signal(code)  # the work done: a signal while the process exits keeps the code
raise SystemExit(code)
