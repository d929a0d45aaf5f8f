"""Float tables checked the same way: node features [N, d] and edge features [E, D].

Both are stored as float32 or bfloat16 (kept as given: half the host and device bytes)
and must be finite. A table may be a memory-mapped file of many GB, so finiteness is
checked in row blocks: the file is read once and no temporary of the table's size is made.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

BFLOAT16 = np.dtype(jnp.bfloat16)  # ml_dtypes' bfloat16, as NumPy sees it
FINITE_BLOCK = 1 << 24  # entries checked at a time (64 MB of float32)


def check_finite_rows(name: str, table: np.ndarray, block: int = FINITE_BLOCK) -> None:
    """Raises ValueError "<name> contain NaN or inf (...)" with the count and the first
    (row, column), unless every entry of the 2-D `table` is finite (as float32 where the
    table is wider: the device holds float32 or narrower). Reads `block` entries at a
    time."""
    wide = table.dtype.itemsize > 4
    step = max(1, block // max(1, table.shape[1]))
    count, first = 0, None
    for start in range(0, table.shape[0], step):
        block = np.asarray(table[start:start + step])
        with np.errstate(over="ignore"):
            bad = ~np.isfinite(block.astype(np.float32) if wide or block.dtype == BFLOAT16
                               else block)
        if bad.any():
            count += int(bad.sum())
            if first is None:
                row, col = np.argwhere(bad)[0]
                first = (start + int(row), int(col))
    if count:
        raise ValueError(
            f"{name} contain NaN or inf ({count} entries; first at row {first[0]}, "
            f"column {first[1]}{'; as float32' if wide else ''})"
        )


def edge_feature_table(values, num_edges: int, *, check: bool = True) -> np.ndarray:
    """`values` as an edge-feature table [num_edges, D]: bfloat16 kept as given, any
    other numeric dtype made float32 (no copy where it already is); checked by
    `check_edge_features` unless `check` is False.

    Raises:
      ValueError: not numeric (bool and object included), or what
        `check_edge_features` refuses.
    """
    table = np.asarray(values)
    if table.dtype != BFLOAT16:
        if not np.issubdtype(table.dtype, np.number) or table.dtype == np.bool_:
            raise ValueError(f"edge_features must be numeric, got {table.dtype}")
        with np.errstate(over="ignore"):  # past float32's range: inf, refused below
            table = np.asarray(table, np.float32)
    if check:
        check_edge_features(table, num_edges)
    return table


def check_edge_features(table, num_edges: int) -> None:
    """Raises ValueError naming the problem unless `table` is a finite float32 or
    bfloat16 array [num_edges, D], D >= 1."""
    if not hasattr(table, "shape"):  # a list; arrays (memory-mapped too) stay as they are
        table = np.asarray(table)
    if table.ndim != 2:
        raise ValueError(f"edge_features must be 2-D [E, D], got shape {tuple(table.shape)}")
    if table.shape[0] != num_edges:
        raise ValueError(f"edge_features have {table.shape[0]} rows but the graph has "
                         f"{num_edges} edges")
    if table.shape[1] < 1:
        raise ValueError(f"edge_features need at least one column, got shape "
                         f"{tuple(table.shape)}")
    if np.dtype(table.dtype) not in (np.dtype(np.float32), BFLOAT16):
        raise ValueError(f"edge_features must be float32 or bfloat16, got {table.dtype}")
    check_finite_rows("edge_features", table)


def node_feature_table(what: str, values, rows: int) -> np.ndarray:
    """`values` as a finite node-feature table [rows, d], d >= 1: bfloat16 kept as given,
    any other numeric dtype made float32 (no copy where it already is); ValueError
    "<what> ..." naming the problem otherwise."""
    table = values if isinstance(values, np.ndarray) else np.asarray(values)
    if table.dtype != BFLOAT16:
        if not np.issubdtype(table.dtype, np.number) or table.dtype == np.bool_:
            raise ValueError(f"{what} must be numeric, got {table.dtype}")
        with np.errstate(over="ignore"):  # past float32's range: inf, refused below
            table = np.asarray(table, np.float32)
    if table.ndim != 2 or table.shape[1] < 1:
        raise ValueError(f"{what} must be 2-D [N, d] with d >= 1, got shape {table.shape}")
    if table.shape[0] != rows:
        raise ValueError(f"{what} have {table.shape[0]} rows, expected {rows}")
    check_finite_rows(what, table)
    return table
