"""OGB node-property datasets read from OGB's own on-disk layout, without the ogb package.

Expected layout under `root` (what OGB's download unpacks to):

  ogbn_arxiv/ and ogbn_products/ (CSV, one row per line, no header):
    raw/edge.csv.gz          E rows "src,dst" (each undirected edge once for products;
                             arxiv citations are directed)
    raw/node-feat.csv.gz     N rows of d floats
    raw/node-label.csv.gz    N rows of one class id
    raw/num-node-list.csv.gz one row: N
  ogbn_papers100M/ (NumPy):
    raw/data.npz             edge_index int64[2, E], node_feat float[N, d],
                             num_nodes_list int64[1] (plus num_edges_list, node_year)
    raw/node-label.npz       node_label float[N, 1], NaN for unlabelled papers
  every dataset:
    split/<split>/{train,valid,test}.csv.gz   node ids, one per line
    (<split> = "time" for arxiv and papers100M, "sales_ranking" for products)

Graphs are made undirected (as OGB's examples do for arxiv) with self-loops and duplicate
edges dropped; NaN labels become -1. The full papers100M graph has more than 2**31
directed edges once symmetrised: it needs `jax_enable_x64` and a large-memory host.
"""

from __future__ import annotations

import dataclasses
import gzip
import os
import warnings
from pathlib import Path

import numpy as np

from zerognn_jax._src.data.dataset import Dataset, make_dataset
from zerognn_jax._src.data.undirected import undirected_csr


@dataclasses.dataclass(frozen=True)
class _Spec:
    folder: str
    split: str
    num_classes: int
    binary: bool


SPECS = {
    "ogbn-arxiv": _Spec("ogbn_arxiv", "time", 40, binary=False),
    "ogbn-products": _Spec("ogbn_products", "sales_ranking", 47, binary=False),
    "ogbn-papers100M": _Spec("ogbn_papers100M", "time", 172, binary=True),
}


def dataset_folder(name: str, root: str | os.PathLike) -> Path:
    """`<root>/ogbn_<name>`, the folder OGB unpacks dataset `name` into."""
    return Path(root) / SPECS[name].folder


def load_ogb(name: str, root: str | os.PathLike) -> Dataset:
    """Reads OGB dataset `name` ("ogbn-arxiv", "ogbn-products", "ogbn-papers100M").

    Raises:
      FileNotFoundError: a file of the layout above is missing (the message names it).
      ValueError: unknown name, or arrays inconsistent with each other.
    """
    if name not in SPECS:
        raise ValueError(f"unknown OGB dataset {name!r}; expected one of {sorted(SPECS)}")
    spec = SPECS[name]
    folder = dataset_folder(name, root)
    raw = folder / "raw"
    read = _read_binary if spec.binary else _read_csv_graph
    src, dst, features, labels = read(raw)
    if features.shape[0] != labels.shape[0]:
        raise ValueError(
            f"{raw}: node features have {features.shape[0]} rows, labels {labels.shape[0]}"
        )
    graph = undirected_csr(src, dst, features.shape[0])
    split = {part: _read_ids(folder / "split" / spec.split / f"{part}.csv.gz")
             for part in ("train", "valid", "test")}
    return make_dataset(
        name, graph.indptr, graph.indices, features, labels, split["train"], split["valid"],
        split["test"], spec.num_classes,
    )


def _require(path: Path) -> Path:
    if not path.is_file():
        raise FileNotFoundError(f"OGB file {path} not found (see the layout in docs/datasets.md)")
    return path


def _load_text(path: Path, dtype) -> np.ndarray:
    """[rows, cols] array from a gzipped headerless CSV."""
    with gzip.open(_require(path), "rt") as f, warnings.catch_warnings():
        warnings.filterwarnings("ignore", "loadtxt: input contained no data")  # empty split
        return np.loadtxt(f, delimiter=",", dtype=dtype, ndmin=2)


def _read_ids(path: Path) -> np.ndarray:
    return _load_text(path, np.int64).reshape(-1)


def _as_labels(values: np.ndarray) -> np.ndarray:
    """int64[N] class ids from a [N] or [N, 1] array; NaN -> -1."""
    values = np.asarray(values).reshape(-1)
    if np.issubdtype(values.dtype, np.floating):
        return np.where(np.isnan(values), -1, values).astype(np.int64)
    return values.astype(np.int64)


def _read_csv_graph(raw: Path):
    """(src, dst, features, labels) of a CSV-layout dataset."""
    edges = _load_text(raw / "edge.csv.gz", np.int64)
    features = _load_text(raw / "node-feat.csv.gz", np.float32)
    labels = _as_labels(_load_text(raw / "node-label.csv.gz", np.float64))
    num_nodes = int(_load_text(raw / "num-node-list.csv.gz", np.int64).sum())
    if features.shape[0] != num_nodes:
        raise ValueError(
            f"{raw}: num-node-list says {num_nodes} nodes, node-feat has {features.shape[0]} rows"
        )
    return edges[:, 0], edges[:, 1], features, labels


def _read_binary(raw: Path):
    """(src, dst, features, labels) of the npz layout (papers100M)."""
    edge_index, features, num_nodes_list = _npz_arrays(
        raw / "data.npz", "edge_index", "node_feat", "num_nodes_list")
    (labels,) = _npz_arrays(raw / "node-label.npz", "node_label")
    labels, num_nodes = _as_labels(labels), int(np.sum(num_nodes_list))
    if edge_index.ndim != 2 or edge_index.shape[0] != 2:
        raise ValueError(f"{raw}/data.npz: edge_index must be [2, E], got {edge_index.shape}")
    if features.shape[0] != num_nodes:
        raise ValueError(
            f"{raw}/data.npz: num_nodes_list says {num_nodes} nodes, node_feat has "
            f"{features.shape[0]} rows"
        )
    return edge_index[0], edge_index[1], features, labels


def _npz_arrays(path: Path, *keys: str) -> list[np.ndarray]:
    with np.load(_require(path), allow_pickle=False) as data:
        missing = [k for k in keys if k not in data.files]
        if missing:
            raise ValueError(f"{path} lacks key(s) {', '.join(missing)}; has {data.files}")
        return [data[k] for k in keys]
