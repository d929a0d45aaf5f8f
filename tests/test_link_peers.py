"""The link-prediction peers (benchmarks/peers: link_data, zerognn_link, torch_gpu_link,
pyg_link, link_table): the split handoff, seed-edge exclusion, a tiny end-to-end run.

The split file, zerognn-jax's side and the table need no torch; the peers' tests skip
where torch (or torch_geometric, or a PyG sampling backend) does not import.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import sys
from pathlib import Path

import numpy as np
import pytest

import zerognn_jax as zg
from zerognn_jax._src.training.tasks.link import link_data as trainer_link_data

PEERS = Path(__file__).resolve().parents[1] / "benchmarks" / "peers"
SCALE = 0.0005  # products-like with ~1,200 nodes


def _peer(name: str):
    if str(PEERS) not in sys.path:
        sys.path.insert(0, str(PEERS))
    return importlib.import_module(name)


@pytest.fixture(scope="module")
def split_file(tmp_path_factory):
    """A split file of products-like at SCALE, seed 3, with the trainer's 100 MRR
    negatives per positive."""
    link_data = _peer("link_data")
    path = tmp_path_factory.mktemp("link") / "link.npz"
    name, features, split = link_data.make("products-like", None, SCALE, 3, 100)
    link_data.write(path, name, 3, features, split)
    return path, split


def test_split_file_holds_the_trainers_split(split_file):
    path, split = split_file
    data = _peer("link_data").load(path)
    cfg = zg.TrainConfig(task="link", dataset="products-like", scale=SCALE, seed=3,
                         link_metric="mrr", fanouts=(5,), layers=1)
    _, theirs = trainer_link_data(cfg)
    np.testing.assert_array_equal(data.train, theirs.train)
    np.testing.assert_array_equal(data.indptr, np.asarray(theirs.graph.indptr))
    np.testing.assert_array_equal(data.indices, np.asarray(theirs.graph.indices))
    for s in ("val", "test"):
        for k in ("pos", "neg", "neg_dst"):
            np.testing.assert_array_equal(data.evals[s][k], getattr(getattr(theirs, s), k))
    assert data.has_mrr and data.seed == 3 and data.features.dtype == np.float32
    assert not (Path(str(path) + ".partial.npz")).exists()


def test_split_file_refuses_a_node_dataset(tmp_path, split_file):
    link_data = _peer("link_data")
    arrays = dict(np.load(split_file[0]))
    np.savez(tmp_path / "bad.npz", **dict(arrays, kind=np.str_("node")))
    with pytest.raises(ValueError, match="not a link split"):
        link_data.load(tmp_path / "bad.npz")
    del arrays["test_neg"]
    np.savez(tmp_path / "short.npz", **arrays)
    with pytest.raises(ValueError, match="test_neg"):
        link_data.load(tmp_path / "short.npz")


def test_zerognn_task_reads_the_file(split_file):
    path, split = split_file
    zl = _peer("zerognn_link")
    zg.register_task(zl.SavedLinkTask)
    cfg = zg.TrainConfig(task="link-file", dataset=str(path), fanouts=(5,), layers=1)
    task, dataset = zl.SavedLinkTask.build(cfg)
    np.testing.assert_array_equal(task.split.train, split.train)
    np.testing.assert_array_equal(task.split.test.neg, split.test.neg)
    assert dataset.graph.num_edges == split.graph.num_edges
    with pytest.raises(ValueError, match="reads its dataset"):
        zl.SavedLinkTask.build(cfg, dataset)


def test_link_table_compares_speed_and_auc(tmp_path, capsys):
    table = _peer("link_table")
    base = {"summary": True, "task": "link", "steps": 200}
    records = [
        dict(base, system="zerognn-jax", ms_per_step=1.0, positive_edges_per_second=1.0e6,
             epoch_seconds=51.0, test_auc=0.95, device_name="H100", jax_version="0.11"),
        dict(base, system="pyg-linkneighborloader", ms_per_step=100.0,
             positive_edges_per_second=1.0e4, test_auc=0.9412, syncs_per_step=6.0),
        {"engine": "scan", "steps_timed": 2000, "ms_per_step": 0.9,
         "positive_edges_per_second": 1.1e6},
        {"system": "torch-gpu-eager", "summary": True, "test_acc": 0.9},  # a node run
    ]
    path = tmp_path / "link.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in records) + "\n")
    assert table.main([str(path)]) == 0
    rows = {line.split(" | ")[0].strip("| "): line
            for line in capsys.readouterr().out.splitlines() if line.startswith("| ")}
    assert list(rows)[1:] == ["zerognn-jax", "zerognn-jax, link.py scan",
                              "pyg-linkneighborloader"]
    assert "| 1,000,000 | 51 | 1x |" in rows["zerognn-jax"]
    assert "| 10,000 | — | 100x | — | 6.0 | 0.9412 | — | -0.88 |" in rows[
        "pyg-linkneighborloader"]


@pytest.fixture(scope="module")
def torch_link():
    pytest.importorskip("torch")
    return _peer("torch_gpu_link")


def test_sampled_blocks_never_hold_a_positive_pair(torch_link, split_file):
    """Fanout above every degree: each seed draws all its neighbours, and exactly the
    64 positive edges leave, in both directions."""
    import torch
    link_run = _peer("link_run")
    data = _peer("link_data").load(split_file[0])
    graph = torch_link.DeviceGraph(torch.from_numpy(data.indptr),
                                   torch.from_numpy(data.indices).long())
    pos = torch.from_numpy(data.train[:64])
    seeds = torch.unique(pos.reshape(-1))
    keys = link_run.positive_keys(pos, data.num_nodes)
    fanout = int(np.diff(data.indptr).max()) + 1
    gen = torch.Generator().manual_seed(0)
    (block,), inputs = torch_link.sample_link_blocks(graph, seeds, [fanout], gen, keys,
                                                     data.num_nodes)
    dst, src = seeds[block.dst], inputs[block.src]
    assert not link_run.is_pair(dst, src, keys, data.num_nodes).any()
    degrees = np.diff(data.indptr)[seeds.numpy()]
    assert dst.shape[0] == degrees.sum() - 2 * 64
    kept = np.bincount(block.dst.numpy(), minlength=seeds.shape[0])
    np.testing.assert_allclose(block.inv_deg[:, 0].numpy(), 1 / np.maximum(kept, 1))


def test_pair_loss_weighs_negatives_as_zerognn(torch_link):
    import torch
    link_run = _peer("link_run")
    pos, neg = torch.tensor([2.0, -1.0]), torch.tensor([[0.5, -3.0, 1.0], [0.0, 2.0, -1.0]])
    softplus = torch.nn.functional.softplus
    want = (softplus(-pos).sum() + softplus(neg).sum() / 3) / (2 + 6 / 3)
    torch.testing.assert_close(link_run.pair_loss(pos, neg), want)


def test_torch_link_end_to_end(torch_link, split_file, tmp_path):
    out = tmp_path / "out.jsonl"
    assert torch_link.main(["--data", str(split_file[0]), "--device", "cpu", "--steps", "6",
                            "--warm-steps", "2", "--hidden", "16", "--layers", "2",
                            "--fanouts", "4,3", "--batch", "64", "--negatives", "2",
                            "--out", str(out)]) == 0
    summary = json.loads(out.read_text().splitlines()[-1])
    assert summary["system"] == "torch-gpu-link-eager" and summary["task"] == "link"
    assert summary["steps"] == 6 and summary["timed_steps"] == 4
    assert summary["ms_per_step"] > 0 and np.isfinite(summary["loss_last"])
    for key in ("test_auc", "test_ap", "val_auc", "test_mrr", "test_hits@10"):
        assert 0.0 <= summary[key] <= 1.0, key


def test_pyg_drops_the_positive_edges():
    pytest.importorskip("torch")
    pytest.importorskip("torch_geometric")
    import torch
    from torch_geometric.data import Data
    pyg_link = _peer("pyg_link")
    edge_index = torch.tensor([[0, 1, 2, 1, 3, 0, 4], [1, 0, 1, 2, 0, 3, 2]])
    batch = Data(edge_index=edge_index, num_nodes=5, src_index=torch.tensor([0, 2]),
                 dst_pos_index=torch.tensor([1, 4]))
    kept = pyg_link.without_positives(batch)
    assert kept.tolist() == [[2, 1, 3, 0], [1, 2, 0, 3]]


def test_pyg_link_end_to_end(split_file, tmp_path):
    pytest.importorskip("torch")
    pytest.importorskip("torch_geometric")
    if not any(importlib.util.find_spec(m) for m in ("pyg_lib", "torch_sparse")):
        pytest.skip("LinkNeighborLoader needs pyg-lib or torch-sparse")
    pyg_link = _peer("pyg_link")
    out = tmp_path / "out.jsonl"
    assert pyg_link.main(["--data", str(split_file[0]), "--device", "cpu", "--steps", "5",
                          "--warm-steps", "2", "--hidden", "16", "--layers", "2",
                          "--fanouts", "4,3", "--batch", "64", "--infer-batch", "500",
                          "--out", str(out)]) == 0
    summary = json.loads(out.read_text().splitlines()[-1])
    assert summary["system"] == "pyg-linkneighborloader" and summary["steps"] == 5
    assert 0.0 <= summary["test_auc"] <= 1.0 and 0.0 <= summary["test_mrr"] <= 1.0
