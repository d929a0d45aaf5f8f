"""Uniform neighbour sampling into fixed-shape blocks: the op and its plain-XLA reference.

`sample_neighbors_reference` is the default implementation and the twin that the Pallas
kernel in `pallas/sample.py` must match exactly; `sample_neighbors` dispatches.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax

from zerognn_jax._src.data.graph import edge_ids, take_edges
from zerognn_jax._src.ops.registry import Kernels, implementation
from zerognn_jax._src.pallas import counter_hash

# Fanouts up to this size unroll Floyd's loop in Python; larger ones use fori_loop.
_UNROLL_LIMIT = 16


def row_bounds(indptr, frontier, valid):
    """(first edge [C] in indptr's dtype, int32[C] degree) of each frontier row; degree 0
    where invalid. Edge ids of a row are `graph.edge_ids(start, offsets)`."""
    start = indptr[frontier]
    deg = (indptr[frontier + 1] - start).astype(jnp.int32)
    return start, jnp.where(valid, deg, 0)


def _floyd_offsets(key, frontier, deg, fanout: int) -> jax.Array:
    """int32[C, fanout]: a uniform `fanout`-subset of [0, deg) per row (rows with deg > fanout).

    Floyd's algorithm: for i in 0..k-1 with j = deg - k + i, draw t in [0, j]; take t
    unless already taken, else take j. Each draw uses the bits of (key, node, i).
    """
    c = frontier.shape[0]
    chosen = jnp.full((c, fanout), -1, jnp.int32)
    slots = jnp.arange(fanout, dtype=jnp.int32)

    def body(i, chosen):
        j = deg - fanout + i
        bits = counter_hash.slot_bits(key, frontier, i)
        t = counter_hash.uniform_below(bits, jnp.maximum(j + 1, 1))
        taken = jnp.any(chosen == t[:, None], axis=1)
        pick = jnp.where(taken, j, t)
        return jnp.where(slots[None, :] == i, pick[:, None], chosen)

    if fanout <= _UNROLL_LIMIT:
        for i in range(fanout):
            chosen = body(i, chosen)
        return chosen
    return lax.fori_loop(0, fanout, body, chosen)


def sample_neighbors_reference(
    indptr: jax.Array,
    indices: jax.Array,
    frontier: jax.Array,
    valid: jax.Array,
    key: jax.Array,
    fanout: int,
    *,
    replace: bool = False,
    all_neighbors: bool = False,
    with_edges: bool = False,
) -> tuple[jax.Array, ...]:
    """Samples up to `fanout` neighbours of every valid frontier node.

    Args:
      indptr, indices: the CSR graph (int32 or uint32 offsets, `data/graph.py`).
      frontier: int32[C], node ids; entries where `valid` is False are ignored.
      valid: bool[C].
      key: uint32 scalar from `counter_hash.step_key`.
      fanout: K, the static number of slots per row.
      replace: draw K neighbours with replacement (every slot valid when degree > 0).
      all_neighbors: take neighbours 0..K-1 in CSR order without randomness (K must
        then be at least the largest degree, for full-neighbourhood blocks).
      with_edges: also return the sampled edges' ids.

    Returns:
      nbr: int32[C, K], global ids of the sampled neighbours; 0 in invalid slots.
      mask: bool[C, K], which slots hold a sampled neighbour. Without replacement a row
        of degree d <= K holds all d neighbours in CSR order in slots 0..d-1.
      edge (with `with_edges`): [C, K] in indptr's dtype, each slot's position in the
        CSR (`indices[edge] == nbr`); 0 in invalid slots.
    """
    start, deg = row_bounds(indptr, frontier, valid)
    slots = jnp.arange(fanout, dtype=jnp.int32)[None, :]
    if replace:
        bits = counter_hash.slot_bits(key, frontier[:, None], slots)
        offsets = counter_hash.uniform_below(bits, jnp.maximum(deg, 1)[:, None])
        mask = jnp.broadcast_to(deg[:, None] > 0, offsets.shape)
    else:
        offsets = jnp.broadcast_to(slots, (frontier.shape[0], fanout))
        if not all_neighbors:
            floyd = _floyd_offsets(key, frontier, deg, fanout)
            offsets = jnp.where(deg[:, None] > fanout, floyd, offsets)
        mask = slots < deg[:, None]
    edge = jnp.where(mask, edge_ids(start[:, None], offsets), 0)
    nbr = jnp.where(mask, take_edges(indices, edge), 0)
    return (nbr, mask, edge) if with_edges else (nbr, mask)


def sample_neighbors(kernels: Kernels, indptr, indices, frontier, valid, key, fanout: int, *,
                     replace: bool = False, all_neighbors: bool = False,
                     with_edges: bool = False):
    """`sample_neighbors_reference`, or the implementation `kernels` selects for "sample"."""
    impl = implementation(kernels, "sample") or sample_neighbors_reference
    return impl(indptr, indices, frontier, valid, key, fanout, replace=replace,
                all_neighbors=all_neighbors, with_edges=with_edges)
