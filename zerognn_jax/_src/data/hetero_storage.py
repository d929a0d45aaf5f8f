"""Typed dataset storage: one `.npz` file, or a directory of memory-mappable `.npy` files,
as for homogeneous datasets (storage.py), with the types and relations in the metadata.

Type and relation names may hold any characters, so arrays are named by position: the
metadata lists the node types (with counts) and the relations in order, and

  r<i>_indptr, r<i>_indices   relation i's CSR (rows: its destination type)
  r<i>_weights                float32[E_i], only for weighted relations
  r<i>_edge_features          float32 or bfloat16 [E_i, D_i], only with edge features
  x<j>                        node type j's features, only for types with features
  info<j>_<k>                 node type j's k-th node_info column (names in the metadata)
  labels, train_idx, val_idx, test_idx   of the target type
  targets                     float32[N_target, T], only with float targets (their kind is
                              the metadata's "target_kind"; without it: "classes")

A directory holds `<key>.npy` per array and `meta.json` ({"kind": "hetero", ...} with
every array's shape and dtype, written and renamed into place atomically by
`storage.write_dir`), and is read memory-mapped; an `.npz` holds the same arrays plus
`meta`, the same JSON as a string (bfloat16 tables as their uint16 bits, the dtype named
in "dtypes"; "stored" lists every array, so that a file short of one is refused).
"""

from __future__ import annotations

import json
import os
import zipfile
import zlib
from pathlib import Path

import numpy as np

from zerognn_jax._src.data import storage
from zerognn_jax._src.data.checks import is_int
from zerognn_jax._src.data.graph import csr_from_arrays
from zerognn_jax._src.data.hetero import HeteroGraph
from zerognn_jax._src.data.hetero_dataset import SPLITS, HeteroDataset
from zerognn_jax._src.data.tables import BFLOAT16
from zerognn_jax._src.data.writes import (
    atomic_write,
    refuse_foreign,
    require_kind,
    require_npz_suffix,
)

KIND = "hetero"
# Relation k's CSR and tables, node type k's features, node_info entries, the target
# type's labels, splits and targets
_ACCEPTS = storage.ArrayNames(
    r"r\d+_(indptr|indices|weights|edge_features)|x\d+|info\d+_\d+|labels|"
    r"(train|val|test)_idx|targets",
    "r<k>_indptr, r<k>_indices, r<k>_weights, r<k>_edge_features, x<k>, info<k>_<j>, "
    "labels, train_idx, val_idx, test_idx, targets")


def _arrays(ds: HeteroDataset) -> dict[str, np.ndarray]:
    """Every array of `ds` under its stored key (module docstring)."""
    out = {"labels": ds.labels, **{f"{s}_idx": getattr(ds, f"{s}_idx") for s in SPLITS}}
    if ds.targets is not None:
        out["targets"] = ds.targets
    for i, g in enumerate(ds.graph.graphs):
        out[f"r{i}_indptr"], out[f"r{i}_indices"] = np.asarray(g.indptr), np.asarray(g.indices)
        if g.weights is not None:
            out[f"r{i}_weights"] = np.asarray(g.weights)
        if g.edge_features is not None:
            out[f"r{i}_edge_features"] = np.asarray(g.edge_features)
    types = ds.graph.node_types
    for j, t in enumerate(types):
        if t in ds.features:
            out[f"x{j}"] = ds.features[t]
        for k, col in enumerate(ds.node_info.get(t, {}).values()):
            out[f"info{j}_{k}"] = np.asarray(col)
    return out


def _meta(ds: HeteroDataset) -> dict:
    """The metadata of `ds` (module docstring); "target_kind" only with float targets."""
    return {"kind": KIND, "name": ds.name, "num_classes": int(ds.num_classes),
            "node_types": [[t, n] for t, n in ds.graph.node_counts],
            "relations": [list(r) for r in ds.graph.relations],
            "target_type": ds.target_type,
            "node_info": {t: list(cols) for t, cols in ds.node_info.items()},
            **({} if ds.targets is None else {"target_kind": ds.target_kind})}


def _dataset(meta: dict, arrays: dict, where) -> HeteroDataset:
    """The HeteroDataset of stored (meta, arrays); ValueError naming `where`."""
    try:
        counts = tuple((str(t), _recorded_int(n, f"node count of {t!r}"))
                       for t, n in _recorded_rows(meta["node_types"], "node_types", 2,
                                                  "[node type, count] pairs"))
        relations = tuple(tuple(r) for r in _recorded_rows(
            meta["relations"], "relations", 3, "[source type, name, destination type] "
            "triples"))
        graphs = []
        for i, rel in enumerate(relations):
            ncols = dict(counts).get(rel[0], 0)
            graphs.append(csr_from_arrays(arrays[f"r{i}_indptr"], arrays[f"r{i}_indices"],
                                          arrays.get(f"r{i}_weights"), num_columns=ncols,
                                          edge_features=arrays.get(f"r{i}_edge_features"),
                                          validate=False))  # the dataset validates them
        types = [t for t, _ in counts]
        features = {t: arrays[f"x{j}"] for j, t in enumerate(types) if f"x{j}" in arrays}
        recorded = meta.get("node_info", {})
        if not isinstance(recorded, dict):
            raise ValueError(f"its node_info must map node types to column names, got "
                             f"{recorded!r}")
        for t in recorded:
            if t not in types:
                raise ValueError(f"its node_info names {t!r}, which is not a node type "
                                 f"({', '.join(types)})")
        info = {t: {c: arrays[f"info{types.index(t)}_{k}"] for k, c in enumerate(cols)}
                for t, cols in recorded.items()}
        claimed = {f"r{i}_{part}" for i in range(len(relations))
                   for part in ("indptr", "indices", "weights", "edge_features")}
        claimed |= {f"x{j}" for j in range(len(types))}
        claimed |= {f"info{types.index(t)}_{k}" for t, cols in recorded.items()
                    for k in range(len(cols))}
        unclaimed = sorted(set(arrays) - claimed - {"meta", "labels", "targets",
                                                     *(f"{s}_idx" for s in SPLITS)})
        if unclaimed:  # its record lost a relation or a type: read, they were left out
            raise ValueError(f"it holds arrays its record names no relation, node type or "
                             f"column for: {', '.join(unclaimed)}")
        num_classes = _recorded_int(meta["num_classes"], "num_classes")
        return HeteroDataset(meta["name"], HeteroGraph(counts, relations, tuple(graphs)),
                             features, meta["target_type"], arrays["labels"],
                             *(arrays[f"{s}_idx"] for s in SPLITS), num_classes,
                             info, arrays.get("targets"), meta.get("target_kind", "classes"))
    except KeyError as err:  # an array (or a record's entry) its record says it holds
        raise ValueError(f"{where} holds an invalid typed dataset: it lacks {err}") from err
    except (TypeError, ValueError, IndexError) as err:
        raise ValueError(f"{where} holds an invalid typed dataset: {err}") from err


def _recorded_rows(value, what: str, width: int, rows: str) -> list:
    """`value`, a list of lists of `width` entries its record holds; ValueError naming
    `what` and the `rows` it should list otherwise (Python's own message before)."""
    if not isinstance(value, list) or not all(isinstance(r, list) and len(r) == width
                                              for r in value):
        raise ValueError(f"its {what} must be a list of {rows}, got {value!r:.80}")
    return value


def _recorded_int(value, what: str) -> int:
    """`value`, an integer its record holds; ValueError naming `what` otherwise (a count
    of 4.7 or a "3" read as 4 and 3 would pass unnoticed)."""
    if not is_int(value):
        raise ValueError(f"its {what} must be an integer, got {value!r}")
    return int(value)


def save_hetero_npz(ds: HeteroDataset, path: str | os.PathLike, *,
                    overwrite: bool = False) -> Path:
    """Writes `ds` to the `.npz` file `path` (atomically; ValueError where `path` does
    not end in .npz; WriteError when it cannot be written; FileExistsError if `path`
    holds something else than a dataset written here, unless `overwrite`)."""
    require_kind(ds, HeteroDataset, "save_hetero_npz")
    arrays, dtypes = {}, {}
    for key, values in _arrays(ds).items():
        if values.dtype == BFLOAT16:  # .npy has no bfloat16: its bits go as uint16
            dtypes[key] = "bfloat16"
            values = values.view(np.uint16)
        arrays[key] = values
    # every array named, as a directory's meta.json names them: a file short of one
    # (its features, say) is refused rather than read without it
    meta = {**_meta(ds), "dtypes": dtypes, "stored": sorted(arrays)}
    if not overwrite:
        refuse_foreign(path, "dataset file", folder=False)
    require_npz_suffix(path, "save_hetero_npz")
    with atomic_write(path, "dataset file") as f:
        np.savez(f, format_version=np.int64(storage.FORMAT_VERSION),
                 meta=np.str_(json.dumps(meta)), **arrays)
    return Path(path)


def load_hetero_npz(path: str | os.PathLike) -> HeteroDataset:
    """Reads a HeteroDataset written by `save_hetero_npz`.

    Raises:
      FileNotFoundError: `path` does not exist.
      ValueError: not a readable typed dataset file (the message names it).
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"dataset file {path} does not exist")
    try:
        with storage.open_npz(path) as npz:
            if other := storage.npz_of_another_kind(npz, "hetero"):
                raise ValueError(other)
            if "meta" not in npz.files:
                raise ValueError("no meta entry (not a typed dataset file)")
            arrays = {k: npz[k] for k in npz.files}
        meta = json.loads(str(arrays.pop("meta")))
        if not isinstance(meta, dict):
            raise ValueError(f"its meta entry is not a JSON object: {meta!r:.60}")
        version = int(arrays.pop("format_version", -1))
    except (zipfile.BadZipFile, EOFError, OSError, ValueError, TypeError) as err:
        raise ValueError(f"{path} is not a readable typed dataset file: {err}") from err
    if version != storage.FORMAT_VERSION or meta.get("kind") != KIND:
        raise ValueError(f"{path} has format_version {version} and kind {meta.get('kind')!r}; "
                         f"this version reads {storage.FORMAT_VERSION} and {KIND!r}")
    lacking = [k for k in meta.get("stored", ()) if k not in arrays]  # (older files: none)
    if lacking:
        types = [t for t, _ in meta.get("node_types", ())]
        named = [f"{k} (the features of {types[int(k[1:])]!r})"
                 if k[0] == "x" and k[1:].isdigit() and int(k[1:]) < len(types) else k
                 for k in lacking]
        raise ValueError(f"{path} is not a readable typed dataset file: it lacks "
                         f"{', '.join(named)}, which its meta lists")
    for key, kind in meta.get("dtypes", {}).items():
        if kind == "bfloat16" and arrays.get(key, np.zeros(0)).dtype == np.uint16:
            arrays[key] = arrays[key].view(BFLOAT16)
    return _dataset(meta, arrays, path)


def save_hetero_dir(ds: HeteroDataset, path: str | os.PathLike, *,
                    overwrite: bool = False) -> Path:
    """Writes `ds` to the directory `path` (atomically), one `.npy` per array (as
    `save_hetero_npz` for what is already at `path`)."""
    require_kind(ds, HeteroDataset, "save_hetero_dir")
    with storage.write_dir(path, ds.name, ds.num_classes, accepts=_ACCEPTS,
                           overwrite=overwrite) as out:
        out.meta.update(_meta(ds))
        for key, values in _arrays(ds).items():
            out.put(key, values)
    return Path(path)


def load_hetero_dir(path: str | os.PathLike) -> HeteroDataset:
    """The HeteroDataset of a directory written by `save_hetero_dir`, its arrays
    memory-mapped as stored (features in float32 or bfloat16), not copied."""
    meta, arrays = storage.load_arrays(path, accepts=_ACCEPTS, kind=KIND)
    return _dataset(meta, arrays, path)


def is_hetero_path(path: str | os.PathLike) -> bool:
    """Whether `path` is a typed dataset directory or `.npz` (its `meta` says "hetero")."""
    path = Path(path)
    if (path / storage.META).is_file():
        try:
            return json.loads((path / storage.META).read_text()).get("kind") == KIND
        except (OSError, ValueError, AttributeError):
            return False
    if path.suffix == ".npz" and path.is_file():
        try:
            with storage.open_npz(path) as npz:
                return storage.npz_kind(npz) == KIND
        except (OSError, ValueError, EOFError, zipfile.BadZipFile,
                zlib.error):  # unreadable: not a typed dataset file
            return False
    return False


def load_hetero(path: str | os.PathLike) -> HeteroDataset:
    """A typed dataset from an `.npz` file or a dataset directory."""
    return load_hetero_npz(path) if str(path).endswith(".npz") else load_hetero_dir(path)
