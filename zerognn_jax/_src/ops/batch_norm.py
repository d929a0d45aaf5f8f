"""Batch normalisation over the masked rows of a [rows, features] array, with its
gradient written out.

    masked_batch_norm(x, mask, scale, bias, epsilon) -> (y, mean, var, count)

The statistics are Flax `BatchNorm`'s with a row mask and its fast variance: in float32,
mean and E[x^2] - mean^2 (clipped at 0) over the rows where `mask` holds; every row,
padding included, is normalised with them: y = (x - mean) * rsqrt(var + epsilon) *
scale + bias, in float32 (Flax's result type for a float32 scale). The value equals
Flax's up to the order of the sums; the gradient is what differs. Differentiating
Flax's form gives a chain of masked means, selects and their transposes (about five
kernels a normalisation in a molecule GNN's backward on an H100). Here the backward
is two passes over the rows: one variadic reduction (sum dy, sum dy * (x - mean))
and one elementwise pass for dx (docs/benchmarks.md, "Graph-level steps", measures it
with two other changes):

    dx_i = scale * inv * dy_i + m_i / n * (dL/dmean + 2 * dL/dvar * (x_i - mean))
    dL/dmean = -inv * scale * sum(dy)            (+ the cotangent of `mean`)
    dL/dvar = -inv^3 / 2 * scale * sum(dy * (x - mean))   (+ that of `var`)

with inv = rsqrt(var + epsilon), m the mask and n its count; sums run over every row
(padding rows' outputs depend on the statistics too). `count` is the number of masked
rows (float32; no gradient). With none (a device's share of an epoch's last, partial
step under data parallelism) the statistics are taken over a count of 1, so they are
zero, and the rows pass as y = x * scale + bias: finite, where Flax's are NaN. (Scaled
by rsqrt(epsilon), as those statistics would have them, each normalisation multiplied
the padding rows by ~316, and a deep model's stack of them overflowed to inf and NaN:
GINE-virtual 5 x 300 diverged on the empty device of such a step.)
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np


def _stats(x, mask):
    """(x as float32, float32 row count, the count taken as at least 1, mean, var before
    clipping) over masked rows (the mean and variance divide by the third)."""
    xf = x.astype(jnp.float32)
    m = mask[:, None]
    # Counted behind a barrier: on a GPU, sampling one step ahead, XLA fused the scalar
    # sum into the kernel that packs the batch and gathers its features, which then took
    # 56.7 us a step for 0.7 MB.
    count = jnp.sum(jax.lax.optimization_barrier(mask).astype(jnp.float32))
    n = jnp.maximum(count, 1.0)
    total, squares = _column_sums(jnp.where(m, xf, 0.0), jnp.where(m, xf * xf, 0.0))
    mean = total / n
    return xf, count, n, mean, squares / n - mean * mean


def _column_sums(a, b):
    """(sum of a's rows, sum of b's rows), float32, as one variadic reduction: one
    kernel reading both. As two `jnp.sum`s XLA:GPU made the backward's pair a fusion
    that summed dy while writing dy * (x - mean) out for a second kernel to sum, about
    14 us a [1152, 300] normalisation on an H100 (docs/benchmarks.md, "Matrix products
    by cuBLAS, and batch norm's sums in one reduction")."""
    zero = np.float32(0)
    return jax.lax.reduce((a, b), (zero, zero),
                          lambda x, y: (x[0] + y[0], x[1] + y[1]), (0,))


@functools.partial(jax.custom_vjp, nondiff_argnums=(4,))
def masked_batch_norm(x, mask, scale, bias, epsilon):
    """(y float32[rows, F], mean float32[F], var float32[F], count float32[]) as the
    module docstring says; `x` [rows, F] any float dtype, `mask` bool[rows],
    `scale`/`bias` float32[F], `epsilon` a Python float."""
    return _forward(x, mask, scale, bias, epsilon)[0]


def _forward(x, mask, scale, bias, epsilon):
    xf, count, n, mean, raw = _stats(x, mask)
    var = jnp.maximum(raw, 0.0)
    inv = jnp.where(count > 0, jax.lax.rsqrt(var + epsilon), 1.0)
    y = (xf - mean) * (inv * scale) + bias
    return (y, mean, var, count), (x, mask, scale, n, mean, inv, raw > 0)


def _backward(epsilon, res, cotangents):
    del epsilon
    x, mask, scale, count, mean, inv, positive = res
    dy, dmean_out, dvar_out, _ = cotangents
    g = dy.astype(jnp.float32)
    d = x.astype(jnp.float32) - mean
    sum_g, sum_gd = _column_sums(g, g * d)
    dmean = -inv * scale * sum_g + dmean_out
    dvar = jnp.where(positive, -0.5 * inv ** 3 * scale * sum_gd + dvar_out, 0.0)
    share = mask[:, None].astype(jnp.float32) / count
    dx = g * (scale * inv) + share * (dmean + 2.0 * dvar * d)
    return dx.astype(x.dtype), None, sum_gd * inv, sum_g


masked_batch_norm.defvjp(_forward, _backward)
