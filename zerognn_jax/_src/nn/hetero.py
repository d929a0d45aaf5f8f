"""Relational GNNs in Flax Linen over typed blocks: relational SAGE, R-GCN, R-GAT.

The typed interface, the homogeneous one (models.py) keyed by type and relation:

    model.apply(variables, x, layers, train=..., rngs={"dropout": key}) -> logits

`x` is {type: float[S_t, d_t]} (input rows of the outermost level, each type of its own
width: a type's features, or for a featureless type its rows of a learnable table that
the training step keeps outside the model, training/tasks/typed_node.py), and `layers`
one `TypedLayer` per layer, innermost last: layer i reads hop L - 1 - i. A layer
computes, for every type of its level, the sum over the relations into that type of a
per-relation conv of (the sources' rows, the destinations' rows, the relation's view),
where a type's destinations are the first rows of its sources (the sampled levels'
prefix property), or in a chunk of exact inference the rows from the chunk's start
(`TypedLayer.dst_rows` reads either). A type of the level that no relation of the hop
reaches gets a root transform of its own rows only.

  rsage  SAGEConv per relation, summed per destination type: PyG's `to_hetero(SAGE)`
         with aggr="sum" (each relation has its own root weight).
  rgcn   R-GCN (Schlichtkrull et al.): W_root,t h_i + sum_r mean_{j in N_r(i)} W_r h_j,
         optionally W_r = sum_b a_rb V_b over `num_bases` bases (the sources of every
         relation of a layer must then have one width).
  rgat   a GAT per relation (separate source and destination projections, attention
         over the relation's edges only, `heads` heads, concatenated), summed per
         destination type, leaky ReLU between layers, every layer `hidden` wide and a
         linear classifier on the target type's rows: the layout of MLPerf's R-GAT
         (DGL's `HeteroGraphConv` or PyG's `HeteroConv` of `GATConv`, then `Linear`).
         A relation with fewer sampled edge slots than source rows (edges into a small
         type: venues, topics) projects the rows its slots read, not every source row.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any, ClassVar

import flax.linen as nn
import jax
import jax.numpy as jnp
from flax.linen.dtypes import promote_dtype

from zerognn_jax._src.nn.models import Dropout, SAGEConv, edge_logits
from zerognn_jax._src.nn.views import EdgeView, EllView, mean_weights
from zerognn_jax._src.ops.aggregate import row_major
from zerognn_jax._src.ops.registry import XLA, Kernels

HETERO_MODELS = ("rsage", "rgcn", "rgat")


@functools.partial(jax.tree_util.register_dataclass, data_fields=["views", "dst_start"],
                   meta_fields=["num_dst"])
@dataclasses.dataclass(frozen=True, eq=False)
class TypedLayer:
    """What one layer sees: `views` {relation: edge view} of its hop, and `num_dst`
    ((type, rows), ...), static: every type of the level the layer computes, with its
    row count. A type's destinations are the prefix of its source rows, or, for a type
    in `dst_start` ({type: int32 scalar}: a chunk of exact inference), the rows from
    that start; `dst_rows` reads them either way."""

    views: dict
    num_dst: tuple
    dst_start: dict = dataclasses.field(default_factory=dict)

    def dst_rows(self, node_type: str, h_src: jax.Array) -> jax.Array:
        """The destination rows of `node_type` in its source rows `h_src`."""
        rows = dict(self.num_dst)[node_type]
        start = self.dst_start.get(node_type)
        if start is None:
            return h_src[:rows]
        return jax.lax.dynamic_slice_in_dim(h_src, start, rows)


def typed_layers(mb, kernels: Kernels = XLA, edges: tuple = ()) -> tuple[TypedLayer, ...]:
    """One TypedLayer per layer from a sampled typed minibatch (`TypedMiniBatch`: its
    nodes, valid, degrees and blocks), outermost hop first. Views gather their sources
    through `nbr` (tree-mode levels too: their `nbr` hold the positions). `edges`, per
    hop {relation: float[C, K, D]}: the edge features of those relations' sampled slots,
    which their views carry (`EllView.edge_attr`)."""
    out = []
    for hop in reversed(range(len(mb.blocks))):
        views = {}
        for rel, block in mb.blocks[hop].items():
            dst = rel[2]
            src_deg = jnp.zeros(mb.nodes[hop + 1][rel[0]].shape, jnp.int32)
            views[rel] = EllView(block.nbr, block.mask, mb.valid[hop][dst],
                                 mb.degrees[hop][rel], src_deg, kernels,
                                 edge_attr=edges[hop].get(rel) if edges else None)
        out.append(TypedLayer(views, tuple((t, int(ids.shape[0]))
                                           for t, ids in mb.nodes[hop].items())))
    return tuple(out)


def _name(relation) -> str:
    return "__".join(relation)


class RGCNConv(nn.Module):
    """One R-GCN layer for one destination type: sum over its relations of the mean of
    W_r h_j, plus W_root h_i. `relations` name the layer's relations (for the bases:
    the coefficients are per relation of the whole layer)."""

    features: int
    relations: tuple
    num_bases: int | None = None
    dtype: Any = jnp.float32

    @nn.compact
    def __call__(self, h_dst, inputs):
        """inputs: [(relation, h_src, view), ...] into this type."""
        out = nn.Dense(self.features, dtype=self.dtype, name="root")(h_dst)
        if self.num_bases:
            widths = {h.shape[-1] for _, h, _ in inputs}
            if len(widths) != 1:
                each = ", ".join(f"{_name(r)} {h.shape[-1]}"
                                 for r, h, _ in inputs)
                raise ValueError(f"R-GCN bases need one source width per layer, got "
                                 f"{sorted(widths)} ({each}): project the inputs to one "
                                 f"width first (zg.train gives types without features "
                                 f"learnable rows TrainConfig.hidden wide, embedding_dim "
                                 f"where set: make that the features' width; features of "
                                 f"two widths need padding to one, or R-GCN without bases)")
            init = nn.initializers.glorot_uniform()
            bases = self.param("bases", init, (self.num_bases, widths.pop(), self.features))
            coef = self.param("coef", nn.initializers.lecun_normal(),
                              (len(self.relations), self.num_bases))
        for rel, h_src, view in inputs:
            agg = view.weighted_sum(h_src[:, None, :], mean_weights(view).astype(h_src.dtype))
            agg = agg[:, 0, :]
            if self.num_bases:
                w = jnp.einsum("b,bio->io", coef[self.relations.index(rel)], bases)
                out = out + agg @ w.astype(self.dtype)
            else:
                out = out + nn.Dense(self.features, use_bias=False, dtype=self.dtype,
                                     name=f"rel_{_name(rel)}")(agg)
        return out


class RelGATConv(nn.Module):
    """GAT over one relation: separate projections of sources and destinations (their
    widths may differ), attention over the relation's edges only (no self loop);
    [C, heads * F], or [C, F] averaged over heads with `concat=False`. The sources are
    projected row by row, or slot by slot where the view has fewer edge slots than
    source rows (the same values, fewer rows through the matmul). The destinations'
    projection W_dst enters only their attention term a_dst . (W_dst h), computed as
    h . (W_dst a_dst): one column per head instead of heads * F (the same parameters).
    With `edge_dim`, each edge's features enter its attention logit as PyG's
    `GATConv(edge_dim=...)` defines it: a_edge . (W_e e_ij) per head."""

    features: int
    heads: int = 4
    concat: bool = True
    negative_slope: float = 0.2
    dtype: Any = jnp.float32
    edge_dim: int | None = None

    @nn.compact
    def __call__(self, h_src, h_dst, view):
        h, f = self.heads, self.features // self.heads if self.concat else self.features
        project = nn.Dense(h * f, use_bias=False, dtype=self.dtype, name="src")
        init = nn.initializers.lecun_normal()
        w_dst = self.param("dst", init, (h_dst.shape[-1], h * f))
        a_src = self.param("att_src", init, (1, h, f))
        a_dst = self.param("att_dst", init, (1, h, f))
        # the destinations' projection is read only through a_dst: one column per head
        v_dst = jnp.einsum("dhf,hf->dh", w_dst.reshape(-1, h, f), a_dst[0])
        dst_logits = jnp.matmul(h_dst.astype(self.dtype), v_dst.astype(self.dtype),
                                preferred_element_type=jnp.float32)  # [C, H]
        slots = view.edge_mask.shape
        per_slot = math.prod(slots) < h_src.shape[0]
        if per_slot:  # the slots' rows, projected: fewer than the sources
            # held row-major: left free, XLA relaid them out with two transposes;
            # pinned, none, and igbh-like's R-GAT epoch went from 7.72 to 7.13 s (H200,
            # docs/benchmarks.md)
            z_edges = row_major(project(view.src_of_edges(h_src)).reshape(*slots, h, f))
            src_logits = jnp.sum(z_edges * a_src, -1)
        else:  # every source row projected once, then read per slot
            z_src = project(h_src).reshape(-1, h, f)
            src_logits = view.src_of_edges(jnp.sum(z_src * a_src, -1))
        logits = src_logits + view.dst_of_edges(dst_logits)
        if self.edge_dim is not None:
            logits = logits + self._edge_terms(view, h, f, init)
        logits = nn.leaky_relu(logits, self.negative_slope)
        # no self term: a finite floor that takes the weight only of rows without edges
        floor = jnp.full((h_dst.shape[0], h), -1e30, logits.dtype)
        w_edges, _ = view.softmax(logits, floor)
        w_edges = w_edges.astype(self.dtype)
        if per_slot:  # float32 products and sums, as the gathering sum's
            acc = jnp.promote_types(self.dtype, jnp.float32)
            out = view.sum_edges(z_edges.astype(acc) * w_edges[..., None].astype(acc))
            out = out.astype(self.dtype)  # [C, H, F]
        else:
            out = view.weighted_sum(z_src, w_edges)
        out = out.reshape(-1, h * f) if self.concat else jnp.mean(out, axis=1)
        bias = self.param("bias", nn.initializers.zeros, (out.shape[-1],))
        return out + bias.astype(self.dtype)

    def _edge_terms(self, view, h: int, f: int, init) -> jax.Array:
        """Edge-shaped [..., H]: a_edge . (W_e e) of each edge's features e
        (`edge_logits`, as `GATConv`'s)."""
        e = view.edge_features()
        if e.shape[-1] != self.edge_dim:
            raise ValueError(f"RelGATConv has edge_dim {self.edge_dim}, and its view's edge "
                             f"features are {e.shape[-1]} wide")
        w_edge = self.param("edge_kernel", init, (self.edge_dim, h * f))
        return edge_logits(e, w_edge, self.param("att_edge", init, (1, h, f)), self.dtype)


class HeteroGNN(nn.Module):
    """A stack of relational layers (module docstring) with ReLU (rgat: leaky ReLU) and
    dropout between; rgat's last layer is `hidden` wide, then a linear classifier.

    Attributes:
      conv: "rsage", "rgcn" or "rgat".
      hidden: width of every hidden layer; num_layers; num_classes: output width.
      target_type: the type whose level-0 rows are the logits.
      relations: the graph's relations ((src, name, dst), ...): a conv per relation and
        layer (rgcn: per destination type and layer), whether sampled or not.
      heads: for rgat. num_bases: for rgcn (None: a full matrix per relation).
      dropout: on the hidden activations; input_dropout: on the raw features.
      dtype: computation dtype; parameters float32, logits float32.
      edge_dims: ((relation, D), ...): rgat's relations whose attention reads their
        edges' D features (their views carry them); the others read none.
    """

    conv: str
    hidden: int
    num_layers: int
    num_classes: int
    target_type: str
    relations: tuple
    heads: int = 4
    num_bases: int | None = None
    dropout: float = 0.5
    input_dropout: float = 0.0
    dtype: Any = jnp.float32
    edge_dims: tuple = ()
    # `layer` reads each type's destinations through `TypedLayer.dst_rows`, so exact
    # inference may give it chunks of destination rows (training/tasks/typed_eval.py)
    chunked_exact: ClassVar[bool] = True

    def setup(self):
        types = tuple(dict.fromkeys([self.target_type, *(t for r in self.relations
                                                         for t in (r[0], r[2]))]))
        classifier = self.conv == "rgat"  # MLPerf's layout: hidden-wide convs, then Dense
        convs, roots = [], []
        for i in range(self.num_layers):
            last = i == self.num_layers - 1
            width = self.num_classes if last and not classifier else self.hidden
            if self.conv == "rgcn":
                convs.append({t: RGCNConv(width, self.relations, self.num_bases, self.dtype)
                              for t in types if any(r[2] == t for r in self.relations)})
            else:
                convs.append({_name(r): self._relation_conv(width, r) for r in self.relations})
            roots.append({t: nn.Dense(width, dtype=self.dtype) for t in types})
        self.convs, self.roots = convs, roots
        self.classifier = nn.Dense(self.num_classes, dtype=self.dtype) if classifier else None
        self.drop_input = Dropout(self.input_dropout)
        self.drop_hidden = Dropout(self.dropout)

    def _relation_conv(self, width: int, relation):
        if self.conv == "rsage":
            return SAGEConv(width, dtype=self.dtype)
        if self.conv == "rgat":
            return RelGATConv(width, self.heads, dtype=self.dtype,
                              edge_dim=dict(self.edge_dims).get(relation))
        raise ValueError(f"unknown relational conv {self.conv!r}; choose one of "
                         f"{', '.join(HETERO_MODELS)}")

    def __call__(self, x: dict, layers, *, train: bool):
        return self.encode(x, layers, train=train)[self.target_type]

    def encode(self, x: dict, layers, *, train: bool) -> dict:
        """{type: float32 rows} of every type of level 0 after the last layer (a link
        task's two ends; `__call__` keeps the target type's)."""
        if len(layers) != self.num_layers:
            raise ValueError(f"the model has {self.num_layers} "
                             f"layer{'s' if self.num_layers != 1 else ''}, the batch "
                             f"{len(layers)} hops")
        read = {r[0] for r in layers[0].views} | {t for t, _ in layers[0].num_dst}
        missing = sorted(read - set(x))
        if missing:
            raise ValueError(f"x has no rows of node type {', '.join(map(repr, missing))}, "
                             f"which the first layer reads: a featureless type needs rows "
                             f"of yours (an embedding of batch.input_nodes[type], "
                             f"docs/loader.md)")
        h = x
        for i, layer in enumerate(layers):
            h = self.layer(i, h, layer, train=train)
        return h

    def layer(self, i: int, h: dict, layer: TypedLayer, *, train: bool) -> dict:
        """Layer i: {type: rows} of the level it computes, from the sources `h`
        ({type: [S_t, d]}, each type's destinations its first rows, or those
        `layer.dst_start` names). With whole-graph views (`whole_graph_layer`), or views
        of chunks of destination rows, this is exact layer-wise inference."""
        drop = self.drop_input if i == 0 else self.drop_hidden
        # Each call of `drop` draws the next dropout key: types in sorted order, not the
        # dict's, which a jit boundary re-sorts (a step whose sample arrived through one
        # would otherwise drop other units than one that sampled inside it).
        h = {t: drop(h[t].astype(self.dtype), deterministic=not train) for t in sorted(h)}
        out = {}
        for t, _ in layer.num_dst:
            h_dst = layer.dst_rows(t, h[t])
            into = [(r, h[r[0]], v) for r, v in layer.views.items() if r[2] == t]
            if not into:
                out[t] = self.roots[i][t](h_dst)
            elif self.conv == "rgcn":
                out[t] = self.convs[i][t](h_dst, into)
            elif self.conv == "rsage":
                out[t] = self._sage_sum(i, h_dst, into)
            else:
                out[t] = sum(self.convs[i][_name(r)](h_src, h_dst, v) for r, h_src, v in into)
        if i == self.num_layers - 1:
            if self.classifier is not None:
                out = {t: self.classifier(v) for t, v in out.items()}
            return {t: v.astype(jnp.float32) for t, v in out.items()}
        act = nn.leaky_relu if self.conv == "rgat" else nn.relu
        return {t: act(v) for t, v in out.items()}

    def _sage_sum(self, i: int, h_dst, into) -> jax.Array:
        """Layer i's SAGE convs of the relations `into` [(relation, sources, view)] of one
        destination type, summed. Each is W_r [h_dst ; agg_r] + b_r, so their sum is one
        product: [h_dst ; agg_1 ; ... ; agg_k] times the kernels' destination rows summed
        and their neighbour rows stacked, plus the biases summed. One concatenation, one
        matrix product (forward and backward) and no sum over k outputs, where the convs
        one by one copy h_dst k times and multiply k times. The parameters stay those of
        each relation's conv (created by calling the convs while initialising); the
        values are theirs up to rounding (one relation: the same products)."""
        convs = [self.convs[i][_name(r)] for r, _, _ in into]
        if self.is_initializing():
            return sum(conv(h_src, h_dst, v) for conv, (_, h_src, v) in zip(convs, into))
        linear = [conv.variables.get("params", {}).get("linear") for conv in convs]
        missing = [_name(r) for (r, _, _), p in zip(into, linear) if p is None]
        if missing:
            raise ValueError(f"layer {i} has no parameters for relation(s) "
                             f"{', '.join(missing)}: the model was initialised on batches "
                             f"that never sampled them at that layer")
        d = h_dst.shape[-1]
        kernel = jnp.concatenate([sum(p["kernel"][:d] for p in linear),
                                  *(p["kernel"][d:] for p in linear)])
        bias = sum(p["bias"] for p in linear)
        aggs = _written_out([conv.aggregate(h_src, v).astype(h_dst.dtype)
                             for conv, (_, h_src, v) in zip(convs, into)])
        both, kernel, bias = promote_dtype(jnp.concatenate([h_dst, *aggs], axis=-1), kernel,
                                           bias, dtype=self.dtype)
        return jnp.dot(both, kernel) + bias


@jax.custom_jvp
def _written_out(xs):
    """`xs` written out before anything reads them; their tangents and gradients pass as
    they are.

    Left to itself XLA fused the aggregates' gathers and reductions into the loop
    fusion of the concatenation that reads them, which then reduced element by element
    (mag-like's papers: 84 us a step for their [12,288, 768] input on an H200;
    docs/benchmarks.md, eighteenth session). An optimization barrier alone would also
    hold back their gradients, which XLA then copies out of the concatenation's."""
    return jax.lax.optimization_barrier(xs)


@_written_out.defjvp
def _written_out_jvp(primals, tangents):
    return _written_out(*primals), tangents[0]


def whole_graph_layer(graph, types=None) -> TypedLayer:
    """A TypedLayer of whole-graph edge views (`EdgeView`) over every relation into
    `types` (default: every type) of `graph` (a `HeteroGraph`: its `node_counts` and
    `items()`): every node of those types is a destination, and a relation's views
    carry its edge features where it has them. Run through
    `HeteroGNN.layer`, layer by layer, it gives exact inference (every neighbour, no
    sampling) for all their nodes at once. Layer i should compute the types a sampled
    batch holds at level L - 1 - i (`TypedSamplerConfig.plan`): a type no sampled batch
    computed there has no parameters for it."""
    types = set(graph.num_nodes if types is None else types)
    views = {}
    for rel, g in graph.items():
        if rel[2] not in types:
            continue
        indptr = jnp.asarray(g.indptr)
        deg = (indptr[1:] - indptr[:-1]).astype(jnp.int32)
        n_dst = deg.shape[0]
        dst = jnp.repeat(jnp.arange(n_dst, dtype=jnp.int32), deg,
                         total_repeat_length=g.num_edges)
        edges = None if g.edge_features is None else jnp.asarray(g.edge_features)
        views[rel] = EdgeView(jnp.asarray(g.indices), dst, jnp.ones(g.num_edges, bool),
                              jnp.ones(n_dst, bool), deg, jnp.zeros(1, jnp.int32), n_dst,
                              edges)
    return TypedLayer(views, tuple((t, n) for t, n in graph.node_counts if t in types))


def make_hetero_model(name: str, *, hidden: int, num_layers: int, num_classes: int,
                      target_type: str, relations, heads: int = 4,
                      num_bases: int | None = None, dropout: float = 0.5,
                      input_dropout: float = 0.0, dtype: Any = jnp.float32,
                      edge_dims: dict | None = None) -> HeteroGNN:
    """Builds a relational model by name: rsage, rgcn, rgat (module docstring), with a
    conv per relation of `relations` (the graph's, `HeteroGraph.relations`).
    `edge_dims` ({relation: D}, rgat only): the relations whose attention reads their
    edges' D features. The other arguments are `HeteroGNN`'s attributes: `hidden`,
    `num_layers`, `num_classes` (the output width), `target_type` (whose rows are the
    outputs), `heads` (rgat; must divide `hidden`), `num_bases` (rgcn's basis
    decomposition; None: a matrix per relation), `dropout`, `input_dropout` (on the raw
    features) and `dtype`."""
    if name not in HETERO_MODELS:
        raise ValueError(f"unknown model {name!r}; choose one of {', '.join(HETERO_MODELS)}")
    if name == "rgat" and (heads < 1 or hidden % heads):
        raise ValueError(f"R-GAT needs heads >= 1 dividing hidden, got hidden {hidden}, "
                         f"heads {heads}")
    if num_bases is not None and (name != "rgcn" or num_bases < 1):
        raise ValueError(f"num_bases applies to rgcn and must be >= 1, got {num_bases} "
                         f"for {name}")
    if edge_dims and name != "rgat":
        raise ValueError(f"model {name!r} reads no edge features (edge_dims given); rgat "
                         f"does")
    return HeteroGNN(name, hidden, num_layers, num_classes, target_type,
                     tuple(tuple(r) for r in relations), heads, num_bases, dropout,
                     input_dropout, dtype,
                     tuple((tuple(r), int(d)) for r, d in (edge_dims or {}).items()))


class OnTypes(nn.Module):
    """A relational model (`HeteroGNN`'s interface) run by the engines' step: it takes
    the outermost level's gathered rows and the typed minibatch instead of
    `{type: rows}` and typed layers (training/tasks/typed_node.py gathers them).

    Attributes:
      model: the relational model. kernels: the views' kernels.
      widths: ((type, d_type), ...) of the types with features, in the stacked table's
        order: `x` holds one array of level-L rows per such type the level holds, in
        this order, each as wide as the table (a narrower type's first d_type columns
        are its features, sliced here: only the widest types' rows reach the model
        uncopied).
      embedded: the types with learnable rows, in the order of their packed embedding
        rows: the featureless types, or every type with `embedding_dim` (a featured
        type's rows then follow its features, `join_inputs`).
    """

    model: nn.Module
    kernels: Kernels = XLA
    widths: tuple = ()
    embedded: tuple = ()

    def typed_inputs(self, x, nodes: dict) -> dict:
        """{type: rows} of the outermost level from the gathered rows `x` and `nodes`
        {type: int32[S_t]}: `x` is (float[S_t, max d], ...), one array per featured type
        of `widths` that `nodes` holds, or with embedded types the pair (that,
        float[sum of S_t over `embedded`, dim]) of feature rows and packed embedding
        rows."""
        features, embedded = x if self.embedded else (x, None)
        present = [(t, d) for t, d in self.widths if t in nodes]
        return join_inputs({t: rows[:, :d] for (t, d), rows in zip(present, features)},
                           _unpack(embedded, self.embedded, nodes))

    def __call__(self, x, views, *, train: bool, typed, edges: tuple = ()):
        """Logits float32[B, classes] of the seeds of the typed minibatch `typed`
        (`views` is empty: the typed layers come from `typed`'s blocks, with `edges`,
        per hop {relation: float[C, K, D]}, the edge features of the sampled slots)."""
        del views
        h = self.typed_inputs(x, typed.nodes[-1])
        return self.model(h, typed_layers(typed, self.kernels, edges), train=train)

    def layer(self, i: int, h: dict, layer: TypedLayer, *, train: bool) -> dict:
        """`HeteroGNN.layer`, for exact layer-wise inference."""
        return self.model.layer(i, h, layer, train=train)

    @property
    def num_layers(self) -> int:
        return self.model.num_layers


def join_inputs(features: dict, embedded: dict) -> dict:
    """{type: input rows}: a type's feature rows, its embedding rows, or both side by
    side (features first) where it has both."""
    out = {**features, **embedded}
    for t in features.keys() & embedded.keys():
        out[t] = jnp.concatenate([features[t], embedded[t].astype(features[t].dtype)], 1)
    return out


def _unpack(rows, types, nodes: dict) -> dict:
    """{type: its rows of `rows`}: the `types` that `nodes` holds, each `nodes[type]`'s
    length of rows in turn."""
    out, start = {}, 0
    for t in types:
        if t in nodes:
            count = nodes[t].shape[0]
            out[t] = rows[start:start + count]
            start += count
    return out
