"""The PyTorch peer baselines (benchmarks/peers): sampler properties, exact inference,
a tiny end-to-end run, and the results table.

Everything that needs torch skips where torch does not import (CI has none); the
PyG checks also skip without torch_geometric, and the NeighborLoader one without a
sampling backend (pyg-lib or torch-sparse).
"""

from __future__ import annotations

import importlib
import importlib.util
import itertools
import json
import sys
from pathlib import Path

import numpy as np
import pytest

from zerognn_jax._src.bench.profiling import union_length

PEERS = Path(__file__).resolve().parents[1] / "benchmarks" / "peers"


def _peer(name: str):
    if str(PEERS) not in sys.path:
        sys.path.insert(0, str(PEERS))
    return importlib.import_module(name)


@pytest.fixture(scope="module")
def tgs():
    pytest.importorskip("torch")
    return _peer("torch_gpu_sage")


def random_csr(n: int, max_deg: int, seed: int):
    """A simple directed graph: indptr int64[n + 1], indices int64[E]; degrees 0..max_deg."""
    rng = np.random.default_rng(seed)
    deg = rng.integers(0, max_deg + 1, n)
    deg[:4] = [0, 1, max_deg, min(3, max_deg)]
    rows = [np.sort(rng.choice(n, d, replace=False)) for d in deg]
    indptr = np.concatenate([[0], np.cumsum(deg)]).astype(np.int64)
    return indptr, np.concatenate(rows).astype(np.int64)


def write_npz(path: Path, n: int = 240, d: int = 12, classes: int = 4, seed: int = 0):
    """A tiny dataset file in the format `zerognn data generate` writes."""
    indptr, indices = random_csr(n, 12, seed)
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, classes, n).astype(np.int32)
    features = (rng.normal(size=(n, d)) + labels[:, None] * 0.5).astype(np.float32)
    perm = rng.permutation(n).astype(np.int32)
    np.savez(path, format_version=np.int64(1), name=np.str_("tiny-peers"),
             num_classes=np.int64(classes), indptr=indptr.astype(np.int32),
             indices=indices.astype(np.int32), features=features, labels=labels,
             train_idx=perm[:120], val_idx=perm[120:160], test_idx=perm[160:])
    return path


@pytest.mark.parametrize("fanout", [1, 3, 5, 15])
def test_sampler_obeys_fanout(tgs, fanout):
    import torch
    indptr, indices = random_csr(300, 20, seed=fanout)
    graph = tgs.DeviceGraph(torch.from_numpy(indptr), torch.from_numpy(indices))
    gen = torch.Generator().manual_seed(1)
    nodes = torch.randperm(300, generator=gen)[:200]
    nbr, mask = tgs.sample_hop(graph, nodes, fanout, gen)
    deg = indptr[nodes.numpy() + 1] - indptr[nodes.numpy()]
    assert (mask.sum(1).numpy() == np.minimum(deg, fanout)).all()
    for row, v in enumerate(nodes.tolist()):
        got = nbr[row][mask[row]].numpy()
        real = indices[indptr[v]:indptr[v + 1]]
        assert np.isin(got, real).all(), "a sampled neighbour is not a neighbour"
        assert np.unique(got).shape[0] == got.shape[0], "a neighbour sampled twice"
        if deg[row] <= fanout:
            assert set(got.tolist()) == set(real.tolist()), "low degree: keep all"


def test_blocks_are_dst_first_and_exact(tgs):
    import torch
    common = _peer("common")
    indptr, indices = random_csr(400, 25, seed=3)
    graph = tgs.DeviceGraph(torch.from_numpy(indptr), torch.from_numpy(indices))
    gen = torch.Generator().manual_seed(2)
    nodes = torch.randperm(400, generator=gen)[:32]
    for fanout in (6, 4, 2):
        block, nxt = tgs.to_block(nodes, *tgs.sample_hop(graph, nodes, fanout, gen))
        assert torch.equal(nxt[:nodes.shape[0]], nodes)
        assert torch.unique(nxt).shape[0] == nxt.shape[0]
        assert block.num_dst == nodes.shape[0]
        problems = common.check_hop(indptr, indices, nodes[block.dst].numpy(),
                                    nxt[block.src].numpy(), nodes.numpy(), fanout)
        assert problems == []
        nodes = nxt


def test_check_hop_catches_violations():
    common = _peer("common")
    indptr = np.array([0, 3, 5, 5])
    indices = np.array([1, 2, 0, 0, 2])
    nodes = np.array([0, 1])  # neighbours: 0 <- {1, 2, 0}, 1 <- {0, 2}

    def problems(dst, src):
        return common.check_hop(indptr, indices, np.array(dst), np.array(src), nodes, 2)

    assert problems([0, 0, 1, 1], [1, 2, 0, 2]) == []
    assert problems([0, 1, 1], [1, 0, 2])  # node 0 got 1 of min(3, 2)
    assert problems([0, 0, 1, 1], [1, 1, 0, 2])  # a duplicate
    assert problems([0, 0, 1, 1], [1, 2, 0, 1])  # 1 <- 1 is no edge
    assert problems([0, 0, 1, 1, 2], [1, 2, 0, 2, 0])  # node 2 is not in the hop


def test_floyd_draw_is_uniform(tgs):
    import torch
    rows, deg, fanout = 40000, 6, 3
    gen = torch.Generator().manual_seed(0)
    rand = torch.rand((rows, fanout), generator=gen)
    off = tgs.floyd_offsets(torch.full((rows,), deg), rand, fanout).numpy()
    assert ((off >= 0) & (off < deg)).all()
    assert (np.sort(off, 1)[:, 1:] != np.sort(off, 1)[:, :-1]).all()
    per_offset = np.bincount(off.ravel(), minlength=deg) / rows
    np.testing.assert_allclose(per_offset, fanout / deg, atol=0.015)
    subsets = {s: i for i, s in enumerate(itertools.combinations(range(deg), fanout))}
    codes = np.array([subsets[tuple(r)] for r in np.sort(off, 1)])
    freq = np.bincount(codes, minlength=len(subsets)) / rows
    np.testing.assert_allclose(freq, 1 / len(subsets), atol=0.006)


def test_layerwise_inference_is_exact(tgs):
    import torch
    indptr, indices = random_csr(150, 30, seed=5)
    graph = tgs.DeviceGraph(torch.from_numpy(indptr), torch.from_numpy(indices))
    torch.manual_seed(0)
    model = tgs.SAGE(8, 16, 5, 3, dropout=0.5).eval()
    x = torch.randn(150, 8)
    deg = torch.from_numpy(np.diff(indptr))
    full = tgs.Block(graph.indices, torch.repeat_interleave(torch.arange(150), deg),
                     1.0 / deg.clamp(min=1).float()[:, None], 150)
    with torch.no_grad():
        want = model(x, [full] * 3).argmax(1).numpy()
    got = tgs.layerwise_predict(model, graph, x, indptr, max_edges=97)
    np.testing.assert_array_equal(got, want)


def test_torch_pipeline_end_to_end(tgs, tmp_path):
    data = write_npz(tmp_path / "tiny.npz")
    out = tmp_path / "out.jsonl"
    flags = ["--data", str(data), "--device", "cpu", "--epochs", "2", "--batch", "32",
             "--hidden", "16", "--layers", "2", "--fanouts", "4,3", "--out", str(out)]
    assert tgs.main(flags + ["--check"]) == 0
    assert tgs.main(flags) == 0
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    assert lines[0]["check"] == "fanouts" and lines[0]["ok"]
    summary = lines[-1]
    assert summary["summary"] and summary["system"] == "torch-gpu-eager"
    assert len(summary["epoch_seconds_runs"]) == 2 and summary["steps_per_epoch"] == 4
    assert all(np.isfinite(summary["loss"]))
    assert 0.0 <= summary["test_acc"] <= 1.0
    assert summary["gpu_fraction"] is None and summary["peak_bytes"] is None


def test_pyg_layerwise_inference_is_exact(tmp_path):
    pytest.importorskip("torch")
    pytest.importorskip("torch_geometric")
    import torch
    from torch_geometric.data import Data
    pyg_sage = _peer("pyg_sage")
    common = _peer("common")
    data = common.load_npz(write_npz(tmp_path / "tiny.npz"))
    pyg = pyg_sage.to_pyg(data)
    torch.manual_seed(0)
    model = pyg_sage.GraphSAGE(12, 16, num_layers=3, out_channels=4).eval()
    with torch.no_grad():
        want = model(pyg.x, pyg.edge_index).argmax(1).numpy()
    batches = []  # what a one-hop full-neighbour NeighborLoader yields, 50 nodes a batch
    for a in range(0, data.num_nodes, 50):
        seeds = np.arange(a, min(a + 50, data.num_nodes))
        src = data.indices[data.indptr[a]:data.indptr[seeds[-1] + 1]].astype(np.int64)
        dst = np.repeat(seeds, np.diff(data.indptr)[seeds])
        n_id = np.concatenate([seeds, np.setdiff1d(np.unique(src), seeds)])
        local = {v: i for i, v in enumerate(n_id)}
        edge_index = torch.tensor([[local[s] for s in src], [local[t] for t in dst]])
        batches.append(Data(edge_index=edge_index.reshape(2, -1), n_id=torch.from_numpy(n_id),
                            batch_size=len(seeds)))
    got = pyg_sage.layerwise_predict(model, batches, pyg.x, torch.device("cpu"))
    np.testing.assert_array_equal(got, want)


def test_pyg_neighbor_loader_obeys_fanouts(tmp_path):
    pytest.importorskip("torch")
    pytest.importorskip("torch_geometric")
    if not any(importlib.util.find_spec(m) for m in ("pyg_lib", "torch_sparse")):
        pytest.skip("NeighborLoader needs pyg-lib or torch-sparse")
    pyg_sage = _peer("pyg_sage")
    data = write_npz(tmp_path / "tiny.npz")
    assert pyg_sage.main(["--data", str(data), "--device", "cpu", "--fanouts", "4,3",
                          "--layers", "2", "--batch", "32", "--check"]) == 0


def test_table_reads_baselines_and_zerognn(tmp_path, capsys):
    table = _peer("table")
    records = [
        {"epoch": 0, "epoch_seconds": 5.0}, {"epoch": 1, "epoch_seconds": 0.25},
        {"epoch": 2, "epoch_seconds": 0.27},
        {"summary": True, "median_epoch_seconds": 0.27, "test_acc": 0.8,
         "peak_bytes_in_use": 2**31, "device": "cuda:0", "engine": "scan"},
        {"epoch": 0, "epoch_seconds": 4.0}, {"epoch": 1, "epoch_seconds": 0.125},
        {"summary": True, "median_epoch_seconds": 0.125, "test_acc": 0.8, "engine": "scan",
         "config": {"dtype": "bfloat16"}},
        {"system": "pyg-neighborloader", "epoch": 0, "epoch_seconds": 30.0},
        {"system": "pyg-neighborloader", "epoch": 1, "epoch_seconds": 26.0},
        {"summary": True, "system": "pyg-neighborloader", "epoch_seconds": 26.0,
         "gpu_fraction": 0.05, "syncs_per_step": 3.0, "launches_per_step": 120.0,
         "peak_bytes": 2**30, "test_acc": 0.81},
        {"system": "torch-gpu-eager", "epoch": 0, "epoch_seconds": 3.0,
         "gpu_fraction": 0.4},
        {"system": "torch-gpu-eager", "check": "fanouts", "ok": True, "problems": []},
    ]
    path = tmp_path / "peers.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in records) + "\n{\"cut")
    assert table.main([str(path)]) == 0
    lines = capsys.readouterr().out.splitlines()
    rows = {line.split(" | ")[0].strip("| "): line for line in lines if line.startswith("| ")}
    assert list(rows)[1] == "zerognn-jax"
    assert "| 0.26 | 1x |" in rows["zerognn-jax"]  # median of the epochs after the first
    assert "| 0.125 | 0.481x |" in rows["zerognn-jax, bfloat16"]  # its own epochs only
    assert "| 26 | 100x | 5 % | 3.0 | 120 | 1.00 | 81.0 % |" in rows["pyg-neighborloader"]
    assert "torch-gpu-eager (cut off)" in rows
    assert any(line == "fanout check torch-gpu-eager: ok" for line in lines)


def test_row_normalised_features_match_zerognn(tmp_path):
    from zerognn_jax._src.data.planetoid import row_normalize
    common = _peer("common")
    path = write_npz(tmp_path / "tiny.npz")
    raw = np.abs(np.load(path)["features"])  # row sums of counts (signed rows: refused)
    raw[3] = 0.0  # an all-zero row stays zero
    np.savez(tmp_path / "zero.npz", **dict(np.load(path), features=raw))
    assert np.array_equal(common.load_npz(tmp_path / "zero.npz").features, raw)
    got = common.load_npz(tmp_path / "zero.npz", normalize=True).features
    assert got.dtype == np.float32 and not got[3].any()
    np.testing.assert_array_equal(got, row_normalize(raw))


def test_torch_pipeline_takes_weight_decay_and_normalisation(tgs, tmp_path):
    data = write_npz(tmp_path / "tiny.npz")
    out = tmp_path / "out.jsonl"
    assert tgs.main(["--data", str(data), "--device", "cpu", "--epochs", "1", "--batch",
                     "120", "--hidden", "8", "--layers", "2", "--fanouts", "20,20",
                     "--weight-decay", "5e-4", "--normalize-features", "--seed", "3",
                     "--out", str(out)]) == 0
    summary = json.loads(out.read_text().splitlines()[-1])
    assert summary["weight_decay"] == 5e-4 and summary["normalize_features"]
    assert summary["seed"] == 3 and summary["steps_per_epoch"] == 1


def test_accuracy_table_checks_the_gap(tmp_path, capsys):
    table = _peer("table")
    records = [{"summary": True, "median_epoch_seconds": 1.0, "test_acc": a}
               for a in (0.80, 0.81)]
    records += [{"summary": True, "system": "pyg-neighborloader", "test_acc": a}
                for a in (0.79, 0.78)]
    records += [{"summary": True, "system": "torch-gpu-eager", "test_acc": None}]
    path = tmp_path / "cora.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in records) + "\n")
    assert table.main(["--accuracy", str(path)]) == 0
    out = capsys.readouterr().out
    assert "| zerognn-jax | 2 | 80.0, 81.0 | 80.50 | 0.71 | — |" in out
    assert "| pyg-neighborloader | 2 | 79.0, 78.0 | 78.50 | 0.71 | -2.00 points |" in out
    assert "torch-gpu-eager" not in out and out.rstrip().endswith("holds")
    assert table.main(["--accuracy", "--gap", "1.5", str(path)]) == 1
    assert capsys.readouterr().out.rstrip().endswith("FAILS")


def test_device_busy_time_from_a_trace(tmp_path):
    common = _peer("common")
    events = [
        {"ph": "X", "cat": "kernel", "name": "a", "ts": 0.0, "dur": 10.0},
        {"ph": "X", "cat": "kernel", "name": "b", "ts": 5.0, "dur": 10.0},  # overlaps a
        {"ph": "X", "cat": "gpu_memcpy", "name": "c", "ts": 20.0, "dur": 5.0},
        {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "ts": 0, "dur": 99},
        {"ph": "M", "name": "process_name", "pid": 0, "args": {"name": "x"}},
    ]
    path = tmp_path / "trace.json"
    path.write_text(json.dumps({"traceEvents": events}))
    found = common.device_events(str(path))
    assert [e["name"] for e in found] == ["a", "b", "c"]
    assert union_length((e["ts"], e["ts"] + e["dur"]) for e in found) == 20.0
