"""ogbn-mag read from OGB's own folder layout, without the ogb package.

Expected layout under `root` (what OGB's download of ogbn-mag unpacks to; gzipped CSV
without a header unless said):

  ogbn_mag/raw/num-node-dict.csv.gz          a header row of node types, one row of counts
  ogbn_mag/raw/triplet-type-list.csv.gz      one "src_type,relation,dst_type" per line
  ogbn_mag/raw/relations/<src>___<rel>___<dst>/edge.csv.gz   "src,dst" per edge
  ogbn_mag/raw/node-feat/paper/node-feat.csv.gz    N_paper rows of 128 floats
  ogbn_mag/raw/node-feat/paper/node_year.csv.gz    N_paper rows of one year
  ogbn_mag/raw/node-label/paper/node-label.csv.gz  N_paper rows of one venue id
  ogbn_mag/split/time/paper/{train,valid,test}.csv.gz   paper ids, one per line

Four relations (author affiliated_with institution, author writes paper, paper cites
paper, paper has_topic field_of_study), 349 venue classes, features and labels on
papers only, the time split (train up to 2017, valid 2018, test 2019). Reverse
relations are added as PyG's `ToUndirected` adds them (`add_reverse_relations`: cites
made symmetric, rev_writes, rev_has_topic, rev_affiliated_with) unless
`add_reverse=False`; nothing else is changed (OGB's reader keeps loops and repeated
pairs, and so does this one).
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from zerognn_jax._src.data.hetero_dataset import HeteroDataset, make_hetero_dataset
from zerognn_jax._src.data.ogb import _as_labels, _load_text, _named, _read_ids, read_gz

FOLDER = "ogbn_mag"
TARGET = "paper"
NUM_CLASSES = 349


def mag_folder(root: str | os.PathLike) -> Path:
    return Path(root) / FOLDER


def _read_counts(path: Path) -> dict[str, int]:
    """{type: count} from OGB's num-node-dict (a header row, then a row of counts)."""
    lines = read_gz(path, lambda f: [line.strip() for line in f if line.strip()])
    if len(lines) < 2:
        raise ValueError(f"{path}: expected a header row of node types and a row of counts")
    types, counts = lines[0].split(","), lines[1].split(",")
    if len(types) != len(counts):
        raise ValueError(f"{path}: {len(types)} node types but {len(counts)} counts")
    bad = [c for c in counts if not c.strip().isdigit()]
    if bad:
        raise ValueError(f"{path}: a node count is not a count (a whole number >= 0): "
                         f"{bad[0]!r}")
    if TARGET not in types:
        raise ValueError(f"{path} lists no {TARGET!r} node type (it lists "
                         f"{', '.join(types)}), whose papers ogbn-mag classifies")
    return {t: int(c) for t, c in zip(types, counts)}


def _read_triplets(path: Path) -> list[tuple[str, str, str]]:
    rows = read_gz(path, lambda f: [tuple(line.strip().split(",")) for line in f
                                    if line.strip()])
    bad = [r for r in rows if len(r) != 3]
    if bad:
        raise ValueError(f"{path}: a line is not src_type,relation,dst_type: {','.join(bad[0])}")
    return rows


def load_mag(root: str | os.PathLike, *, add_reverse: bool = True) -> HeteroDataset:
    """Reads ogbn-mag from `<root>/ogbn_mag` (module docstring).

    Raises:
      FileNotFoundError: a file of the layout is missing (the message names it).
      ValueError: arrays inconsistent with each other (named with the relation or file).
    """
    folder = mag_folder(root)
    raw = folder / "raw"
    counts = _read_counts(raw / "num-node-dict.csv.gz")
    edges = {}
    for rel in _read_triplets(raw / "triplet-type-list.csv.gz"):
        pairs = _load_text(raw / "relations" / "___".join(rel) / "edge.csv.gz", np.int64,
                           columns=2)
        edges[rel] = (pairs[:, 0], pairs[:, 1])
    paper = Path("node-feat") / TARGET
    features = _load_text(raw / paper / "node-feat.csv.gz", np.float32)
    year_file = raw / paper / "node_year.csv.gz"
    year = _load_text(year_file, np.int64, columns=1).reshape(-1)
    label_file = raw / "node-label" / TARGET / "node-label.csv.gz"
    labels = _as_labels(_load_text(label_file, np.float64), label_file)
    split = {part: _read_ids(folder / "split" / "time" / TARGET / f"{part}.csv.gz")
             for part in ("train", "valid", "test")}
    n = counts[TARGET]
    for file, arr in ((raw / paper / "node-feat.csv.gz", features), (year_file, year),
                      (label_file, labels)):
        if arr.shape[0] != n:
            raise ValueError(f"{file} has {arr.shape[0]} rows, num-node-dict says {n} "
                             f"papers")
    return _named(folder, lambda: make_hetero_dataset(
        "ogbn-mag", counts, edges, target_type=TARGET, labels=labels,
        train_idx=split["train"], val_idx=split["valid"], test_idx=split["test"],
        num_classes=NUM_CLASSES, features={TARGET: features}, add_reverse=add_reverse,
        node_info={TARGET: {"year": year.astype(np.int32)}}))
