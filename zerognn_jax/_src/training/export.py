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


class ExportedModel(NamedTuple):
    """What `export_model` returns.

    Attributes:
      exported: the `jax.export.Exported`; `.call(indptr, indices, features, seeds,
        valid, key)` gives float32[batch_size, outputs]; `.serialize()` gives bytes.
      batch_size: seeds per call (pad with any id and `valid=False`).
      arguments: the argument names, in order.
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
      ValueError: a bad batch size, or a weighted sampler (it reads a per-edge table
        the artifact does not take).
    """
    if not (isinstance(batch_size, int) and batch_size >= 1):
        raise ValueError(f"batch_size must be a positive int, got {batch_size!r}")
    if program.sampler.method == "weighted":
        raise ValueError("export_model serves the uniform and LABOR samplers; this "
                         "program samples by edge weight")
    caps = conservative(batch_size, program.sampler.slots, data.graph.num_nodes).capacities
    # The XLA twin of every op: no Triton custom calls, whose serialized form jax.export
    # does not promise to keep loadable, and one artifact lowers for CPU and GPU alike.
    program = dataclasses.replace(program.with_mesh(None), kernels=XLA)

    def infer(indptr, indices, features, seeds, valid, key):
        graph = CSRGraph(indptr, indices)
        device = DeviceData(graph, features, None)  # inference reads no targets
        logits, _, _ = program.forward(variables, device, seeds, valid, key, caps,
                                       train=False)
        return logits.astype(jnp.float32)

    shapes = [jax.ShapeDtypeStruct(a.shape, a.dtype) for a in
              (data.graph.indptr, data.graph.indices, data.features)]
    shapes += [jax.ShapeDtypeStruct((batch_size,), jnp.int32),
               jax.ShapeDtypeStruct((batch_size,), jnp.bool_),
               jax.ShapeDtypeStruct((), jnp.uint32)]
    # Left out, jax.export lowers for this backend (its name for it: "cuda", not "gpu").
    chosen = {"platforms": tuple(platforms)} if platforms else {}
    exported = jax.export.export(jax.jit(infer), **chosen)(*shapes)
    return ExportedModel(exported, batch_size)
