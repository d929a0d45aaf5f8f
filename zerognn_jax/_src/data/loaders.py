"""Dataset loading by name: real graphs, synthetic presets and single-file `.npz` datasets.

`load_dataset` is the one entry point the trainer, the CLI and the benchmarks use; the
loaders it dispatches to live in the private modules of this package.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import re
import zipfile
from collections.abc import Callable
from pathlib import Path

import numpy as np

from zerognn_jax._src.data import ogb, planetoid
from zerognn_jax._src.data.announce import Log, announced, announcing, preset_label
from zerognn_jax._src.data.checks import check_seed
from zerognn_jax._src.data.dataset import Dataset
from zerognn_jax._src.data.graph_datasets import (
    GRAPH_DATASET_NAMES,
    graph_task_needed,
    is_graph_dataset,
)
from zerognn_jax._src.data.graph_datasets import PRESETS as GRAPH_PRESETS
from zerognn_jax._src.data.hetero_dataset import HeteroDataset
from zerognn_jax._src.data.hetero_storage import (
    is_hetero_path,
    load_hetero,
    load_hetero_npz,
    save_hetero_dir,
    save_hetero_npz,
)
from zerognn_jax._src.data.hetero_synthetic import igbh_like, mag_like
from zerognn_jax._src.data.links import OGBL
from zerognn_jax._src.data.mag import load_mag, mag_folder
from zerognn_jax._src.data.papers import papers100m_like, write_papers100m_like
from zerognn_jax._src.data.planetoid import row_normalize
from zerognn_jax._src.data.proteins import proteins_like
from zerognn_jax._src.data.shop import shop_like
from zerognn_jax._src.data.storage import (
    META,
    dataset_name,
    is_dataset_dir,
    load_dir,
    load_npz,
    names_a_missing_path,
    open_npz,
    save_dir,
    save_npz,
)
from zerognn_jax._src.data.synthetic import check_scale, products_like, rmat
from zerognn_jax._src.data.writes import (
    keep_cache,
    parse_into_cache,
    read_cache,
    read_current_cache,
)

__all__ = ["DATASET_NAMES", "HETERO_NAMES", "is_typed", "load_dataset", "load_hetero_dataset",
           "load_dir",
           "load_npz", "papers100m_like", "products_like", "proteins_like", "rmat",
           "row_normalize", "save_dir", "save_npz", "write_papers100m_like"]

TINY_SCALE = 0.002  # products-like with 4,898 nodes and ~124k undirected edges
RMAT_BASE_LOG2 = 21  # "rmat" at scale 1: 2**21 nodes, roughly ogbn-products' size
DATASET_NAMES = (
    *planetoid.NAMES, *ogb.SPECS, "products-like", "tiny", "papers100m-like", "rmat",
    "proteins-like", "<file>.npz", "<dataset directory>",
)
SCALED = ("products-like", "papers100m-like", "rmat", "proteins-like")
HETERO_NAMES = ("ogbn-mag", "mag-like", "igbh-like", "shop-like", "<typed .npz>",
                "<typed dataset directory>")
# The synthetic typed presets: (generator(scale, seed), the cache's suffix: a .npz file,
# or "" for a dataset directory)
TYPED_PRESETS = {"mag-like": (mag_like, ".npz"), "igbh-like": (igbh_like, ""),
                 "shop-like": (shop_like, ".npz")}


def load_dataset(name: str, root: str | os.PathLike | None = None, *, scale: float = 1.0,
                 seed: int = 0, download: bool = False, log: Log | None = None) -> Dataset:
    """Loads a dataset by name, or a `.npz` file written by `save_npz`.

    Args:
      name: "cora", "citeseer", "pubmed" (Planetoid files in `root`, default
        ~/.cache/zerognn-jax/planetoid, `planetoid.default_root`); "ogbn-arxiv",
        "ogbn-products", "ogbn-papers100M", "ogbn-proteins" (OGB's layout under `root`,
        required); "products-like" (synthetic, node and edge counts times `scale`); "tiny"
        (products-like with ~5k nodes); "rmat" (R-MAT with 2**21 * scale nodes, scale
        rounded to a power of two); "proteins-like" (synthetic, ogbn-proteins' shape times
        `scale`, with edge features and 112 binary targets that need them);
        "papers100m-like" (synthetic, ogbn-papers100M's shape times `scale`, generated
        with JAX on the default device); a path ending in ".npz"; or a dataset directory
        (`save_dir`).
      root: data folder. For products-like, proteins-like and rmat, where generated
        graphs are cached as `<root>/<name>-<scale>-<seed>.npz`, for papers100m-like as
        the dataset directory `<root>/papers100m-like-<scale>-<seed>/` (no caching when
        None); OGB datasets cache their parsed form as
        `<root>/ogbn_<name>/processed/zerognn.npz` (ogbn-papers100M: the memory-mapped
        dataset directory `processed/zerognn/`, ogb.py).
      scale: size multiplier of the synthetic presets; must be 1 for the other named
        datasets and for a .npz file or a dataset directory (ValueError otherwise).
      seed: generator seed of the synthetic presets (the other datasets ignore it).
      download: fetch missing Planetoid files.
      log: called with a line once generating a synthetic preset or parsing an OGB
        folder has taken a second (never for a cache read) and with the seconds it took
        when it ends (data/announce.py); `zg.train` prints these to stderr while
        `progress` is on.

    Raises:
      ValueError: unknown name or bad option, naming the valid choices.
      FileNotFoundError: data files are missing.
    """
    name = dataset_name(name)
    key = name.lower()
    check_seed(seed)  # (NumPy's refusal of -1 named neither)
    if key in HETERO_NAMES or is_hetero_path(name):
        raise ValueError(f"{name} is a typed (heterogeneous) dataset: load it with "
                         "load_hetero_dataset (zg.train reads it by name)")
    _refuse_graphs(name)
    if key not in SCALED and scale != 1.0:  # a saved file's too: typed ones refuse it
        raise ValueError(f"scale applies to the synthetic presets ({', '.join(SCALED)}; "
                         f"typed: {', '.join(TYPED_PRESETS)}; graph collections: "
                         f"{', '.join(GRAPH_PRESETS)}), got scale={scale} (--scale) for "
                         f"{name!r}")
    if name.endswith(".npz"):
        return load_npz(name)
    if is_dataset_dir(name):
        return load_dir(name)
    if key in planetoid.NAMES:
        return planetoid.load_planetoid(key, root, download=download)
    ogb_names = {n.lower(): n for n in ogb.SPECS}
    if key in ogb_names:
        return _load_ogb(ogb_names[key], root, log)
    what = preset_label(key, scale, seed)
    if key == "products-like":
        return _cached(root, f"products-like-{scale:g}-{seed}",
                       lambda: products_like(scale, seed), what, log)
    if key == "papers100m-like":
        path = None if root is None else Path(root) / f"papers100m-like-{scale:g}-{seed}"
        if path is not None and is_dataset_dir(path):
            return read_cache(load_dir, path)
        with announcing(what, log, into=path) as say:
            if path is None:
                return papers100m_like(scale, seed, log=say)
            write_papers100m_like(path, scale, seed, log=say)
        return load_dir(path)
    if key == "proteins-like":
        return _cached(root, f"proteins-like-{scale:g}-{seed}",
                       lambda: proteins_like(scale, seed), what, log)
    if key == "tiny":
        return _tiny(seed)
    if key == "rmat":
        return _cached(root, f"rmat-{scale:g}-{seed}", lambda: rmat(_rmat_log2(scale), seed=seed),
                       what, log)
    _refuse_unknown(name)


def require_known(name: str) -> None:
    """Raises what `load_dataset` raises for a name that names no dataset it reads (a
    graph collection, a missing path, an unknown name), without loading anything."""
    name = dataset_name(name)
    _refuse_graphs(name)
    if name.lower() not in {n.lower() for n in DATASET_NAMES} and not Path(name).exists():
        _refuse_unknown(name)


def require_readable(name: str) -> None:
    """`require_known`, and for a file or folder that is no node dataset's, the error that
    loading it raises; a node dataset's file or folder is looked at, not loaded."""
    require_known(name)
    name = dataset_name(name)
    if Path(name).exists() and not _node_path(name):
        load_dataset(name)  # raises what is wrong with it


def require_graphs(name) -> None:
    """ValueError for the name or path of a node or typed dataset (one graph) given where
    a collection of graphs is read (task 'graph')."""
    name = dataset_name(name)
    if is_graph_dataset(name):
        return
    if is_typed(name):
        kind = "a typed (heterogeneous) dataset"
    elif name.lower() in {n.lower() for n in DATASET_NAMES} or _node_path(name):
        kind = "a node dataset"
    else:
        return
    raise ValueError(f"{name} is {kind}, one graph: train it with task 'node' or 'link'; "
                     f"task 'graph' trains collections of small graphs "
                     f"({', '.join(GRAPH_DATASET_NAMES)})")


def _refuse_graphs(name: str):
    if is_graph_dataset(name):
        raise ValueError(graph_task_needed(name))


def _refuse_unknown(name: str):
    if names_a_missing_path(name):
        raise FileNotFoundError(f"dataset {name!r}: no such file or directory")
    if Path(name).is_dir():
        folder = Path(name).resolve()
        ogb = (f"; an OGB folder is read by its dataset's name under its parent: "
               f"{folder.name.replace('_', '-', 1)} with root {folder.parent} (--root)"
               if re.match(r"ogb[nlg]_", folder.name) else "")
        raise ValueError(f"dataset {name!r} is a folder without the meta.json of a dataset "
                         f"saved by zerognn-jax (save_dir, zerognn data generate){ogb}")
    if Path(name).is_file():
        raise ValueError(f"dataset {name!r} is a file but not an .npz dataset archive "
                         "(save_npz, zerognn data generate)")
    if name.lower() in OGBL:  # read by the link task alone (links.py)
        raise ValueError(f"{name} is a link-prediction split: train it with task='link' "
                         f"(--task link) and root= (--root), the folder that holds "
                         f"{OGBL[name.lower()]}/")
    raise ValueError(f"unknown dataset {name!r}; valid names: {', '.join(DATASET_NAMES)}; "
                     f"typed (task 'node'): {', '.join(HETERO_NAMES)}; graph collections "
                     f"(task 'graph'): {', '.join(GRAPH_DATASET_NAMES)}; link splits "
                     f"(task 'link'): {', '.join(OGBL)}")


def _tiny(seed: int) -> Dataset:
    """products-like at TINY_SCALE, re-split 60/20/20 so a short CPU run learns visibly
    (products-like's own 8 % training split leaves ~400 nodes at this size)."""
    base = products_like(TINY_SCALE, seed)
    order = np.random.default_rng(seed).permutation(base.num_nodes).astype(np.int32)
    n_train, n_val = int(0.6 * order.size), int(0.2 * order.size)
    return dataclasses.replace(base, name="tiny", train_idx=np.sort(order[:n_train]),
                               val_idx=np.sort(order[n_train:n_train + n_val]),
                               test_idx=np.sort(order[n_train + n_val:]))


def _rmat_log2(scale: float) -> int:
    check_scale(scale)
    log2 = RMAT_BASE_LOG2 + round(math.log2(scale))
    if not 1 <= log2 <= 30:
        raise ValueError(f"scale={scale} gives rmat 2**{log2} nodes; it needs a scale from "
                         f"2**{1 - RMAT_BASE_LOG2} to 2**{30 - RMAT_BASE_LOG2} (2 to 2**30 "
                         f"nodes)")
    return log2


def _load_ogb(name: str, root, log: Log | None) -> Dataset:
    if root is None:
        raise ValueError(f"{name} needs root= (--root), the folder that holds "
                         f"{ogb.SPECS[name].folder}/")
    folder = ogb.dataset_folder(name, root)
    binary = ogb.SPECS[name].binary  # converted into a memory-mapped dataset directory
    cache = ogb.processed_dir(name, root) if binary else folder / "processed" / "zerognn.npz"
    stamp = cache / "meta.json" if binary else cache
    cached = read_current_cache(cache, stamp, folder, load_dir if binary else load_npz)
    if cached is not None:
        return cached
    parse = lambda: _parsed_ogb(name, root, binary, cache)
    return announced(name, lambda: parse_into_cache(cache, stamp, folder, parse), log,
                     into=cache, doing="parsing OGB's files")


def _parsed_ogb(name: str, root, binary: bool, cache: Path) -> Dataset:
    """OGB dataset `name` parsed from its files, its cache written (`_load_ogb`)."""
    dataset = ogb.load_ogb(name, root)
    return dataset if binary else keep_cache(dataset, save_npz, cache)


def _cached(root, stem: str, build: Callable[[], Dataset], what: str,
            log: Log | None) -> Dataset:
    """Loads `<root>/<stem>.npz` if present, else builds the dataset (`log` told, as
    `what`) and writes it there."""
    if root is None:
        return announced(what, build, log)
    path = Path(root) / f"{stem}.npz"
    if path.exists():
        return read_cache(load_npz, path)
    return announced(what, lambda: keep_cache(build(), save_npz, path, "generated"), log,
                     into=path)


def is_typed(dataset) -> bool:
    """Whether `dataset` (a loaded dataset, or a name or path `load_dataset` would read)
    is a typed dataset, which `load_hetero_dataset` reads."""
    if isinstance(dataset, HeteroDataset):
        return True
    if not isinstance(dataset, str | os.PathLike):
        return False
    return str(dataset).lower() in HETERO_NAMES or is_hetero_path(dataset)


def load_hetero_dataset(name: str, root: str | os.PathLike | None = None, *,
                        scale: float = 1.0, seed: int = 0,
                        log: Log | None = None) -> HeteroDataset:
    """Loads a typed dataset by name, or from a typed `.npz` file or dataset directory.

    Args:
      name: "ogbn-mag" (OGB's layout under `root`, required; its parsed form is cached
        as `<root>/ogbn_mag/processed/zerognn-typed.npz`); "mag-like" (synthetic,
        ogbn-mag's shape times `scale`, cached as `<root>/mag-like-<scale>-<seed>.npz`);
        "igbh-like" (synthetic, IGBH-full's shape / 32 times `scale`, bfloat16
        features, cached as the directory `<root>/igbh-like-<scale>-<seed>/`); "shop-like"
        (synthetic users who buy items, data/shop.py, times `scale`, cached as
        `<root>/shop-like-<scale>-<seed>.npz`); a path
        written by `save_hetero_npz` or `save_hetero_dir`.
      root: data folder (no caching of the synthetic presets when None).
      log: as `load_dataset`'s: told when generating a preset or parsing ogbn-mag's
        folder takes more than a second, and when it ends.

    Raises:
      ValueError: unknown name or bad option, naming the valid choices.
      FileNotFoundError: data files are missing.
    """
    name = dataset_name(name)
    key = name.lower()
    check_seed(seed)
    if key not in TYPED_PRESETS and scale != 1.0:
        raise ValueError(f"scale applies to {', '.join(TYPED_PRESETS)}, got scale={scale} "
                         f"(--scale) for {name!r}")
    if key == "ogbn-mag":
        if root is None:
            raise ValueError(f"ogbn-mag needs root= (--root), the folder that holds "
                             f"{mag_folder('')}/")
        return _load_mag(root, log)
    if key in TYPED_PRESETS:
        make, suffix = TYPED_PRESETS[key]
        what = preset_label(key, scale, seed)
        if root is None:
            return announced(what, lambda: make(scale, seed), log)
        path = Path(root) / f"{key}-{scale:g}-{seed}{suffix}"
        if path.exists():  # (an unreadable one was generated over before)
            return read_cache(load_hetero, path)
        return announced(what, lambda: keep_cache(make(scale, seed), _save_typed, path,
                                                  "generated"), log, into=path)
    if is_hetero_path(name):
        return load_hetero(name)
    if key in {n.lower() for n in DATASET_NAMES} or is_graph_dataset(name) or \
            _node_path(name):
        raise ValueError(f"{name} is not a typed dataset: load it with "
                         f"{'load_graphs' if is_graph_dataset(name) else 'load_dataset'}")
    if names_a_missing_path(name):
        raise FileNotFoundError(f"typed dataset {name!r}: no such file or directory")
    if Path(name).exists():
        return load_hetero(name)  # a file that holds none: it says what is wrong
    raise ValueError(f"unknown typed dataset {name!r}; valid names: {', '.join(HETERO_NAMES)}")


def _node_path(name: str) -> bool:
    """Whether `name` is a node dataset's `.npz` file or directory (`save_npz`,
    `save_dir`), not a typed dataset's or a graph collection's."""
    path = Path(name)
    try:
        if is_dataset_dir(path):
            meta = json.loads((path / META).read_text())
            return isinstance(meta, dict) and "kind" not in meta and "format" not in meta
        if path.suffix == ".npz" and path.is_file():
            with open_npz(path) as npz:
                return "indptr" in npz.files and "meta" not in npz.files
    except (OSError, ValueError, EOFError, zipfile.BadZipFile):
        pass
    return False


def _save_typed(dataset: HeteroDataset, path: Path, *, overwrite: bool) -> None:
    (save_hetero_npz if path.suffix == ".npz" else save_hetero_dir)(dataset, path,
                                                                     overwrite=overwrite)


def _load_mag(root, log: Log | None) -> HeteroDataset:
    """ogbn-mag, from its cache when that was made from the raw and split files as they
    are (`cache_current`)."""
    folder = mag_folder(root)
    cache = folder / "processed" / "zerognn-typed.npz"
    cached = read_current_cache(cache, cache, folder, load_hetero_npz)
    if cached is not None:
        return cached
    parse = lambda: keep_cache(load_mag(root), _save_typed, cache)
    return announced("ogbn-mag", lambda: parse_into_cache(cache, cache, folder, parse), log,
                     into=cache, doing="parsing OGB's files")
