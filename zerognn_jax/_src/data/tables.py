"""Float tables checked the same way: node features [N, d] and edge features [E, D].

Both are stored as float32 or bfloat16 (kept as given: half the host and device bytes)
and must be finite. A table may be a memory-mapped file of many GB, so finiteness is
checked in row blocks (on several threads, `host_parallel.thread_map`; bfloat16 as its
bits, cheaper than a cast): the file is read once and no temporary of the table's size
is made.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from zerognn_jax._src.data.host_parallel import host_threads, thread_map

BFLOAT16 = np.dtype(jnp.bfloat16)  # ml_dtypes' bfloat16, as NumPy sees it
FINITE_BLOCK = 1 << 24  # entries checked at a time (64 MB of float32)


def check_finite_rows(name: str, table: np.ndarray, block: int = FINITE_BLOCK,
                      threads: int | None = None) -> None:
    """Raises ValueError "<name> contain NaN or inf (...)" with the count and the first
    (row, column), unless every entry of the 2-D `table` is finite (as float32 where the
    table is wider: the device holds float32 or narrower; a finite entry past float32's
    range is named as an overflow, with its value). Reads `block` entries at a time, on
    `threads` threads (default `host_threads()`)."""
    step = max(1, block // max(1, table.shape[1]))
    threads = host_threads() if threads is None else threads
    found = thread_map(lambda i: _nonfinite(table[i * step:(i + 1) * step], i * step),
                       -(-table.shape[0] // step), threads)
    found = [f for f in found if f is not None]
    if found:
        count, (row, col), value = sum(c for c, _, _ in found), found[0][1], found[0][2]
        if value is not None:
            top = float(np.finfo(np.float32).max)
            raise ValueError(f"{name} overflow float32: {value} at row {row}, column {col} "
                             f"is past its largest magnitude ({top:g})")
        raise ValueError(
            f"{name} contain NaN or inf ({count} entries; first at row {row}, column {col})"
        )


def _nonfinite(rows, start: int) -> tuple[int, tuple[int, int], np.generic | None] | None:
    """(count, first (row, column) counted from `start`, its value where it is finite as
    given, else None) of the entries of the 2-D block `rows` that are not finite as
    float32, or None. bfloat16 is read as its bits: all exponent bits set."""
    rows = np.asarray(rows)
    if rows.dtype == BFLOAT16:
        bits = rows.view(np.uint16) & np.uint16(0x7FFF)
        if bits.size == 0 or bits.max() < 0x7F80:
            return None
        bad = bits >= 0x7F80
    else:
        with np.errstate(over="ignore"):
            bad = ~np.isfinite(rows.astype(np.float32) if rows.dtype.itemsize > 4 else rows)
        if not bad.any():
            return None
    row, col = np.argwhere(bad)[0]
    value = rows[row, col]
    return int(bad.sum()), (start + int(row), int(col)), value if np.isfinite(value) else None


def check_weights(weights: np.ndarray) -> None:
    """ValueError naming the first edge whose weight float32 cannot hold: NaN or
    infinite ("weights contain NaN or inf (2 entries; first at edge 3)"), or finite as
    given but past float32's range, which the cast would make infinite (named with its
    value); or weights that are not real numbers; or a negative weight, which no draw
    can take (a graph's weights are the weighted sampler's: a negative one was refused
    only once a run sampled by them)."""
    if weights.dtype not in (BFLOAT16, np.bool_):  # (bools are weights 0 and 1)
        require_real("weights", weights)
    found = _nonfinite(weights.reshape(-1, 1), 0)
    if found is None:
        negative = np.flatnonzero(weights < 0)
        if negative.size:
            edge = int(negative[0])
            raise ValueError(f"weights must be non-negative (the weighted sampler draws "
                             f"each edge in proportion to its weight): {weights[edge]} at "
                             f"edge {edge} ({negative.size} negative in all)")
        return
    count, (edge, _), value = found
    if value is not None:
        raise ValueError(f"weights overflow float32: {value} at edge {edge} is past its "
                         f"largest magnitude ({float(np.finfo(np.float32).max):g})")
    raise ValueError(f"weights contain NaN or inf ({count} entries; first at edge {edge})")


def edge_feature_table(values, num_edges: int, *, check: bool = True) -> np.ndarray:
    """`values` as an edge-feature table [num_edges, D]: bfloat16 kept as given, any
    other real dtype made float32 (no copy where it already is); unless `check` is
    False, its shape and finiteness are checked as `check_edge_features` does, before
    the cast (a finite value past float32's range is named as an overflow).

    Raises:
      ValueError: not real numbers (bool, complex and object included), or what
        `check_edge_features` refuses.
    """
    table = np.asarray(values)
    if table.dtype != BFLOAT16:
        require_real("edge_features", table)
    if check:
        _check_edge_shape(table, num_edges)
        check_finite_rows("edge_features", table)
    if table.dtype == BFLOAT16:
        return table
    with np.errstate(over="ignore"):  # past float32's range: inf, where unchecked
        return np.asarray(table, np.float32)


def check_edge_features(table, num_edges: int) -> None:
    """Raises ValueError naming the problem unless `table` is a finite float32 or
    bfloat16 array [num_edges, D], D >= 1."""
    if not hasattr(table, "shape"):  # a list; arrays (memory-mapped too) stay as they are
        table = np.asarray(table)
    _check_edge_shape(table, num_edges)
    if np.dtype(table.dtype) not in (np.dtype(np.float32), BFLOAT16):
        raise ValueError(f"edge_features must be float32 or bfloat16, got {table.dtype}")
    check_finite_rows("edge_features", table)


def _check_edge_shape(table, num_edges: int) -> None:
    """Raises ValueError naming the problem unless `table` is [num_edges, D], D >= 1."""
    if table.ndim != 2:
        raise ValueError(f"edge_features must be 2-D [E, D], got shape {tuple(table.shape)}")
    if table.shape[0] != num_edges:
        raise ValueError(f"edge_features have {table.shape[0]} rows but the graph has "
                         f"{num_edges} edges")
    if table.shape[1] < 1:
        raise ValueError(f"edge_features need at least one column, got shape "
                         f"{tuple(table.shape)}")


def narrow_to_float32(what: str, table: np.ndarray, *, copy: bool = False,
                      missing: bool = False) -> np.ndarray:
    """The real-valued `table` as float32 (`copy`: always a new array). A wider 2-D float
    table is checked first, so that a finite value past float32's range is named as such,
    not as the inf the cast makes of it; with `missing` (NaN marks a missing entry) only
    such a value is refused there, NaN and inf left to the caller's checks."""
    if np.issubdtype(table.dtype, np.floating) and table.dtype.itemsize > 4 \
            and table.ndim == 2:
        check_finite_rows(what, np.where(np.isfinite(table), table, 0.0) if missing
                          else table)
    with np.errstate(over="ignore"):  # past float32's range: inf, refused where checked
        if copy:
            return table.astype(np.float32)
        return np.ascontiguousarray(table, dtype=np.float32)


def require_real(what: str, table: np.ndarray) -> None:
    """ValueError "<what> must be real numbers" unless `table` holds ints, floats or
    bfloat16 (bool, complex, strings and objects are refused: a cast to float32 would
    drop or garble them)."""
    if table.dtype == BFLOAT16:
        return
    if (not np.issubdtype(table.dtype, np.number) or table.dtype == np.bool_
            or np.issubdtype(table.dtype, np.complexfloating)):
        raise ValueError(f"{what} must be real numbers, got {table.dtype}")


def node_feature_table(what: str, values, rows: int) -> np.ndarray:
    """`values` as a finite node-feature table [rows, d], d >= 1: bfloat16 kept as given,
    any other real dtype made float32 (no copy where it already is); ValueError
    "<what> ..." naming the problem otherwise."""
    table = values if isinstance(values, np.ndarray) else np.asarray(values)
    if table.dtype != BFLOAT16:
        require_real(what, table)
    if table.ndim != 2 or table.shape[1] < 1:
        raise ValueError(f"{what} must be 2-D [N, d] with d >= 1, got shape {table.shape}")
    if table.shape[0] != rows:
        raise ValueError(f"{what} have {table.shape[0]} rows, expected {rows}")
    check_finite_rows(what, table)  # as given: a value past float32's range is named
    return table if table.dtype == BFLOAT16 else np.asarray(table, np.float32)
