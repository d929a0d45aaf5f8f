"""Link heads: decoders that score a pair of node embeddings, and the encoder-decoder
models link prediction trains (`LinkModel`; `OnTypesLink` on a typed graph).

A decoder is a Flax module `decoder(h_src[P, d], h_dst[P, d], *, train) -> float32[P]`.
"""

from __future__ import annotations

import flax.linen as nn
import jax.numpy as jnp

from zerognn_jax._src.nn.hetero import OnTypes, typed_layers
from zerognn_jax._src.nn.layerwise import layer_count
from zerognn_jax._src.nn.models import dense

DECODERS = ("scaled-dot", "dot", "mlp")


class DotDecoder(nn.Module):
    """score(u, v) = <h_u, h_v>, or with `scaled` <h_u, h_v> / sqrt(d) (d: the
    embeddings' width). Both rank pairs alike; scaled, the scores of embeddings whose
    entries have unit variance have unit variance too, where the plain product's grow
    with sqrt(d): from LeCun-normal layers (Flax's start) over standardised features a
    256-wide encoder's first scores are in the tens, the loss starts near 14 and
    training stalls at log 2 (docs/link_prediction.md, "The scaled dot decoder")."""

    scaled: bool = False

    @nn.compact
    def __call__(self, h_src, h_dst, *, train: bool = False):
        del train
        score = jnp.sum(h_src.astype(jnp.float32) * h_dst.astype(jnp.float32), axis=-1)
        return score * (h_src.shape[-1] ** -0.5) if self.scaled else score


class MLPDecoder(nn.Module):
    """score(u, v) = MLP(h_u * h_v) (OGB's link predictor): `layers` Dense layers of
    width `hidden`, ReLU and dropout between them, one output unit; `param_init`: how
    they start (models.INITS)."""

    hidden: int
    layers: int = 2
    dropout: float = 0.0
    param_init: str = "flax"

    @nn.compact
    def __call__(self, h_src, h_dst, *, train: bool = False):
        h = h_src.astype(jnp.float32) * h_dst.astype(jnp.float32)
        for _ in range(self.layers - 1):
            h = nn.relu(dense(self.hidden, h.shape[-1], self.param_init, jnp.float32)(h))
            h = nn.Dropout(self.dropout, deterministic=not train)(h)
        return dense(1, h.shape[-1], self.param_init, jnp.float32)(h)[..., 0]


def make_decoder(name: str, hidden: int, dropout: float = 0.0,
                 init: str = "flax") -> nn.Module:
    """The decoder called `name`: "scaled-dot", "dot" or "mlp" (`MLPDecoder`: `hidden`
    units a layer, `dropout` between its layers, which start as `init` says); the dot
    products read neither."""
    if name in ("scaled-dot", "dot"):
        return DotDecoder(scaled=name == "scaled-dot")
    if name == "mlp":
        return MLPDecoder(hidden, dropout=dropout, param_init=init)
    raise ValueError(f"decoder must be one of {', '.join(DECODERS)}, got {name!r}")


class LinkModel(nn.Module):
    """An encoder and a decoder: pair scores for link tasks, embeddings otherwise.

    `model(x, views, train=..., pairs=int32[P, 2])` gives float32[P] scores of pairs of
    level-0 positions; without `pairs` it gives the encoder's level-0 embeddings (what
    sampled evaluation reads). `layer` and `num_layers` are the encoder's (None when the
    encoder has no per-layer form, nn/layerwise.py), so exact layer-wise inference
    yields every node's embedding; `score` decodes given embeddings.
    """

    encoder: nn.Module
    decoder: nn.Module

    def __call__(self, x, views, *, train: bool, pairs=None):
        h = self.encoder(x, views, train=train)
        _check_embeddings(h, views[-1].num_dst if views else len(x))
        if pairs is None:
            return h
        return self.decoder(h[pairs[:, 0]], h[pairs[:, 1]], train=train)

    def score(self, h_src, h_dst):
        return self.decoder(h_src, h_dst, train=False)

    def layer(self, i, h_src, h_dst, view, *, train: bool):
        return self.encoder.layer(i, h_src, h_dst, view, train=train)

    @property
    def num_layers(self) -> int | None:
        """The encoder's layer count, None when it has no per-layer form."""
        return layer_count(self.encoder)

    @property
    def hidden(self) -> int:
        return getattr(self.encoder, "hidden", 0)


def _check_embeddings(h, rows: int) -> None:
    """ValueError unless the encoder's output `h` is one 2-D float array of `rows` rows
    (level 0's nodes): pairs are looked up in it by position, so an encoder giving every
    sampled row trained on the wrong rows, and its evaluation failed after training."""
    shape = getattr(h, "shape", None)
    if shape is None or len(shape) != 2 or shape[0] != rows:
        got = (f"a {type(h).__name__}" if shape is None
               else f"{getattr(h, 'dtype', '')}{list(shape)}")
        raise ValueError(f"the encoder gives {got}; a link task needs one embedding row "
                         f"per level-0 node (the innermost view's destinations): "
                         f"[{rows}, d]")


class OnTypesLink(OnTypes):
    """A relational encoder (`HeteroGNN`'s `encode`) and a decoder: pair scores of a
    typed graph's link task, whose pairs join a node of one type to a node of another
    (or the same) type.

    `model(x, views, train=..., typed=..., pairs=int32[P, 2])` gives float32[P] scores
    of pairs (a position among level 0's `ends[0]` rows, one among its `ends[1]` rows);
    without `pairs`, a level 0 of one type gives its rows' embeddings (sampled
    inference of one end's nodes). `layer` is the encoder's, so exact layer-wise
    inference yields every node's embedding, and `score` decodes given embeddings.

    Attributes:
      decoder: scores a pair of embeddings (`make_decoder`).
      ends: (source type, destination type) of the predicted relation.
    """

    decoder: nn.Module | None = None
    ends: tuple = ()

    def __call__(self, x, views, *, train: bool, typed, edges: tuple = (), pairs=None):
        del views
        h = self.model.encode(self.typed_inputs(x, typed.nodes[-1]),
                              typed_layers(typed, self.kernels, edges), train=train)
        if pairs is None:
            if len(h) != 1:
                raise ValueError(f"without pairs, level 0 must hold one type (its nodes' "
                                 f"embeddings come back); it holds {', '.join(h)}")
            return next(iter(h.values()))
        src, dst = self.ends
        return self.decoder(h[src][pairs[:, 0]], h[dst][pairs[:, 1]], train=train)

    def score(self, h_src, h_dst):
        return self.decoder(h_src, h_dst, train=False)
