"""What a checkpoint records to rebuild its run for inference, and the config it gives.

Every checkpoint's `meta` holds, besides the run's identity (checkpoint.py), the whole
`TrainConfig` with the dataset root, a link split's file, and a dataset read from a
file or folder, made absolute (`"config"`) and whether the dataset was a `Dataset`
passed to `train()` rather than loaded by `cfg.dataset` (`"dataset_given"`). `restore` and `predict`
(inference.py) rebuild the run from these without the caller's config: the dataset is
loaded from the recorded root, not searched for under `~/.cache`. Checkpoints written
before this record fall back to the identity's options (the dataset's name, no root).
"""

from __future__ import annotations

import dataclasses
import os

from zerognn_jax._src.data.graph_datasets import GRAPH_DATASET_NAMES
from zerognn_jax._src.data.loaders import DATASET_NAMES, HETERO_NAMES
from zerognn_jax._src.data.storage import is_dataset_dir
from zerognn_jax._src.training.config import TrainConfig

# Datasets' names. The graph and typed loaders read a name before a file or folder of
# that name; `load_dataset` (node and link tasks) reads an .npz file or a dataset
# folder first.
NAMES = frozenset(n.lower() for n in (*DATASET_NAMES, *HETERO_NAMES, *GRAPH_DATASET_NAMES))
TYPED_NAMES = frozenset(n.lower() for n in HETERO_NAMES)
# Set when a run is rebuilt from its checkpoint: on one device, writing nothing.
REBUILT = {"progress": False, "checkpoint_dir": None, "metrics_out": None,
           "tensorboard_dir": None, "best_metric": None, "patience": 0, "devices": 1,
           "shard_features": False}


def rebuild_record(cfg: TrainConfig, dataset, given: bool) -> dict:
    """{"config": every option (the root, a link split's file, and a dataset read from a
    path, absolute), "dataset_given": bool} of a run."""
    config = dataclasses.asdict(cfg)
    for name in ("root", "link_split"):
        if getattr(cfg, name) is not None:
            config[name] = os.path.abspath(getattr(cfg, name))
    if given:  # recorded for the message that asks for it: its name, not cfg.dataset's
        config["dataset"] = dataset.name
    elif read_from_path(cfg):  # a dataset file or folder, found then from any folder
        config["dataset"] = os.path.abspath(cfg.dataset)
    return {"config": config, "dataset_given": bool(given)}


def read_from_path(cfg: TrainConfig) -> bool:
    """Whether the run's loader reads `cfg.dataset` as a file or folder (see NAMES)."""
    name = cfg.dataset
    if not isinstance(name, str | os.PathLike) or not os.path.exists(name):
        return False
    name = os.fspath(name)
    if name.lower() not in NAMES:
        return True
    return cfg.task != "graph" and name.lower() not in TYPED_NAMES and (
        name.endswith(".npz") or is_dataset_dir(name))


def config_of(meta: dict) -> TrainConfig:
    """The TrainConfig of a checkpoint's run on one device (the global batch as the
    batch; `REBUILT`): the recorded config, or for an older checkpoint the identity's
    options (those that do not shape the trained values take their defaults)."""
    ident = meta.get("identity", {})
    names = {f.name for f in dataclasses.fields(TrainConfig)}
    if "config" in meta:
        values = {k: v for k, v in meta["config"].items() if k in names}
    else:
        values = {k: v for k, v in ident.items() if k in names}
        values["dataset"] = ident.get("dataset.name", "tiny")
    if "global_batch" in ident:
        values["batch_size"] = ident["global_batch"]
    return TrainConfig(**{**values, **REBUILT})


def check_dataset(meta: dict, dataset) -> None:
    """Raises ValueError when the run trained on data passed to `train()` (a Dataset,
    HeteroDataset or GraphCollection) and none is given now: it cannot be loaded by
    name."""
    if dataset is None and meta.get("dataset_given"):
        config = meta.get("config", {})
        name = config.get("dataset")
        kind = "GraphCollection" if config.get("task") == "graph" else "dataset"
        raise ValueError(f"the checkpoint's run trained on a {kind} passed to train() "
                         f"(named {name!r}), which cannot be loaded by name: pass it, "
                         f"restore(..., dataset=...) (zerognn export and "
                         f"predict: --dataset and the file it was saved to)")
