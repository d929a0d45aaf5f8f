"""Checks of the plain numbers a user passes (batch sizes, counts, seeds), worded alike
wherever they are taken."""

from __future__ import annotations

import numbers


def is_int(value) -> bool:
    """Whether `value` is an integer (Python's or NumPy's), a bool not counted as one."""
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def at_least_one(value, name: str) -> int:
    """`value` as an int; ValueError naming `name` and the value unless it is an integer
    >= 1 (2.5, True, "64" and 0 are refused)."""
    if not is_int(value) or value < 1:
        raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
    return int(value)
