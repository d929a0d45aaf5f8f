"""The package's version (pyproject.toml's), which checkpoints record beside JAX's."""

VERSION = "0.1.0"
