"""How many entries of a sorted array lie at or below each query, without a loop.

`count_at_most(sorted, queries)` equals `jnp.searchsorted(sorted, queries, side="right")`.
JAX's methods for that search cost a GPU more than the work around them where it runs
inside a loop over chunks (exact inference) or a training step (graph packing): the
default is a `while` of log2(n) iterations (a kernel and two copies each); "scan_unrolled"
carries a (low, high) pair, and XLA emits nearly every step as a kernel of its own (12 a
chunk of products-like's exact inference on an H200, reading and writing 7 MB each);
"compare_all" grows as n x queries. Here the search keeps one value per query, the count
found so far, and grows it by halving powers of two (`count + step` is kept when the
entry it would include is <= the query): every step is a gather from the sorted array
and a select on that one value, and XLA fuses several steps a kernel (6 kernels for the
same chunk's 15 steps).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def count_at_most(sorted_values: jax.Array, queries: jax.Array) -> jax.Array:
    """int32[...]: per query, the number of entries of `sorted_values` (1-D,
    non-decreasing, no NaN) that are <= it: `jnp.searchsorted(sorted_values, queries,
    side="right")`. `queries`: an array of any shape; an empty `sorted_values` gives
    zeros."""
    if sorted_values.ndim != 1:
        raise ValueError(f"sorted_values must be 1-D, got shape {sorted_values.shape}")
    n = sorted_values.shape[0]
    count = jnp.zeros(queries.shape, jnp.int32)
    step = 1 << (n.bit_length() - 1) if n else 0
    while step:  # static: log2(n) + 1 steps, unrolled in the trace
        wider = count + step
        entry = sorted_values[jnp.minimum(wider, n) - 1]
        count = jnp.where((wider <= n) & (entry <= queries), wider, count)
        step >>= 1
    return count
