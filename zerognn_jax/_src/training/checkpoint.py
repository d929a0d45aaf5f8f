"""Epoch checkpoints through orbax: model/optimizer state plus a JSON record.

Orbax writes each checkpoint into a temporary folder and renames it when complete, so
a process killed mid-save leaves the previous checkpoint as the latest one.
"""

from __future__ import annotations

import os

import jax
import orbax.checkpoint as ocp


class Checkpointer:
    """Saves `{params, batch_stats, opt_state}` and a JSON dict after each epoch."""

    def __init__(self, directory: str, *, keep: int = 2):
        self._manager = ocp.CheckpointManager(
            os.path.abspath(directory),
            options=ocp.CheckpointManagerOptions(max_to_keep=keep, create=True,
                                                 enable_async_checkpointing=False),
            item_names=("state", "meta"),
        )

    def latest_epoch(self) -> int | None:
        return self._manager.latest_step()

    def save(self, epoch: int, state: dict, meta: dict) -> None:
        self._manager.save(epoch, args=ocp.args.Composite(
            state=ocp.args.StandardSave(state), meta=ocp.args.JsonSave(meta)))
        self._manager.wait_until_finished()

    def restore(self, epoch: int, like: dict) -> tuple[dict, dict]:
        """Restores the checkpoint of `epoch` into the structure and shardings of `like`."""
        abstract = jax.tree_util.tree_map(ocp.utils.to_shape_dtype_struct, like)
        out = self._manager.restore(epoch, args=ocp.args.Composite(
            state=ocp.args.StandardRestore(abstract), meta=ocp.args.JsonRestore()))
        return out["state"], out["meta"]

    def close(self) -> None:
        self._manager.close()
