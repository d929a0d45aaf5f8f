"""ogbn-proteins from OGB's folder layout, and the proteins-like synthetic preset."""

import gzip
from pathlib import Path

import numpy as np
import pytest

from zerognn_jax._src.data.graph import mean_edge_features, to_edge_list
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


def test_mean_edge_features_averages_each_rows_edges():
    from zerognn_jax import from_edge_list

    g = from_edge_list([0, 0, 1], [1, 2, 0], 3, edge_features=[[1.0, 2.0], [3.0, 6.0], [5.0, 5.0]])
    assert mean_edge_features(g).tolist() == [[2.0, 4.0], [5.0, 5.0], [0.0, 0.0]]
