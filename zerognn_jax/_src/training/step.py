"""The one step body every engine runs: loss, gradient, update, metrics; and epoch sums.

The scan engine (scan.py) and the host-mediated engine (host.py) differ only in how
they drive steps and size their buffers; both call `train_step` on a sampled
minibatch and `step_metrics` on its result, and sum an epoch with `EpochResult.of`.
"""

from __future__ import annotations

import dataclasses
import inspect

import jax
import jax.numpy as jnp
import numpy as np
import optax

from zerognn_jax._src.sampling.envelope import Envelope
from zerognn_jax._src.sampling.minibatch import MiniBatch
from zerognn_jax._src.training.program import DeviceData, StepProgram, TrainState
from zerognn_jax._src.training.tasks.base import TaskBatch
from zerognn_jax._src.training.tasks.losses import masked_mean


def takes_value(tx) -> bool:
    """The optimizer `tx`'s update takes extra keyword arguments, which `train_step`
    gives it: `value=` the step's loss, what `optax.contrib.reduce_on_plateau` reads
    (`optax.chain` passes it on to those that take it; `optax.MultiSteps` too)."""
    if isinstance(tx, optax.GradientTransformationExtraArgs):
        return True
    try:
        parameters = inspect.signature(tx.update).parameters.values()
    except (TypeError, ValueError):  # (no signature to read: a builtin, say)
        return False
    return any(p.kind is p.VAR_KEYWORD or p.name == "value" for p in parameters)


def train_step(program: StepProgram, state: TrainState, data: DeviceData, batch: TaskBatch,
               mb: MiniBatch, drop_key, *, rows=None) -> tuple[TrainState, dict]:
    """One optimizer step on the task batch `batch` and its sampled minibatch `mb`
    (`rows`: its outermost level's feature rows, if read already).

    The loss is the task's per-row loss averaged over the rows of weight 1. With data
    parallelism the gradient is that of the loss averaged over every device's rows (as
    one device would compute on the global batch) and the batch statistics are averaged
    over the devices (`DataParallel.average_update`). Returns the updated state (the
    caller decides whether to keep it) and {"loss", "outputs", "targets", "weight"} of
    this device's rows, plus "overflow" (bool, any device's minibatch overflowed) when
    the collectives pack the flag into the gradient all-reduce. With a node embedding
    (`program.embedding`) the rows the step reads (`NodeEmbedding.ids`: the outermost
    level's nodes, or a typed step's nodes of featureless types) are differentiated too;
    their ids, gradients and validity come back as "embedding_grads" for
    `update_embedding` (the table in the returned state is the old one).
    """
    task = program.task
    emb = program.embedding
    ids = valid = embedded = None
    if emb is not None:
        with jax.named_scope("embedding_rows"):  # phases a profile reads (bench/profiling.py)
            ids, valid = emb.ids(mb)
            embedded = emb.rows(program.kernels, state.embedding, ids, valid)

    def loss_fn(params, embedded):
        variables = {"params": params, "batch_stats": state.batch_stats}
        outputs, new_vars = program.apply_model(variables, data, mb, train=True,
                                                dropout_key=drop_key,
                                                inputs=batch.model_inputs, embedded=embedded,
                                                rows=rows)
        loss = masked_mean(task.loss(outputs, batch.targets), batch.weight)
        return loss, (outputs, new_vars)

    argnums = 0 if emb is None else (0, 1)
    (loss, (outputs, new_vars)), grads = jax.value_and_grad(
        loss_fn, argnums=argnums, has_aux=True)(state.params, embedded)
    grads, row_grads = (grads, None) if emb is None else grads
    dp = program.parallel
    batch_stats = new_vars.get("batch_stats", state.batch_stats)
    extra = {}
    value = {"value": loss} if takes_value(program.tx) else {}
    if dp is not None:
        weight = jnp.sum(batch.weight)
        # The loss is averaged with the gradients, so every replica's optimizer state
        # takes the global batch's.
        (grads, value), batch_stats, agreed = dp.average_update(
            (grads, value), batch_stats, weight, mb.overflow)
        if agreed is not None:
            extra["overflow"] = agreed
        if emb is not None:
            ids, row_grads, valid = dp.gather_row_grads(ids, row_grads, valid, weight)
    if emb is not None:
        extra["embedding_grads"] = (ids, row_grads, valid)
    with jax.named_scope("update"):
        updates, opt_state = program.tx.update(grads, state.opt_state, state.params,
                                               **value)
        new_state = state._replace(params=optax.apply_updates(state.params, updates),
                                   batch_stats=batch_stats, opt_state=opt_state)
    return new_state, {"loss": loss, "outputs": outputs, "targets": batch.targets,
                       "weight": batch.weight, **extra}


def update_embedding(program: StepProgram, state: TrainState, out: dict,
                     keep) -> TrainState:
    """`state` with the node embedding's lazy Adam step on the rows `train_step` left in
    `out["embedding_grads"]`, taken only where `keep` (bool scalar: the engine keeps the
    step); unchanged without an embedding.

    The engines call it after deciding whether a step stands, so that a dropped step
    writes no row: choosing between a whole new table and the old one would read and
    write every row of the table, its moments included, each step."""
    emb = program.embedding
    if emb is None:
        return state
    ids, grads, valid = out["embedding_grads"]
    # Rows of a deduplicated outermost level are distinct on one device (a typed level's
    # per type, and the types' tables lie at distinct offsets of the stacked one); the
    # rows gathered from D devices then hold each id at most D times.
    distinct = not program.sampler.positional[-1]
    single = program.parallel is None
    with jax.named_scope("embedding_update"):
        table, opt = emb.update(state.embedding, state.embedding_opt, ids, grads,
                                valid & keep, unique=single and distinct,
                                repeats=program.num_shards if distinct and not single
                                else None, taken=keep, kernels=program.kernels)
    return state._replace(embedding=table, embedding_opt=opt)


def step_sums(program: StepProgram, out: dict, mb: MiniBatch) -> dict:
    """This device's per-step sums: "loss_sum" (loss times rows), "correct" (summed
    score, NaN if the task has none), "seeds" (target rows), "counts" (int32[L + 1]
    level sizes) and "edges" (sampled edges)."""
    weight = out["weight"]
    seen = jnp.sum(weight)
    score = program.task.score
    correct = (jnp.sum(score(out["outputs"], out["targets"]) * weight)
               if score is not None else jnp.float32(jnp.nan))
    return {"loss_sum": out["loss"] * seen, "correct": correct, "seeds": seen,
            "counts": mb.counts, "edges": mb.num_edges()}


def finish_metrics(sums: dict) -> dict:
    """Step metrics from (device-reduced) sums: the mean loss replaces "loss_sum".
    Works on JAX and NumPy arrays alike."""
    out = {k: v for k, v in sums.items() if k != "loss_sum"}
    seeds = sums["seeds"]
    where = np.where if isinstance(seeds, np.ndarray | np.generic) else jnp.where
    out["loss"] = sums["loss_sum"] / where(seeds > 0, seeds, 1.0)  # as `masked_mean`
    return out


def step_metrics(program: StepProgram, out: dict, mb: MiniBatch) -> dict:
    """Per-step scalars, summed over data-parallel devices on the devices: mean loss,
    summed score ("correct", if the task scores), target rows ("seeds"), per-level
    counts (max over devices) and sampled edges."""
    sums = step_sums(program, out, mb)
    if program.parallel is not None:
        sums = program.parallel.reduce_metrics(sums)
    return finish_metrics(sums)


def merge_devices(sums: dict) -> dict:
    """Step metrics from every device's per-step sums, NumPy arrays `[devices, steps,
    ...]` (the scan engine with host metrics): counts maxed, the rest summed; "overflow"
    and "applied", agreed by all devices, are taken from the first."""
    merged = {k: (v.max(0) if k == "counts" else v[0] if k in ("overflow", "applied")
                  else v.sum(0)) for k, v in sums.items()}
    return finish_metrics(merged)


@dataclasses.dataclass
class EpochResult:
    """Host-side summary of one epoch."""

    state: TrainState
    envelope: Envelope
    loss: float
    train_acc: float | None  # None when the task has no score (regression)
    steps: int
    overflows: int
    max_counts: tuple[int, ...]
    sampled_edges: int
    chunks: int
    first_nonfinite: int | None = None  # the first step whose loss is NaN or infinite

    @classmethod
    def of(cls, state, envelope, metrics: dict, *, overflows: int,
           chunks: int) -> EpochResult:
        """From the per-step metrics (NumPy arrays over the steps that were applied)."""
        seeds = float(metrics["seeds"].sum()) or 1.0  # the weights' sum, as `masked_mean`
        total = (metrics["loss"] * metrics["seeds"]).sum()
        if not np.isfinite(total) and np.isfinite(metrics["loss"]).all():
            # finite float32 step losses whose sum passes float32's range
            total = (metrics["loss"].astype(np.float64) * metrics["seeds"]).sum()
        return cls(
            state=state, envelope=envelope, loss=float(total / seeds),
            train_acc=_mean_score(metrics["correct"], seeds),
            steps=int(metrics["loss"].shape[0]), overflows=overflows,
            max_counts=tuple(int(c) for c in np.max(metrics["counts"], axis=0)),
            sampled_edges=int(metrics["edges"].sum()), chunks=chunks,
            first_nonfinite=_first_nonfinite(metrics["loss"]))


def _mean_score(correct: np.ndarray, seeds: float) -> float | None:
    total = float(correct.sum())
    return None if np.isnan(total) else total / seeds


def _first_nonfinite(losses: np.ndarray) -> int | None:
    bad = np.flatnonzero(~np.isfinite(losses))
    return int(bad[0]) if bad.size else None
