"""Undirected CSR graphs from large edge lists, built with SciPy's counting sorts.

`graph.from_edge_list` sorts int64 keys of every directed edge, which costs ~20 s and
several GB for 124M edges. Here each undirected edge is stored once as (min, max) in an
upper-triangular boolean SciPy matrix: COO -> CSR is a counting sort that merges
duplicates, and `U + U.T` mirrors it into both directions with sorted rows, in C++.
Indices stay int32 throughout (SciPy picks int64 only past 2**31 - 1 entries).

Edge features and weights ride along as the matrix's data: the upper matrix holds 1 +
the table row of each entry (int64; never 0, which SciPy may drop), `U + U.T` copies it
to the reverse entry, and the mirrored graph's table is `table[data - 1]`: both
directions of an undirected edge carry the same row (the same weight). Duplicates must
be gone before (a COO -> CSR conversion sums them): `undirected_csr` keeps each pair's
first occurrence.
"""

from __future__ import annotations

import numpy as np
import scipy.sparse

from zerognn_jax._src.data.graph import CSRGraph, csr_from_arrays
from zerognn_jax._src.data.tables import edge_feature_table


def canonical_pairs(src: np.ndarray, dst: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """int[E] x2 -> int32[E'] x2: (min, max) of each edge, self-loops dropped."""
    keep = src != dst
    src, dst = src[keep], dst[keep]
    return np.minimum(src, dst).astype(np.int32), np.maximum(src, dst).astype(np.int32)


def upper_matrix(lo: np.ndarray, hi: np.ndarray, num_nodes: int) -> scipy.sparse.csr_matrix:
    """bool CSR [N, N] with one entry per distinct pair (lo[i], hi[i]), lo < hi."""
    data = np.ones(lo.shape[0], dtype=bool)
    return scipy.sparse.coo_matrix((data, (lo, hi)), shape=(num_nodes, num_nodes)).tocsr()


def symmetric_graph(upper: scipy.sparse.csr_matrix, edge_features=None,
                    weights=None) -> CSRGraph:
    """The CSRGraph holding every entry of `upper` in both directions, rows sorted.

    `edge_features` ([upper.nnz, D], float32 or bfloat16) and `weights` ([upper.nnz],
    float32), both checked by the caller: row j for the j-th stored entry of `upper` in
    CSR order; both directions of that entry get it. `upper` must be strictly
    upper-triangular (a diagonal entry would be summed with itself) without duplicates,
    as `upper_matrix` of `canonical_pairs` is.
    """
    if edge_features is None and weights is None:
        full = (upper + upper.T).tocsr()
        full.sort_indices()
        return csr_from_arrays(full.indptr, full.indices, validate=False)
    ids = scipy.sparse.csr_matrix(
        (np.arange(1, upper.nnz + 1, dtype=np.int64), upper.indices, upper.indptr),
        shape=upper.shape)
    full = (ids + ids.T).tocsr()
    full.sort_indices()
    rows = full.data - 1
    return csr_from_arrays(
        full.indptr, full.indices, None if weights is None else np.asarray(weights)[rows],
        validate=False, edge_features=None if edge_features is None else edge_features[rows])


def undirected_csr(src, dst, num_nodes: int, edge_features=None, weights=None) -> CSRGraph:
    """CSRGraph of the undirected graph on edges {src[i], dst[i]}: both directions stored,
    self-loops and duplicates dropped, neighbours sorted.

    Args:
      src, dst: int[E] node ids in [0, num_nodes).
      edge_features: float[E, D] or None, row i for edge i. A pair listed more than once
        (either way round) keeps the row of its first listing; both directions carry it.
      weights: float32[E] or None (checked by the caller), edge i's weight; kept as the
        feature rows are.
    """
    src, dst = np.asarray(src), np.asarray(dst)
    if src.shape != dst.shape or src.ndim != 1:
        raise ValueError(f"src and dst must be 1-D of equal length, got {src.shape}, {dst.shape}")
    if not (np.issubdtype(src.dtype, np.integer) and np.issubdtype(dst.dtype, np.integer)):
        raise ValueError(f"edge ids must be integers, got {src.dtype} and {dst.dtype}")
    for label, ids in (("src", src), ("dst", dst)):
        if ids.size and (ids.min() < 0 or ids.max() >= num_nodes):
            raise ValueError(
                f"{label} ids span [{int(ids.min())}, {int(ids.max())}], outside "
                f"[0, {num_nodes})"
            )
    if edge_features is None and weights is None:
        return symmetric_graph(upper_matrix(*canonical_pairs(src, dst), num_nodes))
    table = None if edge_features is None else edge_feature_table(edge_features, src.shape[0])
    keep = np.flatnonzero(src != dst)
    lo, hi = canonical_pairs(src, dst)
    keys, first = np.unique(lo.astype(np.int64) * num_nodes + hi, return_index=True)
    lo, hi = (keys // num_nodes).astype(np.int32), (keys % num_nodes).astype(np.int32)
    upper = upper_matrix(lo, hi, num_nodes)  # keys are sorted: entry j is pair j
    rows = keep[first]
    return symmetric_graph(upper, None if table is None else table[rows],
                           None if weights is None else np.asarray(weights)[rows])
