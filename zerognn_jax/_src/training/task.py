"""The task seam: what a training task adds to the sampled-subgraph step.

An engine knows nothing of labels, losses or metrics. Per step it hands the task a
slice of the epoch's shuffled training items (node ids for node tasks; other tasks
choose their own items, e.g. edges), and the task returns a `TaskBatch`: the seed
nodes to sample around, the targets and their weights, and any extra inputs of the
model's head. After the model has run on the sampled subgraph, the task's per-row
loss and score turn its outputs into the step's loss and metrics.

`NodeTask` is node classification (integer labels, the default), multi-label
classification or regression: the loss and the score are plain functions over
(outputs, targets), so a user's loss plugs in unchanged.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax


class TaskBatch(NamedTuple):
    """What a task picks for one step, on the device, with static shapes.

    Attributes:
      seeds: int32[S] node ids the subgraph is sampled around (level 0).
      seed_valid: bool[S], which seeds are real (the rest is padding).
      targets: a pytree whose leaves have one row per output row.
      weight: float32[rows], 1 for a real target row, 0 for padding.
      model_inputs: keyword arguments for the model beyond (x, views, train).
      seed_count: int32 scalar, the real number of seeds when the task deduplicates them
        into `seeds` (it may exceed len(seeds): level 0 overflowed, and the step is
        redone with a larger envelope); None: the count of `seed_valid`.
    """

    seeds: jax.Array
    seed_valid: jax.Array
    targets: Any
    weight: jax.Array
    model_inputs: dict
    seed_count: jax.Array | None = None


def softmax_cross_entropy(logits, labels) -> jax.Array:
    """float32[rows]: cross-entropy of integer class labels."""
    return optax.softmax_cross_entropy_with_integer_labels(
        logits.astype(jnp.float32), labels)


def sigmoid_cross_entropy(logits, targets) -> jax.Array:
    """float32[rows]: binary cross-entropy with logits, averaged over a row's labels
    (multi-label targets in {0, 1} of the logits' shape)."""
    ce = optax.sigmoid_binary_cross_entropy(logits.astype(jnp.float32), targets)
    return ce.reshape(ce.shape[0], -1).mean(-1)


def squared_error(outputs, targets) -> jax.Array:
    """float32[rows]: squared error averaged over a row's outputs (regression)."""
    err = jnp.square(outputs.astype(jnp.float32) - targets)
    return err.reshape(err.shape[0], -1).mean(-1)


def class_accuracy(logits, labels) -> jax.Array:
    """float32[rows]: 1 where the arg-max class is the label."""
    return (jnp.argmax(logits, -1) == labels).astype(jnp.float32)


def label_accuracy(logits, targets) -> jax.Array:
    """float32[rows]: the fraction of a row's binary labels the sign of its logit gets
    right (multi-label)."""
    hit = ((logits > 0) == (targets > 0.5)).astype(jnp.float32)
    return hit.reshape(hit.shape[0], -1).mean(-1)


LOSSES = {"cross_entropy": softmax_cross_entropy, "sigmoid": sigmoid_cross_entropy,
          "mse": squared_error}
SCORES = {"cross_entropy": class_accuracy, "sigmoid": label_accuracy, "mse": None}


def masked_mean(per_row, weight) -> jax.Array:
    """The mean of `per_row` over the rows whose weight is 1 (0 if there are none)."""
    return jnp.sum(per_row * weight) / jnp.maximum(jnp.sum(weight), 1.0)


@dataclasses.dataclass(frozen=True, eq=False)
class NodeTask:
    """Supervised learning on the training nodes: one output row per seed.

    Attributes:
      loss: (outputs[rows, ...], targets[rows, ...]) -> float32[rows], per-row losses;
        the engine averages them over the real seeds (padding rows never count).
      score: the same shape of function giving a per-row score in [0, 1] (reported as
        accuracy), or None when it means nothing (regression).
    """

    loss: Callable = softmax_cross_entropy
    score: Callable | None = class_accuracy
    name = "node"

    @classmethod
    def named(cls, loss: str) -> NodeTask:
        """The task of a built-in loss: "cross_entropy", "sigmoid" or "mse"."""
        if loss not in LOSSES:
            raise ValueError(f"loss must be one of {', '.join(LOSSES)}, got {loss!r}")
        return cls(LOSSES[loss], SCORES[loss])

    def batch(self, data, items, valid, key, capacity: int | None = None) -> TaskBatch:
        """The step's seeds are its items; targets are their rows of `data.labels`.

        `capacity` is the envelope's level 0; a node batch's seeds are its items.
        """
        del key, capacity  # node batches draw nothing
        targets = jax.tree_util.tree_map(lambda t: t[items], data.labels)
        return TaskBatch(items, valid, targets, valid.astype(jnp.float32), {})

    def restrict(self, mb, batch: TaskBatch):
        """The sampled minibatch the model may read (node tasks hide nothing)."""
        del batch
        return mb

    def train_items(self, dataset):
        """The rows the engines shuffle into steps: the training node ids."""
        return dataset.train_idx

    def evaluate(self, program, variables, data, dataset, *, mode: str, batch_size: int,
                 seed: int) -> dict:
        """Train/val/test metrics of the split (`evaluate.evaluate_splits`)."""
        from zerognn_jax._src.training.evaluate import evaluate_splits  # imports program.py

        return evaluate_splits(program, variables, data, dataset, mode=mode,
                               batch_size=batch_size, seed=seed)
