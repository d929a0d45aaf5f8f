"""Per-row losses and scores of the built-in tasks: functions of (outputs, targets)
giving float32[rows], which the step averages over the real rows (`masked_mean`)."""

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
