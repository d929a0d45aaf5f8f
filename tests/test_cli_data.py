"""`zerognn data info`, `zerognn data generate` and `zerognn data convert`, driven
through the command line's `main`."""

import json
import os
import re
import signal
import warnings
from pathlib import Path

import pytest

import zerognn_jax as zg
from zerognn_jax import load_npz
from zerognn_jax._src.data import announce
from zerognn_jax.cli import data as cli_data
from zerognn_jax.cli import main as run

PLANETOID = Path(__file__).parents[2] / "shared" / "datasets" / "planetoid"


def test_info_prints_one_json_object(capsys):
    assert run(["data", "info", "tiny", "--seed", "1"]) == 0
    out, err = capsys.readouterr()
    stats = json.loads(out)
    assert out.count("\n") == 1 and err == ""
    assert stats["name"] == "tiny" and stats["classes"] == 47 and stats["features"] == 100
    assert stats["labelled"] == stats["nodes"]


def test_info_planetoid_with_root(capsys):
    if not (PLANETOID / "ind.cora.x").is_file():
        pytest.skip(f"no Planetoid files in {PLANETOID}")
    assert run(["data", "info", "cora", "--root", str(PLANETOID)]) == 0
    stats = json.loads(capsys.readouterr().out)
    assert (stats["nodes"], stats["directed_edges"], stats["train"]) == (2708, 10_556, 140)


def test_info_a_signal_while_the_statistics_are_computed_is_the_exit(monkeypatch, capsys):
    """Held while the statistics are computed, then the exit's (code 130), as `data
    generate` does with one that comes while it writes; it had been dropped (exit 0)."""
    computed = zg.Dataset.stats

    def stats(self):
        os.kill(os.getpid(), signal.SIGINT)
        return computed(self)

    monkeypatch.setattr(zg.Dataset, "stats", stats)
    assert run(["data", "info", "tiny"]) == 130
    assert "interrupted" in capsys.readouterr().err.lower()


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["data", "info", "karate"], "zerognn: error: unknown dataset 'karate'; valid names:"),
        (["data", "info", "cora", "--root", "/nonexistent"],
         "zerognn: error: Planetoid file /nonexistent/ind.cora.x not found"),
        (["data", "info", "/nonexistent/d.npz"],
         "zerognn: error: dataset file /nonexistent/d.npz does not exist"),
        (["data", "info", "cora", "--scale", "2"],
         "zerognn: error: scale applies to the synthetic presets (products-like, "),
        # a saved homogeneous file ignored it, where typed files and collections refuse it
        (["data", "info", "/nonexistent/r.npz", "--scale", "0.5"],
         "zerognn: error: scale applies to the synthetic presets (products-like, "),
        (["data", "info", "mag-like", "--scale", "0"],
         "zerognn: error: --scale must be positive and finite, got 0.0\n"),
        (["data", "generate", "rmat", "--out", "r.npz", "--scale", "1e-9"],  # was scale_log2
         "zerognn: error: --scale=1e-09 gives rmat 2**-9 nodes; it needs a scale from 2**-20 "
         "to 2**9 (2 to 2**30 nodes)\n"),
        (["data", "info", "products-like", "--scale", "0.001", "--download"],
         "zerognn: error: --download fetches the Planetoid files (cora, citeseer, pubmed); "
         "'products-like' has none\n"),
        (["data", "info", "ogbn-mag", "--seed", "3"],
         "zerognn: error: --seed applies to the synthetic presets (products-like, "),
        (["data", "generate", "rmat", "--out", "graph.bin"],
         "zerognn: error: --out must end in .npz, got 'graph.bin'"),
        # a file named as the out path: the advice was to give a folder, which rmat refuses
        (["data", "generate", "rmat", "--out", "/dev/null"],
         "zerognn: error: --out must end in .npz, got '/dev/null'\n"),
        # "m.npz/" wrote a folder m.npz that the readers took for a missing file (a file,
        # for a graph preset)
        (["data", "generate", "mag-like", "--out", "/nonexistent/m.npz/"],
         "zerognn: error: --out /nonexistent/m.npz/ ends in a separator but its name ends "
         "in .npz, which names a file: give /nonexistent/m.npz for a file, or a folder name "
         "without .npz\n"),
        (["data", "generate", "molhiv-like", "--out", "m.npz/"],
         "zerognn: error: --out m.npz/ ends in a separator"),
        (["data", "generate", "molhiv-like", "--out", "/nonexistent/m.npz",
          "--feature-dtype", "bfloat16"],
         "zerognn: error: --feature-dtype bfloat16 does not apply to molhiv-like: its atom "
         "features are categorical ids (int32) that the graph task embeds; leave "
         "--feature-dtype out\n"),
        (["data", "generate", "molpcba-like", "--out", "/nonexistent/m",
          "--feature-dtype", "float32"],
         "zerognn: error: --feature-dtype float32 does not apply to molpcba-like"),
        (["data", "generate", "products-like", "--out", "/nonexistent/p.npz",
          "--feature-dtype", "float32"],
         "zerognn: error: --feature-dtype float32 applies to papers100m-like written to a "
         "directory and to igbh-like only; products-like keeps its generator's features"),
        (["data", "generate", "mag-like", "--out", "/nonexistent/m.npz",
          "--feature-dtype", "bfloat16"],
         "zerognn: error: --feature-dtype bfloat16 applies to papers100m-like written to a "
         "directory and to igbh-like only; mag-like keeps its generator's features"),
        (["data", "generate", "papers100m-like", "--out", "/nonexistent/p.npz",
          "--feature-dtype", "bfloat16"],
         "zerognn: error: --feature-dtype bfloat16 applies to papers100m-like written to a "
         "directory, not to --out /nonexistent/p.npz: give --out a directory"),
    ],
)
def test_errors_go_to_stderr_with_exit_code_2(argv, message, capsys):
    assert run(argv) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.startswith(message)


def test_an_empty_root_is_refused(capsys):
    """It was read as the current folder, and the hint's command lost its value."""
    with pytest.raises(SystemExit) as exit_:
        run(["data", "info", "cora", "--root", ""])
    assert exit_.value.code == 2
    assert "argument --root: expected a path, got ''" in capsys.readouterr().err


def test_an_unwritable_out_folder_is_refused_before_generating(tmp_path, capsys,
                                                               monkeypatch):
    """A folder that cannot be written (a read-only file system) was found out only at
    the write, once the preset had been generated."""
    from zerognn_jax._src.data import writes

    locked = tmp_path / "ro"
    locked.mkdir()
    access = os.access
    monkeypatch.setattr(writes.os, "access",
                        lambda p, mode: Path(p) != locked and access(p, mode))
    monkeypatch.setattr(cli_data, "load_dataset", lambda *a, **k: pytest.fail("generated"))
    for out in (locked / "x.npz", locked / "new" / "x.npz"):
        assert run(["data", "generate", "products-like", "--scale", "0.001",
                    "--out", str(out)]) == 2
        assert capsys.readouterr().err == (
            f"zerognn: error: --out {out}: the folder {locked} is not writable (by this "
            f"user, or on a read-only file system)\n")
    assert list(locked.iterdir()) == []


def test_generate_products_like_writes_a_loadable_file(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(announce, "ANNOUNCE_AFTER_S", 0)  # told at once, not after 1 s
    out = tmp_path / "p.npz"
    assert run(["data", "generate", "products-like", "--scale", "0.001", "--seed", "5",
                "--out", str(out)]) == 0
    printed, err = capsys.readouterr()
    stats = json.loads(printed)
    assert stats["nodes"] == 2449 and stats["train"] == 197
    assert stats.pop("path") == str(out)  # where it went, as for a directory
    assert load_npz(out).stats() == stats
    # what it is doing goes to stderr, the statistics alone to stdout
    what = "products-like at scale 0.001 (seed 5)"
    assert re.fullmatch(rf"{re.escape(what)}: generating, into {re.escape(str(out))}\n"
                        rf"{re.escape(what)}: done in \d+\.\d s\n", err), err


def test_a_leading_tilde_in_a_path_is_the_home_folder(tmp_path, capsys, monkeypatch):
    """`--out=~/p.npz` reaches the program unexpanded (the shell expands `~` only at a
    word's start): it wrote a folder named "~" in the working directory."""
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.chdir(tmp_path)
    assert run(["data", "generate", "products-like", "--scale", "0.001",
                "--out=~/p.npz"]) == 0
    written = json.loads(capsys.readouterr().out)
    assert (tmp_path / "p.npz").is_file() and not (tmp_path / "~").exists()
    assert written.pop("path") == str(tmp_path / "p.npz")
    assert run(["data", "info", "~/p.npz"]) == 0
    assert json.loads(capsys.readouterr().out) == written


def test_info_announces_a_preset_it_generates_not_its_cache(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(announce, "ANNOUNCE_AFTER_S", 0)
    argv = ["data", "info", "molhiv-like", "--scale", "0.001", "--root", str(tmp_path)]
    assert run(argv) == 0
    out, err = capsys.readouterr()
    assert err.startswith("molhiv-like at scale 0.001 (seed 0): generating, into ")
    assert run(argv) == 0
    again, err = capsys.readouterr()
    assert again == out and err == ""


def test_generate_proteins_like_keeps_its_edge_features(tmp_path, capsys):
    out = tmp_path / "pr.npz"
    assert run(["data", "generate", "proteins-like", "--scale", "0.01", "--out", str(out)]) == 0
    stats = json.loads(capsys.readouterr().out)
    assert stats.pop("path") == str(out)
    back = load_npz(out)
    assert back.stats() == stats
    assert back.graph.edge_features.shape == (back.graph.num_edges, 8)
    assert back.targets.shape == (back.num_nodes, 112)


def test_generate_rmat(tmp_path, capsys):
    out = tmp_path / "r.npz"
    assert run(["data", "generate", "rmat", "--scale", str(2**-9), "--out", str(out)]) == 0
    assert json.loads(capsys.readouterr().out)["nodes"] == 4096
    assert out.is_file()


def test_convert_writes_each_kind_in_the_other_form(tmp_path, capsys):
    """A Planetoid dataset read by name into a memory-mapped folder and back into a file,
    a typed .npz into a folder, a collection's folder into a .npz: each reads back as
    the dataset read (its arrays bit for bit); the dataset itself, or someone else's
    file, is refused as --out before anything is read."""
    import numpy as np

    if not PLANETOID.is_dir():
        pytest.skip("no Planetoid files beside the checkout")
    assert run(["data", "convert", "cora", "--root", str(PLANETOID), "--out",
                str(tmp_path / "cora")]) == 0
    assert json.loads(capsys.readouterr().out)["path"] == str(tmp_path / "cora")
    cora, folder = zg.load_dataset("cora", root=str(PLANETOID)), zg.load_dir(tmp_path / "cora")
    for name in ("features", "labels", "train_idx", "test_idx"):
        np.testing.assert_array_equal(np.asarray(getattr(folder, name)),
                                      np.asarray(getattr(cora, name)))
    np.testing.assert_array_equal(folder.graph.indices, cora.graph.indices)
    assert run(["data", "convert", str(tmp_path / "cora"), "--out",
                str(tmp_path / "c.npz")]) == 0
    assert load_npz(tmp_path / "c.npz").stats() == cora.stats()
    typed = zg.load_hetero_dataset("mag-like", scale=0.001, seed=0)
    zg.save_hetero_npz(typed, tmp_path / "mag.npz")
    assert run(["data", "convert", str(tmp_path / "mag.npz"), "--out",
                str(tmp_path / "mag")]) == 0
    assert zg.load_hetero_dataset(str(tmp_path / "mag")).stats() == typed.stats()
    graphs = zg.molhiv_like(0.002, seed=1)
    zg.save_graphs(graphs, tmp_path / "mol")
    assert run(["data", "convert", str(tmp_path / "mol"), "--out",
                str(tmp_path / "mol.npz")]) == 0
    assert zg.load_graphs(str(tmp_path / "mol.npz")).stats() == graphs.stats()
    capsys.readouterr()
    assert run(["data", "convert", str(tmp_path / "c.npz"), "--out",
                str(tmp_path / "c.npz")]) == 2
    assert "is the dataset read; give another path" in capsys.readouterr().err
    (tmp_path / "notes.npz").write_text("mine")
    assert run(["data", "convert", str(tmp_path / "c.npz"), "--out",
                str(tmp_path / "notes.npz")]) == 2
    assert "notes.npz is a file, not a dataset archive" in capsys.readouterr().err
    assert (tmp_path / "notes.npz").read_text() == "mine"


def test_convert_onto_another_dataset_says_it_replaces_it(tmp_path, capsys):
    """--out holding another dataset written here is replaced (it went without a word):
    stderr says so before the work; a new path draws no such line."""
    import numpy as np

    arrays = dict(indptr=[0, 1, 2, 3], indices=[1, 2, 0], features=np.eye(3),
                  labels=[0, 1, 0], train_idx=[0], val_idx=[1], test_idx=[2], num_classes=2)
    zg.save_npz(zg.make_dataset("old", **arrays), tmp_path / "old.npz")
    zg.save_npz(zg.make_dataset("new", **arrays), tmp_path / "new.npz")
    assert run(["data", "convert", str(tmp_path / "new.npz"), "--out",
                str(tmp_path / "fresh.npz")]) == 0
    assert "replaces" not in capsys.readouterr().err
    assert run(["data", "convert", str(tmp_path / "new.npz"), "--out",
                str(tmp_path / "old.npz")]) == 0
    assert (f"zerognn: --out {tmp_path / 'old.npz'} holds a dataset written before; the "
            f"new one replaces it once written whole") in capsys.readouterr().err
    assert load_npz(tmp_path / "old.npz").name == "new"


def test_generate_rejects_unknown_preset(capsys):
    with pytest.raises(SystemExit) as exit_info:
        run(["data", "generate", "cora", "--out", "x.npz"])
    assert exit_info.value.code == 2
    assert "invalid choice: 'cora'" in capsys.readouterr().err


@pytest.mark.parametrize(("argv", "names"), [([], "{train,data,bench,export,predict}"),
                                             (["data"], "{info,generate,convert}")])
def test_a_missing_command_is_named_by_its_choices(argv, names, capsys):
    """The message named argparse's destination, `data_command`."""
    with pytest.raises(SystemExit):
        run(argv)
    assert capsys.readouterr().err.endswith(f"error: the following arguments are required: "
                                            f"{names}\n")




@pytest.mark.parametrize("command", ["info", "train"])
def test_root_with_a_dataset_read_as_a_path_is_named_as_ignored(tmp_path, capsys, command):
    """`--root` beside a saved file: the loaders read the path as given, and the folder
    was ignored without a word; it is named in a warning, as other options that do
    nothing are."""
    out = tmp_path / "r.npz"
    assert run(["data", "generate", "rmat", "--scale", str(2**-9), "--out", str(out)]) == 0
    argv = (["data", "info", str(out)] if command == "info" else
            ["train", "--dataset", str(out), "--epochs", "1", "--no-progress",
             "--eval-mode", "none", "--batch-size", "4096"])
    root, named = ((str(tmp_path), str(out)) if command == "info" else
                   (repr(str(tmp_path)), f"dataset {str(out)!r}"))
    with pytest.warns(zg.IgnoredOptionWarning) as caught:
        assert run([*argv, "--root", str(tmp_path)]) == 0
    # (on a GPU, JAX's deprecation of the Pallas Triton backend is caught too)
    assert [str(w.message) for w in caught if w.category is zg.IgnoredOptionWarning] == [
        f"{'--' if command == 'info' else ''}root {root}: the folder of datasets read by "
        f"name, ignored for {named}, a path read as it is given"]
    with warnings.catch_warnings():
        warnings.simplefilter("error", zg.IgnoredOptionWarning)
        assert run(argv) == 0
