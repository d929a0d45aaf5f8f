"""Dataset loaders: Planetoid (local and downloaded), OGB layout, synthetic presets, npz."""

import dataclasses
import functools
import gzip
import http.server
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import threading
import warnings
from pathlib import Path

import numpy as np
import pytest

import zerognn_jax as zg
import zerognn_jax._src.data.loaders as datasets_pkg
from zerognn_jax._src.data import announce, planetoid, storage, writes
from zerognn_jax._src.data.dataset import Dataset, make_dataset
from zerognn_jax._src.data.graph import CSRGraph
from zerognn_jax._src.data.loaders import (
    load_dataset,
    load_npz,
    products_like,
    rmat,
    save_npz,
)
from zerognn_jax._src.data.undirected import undirected_csr

SHARED = Path(__file__).parents[2] / "shared" / "datasets"
PLANETOID = SHARED / "planetoid"
needs_planetoid = pytest.mark.skipif(
    not (PLANETOID / "ind.cora.x").is_file(), reason=f"no Planetoid files in {PLANETOID}"
)


def check_undirected_simple(graph):
    """Rows sorted and duplicate-free, no self-loops, every edge stored both ways."""
    indptr, indices = np.asarray(graph.indptr), np.asarray(graph.indices)
    src = np.repeat(np.arange(graph.num_nodes), np.diff(indptr))
    assert not np.any(src == indices)
    same_row = src[1:] == src[:-1]
    assert np.all(indices[1:][same_row] > indices[:-1][same_row])
    forward = set(zip(src.tolist(), indices.tolist()))
    assert forward == {(b, a) for a, b in forward}


def tiny_arrays(n=6):
    return dict(
        name="t", indptr=np.zeros(n + 1, np.int64), indices=np.zeros(0, np.int64),
        features=np.ones((n, 3), np.float32), labels=np.arange(n) % 2,
        train_idx=[0, 1], val_idx=[2], test_idx=[3, 4], num_classes=2,
    )


# ---------------------------------------------------------------- Planetoid


@needs_planetoid
def test_cora_counts_and_standard_split():
    ds = load_dataset("cora", root=PLANETOID)
    assert ds.num_nodes == 2708 and ds.features.shape == (2708, 1433)
    assert ds.num_classes == 7 and ds.graph.num_edges == 10_556
    assert (ds.train_idx.size, ds.val_idx.size, ds.test_idx.size) == (140, 500, 1000)
    np.testing.assert_array_equal(ds.train_idx, np.arange(140))
    np.testing.assert_array_equal(ds.val_idx, np.arange(140, 640))
    assert ds.test_idx.min() == 1708 and ds.test_idx.max() == 2707
    assert np.bincount(ds.labels[ds.train_idx]).tolist() == [20] * 7
    assert set(np.unique(ds.features).tolist()) == {0.0, 1.0}
    check_undirected_simple(ds.graph)


@needs_planetoid
def test_citeseer_counts_and_unlabelled_gap_nodes():
    ds = load_dataset("CiteSeer", root=PLANETOID)
    assert ds.num_nodes == 3327 and ds.features.shape == (3327, 3703)
    assert ds.num_classes == 6 and ds.graph.num_edges == 2 * 4552
    assert (ds.train_idx.size, ds.val_idx.size, ds.test_idx.size) == (120, 500, 1000)
    gaps = np.flatnonzero(ds.labels == -1)
    assert gaps.size == 15 and gaps.min() >= 2312
    assert not ds.features[gaps].any()
    assert np.all(ds.labels[ds.test_idx] >= 0)


@needs_planetoid
def test_row_normalize():
    ds = load_dataset("cora", root=PLANETOID)
    sums = zg.row_normalize(ds.features).sum(axis=1)
    np.testing.assert_allclose(sums, 1.0, rtol=1e-5)
    assert zg.row_normalize(np.zeros((2, 3))).tolist() == [[0.0] * 3] * 2


def test_row_normalize_refuses_negative_values_by_position():
    """A signed row's sum can be near zero or negative: dividing by it flipped rows and
    blew one up to inf (a probe: tiny's signed features fell from 0.48 to 0.18 test
    accuracy, silently)."""
    x = np.array([[1.0, 2.0, 1.0], [0.5, 0.0, 0.0], [1.0, -1.0, 1e-40]], np.float32)
    with pytest.raises(ValueError, match=r"^normalize_features divides each row of the "
                                         r"features by its sum, which needs values >= 0 "
                                         r"\(counts, bags of words\); found -1 at row 12, "
                                         r"column 1: set normalize_features to False"):
        zg.row_normalize(x, first_row=10)
    np.testing.assert_allclose(zg.row_normalize(x[:2]), [[0.25, 0.5, 0.25], [1, 0, 0]])
    # one's own arrays named "cora": the option, left unset, was on by that name, and the
    # message had said to turn off what the user never turned on
    ds = zg.make_dataset("cora", np.arange(5), np.array([1, 2, 3, 0]), x[[0, 1, 2, 0]],
                         np.array([0, 1, 0, 1]), [0, 1], [2], [3], 2)
    cfg = zg.TrainConfig(hidden=4, layers=1, fanouts=(1,), batch_size=2, epochs=1,
                         eval_mode="none", progress=False)
    with pytest.raises(ValueError, match=r"^normalize_features, on by default for a "
                                         r"dataset named 'cora' as Planetoid's is, divides"):
        zg.train(cfg, ds)


@pytest.fixture
def cora_copy(tmp_path):
    if not (PLANETOID / "ind.cora.x").is_file():
        pytest.skip(f"no Planetoid files in {PLANETOID}")
    folder = tmp_path / "cora"
    folder.mkdir()
    for path in PLANETOID.glob("ind.cora.*"):
        shutil.copyfile(path, folder / path.name)
    return folder


def flip_last_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[-1] ^= 0xFF
    path.write_bytes(bytes(data))


def test_checksum_mismatch_names_file_and_digests(cora_copy):
    flip_last_byte(cora_copy / "ind.cora.graph")
    expected = planetoid.SHA256["ind.cora.graph"]
    with pytest.raises(ValueError, match=rf"checksum mismatch for .*ind\.cora\.graph: "
                                         rf"expected sha256 {expected}, got [0-9a-f]{{64}}; "
                                         rf"the file is damaged or another: remove it and "
                                         rf"fetch it again with `zerognn data info cora "
                                         rf"--root .* --download`"):
        load_dataset("cora", root=cora_copy)


def test_missing_planetoid_file_suggests_download(cora_copy):
    (cora_copy / "ind.cora.ty").unlink()
    with pytest.raises(FileNotFoundError, match=r"ind\.cora\.ty not found .*download=True"):
        load_dataset("cora", root=cora_copy)
    # a file given for the folder was reported as its eight files missing, with a
    # download into the file's path suggested
    file = cora_copy / "ind.cora.x"
    for download in (False, True):
        with pytest.raises(NotADirectoryError, match=rf"^root {re.escape(str(file))} is a "
                                                     rf"file, not the folder of the "
                                                     rf"ind\.cora\.\* files$"):
            load_dataset("cora", root=file, download=download)


# ------------------------------------------------------- download over HTTP


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass


@pytest.fixture
def serve():
    """serve(folder) -> base URL of an HTTP server on 127.0.0.1 for `folder`."""
    servers = []

    def start(folder: Path) -> str:
        handler = functools.partial(_QuietHandler, directory=str(folder))
        server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
        threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True).start()
        servers.append(server)
        return f"http://127.0.0.1:{server.server_address[1]}"

    yield start
    for server in servers:
        server.shutdown()
        server.server_close()


@needs_planetoid
def test_download_fetches_verifies_and_is_quiet(tmp_path, serve, monkeypatch, capfd):
    monkeypatch.setenv(planetoid.URL_ENV, serve(PLANETOID))
    root = tmp_path / "cache"
    ds = load_dataset("cora", root=root, download=True)
    assert ds.num_nodes == 2708 and ds.graph.num_edges == 10_556
    assert sorted(p.name for p in root.iterdir()) == sorted(
        f"ind.cora.{part}" for part in ("x", "y", "tx", "ty", "allx", "ally", "graph",
                                        "test.index"))
    assert capfd.readouterr().err == ""


@needs_planetoid
def test_download_only_fetches_missing_files(tmp_path, serve, cora_copy):
    (cora_copy / "ind.cora.allx").unlink()
    before = (cora_copy / "ind.cora.x").stat().st_mtime_ns
    ds = planetoid.load_planetoid("cora", cora_copy, download=True, base_url=serve(PLANETOID))
    assert ds.num_nodes == 2708
    assert (cora_copy / "ind.cora.allx").is_file()
    assert (cora_copy / "ind.cora.x").stat().st_mtime_ns == before


def test_download_checksum_mismatch_leaves_nothing_behind(tmp_path, serve, cora_copy):
    flip_last_byte(cora_copy / "ind.cora.x")
    root = tmp_path / "cache"
    with pytest.raises(ValueError, match=r"checksum mismatch for .*ind\.cora\.x: expected"):
        planetoid.load_planetoid("cora", root, download=True, base_url=serve(cora_copy))
    assert not root.exists()  # not even the folder the download made


def test_download_http_error_is_reported(tmp_path, serve):
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(ConnectionError, match=r"cannot download http://127\.0\.0\.1:\d+/"
                                              r"ind\.cora\.x: HTTP Error 404"):
        planetoid.load_planetoid("cora", tmp_path / "cache", download=True, base_url=serve(empty))
    assert not any((tmp_path / "cache").glob("*"))


# ---------------------------------------------------------------------- OGB


def write_csv_gz(path: Path, rows) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with gzip.open(path, "wt") as f:
        for row in rows:
            f.write(",".join(str(v) for v in np.atleast_1d(row)) + "\n")


def write_ogb_split(folder: Path, split: str, train, valid, test) -> None:
    for part, ids in (("train", train), ("valid", valid), ("test", test)):
        write_csv_gz(folder / "split" / split / f"{part}.csv.gz", ids)


def make_fake_arxiv(root: Path) -> Path:
    folder = root / "ogbn_arxiv"
    raw = folder / "raw"
    # Directed citations with a reciprocal pair (0-1), a duplicate (2->3) and a self-loop.
    write_csv_gz(raw / "edge.csv.gz", [(0, 1), (1, 0), (2, 3), (2, 3), (4, 4), (4, 0)])
    write_csv_gz(raw / "node-feat.csv.gz", np.arange(15, dtype=np.float32).reshape(5, 3) / 4)
    write_csv_gz(raw / "node-label.csv.gz", [3, 0, 39, 3, 1])
    write_csv_gz(raw / "num-node-list.csv.gz", [5])
    write_csv_gz(raw / "num-edge-list.csv.gz", [6])
    write_ogb_split(folder, "time", [0, 1], [2], [3, 4])
    return folder


def test_ogb_arxiv_layout_is_read_and_symmetrised(tmp_path):
    make_fake_arxiv(tmp_path)
    ds = load_dataset("ogbn-arxiv", root=tmp_path)
    assert ds.num_nodes == 5 and ds.num_classes == 40
    assert ds.graph.num_edges == 6  # {0,1}, {2,3}, {0,4} both ways
    check_undirected_simple(ds.graph)
    np.testing.assert_allclose(ds.features[1], [0.75, 1.0, 1.25])
    assert ds.labels.tolist() == [3, 0, 39, 3, 1]
    assert ds.train_idx.tolist() == [0, 1] and ds.test_idx.tolist() == [3, 4]


def test_ogb_parsed_form_is_cached_and_refreshed(tmp_path, monkeypatch):
    folder = make_fake_arxiv(tmp_path)
    load_dataset("ogbn-arxiv", root=tmp_path)
    cache = folder / "processed" / "zerognn.npz"
    assert cache.is_file()
    from zerognn_jax._src.data import ogb

    def fail(*args):
        raise AssertionError("raw files read again")

    monkeypatch.setattr(ogb, "load_ogb", fail)
    assert load_dataset("ogbn-arxiv", root=tmp_path).num_nodes == 5
    monkeypatch.undo()
    write_csv_gz(folder / "raw" / "node-label.csv.gz", [1, 1, 1, 1, 1])
    os.utime(cache, (0, 0))  # the cache is now older than the raw files
    assert load_dataset("ogbn-arxiv", root=tmp_path).labels.tolist() == [1] * 5
    # a file replaced by one of an older time (an archive extracted again, `cp -p`) is
    # told apart by the record of the files the cache was made from
    labels = folder / "raw" / "node-label.csv.gz"
    write_csv_gz(labels, [2, 2, 2, 2, 2])
    os.utime(labels, (1, 1))
    assert load_dataset("ogbn-arxiv", root=tmp_path).labels.tolist() == [2] * 5
    monkeypatch.setattr(ogb, "load_ogb", fail)  # and read from the cache from then on
    assert load_dataset("ogbn-arxiv", root=tmp_path).labels.tolist() == [2] * 5
    # a cache of files as they were, which could not be written anew, is not vouched for
    monkeypatch.undo()
    write_csv_gz(labels, [3, 3, 3, 3, 3])
    os.utime(labels, (2, 2))
    from zerognn_jax._src.data import loaders
    monkeypatch.setattr(loaders, "save_npz", lambda *a, **k: (_ for _ in ()).throw(
        OSError(28, "No space left on device")))
    with pytest.warns(zg.CacheWarning):
        assert load_dataset("ogbn-arxiv", root=tmp_path).labels.tolist() == [3] * 5
    monkeypatch.undo()
    assert load_dataset("ogbn-arxiv", root=tmp_path).labels.tolist() == [3] * 5


def test_ogb_products_layout(tmp_path):
    folder = tmp_path / "ogbn_products"
    write_csv_gz(folder / "raw" / "edge.csv.gz", [(0, 1), (1, 2), (2, 3)])
    write_csv_gz(folder / "raw" / "node-feat.csv.gz", np.ones((4, 2)))
    write_csv_gz(folder / "raw" / "node-label.csv.gz", [46, 0, 1, 2])
    write_csv_gz(folder / "raw" / "num-node-list.csv.gz", [4])
    write_ogb_split(folder, "sales_ranking", [0], [1], [2, 3])
    ds = load_dataset("ogbn-products", root=tmp_path)
    assert ds.num_classes == 47 and ds.graph.num_edges == 6


def test_ogb_papers100m_npz_layout_with_nan_labels(tmp_path):
    folder = tmp_path / "ogbn_papers100M"
    (folder / "raw").mkdir(parents=True)
    np.savez(folder / "raw" / "data.npz", edge_index=np.array([[0, 1, 3], [1, 2, 3]]),
             node_feat=np.ones((4, 2), np.float16), num_nodes_list=np.array([4]),
             num_edges_list=np.array([3]), node_year=np.zeros((4, 1), np.int64))
    np.savez(folder / "raw" / "node-label.npz",
             node_label=np.array([[5.0], [np.nan], [171.0], [np.nan]], np.float32))
    write_ogb_split(folder, "time", [0], [2], [])
    ds = load_dataset("ogbn-papers100M", root=tmp_path)
    assert ds.labels.tolist() == [5, -1, 171, -1] and ds.num_classes == 172
    assert ds.graph.num_edges == 4 and ds.features.dtype == np.float32


def test_ogb_npz_missing_key(tmp_path):
    raw = tmp_path / "ogbn_papers100M" / "raw"
    raw.mkdir(parents=True)
    np.savez(raw / "data.npz", edge_index=np.zeros((2, 0), np.int64))
    with pytest.raises(ValueError, match=r"data\.npz lacks key\(s\) node_feat, num_nodes_list"):
        load_dataset("ogbn-papers100M", root=tmp_path)


def test_ogb_missing_file_and_root(tmp_path):
    folder = make_fake_arxiv(tmp_path)
    (folder / "raw" / "node-feat.csv.gz").unlink()
    # a zip unpacked by hand (to arxiv/) is told of the ogb package's rename
    with pytest.raises(FileNotFoundError, match=r"OGB file .*ogbn_arxiv/raw/node-feat\.csv\.gz "
                                                r"not found \(.*to arxiv/ say, is renamed "
                                                r"ogbn_arxiv/\)"):
        load_dataset("ogbn-arxiv", root=tmp_path)
    with pytest.raises(ValueError, match=r"ogbn-arxiv needs root="):
        load_dataset("ogbn-arxiv")


def _cut_short(path: Path) -> None:
    path.write_bytes(path.read_bytes()[:20])


@pytest.mark.parametrize("spoil, message", [
    (lambda raw: _cut_short(raw / "edge.csv.gz"),
     r"edge\.csv\.gz is not a readable OGB file: Compressed file ended"),
    (lambda raw: (raw / "node-feat.csv.gz").write_bytes(b"no gzip"),
     r"node-feat\.csv\.gz is not a readable OGB file: Not a gzipped file"),
    (lambda raw: write_csv_gz(raw / "edge.csv.gz", [0, 1, 2]),
     r"edge\.csv\.gz has 1 columns, expected 2"),
    (lambda raw: write_csv_gz(raw / "edge.csv.gz", [(0, 1, 0), (1, 2, 0)]),
     r"edge\.csv\.gz has 3 columns, expected 2"),
    (lambda raw: write_csv_gz(raw / "node-label.csv.gz", [3, 0.7, 39, 3, 1]),
     r"node-label\.csv\.gz has a class id that is not a whole number: 0\.7"),
    (lambda raw: write_csv_gz(raw / "edge.csv.gz", [(0, 1), (1, 5)]),
     r"edge\.csv\.gz: edge ends span \[0, 5\], outside the 5 nodes \[0, 5\)"),
    (lambda raw: write_csv_gz(raw.parent / "split" / "time" / "test.csv.gz", [(3, 4)]),
     r"test\.csv\.gz has 2 columns, expected 1"),  # was read as the ids 3 and 4
])
def test_ogb_files_that_do_not_read_are_named(tmp_path, spoil, message):
    spoil(make_fake_arxiv(tmp_path) / "raw")
    with pytest.raises(ValueError, match=message):
        load_dataset("ogbn-arxiv", root=tmp_path)


def test_an_empty_ogb_edge_file_is_an_edgeless_graph(tmp_path):
    raw = make_fake_arxiv(tmp_path) / "raw"
    write_csv_gz(raw / "edge.csv.gz", [])
    assert load_dataset("ogbn-arxiv", root=tmp_path).graph.num_edges == 0


def _fake_papers(root: Path, *, edges=((0, 1, 3), (1, 2, 3)), labels=(5.0, np.nan, 171.0, 0)):
    raw = root / "ogbn_papers100M" / "raw"
    raw.mkdir(parents=True)
    np.savez(raw / "data.npz", edge_index=np.array(edges, np.int64).reshape(2, -1),
             node_feat=np.ones((4, 2), np.float32), num_nodes_list=np.array([4]))
    np.savez(raw / "node-label.npz", node_label=np.float32(labels)[:, None])
    write_ogb_split(root / "ogbn_papers100M", "time", [0], [2], [])
    return raw


def test_ogb_papers100m_files_that_do_not_read_are_named(tmp_path):
    """Archives cut short were tracebacks (BadZipFile); an edgeless graph an IndexError."""
    for name in ("data.npz", "node-label.npz"):
        raw = _fake_papers(tmp_path / name)
        _cut_short(raw / name)
        with pytest.raises(ValueError, match=rf"{name} is not a readable .*: File is not a zip"):
            load_dataset("ogbn-papers100M", root=tmp_path / name)
    _fake_papers(tmp_path / "none", edges=((), ()))
    assert load_dataset("ogbn-papers100M", root=tmp_path / "none").graph.num_edges == 0
    raw = _fake_papers(tmp_path / "objects")  # was "cannot create an OBJECT array ..."
    np.savez(raw / "data.npz", edge_index=np.array([[0, 1], [1, 2]], object),
             node_feat=np.ones((4, 2), np.float32), num_nodes_list=np.array([4]))
    with pytest.raises(ValueError, match=r"data\.npz:edge_index is not a readable array: "
                                         r"it holds Python objects \(object\)"):
        load_dataset("ogbn-papers100M", root=tmp_path / "objects")


def test_a_missing_or_misshapen_ogb_papers100m_input_is_named_as_such(tmp_path):
    """A missing split or label file was read inside the converted folder's writer and
    reported as a failed write (exit 1); a label file of two columns as twice the rows."""
    raw = _fake_papers(tmp_path / "a")
    (raw.parent / "split" / "time" / "valid.csv.gz").unlink()
    with pytest.raises(FileNotFoundError, match=r"OGB file .*valid\.csv\.gz not found"):
        load_dataset("ogbn-papers100M", root=tmp_path / "a")
    raw = _fake_papers(tmp_path / "b")
    np.savez(raw / "node-label.npz", node_label=np.zeros((4, 2), np.float32))
    with pytest.raises(ValueError, match=r"node-label\.npz has \(2,\) values a row, "
                                         r"expected one class id a node"):
        load_dataset("ogbn-papers100M", root=tmp_path / "b")


def test_an_invalid_ogb_papers100m_is_named_by_its_raw_files_and_not_kept(tmp_path):
    """It was named by the converted folder, which stayed: a dataset nobody wrote; now by
    the dataset's folder (its raw and split files)."""
    raw = _fake_papers(tmp_path, labels=(5.0, np.nan, 172.0, 0))
    with pytest.raises(ValueError, match=rf"^{raw.parent} holds an invalid dataset: labels "
                                         rf"must lie in \[-1, 172\), found range "
                                         rf"\[-1, 172\]$"):
        load_dataset("ogbn-papers100M", root=tmp_path)
    assert list((raw.parent / "processed").iterdir()) == []


def test_a_parsed_ogb_cache_that_does_not_read_is_parsed_again(tmp_path):
    """A cache cut short (a copy interrupted) beside unchanged files failed every later
    load with "not a readable zerognn dataset file", never saying it was the library's
    own; it is parsed from the files again, with a warning, and written anew."""
    make_fake_arxiv(tmp_path)
    first = load_dataset("ogbn-arxiv", root=tmp_path)
    cache = tmp_path / "ogbn_arxiv" / "processed" / "zerognn.npz"
    _cut_short(cache)
    with pytest.warns(zg.CacheWarning, match=r"the parsed cache .*zerognn\.npz does not "
                                            r"read \(.*\): the dataset is parsed from its "
                                            r"files again"):
        again = load_dataset("ogbn-arxiv", root=tmp_path)
    assert again.labels.tolist() == first.labels.tolist()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the cache written anew reads without a word
        assert load_dataset("ogbn-arxiv", root=tmp_path).num_nodes == first.num_nodes


def test_ogb_data_whose_cache_cannot_be_written_are_used_without_it(tmp_path):
    """A folder the user may not write (a team's copy) refused the whole dataset."""
    folder = make_fake_arxiv(tmp_path)
    (folder / "processed").write_text("in the way")  # as a folder that cannot be written
    with pytest.warns(zg.CacheWarning, match=r"could not write the cache .*zerognn\.npz .*"
                                            r"read from their files again next time"):
        ds = load_dataset("ogbn-arxiv", root=tmp_path)
    assert ds.labels.tolist() == [3, 0, 39, 3, 1]
    # a synthetic preset's root cache, of every kind: likewise
    blocked = tmp_path / "file"
    blocked.write_text("in the way")
    for load, name in ((load_dataset, "products-like"), (zg.load_graphs, "molhiv-like"),
                       (zg.load_hetero_dataset, "mag-like")):
        with pytest.warns(zg.CacheWarning, match="could not write the cache .*generated "
                                                 "again next time"):
            assert load(name, root=str(blocked / "sub"), scale=0.001) is not None


def test_building_a_dataset_is_announced_and_reading_its_cache_is_not(tmp_path, monkeypatch):
    """Generating products-like at scale 1 took 46 s on a 2-core machine with nothing
    printed: each loader now tells `log` when it builds, of every kind (at once here;
    after a second by default, the next test)."""
    monkeypatch.setattr(announce, "ANNOUNCE_AFTER_S", 0)
    done = r"done in \d+\.\d s$"
    cases = ((load_dataset, "products-like", "products-like-0.001-3.npz"),
             (zg.load_graphs, "molhiv-like", "molhiv-like-0.001-3.npz"),
             (zg.load_hetero_dataset, "mag-like", "mag-like-0.001-3.npz"))
    for load, name, cache in cases:
        lines = []
        first = load(name, root=str(tmp_path), scale=0.001, seed=3, log=lines.append)
        what = f"{name} at scale 0.001 (seed 3)"
        assert lines[0] == f"{what}: generating, into {tmp_path / cache}", lines
        assert len(lines) == 2 and re.fullmatch(rf"{re.escape(what)}: {done}", lines[1])
        again = []
        assert load(name, root=str(tmp_path), scale=0.001, seed=3, log=again.append) \
            .stats() == first.stats()
        assert again == []  # read from its cache
        unkept = []
        load(name, scale=0.001, seed=3, log=unkept.append)  # no root: built, not cached
        assert unkept[0] == f"{what}: generating" and re.search(done, unkept[1])
    parsed = []
    make_fake_arxiv(tmp_path)
    load_dataset("ogbn-arxiv", root=tmp_path, log=parsed.append)
    assert parsed[0] == (f"ogbn-arxiv: parsing OGB's files, into "
                         f"{tmp_path / 'ogbn_arxiv' / 'processed' / 'zerognn.npz'}")
    tiny = []  # the embedded default builds in well under a second: no lines
    load_dataset("tiny", log=tiny.append)
    assert tiny == []


def test_a_build_is_announced_once_it_has_taken_a_while():
    """Builds shorter than the delay (small presets, options refused before any work)
    log nothing; a longer one logs its start from the timer, then its time."""
    quick = []
    with announce.announcing("quick", quick.append, after=60):
        pass
    assert quick == []
    lines, seen = [], threading.Event()

    def log(line):
        lines.append(line)
        seen.set()

    with announce.announcing("slow", log, into="p.npz", after=0.01):
        assert seen.wait(60), "the start line never came"
    assert lines[0] == "slow: generating, into p.npz"
    assert len(lines) == 2 and re.fullmatch(r"slow: done in \d+\.\d s", lines[1])
    # the build's own line brings its start forward
    nested = []
    with announce.announcing("papers", nested.append, after=60) as say:
        say("papers CSR: 1 bucket")
    assert nested[:2] == ["papers: generating", "papers CSR: 1 bucket"] and len(nested) == 3


def test_a_failed_build_announces_its_start_only(tmp_path, monkeypatch):
    monkeypatch.setattr(announce, "ANNOUNCE_AFTER_S", 0)

    def broken(scale, seed):
        raise ValueError("broken generator")
    monkeypatch.setattr(datasets_pkg, "products_like", broken)
    lines = []
    with pytest.raises(ValueError, match="broken generator"):
        load_dataset("products-like", root=tmp_path, scale=0.5, log=lines.append)
    assert lines == [f"products-like at scale 0.5 (seed 0): generating, into "
                     f"{tmp_path / 'products-like-0.5-0.npz'}"]
    assert list(tmp_path.iterdir()) == []


# ---------------------------------------------------------------- synthetic


def test_products_like_counts_scale_linearly():
    ds = products_like(scale=0.001, seed=0)
    assert ds.num_nodes == 2449 and ds.features.shape == (2449, 100)
    assert ds.features.dtype == np.float32 and ds.num_classes == 47
    assert abs(ds.graph.num_edges / 2 / 61_859 - 1) < 0.01
    assert (ds.train_idx.size, ds.val_idx.size) == (197, 39)
    assert ds.test_idx.size == 2449 - 197 - 39
    assert ds.labels.min() >= 0 and ds.labels.max() < 47
    check_undirected_simple(ds.graph)


def test_products_like_is_deterministic_per_seed():
    a, b, c = products_like(0.001, seed=3), products_like(0.001, seed=3), products_like(0.001, 4)
    for name in ("features", "labels", "train_idx", "test_idx"):
        np.testing.assert_array_equal(getattr(a, name), getattr(b, name))
    np.testing.assert_array_equal(a.graph.indices, b.graph.indices)
    assert not np.array_equal(a.labels, c.labels)


def test_products_like_is_homophilous_with_power_law_degrees():
    ds = products_like(0.01, seed=0)
    g = ds.graph
    degrees = np.diff(g.indptr)
    src = np.repeat(np.arange(g.num_nodes), degrees)
    assert np.mean(ds.labels[src] == ds.labels[g.indices]) > 0.5
    assert degrees.max() > 20 * np.median(degrees)


def test_products_like_rejects_tiny_scale():
    with pytest.raises(ValueError, match=r"scale=0\.0001 gives 245 nodes"):
        products_like(scale=1e-4)


@pytest.mark.parametrize("scale", [float("nan"), float("inf"), -1.0])
@pytest.mark.parametrize("name", ["products-like", "proteins-like", "papers100m-like",
                                  "rmat", "molhiv-like", "molpcba-like", "mag-like",
                                  "igbh-like", "shop-like"])
def test_a_scale_that_is_no_size_is_refused_by_every_preset(name, scale):
    """Each preset names the scale it cannot use, in one message (NaN once failed inside
    round(); infinity was once said to give 0 nodes)."""
    import zerognn_jax as zg

    load = {"molhiv-like": zg.load_graphs, "molpcba-like": zg.load_graphs,
            "mag-like": zg.load_hetero_dataset, "igbh-like": zg.load_hetero_dataset,
            "shop-like": zg.load_hetero_dataset}.get(name, load_dataset)
    with pytest.raises(ValueError, match=rf"^scale must be positive and finite, got {scale}$"):
        load(name, scale=scale)


def test_tiny_preset():
    ds = load_dataset("tiny")
    assert ds.name == "tiny" and 4000 < ds.num_nodes < 6000


def test_products_like_cache_in_root(tmp_path, monkeypatch):
    ds = load_dataset("products-like", root=tmp_path, scale=0.001, seed=1)
    path = tmp_path / "products-like-0.001-1.npz"
    assert path.is_file()
    monkeypatch.setattr(datasets_pkg, "products_like", None)  # a rebuild would fail
    again = load_dataset("products-like", root=tmp_path, scale=0.001, seed=1)
    np.testing.assert_array_equal(again.features, ds.features)


def test_rmat_graph500_shape_and_determinism():
    a, b = rmat(12, edge_factor=8, seed=1), rmat(12, edge_factor=8, seed=1)
    assert a.num_nodes == 4096 and a.name == "rmat-12"
    assert 0 < a.graph.num_edges <= 2 * 8 * 4096
    np.testing.assert_array_equal(a.graph.indices, b.graph.indices)
    check_undirected_simple(a.graph)
    degrees = np.diff(a.graph.indptr)
    assert degrees.max() > 10 * degrees.mean()  # skewed, as R-MAT should be
    assert load_dataset("rmat", scale=2**-9).num_nodes == 4096


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        (dict(scale_log2=0), r"scale_log2 must be in \[1, 30\], got 0"),
        (dict(scale_log2=5, edge_factor=0), r"edge_factor must be >= 1, got 0"),
        (dict(scale_log2=5, a=0.6, b=0.3, c=0.3), r"a \+ b \+ c <= 1, got 0\.6, 0\.3, 0\.3"),
    ],
)
def test_rmat_rejects_bad_parameters(kwargs, match):
    with pytest.raises(ValueError, match=match):
        rmat(**kwargs)


def test_undirected_csr_checks_ids():
    g = undirected_csr(np.array([0, 2, 2]), np.array([2, 0, 2]), 3)
    assert np.asarray(g.indices).tolist() == [2, 0]
    with pytest.raises(ValueError, match=r"dst ids span \[0, 3\], outside \[0, 3\)"):
        undirected_csr(np.array([0, 1]), np.array([3, 0]), 3)
    with pytest.raises(ValueError, match=r"edge ids must be integers, got float64"):
        undirected_csr(np.array([0.0]), np.array([1]), 3)


# -------------------------------------------------------------- validation


@pytest.mark.parametrize(
    ("change", "match"),
    [
        (dict(features=np.ones((5, 3))), r"features have 5 rows but the graph has 6 nodes"),
        (dict(labels=np.zeros(7, np.int64)), r"labels have 7 entries but the graph has 6 "
                                              r"nodes; the graph's nodes are its indptr's"),
        (dict(features=np.where(np.eye(6, 3) > 0, np.nan, 1.0)),
         r"features contain NaN or inf \(3 entries; first at row 0, column 0\)"),
        (dict(features=np.full((6, 3), np.inf)), r"features contain NaN or inf"),
        (dict(train_idx=[]), r"train_idx is empty"),
        (dict(val_idx=[1, 2]), r"train and val splits overlap in 1 nodes \(first: 1\)"),
        (dict(test_idx=[2, 2]), r"test_idx lists node 2 more than once"),
        (dict(test_idx=[6]), r"test_idx has node ids outside \[0, 6\)"),
        (dict(labels=np.array([0, 1, 2, 0, 1, 0])), r"labels must lie in \[-1, 2\)"),
        (dict(labels=np.array([1, 2, 2, 1, 1, 2])),
         r"^labels must lie in \[-1, 2\), found range \[1, 2\]: they look numbered from 1; "
         r"class ids run from 0 \(give labels - 1\), and -1 marks a node without one$"),
        (dict(labels=np.array([0, 1, 2**32, 0, 1, 0]), num_classes=2**31),
         r"labels must lie in \[-1, 2147483648\), found range \[0, 4294967296\]"),
        (dict(num_classes=2**32 + 1), r"num_classes must be at most 2\*\*31"),
        (dict(num_classes=0), r"^num_classes must be at least 1 \(the width of the model's "),
    ],
)
def test_dataset_validation_names_the_problem(change, match):
    with pytest.raises(ValueError, match=match):
        make_dataset(**{**tiny_arrays(), **change})


def test_a_graph_of_no_labels_is_for_link_prediction_and_a_node_run_says_so(tmp_path):
    """Every label -1 and no split: a dataset (link prediction needs neither), which a
    node run refuses by name (with a class labelled, an empty train split stays
    refused: the table above)."""
    bare = make_dataset(**{**tiny_arrays(), "name": "bare", "labels": np.full(6, -1),
                           "train_idx": [], "val_idx": [], "test_idx": [], "num_classes": 1})
    assert bare.train_idx.size == 0
    with pytest.raises(ValueError, match=r"^dataset 'bare' labels none of its nodes: a node "
                                         r"task has nothing to train on \(a graph built for "
                                         r"link prediction alone trains with task 'link'\)$"):
        zg.train(zg.TrainConfig(epochs=1, progress=False, fanouts=(2,), layers=1), bare)
    # read from a file, it is named as the run named it (its path), not by its own name
    zg.save_npz(bare, tmp_path / "bare.npz")
    with pytest.raises(ValueError, match=rf"^dataset '{re.escape(str(tmp_path))}/bare.npz' "
                                         rf"labels none of its nodes"):
        zg.train(zg.TrainConfig(dataset=str(tmp_path / "bare.npz"), epochs=1,
                                progress=False, fanouts=(2,), layers=1))
    empty = make_dataset("empty", np.zeros(1, np.int64), np.zeros(0, np.int64),
                         np.zeros((0, 3)), np.zeros(0, np.int64), [], [], [], 1)
    with pytest.raises(ValueError, match=r"^dataset 'empty' has no nodes: a node task has "
                                         r"nothing to train on$"):
        zg.train(zg.TrainConfig(epochs=1, progress=False, fanouts=(2,), layers=1), empty)


def test_a_node_run_refuses_a_dataset_of_one_class():
    """num_classes 1: a softmax over one class has a loss of 0 whatever the model gives
    (a run trained at loss 0.0 and accuracy 1.0 without a word)."""
    one = make_dataset(**{**tiny_arrays(), "name": "one", "labels": np.zeros(6, np.int64),
                          "num_classes": 1})
    with pytest.raises(ValueError, match=r"^dataset 'one' has one class \(num_classes 1\): a "
                                         r"classifier over one class has a loss of 0"):
        zg.train(zg.TrainConfig(epochs=1, progress=False, fanouts=(2,), layers=1), one)


def test_tables_longer_than_the_graph_are_named_before_the_splits():
    """from_edge_index without num_nodes leaves out a last isolated node: 8 feature rows
    on its 7-node graph were named by the test split that reached node 7."""
    graph = zg.from_edge_index(np.array([[0, 1, 5], [1, 6, 4]]))  # node 7 has no edge
    assert graph.num_nodes == 7
    arrays = dict(tiny_arrays(8), indptr=graph.indptr, indices=graph.indices,
                  test_idx=[3, 7])
    fix = (r"the graph's nodes are its indptr's entries less one \(8 - 1\), and a graph "
           r"built from edges has the largest id \+ 1 nodes unless told: pass ")
    with pytest.raises(ValueError, match=rf"^features have 8 rows but the graph has 7 nodes; "
                                         rf"{fix}from_edge_index\(\.\.\., num_nodes=8\)$"):
        make_dataset(**arrays)
    with pytest.raises(ValueError, match=rf"^labels have 8 entries but the graph has 7 nodes; "
                                         rf"{fix}"):
        make_dataset(**{**arrays, "features": np.ones((7, 3), np.float32)})
    with pytest.raises(ValueError, match=r"^targets have 8 rows but the graph has 7 nodes; "):
        make_dataset(**{**arrays, "features": np.ones((7, 3), np.float32), "labels": None,
                        "num_classes": None, "targets": np.zeros(8),
                        "target_kind": "regression"})
    with pytest.raises(ValueError, match=r"^features have 6 rows but the graph has 7 nodes; "
                                         r"give one per node$"):
        make_dataset(**{**arrays, "features": np.ones((6, 3), np.float32)})
    # a 1-D table is named as such, not by its length as a row count
    with pytest.raises(ValueError, match=r"^features must be 2-D \[num_nodes, dim\], got "
                                         r"shape \(21,\)$"):
        make_dataset(**{**arrays, "features": np.ones(21, np.float32)})


@pytest.mark.parametrize(("graph_at", "given", "tables"), [
    (0, "CSRGraph", True), (1, "CSRGraph", True), (0, "csr_array", False),
    (0, "NoneType", False),
])
def test_make_dataset_names_a_graph_given_for_its_csr_arrays(graph_at, given, tables):
    """A CSRGraph in place of indptr was NumPy's "setting an array element with a
    sequence"; make_dataset takes the arrays (the graph's weights and edge features
    would be a second way to give what `weights=` and `edge_features=` give)."""
    arrays = tiny_arrays()
    graph = zg.from_edge_list([0, 1], [1, 0], 6)
    given_value = {"CSRGraph": graph, "csr_array": zg.to_scipy(graph), "NoneType": None}[given]
    arrays[("indptr", "indices")[graph_at]] = given_value
    fix = r", weights=g\.weights, edge_features=g\.edge_features" if tables else ""
    with pytest.raises(TypeError, match=rf"^make_dataset takes the graph as its CSR arrays, "
                                        rf"got {given} as {('indptr', 'indices')[graph_at]}: "
                                        rf"for a graph g \(a CSRGraph, a SciPy CSR matrix\) "
                                        rf"pass g\.indptr, g\.indices{fix}$"):
        make_dataset(**arrays)
    built = make_dataset(**{**tiny_arrays(), "indptr": graph.indptr, "indices": graph.indices})
    assert built.graph.num_edges == 2


@pytest.mark.parametrize("split", ("train_idx", "val_idx", "test_idx"))
def test_a_boolean_mask_given_for_a_split_says_how_to_get_its_ids(split):
    """PyG's train_mask is refused (no silent conversion), by make_dataset and by the
    Dataset constructor alike, with the way to its ids."""
    arrays = tiny_arrays()
    mask = np.isin(np.arange(6), arrays[split])
    message = (rf"^{split} must be a 1-D integer array, got bool\[6\]; a boolean mask\? "
               r"pass np\.flatnonzero\(mask\)$")
    with pytest.raises(ValueError, match=message):
        make_dataset(**{**arrays, split: mask})
    good = make_dataset(**arrays)
    with pytest.raises(ValueError, match=message):
        dataclasses.replace(good, **{split: mask})
    assert make_dataset(**{**arrays, split: np.flatnonzero(mask)}).num_nodes == 6


def test_a_dataset_built_directly_names_what_is_not_an_array():
    """A list split was an AttributeError (make_dataset converts them)."""
    good = make_dataset(**tiny_arrays())
    with pytest.raises(ValueError, match=r"^train_idx must be an array, got a list \(make_"):
        zg.Dataset(good.name, good.graph, good.features, good.labels, [0, 1], good.val_idx,
                   good.test_idx, good.num_classes)
    labels = np.asarray(good.labels).copy()
    labels[good.train_idx[1]] = -1
    with pytest.raises(ValueError, match=rf"^train_idx contains 1 unlabelled nodes \(label "
                                         rf"-1; first: node {good.train_idx[1]}\)"):
        make_dataset(**{**tiny_arrays(), "labels": labels})
    # a fractional class count passed, and the loss named a [3, 47.5] shape instead
    with pytest.raises(ValueError, match=r"^num_classes must be a positive integer, got 2\.5$"):
        dataclasses.replace(good, num_classes=2.5)
    with pytest.raises(ValueError, match=r"^num_classes must be at most 2\*\*31 \(labels are "
                                         r"stored as int32\), got 4294967297$"):
        dataclasses.replace(good, num_classes=2**32 + 1)


# ---------------------------------------------------------------- npz files


def test_npz_round_trip(tmp_path):
    ds = products_like(0.001, seed=2)
    path = save_npz(ds, tmp_path / "sub" / "d.npz")
    back = load_npz(path)
    assert back.name == ds.name and back.num_classes == ds.num_classes
    for name in ("features", "labels", "train_idx", "val_idx", "test_idx"):
        np.testing.assert_array_equal(getattr(back, name), getattr(ds, name))
    np.testing.assert_array_equal(back.graph.indptr, ds.graph.indptr)
    np.testing.assert_array_equal(back.graph.indices, ds.graph.indices)
    assert back.graph.weights is None
    assert load_dataset(str(path)).stats() == ds.stats()
    assert [p.name for p in path.parent.iterdir()] == ["d.npz"]  # no temp file left


def test_npz_round_trip_keeps_weights(tmp_path):
    arrays = tiny_arrays(2)
    arrays.update(indptr=[0, 1, 2], indices=[1, 0], weights=np.float32([0.5, 2.0]),
                  train_idx=[0], val_idx=[], test_idx=[1])
    back = load_npz(save_npz(make_dataset(**arrays), tmp_path / "w.npz"))
    np.testing.assert_array_equal(back.graph.weights, np.float32([0.5, 2.0]))


def test_npz_round_trip_keeps_bfloat16_features(tmp_path):
    import ml_dtypes

    arrays = tiny_arrays()
    arrays["features"] = np.asarray(arrays["features"], ml_dtypes.bfloat16)
    ds = make_dataset(**arrays)
    back = load_npz(save_npz(ds, tmp_path / "b.npz"))
    assert back.features.dtype == ml_dtypes.bfloat16
    np.testing.assert_array_equal(back.features.view(np.uint16), ds.features.view(np.uint16))
    legacy = {k: v for k, v in np.load(save_npz(make_dataset(**tiny_arrays()),
                                                tmp_path / "f.npz")).items()
              if k != "features_dtype"}  # a file from before the dtype entry
    np.savez(tmp_path / "old.npz", **legacy)
    assert load_npz(tmp_path / "old.npz").features.dtype == np.float32
    # bfloat16 features saved as they were (before the dtype entry: NumPy's "|V2")
    raw = {k: v for k, v in np.load(tmp_path / "b.npz").items() if k != "features_dtype"}
    np.savez(tmp_path / "v2.npz", **{**raw, "features": ds.features})
    assert np.load(tmp_path / "v2.npz")["features"].dtype == np.dtype("V2")
    again = load_npz(tmp_path / "v2.npz")
    np.testing.assert_array_equal(again.features.view(np.uint16), ds.features.view(np.uint16))
    # bfloat16 bits without their dtype entry (a file written by hand) were read as numbers
    np.savez(tmp_path / "bits.npz", **raw)  # features: uint16, no features_dtype
    with pytest.raises(ValueError, match=r"bits.npz holds an invalid dataset: features holds "
                                         r"uint16 values and the file names no "
                                         r"features_dtype"):
        load_npz(tmp_path / "bits.npz")


def test_a_later_save_removes_what_killed_writers_left(tmp_path):
    """A writer killed outright (SIGKILL, out of memory) leaves its hidden temporary file
    or folder; the next save to that path removes those of this host's dead processes
    before it writes, and leaves a running writer's, another host's and unnamed ones."""
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    host = socket.gethostname()
    left = {"file": tmp_path / f".d.npz.{host}-{dead.pid}.a1.part",
            "dir": tmp_path / f".e.{host}-{dead.pid}.a2.part"}
    left["file"].write_bytes(b"half a dataset")
    (left["dir"] / "x.npy").parent.mkdir()
    (left["dir"] / "x.npy").write_bytes(b"")
    kept = [f".d.npz.{host}-{os.getppid()}.a3.part", f".d.npz.elsewhere-{dead.pid}.a4.part",
            ".e.a5.part"]
    for name in kept:
        (tmp_path / name).write_bytes(b"")
    # before it writes: a save that fails (a disk with room for one copy) removes them too
    with pytest.raises(RuntimeError, match="disk full"), writes.atomic_write(tmp_path / "d.npz"):
        raise RuntimeError("disk full")
    assert not left["file"].exists() and left["dir"].exists()
    ds = make_dataset(**tiny_arrays())
    save_npz(ds, tmp_path / "d.npz")
    storage.save_dir(ds, tmp_path / "e")
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["d.npz", "e", *kept])


@pytest.fixture
def saved(tmp_path):
    return save_npz(make_dataset(**tiny_arrays()), tmp_path / "d.npz")


def test_npz_truncated_file(saved):
    saved.write_bytes(saved.read_bytes()[:200])
    with pytest.raises(ValueError, match=rf"{saved} is not a readable zerognn dataset file"):
        load_npz(saved)


def test_npz_format_version_that_is_no_number(saved):
    np.savez(saved, **{**dict(np.load(saved)), "format_version": np.array([1, 2])})
    with pytest.raises(ValueError, match=rf"{saved} is not a readable zerognn dataset file: "):
        load_npz(saved)


def test_npz_corrupt_file(saved):
    saved.write_bytes(b"this is not a zip archive at all" * 10)
    with pytest.raises(ValueError, match=rf"{saved} is not a readable zerognn dataset file"):
        load_npz(saved)


def test_npz_missing_key(saved):
    with np.load(saved) as npz:
        arrays = {k: npz[k] for k in npz.files if k not in ("labels", "val_idx")}
    np.savez(saved, **arrays)
    with pytest.raises(ValueError, match=r"d\.npz is not a readable .*missing key\(s\) labels, "
                                         r"val_idx"):
        load_npz(saved)


def test_npz_other_version(saved):
    with np.load(saved) as npz:
        arrays = dict(npz)
    np.savez(saved, **{**arrays, "format_version": np.int64(99)})
    with pytest.raises(ValueError, match=r"has format_version 99; .* reads 1"):
        load_npz(saved)


def test_npz_invalid_arrays_name_the_file(saved):
    with np.load(saved) as npz:
        arrays = dict(npz)
    np.savez(saved, **{**arrays, "features": np.ones((2, 3), np.float32)})
    with pytest.raises(ValueError, match=r"d\.npz holds an invalid dataset: features have 2 rows"):
        load_npz(saved)


def test_npz_missing_file(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"nope\.npz does not exist"):
        load_dataset(str(tmp_path / "nope.npz"))


def test_atomic_write_failure_leaves_nothing(tmp_path):
    target = tmp_path / "x.npz"
    with pytest.raises(RuntimeError):
        with storage.atomic_write(target) as f:
            f.write(b"partial")
            raise RuntimeError("disk full")
    assert list(tmp_path.iterdir()) == []


# ----------------------------------------------------------------- dispatch


def test_unknown_name_lists_valid_names():
    with pytest.raises(ValueError, match=r"unknown dataset 'karate'; valid names: cora, "
                                         r"citeseer, pubmed, ogbn-arxiv.*products-like, tiny"
                                         r".*; link splits \(task 'link'\): ogbl-collab, "
                                         r"ogbl-citation2$"):
        load_dataset("karate")
    # read by the link task only: named as unknown before
    with pytest.raises(ValueError, match=r"^ogbl-citation2 is a link-prediction split: train "
                                         r"it with task='link' \(--task link\) and root= "
                                         r"\(--root\), the folder that holds ogbl_citation2/$"):
        load_dataset("ogbl-citation2")


def test_scale_only_for_synthetic_presets():
    with pytest.raises(ValueError, match=r"scale applies to the synthetic presets "
                                         r"\(products-like, .* molhiv-like"):
        load_dataset("cora", scale=0.5)


@pytest.mark.parametrize("kind", ["multilabel", "regression"])
@pytest.mark.parametrize("fmt", ["npz", "dir"])
def test_saved_datasets_keep_float_targets(tmp_path, kind, fmt):
    from zerognn_jax._src.data import storage

    ds = make_dataset(**tiny_arrays())
    rs = np.random.default_rng(0)
    y = (rs.random((ds.num_nodes, 3)) > 0.5) if kind == "multilabel" else rs.normal(
        size=(ds.num_nodes, 3))
    ds = ds.with_targets(y.astype(np.float32), kind)
    back = (load_npz(save_npz(ds, tmp_path / "t.npz")) if fmt == "npz" else
            storage.load_dir(storage.save_dir(ds, tmp_path / "t")))
    assert back.target_kind == kind
    np.testing.assert_array_equal(back.targets, ds.targets)


def _drop(key):
    def change(meta: dict) -> str:
        del meta[key]
        return json.dumps(meta)
    return change


@pytest.mark.parametrize(("change", "problem"), [
    (_drop("arrays"), "lacks the key(s) arrays"),
    (_drop("name"), "lacks the key(s) name"),
    (lambda meta: '{"name": "t", "arrays": {', "is not readable JSON: Expecting"),
    (lambda meta: "[1, 2]", "holds a JSON list, not an object"),
    (lambda meta: json.dumps({**meta, "arrays": {"indptr": [3]}}),
     'bad entries: indptr'),
    (lambda meta: json.dumps({**meta, "arrays": {**meta["arrays"], "../x": {}}}),
     'bad entries: ../x'),
], ids=["no arrays", "no name", "not JSON", "a list", "a spec without dtype",
        "an unknown array"])
def test_a_bad_meta_json_is_one_line_naming_the_file(tmp_path, capsys, change, problem):
    from zerognn_jax.cli import main

    folder = storage.save_dir(make_dataset(**tiny_arrays()), tmp_path / "t")
    meta = folder / "meta.json"
    meta.write_text(change(json.loads(meta.read_text())))
    assert main(["data", "info", str(folder)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"zerognn: error: {meta}") and problem in err, err
    assert err.count("\n") == 1


def test_dataset_directories_through_the_public_api(tmp_path):
    import zerognn_jax

    assert {"save_dir", "load_dir"} <= set(zerognn_jax.__all__)
    ds = make_dataset(**tiny_arrays())
    back = zerognn_jax.load_dir(zerognn_jax.save_dir(ds, tmp_path / "t"))
    assert back.stats() == ds.stats()
    # features of another dtype are refused, as a typed directory's are (they were read
    # as a float32 copy of the whole table, not in place)
    meta_path = tmp_path / "t" / "meta.json"
    meta = json.loads(meta_path.read_text())
    for dtype in (np.float64, np.int64):
        np.save(tmp_path / "t" / "features.npy", np.ones((6, 3), dtype))
        meta["arrays"]["features"]["dtype"] = np.dtype(dtype).name  # the record agrees
        meta_path.write_text(json.dumps(meta))
        with pytest.raises(ValueError, match=rf"holds an invalid dataset: features\.npy is "
                                             rf"{np.dtype(dtype)}; a dataset directory's "
                                             rf"features must be float32 or bfloat16"):
            zerognn_jax.load_dir(tmp_path / "t")


def test_finite_float64_features_past_float32_are_named_as_an_overflow():
    arrays = tiny_arrays()
    dataset = lambda features: Dataset(
        name="t", graph=CSRGraph(arrays["indptr"], arrays["indices"]), features=features,
        labels=arrays["labels"], train_idx=np.array([0, 1]), val_idx=np.array([2]),
        test_idx=np.array([3, 4]), num_classes=2)
    features = np.ones((6, 3))
    features[4, 2] = 1e300
    with pytest.raises(ValueError, match=r"^features overflow float32: 1e\+300 at row 4, "
                                         r"column 2 is past its largest magnitude"):
        dataset(features)
    features[4, 2] = np.nan
    with pytest.raises(ValueError, match=r"^features contain NaN or inf \(1 entries; first at "
                                         r"row 4, column 2\)$"):
        dataset(features)


def test_reprs_give_sizes_not_arrays():
    """A notebook prints what a cell leaves: the containers give their sizes (a Dataset's
    repr was 14 kB of truncated arrays, a TrainResult's 36 kB)."""
    ds = zg.load_dataset("tiny")
    assert repr(ds) == ("Dataset('tiny', nodes=4,898, edges=246,528, features=float32[4898, "
                        "100], classes=47, train/val/test=2,938/979/981)")
    graphs = zg.molhiv_like(0.01)
    assert repr(graphs).startswith("GraphCollection('molhiv-like', graphs=411, nodes=")
    result = zg.TrainResult(
        variables={"params": {"w": np.zeros((1000, 100))}}, history=[{}, {}],
        summary={"dataset": "tiny", "task": "node", "model": "sage", "params": 100000,
                 "val_acc": 0.51234, "test_acc": 0.5, "train_acc": 0.9}, dataset=ds)
    assert repr(result) == ("TrainResult(dataset='tiny', task='node', model='sage', "
                            "params=100000, epochs=2, val_acc=0.5123, test_acc=0.5)")
    restored = zg.TrainResult(variables={"params": {"w": np.zeros((10, 3))}}, history=None,
                              summary={"test_acc": np.float32(0.25)}, dataset=ds)
    assert repr(restored) == ("TrainResult(dataset='tiny', task=None, model=None, params=30, "
                              "epochs=0, test_acc=0.25)")


def test_ids_out_of_range_are_counted_and_named():
    from zerognn_jax._src.data.checks import check_ids

    with pytest.raises(ValueError, match=r"ids must lie in \[0, 10\), found \[5, 14\]: 5 "
                                         r"outside it \(10, 11, 12, \.\.\.\)$"):
        check_ids("ids", np.arange(5, 15), 10)


def test_a_dataset_built_directly_keeps_the_dtypes_its_files_store(tmp_path):
    """float64 features were accepted, then `load_dir` refused the folder `save_dir`
    wrote of them; int64 labels and ids came back int32 from `.npz` only."""
    good = make_dataset(**tiny_arrays())
    wide = lambda a: np.asarray(a, np.int64)  # noqa: E731
    with pytest.raises(ValueError, match=r"^features must be float32 or bfloat16, got "
                                         r"float64 \(make_dataset narrows"):
        zg.Dataset(good.name, good.graph, np.asarray(good.features, np.float64), good.labels,
                   good.train_idx, good.val_idx, good.test_idx, good.num_classes)
    ds = zg.Dataset(good.name, good.graph, good.features, wide(good.labels),
                    wide(good.train_idx), wide(good.val_idx), wide(good.test_idx),
                    good.num_classes)
    for name in ("labels", "train_idx", "val_idx", "test_idx"):
        assert getattr(ds, name).dtype == np.int32
        assert np.array_equal(getattr(ds, name), getattr(good, name))
    back = storage.load_dir(storage.save_dir(ds, tmp_path / "d"))
    assert back.labels.dtype == np.int32 and np.array_equal(back.labels, good.labels)


@pytest.mark.parametrize(("load", "stem"), [
    (lambda root: zg.load_dataset("rmat", root, scale=2**-12), "rmat-0.000244141-0.npz"),
    (lambda root: zg.load_hetero_dataset("shop-like", root, scale=0.001),
     "shop-like-0.001-0.npz"),
    (lambda root: zg.load_graphs("molhiv-like", root, scale=0.002), "molhiv-like-0.002-0.npz"),
])
def test_an_unreadable_cache_says_to_remove_it_and_is_never_overwritten(tmp_path, load, stem):
    """A node or graph preset's failed on every run without saying what to do; a typed
    preset's was generated over, even a file of the user's standing at that name."""
    (tmp_path / stem).write_text("the user's notes")
    with pytest.raises(ValueError, match=r"; it stands where the preset's cache goes under "
                                         r"the data folder: remove it, and the data are "
                                         r"generated again$"):
        load(tmp_path)
    assert (tmp_path / stem).read_text() == "the user's notes"


def test_an_unreadable_papers100m_like_cache_folder_says_to_remove_it(tmp_path):
    """papers100m-like's cache is a folder, read without the advice the others give."""
    folder = tmp_path / "papers100m-like-0.0005-0"
    folder.mkdir()
    (folder / "meta.json").write_text("{}")
    with pytest.raises(ValueError, match=rf"^{folder}.*; it stands where the preset's "
                                         r"cache goes under the data folder: remove it"):
        zg.load_dataset("papers100m-like", tmp_path, scale=0.0005)
    assert (folder / "meta.json").read_text() == "{}"
