"""Checks a config dataclass's values against their annotations when it is built.

Ints are ints (not 64.0, "64" or True), floats are real numbers (an int is fine: 1 for
1.0), booleans are booleans, strings are strings (a path object becomes its text),
`tuple[int, ...]` takes a tuple or a list of ints (never a string: "15" is not (1, 5)),
`dict[K, V]` a dict whose keys fit K and values fit V, and `X | None` takes None too.
Nothing is parsed from a string here; the options whose strings are specs say so
(`TrainConfig.kernels`). Each error is one line naming the field and the value.
"""

from __future__ import annotations

import dataclasses
import numbers
import os
import types
import typing

import numpy as np

_MISSING = object()


class ConfigTypeError(TypeError, ValueError):
    """A config value of the wrong type (a ValueError too: the CLI reports it as one)."""


def describe(hint) -> str:
    """How a type annotation reads in an error message."""
    if _is_union(hint):
        return " or ".join(describe(arg) for arg in typing.get_args(hint))
    if hint is type(None):
        return "None"
    if typing.get_origin(hint) is tuple:
        return f"a tuple or list of {typing.get_args(hint)[0].__name__}s"
    if typing.get_origin(hint) is dict:
        return f"a dict of {' to '.join(describe(a) for a in typing.get_args(hint))}"
    return {int: "an int", float: "a number", bool: "a bool", str: "a str"}.get(
        hint, getattr(hint, "__name__", str(hint)))


def _is_union(hint) -> bool:
    return typing.get_origin(hint) in (typing.Union, types.UnionType)


def conform(hint, value):
    """`value` as the annotation `hint` takes it (a list becomes a tuple, a NumPy int
    an int), or `_MISSING` when it does not fit."""
    if _is_union(hint):
        for arg in typing.get_args(hint):
            got = conform(arg, value)
            if got is not _MISSING:
                return got
        return _MISSING
    if hint is type(None):
        return value if value is None else _MISSING
    if hint is bool:
        return bool(value) if isinstance(value, bool | np.bool_) else _MISSING
    if hint is int:
        integral = isinstance(value, numbers.Integral) and not isinstance(value, bool)
        return (value if type(value) is int else int(value)) if integral else _MISSING
    if hint is float:
        real = isinstance(value, numbers.Real) and not isinstance(value, bool | np.bool_)
        return float(value) if real else _MISSING
    if hint is str:  # a path may come as a pathlib.Path: the config keeps its text
        value = os.fspath(value) if isinstance(value, os.PathLike) else value
        return value if isinstance(value, str) else _MISSING
    if typing.get_origin(hint) is dict:
        if not isinstance(value, dict):
            return _MISSING
        key_hint, value_hint = typing.get_args(hint)
        items = {conform(key_hint, k): conform(value_hint, v) for k, v in value.items()}
        return _MISSING if _MISSING in items or _MISSING in items.values() else items
    if typing.get_origin(hint) is tuple:
        if not isinstance(value, tuple | list):
            return _MISSING
        items = [conform(typing.get_args(hint)[0], v) for v in value]
        return _MISSING if any(i is _MISSING for i in items) else tuple(items)
    raise TypeError(f"no type check for the annotation {hint!r}")


def check_types(config) -> None:
    """Raises ConfigTypeError for the first field of the frozen dataclass `config` whose
    value does not fit its annotation; stores the conformed values (tuples, ints)."""
    hints = typing.get_type_hints(type(config))
    for field in dataclasses.fields(config):
        value = getattr(config, field.name)
        got = conform(hints[field.name], value)
        if got is _MISSING:
            raise ConfigTypeError(
                f"{type(config).__name__}.{field.name} must be "
                f"{describe(hints[field.name])}, got {value!r} ({type(value).__name__})")
        if got is not value:
            object.__setattr__(config, field.name, got)
