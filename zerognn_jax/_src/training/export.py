"""A trained model as a serialized `jax.export` artifact: sampled inference for serving.

`export_model` stages out one batch of sampled inference (sample the seeds' neighbourhood,
gather features, run the model) with the model's variables baked in, every op in its
XLA form. The graph and the feature table stay arguments: they are the data a server
holds, often too large to serialize. Every argument is a plain array, so the artifact
needs no pytree registrations to load: `jax.export.deserialize(blob).call(...)` in any
process with JAX (and `flatbuffers`, which `serialize` needs) runs it, no zerognn-jax
required. A typed graph's model exports the same way, each relation's CSR an argument of
its own: a node model gives its target type's logits, a link model the embeddings of the
nodes of one end of its relation (`export_model`).
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
from zerognn_jax._src.training.tasks.base import BatchedTask, PredictsTypes

PLATFORMS = ("cpu", "cuda", "rocm", "tpu")  # jax.export's names for its lowering targets


class ExportedModel(NamedTuple):
    """What `export_model` returns.

    Attributes:
      exported: the `jax.export.Exported`; `.call(*arguments)` gives
        float32[batch_size, outputs] (a link model's: the encoder's embeddings);
        `.serialize()` gives bytes.
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
        return tuple(_lookup(data, self.arguments[:-3]))


def _lookup(data: DeviceData, names) -> list:
    """The arrays of `data` that argument `names` name: "features", a graph's "indptr",
    "indices" or "edge_features", or a typed graph's "<relation>.<that>"."""
    graph = data.graph
    relations = ({relation_name(r): r for r in graph.relations}
                 if isinstance(graph, HeteroGraph) else {})
    out = []
    for name in names:
        owner, _, part = name.rpartition(".")
        out.append(data.features if name == "features" else
                   getattr(graph[relations[owner]] if owner else graph, part))
    return out


def export_model(program: StepProgram, variables, data: DeviceData, *, batch_size: int,
                 platforms: tuple[str, ...] | None = None,
                 node_type: str | None = None) -> ExportedModel:
    """Exports sampled inference of `batch_size` seeds with `program`'s sampler and model.

    Args:
      program, variables, data: as `TrainResult.program`, `.variables`, `.data` (or
        `restore`'s); `data` gives the shapes and dtypes of the graph and features the
        artifact will be called with (it is not stored).
      batch_size: seeds per call; the envelope is the conservative one for that batch,
        so no call can overflow.
      platforms: lowering targets, e.g. ("cpu", "cuda"); default: this backend's.
      node_type: a typed link model's end type whose embeddings the artifact gives (it
        may be left out where both ends are one type); a typed node model's target type
        or None; None for a graph of one type.

    A typed graph's program takes, per relation in the graph's order,
    "<src>__<name>__<dst>.indptr" and ".indices" (and ".edge_features" where its views
    read that relation's table), then the stacked "features" table, then the seeds: ids
    of the target type, whose logits come back, or of a link model's `node_type`, whose
    embeddings come back. Learnable rows are baked in with the variables.

    Raises:
      ValueError: a bad batch size, an unknown platform, a weighted sampler (it reads a
        per-edge table the artifact does not take), a graph collection's task (not
        served yet), or a `node_type` the model does not predict.
    """
    if not (isinstance(batch_size, int) and batch_size >= 1):
        raise ValueError(f"batch_size must be a positive int, got {batch_size!r}")
    unknown = [p for p in platforms or () if p not in PLATFORMS]
    if unknown:  # jax.export lowers for a name it does not know without a word
        raise ValueError(f"platforms must be among {', '.join(PLATFORMS)}; got "
                         f"{', '.join(map(repr, unknown))}")
    typed = isinstance(program.task, PredictsTypes)
    if isinstance(program.task, BatchedTask) and not typed:
        raise ValueError(f"export_model serves node and link models, of one node type or "
                         f"several; this program's task ({type(program.task).__name__}) "
                         f"batches graph collections, which are not served yet")
    if typed:
        seed_type = program.task.output_type(node_type)  # before any lowering
    elif node_type is not None:
        raise ValueError(f"node_type picks a node type of a typed graph's model; this "
                         f"program's graph has one type (task {type(program.task).__name__})")
    if program.sampler.method == "weighted":
        raise ValueError("export_model serves the uniform and LABOR samplers; this "
                         "program samples by edge weight")
    # The XLA twin of every op: no Triton custom calls, whose serialized form jax.export
    # does not promise to keep loadable, and one artifact lowers for CPU and GPU alike.
    program = dataclasses.replace(program.with_mesh(None), kernels=XLA)
    if typed:  # a typed model's views take their kernels from the model (`OnTypes`)
        program = dataclasses.replace(program, model=program.model.clone(kernels=XLA))
        return _export_typed(program, variables, data, batch_size, platforms, seed_type)
    edges = program.sampler.edge_ids  # the views read the sampled edges' features
    caps = conservative(batch_size, program.sampler.slots, data.graph.num_nodes).capacities

    def infer(given: dict, seeds, valid, key):
        graph = CSRGraph(given["indptr"], given["indices"],
                         edge_features=given.get("edge_features"))
        device = DeviceData(graph, given["features"], None)  # inference reads no targets
        logits, _, _ = program.forward(variables, device, seeds, valid, key, caps,
                                       train=False)
        return logits.astype(jnp.float32)

    names = ("indptr", "indices", "features") + (("edge_features",) if edges else ())
    return _exported(infer, data, names, batch_size, platforms)


def _exported(infer, data: DeviceData, names: tuple, batch_size: int, platforms):
    """`infer({name: array}, seeds, valid, key)` exported for the shapes of `data`'s
    arrays that `names` name, then the seeds, valid flags and key."""
    shapes = [jax.ShapeDtypeStruct(a.shape, a.dtype) for a in _lookup(data, names)]
    shapes += [jax.ShapeDtypeStruct((batch_size,), jnp.int32),
               jax.ShapeDtypeStruct((batch_size,), jnp.bool_),
               jax.ShapeDtypeStruct((), jnp.uint32)]

    def call(*args):
        return infer(dict(zip(names, args)), *args[len(names):])

    # Left out, jax.export lowers for this backend (its name for it: "cuda", not "gpu").
    chosen = {"platforms": tuple(platforms)} if platforms else {}
    # A layout pin (`ops.aggregate.row_major`, R-GAT's projected slots) is a custom call
    # outside jax.export's stable list; it only tells XLA's layout assignment what to do.
    pins = [jax.export.DisabledSafetyCheck.custom_call("LayoutConstraint")]
    exported = jax.export.export(jax.jit(call), disabled_checks=pins, **chosen)(*shapes)
    return ExportedModel(exported, batch_size, names + ("seeds", "valid", "key"))


def _export_typed(program: StepProgram, variables, data: DeviceData, batch_size: int,
                  platforms, seed_type: str) -> ExportedModel:
    """`export_model` for a typed graph's task (its docstring), seeds of `seed_type`:
    the typed sampler at the conservative envelope for `batch_size` seeds (tree sizes in
    tree mode)."""
    task, graph = program.task.for_seeds(seed_type), data.graph
    config = task.sampler
    envelope = (typed_conservative(config, seed_type, batch_size, graph.num_nodes)
                if config.dedup else typed_tree_sizes(config, seed_type, batch_size))
    relations = [relation_name(r) for r in graph.relations]
    names = tuple(f"{name}.{part}" for name, g in zip(relations, graph.graphs)
                  for part in ("indptr", "indices", "edge_features")
                  if part != "edge_features" or (config.edge_ids
                                                 and g.edge_features is not None))

    def infer(given: dict, seeds, valid, key):
        graphs = tuple(g._replace(indptr=given[f"{name}.indptr"],
                                  indices=given[f"{name}.indices"], weights=None,
                                  edge_features=given.get(f"{name}.edge_features"))
                       for name, g in zip(relations, graph.graphs))
        device = DeviceData(dataclasses.replace(graph, graphs=graphs), given["features"],
                            None)
        mb = sample_typed(device.graph, seeds, valid, key, config, envelope, XLA)
        logits, _ = program.apply_model(variables, device, task.sample_of(mb), train=False,
                                        inputs=task.model_inputs(device, mb))
        return logits.astype(jnp.float32)

    return _exported(infer, data, names + ("features",), batch_size, platforms)
