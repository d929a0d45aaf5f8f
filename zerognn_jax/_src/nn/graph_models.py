"""Graph-level models in Flax Linen: GIN, GINE and GCN with an optional virtual node,
OGB-style categorical encoders, and sum / mean / max / attention readouts.

The interface of a graph-level model (built-in or a user's):

    model.apply(variables, graphs, train=..., rngs={"dropout": key}) -> float[B + 1, out]

where `graphs` is a `Graphs` (jraph's `GraphsTuple` fields plus masks) of B graphs and
the padding graph (the last slot): one output row per graph slot; the padding graph's
row is never read. `OnGraphs` adapts such a model to the step's calling convention.
The built-in models follow OGB's molecule GNNs (ogb/examples/graphproppred/mol): per
layer a convolution, batch normalisation over the real nodes, ReLU (not after the last
layer), dropout; the virtual node is OGB's (a per-graph vector added to every node
before each layer and updated by an MLP of the graph's summed nodes). Unlike OGB's,
dense layers that feed a batch norm have no bias (`dense_before_norm`): it would change
no output.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import flax.linen as nn
import jax
import jax.numpy as jnp

from zerognn_jax._src.nn.models import RowBatchNorm, dropout_seed, hash_dropout
from zerognn_jax._src.ops.aggregate import _accumulator
from zerognn_jax._src.ops.incidence import Incidence, edges_to_nodes, nodes_to_edges
from zerognn_jax._src.pallas import counter_hash

GRAPH_CONVS = ("gin", "gine", "gcn")
GRAPH_MODELS = (*GRAPH_CONVS, *(f"{c}-virtual" for c in GRAPH_CONVS))
READOUTS = ("sum", "mean", "max", "attention")


class Graphs(NamedTuple):
    """A padded batch of graphs: jraph `GraphsTuple` fields plus masks.

    Attributes:
      nodes: float[Nc, d] node features (categorical ids as floats for encoders).
      edges: float[Ec, d_e] edge features, or None.
      senders, receivers: int32[Ec] node slots; padding edges join padding nodes.
      n_node, n_edge: int32[B + 1]; the last graph slot is the padding graph.
      globals: None (the targets stay with the task).
      node_graph: int32[Nc], each node's graph slot, non-decreasing (a graph's nodes
        are contiguous, as in jraph); node_mask: bool[Nc] real nodes.
      edge_mask: bool[Ec] real edges; graph_mask: bool[B + 1] real graphs.
      in_slots, out_slots: int32[Nc, K], the real edges each node receives and sends
        (Ec in unused slots), or None: layers then sum messages with scatter-adds
        (ops/incidence.py).
    """

    nodes: jax.Array
    edges: jax.Array | None
    senders: jax.Array
    receivers: jax.Array
    n_node: jax.Array
    n_edge: jax.Array
    globals: Any
    node_graph: jax.Array
    node_mask: jax.Array
    edge_mask: jax.Array
    graph_mask: jax.Array
    in_slots: jax.Array | None = None
    out_slots: jax.Array | None = None

    @property
    def num_graphs(self) -> int:
        return self.n_node.shape[0]

    @property
    def incoming(self) -> Incidence:
        """Each edge slot's receiver; each node's received edges when listed."""
        return Incidence(self.receivers, self.edge_mask, self.in_slots)

    @property
    def outgoing(self) -> Incidence:
        """Each edge slot's sender; each node's sent edges when listed."""
        return Incidence(self.senders, self.edge_mask, self.out_slots)


def _widened(x: jax.Array) -> jax.Array:
    """A float `x` in its accumulation dtype (`ops.aggregate`'s: float32 for half
    precision); any other `x` as it is."""
    return x.astype(_accumulator(x.dtype)) if jnp.issubdtype(x.dtype, jnp.floating) else x


def pool(h: jax.Array, graphs: Graphs, how: str) -> jax.Array:
    """float[B + 1, d]: node rows `h` [Nc, d] summed, averaged or maxed per graph.

    The graph ids are declared sorted: on a GPU, XLA then sums each run of equal ids in
    registers and adds it with one atomic (its sorted-indices scatter), where rows
    of unsorted ids would each be an atomic on one of B + 1 rows. Half-precision rows
    are pooled in float32 and the result given back in their dtype: the sums are more
    exact, and on an H100 a bfloat16 scatter-add of [7872, 300] rows took 105 us where
    float32's took 8.5."""
    g, num, x = graphs.node_graph, graphs.num_graphs, _widened(h)
    if how == "sum":
        out = jax.ops.segment_sum(x, g, num, indices_are_sorted=True)
    elif how == "mean":
        count = jnp.maximum(graphs.n_node, 1).astype(x.dtype)[:, None]
        out = jax.ops.segment_sum(x, g, num, indices_are_sorted=True) / count
    elif how == "max":
        out = jax.ops.segment_max(x, g, num, indices_are_sorted=True)
        out = jnp.where(graphs.n_node[:, None] > 0, out, 0).astype(x.dtype)
    else:
        raise ValueError(f"readout must be one of {', '.join(READOUTS)}, got {how!r}")
    return out if x is h else out.astype(h.dtype)


def broadcast(rows: jax.Array, graphs: Graphs) -> jax.Array:
    """float[Nc, d]: each node's row of the per-graph `rows` [B + 1, d]; its gradient
    is `pool`'s sorted sum, in float32 for half-precision rows (as `pool`)."""
    out = jnp.take(_widened(rows), graphs.node_graph, axis=0, indices_are_sorted=True)
    return out.astype(rows.dtype)


# Categories in all up to which the encoder multiplies multi-hot codes (OGB's atoms:
# 173, bonds: 13); a larger vocabulary would make the codes wider than a lookup's rows.
MULTI_HOT_LIMIT = 1024


class CategoricalEncoder(nn.Module):
    """OGB's AtomEncoder / BondEncoder: the sum of one embedding per categorical
    column. `vocab[k]` categories in column k; input [rows, len(vocab)] ids (any dtype).

    Computed as one matrix product of the rows' multi-hot codes (one 1 per column) with
    the stacked tables, at full float32 precision: its gradient is a product too, where
    the lookups' gradient scatter-adds every row into a few table rows (atomics that
    all collide: bond tables have 2 to 6 rows). The tables are Flax `Embed` parameters
    (`column{k}/embedding`), as when they were looked up. Above MULTI_HOT_LIMIT
    categories in all (the codes are [rows, sum(vocab)]) the columns are looked up."""

    vocab: tuple[int, ...]
    dim: int
    dtype: Any = jnp.float32

    @nn.compact
    def __call__(self, x):
        ids = x.astype(jnp.int32)
        init = nn.initializers.xavier_uniform()
        tables = [nn.Embed(v, self.dim, embedding_init=init, name=f"column{k}").embedding
                  for k, v in enumerate(self.vocab)]
        if sum(self.vocab) > MULTI_HOT_LIMIT:
            return sum(jnp.take(t, ids[:, k], axis=0) for k, t in enumerate(tables)) \
                .astype(self.dtype)
        codes = sum(jax.nn.one_hot(ids[:, k] + start, sum(self.vocab), dtype=self.dtype)
                    for k, start in enumerate(_starts(self.vocab)))
        stacked = jnp.concatenate(tables).astype(self.dtype)
        return jnp.dot(codes, stacked, precision=jax.lax.Precision.HIGHEST)


def _starts(vocab: tuple[int, ...]) -> list[int]:
    """Each column's first row in the stacked tables."""
    return [sum(vocab[:k]) for k in range(len(vocab))]


def encoder(vocab: tuple[int, ...], dim: int, dtype, name: str) -> nn.Module:
    """A categorical encoder when `vocab` is given, else a dense projection."""
    if vocab:
        return CategoricalEncoder(tuple(vocab), dim, dtype, name=name)
    return nn.Dense(dim, dtype=dtype, name=name)


class MaskedBatchNorm(nn.Module):
    """Batch normalisation over the rows where `mask` (bool[rows]) holds, with PyTorch's
    BatchNorm1d defaults (momentum 0.1, eps 1e-5) in Flax's terms: padding rows count
    in no statistic. Values, variables and their names are those of Flax's
    `nn.BatchNorm(momentum=0.9, epsilon=1e-5)` given the mask, as a child "BatchNorm_0"
    (checkpoints of either load in the other); training steps differentiate it by
    `ops.batch_norm.masked_batch_norm`'s two-pass gradient. A training call with no
    masked row (a device without graphs in the last step of a data-parallel epoch)
    leaves the running statistics as they were. The statistics and the arithmetic are
    float32; the output has `dtype` (float32 when None, Flax's result type for float32
    parameters), so that a bfloat16 model's activations between layers stay bfloat16
    (as Flax's `BatchNorm(dtype=...)` gives)."""

    dtype: Any = None

    @nn.compact
    def __call__(self, x, mask, *, train: bool):
        return RowBatchNorm(0.9, dtype=self.dtype, name="BatchNorm_0")(x, mask, train=train)


def dense_before_norm(features: int, dtype) -> nn.Dense:
    """A dense layer whose output goes straight into batch normalisation, without a bias:
    the normalisation subtracts each column's mean over the batch, so a bias would
    change no output and its gradient would be zero (in a GPU step, one reduction over
    the layer's rows for nothing)."""
    return nn.Dense(features, use_bias=False, dtype=dtype)


class GINMLP(nn.Module):
    """GIN's update: Dense(2H), batch norm, ReLU, Dense(H). Its output goes into the
    layer's batch norm (`GraphGNN`), so neither dense layer has a bias."""

    hidden: int
    dtype: Any = jnp.float32

    @nn.compact
    def __call__(self, h, mask, *, train: bool):
        h = dense_before_norm(2 * self.hidden, self.dtype)(h)
        h = nn.relu(MaskedBatchNorm(self.dtype)(h, mask, train=train))
        return dense_before_norm(self.hidden, self.dtype)(h)


class GraphConv(nn.Module):
    """One message-passing layer: "gin" (sum of neighbours), "gine" (sum of
    ReLU(neighbour + edge embedding)) or "gcn" (OGB's: symmetric-normalised, edge
    embeddings added when the graphs have edge features)."""

    kind: str
    hidden: int
    edge_vocab: tuple[int, ...] = ()
    dtype: Any = jnp.float32

    @nn.compact
    def __call__(self, h, graphs: Graphs, *, train: bool):
        edges = None
        if self.kind == "gine" or (self.kind == "gcn" and graphs.edges is not None):
            if graphs.edges is None:
                raise ValueError(f"{self.kind} reads edge features; these graphs have none")
            edges = encoder(self.edge_vocab, h.shape[-1] if self.kind != "gcn" else
                            self.hidden, self.dtype, "edge_encoder")(graphs.edges)
        if self.kind == "gcn":
            return self._gcn(h, graphs, edges, train=train)
        h_s = nodes_to_edges(h, graphs.outgoing)
        msg = h_s if edges is None else nn.relu(h_s + edges)
        agg = edges_to_nodes(msg, graphs.incoming, h.shape[0])
        eps = self.param("eps", nn.initializers.zeros, (), jnp.float32)
        return GINMLP(self.hidden, self.dtype)((1 + eps) * h + agg, graphs.node_mask,
                                               train=train)

    def _gcn(self, h, graphs: Graphs, edges, *, train: bool):
        del train
        s, r, n = graphs.senders, graphs.receivers, h.shape[0]
        x = nn.Dense(self.hidden, dtype=self.dtype)(h)
        ones = graphs.edge_mask.astype(x.dtype)[:, None]
        deg = edges_to_nodes(ones, graphs.incoming, n)[:, 0] + 1
        norm = jax.lax.rsqrt(deg[s]) * jax.lax.rsqrt(deg[r])
        x_s = nodes_to_edges(x, graphs.outgoing)
        msg = norm[:, None] * (x_s if edges is None else nn.relu(x_s + edges))
        root = self.param("root", nn.initializers.zeros, (1, self.hidden), jnp.float32)
        self_term = x if edges is None else nn.relu(x + root.astype(x.dtype))
        return edges_to_nodes(msg, graphs.incoming, n) + self_term / deg[:, None]


class GraphGNN(nn.Module):
    """A graph-level GNN (module docstring): encoder, `num_layers` convolutions of
    `hidden` units, optional virtual node, readout, a linear head of `out_dim`."""

    conv: str
    hidden: int
    num_layers: int
    out_dim: int
    dropout: float = 0.5
    readout: str = "mean"
    virtual_node: bool = False
    node_vocab: tuple[int, ...] = ()
    edge_vocab: tuple[int, ...] = ()
    dtype: Any = jnp.float32

    @nn.compact
    def __call__(self, graphs: Graphs, *, train: bool):
        h = encoder(self.node_vocab, self.hidden, self.dtype, "node_encoder")(graphs.nodes)
        drop = self._dropout(train)
        vn = None
        if self.virtual_node:
            vn0 = self.param("virtual_node", nn.initializers.zeros, (1, self.hidden))
            vn = jnp.broadcast_to(vn0.astype(h.dtype), (graphs.num_graphs, self.hidden))
        for layer in range(self.num_layers):
            last = layer == self.num_layers - 1
            if vn is not None:
                h = h + broadcast(vn, graphs)
            h_in = h
            h = GraphConv(self.conv, self.hidden, self.edge_vocab, self.dtype)(
                h, graphs, train=train)
            h = MaskedBatchNorm(self.dtype)(h, graphs.node_mask, train=train)
            h = drop(h if last else nn.relu(h), 2 * layer)
            if vn is not None and not last:
                vn = drop(self._update_virtual(pool(h_in, graphs, "sum") + vn, graphs, train),
                          2 * layer + 1)
        return nn.Dense(self.out_dim, dtype=self.dtype, name="head")(
            self._readout(h, graphs, train))

    def _dropout(self, train: bool):
        """(x, site) -> x after dropout (identity unless training with a rate). Every
        site's mask comes from one seed per call, drawn from the "dropout" rng once and
        mixed with the site's number. A key per site (Flax's `make_rng` in each
        Dropout) cost 18 tiny kernels of GINE-virtual 5 x 300's ~385 a step on a GPU."""
        if not train or self.dropout == 0.0:
            return lambda x, site: x
        seed = dropout_seed(self.make_rng("dropout"))
        return lambda x, site: hash_dropout(
            x, self.dropout, counter_hash.hash2(seed, jnp.uint32(site)))

    def _update_virtual(self, pooled, graphs: Graphs, train: bool):
        mask = graphs.graph_mask
        v = dense_before_norm(2 * self.hidden, self.dtype)(pooled)
        v = nn.relu(MaskedBatchNorm(self.dtype)(v, mask, train=train))
        v = dense_before_norm(self.hidden, self.dtype)(v)
        return nn.relu(MaskedBatchNorm(self.dtype)(v, mask, train=train))

    def _readout(self, h, graphs: Graphs, train: bool):
        if self.readout != "attention":
            return pool(h, graphs, self.readout)
        gate = dense_before_norm(2 * self.hidden, self.dtype)(h)
        gate = nn.relu(MaskedBatchNorm(self.dtype)(gate, graphs.node_mask, train=train))
        gate = nn.Dense(1, dtype=self.dtype)(gate).astype(jnp.float32)
        top = pool(gate, graphs, "max")
        w = jnp.exp(gate - broadcast(top, graphs))
        w = w / broadcast(pool(w, graphs, "sum"), graphs)
        return pool(w.astype(h.dtype) * h, graphs, "sum")


class OnGraphs(nn.Module):
    """Runs a graph-level model (`model(graphs, *, train)`) in the step's calling
    convention `(x, views, *, train, graph, edges)`: `x` float[Nc, d] are the gathered
    node rows, `graph` the packed batch's structure (`sampling.graph_batch.GraphBatch`),
    `edges` its gathered edge rows or None; `views` is empty."""

    model: nn.Module

    def __call__(self, x, views, *, train: bool, graph, edges=None):
        del views
        graphs = Graphs(x, edges, graph.senders, graph.receivers, graph.n_node,
                        graph.n_edge, None, graph.node_graph, graph.node_mask,
                        graph.edge_mask, graph.graph_mask, graph.in_slots,
                        graph.out_slots)
        return self.model(graphs, train=train)


def make_graph_model(name: str, *, hidden: int, num_layers: int, out_dim: int,
                     dropout: float = 0.5, readout: str = "mean", node_vocab=(),
                     edge_vocab=(), dtype: Any = jnp.float32) -> GraphGNN:
    """A built-in graph-level model by name: gin, gine, gcn, and each with "-virtual".

    Args:
      name: the model; "-virtual" adds a virtual node joined to every node of a graph.
      hidden: the width of the node encoder and of every convolution.
      num_layers: the convolutions, each followed by batch norm (and ReLU, but the last).
      out_dim: the head's output width (a collection's `output_dim`).
      dropout: the rate after every convolution and virtual-node update.
      readout: how a graph's node rows pool into its row: sum, mean, max or attention.
      node_vocab, edge_vocab: the vocabulary size of each column of integer node (edge)
        features, embedded per column and summed; () reads float features through a
        dense projection (edges: gine only).
      dtype: the computation dtype (parameters float32).
    """
    if name not in GRAPH_MODELS:
        node = " (a node model, the default of node tasks)" if name == "sage" else ""
        raise ValueError(f"unknown graph model {name!r}{node}; choose one of "
                         f"{', '.join(GRAPH_MODELS)} (--model)")
    if readout not in READOUTS:
        raise ValueError(f"readout must be one of {', '.join(READOUTS)}, got {readout!r}")
    conv, _, virtual = name.partition("-")
    return GraphGNN(conv, hidden, num_layers, out_dim, dropout, readout, bool(virtual),
                    tuple(node_vocab), tuple(edge_vocab), dtype)
