"""The `zerognn predict` command: a trained run's outputs, read from its checkpoint
folder and written to one .npz file, for the nodes (graphs) or pairs named.

  zerognn predict CHECKPOINT_DIR --out FILE.npz
                  [--nodes test|val|train|all|IDS_FILE]  (default: test; a link run: all)
                  [--pairs PAIRS_FILE]                   (a link run: the pairs' scores)
                  [--top-k K [--exclude train|none|train,val] [--candidates IDS_FILE]]
                                                         (a link run: --nodes' K best)
                  [--mode full|sampled] [--batch-size N] [--seed N]
                  [--best | --epoch N] [--node-type TYPE]
                  [--dataset FILE] [--graph FILE] [--no-progress]
                  [--compile-cache DIR|none]

What the file holds (NumPy's `np.load`), by what was asked:
  nodes:  `ids` int64[n], `outputs` float32[n, ...] (a node run's logits, a link run's
          embeddings, a graph run's rows: `zg.predict`)
  pairs:  `pairs` int64[P, 2], `scores` float32[P] (decoder logits: `zg.score_pairs`)
  top k:  `sources` int64[S], `destinations` int64[S, K], `scores` float32[S, K]
          (`zg.recommend`, among the --candidates file's destinations if given; -1
          and -inf where fewer than K are left)
and `meta`, a JSON string: the checkpoint, its epoch, the task, what the arrays are.

The run comes back as `zg.restore` gives it for inference: a run trained on a dataset
object needs it again, saved to a file and given as `--dataset FILE` (as `zerognn
export` takes it). `--graph FILE` is another graph's saved dataset (a typed run's: a
typed dataset of its types and relations), or another collection of graphs for a
graph-level run: the run's model over data it never saw (`dataset=` of `zg.predict`).
IDS_FILE is a .npy array or a text file of one id a line; PAIRS_FILE a .npy int[P, 2] or
text of two ids a line (a text file's numbers apart by spaces or by commas, as a CSV, whose
first line may name its columns). The file is written whole or not at all; an existing --out is
replaced only if this command wrote it. One JSON line on stdout says what was written; a
step that takes more than a second (a dataset built, the run restored, the outputs
computed) is said on stderr, with its time. A first SIGINT, SIGTERM or SIGHUP stops the
command after the step in progress (one during the write lets it finish), a second at
once; no file is left half-written. Errors print `zerognn: error: ...` and exit with 2,
or 1 where the file could not be written.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import time
import warnings
import zipfile
from pathlib import Path

import numpy as np

from zerognn_jax._src.data.announce import announcing, stderr_log
from zerognn_jax._src.data.writes import archive_meta, atomic_write, print_line
from zerognn_jax._src.training.inference import predict, score_pairs
from zerognn_jax._src.training.lock import checkpoint_name
from zerognn_jax._src.training.recommend import recommend
from zerognn_jax._src.training.tasks.base import (
    PredictsItems,
    PredictsTypes,
    RanksPairs,
)
from zerognn_jax.cli.data import load_named
from zerognn_jax.cli.export import add_checkpoint_flags, other_dataset, restored
from zerognn_jax.cli.flags import add_compile_cache_flag, path_text, whole_number

FORMAT = "zerognn-predictions"  # `meta`'s "format": a file this command wrote
SPLITS = ("train", "val", "test")


def add_predict_command(subparsers) -> argparse.ArgumentParser:
    """Adds `predict` to `subparsers` (from `add_subparsers()`); its handler returns the
    exit code."""
    p = subparsers.add_parser("predict", help="write a trained run's outputs for nodes, "
                                              "graphs or pairs to a .npz file",
                              allow_abbrev=False)
    p.add_argument("checkpoint_dir", type=os.path.expanduser,
                   help="the run's checkpoint folder (--checkpoint-dir)")
    p.add_argument("--out", required=True, type=path_text, help="the .npz file to write")
    p.add_argument("--nodes", default=None,
                   help="train, val, test or all (the run's split, or every id), or a file "
                        "of ids (.npy, or text of one a line); default: test, a link run's "
                        "all")
    p.add_argument("--pairs", type=path_text, default=None,
                   help="a link run: a file of pairs to score (.npy int[P, 2], or text of "
                        "two ids a line, or a CSV)")
    p.add_argument("--top-k", dest="k", type=int, default=None,
                   help="a link run: the K best destinations of each of --nodes")
    p.add_argument("--exclude", default=None,
                   help="with --top-k, the pairs ranked out: the run's splits named "
                        "(train, val, test, comma-separated) or none (default: train)")
    p.add_argument("--candidates", type=path_text, default=None,
                   help="with --top-k, a file of the only destination ids ranked (.npy, "
                        "or text of one a line); default: every destination")
    p.add_argument("--mode", default="full", choices=("full", "sampled"),
                   help="exact layer-wise inference where the model offers it, or sampled "
                        "with the training fanouts (default: full)")
    p.add_argument("--batch-size", type=int, default=4096,
                   help="sampled: seeds a step (default: 4096)")
    p.add_argument("--seed", type=whole_number, default=0,
                   help="sampled: the draws' key (default: 0)")
    add_checkpoint_flags(p)
    p.add_argument("--node-type", default=None,
                   help="a typed run: the node type whose rows --nodes names (a typed "
                        "link run: an end of its relation)")
    p.add_argument("--graph", type=path_text, default=None,
                   help="another graph's saved dataset (a typed run: of its types "
                        "and relations; a graph run: another collection), whose "
                        "nodes (graphs) are predicted; "
                        "--nodes train, val and test name its splits")
    p.add_argument("--progress", action=argparse.BooleanOptionalAction, default=True,
                   help="say on stderr what a step taking more than a second is doing "
                        "(default: on)")
    add_compile_cache_flag(p)
    p.set_defaults(handler=run_predict)
    return p


def run_predict(args) -> int:
    """Handler of `zerognn predict`. SIGINT, SIGTERM and SIGHUP are held until the
    datasets or the checkpoint are read or the outputs computed (`interrupts.deferred`),
    then stop the command with nothing written; one during the write lets it finish."""
    from zerognn_jax._src.training import interrupts

    out = Path(args.out)
    _check_options(args, out)
    log = stderr_log(args.progress)
    with interrupts.deferred():
        started = time.perf_counter()
        ids = _ids_file(args.nodes, "--nodes", columns=1) if _is_file(args.nodes) else None
        pairs = None if args.pairs is None else _ids_file(args.pairs, "--pairs", columns=2)
        candidates = None if args.candidates is None else _ids_file(
            args.candidates, "--candidates", columns=1)
        dataset = None if args.dataset is None else load_named(args.dataset, log=log)
        interrupts.check("reading the dataset; nothing was written")
        with announcing(f"zerognn: {args.checkpoint_dir}", log, doing="restoring the run"):
            result = restored(args, dataset, "call zg.predict from Python")
        interrupts.check("reading the checkpoint; nothing was written")
        other = None if args.graph is None else other_dataset(args.graph, result, log)
        interrupts.check("reading the graph of --graph; nothing was written")
        with announcing("zerognn: outputs", log, doing=f"computing ({args.mode})"):
            arrays, what = _outputs(args, result, other, ids, pairs, candidates)
        interrupts.check("computing the outputs; nothing was written")
        meta = {"format": FORMAT, "checkpoint": str(Path(args.checkpoint_dir).resolve()),
                "epoch": result.summary["epoch"], "task": result.summary["task"],
                "best": args.best, "what": what, "mode": args.mode, "seed": args.seed,
                "batch_size": args.batch_size, "graph": _resolved(args.graph),
                "node_type": _node_type(args, result, what), "nodes": _nodes_named(args, what),
                "pairs": _resolved(args.pairs), "top_k": args.k,
                "exclude": None if args.k is None else args.exclude or "train",
                "candidates": _resolved(args.candidates)}
        with atomic_write(out, "predictions") as f:  # (a signal now: the file is done)
            np.savez(f, **arrays, meta=np.asarray(json.dumps(meta)))
    shapes = {name: list(a.shape) for name, a in arrays.items()}
    print_line(json.dumps({"out": str(out), "what": what, "epoch": meta["epoch"],
                           "shapes": shapes,
                           "seconds": round(time.perf_counter() - started, 3)}),
               "what was written (the file is written)")
    return 0


def _check_options(args, out: Path) -> None:
    """ValueError for options that cannot go together or an --out that is no new or
    predictions file, before any work."""
    if out.suffix != ".npz":
        raise ValueError(f"--out must name a .npz file (the archive np.load reads), got "
                         f"{str(out)!r}")
    if out.is_dir():
        raise ValueError(f"--out {out} is a folder; give a file's path ending in .npz")
    if os.path.lexists(out) and not _ours(out):
        raise ValueError(f"--out {out} exists and is not a file zerognn predict wrote; "
                         f"give a new path or remove it first")
    taken = checkpoint_name(out, Path(args.checkpoint_dir))
    if taken is not None:
        raise ValueError(f"--out {out.resolve()} takes a name a run writes in its "
                         f"checkpoint folder ({taken}); give another name")
    if args.pairs is not None and (args.k is not None or args.nodes is not None):
        raise ValueError("--pairs scores the pairs of its file; it takes neither --nodes "
                         "nor --top-k")
    if args.k is not None and args.k < 1:
        raise ValueError(f"--top-k must be at least 1, got {args.k}")
    for flag, value, does in (("--exclude", args.exclude, "which pairs --top-k ranks out"),
                              ("--candidates", args.candidates,
                               "which destinations --top-k ranks")):
        if value is not None and args.k is None:
            raise ValueError(f"{flag} {value} says {does}; give --top-k K")
    if args.node_type is not None and (args.pairs is not None or args.k is not None):
        flag = "--pairs" if args.pairs is not None else "--top-k"
        raise ValueError(f"--node-type {args.node_type} picks the type whose rows --nodes "
                         f"names; {flag} takes the ids of the link relation's own ends "
                         f"(sources, then destinations): drop --node-type")
    for flag, path in (("--dataset", args.dataset), ("--graph", args.graph)):
        if path is not None and not os.path.exists(path):
            raise FileNotFoundError(f"{flag} {path}: no such file or folder")
    if args.exclude is not None:
        names = _exclude(args.exclude) or ()  # (refused before any work)
        if args.graph is not None and set(names) - {"train"}:
            raise ValueError(f"--exclude {args.exclude}: the graph of --graph has no "
                             f"val or test pairs; give train (its edges) or none")


def _node_type(args, result, what: str) -> str | None:
    """The type whose rows the archive holds (a typed run's node rows), for `meta`."""
    task = result.program.task
    if what in ("outputs", "embeddings") and isinstance(task, PredictsTypes):
        return task.output_type(args.node_type)
    return args.node_type


def _resolved(path: str | None) -> str | None:
    return None if path is None else str(Path(path).resolve())


def _nodes_named(args, what: str) -> str | None:
    """What --nodes named, as `meta` records it: a split, "all" or a file's absolute
    path (None for pairs)."""
    if what == "scores":
        return None
    if _is_file(args.nodes):
        return _resolved(args.nodes)
    return args.nodes or ("all" if what in ("embeddings", "top_k") else "test")


def _is_file(nodes: str | None) -> bool:
    """Whether --nodes names a file of ids (not a split, "all" or nothing)."""
    return nodes is not None and nodes not in (*SPLITS, "all")


def _ours(path: Path) -> bool:
    """Whether `path` is a file this command wrote (its `meta` names `FORMAT`)."""
    try:
        meta = archive_meta(path)
    except (OSError, ValueError, zipfile.BadZipFile):
        return False
    return isinstance(meta, dict) and meta.get("format") == FORMAT


def _outputs(args, result, other, ids, pairs, candidates) -> tuple[dict, str]:
    """(the arrays to write, what they are) for the request `args` makes of `result`:
    `ids` those of the --nodes file (else None), `pairs` those of --pairs, `candidates`
    those of --candidates (each else None).
    An error about `other` (--graph) names that flag (the functions call it dataset)."""
    task = result.program.task
    links = isinstance(task, RanksPairs)
    if (pairs is not None or args.k is not None) and not links:
        flag = "--pairs" if pairs is not None else "--top-k"
        raise ValueError(f"{flag} asks a link run for pairs; {args.checkpoint_dir} holds a "
                         f"{task.name!r} run")
    common = dict(mode=args.mode, batch_size=args.batch_size, seed=args.seed, dataset=other)
    if ids is None and pairs is None:
        ids = _split_ids(args, result, other, links)
    try:
        if pairs is not None:
            return {"pairs": pairs, "scores": score_pairs(result, pairs, **common)}, "scores"
        if args.k is not None:
            best, scores = recommend(result, ids, args.k,
                                     exclude=_exclude(args.exclude or "train"),
                                     candidates=candidates, **common)
            return {"sources": ids, "destinations": best, "scores": scores}, "top_k"
        outputs = np.asarray(predict(result, ids, node_type=args.node_type, **common),
                             np.float32)
    except ValueError as err:
        if _is_file(args.nodes) and str(err).startswith(("nodes must", "sources must")):
            said = str(err).split(" must", 1)[1]  # (the file that holds them named)
            err = ValueError(f"--nodes {args.nodes}: its ids must{said}")
        if other is None:
            raise err from None
        raise ValueError(f"--graph {args.graph}: {err}") from None
    return {"ids": ids, "outputs": outputs}, "embeddings" if links else "outputs"


def _split_ids(args, result, other, links: bool) -> np.ndarray:
    """int64[n]: the ids a split name or "all" names (default: test, a link run's all):
    of the --graph dataset if given, else of the run's; a link run's --top-k sources,
    the ids of its relation's source end."""
    spec = args.nodes if args.nodes is not None else "all" if links else "test"
    data = other if other is not None else result.dataset
    task = result.program.task
    if spec == "all":
        if args.k is not None:
            count = task.pair_counts()[0] if other is None else (
                other.graph.num_nodes[task.split.ends[0]] if isinstance(task, PredictsTypes)
                else other.graph.num_nodes)
        elif isinstance(task, PredictsItems):
            count = task.num_items(data)
        elif isinstance(task, PredictsTypes):
            count = data.graph.num_nodes[task.output_type(args.node_type)]
        else:
            count = data.graph.num_nodes
        return np.arange(count, dtype=np.int64)
    if links:
        raise ValueError(f"--nodes {spec}: a link run's splits are pairs, not nodes; give "
                         f"all, a file of ids, or --pairs")
    ids = np.asarray(getattr(data, f"{spec}_idx"), np.int64)
    if not ids.size:
        graphs = isinstance(task, PredictsItems)
        whose = ("the run's dataset" if other is None else
                 "the collection of --graph" if graphs else "the graph of --graph")
        raise ValueError(f"--nodes {spec}{'' if args.nodes else ' (the default)'}: {whose} "
                         f"has no {spec} {task.item_name + 's' if graphs else 'nodes'}; "
                         f"give all, another split or a file of ids")
    return ids


def _exclude(text: str):
    """--exclude as `recommend` takes it: None, or a tuple of split names."""
    names = tuple(n.strip() for n in text.split(","))
    if names == ("none",):
        return None
    wrong = [n for n in names if n not in SPLITS]
    if wrong:
        raise ValueError(f"--exclude takes train, val, test (comma-separated) or none, "
                         f"got {text!r}")
    return names


def _text_numbers(path: str) -> np.ndarray:
    """float64[n, columns] of a text file's numbers, a row a line, apart by spaces or
    by commas (those of its first line), read as it streams; blank lines, lines that
    begin with "#" and a byte-order mark are skipped, and so is a first line of which
    no field is a number (a CSV's header: one with a number is a row, and a bad one an
    error, never dropped)."""
    with open(path, encoding="utf-8-sig") as f:
        lines = (line for line in f if line.strip() and not line.lstrip().startswith("#"))
        first = next(lines, None)
        if first is None:
            return np.zeros((0, 0))
        delimiter = "," if "," in first else None
        header = not any(_is_number(field) for field in first.split(delimiter))
        rows = lines if header else itertools.chain([first], lines)
        return np.loadtxt(rows, dtype=np.float64, ndmin=2, delimiter=delimiter)


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def _ids_file(path: str, flag: str, *, columns: int) -> np.ndarray:
    """int64[n] (`columns` 1) or int64[n, 2] of a .npy file or a text file (a line a
    row: one id, or two)."""
    if not os.path.isfile(path):
        names = " (nor a split: train, val, test or all)" if flag == "--nodes" else ""
        raise FileNotFoundError(f"{flag} {path}: no such file{names}")
    if path.endswith(".npz"):
        raise ValueError(f"{flag} {path}: an .npz archive; give a .npy array or a text "
                         f"file of ids")
    try:
        with warnings.catch_warnings():  # (an empty text file: refused below)
            warnings.simplefilter("ignore")
            if path.endswith(".npy"):
                ids = np.load(path, allow_pickle=False)
            else:
                ids = _text_numbers(path)
                ids = ids.reshape(-1) if columns == 1 and ids.shape[1:] == (1,) else ids
    except (OSError, ValueError, UnicodeDecodeError) as err:
        raise ValueError(f"{flag} {path}: not a .npy array or a text file of numbers "
                         f"({err})") from None
    if not ids.size:
        raise ValueError(f"{flag} {path} holds no ids")
    shape = "[n]" if columns == 1 else "[n, 2]"
    if ids.ndim != columns or (columns == 2 and ids.shape[1] != 2):
        raise ValueError(f"{flag} {path} holds an array of shape {ids.shape}; expected "
                         f"{shape} ids")
    if ids.dtype.kind == "f":
        if not np.all(np.isfinite(ids)) or np.any(ids != np.round(ids)):
            raise ValueError(f"{flag} {path} holds numbers that are not whole ids")
    elif ids.dtype.kind not in "iu":
        raise ValueError(f"{flag} {path} holds {ids.dtype} values, not integer ids")
    if ids.dtype.kind != "i":  # past int64 (no id of any graph) before the cast wraps it
        farthest = ids.flat[np.argmax(np.abs(ids.astype(np.float64)))]
        if abs(float(farthest)) >= 2**63:
            raise ValueError(f"{flag} {path} holds {int(farthest)}, past any id")
    return ids.astype(np.int64)
