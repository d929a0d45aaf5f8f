"""CSR construction: directions, self-loops, duplicates, ordering, SciPy interop, bad input."""

import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.sparse
from conftest import lexsort_csr

from zerognn_jax import (
    CSRGraph,
    from_edge_index,
    from_edge_list,
    from_jraph,
    from_scipy,
    hetero_graph,
    to_jraph,
    without_self_loops,
)
from zerognn_jax._src.data.graph import csr_from_arrays, to_edge_list


def rows(graph: CSRGraph) -> list[list[int]]:
    indptr, indices = np.asarray(graph.indptr), np.asarray(graph.indices)
    return [indices[indptr[v]:indptr[v + 1]].tolist() for v in range(graph.num_nodes)]


def test_directed_edges_become_rows_of_their_source():
    g = from_edge_list([0, 1, 2, 0], [1, 2, 0, 2], 4)
    assert rows(g) == [[1, 2], [2], [0], []]
    assert g.indptr.dtype == np.int32 and g.indices.dtype == np.int32
    assert g.num_nodes == 4 and g.num_edges == 4
    assert np.asarray(g.degrees()).tolist() == [2, 1, 1, 0]
    assert g.max_degree() == 2


def test_num_nodes_defaults_to_largest_id_plus_one():
    assert from_edge_list([0, 3], [1, 2]).num_nodes == 4
    assert from_edge_list(np.zeros(0, np.int32), np.zeros(0, np.int32)).num_nodes == 0


def test_make_undirected_adds_reverse_edges():
    g = from_edge_list([0, 1], [1, 2], 3, make_undirected=True)
    assert rows(g) == [[1], [0, 2], [1]]


def test_self_loops_kept_unless_removed():
    assert rows(from_edge_list([0, 1], [0, 0], 2)) == [[0], [0]]
    assert rows(from_edge_list([0, 1], [0, 0], 2, remove_self_loops=True)) == [[], [0]]


def test_duplicates_kept_unless_removed_and_first_weight_wins():
    src, dst, w = [0, 0, 0, 1], [1, 1, 2, 0], [5.0, 7.0, 1.0, 2.0]
    assert rows(from_edge_list(src, dst, 3)) == [[1, 1, 2], [0], []]
    g = from_edge_list(src, dst, 3, weights=w, remove_duplicates=True)
    assert rows(g) == [[1, 2], [0], []]
    np.testing.assert_array_equal(g.weights, np.float32([5.0, 1.0, 2.0]))


def test_undirected_with_duplicates_in_both_directions_collapses_to_one_pair():
    g = from_edge_list([0, 1, 0], [1, 0, 1], 2, make_undirected=True, remove_duplicates=True)
    assert rows(g) == [[1], [0]]


def test_sort_neighbors_orders_rows_and_can_be_turned_off():
    assert rows(from_edge_list([0, 0, 0], [3, 1, 2], 4)) == [[1, 2, 3], [], [], []]
    unsorted = from_edge_list([0, 1, 0, 0], [3, 0, 1, 2], 4, sort_neighbors=False)
    assert rows(unsorted) == [[3, 1, 2], [0], [], []]


def test_accepts_jax_arrays_and_moves_to_device():
    g = from_edge_list(jnp.array([0, 1]), jnp.array([1, 0]), 2)
    dev = g.to_device()
    assert isinstance(dev.indices, jax.Array)
    assert rows(dev) == [[1], [0]]
    assert np.asarray(dev.degrees()).tolist() == [1, 1]


def test_random_graph_matches_a_set_reference():
    rng = np.random.default_rng(0)
    src, dst = rng.integers(0, 50, 400), rng.integers(0, 50, 400)
    g = from_edge_list(src, dst, 50, make_undirected=True, remove_self_loops=True,
                       remove_duplicates=True)
    expected = {(a, b) for a, b in zip(src.tolist(), dst.tolist()) if a != b}
    expected |= {(b, a) for a, b in expected}
    gs, gd = to_edge_list(g)
    assert list(zip(gs.tolist(), gd.tolist())) == sorted(expected)


@pytest.mark.parametrize("chunk", [None, 8])  # 8: keys sorted in chunks, merged by ranges
@pytest.mark.parametrize("order", ["random", "csr"])  # "csr": keys already ascending
@pytest.mark.parametrize(("undirected", "loops", "distinct", "sort"), [
    (False, True, False, True), (False, False, False, True), (False, True, True, False),
    (True, True, False, True), (True, True, True, True), (True, False, True, False),
])
def test_bare_edges_take_the_key_sort_with_the_argsort_arrays(chunk, order, undirected,
                                                              loops, distinct, sort,
                                                              monkeypatch):
    # edges without weights or features: sorted keys (`_key_csr`), same arrays as the
    # stable argsort that weighted edges take and as a plain lexsort
    from zerognn_jax._src.data import graph

    if chunk:
        monkeypatch.setattr(graph, "_KEY_CHUNK", chunk)
    calls, key_csr = [], graph._key_csr
    monkeypatch.setattr(graph, "_key_csr", lambda *a, **k: calls.append(1) or key_csr(*a, **k))
    rng = np.random.default_rng(1)
    src, dst = rng.integers(0, 7, 60), rng.integers(0, 7, 60)  # repeats, loops, empty rows
    if order == "csr":
        src, dst = np.unique(src * 7 + dst) // 7, np.unique(src * 7 + dst) % 7
    kw = dict(make_undirected=undirected, remove_self_loops=not loops,
              remove_duplicates=distinct, sort_neighbors=sort)
    got = from_edge_list(src, dst, 9, **kw)
    argsorted = from_edge_list(src, dst, 9, weights=np.ones(src.size), **kw)
    indptr, indices = lexsort_csr(src, dst, 9, undirected=undirected, loops=loops,
                                   distinct=distinct)
    for want in (argsorted, CSRGraph(indptr, indices)):
        np.testing.assert_array_equal(got.indptr, want.indptr)
        np.testing.assert_array_equal(got.indices, want.indices)
    assert got.indptr.dtype == np.int32 and got.indices.dtype == np.int32
    assert got.weights is None and got.edge_features is None
    assert len(calls) == 1  # the bare edges' build only


@pytest.mark.parametrize("chunk", [None, 8])
def test_bare_bipartite_edges_take_the_key_sort_with_the_argsort_arrays(chunk, monkeypatch):
    from zerognn_jax._src.data import graph

    if chunk:
        monkeypatch.setattr(graph, "_KEY_CHUNK", chunk)
    rng = np.random.default_rng(2)
    src, dst = rng.integers(0, 5, 50).astype(np.int32), rng.integers(0, 11, 50)
    got = from_edge_list(src, dst, 6, num_columns=11)
    want = from_edge_list(src, dst, 6, num_columns=11, weights=np.ones(50))
    np.testing.assert_array_equal(got.indptr, want.indptr)
    np.testing.assert_array_equal(got.indices, want.indices)


def test_merge_sorted_merges_by_ranges_whatever_the_thread_count():
    from zerognn_jax._src.data.host_parallel import merge_sorted

    rng = np.random.default_rng(3)
    parts = [np.sort(rng.integers(0, 100, n)) for n in (0, 30, 7, 50)]
    cuts = np.array([10, 10, 40, 95])
    everything = np.sort(np.concatenate(parts))
    for threads in (1, 3):
        runs = merge_sorted(parts, cuts, threads=threads)
        for run, lo, hi in zip(runs, cuts[:-1], cuts[1:]):
            np.testing.assert_array_equal(run, everything[(everything >= lo) & (everything < hi)])
        distinct = merge_sorted(parts, cuts, distinct=True, threads=threads)
        np.testing.assert_array_equal(np.concatenate(distinct),
                                      np.unique(everything[(everything >= 10) & (everything < 95)]))


def test_from_scipy_reads_weights_only_when_not_all_one():
    ones = scipy.sparse.csr_matrix(np.array([[0, 1], [1, 0]], np.float32))
    assert from_scipy(ones).weights is None
    weighted = from_scipy(scipy.sparse.coo_matrix(np.array([[0, 2.5], [0, 0]])))
    assert rows(weighted) == [[1], []]
    np.testing.assert_array_equal(weighted.weights, np.float32([2.5]))
    sym = from_scipy(scipy.sparse.csr_matrix(np.array([[0, 1], [0, 0]])), make_undirected=True)
    assert rows(sym) == [[1], [0]]


def test_from_scipy_edge_features_follow_their_entries():
    """A row per stored entry in tocoo()'s order, unsorted as PyG's COO matrices are:
    each edge keeps its own row (10 * src + dst), in CSR and COO alike; a stored zero's
    row goes with it; an entry stored twice, or a table of another length, is refused."""
    src, dst = np.array([2, 0, 1, 0, 1]), np.array([1, 2, 0, 1, 2])
    values = np.array([1.0, 1.0, 1.0, 1.0, 0.0])  # (1, 2) stored as a zero: no edge
    coo = scipy.sparse.coo_matrix((values, (src, dst)), shape=(3, 3))
    for m in (coo, coo.tocsr()):
        entries = m.tocoo()
        table = (10 * entries.row + entries.col).astype(np.float32)[:, None]
        g = from_scipy(m, edge_features=table)
        assert rows(g) == [[1, 2], [0], [1]] and g.weights is None
        owners = np.repeat(np.arange(3), np.diff(np.asarray(g.indptr)))
        np.testing.assert_array_equal(np.asarray(g.edge_features)[:, 0],
                                      10 * owners + np.asarray(g.indices))
    twice = scipy.sparse.coo_matrix((np.ones(3), ([0, 0, 1], [1, 1, 0])), shape=(2, 2))
    with pytest.raises(ValueError, match=r"stores entry \(0, 1\) more than once"):
        from_scipy(twice, edge_features=np.ones((3, 2), np.float32))
    with pytest.raises(ValueError, match=r"one row per entry the matrix stores \(5, "
                                         r"in the order matrix.tocoo\(\) lists them\), "
                                         r"got shape \(4, 1\)"):
        from_scipy(coo, edge_features=np.ones((4, 1), np.float32))


def test_from_scipy_rejects_non_square():
    with pytest.raises(ValueError, match=r"must be square, got shape \(2, 3\)"):
        from_scipy(scipy.sparse.csr_matrix(np.ones((2, 3))))
    with pytest.raises(TypeError, match=r"takes a SciPy sparse matrix or array, got ndarray"):
        from_scipy(np.eye(3))


def test_csr_from_arrays_narrows_to_int32():
    g = csr_from_arrays(np.array([0, 1, 2], np.int64), np.array([1, 0], np.int64))
    assert g.indptr.dtype == np.int32 and g.indices.dtype == np.int32
    assert rows(g) == [[1], [0]]


def test_jraph_round_trip():
    pytest.importorskip("jraph")
    g = from_edge_list([0, 1, 1], [1, 0, 2], 3)
    assert rows(from_jraph(to_jraph(g))) == rows(g)
    # edge weights, edge features, or both come back with their edges (the features were
    # dropped: to_jraph wrote the weights only)
    table = np.arange(6, dtype=np.float32).reshape(3, 2)
    for tables in (dict(weights=np.float32([0.5, 2, 3])), dict(edge_features=table),
                   dict(weights=np.float32([0.5, 2, 3]), edge_features=table)):
        g = from_edge_list([0, 1, 1], [1, 0, 2], 3, **tables)
        back = from_jraph(to_jraph(g))
        assert rows(back) == rows(g)
        for name in ("weights", "edge_features"):
            want, got = getattr(g, name), getattr(back, name)
            assert (want is None and got is None) or np.array_equal(want, got)


def test_from_jraph_keeps_the_edges_as_weights_or_features():
    """Without jraph: a GraphsTuple is read by its fields."""
    tuple_of = lambda edges: types.SimpleNamespace(
        nodes=None, edges=edges, senders=np.array([1, 0]), receivers=np.array([0, 1]),
        n_node=np.array([2]), n_edge=np.array([2]), globals=None)
    weighted = from_jraph(tuple_of(np.float32([0.5, 2.0])))
    np.testing.assert_array_equal(weighted.weights, [0.5, 2.0])
    table = np.arange(6, dtype=np.float32).reshape(2, 3)
    np.testing.assert_array_equal(from_jraph(tuple_of(table)).edge_features, table)
    half = table.astype(jnp.bfloat16)  # was left out: NumPy's floating excludes bfloat16
    assert from_jraph(tuple_of(half)).edge_features.dtype == jnp.bfloat16
    assert from_jraph(tuple_of(None)).weights is None
    assert from_jraph(tuple_of(np.ones(2, np.float32))).weights is None  # as from_scipy
    for other in (np.array([3, 0]), {"bond": np.ones(2)}):  # ids, other keys: left out
        g = from_jraph(tuple_of(other))
        assert g.weights is None and g.edge_features is None
    both = from_jraph(tuple_of({"weights": np.float32([0.5, 2.0]), "edge_features": table}))
    np.testing.assert_array_equal(both.weights, [0.5, 2.0])
    np.testing.assert_array_equal(both.edge_features, table)
    ones = from_jraph(tuple_of({"weights": np.ones(2, np.float32), "edge_features": table}))
    assert ones.weights is None and ones.edge_features is not None  # as the [E] form
    mine = from_jraph(tuple_of(table), weights=np.float32([1.0, 3.0]))  # given: edges unread
    assert mine.edge_features is None and list(mine.weights) == [1.0, 3.0]


@pytest.mark.parametrize(
    ("src", "dst", "num_nodes", "error", "match"),
    [
        ([0, 5], [1, 2], 5, ValueError, r"src has node id 5 at position 1, out of range for "
                                        r"num_nodes=5"),
        ([0, 1], [1, 7], 5, ValueError, r"dst has node id 7 at position 1, out of range"),
        ([0, -1], [1, 2], 5, ValueError, r"src has a negative node id -1 at position 1"),
        ([0, 1], [-3, 2], 5, ValueError, r"dst has a negative node id -3 at position 0"),
        ([0.0, 1.0], [1, 2], 5, TypeError, r"src must have an integer dtype, got float64 "
                                            r"\(cast explicitly"),
        ([0, 1], [1.5, 2.0], 5, TypeError, r"dst must have an integer dtype, got float64$"),
        ([True, False], [1, 2], 5, TypeError, r"src must have an integer dtype, got bool"),
        ([0, 1, 2], [1, 2], 5, ValueError, r"src and dst differ in length: 3 vs 2"),
        ([[0, 1]], [[1, 2]], 5, ValueError, r"src must be one-dimensional, got shape \(1, 2\)"),
        ([0], [1], -1, ValueError, r"num_nodes must be in \[0, 2\*\*31 - 1\], got -1"),
        ([0], [1], 2**31, ValueError, r"num_nodes must be in \[0, 2\*\*31 - 1\], got 2147483648"),
        ([0], [1], 3.0, TypeError, r"num_nodes must be an integer, got float 3.0"),
        ([0], [1], True, TypeError, r"num_nodes must be an integer, got bool"),
    ],
)
def test_from_edge_list_rejects_bad_ids(src, dst, num_nodes, error, match):
    with pytest.raises(error, match=match):
        from_edge_list(np.array(src), np.array(dst), num_nodes)


def test_from_edge_list_takes_integer_counts_of_any_kind():
    for n in (np.int64(3), jnp.int32(3), np.array(3)):
        assert from_edge_list([0], [1], n).num_nodes == 3
    with pytest.raises(TypeError, match=r"num_columns must be an integer, got float 2.9"):
        from_edge_list([0], [1], 3, num_columns=2.9)  # was read as 2


@pytest.mark.parametrize(
    ("weights", "match"),
    [
        ([1.0], r"weights has shape \(1,\), expected \(2,\)"),
        ([1.0, np.nan], r"^weights contain NaN or inf \(1 entries; first at edge 1\)$"),
        ([np.inf, 1.0], r"^weights contain NaN or inf \(1 entries; first at edge 0\)$"),
        # finite as given, inf as float32: named as an overflow, not as the inf of a cast
        ([1.0, 1e39], r"^weights overflow float32: 1e\+39 at edge 1 is past its largest "
                      r"magnitude \(3\.40282e\+38\)$"),
        (["1.5", "x"], r"^weights must be real numbers, got <U3$"),
        # refused where the graph is built, not when a run first samples by them
        ([0.5, -3.5], r"^weights must be non-negative \(the weighted sampler draws each "
                      r"edge in proportion to its weight\): -3\.5 at edge 1 \(1 negative in "
                      r"all\)$"),
    ],
)
def test_from_edge_list_rejects_bad_weights(weights, match):
    with pytest.raises(ValueError, match=match):
        from_edge_list([0, 1], [1, 0], 2, weights=np.array(weights))
    # bools are weights 0 and 1, as NumPy's cast made them
    kept = from_edge_list([0, 1], [1, 0], 2, weights=np.array([True, False]))
    np.testing.assert_array_equal(kept.weights, [1.0, 0.0])
    if "edge" in match:  # the same line from a CSR built directly, and a typed relation's
        with pytest.raises(ValueError, match=match):
            csr_from_arrays(np.array([0, 1, 2]), np.array([1, 0]), np.array(weights))
        with pytest.raises(ValueError, match="^relation a__r__a: " + match[1:]):
            hetero_graph({"a": 2}, {("a", "r", "a"): ([0, 1], [1, 0])},
                         weights={("a", "r", "a"): np.array(weights)})


@pytest.mark.parametrize(
    ("indptr", "indices", "error", "match"),
    [
        ([], [], ValueError, r"indptr must be 1-D with at least one entry, got \(0,\)"),
        ([[0, 1]], [0], ValueError, r"indptr must be 1-D"),
        ([1, 2], [0, 0], ValueError, r"must start at 0 and end at len\(indices\)=2, got 1 and 2"),
        ([0, 1], [0, 0], ValueError, r"end at len\(indices\)=2, got 0 and 1"),
        ([0, 2, 1, 2], [0, 1], ValueError, r"indptr decreases at row 1"),
        ([0, 1, 2], [0, 2], ValueError, r"indices has node id 2 at position 1, out of range "
                                        r"for num_nodes=2"),
        ([0, 1, 2], [0, -1], ValueError, r"indices has a negative node id -1"),
        ([0, 1, 2], [0.0, 1.0], TypeError, r"indices must have an integer dtype, got float64"),
    ],
)
def test_csr_from_arrays_rejects_bad_arrays(indptr, indices, error, match):
    with pytest.raises(error, match=match):
        csr_from_arrays(np.array(indptr, dtype=np.int64 if indptr == [] else None),
                        np.array(indices))


@pytest.mark.parametrize("rows_per_chunk", [1 << 20, 2])
def test_self_loops_go_with_their_weights_and_edge_features(rows_per_chunk):
    """Rows 0 and 3 list themselves (row 3 twice); every other edge keeps its weight and
    feature row, in CSR order; a graph without loops comes back as itself."""
    indptr = np.array([0, 3, 4, 4, 8])
    indices = np.array([0, 1, 2, 0, 3, 1, 3, 2], np.int32)
    weights = np.arange(8, dtype=np.float32)
    features = np.arange(16, dtype=np.float32).reshape(8, 2)
    g = CSRGraph(indptr.astype(np.int32), indices, weights, features)
    out = without_self_loops(g, rows_per_chunk=rows_per_chunk)  # public: own loops
    kept = [1, 2, 3, 5, 7]
    np.testing.assert_array_equal(out.indptr, [0, 2, 3, 3, 5])
    assert out.indptr.dtype == np.int32
    np.testing.assert_array_equal(out.indices, indices[kept])
    np.testing.assert_array_equal(out.weights, weights[kept])
    np.testing.assert_array_equal(out.edge_features, features[kept])
    assert without_self_loops(out, rows_per_chunk=rows_per_chunk) is out


@pytest.mark.parametrize("weighted", [False, True])  # the key build and the argsort's
def test_make_undirected_keeps_a_self_loop_once(weighted):
    w = np.array([2.0, 5.0, 3.0], np.float32) if weighted else None
    g = from_edge_list([0, 2, 1], [1, 2, 2], 3, weights=w, make_undirected=True)
    pairs = list(zip(*map(np.ndarray.tolist, to_edge_list(g))))
    assert pairs == [(0, 1), (1, 0), (1, 2), (2, 1), (2, 2)]
    if weighted:
        assert np.asarray(g.weights).tolist() == [2.0, 2.0, 3.0, 3.0, 5.0]


def test_an_undirected_networkx_graph_round_trips_with_its_self_loops():
    nx = pytest.importorskip("networkx")
    from zerognn_jax import from_networkx, to_networkx

    graph = nx.Graph()
    graph.add_weighted_edges_from([(0, 1, 2.0), (2, 2, 5.0), (1, 2, 3.0)])
    g = from_networkx(graph, weight="weight")
    assert g.num_edges == 5 and np.asarray(g.weights)[-1] == 5.0
    back = to_networkx(g, undirected=True)
    assert sorted(back.edges(data="weight")) == sorted(graph.edges(data="weight"))


def test_a_networkx_weight_that_is_no_number_is_named():
    nx = pytest.importorskip("networkx")
    from zerognn_jax import from_networkx

    graph = nx.Graph()
    graph.add_edge(0, 1, weight="heavy")
    with pytest.raises(ValueError, match="edge attribute 'weight' must hold numbers.*heavy"):
        from_networkx(graph, weight="weight")


def test_from_scipy_reads_a_matrix_as_scipy_does():
    # a repeated COO entry is one entry of the summed value, a stored zero is no entry
    coo = scipy.sparse.coo_matrix((np.array([1.0, 1.0, 0.0, 3.0]),
                                   (np.array([0, 0, 1, 2]), np.array([1, 1, 2, 0]))), (3, 3))
    for m in (coo, coo.tocsr()):
        g = from_scipy(m)
        assert list(zip(*map(np.ndarray.tolist, to_edge_list(g)))) == [(0, 1), (2, 0)]
        assert np.asarray(g.weights).tolist() == [2.0, 3.0]
    assert coo.nnz == 4  # the caller's matrix is left as it was
    with pytest.raises(ValueError, match="weights must be real numbers"):
        from_scipy(scipy.sparse.csr_matrix(np.array([[0, 3j], [0, 0]])))
    with pytest.raises(ValueError, match=r"weights overflow float32: 1e\+300 at edge 0"):
        from_scipy(scipy.sparse.csr_matrix(np.array([[0, 1e300], [0, 0]])))
    with pytest.raises(TypeError, match="takes the edge weights from the matrix's values"):
        from_scipy(coo, weights=np.ones(4))


def test_ids_past_int64_and_past_num_columns_are_named_as_given():
    big = np.array([0, 2**63], np.uint64)
    with pytest.raises(ValueError, match=r"^src has node id 9223372036854775808 at position 1, "
                                         r"past any graph's node count$"):
        from_edge_list(big, np.array([1, 0], np.uint64), 3)
    with pytest.raises(ValueError, match=r"^dst has node id 5 at position 0, out of range for "
                                         r"num_columns=4; pass num_columns=6 or more$"):
        from_edge_list([0], [5], 3, num_columns=4)
    # one count bounds both rows: its least value holds the larger row's ids
    with pytest.raises(ValueError, match=r"^edge_index\[0\] has node id 4 at position 1, out "
                                         r"of range for num_nodes=4; pass num_nodes=6 or "
                                         r"more$"):
        from_edge_index(np.array([[0, 4], [5, 1]]), 4)
