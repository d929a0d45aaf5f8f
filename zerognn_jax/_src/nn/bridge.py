"""A user's model as the engine sees it: Flax Linen as is, Flax NNX through the bridge.

The engine calls a Linen module's pure `apply` (`nn/models.py` gives the interface).
An NNX module (`flax.nnx.Module` instance) is wrapped by `as_linen` with
`flax.nnx.bridge.ToLinen`, which keeps the module's state as Linen variables: its
`nnx.Param`s become the "params" collection, its `nnx.BatchStat`s "batch_stats". The
initial values are the instance's own (its `rngs=` at construction decide them). At
every call the wrapper:

- rebuilds the module from its graph definition and the current variables;
- reseeds every RNG stream of the module (`nnx.Rngs` it was built with) from the step's
  dropout key, so dropout differs per step and is reproducible from the run's seed;
- puts `nnx.Dropout` and `nnx.BatchNorm` into training or evaluation mode (their
  `deterministic` / `use_running_average` attributes) from `train`, and passes `train`
  on: `module(x, views, train=train)` (a graph task's `module(graphs, train=train)`).

An NNX module that defines `layer(i, h_src, h_dst, view, *, train)` and `num_layers`
(the per-layer protocol, nn/layerwise.py), or a typed model's `layer(i, h, layer, *,
train)` (nn/hetero.py), gets exact layer-wise inference: the wrapper forwards both; the
wrapper of a module without `layer` has none.

`flax.nnx` (about 0.2 s to import) is imported by the functions that meet an NNX
module, so a run with a Linen model never loads it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import flax.linen as nn
import jax

from zerognn_jax._src.nn.layerwise import layer_count

if TYPE_CHECKING:
    from flax import nnx


def model_name(model) -> str:
    """The class name of a model (of the NNX module for a wrapped one)."""
    return getattr(model, "nnx_name", None) or type(model).__qualname__


def _reseed(module, rngs: nnx.Rngs) -> None:
    """Gives every RNG stream of `module` a key drawn from `rngs`' dropout stream (when
    the caller supplied one, i.e. in training)."""
    from flax import nnx

    if "dropout" not in rngs:
        return
    tags = sorted({node.tag for _, node in nnx.iter_graph(module)
                   if isinstance(node, nnx.RngStream)})
    if tags:
        base = rngs["dropout"]()
        nnx.reseed(module, **{t: jax.random.fold_in(base, i) for i, t in enumerate(tags)})


def _set_mode(module, train: bool) -> None:
    module.set_attributes(deterministic=not train, use_running_average=not train,
                          raise_if_not_found=False)


def _in_mode(module, *args, train: bool, **inputs):
    _set_mode(module, train)
    return module(*args, train=train, **inputs)


def _layer_in_mode(module, i, *inputs, train: bool):
    _set_mode(module, train)
    return module.layer(i, *inputs, train=train)


class NNXModel(nn.Module):
    """A Linen module running an NNX module (made by `as_linen`); its variables sit
    under the "nnx" scope ({"params": {"nnx": ...}}).

    Attributes:
      factory: (*, rngs) -> a fresh copy of the NNX module (graph definition + state).
      nnx_name: the NNX module's class name (summaries, checkpoint identity).
      num_layers: the NNX module's `num_layers` when it offers the per-layer protocol
        (nn/layerwise.py), else None.
    """

    factory: Any
    nnx_name: str
    num_layers: int | None = None

    def setup(self):
        from flax.nnx import bridge

        self.nnx = bridge.ToLinen(self.factory, metadata_fn=None)  # the "nnx" scope

    def __call__(self, *args, train: bool, **inputs):
        """The NNX module called as the task calls a model: `(x, views)` for node and
        link tasks, `(graphs)` for a graph task."""
        return self.nnx(*args, train=train, nnx_method=_in_mode, **inputs)


class NNXLayerModel(NNXModel):
    """`NNXModel` of an NNX module that has a `layer` method, which it forwards: a
    homogeneous model's `layer(i, h_src, h_dst, view)` (nn/layerwise.py) or a typed
    one's `layer(i, h, layer)` (nn/hetero.py). (A wrapper of a module without one has
    none either: exact inference asks whether a model has it.)"""

    def layer(self, i, *inputs, train: bool):
        """The NNX module's layer `i` (its `layer` method)."""
        return self.nnx(i, *inputs, train=train, nnx_method=_layer_in_mode)


def as_linen(model) -> nn.Module:
    """`model` as a Linen module with the engine's interface: a Linen module unchanged,
    an NNX module instance wrapped (module docstring).

    Raises:
      TypeError: `model` is a module class, named (pass an instance), or neither kind.
    """
    if isinstance(model, nn.Module):
        return model
    from flax import nnx

    if isinstance(model, nnx.Module):
        graphdef, state = nnx.split(model)

        def factory(*, rngs: nnx.Rngs):
            # New variables at the caller's trace level: the captured ones may not be
            # mutated (reseeded, updated) inside a transformation.
            module = nnx.merge(graphdef, jax.tree_util.tree_map(lambda a: a, state))
            _reseed(module, rngs)
            return module

        wrapper = NNXLayerModel if callable(getattr(model, "layer", None)) else NNXModel
        return wrapper(factory, type(model).__qualname__, layer_count(model))
    if isinstance(model, type) and issubclass(model, nnx.Module):
        raise TypeError(f"model is the NNX class {model.__qualname__}; pass an instance, "
                        f"e.g. {model.__qualname__}(..., rngs=nnx.Rngs(0))")
    if isinstance(model, type) and issubclass(model, nn.Module):  # was "got type"
        raise TypeError(f"model is the Linen class {model.__qualname__}, not an instance; "
                        f"pass an instance, e.g. {model.__qualname__}(...)")
    given = (f"the class {model.__qualname__}" if isinstance(model, type)
             else type(model).__qualname__)
    raise TypeError(f"model must be a flax.linen.Module or a flax.nnx.Module instance, got "
                    f"{given}")
