"""Cora, CiteSeer and PubMed in the original Planetoid files, with the standard split.

A dataset `<name>` is eight files `ind.<name>.{x,y,tx,ty,allx,ally,graph,test.index}`
in one folder: Python-2 pickles of SciPy sparse feature rows (`x`, `tx`, `allx`), one-hot
label rows (`y`, `ty`, `ally`), a dict of adjacency lists (`graph`), and the test node
ids one per line (`test.index`). Row `i` of `allx` is node `i`; row `j` of `tx` is node
`test.index[j]`. Nodes in neither (CiteSeer's 15 isolated test-range nodes) get zero
features and label -1.

Standard split (Yang et al., 2016; Kipf & Welling, 2017): train = the first
`num_classes * 20` nodes (the rows of `y`), val = the next 500, test = `test.index`.
The graph is made undirected with self-loops and duplicate edges dropped. Features stay
raw (binary bag of words); `row_normalize` gives the usual normalised variant.

Every file is checked against a SHA-256 digest built into the package before it is
unpickled (PubMed has none here and is read unverified, with a warning), and unpickling
only admits the few NumPy/SciPy classes these files use.
"""

from __future__ import annotations

import collections
import hashlib
import os
import pickle
import sys
import urllib.error
import urllib.request
import warnings
from pathlib import Path

import numpy as np
import scipy.sparse
from tqdm import tqdm

from zerognn_jax._src.data.cache_dirs import cache_dir
from zerognn_jax._src.data.checks import LibraryWarning
from zerognn_jax._src.data.dataset import Dataset, make_dataset
from zerognn_jax._src.data.graph import from_edge_list
from zerognn_jax._src.data.storage import atomic_write

NAMES = ("cora", "citeseer", "pubmed")
_PARTS = ("x", "y", "tx", "ty", "allx", "ally", "graph", "test.index")
DEFAULT_URL = "https://raw.githubusercontent.com/kimiyoung/planetoid/master/data"
URL_ENV = "ZEROGNN_PLANETOID_URL"
_NUM_VAL = 500
_CHUNK = 1 << 16

# SHA-256 of the published files (identical to the copies in tkipf/gcn, gcn/data).
SHA256 = {
    "ind.citeseer.allx": "2ac30345d95c9ec933a817ee0bdd6a5f077f8c184a20e696910192d534414668",
    "ind.citeseer.ally": "f704b2d986dde6c2669934de1f3ae5696a6cf9455c0f6b2646a2d135ea0a1c95",
    "ind.citeseer.graph": "d79a4ef9d3e7169aee8946145f6b7306e35bc79bffad26346cfb94e10e9912a7",
    "ind.citeseer.test.index": "2af990671580b6b2df5d158d1038f8292e30c9cd821b5453f399659b25b723d4",
    "ind.citeseer.tx": "539a8906a2da97628d212f2fdd668c109a8b3f0d36574b59e5d3fd5b5303da21",
    "ind.citeseer.ty": "55e5bd1ba1e733a04598753ad1a8d57957f4b8f89e74519f41f4f4938767e4ce",
    "ind.citeseer.x": "d20de19150741e555de0ed037195630fc194114ebc7fd72ced62810148aa22f6",
    "ind.citeseer.y": "8ba87e515d8e3ee3cf52f6d2c5b86aa73f11ecad825a808455209ec26cd54924",
    "ind.cora.allx": "9419ba2f26f5c35243db64aba110e0f35a04851609e0dc5433450676ca6b8543",
    "ind.cora.ally": "2b998f5cc7fedc86e7f97ca2498f47a1ffc1462c29e2d578b23bf3f62b6e7d71",
    "ind.cora.graph": "58f13302f39dde8852dad6fe6d15b89b077b6d7f837626bce671ef80344b383d",
    "ind.cora.test.index": "297ce89af2b51a6a194181c7dbe1796c6a1cf9cd9349a88383b1b1e227867875",
    "ind.cora.tx": "b9afbaa4a400df991f6f02ef677e1e44da55ffc04801fd02f9e673987829226a",
    "ind.cora.ty": "41f5ac76596a1699cc33f53084a2419e92961c42bb75f36fc38e616d348532ad",
    "ind.cora.x": "23cfa55d91c6f624233f5eb7b6e3f141f1bd2b2ae39608a63cf5d084bb27baab",
    "ind.cora.y": "94465c14eb53e04ca262198dcbb2521ee8af60fb3f3d546cd6ca24a511b0e7d1",
}

# The only globals the Planetoid pickles reference (module names as Python 2 wrote them).
_ALLOWED_GLOBALS = {
    ("numpy", "dtype"): np.dtype,
    ("numpy", "ndarray"): np.ndarray,
    ("numpy.core.multiarray", "_reconstruct"): np.ndarray.__reduce__(np.zeros(0))[0],
    ("scipy.sparse.csr", "csr_matrix"): scipy.sparse.csr_matrix,
    ("collections", "defaultdict"): collections.defaultdict,
    ("__builtin__", "list"): list,
}


def default_root() -> Path:
    """The download cache, `cache_dir("planetoid")` (`~/.cache/zerognn-jax/planetoid`
    without `$XDG_CACHE_HOME`); `~/.cache/zerognn/planetoid`, where versions before
    2026-12-06 downloaded to, while it is there and the other is not."""
    root, before = cache_dir("planetoid"), Path.home() / ".cache" / "zerognn" / "planetoid"
    return before if before.is_dir() and not root.is_dir() else root


def row_normalize(features: np.ndarray, *, what: str = "features",
                  first_row: int = 0, default_for: str | None = None) -> np.ndarray:
    """float32[N, d] -> float32[N, d]: each row divided by its sum; all-zero rows stay zero.

    Raises:
      ValueError: a negative value, naming `what` and its row (counted from `first_row`,
        for a table normalised block by block) and column, and the dataset whose name
        turned the option on where it was left unset (`default_for`). Dividing by the
        sum is for counts and bags of words: a row with negative entries can sum to
        about zero or below it, flipping or blowing up its values.
    """
    features = np.asarray(features, np.float32)
    if features.size and features.min() < 0:
        row, col = np.unravel_index(int(np.argmin(features)), features.shape)
        option = ("normalize_features" if default_for is None else
                  f"normalize_features, on by default for a dataset named {default_for!r} "
                  f"as Planetoid's is,")
        raise ValueError(f"{option} divides each row of the {what} by its sum, "
                         f"which needs values >= 0 (counts, bags of words); found "
                         f"{features[row, col]:g} at row {first_row + row}, column {col}: "
                         f"set normalize_features to False, or shift or scale the {what} "
                         f"yourself")
    sums = features.sum(axis=1, keepdims=True)
    return features / np.where(sums == 0, 1, sums)


def load_planetoid(
    name: str, root: str | os.PathLike | None = None, *, download: bool = False,
    base_url: str | None = None,
) -> Dataset:
    """Loads Cora, CiteSeer or PubMed from the Planetoid files in `root`.

    Args:
      name: "cora", "citeseer" or "pubmed" (any case).
      root: folder holding the `ind.<name>.*` files; default `default_root()`.
      download: fetch missing files from `base_url` into `root` first.
      base_url: where to download from; default `$ZEROGNN_PLANETOID_URL`, else the data/
        folder of the kimiyoung/planetoid repository.

    Raises:
      ValueError: unknown name, or a file whose checksum differs from the built-in one.
      FileNotFoundError: a file is missing and `download` is False.
      NotADirectoryError: `root` is a file.
    """
    name = name.lower()
    if name not in NAMES:
        raise ValueError(f"unknown Planetoid dataset {name!r}; expected one of {NAMES}")
    root_flag = "" if root is None else f" --root {root}"
    root = Path(root) if root is not None else default_root()
    if root.exists() and not root.is_dir():  # (its files were reported missing)
        raise NotADirectoryError(f"root {root} is a file, not the folder of the "
                                 f"ind.{name}.* files")
    paths = {part: root / f"ind.{name}.{part}" for part in _PARTS}
    missing = [p for p in paths.values() if not p.is_file()]
    if missing and download:
        url = base_url or os.environ.get(URL_ENV) or DEFAULT_URL
        for path in missing:
            _download(f"{url.rstrip('/')}/{path.name}", path)
    elif missing:
        raise FileNotFoundError(
            f"Planetoid file {missing[0]} not found ({len(missing)} of 8 missing); "
            f"fetch them with `zerognn data info {name}{root_flag} --download` (Python: "
            "load_dataset(..., download=True)), or point --root at a folder that holds them"
        )
    for path in paths.values():
        verify(path, f"; the file is damaged or another: remove it and fetch it again with "
                     f"`zerognn data info {name}{root_flag} --download` (Python: "
                     f"load_dataset(..., download=True))")
    objs = {part: _unpickle(path) for part, path in paths.items() if part != "test.index"}
    test_index = np.loadtxt(paths["test.index"], dtype=np.int64, ndmin=1)
    return _assemble(name, objs, test_index)


def verify(path: Path, hint: str = "") -> None:
    """Checks `path` against its built-in SHA-256; raises ValueError on a mismatch, its
    message ended by `hint`."""
    expected = SHA256.get(path.name)
    if expected is None:
        warnings.warn(f"no built-in checksum for {path.name}; reading it unverified",
                      LibraryWarning, stacklevel=3)
        return
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            digest.update(chunk)
    _check_digest(path, expected, digest.hexdigest(), hint)


def _check_digest(path: Path, expected: str, actual: str, hint: str = "") -> None:
    if actual != expected:
        raise ValueError(
            f"checksum mismatch for {path}: expected sha256 {expected}, got {actual}{hint}"
        )


def _download(url: str, dest: Path) -> None:
    """Streams `url` into `dest` atomically, checking the digest before the rename."""
    expected = SHA256.get(dest.name)
    digest = hashlib.sha256()
    try:
        response = urllib.request.urlopen(url, timeout=60)
    except urllib.error.URLError as err:
        raise ConnectionError(f"cannot download {url}: {err}") from err
    with response, atomic_write(dest) as out:
        total = int(response.headers.get("Content-Length") or 0) or None
        with _progress(dest.name, total) as bar:
            while chunk := response.read(_CHUNK):
                digest.update(chunk)
                out.write(chunk)
                bar.update(len(chunk))
        if expected is not None:
            _check_digest(dest, expected, digest.hexdigest())


def _progress(label: str, total: int | None):
    """A tqdm byte counter, drawn only when stderr is a terminal."""
    return tqdm(total=total, desc=label, unit="B", unit_scale=True, leave=False,
                disable=not sys.stderr.isatty())


class _RestrictedUnpickler(pickle.Unpickler):
    def find_class(self, module, name):
        try:
            return _ALLOWED_GLOBALS[(module, name)]
        except KeyError:
            raise pickle.UnpicklingError(
                f"Planetoid file refers to {module}.{name}, which is not allowed"
            ) from None


def _unpickle(path: Path):
    with open(path, "rb") as f:
        try:
            return _RestrictedUnpickler(f, encoding="latin1").load()
        except (pickle.UnpicklingError, EOFError, ValueError) as err:
            raise ValueError(f"cannot read Planetoid file {path}: {err}") from err


def _labels(onehot) -> np.ndarray:
    """int64[rows] from one-hot rows; an all-zero row gives -1."""
    onehot = np.asarray(onehot)
    return np.where(onehot.any(axis=1), onehot.argmax(axis=1), -1)


def _assemble(name: str, objs: dict, test_index: np.ndarray) -> Dataset:
    allx, tx = objs["allx"], objs["tx"]
    graph = objs["graph"]
    n = max(allx.shape[0], int(test_index.max()) + 1, max(graph) + 1)
    features = np.zeros((n, allx.shape[1]), np.float32)
    features[: allx.shape[0]] = allx.toarray()
    features[test_index] = tx.toarray()
    labels = np.full(n, -1, np.int64)
    labels[: allx.shape[0]] = _labels(objs["ally"])
    labels[test_index] = _labels(objs["ty"])
    src = np.repeat(np.fromiter(graph.keys(), np.int64), [len(v) for v in graph.values()])
    dst = np.fromiter((d for nbrs in graph.values() for d in nbrs), np.int64, src.size)
    g = from_edge_list(src, dst, n, make_undirected=True, remove_self_loops=True,
                       remove_duplicates=True)
    num_train = objs["y"].shape[0]
    return make_dataset(
        name, g.indptr, g.indices, features, labels,
        train_idx=np.arange(num_train),
        val_idx=np.arange(num_train, num_train + _NUM_VAL),
        test_idx=np.sort(test_index),
        num_classes=np.asarray(objs["ally"]).shape[1],
    )
