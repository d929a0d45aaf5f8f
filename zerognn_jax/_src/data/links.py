"""Link-prediction splits: random splits of any graph, and OGB's ogbl layout.

A `LinkSplit` holds the training edges (the training items), the message-passing graph
(training edges only, both directions), and per evaluation split its positives with
their fixed negatives, generated once when the split is made and stored with it:

- `neg`: int32[Q, 2], negative pairs scored against all positives (AUC and AP over
  positives and negatives, as in GAE's Planetoid protocol; Hits@K as in ogbl-collab);
- `neg_dst`: int32[P, M], per positive M negative destinations of its source, against
  which it is ranked (MRR and Hits@1/3/10, as in ogbl-citation2); M may be 0.

OGB's ogbl layout (what OGB's download unpacks to, read without the ogb package):

  <root>/ogbl_collab/     raw/edge.csv.gz (E rows "u,v", each undirected edge once),
                          raw/node-feat.csv.gz (N rows of 128 floats),
                          raw/num-node-list.csv.gz, split/time/{train,valid,test}.pt:
                          train {"edge": [E, 2], ...}, valid/test {"edge", "edge_neg"}
  <root>/ogbl_citation2/  raw/edge.csv.gz (directed "source,target"), node-feat,
                          num-node-list, split/time/{train,valid,test}.pt:
                          train {"source_node", "target_node"}, valid/test also
                          {"target_node_neg": [P, 1000]}

OGB saved those `.pt` files with `torch.save` of dicts of NumPy arrays; `read_pt` reads
them (the legacy and the zip format) with a restricted unpickler that builds NumPy
arrays only, no torch needed. A `.npz` file with the same keys may stand in for each
`.pt` file (`{train,valid,test}.npz`).
"""

from __future__ import annotations

import dataclasses
import hashlib
import io
import os
import pickle
import warnings
import zipfile
from pathlib import Path

import numpy as np

from zerognn_jax._src.data import graph_kinds
from zerognn_jax._src.data.checks import check_seed, is_count
from zerognn_jax._src.data.graph import CSRGraph
from zerognn_jax._src.data.hetero import HeteroGraph
from zerognn_jax._src.data.ogb import _load_text  # the gzipped-CSV reader of ogbn
from zerognn_jax._src.data.storage import npz_of_another_kind, put_table, stored_table
from zerognn_jax._src.data.tables import edge_feature_table
from zerognn_jax._src.data.undirected import (
    canonical_pairs,
    symmetric_graph,
    undirected_csr,
    upper_matrix,
)
from zerognn_jax._src.data.writes import atomic_write

SPLITS = ("val", "test")
# A saved split's arrays of its evaluation pairs, "val_pos" and so on
EVAL_KEYS = tuple(f"{s}_{k}" for s in SPLITS for k in ("pos", "neg", "neg_dst"))
_SAVED = ("num_nodes", "train", *EVAL_KEYS)


@dataclasses.dataclass(frozen=True)
class EvalEdges:
    """One evaluation split: pos int32[P, 2], neg int32[Q, 2] (the negative pairs AUC,
    AP and Hits@K score against), neg_dst int32[P, M] (M negative destinations per
    positive, which MRR ranks it among; None: M = 0). Array-likes are taken as
    arrays."""

    pos: np.ndarray
    neg: np.ndarray
    neg_dst: np.ndarray | None = None

    def __post_init__(self):
        if self.neg_dst is None:
            object.__setattr__(self, "neg_dst", np.zeros((np.shape(self.pos)[0], 0), np.int32))
        for name in ("pos", "neg", "neg_dst"):
            a = np.asarray(getattr(self, name))
            if a.dtype.kind not in "iu" and a.size:
                raise ValueError(f"{name} must hold integer node ids, got {a.dtype}")
            object.__setattr__(self, name, a if a.size else a.astype(np.int32))
        for name in ("pos", "neg"):
            a = getattr(self, name)
            if a.ndim != 2 or a.shape[1] != 2:
                raise ValueError(f"{name} must be [n, 2], got {a.shape}"
                                 f"{transposed_hint(a, 'an evaluation split takes')}")
        if self.neg_dst.ndim != 2 or self.neg_dst.shape[0] != self.pos.shape[0]:
            raise ValueError(f"neg_dst must be [{self.pos.shape[0]}, M], got "
                             f"{self.neg_dst.shape}")


@dataclasses.dataclass(frozen=True)
class LinkSplit:
    """Training edges, the message-passing graph, and the evaluation splits.

    Attributes:
      train: int32[E, 2], training edges (the items the engines shuffle into steps).
      graph: CSRGraph of the training edges in both directions (val/test removed),
        with the edge features and weights of the split graph's surviving edges, if it
        had them.
      val, test: EvalEdges.
      num_nodes: N.
    """

    train: np.ndarray
    graph: CSRGraph
    val: EvalEdges
    test: EvalEdges
    num_nodes: int

    def __post_init__(self):
        object.__setattr__(self, "train", np.asarray(self.train))
        _check_split(self.train, {s: getattr(self, s) for s in SPLITS}, self.num_nodes)

    def save(self, path: str | os.PathLike) -> None:
        """Writes the split (edges and fixed negatives; not the graph, but the training
        edges' feature rows and weights when it has them) to a `.npz` (atomically;
        ".npz" is added to a path without it, as `np.savez` does).

        Raises:
          WriteError: the file could not be written (an OSError naming it).
        """
        arrays = {"train": self.train, "num_nodes": np.int64(self.num_nodes)}
        for s in SPLITS:
            for k in ("pos", "neg", "neg_dst"):
                arrays[f"{s}_{k}"] = getattr(getattr(self, s), k)
        g = self.graph
        if g.edge_features is not None or g.weights is not None:
            at = edge_positions(g, self.train[:, 0], self.train[:, 1])
            if g.edge_features is not None:
                put_table(arrays, "train_edge_features", np.asarray(g.edge_features)[at])
            if g.weights is not None:
                arrays["train_weights"] = np.asarray(g.weights)[at]
        with atomic_write(npz_path(path), "link split file") as f:
            np.savez(f, **arrays)

    @classmethod
    def load(cls, path: str | os.PathLike) -> LinkSplit:
        """Reads a split written by `save` (at `path`, or at `path` + ".npz" as `save`
        names it); the graph is rebuilt from its training edges (and their feature rows,
        and weights, when saved). ValueError naming the file when it is no such split."""
        with split_archive(path, "link", _SAVED) as f:
            try:  # the arrays checked before the graph is built of them
                n, train = int(f["num_nodes"]), f["train"]
                evals = saved_evals(f)
                _check_split(train, evals, n, sep="_")
            except ValueError as err:
                raise ValueError(f"{split_file(path)}: {err}") from err
            table = stored_table(f, "train_edge_features")
            weights = f["train_weights"] if "train_weights" in f.files else None
            return cls(train, training_graph(train, n, table, weights), evals["val"],
                       evals["test"], n)


def _check_split(train: np.ndarray, evals: dict, n: int, sep: str = ".") -> None:
    """ValueError naming the array of a split (`train`, `val.pos`, ...; `val_pos` with
    `sep` "_", a file's keys) whose shape or node ids (the first outside [0, n)) are
    wrong."""
    arrays = {"train": train, **{f"{s}{sep}{k}": getattr(evals[s], k)
                                 for s in SPLITS for k in ("pos", "neg", "neg_dst")}}
    require_train(train)
    for name, a in arrays.items():
        require_ids_in(name, a, n)


def require_train(train: np.ndarray) -> None:
    """ValueError unless a split's training pairs `train` are a non-empty [E, 2] array
    of integer node ids."""
    if train.ndim != 2 or train.shape[1] != 2 or not train.shape[0]:
        raise ValueError(f"train must be a non-empty [E, 2] array, got {train.shape}")
    if train.dtype.kind not in "iu":
        raise ValueError(f"train must hold integer node ids, got {train.dtype}")


def require_ids_in(name: str, ids: np.ndarray, n: int, what: str = "node") -> None:
    """ValueError naming the array `name` of a split where its ids (of `what`) hold one
    outside [0, n): the first, and how many."""
    outside = (ids < 0) | (ids >= n)
    if outside.any():
        raise ValueError(f"{name} holds {what} ids outside [0, {n}): "
                         f"{int(ids[outside][0])} (the first of {int(outside.sum())})")


def saved_evals(f) -> dict:
    """{"val": EvalEdges, "test": ...} of a saved split's open `.npz`."""
    return {s: EvalEdges(*(f[f"{s}_{k}"] for k in ("pos", "neg", "neg_dst")))
            for s in SPLITS}


def transposed_hint(pairs: np.ndarray, holds: str = "this takes") -> str:
    """" (PyG's [2, E] edge_index? {holds} [E, 2])" for pairs given as [2, E], E != 2
    (the layout PyG keeps them in); "" otherwise."""
    shape = np.shape(pairs)
    if len(shape) == 2 and shape[0] == 2 and shape[1] != 2:
        return f" (PyG's [2, E] edge_index? {holds} [E, 2]: its transpose)"
    return ""


def check_fractions(val, test) -> None:
    """ValueError unless `val` and `test` are numbers >= 0 whose sum is below 1 (a
    link split's held-out shares), naming them."""
    for name, share in (("val", val), ("test", test)):
        if isinstance(share, bool) or np.ndim(share) or (
                np.asarray(share).dtype.kind not in "fiu"):  # NumPy's and JAX's scalars too
            raise ValueError(f"{name} must be a number in [0, 1), the share of the pairs "
                             f"held out, got {share!r}")
    if not (0 <= val and 0 <= test and val + test < 1):
        raise ValueError(f"need val, test >= 0 and val + test < 1, got {val}, {test}")


def npz_path(path: str | os.PathLike) -> Path:
    """`path` with ".npz" added where it lacks it, as `np.savez` names its file."""
    path = Path(path)
    return path if path.suffix == ".npz" else path.with_name(f"{path.name}.npz")


def split_file(path: str | os.PathLike) -> Path:
    """The file a split's `load` reads: `path` where it is one, else `npz_path(path)`,
    where its `save` wrote it."""
    return Path(path) if Path(path).is_file() else npz_path(path)


def split_archive(path: str | os.PathLike, kind: str, keys: tuple[str, ...]):
    """The open `.npz` of a split of `kind` ("link": `LinkSplit.save`'s, "typed_link":
    `TypedLinkSplit.save`'s) at `path` (or `path` + ".npz"), which must hold `keys`;
    ValueError naming the file when it holds no such split (which gave a KeyError naming
    one key, or NumPy's error of a file that is no archive), and the reader where it is
    another file of this library."""
    path = split_file(path)
    wrong = f"{path} is not a {kind.replace('_', ' ')} split written by " \
            f"{'TypedLinkSplit' if kind == 'typed_link' else 'LinkSplit'}.save"
    try:
        f = np.load(path)
    except (ValueError, EOFError, pickle.UnpicklingError) as err:
        why = ("it holds pickled objects, which no split file does" if "allow_pickle" in
               str(err) else err)
        raise ValueError(f"{wrong}: {why}") from err
    if not isinstance(f, np.lib.npyio.NpzFile):
        raise ValueError(f"{wrong}: it holds one array, not an .npz archive")
    missing = [k for k in keys if k not in f.files]
    other = npz_of_another_kind(f, kind)
    if other or missing:
        f.close()
        raise ValueError(f"{wrong}: {other or 'it lacks ' + ', '.join(missing)}")
    return f


def split_digest(path: str | os.PathLike) -> str:
    """"sha256:<hex>" of a saved split's arrays (names, dtypes, shapes and values, by
    name; integers as int64, so that the same pairs saved in another integer dtype give
    the same digest): what a checkpoint of a run trained on it compares. The file's own
    bytes would not do: the archive records when each array was written."""
    digest = hashlib.sha256()
    with np.load(split_file(path)) as f:
        for name in sorted(f.files):
            values = f[name]
            if values.dtype.kind in "iu":  # ids: the same pairs in any integer dtype
                values = values.astype(np.int64)
            digest.update(f"{name} {values.dtype.str} {values.shape}\n".encode())
            digest.update(np.ascontiguousarray(values).tobytes())
    return f"sha256:{digest.hexdigest()}"


class SplitFileMissing(FileNotFoundError):
    """The split file a run names (`TrainConfig.link_split`) is not there."""


def read_split_file(path: str | os.PathLike, load):
    """`load(path)` of a split file a run names (`TrainConfig.link_split`), refused first
    (`SplitFileMissing`) naming both names `split_file` tries when neither is a file."""
    if not split_file(path).is_file():
        also = "" if npz_path(path) == Path(path) else f" nor at {os.fspath(npz_path(path))!r}"
        folder = " (a folder)" if Path(path).is_dir() else ""
        raise SplitFileMissing(f"link_split {os.fspath(path)!r}{folder}: no split file "
                               f"there{also}; it is the split this run trains and "
                               f"evaluates on")
    return load(path)


def training_graph(train: np.ndarray, num_nodes: int, edge_features=None,
                   weights=None) -> CSRGraph:
    """The message-passing graph: the training edges in both directions, each with its
    row of `edge_features` ([E, D], row i for train[i]) and its weight (float32[E]) when
    given."""
    return undirected_csr(train[:, 0], train[:, 1], num_nodes, edge_features, weights)


def _edge_keys(graph: CSRGraph, positions: bool):
    """(int64[E] sorted keys min * N + max, every undirected edge {u, v} once; with
    `positions`, int64[E] the CSR position of its first directed copy, the (min, max)
    direction where the graph has it, since row min comes first; else None)."""
    indptr, indices = np.asarray(graph.indptr), np.asarray(graph.indices)
    src = np.repeat(np.arange(graph.num_nodes, dtype=np.int64), np.diff(indptr))
    lo, hi = canonical_pairs(src, indices.astype(np.int64))
    keys = lo.astype(np.int64) * graph.num_nodes + hi
    # Sorts rather than np.unique: NumPy 2's hash-based unique is ~40x slower than a sort
    # here, and its stable argsort (return_index) ~2x slower than an unstable one, after
    # which a key's first copy is still the smallest index in its run.
    order = np.argsort(keys) if positions else None
    keys = keys[order] if positions else np.sort(keys)
    new = np.empty(keys.shape, bool)
    new[:1] = True
    np.not_equal(keys[1:], keys[:-1], out=new[1:])
    first = None
    if positions:
        first = np.flatnonzero(src != indices)[np.minimum.reduceat(order, np.flatnonzero(new))]
    return keys[new], first


def _key_pairs(keys: np.ndarray, n: int) -> np.ndarray:
    """int32[E, 2] (min, max) pairs of keys min * n + max."""
    return np.stack([keys // n, keys % n], 1).astype(np.int32)


def undirected_edges(graph: CSRGraph) -> np.ndarray:
    """int32[E, 2]: every undirected edge {u, v} of `graph` once, as (min, max), sorted."""
    return _key_pairs(_edge_keys(graph, positions=False)[0], graph.num_nodes)


def edge_positions(graph: CSRGraph, rows, cols, *, either_way: bool = False) -> np.ndarray:
    """int64[P]: the CSR position of edge rows[i] -> cols[i] of `graph` (the first, if
    repeated). Raises ValueError naming the first pair the graph lacks; with
    `either_way`, takes the edge cols[i] -> rows[i] where that one is missing, and gives
    -1 for a pair the graph holds neither way round."""
    n = graph.num_nodes
    indptr, indices = np.asarray(graph.indptr), np.asarray(graph.indices)
    keys = np.repeat(np.arange(n, dtype=np.int64), np.diff(indptr)) * n + indices
    order = np.argsort(keys, kind="stable")
    rows, cols = np.asarray(rows, np.int64), np.asarray(cols, np.int64)
    found = np.full(rows.shape, -1, np.int64)
    for a, b in ((rows, cols), (cols, rows))[:1 + either_way]:
        want = a * n + b
        at = np.minimum(np.searchsorted(keys[order], want), max(keys.size - 1, 0))
        hit = (found < 0) & (keys[order][at] == want) if keys.size else found >= 0
        found[hit] = order[at][hit]
    missing = np.flatnonzero(found < 0)
    if missing.size and not either_way:
        i = int(missing[0])
        raise ValueError(f"the graph has no edge {int(rows[i])} -> {int(cols[i])}")
    return found


def _pair_keys(edges: np.ndarray, n: int) -> np.ndarray:
    lo, hi = np.minimum(edges[:, 0], edges[:, 1]), np.maximum(edges[:, 0], edges[:, 1])
    return lo.astype(np.int64) * n + hi


def sample_non_edges(rng: np.random.Generator, count: int, num_nodes: int,
                     known: np.ndarray, *, num_sources: int | None = None,
                     relation: str | None = None) -> np.ndarray:
    """int32[count, 2] uniform pairs {u, v}, u != v, none in the sorted int64 `known`
    pair keys (min * N + max) nor repeated. With `num_sources` (the sources are nodes
    of another type): ordered pairs (u < num_sources, v < num_nodes), keys u * N + v.

    Raises ValueError when fewer than `count` such pairs exist (naming `relation`, the
    split relation's name, where given)."""
    if num_sources is None:  # self-pairs are never drawn, so their keys do not count
        pairs = num_nodes * (num_nodes - 1) // 2
        free = pairs - np.count_nonzero(known // num_nodes != known % num_nodes)
    else:
        free = num_sources * num_nodes - known.size
    if count > free:
        where = "" if relation is None else f"link split of {relation}: "
        raise ValueError(f"{where}need {count} negative pairs and only {free} pairs are not "
                         "edges")
    out = np.zeros((0,), np.int64)
    while out.size < count:
        want = 2 * (count - out.size) + 16
        if num_sources is None:
            u, v = rng.integers(0, num_nodes, want), rng.integers(0, num_nodes, want)
            keys = _pair_keys(np.stack([u, v], 1), num_nodes)[u != v]
        else:
            u, v = rng.integers(0, num_sources, want), rng.integers(0, num_nodes, want)
            keys = u.astype(np.int64) * num_nodes + v
        fresh = keys
        if known.size:  # searched in ascending order: ~7x faster than random order
            order = np.argsort(keys)
            ascending = keys[order]
            hit = np.empty(keys.shape, bool)
            hit[order] = known[np.minimum(np.searchsorted(known, ascending),
                                          known.size - 1)] == ascending
            fresh = keys[~hit]
        _, first = np.unique(np.concatenate([out, fresh]), return_index=True)
        out = np.concatenate([out, fresh])[np.sort(first)]
    out = out[:count]
    return np.stack([out // num_nodes, out % num_nodes], 1).astype(np.int32)


def destination_negatives(rng: np.random.Generator, pos: np.ndarray, num_nodes: int,
                          per_positive: int) -> np.ndarray:
    """int32[P, M]: per positive (u, v), M uniform destinations other than v."""
    draw = rng.integers(0, num_nodes - 1, (pos.shape[0], per_positive))
    return (draw + (draw >= pos[:, 1:2])).astype(np.int32)


class EmptySplitWarning(UserWarning):
    """A link split's fraction that gives no pair on a graph this small."""


def warn_empty_splits(val: float, test: float, n_val: int, n_test: int, pairs: int,
                      what: str) -> None:
    """Warns (`EmptySplitWarning`) of an evaluation split a positive fraction leaves
    empty: its metrics are then null."""
    empty = [(name, fraction) for name, fraction, count in
             (("val", val, n_val), ("test", test, n_test)) if fraction > 0 and count == 0]
    if empty:
        said = " and ".join(f"{name} {fraction} x {pairs}" for name, fraction in empty)
        warnings.warn(f"the link split of {pairs} {what} leaves "
                      f"{' and '.join(name for name, _ in empty)} empty ({said} round down "
                      f"to 0 pairs): their metrics are null", EmptySplitWarning, stacklevel=3)


# What splits each kind of graph, for the message of a wrong one (`require_graph`)
_SPLIT_BY = {CSRGraph: "zg.random_link_split({})",
             HeteroGraph: "zg.typed_link_split({}, relation)"}


def require_graph(split: str, graph, kind: type) -> None:
    """`graph_kinds.require_graph` for `split`: a dataset's graph, or the split of the other
    kind of graph."""
    def elsewhere(what: str, inner) -> str:
        held = "graph" if inner is graph else "dataset.graph"
        return f"{what} is split by {_SPLIT_BY[type(inner)].format(held)}"

    graph_kinds.require_graph(split, graph, kind, dataset_fix="pass dataset.graph",
                         elsewhere=elsewhere)


def check_mrr_negatives(value, n_val: int, n_test: int) -> int:
    """`value` as an int; ValueError naming it unless it is an integer >= 0 whose
    [P, value] table of each split's P positives stays under 2**31 entries (-1 and 1.5
    met NumPy's errors, 10**12 a MemoryError of petabytes)."""
    if not is_count(value) or int(value) < 0:
        raise ValueError(f"mrr_negatives must be an integer >= 0, got {value!r}")
    count, (positives, split) = int(value), max((n_val, "val"), (n_test, "test"))
    if positives * count >= 2**31:
        raise ValueError(f"mrr_negatives={count} x {positives} {split} positives is "
                         f"{positives * count:,} negative destinations, 2**31 or more")
    return count


def random_link_split(graph: CSRGraph, *, val: float = 0.05, test: float = 0.10,
                      seed: int = 0, mrr_negatives: int = 0) -> LinkSplit:
    """A random split of the undirected edges of `graph` (85/5/10 by default).

    Val and test edges leave the message-passing graph; with `graph.edge_features` or
    `graph.weights`, each surviving edge keeps, in both directions, the row and the
    weight of its first directed copy in `graph` (the (min, max) direction where
    present). Each evaluation split gets one
    negative pair per positive (uniform non-edges of the whole graph, none repeated)
    and, if `mrr_negatives` > 0, that many negative destinations per positive. The
    same (graph, fractions, seed) give the same split, negatives included.
    """
    require_graph("random_link_split", graph, CSRGraph)
    check_fractions(val, test)
    seed = check_seed(seed)
    n = graph.num_nodes
    if n < 2:
        raise ValueError(f"a link split needs at least 2 nodes, got {n}")
    keys, first = _edge_keys(graph, positions=graph.edge_features is not None
                             or graph.weights is not None)
    rng = np.random.default_rng(seed)
    perm = rng.permutation(keys.shape[0])
    edges = _key_pairs(keys[perm], n)
    n_val, n_test = int(val * edges.shape[0]), int(test * edges.shape[0])
    mrr_negatives = check_mrr_negatives(mrr_negatives, n_val, n_test)
    parts = {"val": edges[:n_val], "test": edges[n_val:n_val + n_test]}
    held = n_val + n_test
    train = edges[held:]
    if not train.shape[0]:
        raise ValueError(f"the graph has {edges.shape[0]} undirected edges: none left to train")
    warn_empty_splits(val, test, n_val, n_test, edges.shape[0], "undirected edges")
    # The graph `training_graph(train, n, table)` builds, without its sort of the training
    # keys: they are `keys` where `in_train`, and `at` holds their rows of `train`.
    rank = np.empty_like(perm)
    rank[perm] = np.arange(perm.size)
    in_train = rank >= held
    at = rank[in_train] - held
    table = weights = None
    if first is not None:
        train_first = first[perm[held:]]  # each training edge's first copy, in `train` order
    if graph.edge_features is not None:
        table = edge_feature_table(np.asarray(graph.edge_features)[train_first],
                                   train.shape[0])[at]
    if graph.weights is not None:
        weights = np.asarray(graph.weights, np.float32)[train_first][at]
    train_keys = keys[in_train]
    upper = upper_matrix((train_keys // n).astype(np.int32),
                         (train_keys % n).astype(np.int32), n)
    evals = {}
    for name in SPLITS:
        pos = parts[name]
        neg = sample_non_edges(rng, pos.shape[0], n, keys)
        neg_dst = destination_negatives(rng, pos, n, mrr_negatives)
        evals[name] = EvalEdges(pos, neg, neg_dst)
    return LinkSplit(train, symmetric_graph(upper, table, weights), evals["val"],
                     evals["test"], n)


# ---- OGB's ogbl layout -------------------------------------------------------------------

OGBL = {"ogbl-collab": "ogbl_collab", "ogbl-citation2": "ogbl_citation2"}
_NUMPY_GLOBALS = {
    ("numpy.core.multiarray", "_reconstruct"), ("numpy._core.multiarray", "_reconstruct"),
    ("numpy.core.multiarray", "scalar"), ("numpy._core.multiarray", "scalar"),
    ("numpy", "ndarray"), ("numpy", "dtype"), ("collections", "OrderedDict"),
    ("_codecs", "encode"),  # how protocol 2 (torch.save's) pickles bytes
    ("__builtin__", "bytes"), ("builtins", "bytes"),  # and empty bytes (an empty array's)
}


class _NumpyUnpickler(pickle.Unpickler):
    """Builds dicts, lists and NumPy arrays only; anything else is refused."""

    def find_class(self, module, name):
        if (module, name) in _NUMPY_GLOBALS:
            return super().find_class(module, name)
        raise pickle.UnpicklingError(
            f"{module}.{name} is not allowed here: only NumPy arrays are read from OGB "
            "split files (convert a file holding torch tensors to .npz)")

    def persistent_load(self, pid):
        raise pickle.UnpicklingError("torch storages are not supported: convert the split "
                                     "file to .npz with the same keys")


# The first object of torch.save's legacy format
TORCH_LEGACY_MAGIC = 0x1950A86A20F9469CFC6C


def read_pt(path: str | os.PathLike):
    """The object (OGB's: a dict of NumPy arrays) in a `torch.save` file (legacy or zip
    format) or a plain pickle."""
    path = Path(path)
    if zipfile.is_zipfile(path):
        with zipfile.ZipFile(path) as z:
            name = next((n for n in z.namelist() if n.endswith("data.pkl")), None)
            if name is None:
                raise ValueError(f"{path}: a zip without data.pkl is not a torch.save file")
            return _NumpyUnpickler(io.BytesIO(z.read(name))).load()
    with open(path, "rb") as f:
        if f.read(4) == b"PK\x03\x04":  # a zip's first entry, but no readable directory
            raise ValueError("a zip-format torch.save file cut short (its directory is "
                             "missing)")
        f.seek(0)
        first = _NumpyUnpickler(f).load()
        if not (isinstance(first, int) and first == TORCH_LEGACY_MAGIC):
            return first  # a plain pickle (of a dict, or of what the caller names)
        # torch's legacy format: magic number, protocol version, system info, object
        _NumpyUnpickler(f).load()
        _NumpyUnpickler(f).load()
        return _NumpyUnpickler(f).load()


def _read_split_part(folder: Path, part: str) -> tuple[Path, dict]:
    """(the file of split `part`, its dict of arrays)."""
    for suffix, reader in ((".pt", read_pt), (".npz", lambda p: dict(np.load(p)))):
        path = folder / f"{part}{suffix}"
        if path.is_file():
            try:
                content = reader(path)
            except (zipfile.BadZipFile, EOFError, OSError, ValueError, KeyError,
                    pickle.UnpicklingError) as err:
                raise ValueError(f"{path} is not a readable OGB split file: {err}") from err
            if not isinstance(content, dict):
                raise ValueError(f"{path} holds a {type(content).__name__}, not the dict of "
                                 f"arrays of OGB's split files")
            return path, {k: np.asarray(v) for k, v in content.items()}
    raise FileNotFoundError(f"OGB split file {folder / part}.pt (or .npz) not found")


def _node_pairs(values, what: str, n: int) -> np.ndarray:
    """int32[E, 2] node pairs of `values`, which must be integer [E, 2] (OGB's layout)
    with ids in [0, n): ValueError naming `what` otherwise."""
    pairs = np.asarray(values)
    if pairs.size == 0:  # no pairs, whatever shape the empty array was saved in
        return np.zeros((0, 2), np.int32)
    if pairs.ndim != 2 or pairs.shape[1] != 2:
        raise ValueError(f"{what} must be node pairs of shape [E, 2], got shape "
                         f"{pairs.shape}{transposed_hint(pairs, 'OGB split files hold')}")
    if not np.issubdtype(pairs.dtype, np.integer):
        raise ValueError(f"{what} must hold integer node ids, got {pairs.dtype}")
    if pairs.min() < 0 or pairs.max() >= n:
        raise ValueError(f"{what} has node ids in [{pairs.min()}, {pairs.max()}], outside "
                         f"[0, {n})")
    return pairs.astype(np.int32)


def _negative_rows(part: dict, path: Path, positives: int, n: int) -> np.ndarray:
    """int32[P, M]: a split file's `target_node_neg`, which must be integer [P, M], one
    row per positive, ids in [0, n) (a transposed [M, P] was reshaped into scrambled
    rows, float ids truncated); [P, 0] without it or with an empty one. ValueError naming
    the file otherwise."""
    neg = part.get("target_node_neg", np.zeros((positives, 0), np.int32))
    fits = neg.ndim == 2 and neg.shape[0] == positives
    if not neg.size:  # no negatives, whatever shape the empty array was saved in
        return np.zeros((positives, neg.shape[1] if fits else 0), np.int32)
    what = f"{path}: 'target_node_neg'"
    if not fits:
        hint = " (transposed?)" if neg.ndim == 2 and neg.shape[1] == positives else ""
        raise ValueError(f"{what} must be integer [P, M], one row of negatives per positive "
                         f"(P = {positives}), got {neg.dtype}{list(neg.shape)}{hint}")
    if not np.issubdtype(neg.dtype, np.integer):
        raise ValueError(f"{what} must hold integer node ids, got {neg.dtype}"
                         f"{list(neg.shape)}")
    if neg.min() < 0 or neg.max() >= n:
        raise ValueError(f"{what} has node ids in [{neg.min()}, {neg.max()}], outside "
                         f"[0, {n})")
    return neg.astype(np.int32)


def _pairs(part: dict, path: Path, n: int) -> np.ndarray:
    """int32[E, 2] positive pairs of split file `path`'s `part`: its 'edge', or its
    'source_node' and 'target_node' side by side; ValueError naming the file."""
    if "edge" in part:
        return _node_pairs(part["edge"], f"{path}'s 'edge'", n)
    ends = [k for k in ("source_node", "target_node") if k in part]
    if not ends:
        raise ValueError(f"{path} has neither 'edge' nor 'source_node' and 'target_node': "
                         f"{sorted(part)}")
    if len(ends) == 1:
        raise ValueError(f"{path} has {ends[0]} but not "
                         f"{({'source_node', 'target_node'} - set(ends)).pop()}")
    src, dst = (np.asarray(part[k]) for k in ends)
    if src.shape != dst.shape or src.ndim != 1:
        raise ValueError(f"{path}: source_node and target_node must be [E] each, got "
                         f"{list(src.shape)} and {list(dst.shape)}")
    return _node_pairs(np.stack([src, dst], 1), f"{path}'s source_node and target_node", n)


def load_ogbl(name: str, root: str | os.PathLike):
    """(features float32[N, d], LinkSplit) of "ogbl-collab" or "ogbl-citation2".

    The message-passing graph is the training edges made undirected (as OGB's examples
    do for both). Collab's evaluation negatives are its `edge_neg` pairs (Hits@50);
    citation2's are its `target_node_neg` destinations per positive (MRR).
    """
    if name not in OGBL:
        raise ValueError(f"unknown ogbl dataset {name!r}; expected one of {sorted(OGBL)}")
    if root is None:
        raise ValueError(f"{name} needs root, the folder that holds {OGBL[name]}/")
    folder = Path(root) / OGBL[name]
    raw = folder / "raw"
    features = _load_text(raw / "node-feat.csv.gz", np.float32)
    n = int(_load_text(raw / "num-node-list.csv.gz", np.int64).sum())
    if features.shape[0] != n:
        raise ValueError(f"{raw}: num-node-list says {n} nodes, node-feat has "
                         f"{features.shape[0]} rows")
    split_dir = folder / "split" / "time"
    files = {p: _read_split_part(split_dir, p) for p in ("train", "valid", "test")}
    train = _pairs(files["train"][1], files["train"][0], n)
    if not train.shape[0]:
        raise ValueError(f"{files['train'][0]} holds no training edges")
    evals = {}
    for ours, theirs in (("val", "valid"), ("test", "test")):
        path, part = files[theirs]
        pos = _pairs(part, path, n)
        neg = _node_pairs(part.get("edge_neg", np.zeros((0, 2), np.int64)),
                          f"{path}'s 'edge_neg'", n)
        evals[ours] = EvalEdges(pos, neg, _negative_rows(part, path, pos.shape[0], n))
    split = LinkSplit(train, training_graph(train, n), evals["val"], evals["test"], n)
    return features, split
