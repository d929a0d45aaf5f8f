"""`zerognn predict`: a run's checkpoint gives the outputs `zg.predict`, `zg.score_pairs`
and `zg.recommend` give, written to one .npz file; bad input ends in one line and
writes nothing."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest
from conftest import assert_same_runs

import zerognn_jax as zg
from zerognn_jax._src.data.shop import make_shop
from zerognn_jax.cli import main

SMALL = dict(dataset="tiny", hidden=8, layers=2, fanouts=(4, 3), batch_size=256, epochs=1,
             eval_mode="none", progress=False)


@pytest.fixture(scope="module")
def node_run(tmp_path_factory):
    folder = tmp_path_factory.mktemp("predict")
    zg.train(zg.TrainConfig(**SMALL, checkpoint_dir=str(folder / "ck")))
    return folder, zg.restore(str(folder / "ck"), for_inference=True)


@pytest.fixture(scope="module")
def link_run(tmp_path_factory):
    folder = tmp_path_factory.mktemp("predict-link")
    zg.train(zg.TrainConfig(**SMALL, task="link", checkpoint_dir=str(folder / "ck")))
    return folder, zg.restore(str(folder / "ck"), for_inference=True)


def _predict(folder, *flags, out="p.npz"):
    """(exit code, the file's arrays and meta or None) of `zerognn predict`."""
    path = folder / out
    code = main(["predict", str(folder / "ck"), "--out", str(path), *flags])
    if code or not path.exists():
        return code, None
    with np.load(path) as saved:
        arrays = {k: saved[k] for k in saved.files}
    return code, {**arrays, "meta": json.loads(str(arrays["meta"]))}


def test_a_node_runs_outputs_are_those_of_predict(node_run, capsys):
    folder, result = node_run
    code, got = _predict(folder)  # the test split, exact
    assert code == 0
    ids = np.asarray(result.dataset.test_idx)
    np.testing.assert_array_equal(got["ids"], ids)
    assert_same_runs(got["outputs"], zg.predict(result, ids))
    assert got["meta"]["what"] == "outputs" and got["meta"]["epoch"] == 0
    printed = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    classes = result.dataset.num_classes
    assert printed["shapes"] == {"ids": [ids.size], "outputs": [ids.size, classes]}
    # ids of a text file, sampled with a seed; the file of the last call is replaced
    (folder / "ids.txt").write_text("4\n0\n17\n")
    code, got = _predict(folder, "--nodes", str(folder / "ids.txt"), "--mode", "sampled",
                         "--seed", "3", "--batch-size", "2")
    want = zg.predict(result, [4, 0, 17], mode="sampled", seed=3, batch_size=2)
    np.testing.assert_array_equal(got["outputs"], np.asarray(want))
    code, got = _predict(folder, "--nodes", "all")
    assert got["ids"].tolist() == list(range(result.dataset.graph.num_nodes))


def test_another_graphs_nodes_are_predicted_as_predict_gives_them(node_run):
    folder, result = node_run
    other = zg.load_dataset("tiny", seed=1)
    zg.save_npz(other, folder / "other.npz")
    code, got = _predict(folder, "--graph", str(folder / "other.npz"), "--nodes", "val")
    assert code == 0 and got["meta"]["graph"] == str(folder / "other.npz")
    want = zg.predict(result, other.val_idx, dataset=other)
    np.testing.assert_allclose(got["outputs"], np.asarray(want), rtol=1e-6, atol=1e-6)


def test_a_link_runs_pairs_and_rankings_are_those_of_score_pairs_and_recommend(link_run):
    folder, result = link_run
    pairs = np.array([[0, 5], [7, 2], [3, 3]])
    np.save(folder / "pairs.npy", pairs)
    code, got = _predict(folder, "--pairs", str(folder / "pairs.npy"))
    assert code == 0 and got["meta"]["what"] == "scores"
    assert_same_runs(got["scores"], zg.score_pairs(result, pairs))
    (folder / "pairs.csv").write_text("src,dst\n0,5\n7, 2\n\n3,3\n")  # as pandas writes
    code, csv = _predict(folder, "--pairs", str(folder / "pairs.csv"))
    np.testing.assert_array_equal(csv["pairs"], pairs)
    assert_same_runs(csv["scores"], got["scores"])
    # a byte-order mark before a first pair (Excel's UTF-8 CSV) keeps it; so does a
    # comment line with a comma before pairs apart by spaces
    for name, text in (("bom.csv", "\ufeff0,5\n7,2\n3,3\n"),
                       ("noted.txt", "# user, item\n0 5\n7 2\n3 3\n")):
        (folder / name).write_text(text, encoding="utf-8")
        code, read = _predict(folder, "--pairs", str(folder / name))
        np.testing.assert_array_equal(read["pairs"], pairs)
    np.save(folder / "users.npy", np.array([1, 9]))
    code, got = _predict(folder, "--nodes", str(folder / "users.npy"), "--top-k", "4",
                         "--exclude", "train,val")
    best, scores = zg.recommend(result, [1, 9], 4, exclude=("train", "val"))
    np.testing.assert_array_equal(got["destinations"], best)
    assert_same_runs(got["scores"], scores)
    (folder / "items.txt").write_text("3\n11\n0\n8\n")
    code, got = _predict(folder, "--nodes", str(folder / "users.npy"), "--top-k", "2",
                         "--candidates", str(folder / "items.txt"))
    best, scores = zg.recommend(result, [1, 9], 2, candidates=[3, 11, 0, 8])
    np.testing.assert_array_equal(got["destinations"], best)
    assert got["meta"]["candidates"] == str((folder / "items.txt").resolve())
    code, got = _predict(folder, "--nodes", str(folder / "users.npy"))  # embeddings
    assert got["meta"]["what"] == "embeddings" and got["outputs"].shape == (2, 8)
    assert got["meta"]["nodes"] == str((folder / "users.npy").resolve())


def test_a_link_runs_k_past_its_destinations_is_named_as_the_flag(link_run, capsys):
    folder, result = link_run
    n = result.data.graph.num_nodes
    code, _ = _predict(folder, "--top-k", str(n + 1), "--no-progress", out="k.npz")
    assert code == 2 and not (folder / "k.npz").exists()
    assert capsys.readouterr().err == (f"zerognn: error: --top-k must be at most the {n} "
                                       f"destinations, got {n + 1}\n")
    (folder / "twice.txt").write_text("4\n4\n")
    code, _ = _predict(folder, "--top-k", "1", "--candidates", str(folder / "twice.txt"),
                       "--no-progress", out="k.npz")
    assert code == 2 and not (folder / "k.npz").exists()
    assert capsys.readouterr().err == ("zerognn: error: --candidates must be distinct ids; "
                                       "4 is given 2 times\n")


@pytest.mark.parametrize(("flags", "message"), [
    (["--top-k", "3"], "--top-k asks a link run for pairs; .* holds a 'node' run"),
    (["--pairs", "PAIRS", "--nodes", "all"], "--pairs scores the pairs of its file; it "
                                             "takes neither --nodes nor --top-k"),
    (["--exclude", "val"], "--exclude val says which pairs --top-k ranks out"),
    (["--candidates", "FLOATS"], "--candidates .*floats.txt says which destinations "
                                 "--top-k ranks; give --top-k K"),
    (["--nodes", "MISSING"], r"--nodes .*missing.txt: no such file \(nor a split: train, "
                             r"val, test or all\)"),
    (["--nodes", "FLOATS"], "--nodes .* holds numbers that are not whole ids"),
    (["--nodes", "PAIRS"], r"--nodes .* holds an array of shape \(2, 2\); expected \[n\]"),
    (["--nodes", "BIG"], r"--nodes .*big.txt: its ids must lie in \[0, \d+\), found "
                         r"\[0, 99999999\]"),
    (["--nodes", "ONE_LINE"], r"shape \(1, 2\); expected \[n\] ids"),  # not two ids
    (["--nodes", "EMPTY"], r"--nodes .*empty.txt holds no ids"),
    (["--nodes", "HEADER"], r"--nodes .*header.txt holds no ids"),
    (["--nodes", "WORDS"], r"--nodes .*words.txt: not a .npy array or a text file of "
                           r"numbers"),
    (["--pairs", "TYPO"], r"--pairs .*typo.txt: not a .npy array or a text file of "
                          r"numbers"),  # a first row with a typo: no header, an error
    (["--nodes", "HUGE"], r"holds 9223372036854775813, past any id"),  # not wrapped
    (["--graph", "MISSING"], r"--graph .*missing.txt: no such file or folder"),
    (["--graph", "OTHER", "--top-k", "2", "--exclude", "train,val"],
     "--exclude train,val: the graph of --graph has no val or test pairs; give train"),
])
def test_bad_requests_are_one_line_and_write_nothing(node_run, capsys, flags, message):
    folder, _ = node_run
    files = {name: folder / f"{name.lower()}.{'npy' if name in ('PAIRS', 'HUGE') else 'txt'}"
             for name in ("MISSING", "FLOATS", "PAIRS", "BIG", "ONE_LINE", "EMPTY", "HUGE",
                          "HEADER", "WORDS", "TYPO")}
    files["FLOATS"].write_text("1.5\n2\n")
    np.save(files["PAIRS"], np.array([[1, 2], [3, 4]]))
    files["BIG"].write_text("0\n99999999\n")
    files["ONE_LINE"].write_text("1 2\n")
    files["EMPTY"].write_text("")
    files["HEADER"].write_text("node\n")  # a CSV's column name, and no row
    files["WORDS"].write_text("1\ntwo\n")
    files["TYPO"].write_text("1,2x\n3,4\n")
    np.save(files["HUGE"], np.array([1, 2**63 + 5], np.uint64))
    files["OTHER"] = folder / "unread.npz"  # (refused before the file is read)
    files["OTHER"].write_bytes(b"")
    argv = [str(files.get(f, f)) for f in flags]
    code, got = _predict(folder, *argv, "--no-progress", out="bad.npz")
    assert code == 2 and got is None
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("zerognn: error: ")
    assert re.search(message, err[0]), err[0]


def test_a_file_of_someone_elses_is_not_replaced(node_run, capsys):
    folder, _ = node_run
    theirs = folder / "theirs.npz"
    np.savez(theirs, x=np.arange(3))
    before = theirs.read_bytes()
    code, _ = _predict(folder, out="theirs.npz")
    assert code == 2 and theirs.read_bytes() == before
    assert "exists and is not a file zerognn predict wrote" in capsys.readouterr().err
    assert main(["predict", str(folder / "ck"), "--out", str(folder / "p.txt")]) == 2
    assert not (folder / "p.txt").exists()
    assert "--out must name a .npz file (the archive np.load reads), got" in (
        capsys.readouterr().err)


def test_a_typed_link_runs_top_k_ranks_for_every_source_of_its_relation(tmp_path, capsys):
    """`--top-k` without --nodes ranks for every user (the relation's sources), not for
    as many users as another type has nodes; --node-type is refused with it, and so is
    a split of nodes of another graph given to a link run."""
    shop = make_shop(60, 40, 2, per_user=6, dim=8, name="shop")
    saved = zg.save_hetero_npz(shop, tmp_path / "shop.npz")
    zg.train(zg.TrainConfig(task="link", model="rsage", hidden=16, layers=2, fanouts=(4, 4),
                            batch_size=64, epochs=1, eval_mode="none", progress=False,
                            link_relation="buys", checkpoint_dir=str(tmp_path / "ck")), shop)
    code, got = _predict(tmp_path, "--dataset", str(saved), "--top-k", "3")
    assert code == 0 and got["sources"].tolist() == list(range(60))
    result = zg.restore(str(tmp_path / "ck"), dataset=shop, for_inference=True)
    best, _ = zg.recommend(result, np.arange(60), 3)
    np.testing.assert_array_equal(got["destinations"], best)
    assert got["meta"]["exclude"] == "train" and got["meta"]["top_k"] == 3
    code, got = _predict(tmp_path, "--dataset", str(saved), "--nodes", "all",
                         "--node-type", "item")  # embeddings of every item
    assert got["outputs"].shape[0] == 40
    capsys.readouterr()
    code, _ = _predict(tmp_path, "--dataset", str(saved), "--top-k", "3", "--node-type",
                       "item", "--no-progress")
    assert code == 2 and "drop --node-type" in capsys.readouterr().err
    code, _ = _predict(tmp_path, "--dataset", str(saved), "--graph", str(saved),
                       "--nodes", "test", "--no-progress")
    assert code == 2 and capsys.readouterr().err.startswith(
        "zerognn: error: --nodes test: a link run's splits are pairs, not nodes")


def test_a_graph_runs_collection_without_a_split_is_named_as_graphs(tmp_path, capsys):
    """A collection built to predict holds no splits: its default split, test, is
    refused in a graph run's words (it was an empty file), and `--nodes all` predicts
    every graph as `zg.predict` does."""
    mol = zg.molhiv_like(0.002, seed=3)
    zg.train(zg.TrainConfig(task="graph", model="gin", hidden=8, layers=1, batch_size=16,
                            epochs=1, eval_mode="none", progress=False,
                            checkpoint_dir=str(tmp_path / "ck")), mol)
    zg.save_graphs(mol, tmp_path / "mol.npz")
    new = zg.make_collection("new", mol.n_node[:5], mol.n_edge[:5],
                             *(a[:mol.edge_offsets[5]] for a in (mol.senders, mol.receivers)),
                             mol.node_features[:mol.node_offsets[5]],
                             np.full((5, 1), np.nan, np.float32), "binary",
                             edge_features=mol.edge_features[:mol.edge_offsets[5]],
                             node_vocab=mol.node_vocab, edge_vocab=mol.edge_vocab)
    zg.save_graphs(new, tmp_path / "new.npz")
    given = ("--dataset", str(tmp_path / "mol.npz"), "--graph", str(tmp_path / "new.npz"))
    code, _ = _predict(tmp_path, *given, "--no-progress")
    assert code == 2 and capsys.readouterr().err == (
        "zerognn: error: --nodes test (the default): the collection of --graph has no "
        "test graphs; give all, another split or a file of ids\n")
    code, got = _predict(tmp_path, *given, "--nodes", "all")
    result = zg.restore(str(tmp_path / "ck"), dataset=mol, for_inference=True)
    np.testing.assert_allclose(got["outputs"],
                               np.asarray(zg.predict(result, np.arange(5), dataset=new)),
                               rtol=1e-6, atol=1e-6)
