"""A trained model as a serialized `jax.export` artifact: sampled inference for serving.

`export_model` stages out one batch of sampled inference (sample the seeds' neighbourhood,
gather features, run the model) with the model's variables baked in, every op in its
XLA form. The graph and the feature table stay arguments: they are the data a server
holds, often too large to serialize. Every argument is a plain array, so the artifact
needs no pytree registrations to load: `jax.export.deserialize(blob).call(...)` in any
process with JAX (and `flatbuffers`, which `serialize` needs) runs it, no zerognn-jax
required. A typed graph's node model exports the same way, each relation's CSR an
argument of its own (`export_model`).
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

import jax
import jax.numpy as jnp

from zerognn_jax._src.data.graph import CSRGraph
from zerognn_jax._src.data.hetero import HeteroGraph, relation_name
from zerognn_jax._src.ops.registry import XLA
from zerognn_jax._src.sampling.envelope import conservative
from zerognn_jax._src.sampling.typed_envelope import typed_conservative, typed_tree_sizes
from zerognn_jax._src.sampling.typed_minibatch import sample_typed
from zerognn_jax._src.training.program import DeviceData, StepProgram
from zerognn_jax._src.training.tasks.base import BatchedTask
from zerognn_jax._src.training.tasks.typed_node import TypedNodeTask

PLATFORMS = ("cpu", "cuda", "rocm", "tpu")  # jax.export's names for its lowering targets


class ExportedModel(NamedTuple):
    """What `export_model` returns.

    Attributes:
      exported: the `jax.export.Exported`; `.call(*arguments)` gives
        float32[batch_size, outputs]; `.serialize()` gives bytes.
      batch_size: seeds per call (pad with any id and `valid=False`).
      arguments: the argument names, in order: (indptr, indices, features, seeds, valid,
        key), with "edge_features" (float[E, D], the graph's table) after "features"
        for a model that reads edge features; a typed graph's are per relation
        (`export_model`).
    """

    exported: jax.export.Exported
    batch_size: int
    arguments: tuple[str, ...] = ("indptr", "indices", "features", "seeds", "valid", "key")

    def serialize(self) -> bytearray:
        return self.exported.serialize()

    def data_arguments(self, data: DeviceData) -> tuple:
        """The arrays of `data` (a run's `DeviceData`, or one of the same shapes) that
        come before the seeds, in `arguments`' order: `call(*art.data_arguments(data),
        seeds, valid, key)`."""
        graph = data.graph
        relations = ({relation_name(r): r for r in graph.relations}
                     if isinstance(graph, HeteroGraph) else {})
        out = []
        for name in self.arguments[:-3]:
            owner, _, part = name.rpartition(".")
            if part == "features":
                out.append(data.features)
            else:
                out.append(getattr(graph[relations[owner]] if owner else graph, part))
        return tuple(out)


def export_model(program: StepProgram, variables, data: DeviceData, *, batch_size: int,
                 platforms: tuple[str, ...] | None = None) -> ExportedModel:
    """Exports sampled inference of `batch_size` seeds with `program`'s sampler and model.

    Args:
      program, variables, data: as `TrainResult.program`, `.variables`, `.data` (or
        `restore`'s); `data` gives the shapes and dtypes of the graph and features the
        artifact will be called with (it is not stored).
      batch_size: seeds per call; the envelope is the conservative one for that batch,
        so no call can overflow.
      platforms: lowering targets, e.g. ("cpu", "cuda"); default: this backend's.

    A typed graph's program (`TypedNodeTask`) takes, per relation in the graph's order,
    "<src>__<name>__<dst>.indptr" and ".indices" (and ".edge_features" where its views
    read that relation's table), then the stacked "features" table, then the seeds (ids
    of the target type), and gives their logits; learnable rows are baked in with the
    variables.

    Raises:
      ValueError: a bad batch size, an unknown platform, a weighted sampler (it reads a
        per-edge table the artifact does not take), or a graph collection's task (not
        served yet).
    """
    if not (isinstance(batch_size, int) and batch_size >= 1):
        raise ValueError(f"batch_size must be a positive int, got {batch_size!r}")
    unknown = [p for p in platforms or () if p not in PLATFORMS]
    if unknown:  # jax.export lowers for a name it does not know without a word
        raise ValueError(f"platforms must be among {', '.join(PLATFORMS)}; got "
                         f"{', '.join(map(repr, unknown))}")
    typed = isinstance(program.task, TypedNodeTask)
    if isinstance(program.task, BatchedTask) and not typed:
        raise ValueError(f"export_model serves node and link models, and typed graphs' "
                         f"node models; this program's task ({type(program.task).__name__}) "
                         f"batches graph collections, which are not served yet")
    if program.sampler.method == "weighted":
        raise ValueError("export_model serves the uniform and LABOR samplers; this "
                         "program samples by edge weight")
    # The XLA twin of every op: no Triton custom calls, whose serialized form jax.export
    # does not promise to keep loadable, and one artifact lowers for CPU and GPU alike.
    program = dataclasses.replace(program.with_mesh(None), kernels=XLA)
    if typed:
        return _export_typed(program, variables, data, batch_size, platforms)
    edges = program.sampler.edge_ids  # the views read the sampled edges' features
    caps = conservative(batch_size, program.sampler.slots, data.graph.num_nodes).capacities

    def infer(indptr, indices, features, *rest):
        edge_features, (seeds, valid, key) = (rest[0], rest[1:]) if edges else (None, rest)
        graph = CSRGraph(indptr, indices, edge_features=edge_features)
        device = DeviceData(graph, features, None)  # inference reads no targets
        logits, _, _ = program.forward(variables, device, seeds, valid, key, caps,
                                       train=False)
        return logits.astype(jnp.float32)

    tables = (data.graph.indptr, data.graph.indices, data.features)
    if edges:
        tables += (data.graph.edge_features,)
    shapes = [jax.ShapeDtypeStruct(a.shape, a.dtype) for a in tables]
    names = ("indptr", "indices", "features") + (("edge_features",) if edges else ())
    return _exported(infer, shapes, names, batch_size, platforms)


def _exported(infer, shapes: list, names: tuple, batch_size: int, platforms):
    """`infer` exported for `shapes` and the seeds, valid flags and key after them."""
    shapes = shapes + [jax.ShapeDtypeStruct((batch_size,), jnp.int32),
                       jax.ShapeDtypeStruct((batch_size,), jnp.bool_),
                       jax.ShapeDtypeStruct((), jnp.uint32)]
    # Left out, jax.export lowers for this backend (its name for it: "cuda", not "gpu").
    chosen = {"platforms": tuple(platforms)} if platforms else {}
    # A layout pin (`ops.aggregate.row_major`, R-GAT's projected slots) is a custom call
    # outside jax.export's stable list; it only tells XLA's layout assignment what to do.
    pins = [jax.export.DisabledSafetyCheck.custom_call("LayoutConstraint")]
    exported = jax.export.export(jax.jit(infer), disabled_checks=pins, **chosen)(*shapes)
    return ExportedModel(exported, batch_size, names + ("seeds", "valid", "key"))


def _export_typed(program: StepProgram, variables, data: DeviceData, batch_size: int,
                  platforms) -> ExportedModel:
    """`export_model` for a typed node task (its docstring): the typed sampler at the
    conservative envelope for `batch_size` seeds (tree sizes in tree mode)."""
    task, graph = program.task, data.graph
    config, seed_type = task.sampler, task.seed_type
    envelope = (typed_conservative(config, seed_type, batch_size, graph.num_nodes)
                if config.dedup else typed_tree_sizes(config, seed_type, batch_size))
    tables = [(name, g.edge_features is not None and config.edge_ids)
              for name, g in zip(map(relation_name, graph.relations), graph.graphs)]

    def infer(*args):
        args = list(args)
        graphs = []
        for g, (_, with_table) in zip(graph.graphs, tables):
            indptr, indices = args.pop(0), args.pop(0)
            table = args.pop(0) if with_table else None
            graphs.append(g._replace(indptr=indptr, indices=indices, weights=None,
                                     edge_features=table))
        features, seeds, valid, key = args
        device = DeviceData(dataclasses.replace(graph, graphs=tuple(graphs)), features, None)
        mb = sample_typed(device.graph, seeds, valid, key, config, envelope, XLA)
        logits, _ = program.apply_model(variables, device, task.sample_of(mb), train=False,
                                        inputs=task.model_inputs(device, mb))
        return logits.astype(jnp.float32)

    arrays, names = [], []
    for g, (name, with_table) in zip(graph.graphs, tables):
        parts = [("indptr", g.indptr), ("indices", g.indices)] + (
            [("edge_features", g.edge_features)] if with_table else [])
        arrays += [a for _, a in parts]
        names += [f"{name}.{part}" for part, _ in parts]
    arrays.append(data.features)
    shapes = [jax.ShapeDtypeStruct(a.shape, a.dtype) for a in arrays]
    return _exported(infer, shapes, tuple(names) + ("features",), batch_size, platforms)
