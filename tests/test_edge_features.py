"""Edge-feature tables: aligned with the CSR edges through every construction path,
validated, stored and read back value by value."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import random_graph

from zerognn_jax import TrainConfig, from_edge_list, train
from zerognn_jax._src.data.dataset import BFLOAT16, make_dataset
from zerognn_jax._src.data.graph import csr_from_arrays, take_edge_rows, to_edge_list
from zerognn_jax._src.data.storage import load_dir, load_npz, save_dir, save_npz
from zerognn_jax._src.data.undirected import undirected_csr


def edge_rows(graph) -> dict:
    """{(row, neighbour): [its feature rows as lists]} of a graph, in CSR order."""
    src, dst = to_edge_list(graph)
    table = np.asarray(graph.edge_features, np.float32)
    out: dict = {}
    for i, (s, d) in enumerate(zip(src.tolist(), dst.tolist())):
        out.setdefault((s, d), []).append(table[i].tolist())
    return out


def feats(e: int, d: int = 3) -> np.ndarray:
    """Row i = [i, i + 0.5, -i, ...]: every row different, so a mix-up shows."""
    i = np.arange(e, dtype=np.float32)[:, None]
    return np.concatenate([i, i + 0.5, -i][:d], axis=1)


def test_from_edge_list_moves_each_row_with_its_edge_when_sorting():
    f = feats(4)
    g = from_edge_list([2, 0, 1, 0], [0, 2, 2, 1], 3, edge_features=f)
    assert edge_rows(g) == {(0, 1): [f[3].tolist()], (0, 2): [f[1].tolist()],
                            (1, 2): [f[2].tolist()], (2, 0): [f[0].tolist()]}
    assert g.edge_features.dtype == np.float32


def test_make_undirected_gives_the_reverse_edge_the_same_row():
    f = feats(2)
    g = from_edge_list([0, 1], [1, 2], 3, edge_features=f, make_undirected=True)
    assert edge_rows(g) == {(0, 1): [f[0].tolist()], (1, 0): [f[0].tolist()],
                            (1, 2): [f[1].tolist()], (2, 1): [f[1].tolist()]}


def test_self_loops_and_duplicates_drop_their_rows_keeping_the_first():
    f = feats(5)
    g = from_edge_list([0, 1, 0, 2, 0], [1, 1, 1, 0, 1], 3, edge_features=f,
                       remove_self_loops=True, remove_duplicates=True)
    assert edge_rows(g) == {(0, 1): [f[0].tolist()], (2, 0): [f[3].tolist()]}


def test_a_given_edge_wins_over_a_reverse_copy():
    f = feats(2)
    g = from_edge_list([0, 1], [1, 0], 2, edge_features=f, make_undirected=True,
                       remove_duplicates=True)
    assert edge_rows(g) == {(0, 1): [f[0].tolist()], (1, 0): [f[1].tolist()]}


def test_bfloat16_is_kept_and_integers_become_float32():
    f = feats(2).astype(BFLOAT16)
    assert from_edge_list([0, 1], [1, 0], 2, edge_features=f).edge_features.dtype == BFLOAT16
    g = from_edge_list([0, 1], [1, 0], 2, edge_features=np.array([[3], [4]]))
    assert g.edge_features.dtype == np.float32
    assert g.edge_features[:, 0].tolist() == [3.0, 4.0]


@pytest.mark.parametrize("table, message", [
    (np.zeros((3, 2), np.float32), "edge_features have 3 rows but the graph has 2 edges"),
    (np.zeros(2, np.float32), r"edge_features must be 2-D \[E, D\], got shape \(2,\)"),
    (np.zeros((2, 0), np.float32), "need at least one column"),
    (np.array([[0.0, 1.0], [2.0, np.nan]]), "NaN or inf \\(1 entries; first at row 1, column 1\\)"),
    (np.ones((2, 1), bool), "edge_features must be real numbers, got bool"),
    (np.ones((2, 1), np.complex64), "edge_features must be real numbers, got complex64"),
])
def test_bad_tables_are_refused_with_the_problem_named(table, message):
    with pytest.raises(ValueError, match=message):
        from_edge_list([0, 1], [1, 0], 2, edge_features=table)
    with pytest.raises(ValueError, match=message):
        csr_from_arrays([0, 1, 2], [1, 0], edge_features=table)


def test_undirected_csr_keeps_the_first_listing_of_a_pair_for_both_directions():
    f = feats(5)
    # (1, 0) repeats (0, 1) the other way round; (2, 2) is a loop; (2, 1) comes twice
    g = undirected_csr(np.array([0, 1, 2, 2, 1]), np.array([1, 0, 2, 1, 2]), 3,
                       edge_features=f)
    assert edge_rows(g) == {(0, 1): [f[0].tolist()], (1, 0): [f[0].tolist()],
                            (1, 2): [f[3].tolist()], (2, 1): [f[3].tolist()]}
    plain = undirected_csr(np.array([0, 1, 2, 2, 1]), np.array([1, 0, 2, 1, 2]), 3)
    assert np.array_equal(plain.indptr, g.indptr) and np.array_equal(plain.indices, g.indices)


def test_a_graph_without_edge_features_has_the_same_leaves_as_before():
    g = from_edge_list([0, 1], [1, 0], 2)
    assert g.edge_features is None and len(jax.tree.leaves(g)) == 2
    with_f = from_edge_list([0, 1], [1, 0], 2, edge_features=feats(2)).to_device()
    assert isinstance(with_f.edge_features, jax.Array)
    assert np.array_equal(np.asarray(with_f.edge_features), feats(2)[[0, 1]])


def test_take_edge_rows_reads_rows_by_uint32_ids_under_jit():
    table = jnp.asarray(feats(6))
    ids = np.array([[5, 0], [2, 2]], np.uint32)
    got = jax.jit(take_edge_rows)(table, jnp.asarray(ids))
    assert got.shape == (2, 2, 3)
    assert np.array_equal(np.asarray(got), feats(6)[ids.astype(np.int64)])


def _dataset(table):
    g = from_edge_list([0, 1, 2, 2], [1, 2, 0, 1], 3, edge_features=table,
                       make_undirected=True, remove_duplicates=True)
    return make_dataset("t", g.indptr, g.indices, np.ones((3, 2)), [0, 1, 0], [0], [1], [2], 2,
                        edge_features=g.edge_features)


@pytest.mark.parametrize("dtype", [np.float32, BFLOAT16])
def test_npz_and_directory_round_trips_keep_every_value(tmp_path, dtype):
    ds = _dataset((feats(4) * 1.25).astype(dtype))
    assert ds.stats()["edge_features"] == 3 and ds.stats()["edge_feature_dtype"] == \
        np.dtype(dtype).name
    from_npz = load_npz(save_npz(ds, tmp_path / "d.npz"))
    from_dir = load_dir(save_dir(ds, tmp_path / "d"))
    mapped = from_dir.graph.edge_features  # a view of the mapped file, not a copy
    assert isinstance(mapped, np.memmap) or isinstance(mapped.base, np.memmap)
    for back in (from_npz, from_dir):
        assert back.graph.edge_features.dtype == dtype
        assert np.array_equal(back.graph.edge_features.view(np.uint8),
                              ds.graph.edge_features.view(np.uint8))
        assert np.array_equal(back.graph.indices, ds.graph.indices)


def test_a_dataset_without_edge_features_stores_and_reports_none(tmp_path):
    g = from_edge_list([0, 1], [1, 0], 2)
    ds = make_dataset("t", g.indptr, g.indices, np.ones((2, 1)), [0, 1], [0], [1], [], 2)
    assert "edge_features" not in ds.stats()
    assert "edge_features" not in np.load(save_npz(ds, tmp_path / "d.npz")).files
    assert not (save_dir(ds, tmp_path / "d") / "edge_features.npy").exists()
    assert load_dir(tmp_path / "d").graph.edge_features is None


def _featured_ring(n: int = 12, dtype=np.float32):
    """Ring plus chords, both directions given explicitly: u -> v carries row
    [u, v, u * v] and v -> u row [v, u, u * v], so directions differ."""
    u = np.concatenate([np.arange(n), np.arange(0, n, 3)])
    v = np.concatenate([(np.arange(n) + 1) % n, (np.arange(0, n, 3) + 5) % n])
    src, dst = np.concatenate([u, v]), np.concatenate([v, u])
    table = np.stack([src, dst, src * dst], 1).astype(dtype)
    return from_edge_list(src, dst, n, edge_features=table, remove_duplicates=True)


def test_a_link_split_keeps_the_surviving_edges_rows_from_the_min_max_direction():
    from zerognn_jax._src.data.links import random_link_split

    split = random_link_split(_featured_ring(), val=0.2, test=0.2, seed=3)
    rows = edge_rows(split.graph)
    assert len(rows) == 2 * split.train.shape[0]
    for a, b in split.train.tolist():
        lo, hi = min(a, b), max(a, b)
        assert rows[(a, b)] == rows[(b, a)] == [[lo, hi, lo * hi]]
    for a, b in np.concatenate([split.val.pos, split.test.pos]).tolist():
        assert (a, b) not in rows and (b, a) not in rows


@pytest.mark.parametrize("dtype", [np.float32, BFLOAT16])
def test_a_saved_link_split_reloads_its_edge_features(tmp_path, dtype):
    from zerognn_jax._src.data.links import LinkSplit, random_link_split

    split = random_link_split(_featured_ring(dtype=dtype), val=0.2, test=0.2, seed=1)
    split.save(tmp_path / "s.npz")
    with np.load(tmp_path / "s.npz") as stored:  # the layout of files saved before
        assert str(stored["train_edge_features_dtype"]) == np.dtype(dtype).name
        bits = np.uint16 if dtype == BFLOAT16 else dtype
        assert stored["train_edge_features"].dtype == bits
    back = LinkSplit.load(tmp_path / "s.npz")
    assert back.graph.edge_features.dtype == dtype
    assert np.array_equal(back.graph.indices, split.graph.indices)
    assert np.array_equal(back.graph.edge_features.view(np.uint8),
                          split.graph.edge_features.view(np.uint8))
    plain = random_link_split(from_edge_list([0, 1, 2], [1, 2, 0], 3, make_undirected=True),
                              val=0.0, test=0.0)
    plain.save(tmp_path / "p.npz")
    assert "train_edge_features" not in np.load(tmp_path / "p.npz").files
    assert LinkSplit.load(tmp_path / "p.npz").graph.edge_features is None


def test_sampled_edge_ids_read_the_rows_of_the_sampled_edges():
    from zerognn_jax import SamplerConfig, sample_minibatch

    rng = np.random.default_rng(4)
    src, dst = rng.integers(0, 60, 400), rng.integers(0, 60, 400)
    pair = np.stack([np.minimum(src, dst), np.maximum(src, dst)], 1).astype(np.float32)
    graph = from_edge_list(src, dst, 60, edge_features=pair, make_undirected=True,
                           remove_self_loops=True, remove_duplicates=True)
    plain = graph._replace(edge_features=None)
    config = SamplerConfig((5, 3), edge_ids=True).resolve(graph.max_degree())
    seeds = jnp.arange(0, 60, 2, dtype=jnp.int32)
    valid = jnp.ones(seeds.shape, bool)

    @jax.jit
    def sample(g):
        mb = sample_minibatch(g, seeds, valid, jnp.uint32(9), config, (256, 1024))
        rows = None if g.edge_features is None else \
            [take_edge_rows(g.edge_features, b.eid) for b in mb.blocks]
        return mb, rows

    mb, rows = sample(graph.to_device())
    base, _ = sample(plain.to_device())
    for hop, block in enumerate(mb.blocks):
        np.testing.assert_array_equal(base.blocks[hop].nbr, block.nbr)  # the table moves nothing
        mask = np.asarray(block.mask)
        here = np.broadcast_to(np.asarray(mb.nodes[hop])[:, None], mask.shape)
        there = np.asarray(mb.nodes[hop + 1])[np.asarray(block.nbr)]
        want = np.stack([np.minimum(here, there), np.maximum(here, there)], -1)
        np.testing.assert_array_equal(np.asarray(rows[hop])[mask], want[mask])
        assert mask.sum() > 20


def test_stored_tables_that_do_not_fit_are_refused_naming_the_file(tmp_path):
    ds = _dataset(feats(4))
    path = save_npz(ds, tmp_path / "d.npz")
    arrays = dict(np.load(path))
    arrays["edge_features"] = arrays["edge_features"][:-1]
    np.savez(tmp_path / "short.npz", **arrays)
    with pytest.raises(ValueError, match=r"short.npz holds an invalid dataset: edge_features "
                                         r"have 5 rows but the graph has 6 edges"):
        load_npz(tmp_path / "short.npz")
    arrays = dict(np.load(path), edge_features_dtype=np.str_("float16"))
    np.savez(tmp_path / "kind.npz", **arrays)
    with pytest.raises(ValueError, match="edge_features_dtype says float16, the array holds "
                                         "float32"):
        load_npz(tmp_path / "kind.npz")


def test_edge_positions_finds_each_edge_and_names_a_missing_one():
    from zerognn_jax._src.data.links import edge_positions

    g = from_edge_list([2, 0, 1, 0], [0, 2, 2, 1], 3, sort_neighbors=False)
    src, dst = to_edge_list(g)
    pos = edge_positions(g, [1, 2, 0], [2, 0, 1])
    assert [(int(src[p]), int(dst[p])) for p in pos] == [(1, 2), (2, 0), (0, 1)]
    with pytest.raises(ValueError, match="the graph has no edge 1 -> 0"):
        edge_positions(g, [0, 1], [1, 0])


def test_from_edge_index_takes_pyg_edge_attr_column_by_column():
    from zerognn_jax import from_edge_index

    edge_index = np.array([[0, 2, 1], [1, 0, 2]])  # columns j -> i: row i gets j
    attr = feats(3)
    g = from_edge_index(edge_index, 3, edge_features=attr)
    assert edge_rows(g) == {(1, 0): [attr[0].tolist()], (0, 2): [attr[1].tolist()],
                            (2, 1): [attr[2].tolist()]}
    with pytest.raises(TypeError, match=r"takes PyG's edge_attr as edge_features="):
        from_edge_index(edge_index, 3, edge_attr=attr)


def test_training_leaves_an_unread_edge_table_on_the_host():
    """No built-in model reads edge features yet: the trainer does not upload them."""
    g = random_graph(60, 200, seed=9)
    rs = np.random.default_rng(9)
    ds = make_dataset("e", g.indptr, g.indices, rs.normal(size=(60, 3)),
                      rs.integers(0, 2, 60), np.arange(40), np.arange(40, 50),
                      np.arange(50, 60), 2,
                      edge_features=rs.normal(size=(g.num_edges, 4)).astype(np.float32))
    assert ds.graph.edge_features is not None
    res = train(TrainConfig(hidden=4, layers=1, fanouts=(3,), batch_size=16, epochs=1,
                            eval_mode="none", progress=False), ds)
    assert res.data.graph.edge_features is None
    assert res.dataset.graph.edge_features is not None  # the dataset keeps its table


def test_csr_edge_features_past_float32_are_named_as_an_overflow():
    """Checked as given, before the cast to float32 (which made them inf)."""
    with pytest.raises(ValueError, match=r"^edge_features overflow float32: 1e\+300 at row 1, "
                                         r"column 0 is past its largest magnitude"):
        csr_from_arrays([0, 1, 2], [1, 0], edge_features=np.array([[1.0], [1e300]]))


def test_a_link_split_keeps_weights_as_it_keeps_feature_rows(tmp_path):
    from zerognn_jax._src.data.links import LinkSplit, random_link_split

    featured = _featured_ring()
    src, dst = to_edge_list(featured)
    # each direction its own weight, the feature row's pair coded in it: 100 lo + hi for
    # the (min, max) direction, which the split keeps, 0.5 for the other
    weights = np.where(src < dst, 100.0 * src + dst, 0.5).astype(np.float32)
    graph = csr_from_arrays(featured.indptr, featured.indices, weights,
                            edge_features=featured.edge_features)
    split = random_link_split(graph, val=0.2, test=0.2, seed=3)
    kept = dict(zip(zip(*map(np.ndarray.tolist, to_edge_list(split.graph))),
                    np.asarray(split.graph.weights).tolist()))
    assert len(kept) == 2 * split.train.shape[0]
    for a, b in split.train.tolist():
        lo, hi = min(a, b), max(a, b)
        assert kept[(a, b)] == kept[(b, a)] == 100.0 * lo + hi
    assert edge_rows(split.graph) == edge_rows(random_link_split(featured, val=0.2, test=0.2,
                                                                 seed=3).graph)
    split.save(tmp_path / "s.npz")
    back = LinkSplit.load(tmp_path / "s.npz")
    assert np.array_equal(back.graph.indices, split.graph.indices)
    assert np.array_equal(back.graph.weights, split.graph.weights)
    assert edge_rows(back.graph) == edge_rows(split.graph)
