"""What a user brings to `train`: a model, an optimizer, a loss, variables to start from.

`train(cfg, dataset, model=..., optimizer=..., loss=...)` replaces the built-in pieces
that `cfg` names (its `model`, Adam with `lr` and `weight_decay`, the loss of the
dataset's targets). Each is checked here before anything is compiled, and named in the
checkpoint identity, so that a checkpoint of another model or loss is refused.
"""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np

from zerognn_jax._src.nn.bridge import model_name
from zerognn_jax._src.training.task import LOSSES, SCORES, NodeTask

# The built-in loss of each kind of node target (Dataset.target_kind).
DEFAULT_LOSS = {"classes": "cross_entropy", "multilabel": "sigmoid", "regression": "mse"}


def node_task(loss, dataset) -> NodeTask:
    """The node task of a run on `dataset`.

    `loss` is None (the default of the dataset's targets: "cross_entropy" for class
    labels, "sigmoid" for multi-label, "mse" for regression), a built-in name, a
    per-row function `(outputs[rows, ...], targets[rows, ...]) -> float32[rows]` (scored
    as the default loss is), or a `NodeTask` (a loss and a score of your own).

    Raises:
      ValueError: a built-in loss that does not fit the dataset's targets.
      TypeError: `loss` is none of these.
    """
    kind = getattr(dataset, "target_kind", "classes")
    default = DEFAULT_LOSS[kind]
    if loss is None:
        return NodeTask.named(default)
    if isinstance(loss, NodeTask):
        return loss
    if isinstance(loss, str):
        fits = loss == "cross_entropy" if kind == "classes" else loss in ("sigmoid", "mse")
        if loss in LOSSES and not fits:
            need = ("class labels" if loss == "cross_entropy"
                    else "float targets (Dataset.with_targets)")
            raise ValueError(f"loss {loss!r} needs {need}; the dataset {dataset.name!r} has "
                             f"{kind} targets, whose loss is {default!r}")
        return NodeTask.named(loss)
    if callable(loss):
        return NodeTask(loss, SCORES[default])
    raise TypeError(f"loss must be a name ({', '.join(LOSSES)}), a per-row function of "
                    f"(outputs, targets) or a NodeTask, got {type(loss).__name__}")


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
            raise ValueError(f"the {what} {_name(fn)} fails on outputs float32{list(out.shape)} "
                             f"and targets {tgt.dtype}{list(tgt.shape)}: {err}") from err
        if getattr(got, "shape", None) != (rows,):
            raise ValueError(
                f"the {what} {_name(fn)} must give one value per row, float32[rows]; for "
                f"{rows} rows it gave shape {getattr(got, 'shape', type(got).__name__)} "
                "(the engine averages over the real rows itself: drop a final .mean())")


def check_optimizer(optimizer) -> None:
    if not (callable(getattr(optimizer, "init", None))
            and callable(getattr(optimizer, "update", None))):
        raise TypeError(f"optimizer must be an optax.GradientTransformation (e.g. "
                        f"optax.adamw(1e-3)), got {type(optimizer).__name__}")


def user_identity(model, optimizer, task: NodeTask | None, dataset) -> dict:
    """What the checkpoint identity adds for a user's pieces: the model's class name,
    "custom" for an optimizer, the loss function's name when it is not the default."""
    extra = {}
    if model is not None:
        extra["model"] = model_name(model)
    if optimizer is not None:
        extra["optimizer"] = "custom"
    default = LOSSES[DEFAULT_LOSS[getattr(dataset, "target_kind", "classes")]]
    if task is not None and getattr(task, "loss", default) is not default:
        extra["loss"] = _name(task.loss)
    return extra


def start_from(program, state, variables: dict):
    """`state` with the model variables `variables` ({"params", "batch_stats"}) and the
    optimizer state of those parameters, for fine-tuning.

    Raises:
      ValueError: the variables do not have the model's structure and shapes.
    """
    want = {"params": state.params, "batch_stats": state.batch_stats}
    given = {"params": variables["params"], "batch_stats": variables.get("batch_stats", {})}
    spec = lambda tree: {jax.tree_util.keystr(p): tuple(np.shape(x))
                         for p, x in jax.tree_util.tree_flatten_with_path(tree)[0]}
    if spec(want) != spec(given):
        diff = sorted(set(spec(want).items()) ^ set(spec(given).items()))
        raise ValueError(f"variables do not fit the model (path and shape, either side): "
                         f"{diff[:4]}")
    # Copies: the engines donate the state, and the caller's arrays must survive.
    copy = lambda x, like: jnp.array(x, like.dtype, copy=True)
    params = jax.tree_util.tree_map(copy, given["params"], state.params)
    stats = jax.tree_util.tree_map(copy, given["batch_stats"], state.batch_stats)
    state = state._replace(params=params, batch_stats=stats,
                           opt_state=program.tx.init(params))
    return state if program.parallel is None else program.parallel.replicate(state)


def _name(fn: Callable) -> str:
    return getattr(fn, "__qualname__", None) or type(fn).__qualname__
