"""Compressed sparse row graphs: built on the host with NumPy, moved to the device once.

Ids. Node ids are int32 everywhere: 2**31 nodes is far beyond the largest graph that fits
one GPU (ogbn-papers100M has 111M nodes).

Offsets. `indptr` is int32 while the graph has fewer than 2**31 directed edges and
uint32 up to 2**32 - 1 (ogbn-papers100M stores 3.23B), in JAX's default 32-bit mode;
only beyond that is it int64, which needs `jax_enable_x64`. uint32 costs what int32
costs (one 4-byte read per offset, no second array as a (high, low) split or per-block
bases would need) and keeps every existing int32 graph and file as it is. Its three
hazards are handled where offsets are read: a degree is a difference of non-decreasing
offsets (never negative, so exact in uint32), and an edge id is built by `edge_ids`,
which adds an int32 offset within the row in the offsets' own dtype (uint32 + int32
would promote to int64 and, without x64, come back as a wrapped int32). Edge arrays are
read with `take_edges`, a gather that takes uint32 ids as they are (NumPy-style
indexing of an array past 2**31 entries would narrow them to int32); the Pallas Triton lowering
zero-extends them and indexes arrays above 4 GiB with 64-bit offsets.
Host-side construction works in NumPy int64 and narrows at the end.
"""

from __future__ import annotations

import operator
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from zerognn_jax._src.data.checks import rectangular
from zerognn_jax._src.data.host_parallel import host_threads, merge_sorted, thread_map
from zerognn_jax._src.data.optional import need
from zerognn_jax._src.data.tables import check_edge_features, check_weights, edge_feature_table

_INT32_MAX = np.iinfo(np.int32).max
_UINT32_MAX = np.iinfo(np.uint32).max
_KEY_CHUNK = 1 << 22  # edges whose keys one thread sorts at a time (`_key_csr`)
_FEW_EDGES = 1 << 16  # fewer bare edges in one chunk are built on the calling thread


class CSRGraph(NamedTuple):
    """A directed graph in CSR form; row `v` lists the neighbours that `v` samples from.

    The arrays are NumPy while the graph is built and stored, JAX arrays after
    `to_device()`; every function that reads a graph accepts either.

    Attributes:
      indptr: int32[N + 1] (uint32 from 2**31 edges, see `offset_dtype`), row
        offsets, indptr[0] = 0.
      indices: int32[E], neighbour ids of each row, rows concatenated.
      weights: float32[E] or None, optional per-edge weights.
      edge_features: float32[E, D] or bfloat16[E, D], or None: row i describes the
        edge at CSR position i (`indices[i]`), so a sampled edge id reads its row
        (`take_edge_rows`). None adds no leaf to the pytree: a graph without edge
        features moves, traces and compiles exactly as before the field existed.
    """

    indptr: jax.Array
    indices: jax.Array
    weights: jax.Array | None = None
    edge_features: jax.Array | None = None

    @property
    def num_nodes(self) -> int:
        return self.indptr.shape[0] - 1

    @property
    def num_edges(self) -> int:
        return self.indices.shape[0]

    def degrees(self) -> jax.Array:
        """int32[N]: out-degree of every node (the number of neighbours it can sample)."""
        return (self.indptr[1:] - self.indptr[:-1]).astype(jnp.int32)

    def max_degree(self) -> int:
        """Largest row length, read on the host (call outside jitted code)."""
        return int(np.max(np.diff(np.asarray(self.indptr)), initial=0))

    def to_device(self, device=None) -> CSRGraph:
        """The same graph with its arrays on `device` (default: JAX's default device)."""
        return jax.device_put(self, device)


def _as_id_array(name: str, values) -> np.ndarray:
    arr = rectangular(name, values)
    if arr.ndim != 1:
        raise ValueError(f"{name} must be one-dimensional, got shape {arr.shape}")
    if arr.size and not np.issubdtype(arr.dtype, np.integer):
        if np.issubdtype(arr.dtype, np.floating) and np.all(np.mod(arr, 1) == 0):
            raise TypeError(
                f"{name} must have an integer dtype, got {arr.dtype} "
                "(cast explicitly if the values are whole numbers)"
            )
        raise TypeError(f"{name} must have an integer dtype, got {arr.dtype}")
    # signed ids are used as given (every later use widens them exactly); others: int64,
    # which would wrap an unsigned id past its range into a negative one
    if arr.dtype.kind == "u" and arr.size and int(arr.max()) > np.iinfo(np.int64).max:
        raise ValueError(f"{name} has node id {int(arr.max())} at position "
                         f"{int(np.argmax(arr))}, past any graph's node count")
    return arr if arr.dtype.kind == "i" else arr.astype(np.int64)


def _check_ids(name: str, ids: np.ndarray, num_nodes: int | None,
               count: str | None = None, least: int | None = None) -> None:
    """ValueError naming `name`, the first smallest or largest id and its position unless
    every id lies in [0, num_nodes) (None: no upper bound); for an id past the end,
    `count` names the argument to pass larger, with the least value that holds every id
    it bounds (`least`; default: those of `ids`)."""
    if ids.size == 0:
        return
    lo, hi = int(ids.min()), int(ids.max())
    if lo < 0:
        pos = int(np.argmin(ids))
        raise ValueError(f"{name} has a negative node id {lo} at position {pos}")
    if num_nodes is not None and hi >= num_nodes:
        pos = int(np.argmax(ids))
        fix = "" if count is None else f"; pass {count}={least or hi + 1} or more"
        raise ValueError(f"{name} has node id {hi} at position {pos}, out of range for "
                         f"{count or 'num_nodes'}={num_nodes}{fix}")


def _integer(name: str, value) -> int:
    """`value` as an int: an integer, NumPy's or JAX's included (TypeError naming `name`
    for a float, a bool, a string: 2.9 nodes was read as 2)."""
    try:
        if isinstance(value, bool | np.bool_):
            raise TypeError
        return operator.index(value)
    except TypeError:
        raise TypeError(f"{name} must be an integer, got {type(value).__name__} "
                        f"{value!r}") from None


def from_edge_list(
    src,
    dst,
    num_nodes: int | None = None,
    *,
    weights=None,
    edge_features=None,
    make_undirected: bool = False,
    remove_self_loops: bool = False,
    remove_duplicates: bool = False,
    sort_neighbors: bool = True,
    num_columns: int | None = None,
) -> CSRGraph:
    """Builds a host-side CSRGraph from edges `src[i] -> dst[i]`.

    Row `src[i]` gets neighbour `dst[i]`. `make_undirected` adds the reverse of every
    edge but a self-loop, which is its own reverse (after all given edges, with the same
    weight and `edge_features` row);
    `remove_duplicates` keeps one copy of each (src, dst) pair, the first in that order
    (a given edge before any reverse copy), with its weight and features;
    `sort_neighbors` orders each row by neighbour id. `edge_features` ([E, D], row i
    for edge i) follow their edges through every step (`edge_feature_table`). Inputs may
    be NumPy or JAX arrays. `num_columns` bounds the neighbour ids `dst` (default
    `num_nodes`): the rows and neighbours of a bipartite relation (`hetero.py`) are
    nodes of two types.

    Edges without weights or features whose rows come out sorted (`sort_neighbors` or
    `remove_duplicates`) are built from their sorted keys (`_key_csr`), on threads when
    there are many; the others by a stable argsort of the keys. Both give the same
    arrays: a bare edge is its key, so equal keys have nothing an order could tell apart.
    """
    src = _as_id_array("src", src)
    dst = _as_id_array("dst", dst)
    if src.shape != dst.shape:
        raise ValueError(f"src and dst differ in length: {src.shape[0]} vs {dst.shape[0]}")
    if num_nodes is None:
        num_nodes = int(max(src.max(initial=-1), dst.max(initial=-1))) + 1
    num_nodes = _integer("num_nodes", num_nodes)
    if num_nodes < 0 or num_nodes > _INT32_MAX:
        raise ValueError(f"num_nodes must be in [0, 2**31 - 1], got {num_nodes}")
    columns = num_nodes if num_columns is None else _integer("num_columns", num_columns)
    if columns != num_nodes and make_undirected:
        raise ValueError(f"make_undirected needs one node set; rows have {num_nodes} nodes, "
                         f"neighbours {columns}")
    _check_ids("src", src, num_nodes)
    _check_ids("dst", dst, columns, None if num_columns is None else "num_columns")
    w = None
    if weights is not None:
        w = np.asarray(weights)
        if w.shape != src.shape:
            raise ValueError(f"weights has shape {w.shape}, expected ({src.shape[0]},)")
        check_weights(w)  # as given: a value past float32's range is named
        w = w.astype(np.float32)
    f = None if edge_features is None else edge_feature_table(edge_features, src.shape[0])
    if w is None and f is None and (sort_neighbors or remove_duplicates):
        indptr, indices = _key_csr(src, dst, num_nodes, columns, undirected=make_undirected,
                                   drop_loops=remove_self_loops, distinct=remove_duplicates)
        return csr_from_arrays(indptr, indices, num_columns=columns)
    src, dst = src.astype(np.int64, copy=False), dst.astype(np.int64, copy=False)
    if make_undirected:
        turn = np.flatnonzero(src != dst)  # a self-loop is its own reverse
        src, dst = np.concatenate([src, dst[turn]]), np.concatenate([dst, src[turn]])
        w = None if w is None else np.concatenate([w, w[turn]])
        f = None if f is None else np.concatenate([f, f[turn]])
    if remove_self_loops:
        keep = src != dst
        src, dst = src[keep], dst[keep]
        w = None if w is None else w[keep]
        f = None if f is None else f[keep]
    key = src * np.int64(max(columns, 1)) + dst if (sort_neighbors or remove_duplicates) else src
    order = np.argsort(key, kind="stable")
    src, dst, key = src[order], dst[order], key[order]
    w = None if w is None else w[order]
    f = None if f is None else f[order]
    if remove_duplicates and key.size:
        first = np.ones(key.shape, bool)
        first[1:] = key[1:] != key[:-1]
        src, dst = src[first], dst[first]
        w = None if w is None else w[first]
        f = None if f is None else f[first]
    counts = np.bincount(src, minlength=num_nodes)
    indptr = np.zeros(num_nodes + 1, np.int64)
    np.cumsum(counts, out=indptr[1:])
    return csr_from_arrays(indptr, dst, w, edge_features=f, num_columns=columns)


def _key_csr(src: np.ndarray, dst: np.ndarray, num_rows: int, num_columns: int, *,
             undirected: bool, drop_loops: bool,
             distinct: bool) -> tuple[np.ndarray, np.ndarray]:
    """(int64[num_rows + 1] offsets, int32[E'] neighbour ids, rows sorted) of the bare
    edges `src -> dst` (their reverses too when `undirected`, a loop's excepted; loops
    dropped when `drop_loops`; each pair once when `distinct`), from their ascending
    int64 keys src * N_cols + dst.

    Keys are made and sorted `_KEY_CHUNK` edges at a time (a chunk already ascending,
    edges given in CSR order, is not sorted again), then merged by ranges of rows
    (`merge_sorted`), on `host_threads()` threads unless the edges are few. The arrays
    do not depend on the chunk size or the number of threads."""
    width = max(num_columns, 1)
    chunks = -(-src.shape[0] // _KEY_CHUNK)
    threads = 1 if chunks <= 1 and src.shape[0] < _FEW_EDGES else host_threads()

    def chunk_keys(c):
        r = src[c * _KEY_CHUNK:(c + 1) * _KEY_CHUNK].astype(np.int64, copy=False)
        k = dst[c * _KEY_CHUNK:(c + 1) * _KEY_CHUNK].astype(np.int64, copy=False)
        if drop_loops:
            keep = r != k
            r, k = r[keep], k[keep]
        if undirected:
            turn = r != k  # a self-loop is its own reverse
            keys = np.concatenate([r * width + k, k[turn] * width + r[turn]])
        else:
            keys = r * width + k
        if not np.all(keys[1:] >= keys[:-1]):  # edges in CSR order (igbh-like's) skip it
            keys.sort()
        return keys

    ranges = max(1, min(4 * threads, num_rows))
    first = np.arange(ranges + 1, dtype=np.int64) * num_rows // ranges  # first row of each
    pieces = merge_sorted(thread_map(chunk_keys, chunks, threads), first * width,
                          distinct=distinct, threads=threads)

    def piece_csr(i):
        row = pieces[i] // width
        return (np.bincount(row - first[i], minlength=int(first[i + 1] - first[i])),
                (pieces[i] - row * width).astype(np.int32))

    done = thread_map(piece_csr, ranges, threads)
    indptr = np.zeros(num_rows + 1, np.int64)
    np.cumsum(np.concatenate([counts for counts, _ in done]), out=indptr[1:])
    return indptr, np.concatenate([ids for _, ids in done])


def from_edge_index(edge_index, num_nodes: int | None = None, *,
                    flow: str = "source_to_target", **kwargs) -> CSRGraph:
    """A CSRGraph from a PyG-style `edge_index` int[2, E] (NumPy, JAX or torch arrays).

    With PyG's default `flow="source_to_target"`, column i is an edge
    `edge_index[0, i] -> edge_index[1, i]` and messages flow along it, so row
    `edge_index[1, i]` (the target) aggregates from `edge_index[0, i]`; with
    "target_to_source" the other way round. (`from_edge_list(src, dst)` takes the row
    first: row `src[i]` aggregates from `dst[i]`.) Other keywords as `from_edge_list`.

    `num_nodes` defaults to the largest id in `edge_index` + 1 (PyG reads it off `x`):
    nodes without edges whose ids come after it (a last node that is isolated) are
    left out unless `num_nodes` is given. A bad id is named by its row and position
    in `edge_index` as given.
    """
    if flow not in ("source_to_target", "target_to_source"):
        raise ValueError(f"flow must be 'source_to_target' or 'target_to_source', got {flow!r}")
    if "edge_attr" in kwargs:
        raise TypeError("from_edge_index takes PyG's edge_attr as edge_features= (row i "
                        "for column i of edge_index)")
    edge_index = rectangular("edge_index", edge_index)
    if edge_index.ndim != 2 or edge_index.shape[0] != 2:
        raise ValueError(f"edge_index must have shape [2, E], got {list(edge_index.shape)}")
    _check_edge_index(edge_index, 1 if flow == "source_to_target" else 0, num_nodes,
                      kwargs.get("num_columns"))
    source, target = edge_index
    rows, nbrs = (target, source) if flow == "source_to_target" else (source, target)
    return from_edge_list(rows, nbrs, num_nodes, **kwargs)


def _check_edge_index(edge_index: np.ndarray, row_of_rows: int, num_nodes,
                      num_columns) -> None:
    """TypeError or ValueError naming the row of `edge_index` as the user gave it
    (`edge_index[0]`, `edge_index[1]`) that holds a non-integer or out-of-range id, and
    the id's position: `from_edge_list` would name its own `src` and `dst`, which are
    those rows swapped under PyG's default flow. `edge_index[row_of_rows]` holds the
    CSR rows (below `num_nodes`), the other row their neighbours (below `num_columns`,
    default `num_nodes`); a count of None bounds nothing (it is read off the ids)."""
    rows = None if num_nodes is None else _integer("num_nodes", num_nodes)
    columns = rows if num_columns is None else _integer("num_columns", num_columns)
    ids = [_as_id_array(f"edge_index[{i}]", edge_index[i]) for i in (0, 1)]
    # one count bounding both rows (no num_columns) must hold the larger row's ids
    both = None if num_columns is not None else 1 + max(
        (int(a.max()) for a in ids if a.size), default=-1)
    for i in (0, 1):
        count = "num_nodes" if i == row_of_rows or num_columns is None else "num_columns"
        _check_ids(f"edge_index[{i}]", ids[i], rows if i == row_of_rows else columns, count,
                   both)


def validate_csr(indptr, indices, weights=None, edge_features=None, *,
                 num_columns: int | None = None) -> None:
    """Raises TypeError (dtype) or ValueError naming the first problem of CSR arrays.

    Neighbour ids must lie below `num_columns` (default: the number of rows)."""
    indptr, indices = np.asarray(indptr), np.asarray(indices)
    if indptr.ndim != 1 or indptr.shape[0] < 1:
        raise ValueError(f"indptr must be 1-D with at least one entry, got {indptr.shape}")
    if indices.ndim != 1:
        raise ValueError(f"indices must be one-dimensional, got shape {indices.shape}")
    for name, arr in (("indptr", indptr), ("indices", indices)):
        if arr.size and not np.issubdtype(arr.dtype, np.integer):
            raise TypeError(f"{name} must have an integer dtype, got {arr.dtype}")
    if indptr[0] != 0 or indptr[-1] != indices.shape[0]:
        raise ValueError(
            f"indptr must start at 0 and end at len(indices)={indices.shape[0]}, "
            f"got {int(indptr[0])} and {int(indptr[-1])}"
        )
    decreasing = indptr[1:] < indptr[:-1]  # not np.diff: it wraps for unsigned offsets
    if np.any(decreasing):
        raise ValueError(f"indptr decreases at row {int(np.argmax(decreasing))}")
    _check_ids("indices", indices, indptr.shape[0] - 1 if num_columns is None else num_columns)
    if weights is not None:
        w = np.asarray(weights)
        if w.shape != indices.shape:
            raise ValueError(f"weights has shape {w.shape}, expected ({indices.shape[0]},)")
        check_weights(w)
    if edge_features is not None:
        check_edge_features(edge_features, indices.shape[0])


def offset_dtype(num_edges: int) -> np.dtype:
    """The dtype of the row offsets of a graph with `num_edges` directed edges.

    int32 below 2**31, uint32 up to 2**32 - 1, int64 beyond (only with `jax_enable_x64`,
    else ValueError).
    """
    if num_edges <= _INT32_MAX:
        return np.dtype(np.int32)
    if num_edges <= _UINT32_MAX:
        return np.dtype(np.uint32)
    if not jax.config.jax_enable_x64:
        raise ValueError(
            f"the graph has {num_edges:,} directed edges, more than uint32 offsets hold "
            f"({_UINT32_MAX:,}); enable 64-bit offsets with "
            "jax.config.update('jax_enable_x64', True)"
        )
    return np.dtype(np.int64)


def edge_ids(start, offsets):
    """Edge ids `start + offsets` in the dtype of the row offsets `start` (see the module
    docstring): `offsets` are non-negative int32 positions within the rows."""
    return start + offsets.astype(start.dtype)


_TAKE = jax.lax.GatherDimensionNumbers(offset_dims=(), collapsed_slice_dims=(0,),
                                       start_index_map=(0,))


def take_edges(values, ids):
    """`values[ids]` for an edge array [E] and edge ids from `edge_ids`.

    NumPy-style indexing converts ids to int64 once E passes 2**31, which without x64
    comes back as int32: uint32 ids past 2**31 wrap negative and read the wrong entry.
    A gather takes the ids in their own dtype; ids past the end (slots the caller masks)
    read the last entry. Anything but a JAX array (NumPy outside jit) is indexed as it is.
    """
    if not isinstance(values, jax.Array):
        return values[ids]
    return jax.lax.gather(values, ids[..., None], _TAKE, slice_sizes=(1,),
                          mode=jax.lax.GatherScatterMode.CLIP)


def take_edge_rows(table, ids):
    """`table[ids]` for an edge table [E, D] and edge ids of any shape from `edge_ids`
    (uint32 past 2**31 edges): [*ids.shape, D]. A gather keeps the ids' dtype (see
    `take_edges`); ids past the end (masked slots) read the last row, and a table of no
    rows (an edgeless graph: every slot masked) zeros. NumPy tables are indexed as they
    are."""
    if table.shape[0] == 0:
        xp = jnp if isinstance(table, jax.Array) else np
        return xp.zeros((*np.shape(ids), table.shape[1]), table.dtype)
    if not isinstance(table, jax.Array):
        return table[ids]
    ids = jnp.asarray(ids)
    dims = jax.lax.GatherDimensionNumbers(offset_dims=(ids.ndim,), collapsed_slice_dims=(0,),
                                          start_index_map=(0,))
    return jax.lax.gather(table, ids[..., None], dims, slice_sizes=(1, table.shape[1]),
                          mode=jax.lax.GatherScatterMode.CLIP)


def csr_from_arrays(indptr, indices, weights=None, *, edge_features=None,
                    validate: bool = True, num_columns: int | None = None) -> CSRGraph:
    """Wraps existing CSR arrays as a host-side CSRGraph, narrowing ids to int32 and the
    offsets to `offset_dtype` (no copy where the dtypes already match). `edge_features`
    [E, D] are kept in bfloat16 or made float32 (`edge_feature_table`); neighbour ids
    lie below `num_columns` (default: the number of rows; see `validate_csr`)."""
    indptr = np.asarray(indptr)
    indices = np.asarray(indices)
    # checked as given (a float64 value past float32's range is named, not its inf)
    f = None if edge_features is None else edge_feature_table(edge_features,
                                                              indices.shape[0], check=validate)
    if validate:
        validate_csr(indptr, indices, weights, num_columns=num_columns)
    elif indices.dtype != np.int32 and indices.size:  # the caller validates after the cast,
        _as_id_array("indices", indices)              # which must not wrap an id into range
        _check_ids("indices", indices, _INT32_MAX + 1)
    ptr_dtype = offset_dtype(indices.shape[0])
    w = None if weights is None else np.asarray(weights, np.float32)
    return CSRGraph(indptr.astype(ptr_dtype, copy=False), indices.astype(np.int32, copy=False), w,
                    f)


def from_scipy(matrix, **kwargs) -> CSRGraph:
    """Builds a CSRGraph from a SciPy sparse matrix; nonzero (i, j) is the edge i -> j.

    The matrix is read as SciPy reads it: entries stored more than once are summed and
    explicitly stored zeros are no edges. Its values become edge weights unless they are
    all one (checked as `from_edge_list` checks weights). Keyword arguments go to
    `from_edge_list` (make_undirected, remove_self_loops, ...). `edge_features` has one
    row per stored entry, in the order `matrix.tocoo()` lists them (a COO matrix's own
    order, unsorted as given), and follows its entry; a stored zero's row is dropped
    with it, and a matrix with an entry stored twice is refused (its rows would have to
    be merged). PyG's `edge_attr` of an `edge_index` goes to
    `from_edge_index(edge_index, edge_features=edge_attr)`.
    """
    if not hasattr(matrix, "tocoo"):
        raise TypeError(f"from_scipy takes a SciPy sparse matrix or array, got "
                        f"{type(matrix).__name__} (a dense one: scipy.sparse.csr_array(m))")
    if "weights" in kwargs:
        raise TypeError("from_scipy takes the edge weights from the matrix's values; "
                        "give them there rather than as weights=")
    coo = matrix.tocoo(copy=True)
    if coo.shape[0] != coo.shape[1]:
        raise ValueError(f"adjacency matrix must be square, got shape {coo.shape}")
    if kwargs.get("edge_features") is not None:
        return _from_scipy_entries(coo, **kwargs)
    coo.sum_duplicates()
    coo.eliminate_zeros()
    data = coo.data
    weights = None if np.all(data == 1) else data
    return from_edge_list(coo.row, coo.col, coo.shape[0], weights=weights, **kwargs)


def _from_scipy_entries(coo, *, edge_features, **kwargs) -> CSRGraph:
    """`from_scipy` with an edge-feature row per stored entry of `coo`, kept in step
    with the entries (no duplicates summed: refused instead)."""
    table = edge_features if hasattr(edge_features, "shape") else np.asarray(edge_features)
    if table.ndim < 1 or table.shape[0] != coo.nnz:
        raise ValueError(f"edge_features must have one row per entry the matrix stores "
                         f"({coo.nnz}, in the order matrix.tocoo() lists them), got shape "
                         f"{tuple(table.shape)}")
    row, col = np.asarray(coo.row, np.int64), np.asarray(coo.col, np.int64)
    order = np.lexsort((col, row))
    twice = np.flatnonzero((np.diff(row[order]) == 0) & (np.diff(col[order]) == 0))
    if twice.size:
        i, j = row[order[twice[0]]], col[order[twice[0]]]
        raise ValueError(f"the matrix stores entry ({i}, {j}) more than once, which SciPy "
                         f"sums; edge_features cannot be summed with it: give each edge "
                         f"once (m.sum_duplicates(), then its rows in m.tocoo()'s order)")
    keep = coo.data != 0
    if not keep.all():
        row, col, table = row[keep], col[keep], np.asarray(table)[keep]
    data = coo.data[keep]
    weights = None if np.all(data == 1) else data
    return from_edge_list(row, col, coo.shape[0], weights=weights, edge_features=table,
                          **kwargs)


def mean_edge_features(graph: CSRGraph) -> np.ndarray:
    """float32[N, D]: each row's mean edge-feature row on the host (0 for a node without
    edges), the node input OGB's examples build for ogbn-proteins."""
    if graph.edge_features is None:
        raise ValueError("the graph has no edge features (CSRGraph.edge_features is None)")
    indptr = np.asarray(graph.indptr, np.int64)
    table = np.asarray(graph.edge_features, np.float32)
    sums = np.zeros((graph.num_nodes, table.shape[1]), np.float64)
    rows = np.repeat(np.arange(graph.num_nodes), np.diff(indptr))
    for col in range(table.shape[1]):
        sums[:, col] = np.bincount(rows, table[:, col], minlength=graph.num_nodes)
    return (sums / np.maximum(np.diff(indptr), 1)[:, None]).astype(np.float32)


def without_self_loops(graph: CSRGraph, *, rows_per_chunk: int = 1 << 20) -> CSRGraph:
    """`graph` without its self-loops (row v listing v itself), their weights and edge
    feature rows dropped with them; `graph` itself where it has none. Rows are scanned
    `rows_per_chunk` at a time, so a large graph is checked without an edge-sized copy."""
    indptr = np.asarray(graph.indptr)
    indices = np.asarray(graph.indices)
    loops = []
    for lo in range(0, graph.num_nodes, rows_per_chunk):
        hi = min(lo + rows_per_chunk, graph.num_nodes)
        start, stop = int(indptr[lo]), int(indptr[hi])
        rows = np.repeat(np.arange(lo, hi, dtype=np.int64), np.diff(indptr[lo:hi + 1]))
        loops.append(start + np.flatnonzero(indices[start:stop] == rows))
    loops = np.concatenate(loops) if loops else np.zeros(0, np.int64)
    if not loops.size:
        return graph
    keep = np.ones(graph.num_edges, bool)
    keep[loops] = False
    dropped = np.bincount(np.searchsorted(indptr, loops, side="right") - 1,
                          minlength=graph.num_nodes)
    shift = np.concatenate([[0], np.cumsum(dropped)])
    return CSRGraph((indptr - shift).astype(indptr.dtype), indices[keep],
                    None if graph.weights is None else np.asarray(graph.weights)[keep],
                    None if graph.edge_features is None
                    else np.asarray(graph.edge_features)[keep])


def to_edge_list(graph: CSRGraph) -> tuple[np.ndarray, np.ndarray]:
    """Host copies (src, dst) of every directed edge, in CSR order."""
    indptr = np.asarray(graph.indptr)
    src = np.repeat(np.arange(graph.num_nodes, dtype=np.int32), np.diff(indptr))
    return src, np.asarray(graph.indices)


def to_scipy(graph: CSRGraph):
    """A SciPy `csr_array` [N, N] whose nonzero (i, j) is row i's neighbour j, holding
    the edge weights (ones without them): the inverse of `from_scipy`."""
    import scipy.sparse  # SciPy comes with the package's dependencies

    n = graph.num_nodes
    data = (np.ones(graph.num_edges, np.float32) if graph.weights is None
            else np.asarray(graph.weights, np.float32))
    return scipy.sparse.csr_array((data, np.asarray(graph.indices),
                                   np.asarray(graph.indptr, np.int64)), shape=(n, n))


def to_edge_index(graph: CSRGraph, *, flow: str = "source_to_target") -> np.ndarray:
    """int64[2, E], PyG's `edge_index` of the graph: the inverse of `from_edge_index`
    (with "source_to_target", row i's neighbour j is the column (j, i))."""
    if flow not in ("source_to_target", "target_to_source"):
        raise ValueError(f"flow must be 'source_to_target' or 'target_to_source', got {flow!r}")
    rows, nbrs = to_edge_list(graph)
    pair = (nbrs, rows) if flow == "source_to_target" else (rows, nbrs)
    return np.stack(pair).astype(np.int64)


def from_networkx(nx_graph, *, weight: str | None = None, **kwargs) -> CSRGraph:
    """A CSRGraph from a networkx graph; node i is the i-th of `nx_graph.nodes`.

    An undirected graph's edges go both ways; a directed edge (u, v) carries messages
    from u to v, so row v gets neighbour u (PyG's convention). `weight` names the edge
    attribute to keep as weights (edges without it weigh 1). Other keywords as
    `from_edge_list`.
    """
    if not all(hasattr(nx_graph, a) for a in ("nodes", "edges", "is_directed")):
        raise TypeError(f"from_networkx takes a networkx graph, got "
                        f"{type(nx_graph).__name__} (a list of (u, v) edges: "
                        f"from_edge_list or networkx.Graph(edges))")
    nodes = list(nx_graph.nodes)
    index = {node: i for i, node in enumerate(nodes)}
    edges = list(nx_graph.edges(data=weight, default=1.0)) if weight else \
        list(nx_graph.edges)
    src = np.fromiter((index[e[0]] for e in edges), np.int64, len(edges))
    dst = np.fromiter((index[e[1]] for e in edges), np.int64, len(edges))
    w = None
    if weight:
        try:
            w = np.array([e[2] for e in edges], np.float64)
        except (TypeError, ValueError) as err:
            raise ValueError(f"edge attribute {weight!r} must hold numbers: {err}") from None
    if not nx_graph.is_directed():
        kwargs.setdefault("make_undirected", True)
    return from_edge_list(dst, src, len(nodes), weights=w, **kwargs)


def to_networkx(graph: CSRGraph, *, undirected: bool = False):
    """A networkx `DiGraph` (a `Graph` with `undirected`) on nodes 0..N-1 with an edge
    j -> i for row i's neighbour j, and the edge weights as its "weight" attribute
    (needs networkx)."""
    networkx = need("networkx", "to_networkx")
    out = networkx.Graph() if undirected else networkx.DiGraph()
    out.add_nodes_from(range(graph.num_nodes))
    rows, nbrs = to_edge_list(graph)
    if graph.weights is None:
        out.add_edges_from(zip(nbrs.tolist(), rows.tolist()))
    else:
        weights = np.asarray(graph.weights, np.float32).tolist()
        out.add_weighted_edges_from(zip(nbrs.tolist(), rows.tolist(), weights))
    return out


def to_jraph(graph: CSRGraph, node_features=None):
    """A jraph.GraphsTuple holding the graph's edges as receivers <- senders (needs jraph).

    `edges` holds the edge weights [E], or the edge features [E, D], or both as a dict
    {"weights": ..., "edge_features": ...}, each row the edge's in CSR order."""
    jraph = need("jraph", "to_jraph")
    src, dst = to_edge_list(graph)
    tables = {k: v for k, v in (("weights", graph.weights),
                                ("edge_features", graph.edge_features)) if v is not None}
    return jraph.GraphsTuple(
        nodes=node_features,
        edges=tables if len(tables) == 2 else next(iter(tables.values()), None),
        senders=jnp.asarray(dst),
        receivers=jnp.asarray(src),
        n_node=jnp.asarray([graph.num_nodes]),
        n_edge=jnp.asarray([graph.num_edges]),
        globals=None,
    )


def from_jraph(graphs_tuple, **kwargs) -> CSRGraph:
    """Builds a CSRGraph from a single-graph jraph.GraphsTuple (receivers sample senders).

    Float `edges` come along unless `weights=` or `edge_features=` is given: [E] as the
    edge weights, as `to_jraph` writes them, [E, D] as edge features, a dict's "weights"
    and "edge_features" as those (`to_jraph` of a graph with both). Weights that are all
    one are no weights (as `from_scipy` reads values). Other edges (integer ids, other
    keys) are left out."""
    n = int(np.sum(np.asarray(graphs_tuple.n_node)))
    edges = graphs_tuple.edges
    tables = {}
    if isinstance(edges, dict):
        tables = {k: np.asarray(edges[k]) for k in ("weights", "edge_features")
                  if edges.get(k) is not None}
    elif edges is not None:
        edges = np.asarray(edges)
        if jnp.issubdtype(edges.dtype, jnp.floating) and edges.ndim in (1, 2):  # bf16 too
            tables = {("weights" if edges.ndim == 1 else "edge_features"): edges}
    if "weights" in tables and not (tables["weights"] != 1).any():
        del tables["weights"]
    if "weights" not in kwargs and "edge_features" not in kwargs:
        kwargs.update(tables)
    return from_edge_list(
        np.asarray(graphs_tuple.receivers), np.asarray(graphs_tuple.senders), n, **kwargs
    )
