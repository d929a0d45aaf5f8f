"""Graph-level losses (per graph row, missing labels masked: losses.py) and evaluation metrics:
ROC-AUC and AP averaged over the tasks (OGB's molhiv and molpcba evaluators: a task
counts when its labelled graphs hold both classes), accuracy, mean absolute error; NaN
when an output is."""

from __future__ import annotations

import numpy as np

from zerognn_jax._src.training.tasks.link_metrics import scored_ap, scored_auc
from zerognn_jax._src.training.tasks.losses import (
    class_accuracy,
    masked_abs_error,
    masked_label_accuracy,
    masked_sigmoid,
    masked_squared_error,
    softmax_cross_entropy,
)

# Per kind of graph target (GraphCollection.target_kind): the built-in losses, the
# default, the per-row score reported during training, and the evaluation metrics.
LOSSES = {"sigmoid": masked_sigmoid, "cross_entropy": softmax_cross_entropy,
          "mae": masked_abs_error, "mse": masked_squared_error}
DEFAULT_LOSS = {"binary": "sigmoid", "classes": "cross_entropy", "regression": "mae"}
SCORES = {"binary": masked_label_accuracy, "classes": class_accuracy, "regression": None}
METRICS = {"binary": ("rocauc", "ap"), "classes": ("acc",), "regression": ("mae",)}


def _per_task(outputs, targets, metric) -> float:
    """The mean of `metric(pos_scores, neg_scores)` over the tasks whose labelled rows
    hold both classes; NaN when none does."""
    values = []
    for t in range(targets.shape[1]):
        known = ~np.isnan(targets[:, t])
        y, s = targets[known, t], outputs[known, t]
        if y.size and 0 < y.sum() < y.size:
            values.append(metric(s[y > 0.5], s[y < 0.5]))
    return float(np.mean(values)) if values else float("nan")


def graph_metrics(outputs, targets, kind: str) -> dict:
    """{metric: value} of one split (`METRICS[kind]`): outputs float[G, T] (logits for
    "binary"), targets as stored (NaN = missing)."""
    out = np.asarray(outputs, np.float64)
    t = np.asarray(targets)
    if not len(out) or np.isnan(out).any():  # no rows, or a NaN output: null in records
        return {name: float("nan") for name in METRICS[kind]}
    if kind == "classes":
        acc = float(np.mean(out.argmax(-1) == t)) if t.size else float("nan")
        return {"acc": acc}
    out, t = out.reshape(len(out), -1), t.reshape(len(t), -1).astype(np.float64)
    if kind == "regression":
        known = ~np.isnan(t)
        mae = float(np.abs(out - np.nan_to_num(t))[known].mean()) if known.any() \
            else float("nan")
        return {"mae": mae}
    return {"rocauc": _per_task(out, t, scored_auc), "ap": _per_task(out, t, scored_ap)}
