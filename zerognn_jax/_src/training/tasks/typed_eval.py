"""Evaluation of typed node classification: exact layer-wise logits per node type, or
logits of sampled neighbourhoods with the training fanouts.

Exact: layer i computes, for every node of the types a sampled batch holds at level
L - 1 - i (`TypedSamplerConfig.plan`), the relational layer over every edge of the
relations that hop samples (`whole_graph_layer`), from the previous layer's rows of
every node; the target type's rows of the last layer are the logits. Not chunked: a
layer gathers one row per edge of its relations (docs/hetero.md), and the inputs are
every node's rows on the device (a feature table in host memory is read onto it for the
pass, by the host gather).

Sampled: the ids in consecutive batches, sampled with the keys of an epoch no training
run reaches; the envelope holds exactly the largest counts of those batches (one
sampling scan first, under the conservative bound), so nothing overflows.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np

from zerognn_jax._src.nn.hetero import TypedLayer, whole_graph_layer
from zerognn_jax._src.ops.host_rows import is_host_resident, uploaded
from zerognn_jax._src.sampling.envelope import EnvelopePolicy
from zerognn_jax._src.sampling.seeds import ordered_items
from zerognn_jax._src.sampling.typed_calibrate import sample_typed_epoch_counts
from zerognn_jax._src.sampling.typed_envelope import (
    fit_typed_envelope,
    typed_conservative,
    typed_from_counts,
    typed_tree_sizes,
)
from zerognn_jax._src.sampling.typed_minibatch import sample_typed_step
from zerognn_jax._src.training.evaluate import halving_batches
from zerognn_jax._src.training.memory import device_free_bytes

EVAL_EPOCH = 0x7FFFFFFF  # the epoch whose keys evaluation samples with
EXACT_POLICY = EnvelopePolicy(1.0, 128)


def typed_logits(task, predictor, ids) -> np.ndarray:
    """float32[len(ids), classes]: logits of the target-type nodes `ids`, exact when
    `predictor.mode` is "full" and the model has `layer`, else sampled."""
    ids = np.asarray(ids, np.int32)
    program, variables = predictor.program, predictor.variables
    if predictor.mode == "full" and hasattr(program.model.model, "layer"):
        return np.asarray(exact_logits(task, program, variables, predictor.data))[ids]
    return sampled_logits(task, program, variables, predictor.data, ids,
                          batch_size=predictor.batch_size, seed=predictor.seed)


def exact_layer(task, graph, i: int) -> TypedLayer:
    """Layer i's whole-graph views of the relations its hop samples, and the types it
    computes (all their nodes)."""
    plan = task.sampler.plan(task.seed_type)
    hop = len(plan) - 1 - i
    types = (task.seed_type,) if hop == 0 else plan[hop - 1].types
    whole = whole_graph_layer(graph, types)
    views = {r: v for r, v in whole.views.items() if r in plan[hop].relations}
    return TypedLayer(views, whole.num_dst)


def exact_inputs(task, data, table=None) -> dict:
    """{type: every node's input row}: its features (from a table in host memory, the
    whole table read onto the device first, in blocks, after checking that it fits), or
    for a featureless type its rows of the stacked embedding `table` (`TypedEmbedding`)."""
    counts = data.graph.num_nodes
    offsets = dict(task.inputs.offsets)
    features = data.features
    if is_host_resident(features):
        host = getattr(features, "host", features)  # a CachedTable's own
        _check_room(host)
        features = uploaded(host)
    h = {t: features[offsets[t]:offsets[t] + counts[t], :d] for t, d in task.inputs.widths}
    h.update({t: table[off:off + counts[t]] for t, off in task.inputs.embedded_offsets})
    return h


def _check_room(table) -> None:
    """ValueError naming the bytes, where the host `table` would not fit the device's
    free memory (unknown on a CPU: no check). Only the table is counted: the layers'
    buffers come on top."""
    free = device_free_bytes()
    if free is not None and table.nbytes > free:
        raise ValueError(f"exact evaluation of a typed graph reads its feature table onto "
                         f"the device ({table.nbytes:,} bytes) and {free:,} bytes are free: "
                         f"evaluate by sampling (eval_mode 'sampled', or "
                         f"zg.predict(..., mode='sampled'))")


@functools.partial(jax.jit, static_argnames=("program", "i"))
def _exact_layer(program, variables, h, graph, *, i: int):
    layer = exact_layer(program.task, graph, i)
    return program.model.apply(variables, i, h, layer, train=False, method="layer")


def exact_logits(task, program, variables, data) -> jax.Array:
    """float32[N_target, classes]: every target node's exact logits (`variables` hold
    the model's and, with featureless types, the "embedding" table)."""
    h = exact_inputs(task, data, variables.get("embedding"))
    model_vars = {k: v for k, v in variables.items() if k != "embedding"}
    for i in range(task.sampler.num_hops):
        h = _exact_layer(program, model_vars, h, data.graph, i=i)
    return h[task.seed_type]


def eval_envelope(task, data, padded, batch_size: int, seed, kernels):
    """The envelope that holds every batch of `padded` exactly (module docstring)."""
    config, st = task.sampler, task.seed_type
    if not config.dedup:
        return typed_tree_sizes(config, st, batch_size)
    safe = typed_conservative(config, st, batch_size, data.graph.num_nodes, EXACT_POLICY)
    counts, _, _ = sample_typed_epoch_counts(data.graph, padded, seed, EVAL_EPOCH,
                                             batch_size=batch_size, config=config,
                                             envelope=safe, kernels=kernels)
    top = {t: np.asarray(c).max(axis=0) for t, c in counts.items()}
    env = typed_from_counts(config, st, batch_size, top, safe, EXACT_POLICY)
    return fit_typed_envelope(config, env)


def sampled_logits(task, program, variables, data, ids, *, batch_size: int,
                   seed: int = 0) -> np.ndarray:
    """float32[len(ids), classes]: logits of sampled neighbourhoods of `ids`,
    `batch_size` at a time (fewer where the device runs out: `halving_batches`)."""
    if ids.size == 0:
        return np.zeros((0, program.model.model.num_classes), np.float32)

    def run(batch: int) -> np.ndarray:
        padded, key = ordered_items(jnp.asarray(ids, jnp.int32), batch), jnp.uint32(seed)
        env = eval_envelope(task, data, padded, batch, key, program.kernels)
        out = _sampled_pass(program, variables, data, padded, key, envelope=env)
        return np.asarray(out, np.float32).reshape(padded.shape[0], -1)[:ids.size]

    return halving_batches(run, min(batch_size, ids.size), "typed sampled evaluation")


@functools.partial(jax.jit, static_argnames=("program", "envelope"))
def _sampled_pass(program, variables, data, padded, seed, *, envelope):
    task = program.task
    program = dataclasses.replace(program, parallel=None)

    def step(_, s):
        st = sample_typed_step(data.graph, padded, s, seed=seed, epoch=EVAL_EPOCH,
                               batch_size=envelope.batch_size, config=task.sampler,
                               envelope=envelope, kernels=program.kernels)
        out, _ = program.apply_model(variables, data, task.sample_of(st.mb), train=False,
                                     inputs={"typed": st.mb})
        return None, out

    steps = padded.shape[0] // envelope.batch_size
    return jax.lax.scan(step, None, jnp.arange(steps, dtype=jnp.int32))[1]
