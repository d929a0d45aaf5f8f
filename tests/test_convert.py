"""Conversions to and from SciPy, PyG's edge_index and networkx round-trip the graph."""

from __future__ import annotations

import numpy as np
import pytest

from zerognn_jax import (
    from_edge_index,
    from_edge_list,
    from_networkx,
    from_scipy,
    to_edge_index,
    to_networkx,
    to_scipy,
)


@pytest.fixture(scope="module")
def weighted():
    """A directed graph (rows not symmetric) with distinct weights, every row sorted."""
    rs = np.random.default_rng(5)
    src, dst = rs.integers(0, 60, 300), rs.integers(0, 60, 300)
    return from_edge_list(src, dst, 60, weights=rs.uniform(0.1, 3.0, 300),
                          remove_self_loops=True, remove_duplicates=True)


def _same(a, b):
    np.testing.assert_array_equal(a.indptr, b.indptr)
    np.testing.assert_array_equal(a.indices, b.indices)
    if a.weights is None:
        assert b.weights is None
    else:
        np.testing.assert_allclose(a.weights, b.weights, rtol=1e-6)


def test_scipy_round_trip_keeps_rows_and_weights(weighted):
    m = to_scipy(weighted)
    assert m.shape == (60, 60) and m.nnz == weighted.num_edges
    row = 3
    lo, hi = weighted.indptr[row], weighted.indptr[row + 1]
    np.testing.assert_allclose(m[[row], :].toarray()[0, weighted.indices[lo:hi]],
                               weighted.weights[lo:hi], rtol=1e-6)
    _same(from_scipy(m), weighted)


@pytest.mark.parametrize("flow", ["source_to_target", "target_to_source"])
def test_edge_index_round_trip_in_both_flows(weighted, flow):
    ei = to_edge_index(weighted, flow=flow)
    assert ei.shape == (2, weighted.num_edges) and ei.dtype == np.int64
    back = from_edge_index(ei, 60, flow=flow, weights=weighted.weights)
    _same(back, weighted)
    assert weighted.indptr[1] > 0
    row, nbr = 0, weighted.indices[0]
    col = (nbr, row) if flow == "source_to_target" else (row, nbr)
    assert any((ei[:, k] == col).all() for k in range(ei.shape[1]))


def test_networkx_round_trip_directed_and_weighted(weighted):
    nx = pytest.importorskip("networkx")
    g = to_networkx(weighted)
    assert isinstance(g, nx.DiGraph) and g.number_of_edges() == weighted.num_edges
    row = 7
    for k in range(weighted.indptr[row], weighted.indptr[row + 1]):
        assert g[weighted.indices[k]][row]["weight"] == pytest.approx(weighted.weights[k])
    _same(from_networkx(g, weight="weight"), weighted)
    assert from_networkx(g).weights is None


def test_from_networkx_undirected_with_named_nodes():
    nx = pytest.importorskip("networkx")
    g = nx.Graph([("a", "b"), ("b", "c")])
    csr = from_networkx(g)  # nodes a, b, c -> 0, 1, 2; both directions
    assert csr.num_nodes == 3 and csr.num_edges == 4
    np.testing.assert_array_equal(csr.indices[csr.indptr[1]:csr.indptr[2]], [0, 2])
    und = to_networkx(csr, undirected=True)
    assert sorted(und.edges) == [(0, 1), (1, 2)]


def test_to_edge_index_refuses_an_unknown_flow(weighted):
    with pytest.raises(ValueError, match="flow must be.*got 'up'"):
        to_edge_index(weighted, flow="up")
