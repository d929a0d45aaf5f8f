"""Dataset storage: a single `.npz` file, or a directory of memory-mappable `.npy` files;
atomic file writes shared by the loaders.

A directory (`save_dir`, `load_dir`, `DatasetWriter`) holds one `<key>.npy` per array
of the table below (name and num_classes go to `meta.json`, with the format version and
every array's shape and dtype). It is written under a temporary name and renamed into
place when complete, and read with `np.load(mmap_mode="r")`: loading costs page-table
set-up, not a copy, and a device upload reads the pages once. Large graphs use it
(papers100M: 13 GB of CSR, 28 GB of bfloat16 features), as an `.npz` member can be
neither memory-mapped nor written without holding it. `load_arrays` returns the arrays
as they are stored (features in float32 or bfloat16); `load_dir` validates them into a
Dataset that keeps them so.

Layout of a file (NumPy's uncompressed `.npz`, readable with `allow_pickle=False`):

  format_version  int64[]      currently 1
  name            str[]        the dataset's name
  num_classes     int64[]
  indptr          int32[N + 1] (int64 past 2**31 - 1 edges)
  indices         int32[E]
  weights         float32[E]   only for weighted graphs
  edge_features   float32[E, D] or uint16[E, D] (bfloat16 bits, with
                  edge_features_dtype = "bfloat16"), only with edge features
  features        float32[N, d] or uint16[N, d] (bfloat16 bits); features_dtype names
                  the dtype (files written before it existed hold float32 features)
  labels          int32[N]     -1 for unlabelled nodes
  targets         float32[N, T] only with float targets, whose kind is target_kind
  target_kind     str[]        "multilabel" or "regression", only with targets (a
                  directory keeps it in meta.json)
  train_idx, val_idx, test_idx  int32[*]
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import re
import zipfile
from collections.abc import Iterator
from pathlib import Path

import ml_dtypes
import numpy as np

from zerognn_jax._src.data.dataset import Dataset, make_dataset
from zerognn_jax._src.data.tables import BFLOAT16
from zerognn_jax._src.data.writes import (
    GRAPHS_FORMAT,
    META,
    atomic_write,
    open_filled,
    refuse_foreign,
    require_kind,
    require_npz_suffix,
    staged_dir,
)

__all__ = ["atomic_write", "load_arrays", "load_dir", "load_npz", "save_dir", "save_npz",
           "write_dir"]

FORMAT_VERSION = 1
_REQUIRED = (
    "format_version", "name", "num_classes", "indptr", "indices", "features", "labels",
    "train_idx", "val_idx", "test_idx",
)


def save_npz(dataset: Dataset, path: str | os.PathLike, *, overwrite: bool = False) -> Path:
    """Writes `dataset` to `path` (atomically) in the single-file format above.

    Raises:
      ValueError: `path` does not end in .npz (`load_dataset` would not read it).
      WriteError: the file could not be written (an OSError naming it; nothing is left).
      FileExistsError: `path` holds something else than a dataset written here (not
        checked with `overwrite`).
    """
    require_kind(dataset, Dataset, "save_npz")
    g = dataset.graph
    arrays = {
        "format_version": np.int64(FORMAT_VERSION),
        "name": np.str_(dataset.name),
        "num_classes": np.int64(dataset.num_classes),
        "indptr": np.asarray(g.indptr),
        "indices": np.asarray(g.indices),
        "labels": dataset.labels,
        "train_idx": dataset.train_idx,
        "val_idx": dataset.val_idx,
        "test_idx": dataset.test_idx,
    }
    if g.weights is not None:
        arrays["weights"] = np.asarray(g.weights)
    put_table(arrays, "features", np.asarray(dataset.features))
    if g.edge_features is not None:
        put_table(arrays, "edge_features", np.asarray(g.edge_features))
    if dataset.targets is not None:
        arrays["targets"] = dataset.targets
        arrays["target_kind"] = np.str_(dataset.target_kind)
    if not overwrite:
        refuse_foreign(path, "dataset file", folder=False)
    require_npz_suffix(path, "save_npz")
    with atomic_write(path, "dataset file") as f:
        np.savez(f, **arrays)
    return Path(path)


def load_npz(path: str | os.PathLike) -> Dataset:
    """Reads a Dataset written by `save_npz`.

    Raises:
      FileNotFoundError: `path` does not exist.
      ValueError: the file is not a readable dataset file (truncated, corrupt, a key
        missing, another format version, or arrays that fail Dataset validation); the
        message names the file and the problem.
    """
    path = Path(path)
    if not path.is_file():
        problem = "is not a file" if path.exists() else "does not exist"
        raise FileNotFoundError(f"dataset file {path} {problem}")
    try:
        with open_npz(path) as npz:
            missing = [k for k in _REQUIRED if k not in npz.files]
            if missing:
                raise ValueError(npz_of_another_kind(npz, "homogeneous")
                                 or f"missing key(s) {', '.join(missing)}")
            arrays = {k: npz[k] for k in npz.files}
        version = int(arrays["format_version"])
    except (zipfile.BadZipFile, EOFError, OSError, ValueError, TypeError) as err:
        raise ValueError(f"{path} is not a readable zerognn dataset file: {err}") from err
    if version != FORMAT_VERSION:
        raise ValueError(
            f"{path} has format_version {version}; this version of zerognn reads "
            f"{FORMAT_VERSION}"
        )
    try:
        return make_dataset(
            str(arrays["name"]), arrays["indptr"], arrays["indices"],
            stored_table(arrays, "features"), arrays["labels"], arrays["train_idx"],
            arrays["val_idx"], arrays["test_idx"],
            int(arrays["num_classes"]), weights=arrays.get("weights"),
            targets=arrays.get("targets"),
            target_kind=str(arrays["target_kind"]) if "target_kind" in arrays else None,
            edge_features=stored_table(arrays, "edge_features"),
        )
    except (TypeError, ValueError) as err:
        raise ValueError(f"{path} holds an invalid dataset: {err}") from err


def put_table(arrays: dict, key: str, table: np.ndarray) -> None:
    """Puts `table` and its dtype's name (`<key>_dtype`) into a `.npz`'s `arrays`: .npy
    has no bfloat16, so its bits go as uint16."""
    arrays[f"{key}_dtype"] = np.str_(table.dtype.name)
    arrays[key] = table.view(np.uint16) if table.dtype == BFLOAT16 else table


def stored_table(arrays: dict, key: str):
    """The table `key` of a `.npz`'s arrays (bfloat16 from its uint16 bits; files written
    before features had a dtype entry hold their features as they are), or None."""
    table = arrays.get(key)
    if table is None:
        return None
    kind = str(arrays.get(f"{key}_dtype", table.dtype.name))
    if table.dtype == np.uint16 and f"{key}_dtype" not in arrays:  # (never written so)
        raise ValueError(f"{key} holds uint16 values and the file names no {key}_dtype: "
                         f"bfloat16 bits go with {key}_dtype 'bfloat16' (save_npz writes "
                         f"it), numbers as float32 (or another float type)")
    if kind == "bfloat16" and table.dtype == np.uint16:
        return table.view(BFLOAT16)
    if table.dtype == np.dtype("V2") and f"{key}_dtype" not in arrays:
        return table.view(BFLOAT16)  # bfloat16 saved as it was, before the dtype entry
    if kind != table.dtype.name:
        raise ValueError(f"{key}_dtype says {kind}, the array holds {table.dtype}")
    return table


_DIR_ARRAYS = ("indptr", "indices", "weights", "features", "labels", "train_idx", "val_idx",
               "test_idx", "targets", "edge_features")
_OPTIONAL = ("weights", "targets", "edge_features")


@dataclasses.dataclass(frozen=True)
class ArrayNames:
    """The array names a kind of dataset directory holds: those `pattern` (a regular
    expression) matches whole; `shown` lists them for messages."""

    pattern: str
    shown: str

    def __call__(self, key: str) -> bool:
        return re.fullmatch(self.pattern, key) is not None


HOMOGENEOUS = ArrayNames("|".join(_DIR_ARRAYS), ", ".join(_DIR_ARRAYS))


class DatasetWriter:
    """Writes the arrays of a dataset directory one at a time (see `write_dir`).

    `accepts` tells the array names this kind of directory holds (default: the
    homogeneous dataset's, `_DIR_ARRAYS`; typed datasets name theirs, hetero_storage.py).
    """

    def __init__(self, folder: Path, accepts: ArrayNames = HOMOGENEOUS):
        self.folder = folder
        self.accepts = accepts
        self.meta: dict = {"format_version": FORMAT_VERSION, "arrays": {}}

    def array(self, key: str, shape, dtype) -> np.memmap:
        """A writable memory map for array `key`, to fill in place (in blocks)."""
        if not self.accepts(key):
            raise ValueError(f"unknown array {key!r}; expected one of {self.accepts.shown}")
        dtype = np.dtype(dtype)
        self.meta["arrays"][key] = {"shape": [int(d) for d in shape], "dtype": dtype.name}
        return open_filled(self.folder / f"{key}.npy", dtype, shape)

    def put(self, key: str, values) -> None:
        """Writes array `key` from `values` (any array-like)."""
        values = np.asarray(values)
        out = self.array(key, values.shape, values.dtype)
        out[...] = values
        out.flush()


@contextlib.contextmanager
def write_dir(path: str | os.PathLike, name: str, num_classes: int, *,
              accepts: ArrayNames = HOMOGENEOUS,
              overwrite: bool = False) -> Iterator[DatasetWriter]:
    """Yields a `DatasetWriter` whose directory replaces `path` when the block ends.

    The arrays go to a temporary folder beside `path`, which is synced and renamed into
    place once the block ends without an exception (an older `path` is removed only
    then), and deleted otherwise: readers see a complete dataset or none. The folder and
    its files get the permissions the umask leaves (of 0o777 and 0o666). An OSError
    (a full disk, ...) becomes a `WriteError` naming `path`. `accepts`: see
    `DatasetWriter`. Unless `overwrite` (the library's own caches), anything at `path`
    but a dataset written here is refused (`refuse_foreign`), before the block and again
    before the swap.
    """
    path = Path(path)
    if not overwrite:
        refuse_foreign(path, "dataset directory", folder=True)
    with staged_dir(path, "dataset directory", overwrite=overwrite) as tmp:
        writer = DatasetWriter(tmp, accepts)
        writer.meta.update(name=name, num_classes=int(num_classes))
        yield writer
        with open(tmp / META, "w") as f:
            json.dump(writer.meta, f, indent=1)


def save_dir(dataset: Dataset, path: str | os.PathLike, *, overwrite: bool = False) -> Path:
    """Writes `dataset` to the directory `path` (atomically), one `.npy` per array;
    FileExistsError if `path` holds something else than a dataset written here, unless
    `overwrite`."""
    require_kind(dataset, Dataset, "save_dir")
    g = dataset.graph
    with write_dir(path, dataset.name, dataset.num_classes, overwrite=overwrite) as out:
        for key, values in (("indptr", g.indptr), ("indices", g.indices),
                            ("weights", g.weights), ("features", dataset.features),
                            ("labels", dataset.labels), ("train_idx", dataset.train_idx),
                            ("val_idx", dataset.val_idx), ("test_idx", dataset.test_idx),
                            ("targets", dataset.targets), ("edge_features", g.edge_features)):
            if values is not None:
                out.put(key, values)
        if dataset.targets is not None:
            out.meta["target_kind"] = dataset.target_kind
    return Path(path)


def dataset_name(name) -> str:
    """`name`, a dataset's name or a path (str or `os.PathLike`; a leading `~` read as
    the home folder), as a string; TypeError for anything else."""
    if isinstance(name, str | os.PathLike):
        return os.path.expanduser(os.fspath(name))
    raise TypeError(f"a dataset is named by a string or a path, got {type(name).__name__}: "
                    f"{name!r}")


# What each kind of this library's `.npz` files holds, and its reader.
_NPZ_KINDS = {"homogeneous": ("a homogeneous dataset", "zg.load_dataset"),
              "hetero": ("a typed (heterogeneous) dataset", "zg.load_hetero"),
              "graphs": ("a graph collection", "zg.load_graphs_file"),
              "link": ("a link split (LinkSplit.save's)", "zg.LinkSplit.load"),
              "typed_link": ("a typed graph's link split (TypedLinkSplit.save's)",
                             "zg.TypedLinkSplit.load")}


def open_npz(path: str | os.PathLike):
    """The open `.npz` archive at `path` (pickles refused). ValueError where the file is
    something else: NumPy reads bytes that are neither a zip nor a `.npy` as a pickle,
    and advised `allow_pickle=`, which no reader here takes."""
    try:
        f = np.load(path, allow_pickle=False)
    except ValueError as err:
        if "pickle" not in str(err):
            raise
        raise ValueError("it is no .npz archive (its bytes are neither a zip of .npy "
                         "arrays nor a .npy array)") from None
    if not isinstance(f, np.lib.npyio.NpzFile):
        raise ValueError("it holds one .npy array, not an .npz archive")
    return f


def npz_kind(npz) -> str | None:
    """Which of this library's `.npz` files the open `npz` is (a `_NPZ_KINDS` key: a
    typed dataset's and a graph collection's `meta` say so, a homogeneous dataset and a
    link split have their arrays at the top), or None."""
    files = set(npz.files)
    if "meta" not in files:
        if {"indptr", "format_version"} <= files:
            return "homogeneous"
        return "link" if {"num_nodes", "train", "val_pos", "test_pos"} <= files else None
    try:
        return _meta_kind(json.loads(str(npz["meta"])))
    except (ValueError, TypeError):  # a damaged meta: the arrays may still say what it is
        return "graphs" if {"node_offsets", "senders", "receivers"} <= files else None


def _meta_kind(meta) -> str | None:
    """"hetero", "typed_link" or "graphs" where the JSON object `meta` (a `.npz`'s `meta`
    entry or a folder's meta.json) says so, else None."""
    if isinstance(meta, dict) and meta.get("kind") in ("hetero", "typed_link"):
        return meta["kind"]
    if isinstance(meta, dict) and meta.get("format") == GRAPHS_FORMAT:
        return "graphs"
    return None


def dir_kind(meta) -> str | None:
    """Which of this library's folders a folder of meta.json `meta` is (as `npz_kind`:
    a homogeneous dataset's meta.json has a format_version and no kind), or None."""
    held = _meta_kind(meta)
    return held or ("homogeneous" if isinstance(meta, dict) and "format_version" in meta
                    else None)


def of_another_kind(held: str | None, kind: str) -> str | None:
    """"it holds <what>; read it with <reader>" where a file or folder of this library's
    kind `held` (`npz_kind`, `dir_kind`) is of another kind than `kind`, else None: a
    loader then names the reader rather than the keys the file lacks."""
    if held is None or held == kind:
        return None
    what, reader = _NPZ_KINDS[held]
    return f"it holds {what}; read it with {reader}"


def npz_of_another_kind(npz, kind: str) -> str | None:
    """`of_another_kind` of the open `.npz` `npz`."""
    return of_another_kind(npz_kind(npz), kind)


def names_a_missing_path(name: str) -> bool:
    """Whether `name` reads as a path (a directory separator, or an `.npz` ending) that
    names nothing on disk: the loaders then say so rather than "unknown dataset"."""
    return (os.sep in name or name.endswith(".npz")) and not Path(name).exists()


def is_dataset_dir(path: str | os.PathLike) -> bool:
    return (Path(path) / META).is_file()


def reads_as_path(name: str) -> bool:
    """Whether the loaders read `name` as a path (an `.npz` file, a path with a folder
    in it, a saved dataset directory), and so never look in their `root`."""
    return name.endswith(".npz") or os.sep in name or is_dataset_dir(name)


def _read_meta(file: Path, accepts: ArrayNames = HOMOGENEOUS, kind: str | None = None) -> dict:
    """The JSON object of a `meta.json`, checked for what `load_arrays` reads from it.

    Raises:
      ValueError: naming `file` and the problem: not JSON, not an object, another
        format version, a missing key, or an `arrays` entry that is not a known array
        with its shape and dtype.
    """
    try:
        meta = json.loads(file.read_text())
    except (OSError, ValueError) as err:  # JSONDecodeError and UnicodeDecodeError too
        raise ValueError(f"{file} is not readable JSON: {err}") from None
    if not isinstance(meta, dict):
        raise ValueError(f"{file} holds a JSON {type(meta).__name__}, not an object")
    if _meta_kind(meta) == "graphs":  # not a dataset of either kind
        raise ValueError(f"{file.parent} is not a dataset directory: "
                         f"{of_another_kind('graphs', 'homogeneous')}")
    if meta.get("format_version") != FORMAT_VERSION:
        raise ValueError(f"{file.parent} has format_version {meta.get('format_version')}; "
                         f"this version of zerognn reads {FORMAT_VERSION}")
    if meta.get("kind") != kind:
        held = "a typed (heterogeneous)" if meta.get("kind") == "hetero" else "a homogeneous"
        reader = "load_hetero" if meta.get("kind") == "hetero" else "load_dir"
        raise ValueError(f"{file.parent} holds {held} dataset; read it with {reader}")
    missing = [k for k in ("name", "num_classes", "arrays") if k not in meta]
    if missing:
        raise ValueError(f"{file} lacks the key(s) {', '.join(missing)}")
    specs = meta["arrays"]
    bad = [k for k, v in specs.items() if not accepts(k) or not isinstance(v, dict)
           or not isinstance(v.get("shape"), list) or not isinstance(v.get("dtype"), str)] \
        if isinstance(specs, dict) else [repr(specs)]
    if bad:
        raise ValueError(f"{file}: \"arrays\" must map array names ({accepts.shown}) "
                         f"to {{\"shape\": [...], \"dtype\": \"...\"}}; bad entries: "
                         f"{', '.join(bad)}")
    return meta


def open_npy(file: Path) -> np.ndarray:
    """The `.npy` file `file` memory-mapped read-only; ValueError saying why it cannot
    be: not a `.npy` file at all (NumPy's own message then suggests unpickling it), an
    empty or cut file, or an array of Python objects."""
    with open(file, "rb") as f:
        head = f.read(len(np.lib.format.MAGIC_PREFIX))
    if head != np.lib.format.MAGIC_PREFIX:
        raise ValueError("it is not a .npy file (it lacks NumPy's header)" if head else
                         "it is empty")
    try:
        return np.load(file, mmap_mode="r", allow_pickle=False)
    except (ValueError, EOFError) as err:  # EOFError: a cut header
        raise ValueError(_header_problem(file) or str(err) or type(err).__name__) from err


def _header_problem(file: Path) -> str | None:
    """What `file`'s header says is wrong with it, in place of NumPy's words: an array
    of Python objects, which only pickle reads ("it is cut short" before: an object's
    size is not its pickle's), or a header that promises more bytes than the file holds
    (mmap's "mmap length is greater than file size"); None otherwise."""
    try:
        with open(file, "rb") as f:
            version = np.lib.format.read_magic(f)
            read = (np.lib.format.read_array_header_1_0 if version == (1, 0) else
                    np.lib.format.read_array_header_2_0)
            shape, _, dtype = read(f)
            start = f.tell()
    except (ValueError, EOFError, OSError):
        return None
    if dtype.hasobject:
        return (f"it holds Python objects (dtype {dtype}, shape {list(shape)}), which only "
                f"pickle reads: a dataset's arrays hold numbers")
    want = start + int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    have = file.stat().st_size
    if have >= want:
        return None
    return (f"it is cut short: {have:,} of the {want:,} bytes its header promises "
            f"({dtype}{list(shape)})")


def load_arrays(path: str | os.PathLike, *, accepts: ArrayNames = HOMOGENEOUS,
                kind: str | None = None) -> tuple[dict, dict[str, np.ndarray]]:
    """(meta, arrays) of a dataset directory, the arrays memory-mapped read-only.

    `accepts` and `kind` (meta.json's "kind": None for homogeneous datasets, "hetero")
    say which directories are read; another kind is a ValueError naming its reader.

    Raises:
      FileNotFoundError: `path` holds no `meta.json`.
      ValueError: a `meta.json` that is not JSON or lacks a key (`_read_meta`), another
        format version, or an array whose file is missing or does not match the shape
        and dtype `meta.json` records.
    """
    path = Path(path)
    if not is_dataset_dir(path):
        raise FileNotFoundError(f"{path} is not a dataset directory (no {META})")
    meta = _read_meta(path / META, accepts, kind)
    arrays = {}
    for key, spec in meta["arrays"].items():
        try:
            arr = open_npy(path / f"{key}.npy")
        except (OSError, ValueError) as err:
            raise ValueError(f"{path}: array {key} is unreadable: {err}") from err
        if arr.dtype.kind == "V" and hasattr(ml_dtypes, spec["dtype"]):
            arr = arr.view(getattr(ml_dtypes, spec["dtype"]))  # .npy keeps bfloat16 as void
        if list(arr.shape) != spec["shape"] or arr.dtype.name != spec["dtype"]:
            raise ValueError(f"{path}: {key}.npy holds {arr.dtype.name}{list(arr.shape)}, "
                             f"meta.json says {spec['dtype']}{spec['shape']}")
        arrays[key] = arr
    missing = [k for k in _DIR_ARRAYS if k not in _OPTIONAL and k not in arrays]
    if missing and kind is None:
        raise ValueError(f"{path} lacks array(s) {', '.join(missing)}")
    return meta, arrays


def load_dir(path: str | os.PathLike) -> Dataset:
    """The Dataset of a directory written by `save_dir` or `write_dir`: the graph and the
    features memory-mapped as stored (float32 or bfloat16), not copied."""
    meta, a = load_arrays(path)
    stored = a["features"].dtype
    if stored not in (np.float32, BFLOAT16):  # read in place, never as a converted copy
        raise ValueError(f"{path} holds an invalid dataset: features.npy is {stored}; a "
                         f"dataset directory's features must be float32 or bfloat16 (they "
                         f"are read in place, as typed directories' are): write them as "
                         f"one, np.save(path, table.astype(np.float32))")
    try:
        return make_dataset(meta["name"], a["indptr"], a["indices"], a["features"], a["labels"],
                            a["train_idx"], a["val_idx"], a["test_idx"], meta["num_classes"],
                            weights=a.get("weights"), targets=a.get("targets"),
                            target_kind=meta.get("target_kind"),
                            edge_features=a.get("edge_features"))
    except (TypeError, ValueError) as err:
        raise ValueError(f"{path} holds an invalid dataset: {err}") from err
