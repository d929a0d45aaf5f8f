"""Epoch callbacks: functions `train` calls with each epoch's record, which may stop it.

A callback is any callable `callback(record) -> bool | None`, called after the epoch's
checkpoint and metrics line are written, with the epoch's record (the dict of the
metrics log: "epoch", "loss", "train_batch_acc" ("train_batch_pair_acc" for link
prediction: the task's `score_name`), the evaluated "val_acc", ... when that epoch was
evaluated). A true return value stops training after this epoch; the run then
evaluates and writes its summary as usual, with "stopped_early" set. Every callback sees
every record (they are all called before the stop is taken). A callback with a `reset()`
method has it called when a run starts, before any record (`EarlyStopping` forgets the
best value and the patience spent of an earlier run). A resumed run first shows
the records it holds to its `EarlyStopping` callbacks (`replay_early_stopping`), so that
a resumed run stops where the uninterrupted one would, and one they stopped stays
stopped when run again; other callbacks see the epochs completed from then on.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable, Sequence

from zerognn_jax._src.data.checks import at_least_one


def best_mode(metric: str) -> str:
    """"min" for an error or a loss (`*_mse`, `*_mae`, `*_loss`, the training `loss`),
    else "max": the direction a best checkpoint and `EarlyStopping` take."""
    return "min" if metric == "loss" or metric.endswith(("_mse", "_mae", "_loss")) else "max"


class EarlyStopping:
    """Stops when `metric` has not improved by more than `min_delta` for `patience`
    evaluated epochs (records without the metric are skipped).

    `mode` is "max" or "min"; None picks "min" for `*_mse`, `*_mae`, `*_loss` and the
    training `loss`, else "max" (`best_mode`).
    """

    def __init__(self, metric: str = "val_acc", patience: int = 10, *,
                 mode: str | None = None, min_delta: float = 0.0):
        if not isinstance(metric, str) or not metric:
            raise ValueError(f"metric must be the name of a record's metric (e.g. "
                             f"'val_acc'), got {metric!r}")
        patience = at_least_one(patience, "patience")
        if isinstance(min_delta, bool) or not isinstance(min_delta, numbers.Real) \
                or not math.isfinite(min_delta) or min_delta < 0:
            raise ValueError(f"min_delta must be a finite number >= 0, got {min_delta!r}")
        self.metric, self.patience, self.min_delta = metric, patience, min_delta
        self.mode = mode or best_mode(metric)
        if self.mode not in ("min", "max"):
            raise ValueError(f"mode must be 'min' or 'max', got {mode!r}")
        self.reset()

    def reset(self) -> None:
        """Forgets the records seen: `train` calls it when a run starts, so that one
        instance serves run after run."""
        self.best, self.best_epoch, self.waited = None, None, 0

    def __call__(self, record: dict) -> bool:
        value = record.get(self.metric)
        if value is None or not math.isfinite(value):
            return False
        sign = 1.0 if self.mode == "max" else -1.0
        if self.best is None or sign * (value - self.best) > self.min_delta:
            self.best, self.best_epoch, self.waited = value, record.get("epoch"), 0
            return False
        self.waited += 1
        return self.waited >= self.patience


def check_callbacks(callbacks) -> tuple[Callable, ...]:
    """`callbacks` as a tuple of callables (one callable alone is accepted)."""
    if callable(callbacks):  # a class too, named below
        callbacks = (callbacks,)
    try:
        callbacks = tuple(callbacks or ())
    except TypeError:
        raise TypeError(f"callbacks must be a callable or a sequence of callables, got "
                        f"{type(callbacks).__name__}") from None
    for cb in callbacks:
        if isinstance(cb, type):  # callable too: calling it would make an instance
            raise TypeError(f"a callback must be callable with the epoch record, got the "
                            f"class {cb.__name__}: pass an instance, {cb.__name__}(...)")
        if not callable(cb):
            raise TypeError(f"a callback must be callable with the epoch record, got "
                            f"{type(cb).__name__}")
    return callbacks


def reset_callbacks(callbacks: Sequence[Callable]) -> None:
    """Calls the `reset()` of every callback that has one (a run is starting)."""
    for cb in callbacks:
        reset = getattr(cb, "reset", None)
        if callable(reset):
            reset()


def replay_early_stopping(callbacks: Sequence[Callable], records) -> str | None:
    """Feeds the `records` of the epochs a resumed run already holds to its
    `EarlyStopping` callbacks, so that they count patience from where the run was (a
    fresh one would restart the count, and rerunning a run it had stopped trained on);
    the name of the first whose patience has run out at the last record, or None (one
    added on resume whose patience ran out at an earlier record stops nothing: that
    run went on). Other callbacks, which may log or write, see only the epochs the
    resumed run completes."""
    stop = None
    for i, record in enumerate(records):
        for cb in callbacks:
            if isinstance(cb, EarlyStopping) and cb(dict(record)) and stop is None \
                    and i == len(records) - 1:
                stop = _name(cb)
    return stop


def run_callbacks(callbacks: Sequence[Callable], record: dict) -> str | None:
    """Calls every callback with a copy of `record`; the name of the first one that asked
    to stop, or None."""
    stop = None
    for cb in callbacks:
        if cb(dict(record)) and stop is None:
            stop = _name(cb)
    return stop


def _name(cb: Callable) -> str:
    """What a run's summary calls the callback that stopped it."""
    return getattr(cb, "__name__", None) or type(cb).__name__
