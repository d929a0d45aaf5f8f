"""Storage of a `GraphCollection`: one `.npz` file, or a directory of `.npy` files.

Both hold the same arrays (NumPy's format, readable with `allow_pickle=False`) and one
JSON document of the rest:

  meta            {"format": "zerognn-graphs", "version": 1, "name", "target_kind",
                   "num_classes", "node_vocab", "edge_vocab"} (the .npz: a str[] member;
                   a directory: meta.json)
  node_offsets, edge_offsets   int64[G + 1]
  senders, receivers           int32[E], local to each graph
  node_features                float32[N, d] or int[N, d]
  edge_features                [E, d_e], only when the graphs have edge features
  targets                      float32[G, T] or int32[G]
  train_idx, val_idx, test_idx int32[*]

A directory is written under a temporary name, synced and renamed into place when
complete; a file is replaced atomically. Its arrays load memory-mapped.
"""

from __future__ import annotations

import json
import os
import zipfile
from pathlib import Path

import numpy as np

from zerognn_jax._src.data import storage
from zerognn_jax._src.data.graphs import GraphCollection
from zerognn_jax._src.data.writes import (
    GRAPHS_FORMAT,
    atomic_write,
    open_filled,
    refuse_foreign,
    require_kind,
    staged_dir,
)

FORMAT, VERSION = GRAPHS_FORMAT, 1
ARRAYS = ("node_offsets", "edge_offsets", "senders", "receivers", "node_features",
          "targets", "train_idx", "val_idx", "test_idx")


def _meta(c: GraphCollection) -> dict:
    return {"format": FORMAT, "version": VERSION, "name": c.name,
            "target_kind": c.target_kind, "num_classes": c.num_classes,
            "node_vocab": list(c.node_vocab), "edge_vocab": list(c.edge_vocab)}


def _arrays(c: GraphCollection) -> dict:
    out = {k: getattr(c, k) for k in ARRAYS}
    if c.edge_features is not None:
        out["edge_features"] = c.edge_features
    return out


def save_graphs(collection: GraphCollection, path: str | os.PathLike, *,
                overwrite: bool = False) -> Path:
    """Writes `collection` to `path`: a `.npz` file when the name ends in .npz, else a
    directory. Raises WriteError (an OSError naming the path) when it cannot be written;
    nothing half-written is left. Unless `overwrite`, FileExistsError if `path` holds
    something else than a dataset written here."""
    require_kind(collection, GraphCollection, "save_graphs")
    path = Path(path)
    what = "graph collection " + ("file" if path.suffix == ".npz" else "directory")
    if not overwrite:
        refuse_foreign(path, what, folder=path.suffix != ".npz")
    if path.suffix == ".npz":
        with atomic_write(path, "graph collection file") as f:
            np.savez(f, meta=np.str_(json.dumps(_meta(collection))), **_arrays(collection))
        return path
    with staged_dir(path, what, overwrite=overwrite) as tmp:
        for key, values in _arrays(collection).items():
            # blocks allocated first: np.save's partial write on a full disk raised
            # "11160 requested and 4064 written", an OSError of no errno
            out = open_filled(tmp / f"{key}.npy", values.dtype, values.shape)
            out[...] = values
            out.flush()
            del out
        (tmp / "meta.json").write_text(json.dumps(_meta(collection)))
    return path


def is_graphs_path(path: str | os.PathLike) -> bool:
    """Whether `path` is a graph collection written by `save_graphs`."""
    path = Path(path)
    if path.is_dir():
        meta = path / "meta.json"
        try:
            return meta.is_file() and FORMAT in meta.read_text()[:200]
        except (OSError, UnicodeDecodeError):  # unreadable: not a collection
            return False
    if path.is_file() and path.suffix == ".npz":
        try:
            with storage.open_npz(path) as npz:
                return storage.npz_kind(npz) == "graphs"
        except (zipfile.BadZipFile, OSError, ValueError, EOFError):
            return False
    return False


def load_graphs_file(path: str | os.PathLike) -> GraphCollection:
    """Reads a collection written by `save_graphs` (file or directory).

    Raises:
      FileNotFoundError: nothing at `path`.
      ValueError: not a readable collection (a key missing, another format or version,
        arrays that fail validation), naming the path and the problem.
    """
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"graph collection {path} does not exist")
    try:
        meta, arrays = _read(path)
        if not isinstance(meta, dict):
            raise ValueError(f"its meta is not a JSON object: {meta!r:.60}")
    except (zipfile.BadZipFile, EOFError, OSError, ValueError, KeyError,
            UnicodeDecodeError) as err:
        raise ValueError(f"{path} is not a readable graph collection: {err}") from err
    if meta.get("format") != FORMAT or meta.get("version") != VERSION:
        raise ValueError(f"{path} is format {meta.get('format')!r} version "
                         f"{meta.get('version')!r}; this zerognn reads {FORMAT!r} {VERSION}")
    try:
        # a file saved before 2026-12-01 may hold num_classes for other targets, or an
        # edge vocabulary without edge features: both meant nothing, and are dropped
        classes = int(meta["num_classes"]) if meta["target_kind"] == "classes" else 0
        edges = arrays.get("edge_features")
        return GraphCollection(
            meta["name"], *(arrays[k] for k in ARRAYS[:5]), edges, arrays["targets"],
            meta["target_kind"], arrays["train_idx"], arrays["val_idx"],
            arrays["test_idx"], classes, tuple(meta["node_vocab"]),
            tuple(meta["edge_vocab"]) if edges is not None else ())
    except KeyError as err:
        raise ValueError(f"{path} holds an invalid graph collection: no entry {err}") from err
    except (TypeError, ValueError) as err:
        raise ValueError(f"{path} holds an invalid graph collection: {err}") from err


def _read(path: Path) -> tuple[dict, dict]:
    if path.is_dir():
        meta = json.loads((path / "meta.json").read_text())
        if other := storage.of_another_kind(storage.dir_kind(meta), "graphs"):
            raise ValueError(other)
        keys = [*ARRAYS, "edge_features"]
        arrays = {}
        for k in keys:
            if (path / f"{k}.npy").is_file():
                try:
                    arrays[k] = storage.open_npy(path / f"{k}.npy")
                except ValueError as err:
                    raise ValueError(f"{k}.npy is unreadable: {err}") from err
    else:
        with storage.open_npz(path) as npz:
            if other := storage.npz_of_another_kind(npz, "graphs"):
                raise ValueError(other)
            arrays = {k: npz[k] for k in npz.files}
        if "meta" not in arrays:
            raise ValueError("it has no 'meta' entry, which save_graphs writes")
        try:
            meta = json.loads(str(arrays.pop("meta")))
        except ValueError as err:
            raise ValueError(f"its meta entry is not readable JSON ({err})") from None
    missing = [k for k in ARRAYS if k not in arrays]
    if missing:
        raise ValueError(f"missing array(s) {', '.join(missing)}")
    return meta, {k: np.asarray(v) for k, v in arrays.items()}
