"""Gather and neighbour-aggregation ops over fixed-shape ("ELL") blocks: XLA references.

Their Pallas twins live in `pallas_kernels/aggregate.py` and `pallas_kernels/gather.py`
and take the same arguments (plus `interpret`).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def gather_rows_reference(table: jax.Array, ids: jax.Array, valid: jax.Array) -> jax.Array:
    """float[C, d]: rows `table[ids]`, with rows where `valid` is False set to zero.

    Args:
      table: float[N, d]; ids: int32[C] in [0, N); valid: bool[C].
    """
    rows = table[jnp.where(valid, ids, 0)]
    return jnp.where(valid[:, None], rows, jnp.zeros((), table.dtype))


def weighted_sum_reference(h_src: jax.Array, nbr: jax.Array, weights: jax.Array) -> jax.Array:
    """float[C, H, F]: out[c, h] = sum_k weights[c, k, h] * h_src[nbr[c, k], h].

    Args:
      h_src: float[S, H, F], source rows (H heads of F features; H = 1 for plain layers).
      nbr: int32[C, K], positions into h_src.
      weights: float[C, K, H]; must be zero in masked slots (that is what masks them).
    The sum runs over k in increasing order.
    """
    gathered = h_src[nbr]  # [C, K, H, F]
    return jnp.sum(gathered * weights[..., None].astype(h_src.dtype), axis=1)


def max_reference(h_src: jax.Array, nbr: jax.Array, mask: jax.Array) -> jax.Array:
    """float[C, d]: elementwise max over the valid slots of each row; 0 for empty rows.

    Args:
      h_src: float[S, d]; nbr: int32[C, K]; mask: bool[C, K].
    """
    gathered = h_src[nbr]
    neg = jnp.array(-jnp.inf, h_src.dtype)
    best = jnp.max(jnp.where(mask[..., None], gathered, neg), axis=1)
    return jnp.where(jnp.any(mask, axis=1)[:, None], best, jnp.zeros((), h_src.dtype))
