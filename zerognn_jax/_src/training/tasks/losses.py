"""Per-row losses and scores of the built-in tasks: functions of (outputs, targets)
giving float32[rows], which the step averages over the real rows (`masked_mean`). The
`masked_` ones read NaN targets as missing entries (graph targets, and node targets
that have some), whose rows the step weights by their given entries (`row_weights`)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import optax


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


def _labelled(targets):
    """(bool mask of labelled entries, targets with missing entries as 0)."""
    known = ~jnp.isnan(targets)
    return known, jnp.where(known, targets, 0.0)


def _row_mean(values, known) -> jax.Array:
    values = jnp.where(known, values, 0.0).reshape(values.shape[0], -1)
    count = known.reshape(known.shape[0], -1).sum(-1)
    return values.sum(-1) / jnp.maximum(count, 1)


def masked_sigmoid(logits, targets) -> jax.Array:
    """float32[rows]: binary cross-entropy with logits over a row's labelled entries
    (NaN targets are missing labels and count nothing)."""
    known, t = _labelled(targets)
    ce = optax.sigmoid_binary_cross_entropy(logits.astype(jnp.float32), t)
    return _row_mean(ce, known)


def masked_label_accuracy(logits, targets) -> jax.Array:
    """float32[rows]: the fraction of a row's labelled entries the logit's sign gets right."""
    known, t = _labelled(targets)
    return _row_mean(((logits > 0) == (t > 0.5)).astype(jnp.float32), known)


def masked_abs_error(outputs, targets) -> jax.Array:
    """float32[rows]: absolute error over a row's labelled entries (regression)."""
    known, t = _labelled(targets)
    return _row_mean(jnp.abs(outputs.astype(jnp.float32) - t), known)


def masked_squared_error(outputs, targets) -> jax.Array:
    """float32[rows]: squared error over a row's labelled entries (regression)."""
    known, t = _labelled(targets)
    return _row_mean(jnp.square(outputs.astype(jnp.float32) - t), known)


def row_weights(targets, valid) -> jax.Array:
    """float32[rows]: a row's labelled entries (0 for padding rows), so that the engine's
    weighted mean of per-row means is the mean over every labelled entry of the batch
    (OGB's loss); 1 per real row for class targets."""
    if jnp.issubdtype(targets.dtype, jnp.integer):
        return valid.astype(jnp.float32)
    known = ~jnp.isnan(targets).reshape(targets.shape[0], -1)
    return jnp.where(valid, known.sum(-1), 0).astype(jnp.float32)


LOSSES = {"cross_entropy": softmax_cross_entropy, "sigmoid": sigmoid_cross_entropy,
          "mse": squared_error}
SCORES = {"cross_entropy": class_accuracy, "sigmoid": label_accuracy, "mse": None}


def masked_mean(per_row, weight) -> jax.Array:
    """The mean of `per_row` weighted by `weight` (1 a real row, 0 padding, or a row's
    own weight), 0 if every weight is 0. (It divided by at least 1: weights summing
    below 1 in a step gave a loss too small by their sum; 0/1 masks, whose sum is 0 or
    at least 1, give the same values as before.)"""
    total = jnp.sum(weight)
    return jnp.sum(per_row * weight) / jnp.where(total > 0, total, 1.0)
