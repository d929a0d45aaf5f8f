"""papers100M-like at tiny scale: statistics, determinism, the memory-mapped directory
format, and the memory plan's error when a graph and its features cannot fit."""

from __future__ import annotations

import dataclasses
import gzip
import importlib.util
import json
import re
from pathlib import Path

import jax
import ml_dtypes
import numpy as np
import pytest

from zerognn_jax._src.data import papers, storage
from zerognn_jax._src.data.graph import to_edge_list, validate_csr
from zerognn_jax._src.data.loaders import load_dataset
from zerognn_jax._src.sampling.envelope import Envelope
from zerognn_jax._src.training import memory
from zerognn_jax.cli import main

SCALE = 0.0005


@pytest.fixture(scope="module")
def dataset():
    return papers.papers100m_like(SCALE, seed=0)


def test_shape_split_and_labels(dataset):
    n, _, split = papers.sizes(SCALE)
    assert dataset.num_nodes == n == 55_530
    assert dataset.features.shape == (n, 128) and dataset.num_classes == 172
    assert (dataset.train_idx.size, dataset.val_idx.size, dataset.test_idx.size) == split
    labelled = np.concatenate([dataset.train_idx, dataset.val_idx, dataset.test_idx])
    assert np.all(dataset.labels[labelled] >= 0)
    assert np.sum(dataset.labels >= 0) == labelled.size  # everything else is -1


def test_graph_is_symmetric_power_law_and_homophilous(dataset):
    g = dataset.graph
    src, dst = to_edge_list(g)
    assert np.all(src != dst)
    key = src.astype(np.int64) * g.num_nodes + dst
    assert np.all(np.diff(key) > 0)  # rows sorted, no duplicates
    np.testing.assert_array_equal(np.sort(dst.astype(np.int64) * g.num_nodes + src), key)
    deg = np.diff(g.indptr)
    assert 18 < deg.mean() < 32  # papers100M: 29 (fewer here: duplicates among hubs)
    assert deg.max() > 10 * np.median(deg)
    # Latent classes: same-class edges are far above the 1/172-ish chance level.
    lab = dataset.labels
    both = (lab[src] >= 0) & (lab[dst] >= 0)
    assert np.mean(lab[src][both] == lab[dst][both]) > 0.4


def test_features_carry_the_label(dataset):
    train, test = dataset.train_idx, dataset.test_idx
    x, y = dataset.features, dataset.labels
    centroids = np.stack([x[train][y[train] == c].mean(0) if np.any(y[train] == c)
                          else np.zeros(128) for c in range(172)])
    pred = np.argmax(x[test] @ centroids.T - 0.5 * np.sum(centroids**2, 1), 1)
    assert np.mean(pred == y[test]) > 0.1  # chance is below 0.02


def test_deterministic_per_seed(dataset):
    again = papers.papers100m_like(SCALE, seed=0)
    np.testing.assert_array_equal(again.graph.indices, dataset.graph.indices)
    np.testing.assert_array_equal(again.features, dataset.features)
    other = papers.papers100m_like(SCALE, seed=1)
    assert not np.array_equal(other.graph.indptr, dataset.graph.indptr)


def test_seeds_past_32_bits_give_other_data():
    """jax.random.key kept a seed's low 32 bits: --seed 4294967296 wrote seed 0's file,
    and one past 2**63 was an OverflowError's traceback."""
    def key(seed):
        return np.asarray(jax.random.key_data(papers.seed_key(seed))).tolist()

    assert key(7) == np.asarray(jax.random.key_data(jax.random.key(7))).tolist()  # as before
    seeds = (0, 2**32, 2**64, 2**64 + 2**32, 10**30)
    assert len({str(key(s)) for s in seeds}) == len(seeds)
    low = papers.papers100m_like(0.00002, seed=0)
    high = papers.papers100m_like(0.00002, seed=2**32)
    assert not np.array_equal(low.features, high.features)


def test_bucketed_csr_is_the_same_graph(dataset):
    """Buckets of at most 2**17 directed entries (~13 here) sort and deduplicate their rows
    alone, as 2**30 do at full scale (XLA sorts at most 2**31 - 1): same graph."""
    lines = []
    small = papers.papers100m_like(SCALE, seed=0, max_sort=1 << 17, log=lines.append)
    assert "13 bucket(s) of <= " in lines[0] and "estimated peak device memory" in lines[0]
    validate_csr(small.graph.indptr, small.graph.indices)
    np.testing.assert_array_equal(small.graph.indptr, dataset.graph.indptr)
    np.testing.assert_array_equal(small.graph.indices, dataset.graph.indices)


def test_buckets_see_every_chunk_and_drop_its_padding(monkeypatch):
    monkeypatch.setattr(papers, "_EDGE_CHUNK", 10_007)  # 17 chunks, the last one padded
    lines = []
    whole, split = (papers.papers100m_like(0.0001, seed=2, max_sort=s, log=lines.append)
                    for s in (2**30, 9_000))
    g = split.graph
    validate_csr(g.indptr, g.indices)
    np.testing.assert_array_equal(g.indptr, whole.graph.indptr)
    np.testing.assert_array_equal(g.indices, whole.graph.indices)
    src, dst = to_edge_list(g)
    key = src.astype(np.int64) * g.num_nodes + dst
    assert np.all(src != dst) and np.all(np.diff(key) > 0)
    np.testing.assert_array_equal(np.sort(dst.astype(np.int64) * g.num_nodes + src), key)
    # Every edge drawn and stored both ways (a chunk is 6 %); loops (3 %) and the padding
    # past m (5 %) are dropped.
    drawn = int(re.search(r"([\d,]+) directed entries", lines[0])[1].replace(",", ""))
    assert 0.95 * 2 * papers.sizes(0.0001)[1] < drawn < 2 * papers.sizes(0.0001)[1], lines


def test_buckets_cover_the_rows_within_max_sort():
    counts = np.random.default_rng(0).integers(0, 40, 10_000)
    counts[[0, 777, 9_999]] = 1_000  # hubs, one at each end
    for max_sort in (1_000, 4_096, 50_000, int(counts.sum())):
        bounds = papers._bucket_bounds(counts, max_sort)
        assert bounds[0] == 0 and bounds[-1] == counts.size and np.all(np.diff(bounds) > 0)
        entries = np.add.reduceat(counts, bounds[:-1])
        assert entries.max() <= max_sort and entries.sum() == counts.sum()
        if max_sort > 4 * counts.max():  # rows far smaller than buckets: about equal shares
            assert len(entries) <= -(-counts.sum() // max_sort) + 1
    with pytest.raises(ValueError, match=r"row 777 has 1,001 directed entries, more than "
                                         r"max_sort=1,000"):
        papers._bucket_bounds(np.where(np.arange(counts.size) == 777, 1_001, counts), 1_000)


def test_max_sort_is_checked():
    with pytest.raises(ValueError, match=r"max_sort=2,147,483,648 must be in 1 .. 2\*\*31 - 1"):
        papers.papers100m_like(SCALE, max_sort=2**31)
    with pytest.raises(ValueError, match=r"more than max_sort=20: a row cannot be split"):
        papers.papers100m_like(0.00002, max_sort=20)


def test_full_scale_generation_fits_an_h100():
    """Buckets of <= 2**30 entries (4 at full scale): the estimate leaves a margin under
    the 60 GB that JAX's default 75 % preallocation takes of an 80 GB H100."""
    n, m, _ = papers.sizes(1.0)
    assert -(-2 * m // papers._MAX_SORT) == 4
    assert papers.estimate_device_bytes(1.0) < 48 * 10**9
    assert papers.estimate_device_bytes(1.0, max_sort=1 << 29) < 36 * 10**9


@pytest.fixture(scope="module")
def bfloat16_dir(tmp_path_factory):
    """The dataset written as a directory with bfloat16 features, once for the tests
    that read it back (they do not modify it)."""
    return papers.write_papers100m_like(tmp_path_factory.mktemp("written") / "p", SCALE, 0,
                                        feature_dtype="bfloat16")


def test_directory_round_trip_is_memory_mapped(dataset, bfloat16_dir):
    path = bfloat16_dir
    meta, arrays = storage.load_arrays(path)
    assert meta["name"] == "papers100m-like" and meta["num_classes"] == 172
    assert all(isinstance(a, np.memmap) for a in arrays.values())
    assert arrays["features"].dtype == ml_dtypes.bfloat16
    np.testing.assert_array_equal(arrays["indices"], dataset.graph.indices)
    # the float32 generator's values, each rounded to the nearest bfloat16
    np.testing.assert_array_equal(arrays["features"],
                                  dataset.features.astype(ml_dtypes.bfloat16))
    loaded = load_dataset(str(path))
    np.testing.assert_array_equal(loaded.labels, dataset.labels)
    assert sorted(p.name for p in path.parent.iterdir()) == ["p"]  # no temporary left


def test_save_dir_round_trip_and_failed_write_leaves_nothing(dataset, tmp_path):
    loaded = storage.load_dir(storage.save_dir(dataset, tmp_path / "d"))
    assert loaded.stats() == dataset.stats()
    with pytest.raises(RuntimeError), storage.write_dir(tmp_path / "e", "x", 2) as out:
        out.put("labels", np.zeros(3, np.int32))
        raise RuntimeError("interrupted")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["d"]


def test_directory_shape_mismatch_is_named(dataset, tmp_path):
    path = storage.save_dir(dataset, tmp_path / "d")
    meta = json.loads((path / storage.META).read_text())
    meta["arrays"]["labels"]["shape"] = [3]
    (path / storage.META).write_text(json.dumps(meta))
    with pytest.raises(ValueError, match=r"labels.npy holds int32\[55530\], meta.json says"):
        storage.load_arrays(path)
    whole = (path / "features.npy").read_bytes()
    (path / "features.npy").write_bytes(whole[:len(whole) // 2])  # mmap: "length greater"
    with pytest.raises(ValueError, match=rf"array features is unreadable: it is cut short: "
                                         rf"{len(whole) // 2:,} of the {len(whole):,} bytes "
                                         rf"its header promises"):
        storage.load_arrays(path)
    (path / "features.npy").write_bytes(whole)
    for content, why in ((b"", "it is empty"),  # was an EOFError's traceback
                         (b"\x93NUMPY\x01", "EOF: reading magic string"),
                         (b"x" * 64, r"it is not a .npy file \(it lacks NumPy's header\)")):
        (path / "labels.npy").write_bytes(content)  # NumPy's advice: unpickle the last
        with pytest.raises(ValueError, match=rf"array labels is unreadable: {why}"):
            storage.load_arrays(path)
    # an array of Python objects (a pickle's) was said to be cut short
    np.save(path / "labels.npy", np.array([object()] * 4), allow_pickle=True)
    with pytest.raises(ValueError, match=r"array labels is unreadable: it holds Python objects "
                                         r"\(dtype object, shape \[4\]\), which only pickle "
                                         r"reads"):
        storage.load_arrays(path)


def test_cli_generates_a_directory(tmp_path, capsys):
    out = tmp_path / "cli"
    code = main(["data", "generate", "papers100m-like", "--out", str(out), "--scale",
                 str(SCALE), "--feature-dtype", "bfloat16"])
    assert code == 0
    stats = json.loads(capsys.readouterr().out)
    assert stats["nodes"] == 55_530 and stats["feature_dtype"] == "bfloat16"
    assert storage.is_dataset_dir(out)
    # the statistics every other way of writing a dataset prints, and where it went
    assert stats == {**storage.load_dir(out).stats(), "path": str(out)}


def test_memory_plan_names_the_parts_and_the_remedies(dataset):
    dims = (172, 256, 256, 128)
    env = Envelope(1024, (15_360, 168_960, 890_880))
    resident = memory.resident_bytes(dataset.graph, 128, "float32", dims)
    assert resident.features == dataset.features.nbytes
    assert resident.graph == dataset.graph.indptr.nbytes + dataset.graph.indices.nbytes
    memory.check_fits(env, (15, 10, 5), dims, 8 << 30, resident=resident)
    # papers100M itself with float32 features (57 GB) and its CSR (13 GB), on the 60 GB
    # that JAX's default 75 % preallocation leaves of an 80 GB H100.
    full = memory.Resident(graph=13_369_000_000, features=56_862_697_472, model=4_000_000)
    with pytest.raises(ValueError) as err:
        memory.check_fits(env, (15, 10, 5), dims, 60 * 10**9, resident=full)
    text = str(err.value)
    assert "graph 12.45 GiB + features 52.96 GiB (float32" in text
    assert "bfloat16 features (--dtype bfloat16) save 26.48 GiB" in text
    assert "--shard-features" in text
    half = memory.Resident(13_369_000_000, 28_431_348_736, 4_000_000, "bfloat16")
    memory.check_fits(env, (15, 10, 5), dims, 60 * 10**9, resident=half)


def test_bfloat16_features_are_kept_and_checked_in_blocks(dataset, monkeypatch):
    from zerognn_jax._src.data import dataset as dataset_module

    x = dataset.features[:300].astype(ml_dtypes.bfloat16)
    keep = np.arange(300)

    def build(features):
        return dataset_module.make_dataset(
            "bf16", [0] * 301, [], features, dataset.labels[keep].clip(0), keep[:200],
            keep[200:250], keep[250:], 172)

    ds = build(x)
    assert ds.features.dtype == ml_dtypes.bfloat16 and np.shares_memory(ds.features, x)
    monkeypatch.setattr(dataset_module, "_FINITE_BLOCK", 128 * 7)  # blocks of 7 rows
    bad = x.copy()
    bad[123, 5] = np.nan
    bad[200, 0] = np.inf
    with pytest.raises(ValueError, match=r"\(2 entries; first at row 123, column 5\)"):
        build(bad)


def test_load_dir_keeps_bfloat16_memory_mapped(bfloat16_dir):
    loaded = storage.load_dir(bfloat16_dir)
    assert loaded.features.dtype == ml_dtypes.bfloat16
    assert not loaded.features.flags.owndata  # a view of the memory map, not a copy


def _benchmark():
    path = Path(__file__).resolve().parents[1] / "benchmarks" / "papers100m.py"
    spec = importlib.util.spec_from_file_location("papers100m_benchmark", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


TINY_RUN = ["--scale", str(SCALE), "--dtype", "float32", "--hidden", "8", "--fanouts", "5",
            "--batch-size", "256", "--epochs", "1"]


def test_benchmark_runs_every_phase_at_tiny_scale(dataset, tmp_path, capsys):
    bench = _benchmark()
    stored = dataclasses.replace(dataset, features=dataset.features.astype(ml_dtypes.bfloat16))
    storage.save_dir(stored, tmp_path / f"papers100m-like-{SCALE:g}-0-bfloat16")  # reused
    out = tmp_path / "run.jsonl"
    assert bench.main(["--root", str(tmp_path), *TINY_RUN, "--store-dtype", "bfloat16",
                       "--offload", "on", "--out", str(out)]) == 0
    records = {r["phase"]: r for r in map(json.loads, out.read_text().splitlines())}
    assert list(records) == ["generate", "load", "upload", "train", "fraction", "sampled",
                             "mlp", "exact"]
    # On a CPU the traced epoch runs, and its fraction is skipped with the reason.
    fraction = records.pop("fraction")
    if jax.default_backend() == "cpu":
        assert fraction["reason"].startswith("no device stream lines")
    else:
        assert 0 < fraction["gpu_fraction"] <= 1
    assert all(r["status"] == "ok" for r in records.values())
    assert records["generate"]["reused"] and records["generate"]["nodes"] == 55_530
    assert records["load"]["feature_dtype"] == "bfloat16"  # float32 on the device
    train = records["train"]
    assert train["steps"] == 3
    # One hop: the default samples it as a tree (exact sizes, nothing to calibrate).
    assert train["dedup"] is False and train["envelope_over_ideal"] is None
    assert train["calibrate_compile_seconds"] > train["compile_seconds"] > 0
    assert records["exact"]["offload"] and 0 <= records["exact"]["test_acc"] <= 1
    assert 0 <= records["mlp"]["test_acc"] <= 1
    table = capsys.readouterr().out
    assert "| epoch s (last) |" in table and "| SAGE test acc, exact |" in table


def test_benchmark_deadline_skips_what_would_start_too_late(tmp_path, capsys):
    bench = _benchmark()
    assert bench.main(["--root", str(tmp_path), *TINY_RUN, "--curve", "--curve-scales",
                       "0.002", "--deadline", "1"]) == 0
    out = capsys.readouterr().out
    skipped = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    assert [(r["dataset"], r["status"]) for r in skipped] == [
        ("products-like", "skipped"), ("papers100m-like", "skipped")]
    assert "would start too late" in skipped[0]["reason"]
    assert "| products-like | 0.002 | skipped: would start too late" in out
    assert not list(tmp_path.iterdir())  # nothing generated


def _tiny_ogb_papers(root, rng):
    """ogbn_papers100M/ in OGB's layout: compressed data.npz, node-label.npz, time split."""
    folder = root / "ogbn_papers100M"
    (folder / "raw").mkdir(parents=True)
    n, e = 50, 400
    edges = rng.integers(0, n, (2, e))
    edges[:, :5] = [[3, 3, 4, 7, 7], [3, 9, 9, 2, 2]]  # a loop and duplicates
    features = rng.normal(size=(n, 6)).astype(np.float16)
    np.savez_compressed(folder / "raw" / "data.npz", edge_index=edges, node_feat=features,
                        num_nodes_list=np.array([n]), num_edges_list=np.array([e]),
                        node_year=np.zeros((n, 1), np.int64))
    labels = rng.integers(0, 172, n).astype(np.float64)
    labels[::3] = np.nan
    np.savez_compressed(folder / "raw" / "node-label.npz", node_label=labels[:, None])
    for part, ids in (("train", [1, 2, 4]), ("valid", [5]), ("test", [7, 8])):
        path = folder / "split" / "time" / f"{part}.csv.gz"
        path.parent.mkdir(parents=True, exist_ok=True)
        with gzip.open(path, "wt") as f:
            f.write("".join(f"{i}\n" for i in ids))
    return edges, features, labels


def test_ogb_papers100m_is_streamed_into_a_dataset_directory(tmp_path, monkeypatch):
    from zerognn_jax._src.data import ogb
    from zerognn_jax._src.data.undirected import undirected_csr

    edges, features, labels = _tiny_ogb_papers(tmp_path, np.random.default_rng(0))
    monkeypatch.setattr(ogb, "_BLOCK", 7)  # many edge, row and feature blocks
    ds = load_dataset("ogbn-papers100M", root=tmp_path)
    want = undirected_csr(edges[0], edges[1], 50)
    np.testing.assert_array_equal(ds.graph.indptr, want.indptr)
    np.testing.assert_array_equal(ds.graph.indices, want.indices)
    np.testing.assert_array_equal(ds.features, features.astype(np.float32))
    assert ds.labels.tolist() == np.where(np.isnan(labels), -1, labels).astype(int).tolist()
    assert ds.train_idx.tolist() == [1, 2, 4] and ds.num_classes == 172
    processed = tmp_path / "ogbn_papers100M" / "processed"
    # no temporary left; the record of the raw files the folder was made from beside it
    assert sorted(p.name for p in processed.iterdir()) == ["zerognn", "zerognn.sources.json"]
    monkeypatch.setattr(ogb, "write_binary", lambda *a, **k: pytest.fail("raw read again"))
    assert load_dataset("ogbn-papers100M", root=tmp_path).graph.num_edges == want.num_edges
    monkeypatch.undo()
    half = ogb.write_binary("ogbn-papers100M", tmp_path, tmp_path / "bf16",
                            feature_dtype="bfloat16")
    assert storage.load_dir(half).features.dtype == ml_dtypes.bfloat16


def test_benchmark_skip_leaves_a_phase_out_with_the_reason(capsys):
    bench = _benchmark()
    args = bench.parse_args(["--root", "unused", "--skip", "fraction,mlp"])
    records, ran = [], []
    clock = bench.Clock(None)
    for phase in ("fraction", "sampled"):
        bench.run_phase(args, clock, records, phase, lambda: ran.append(1) or (None, {}), 1.0)
    assert ran == [1]  # sampled ran, fraction did not
    assert [(r["phase"], r["status"], r.get("reason")) for r in records] == [
        ("fraction", "skipped", "left out by --skip"), ("sampled", "ok", None)]
