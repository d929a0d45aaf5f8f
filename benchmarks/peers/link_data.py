"""The link-prediction handoff: zerognn-jax's split of a graph, written once for the peers.

    PYTHONPATH=. python3 benchmarks/peers/link_data.py --dataset products-like \
        --scale 1 --root .cache/zerognn --out .cache/zerognn/products-link.npz

The split is the one zerognn-jax trains on: `load_dataset(name, root, scale=, seed=)`,
then `random_link_split(graph, seed=seed, mrr_negatives=M)` (M = 100 with
`--link-metric mrr`, as the trainer does, else 0), so `zerognn train --task link` and
benchmarks/link.py with the same dataset, scale and seed see the same training edges
and score the same fixed negatives. The file (NumPy `.npz`, read with
`allow_pickle=False`):

  format_version  int64[]        1
  kind            str[]          "link"
  name            str[]          the dataset's name
  seed            int64[]        the split's (and the generated graph's) seed
  indptr          int32[N + 1]   the message-passing graph: training edges both ways
  indices         int32[E]       (row v lists the neighbours v aggregates from)
  features        float32[N, d]  raw (link prediction does not normalise them)
  train           int32[T, 2]    training edges, each undirected edge once
  {val,test}_pos  int32[P, 2]    held-out edges (not in the message-passing graph)
  {val,test}_neg  int32[Q, 2]    one fixed non-edge per positive (AUC, AP)
  {val,test}_neg_dst int32[P, M] fixed negative destinations per positive (MRR); M may be 0

Reading needs NumPy only (`load`); writing needs zerognn-jax.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from typing import NamedTuple

import numpy as np

FORMAT_VERSION = 1
SPLITS = ("val", "test")
EVAL_KEYS = ("pos", "neg", "neg_dst")
REQUIRED_KEYS = ("format_version", "kind", "name", "seed", "indptr", "indices", "features",
                 "train", *(f"{s}_{k}" for s in SPLITS for k in EVAL_KEYS))


class LinkData(NamedTuple):
    """A link split as NumPy arrays.

    indptr: int64[N + 1], indices: int32 or int64[E]: the message-passing CSR graph.
    features: float32[N, d]. train: int64[T, 2]. evals: {"val", "test"} ->
    {"pos": int64[P, 2], "neg": int64[Q, 2], "neg_dst": int64[P, M]}.
    """

    name: str
    seed: int
    indptr: np.ndarray
    indices: np.ndarray
    features: np.ndarray
    train: np.ndarray
    evals: dict

    @property
    def num_nodes(self) -> int:
        return self.indptr.shape[0] - 1

    @property
    def num_edges(self) -> int:
        return self.indices.shape[0]

    @property
    def has_mrr(self) -> bool:
        """Whether the split stores per-positive negatives (MRR) besides its pairs."""
        return self.evals["test"]["neg_dst"].shape[1] > 0


def split_arrays(name: str, seed: int, features, split) -> dict:
    """The file's arrays for a zerognn-jax `LinkSplit` and the node features."""
    graph = split.graph
    arrays = {"format_version": np.int64(FORMAT_VERSION), "kind": np.str_("link"),
              "name": np.str_(name), "seed": np.int64(seed),
              "indptr": np.asarray(graph.indptr), "indices": np.asarray(graph.indices),
              "features": np.asarray(features, np.float32), "train": np.asarray(split.train)}
    for s in SPLITS:
        for k in EVAL_KEYS:
            arrays[f"{s}_{k}"] = np.asarray(getattr(getattr(split, s), k))
    return arrays


def write(path: str | os.PathLike, name: str, seed: int, features, split) -> None:
    """Writes the file for `split` (a `LinkSplit`) next to its final name, then renames
    it, so an interrupted write leaves no file that looks complete."""
    partial = f"{path}.partial.npz"
    np.savez(partial, **split_arrays(name, seed, features, split))
    os.replace(partial, path)


def make(dataset: str, root, scale: float, seed: int, mrr_negatives: int):
    """(name, features, LinkSplit) as zerognn-jax's trainer builds them for
    `--task link --dataset D --scale S --seed s`."""
    import zerognn_jax as zg
    data = zg.load_dataset(dataset, root, scale=scale, seed=seed)
    split = zg.random_link_split(data.graph, seed=seed, mrr_negatives=mrr_negatives)
    return data.name, data.features, split


def load(path: str | os.PathLike) -> LinkData:
    """Reads a file `write` made; ValueError names the file and what is wrong with it."""
    with np.load(path, allow_pickle=False) as npz:
        missing = [k for k in REQUIRED_KEYS if k not in npz.files]
        if missing:
            raise ValueError(f"{path}: missing key(s) {', '.join(missing)}")
        a = {k: npz[k] for k in npz.files}
    if int(a["format_version"]) != FORMAT_VERSION or str(a["kind"]) != "link":
        raise ValueError(f"{path}: not a link split of format {FORMAT_VERSION} "
                         f"(kind {a['kind']}, format_version {a['format_version']})")
    indptr = a["indptr"].astype(np.int64)
    n = indptr.shape[0] - 1
    if a["features"].shape[0] != n or int(indptr[-1]) != a["indices"].shape[0]:
        raise ValueError(f"{path}: {n} nodes and {int(indptr[-1])} edges in indptr, "
                         f"features {a['features'].shape}, indices {a['indices'].shape}")
    evals = {s: {k: a[f"{s}_{k}"].astype(np.int64) for k in EVAL_KEYS} for s in SPLITS}
    return LinkData(str(a["name"]), int(a["seed"]), indptr, a["indices"],
                    np.ascontiguousarray(a["features"], np.float32),
                    a["train"].astype(np.int64), evals)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--dataset", default="products-like")
    p.add_argument("--root", default=None, help="zerognn-jax's data folder (generated "
                   "graphs are cached there)")
    p.add_argument("--scale", type=float, default=1.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--link-metric", default="auc", choices=("auc", "mrr"),
                   help="mrr also stores 100 negative destinations per positive")
    p.add_argument("--out", required=True)
    args = p.parse_args(argv)
    t0 = time.perf_counter()
    name, features, split = make(args.dataset, args.root, args.scale, args.seed,
                                 100 if args.link_metric == "mrr" else 0)
    write(args.out, name, args.seed, features, split)
    print(f"{args.out}: {split.num_nodes} nodes, {split.train.shape[0]} training edges, "
          f"{split.test.pos.shape[0]} test edges, {time.perf_counter() - t0:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
