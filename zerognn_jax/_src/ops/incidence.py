"""Sums between the edges and the nodes of packed graphs, with and without atomics.

Two ops, each the transpose of the other, over an `Incidence` (which node each edge
slot meets, and which edge slots meet each node):

    edges_to_nodes(data[E, F]) -> [N, F]   out[v] = sum of the live rows e with ends[e] = v
    nodes_to_edges(h[N, F])    -> [E, F]   out[e] = h[ends[e]] where live, else 0

The references are `jax.ops.segment_sum` and a gather: their gradients (and the
reference's forward) scatter-add rows with atomics, which cost a GPU more than the
rest of a molecule GNN's layer. Half-precision rows are summed, and scattered in the
gradients, in float32: an H200 took 29-37 us for each bfloat16 scatter-add of
molhiv-like's [2240, 300] edge rows into [1088, 300] node rows, where float32's took
6.3-6.7 (docs/benchmarks.md). The fixed-width ("ELL") form reads each node's incident
edge slots from `slots` (int32[N, K], K at least the largest degree): both ops and
both gradients are then gathers followed by a sum over K, with no scatter.
Each takes the ELL form when the incidence has slots, the reference otherwise.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from zerognn_jax._src.ops.aggregate import _accumulator, gather_live


class Incidence(NamedTuple):
    """Edge slots and the node each meets (its receiver, or its sender).

    Attributes:
      ends: int32[E], the node slot each edge slot meets.
      live: bool[E], the edges that count (padding edges do not).
      slots: int32[N, K], the live edge slots meeting each node, in any order; E (one
        past the last edge slot) in unused slots. None: the reference ops only.
    """

    ends: jax.Array
    live: jax.Array
    slots: jax.Array | None = None


def edges_to_nodes_reference(data: jax.Array, inc: Incidence, num_nodes: int) -> jax.Array:
    """float[N, F]: each node's sum of the live edge rows of `data` (float[E, F]) that
    meet it (`jax.ops.segment_sum`, in float32 for half-precision rows)."""
    wide = data.astype(_accumulator(data.dtype))
    masked = jnp.where(inc.live[:, None], wide, jnp.zeros((), wide.dtype))
    return jax.ops.segment_sum(masked, inc.ends, num_nodes).astype(data.dtype)


def nodes_to_edges_reference(h: jax.Array, inc: Incidence) -> jax.Array:
    """float[E, F]: row `ends[e]` of `h` (float[N, F]) for live edges, zero elsewhere.
    Half-precision rows are gathered as float32, so that the gradient's scatter-add
    sums in float32."""
    wide = h.astype(_accumulator(h.dtype))
    return jnp.where(inc.live[:, None], wide[inc.ends], jnp.zeros((), wide.dtype)) \
        .astype(h.dtype)


def _sum_slots(data, slots):
    """sum_k data[slots[:, k]] (rows past the end read as zero), accumulated in float32
    for half-precision data. Gathered slot-major ([K, N, F]) and reduced over the
    leading axis, the form aggregate.py measured fastest."""
    rows = jnp.take(data.astype(_accumulator(data.dtype)), slots.T, axis=0, mode="fill",
                    fill_value=0)
    return jnp.sum(rows, axis=0).astype(data.dtype)


@jax.custom_vjp
def _edges_to_nodes_ell(data, ends, live, slots):
    return _sum_slots(data, slots)


def _e2n_fwd(data, ends, live, slots):
    return _sum_slots(data, slots), (ends, live, slots)


def _e2n_bwd(res, g):
    ends, live, slots = res
    return _nodes_to_edges_ell(g, ends, live, slots), None, None, None


_edges_to_nodes_ell.defvjp(_e2n_fwd, _e2n_bwd)


@jax.custom_vjp
def _nodes_to_edges_ell(h, ends, live, slots):
    return gather_live(h, ends, live)


def _n2e_fwd(h, ends, live, slots):
    return gather_live(h, ends, live), (ends, live, slots)


def _n2e_bwd(res, g):
    ends, live, slots = res
    return _edges_to_nodes_ell(g, ends, live, slots), None, None, None


_nodes_to_edges_ell.defvjp(_n2e_fwd, _n2e_bwd)


def edges_to_nodes(data: jax.Array, inc: Incidence, num_nodes: int) -> jax.Array:
    """`edges_to_nodes_reference`, by gathers over `inc.slots` when it has them: the
    gradient gathers each edge's row of the output gradient (`nodes_to_edges`)."""
    if inc.slots is None:
        return edges_to_nodes_reference(data, inc, num_nodes)
    if inc.slots.shape[0] != num_nodes:
        raise ValueError(f"the incidence has {inc.slots.shape[0]} node rows, the output "
                         f"{num_nodes}")
    return _edges_to_nodes_ell(data, inc.ends, inc.live, inc.slots)


def nodes_to_edges(h: jax.Array, inc: Incidence) -> jax.Array:
    """`nodes_to_edges_reference`, with a gradient that sums each node's incident edge
    rows over `inc.slots` (when it has them) instead of scatter-adding them."""
    if inc.slots is None:
        return nodes_to_edges_reference(h, inc)
    return _nodes_to_edges_ell(h, inc.ends, inc.live, inc.slots)
