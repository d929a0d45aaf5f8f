"""Node tasks: classification (integer labels, the default), multi-label classification
and regression on the training nodes, one output row per seed.

The loss and the score are plain per-row functions over (outputs, targets), so a
user's loss plugs in unchanged (`node_task`).
"""

from __future__ import annotations

import dataclasses
import functools
import warnings
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np

from zerognn_jax._src.data.checks import LibraryWarning
from zerognn_jax._src.data.dataset import Dataset
from zerognn_jax._src.data.loaders import load_dataset
from zerognn_jax._src.training.tasks.base import (
    ItemsAreLevel0,
    Predictor,
    TaskBatch,
    data_log,
    require_dataset,
)
from zerognn_jax._src.training.tasks.link_metrics import any_nan, scored_auc
from zerognn_jax._src.training.tasks.losses import (
    LOSSES,
    SCORES,
    class_accuracy,
    masked_label_accuracy,
    masked_sigmoid,
    masked_squared_error,
    row_weights,
    softmax_cross_entropy,
)

SPLITS = ("train", "val", "test")
# The built-in loss of each kind of node target (Dataset.target_kind).
DEFAULT_LOSS = {"classes": "cross_entropy", "multilabel": "sigmoid", "regression": "mse"}
# What `evaluate` reports per split, by kind of target ("loss": the task's loss, the
# mean over the split's nodes, as the training loss is over a step's seeds).
METRICS = {"classes": ("acc", "loss"), "multilabel": ("acc", "f1", "rocauc", "loss"),
           "regression": ("mse", "loss")}
# The loss and score of a built-in float loss where some targets are missing (NaN).
MASKED = {"sigmoid": (masked_sigmoid, masked_label_accuracy), "mse": (masked_squared_error,
                                                                       None)}
# A built-in loss that reads every entry, by the name of its task that leaves missing ones
# out.
UNMASKED = {LOSSES[name]: name for name in MASKED}


@dataclasses.dataclass(frozen=True, eq=False)
class NodeTask(ItemsAreLevel0):
    """Supervised learning on the training nodes: one output row per seed (`Task`).

    Attributes:
      loss: (outputs[rows, ...], targets[rows, ...]) -> float32[rows], per-row losses;
        the engine averages them over the real seeds (padding rows never count).
      score: the same shape of function giving a per-row score in [0, 1] (reported as
        accuracy), or None when it means nothing (regression).
      weight: None (each real seed weighs 1), or (targets[rows, ...], valid
        bool[rows]) -> float32[rows], each row's weight in that average (0 for
        padding): float targets with missing (NaN) entries weigh a row by its given
        entries (`row_weights`), so that the loss is the mean over the batch's entries.
    """

    loss: Callable = softmax_cross_entropy
    score: Callable | None = class_accuracy
    weight: Callable | None = None
    name = "node"
    score_name = "acc"  # the fraction of rows (or of labels) the outputs get right
    dedups_seeds = False
    tree_by_default = True
    row_normalizes_planetoid = True

    def __post_init__(self):
        for what in ("loss", "score", "weight"):
            fn = getattr(self, what)
            if not (callable(fn) or (fn is None and what != "loss")):
                named = (f"; a built-in loss by name is NodeTask.named({fn!r})"
                         if isinstance(fn, str) and fn in LOSSES else "")
                raise TypeError(f"NodeTask's {what} must be a function"
                                + (" or None" if what != "loss" else "")
                                + f", got {type(fn).__name__} {fn!r}{named}")

    @classmethod
    def named(cls, loss: str, *, missing: bool = False) -> NodeTask:
        """The task of a built-in loss: "cross_entropy", "sigmoid" or "mse"; `missing`:
        of float targets with missing (NaN) entries, which it leaves out."""
        if loss not in LOSSES:
            raise ValueError(f"loss must be one of {', '.join(LOSSES)}, got {loss!r}")
        if missing and loss in MASKED:
            return cls(*MASKED[loss], row_weights)
        return cls(LOSSES[loss], SCORES[loss])

    @classmethod
    def build(cls, cfg, dataset: Dataset | None, *, loss=None, kernels=None
              ) -> tuple[NodeTask, Dataset]:
        """The node task of `loss` (`node_task`) on `dataset` (default: `cfg.dataset`),
        its loss checked against the dataset's targets."""
        del kernels  # a node task runs no op of its own
        named = cfg.dataset if dataset is None else None  # (as the user named it)
        if dataset is None:
            dataset = load_dataset(cfg.dataset, cfg.root, scale=cfg.scale, seed=cfg.seed,
                                   log=data_log(cfg))
        require_dataset(dataset, "node")
        require_labels(dataset, named)
        task = node_task(loss, dataset)
        check_loss(task, task.output_dim(cfg, dataset), task.device_targets(dataset))
        return task, dataset

    def output_dim(self, cfg, dataset: Dataset) -> int:
        del cfg
        return dataset.output_dim

    def wrap_model(self, model, cfg):
        del cfg
        return model

    def device_targets(self, dataset: Dataset) -> np.ndarray:
        """Class ids int32[N] (unlabelled nodes' -1 as 0, never a training row), or the
        float targets float32[N, T] of multi-label or regression datasets."""
        if dataset.targets is not None:
            return dataset.targets
        return np.maximum(dataset.labels, 0).astype(np.int32)

    def batch(self, data, items, valid, key, level) -> TaskBatch:
        """Targets are the items' rows of `data.targets`."""
        del key
        targets = jax.tree_util.tree_map(lambda t: t[items], data.targets)
        return TaskBatch(targets, batch_weights(self, targets, valid), {}, level)

    def restrict(self, mb, batch: TaskBatch):
        """The sampled minibatch the model may read (node tasks hide nothing)."""
        del batch
        return mb

    def metric_names(self, dataset: Dataset) -> tuple[str, ...]:
        return METRICS[dataset.target_kind]

    def evaluate(self, predictor: Predictor, dataset: Dataset) -> dict:
        """Every split's metrics (`metric_names`) from the model's output rows."""
        result, parts = {}, [np.asarray(getattr(dataset, f"{split}_idx")) for split in SPLITS]
        for split, idx, outputs in zip(SPLITS, parts, predictor.split_outputs(parts)):
            metrics = split_metrics(outputs, dataset, idx, self)
            result.update({f"{split}_{name}": value for name, value in metrics.items()})
        return result


def split_metrics(outputs, dataset, ids, task) -> dict:
    """The metrics of the output rows of nodes `ids` of `dataset` (a `Dataset` or a typed
    one, whose ids are its target type's): the accuracy of class labels, or
    `target_metrics` of float targets; and the mean of `task`'s per-row loss over the
    targets it trains on (`device_targets`; NaN for no rows)."""
    if dataset.targets is None:
        metrics = {"acc": accuracy(outputs, np.asarray(dataset.labels)[ids])}
    else:
        metrics = target_metrics(outputs, dataset.targets[ids], dataset.target_kind)
    if not len(ids):  # (the built-in losses cannot reshape no rows)
        metrics["loss"] = float("nan")
        return metrics
    targets = task.device_targets(dataset)[ids]
    # summed on the host in float64: the same figure whatever JAX's 64-bit mode
    rows = np.asarray(task.loss(jnp.asarray(outputs), jnp.asarray(targets)), np.float64)
    if getattr(task, "weight", None) is None:
        metrics["loss"] = float(rows.mean())
    else:  # (weighed as the step weighs them)
        weight = np.asarray(task.weight(jnp.asarray(targets), jnp.ones(len(ids), bool)),
                            np.float64)
        metrics["loss"] = float(np.sum(rows * weight) / np.sum(weight)) if weight.sum() \
            else float("nan")
    return metrics


def accuracy(logits, labels) -> float:
    """The fraction of rows whose arg-max class is the label (NaN for no rows, or any
    NaN logit: its arg-max would be the NaN's class)."""
    if len(labels) == 0 or any_nan(logits):
        return float("nan")
    pred = np.asarray(jnp.argmax(logits, -1))
    return float(np.mean(pred == np.asarray(labels)))


def target_metrics(outputs, targets, kind: str) -> dict:
    """Metrics of float node targets, over every (row, column) entry; NaN for no rows,
    and (with a warning) for outputs of another shape than the targets'.

    "multilabel" (logits against {0, 1} targets, a logit > 0 predicts 1): {"acc": the
    fraction of labels right, "f1": micro-averaged F1, "rocauc": the ROC-AUC of each
    target column averaged over the columns with both classes present (OGB's
    ogbn-proteins metric; NaN if none has)}; F1 is NaN with no positive label and none
    predicted (nothing to score). "regression": {"mse"}. NaN outputs give NaN metrics; a
    NaN target is a missing label, left out of every metric (as OGB's evaluators do).
    """
    out, t = (np.asarray(a, np.float32) for a in (outputs, targets))
    out, t = (a.reshape(len(a), int(np.prod(a.shape[1:]))) for a in (out, t))  # 0 rows too
    if out.shape != t.shape:  # (they broadcast: a wrong width gave a number) a user's
        # loss may read outputs of another width (a mean and a variance): no metric then
        warnings.warn(f"outputs {list(out.shape)} and targets {list(t.shape)} differ in "
                      f"shape: their {kind} metrics are undefined (NaN)", LibraryWarning,
                      stacklevel=2)
        names = ("mse",) if kind == "regression" else ("acc", "f1", "rocauc")
        return dict.fromkeys(names, float("nan"))
    known = ~np.isnan(t)
    if kind == "regression":
        return {"mse": float(np.mean(np.square(out - t)[known])) if known.any()
                else float("nan")}
    if kind != "multilabel":
        raise ValueError(f"target kind must be multilabel or regression, got {kind!r}")
    if not known.any() or any_nan(out):
        return {"acc": float("nan"), "f1": float("nan"), "rocauc": float("nan")}
    pred, true = out > 0, t > 0.5
    tp = float(np.sum(pred & true & known))
    wrong = float(np.sum((pred != true) & known))
    columns = [(out[known[:, j], j], true[known[:, j], j]) for j in range(t.shape[1])]
    aucs = [scored_auc(o[y], o[~y]) for o, y in columns if y.any() and not y.all()]
    return {"acc": 1.0 - wrong / known.sum(), "f1": 2 * tp / (2 * tp + wrong)
            if tp or wrong else float("nan"),
            "rocauc": float(np.mean(aucs)) if aucs else float("nan")}


def require_labels(dataset, named: str | None = None) -> None:
    """ValueError for a dataset (typed or not) that labels none of its target nodes and
    has no float targets: a graph for link prediction alone, which a node task would
    train nothing on; one of no nodes at all; or one of a single class, whose
    cross-entropy is 0 whatever the model gives (it trained at a loss of 0). `named`: how
    the run named it (a path; None: its own name)."""
    named = dataset.name if named is None else named
    if np.asarray(dataset.labels).size == 0:
        raise ValueError(f"dataset {named!r} has no nodes: a node task has nothing to "
                         f"train on")
    if dataset.targets is None and not np.any(np.asarray(dataset.labels) >= 0):
        target = getattr(dataset, "target_type", None)
        nodes = "nodes" if target is None else f"{target!r} nodes"
        raise ValueError(f"dataset {named!r} labels none of its {nodes}: a node task "
                         f"has nothing to train on (a graph built for link prediction alone "
                         f"trains with task 'link')")
    train = np.asarray(dataset.train_idx)
    if dataset.targets is not None and train.size and np.isnan(dataset.targets[train]).all():
        raise ValueError(f"dataset {named!r} gives no target entry for its {train.size} "
                         f"training nodes (targets[train_idx] are all NaN, missing): a "
                         f"node task has nothing to train on")
    if dataset.targets is None and dataset.num_classes < 2:
        raise ValueError(f"dataset {named!r} has one class (num_classes "
                         f"{dataset.num_classes}): a classifier over one class has a loss "
                         f"of 0 whatever it outputs, so it would learn nothing; give the "
                         f"labels of two classes or more (a yes/no target is num_classes 2)")


def node_task(loss, dataset) -> NodeTask:
    """The node task of a run on `dataset`.

    `loss` is None (the default of the dataset's targets: "cross_entropy" for class
    labels, "sigmoid" for multi-label, "mse" for regression), a built-in name, a
    per-row function `(outputs[rows, ...], targets[rows, ...]) -> float32[rows]` (scored
    as the default loss is), or a `NodeTask` (a loss and a score of your own).

    Float targets with missing (NaN) entries take the built-in losses and scores that
    leave those out (`losses.masked_sigmoid`, `masked_squared_error`), each row weighed
    by its given entries (`row_weights`); a function of your own then receives the NaN
    entries and must leave them out itself (its rows are weighed so too).

    Raises:
      ValueError: a built-in loss that does not fit the dataset's targets.
      TypeError: `loss` is none of these.
    """
    kind = getattr(dataset, "target_kind", "classes")
    default = DEFAULT_LOSS[kind]
    missing = has_missing(dataset)
    if loss is None:
        return NodeTask.named(default, missing=missing)
    if isinstance(loss, NodeTask):
        if missing and loss.loss in UNMASKED:
            raise ValueError(f"the loss {fn_name(loss.loss)} reads every target entry, and "
                             f"dataset {dataset.name!r} has missing (NaN) ones: use "
                             f"zg.NodeTask.named({UNMASKED[loss.loss]!r}, missing=True), "
                             f"whose loss leaves them out")
        return loss
    if isinstance(loss, str):
        fits = loss == "cross_entropy" if kind == "classes" else loss in ("sigmoid", "mse")
        if loss in LOSSES and not fits:
            need = ("class labels" if loss == "cross_entropy"
                    else "float targets (Dataset.with_targets)")
            raise ValueError(f"loss {loss!r} needs {need}; the dataset {dataset.name!r} has "
                             f"{kind} targets, whose loss is {default!r}")
        return NodeTask.named(loss, missing=missing)
    if callable(loss):
        default_task = NodeTask.named(default, missing=missing)
        return NodeTask(loss, default_task.score, default_task.weight)
    raise TypeError(f"loss must be a name ({', '.join(LOSSES)}), a per-row function of "
                    f"(outputs, targets) or a NodeTask, got {type(loss).__name__}")


def batch_weights(task, targets, valid) -> jax.Array:
    """float32[rows]: each row's weight in the step's mean loss by a node task's (or a
    typed node task's) `weight`; 1 a real row, 0 padding without one."""
    if task.weight is None:
        return valid.astype(jnp.float32)
    return task.weight(targets, valid)


def has_missing(dataset) -> bool:
    """Whether `dataset`'s float targets (None: class labels) have missing (NaN)
    entries."""
    targets = getattr(dataset, "targets", None)
    return targets is not None and bool(np.isnan(targets).any())


def check_loss(task: NodeTask, outputs: int, targets) -> None:
    """Raises ValueError unless the task's loss (and score) give one float per row for
    outputs float32[rows, `outputs`] and rows of `targets` (host array, one row per node).
    """
    rows = 3
    out = jax.ShapeDtypeStruct((rows, outputs), jnp.float32)
    tgt = jax.ShapeDtypeStruct((rows, *np.shape(targets)[1:]), np.asarray(targets).dtype)
    for what, fn in (("loss", task.loss), ("score", task.score)):
        if fn is None:
            continue
        try:
            got = jax.eval_shape(fn, out, tgt)
        except Exception as err:  # noqa: BLE001 - any failure is the user's function's
            fix = ("" if what == "loss" else " (give your NodeTask a score for these "
                   "targets, or score=None; it scores by class accuracy unless told)")
            raise ValueError(f"the {what} {fn_name(fn)} fails on outputs "
                             f"float32{list(out.shape)} and targets "
                             f"{tgt.dtype}{list(tgt.shape)}: {err}{fix}") from err
        shape = getattr(got, "shape", None)
        if shape != (rows,):
            fix = ("the engine averages over the real rows itself: drop a final .mean()"
                   if shape == () else "drop its last axis" if shape == (rows, 1) else
                   "reduce each row to one value")
            raise ValueError(
                f"the {what} {fn_name(fn)} must give one value per row, float32[rows]; for "
                f"{rows} rows it gave shape {type(got).__name__ if shape is None else shape} "
                f"({fix})")


def fn_name(fn: Callable) -> str:
    """A function's (or callable object's) qualified name, for messages and identities;
    a `functools.partial` names its function and the arguments it binds (plain values by
    `repr`, others by type), so that two partials of one function differ (they were both
    "partial", and a checkpoint resumed under another loss)."""
    if isinstance(fn, functools.partial):
        bound = [_bound(a) for a in fn.args] + [f"{k}={_bound(v)}" for k, v in
                                                 fn.keywords.items()]
        return f"partial({', '.join([fn_name(fn.func), *bound])})"
    return getattr(fn, "__qualname__", None) or type(fn).__qualname__


def _bound(value) -> str:
    """A bound argument as an identity may record it: the same in every process."""
    if isinstance(value, bool | int | float | str | type(None)):
        return repr(value)
    return type(value).__qualname__
