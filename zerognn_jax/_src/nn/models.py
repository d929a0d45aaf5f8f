"""GNN models in Flax Linen: GraphSAGE, GCN, GAT, GINE and an MLP baseline.

The interface every model (built-in or a user's) follows:

    model.apply(variables, x, views, train=..., rngs={"dropout": key}) -> logits

where `x` is float[S_L, d] (features of the outermost level) and `views` holds one edge
view per layer, innermost last (`views[i]` feeds layer i; its destinations are the
first `view.num_dst` rows of its sources). A model that also defines
`layer(self, i, h_src, h_dst, view, *, train)` and `num_layers` gets exact layer-wise
inference over the whole graph; otherwise evaluation samples.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from zerognn_jax._src.nn.views import gcn_weights, mean_over_edges, mean_weights
from zerognn_jax._src.ops.batch_norm import masked_batch_norm
from zerognn_jax._src.pallas import counter_hash

MODELS = ("sage", "sage-max", "sage-sum", "gcn", "gat", "gine", "mlp")
# The models whose layers read the edge features of their views.
EDGE_MODELS = ("gat", "gine")
# The models whose layers add each node's own term to its neighbours' (as PyG's GCNConv
# and GATConv add self-loops): a graph's own self-loops would count that term twice.
OWN_TERM_MODELS = ("gcn", "gat")
NORMS = ("none", "layer", "batch")
# How the dense layers of SAGE and the MLP start: "flax" (Flax's `Dense`: LeCun-normal
# weights over the layer's whole input, zero bias) or "torch" (as `torch.nn.Linear`, and
# PyG's `SAGEConv`, whose self and neighbour halves are two such layers: weights and bias
# uniform in +-1/sqrt(fan_in), fan_in counted per half).
INITS = ("flax", "torch")
# The models `init` applies to; GCN and GAT start from Glorot weights and zero biases, as
# PyG's GCNConv and GATConv do.
INIT_MODELS = ("sage", "sage-max", "sage-sum", "mlp")


def torch_uniform(fan_in: int):
    """An initializer drawing uniformly from +-1/sqrt(fan_in), as torch.nn.Linear draws
    its weights (Kaiming-uniform with a = sqrt(5)) and its bias."""
    bound = fan_in ** -0.5

    def init(key, shape, dtype=jnp.float32):
        return jax.random.uniform(key, shape, dtype, -bound, bound)
    return init


def dense(features: int, fan_in: int, init: str, dtype, name: str | None = None) -> nn.Dense:
    """A Dense layer started as `init` says (INITS); `fan_in`: its input width for
    "torch" (for SAGE, one half of its concatenated input)."""
    if init == "flax":
        return nn.Dense(features, dtype=dtype, name=name)
    return nn.Dense(features, dtype=dtype, name=name, kernel_init=torch_uniform(fan_in),
                    bias_init=torch_uniform(fan_in))


class Dropout(nn.Module):
    """Inverted dropout whose mask comes from the counter hash (one mix per element).

    Same contract as `nn.Dropout` (needs the "dropout" rng when not deterministic), but
    several times cheaper than drawing the mask from jax.random on CPU and GPU.
    """

    rate: float

    @nn.compact
    def __call__(self, x, *, deterministic: bool):
        if deterministic or self.rate == 0.0:
            return x
        return hash_dropout(x, self.rate, dropout_seed(self.make_rng("dropout")))


def dropout_seed(key: jax.Array) -> jax.Array:
    """uint32 scalar: the seed `hash_dropout` draws a mask from, given a PRNG key."""
    return counter_hash.mix32(jax.random.bits(key, dtype=jnp.uint32))


def hash_dropout(x: jax.Array, rate: float, seed: jax.Array) -> jax.Array:
    """Inverted dropout of `x` at `rate`, its mask the counter hash of each element's
    flat index under `seed` (uint32 scalar): one mix per element."""
    idx = jax.lax.iota(jnp.uint32, x.size).reshape(x.shape)
    keep = counter_hash.mix32(seed ^ (idx * jnp.uint32(0x9E3779B9))) >= jnp.uint32(
        min(int(rate * 2**32), 2**32 - 1))
    return jnp.where(keep, x / (1.0 - rate), jnp.zeros((), x.dtype))


class SAGEConv(nn.Module):
    """GraphSAGE: W [h_i ; AGG_j h_j] + b, AGG in {mean, sum, max}.

    One matmul over the concatenation equals W_self h_i + W_neigh AGG_j h_j with W
    stacked from the two; it writes the layer's output once instead of twice, and its
    gradient needs one pass less over the output (1.18x per epoch on an H100,
    docs/benchmarks.md). Where the inputs are far wider than the output and the slots
    many (Cora's 1,433 features into 16, every neighbour of a 168-degree hub), a mean or
    sum is taken of the sources' rows projected by W_neigh instead (the same sum,
    linear), so the slots read `features` columns, not the input's (`_projects_first`).
    """

    features: int
    aggregator: str = "mean"
    dtype: Any = jnp.float32
    param_init: str = "flax"

    @nn.compact
    def __call__(self, h_src, h_dst, view, *, train: bool = False):
        del train  # (the layer draws nothing at random)
        if isinstance(h_src, tuple):  # column blocks aggregated apart (`GNN`), then joined
            agg = jnp.concatenate([self.aggregate(h, view) for h in h_src], axis=-1)
            h_dst = jnp.concatenate(h_dst, axis=-1)
        elif self._projects_first(h_src, view):
            return self._projected(h_src, h_dst, view)
        else:
            agg = self.aggregate(h_src, view)
        both = jnp.concatenate([h_dst, agg.astype(h_dst.dtype)], axis=-1)
        return dense(self.features, h_dst.shape[-1], self.param_init, self.dtype, "linear")(both)

    def _projects_first(self, h_src, view) -> bool:
        """Whether aggregating the sources' rows after W_neigh reads far fewer values
        (a quarter or less) than aggregating them whole: S rows of d read once for the
        product, then `features` per slot, against d per slot (static shapes)."""
        if self.aggregator == "max" or h_src.ndim != 2:
            return False
        slots, (rows, d) = view.edge_mask.size, h_src.shape
        return slots * d > 4 * (rows * d + slots * self.features)

    def _projected(self, h_src, h_dst, view):
        """The layer as `__call__` computes it, with W_neigh applied before the
        aggregation: the same parameters (the "linear" Dense over [h_dst ; agg], of the
        destinations' and the sources' widths, which differ across a typed graph's
        relations; created by a call on no rows)."""
        d = h_dst.shape[-1]
        linear = dense(self.features, d, self.param_init, self.dtype, "linear")
        linear(jnp.zeros((0, d + h_src.shape[-1]), self.dtype))
        params = linear.variables["params"]
        kernel, bias = (params[k].astype(self.dtype) for k in ("kernel", "bias"))
        agg = self.aggregate(jnp.dot(h_src.astype(self.dtype), kernel[d:]), view)
        return jnp.dot(h_dst.astype(self.dtype), kernel[:d]) + agg.astype(self.dtype) + bias

    def aggregate(self, h_src, view):
        """AGG_j h_j over each destination's sampled neighbours, column by column."""
        if self.aggregator == "max":
            return view.max(h_src)
        w = mean_weights(view) if self.aggregator == "mean" else view.edge_mask[..., None]
        return view.weighted_sum(h_src[:, None, :], w.astype(h_src.dtype))[:, 0, :]


class GCNConv(nn.Module):
    """GCN: W sum_j h_j / sqrt((d_i+1)(d_j+1)) over neighbours and the node itself."""

    features: int
    dtype: Any = jnp.float32

    @nn.compact
    def __call__(self, h_src, h_dst, view, *, train: bool = False):
        del train  # (the layer draws nothing at random)
        dense = nn.Dense(self.features, use_bias=False, dtype=self.dtype,
                         kernel_init=nn.initializers.glorot_uniform())
        z_src, z_dst = dense(h_src), dense(h_dst)
        agg = view.weighted_sum(z_src[:, None, :], gcn_weights(view).astype(self.dtype))[:, 0, :]
        self_w = (1.0 / (view.dst_deg.astype(jnp.float32) + 1.0)).astype(self.dtype)
        bias = self.param("bias", nn.initializers.zeros, (self.features,))
        return agg + self_w[:, None] * z_dst + bias.astype(self.dtype)


class GATConv(nn.Module):
    """GAT: multi-head attention over each node's sampled neighbours and itself.

    With `edge_dim`, an edge's features enter its attention logit as PyG's
    `GATConv(edge_dim=...)` defines it: a_edge . (W_e e_ij) per head; the self term takes
    the mean of the node's edges' terms (PyG's self-loops get the mean edge feature,
    `fill_value="mean"`, and the term is linear in it).

    `attention_dropout` drops attention coefficients after the softmax, the self term's
    too, when called with `train=True` (the GAT paper's 0.6; PyG's `dropout`); it needs
    the "dropout" rng then.

    `features` is the output's width. With `concat` (the default) the heads' outputs
    are laid side by side, `features / heads` each (`heads` must divide `features`);
    without it every head computes `features` and the output is their mean, as PyG's
    `GATConv(concat=False)` gives and the GAT paper's output layer on PubMed takes.
    """

    features: int
    heads: int = 4
    negative_slope: float = 0.2
    dtype: Any = jnp.float32
    edge_dim: int | None = None
    attention_dropout: float = 0.0
    concat: bool = True

    @nn.compact
    def __call__(self, h_src, h_dst, view, *, train: bool = False):
        h, f = self.heads, self._head_width()
        dense = nn.Dense(h * f, use_bias=False, dtype=self.dtype)
        z_src, z_dst = dense(h_src).reshape(-1, h, f), dense(h_dst).reshape(-1, h, f)
        init = nn.initializers.lecun_normal()
        a_src = self.param("att_src", init, (1, h, f))
        a_dst = self.param("att_dst", init, (1, h, f))
        s_src, s_dst = jnp.sum(z_src * a_src, -1), jnp.sum(z_dst * a_dst, -1)  # [*, H]
        act = lambda v: nn.leaky_relu(v, self.negative_slope)
        logits = view.src_of_edges(s_src) + view.dst_of_edges(s_dst)
        self_logits = jnp.sum(z_dst * a_src, -1) + s_dst
        if self.edge_dim is not None:
            s_edge = self._edge_terms(view, h, f, init)
            logits, self_logits = logits + s_edge, self_logits + mean_over_edges(view, s_edge)
        logits, self_logits = act(logits), act(self_logits)
        w_edges, w_self = view.softmax(logits, self_logits)
        w_edges, w_self = w_edges.astype(self.dtype), w_self.astype(self.dtype)
        if train and self.attention_dropout > 0.0:
            drop = Dropout(self.attention_dropout)
            w_edges, w_self = (drop(w, deterministic=False) for w in (w_edges, w_self))
        out = view.weighted_sum(z_src, w_edges) + w_self[..., None] * z_dst
        bias = self.param("bias", nn.initializers.zeros, (self.features,))
        out = out.reshape(-1, h * f) if self.concat or h == 1 else jnp.mean(out, axis=1)
        return out + bias.astype(self.dtype)

    def _head_width(self) -> int:
        """Each head's features; ValueError for a head count that cannot give
        `features` (it had silently given a narrower output)."""
        if self.heads < 1 or (self.concat and self.features % self.heads):
            raise ValueError(f"GATConv needs heads >= 1 dividing features when concat "
                             f"(each head gets features / heads); got features "
                             f"{self.features}, heads {self.heads} (concat=False gives "
                             f"every head all the features and averages them)")
        return self.features // self.heads if self.concat else self.features

    def _edge_terms(self, view, h: int, f: int, init):
        """Edge-shaped [..., H]: the attention term of each edge's features."""
        e = view.edge_features()
        if e.shape[-1] != self.edge_dim:
            raise ValueError(f"GATConv has edge_dim {self.edge_dim}, and its view's edge "
                             f"features are {e.shape[-1]} wide")
        w_edge = _EdgeKernel(self.edge_dim, h * f, name="edge")()
        return edge_logits(e, w_edge, self.param("att_edge", init, (1, h, f)), self.dtype)


def edge_logits(e: jax.Array, w_edge: jax.Array, a_edge: jax.Array, dtype) -> jax.Array:
    """Edge-shaped float32[..., H]: a_edge . (W_e e) per head of the edge features e
    [..., D], W_e [D, H * F], a_edge [1, H, F]. As e . (W_e a_edge): the [D, H] fold
    replaces the [..., H * F] edge-shaped projection that would be written and read
    back."""
    d, (_, h, f) = w_edge.shape[0], a_edge.shape
    folded = jnp.sum(w_edge.reshape(d, h, f) * a_edge, -1)
    return jnp.dot(e.astype(dtype), folded.astype(dtype), preferred_element_type=jnp.float32)


class _EdgeKernel(nn.Module):
    """The [D, H * F] kernel of GAT's edge projection, held where `nn.Dense(name="edge")`
    holds it (same path, shape and initialiser)."""

    rows: int
    columns: int

    @nn.compact
    def __call__(self) -> jax.Array:
        return self.param("kernel", nn.initializers.lecun_normal(), (self.rows, self.columns))


class GINEConv(nn.Module):
    """GINE (Hu et al., 2020): MLP((1 + eps) h_i + sum_j ReLU(h_j + W_e e_ij)), the edge
    features projected to the input width; `train_eps` learns eps (PyG's `GINEConv`
    with `edge_dim`, its `nn` a two-layer MLP of `hidden` then `features` units).

    `hidden` (default `features`, as PyG's `GIN` builds every layer's MLP) is the MLP's
    inner width: an output layer of a few classes needs it wider, or its few ReLU units
    can all die and leave the logits constant (`GNN` gives its last layer the model's
    hidden width)."""

    features: int
    hidden: int | None = None
    eps: float = 0.0
    train_eps: bool = False
    dtype: Any = jnp.float32

    @nn.compact
    def __call__(self, h_src, h_dst, view, *, train: bool = False):
        del train  # (the layer draws nothing at random)
        e = nn.Dense(h_src.shape[-1], dtype=self.dtype, name="edge")(view.edge_features())
        agg = view.sum_edges(nn.relu(view.src_of_edges(h_src) + e))
        eps = (self.param("eps", nn.initializers.constant(self.eps), ()) if self.train_eps
               else self.eps)
        out = (1.0 + eps) * h_dst + agg
        out = nn.relu(nn.Dense(self.hidden or self.features, dtype=self.dtype)(out))
        return nn.Dense(self.features, dtype=self.dtype)(out)


class RowBatchNorm(nn.Module):
    """Batch normalisation over the rows where `mask` (bool[rows]) holds: the variables,
    their names and the values of Flax's `nn.BatchNorm(momentum, epsilon)` given that
    mask (checkpoints of either load in the other), differentiated in training steps by
    `ops.batch_norm.masked_batch_norm`'s two-pass gradient. A training call with no
    masked row (a device without seeds or graphs in the last step of a data-parallel
    epoch) normalises by zero statistics, where Flax's are NaN, and leaves the running
    statistics as they were. Statistics and arithmetic are float32; the output has
    `dtype` (float32 when None)."""

    momentum: float
    epsilon: float = 1e-5
    dtype: Any = None

    @nn.compact
    def __call__(self, x, mask, *, train: bool):
        features = (x.shape[-1],)
        mean = self.variable("batch_stats", "mean", jnp.zeros, features, jnp.float32)
        var = self.variable("batch_stats", "var", jnp.ones, features, jnp.float32)
        scale = self.param("scale", nn.initializers.ones, features, jnp.float32)
        bias = self.param("bias", nn.initializers.zeros, features, jnp.float32)
        out = jnp.float32 if self.dtype is None else self.dtype
        if not train:
            inv = jax.lax.rsqrt(var.value + self.epsilon) * scale
            return ((x - mean.value) * inv + bias).astype(out)
        y, batch_mean, batch_var, count = masked_batch_norm(x, mask, scale, bias,
                                                            self.epsilon)
        if not self.is_initializing():
            seen = count > 0
            mean.value = jnp.where(seen, self.momentum * mean.value
                                   + (1 - self.momentum) * batch_mean, mean.value)
            var.value = jnp.where(seen, self.momentum * var.value
                                  + (1 - self.momentum) * batch_var, var.value)
        return y.astype(out)


# Hidden layers' activations (GNN.activation): ReLU, or the GAT paper's ELU.
ACTIVATIONS = {"relu": nn.relu, "elu": nn.elu}


class GNN(nn.Module):
    """A stack of message-passing layers with ReLU (or ELU), dropout and optional norm.

    Every layer is called as `conv(h_src, h_dst, view, train=...)` (GAT drops attention
    coefficients while training; the other convs take the flag and draw nothing).

    Dropout falls where PyG's and DGL's GraphSAGE examples put it: on the hidden
    activations (after each ReLU, i.e. on the input of every layer but the first).
    The raw features are dropped only with `input_dropout` > 0 (the GCN paper's recipe).

    Attributes:
      conv: "sage", "gcn", "gat" or "gine".
      hidden: width of every hidden layer; num_layers: number of conv layers.
      num_classes: output width.
      aggregator: for SAGE: "mean", "sum" or "max". heads: GAT's hidden layers';
        output_heads: its output layer's, averaged.
      dropout: rate on the hidden activations. input_dropout: rate on the raw features.
      norm: "none", "layer" or "batch".
      edge_dim: width of the edge features GAT's attention reads (`GATConv.edge_dim`);
        None: GAT reads none. GINE always reads them.
      activation: after each hidden layer, "relu" or "elu" (ACTIVATIONS).
      attention_dropout: GAT's rate on its attention coefficients while training.
      dtype: the computation dtype (bfloat16 halves the bytes gathered and scattered);
        parameters stay float32 and the logits come back float32.
      param_init: how SAGE's layers start (INITS); the other convs keep their own.
    """

    conv: str
    hidden: int
    num_layers: int
    num_classes: int
    aggregator: str = "mean"
    heads: int = 4
    dropout: float = 0.5
    norm: str = "none"
    input_dropout: float = 0.0
    dtype: Any = jnp.float32
    edge_dim: int | None = None
    param_init: str = "flax"
    activation: str = "relu"
    attention_dropout: float = 0.0
    output_heads: int = 1

    def setup(self):
        widths = [self.hidden] * (self.num_layers - 1) + [self.num_classes]
        self.convs = [self._make_conv(w, last=i == self.num_layers - 1)
                      for i, w in enumerate(widths)]
        # batch: over the destinations that hold a node, Flax's momentum (0.99)
        norm = {"none": None, "layer": nn.LayerNorm,
                "batch": functools.partial(RowBatchNorm, 0.99)}[self.norm]
        self.norms = [norm(dtype=self.dtype) for _ in widths[:-1]] if norm else []
        self.drop_input = Dropout(self.input_dropout)
        self.drop_hidden = Dropout(self.dropout)

    def _make_conv(self, width, last):
        if self.conv == "sage":
            return SAGEConv(width, self.aggregator, dtype=self.dtype,
                            param_init=self.param_init)
        if self.conv == "gcn":
            return GCNConv(width, dtype=self.dtype)
        if self.conv == "gat":
            return GATConv(width, heads=self.output_heads if last else self.heads,
                           dtype=self.dtype, edge_dim=self.edge_dim,
                           attention_dropout=self.attention_dropout, concat=not last)
        if self.conv == "gine":
            return GINEConv(width, hidden=self.hidden, dtype=self.dtype)
        raise ValueError(f"unknown conv {self.conv!r}; choose sage, gcn, gat or gine")

    def layer(self, i, h_src, h_dst, view, *, train: bool):
        """Layer i. `h_dst=None` means the destinations are the first rows of `h_src`
        (sampled blocks); layer-wise inference passes them explicitly. A tuple `h_src`
        (`__call__` only, so its destinations are its first rows) holds column blocks of
        the input rows, which a SAGE layer aggregates apart."""
        drop = self.drop_input if i == 0 else self.drop_hidden
        if isinstance(h_src, tuple):  # never dropped (`__call__`)
            h_src = tuple(h.astype(self.dtype) for h in h_src)
            h_dst = tuple(h[: view.num_dst] for h in h_src)
        else:
            h_src = drop(h_src.astype(self.dtype), deterministic=not train)
            if h_dst is None:
                h_dst = h_src[: view.num_dst]
            else:
                h_dst = drop(h_dst.astype(self.dtype), deterministic=not train)
        out = self.convs[i](h_src, h_dst, view, train=train)
        if i == self.num_layers - 1:
            return out.astype(jnp.float32)
        if self.norm == "batch":
            out = self.norms[i](out, view.dst_valid, train=train)
        elif self.norm == "layer":
            out = self.norms[i](out)
        return ACTIVATIONS[self.activation](out)

    def __call__(self, x, views: Sequence, *, train: bool):
        """`x`: the outermost level's input rows, float[S, d]; or a pair of column blocks
        (features float[S, d], learnable embedding rows float[S, e]), whose
        concatenation they stand for. A SAGE layer's input, not dropped
        (`input_dropout` 0 or not training), aggregates the two apart: each column is the
        same sum (bit-equal in float32; bfloat16 may round a few values apart), and the
        backward scatters the gradient of the embedding's `e` columns only, not of all
        d + e (the features take none). One view per layer: other counts are refused
        (fewer gave a hidden layer's activations as the output)."""
        if len(views) != self.num_layers:
            raise ValueError(f"the model has {self.num_layers} "
                             f"layer{'s' if self.num_layers != 1 else ''} and was given "
                             f"{len(views)} views (sampled hops): sample one hop per "
                             f"layer")
        h = x
        if isinstance(x, tuple) and (self.conv != "sage" or not views
                                     or (train and self.input_dropout > 0.0)):
            h = jnp.concatenate(x, axis=-1)
        for i, view in enumerate(views):
            h = self.layer(i, h, None, view, train=train)
        return h


class MLP(nn.Module):
    """Feature-only baseline: ignores the graph (uses only the seeds' own rows).

    Dropout as in `GNN`: `dropout` on hidden activations, `input_dropout` on features.
    `param_init`: how the dense layers start (INITS).
    """

    hidden: int
    num_layers: int
    num_classes: int
    dropout: float = 0.5
    input_dropout: float = 0.0
    dtype: Any = jnp.float32
    param_init: str = "flax"

    @nn.compact
    def __call__(self, x, views: Sequence, *, train: bool):
        h = (x[: views[-1].num_dst] if views else x).astype(self.dtype)
        for i in range(self.num_layers):
            rate = self.input_dropout if i == 0 else self.dropout
            h = Dropout(rate)(h, deterministic=not train)
            h = dense(self.hidden if i < self.num_layers - 1 else self.num_classes,
                      h.shape[-1], self.param_init, self.dtype)(h)
            if i < self.num_layers - 1:
                h = nn.relu(h)
        return h.astype(jnp.float32)


def make_model(name: str, *, hidden: int, num_layers: int, num_classes: int,
               dropout: float = 0.5, input_dropout: float = 0.0, norm: str = "none",
               heads: int = 4, dtype: Any = jnp.float32, edge_dim: int | None = None,
               init: str = "flax", activation: str = "relu",
               attention_dropout: float = 0.0, output_heads: int = 1) -> nn.Module:
    """Builds a model by name: sage (mean), sage-max, sage-sum, gcn, gat, gine, mlp.

    `hidden` (the width of every hidden layer), `num_layers`, `num_classes` (the output
    width), `dropout` (on the hidden activations), `input_dropout` (on the raw
    features), `norm` ("none", "layer" or "batch", after each hidden layer), `heads`
    (gat: must divide `hidden` where there are hidden layers) and `dtype` (the
    computation dtype; parameters float32) are `GNN`'s attributes (`MLP`'s for mlp).
    `edge_dim` is the width of the edge features the model reads (gat: in its
    attention; gine needs them; the others read none and refuse it). `init`: how the
    dense layers of SAGE and the MLP start (INITS). `activation` (ACTIVATIONS) follows
    each hidden layer of the message-passing models; `attention_dropout` drops gat's
    attention coefficients while training; `output_heads` are gat's output layer's heads,
    each computing every output, averaged (the other models, as with `heads`, read
    neither)."""
    if name not in MODELS:
        raise ValueError(f"unknown model {name!r}; choose one of {', '.join(MODELS)}")
    check_init(init, name)
    if norm not in NORMS:
        raise ValueError(f"unknown norm {norm!r}; choose one of {', '.join(NORMS)}")
    if name == "gat" and (heads < 1 or (num_layers > 1 and hidden % heads)):
        raise ValueError(f"GAT needs heads >= 1 dividing hidden (each head gets hidden / heads "
                         f"features); got hidden {hidden}, heads {heads}")
    if output_heads < 1:
        raise ValueError(f"output_heads must be at least 1, got {output_heads}")
    if edge_dim is not None and name not in EDGE_MODELS:
        raise ValueError(f"model {name!r} reads no edge features (edge_dim {edge_dim}); "
                         f"those that do: {', '.join(EDGE_MODELS)}")
    if name == "gine" and edge_dim is None:
        raise ValueError("model 'gine' reads edge features: give edge_dim, the width of "
                         "the graph's edge-feature table")
    if activation not in ACTIVATIONS:
        raise ValueError(f"unknown activation {activation!r}; choose one of "
                         f"{', '.join(ACTIVATIONS)}")
    if name == "mlp":
        return MLP(hidden, num_layers, num_classes, dropout, input_dropout, dtype=dtype,
                   param_init=init)
    conv, _, agg = name.partition("-")
    return GNN(conv, hidden, num_layers, num_classes, aggregator=agg or "mean",
               heads=heads, dropout=dropout, norm=norm, input_dropout=input_dropout,
               dtype=dtype, edge_dim=edge_dim, param_init=init, activation=activation,
               attention_dropout=attention_dropout, output_heads=output_heads)


def check_init(init: str, model: str | None) -> None:
    """Raises ValueError unless `init` is one of INITS and, other than "flax", `model`
    is one it applies to (INIT_MODELS; None, a model not named yet, is not checked)."""
    if init not in INITS:
        raise ValueError(f"init must be one of {', '.join(INITS)}, got {init!r}")
    if init != "flax" and model is not None and model not in INIT_MODELS:
        raise ValueError(f"init={init!r} (--init) applies to the models {', '.join(INIT_MODELS)}, "
                         f"not {model!r}, which starts as its own layers say (GCN and "
                         f"GAT from Glorot weights and zero biases, as PyG's do)")


def count_params(params) -> int:
    return sum(int(x.size) for x in jax.tree_util.tree_leaves(params))
