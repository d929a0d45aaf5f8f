"""What a GNN layer sees of its edges: sampled ELL blocks or exact edge chunks.

Both views offer the same methods, so one layer definition serves sampled training
(`EllView`: edges as a [C, K] neighbour matrix with a mask) and exact layer-wise
inference (`EdgeView`: a flat chunk of CSR edges). Edge-shaped arrays are [C, K, ...]
for the first and [E, ...] for the second.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from zerognn_jax._src.ops.aggregate import (
    check_max,
    check_weighted_sum,
    gather_live,
    neighbor_max,
    weighted_sum,
)
from zerognn_jax._src.ops.registry import XLA, Kernels


def _gcn_norm(dst_deg, src_deg, sampled):
    """Symmetric GCN weight 1/sqrt((d_i + 1)(d_j + 1)), rescaled by d_i / sampled_i."""
    scale = dst_deg.astype(jnp.float32) / jnp.maximum(sampled, 1).astype(jnp.float32)
    return scale * jax.lax.rsqrt((dst_deg + 1.0) * (src_deg + 1.0))


@dataclasses.dataclass(frozen=True)
class EllView:
    """A sampled block. nbr, mask: [C, K]; dst_valid, dst_deg: [C]; src_deg: [S].

    `positional`: the sources are laid out in slot order (row C + c K + k is slot
    (c, k); S = C (1 + K): tree mode, a flat outer hop), so slots are read by position
    (a reshape) instead of gathered through `nbr`. Either way gives the same values.

    `edge_attr`: [C, K, D] features of the sampled edges (zero in dead slots), for
    layers that read them (`edge_features`); None when the block carries none.

    `node_ids`: int32[S], the global node id of each source row (padding rows hold
    row 0's id), for models that index tables of their own by node (a learnable
    embedding, `views[0].node_ids`); None where the view was built without them.
    `dst_ids` gives the destinations' (the sources' first C: dst-first levels).

    `pin_aggregates`: positional aggregates are written out before anything reads them
    (an optimization barrier), for forward passes that are not differentiated. There,
    XLA 0.11.2 on an H100 fuses the reduction over a slice of the sources with a
    concatenation of the sources' first rows (SAGE's `[h_dst ; agg]`) into one Triton
    block-level fusion that computes wrong values at 256 features (relative error ~1
    against the CPU; 64, 100 and 128 features came out right), and sampled inference
    in tree mode lost 3 to 14 points of accuracy (docs/benchmarks.md, "Sampled
    evaluation"). Training steps compiled right and keep the fusion: the barrier made
    a bfloat16 products-like epoch 5-7 % slower.
    """

    nbr: jax.Array
    mask: jax.Array
    dst_valid: jax.Array
    dst_deg: jax.Array
    src_deg: jax.Array
    kernels: Kernels = XLA
    positional: bool = False
    pin_aggregates: bool = False
    edge_attr: jax.Array | None = None
    node_ids: jax.Array | None = None

    @property
    def num_dst(self) -> int:
        return self.nbr.shape[0]

    @property
    def dst_ids(self) -> jax.Array | None:
        """int32[C]: the global node id of each destination row (None without
        `node_ids`)."""
        return None if self.node_ids is None else self.node_ids[:self.num_dst]

    @property
    def edge_mask(self) -> jax.Array:
        return self.mask

    def _slot_rows(self, x_src: jax.Array) -> jax.Array:
        """x_src's rows of the slots by position, [C, K, ...]; masked slots read zero."""
        c, k = self.nbr.shape
        if x_src.shape[0] != c * (1 + k):
            raise ValueError(f"a positional block with {c} x {k} slots reads {c * (1 + k)} "
                             f"source rows, got {x_src.shape[0]}")
        rows = x_src[c:].reshape(c, k, *x_src.shape[1:])
        live = self.mask.reshape(c, k, *(1,) * (x_src.ndim - 1))
        return jnp.where(live, rows, jnp.zeros((), x_src.dtype))

    def _pinned(self, agg: jax.Array) -> jax.Array:
        """`agg`, behind an optimization barrier with `pin_aggregates`."""
        return jax.lax.optimization_barrier(agg) if self.pin_aggregates else agg

    def dst_of_edges(self, x_dst: jax.Array) -> jax.Array:
        """[C, K, ...]: each slot's destination row of `x_dst` [C, ...]."""
        return jnp.broadcast_to(x_dst[:, None], self.nbr.shape + x_dst.shape[1:])

    def src_of_edges(self, x_src: jax.Array) -> jax.Array:
        """[C, K, ...]: each slot's source row of `x_src` [S, ...] (zero in dead slots)."""
        if self.positional:
            return self._slot_rows(x_src)
        return gather_live(x_src, self.nbr, self.mask)

    def edge_count(self) -> jax.Array:
        """float32[C]: sampled edges per destination."""
        return jnp.sum(self.mask, axis=1).astype(jnp.float32)

    def edge_features(self) -> jax.Array:
        """[C, K, D]: the block's edge features (`_require_edges` explains a None)."""
        return _require_edges(self.edge_attr)

    def sum_edges(self, values: jax.Array) -> jax.Array:
        """[C, ...]: per destination, the sum of edge-shaped `values` [C, K, ...] over its
        live slots (float32 sums for half-precision values)."""
        live = self.mask.reshape(self.mask.shape + (1,) * (values.ndim - 2))
        acc = jnp.promote_types(values.dtype, jnp.float32)
        out = jnp.sum(jnp.where(live, values.astype(acc), 0), axis=1)
        return self._pinned(out.astype(values.dtype))

    def weighted_sum(self, h_src: jax.Array, weights: jax.Array) -> jax.Array:
        """[C, H, F] from h_src [S, H, F] and weights [C, K, H] (zero where masked).

        Summed in float32 for half-precision inputs, as the gathering op does."""
        check_weighted_sum(h_src, weights, self.nbr.shape)
        if self.positional:
            acc = jnp.promote_types(h_src.dtype, jnp.float32)
            rows = self._slot_rows(h_src).astype(acc)
            out = jnp.sum(rows * weights[..., None].astype(acc), axis=1)
            return self._pinned(out.astype(h_src.dtype))
        return weighted_sum(self.kernels, h_src, self.nbr, weights)

    def max(self, h_src: jax.Array) -> jax.Array:
        """[C, F]: per destination, the elementwise max of `h_src` [S, F] over its live
        slots (0 for a destination with none; a NaN is kept, as `jnp.max` keeps it)."""
        check_max(h_src)
        if self.positional:
            rows = jnp.where(self.mask[..., None], self._slot_rows(h_src), -jnp.inf)
            best = jnp.max(rows, axis=1)
            live = jnp.any(self.mask, axis=1)[:, None]
            return self._pinned(jnp.where(live, best, 0).astype(h_src.dtype))
        return neighbor_max(self.kernels, h_src, self.nbr, self.mask)

    def softmax(self, logits: jax.Array, self_logits: jax.Array):
        """Softmax over each row's valid edges plus a self term; returns (w_edges, w_self).

        logits: [C, K, H]; self_logits: [C, H].
        """
        neg = jnp.array(-jnp.inf, logits.dtype)
        masked = jnp.where(self.mask[..., None], logits, neg)
        top = jnp.maximum(jnp.max(masked, axis=1), self_logits)
        e = jnp.where(self.mask[..., None], jnp.exp(masked - top[:, None]), 0.0)
        e_self = jnp.exp(self_logits - top)
        total = jnp.sum(e, axis=1) + e_self
        return e / total[:, None], e_self / total


@dataclasses.dataclass(frozen=True)
class EdgeView:
    """A chunk of whole-graph CSR edges. src, dst, mask: [E]; dst in [0, num_dst),
    non-decreasing (CSR order; padding slots at the end). A chunk holds every edge of
    each of its destinations, so `dst_deg` [num_dst] counts each one's live edges."""

    src: jax.Array
    dst: jax.Array
    mask: jax.Array
    dst_valid: jax.Array
    dst_deg: jax.Array
    src_deg: jax.Array
    num_dst: int
    edge_attr: jax.Array | None = None  # [E, D], as EllView's
    node_ids: jax.Array | None = None  # int32[S], as EllView's (all nodes: 0 .. N - 1)
    # int32[num_dst]: the destinations' global ids (a chunk's rows are not the sources'
    # first: exact inference hands them to a layer as h_dst apart)
    dst_ids: jax.Array | None = None

    @property
    def edge_mask(self) -> jax.Array:
        return self.mask

    def edge_features(self) -> jax.Array:
        """[E, D]: the chunk's edge features (`_require_edges` explains a None)."""
        return _require_edges(self.edge_attr)

    def sum_edges(self, values: jax.Array) -> jax.Array:
        """[num_dst, ...]: per destination, the sum of edge-shaped `values` [E, ...]."""
        live = self.mask.reshape(self.mask.shape + (1,) * (values.ndim - 1))
        return self._segment_sum(jnp.where(live, values, jnp.zeros((), values.dtype)))

    def dst_of_edges(self, x_dst: jax.Array) -> jax.Array:
        """[E, ...]: each edge's destination row of `x_dst` [num_dst, ...]."""
        return x_dst[self.dst]

    def src_of_edges(self, x_src: jax.Array) -> jax.Array:
        """[E, ...]: each edge's source row of `x_src` [S, ...] (padding edges read a
        real row: mask what they give, as `sum_edges` does)."""
        return x_src[self.src]

    def _scatter_index(self) -> jax.Array:
        """dst with padding slots sent out of range, where segment ops drop them: left
        on one row, a chunk's padding serialises there as a hub's edges do."""
        return jnp.where(self.mask, self.dst, self.num_dst)

    def _segment_sum(self, values):
        """Per-destination sums, accumulated in float32 (a bfloat16 scatter-add on a
        hub's row is slow as well as inexact); returned in `values`' dtype."""
        out = jax.ops.segment_sum(values.astype(jnp.float32), self._scatter_index(),
                                  num_segments=self.num_dst, indices_are_sorted=True)
        return out.astype(values.dtype)

    def _segment_max(self, values):
        return jax.ops.segment_max(values, self._scatter_index(), num_segments=self.num_dst,
                                   indices_are_sorted=True)

    def edge_count(self) -> jax.Array:
        """float32[num_dst]: edges per destination (its degree: a chunk holds them all)."""
        # the degrees: counting the live slots again would cost a scatter-add a chunk
        return self.dst_deg.astype(jnp.float32)

    def weighted_sum(self, h_src: jax.Array, weights: jax.Array) -> jax.Array:
        """[num_dst, H, F] from h_src [S, H, F] and weights [E, H] (zero where masked),
        summed in float32, in h_src's dtype (as `EllView.weighted_sum` gives it)."""
        check_weighted_sum(h_src, weights, self.src.shape)
        return self._segment_sum(h_src[self.src] * weights[..., None]).astype(h_src.dtype)

    def max(self, h_src: jax.Array) -> jax.Array:
        """[num_dst, F]: per destination, the elementwise max of `h_src` [S, F] over its
        edges (0 for a destination with none; an infinite max is kept, as the sampled
        views keep it)."""
        check_max(h_src)
        vals = jnp.where(self.mask[:, None], h_src[self.src], -jnp.inf)
        best = self._segment_max(vals)
        return jnp.where(self.dst_deg[:, None] > 0, best, 0.0)

    def softmax(self, logits: jax.Array, self_logits: jax.Array):
        """Softmax over each destination's edges plus a self term; returns (w_edges,
        w_self). logits: [E, H]; self_logits: [num_dst, H]."""
        masked = jnp.where(self.mask[:, None], logits, -jnp.inf)
        top = self._segment_max(masked)
        top = jnp.maximum(top, self_logits)
        e = jnp.where(self.mask[:, None], jnp.exp(masked - top[self.dst]), 0.0)
        e_self = jnp.exp(self_logits - top)
        total = self._segment_sum(e) + e_self
        return e / total[self.dst], e_self / total


class NoEdgeFeatures(ValueError):
    """A layer read `view.edge_features()` of a view built without them; `zg.train`
    words it as the option its run lacks (training/checks.py)."""


def _require_edges(edge_attr):
    if edge_attr is None:
        raise NoEdgeFeatures("this layer reads edge features, and its view carries none: "
                             "build the views with zg.views_for(mb, edge_table=...) from "
                             "blocks sampled with SamplerConfig(edge_ids=True)")
    return edge_attr


def mean_over_edges(view, values: jax.Array) -> jax.Array:
    """Per destination, the mean of edge-shaped `values` over its edges (0 for none)."""
    count = view.edge_count().reshape((-1,) + (1,) * (values.ndim - view.mask.ndim))
    return view.sum_edges(values) / jnp.maximum(count, 1.0).astype(values.dtype)


def mean_weights(view) -> jax.Array:
    """Edge weights [edges..., 1] of a mean over each destination's valid edges."""
    count = view.edge_count()
    w = view.edge_mask / jnp.maximum(view.dst_of_edges(count), 1.0)
    return w.astype(jnp.float32)[..., None]


def gcn_weights(view) -> jax.Array:
    """Edge weights [edges..., 1] of sampled symmetric GCN normalisation.

    Exact GCN (with self loops) when every neighbour is present; with sampling each
    edge is scaled by degree / sampled count so the sum stays unbiased.
    """
    count = view.dst_of_edges(view.edge_count())
    dst_deg = view.dst_of_edges(view.dst_deg.astype(jnp.float32))
    src_deg = view.src_of_edges(view.src_deg.astype(jnp.float32))
    w = _gcn_norm(dst_deg, src_deg, count)
    return jnp.where(view.edge_mask, w, 0.0)[..., None]
