"""Epoch checkpoints through orbax: model and optimizer state plus a JSON record.

Each checkpoint holds `state` ({params, batch_stats, opt_state}) and `meta`: the run's
`identity` (the options that shape the trained values, and the dataset's size), the
envelope, the shapes of the state's arrays and the epoch records so far. Orbax writes a
checkpoint into a temporary folder and renames it when complete, so a process killed
mid-save leaves the previous checkpoint as the latest one.

Resuming (`find_resumable`, then `restore`): a checkpoint written with other options is
refused with one line naming the options that differ; one that cannot be read is moved
aside to `<epoch>.corrupt` with a `CheckpointWarning`, and the previous one kept is used.
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import inspect
import json
import logging
import os
import sys
import warnings
from pathlib import Path

import jax
import orbax.checkpoint as ocp

FORMAT = 1
# TrainConfig fields a resumed run may change: they leave the trained values unchanged
# (engines, kernels and envelopes give the same result; the batch is compared as the
# global batch, so the devices may change with the per-device batch; the data are
# compared by their sizes, not by the name or path they were loaded from) or only say how
# long to train, what to evaluate and where to write. Every other field, new ones
# included, must match the checkpoint.
FREE_ON_RESUME = frozenset({
    "epochs", "dataset", "root", "batch_size", "devices", "shard_features", "kernels",
    "chunk_steps", "engine", "envelope", "margin", "multiple", "eval_mode", "eval_every",
    "eval_batch_size", "checkpoint_dir", "metrics_out", "progress",
})
DATASET_KEYS = ("name", "nodes", "directed_edges", "features", "classes", "train")


class CheckpointMismatch(ValueError):
    """The checkpoint folder holds a run with other options or another model."""


class CheckpointWarning(UserWarning):
    """A checkpoint could not be read and was set aside."""


def identity(cfg, dataset_stats: dict, global_batch: int) -> dict:
    """What a checkpoint must agree on with the run resuming from it, as flat JSON: the
    TrainConfig fields not in FREE_ON_RESUME, the global batch (seeds per step over every
    device and process) and the dataset's counts (`Dataset.stats()`)."""
    out = {f.name: getattr(cfg, f.name) for f in dataclasses.fields(cfg)
           if f.name not in FREE_ON_RESUME}
    out["global_batch"] = global_batch
    out.update({f"dataset.{k}": dataset_stats[k] for k in DATASET_KEYS})
    return json.loads(json.dumps(out))


def state_spec(state) -> dict:
    """{path: [shape, dtype]} of every array of `state`."""
    leaves = jax.tree_util.tree_flatten_with_path(state)[0]
    return {jax.tree_util.keystr(path): [list(leaf.shape), str(leaf.dtype)]
            for path, leaf in leaves}


def _differences(saved: dict, current: dict) -> list[str]:
    """"key A there, B here" for every key whose value differs (or is absent on one side)."""
    absent = object()
    show = lambda v: "absent" if v is absent else repr(v)
    keys = list(current) + [k for k in saved if k not in current]
    return [f"{k} {show(saved.get(k, absent))} there, {show(current.get(k, absent))} here"
            for k in keys if saved.get(k, absent) != current.get(k, absent)]


def _short(err: BaseException) -> str:
    text = str(err).strip().splitlines()
    return f"{type(err).__name__}: {text[0][:160] if text else ''}"


@contextlib.contextmanager
def _quiet():
    """Silences orbax while it reads: its log lines, and the asyncio leftovers of a failed
    read ("Exception ignored in <coroutine ...>"), collected here rather than at exit."""
    logger, hook = logging.getLogger("absl"), sys.unraisablehook
    level = logger.level
    logger.setLevel(logging.CRITICAL)
    sys.unraisablehook = lambda u: None if inspect.iscoroutine(u.object) else hook(u)
    try:
        yield
    finally:
        gc.collect()
        sys.unraisablehook = hook
        logger.setLevel(level)


class Checkpointer:
    """Saves `{params, batch_stats, opt_state}` and a JSON dict after each epoch."""

    def __init__(self, directory: str, *, keep: int = 2):
        self.directory = Path(directory).absolute()
        with _quiet():
            self._manager = ocp.CheckpointManager(
                self.directory,
                options=ocp.CheckpointManagerOptions(max_to_keep=keep, create=True,
                                                     enable_async_checkpointing=False),
                item_names=("state", "meta"),
            )

    def latest_epoch(self) -> int | None:
        return self._manager.latest_step()

    def save(self, epoch: int, state: dict, meta: dict) -> None:
        """Writes the checkpoint of `epoch`; `meta` gets the format and the state's shapes."""
        meta = {"format": FORMAT, "epoch": epoch, "state_spec": state_spec(state), **meta}
        saved = self._manager.save(epoch, args=ocp.args.Composite(
            state=ocp.args.StandardSave(state), meta=ocp.args.JsonSave(meta)))
        self._manager.wait_until_finished()
        if not saved:
            raise RuntimeError(f"orbax did not save epoch {epoch} into {self.directory}: a "
                               f"checkpoint of that epoch exists already")

    def read_meta(self, epoch: int) -> dict:
        with _quiet():
            out = self._manager.restore(epoch, args=ocp.args.Composite(
                meta=ocp.args.JsonRestore()))
        if not isinstance(out["meta"], dict):
            raise ValueError(f"meta is {type(out['meta']).__name__}, not a JSON object")
        return out["meta"]

    def restore(self, epoch: int, like: dict) -> tuple[dict, dict]:
        """Restores the checkpoint of `epoch` into the structure and shardings of `like`."""
        abstract = jax.tree_util.tree_map(ocp.utils.to_shape_dtype_struct, like)
        with _quiet():
            out = self._manager.restore(epoch, args=ocp.args.Composite(
                state=ocp.args.StandardRestore(abstract), meta=ocp.args.JsonRestore()))
        return out["state"], out["meta"]

    def find_resumable(self, ident: dict) -> list[int]:
        """The epochs to try resuming from, newest first: from the newest checkpoint whose
        record can be read and has the identity `ident` (unreadable newer ones are set
        aside); [] for a folder without checkpoints.

        Raises:
          CheckpointMismatch: that checkpoint has another identity.
          ValueError: checkpoints exist but none can be read.
        """
        return self._first_readable(ident, None)[0]

    def restore_first(self, epochs: list[int], ident: dict,
                      like: dict) -> tuple[int, dict, dict] | None:
        """(epoch, state, meta) of the first of `epochs` whose state restores into the
        structure and shardings of `like` (the ones before it are set aside); None if
        `epochs` is empty. Raises as `find_resumable`, and CheckpointMismatch for a
        checkpoint whose arrays have other shapes than `like`'s."""
        epochs, restored = self._first_readable(ident, like, epochs)
        return None if restored is None else (epochs[0], *restored)

    def _first_readable(self, ident: dict, like: dict | None, epochs=None):
        if epochs is None:
            epochs = sorted(self._manager.all_steps(), reverse=True)
        problems = []
        for i, epoch in enumerate(epochs):
            try:
                meta = self.read_meta(epoch)
                self._check(epoch, meta, ident, like)
                restored = None if like is None else self.restore(epoch, like)
            except CheckpointMismatch:
                raise
            except Exception as err:  # noqa: BLE001 - any failure to read means corrupt
                problems.append(f"epoch {epoch}: {_short(err)}")
                continue
            self._set_aside(epochs[:i], problems)
            return epochs[i:], restored
        if problems:
            raise ValueError(f"no readable checkpoint in {self.directory} "
                             f"({'; '.join(problems)}); move the folder away to start afresh")
        return [], None

    def _check(self, epoch: int, meta: dict, ident: dict, like: dict | None) -> None:
        """Raises CheckpointMismatch if `meta` records another identity or other arrays."""
        where = f"checkpoint_dir {self.directory} holds"
        if "identity" not in meta:
            raise CheckpointMismatch(f"{where} a checkpoint that records no options (epoch "
                                     f"{epoch}, written by an older version); use another "
                                     f"checkpoint_dir")
        diff = _differences(meta["identity"], ident)
        if diff:
            raise CheckpointMismatch(
                f"{where} a run with other settings (epoch {epoch}): {'; '.join(diff)}; "
                f"resume with the same settings or use another checkpoint_dir")
        diff = [] if like is None else _differences(meta.get("state_spec", {}),
                                                    state_spec(like))
        if diff:
            raise CheckpointMismatch(f"{where} other model variables (epoch {epoch}): "
                                     f"{'; '.join(diff[:3])}")

    def _set_aside(self, epochs: list[int], problems: list[str]) -> None:
        """Renames the unreadable checkpoints of `epochs` to `<epoch>.corrupt`, so the
        epochs can be saved again, and warns."""
        if not epochs:
            return
        if jax.process_index() == 0:
            for epoch in epochs:
                src, n = self.directory / str(epoch), 0
                dst = self.directory / f"{epoch}.corrupt"
                while dst.exists():
                    n += 1
                    dst = self.directory / f"{epoch}.corrupt-{n}"
                os.replace(src, dst)
        self._manager.reload()
        names = ", ".join(f"{e}.corrupt" for e in epochs)
        warnings.warn(f"unreadable checkpoint in {self.directory} ({'; '.join(problems)}); "
                      f"set aside as {names}, resuming from the one before", CheckpointWarning,
                      stacklevel=4)

    def close(self) -> None:
        self._manager.close()
