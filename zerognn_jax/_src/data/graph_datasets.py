"""Graph collections by name: the synthetic presets, OGB's graph-property folders and
files written by `save_graphs`; the one entry point of graph-level tasks and the CLI."""

from __future__ import annotations

import os
from pathlib import Path

from zerognn_jax._src.data.announce import Log, announced, preset_label
from zerognn_jax._src.data.checks import check_seed
from zerognn_jax._src.data.graph_storage import is_graphs_path, load_graphs_file, save_graphs
from zerognn_jax._src.data.graphs import GraphCollection
from zerognn_jax._src.data.molecules import molhiv_like, molpcba_like
from zerognn_jax._src.data.ogbg import GRAPH_SPECS, load_ogbg
from zerognn_jax._src.data.storage import dataset_name, names_a_missing_path
from zerognn_jax._src.data.writes import keep_cache, read_cache

PRESETS = {"molhiv-like": molhiv_like, "molpcba-like": molpcba_like}
GRAPH_DATASET_NAMES = (*PRESETS, *GRAPH_SPECS, "<graphs>.npz", "<graphs directory>")
GRAPH_NAMES = frozenset((*PRESETS, *GRAPH_SPECS))  # the collections known by name


def is_graph_dataset(name: str) -> bool:
    """Whether `load_graphs` reads `name` (a preset, an OGB graph dataset, or a file or
    directory written by `save_graphs`)."""
    name = dataset_name(name)
    return name.lower() in GRAPH_NAMES or is_graphs_path(name)


def graph_task_needed(name: str) -> str:
    """What a run of another task than "graph" on the graph collection `name` is told."""
    return (f"{name} is a collection of small graphs: train it with task='graph' "
            "(--task graph); load_graphs reads it")


def load_graphs(name: str, root: str | os.PathLike | None = None, *, scale: float = 1.0,
                seed: int = 0, log: Log | None = None) -> GraphCollection:
    """Loads a graph collection by name.

    Args:
      name: "molhiv-like", "molpcba-like" (synthetic, graph counts times `scale`;
        cached as `<root>/<name>-<scale>-<seed>.npz` when `root` is given);
        "ogbg-molhiv", "ogbg-molpcba" (OGB's folder under `root`, required); or a
        `.npz` file or directory written by `save_graphs`.
      scale, seed: of the synthetic presets (scale must be 1 for the others).
      log: as `load_dataset`'s: told when generating a preset or parsing an OGB folder
        takes more than a second, and when it ends.

    Raises:
      ValueError: an unknown name or a bad option, naming the choices; a file or
        directory that holds no readable collection, naming the problem.
      FileNotFoundError: data files are missing.
    """
    name = dataset_name(name)
    key = name.lower()
    check_seed(seed)
    if key in PRESETS:
        what = preset_label(key, scale, seed)
        if root is None:
            return announced(what, lambda: PRESETS[key](scale, seed), log)
        path = Path(root) / f"{key}-{scale:g}-{seed}.npz"
        if path.exists():
            return read_cache(load_graphs_file, path)
        return announced(what, lambda: keep_cache(PRESETS[key](scale, seed), save_graphs, path,
                                                  "generated"), log, into=path)
    if scale != 1.0:
        raise ValueError(f"scale applies to the synthetic presets ({', '.join(PRESETS)}), "
                         f"got scale={scale} (--scale) for {name!r}")
    if key in GRAPH_SPECS:
        if root is None:
            raise ValueError(f"{key} needs root= (--root), the folder that holds "
                             f"{GRAPH_SPECS[key].folder}/")
        return load_ogbg(key, root, log)
    if names_a_missing_path(name):
        raise FileNotFoundError(f"graph dataset {name!r}: no such file or directory")
    if is_graphs_path(name) or Path(name).is_file() or (Path(name) / "meta.json").is_file():
        return load_graphs_file(name)  # a file that holds none: it says what is wrong
    folder = (f"; the folder {name} holds no meta.json, which save_graphs writes"
              if Path(name).is_dir() else "")
    raise ValueError(f"unknown graph dataset {name!r}; valid names: "
                     f"{', '.join(GRAPH_DATASET_NAMES)} (node and typed datasets, one "
                     f"graph each, are read by load_dataset and load_hetero_dataset){folder}")
