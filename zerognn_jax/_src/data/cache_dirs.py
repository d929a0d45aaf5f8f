"""Where the library keeps what it can fetch or build again: one folder per kind under
the user's cache folder, as the XDG base directory rules place it."""

from __future__ import annotations

import os
from pathlib import Path


def cache_dir(kind: str) -> Path:
    """`$XDG_CACHE_HOME/zerognn-jax/<kind>`, or `~/.cache/zerognn-jax/<kind>` where the
    variable is unset, empty or a relative path (which the rules say to ignore)."""
    base = os.environ.get("XDG_CACHE_HOME", "")
    if not os.path.isabs(base):
        base = os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "zerognn-jax" / kind
