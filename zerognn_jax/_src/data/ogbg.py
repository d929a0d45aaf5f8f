"""OGB's graph-property datasets (ogbg-molhiv, ogbg-molpcba) read from their folder,
without the ogb package.

Layout under `root` (what OGB unpacks; every file a headerless gzipped CSV):

  ogbg_molhiv/raw/num-node-list.csv.gz   nodes of each graph, one line per graph
  ogbg_molhiv/raw/num-edge-list.csv.gz   bonds of each graph (each stored once)
  ogbg_molhiv/raw/edge.csv.gz            "u,v" per bond, ids local to its graph,
                                         graphs in order
  ogbg_molhiv/raw/node-feat.csv.gz       9 atom feature ids per node
  ogbg_molhiv/raw/edge-feat.csv.gz       3 bond feature ids per bond
  ogbg_molhiv/raw/graph-label.csv.gz     one row per graph: T labels, empty = missing
  ogbg_molhiv/split/scaffold/{train,valid,test}.csv.gz   graph ids

As OGB does for molecules (`add_inverse_edge`), every bond becomes two directed edges,
(u, v) then (v, u), both with the bond's features. The parsed collection is cached as
`<folder>/processed/zerognn-graphs.npz`, reused while it is newer than the raw files.
"""

from __future__ import annotations

import dataclasses
import io
import os
import re
from pathlib import Path

import numpy as np

from zerognn_jax._src.data.announce import Log, announced
from zerognn_jax._src.data.graph_storage import load_graphs_file, save_graphs
from zerognn_jax._src.data.graphs import GraphCollection, make_collection
from zerognn_jax._src.data.ogb import _load_text, _loadtxt, _read_ids, read_gz
from zerognn_jax._src.data.writes import keep_cache, parse_into_cache, read_current_cache

# OGB's vocabulary sizes (ogb/utils/features.py: get_atom_feature_dims and
# get_bond_feature_dims): atomic number, chirality, degree, formal charge, Hs,
# radical electrons, hybridisation, aromatic, in ring; bond type, stereo, conjugated.
ATOM_VOCAB = (119, 5, 12, 12, 10, 6, 6, 2, 2)
BOND_VOCAB = (5, 6, 2)
# a field with nothing (or blanks) in it: after a line's start or a comma, before a comma
# or the line's end
_EMPTY_FIELD = re.compile(r"(?<![^,\n])[ \t]*(?=,|\n|\Z)")


@dataclasses.dataclass(frozen=True)
class GraphSpec:
    folder: str
    split: str
    tasks: int


GRAPH_SPECS = {
    "ogbg-molhiv": GraphSpec("ogbg_molhiv", "scaffold", 1),
    "ogbg-molpcba": GraphSpec("ogbg_molpcba", "scaffold", 128),
}


def _read_labels(path: Path, tasks: int, graphs: int | None = None) -> np.ndarray:
    """float32[G, tasks]; empty fields are missing labels (NaN); other text that is not
    a number is refused, naming the file (it was read as a missing label). Blank lines
    at the end are no graphs, except as many as `graphs` (the count lists') still needs:
    those are graphs of no label (a one-task file's last graph unlabelled)."""
    def parse(f) -> np.ndarray:
        lines = f.read().splitlines()
        while len(lines) > (graphs or 0) and not lines[-1].strip():
            lines.pop()
        if not lines:
            return np.zeros((0, tasks), np.float32)
        return _loadtxt(io.StringIO(_EMPTY_FIELD.sub("nan", "\n".join(lines))), np.float32)

    labels = read_gz(path, parse)
    if labels.shape[1] != tasks:
        raise ValueError(f"{path}: expected {tasks} label columns, got {labels.shape[1]}")
    return labels


def read_ogbg(name: str, root: str | os.PathLike) -> GraphCollection:
    """Parses OGB graph dataset `name` from `<root>/<folder>` (module docstring).

    Raises:
      FileNotFoundError: a file of the layout is missing (named).
      ValueError: unknown name, or files that disagree (counts named).
    """
    if name not in GRAPH_SPECS:
        raise ValueError(f"unknown OGB graph dataset {name!r}; expected one of "
                         f"{', '.join(GRAPH_SPECS)}")
    spec = GRAPH_SPECS[name]
    folder = Path(root) / spec.folder
    raw = folder / "raw"
    n_node = _read_ids(raw / "num-node-list.csv.gz")
    n_bond = _read_ids(raw / "num-edge-list.csv.gz")
    bonds = _load_text(raw / "edge.csv.gz", np.int64, columns=2)
    atoms = _load_text(raw / "node-feat.csv.gz", np.int64, columns=len(ATOM_VOCAB))
    bond_feats = _load_text(raw / "edge-feat.csv.gz", np.int64, columns=len(BOND_VOCAB))
    labels = _read_labels(raw / "graph-label.csv.gz", spec.tasks, n_node.size)
    for what, rows, want in (("edge.csv.gz", bonds.shape[0], n_bond.sum()),
                             ("edge-feat.csv.gz", bond_feats.shape[0], n_bond.sum()),
                             ("node-feat.csv.gz", atoms.shape[0], n_node.sum()),
                             ("graph-label.csv.gz", labels.shape[0], n_node.size),
                             ("num-edge-list.csv.gz", n_bond.size, n_node.size)):
        if rows != want:
            raise ValueError(f"{raw}: {what} has {rows} rows, the count lists say {want}")
    _check_bonds(raw / "edge.csv.gz", bonds, n_node, n_bond)
    both = np.empty((2 * bonds.shape[0], 2), np.int64)  # (u, v), (v, u) per bond
    both[0::2], both[1::2] = bonds, bonds[:, ::-1]
    splits = [_read_ids(folder / "split" / spec.split / f"{part}.csv.gz")
              for part in ("train", "valid", "test")]
    try:
        return make_collection(name, n_node, 2 * n_bond, both[:, 0], both[:, 1],
                               atoms.astype(np.int32), labels, "binary",
                               edge_features=np.repeat(bond_feats, 2, axis=0).astype(np.int32),
                               splits=splits, node_vocab=ATOM_VOCAB, edge_vocab=BOND_VOCAB)
    except ValueError as err:  # (the split files' ids, the features' vocabularies)
        raise ValueError(f"{folder} holds an invalid {name}: {err} (in its raw/ or "
                         f"split/{spec.split}/ files)") from None


def _check_bonds(file: Path, bonds: np.ndarray, n_node: np.ndarray, n_bond: np.ndarray):
    """ValueError naming `file`'s first row whose atom lies outside its molecule (ids
    are local to each molecule: row i belongs to the molecule whose bonds it falls in)."""
    graph = np.repeat(np.arange(n_node.size), n_bond)
    bad = np.flatnonzero(((bonds < 0) | (bonds >= n_node[graph][:, None])).any(1))
    if bad.size:
        row = int(bad[0])
        g = int(graph[row])
        raise ValueError(f"{file} row {row}: bond {bonds[row].tolist()} names an atom outside "
                         f"molecule {g}, which has {int(n_node[g])} atoms (ids 0 to "
                         f"{int(n_node[g]) - 1}, local to each molecule)")


def load_ogbg(name: str, root: str | os.PathLike, log: Log | None = None) -> GraphCollection:
    """`read_ogbg`, through the cache `<folder>/processed/zerognn-graphs.npz` (`log` told
    of a long parse, as `load_graphs` says)."""
    if name not in GRAPH_SPECS:
        raise ValueError(f"unknown OGB graph dataset {name!r}; expected one of "
                         f"{', '.join(GRAPH_SPECS)}")
    folder = Path(root) / GRAPH_SPECS[name].folder
    cache = folder / "processed" / "zerognn-graphs.npz"
    cached = read_current_cache(cache, cache, folder, load_graphs_file)
    if cached is not None:
        return cached
    parse = lambda: keep_cache(read_ogbg(name, root), save_graphs, cache)
    return announced(name, lambda: parse_into_cache(cache, cache, folder, parse), log,
                     into=cache, doing="parsing OGB's files")
