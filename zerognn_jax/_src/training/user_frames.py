"""Where a library warning points: at the user's line, not the library's."""

from __future__ import annotations

import os
import sys

# The package's folder: a warning points at the first frame outside it.
_PACKAGE = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def user_stacklevel() -> int:
    """The `stacklevel` at which a warning issued by this function's caller names the
    first frame outside the package (the user's call of `train`, `restore`, ...), however
    deep the library's frames: Python shows a warning once per place, and a place inside
    the library would show it once per process, not once per line of the user's."""
    frame, level = sys._getframe(1), 1
    while frame is not None and frame.f_code.co_filename.startswith(_PACKAGE + os.sep):
        frame, level = frame.f_back, level + 1
    return level
