"""The per-layer protocol of exact inference, and the check of whether a model offers it.

Exact layer-wise inference (training/evaluate.py's `layerwise_logits`) computes layer
i for every node of the graph before layer i + 1, over full neighbourhoods. It needs the
model to say how many layers it has and how to run one of them on any rows:

    num_layers: int
    def layer(self, i, h_src, h_dst, view, *, train) -> float[R, d_out]

`h_src` holds the input rows of layer i for every source of `view` (float[S, d_in]),
`h_dst` those of the R destinations (float[R, d_in]; None in a sampled forward, where
they are the first `view.num_dst` rows of `h_src`), and `view` is an `EdgeView` (a chunk
of the graph's edges) or an `EllView` (a sampled block): both offer the same methods,
and `view.node_ids` / `view.dst_ids` name the sources' and destinations' nodes.
A Linen model adds the method and a `num_layers` field or property (with
`@nn.compact` on `layer`, its submodules named by `i`: unnamed, every call would reuse
the same ones); an NNX module defines the same two names (nn/bridge.py forwards them);
`__call__` can then be the loop
`for i, view in enumerate(views): h = self.layer(i, h, None, view, train=train)`.

A model without them is still evaluated exactly where its full neighbourhoods fit
(training/exact.py), and on sampled neighbourhoods otherwise.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

import flax
import jax


@runtime_checkable
class LayerWise(Protocol):
    """A model with the per-layer form exact inference runs (module docstring)."""

    num_layers: int

    def layer(self, i: int, h_src: jax.Array, h_dst: jax.Array | None, view, *,
              train: bool) -> jax.Array:
        """Layer `i`'s output rows for the destinations of `view`."""
        ...


def layer_count(model) -> int | None:
    """`model.num_layers` when the model offers the per-layer protocol (a callable
    `layer` and a positive integer `num_layers`), else None.

    A Linen property that raises AttributeError reaches the caller as Flax's
    `DescriptorAttributeError`, which `hasattr` does not catch: both count as absent.
    """
    try:
        layer, count = getattr(model, "layer", None), getattr(model, "num_layers", None)
    except (AttributeError, flax.errors.FlaxError):
        return None
    if not callable(layer) or isinstance(count, bool) or not isinstance(count, int):
        return None
    return count if count >= 1 else None


def supports_layerwise(model) -> bool:
    """Whether `model` offers the per-layer protocol (`layer_count`)."""
    return layer_count(model) is not None
