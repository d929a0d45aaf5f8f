"""Nothing a user can type crashes a run (issue 17): bad options, paths and data get one
line naming the problem and the value; an edgeless graph trains; a diverged run stops
with the epoch and step; every metrics line is strict JSON. Interrupts, checkpoints and
resuming are in test_recovery.py."""

from __future__ import annotations

import dataclasses
import gzip
import importlib.util
import json
import re
import sys
import types
import warnings
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import zerognn_jax as zg
from zerognn_jax import (
    CSRGraph,
    Dataset,
    SamplerConfig,
    TrainConfig,
    from_edge_list,
    load_dataset,
    load_npz,
    make_dataset,
    sample_minibatch,
    train,
)
from zerognn_jax._src.data.checks import key_seed
from zerognn_jax._src.data.loaders import require_graphs
from zerognn_jax._src.training import run_checks, trainer
from zerognn_jax._src.training.trainer import Diverged
from zerognn_jax.cli import main

on_cpu = pytest.mark.skipif(jax.default_backend() == "gpu", reason="checks the CPU message")


def strict_json(line: str):
    """json.loads that refuses NaN and Infinity, as RFC 8259 parsers do."""
    def refuse(constant):
        raise ValueError(f"not strict JSON: {constant}")
    return json.loads(line, parse_constant=refuse)


def small_config(**changes) -> TrainConfig:
    base = dict(hidden=8, layers=2, fanouts=(4, 4), batch_size=32, epochs=2, progress=False)
    return TrainConfig(**{**base, **changes})


def random_dataset(n=200, classes=3, edges=800, seed=0, split=(120, 40, 40), name="r"):
    rs = np.random.default_rng(seed)
    g = from_edge_list(rs.integers(0, n, edges), rs.integers(0, n, edges), n,
                       make_undirected=True, remove_self_loops=True, remove_duplicates=True)
    order = rs.permutation(n)
    a, b, c = split
    return make_dataset(name, g.indptr, g.indices, rs.normal(size=(n, 6)),
                        rs.integers(0, classes, n), np.sort(order[:a]),
                        np.sort(order[a:a + b]), np.sort(order[a + b:a + b + c]), classes)


# ------------------------------------------------------------- options


@pytest.mark.parametrize(("changes", "message"), [
    (dict(model="gat", heads=0), "heads must be >= 1, got 0"),
    (dict(model="gat", hidden=2, heads=4), "hidden 2 is not a multiple of heads 4"),
    (dict(model="gat", hidden=32, heads=3), "hidden 32 is not a multiple of heads 3"),
    (dict(multiple=0), "multiple must be >= 1, got 0"),
    (dict(multiple=-128), "multiple must be >= 1, got -128"),
    (dict(margin=0.5), "margin must be a finite number >= 1, got 0.5"),
    (dict(norm="bogus"), "norm must be one of none, layer, batch, got 'bogus'"),
    (dict(gemm_backend="triton"), "gemm_backend must be one of cublas, xla, got 'triton'"),
    (dict(lr=float("inf")), "lr must be positive and finite, got inf"),
    (dict(read_ahead_gib=0.0), "read_ahead_gib must be positive and at least one byte "
                               "(2**-30 GiB), got 0.0"),
    (dict(read_ahead_gib=float("nan")), "at least one byte (2**-30 GiB), got nan"),
    (dict(read_ahead_gib=1e-12), "at least one byte (2**-30 GiB), got 1e-12"),
    (dict(seed=-1), "seed must be in [0, 2**31), got -1"),
    (dict(seed=2**31), "seed must be in [0, 2**31), got 2147483648"),
    (dict(fanouts=(5, 0)), "fanouts must be positive or -1 (all) at every hop, got 0 at "
                           "hop 1"),
    # refused only by the sampler, once training had started
    (dict(layers=9, fanouts=(2,) * 9), "layers must be at most 8 (one sampled hop each), "
                                       "got 9"),
    # the spec was not quoted, and "a callable" offered what no spec can name
    (dict(kernels="sample=fast"), "bad kernel spec 'sample=fast' in kernels 'sample=fast': "
                                  "sample takes 'xla' or 'pallas', got 'fast'"),
    (dict(kernels="fast"), "bad kernel spec 'fast'"),
    (dict(kernels=" "), "bad kernel spec: kernels ' ' names nothing; expected 'auto', "
                        "'xla' or 'pallas'"),
    (dict(layers=1, fanouts=(5, 5)), "need one fanout per layer: 1 layer but fanouts (5, 5); "
                                     "set layers to 2 (--layers 2) or give 1 fanout"),
    (dict(batch_size=99999999999), "batch_size 99999999999 is past int32 (2**31 - 1)"),
    (dict(fanouts=(3, 2**31), layers=2),
     "fanouts (3, 2147483648): 2147483648 is past int32 (2**31 - 1)"),
    (dict(metrics_out=""), "metrics_out must be a path (left unset: none), got ''"),
    (dict(checkpoint_dir=" "), "checkpoint_dir must be a path (left unset: none), got ' '"),
    (dict(best_metric="", checkpoint_dir="c"), "best_metric must name a metric (val_acc, "
                                               "val_loss, ...), got ''"),
    (dict(dataset=""), "dataset must name a dataset or a folder, got ''"),
    (dict(checkpoint_dir="ck\udcffx"), "checkpoint_dir 'ck\\udcffx' is not UTF-8 text, "
                                        "which checkpoints (orbax) need"),
    (dict(root=""), "root must be a folder (left unset: the default), got ''"),
    # was an OverflowError's traceback from the first step's frontier
    (dict(task="link", negatives=2_100_000, batch_size=1024),
     "negatives 2100000 with batch_size 1024 gives a step 2,150,402,048 node ids (each "
     "pair's ends, negatives included), past int32's 2**31 - 1: lower either"),
])
def test_config_names_the_bad_value(changes, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        small_config(**changes)


@pytest.mark.parametrize(("seed", "message"), [
    (2**32, r"got 4294967296$"), (np.array(-1), r"got array\(-1\)$"), (2.0, "got 2.0$"),
    (True, "got True$"), ("3", "got '3'$"),
    # a key (as the loaders take) met JAX's "cannot be converted to a NumPy array"
    (jax.random.key(0), r"got a PRNG key \(key<fry>\): this takes the integer keys are "
                        r"made from$")])
def test_a_sampling_seed_outside_uint32_is_named(seed, message):
    """Evaluation's sampling seeds are uint32s: NumPy integers in range are taken as
    the seeds of training are, anything else is named."""
    assert [key_seed(np.int64(7)), key_seed(np.array(7, np.uint8)), key_seed(2**32 - 1)] == [
        7, 7, 2**32 - 1]
    with pytest.raises(ValueError, match=r"^seed must be an integer in \[0, 2\*\*32\), " + message):
        key_seed(seed)


@on_cpu
def test_pallas_kernels_on_a_cpu_say_what_to_use_instead():
    with pytest.raises(ValueError, match=r"^kernels 'pallas' runs sample, relabel, gather, "
                                         r"weighted_sum, max, row_adam as Pallas kernels, "
                                         r"which need an NVIDIA GPU; JAX's backend here is "
                                         r"cpu: use kernels 'xla' or 'auto'$"):
        small_config(kernels="pallas")
    with pytest.raises(ValueError, match=r"runs sample as Pallas kernels"):
        small_config(kernels="sample=pallas")
    # a `Kernels` given to a public op (JAX's lowering error came from deep inside it);
    # interpreted ones are the kernels' tests'
    graph = zg.from_edge_list([0, 1], [1, 2], 3, make_undirected=True)
    config = zg.SamplerConfig(fanouts=(2,))
    sample = lambda kernels: zg.sample_minibatch(
        graph, jnp.array([0, 1]), jnp.array([True, True]), 0, config, (8,), kernels=kernels)
    with pytest.raises(ValueError, match=r"^kernels 'sample=pallas,relabel=xla,.*' runs "
                                         r"sample as Pallas kernels, which need an NVIDIA "
                                         r"GPU; JAX's backend here is cpu"):
        sample(zg.Kernels(sample="pallas"))
    assert sample(zg.Kernels(sample="pallas", interpret=True)).counts[-1] == 3


def test_cli_option_errors_are_one_line(capsys):
    assert main(["train", "--kernels", "sample=fast", "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("zerognn: error: bad kernel spec 'sample=fast' in --kernels "
                          "'sample=fast': sample takes 'xla' or 'pallas', got 'fast'")
    assert err.count("\n") == 1
    with pytest.raises(SystemExit) as exit_:
        main(["train", "--norm", "bogus"])
    assert exit_.value.code == 2
    assert "argument --norm: invalid choice: 'bogus'" in capsys.readouterr().err
    # a value the config refuses is named by the flag that gave it
    for argv, message in ((["train", "--seed", "-3"], "--seed must be in [0, 2**31), got -3"),
                          (["bench", "--batch-size", "0"], "--batch-size must be >= 1, got 0"),
                          # the bench's own checks of a training field and of its own
                          (["bench", "--epochs", "0"], "--epochs must be >= 1, got 0"),
                          (["bench", "--batch-sizes", "0"],
                           "--batch-sizes must be in [1, 2**31), got (0,)"),
                          (["train", "--scale", "nan"],
                           "--scale must be positive and finite, got nan")):
        assert main([*argv, "--no-progress"]) == 2
        assert capsys.readouterr().err == f"zerognn: error: {message}\n"
    # the bench sets its configurations' engine, kernels and dtype, measures node
    # classification and evaluates and checkpoints nothing: those options are not its own
    for flag in ("--task", "--negatives", "--readout", "--eval-batch-size",
                 "--checkpoint-dir", "--metrics-out", "--best-metric"):
        with pytest.raises(SystemExit) as exit_:
            main(["bench", flag, "1", "--no-progress"])
        assert exit_.value.code == 2
        assert f"unrecognized arguments: {flag} 1" in capsys.readouterr().err
    for flag in ("--dtype", "--engine"):  # with where the bench chooses them
        with pytest.raises(SystemExit) as exit_:
            main(["bench", flag, "1", "--no-progress"])
        assert exit_.value.code == 2
        assert f"{flag} is what each configuration sets" in capsys.readouterr().err


@pytest.mark.parametrize(("args", "message"), [
    (["--dataset", "mag-like", "--scale", "0.001", "--model", "rsage", "--layers", "2",
      "--fanouts", "5,5", "--relation-fanouts", "cites=5"],
     "--relation-fanouts['cites'] is (5,): one fanout per layer is needed, and the model "
     "has 2 layers"),
    (["--dataset", "products-like", "--scale", "0.001", "--edge-features"],
     "edge_features is set (--edge-features), and --dataset 'products-like' has no "
     "edge-feature table (CSRGraph.edge_features)"),
    (["--dataset", "ogbn-mag"],
     "ogbn-mag needs root= (--root), the folder that holds ogbn_mag/"),
    # named as fields by the library, spelled as flags here: fields with an underscore
    # anywhere, others where the command line gave them and a value follows
    (["--best-metric", "val_acc"],
     "--best-metric 'val_acc' keeps a checkpoint: set --checkpoint-dir"),
    (["--model", "gat", "--hidden", "10", "--heads", "4", "--layers", "2", "--fanouts", "5,5"],
     "GAT splits hidden over its heads: --hidden 10 is not a multiple of --heads 4"),
    (["--model", "gin"], "--model 'gin' is a graph-level model (--task graph); this node "
                         "task takes one of sage, sage-max, sage-sum, gcn, gat, gine, mlp"),
    (["--dataset", "mag-like", "--scale", "0.001", "--model", "sage"],
     "--model 'sage' is a model of one-type graphs; this node task of a typed graph takes "
     "one of rsage, rgcn, rgat"),
    # gcn is also a graph-level model's name, which was all the message said
    (["--dataset", "mag-like", "--scale", "0.001", "--model", "gcn"],
     "--model 'gcn' is a model of one-type graphs; this node task of a typed graph takes "
     "one of rsage, rgcn, rgat"),
])
def test_errors_found_while_preparing_a_run_name_the_flag(capsys, args, message):
    """Raised by `train()` (fields, as Python calls it), they also name the command
    line's flag."""
    assert main(["train", *args, "--epochs", "1", "--no-progress"]) == 2
    assert capsys.readouterr().err == f"zerognn: error: {message}\n"


def test_a_missing_optional_dependency_is_one_line_exit_2(monkeypatch, capsys, tmp_path):
    """--tensorboard-dir without tensorboardX was a traceback, exit 1."""
    def check(logdir):
        if not logdir:
            return []
        raise ImportError("tensorboard_dir needs tensorboardX, which is not installed here: "
                          "pip install 'zerognn-jax[tensorboard]'")
    monkeypatch.setattr(trainer, "check_tensorboard", check)
    assert main(["train", "--no-progress", "--tensorboard-dir", str(tmp_path / "tb")]) == 2
    assert capsys.readouterr().err == ("zerognn: error: --tensorboard-dir needs tensorboardX, "
                                       "which is not installed here: pip install "
                                       "'zerognn-jax[tensorboard]'\n")
    def broken(*args, **kwargs):  # a broken install is no option's: its traceback stays
        raise ImportError("cannot import name 'x' from 'y'")
    monkeypatch.setattr(trainer, "prepare", broken)
    with pytest.raises(ImportError, match="cannot import name"):
        main(["train", "--no-progress"])


def test_a_device_out_of_memory_is_one_line_naming_what_to_lower(monkeypatch, capsys):
    """A run whose model, table or batch does not fit ended in JAX's traceback (a
    learnable embedding of 10**8 rows x 100, for one); other runtime errors still raise."""
    import jax

    def fail(error):
        def prepare(*args, **kwargs):
            error.add_note("For simplicity, JAX has removed its internal frames ... Set "
                           "JAX_TRACEBACK_FILTERING=off to include these.")
            raise error
        monkeypatch.setattr(trainer, "prepare", prepare)

    fail(jax.errors.JaxRuntimeError("RESOURCE_EXHAUSTED: Out of memory allocating 48000000000 "
                                    "bytes.\nmore lines"))
    assert main(["train", "--no-progress"]) == 1
    assert capsys.readouterr().err == (
        "zerognn: error: the device ran out of memory (RESOURCE_EXHAUSTED: Out of memory "
        "allocating 48000000000 bytes.); give it less to hold: a smaller --batch-size, "
        "--hidden or --embedding-dim, --dtype bfloat16, or the feature table in host memory "
        "(--feature-placement host)\n")
    # each command names its own flags (data generate made papers100m-like on the device)
    from zerognn_jax.cli import data as data_cli

    def generate(*args, **kwargs):
        raise jax.errors.JaxRuntimeError("RESOURCE_EXHAUSTED: Out of memory allocating 9 bytes.")

    monkeypatch.setattr(data_cli, "write_papers100m_like", generate)
    assert main(["data", "generate", "papers100m-like", "--out", "/nonexistent/p"]) == 1
    assert capsys.readouterr().err.endswith("; give it less to hold: a smaller --scale\n")
    # the CPU backend's form (a probe: --fanouts 50000,50000 --replace on tiny)
    fail(jax.errors.JaxRuntimeError("INTERNAL: Error dispatching computation: Out of memory "
                                    "allocating 205964238584 bytes."))
    assert main(["train", "--no-progress"]) == 1
    assert capsys.readouterr().err.startswith(
        "zerognn: error: the device ran out of memory (INTERNAL: Error dispatching "
        "computation: Out of memory allocating 205964238584 bytes.); give it less to hold")
    fail(jax.errors.JaxRuntimeError("INTERNAL: something else"))
    with pytest.raises(jax.errors.JaxRuntimeError, match="INTERNAL"):
        main(["train", "--no-progress"])


# ---------------------------------------------------- output paths, first


@pytest.fixture()
def no_work(monkeypatch):
    """Makes loading the data fail loudly: an output check must come before it."""
    def prepare(*args, **kwargs):
        raise AssertionError("the run started working before checking its output paths")
    monkeypatch.setattr(trainer, "prepare", prepare)


@pytest.mark.parametrize(("flag", "where", "message"), [
    ("--metrics-out", "dir", "--metrics-out {p} is a directory; give a file path"),
    ("--metrics-out", "under_file", "the folder of --metrics-out {p.parent} is not writable: "
                                    "Not a directory"),
    ("--metrics-out", "file_as_folder", "the folder of --metrics-out {p.parent} is not a "
                                        "directory"),
    ("--metrics-out", "proc", "the folder of --metrics-out {p.parent} is not writable"),
    ("--checkpoint-dir", "file", "--checkpoint-dir {p} is not a directory"),
    ("--checkpoint-dir", "under_file", "--checkpoint-dir {p} is not writable: Not a "
                                       "directory"),
    ("--checkpoint-dir", "proc", "--checkpoint-dir {p} is not writable"),
    # a new run's epochs had been written inside that checkpoint
    ("--checkpoint-dir", "epoch", "--checkpoint-dir {p} is epoch 2's checkpoint of the run "
                                  "folder {p.parent}: give {p.parent} to resume that run"),
    # read as a damaged epoch's checkpoint, it was renamed 2023.corrupt
    ("--checkpoint-dir", "own_number", "--checkpoint-dir {p} holds the folder 2023, which is "
                                       "no checkpoint (nothing a checkpoint writes is in it)"),
    # a new run wrote its epochs beside another run's folder (a folder given to an example)
    ("--checkpoint-dir", "parent", "--checkpoint-dir {p} holds another run's checkpoint "
                                   "folder, {p}/run, and no checkpoint of its own: give "
                                   "{p}/run to resume that run"),
    # the best checkpoint's epoch names the run's folder, not best/
    ("--checkpoint-dir", "best_epoch", "--checkpoint-dir {p} is epoch 3's checkpoint of the "
                                       "run folder {p.parent.parent}: give {p.parent.parent} "
                                       "to resume that run"),
])
def test_unusable_output_paths_fail_before_any_work(tmp_path, capsys, no_work, flag, where,
                                                    message):
    (tmp_path / "file").write_text("x")
    (tmp_path / "run" / "2" / "meta").mkdir(parents=True)  # an epoch's checkpoint
    (tmp_path / "run" / "best" / "3" / "state").mkdir(parents=True)
    (tmp_path / "mine" / "2023").mkdir(parents=True)  # a user's own folder
    (tmp_path / "mine" / "2023" / "notes.txt").write_text("mine")
    (tmp_path / "mine" / "7").mkdir()  # empty: a damaged epoch's, set aside by a run
    path = {"dir": tmp_path, "file": tmp_path / "file",
            "under_file": tmp_path / "file" / "sub" / "m.jsonl",
            "file_as_folder": tmp_path / "file" / "m.jsonl",
            "proc": Path("/proc/zerognn-test/m.jsonl"), "epoch": tmp_path / "run" / "2",
            "best_epoch": tmp_path / "run" / "best" / "3", "own_number": tmp_path / "mine",
            "parent": tmp_path}[where]
    assert main(["train", "--no-progress", flag, str(path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("zerognn: error: " + message.format(p=path)), err
    assert err.count("\n") == 1
    assert sorted(p.name for p in (tmp_path / "run" / "2").iterdir()) == ["meta"]
    assert sorted(p.name for p in (tmp_path / "mine").iterdir()) == ["2023", "7"]


def test_metrics_out_naming_the_checkpoint_folder_is_refused_as_such(tmp_path, capsys,
                                                                     no_work):
    """The folder did not exist yet: the check made it for the checkpoints, then called
    the metrics path "no regular file, not a regular file"."""
    same = tmp_path / "same"
    assert main(["train", "--no-progress", "--checkpoint-dir", str(same), "--metrics-out",
                 str(same)]) == 2
    assert capsys.readouterr().err == (f"zerognn: error: --metrics-out {same} is the folder "
                                       f"--checkpoint-dir names; give a file path\n")
    assert not same.exists()


@pytest.mark.parametrize(("args", "message"), [
    (["train", "--fanouts", "3,,3"], "argument --fanouts: expected comma-separated "
                                     "integers, got '3,,3'"),
    (["data", "generate", "rmat", "--out", "g.npz", "--seed", "-1"],
     "argument --seed: expected an integer >= 0, got '-1'"),
    (["data", "generate", "rmat", "--out", ""], "argument --out: expected a path, got ''"),
    # a seed no `zerognn train --seed` could name had been taken
    (["data", "info", "products-like", "--seed", "2147483648"],
     "argument --seed: expected an integer in [0, 2**31), got '2147483648'"),
    # a prefix had been taken for the flag: `bench --epoch 2` started a full benchmark
    (["train", "--epoch", "2", "--batch-size", "0"],
     "unrecognized arguments: --epoch 2 (--epoch: did you mean --epochs?)"),
    # the hint had offered the flag refused: "(--out: did you mean --out?)"
    (["data", "info", "tiny", "--out", "x.npz"],
     "unrecognized arguments: --out x.npz (--out is an option of `zerognn data generate`, "
     "`zerognn data convert`, `zerognn bench`, `zerognn export` and `zerognn predict`)"),
    # argparse had said only that a command is required
    (["--verison"], "unrecognized arguments: --verison (--verison: did you mean --version?); "
                    "the command comes first"),
    (["--epochs", "3", "train"], "(--epochs is an option of `zerognn train` and `zerognn "
                                 "bench`); the command comes first"),
    # "unrecognized arguments" had not said where the bench's kernels are chosen
    (["bench", "--kernels", "xla"], "--kernels is what each configuration sets: choose the "
                                    "configurations with --configs (host-exact, "),
])
def test_malformed_or_misplaced_flags_are_named(capsys, args, message):
    with pytest.raises(SystemExit) as stop:
        main(args)
    assert stop.value.code == 2 and message in capsys.readouterr().err


def test_a_list_of_negative_fanouts_is_taken_without_the_equals_sign(capsys):
    """`--fanouts -1,-1` was "argument --fanouts: expected one argument" (argparse takes
    a value starting with - for a flag); the fanouts' own check now sees the value."""
    assert main(["train", "--no-progress", "--layers", "3", "--fanouts", "-1,-1"]) == 2
    assert "3 layers but fanouts (-1, -1)" in capsys.readouterr().err
    assert main(["bench", "--fanouts", "-1,-1", "--layers", "3"]) == 2
    assert "3 layers but fanouts (-1, -1)" in capsys.readouterr().err


def test_the_bench_names_the_benchmark_of_a_graph_collection(capsys):
    """The training config's check had answered first, with a --task flag the bench
    lacks."""
    assert main(["bench", "--dataset", "molhiv-like"]) == 2
    assert capsys.readouterr().err == ("zerognn: error: zerognn bench times node "
                                       "classification; molhiv-like is a collection of "
                                       "graphs: run benchmarks/graph.py\n")


def test_a_ctrl_c_while_the_command_starts_ends_in_one_line(monkeypatch, capsys):
    """The `zerognn` entry point imports the package (a second or two) inside its own
    guard: a Ctrl-C there exits with 130 and one line, not a traceback."""
    import builtins

    import zerognn_cli

    real = builtins.__import__

    def interrupted(name, *args, **kwargs):
        if name == "zerognn_jax.cli":
            raise KeyboardInterrupt
        return real(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", interrupted)
    assert zerognn_cli.main() == 130
    assert capsys.readouterr().err == "zerognn: interrupted while starting\n"


def test_a_ctrl_c_that_the_import_swallows_still_ends_the_command(monkeypatch, capsys):
    """Python prints and drops a KeyboardInterrupt raised in a callback, as JAX's garbage
    collection hook is, and the import went on: the command then ran to its end (exit
    0; 2 of 8 Ctrl-Cs a second into `zerognn data generate`)."""
    import builtins
    import gc
    import os
    import signal
    import time

    import zerognn_cli

    real = builtins.__import__

    def hook(phase, info):
        if phase == "start":
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(1)  # the handler runs here, inside the collection's callback

    def swallowing(name, *args, **kwargs):
        if name == "zerognn_jax.cli":
            gc.callbacks.append(hook)
            try:
                gc.collect()  # Python reports the hook's KeyboardInterrupt, and drops it
            finally:
                gc.callbacks.remove(hook)
        return real(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", swallowing)
    reported = []  # Python's default hook prints each report with a traceback
    monkeypatch.setattr(sys, "unraisablehook", reported.append)
    before = signal.getsignal(signal.SIGINT)
    assert zerognn_cli.main() == 130
    assert capsys.readouterr().err == "zerognn: interrupted while starting\n"
    assert reported == []  # the dropped KeyboardInterrupt was reported (printed) before
    assert signal.getsignal(signal.SIGINT) is before  # the handler it found is back
    assert sys.unraisablehook == reported.append
    # a SIGINT the process ignores (a script's `&` job) stays ignored through the import
    seen = []
    monkeypatch.setattr(builtins, "__import__", lambda name, *a, **k: (
        seen.append(signal.getsignal(signal.SIGINT)) if name == "zerognn_jax.cli" else None)
        or real(name, *a, **k))
    monkeypatch.setattr("zerognn_jax.cli.main", lambda: 0)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        assert zerognn_cli.main() == 0
        assert seen == [signal.SIG_IGN] and signal.getsignal(signal.SIGINT) is signal.SIG_IGN
    finally:
        signal.signal(signal.SIGINT, before)


def test_existing_metrics_file_that_cannot_be_appended_to(tmp_path, capsys, no_work):
    if not Path("/proc/version").is_file():
        pytest.skip("needs Linux's /proc/version")
    link = tmp_path / "m.jsonl"  # in a writable folder, a file not even root may append to
    link.symlink_to("/proc/version")
    assert main(["train", "--no-progress", "--metrics-out", str(link)]) == 2
    assert capsys.readouterr().err.startswith(f"zerognn: error: --metrics-out {link} is not "
                                              f"writable: ")


# ---------------------------------------------- data: same rules every way


def write_npz(path: Path, arrays: dict) -> Path:
    np.savez(path, format_version=np.int64(1), name=np.str_(arrays["name"]),
             num_classes=np.int64(arrays["num_classes"]),
             **{k: np.asarray(v) for k, v in arrays.items()
                if k not in ("name", "num_classes")})
    return path


def write_ogb(root: Path, arrays: dict) -> Path:
    """An ogbn-arxiv folder (40 classes) holding `arrays`' edges, features and split."""
    def csv(path, rows):
        path.parent.mkdir(parents=True, exist_ok=True)
        with gzip.open(path, "wt") as f:
            f.writelines(",".join(str(v) for v in np.atleast_1d(r)) + "\n" for r in rows)
    raw, split = root / "ogbn_arxiv" / "raw", root / "ogbn_arxiv" / "split" / "time"
    indptr = np.asarray(arrays["indptr"])
    src = np.repeat(np.arange(indptr.size - 1), np.diff(indptr))
    csv(raw / "edge.csv.gz", np.stack([src, arrays["indices"]], 1))
    csv(raw / "node-feat.csv.gz", arrays["features"])
    csv(raw / "node-label.csv.gz", arrays["labels"])
    csv(raw / "num-node-list.csv.gz", [indptr.size - 1])
    for part, key in (("train", "train_idx"), ("valid", "val_idx"), ("test", "test_idx")):
        csv(split / f"{part}.csv.gz", arrays[key])
    return root


def good_arrays() -> dict:
    n = 5
    return dict(name="t", indptr=np.array([0, 1, 2, 3, 4, 4]), indices=np.array([1, 0, 3, 2]),
                features=np.ones((n, 3), np.float32), labels=np.array([0, 1, 39, 2, 1]),
                train_idx=np.array([0, 1]), val_idx=np.array([2]), test_idx=np.array([3, 4]),
                num_classes=40)


def arrive(way: str, arrays: dict, tmp_path: Path):
    if way == "python":
        return make_dataset(**arrays)
    if way == "constructor":
        kw = {k: np.asarray(v) for k, v in arrays.items()
              if k not in ("name", "num_classes", "indptr", "indices")}
        return Dataset(name="t", graph=CSRGraph(np.asarray(arrays["indptr"]),
                                                np.asarray(arrays["indices"])),
                       num_classes=arrays["num_classes"], **kw)
    if way == "npz":
        return load_npz(write_npz(tmp_path / "d.npz", arrays))
    return load_dataset("ogbn-arxiv", root=write_ogb(tmp_path, arrays))


WAYS = ("python", "constructor", "npz", "ogb")


@pytest.mark.parametrize("way", WAYS)
@pytest.mark.parametrize(("change", "message"), [
    (dict(train_idx=np.array([0, 9])), r"train_idx has node ids outside \[0, 5\), found range "
                                       r"\[0, 9\]"),
    # 2**32 + 1 narrowed to int32 would become node 1: it must be refused before the cast.
    (dict(test_idx=np.array([3, 2**32 + 1])), r"test_idx has node ids outside \[0, 5\)"),
    (dict(labels=np.array([0, 1, 40, 2, 1])), r"labels must lie in \[-1, 40\), found range "
                                              r"\[0, 40\]"),
    (dict(features=np.where(np.eye(5, 3) > 0, np.nan, 1.0)),
     r"features contain NaN or inf \(3 entries; first at row 0, column 0"),
])
def test_bad_arrays_get_the_same_message_every_way(tmp_path, way, change, message):
    arrays = {**good_arrays(), **change}
    with pytest.raises(ValueError, match=message):
        arrive(way, arrays, tmp_path)


@pytest.mark.parametrize("way", WAYS)
def test_finite_features_past_float32_are_named_as_given(tmp_path, way):
    """float64 rows past float32's range are named with their value; OGB's reader parses
    its text to float32 directly, so it sees inf there."""
    arrays = {**good_arrays(), "features": np.where(np.eye(5, 3) > 0, 1e300, 1.0)}
    message = (r"features contain NaN or inf \(3 entries; first at row 0, column 0\)$"
               if way == "ogb" else r"features overflow float32: 1e\+300 at row 0, column 0 "
                                    r"is past its largest magnitude \(3\.40282e\+38\)$")
    with pytest.raises(ValueError, match=message):
        arrive(way, arrays, tmp_path)


@pytest.mark.parametrize("way", WAYS)
def test_good_arrays_load_every_way(tmp_path, way):
    ds = arrive(way, good_arrays(), tmp_path)
    assert ds.num_nodes == 5 and ds.labels.tolist() == [0, 1, 39, 2, 1]


@pytest.mark.parametrize("way", ("python", "constructor", "npz"))
@pytest.mark.parametrize(("change", "message"), [
    (dict(indices=np.array([1, 0, 7, 2])), r"indices has node id 7 at position 2, out of "
                                           r"range for num_nodes=5"),
    (dict(indptr=np.array([0, 1, 2, 3, 4, 3])), r"indptr must start at 0 and end at "
                                                r"len\(indices\)=4, got 0 and 3"),
    (dict(indptr=np.array([0, 2, 1, 3, 4, 4])), r"indptr decreases at row 1"),
    (dict(train_idx=np.array([0.0, 1.5])), r"train_idx must be a 1-D array of integers, got "
                                           r"float64|train_idx must be a 1-D integer array"),
])
def test_bad_graph_or_ids_every_way(tmp_path, way, change, message):
    with pytest.raises((ValueError, TypeError), match=message):
        arrive(way, {**good_arrays(), **change}, tmp_path)


@pytest.mark.parametrize("bad", [40.5, True, "40", float("nan")])
def test_num_classes_must_be_whole(bad):
    """A bool and a string of digits were taken as counts before the check was shared."""
    with pytest.raises(ValueError, match=f"num_classes must be an integer, got "
                                         f"{re.escape(repr(bad))}"):
        make_dataset(**{**good_arrays(), "num_classes": bad})
    assert make_dataset(**{**good_arrays(), "num_classes": np.array(40.0)}).num_classes == 40


@pytest.mark.parametrize("name", (None, "", 5))
def test_a_dataset_needs_a_name(name):
    with pytest.raises(ValueError, match=rf"name must be a non-empty string .* got {name!r}"):
        make_dataset(**{**good_arrays(), "name": name})


# ------------------------------------------------------ an edgeless graph


def edgeless_dataset(n=300, classes=3):
    g = from_edge_list(np.zeros(0, np.int64), np.zeros(0, np.int64), n)
    rs = np.random.default_rng(0)
    # Labels follow the features, so a model that sees only a node's own row can learn.
    feats = rs.normal(size=(n, 8))
    labels = np.argmax(feats[:, :classes], axis=1)
    return make_dataset("edgeless", g.indptr, g.indices, feats, labels, np.arange(200),
                        np.arange(200, 250), np.arange(250, 300), classes)


def test_edgeless_graph_samples_nothing():
    g = edgeless_dataset().graph.to_device()
    cfg = SamplerConfig((4, 3)).resolve(0)
    seeds = jax.numpy.arange(16, dtype=jax.numpy.int32)
    mb = sample_minibatch(g, seeds, seeds < 10, jax.numpy.uint32(7), cfg, (128, 128))
    assert mb.counts.tolist() == [10, 10, 10]  # the seeds alone, at every level
    assert not any(bool(b.mask.any()) for b in mb.blocks) and not bool(mb.overflow)


@pytest.mark.parametrize("changes", [
    dict(model="mlp"),
    dict(model="sage", fanouts=(-1, -1)),
    dict(model="sage-max", envelope="conservative"),
    dict(model="gcn", engine="host-exact"),
    dict(model="gat", heads=2, dedup=False, eval_mode="sampled"),
], ids=lambda c: "-".join(f"{v}" for v in c.values()))
def test_edgeless_graph_trains(changes):
    """Aggregations over no neighbours give zeros; every model still learns from the
    nodes' own features (labels are a function of them)."""
    result = train(small_config(epochs=6, lr=0.05, dropout=0.0, **changes), edgeless_dataset())
    losses = [h["loss"] for h in result.history]
    assert all(np.isfinite(losses)) and losses[-1] < losses[0], losses
    assert result.summary["test_acc"] > 0.5  # three classes: chance is about 1/3


def test_featureless_nodes_need_an_embedding(tmp_path):
    """A feature table of no columns trains only with a learnable embedding; without
    one the run is refused before any work, naming the dataset (and the file it was
    read from) and the option."""
    ds = random_dataset()
    bare = dataclasses.replace(ds, features=np.zeros((200, 0), np.float32))
    with pytest.raises(ValueError, match=r"^dataset 'r' has no feature columns \(features "
                                         r"\[200, 0\]\) .+ set embedding_dim "):
        train(small_config(epochs=1), bare)
    path = zg.save_npz(bare, tmp_path / "bare.npz")
    with pytest.raises(ValueError, match=rf"^dataset 'r' \(read from {re.escape(str(path))}\) "
                                         r"has no feature columns "):
        train(small_config(epochs=1, dataset=str(path)))
    losses = [h["loss"] for h in train(small_config(epochs=1, embedding_dim=4), bare).history]
    assert np.isfinite(losses).all()


# -------------------------------------------- divergence and strict JSON


def test_divergence_stops_with_epoch_and_step(tmp_path):
    metrics = tmp_path / "m.jsonl"
    cfg = small_config(lr=1e30, epochs=3, metrics_out=str(metrics),
                       checkpoint_dir=str(tmp_path / "ck"))
    with pytest.raises(Diverged, match=r"^training diverged: the loss became NaN or infinite "
                                       r"at epoch 0, step \d+ \(of 4\); nothing of this epoch "
                                       r"is saved\. Lower lr \(now 1e\+30\)") as err:
        train(cfg, random_dataset())
    step = int(re.search(r"step (\d+)", str(err.value)).group(1))
    records = [strict_json(line) for line in metrics.read_text().splitlines()]
    assert len(records) == 1 and records[0]["loss"] is None
    # after an update (the hint is to lower lr), at the step the message names
    assert records[0]["epoch"] == 0 and records[0]["diverged_at_step"] == step >= 1
    assert not (tmp_path / "ck").exists()  # no checkpoint: the folder made for it goes
    # the same run again with a sane lr: its block starts at epoch 0 (the diverged
    # epoch's record stayed, and read as the first of this run's)
    sane = train(dataclasses.replace(cfg, lr=1e-3, epochs=1), random_dataset())
    records = [strict_json(line) for line in metrics.read_text().splitlines()]
    assert [(r.get("epoch"), r.get("summary", False)) for r in records] == [
        (0, False), (None, True)]
    assert records[0]["loss"] == sane.history[0]["loss"] and "diverged_at_step" not in records[0]


def test_a_last_update_to_nan_stops_the_run_before_its_checkpoint(tmp_path):
    """One step an epoch (a full batch): every loss is computed before its update, so a
    NaN update showed in no loss and its weights were saved as the epoch's checkpoint,
    which each rerun resumed from. The state after the epoch is checked now."""
    metrics, ck = tmp_path / "m.jsonl", tmp_path / "ck"
    cfg = small_config(batch_size=120, epochs=2, metrics_out=str(metrics),
                       checkpoint_dir=str(ck), eval_mode="none")
    with pytest.raises(Diverged, match=r"^training diverged: the parameters became NaN or "
                                       r"infinite in the update of epoch 0, step 0 \(its "
                                       r"last; every loss was finite\); "
                                       r"nothing of this epoch is saved\. Lower your "
                                       r"optimizer's learning rate"):
        # (a schedule: a NaN constant rate reaches XLA:GPU's matmul as its alpha, which
        # cuBLAS refuses at compile time)
        train(cfg, random_dataset(), optimizer=optax.sgd(lambda step: jnp.where(
            step >= 0, jnp.nan, 0.1)))
    records = [strict_json(line) for line in metrics.read_text().splitlines()]
    assert [(r["epoch"], r["diverged_at_step"]) for r in records] == [(0, 0)]
    assert records[0]["loss"] is not None and not ck.exists()


def test_a_loss_that_overflows_before_any_update_names_the_data(tmp_path):
    """Targets of 1e20 are finite, but their squared error is not: the loss overflows at
    the first step, before any update, where lowering lr cannot help."""
    ds = random_dataset()
    ds = ds.with_targets(np.full(ds.num_nodes, 1e20), "regression")
    with pytest.raises(Diverged, match=r"at epoch 0, step 0 \(of 4\); nothing of this epoch "
                                       r"is saved\. It came before any update: check the "
                                       r"features and targets"):
        train(small_config(eval_mode="none"), ds)


def test_a_loss_of_yours_that_is_not_finite_at_first_is_named_first():
    """The hint before any update named the data and the initialisation, never the
    loss a user brought, the likeliest cause."""
    def logs_of_negatives(outputs, targets):
        return jnp.log(outputs[:, 0] * 0 - 1.0)

    with pytest.raises(Diverged, match=r"It came before any update: check your loss on "
                                       r"the first batch's outputs and targets"):
        train(small_config(eval_mode="none"), random_dataset(), loss=logs_of_negatives)


def test_normalize_features_refuses_signed_features_before_training(tmp_path):
    with pytest.raises(ValueError, match=r"^normalize_features divides each row of the "
                                         r"features by its sum, which needs values >= 0"):
        train(small_config(normalize_features=True,
                           metrics_out=str(tmp_path / "m.jsonl")), random_dataset())
    assert not (tmp_path / "m.jsonl").exists()


def test_slots_past_int32_are_named_before_anything_is_allocated():
    """With replacement a fanout keeps its slots however small the graph: 32 seeds x 2**30
    slots failed in JAX's argument parsing (OverflowError) inside the relabel."""
    with pytest.raises(ValueError, match=r"^hop 1 would sample 34,359,738,368 slots \(32 "
                                         r"rows x 1,073,741,824\), more than int32 positions "
                                         r"reach \(2,147,483,647\): lower the fanouts"):
        train(small_config(fanouts=(2**30, 2**30), replace=True), random_dataset())


def test_wrong_kinds_of_data_are_named_where_they_are_given(tmp_path):
    """Each of these raised an AttributeError or NumPy's error from inside the library
    (a user trial of bad inputs); each now names the argument and what it got."""
    with pytest.raises(ValueError, match=r"^edge_index must be a rectangular array: its "
                                         r"rows have different lengths \(2, 3\)$"):
        zg.from_edge_index([[0, 1, 2], [1, 2]])
    with pytest.raises(ValueError, match=r"^src must be a rectangular array: it mixes "
                                         r"numbers and sequences$"):
        zg.from_edge_list([0, [1, 2]], [1, 2])
    with pytest.raises(TypeError, match=r"^from_networkx takes a networkx graph, got list "
                                        r"\(a list of \(u, v\) edges: from_edge_list"):
        zg.from_networkx([(0, 1), (1, 2)])
    with pytest.raises(TypeError, match=r"^as_hetero takes a CSRGraph .*, got ndarray$"):
        zg.as_hetero(np.array([[0, 1], [1, 0]]))
    g = zg.from_edge_list([0, 1, 2], [1, 2, 0])
    x, y, ids = np.ones((3, 2), np.float32), np.array([0, 1, 0]), np.array([0])
    with pytest.raises(ValueError, match=r"^graph must be a CSRGraph, got tuple"):
        zg.Dataset("t", (g.indptr, g.indices), x, y, ids, ids + 1, ids + 2, 2)
    with pytest.raises(ValueError, match=r"^graph\.indptr must be an array, got a list"):
        zg.Dataset("t", zg.CSRGraph([0, 1, 2, 3], [1, 2, 0]), x, y, ids, ids + 1, ids + 2, 2)
    for load, name in ((zg.load_dataset, "tiny"), (zg.load_hetero_dataset, "shop-like"),
                       (zg.load_graphs, "molhiv-like")):
        with pytest.raises(ValueError, match=r"^seed must be an integer >= 0, got -1$"):
            load(name, seed=-1)
    with pytest.raises(ValueError, match=r"^features must be floating point, got int32"):
        zg.NeighborLoader(g, np.arange(3), fanouts=(2,), batch_size=2, key=0,
                          features=np.ones((3, 2), np.int32))
    with pytest.raises(ValueError, match=r"^features\['n'\] must be floating point, got bool"):
        zg.HeteroNeighborLoader(zg.as_hetero(g, "n", "e"), ("n", np.arange(3)), fanouts=(2,),
                                batch_size=2, key=0, features={"n": np.ones((3, 2), bool)})
    # restore's arguments, before the folder is looked for
    with pytest.raises(TypeError, match=r"^restore takes a TrainConfig as cfg \(or None: "
                                        r"the one the checkpoint records\), got dict$"):
        zg.restore(tmp_path, {"hidden": 8})
    with pytest.raises(TypeError, match=r"^dataset 'small' is a name or a path: leave "
                                        r"dataset out to load the one the checkpoint "
                                        r"records"):
        zg.restore(tmp_path, dataset="small")


def test_train_names_arguments_of_the_wrong_kind():
    with pytest.raises(TypeError, match="train takes a TrainConfig as cfg, got dict"):
        train({"epochs": 1}, random_dataset())
    with pytest.raises(TypeError, match="dataset 'tiny' is a name or a path: give it as "
                                        r"TrainConfig\(dataset=...\)"):
        train(small_config(), "tiny")
    # a graph without features or labels was read as a dataset: an AttributeError
    graph = random_dataset().graph
    for task in ("node", "link"):
        with pytest.raises(TypeError, match=rf"^the {task} task trains on a Dataset, got "
                                            rf"CSRGraph; a graph alone becomes one with its "
                                            rf"features, labels and splits: zg.make_dataset"):
            train(dataclasses.replace(small_config(), task=task), graph)
    with pytest.raises(TypeError, match="^the node task trains on a Dataset, got dict$"):
        train(small_config(), {"graph": graph})
    with pytest.raises(TypeError, match=r"^the node task trains on a Dataset, got "
                                        r"GraphCollection; a collection of graphs trains "
                                        r"with task='graph' \(--task graph\)$"):
        train(small_config(), zg.molhiv_like(0.001, seed=0))
    with pytest.raises(ValueError, match=r"variables hold no 'params' .*got \['x'\]"):
        train(small_config(), random_dataset(), variables={"x": 1})
    # a config's options as train's own arguments: where they go, not Python's
    # "unexpected keyword argument 'epochs'"
    with pytest.raises(TypeError, match=r"^train\(\) takes the run's options in its "
                                        r"TrainConfig, not as its own arguments: got "
                                        r"epochs=2, lr=0\.1; give zg\.train\(zg\.TrainConfig"
                                        r"\(epochs=2, lr=0\.1, \.\.\.\)\)"):
        train(small_config(), random_dataset(), epochs=2, lr=0.1)
    with pytest.raises(TypeError, match="unexpected keyword argument 'bogus'"):
        train(small_config(), random_dataset(), bogus=1)  # no option of either: Python's


def test_flags_given_are_read_as_the_command_spells_them():
    """`zerognn bench` has a hidden --dedup that sets no option; `train --dedup` was read
    through it as the option '==SUPPRESS==', so a message never spelled --dedup."""
    from zerognn_jax.cli import _message_flags, build_parser

    parser = build_parser()
    assert _message_flags(parser, "train", ["train", "--dedup", "--epochs", "2"])[1] == \
        {"dedup", "epochs"}
    assert _message_flags(parser, "bench", ["bench", "--no-dedup"])[1] == set()


def test_messages_spell_options_as_flags_only_where_they_name_them():
    from zerognn_jax.cli.flags import spelled_as_flags

    flags = {"checkpoint_dir": "--checkpoint-dir", "epochs": "--epochs", "model": "--model",
             "checkpoint": None}
    said = spelled_as_flags("epochs 1 is below the 2 epochs that checkpoint_dir /tmp/"
                            "checkpoint_dir holds; ask for epochs 3 (model 'x')", flags,
                            {"epochs", "checkpoint_dir"})
    assert said == ("--epochs 1 is below the 2 epochs that --checkpoint-dir /tmp/"
                    "checkpoint_dir holds; ask for --epochs 3 (model 'x')")
    assert spelled_as_flags("error: epochs 3", flags) == "error: epochs 3"  # not given
    assert spelled_as_flags("set checkpoint_dir (--checkpoint-dir)", flags) == \
        "set checkpoint_dir (--checkpoint-dir)"  # the flag is there already
    # a record's keys, a path that spells a name, a table named as an option is not
    flags.update(dataset="--dataset", norm="--norm", normalize_features="--normalize-"
                 "features", edge_features="--edge-features")
    assert spelled_as_flags("(epoch 0): dataset.name 'tiny' there, 'p' here", flags,
                            {"dataset"}) == "(epoch 0): dataset.name 'tiny' there, 'p' here"
    assert spelled_as_flags("checkpoint_dir checkpoint_dir is not a directory", flags,
                            {"checkpoint_dir"}) == ("--checkpoint-dir checkpoint_dir is not "
                                                    "a directory")
    assert spelled_as_flags("edge_features have 5 rows", flags) == "edge_features have 5 rows"
    assert spelled_as_flags("normalize_features True, norm 'layer'", flags,
                            {"norm", "normalize_features"}) == \
        "--normalize-features True, --norm 'layer'"  # one flag inside another's


def test_options_of_another_task_are_named_as_ignored():
    cfg = small_config(epochs=1, negatives=5, decoder="mlp", readout="max", heads=2,
                       attention_dropout=0.5, output_heads=4)
    with pytest.warns(zg.IgnoredOptionWarning) as caught:
        train(cfg, random_dataset())
    said = [str(w.message) for w in caught]
    # each points at the line that called train, where the option was set
    assert {w.filename for w in caught if w.category is zg.IgnoredOptionWarning} == {__file__}
    assert "decoder 'mlp', negatives 5: options of link tasks, ignored by this node task" \
        in said
    assert "readout 'max': options of graph tasks, ignored by this node task" in said
    # a model without attention (sage, the model of a config naming none) has no heads
    assert "heads 2: attention heads of the models gat, rgat, ignored by model 'sage'" \
        in said
    # gat's other options too: warned of, not refused, so one grid sweeps several models
    assert "attention_dropout 0.5: dropout on the attention coefficients of model gat, " \
           "ignored by model 'sage'" in said
    assert "output_heads 4: attention heads of the output layer of model gat, ignored by " \
           "model 'sage'" in said
    with pytest.warns(zg.IgnoredOptionWarning, match=r"^weight_decay 0.1, grad_clip 1.0: "
                                                      r"options of the built-in optimizer, "
                                                      r"ignored with one of yours$") as caught:
        train(small_config(epochs=1, weight_decay=0.1, grad_clip=1.0), random_dataset(),
              optimizer=optax.sgd(0.1))
    assert {w.filename for w in caught if w.category is zg.IgnoredOptionWarning} == {__file__}
    # a schedule reaches only embedding rows then, as lr does
    with pytest.warns(zg.IgnoredOptionWarning, match=r"^lr_schedule 'cosine', warmup_epochs 1: "
                                                      r"with an optimizer of yours, these "
                                                      r"step only learnable embedding rows"):
        train(small_config(epochs=2, lr_schedule="cosine", warmup_epochs=1),
              random_dataset(), optimizer=optax.sgd(0.1))
    # the built-in models' options beside a model of the user's (input_dropout was
    # recorded in the summary as if applied)
    mine = zg.make_model("sage", hidden=8, num_layers=2, num_classes=3)
    with pytest.warns(zg.IgnoredOptionWarning, match=r"^dropout 0.1, input_dropout 0.9: "
                                                      r"options of the built-in models, "
                                                      r"ignored with one of yours$"):
        train(small_config(epochs=1, dropout=0.1, input_dropout=0.9), random_dataset(),
              model=mine)
    # the built-in model named too (a run's default filled in is no user's choice)
    with pytest.warns(zg.IgnoredOptionWarning, match=r"^model 'gcn': options of the built-in "
                                                      r"models, ignored with one of yours$"):
        train(small_config(epochs=1, model="gcn"), random_dataset(), model=mine)
    graph = TrainConfig(task="graph", dataset="molhiv-like", model="gin", fanouts=(3, 3),
                        sampler="labor", flat_outer=True, norm="layer", input_dropout=0.5,
                        eval_mode="sampled", progress=False, heads=2,
                        normalize_features=True, read_ahead_gib=1.0)
    with pytest.warns(zg.IgnoredOptionWarning) as caught:
        run_checks.warn_unread_options(graph, None)
    assert [str(w.message) for w in caught] == [
        "fanouts (3, 3), sampler 'labor', flat_outer True: options of neighbour sampling, "
        "ignored by this graph task",
        "input_dropout 0.5, heads 2: options of node and link models, ignored by this "
        "graph task",
        "normalize_features True, read_ahead_gib 1.0: options of the feature tables of node "
        "and link tasks, ignored by this graph task",
        "norm 'layer': options of the models of one-type graphs' node and link tasks, "
        "ignored by this graph task",
        "eval_mode 'sampled': this graph task evaluates whole graphs, exactly ('full'; "
        "'none' skips it)"]
    typed = TrainConfig(dataset="mag-like", model="rsage", norm="batch", progress=False)
    with pytest.warns(zg.IgnoredOptionWarning) as caught:
        run_checks.warn_unread_options(typed, None)
    assert [str(w.message) for w in caught] == [
        "norm 'batch': options of the models of one-type graphs' node and link tasks, "
        "ignored by this node task of a typed graph"]
    host = small_config(engine="host-exact", chunk_steps=2, sample_ahead=4)
    with pytest.warns(zg.IgnoredOptionWarning) as caught:
        run_checks.warn_unread_options(host, None)
    assert [str(w.message) for w in caught] == [
        "chunk_steps 2, sample_ahead 4: options of the scan engine, ignored by engine "
        "'host-exact'"]
    tree = small_config(dedup=False, flat_outer=True)  # accepted, as its checkpoints are
    with pytest.warns(zg.IgnoredOptionWarning) as caught:
        run_checks.warn_unread_options(tree, None)
    assert [str(w.message) for w in caught] == [
        "flat_outer True is ignored with dedup False: tree mode lays out every hop in slot "
        "order already"]
    # a task the typed dataset cannot train is refused before any warning
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(ValueError, match="task 'graph' does not train typed datasets"):
            run_checks.warn_unread_options(dataclasses.replace(typed, task="graph",
                                                             fanouts=(3, 3)), None)


@pytest.mark.parametrize("task", ["node", "link"])
def test_a_run_with_64_bit_types_enabled_trains_as_without(task):
    """With `jax_enable_x64` (JAX_ENABLE_X64=1) index arithmetic became int64 beside the
    library's int32 positions: exact evaluation and the link task's calibration stopped
    in dynamic_slice ("index arguments ... must be integers of the same type")."""
    cfg, dataset = small_config(epochs=1, task=task), random_dataset()
    want = train(cfg, dataset)
    with jax.enable_x64(True):
        got = train(cfg, dataset)
    np.testing.assert_allclose([h["loss"] for h in got.history],
                               [h["loss"] for h in want.history], rtol=1e-5)
    scores = lambda result, losses: {k: v for k, v in result.summary.items()
                                     if k.startswith(("val_", "test_"))
                                     and k.endswith("_loss") == losses}
    assert scores(got, False) == scores(want, False) and scores(want, False)
    # a loss is as close as the trained parameters are (the training losses above)
    for key, value in scores(want, True).items():
        np.testing.assert_allclose(scores(got, True)[key], value, rtol=1e-5)


def test_a_failed_run_leaves_no_empty_metrics_file(tmp_path, monkeypatch):
    """A run that fails before its first record removes the metrics file it created and
    the folder made for it; an empty file that was there before stays."""
    from zerognn_jax._src.training import trainer

    def fail(*args, **kwargs):
        raise RuntimeError("out of device memory, say")

    monkeypatch.setattr(trainer, "_train_epoch", fail)
    metrics = tmp_path / "new" / "m.jsonl"
    with pytest.raises(RuntimeError, match="out of device memory, say"):
        train(small_config(epochs=1, metrics_out=str(metrics)), random_dataset())
    assert not metrics.parent.exists()
    kept = tmp_path / "kept.jsonl"
    kept.write_text("")
    with pytest.raises(RuntimeError, match="out of device memory, say"):
        train(small_config(epochs=1, metrics_out=str(kept)), random_dataset())
    assert kept.exists()


def test_cli_divergence_exit_code_and_one_line(tmp_path, capsys):
    npz = tmp_path / "d.npz"
    from zerognn_jax import save_npz
    save_npz(random_dataset(), npz)
    code = main(["train", "--dataset", str(npz), "--hidden", "8", "--layers", "2",
                 "--fanouts", "4,4", "--batch-size", "32", "--epochs", "2", "--lr", "1e30",
                 "--no-progress"])
    err = capsys.readouterr().err
    assert code == 1 and err.count("\n") == 1
    assert err.startswith("zerognn: error: training diverged: the loss became NaN or infinite "
                          "at epoch 0, step ")


def test_empty_splits_give_null_accuracies(tmp_path):
    metrics = tmp_path / "m.jsonl"
    ds = random_dataset(split=(120, 0, 0))
    result = train(small_config(metrics_out=str(metrics)), ds)
    lines = metrics.read_text().splitlines()
    records = [strict_json(line) for line in lines]
    assert "NaN" not in metrics.read_text()
    assert records[0]["val_acc"] is None and records[0]["test_acc"] is None  # eval_every=1
    summary = records[-1]
    assert summary["summary"] and summary["val_acc"] is None and summary["test_acc"] is None
    assert 0.0 <= summary["train_acc"] <= 1.0
    assert result.summary == summary


def test_cli_summary_is_strict_json(tmp_path, capsys):
    npz = tmp_path / "d.npz"
    from zerognn_jax import save_npz
    save_npz(dataclasses.replace(random_dataset(), val_idx=np.zeros(0, np.int32)), npz)
    assert main(["train", "--dataset", str(npz), "--hidden", "8", "--layers", "2",
                 "--fanouts", "4,4", "--batch-size", "32", "--epochs", "1",
                 "--no-progress"]) == 0
    summary = strict_json(capsys.readouterr().out.strip())
    assert summary["val_acc"] is None and summary["test_acc"] is not None


def test_planetoid_hint_names_the_root(tmp_path):
    with pytest.raises(FileNotFoundError,
                       match=rf"`zerognn data info cora --root {tmp_path} --download`"):
        load_dataset("cora", tmp_path)


def test_npz_path_that_is_a_folder(tmp_path):
    (tmp_path / "d.npz").mkdir()
    with pytest.raises(FileNotFoundError, match=r"dataset file .*d\.npz is not a file"):
        load_npz(tmp_path / "d.npz")


def test_a_graph_collection_is_told_apart_from_a_typed_dataset(tmp_path):
    """A saved graph collection's .npz holds a `meta` entry too; only its kind makes a
    file typed. The node task names the task that trains it, by name or by path."""
    from zerognn_jax import molhiv_like, save_graphs, save_hetero_npz
    from zerognn_jax._src.data.hetero_synthetic import mag_like
    from zerognn_jax._src.data.loaders import is_typed

    graphs = save_graphs(molhiv_like(0.002), tmp_path / "mol.npz")
    typed = tmp_path / "mag.npz"
    save_hetero_npz(mag_like(0.002), typed)
    assert not is_typed(str(graphs)) and is_typed(str(typed))
    for name in (str(graphs), "molhiv-like", "ogbg-molhiv"):
        with pytest.raises(ValueError, match=rf"{re.escape(name)} is a collection of small "
                                             r"graphs: train it with task='graph' "
                                             r"\(--task graph\)"):
            load_dataset(name)


def test_missing_paths_and_unknown_names_say_which(tmp_path):
    from zerognn_jax import load_graphs

    missing = tmp_path / "nowhere" / "data"
    with pytest.raises(FileNotFoundError,
                       match=rf"dataset '{re.escape(str(missing))}': no such file"):
        load_dataset(str(missing))
    with pytest.raises(FileNotFoundError, match=r"graph dataset '.*gone\.npz': no such file"):
        load_graphs(str(tmp_path / "gone.npz"))
    with pytest.raises(ValueError, match=r"unknown dataset 'mag-lik'; .*typed \(task 'node'\): "
                                         r"ogbn-mag, mag-like.*graph collections \(task "
                                         r"'graph'\): molhiv-like"):
        load_dataset("mag-lik")


def test_typed_options_on_a_graph_of_one_type_are_refused(monkeypatch, tmp_path):
    ran = []
    monkeypatch.setattr(trainer, "_train", lambda *a, **k: ran.append(1))
    cfg = TrainConfig(dataset="tiny", relation_fanouts={"cites": (2, 2)}, progress=False)
    with pytest.raises(ValueError, match=r"relation_fanouts \(--relation-fanouts\) samples "
                                         r"the relations of a typed dataset; 'tiny' has one "
                                         r"node and one edge type: give fanouts"):
        train(cfg)
    assert not ran
    trainer.prepare(cfg)  # a run restored from an older checkpoint that recorded it
    with pytest.raises(ValueError, match=r"model 'rsage' is a relational model for typed "
                                         r"datasets; 'tiny' has one node and one edge type: "
                                         r"choose one of sage, "):
        trainer.prepare(TrainConfig(dataset="tiny", model="rsage", progress=False))
    # a name that reads no dataset says so, whatever the model
    with pytest.raises(FileNotFoundError, match=r"dataset 'gone/x.npz': no such file"):
        trainer.prepare(TrainConfig(dataset="gone/x.npz", model="rsage", progress=False))
    with pytest.raises(ValueError, match=r"unknown dataset 'tinny'; valid names: "):
        trainer.prepare(TrainConfig(dataset="tinny", model="rgat", progress=False))
    # a folder or file that exists but holds no dataset is named as such
    (tmp_path / "empty").mkdir()
    (tmp_path / "notes").write_text("x")
    with pytest.raises(ValueError, match="is a folder without the meta.json of a dataset"):
        trainer.prepare(TrainConfig(dataset=str(tmp_path / "empty"), progress=False))
    (tmp_path / "ogbn_arxiv").mkdir()  # OGB's own folder, named where its name was meant
    with pytest.raises(ValueError, match=rf"; an OGB folder is read by its dataset's name "
                                         rf"under its parent: ogbn-arxiv with root "
                                         rf"{re.escape(str(tmp_path.resolve()))} \(--root\)$"):
        trainer.prepare(TrainConfig(dataset=str(tmp_path / "ogbn_arxiv"), progress=False))
    with pytest.raises(ValueError, match="is a file but not an .npz dataset archive"):
        trainer.prepare(TrainConfig(dataset=str(tmp_path / "notes"), progress=False))
    with pytest.raises(ValueError, match=r"unknown graph model 'sage' \(a node model, the "
                                         r"default of node tasks\); choose one of gin"):
        trainer.prepare(TrainConfig(task="graph", dataset="molhiv-like", scale=0.002,
                                    model="sage", progress=False))
    with pytest.raises(ValueError, match=r"molhiv-like is a collection of small graphs: "
                                         r"train it with task='graph'"):
        trainer.prepare(TrainConfig(dataset="molhiv-like", model="rgcn", progress=False))
    # told before a node task's fanouts are checked (the fanouts' advice led nowhere)
    with pytest.raises(ValueError, match=r"^ogbg-molhiv is a collection of small graphs"):
        TrainConfig(dataset="ogbg-molhiv", layers=2)


def test_each_loader_names_the_kind_of_dataset_it_was_given(tmp_path, monkeypatch):
    """A path object reads as its string; a node dataset's name or file given where
    typed data or a graph collection is read says which it is."""
    node = zg.save_npz(make_dataset(**good_arrays()), tmp_path / "node.npz")  # a Path
    assert zg.load_dataset(node).name == "t"
    graphs = zg.save_graphs(zg.load_graphs("molhiv-like", scale=0.002), tmp_path / "g.npz")
    assert zg.load_graphs(graphs).num_graphs == zg.load_graphs(str(graphs)).num_graphs
    with pytest.raises(TypeError, match="named by a string or a path, got NoneType"):
        zg.load_dataset(None)
    with pytest.raises(ValueError, match=r"cora is a node dataset, one graph: train it with "
                                         r"task 'node' or 'link'; task 'graph' trains"):
        require_graphs("cora")
    require_graphs(graphs)
    with pytest.raises(ValueError, match=r"node.npz is not a readable graph collection: it "
                                         r"holds a homogeneous dataset; read it with "
                                         r"zg.load_dataset$"):
        zg.load_graphs(node)
    typed = zg.save_hetero_npz(zg.load_hetero_dataset("shop-like", scale=0.001),
                               tmp_path / "typed.npz")
    # each file or folder given to another kind's reader names its reader (the keys or
    # arrays it lacked, "no meta entry" or another format version, before)
    node_dir = zg.save_dir(zg.load_dataset(node), tmp_path / "node")
    graphs_dir = zg.save_graphs(zg.load_graphs(graphs), tmp_path / "g")
    for load, path, message in (
            (zg.load_npz, typed, "typed.npz is not a readable zerognn dataset file: it holds "
                                 "a typed (heterogeneous) dataset; read it with zg.load_hetero"),
            (zg.load_npz, graphs, "g.npz is not a readable zerognn dataset file: it holds a "
                                  "graph collection; read it with zg.load_graphs_file"),
            (zg.load_hetero, node, "node.npz is not a readable typed dataset file: it holds a "
                                   "homogeneous dataset; read it with zg.load_dataset"),
            (zg.load_hetero, graphs, "g.npz is not a readable typed dataset file: it holds a "
                                     "graph collection; read it with zg.load_graphs_file"),
            (zg.load_graphs_file, typed, "typed.npz is not a readable graph collection: it "
                                         "holds a typed (heterogeneous) dataset; read it with "
                                         "zg.load_hetero"),
            (zg.load_dir, graphs_dir, "g is not a dataset directory: it holds a graph "
                                      "collection; read it with zg.load_graphs_file"),
            (zg.load_hetero, graphs_dir, "g is not a dataset directory: it holds a graph "
                                         "collection; read it with zg.load_graphs_file"),
            (zg.load_graphs_file, node_dir, "node is not a readable graph collection: it holds "
                                            "a homogeneous dataset; read it with "
                                            "zg.load_dataset")):
        with pytest.raises(ValueError, match=f"{re.escape(message)}$"):
            load(path)
    # and each saver given another kind names that kind's saver (AttributeErrors before)
    node_ds, typed_ds = zg.load_dataset(node), zg.load_hetero(typed)
    for save, value, message in (
            (zg.save_npz, typed_ds, "save_npz saves a Dataset, got a HeteroDataset; save it "
                                    "with zg.save_hetero_npz or zg.save_hetero_dir"),
            (zg.save_dir, typed_ds.graph, "save_dir saves a Dataset, got a HeteroGraph"),
            (zg.save_hetero_npz, node_ds, "save_hetero_npz saves a HeteroDataset, got a "
                                          "Dataset; save it with zg.save_npz or zg.save_dir"),
            (zg.save_hetero_dir, node_ds, "save_hetero_dir saves a HeteroDataset, got a "
                                          "Dataset"),
            (zg.save_graphs, typed_ds, "save_graphs saves a GraphCollection, got a "
                                       "HeteroDataset; save it with zg.save_hetero_npz")):
        with pytest.raises(TypeError, match=f"^{re.escape(message)}"):
            save(value, tmp_path / "out.npz")
        assert not (tmp_path / "out.npz").exists()
    with pytest.raises(ValueError, match="cora is not a typed dataset: load it with "
                                         "load_dataset"):
        zg.load_hetero_dataset("cora")
    with pytest.raises(ValueError, match="molhiv-like is not a typed dataset: load it with "
                                         "load_graphs"):
        zg.load_hetero_dataset("molhiv-like")
    with pytest.raises(FileNotFoundError, match=r"typed dataset '.*gone.npz': no such file"):
        zg.load_hetero_dataset(str(tmp_path / "gone.npz"))
    with pytest.raises(ValueError, match="node.npz is not a typed dataset: load it with "
                                         "load_dataset"):
        zg.load_hetero_dataset(node)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "cora").mkdir()  # a folder of that name beside: the name still wins
    with pytest.raises(ValueError, match="cora is not a typed dataset"):
        zg.load_hetero_dataset("cora")
    with pytest.raises(ValueError, match=r"unknown graph dataset 'cora'.*read by load_dataset"):
        zg.load_graphs("cora")


def test_a_best_metric_the_task_never_reports_fails_before_training(tmp_path, monkeypatch):
    ran = []
    monkeypatch.setattr(trainer, "_train", lambda *a, **k: ran.append(1))
    cfg = TrainConfig(dataset="tiny", epochs=1, best_metric="val_rocauc",
                      checkpoint_dir=str(tmp_path / "new" / "ck"),
                      metrics_out=str(tmp_path / "logs" / "m.jsonl"), progress=False)
    refused = pytest.raises(ValueError, match=r"best_metric 'val_rocauc' is not a metric this "
                                              r"task reports; choose one of train_acc, "
                                              r"train_loss, val_acc, val_loss, test_acc, "
                                              r"test_loss$")
    with refused:
        train(cfg)
    # the folders the run made for its outputs go with it; one that was there stays
    assert not ran and sorted(p.name for p in tmp_path.iterdir()) == []
    (tmp_path / "kept").mkdir()
    # the run only checks that tensorboardX imports before it writes: a stand-in where it
    # is not installed (the GPU machine) keeps this part of the test there
    if importlib.util.find_spec("tensorboardX") is None:
        monkeypatch.setitem(sys.modules, "tensorboardX", types.ModuleType("tensorboardX"))
    with refused:  # one output inside another; a folder reached through one made here
        train(dataclasses.replace(cfg, checkpoint_dir=str(tmp_path / "a" / ".." / "kept"),
                                  metrics_out=str(tmp_path / "out" / "logs" / "m.jsonl"),
                                  tensorboard_dir=str(tmp_path / "out" / "tb")))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["kept"]
    assert not any((tmp_path / "kept").iterdir())
    with pytest.raises(ValueError, match="is a directory"):  # refused by the path checks
        train(dataclasses.replace(cfg, metrics_out=str(tmp_path / "kept")))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["kept"]
    train(dataclasses.replace(cfg, best_metric="val_acc"))  # a reported one passes on
    assert ran and (tmp_path / "new" / "ck").is_dir()
    # a task of one's own: names listed plain or prefixed pass, and one that lists none is
    # not checked here; a name without its split ("acc") is in no record
    for names, metric in ((("acc",), "val_acc"), (("val_f1",), "val_f1"), (None, "val_x")):
        task = type("Task", (), {})()
        if names is not None:
            task.metric_names = lambda dataset, names=names: names
        run_checks.check_metrics(dataclasses.replace(cfg, best_metric=metric), task, None)
    task.metric_names = lambda dataset: ("acc",)
    with pytest.raises(ValueError, match=r"^best_metric 'acc' is not a metric this task "
                                         r"reports; choose one of train_acc, val_acc, "
                                         r"test_acc$"):
        run_checks.check_metrics(dataclasses.replace(cfg, best_metric="acc"), task, None)
    # an EarlyStopping callback's metric likewise (it had waited for it silently)
    with pytest.raises(ValueError, match=r"^EarlyStopping's metric 'val_accuracy' is not a "
                                         r"metric this task reports"):
        train(dataclasses.replace(cfg, best_metric=None, checkpoint_dir=None,
                                  metrics_out=None),
              callbacks=[zg.EarlyStopping("val_accuracy", 2)])
    for watched in ("loss", "train_batch_acc"):  # every record's own: a callback may watch
        train(dataclasses.replace(cfg, best_metric=None, checkpoint_dir=None,
                                  metrics_out=None), callbacks=[zg.EarlyStopping(watched)])
    # a choice by the test split is allowed, and warned of (a refused one is not warned of)
    with warnings.catch_warnings(), pytest.raises(ValueError, match="is not a metric"):
        warnings.simplefilter("error")
        train(dataclasses.replace(cfg, best_metric="test_nonsense"))
    with pytest.warns(UserWarning, match=r"^best_metric 'test_acc' keeps the checkpoint by "
                                         r"the test split, whose scores then no longer "
                                         r"estimate unseen data: choose by a val_ metric$"):
        train(dataclasses.replace(cfg, best_metric="test_acc"))
    with pytest.warns(UserWarning, match=r"^EarlyStopping's metric 'test_acc' stops the run "
                                         r"by the test split"):
        train(dataclasses.replace(cfg, best_metric=None, checkpoint_dir=None,
                                  metrics_out=None), callbacks=[zg.EarlyStopping("test_acc")])


def test_a_graph_collection_directory_is_readable_by_others(tmp_path):
    import os

    from zerognn_jax import molhiv_like, save_graphs

    old = os.umask(0o022)
    try:
        save_graphs(molhiv_like(0.002), tmp_path / "mol")
    finally:
        os.umask(old)
    assert (tmp_path / "mol").stat().st_mode & 0o777 == 0o755


def test_an_epoch_whose_best_metric_has_no_value_says_so(tmp_path):
    """A validation split with one class only gives ROC-AUC no value: the epoch cannot
    become the best checkpoint, and a warning says why instead of nothing."""
    from zerognn_jax import CheckpointWarning
    from zerognn_jax._src.training.checkpoint import BestCheckpoint

    best = BestCheckpoint(str(tmp_path), "val_rocauc")
    try:
        with pytest.warns(CheckpointWarning, match=r"best_metric 'val_rocauc' has no value "
                                                   r"at epoch 0 \(an empty split, or one "
                                                   r"class only"):
            assert not best.offer(0, {"val_rocauc": None}, {}, {})
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # said once a run, not every epoch
            assert not best.offer(1, {"val_rocauc": float("nan")}, {}, {})
        assert best.epoch is None and best.value is None
    finally:
        best.close()


def test_the_value_to_beat_is_that_of_the_epoch_best_holds(tmp_path):
    """A run resumed without best_metric trained epochs that best/ never saw: their
    value was taken as the one to beat, and the summary named an epoch best/ lacks."""
    from zerognn_jax._src.training.checkpoint import BestCheckpoint

    best = BestCheckpoint(str(tmp_path), "val_acc")
    try:
        assert best.offer(1, {"val_acc": 0.475}, {"w": np.ones(2, np.float32)}, {})
    finally:
        best.close()
    history = [{"epoch": 0, "val_acc": 0.4}, {"epoch": 1, "val_acc": 0.475},
               {"epoch": 2, "val_acc": 0.48}, {"epoch": 3, "val_acc": 0.47}]
    again = BestCheckpoint(str(tmp_path), "val_acc", history)
    try:
        assert (again.epoch, again.value) == (1, 0.475)
        assert again.offer(4, {"val_acc": 0.477}, {"w": np.ones(2, np.float32)}, {})
    finally:
        again.close()


def _ogbl_folder(root: Path, name: str) -> None:
    """A 10-node OGB link folder of `name`'s layout: collab's pairs with edge_neg,
    citation2's pairs with target_node_neg (3 per positive)."""
    raw = root / name.replace("-", "_") / "raw"
    raw.mkdir(parents=True)
    for file, rows, fmt in (("node-feat", np.ones((10, 2)), "%.1f"),
                            ("num-node-list", [[10]], "%d"), ("edge", [[0, 1]], "%d")):
        with gzip.open(raw / f"{file}.csv.gz", "wt") as f:
            np.savetxt(f, np.asarray(rows), delimiter=",", fmt=fmt)
    split = raw.parent / "split" / "time"
    split.mkdir(parents=True)
    for part in ("train", "valid", "test"):
        if name == "ogbl-collab":
            np.savez(split / f"{part}.npz", edge=np.array([[0, 1], [2, 3]]),
                     edge_neg=np.array([[4, 5]]))
        else:
            np.savez(split / f"{part}.npz", source_node=np.array([0, 2]),
                     target_node=np.array([1, 3]),
                     target_node_neg=np.arange(6).reshape(2, 3) + 4)


@pytest.mark.parametrize("name, metric, message", [
    ("ogbl-citation2", "auc", r"ogbl-citation2's val split has no negative pairs \(OGB's "
                              r"edge_neg\), which link_metric 'auc' scores"),
    ("ogbl-citation2", "hits@20", r"ogbl-citation2's val split has no negative pairs"),
    ("ogbl-collab", "mrr", r"ogbl-collab's val split has no negatives per positive \(OGB's "
                           r"target_node_neg\), which link_metric 'mrr' ranks"),
])
def test_a_metric_the_ogb_split_cannot_score_is_refused_before_training(tmp_path, name,
                                                                        metric, message):
    """AP and Hits@K over no negatives came out 1.0 for any model, and MRR without
    negatives per positive failed only after every epoch had trained."""
    from zerognn_jax._src.training.tasks.link import LinkTask

    _ogbl_folder(tmp_path, name)
    cfg = zg.TrainConfig(task="link", dataset=name, root=str(tmp_path), link_metric=metric)
    with pytest.raises(ValueError, match=message):
        LinkTask.build(cfg, None)


def test_an_ogb_split_without_negatives_of_either_kind_is_named_so(tmp_path):
    """Each metric's refusal had pointed at another metric, refused in its turn."""
    from zerognn_jax._src.training.tasks.link import LinkTask

    _ogbl_folder(tmp_path, "ogbl-collab")
    split = tmp_path / "ogbl_collab" / "split" / "time"
    np.savez(split / "valid.npz", edge=np.array([[0, 1]]), edge_neg=np.zeros((0, 2), int))
    for metric in ("auc", "hits@50", "mrr"):
        cfg = zg.TrainConfig(task="link", dataset="ogbl-collab", root=str(tmp_path),
                             link_metric=metric)
        with pytest.raises(ValueError, match=r"ogbl-collab's val split has no negatives of "
                                             r"either kind, neither pairs \(OGB's edge_neg\) "
                                             r"nor destinations per positive"):
            LinkTask.build(cfg, None)


def test_hits_at_k_over_fewer_negatives_than_k_is_warned_of():
    """OGB's Hits@K is 1.0 when a split has fewer than K negatives: said, not silent."""
    from zerognn_jax._src.training.tasks.link import LinkTask

    graph = zg.from_edge_list(np.arange(40), np.arange(1, 41), 41, make_undirected=True)
    ds = zg.make_dataset("path", graph.indptr, graph.indices, np.ones((41, 2), np.float32),
                         np.zeros(41, np.int32), np.arange(41), [], [], 1)
    with pytest.warns(zg.EmptySplitWarning, match=r"path's val split has 2 negative pairs, "
                                                  r"fewer than hits@20's 20: every model "
                                                  r"scores 1.0 there"):
        LinkTask.build(zg.TrainConfig(task="link", link_metric="hits@20"), ds)


@pytest.mark.parametrize(("args", "reader"), [
    (["data", "info", "{}"], "zerognn dataset file"),
    (["train", "--task", "graph", "--dataset", "{}", "--no-progress"], "graph collection"),
])
def test_a_file_named_npz_that_is_no_archive_is_named_as_such(tmp_path, capsys, args, reader):
    """Text read as an archive was NumPy's advice to pass allow_pickle= (no reader takes
    it); a lone .npy named .npz was a traceback from probing whether it held graphs."""
    (tmp_path / "text.npz").write_text("hello")
    np.save(tmp_path / "one.npy", np.ones(3))
    (tmp_path / "one.npy").rename(tmp_path / "one.npz")
    for name, problem in (("text.npz", "it is no .npz archive (its bytes are neither a zip "
                                       "of .npy arrays nor a .npy array)"),
                          ("one.npz", "it holds one .npy array, not an .npz archive")):
        path = tmp_path / name
        assert main([a.format(path) for a in args]) == 2
        assert capsys.readouterr().err.endswith(f"{path} is not a readable {reader}: "
                                                f"{problem}\n")


def test_a_link_split_or_a_damaged_collection_read_as_a_dataset_is_named(tmp_path, capsys):
    """Both listed the node dataset's keys the file lacked."""
    from zerognn_jax._src.data.links import random_link_split

    ring = zg.from_edge_list(np.arange(30), (np.arange(30) + 1) % 30, 30, make_undirected=True)
    random_link_split(ring).save(tmp_path / "split.npz")
    assert main(["data", "info", str(tmp_path / "split.npz")]) == 2
    assert capsys.readouterr().err.endswith(
        "split.npz is not a readable zerognn dataset file: it holds a link split "
        "(LinkSplit.save's); read it with zg.LinkSplit.load\n")
    saved = zg.save_graphs(zg.load_graphs("molhiv-like", scale=0.002), tmp_path / "g.npz")
    with np.load(saved) as f:
        arrays = {k: f[k] for k in f.files}
    np.savez(tmp_path / "bad.npz", **{**arrays, "meta": np.str_("{not json")})
    assert main(["data", "info", str(tmp_path / "bad.npz")]) == 2
    assert "bad.npz is not a readable graph collection: its meta entry is not readable " \
           "JSON (" in capsys.readouterr().err


def test_a_summary_that_cannot_be_printed_names_what_and_why(monkeypatch, capsys):
    """A closed pipe or a full disk on standard output was "error: [Errno 32] Broken
    pipe", which named neither the summary nor that the work itself was done."""
    class Closed:
        def write(self, text):
            raise BrokenPipeError(32, "Broken pipe")

        def flush(self):
            pass

    monkeypatch.setattr(sys, "stdout", Closed())
    assert main(["data", "info", "tiny"]) == 1
    assert capsys.readouterr().err == (
        "zerognn: error: could not write the dataset's statistics to standard output: "
        "Broken pipe (EPIPE, errno 32)\n")
