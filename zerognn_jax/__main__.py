"""`python -m zerognn_jax ...`: the `zerognn` command."""

from zerognn_jax.cli import main

raise SystemExit(main())
