"""Inference over all nodes: exact layer-wise full-neighbourhood, or sampled.

Layer-wise inference computes layer i for every node before layer i + 1 (as reference
GNN libraries do for ogbn-products), in static chunks of R destination rows whose CSR
edges are read as one fixed-size slice of `edge_capacity` edges: one compiled program
per layer, no host reads inside. A layer writes its chunks into its output in place, so
the only full-size arrays are a layer's input and output (ogbn-papers100M: 111M rows of
256 units, 57 GB in bfloat16 each); `offload=True` streams each output to host memory
(the GPU stores each chunk's rows into page-locked memory from inside the layer's
program), so that the device holds one layer's input at a time, and `offload="auto"`
only the outputs that do not fit the device.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import functools
import time
import warnings

import jax
import jax.numpy as jnp
import numpy as np

from zerognn_jax._src.data.checks import LibraryWarning, at_least_one, key_seed, node_ids
from zerognn_jax._src.data.graph import edge_ids, take_edge_rows, take_edges
from zerognn_jax._src.nn.bridge import model_name
from zerognn_jax._src.nn.layerwise import layer_count, supports_layerwise
from zerognn_jax._src.nn.views import EdgeView
from zerognn_jax._src.ops.host_rows import (
    HostTable,
    PinnedBuffer,
    host_table,
    is_host_resident,
    to_device,
    uploaded,
    write_rows,
)
from zerognn_jax._src.ops.jitting import jit_per_object
from zerognn_jax._src.ops.search import count_at_most
from zerognn_jax._src.sampling.envelope import Envelope, conservative
from zerognn_jax._src.sampling.seeds import (
    EVAL_EPOCH,
    EVAL_STEP,
    padded_parts,
    served_batch,
    step_calls,
)
from zerognn_jax._src.sampling.steps import sample_step
from zerognn_jax._src.training.memory import (
    device_free_bytes,
    device_largest_free_block,
    eighth_as_power_of_two,
    is_out_of_memory,
)
from zerognn_jax._src.training.program import DeviceData, StepProgram
from zerognn_jax._src.training.tasks.node import NodeTask, node_task

# Output bytes per dispatch of a streamed layer: its segments start as soon as the host
# buffer's pieces they write are page-locked.
_SEGMENT_BYTES = 1 << 30
# A chunk's edge rows when the caller sets no budget: BASE_BUDGET where a layer may
# stream to the host (the budget then also decides which layers do), else an eighth of
# the device's free memory, rounded down to a power of two and kept between the two.
BASE_BUDGET, MAX_BUDGET = 1 << 30, 4 << 30


@dataclasses.dataclass(frozen=True)
class ChunkPlan:
    """Static chunking of the rows: `rows` per chunk, `edge_capacity` edges per chunk
    (enough for any `rows` consecutive rows), `num_chunks` to cover every row."""

    rows: int
    num_chunks: int
    edge_capacity: int


def _window_edges(indptr, rows: int) -> int:
    """The most edges any `rows` consecutive rows hold (differences of non-decreasing
    offsets: exact in their own dtype, unsigned included); for a device array, on the
    device by one compiled program for every `rows` (a host pass over 111M offsets
    takes a fraction of a second per probe)."""
    if isinstance(indptr, jax.Array):
        return int(_max_window(indptr, jnp.int32(rows)))
    return int(np.max(indptr[rows:] - indptr[:-rows], initial=0))


@jax.jit
def _max_window(indptr, rows):
    """Device `_window_edges` for 1 <= rows <= n, with `rows` traced: the windows that
    would run past the last row end there instead (they lie inside the last full window,
    so the largest count is the same)."""
    n = indptr.shape[0] - 1
    ends = jnp.minimum(jnp.arange(n + 1, dtype=jnp.int32), n - rows) + rows
    return jnp.max(indptr[ends] - indptr)


def plan_chunks(indptr, max_width: int, budget_bytes: int = BASE_BUDGET) -> ChunkPlan:
    """Largest row chunk (n, or a power of two below it) whose gathered edge rows of
    `max_width` float32 units fit `budget_bytes`, wherever the chunk starts; `indptr`
    on the host or the device."""
    indptr = indptr if isinstance(indptr, jax.Array) else np.asarray(indptr)
    n = indptr.shape[0] - 1
    rows, (cap,) = shared_chunk_rows([indptr], n, max_width, budget_bytes)
    return ChunkPlan(rows, -(-n // rows), cap)


def shared_chunk_rows(indptrs, n: int, max_width: int, budget_bytes: int) -> tuple:
    """(rows, edge capacities): the largest chunk of `rows` (n, or a power of two below
    it) of `n` destination rows whose edges in every CSR of `indptrs` (offsets over the
    same rows, several relations into one type), gathered as rows of `max_width`
    float32 units, fit `budget_bytes` together, wherever the chunk starts; each CSR's
    capacity for that many rows (at least 1)."""
    rows = max(n, 1)
    while True:
        caps = tuple(max(_window_edges(p, rows), 1) if n else 1 for p in indptrs)
        if sum(caps) * max_width * 4 <= budget_bytes or rows == 1:
            return rows, caps
        rows = 1 << ((rows - 1).bit_length() - 1)  # the power of two below rows


def no_layerwise_form(model) -> str:
    """The one-line reason a model gets no exact layer-wise inference."""
    return (f"the model {model_name(model)} has no layer(i, h_src, h_dst, view, *, train) "
            f"and num_layers, which exact layer-wise inference needs (nn/layerwise.py, "
            f"docs/api.md)")


def chunk_edges(graph, r0, rows: int, cap: int) -> tuple:
    """The CSR edges of `graph`'s rows [r0, r0 + rows) in `cap` slots (cap at least
    their count): (src int32[cap], dst int32[cap] (the slot's row within the chunk), mask
    bool[cap], degrees int32[rows], the first edge's id)."""
    # An edgeless graph has no index to gather; one dummy entry, always masked, stands in.
    indices = graph.indices if graph.num_edges else jnp.zeros((1,), jnp.int32)
    slots = jnp.arange(cap, dtype=jnp.int32)
    ptr = jax.lax.dynamic_slice(graph.indptr, (r0,), (rows + 1,))
    local = (ptr - ptr[0]).astype(jnp.int32)  # offsets within the chunk: small
    mask = slots < local[-1]
    src = take_edges(indices, jnp.where(mask, edge_ids(ptr[0], slots), 0))
    # each slot's row, by a search without a loop (ops/search.py)
    dst = jnp.clip(count_at_most(local, slots) - 1, 0, rows - 1).astype(jnp.int32)
    return src, dst, mask, local[1:] - local[:-1], ptr[0]


def _chunk_rows(program: StepProgram, variables, h, graph, deg, r0, *, layer: int,
                plan: ChunkPlan):
    """Layer `layer` of the `plan.rows` rows from `r0`: [rows, d_out] (`deg`: the
    graph's degrees, computed once outside the loop over chunks)."""
    rows, cap = plan.rows, plan.edge_capacity
    model_vars = {k: v for k, v in variables.items() if k != "embedding"}
    slots = jnp.arange(cap, dtype=jnp.int32)
    src, dst, mask, degrees, first = chunk_edges(graph, r0, rows, cap)
    edge_rows = chunk_edge_rows(graph.edge_features, first, slots, mask)
    every = jnp.ones((rows,), bool)
    dst_ids = r0 + jnp.arange(rows, dtype=jnp.int32)
    if is_host_resident(h):  # the chunk's rows read from host memory, edge by edge
        view = EdgeView(slots, dst, mask, every, degrees, deg[src], rows, edge_rows, src,
                        dst_ids)
        return program.model.apply(model_vars, layer, h.gather(src, mask),
                                   h.gather(dst_ids, every), view, train=False,
                                   method="layer")
    node_ids = jnp.arange(graph.num_nodes, dtype=jnp.int32)  # h holds every node, in order
    view = EdgeView(src, dst, mask, every, degrees, deg, rows, edge_rows, node_ids, dst_ids)
    h_dst = jax.lax.dynamic_slice(h, (r0, jnp.zeros_like(r0)), (rows, h.shape[1]))
    return program.model.apply(model_vars, layer, h, h_dst, view, train=False,
                               method="layer")


@jit_per_object(static_argnames=("layer", "plan", "length"))
def _layer_rows(program: StepProgram, variables, h, graph, first, *, layer: int,
                plan: ChunkPlan, length: int):
    """Layer `layer` of rows [first, first + length) (length >= plan.rows): [length, d_out],
    in chunks (`rows_in_chunks`)."""
    deg = graph.degrees()
    return rows_in_chunks(lambda offset: _chunk_rows(program, variables, h, graph, deg,
                                                     first + offset, layer=layer, plan=plan),
                          plan.rows, length)


def rows_in_chunks(chunk, rows: int, length: int) -> jax.Array:
    """[length, d_out]: `chunk(first)` ([rows, d_out], rows first .. first + rows) for
    chunks every `rows` rows, the last one moved back to end at row `length` (its
    overlap computed twice, with the same result), written in place by one loop."""
    shape = jax.eval_shape(chunk, jnp.int32(0))

    def body(j, out):
        first = jnp.minimum(j * rows, length - rows)
        return jax.lax.dynamic_update_slice(out, chunk(first), (first, jnp.zeros_like(first)))

    out = jnp.zeros((length, shape.shape[1]), shape.dtype)
    return jax.lax.fori_loop(0, -(-length // rows), body, out)


@jit_per_object(static_argnames=("layer", "plan", "count"))
def _layer_to_host(program: StepProgram, variables, h, graph, out: HostTable, j0, *,
                   layer: int, plan: ChunkPlan, count: int):
    """int32[]: rows stored by writing layer `layer` of chunks [j0, j0 + count) into the
    host table `out` (the last chunk moved back to end at the last row, its overlap
    stored twice): one loop of a static length on the device (a loop bound read on the
    device would cost a host round trip per chunk)."""
    n, deg = graph.num_nodes, graph.degrees()

    def body(i, written):
        first = jnp.minimum((j0 + i) * plan.rows, n - plan.rows)
        rows = _chunk_rows(program, variables, h, graph, deg, first, layer=layer, plan=plan)
        return written + write_rows(out, rows, first)

    return jax.lax.fori_loop(0, count, body, jnp.int32(0))


def chunk_edge_rows(table, first, slots, mask):
    """[E, D]: the edge-feature rows of a chunk's edges `first + slots` (zero where
    masked), or None for a graph without a table."""
    if table is None:
        return None
    rows = take_edge_rows(table, jnp.where(mask, edge_ids(first, slots), 0))
    return jnp.where(mask[:, None], rows, jnp.zeros((), rows.dtype))


def _streamed_program(program, variables, h, graph, out: HostTable, layer: int,
                      plan: ChunkPlan) -> tuple:
    """(the compiled segment program of layer `layer` streamed into `out`, chunks per
    segment, seconds to compile it); `h` may be abstract (a `jax.ShapeDtypeStruct`)."""
    t0 = time.perf_counter()
    row_bytes = out.shape[1] * out.dtype.itemsize
    step = min(plan.num_chunks, max(1, _SEGMENT_BYTES // (plan.rows * row_bytes)))
    run = _layer_to_host.lower(program, variables, h, graph, out, jnp.int32(0), layer=layer,
                               plan=plan, count=step).compile()
    return run, step, time.perf_counter() - t0


def _prepared_stream(program, variables, h, graph, target, layer: int,
                     plan: ChunkPlan) -> tuple:
    """(the memory layer `layer` streams into, the host table over it, its compiled
    `_streamed_program`), `target()` giving the first two: made on a thread, since the
    table's page-locking waits for the host handlers' build on a machine's first use."""
    memory, out = target()
    return memory, out, _streamed_program(program, variables, h, graph, out, layer, plan)


def _offloaded_layer(program, variables, h, graph, layer: int, plan: ChunkPlan,
                     out: HostTable, log=None, ready=None, compiled=None) -> HostTable:
    """Layer `layer` of every row into the host table `out`, in segments of about
    `_SEGMENT_BYTES` of output, each run once `ready(end)` (the table's first `end` bytes
    usable: a `PinnedBuffer` still being locked) returns; `compiled`: its
    `_streamed_program` made on a thread and the seconds waited for it (else compiled
    here). The compile time and the time waited are reported to `log`. RuntimeError if
    the device reports another number of rows stored than the chunks hold."""
    if compiled is None:
        run, step, seconds = _streamed_program(program, variables, h, graph, out, layer, plan)
        where = ""
    else:
        (run, step, seconds), waited = compiled
        where = f" on a thread ({waited:.2f} s waited for it and its host table)"
    # Segments of `step` chunks, the last one moved back to end at the last chunk.
    starts = [min(j, plan.num_chunks - step) for j in range(0, plan.num_chunks, step)]
    row_bytes = out.shape[1] * out.dtype.itemsize
    waited, counts = 0.0, []
    for j0 in starts:
        if ready is not None:
            waited += ready(min((j0 + step) * plan.rows, out.shape[0]) * row_bytes)
        counts.append(run(variables, h, graph, out, jnp.int32(j0)))
    if log:
        log(f"exact inference: layer {layer + 1} compiled in {seconds:.2f} s{where}; "
            f"{waited:.2f} s waited for the host buffer's locking")
    written, expected = sum(int(c) for c in counts), len(starts) * step * plan.rows
    if written != expected:
        raise RuntimeError(f"exact inference stored {written:,} rows of layer {layer} in "
                           f"host memory, expected {expected:,}")
    return out


def _layer_outputs(program, variables, h, data: DeviceData) -> list:
    """The shape and dtype of every layer's output over all rows, from the input `h` (a
    one-row chunk plan stands in for the real one: the shapes do not depend on it)."""
    shapes, h = [], jax.ShapeDtypeStruct(h.shape, h.dtype)
    n = data.graph.num_nodes
    for layer in range(layer_count(program.model)):
        h = jax.eval_shape(functools.partial(_layer_rows, program, layer=layer,
                                             plan=ChunkPlan(1, n, 1), length=n),
                           variables, h, data.graph, 0)
        shapes.append(h)
    return shapes


def layerwise_logits(program: StepProgram, variables, data: DeviceData, *,
                     budget_bytes: int | None = None, offload: bool | str = False, log=None):
    """float[N, classes]: exact full-neighbourhood logits of every node.

    `budget_bytes` bounds a chunk's gathered edge rows; None: `chunk_budget(offload)`,
    and where that is above BASE_BUDGET and the device runs out of memory, the pass
    runs again at BASE_BUDGET (with a warning). `offload` says where each
    layer's output goes: False, the device; True, host memory (a NumPy array: the
    logits are returned there), written chunk by chunk from inside the layer's program
    and uploaded again as the next layer's input, which is dropped after that layer;
    "auto", the device while the allocator has room for the output plus a chunk's
    `budget_bytes` once the layer's input is in place, one free block holds the output
    (free memory may lie in pieces: a layer that uploads its input first takes its
    output's room, `_hold_output`), and the layer runs there without running out of
    memory, else the host (a GPU holds the layers that fit and streams the rest; on a
    CPU nothing moves).
    Pass `data.features` as a host array as well to keep the device to the graph plus
    one layer's input (features given on the device stay there: they are the caller's);
    a `HostTable` (cached or not) is never uploaded: the first layer reads each chunk's
    rows from it.
    Host-bound outputs take turns in one page-locked buffer as large as the largest
    layer output (the next layer's input is uploaded before it is overwritten; the
    logits get their own array when smaller): the GPU stores the rows there itself
    (ops/host_rows.py). Locking fresh memory costs about as much as a layer (the kernel
    zeroes every page): it runs on a thread, piece by piece, from the start of the call
    when some output surely cannot fit the device, and each layer's segments run as
    soon as the pieces they write are locked. The layers sure to stream into that buffer
    get their host tables and compile on another thread from the start (overlapping the
    first input's upload and the layers before them; on a machine's first use the
    tables wait there for the host handlers' build).
    `log`, a callable taking a line, reports the chunk plan, each layer as it ends
    (where it ran, its seconds, those of its input's upload) and why a layer streams;
    the layers then run one after another.
    """
    _refuse_typed(program, "layerwise_logits")
    if not supports_layerwise(program.model):
        raise TypeError(f"{no_layerwise_form(program.model)}; use sampled_logits instead")
    if not (isinstance(offload, (bool, np.bool_)) or offload == "auto"):
        raise ValueError(f"offload must be False, True or 'auto', got {offload!r}")
    if budget_bytes is not None:
        at_least_one(budget_bytes, "budget_bytes")
    offload = offload if offload == "auto" else bool(offload)
    run = functools.partial(_layerwise_logits, program, variables, data, offload=offload,
                            log=log)
    if budget_bytes is not None:
        return run(budget_bytes)
    budget = chunk_budget(offload)
    return at_budget_or_base(run, budget, f"exact inference: the device ran out of memory "
                                          f"with chunks of {budget / 2**30:.2f} GiB of edge "
                                          f"rows; running again at "
                                          f"{BASE_BUDGET / 2**30:.0f} GiB")


def at_budget_or_base(run, budget: int, warning: str):
    """`run(budget)`; with a budget above BASE_BUDGET that runs the device out of
    memory, `run(BASE_BUDGET)` after warning `warning` (`unless_out_of_memory`)."""
    if budget <= BASE_BUDGET:
        return run(budget)
    return unless_out_of_memory(functools.partial(run, budget),
                                functools.partial(run, BASE_BUDGET), warning)


def unless_out_of_memory(first, then, warning: str):
    """`first()`, its device work finished; where that runs the device out of memory,
    `then()` after warning `warning` (UserWarning). Other errors are raised."""
    try:
        return jax.block_until_ready(first())
    except jax.errors.JaxRuntimeError as error:
        if not is_out_of_memory(error):
            raise
    warnings.warn(warning, LibraryWarning, stacklevel=3)
    return then()


def chunk_budget(offload) -> int:
    """A chunk's edge-row bytes when the caller sets none: BASE_BUDGET where layers may
    stream to the host (`offload` True or "auto") or the device does not say what is
    free (CPU), else an eighth of the free memory rounded down to a power of two (so
    that evaluations a few bytes apart plan, and compile, the same chunks), between
    BASE_BUDGET and MAX_BUDGET. Fewer, larger chunks pay: products-like's exact
    inference took 0.083 s at 4 GiB and 0.099 s at 1 GiB in bfloat16 (H200,
    docs/benchmarks.md)."""
    free = device_free_bytes() if offload is False else None
    return BASE_BUDGET if free is None else eighth_as_power_of_two(free, BASE_BUDGET,
                                                                   MAX_BUDGET)


def _layerwise_logits(program: StepProgram, variables, data: DeviceData, budget_bytes: int, *,
                      offload: bool | str, log):
    """`layerwise_logits` at a chunk budget of `budget_bytes` (`offload` checked)."""
    variables = jax.tree_util.tree_map(  # host leaves uploaded once, not with every block
        lambda x: x if isinstance(x, jax.Array) else jax.device_put(x), variables)
    model = program.model
    h = source = model_inputs(program, variables, data.features)
    # (gat's averaged output heads gather each head's classes: wider than hidden, maybe)
    widest = max(h.shape[1], getattr(model, "hidden", 0),
                 getattr(model, "output_heads", 1) * getattr(model, "num_classes", 0))
    outs = _layer_outputs(program, variables, h, data) if offload else []
    nbytes = [o.size * o.dtype.itemsize for o in outs]
    # the first input takes device memory unless it is there already or read from the host
    first = 0 if isinstance(h, jax.Array) or is_host_resident(h) else h.size * h.dtype.itemsize
    sure = _sure_layers(offload, nbytes, [first] + nbytes[:-1], budget_bytes)
    num_layers = layer_count(model)
    # A buffer surely needed starts locking (on its thread) first of all, while the
    # chunks are planned and the first input uploads; the layers that surely stream
    # into it compile on another thread meanwhile.
    buffer = _host_buffer(max(nbytes), log) if any(sure) else None
    t0 = time.perf_counter()
    plan = plan_chunks(data.graph.indptr, widest, budget_bytes)
    if log:
        log(f"exact inference: {plan.num_chunks:,} chunks a layer, of {plan.rows:,} rows and "
            f"{plan.edge_capacity:,} edge slots (chunk budget {budget_bytes / 2**30:.2f} "
            f"GiB), planned in {time.perf_counter() - t0:.2f} s")
    # each layer's input as the compiler sees it (a host table is part of the program)
    inputs = [h if is_host_resident(h) else jax.ShapeDtypeStruct(h.shape, h.dtype),
              *outs[:-1]]
    streams = {}  # layer -> future of `_prepared_stream`
    h_device = None
    try:
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            for layer in (i for i, surely in enumerate(sure) if surely):
                if _owns_memory(buffer, nbytes, layer, num_layers):
                    continue  # its own buffer is allocated when it runs, not locked early
                streams[layer] = pool.submit(
                    _prepared_stream, program, variables, inputs[layer], data.graph,
                    functools.partial(_stream_target, buffer, outs, nbytes, layer, log), layer,
                    plan)
            streamed = None
            for layer in range(num_layers):
                t0 = time.perf_counter()
                resident = streamed is None and (isinstance(h, jax.Array) or is_host_resident(h))
                hold = (_hold_output(outs[layer], h if streamed is None else streamed)
                        if offload == "auto" and layer not in streams and not resident else None)
                if streamed is not None:  # the previous layer's output, in the host buffer
                    h_device = uploaded(streamed)
                elif resident:
                    h_device = h
                else:
                    h_device = to_device(h)
                if offload or log:  # frees the host buffer for this layer's output, and lets
                    # the previous layer finish and release its input before free memory is read
                    h_device = jax.block_until_ready(h_device)
                del hold  # its room, below the input, is where the output goes
                t1 = time.perf_counter()
                upload, h, streamed = t1 - t0, None, None
                if offload is not True and layer not in streams:
                    h = _device_layer(program, variables, h_device, data.graph, layer, plan,
                                      need=(nbytes[layer], budget_bytes) if offload else None,
                                      log=log)
                if h is None:
                    t1, compiled = time.perf_counter(), None
                    if layer in streams:
                        memory, out, made = streams.pop(layer).result()
                        compiled = made, time.perf_counter() - t1
                    else:
                        if buffer is None:
                            buffer = _host_buffer(max(nbytes), log)
                        memory, out = _stream_target(buffer, outs, nbytes, layer, log)
                    streamed = _offloaded_layer(program, variables, h_device, data.graph, layer,
                                                plan, out, log, memory.ready, compiled)
                    h = out.array
                h_device = None  # freed before the next layer's input is uploaded
                if log:
                    jax.block_until_ready(h)
                    log(f"exact inference: layer {layer + 1} of {num_layers} "
                        f"{'streamed to the host' if streamed is not None else 'on the device'} "
                        f"in {time.perf_counter() - t1:.2f} s, its input uploaded in "
                        f"{upload:.2f} s")
    finally:  # the programs read a host table while it lives (by its number): one made
        # here (features and embedding joined) outlives them, whether the layers end (the
        # last output) or one fails (its input, which the first layer's program made)
        if is_host_resident(source):
            jax.block_until_ready((h, h_device))
    return h


def _hold_output(out: jax.ShapeDtypeStruct, source) -> jax.Array | None:
    """An array as large as a layer's output `out`, taken before the layer's input
    (`source`, on the host) is uploaded, where one free block holds both: dropped after
    the upload, it leaves its room below the input, and the layer's output, allocated
    next, fits there (the allocator takes the smallest free block that holds it). The
    input, dropped after the layer, then frees room next to the free end, not a hole
    between the output and whatever lay below (papers100m-like on an H200: after layer
    1, 67.7 GiB free, in blocks of at most 41.2 GiB: layer 2's 53 GiB streamed).
    None where the allocator does not say (CPU) or has no such block."""
    block = device_largest_free_block()
    size = out.size * out.dtype.itemsize
    if block is None or block < size + source.nbytes:
        return None
    return jnp.zeros(out.shape, out.dtype)


def _owns_memory(buffer: PinnedBuffer, nbytes: list, layer: int, num_layers: int) -> bool:
    """Whether layer `layer` streams into a buffer of its own: the logits, when smaller
    than the shared buffer (holding no larger one)."""
    return layer == num_layers - 1 and nbytes[layer] < buffer.nbytes


def _stream_target(buffer: PinnedBuffer, outs: list, nbytes: list, layer: int,
                   log) -> tuple[PinnedBuffer, HostTable]:
    """(the memory layer `layer` streams into: the shared buffer, or its own
    (`_owns_memory`); the host table over its first bytes that the layer fills)."""
    memory = (_host_buffer(nbytes[layer], log)
              if _owns_memory(buffer, nbytes, layer, len(nbytes)) else buffer)
    array = memory.array[:nbytes[layer]].view(outs[layer].dtype).reshape(outs[layer].shape)
    return memory, HostTable(array)


def _sure_layers(offload, nbytes: list, inputs: list, budget_bytes: int) -> list:
    """Per layer, whether it surely streams to the host: every layer with `offload`
    True; with "auto", those whose output, input (`inputs`: the bytes it adds to the
    device) and chunk budget exceed what the device has free before any layer's input is
    on it (free memory only shrinks from there)."""
    if offload is True:
        return [True] * len(nbytes)
    free = device_free_bytes() if offload == "auto" else None
    return [free is not None and b + i + budget_bytes > free for b, i in zip(nbytes, inputs)]


def _host_buffer(nbytes: int, log) -> PinnedBuffer:
    """A `PinnedBuffer` of `nbytes` (locking on its thread), reported to `log`."""
    buffer = PinnedBuffer(nbytes)
    if log:
        log(f"exact inference: host buffer of {nbytes / 2**30:.1f} GiB"
            f"{', page-locking on a thread' if buffer.locked else ''}")
    return buffer


def model_inputs(program: StepProgram, variables, features):
    """float[N, d (+ dim)]: every node's input row, its features followed by its
    embedding with one (`program.embedding`); on the host where `features` are."""
    if program.embedding is None:
        return features
    table = variables["embedding"]
    if is_host_resident(features):  # a new table (uncached): features and embedding rows
        host = host_table(features)
        rows = np.asarray(table).astype(features.dtype)
        if host.position is not None:  # embedding rows laid out as the feature rows are
            laid = np.empty_like(rows)
            laid[np.asarray(host.position)] = rows
            rows = laid
        return HostTable(np.concatenate([host.array, rows], axis=1), host.position,
                         _checked=True)
    rows = table.shape[0]  # a table split over devices has padding rows past the nodes
    if isinstance(features, jax.Array):
        return jnp.concatenate([features[:rows], table.astype(features.dtype)], axis=1)
    return np.concatenate([features[:rows], np.asarray(table).astype(features.dtype)], axis=1)


def _device_layer(program, variables, h, graph, layer: int, plan: ChunkPlan, *, need,
                  log=None):
    """Layer `layer` of every row on the device. With `need` (its output's bytes, the
    chunk budget): None, without trying, when fewer bytes are free than both or no free
    block holds the output (free memory in pieces: an attempt would wait out the
    allocator's retries before failing); None when the device runs out of memory."""
    run = functools.partial(_layer_rows, program, variables, h, graph, 0, layer=layer,
                            plan=plan, length=graph.num_nodes)
    if need is None:
        return run()
    free, block = device_free_bytes(), device_largest_free_block()
    if (free is not None and free < sum(need)) or (block is not None and block < need[0]):
        if log:
            log(f"exact inference: layer {layer + 1} streams: its output needs "
                f"{need[0] / 2**30:.1f} GiB in one piece and a chunk {need[1] / 2**30:.1f} "
                f"GiB; {_gib(free)} free, the largest free block {_gib(block)}")
        return None
    t0 = time.perf_counter()
    try:
        return jax.block_until_ready(run())
    except jax.errors.JaxRuntimeError as error:
        if not is_out_of_memory(error):
            raise
        if log:
            log(f"exact inference: layer {layer + 1} ran out of device memory after "
                f"{time.perf_counter() - t0:.2f} s; it streams")
        return None


def _gib(nbytes: int | None) -> str:
    return "unknown" if nbytes is None else f"{nbytes / 2**30:.1f} GiB"


def halving_batches(run, batch_size: int, what: str, items: int, rounded: bool = False):
    """`run(batch, limit)` at `batch_size` but at most `items` (the seeds evaluated:
    buffers follow the batch, and `--eval-batch-size 99999999999` once ran the host out
    of memory), run again at half the batch (with a warning) while the device runs out
    of memory: an evaluation batch of `eval_batch_size` seeds samples levels and edges in
    proportion, and a wide typed model (R-GAT over 1024-wide features) can need more
    than the training batch left free. `limit` is the most a served request's batch is
    rounded up to (`serving_items`): `batch_size`, then the halved batch itself, which
    rounding up would give most of the halving back. `run` must finish its device work
    (the error surfaces only then). Other errors, and running out at one seed, raise.
    `rounded`: `run` rounds a batch as served requests are (`served_batch`), which the
    warning names."""
    limit, batch_size = batch_size, max(1, min(batch_size, items))
    while True:
        try:
            return run(batch_size, limit)
        except jax.errors.JaxRuntimeError as error:
            if not is_out_of_memory(error) or batch_size == 1:
                raise
            ran = served_batch(batch_size, limit) if rounded else batch_size
            warnings.warn(f"{what}: the device ran out of memory at {ran} seeds a batch; "
                          f"running again at {batch_size // 2}", LibraryWarning,
                          stacklevel=2)
            batch_size //= 2
            limit = batch_size


def sampled_logits(program: StepProgram, variables, data: DeviceData, nodes, *,
                   batch_size: int, seed: int = 0, bucketed: bool = False) -> jax.Array:
    """float[len(nodes), classes]: logits from sampled neighbourhoods (program's fanouts),
    `batch_size` nodes at a time, at most all of them (fewer where the device runs out:
    `halving_batches`).

    `bucketed` (requests of varying sizes, `zg.predict`): a batch below `batch_size`
    and the number of steps are rounded up to shared sizes (`serving_items`: a power of
    two, and under 25 % more), with empty rows and steps, so that every request size
    does not compile a program of its own. Each node's sample is the same either way,
    and in any request (its id draws it: `EVAL_STEP`)."""
    return sampled_parts(program, variables, data, [nodes], batch_size=batch_size,
                         seed=seed, bucketed=bucketed)[0]


def sampled_parts(program: StepProgram, variables, data: DeviceData, parts, *,
                  batch_size: int, seed: int = 0, bucketed: bool = False) -> list:
    """`sampled_logits` of each node array of `parts` (a dataset's splits), each equal
    to what that call gives for it alone, from one compiled program: the batch is at
    most the largest part's nodes, and every part runs in calls of the same number of
    batches (`step_calls`), so that splits of different sizes do not compile a pass
    each."""
    _refuse_typed(program, "sampled_logits")
    parts = [node_ids("nodes", nodes, data.graph.num_nodes) for nodes in parts]
    batch_size, seed = at_least_one(batch_size, "batch_size"), key_seed(seed)

    def run(batch: int, limit: int) -> list:
        padded, batch, steps = padded_parts(parts, batch, limit, bucketed)
        env = conservative(batch, program.sampler.slots, data.graph.num_nodes)
        call = lambda chunk: _sampled_pass(program, variables, data, chunk,
                                           jnp.uint32(seed), envelope=env)
        return jax.block_until_ready([
            jnp.concatenate(in_calls(call, rows, batch, steps))[: nodes.shape[0]]
            for nodes, rows in zip(parts, padded)])

    return halving_batches(run, batch_size, "sampled evaluation",
                           max(nodes.shape[0] for nodes in parts), rounded=bucketed)


def in_calls(call, padded, batch: int, steps: int) -> list[jax.Array]:
    """`call(rows)` (a sampled pass: [steps, batch, ...] outputs of the batches of
    `rows`) over the batches of `padded`, `steps` a call (`step_calls`), every call
    queued before any is read: [steps * batch, ...] each."""
    return [call(rows).reshape(steps * batch, -1)
            for rows in step_calls(padded, batch, steps)]


def _refuse_typed(program: StepProgram, name: str) -> None:
    """TypeError naming `zg.predict` for a typed graph's program, which `name` (a
    homogeneous graph's evaluation) cannot run."""
    target = getattr(program.task, "seed_type", None)
    if target is None:
        return
    said = f"{name} evaluates a graph of one node type; this run's graph is typed: "
    if getattr(program.task, "name", None) == "link":  # embeddings of either end
        ends = " or ".join(map(repr, target if isinstance(target, tuple) else (target,)))
        raise TypeError(said + f"zg.predict(result, nodes, node_type=T) gives the "
                        f"embeddings of its nodes of type T ({ends})")
    raise TypeError(said + f"zg.predict(result, nodes) gives its {target!r} nodes' logits")


@jit_per_object(static_argnames=("envelope",))
def _sampled_pass(program, variables, data, padded, seed, *, envelope: Envelope):
    """The logits of each batch of `padded`. Plain jitted code outside any mesh:
    features are gathered unsplit (XLA's partitioner moves the rows of a row-sharded
    table)."""
    program = dataclasses.replace(program, parallel=None)

    def step(_, s):
        mb = sample_step(data.graph, padded, s, seed=seed, epoch=EVAL_EPOCH,
                         batch_size=envelope.batch_size, config=program.sampler,
                         envelope=envelope, kernels=program.kernels, key_step=EVAL_STEP).mb
        logits, _ = program.apply_model(variables, data, mb, train=False)
        return None, logits

    steps = padded.shape[0] // envelope.batch_size
    return jax.lax.scan(step, None, jnp.arange(steps, dtype=jnp.int32))[1]


@jax.jit
def _rows(table, ids):
    """`table[ids]` as one program: eagerly, indexing compiles each of its ~6 ops (index
    wrapping, broadcasts, the gather) for every new shape."""
    return table[ids]


@dataclasses.dataclass(frozen=True, eq=False)
class Predictor:
    """A trained model's output rows for a task's evaluation (tasks/base.py's
    `Predictor`): exact layer-wise when `mode` is "full" and the model supports it
    (computed once, for every node), else sampled with the training fanouts,
    `batch_size` nodes per step."""

    program: StepProgram
    variables: dict
    data: DeviceData
    mode: str = "full"
    batch_size: int = 4096
    seed: int = 0
    bucketed: bool = False  # requests of varying sizes (`sampled_logits`)

    @functools.cached_property
    def exact(self) -> jax.Array | None:
        """float[N, ...]: every node's exact output, or None when evaluation samples."""
        if self.mode == "full" and supports_layerwise(self.program.model):
            return layerwise_logits(self.program, self.variables, self.data)
        return None

    def outputs(self, nodes) -> jax.Array:
        if self.exact is not None:
            return _rows(self.exact, jnp.asarray(nodes))
        return sampled_logits(self.program, self.variables, self.data, nodes,
                              batch_size=self.batch_size, seed=self.seed,
                              bucketed=self.bucketed)

    def split_outputs(self, parts) -> list:
        if self.exact is not None:
            return [self.outputs(nodes) for nodes in parts]
        return sampled_parts(self.program, self.variables, self.data, parts,
                             batch_size=self.batch_size, seed=self.seed,
                             bucketed=self.bucketed)

    def all_outputs(self) -> jax.Array:
        if self.exact is not None:
            return self.exact
        return self.outputs(np.arange(self.data.graph.num_nodes, dtype=np.int32))


def evaluate_splits(program: StepProgram, variables, data: DeviceData, dataset, *,
                    mode: str = "full", batch_size: int = 4096, seed: int = 0) -> dict:
    """The node metrics of each split of `dataset`: {"train_acc", "val_acc",
    "test_acc"} for class labels, `tasks.node.target_metrics` for float targets.

    `mode`: "full" (exact layer-wise, for models that support it; else sampled),
    "sampled" (the training fanouts, `batch_size` nodes per step) or "none" ({}).
    The run's own node task scores it (its loss, a user's included); a program of
    another task is scored as the dataset's targets' default node task would be.
    """
    if mode == "none":
        return {}
    _refuse_typed(program, "evaluate_splits")
    task = program.task if isinstance(program.task, NodeTask) else node_task(None, dataset)
    return task.evaluate(Predictor(program, variables, data, mode, batch_size, seed), dataset)


evaluate_targets = evaluate_splits  # its former name for float targets: one function now


def node_embeddings(program: StepProgram, variables, data: DeviceData, *, mode: str = "full",
                    batch_size: int = 4096, seed: int = 0):
    """float[N, d]: every node's output row (a link encoder's embedding).

    `mode` "full" computes it layer-wise exact (where the model supports it), "sampled"
    from neighbourhoods sampled with the program's fanouts, `batch_size` nodes a step,
    the sampling keyed by `seed`."""
    _refuse_typed(program, "node_embeddings")
    return Predictor(program, variables, data, mode, batch_size, seed).all_outputs()
