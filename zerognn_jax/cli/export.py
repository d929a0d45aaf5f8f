"""The `zerognn export` command: a trained run's model as a serialized `jax.export`
artifact for serving (`zg.export_model`), read from its checkpoint folder.

  zerognn export CHECKPOINT_DIR --out FILE [--batch-size N] [--best]
                 [--platforms cpu,cuda] [--node-type TYPE] [--dataset FILE]
                 [--graph FILE]                  (the graph the artifact serves)
                 [--arrays FILE.npz]             (that graph's arrays, for a server)
                 [--max-nodes N --max-edges N]   (a graph-level run's rows per call)
                 [--max-degree K]                (its sums by K listed edges a node)
                 [--compile-cache DIR|none]      (compiled programs kept between runs)

The run's configuration and dataset come from what the checkpoint records, as
`zg.restore` loads them; a run trained on a dataset object needs that dataset again,
saved to a file (`zg.save_npz`, `save_dir`, `save_hetero_npz`, `save_graphs`) and given
as `--dataset FILE`. The artifact takes the arrays of the graph the run trained on;
`--graph FILE`, another graph's saved dataset (a typed run's: of its types and
relations), makes it take that graph's (`zg.over_graph`: a graph grown since training,
say). The artifact is written whole or not at all, and beside it its
description, FILE.json, one JSON object that is also printed on stdout: its argument
names (`jax.export.deserialize(bytes).call(...)` takes them in that order; the artifact
holds no names; `zg.ExportedModel.read(FILE)` reads both), with the run's task, a typed run's
`node_type` (whose rows the artifact gives), `features_row_normalized` where the run
trained on its feature rows each divided by its sum (Planetoid's by default: the
features a server passes must be so too), and for a link run the decoder, how it scores
a pair of embeddings and which graph the artifact takes. `--arrays FILE.npz` writes the
arrays the artifact takes before the seeds (`ExportedModel.data_arguments`), keyed by
their argument names, so that a server without zerognn-jax reads them with `np.load`
(a graph-level artifact takes none: each call's graphs). Errors
print `zerognn: error: ...` on stderr and exit with 2, or 1 where the file could not be
written.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
from pathlib import Path

import jax
import numpy as np

from zerognn_jax._src.data.writes import atomic_write, print_line, written_here
from zerognn_jax._src.training.checkpoint_errors import OwnModelNeeded
from zerognn_jax._src.training.export import description_path, export_model
from zerognn_jax._src.training.inference import ANY_GRAPHS, over_graph, restore
from zerognn_jax._src.training.lock import checkpoint_name
from zerognn_jax._src.training.tasks.base import PredictsItems, PredictsTypes
from zerognn_jax.cli.data import dataset_kind, load_named
from zerognn_jax.cli.flags import add_compile_cache_flag, path_text, whole_number

# An existing --out is read to check that it is an artifact (replaced) rather than
# someone's file (refused) only up to this size.
CHECKED_BYTES = 2**30


def add_export_command(subparsers) -> argparse.ArgumentParser:
    """Adds `export` to `subparsers` (from `add_subparsers()`); its handler returns the
    exit code."""
    p = subparsers.add_parser("export", help="write a trained run's model as a jax.export "
                                             "artifact for serving", allow_abbrev=False)
    p.add_argument("checkpoint_dir", type=os.path.expanduser,
                   help="the run's checkpoint folder (--checkpoint-dir)")
    p.add_argument("--out", required=True, type=os.path.expanduser,  # "": refused below
                   help="the artifact's file")
    p.add_argument("--batch-size", type=int, default=256,
                   help="seeds per call (graphs per call for a graph-level run; default: "
                        "256)")
    add_checkpoint_flags(p)
    p.add_argument("--platforms", default=None,
                   help="lowering targets, comma-separated (cpu, cuda, rocm, tpu); default: this "
                        "machine's")
    p.add_argument("--node-type", default=None,
                   help="a typed link run's end type whose embeddings the artifact gives "
                        "(a typed node run gives its target type's logits)")
    p.add_argument("--max-nodes", type=int, default=None,
                   help="a graph-level run's node rows per call; default: batch size times "
                        "the collection's largest graph")
    p.add_argument("--max-edges", type=int, default=None,
                   help="a graph-level run's edge rows per call; default as --max-nodes")
    p.add_argument("--max-degree", type=int, default=None,
                   help="a graph-level run sums by gathers over this many listed edges a "
                        "node (faster on a GPU for large batches; a graph past it gets NaN); "
                        "default: by scatter-adds")
    p.add_argument("--graph", type=path_text, default=None,
                   help="another graph's saved dataset (a typed run: of its types and "
                        "relations), whose arrays the artifact takes instead of the "
                        "training graph's")
    p.add_argument("--arrays", type=path_text, default=None,
                   help="also write the graph arrays the artifact takes before the seeds "
                        "to this .npz, keyed by argument name (np.load reads them where "
                        "zerognn-jax is not installed)")
    add_compile_cache_flag(p)
    p.set_defaults(handler=run_export)
    return p


def _refuse_other_files(out: Path) -> None:
    """ValueError if `out` exists and is not an exported model (an artifact is
    replaced; anything else, a dataset the run trained on say, is someone's data)."""
    if not os.path.lexists(out):
        return
    if not out.is_file():
        raise ValueError(f"--out {out} exists and is not a file; give a new path")
    size = out.stat().st_size
    if size > CHECKED_BYTES:
        raise ValueError(f"--out {out} is a file of {size / 2**30:.1f} GiB, too large to "
                         f"check that it is an artifact; give a new path or remove it first")
    if not written_here(out):  # a dataset archive is never read whole here
        blob = bytearray(size)  # one copy in memory
        with contextlib.suppress(Exception):  # any failure: not an artifact
            with open(out, "rb") as f:
                f.readinto(blob)
            jax.export.deserialize(blob)
            return
    raise ValueError(f"--out {out} is a file, not a model exported by zerognn-jax that "
                     f"this JAX ({jax.__version__}) reads; give a new path or remove it "
                     f"first")


def _refuse_other_arrays(path: Path, out: Path) -> None:
    """ValueError where `--arrays` names a path that is not a .npz, or a file other than
    the arrays an earlier export to `out` wrote (its description names them): anything
    else there (a saved graph, say) is someone's."""
    if not str(path).endswith(".npz"):
        raise ValueError(f"--arrays writes a .npz archive (np.load reads it): name the file "
                         f"with .npz at the end, got {str(path)!r}")
    if not os.path.lexists(path):
        return
    with contextlib.suppress(OSError, ValueError):
        described = json.loads(description_path(out).read_text())
        if isinstance(described, dict) and described.get("arrays") == str(path.resolve()):
            return
    raise ValueError(f"--arrays {path} exists and is not the arrays an earlier export to "
                     f"--out {out} wrote; give a new path or remove it first")


@contextlib.contextmanager
def _arrays_written(path: Path | None, art, data):
    """Writes the arrays `art` takes before its seeds, for `data`, as the .npz `path`,
    keyed by argument name, put in place as the block ends without an exception (the
    artifact written in it) and not at all otherwise; nothing for a `path` of None."""
    if path is None:
        yield
        return
    named = dict(zip(art.arguments, art.data_arguments(data)))
    with atomic_write(path, "the artifact's arrays") as f:
        np.savez(f, **{name: np.asarray(a) for name, a in named.items()})
        yield


def _refuse_other_descriptions(out: Path) -> None:
    """ValueError if the description's file beside `out` exists and is not an
    artifact's description (one is replaced; anything else is someone's file)."""
    beside = description_path(out)
    if not os.path.lexists(beside):
        return
    with contextlib.suppress(OSError, ValueError):
        if beside.is_file() and beside.stat().st_size < 2**20:
            described = json.loads(beside.read_text())
            if isinstance(described, dict) and {"batch_size", "arguments"} <= described.keys():
                return
    raise ValueError(f"{beside}, where the artifact's description goes, is not one; give "
                     f"another --out or remove it first")


# How a link model's decoder scores a pair (u, v) of the artifact's embeddings.
PAIR_SCORES = {"scaled-dot": "dot(h_u, h_v) / sqrt(d)", "dot": "dot(h_u, h_v)",
               "mlp": "the trained mlp decoder's, not in the artifact"}


# The graph a link artifact is called with: the one its encoder passed messages over.
LINK_GRAPH = ("the run's message-passing graph, its link split's training edges: "
              "zg.restore(CHECKPOINT_DIR).data.graph, whose arrays data_arguments gives")


def _refuse_checkpoint_names(out: Path, checkpoint_dir: Path) -> None:
    """ValueError where `out` takes a name in `checkpoint_dir` that a run writes there
    (`checkpoint_name`): a resumed run would replace the artifact."""
    taken = checkpoint_name(out, checkpoint_dir)
    if taken is not None:
        raise ValueError(f"--out {out.resolve()} takes a name a run writes in its checkpoint "
                         f"folder ({taken}: a resumed run may replace it); give another name")


def _notes(args, result) -> dict:
    """What the artifact's description says of the run beside its arguments (and a
    typed run's node type, `ExportedModel.node_type`): the epoch it holds, the task, row
    normalisation, a link decoder."""
    notes = {"epoch": result.summary["epoch"], "best": bool(args.best),
             "task": result.summary["task"]}
    if "features_row_normalized" in result.summary:  # (a graph task's rows are as given)
        notes["features_row_normalized"] = result.summary["features_row_normalized"]
    decoder = result.summary.get("decoder")
    if decoder is not None:  # a link model's artifact gives embeddings; what scores pairs
        notes.update(outputs="embeddings", decoder=decoder, pair_score=PAIR_SCORES[decoder],
                     graph=LINK_GRAPH)
    if args.graph is not None:
        notes["graph"] = (f"the graph of {Path(args.graph).resolve()} as zg.over_graph("
                          f"zg.restore(CHECKPOINT_DIR), dataset) prepares it, whose arrays "
                          f"data_arguments gives")
    return notes


def add_checkpoint_flags(p: argparse.ArgumentParser) -> None:
    """`--best` or `--epoch N`, which checkpoint of the folder `restored` reads, and
    `--dataset FILE`, the run's dataset where it was given to train() as an object."""
    which = p.add_mutually_exclusive_group()
    which.add_argument("--best", action="store_true",
                       help="the best-validation checkpoint instead of the latest")
    which.add_argument("--epoch", type=whole_number, default=None,
                       help="that epoch's checkpoint instead of the latest (one the folder "
                            "keeps)")
    p.add_argument("--dataset", default=None, type=path_text,
                   help="the saved file of the dataset a run trained on when it was given "
                        "to train() as an object; other runs load theirs by the name they "
                        "recorded")


def restored(args, dataset, instead: str):
    """`zg.restore` of the checkpoint `args` name (--best, --epoch) for inference; a run
    of the user's own model is refused, saying to do `instead` from Python."""
    try:
        return restore(args.checkpoint_dir, best=args.best, epoch=args.epoch,
                       dataset=dataset, for_inference=True)
    except OwnModelNeeded as err:
        raise ValueError(f"{args.checkpoint_dir} holds a run of a model of your own "
                         f"({err.model}); this command builds the built-in models only: "
                         f"{instead} on zg.restore(..., model=..., for_inference=True)"
                         ) from None


def other_dataset(path: str, result, log):
    """The dataset of --graph, read as the run's task reads data (a collection of graphs
    for a graph run, a typed dataset for a typed run, else a graph of one node type);
    ValueError where it holds data of another kind."""
    task = result.program.task
    run = ("graphs" if isinstance(task, PredictsItems) else
           "typed" if isinstance(task, PredictsTypes) else "graph")
    holds = dataset_kind(path)
    if holds != run:
        raise ValueError(f"--graph {path} holds {_KINDS[holds]}, and the run predicts "
                         f"{_KINDS[run]}")
    return load_named(path, log=log)


# What --graph holds, and what a run predicts (`dataset_kind`'s kinds), in messages.
_KINDS = {"graphs": "a collection of graphs", "typed": "a typed graph (node types)",
          "graph": "a graph of one node type"}


def run_export(args) -> int:
    """Handler of `zerognn export`. SIGINT, SIGTERM and SIGHUP are held until the checkpoint is
    read, the model lowered or the artifact written (`interrupts.deferred`; a signal in
    the middle of a restore's threads could crash the process)."""
    from zerognn_jax._src.training import interrupts

    if not args.out.strip() or Path(args.out).is_dir():  # before the restore and lowering
        raise ValueError(f"--out must name the artifact's file, got {args.out!r}")
    _refuse_other_files(Path(args.out))
    _refuse_other_descriptions(Path(args.out))
    beside = [Path(args.out), description_path(args.out)]
    if args.arrays is not None:
        arrays = Path(args.arrays)
        if arrays.resolve() in [p.resolve() for p in beside]:
            raise ValueError(f"--arrays {args.arrays} is where the artifact or its "
                             f"description goes; give another name")
        _refuse_other_arrays(arrays, Path(args.out))
        beside.append(arrays)
    for path in beside:
        _refuse_checkpoint_names(path, Path(args.checkpoint_dir))
    platforms = None
    if args.platforms is not None:  # each named once, in the order given ("" names none)
        platforms = tuple(dict.fromkeys(p.strip() for p in args.platforms.split(",")))
    with interrupts.deferred():
        dataset = None if args.dataset is None else load_named(args.dataset)
        result = restored(args, dataset, "export it from Python, zg.export_model")
        interrupts.check("reading the checkpoint; nothing was written")
        program, data = result.program, result.data
        if args.arrays is not None and isinstance(program.task, PredictsItems):
            raise ValueError(f"--arrays {args.arrays}: a graph-level run's artifact takes "
                             f"each call's graphs whole, and no graph arrays")
        if args.graph is not None:
            if isinstance(result.program.task, PredictsItems):  # (before it is read)
                raise ValueError(f"--graph {args.graph}: {ANY_GRAPHS}")
            other = other_dataset(args.graph, result, log=None)
            try:
                program, data = over_graph(result, other)
            except ValueError as err:
                raise ValueError(f"--graph {args.graph}: {err}") from None
            interrupts.check("reading the graph of --graph; nothing was written")
        art = export_model(program, result.variables, data,
                           batch_size=args.batch_size, platforms=platforms,
                           node_type=args.node_type, max_nodes=args.max_nodes,
                           max_edges=args.max_edges, max_degree=args.max_degree)
        interrupts.check("lowering the model; nothing was written")
        notes = _notes(args, result)
        arrays = None if args.arrays is None else Path(args.arrays)
        if arrays is not None:
            notes["arrays"] = str(arrays.resolve())
        with _arrays_written(arrays, art, data):  # (in place once the artifact is)
            printed = {"out": str(args.out), **art.save(args.out, notes),
                       "description": str(description_path(args.out))}
        interrupts.check(f"writing {args.out}")
    print_line(json.dumps(printed), "the artifact's description (the artifact is written)")
    decoder = notes.get("decoder")
    if decoder == "mlp":
        print("zerognn: warning: the artifact gives the encoder's embeddings; the trained "
              "mlp decoder that scores pairs of them is not in it (zg.score_pairs on "
              "zg.restore of the checkpoint scores pairs with it)", file=sys.stderr)
    return 0
