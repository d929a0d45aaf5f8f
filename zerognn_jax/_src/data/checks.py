"""Checks of the plain numbers a user passes (batch sizes, counts, seeds), worded alike
wherever they are taken, and the class of the library's warnings that no other names."""

from __future__ import annotations

import numbers

import jax
import numpy as np


class LibraryWarning(UserWarning):
    """A warning of the library's that no more particular class names (the command
    line prints the library's warnings, found by their classes' module, as `zerognn:
    warning: ...` with options spelled as its flags)."""

def is_int(value) -> bool:
    """Whether `value` is an integer (Python's or NumPy's), a bool not counted as one."""
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def is_count(value) -> bool:
    """Whether `value` is an integer (`is_int`) or a 0-d integer array (NumPy's or
    JAX's), as a count held in a dataclass field may be."""
    return is_int(_unwrapped(value))


def is_whole(value) -> bool:
    """Whether `value` is a whole number: an integer, or a real number of integral value
    (3.0, a 0-d array of one); a bool, a string or a non-finite float is not."""
    if getattr(value, "ndim", None) == 0:
        value = np.asarray(value).item()
    return (isinstance(value, numbers.Real) and not isinstance(value, bool)
            and float(value).is_integer())


def at_least_one(value, name: str) -> int:
    """`value` as an int; ValueError naming `name` and the value unless it is an integer
    >= 1 (2.5, True, "64" and 0 are refused)."""
    if not is_int(value) or value < 1:
        raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
    return int(value)


def _unwrapped(given):
    """`given` as it is, or as a Python int where it is a 0-d integer array (NumPy's or
    JAX's): what the seed and count checks compare."""
    if getattr(given, "ndim", None) != 0 or _is_key(given):  # (a key converts to no number)
        return given
    value = np.asarray(given)
    if np.issubdtype(value.dtype, np.integer):
        return int(value)
    return given


def check_seed(seed) -> int:
    """`seed` as an int; ValueError naming it unless it is an integer >= 0 (a NumPy
    integer or a 0-d integer array too; NumPy's own refusal names neither the argument
    nor the value)."""
    value = _unwrapped(seed)
    if not is_int(value) or value < 0:
        raise ValueError(f"seed must be an integer >= 0, got {seed!r}")
    return int(value)


def key_seed(seed) -> int:
    """`seed` as an int; ValueError naming it unless it is an integer in [0, 2**32) (a
    sampling key's seed: a uint32; NumPy integers as `check_seed` takes them)."""
    value = _unwrapped(seed)
    if not is_int(value) or not 0 <= value < 2**32:
        got = f"a PRNG key ({seed.dtype}): this takes the integer keys are made from" \
            if _is_key(seed) else repr(seed)
        raise ValueError(f"seed must be an integer in [0, 2**32), got {got}")
    return int(value)


def _is_key(value) -> bool:
    """Whether `value` is a JAX array of typed PRNG keys (`jax.random.key`)."""
    dtype = getattr(value, "dtype", None)
    return dtype is not None and jax.dtypes.issubdtype(dtype, jax.dtypes.prng_key)


def arrays_not_lists(record, fields, maker: str) -> None:
    """ValueError naming the first of `fields` of `record` (a dataclass a user may build
    by hand) that is a list or tuple, where the class wants an array; `maker` is the
    constructor that takes lists."""
    for what in fields:
        value = getattr(record, what)
        if isinstance(value, list | tuple):
            raise ValueError(f"{what} must be an array, got a {type(value).__name__} "
                             f"({maker} takes lists and other array-likes)")


def node_ids(name: str, ids, n: int, kind: str = "") -> np.ndarray:
    """int32[len(ids)]: `ids` (a list, a NumPy or JAX array) as node ids; ValueError
    naming `name` unless they are 1-D integers (`id_array`) in [0, n) (`check_ids`)."""
    ids = id_array(name, ids)
    check_ids(name, ids, n, kind)
    return ids.astype(np.int32)


def rectangular(name: str, values) -> np.ndarray:
    """`np.asarray(values)`; ValueError naming `name` where they are nested sequences of
    different lengths (NumPy's "inhomogeneous shape" named neither)."""
    try:
        return np.asarray(values)
    except ValueError as err:
        if "inhomogeneous" not in str(err):
            raise
        lengths = sorted({len(v) for v in values if hasattr(v, "__len__")})
        why = f"its rows have different lengths ({', '.join(map(str, lengths))})" \
            if len(lengths) > 1 else "it mixes numbers and sequences"
        raise ValueError(f"{name} must be a rectangular array: {why}") from None


def id_array(name: str, ids) -> np.ndarray:
    """`ids` (a list, a NumPy or JAX array) as a NumPy array of their integer dtype;
    ValueError naming `name` unless they are 1-D integers (`require_ids`). An empty
    list, which NumPy reads as float64, holds no id of any type: int64[0]. A value that
    is no array at all (None, a dataset given where its ids were meant) is named by its
    type, where NumPy would make it a 0-d object array."""
    if ids is None or not (hasattr(ids, "__array__") or hasattr(ids, "__len__")):
        what = "None" if ids is None else f"a value of type {type(ids).__name__}"
        raise ValueError(f"{name} must be a 1-D integer array of ids, got {what}")
    ids = rectangular(name, ids)
    if ids.shape == (0,):
        ids = ids.astype(np.int64)
    require_ids(name, ids)
    return ids


def require_ids(name: str, ids: np.ndarray, *, nonempty: bool = False) -> None:
    """ValueError naming `name`, the dtype and the shape unless `ids` is a 1-D integer
    array (with an id, where `nonempty`). A boolean mask (PyG's `train_mask`) is refused
    like any other non-integer array, not read as ids, and the message says how to get
    its ids: the datasets' splits, the loaders' and `predict`'s nodes are checked here."""
    if ids.ndim == 1 and np.issubdtype(ids.dtype, np.integer) and (ids.size or not nonempty):
        return
    if nonempty and ids.shape == (0,):  # (an empty list reads as float64[0])
        raise ValueError(f"{name} must be a non-empty 1-D integer array, got none (an empty "
                         f"array)")
    mask = "; a boolean mask? pass np.flatnonzero(mask)" if ids.dtype == np.bool_ else ""
    raise ValueError(f"{name} must be a {'non-empty ' if nonempty else ''}1-D integer "
                     f"array, got {ids.dtype}{list(ids.shape)}{mask}")


def check_ids(name: str, ids, n: int, kind: str = "") -> None:
    """ValueError unless every id in `ids` lies in [0, n), naming `name`, the range (with
    `kind`, e.g. " ('paper' ids)"), the span of the ids found and how many lie outside
    it (the first few of them)."""
    ids = np.asarray(ids)
    if ids.size and (ids.min() < 0 or ids.max() >= n):
        outside = ids[(ids < 0) | (ids >= n)]
        first = ", ".join(map(str, outside[:3])) + (", ..." if outside.size > 3 else "")
        raise ValueError(f"{name} must lie in [0, {n}){kind}, found [{ids.min()}, "
                         f"{ids.max()}]: {outside.size:,} outside it ({first})")
