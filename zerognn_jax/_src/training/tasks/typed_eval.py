"""Evaluation on typed graphs: exact layer-wise outputs per node type (a node task's
logits, a link task's embeddings), or outputs of sampled neighbourhoods with the
training fanouts.

Exact: layer i computes, for every node of the types a sampled batch holds at level
L - 1 - i (`TypedSamplerConfig.plan`), the relational layer over every edge of the
relations that hop samples, from the previous layer's rows of every node; the target
type's rows of the last layer are the logits. A layer runs whole (`whole_graph_layer`,
which gathers a row per edge of every relation at once) where its edge rows fit half
the device's free memory; else a model that reads its destinations through
`TypedLayer.dst_rows` (`chunked_exact`, as `HeteroGNN`) gets each type's rows in chunks
whose edges, over all its relations, fit a budget (as the homogeneous path's chunks:
`evaluate.chunk_budget`), and any other model the whole layer still. The inputs are
every node's rows on the device: a feature table in host memory is read onto it for the
pass, by the host gather, where it fits the free memory; where it does not, a model that
takes chunks runs its first layer in chunks that read their rows from the host table.

Sampled: the ids in consecutive batches, sampled with the keys of an epoch no training
run reaches; the envelope holds exactly the largest counts of those batches (sampling
alone first, under the conservative bound), so nothing overflows. The splits of an
evaluation share that envelope and run in calls of the same number of batches, so that
one program serves them all.
"""

from __future__ import annotations

import dataclasses
import functools
import threading
import weakref

import jax
import jax.numpy as jnp
import numpy as np

from zerognn_jax._src.nn.bridge import model_name
from zerognn_jax._src.nn.hetero import TypedLayer, join_inputs, whole_graph_layer
from zerognn_jax._src.nn.views import EdgeView
from zerognn_jax._src.ops.host_rows import host_table, is_host_resident, uploaded
from zerognn_jax._src.ops.jitting import jit_per_object
from zerognn_jax._src.sampling.envelope import EnvelopePolicy
from zerognn_jax._src.sampling.seeds import EVAL_EPOCH, EVAL_STEP, padded_parts, step_calls
from zerognn_jax._src.sampling.typed_calibrate import sample_typed_epoch_counts
from zerognn_jax._src.sampling.typed_config import seed_types
from zerognn_jax._src.sampling.typed_envelope import (
    fit_typed_envelope,
    typed_conservative,
    typed_from_counts,
    typed_served,
    typed_tree_sizes,
)
from zerognn_jax._src.sampling.typed_minibatch import sample_typed_step
from zerognn_jax._src.training.evaluate import (
    BASE_BUDGET,
    at_budget_or_base,
    chunk_budget,
    chunk_edge_rows,
    chunk_edges,
    halving_batches,
    in_calls,
    rows_in_chunks,
    shared_chunk_rows,
    unless_out_of_memory,
)
from zerognn_jax._src.training.memory import device_free_bytes

EXACT_POLICY = EnvelopePolicy(1.0, 128)


def typed_logits(task, predictor, ids) -> np.ndarray:
    """float32[len(ids), classes]: logits of the target-type nodes `ids`, exact when
    `predictor.mode` is "full" and the model has `layer`, else sampled."""
    return split_logits(task, predictor, [ids])[0]


def split_logits(task, predictor, parts) -> list[np.ndarray]:
    """`typed_logits` of each id array of `parts` (the splits). Exact logits are
    computed once for all; sampled ones part by part, each as `typed_logits` of its ids
    alone gives them: a node's draws depend on the batch it falls in."""
    parts = [np.asarray(ids, np.int32) for ids in parts]
    program, variables = predictor.program, predictor.variables
    if embeds_exactly(predictor):
        every = np.asarray(exact_logits(task, program, variables, predictor.data))
        return [every[ids] for ids in parts]
    return sampled_parts(task, program, variables, predictor.data, parts,
                         batch_size=predictor.batch_size, seed=predictor.seed,
                         bucketed=predictor.bucketed)


def embeds_exactly(predictor) -> bool:
    """Whether `predictor` computes exact outputs: mode "full" and a model with `layer`
    (exact layer-wise inference); else its outputs are sampled."""
    return predictor.mode == "full" and typed_layerwise(predictor.program.model)


def typed_layerwise(model) -> bool:
    """Whether a typed program's model (the task's wrapper of the built-in or the user's
    module) offers exact layer-wise inference: `layer(i, h, layer, *, train)`."""
    return hasattr(model.model, "layer")


def no_typed_layer_form(model) -> str:
    """The one-line reason a typed program's model gets no exact layer-wise inference."""
    return (f"the model {model_name(model.model)} has no layer(i, h, layer, *, train), "
            f"which a typed graph's exact layer-wise inference needs (docs/hetero.md)")


def exact_relations(task, graph, i: int) -> tuple[tuple, tuple]:
    """(the types layer i computes, the relations into them that its hop samples)."""
    plan = task.sampler.plan(task.seed_type)
    hop = len(plan) - 1 - i
    types = seed_types(task.seed_type) if hop == 0 else plan[hop - 1].types
    return types, tuple(r for r, _ in graph.items()
                        if r[2] in types and r in plan[hop].relations)


def exact_layer(task, graph, i: int) -> TypedLayer:
    """Layer i's whole-graph views of the relations its hop samples, and the types it
    computes (all their nodes)."""
    types, relations = exact_relations(task, graph, i)
    whole = whole_graph_layer(graph, types)
    return TypedLayer({r: v for r, v in whole.views.items() if r in relations},
                      whole.num_dst)


def exact_inputs(task, data, table=None) -> dict:
    """{type: every node's input row}: its features (from a table in host memory, the
    whole table read onto the device first, in blocks, after checking that it fits), or
    for an embedded type its rows of the stacked embedding `table` (`TypedEmbedding`),
    after its features if it has both (`join_inputs`)."""
    counts = data.graph.num_nodes
    offsets = dict(task.inputs.offsets)
    features = data.features
    if is_host_resident(features):
        host = host_table(features)
        free = device_free_bytes()
        if not _table_fits(host, free):
            raise ValueError(f"exact evaluation of a typed graph reads its feature table "
                             f"onto the device ({host.nbytes:,} bytes) and {free:,} bytes "
                             f"are free: evaluate by sampling (eval_mode 'sampled', or "
                             f"zg.predict(..., mode='sampled')), or give the model "
                             f"chunked_exact (docs/hetero.md) to read the table in chunks")
        features = uploaded(host)
    return join_inputs(
        {t: features[offsets[t]:offsets[t] + counts[t], :d] for t, d in task.inputs.widths},
        {t: table[off:off + counts[t]] for t, off in task.inputs.embedded_offsets})


def _table_fits(host, free: int | None) -> bool:
    """Whether the host table fits the device's `free` bytes (unknown on a CPU: it
    does). Only the table is counted: the layers' buffers come on top."""
    return free is None or host.nbytes <= free


@jit_per_object(static_argnames=("i",))
def _exact_layer(program, variables, h, graph, *, i: int):
    layer = exact_layer(program.task, graph, i)
    return program.model.apply(variables, i, h, layer, train=False, method="layer")


def exact_logits(task, program, variables, data, *, budget_bytes: int | None = None
                 ) -> jax.Array:
    """float32[N_target, classes]: every target node's exact logits (`exact_outputs`)."""
    return exact_outputs(task, program, variables, data,
                         budget_bytes=budget_bytes)[task.seed_type]


def exact_outputs(task, program, variables, data, *, budget_bytes: int | None = None
                  ) -> dict:
    """{type: float32[N_type, d]}: the last layer's exact rows of every node of level
    0's types (`task.seed_type`, one type or a link task's two; `variables` hold
    the model's and, with embedded types, the "embedding" table). Where the model
    takes chunks (module docstring), a layer runs in chunks of a type's rows whose
    gathered edge rows fit `budget_bytes`; None: whole where its edge rows fit half the
    device's free memory (`_whole_fits`), else in chunks of `evaluate.chunk_budget`,
    run again at BASE_BUDGET where a larger one runs the device out of memory."""
    model_vars = {k: v for k, v in variables.items() if k != "embedding"}
    graph, table = data.graph, variables.get("embedding")
    chunked = getattr(program.model.model, "chunked_exact", False)
    budget = chunk_budget(False) if budget_bytes is None else budget_bytes
    first = 0
    if (chunked and is_host_resident(data.features)
            and not _table_fits(host_table(data.features), device_free_bytes())):
        h = _first_layer_from_host(task, program, model_vars, data, table, budget,
                                   budget_bytes is None)
        first = 1
    else:
        h = exact_inputs(task, data, table)
    for i in range(first, task.sampler.num_hops):
        types, relations = exact_relations(task, graph, i)
        width = max([x.shape[1] for x in h.values()]
                    + [getattr(program.model.model, "hidden", 0)])
        edge_bytes = sum(graph[r].num_edges for r in relations) * width * 4
        # (a type without nodes, at either end, goes through the whole-graph layer)
        ends = {t for r in relations for t in (r[0], r[2])} | set(types)
        can_chunk = chunked and all(graph.num_nodes[t] for t in ends)
        chunks = functools.partial(_chunks_or_smaller, program, model_vars, graph, i, types,
                                   relations, width, budget, budget_bytes is None)
        if can_chunk and (budget_bytes is not None or not _whole_fits(edge_bytes)):
            h = chunks(h)
        elif not can_chunk:
            h = _exact_layer(program, model_vars, h, graph, i=i)
        else:  # the estimate behind `_whole_fits` counts only the gathered rows
            h = unless_out_of_memory(
                functools.partial(_exact_layer, program, model_vars, h, graph, i=i),
                functools.partial(chunks, h),
                f"typed exact evaluation: layer {i + 1}'s whole-graph pass ran the device "
                f"out of memory; running it in chunks of {budget / 2**30:.2f} GiB of edge "
                f"rows")
    return {t: h[t] for t in seed_types(task.seed_type)}


def _chunks_or_smaller(program, variables, graph, i: int, types, relations, width: int,
                       budget: int, retry: bool, h: dict) -> dict:
    """`_layer_in_chunks` at `budget`; with `retry`, again at BASE_BUDGET where that
    runs the device out of memory (`_or_at_base`)."""
    run = functools.partial(_layer_in_chunks, program, variables, graph, i, types,
                            relations, width)
    return _or_at_base(lambda b: run(b, h), budget, retry, i)


def _or_at_base(run, budget: int, retry: bool, i: int):
    """`run(budget)`, layer i's chunked pass; with `retry` (the budget a default), run
    again at BASE_BUDGET where a larger budget runs the device out of memory, with a
    warning, as the homogeneous path does (`at_budget_or_base`)."""
    if not retry:
        return run(budget)
    return at_budget_or_base(
        run, budget, f"typed exact evaluation: layer {i + 1} ran the device out of memory "
                     f"in chunks of {budget / 2**30:.2f} GiB of edge rows; running it again "
                     f"at {BASE_BUDGET / 2**30:.0f} GiB")


def _layer_in_chunks(program, variables, graph, i: int, types, relations, width: int,
                     budget: int, h: dict) -> dict:
    """Layer i's rows of every type of `types`, each in chunks (`_type_rows`)."""
    return {t: _type_rows(program, variables, h, graph, i, t,
                          tuple(r for r in relations if r[2] == t), width, budget)
            for t in types}


def _first_layer_from_host(task, program, variables, data, table, budget: int,
                           retry: bool) -> dict:
    """`_host_layer_in_chunks` at `budget`; with `retry`, again at BASE_BUDGET where
    that runs the device out of memory (`_or_at_base`)."""
    run = functools.partial(_host_layer_in_chunks, task, program, variables, data, table)
    return _or_at_base(run, budget, retry, 0)


def _host_layer_in_chunks(task, program, variables, data, table, budget: int) -> dict:
    """Layer 0's rows of every type of its level, in chunks whose source rows are read
    from the host feature table (and the embedding `table`) chunk by chunk: for a
    table that does not fit the device."""
    graph, counts = data.graph, data.graph.num_nodes
    types, relations = exact_relations(task, graph, 0)
    width = max(task.inputs.widest(0 if table is None else table.shape[1]),
                getattr(program.model.model, "hidden", 0))
    out = {}
    for t in (t for t in types if counts[t]):
        rels = tuple(r for r in relations if r[2] == t)
        out[t] = _host_chunked_rows(program, variables, data.features, table, graph,
                                    node_type=t, relations=rels, inputs=task.inputs,
                                    **_chunk_plan(graph, t, rels, width, budget))
    width_out, dtype = next((x.shape[1], x.dtype) for x in out.values())
    out.update({t: jnp.zeros((0, width_out), dtype) for t in types if not counts[t]})
    return out


@jit_per_object(static_argnames=("node_type", "relations", "rows", "caps", "length", "inputs"))
def _host_chunked_rows(program, variables, features, table, graph, *, node_type: str,
                       relations: tuple, rows: int, caps: tuple, length: int, inputs):
    """[length, d_out]: layer 0 of every `node_type` row, `rows` at a time (as
    `_chunked_rows`), each chunk's input rows read as it needs them: per source type one
    read of the host table `features` (or of the embedding `table`) for the chunk's
    destinations (first, when the type is also the destinations') and each relation's
    edge slots in turn, so that every view reads its sources by position."""
    offsets, widths = dict(inputs.offsets), dict(inputs.widths)
    embedded = dict(inputs.embedded_offsets)

    def rows_of(node_type, ids, valid):
        read, learned = {}, {}
        if node_type in offsets:
            read[node_type] = features.gather(offsets[node_type] + ids,
                                              valid)[:, :widths[node_type]]
        if node_type in embedded:
            picked = table[embedded[node_type] + jnp.where(valid, ids, 0)]
            learned[node_type] = jnp.where(valid[:, None], picked,
                                           jnp.zeros((), picked.dtype))
        return join_inputs(read, learned)[node_type]

    def chunk(first):
        ids = {node_type: [first + jnp.arange(rows, dtype=jnp.int32)]}
        live = {node_type: [jnp.ones((rows,), bool)]}
        views, taken = {}, {node_type: rows}
        for rel, cap in zip(relations, caps):
            view = _chunk_view(graph[rel], first, rows, cap)
            base = taken.get(rel[0], 0)
            ids.setdefault(rel[0], []).append(view.src)
            live.setdefault(rel[0], []).append(view.mask)
            taken[rel[0]] = base + cap
            views[rel] = dataclasses.replace(view, src=base + jnp.arange(cap, dtype=jnp.int32))
        h = {t: rows_of(t, jnp.concatenate(ids[t]), jnp.concatenate(live[t])) for t in ids}
        layer = TypedLayer(views, ((node_type, rows),))
        return program.model.apply(variables, 0, h, layer, train=False,
                                   method="layer")[node_type]

    return rows_in_chunks(chunk, rows, length)


def _chunk_view(graph, first, rows: int, cap: int) -> EdgeView:
    """The EdgeView of the edges of `graph`'s rows [first, first + rows) in `cap` slots
    (`chunk_edges`), with their rows of its edge features where it has them."""
    src, dst, mask, degrees, first_edge = chunk_edges(graph, first, rows, cap)
    edges = chunk_edge_rows(graph.edge_features, first_edge, jnp.arange(cap, dtype=jnp.int32),
                            mask)
    return EdgeView(src, dst, mask, jnp.ones((rows,), bool), degrees, jnp.zeros(1, jnp.int32),
                    rows, edges)


def _whole_fits(edge_bytes: int) -> bool:
    """Whether a whole-graph layer whose edge rows would take `edge_bytes` runs whole:
    within half the device's free memory (a CPU does not say: whole). Chunks cost time
    where the whole layer fits (mag-like's rsage on an H200: 0.062 s in 4 GiB chunks,
    0.022 s whole; docs/benchmarks.md)."""
    free = device_free_bytes()
    return free is None or edge_bytes <= free // 2


def _type_rows(program, variables, h, graph, i: int, node_type: str, relations: tuple,
               width: int, budget: int) -> jax.Array:
    """Layer i's rows of every `node_type` node, in chunks (`_chunk_plan`)."""
    return _chunked_rows(program, variables, h, graph, i=i, node_type=node_type,
                         relations=relations,
                         **_chunk_plan(graph, node_type, relations, width, budget))


def _chunk_plan(graph, node_type: str, relations: tuple, width: int, budget: int) -> dict:
    """{rows, caps, length}: the chunks of every `node_type` row (`shared_chunk_rows`
    over the `relations` into it)."""
    count = graph.num_nodes[node_type]
    rows, caps = shared_chunk_rows([graph[r].indptr for r in relations], count, width,
                                   budget)
    return {"rows": rows, "caps": caps, "length": count}


@jit_per_object(static_argnames=("i", "node_type", "relations", "rows", "caps", "length"))
def _chunked_rows(program, variables, h, graph, *, i: int, node_type: str, relations: tuple,
                  rows: int, caps: tuple, length: int) -> jax.Array:
    """[length, d_out]: layer i of every `node_type` row, `rows` at a time (the last
    chunk moved back to end at the last row), each chunk's edges of relation
    `relations[k]` in `caps[k]` slots."""

    def chunk(first):
        views = {}
        for rel, cap in zip(relations, caps):
            views[rel] = _chunk_view(graph[rel], first, rows, cap)
        layer = TypedLayer(views, ((node_type, rows),), {node_type: first})
        out = program.model.apply(variables, i, h, layer, train=False, method="layer")
        return out[node_type]

    return rows_in_chunks(chunk, rows, length)


def eval_envelope(task, data, padded: list, batch_size: int, steps: int, seed, kernels, *,
                  served: bool = False):
    """The envelope that holds every batch of each item array of `padded` exactly (module
    docstring), sampled `steps` batches a call (`padded_parts`); with `served` (a
    `zg.predict` request), rounded up to sizes shared with earlier requests to `task` of
    the same batch size (`typed_served`: it only grows)."""
    config, st = task.sampler, task.seed_type
    if not config.dedup:
        return typed_tree_sizes(config, st, batch_size)
    safe = typed_conservative(config, st, batch_size, data.graph.num_nodes, EXACT_POLICY)
    top = {}
    for rows in padded:
        for chunk in step_calls(rows, batch_size, steps):
            counts, _, _ = sample_typed_epoch_counts(
                data.graph, chunk, seed, EVAL_EPOCH, batch_size=batch_size, config=config,
                envelope=safe, kernels=kernels, key_step=EVAL_STEP)
            for t, c in counts.items():
                top[t] = np.maximum(top.get(t, 0), np.asarray(c).max(axis=0))
    env = fit_typed_envelope(config, typed_from_counts(config, st, batch_size, top, safe,
                                                       EXACT_POLICY))
    if served:
        with _SERVED_LOCK:  # (requests from several threads: the larger one is kept)
            earlier = _SERVED.setdefault(task, {})
            env = earlier[batch_size] = typed_served(config, env, safe,
                                                     earlier.get(batch_size))
    return env


# What `zg.predict`'s requests to a task were served with, by batch size: a later request
# whose counts fit takes the same envelope, hence the same compiled pass.
_SERVED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_SERVED_LOCK = threading.Lock()


def sampled_logits(task, program, variables, data, ids, *, batch_size: int,
                   seed: int = 0, bucketed: bool = False) -> np.ndarray:
    """float32[len(ids), outputs]: the model's outputs (logits; a link encoder's
    embeddings, with `task` a link task's `for_seeds` view) of sampled neighbourhoods of
    `task.seed_type`'s nodes `ids`, `batch_size` at a time (fewer where the device runs
    out: `halving_batches`).

    `bucketed` (`zg.predict`'s requests of varying sizes): the batch, the steps and the
    envelope rounded up to sizes that requests share (`serving_items`, `eval_envelope`),
    so that a new request size seldom compiles the pass again; each node's sample is the
    same in any request (its id draws it: `EVAL_STEP`)."""
    return sampled_parts(task, program, variables, data, [ids], batch_size=batch_size,
                         seed=seed, bucketed=bucketed)[0]


def sampled_parts(task, program, variables, data, parts, *, batch_size: int,
                  seed: int = 0, bucketed: bool = False) -> list[np.ndarray]:
    """`sampled_logits` of each id array of `parts` (a dataset's splits), each equal to
    what that call gives for it alone, from one compiled pass: one batch (at most the
    largest part's ids), one envelope holding every part's batches, and every part run
    in calls of the same number of batches (`step_calls`)."""
    parts = [np.asarray(ids, np.int32) for ids in parts]
    if not any(ids.size for ids in parts):
        return [np.zeros((0, program.model.model.num_classes), np.float32) for _ in parts]

    def run(batch: int, limit: int) -> list[np.ndarray]:
        padded, batch, steps = padded_parts(parts, batch, limit, bucketed)
        key = jnp.uint32(seed)
        env = eval_envelope(task, data, padded, batch, steps, key, program.kernels,
                            served=bucketed)
        call = lambda chunk: _sampled_pass(program, variables, data, chunk, key, task=task,
                                           envelope=env)
        outs = [in_calls(call, rows, batch, steps) for rows in padded]  # (queued, then read)
        return [np.concatenate([np.asarray(c, np.float32) for c in out])[:ids.size]
                for ids, out in zip(parts, outs)]

    return halving_batches(run, batch_size, "typed sampled evaluation",
                           max(ids.size for ids in parts), rounded=bucketed)


@jit_per_object(static_argnames=("task", "envelope"))
def _sampled_pass(program, variables, data, padded, seed, *, task, envelope):
    """The model's outputs for each batch of `padded`, sampled as `task` samples (the
    program's task, or a typed link task's view from one end: `for_seeds`)."""
    program = dataclasses.replace(program, parallel=None)

    def step(_, s):
        st = sample_typed_step(data.graph, padded, s, seed=seed, epoch=EVAL_EPOCH,
                               batch_size=envelope.batch_size, config=task.sampler,
                               envelope=envelope, kernels=program.kernels,
                               key_step=EVAL_STEP)
        out, _ = program.apply_model(variables, data, task.sample_of(st.mb), train=False,
                                     inputs=task.model_inputs(data, st.mb))
        return None, out

    steps = padded.shape[0] // envelope.batch_size
    return jax.lax.scan(step, None, jnp.arange(steps, dtype=jnp.int32))[1]
