"""A user's pieces checked against each other before anything compiles.

`train` builds the model's variables on a real first batch (`init_state`); before the
epoch compiles, `check_pieces` traces (`jax.eval_shape`: no compilation, no device
work) that first batch through the model, the task's loss and the optimizer, and turns
what would fail inside the epoch into one line naming the piece and the shapes:

- the task's batch must give one weight a row (float32[rows]) and one target row a
  weight;
- the model's outputs must have one row per target row, and for the built-in losses
  the targets' shape: `[rows, classes]` for class labels, the targets' own shape for
  float targets (multi-label, regression) and for link prediction's pair scores;
- the loss must take those outputs and targets and give float32[rows];
- the optimizer must take the parameters' gradients (`tx.update`).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from zerognn_jax._src.data.checks import is_count
from zerognn_jax._src.data.hetero import relation_name
from zerognn_jax._src.nn.bridge import model_name
from zerognn_jax._src.nn.views import NoEdgeFeatures
from zerognn_jax._src.sampling.seeds import epoch_items
from zerognn_jax._src.training.program import (
    CollectionsError,
    OptimizerInitError,
    init_state,
    sample_batch,
)
from zerognn_jax._src.training.step import takes_value
from zerognn_jax._src.training.tasks.base import BatchedTask, PredictsTypes
from zerognn_jax._src.training.tasks.graph_metrics import LOSSES as GRAPH_LOSSES
from zerognn_jax._src.training.tasks.losses import LOSSES
from zerognn_jax._src.training.tasks.node import fn_name
from zerognn_jax._src.training.tasks.typed_node import TypedNodeTask


def _shape(x) -> str:
    return f"{jnp.dtype(x.dtype).name}{list(x.shape)}"


def _first_line(err: BaseException) -> str:
    lines = str(err).strip().splitlines()
    return f"{type(err).__name__}: {lines[0] if lines else ''}"


def init_checked(program, data, envelope, items, *, user_model: str | None):
    """`init_state`, with a user model's failure on its first batch as one ValueError
    line naming the model (the built-in models' errors pass unchanged)."""
    try:
        return init_state(program, data, envelope, items)
    except (OptimizerInitError, CollectionsError):
        raise  # (the first was blamed on the model; the second says what to do)
    except Exception as err:  # noqa: BLE001 - re-raised with the piece named
        if user_model is None:
            raise
        if _reads_missing_edges(err) and not program.sampler.edge_ids:
            raise ValueError(f"the model {user_model} reads edge features "
                             f"(view.edge_features()), and this run gives it none: pass "
                             f"edge_features=True (--edge-features) with a dataset that "
                             f"has an edge-feature table") from err
        given = ("a typed batch" if isinstance(program.task, PredictsTypes) else
                 "a batch of graphs" if isinstance(program.task, BatchedTask) else
                 f"a feature table {_shape(data.features)}, views of "
                 f"{program.sampler.num_hops} hops")
        raise ValueError(f"the model {user_model} fails on its first batch ({given}): "
                         f"{_first_line(err)}{_typed_hint(program.task, err)}") from err


def _typed_hint(task, err: BaseException) -> str:
    """For a typed batch's missing key: what the batch holds (a model built for another
    target type or other relations looks up a type or relation the batch lacks)."""
    if not isinstance(err, KeyError) or not isinstance(task, TypedNodeTask):
        return ""
    relations = ", ".join(relation_name(r) for r, _ in task.sampler.fanouts)
    return (f" (the batch's seeds are {task.seed_type!r} nodes and its relations "
            f"{relations}: does the model name the dataset's target type and relations?)")


def _reads_missing_edges(err: BaseException | None) -> bool:
    """Whether `err`, or an error it was raised from, is a view's `NoEdgeFeatures`."""
    seen = set()
    while err is not None and id(err) not in seen:
        if isinstance(err, NoEdgeFeatures):
            return True
        seen.add(id(err))
        err = err.__cause__ or err.__context__
    return False


def check_pieces(program, state, data, envelope, items, *, width: int,
                 name: str | None = None) -> None:
    """Raises ValueError (one line) when the model's outputs, the task's loss and the
    optimizer do not fit each other on the first batch (module docstring).

    `width`: the output width the task asks of the model (`Task.output_dim`), checked
    for class labels under the built-in loss. `name`: the model's, as the user knows it
    (default: the program's model's class).
    """
    task, program = program.task, program.with_mesh(None)  # shapes only: one device
    perm = epoch_items(jnp.asarray(items, jnp.int32), program.batch_size, program.seed, 0)
    variables = {"params": state.params, "batch_stats": state.batch_stats}
    if state.embedding is not None:
        variables["embedding"] = state.embedding
    own, name = name is not None, name or model_name(program.model)

    def forward(variables, data, perm, train):
        batch, mb, key = sample_batch(program, data, perm, 0, 0, envelope)
        out, _ = program.apply_model(variables, data, mb, train=train, dropout_key=key,
                                     inputs=batch.model_inputs)
        return out, batch.targets, batch.weight

    # a model of one's own in training mode too (dropout, its train-only paths), where
    # it failed inside the compiled epoch; the built-in models are known there
    for train in (False, True) if own else (False,):
        mode = " in training mode (train=True; zg.train gives it the rng 'dropout')" \
            if train else ""
        try:
            out, targets, weight = jax.eval_shape(
                functools.partial(forward, train=train), variables, data, perm)
        except Exception as err:  # noqa: BLE001 - re-raised with the piece named
            raise ValueError(f"the model {name} fails on its first batch{mode}: "
                             f"{_first_line(err)}") from err
        rows = _check_batch(task, targets, weight)
        _check_outputs(name, out, rows, mode)
    _check_width(task, name, out, targets, width)
    _check_loss(task, name, out, targets, rows)
    _check_optimizer(program, state)


def _check_outputs(name: str, out, rows: int, mode: str) -> None:
    """ValueError unless the model's outputs `out` (in the `mode` said) are one float
    array of `rows` rows."""
    if not isinstance(out, jax.ShapeDtypeStruct):
        raise ValueError(f"the model {name} gives a {type(out).__name__} of outputs{mode}; "
                         f"the task needs one array, one row per target row: [{rows}, ...]")
    if not jnp.issubdtype(out.dtype, jnp.floating):
        raise ValueError(f"the model {name} gives {_shape(out)} outputs{mode}; they must be "
                         f"floating point (no gradient reaches the model through "
                         f"integers or booleans)")
    if not out.shape or out.shape[0] != rows:
        raise ValueError(f"the model {name} gives outputs {_shape(out)}{mode}; the task "
                         f"needs one row per target row: [{rows}, ...]")


def _check_batch(task, targets, weight) -> int:
    """The rows of the task's first batch (`Task.batch`): a weight a row, float32[rows]
    (a [rows, 1] weight broadcast against the per-row losses into [rows, rows], a loss
    `rows` times too large), and a target row a weight (a wrong weight was blamed on
    the model's outputs)."""
    name = type(task).__name__
    if weight.ndim != 1 or not jnp.issubdtype(weight.dtype, jnp.floating):
        raise ValueError(f"the task {name}'s batch gives weight {_shape(weight)}; it must "
                         f"be one weight a row, float32[rows]")
    rows = weight.shape[0]
    for leaf in jax.tree_util.tree_leaves(targets):
        if not leaf.shape or leaf.shape[0] != rows:
            raise ValueError(f"the task {name}'s batch gives targets {_shape(leaf)} and "
                             f"weight {_shape(weight)}; it must give one target row a "
                             f"weight")
    return rows


def check_items(task, items) -> None:
    """Raises ValueError (one line) where a task's training items (`Task.train_items`)
    cannot be trained on: none (an epoch of one empty step trained nothing and scored
    an untrained model), not integers, or negative (gathers clamp or wrap them
    silently). Built-in tasks take items from checked datasets; this is for a task of
    one's own."""
    name, items = type(task).__name__, np.asarray(items)
    if items.ndim == 0 or items.shape[0] == 0:
        raise ValueError(f"the task {name} gives no training items (train_items "
                         f"{_shape(items)}): there is nothing to train on")
    if not np.issubdtype(items.dtype, np.integer):
        raise ValueError(f"the task {name}'s train_items must be integer ids, got "
                         f"{_shape(items)}")
    if items.size and items.min() < 0:
        raise ValueError(f"the task {name}'s train_items hold a negative id "
                         f"({items.min()}); ids must be >= 0")


def check_output_dim(task, width) -> None:
    """Raises ValueError (one line) for a task whose `output_dim` is not a positive
    integer (0 failed deep inside Flax's initializers as a ZeroDivisionError)."""
    if not is_count(width) or width < 1:
        raise ValueError(f"the task {type(task).__name__}'s output_dim is {width!r}; a "
                         f"model's output rows need a positive integer width")


def _check_width(task, name: str, out, targets, width: int) -> None:
    if task.loss not in (*LOSSES.values(), *GRAPH_LOSSES.values()):
        return  # a user's loss decides what it takes; _check_loss traces it
    leaves = jax.tree_util.tree_leaves(targets)
    if len(leaves) != 1:
        return
    t = leaves[0]
    if jnp.issubdtype(t.dtype, jnp.integer) and t.ndim == 1:
        want = (t.shape[0], width)
        what = f"{width} class scores per row: {list(want)}"
    else:
        want, what = tuple(t.shape), f"the targets' shape {_shape(t)}"
    if tuple(out.shape) != want:
        raise ValueError(f"the model {name} gives outputs {_shape(out)}; the loss "
                         f"{fn_name(task.loss)} needs {what}")


def _check_loss(task, name: str, out, targets, rows: int) -> None:
    for what, fn in (("loss", task.loss), ("score", task.score)):
        if fn is None:
            continue
        shapes = ", ".join(_shape(t) for t in jax.tree_util.tree_leaves(targets))
        try:
            got = jax.eval_shape(fn, out, targets)
        except Exception as err:  # noqa: BLE001 - re-raised with the piece named
            raise ValueError(f"the {what} {fn_name(fn)} fails on the model {name}'s outputs "
                             f"{_shape(out)} and targets {shapes}: {_first_line(err)}"
                             ) from err
        if getattr(got, "shape", None) != (rows,) or (
                what == "loss" and not jnp.issubdtype(got.dtype, jnp.floating)):
            raise ValueError(f"the {what} {fn_name(fn)} gives {_shape(got)} for outputs "
                             f"{_shape(out)} and targets {shapes}; it must give one value "
                             f"per row, float32[{rows}]")


def _check_optimizer(program, state) -> None:
    tx = program.tx
    extra = takes_value(tx)  # as `train_step` calls it

    def update(grads, opt_state, params, loss):
        return tx.update(grads, opt_state, params, **({"value": loss} if extra else {}))
    try:
        jax.eval_shape(update, state.params, state.opt_state, state.params,
                       jax.ShapeDtypeStruct((), jnp.float32))
    except Exception as err:  # noqa: BLE001 - re-raised with the piece named
        raise ValueError(f"the optimizer {type(tx).__name__} fails to update the model's "
                         f"parameters ({len(jax.tree_util.tree_leaves(state.params))} arrays): "
                         f"{_first_line(err)}") from err
