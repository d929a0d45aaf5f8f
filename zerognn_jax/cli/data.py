"""The `zerognn data ...` commands: inspect a dataset, generate a synthetic one, write
one in another form.

  zerognn data info NAME [--root DIR] [--scale S] [--seed N] [--download]
  zerognn data generate {products-like,proteins-like,papers100m-like,rmat,mag-like,igbh-like,
                         shop-like,molhiv-like,molpcba-like} --out PATH [--scale S] [--seed N]
                        [--feature-dtype {float32,bfloat16}]
  zerognn data convert NAME --out PATH [--root DIR] [--scale S] [--seed N]

molhiv-like and molpcba-like write a graph collection (`--out` ending in .npz, else a
directory; `zerognn train --task graph --dataset PATH` reads it). For the others
`--out` is a file ending in .npz, or for papers100m-like also a dataset directory of
memory-mappable .npy files, streamed there from the device with its features in
--feature-dtype (the statistics printed are then read from the directory); igbh-like
draws its features in --feature-dtype (default bfloat16); every other preset keeps its
generator's features, and --feature-dtype given to one is refused (molhiv-like's and
molpcba-like's atom features are categorical ids). The typed
presets (mag-like, igbh-like, shop-like) write a typed .npz or dataset directory; `data
info` on a typed dataset (ogbn-mag, a typed preset, a typed file) lists its node types with
their counts and feature widths and its relations with their edge counts.

`data convert` reads any dataset the library reads (a name with --root, a saved .npz
or folder, of one node type, typed, or a graph collection) and writes it by its kind's
writer to --out: a file ending in .npz, else a directory, which is read memory-mapped
(an OGB folder's parse, say, kept as a directory of .npy files).

An --out that holds a dataset written by the library is replaced, once the new one is
written whole, and stderr says so first; any other file or folder there is refused.

Each prints the dataset's statistics as one JSON object on stdout. Errors print
`zerognn: error: ...` on stderr and give exit code 2, or 1 where the output could not be
written (a full disk, ...: the message names the path and the errno, and no partial file
is left).
"""

from __future__ import annotations

import argparse
import json
import os
import warnings
from pathlib import Path

from zerognn_jax._src.data.announce import announced, announcing, preset_label, stderr_log
from zerognn_jax._src.data.graph_datasets import (
    GRAPH_DATASET_NAMES,
    is_graph_dataset,
    load_graphs,
)
from zerognn_jax._src.data.graph_datasets import PRESETS as GRAPH_PRESETS
from zerognn_jax._src.data.graph_storage import save_graphs
from zerognn_jax._src.data.hetero_storage import is_hetero_path, save_hetero_dir, save_hetero_npz
from zerognn_jax._src.data.hetero_synthetic import igbh_like
from zerognn_jax._src.data.loaders import (
    DATASET_NAMES,
    HETERO_NAMES,
    load_dataset,
    load_hetero_dataset,
    save_npz,
    write_papers100m_like,
)
from zerognn_jax._src.data.loaders import TYPED_PRESETS as TYPED_GENERATORS
from zerognn_jax._src.data.planetoid import NAMES as PLANETOID_NAMES
from zerognn_jax._src.data.storage import load_dir, reads_as_path, save_dir
from zerognn_jax._src.data.writes import WriteError, print_line, refuse_foreign
from zerognn_jax.cli.flags import path_text, run_seed

TYPED_PRESETS = tuple(TYPED_GENERATORS)
GENERATE_PRESETS = ("products-like", "proteins-like", "papers100m-like", "rmat",
                    *TYPED_PRESETS, *GRAPH_PRESETS)


def add_data_commands(subparsers) -> argparse.ArgumentParser:
    """Adds `data info`, `data generate` and `data convert` to `subparsers` (from
    `add_subparsers()`).

    Each leaf parser sets `handler`, a function taking the parsed namespace and returning an
    exit code.
    """
    data = subparsers.add_parser("data", help="inspect or generate datasets",
                                 allow_abbrev=False)
    commands = data.add_subparsers(dest="data_command", required=True,
                                   metavar="{info,generate,convert}")
    info = commands.add_parser("info", help="print a dataset's statistics as JSON",
                               allow_abbrev=False)
    info.add_argument("name", help="one of: " + ", ".join(
        DATASET_NAMES + HETERO_NAMES + GRAPH_DATASET_NAMES))
    info.add_argument("--root", default=None, type=path_text,
                      help="data folder (see docs/datasets.md)")
    info.add_argument("--download", action="store_true", help="fetch missing Planetoid files")
    _add_size_options(info)
    info.set_defaults(handler=run_info)
    generate = commands.add_parser("generate", help="write a synthetic dataset (.npz or a "
                                                    "directory of .npy files)",
                                   allow_abbrev=False)
    generate.add_argument("preset", choices=GENERATE_PRESETS,
                          help="the synthetic preset to write: " + ", ".join(GENERATE_PRESETS))
    generate.add_argument("--out", required=True, type=path_text,
                          help="output file ending in .npz (papers100m-like, the typed "
                               "presets and the graph collections: or a directory)")
    generate.add_argument("--feature-dtype", default=None, choices=("float32", "bfloat16"),
                          help="papers100m-like into a directory (default float32) and "
                               "igbh-like (default bfloat16): the features' dtype; refused "
                               "for the others")
    _add_size_options(generate)
    generate.set_defaults(handler=run_generate)
    convert = commands.add_parser("convert", help="write a dataset this library reads (a "
                                                  "name, a saved file or folder) as a .npz "
                                                  "file or a directory of .npy files",
                                  allow_abbrev=False)
    convert.add_argument("name", help="the dataset: a name (with --root), a saved .npz "
                                      "or a saved folder")
    convert.add_argument("--out", required=True, type=path_text,
                         help="the file to write (ending in .npz) or the directory "
                              "(memory-mapped when read)")
    convert.add_argument("--root", default=None, type=path_text,
                         help="data folder of datasets read by name (see docs/datasets.md)")
    _add_size_options(convert)
    convert.set_defaults(handler=run_convert)
    return data


def _add_size_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--scale", type=float, default=1.0,
                        help="size multiplier of the synthetic presets (default 1)")
    parser.add_argument("--seed", type=run_seed, default=0,
                        help="generator seed of the synthetic presets, as zerognn train's "
                             "--seed (0 .. 2**31 - 1; default 0)")


def dataset_kind(name: str) -> str:
    """Which loader reads the dataset `name` (a name or a saved file): "graphs" (a graph
    collection), "typed" (a typed dataset) or "graph" (a dataset of one node type)."""
    if is_graph_dataset(name):
        return "graphs"
    return "typed" if name.lower() in HETERO_NAMES or is_hetero_path(name) else "graph"


def load_named(name: str, root=None, *, scale: float = 1.0, seed: int = 0,
               download: bool = False, log=None):
    """The dataset `name` (a name or a saved file) names, read by the loader of its kind
    (`dataset_kind`; `log`: as the loaders')."""
    kind = dataset_kind(name)
    if kind == "graphs":
        return load_graphs(name, root, scale=scale, seed=seed, log=log)
    if kind == "typed":
        return load_hetero_dataset(name, root, scale=scale, seed=seed, log=log)
    return load_dataset(name, root, scale=scale, seed=seed, download=download, log=log)


def run_info(args: argparse.Namespace) -> int:
    """Handler of `data info`: loads the dataset and prints its statistics. --download
    and --seed are refused where they would do nothing (the scale is checked by the
    loaders, whose Python callers give it too). SIGINT, SIGTERM and SIGHUP are held until
    the dataset is loaded (and a preset's cache under --root written), as `data generate`
    holds them; one that came while the statistics were computed is the exit's."""
    from zerognn_jax._src.training import interrupts
    from zerognn_jax._src.training.run_checks import IgnoredOptionWarning

    def build():
        key = args.name.lower()
        if args.download and key not in PLANETOID_NAMES:
            raise ValueError(f"--download fetches the Planetoid files "
                             f"({', '.join(PLANETOID_NAMES)}); {args.name!r} has none")
        if args.seed and key not in (*GENERATE_PRESETS, "tiny"):
            raise ValueError(f"--seed applies to the synthetic presets "
                             f"({', '.join(GENERATE_PRESETS)}, tiny); {args.name!r} is "
                             f"read, not generated (got --seed {args.seed})")
        if args.root is not None and reads_as_path(args.name):
            warnings.warn(f"--root {args.root}: the folder of datasets read by name, "
                          f"ignored for {args.name}, a path read as it is given",
                          IgnoredOptionWarning, stacklevel=1)
        dataset = load_named(args.name, args.root, scale=args.scale, seed=args.seed,
                             download=args.download, log=stderr_log(True))
        interrupts.check(f"loading {args.name}")
        return dataset

    return _held(lambda: _guarded(build), f"printing {args.name}'s statistics")


def run_generate(args: argparse.Namespace) -> int:
    """Handler of `data generate`: builds the preset, writes it to --out, prints stats.

    SIGINT, SIGTERM and SIGHUP are held until the preset is built (nothing written yet) or
    written (`interrupts.deferred`; a signal in the middle of NumPy's or JAX's work
    could crash the process); `main` turns them into exit code 130, 143 or 129."""
    return _held(lambda: _generate(args), f"writing {args.out}")


def _held(work, done: str) -> int:
    """`work()`'s exit code, SIGINT, SIGTERM and SIGHUP held meanwhile
    (`interrupts.deferred`): one that came is the command's stop once `work` is `done`
    (named so), or once it failed."""
    from zerognn_jax._src.training import interrupts

    with interrupts.deferred():
        try:
            code = work()
        except (ValueError, OSError):
            interrupts.check("the command failed")  # a signal meanwhile is the exit's
            raise
        interrupts.check(done)
    return code


def _generate(args: argparse.Namespace) -> int:
    from zerognn_jax._src.training import interrupts

    bare = args.out.rstrip("/" + os.sep)
    if bare != args.out and bare.endswith(".npz"):  # Path() reads "x.npz/" as x.npz
        raise ValueError(f"--out {args.out} ends in a separator but its name ends in .npz, "
                         f"which names a file: give {bare} for a file, or a folder name "
                         f"without .npz")
    folders = args.preset in GRAPH_PRESETS or args.preset in TYPED_PRESETS \
        or args.preset == "papers100m-like"
    if not folders and not args.out.endswith(".npz"):  # (before advice about folders)
        raise ValueError(f"--out must end in .npz, got {args.out!r}")
    streamed = args.preset == "papers100m-like" and not args.out.endswith(".npz")
    if args.feature_dtype is not None and not streamed and args.preset != "igbh-like":
        raise ValueError(_feature_dtype_refusal(args))
    log = stderr_log(True)  # the stats go to stdout; what it is doing to stderr
    _check_out(args.out, log)  # before generating, not after it
    what = preset_label(args.preset, args.scale, args.seed)

    def announced_write(write):
        return announced(what, write, log, into=args.out)

    def streamed_write():
        with announcing(what, log, into=args.out) as say:
            return write_papers100m_like(args.out, args.scale, args.seed, log=say,
                                         feature_dtype=args.feature_dtype or "float32")

    if streamed:
        return _guarded_stats(lambda: _dir_stats(streamed_write()))

    def written(write):  # the stats of what `write` wrote, and where it went
        return _guarded_stats(lambda: {**announced_write(write).stats(), "path": args.out})

    if args.preset in GRAPH_PRESETS:  # a graph collection: .npz file or directory
        return written(lambda: _saved_graphs(args))
    if args.preset in TYPED_PRESETS:
        return written(lambda: _typed(args))

    def build():
        dataset = load_dataset(args.preset, scale=args.scale, seed=args.seed)
        interrupts.check(f"generating {args.preset}; nothing was written")
        save_npz(dataset, args.out)
        return dataset

    return written(build)


def run_convert(args: argparse.Namespace) -> int:
    """Handler of `data convert`: reads the dataset `args.name` as its kind's loader
    does and writes it to --out by the writer of its kind and form (`save_npz` or
    `save_dir`, their typed and collection twins), then prints its stats. Signals are
    held as `data generate` holds them."""
    from zerognn_jax._src.training import interrupts

    out = args.out.rstrip("/" + os.sep)
    if Path(out).resolve() == Path(args.name).resolve():
        raise ValueError(f"--out {args.out} is the dataset read; give another path")
    _check_out(out, stderr_log(True))  # before reading (as `data generate`)
    kind, npz = dataset_kind(args.name), out.endswith(".npz")
    writer = {"graphs": save_graphs, "typed": save_hetero_npz if npz else save_hetero_dir,
              "graph": save_npz if npz else save_dir}[kind]

    def convert():
        dataset = load_named(args.name, args.root, scale=args.scale, seed=args.seed,
                             log=stderr_log(True))
        interrupts.check(f"reading {args.name}; nothing was written")
        writer(dataset, out)
        return {**dataset.stats(), "path": out}

    return _held(lambda: _guarded_stats(convert), f"writing {out}")


def _check_out(out: str, log) -> None:
    """ValueError where --out may not be written (`refuse_foreign`: a file or folder
    that is no dataset written here, an unwritable folder); a dataset already there is
    replaced, which `log` says first (a run of `data convert` had replaced another
    dataset without a word)."""
    try:
        refuse_foreign(out, "--out", folder=not out.endswith(".npz"))
    except OSError as err:
        raise ValueError(str(err)) from None
    path = Path(out)
    if path.is_file() or (path.is_dir() and any(path.iterdir())):
        log(f"zerognn: --out {out} holds a dataset written before; the new one replaces "
            f"it once written whole")


def _feature_dtype_refusal(args: argparse.Namespace) -> str:
    """Why --feature-dtype does not apply to `args.preset` written to `args.out`, and
    what to do instead."""
    given = f"--feature-dtype {args.feature_dtype}"
    if args.preset in GRAPH_PRESETS:
        return (f"{given} does not apply to {args.preset}: its atom features are "
                f"categorical ids (int32) that the graph task embeds; leave "
                f"--feature-dtype out")
    if args.preset == "papers100m-like":
        return (f"{given} applies to papers100m-like written to a directory, not to "
                f"--out {args.out}: give --out a directory, or leave --feature-dtype out")
    return (f"{given} applies to papers100m-like written to a directory and to "
            f"igbh-like only; {args.preset} keeps its generator's features: leave "
            f"--feature-dtype out")


def _saved_graphs(args: argparse.Namespace):
    collection = load_graphs(args.preset, scale=args.scale, seed=args.seed)
    save_graphs(collection, args.out)
    return collection


def _typed(args: argparse.Namespace):
    """Builds a typed preset and writes it to --out (.npz, else a directory); igbh-like
    with --feature-dtype draws its features in that dtype."""
    if args.preset == "igbh-like" and args.feature_dtype is not None:
        dataset = igbh_like(args.scale, args.seed, feature_dtype=args.feature_dtype)
    else:
        dataset = load_hetero_dataset(args.preset, scale=args.scale, seed=args.seed)
    (save_hetero_npz if args.out.endswith(".npz") else save_hetero_dir)(dataset, args.out)
    return dataset


def _dir_stats(path) -> dict:
    """The statistics of a dataset directory (`Dataset.stats()`, read back from its
    memory-mapped arrays and so checked as `load_dir` checks them), and its path."""
    return {**load_dir(path).stats(), "path": str(path)}


def _guarded(build) -> int:
    """Runs `build`, prints the dataset's stats as JSON; maps data errors to exit code 2."""
    return _guarded_stats(lambda: build().stats())


def _guarded_stats(stats) -> int:
    """Prints `stats()` as JSON. Raises data errors (an unreadable file too) as
    ValueError, exit code 2, and a file that could not be written (`WriteError`: a full
    disk, ...) as it is, exit code 1."""
    try:
        record = stats()
    except WriteError:
        raise
    except OSError as err:
        raise ValueError(str(err)) from None
    print_line(json.dumps(record), "the dataset's statistics")
    return 0
