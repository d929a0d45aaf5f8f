"""ogbn-proteins from OGB's folder layout, and the proteins-like synthetic preset."""

import gzip
from pathlib import Path

import numpy as np
import pytest

from zerognn_jax import mean_edge_features
from zerognn_jax._src.data.graph import to_edge_list
from zerognn_jax._src.data.loaders import load_dataset


def write_csv_gz(path: Path, rows) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with gzip.open(path, "wt") as f:
        for row in rows:
            f.write(",".join(str(v) for v in np.atleast_1d(row)) + "\n")


# Edges listed once (OGB's proteins layout), one repeated the other way round (3, 0 after
# 0, 3) and one loop; edge i's features are [i, i / 8, ..., 7 i / 8] + 0.25.
EDGES = [(0, 1), (1, 2), (0, 3), (3, 0), (4, 4), (2, 4)]


def edge_table() -> np.ndarray:
    i = np.arange(len(EDGES), dtype=np.float32)[:, None]
    return i * np.arange(8, dtype=np.float32) / 8 + i + 0.25


def make_fake_proteins(root: Path) -> Path:
    folder = root / "ogbn_proteins"
    raw = folder / "raw"
    write_csv_gz(raw / "edge.csv.gz", EDGES)
    write_csv_gz(raw / "edge-feat.csv.gz", edge_table())
    labels = (np.arange(5 * 112).reshape(5, 112) % 3 == 0).astype(np.int64)
    write_csv_gz(raw / "node-label.csv.gz", labels)
    write_csv_gz(raw / "node_species.csv.gz", [3702, 3702, 9606, 9606, 4932])
    write_csv_gz(raw / "num-node-list.csv.gz", [5])
    write_csv_gz(raw / "num-edge-list.csv.gz", [len(EDGES)])
    for part, ids in (("train", [0, 1]), ("valid", [2, 3]), ("test", [4])):
        write_csv_gz(folder / "split" / "species" / f"{part}.csv.gz", ids)
    return folder


def test_ogbn_proteins_layout_gives_both_directions_the_listed_edge_features(tmp_path):
    make_fake_proteins(tmp_path)
    ds = load_dataset("ogbn-proteins", root=tmp_path)
    assert ds.target_kind == "multilabel" and ds.targets.shape == (5, 112)
    assert ds.output_dim == 112
    assert ds.targets[1].tolist() == [float(j % 3 == 2) for j in range(112)]
    assert ds.features.shape == (5, 1) and np.all(ds.features == 1)
    assert ds.train_idx.tolist() == [0, 1] and ds.val_idx.tolist() == [2, 3]
    src, dst = to_edge_list(ds.graph)
    table, want = edge_table(), {}
    for i in (0, 1, 2, 5):  # (3, 0) repeats (0, 3): the first listing wins; (4, 4) goes
        a, b = EDGES[i]
        want[(a, b)] = want[(b, a)] = table[i].tolist()
    got = {(s, d): row.tolist() for s, d, row in zip(src.tolist(), dst.tolist(),
                                                       ds.graph.edge_features)}
    assert got == want and ds.graph.num_edges == 8
    cached = load_dataset("ogbn-proteins", root=tmp_path)  # from processed/zerognn.npz
    assert (tmp_path / "ogbn_proteins" / "processed" / "zerognn.npz").is_file()
    assert np.array_equal(cached.graph.edge_features, ds.graph.edge_features)
    assert np.array_equal(cached.targets, ds.targets)


def test_ogbn_proteins_refuses_a_feature_file_of_another_length(tmp_path):
    folder = make_fake_proteins(tmp_path)
    write_csv_gz(folder / "raw" / "edge-feat.csv.gz", edge_table()[:-1])
    with pytest.raises(ValueError, match="edge.csv.gz has 6 edges, edge-feat.csv.gz 5 rows"):
        load_dataset("ogbn-proteins", root=tmp_path)
    # of another width (7 columns were read, and cached), or a value the dataset refuses
    write_csv_gz(folder / "raw" / "edge-feat.csv.gz", edge_table()[:, :7])
    with pytest.raises(ValueError, match="edge-feat.csv.gz has 7 columns, expected 8"):
        load_dataset("ogbn-proteins", root=tmp_path)
    table = edge_table()
    table[1, 2] = np.nan
    write_csv_gz(folder / "raw" / "edge-feat.csv.gz", table)
    with pytest.raises(ValueError, match=f"^{folder / 'raw'} holds an invalid dataset: "
                                         f"edge_features contain NaN"):
        load_dataset("ogbn-proteins", root=tmp_path)


def test_mean_edge_features_averages_each_rows_edges():
    from zerognn_jax import from_edge_list

    g = from_edge_list([0, 0, 1], [1, 2, 0], 3, edge_features=[[1.0, 2.0], [3.0, 6.0], [5.0, 5.0]])
    assert mean_edge_features(g).tolist() == [[2.0, 4.0], [5.0, 5.0], [0.0, 0.0]]


def _auc(y: np.ndarray, score: np.ndarray) -> float:
    """ROC-AUC of binary `y` by `score` (Mann-Whitney, ties averaged)."""
    from scipy.stats import rankdata

    pos = y > 0
    ranks = rankdata(score)
    n_pos, n_neg = pos.sum(), (~pos).sum()
    return float((ranks[pos].sum() - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg))


def _linear_auc(ds, inputs: np.ndarray) -> float:
    """Mean test ROC-AUC over targets of a least-squares linear fit on the train nodes."""
    x = np.concatenate([np.ones((inputs.shape[0], 1)), inputs], axis=1)
    w, *_ = np.linalg.lstsq(x[ds.train_idx], ds.targets[ds.train_idx], rcond=None)
    y, score = ds.targets[ds.test_idx], x[ds.test_idx] @ w
    return float(np.mean([_auc(y[:, j], score[:, j]) for j in range(y.shape[1])
                          if 0 < y[:, j].sum() < y.shape[0]]))


@pytest.fixture(scope="module")
def proteins_small():
    return load_dataset("proteins-like", scale=0.02, seed=0)


def test_proteins_like_has_the_shape_and_a_species_split(proteins_small):
    ds = proteins_small
    assert ds.num_nodes == round(132_534 * 0.02) and ds.target_kind == "multilabel"
    assert ds.targets.shape == (ds.num_nodes, 112) and ds.features.shape == (ds.num_nodes, 8)
    assert ds.graph.edge_features.shape == (ds.graph.num_edges, 8)
    assert 0 < ds.graph.edge_features.min() and ds.graph.edge_features.max() < 1
    sizes = (ds.train_idx.size, ds.val_idx.size, ds.test_idx.size)
    assert np.allclose(np.array(sizes) / ds.num_nodes, np.array([86_619, 21_236, 24_679])
                       / 132_534, atol=1e-3)
    src, dst = to_edge_list(ds.graph)  # no edge leaves its species: no split crosses
    part = np.zeros(ds.num_nodes, int)
    part[ds.val_idx], part[ds.test_idx] = 1, 2
    assert np.array_equal(part[src], part[dst])
    rows = {(s, d): i for i, (s, d) in enumerate(zip(src.tolist(), dst.tolist()))}
    table = ds.graph.edge_features
    assert all(np.array_equal(table[i], table[rows[(d, s)]]) for (s, d), i in rows.items())
    again = load_dataset("proteins-like", scale=0.02, seed=0)
    assert np.array_equal(again.graph.edge_features, table)


def test_proteins_like_targets_need_the_edge_features(proteins_small):
    """Neither the node's own features nor its edges' mean features predict the targets;
    the neighbours' features do, and better when each is weighed by its edge's."""
    ds = proteins_small
    src, dst = to_edge_list(ds.graph)
    x, table = ds.features.astype(np.float64), ds.graph.edge_features.astype(np.float64)
    degree = np.maximum(np.bincount(src, minlength=ds.num_nodes), 1)[:, None]

    def neighbour_mean(weight):
        return np.stack([np.bincount(src, weight * x[dst, k], minlength=ds.num_nodes)
                         for k in range(x.shape[1])], 1) / degree

    plain = np.concatenate([x, neighbour_mean(np.ones(src.shape[0]))], 1)
    weighed = np.concatenate([plain] + [neighbour_mean(table[:, k]) for k in range(8)], 1)
    assert abs(_linear_auc(ds, x) - 0.5) < 0.03
    assert abs(_linear_auc(ds, mean_edge_features(ds.graph)) - 0.5) < 0.03
    assert _linear_auc(ds, weighed) > _linear_auc(ds, plain) + 0.05


def test_proteins_like_is_cached_under_root_with_its_edge_features(tmp_path):
    ds = load_dataset("proteins-like", root=tmp_path, scale=0.008, seed=1)
    path = tmp_path / "proteins-like-0.008-1.npz"
    assert path.is_file()
    back = load_dataset("proteins-like", root=tmp_path, scale=0.008, seed=1)
    assert np.array_equal(back.graph.edge_features, ds.graph.edge_features)
    assert np.array_equal(back.targets, ds.targets)
    with pytest.raises(ValueError, match="proteins-like needs >= 1000"):
        load_dataset("proteins-like", scale=0.001)
