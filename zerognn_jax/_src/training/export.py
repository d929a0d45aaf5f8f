"""A trained model as a serialized `jax.export` artifact: sampled inference for serving.

`export_model` stages out one batch of sampled inference (sample the seeds' neighbourhood,
gather features, run the model) with the model's variables baked in, every op in its
XLA form. The graph and the feature table stay arguments: they are the data a server
holds, often too large to serialize. Every argument is a plain array, so the artifact
needs no pytree registrations to load: `jax.export.deserialize(blob).call(...)` in any
process with JAX (and `flatbuffers`, which `serialize` needs) runs it, no zerognn-jax
required.
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

import jax
import jax.numpy as jnp

from zerognn_jax._src.data.graph import CSRGraph
from zerognn_jax._src.ops.registry import XLA
from zerognn_jax._src.sampling.envelope import conservative
from zerognn_jax._src.training.program import DeviceData, StepProgram
from zerognn_jax._src.training.tasks.base import BatchedTask


class ExportedModel(NamedTuple):
    """What `export_model` returns.

    Attributes:
      exported: the `jax.export.Exported`; `.call(*arguments)` gives
        float32[batch_size, outputs]; `.serialize()` gives bytes.
      batch_size: seeds per call (pad with any id and `valid=False`).
      arguments: the argument names, in order: (indptr, indices, features, seeds, valid,
        key), with "edge_features" (float[E, D], the graph's table) after "features"
        for a model that reads edge features.
    """

    exported: jax.export.Exported
    batch_size: int
    arguments: tuple[str, ...] = ("indptr", "indices", "features", "seeds", "valid", "key")

    def serialize(self) -> bytearray:
        return self.exported.serialize()


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

    Raises:
      ValueError: a bad batch size, a weighted sampler (it reads a per-edge table
        the artifact does not take), or a task that builds its own batches (typed
        graphs, graph collections: not served yet).
    """
    if not (isinstance(batch_size, int) and batch_size >= 1):
        raise ValueError(f"batch_size must be a positive int, got {batch_size!r}")
    if isinstance(program.task, BatchedTask):
        raise ValueError(f"export_model serves node and link models of a graph of one "
                         f"node type; this program's task builds its own batches "
                         f"({type(program.task).__name__}: typed graphs and graph "
                         f"collections are not served yet)")
    if program.sampler.method == "weighted":
        raise ValueError("export_model serves the uniform and LABOR samplers; this "
                         "program samples by edge weight")
    edges = program.sampler.edge_ids  # the views read the sampled edges' features
    caps = conservative(batch_size, program.sampler.slots, data.graph.num_nodes).capacities
    # The XLA twin of every op: no Triton custom calls, whose serialized form jax.export
    # does not promise to keep loadable, and one artifact lowers for CPU and GPU alike.
    program = dataclasses.replace(program.with_mesh(None), kernels=XLA)

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
    shapes += [jax.ShapeDtypeStruct((batch_size,), jnp.int32),
               jax.ShapeDtypeStruct((batch_size,), jnp.bool_),
               jax.ShapeDtypeStruct((), jnp.uint32)]
    # Left out, jax.export lowers for this backend (its name for it: "cuda", not "gpu").
    chosen = {"platforms": tuple(platforms)} if platforms else {}
    exported = jax.export.export(jax.jit(infer), **chosen)(*shapes)
    names = ("indptr", "indices", "features") + (("edge_features",) if edges else ()) + (
        "seeds", "valid", "key")
    return ExportedModel(exported, batch_size, names)
