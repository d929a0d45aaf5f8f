"""Inference over all nodes: exact layer-wise full-neighbourhood, or sampled.

Layer-wise inference computes layer i for every node before layer i + 1 (as reference
GNN libraries do for ogbn-products), in static chunks of R destination rows whose CSR
edges are read as one fixed-size slice of `edge_capacity` edges: one compiled program
per layer, no host reads inside.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np

from zerognn_jax._src.nn.views import EdgeView
from zerognn_jax._src.sampling.envelope import conservative
from zerognn_jax._src.sampling.seeds import num_steps, step_keys, step_seeds
from zerognn_jax._src.training.program import DeviceData, StepProgram


@dataclasses.dataclass(frozen=True)
class ChunkPlan:
    """Static chunking of the rows: `rows` per chunk, `edge_capacity` edges per chunk."""

    rows: int
    num_chunks: int
    edge_capacity: int


def plan_chunks(indptr: np.ndarray, max_width: int, budget_bytes: int = 1 << 30) -> ChunkPlan:
    """Largest power-of-two row chunk whose gathered edge rows fit `budget_bytes`."""
    indptr = np.asarray(indptr, np.int64)
    n = indptr.shape[0] - 1
    rows = 1 << max(0, int(np.ceil(np.log2(max(n, 1)))))
    while True:
        chunks = -(-n // rows)
        bounds = indptr[np.minimum(np.arange(chunks + 1) * rows, n)]
        cap = int(max(np.diff(bounds).max(initial=0), 1))
        if cap * max_width * 4 <= budget_bytes or rows == 1:
            return ChunkPlan(rows, chunks, cap)
        rows //= 2


def supports_layerwise(model) -> bool:
    return hasattr(model, "layer") and hasattr(model, "num_layers")


@functools.partial(jax.jit, static_argnames=("program", "layer", "plan"))
def _layer_pass(program: StepProgram, variables, h, graph, *, layer: int, plan: ChunkPlan):
    n = graph.num_nodes
    rows = plan.rows
    padded_n = plan.num_chunks * rows
    indptr = jnp.concatenate([graph.indptr, jnp.full((padded_n - n,), graph.indptr[-1],
                                                      graph.indptr.dtype)])
    deg = graph.degrees()
    deg_pad = jnp.concatenate([deg, jnp.zeros((padded_n - n,), deg.dtype)])
    h_pad = jnp.concatenate([h, jnp.zeros((padded_n - n, h.shape[1]), h.dtype)])
    # An edgeless graph has no index to gather; one dummy entry, always masked, stands in.
    indices = graph.indices if graph.num_edges else jnp.zeros((1,), jnp.int32)

    def chunk(r0):
        local_ptr = jax.lax.dynamic_slice(indptr, (r0,), (rows + 1,))
        eids = local_ptr[0] + jnp.arange(plan.edge_capacity, dtype=local_ptr.dtype)
        mask = eids < local_ptr[-1]
        src = indices[jnp.where(mask, eids, 0)]
        dst = jnp.clip(jnp.searchsorted(local_ptr, eids, side="right") - 1, 0, rows - 1)
        view = EdgeView(src, dst.astype(jnp.int32), mask, r0 + jnp.arange(rows) < n,
                        jax.lax.dynamic_slice(deg_pad, (r0,), (rows,)), deg, rows)
        h_dst = jax.lax.dynamic_slice(h_pad, (r0, 0), (rows, h.shape[1]))
        return program.model.apply(variables, layer, h, h_dst, view, train=False,
                                   method="layer")

    starts = jnp.arange(plan.num_chunks, dtype=jnp.int32) * rows
    out = jax.lax.map(chunk, starts)
    return out.reshape(padded_n, -1)[:n]


def layerwise_logits(program: StepProgram, variables, data: DeviceData, *,
                     budget_bytes: int = 1 << 30) -> jax.Array:
    """float[N, classes]: exact full-neighbourhood logits of every node."""
    model = program.model
    widest = max(data.features.shape[1], getattr(model, "hidden", 0))
    plan = plan_chunks(np.asarray(data.graph.indptr), widest, budget_bytes)
    h = data.features
    for layer in range(model.num_layers):
        h = _layer_pass(program, variables, h, data.graph, layer=layer, plan=plan)
    return h


def sampled_logits(program: StepProgram, variables, data: DeviceData, nodes, *,
                   batch_size: int, seed: int = 0) -> jax.Array:
    """float[len(nodes), classes]: logits from sampled neighbourhoods (program's fanouts)."""
    nodes = np.asarray(nodes, np.int32)
    steps = num_steps(nodes.shape[0], batch_size)
    padded = np.full(steps * batch_size, -1, np.int32)
    padded[: nodes.shape[0]] = nodes
    env = conservative(batch_size, program.sampler.slots, data.graph.num_nodes)
    out = _sampled_pass(program, variables, data, jnp.asarray(padded), jnp.uint32(seed),
                        capacities=env.capacities, batch_size=batch_size)
    return out.reshape(steps * batch_size, -1)[: nodes.shape[0]]


@functools.partial(jax.jit, static_argnames=("program", "capacities", "batch_size"))
def _sampled_pass(program, variables, data, padded, seed, *, capacities, batch_size):
    # Plain jitted code outside any mesh: features are gathered unsplit (XLA's
    # partitioner moves the rows of a row-sharded table).
    program = dataclasses.replace(program, parallel=None)

    def step(_, s):
        seeds, valid = step_seeds(padded, s, batch_size)
        key, _ = step_keys(seed, 0x7FFFFFFF, s)
        logits, _, _ = program.forward(variables, data, seeds, valid, key, capacities,
                                       train=False)
        return None, logits

    steps = padded.shape[0] // batch_size
    return jax.lax.scan(step, None, jnp.arange(steps, dtype=jnp.int32))[1]


def accuracy(logits, labels, idx) -> float:
    idx = np.asarray(idx)
    if idx.size == 0:
        return float("nan")
    pred = np.asarray(jnp.argmax(logits[jnp.asarray(idx)], -1))
    return float(np.mean(pred == np.asarray(labels)[idx]))


def evaluate_splits(program: StepProgram, variables, data: DeviceData, dataset, *,
                    mode: str = "full", batch_size: int = 4096, seed: int = 0) -> dict:
    """{"train_acc", "val_acc", "test_acc"} of `dataset`'s splits.

    `mode` is "full" (exact layer-wise, for models that support it; else sampled),
    "sampled" (the training fanouts, `batch_size` nodes per step) or "none" ({}).
    """
    if mode == "none":
        return {}
    splits = {s: getattr(dataset, f"{s}_idx") for s in ("train", "val", "test")}
    if mode == "full" and supports_layerwise(program.model):
        logits = layerwise_logits(program, variables, data)
        return {f"{s}_acc": accuracy(logits, dataset.labels, idx) for s, idx in splits.items()}
    result = {}
    for split, idx in splits.items():
        logits = sampled_logits(program, variables, data, idx, batch_size=batch_size,
                                seed=seed)
        result[f"{split}_acc"] = accuracy(logits, dataset.labels[idx], np.arange(len(idx)))
    return result
