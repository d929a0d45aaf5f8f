"""The errors and warnings of checkpoints (checkpoint.py), apart from it: the package
exports them, and checkpoint.py imports orbax, which `import zerognn_jax` (and every
`zerognn --help`) would otherwise pay for (0.3-0.4 s on a 2-core machine)."""

from __future__ import annotations


class CheckpointMismatch(ValueError):
    """The checkpoint folder holds a run with other options or another model."""


class CheckpointWarning(UserWarning):
    """A checkpoint could not be read and was set aside, or an epoch's best_metric has
    no value to rank it by."""


class OwnModelNeeded(CheckpointMismatch):
    """The checkpoint holds a run of a user's model (class name `model`), and a restore
    was asked for without one: only that model can read its variables back."""

    def __init__(self, message: str, model: str):
        super().__init__(message)
        self.model = model
