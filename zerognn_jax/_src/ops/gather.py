"""Gathering feature rows by id: the op and its plain-XLA reference.

The Pallas twin lives in `pallas/gather.py`. A table kept in host memory
(`ops/host_rows.HostTable`, or its `CachedTable`) is read by its own kernel, whatever
`kernels` says.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from zerognn_jax._src.ops.host_rows import is_host_resident
from zerognn_jax._src.ops.registry import Kernels, implementation


def gather_rows_reference(table: jax.Array, ids: jax.Array, valid: jax.Array) -> jax.Array:
    """float[C, d]: rows `table[ids]`, with rows where `valid` is False set to zero.

    Args:
      table: float[N, d]; ids: int32[C] in [0, N); valid: bool[C].
    """
    rows = table[jnp.where(valid, ids, 0)]
    return jnp.where(valid[:, None], rows, jnp.zeros((), table.dtype))


def gather_rows(kernels: Kernels, table, ids, valid) -> jax.Array:
    """`gather_rows_reference`, or the implementation `kernels` selects for "gather";
    `HostTable.gather` for a table in host memory."""
    if is_host_resident(table):
        return table.gather(ids, valid)
    return (implementation(kernels, "gather") or gather_rows_reference)(table, ids, valid)
