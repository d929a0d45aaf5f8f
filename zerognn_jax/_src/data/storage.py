"""Single-file `.npz` storage of a Dataset, and atomic file writes shared by the loaders.

Layout of a file (NumPy's uncompressed `.npz`, readable with `allow_pickle=False`):

  format_version  int64[]      currently 1
  name            str[]        the dataset's name
  num_classes     int64[]
  indptr          int32[N + 1] (int64 past 2**31 - 1 edges)
  indices         int32[E]
  weights         float32[E]   only for weighted graphs
  features        float32[N, d]
  labels          int32[N]     -1 for unlabelled nodes
  train_idx, val_idx, test_idx  int32[*]
"""

from __future__ import annotations

import contextlib
import os
import tempfile
import zipfile
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from zerognn_jax._src.data.dataset import Dataset, make_dataset

FORMAT_VERSION = 1
_REQUIRED = (
    "format_version", "name", "num_classes", "indptr", "indices", "features", "labels",
    "train_idx", "val_idx", "test_idx",
)


@contextlib.contextmanager
def atomic_write(path: str | os.PathLike) -> Iterator:
    """Yields a binary file object whose content replaces `path` only on success.

    The data go to a temporary file in the same folder, which is renamed over `path`
    once the block ends without an exception and removed otherwise, so readers never
    see a half-written file.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".part")
    try:
        with os.fdopen(fd, "wb") as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def save_npz(dataset: Dataset, path: str | os.PathLike) -> Path:
    """Writes `dataset` to `path` (atomically) in the single-file format above."""
    g = dataset.graph
    arrays = {
        "format_version": np.int64(FORMAT_VERSION),
        "name": np.str_(dataset.name),
        "num_classes": np.int64(dataset.num_classes),
        "indptr": np.asarray(g.indptr),
        "indices": np.asarray(g.indices),
        "features": dataset.features,
        "labels": dataset.labels,
        "train_idx": dataset.train_idx,
        "val_idx": dataset.val_idx,
        "test_idx": dataset.test_idx,
    }
    if g.weights is not None:
        arrays["weights"] = np.asarray(g.weights)
    with atomic_write(path) as f:
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
        with np.load(path, allow_pickle=False) as npz:
            missing = [k for k in _REQUIRED if k not in npz.files]
            if missing:
                raise ValueError(f"missing key(s) {', '.join(missing)}")
            arrays = {k: npz[k] for k in npz.files}
    except (zipfile.BadZipFile, EOFError, OSError, ValueError) as err:
        raise ValueError(f"{path} is not a readable zerognn dataset file: {err}") from err
    version = int(arrays["format_version"])
    if version != FORMAT_VERSION:
        raise ValueError(
            f"{path} has format_version {version}; this version of zerognn reads "
            f"{FORMAT_VERSION}"
        )
    try:
        return make_dataset(
            str(arrays["name"]), arrays["indptr"], arrays["indices"], arrays["features"],
            arrays["labels"], arrays["train_idx"], arrays["val_idx"], arrays["test_idx"],
            int(arrays["num_classes"]), weights=arrays.get("weights"),
        )
    except (TypeError, ValueError) as err:
        raise ValueError(f"{path} holds an invalid dataset: {err}") from err
