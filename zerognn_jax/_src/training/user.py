"""What a user brings to `train`: a model, an optimizer, a loss, variables to start from.

`train(cfg, dataset, model=..., optimizer=..., loss=...)` replaces the built-in pieces
that `cfg` names (its `model`, Adam with `lr` and `weight_decay`, the loss of the
dataset's targets). Each is checked here before anything is compiled, and named in the
checkpoint identity, so that a checkpoint of another model or loss is refused.
"""

from __future__ import annotations

import os

import jax
import jax.numpy as jnp
import numpy as np

from zerognn_jax._src.data.graphs import GraphCollection
from zerognn_jax._src.nn.bridge import model_name
from zerognn_jax._src.training.row_adam import row_adam_init
from zerognn_jax._src.training.tasks.node import DEFAULT_LOSS, NodeTask, fn_name, has_missing


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
    if task is not None:  # a kind of target without a node loss (graph tasks): any loss
        kind = getattr(dataset, "target_kind", "classes")
        # (a graph collection's kinds share names with the node kinds: its rule as before)
        missing = not isinstance(dataset, GraphCollection) and has_missing(dataset)
        default = (NodeTask.named(DEFAULT_LOSS[kind], missing=missing).loss
                   if kind in DEFAULT_LOSS else None)
        if getattr(task, "loss", default) is not default:
            extra["loss"] = fn_name(task.loss)
    return extra


def start_from(program, state, variables: dict):
    """`state` with the model variables `variables` ({"params", "batch_stats"}, and
    "embedding", a node embedding's table, if any) and a fresh optimizer state for them
    (the embedding's lazy Adam moments zero), for fine-tuning. A run's node embedding
    that `variables` lack starts afresh, as without them (another graph's rows).

    Raises:
      ValueError: the variables do not have the model's structure and shapes, or hold a
        node embedding the run lacks or one of another shape.
    """
    want = {"params": state.params, "batch_stats": state.batch_stats}
    given = {"params": variables["params"], "batch_stats": variables.get("batch_stats", {})}
    spec = lambda tree: {jax.tree_util.keystr(p): tuple(np.shape(x))
                         for p, x in jax.tree_util.tree_flatten_with_path(tree)[0]}
    if spec(want) != spec(given):
        raise ValueError(_misfit(spec(want), spec(given)))
    # Copies, on the devices of the state they join (variables of a run on other
    # devices too): the engines donate the state, and the caller's arrays must survive.
    copy = lambda x, like: jnp.array(jax.device_put(x, like.sharding), like.dtype, copy=True)
    params = jax.tree_util.tree_map(copy, given["params"], state.params)
    stats = jax.tree_util.tree_map(copy, given["batch_stats"], state.batch_stats)
    state = state._replace(params=params, batch_stats=stats,
                           opt_state=program.tx.init(params))
    if variables.get("embedding") is not None:  # else a run's own table starts afresh
        table = _given_embedding(state.embedding, variables["embedding"])
        state = state._replace(embedding=copy(table, state.embedding),
                               embedding_opt=row_adam_init(state.embedding))
    return state if program.parallel is None else program.parallel.replicate(state)


def _misfit(want: dict, given: dict) -> str:
    """The one line that says how variables of paths and shapes `given` differ from the
    model's `want`: up to 3 of each side's paths the other lacks (or holds in another
    shape), and the scope of the model's under which the given variables, nested, would
    fit where there is one (a link run's encoder: ['encoder'] in each collection)."""
    def shown(side, other):
        rows = [f"{p} {list(s)}" for p, s in sorted(side.items()) if other.get(p) != s]
        return (", ".join(rows[:3]) + (f" and {len(rows) - 3} more" if len(rows) > 3 else "")
                or "nothing else")

    text = (f"variables do not fit the model: the model has {shown(want, given)}; the "
            f"variables have {shown(given, want)}")
    split = lambda path: path.index("]") + 1  # the collection's key ends there
    common = os.path.commonprefix([p[split(p):] for p in want])
    for end in (i + 1 for i, c in enumerate(common) if c == "]"):  # each enclosing scope
        nested = {p[:split(p)] + common[:end] + p[split(p):]: s for p, s in given.items()}
        if nested == want:  # the given variables, nested there, fit
            return (f"{text} (the model's variables are all under {common[:end]} in their "
                    f"collection: nest yours there)")
    return text


def _given_embedding(table, given):
    """`given`, the node embedding of the variables, where it has the run's `table`'s
    shape (a run without one is given none)."""
    if table is None:
        raise ValueError(f"variables hold a node embedding of shape "
                         f"{list(np.shape(given))}, and this run has none (embedding_dim "
                         f"0): drop variables['embedding'], or set embedding_dim")
    if tuple(np.shape(given)) != table.shape:
        raise ValueError(f"variables['embedding'] has shape {list(np.shape(given))}; this "
                         f"run's node embedding is {list(table.shape)} (rows, "
                         f"embedding_dim): drop it to start the run's table afresh")
    return given
