"""OGB node-property datasets read from OGB's own on-disk layout, without the ogb package.

Expected layout under `root` (what the ogb package leaves there: its zip files unpack to
`arxiv/` and so on, which it renames to these names):

  ogbn_arxiv/, ogbn_products/ and ogbn_proteins/ (CSV, one row per line, no header):
    raw/edge.csv.gz          E rows "src,dst" (each undirected edge once for products;
                             arxiv citations are directed)
    raw/node-feat.csv.gz     N rows of d floats (proteins: absent)
    raw/node-label.csv.gz    N rows of one class id (proteins: 112 binary targets)
    raw/num-node-list.csv.gz one row: N
    raw/edge-feat.csv.gz     proteins: E rows of 8 floats, row i for edge i
  ogbn_papers100M/ (NumPy):
    raw/data.npz             edge_index int64[2, E], node_feat float[N, d],
                             num_nodes_list int64[1] (plus num_edges_list, node_year)
    raw/node-label.npz       node_label float[N, 1], NaN for unlabelled papers
  every dataset:
    split/<split>/{train,valid,test}.csv.gz   node ids, one per line
    (<split> = "time" for arxiv and papers100M, "sales_ranking" for products, "species"
    for proteins)

Graphs are made undirected (as OGB's examples do for arxiv) with self-loops and duplicate
edges dropped; NaN labels become -1.

ogbn-proteins lists each undirected edge once; OGB's reader (`add_inverse_edge` in its
master table) puts the reverse right after each edge with a copy of its features and
drops nothing. Here both directions share the row too, in sorted CSR order; a loop or a
repeated pair (either way round), if the files hold any, is dropped, the first listing
kept. Its 112 binary targets become float targets ("multilabel"); it has no node
features, so every node gets the constant feature 1.0 (OGB's examples average each
node's incident edge features instead: `graph.mean_edge_features`). The species of each
node (raw/node_species.csv.gz) is not read: the split files already encode it.

papers100M (1.6B citations, 3.2B directed edges once symmetrised: uint32 offsets) is
streamed, not loaded: `write_binary` reads each member of data.npz once, straight from
the zip stream in blocks (a compressed member cannot be memory-mapped), into a dataset
directory (storage.py): the features into their memory-mapped file in the requested
dtype, the edges into a temporary int32 file, from which the CSR is built with a
counting sort in edge blocks and then sorted and deduplicated in row blocks. Host memory
stays at a few node-sized arrays plus one block; the directory is what `load_ogb` then
memory-maps.
"""

from __future__ import annotations

import dataclasses
import gzip
import os
import shutil
import tempfile
import warnings
import zipfile
import zlib
from pathlib import Path

import numpy as np

from zerognn_jax._src.data import storage
from zerognn_jax._src.data.dataset import BFLOAT16, Dataset, make_dataset
from zerognn_jax._src.data.graph import offset_dtype
from zerognn_jax._src.data.undirected import undirected_csr
from zerognn_jax._src.data.writes import open_filled

PROTEIN_EDGE_FEATURES = 8  # the columns of ogbn-proteins' edge-feat.csv.gz
_BLOCK = 1 << 25  # entries (edges, feature values) read, sorted or written at a time


@dataclasses.dataclass(frozen=True)
class _Spec:
    folder: str
    split: str
    num_classes: int
    binary: bool
    targets: str = "classes"  # or "multilabel": [N, num_classes] binary float targets


SPECS = {
    "ogbn-arxiv": _Spec("ogbn_arxiv", "time", 40, binary=False),
    "ogbn-products": _Spec("ogbn_products", "sales_ranking", 47, binary=False),
    "ogbn-papers100M": _Spec("ogbn_papers100M", "time", 172, binary=True),
    "ogbn-proteins": _Spec("ogbn_proteins", "species", 112, binary=False,
                           targets="multilabel"),
}


def dataset_folder(name: str, root: str | os.PathLike) -> Path:
    """`<root>/ogbn_<name>`, the folder the ogb package keeps dataset `name` in."""
    return Path(root) / SPECS[name].folder


def load_ogb(name: str, root: str | os.PathLike) -> Dataset:
    """Reads OGB dataset `name` ("ogbn-arxiv", "ogbn-products", "ogbn-papers100M",
    "ogbn-proteins").

    Raises:
      FileNotFoundError: a file of the layout above is missing (the message names it).
      ValueError: unknown name, or arrays inconsistent with each other.
    """
    if name not in SPECS:
        raise ValueError(f"unknown OGB dataset {name!r}; expected one of {sorted(SPECS)}")
    spec = SPECS[name]
    folder = dataset_folder(name, root)
    if spec.binary:
        return _load_converted(name, root)
    raw = folder / "raw"
    if spec.targets == "multilabel":
        return _read_multilabel(name, folder, spec)
    src, dst, features, labels = _read_csv_graph(raw)
    if features.shape[0] != labels.shape[0]:
        raise ValueError(
            f"{raw}: node features have {features.shape[0]} rows, labels {labels.shape[0]}"
        )
    graph = undirected_csr(src, dst, features.shape[0])
    split = {part: _read_ids(folder / "split" / spec.split / f"{part}.csv.gz")
             for part in ("train", "valid", "test")}
    return _named(folder, lambda: make_dataset(
        name, graph.indptr, graph.indices, features, labels, split["train"], split["valid"],
        split["test"], spec.num_classes,
    ))


def _named(folder: Path, make):
    """`make()`, whose ValueError (a value the dataset refuses: a label, a split id, a
    NaN) names the folder whose files held it (the dataset's, for a check of raw and
    split files together)."""
    try:
        return make()
    except ValueError as err:
        raise ValueError(f"{folder} holds an invalid dataset: {err}") from err


def _require(path: Path) -> Path:
    if not path.is_file():
        raise FileNotFoundError(f"OGB file {path} not found (the layout the ogb package "
                                f"leaves, in docs/datasets.md: a zip unpacked by hand, to "
                                f"arxiv/ say, is renamed ogbn_arxiv/)")
    return path


def read_gz(path: Path, read):
    """`read(f)` of the gzipped text file `path`; ValueError naming the file where it
    cannot be read (not gzip, cut short, text that is not what `read` parses)."""
    _require(path)
    try:
        with gzip.open(path, "rt") as f:
            return read(f)
    except (OSError, EOFError, ValueError, UnicodeDecodeError) as err:
        raise ValueError(f"{path} is not a readable OGB file: {err}") from err


def _loadtxt(f, dtype) -> np.ndarray:
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "loadtxt: input contained no data")  # empty split
        return np.loadtxt(f, delimiter=",", dtype=dtype, ndmin=2)


def _load_text(path: Path, dtype, columns: int | None = None) -> np.ndarray:
    """[rows, cols] array from a gzipped headerless CSV; with `columns`, ValueError
    unless it has that many (an empty file gives [0, columns])."""
    table = read_gz(path, lambda f: _loadtxt(f, dtype))
    if columns is None:
        return table
    if not table.size:
        return np.zeros((0, columns), table.dtype)
    if table.shape[1] != columns:
        raise ValueError(f"{path} has {table.shape[1]} columns, expected {columns}")
    return table


def _read_ids(path: Path) -> np.ndarray:
    """int64[n] from a file of one whole number a line (a line of two is refused)."""
    return _load_text(path, np.int64, columns=1).reshape(-1)


def _check_ends(edges: np.ndarray, num_nodes: int, path: Path) -> None:
    """ValueError naming `path` where an edge's end (int[E, 2]) is not a node id."""
    if edges.size and (edges.min() < 0 or edges.max() >= num_nodes):
        raise ValueError(f"{path}: edge ends span [{int(edges.min())}, {int(edges.max())}], "
                         f"outside the {num_nodes} nodes [0, {num_nodes})")


def _as_labels(values: np.ndarray, where: Path) -> np.ndarray:
    """int64[N] class ids from a [N] or [N, 1] array (read from `where`); NaN -> -1;
    ValueError for a fractional one, or for a second column (it read as twice the rows)."""
    values = np.asarray(values)
    if values.ndim > 2 or (values.ndim == 2 and values.shape[1] != 1):
        raise ValueError(f"{where} has {values.shape[1:]} values a row, expected one class "
                         f"id a node")
    values = values.reshape(-1)
    if np.issubdtype(values.dtype, np.floating):
        known = values[~np.isnan(values)]
        odd = known[known != np.round(known)]
        if odd.size:
            raise ValueError(f"{where} has a class id that is not a whole number: {odd[0]}")
        return np.where(np.isnan(values), -1, values).astype(np.int64)
    return values.astype(np.int64)


def _read_csv_graph(raw: Path):
    """(src, dst, features, labels) of a CSV-layout dataset."""
    edges = _load_text(raw / "edge.csv.gz", np.int64, columns=2)
    features = _load_text(raw / "node-feat.csv.gz", np.float32)
    labels = _as_labels(_load_text(raw / "node-label.csv.gz", np.float64),
                        raw / "node-label.csv.gz")
    num_nodes = int(_load_text(raw / "num-node-list.csv.gz", np.int64).sum())
    if features.shape[0] != num_nodes:
        raise ValueError(
            f"{raw}: num-node-list says {num_nodes} nodes, node-feat has {features.shape[0]} rows"
        )
    _check_ends(edges, num_nodes, raw / "edge.csv.gz")
    return edges[:, 0], edges[:, 1], features, labels


def _read_multilabel(name: str, folder: Path, spec: _Spec) -> Dataset:
    """A CSV-layout dataset with binary float targets and edge features (ogbn-proteins)."""
    raw = folder / "raw"
    edges = _load_text(raw / "edge.csv.gz", np.int64, columns=2)
    table = _load_text(raw / "edge-feat.csv.gz", np.float32, columns=PROTEIN_EDGE_FEATURES)
    targets = _load_text(raw / "node-label.csv.gz", np.float32)
    num_nodes = int(_load_text(raw / "num-node-list.csv.gz", np.int64).sum())
    _check_ends(edges, num_nodes, raw / "edge.csv.gz")
    if table.shape[0] != edges.shape[0]:
        raise ValueError(f"{raw}: edge.csv.gz has {edges.shape[0]} edges, edge-feat.csv.gz "
                         f"{table.shape[0]} rows")
    if targets.shape != (num_nodes, spec.num_classes):
        raise ValueError(f"{raw}: node-label.csv.gz is {list(targets.shape)}, expected "
                         f"[{num_nodes}, {spec.num_classes}] (num-node-list says {num_nodes})")
    graph = _named(raw, lambda: undirected_csr(edges[:, 0], edges[:, 1], num_nodes,
                                               edge_features=table))
    split = {part: _read_ids(folder / "split" / spec.split / f"{part}.csv.gz")
             for part in ("train", "valid", "test")}
    return _named(folder, lambda: make_dataset(
        name, graph.indptr, graph.indices, np.ones((num_nodes, 1), np.float32), None,
        split["train"], split["valid"], split["test"], spec.num_classes, targets=targets,
        target_kind="multilabel", edge_features=graph.edge_features))


def _load_converted(name: str, root: str | os.PathLike) -> Dataset:
    """A binary-layout dataset written into its dataset directory and read back from it;
    one that does not validate (labels past the classes, NaN features, ...) is removed
    and named by the dataset's folder, whose raw and split files hold what the error is
    about."""
    path = write_binary(name, root, processed_dir(name, root))
    try:
        return storage.load_dir(path)
    except ValueError as err:
        shutil.rmtree(path, ignore_errors=True)
        raise ValueError(f"{dataset_folder(name, root)} holds an invalid dataset: "
                         f"{err.__cause__ or err}") from err


def processed_dir(name: str, root: str | os.PathLike) -> Path:
    """The dataset directory a binary-layout dataset is converted into."""
    return dataset_folder(name, root) / "processed" / "zerognn"


def write_binary(name: str, root: str | os.PathLike, path: str | os.PathLike, *,
                 feature_dtype="float32") -> Path:
    """Converts a binary-layout (npz) OGB dataset into the dataset directory `path`,
    features in `feature_dtype` ("float32" or "bfloat16"); see the module docstring.

    Raises:
      FileNotFoundError: a file of the layout is missing.
      ValueError: a key is missing, or the arrays disagree on the number of nodes.
    """
    spec = SPECS[name]
    folder = dataset_folder(name, root)
    raw = folder / "raw"
    data_npz = _require(raw / "data.npz")
    path = Path(path)
    try:
        _write_binary(spec, name, folder, data_npz, path, feature_dtype)
    except (zipfile.BadZipFile, EOFError, zlib.error) as err:  # cut short, or not a zip
        raise ValueError(f"{data_npz} is not a readable OGB archive: {err}") from err
    return path


def _write_binary(spec: _Spec, name: str, folder: Path, data_npz: Path, path: Path,
                  feature_dtype) -> None:
    raw = folder / "raw"
    # the inputs checked, and the small ones read, before the writer opens: a missing
    # one is no failed write
    with zipfile.ZipFile(data_npz) as zf:
        missing = [k for k in ("edge_index", "node_feat", "num_nodes_list")
                   if f"{k}.npy" not in zf.namelist()]
        if missing:
            raise ValueError(f"{data_npz} lacks key(s) {', '.join(missing)}; has "
                             f"{[n.removesuffix('.npy') for n in zf.namelist()]}")
    (labels,) = _npz_arrays(raw / "node-label.npz", "node_label")
    labels = _as_labels(labels, raw / "node-label.npz")
    split = {part: _read_ids(folder / "split" / spec.split / f"{part}.csv.gz")
             for part in ("train", "valid", "test")}
    with zipfile.ZipFile(data_npz) as zf, storage.write_dir(path, name, spec.num_classes,
                                                              overwrite=True) as out, \
            tempfile.TemporaryDirectory(dir=path.parent, prefix=".edges.") as tmp:
        stream, member = _member(zf, "num_nodes_list", data_npz)
        with stream:
            num_nodes = int(np.sum(member.read_all()))
        if labels.shape[0] != num_nodes:
            raise ValueError(f"{raw}: node-label has {labels.shape[0]} rows, num_nodes_list "
                             f"says {num_nodes} nodes")
        _stream_features(zf, data_npz, out, num_nodes, _feature_dtype(feature_dtype))
        src, dst = _stream_edges(zf, data_npz, Path(tmp), num_nodes)
        _write_csr(out, src, dst, num_nodes, Path(tmp))
        out.put("labels", labels.astype(np.int32))
        for key, part in (("train_idx", "train"), ("val_idx", "valid"), ("test_idx", "test")):
            out.put(key, split[part].astype(np.int32))


def _feature_dtype(name) -> np.dtype:
    if str(name) not in ("float32", "bfloat16"):
        raise ValueError(f"feature_dtype must be float32 or bfloat16, got {name!r}")
    return BFLOAT16 if str(name) == "bfloat16" else np.dtype(np.float32)


class _Member:
    """An .npy member of an open zip: its header, then its data read in order, once."""

    def __init__(self, stream, shape, dtype, fortran: bool, where: str):
        self.stream, self.shape, self.dtype, self.where = stream, shape, dtype, where
        if fortran:
            raise ValueError(f"{where}: Fortran-ordered arrays are not supported")

    def read(self, count: int) -> np.ndarray:
        nbytes = count * self.dtype.itemsize
        buf = self.stream.read(nbytes)
        if len(buf) != nbytes:
            raise ValueError(f"{self.where}: the array ends early")
        return np.frombuffer(buf, self.dtype)

    def read_all(self) -> np.ndarray:
        return self.read(int(np.prod(self.shape))).reshape(self.shape)


def _member(zf: zipfile.ZipFile, key: str, where: Path):
    stream = zf.open(f"{key}.npy")
    try:
        version = np.lib.format.read_magic(stream)
        read_header = (np.lib.format.read_array_header_1_0 if version == (1, 0)
                       else np.lib.format.read_array_header_2_0)
        shape, fortran, dtype = read_header(stream)
        if np.dtype(dtype).hasobject:
            raise ValueError(f"it holds Python objects ({dtype}), not numbers")
    except ValueError as err:
        stream.close()
        raise ValueError(f"{where}:{key} is not a readable array: {err}") from err
    return stream, _Member(stream, shape, np.dtype(dtype), fortran, f"{where}:{key}")


def _stream_features(zf, where: Path, out, num_nodes: int, dtype: np.dtype) -> None:
    stream, member = _member(zf, "node_feat", where)
    with stream:
        if len(member.shape) != 2 or member.shape[0] != num_nodes:
            raise ValueError(f"{where}: num_nodes_list says {num_nodes} nodes, node_feat has "
                             f"shape {member.shape}")
        n, d = member.shape
        dest = out.array("features", (n, d), dtype)
        rows = max(1, _BLOCK // max(d, 1))
        for start in range(0, n, rows):
            stop = min(n, start + rows)
            dest[start:stop] = member.read((stop - start) * d).reshape(-1, d).astype(dtype)
        dest.flush()


def _stream_edges(zf, where: Path, tmp: Path, num_nodes: int):
    """int32 memmaps (src, dst) of edge_index [2, E], each row streamed in blocks."""
    stream, member = _member(zf, "edge_index", where)
    with stream:
        if len(member.shape) != 2 or member.shape[0] != 2:
            raise ValueError(f"{where}: edge_index must be [2, E], got {member.shape}")
        num_edges = member.shape[1]
        ends = []
        for name in ("src", "dst"):
            dest = open_filled(tmp / f"{name}.npy", np.int32, (num_edges,))
            for start in range(0, num_edges, _BLOCK):
                ids = member.read(min(_BLOCK, num_edges - start))
                if ids.size and (ids.min() < 0 or ids.max() >= num_nodes):
                    raise ValueError(f"{where}: edge_index {name} ids span [{int(ids.min())}, "
                                     f"{int(ids.max())}], outside [0, {num_nodes})")
                dest[start:start + ids.size] = ids
            ends.append(dest)
    return ends


def _write_csr(out, src, dst, n: int, tmp: Path) -> None:
    """The symmetric CSR of edges (src, dst) without loops or duplicates, rows sorted:
    counting sort into a temporary file, then each row block sorted and deduplicated."""
    blocks = [(a, min(a + _BLOCK, src.shape[0])) for a in range(0, src.shape[0], _BLOCK)]
    degree = np.zeros(n, np.int64)
    for a, b in blocks:
        s, d = src[a:b], dst[a:b]
        keep = s != d
        degree += np.bincount(s[keep], minlength=n) + np.bincount(d[keep], minlength=n)
    first = np.concatenate([[0], np.cumsum(degree)])
    raw = open_filled(tmp / "raw.npy", np.int32, (int(first[-1]),))
    cursor = first[:-1].copy()
    for a, b in blocks:
        s, d = src[a:b], dst[a:b]
        keep = s != d
        rows, cols = np.concatenate([s[keep], d[keep]]), np.concatenate([d[keep], s[keep]])
        order = np.argsort(rows, kind="stable")
        rows, cols = rows[order], cols[order]
        counts = np.bincount(rows, minlength=n)
        starts = np.cumsum(counts) - counts  # each row's first position within the block
        raw[cursor[rows] + np.arange(rows.size) - starts[rows]] = cols
        cursor += counts
    del cursor
    kept = open_filled(tmp / "kept.npy", np.int32, (raw.shape[0],))
    new_degree, total = np.zeros(n, np.int64), 0
    for lo, hi in _row_blocks(first, n):
        seg = raw[first[lo]:first[hi]].astype(np.int64)
        local = np.repeat(np.arange(hi - lo), degree[lo:hi])
        key = np.sort(local * n + seg)
        key = key[np.concatenate([[True], key[1:] != key[:-1]])[:key.size]]
        kept[total:total + key.size] = key % n
        new_degree[lo:hi] = np.bincount(key // n, minlength=hi - lo)
        total += key.size
    ptr = out.array("indptr", (n + 1,), offset_dtype(total))
    ptr[0] = 0
    ptr[1:] = np.cumsum(new_degree)
    indices = out.array("indices", (total,), np.int32)
    for a in range(0, total, _BLOCK):
        indices[a:a + _BLOCK] = kept[a:min(total, a + _BLOCK)]
    ptr.flush()
    indices.flush()


def _row_blocks(first: np.ndarray, n: int):
    """Consecutive row ranges [lo, hi) of about `_BLOCK` entries (at least one row each)."""
    lo = 0
    while lo < n:
        hi = int(np.searchsorted(first, first[lo] + _BLOCK, side="right")) - 1
        hi = min(n, max(hi, lo + 1))
        yield lo, hi
        lo = hi


def _npz_arrays(path: Path, *keys: str) -> list[np.ndarray]:
    try:
        with np.load(_require(path), allow_pickle=False) as data:
            missing = [k for k in keys if k not in data.files]
            if not missing:
                return [data[k] for k in keys]
            files = data.files
    except (zipfile.BadZipFile, EOFError, zlib.error, ValueError) as err:
        raise ValueError(f"{path} is not a readable .npz file: {err}") from err
    raise ValueError(f"{path} lacks key(s) {', '.join(missing)}; has {files}")
