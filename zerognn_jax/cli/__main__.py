"""`python -m zerognn_jax.cli ...`, the same as the `zerognn` command."""

import sys

from zerognn_jax.cli import main

sys.exit(main())
