"""Uniform neighbour sampling as one Pallas kernel: the twin of `sample_neighbors_reference`.

One program takes a block of frontier rows and all K slots of each (K padded to a power
of two). It reads the two CSR bounds of each row, draws the slots with the same uint32
counter hash as the reference (`counter_hash`, called inside the kernel), runs
Floyd's algorithm vectorised over the block's rows, gathers the chosen neighbour ids and
stores them with the validity mask (and, when asked, the edge ids: a third output that
is not written otherwise). Output is bit-identical to the reference.

Offsets are int32 or uint32 (graphs of 2**31 to 2**32 - 1 edges); edge ids stay in the
offsets' dtype. The Triton lowering zero-extends an index and switches to 64-bit
pointer offsets for arrays above 4 GiB, so uint32 edge ids address all of `indices`.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plt

from zerognn_jax._src.pallas import counter_hash
from zerognn_jax._src.pallas.common import Tiling, cdiv, fanout_loop, launch, next_pow2

TILING = Tiling(block_rows=128, num_warps=4)


def _floyd(key, node, deg, slots, fanout: int):
    """int32[R, KP]: Floyd's uniform `fanout`-subset of [0, deg) per row, as the reference."""
    chosen = jnp.full((node.shape[0], slots.shape[1]), -1, jnp.int32)

    def step(i, chosen):
        j = deg - fanout + i
        t = counter_hash.uniform_below(counter_hash.slot_bits(key, node, i), jnp.maximum(j + 1, 1))
        taken = jnp.max(jnp.where(chosen == t[:, None], 1, 0), axis=1) > 0
        pick = jnp.where(taken, j, t)
        return jnp.where(slots == i, pick[:, None], chosen)

    return fanout_loop(fanout, step, chosen)


def _slot_offsets(key, node, deg, slots, fanout, replace, all_neighbors):
    """(edge offsets within each row, slot mask), both [R, KP]."""
    if replace:
        bits = counter_hash.slot_bits(key, node[:, None], slots)
        offsets = counter_hash.uniform_below(bits, jnp.maximum(deg, 1)[:, None])
        return offsets, (deg[:, None] > 0) & (slots < fanout)
    offsets = jnp.broadcast_to(slots, (node.shape[0], slots.shape[1]))
    if not all_neighbors:
        offsets = jnp.where(deg[:, None] > fanout, _floyd(key, node, deg, slots, fanout), offsets)
    return offsets, slots < jnp.minimum(deg, fanout)[:, None]


def _sample_kernel(
    key_ref, indptr_ref, indices_ref, frontier_ref, valid_ref, nbr_ref, mask_ref, *edge_ref,
    c, fanout, rows, lanes, replace, all_neighbors
):
    r = pl.program_id(0) * rows + jnp.arange(rows, dtype=jnp.int32)
    live = r < c
    ok = plt.load(valid_ref.at[r], mask=live, other=False) & live
    node = plt.load(frontier_ref.at[r], mask=live, other=0)
    start = plt.load(indptr_ref.at[node], mask=ok, other=0)
    end = plt.load(indptr_ref.at[node + 1], mask=ok, other=0)
    deg = jnp.where(ok, (end - start).astype(jnp.int32), 0)
    slots = jnp.arange(lanes, dtype=jnp.int32)[None, :]
    offsets, mask = _slot_offsets(key_ref[0], node, deg, slots, fanout, replace, all_neighbors)
    edge = jnp.where(mask, start[:, None] + offsets.astype(start.dtype), 0)
    nbr = plt.load(indices_ref.at[edge], mask=mask, other=0)
    out = live[:, None] & (slots < fanout)
    plt.store(nbr_ref.at[r[:, None], slots], nbr, mask=out)
    plt.store(mask_ref.at[r[:, None], slots], mask, mask=out)
    for ref in edge_ref:  # with_edges
        plt.store(ref.at[r[:, None], slots], edge, mask=out)


def _check(indptr, indices, frontier, valid, key, fanout):
    if fanout < 1:
        raise ValueError(f"fanout must be at least 1, got {fanout}")
    if indptr.ndim != 1 or indices.ndim != 1:
        raise ValueError(f"indptr and indices must be 1-D, got {indptr.shape} and {indices.shape}")
    if indptr.dtype not in (jnp.int32, jnp.uint32) or indices.dtype != jnp.int32:
        raise ValueError(
            f"the Pallas sampler needs int32 or uint32 indptr (fewer than 2**32 edges) and "
            f"int32 indices, got {indptr.dtype} and {indices.dtype}"
        )
    if frontier.ndim != 1 or valid.shape != frontier.shape:
        raise ValueError(
            f"frontier and valid must be 1-D of one length, got {frontier.shape} and "
            f"{valid.shape}"
        )
    if jnp.size(key) != 1:
        raise ValueError(f"key must be a scalar, got shape {jnp.shape(key)}")


def sample_neighbors(
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
    interpret: bool = False,
) -> tuple[jax.Array, ...]:
    """Pallas twin of `sampling.sample_neighbors_reference` (same arguments and outputs).

    Returns nbr int32[C, K] (0 in invalid slots) and mask bool[C, K], and with
    `with_edges` the edge ids [C, K] in indptr's dtype, bit-identical to the reference.
    `interpret=True` runs the kernel in the Pallas interpreter.
    """
    _check(indptr, indices, frontier, valid, key, fanout)
    c = frontier.shape[0]
    lanes = next_pow2(fanout)
    rows, params = launch(TILING, c, lanes)
    kernel = functools.partial(
        _sample_kernel, c=c, fanout=fanout, rows=rows, lanes=lanes, replace=replace,
        all_neighbors=all_neighbors,
    )
    out_shape = (jax.ShapeDtypeStruct((c, fanout), jnp.int32),
                 jax.ShapeDtypeStruct((c, fanout), jnp.bool_))
    if with_edges:
        out_shape += (jax.ShapeDtypeStruct((c, fanout), indptr.dtype),)
    return pl.pallas_call(
        kernel,
        out_shape=out_shape,
        grid=(cdiv(c, rows),),
        compiler_params=params,
        interpret=interpret,
        name="zerognn_sample_neighbors",
    )(
        jnp.reshape(key, (1,)).astype(jnp.uint32),
        indptr,
        indices,
        frontier.astype(jnp.int32),
        valid.astype(jnp.bool_),
    )
