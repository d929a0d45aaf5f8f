"""Row offsets past 2**31 in JAX's default 32-bit mode (uint32 offsets, data/graph.py).

A graph with 2**31 edges does not fit a test, so every reader gets a small graph seen
through a synthetic offset base: its offsets are shifted by `BASE` (past 2**31) and
stored as uint32, and its edge arrays are wrapped so that edge id `BASE + e` reads
entry e. The wrapper also checks that every edge id reaching it is uint32: an id built
in int32 would wrap negative past 2**31 and index from the end of the array.
"""

from __future__ import annotations

import dataclasses
import re
import weakref

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from conftest import random_graph

from zerognn_jax._src.data.graph import (
    CSRGraph,
    csr_from_arrays,
    offset_dtype,
    take_edges,
    validate_csr,
)
from zerognn_jax._src.nn.models import make_model
from zerognn_jax._src.pallas import sample as pk_sample
from zerognn_jax._src.sampling import labor, uniform, weighted
from zerognn_jax._src.sampling.envelope import conservative
from zerognn_jax._src.sampling.minibatch import SamplerConfig, sample_minibatch
from zerognn_jax._src.training import evaluate
from zerognn_jax._src.training.evaluate import layerwise_logits
from zerognn_jax._src.training.host import HostEngine
from zerognn_jax._src.training.program import DeviceData, StepProgram, init_state

BASES = [2**31 + 12_345, 2**32 - 70_000]  # past int32; near the top of uint32
# Float results: the plain and the shifted graph compile to different programs, which XLA:GPU
# may fuse and tile differently. Float results are then compared under "highest" matmul
# precision (GPU float32 matmuls default to TF32, ~1e-3 relative) at float32 tolerances
# (~1e-6 relative, scaled by the sqrt of the reduction length): sums may run in another
# order (GEMM tiling, atomic scatter-adds), not over other edges.


@jax.tree_util.register_pytree_node_class
@dataclasses.dataclass(frozen=True)
class ShiftedEdges:
    """An edge array [E] read at edge ids base .. base + E - 1 (uint32 ids only)."""

    array: jax.Array
    base: int

    @property
    def shape(self):
        return (self.base + self.array.shape[0],)

    @property
    def dtype(self):
        return self.array.dtype

    def __getitem__(self, edge):
        assert jnp.dtype(edge.dtype) == jnp.uint32, f"edge ids built as {edge.dtype}"
        return self.array[edge - jnp.uint32(self.base)]

    def tree_flatten(self):
        return (self.array,), self.base

    @classmethod
    def tree_unflatten(cls, base, children):
        return cls(children[0], base)


def _shifted(graph: CSRGraph, base: int) -> CSRGraph:
    indptr = (np.asarray(graph.indptr, np.int64) + base).astype(np.uint32)
    weights = None if graph.weights is None else ShiftedEdges(jnp.asarray(graph.weights), base)
    return CSRGraph(jnp.asarray(indptr), ShiftedEdges(jnp.asarray(graph.indices), base),
                    weights)


@pytest.fixture(scope="module")
def graph():
    g = random_graph(300, 2_000, seed=3, isolated=5)
    return g if g.max_degree() > 16 else pytest.fail("want rows above the fanout")


def _frontier(n: int, c: int = 64):
    frontier = jnp.asarray(np.random.default_rng(0).permutation(n)[:c], jnp.int32)
    return frontier, jnp.arange(c) < c - 7


def test_offset_dtype_boundaries():
    assert offset_dtype(2**31 - 1) == np.int32
    assert offset_dtype(2**31) == np.uint32
    assert offset_dtype(2**32 - 1) == np.uint32
    with pytest.raises(ValueError, match=r"4,294,967,296 directed edges.*jax_enable_x64"):
        offset_dtype(2**32)


def test_small_graphs_keep_int32_and_unsigned_decreases_are_caught():
    indptr = np.array([0, 2, 3], np.uint32)
    g = csr_from_arrays(indptr, np.array([1, 0, 0], np.int32))
    assert g.indptr.dtype == np.int32  # narrowed: this graph has 3 edges
    with pytest.raises(ValueError, match="decreases at row 1"):
        validate_csr(np.array([0, 2, 1, 3], np.uint32), np.zeros(3, np.int32))


@pytest.mark.parametrize("base", BASES)
@pytest.mark.parametrize("opts", [{}, {"replace": True}, {"all_neighbors": True}])
def test_uniform_reads_shifted_offsets(graph, base, opts):
    fanout = graph.max_degree() if opts.get("all_neighbors") else 6
    frontier, valid = _frontier(graph.num_nodes)
    fn = jax.jit(lambda g: uniform.sample_neighbors_reference(
        g.indptr, g.indices, frontier, valid, jnp.uint32(5), fanout, **opts))
    want, got = fn(graph.to_device()), fn(_shifted(graph, base))
    np.testing.assert_array_equal(np.asarray(got[0]), np.asarray(want[0]))
    np.testing.assert_array_equal(np.asarray(got[1]), np.asarray(want[1]))


@pytest.mark.parametrize("base", BASES)
@pytest.mark.parametrize("replace", [False, True])
def test_weighted_reads_shifted_offsets(graph, base, replace):
    w = np.random.default_rng(1).random(graph.num_edges).astype(np.float32)
    table = weighted.cumulative_table(graph.indptr, w)
    plain = graph._replace(weights=table)
    frontier, valid = _frontier(graph.num_nodes)
    fn = jax.jit(lambda g: weighted.sample_weighted_reference(
        g.indptr, g.indices, g.weights, frontier, valid, jnp.uint32(9), 5, replace=replace,
        steps=weighted.search_steps(graph.max_degree())))
    want, got = fn(plain.to_device()), fn(_shifted(plain, base))
    np.testing.assert_array_equal(np.asarray(got[0]), np.asarray(want[0]))
    np.testing.assert_array_equal(np.asarray(got[1]), np.asarray(want[1]))


@pytest.mark.parametrize("base", BASES)
def test_labor_reads_shifted_offsets(graph, base):
    frontier, valid = _frontier(graph.num_nodes)
    fn = jax.jit(lambda g: labor.sample_labor_reference(
        g.indptr, g.indices, frontier, valid, jnp.uint32(3), 4, slots=10, span=12))
    want, got = fn(graph.to_device()), fn(_shifted(graph, base))
    np.testing.assert_array_equal(np.asarray(got[0]), np.asarray(want[0]))


def test_minibatch_and_host_engine_read_shifted_offsets(graph):
    sampler = SamplerConfig((5, 3)).resolve(graph.max_degree())
    env = conservative(16, sampler.slots, graph.num_nodes)
    seeds, valid = jnp.arange(16, dtype=jnp.int32), jnp.ones(16, bool)
    fn = jax.jit(lambda g: sample_minibatch(g, seeds, valid, jnp.uint32(1), sampler,
                                            env.capacities))
    want, got = fn(graph.to_device()), fn(_shifted(graph, BASES[0]))
    for a, b in zip(jax.tree_util.tree_leaves(want), jax.tree_util.tree_leaves(got)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    program, data, variables = _program(graph)
    program = dataclasses.replace(program, sampler=sampler, batch_size=16)
    perm = jnp.arange(32, dtype=jnp.int32)
    shifted_data = data._replace(graph=_shifted(graph, BASES[0]))
    with jax.default_matmul_precision("highest"):  # see "Float results" above
        runs = [HostEngine(program).run_steps(  # a cache and a (donated) state each
            init_state(program, data, env, np.arange(32)), d, perm, 0, env, 2)[2]
            for d in (data, shifted_data)]
    np.testing.assert_allclose(runs[0]["loss"], runs[1]["loss"], rtol=1e-6)


def _program(graph):
    n = graph.num_nodes
    feats = jnp.asarray(np.random.default_rng(2).standard_normal((n, 6)), jnp.float32)
    data = DeviceData(graph.to_device(), feats, jnp.zeros(n, jnp.int32))
    model = make_model("sage", hidden=8, num_layers=2, num_classes=3, dropout=0.0)
    sampler = SamplerConfig((4, 4)).resolve(graph.max_degree())
    program = StepProgram(model, optax.sgd(0.1), sampler, 32, seed=0)
    env = conservative(32, sampler.slots, n)
    variables = {"params": init_state(program, data, env, np.arange(n)).params}
    return program, data, variables


@pytest.mark.parametrize("offload", [False, True])
def test_layerwise_inference_reads_shifted_offsets(graph, offload):
    program, data, variables = _program(graph)
    shifted = data._replace(graph=_shifted(graph, BASES[1]))
    with jax.default_matmul_precision("highest"):  # see "Float results" above
        want = layerwise_logits(program, variables, data, budget_bytes=4096)
        got = layerwise_logits(program, variables, shifted, budget_bytes=4096, offload=offload)
    # float32 sums over a row's neighbours (mean) and the widths (6, 8), in another order.
    tol = 1e-6 * np.sqrt(graph.max_degree())
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=tol, atol=tol)


@pytest.mark.parametrize("free, streamed", [((0,), [0, 1]), ((100_000, 8_000), [0]),
                                            ((None,), [])])
def test_layerwise_auto_offload_streams_what_does_not_fit(graph, monkeypatch, free,
                                                          streamed):
    """offload="auto" against the allocator's free bytes (the first figure read before
    any layer, the last one at every layer): nothing fits (every layer to the host), the
    hidden layer's 9,600 B plus the 4,096 B budget do not fit in 8,000 B but the logits'
    3,600 B do, or no figure (CPU: all on the device); the same logits each way."""
    program, data, variables = _program(graph)
    with jax.default_matmul_precision("highest"):  # see "Float results" above
        want = layerwise_logits(program, variables, data, budget_bytes=4096)
        figures = iter(free)
        monkeypatch.setattr(evaluate, "device_free_bytes", lambda: next(figures, free[-1]))
        layers, stream = [], evaluate._offloaded_layer
        monkeypatch.setattr(evaluate, "_offloaded_layer",
                            lambda *a: layers.append(a[4]) or stream(*a))
        got = layerwise_logits(program, variables, data, budget_bytes=4096, offload="auto")
    assert layers == streamed
    assert isinstance(got, np.ndarray) == (1 in streamed)  # the logits' layer
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-6, atol=1e-6)


def test_layerwise_auto_offload_streams_a_layer_that_runs_out_of_memory(graph, monkeypatch):
    """Free memory may lie in pieces: a layer whose device run fails for want of memory
    goes to the host instead; any other runtime error is raised."""
    program, data, variables = _program(graph)
    with jax.default_matmul_precision("highest"):  # see "Float results" above
        want = layerwise_logits(program, variables, data, budget_bytes=4096)
    layer_rows = evaluate._layer_rows

    def failing(message):
        calls = []

        def run(*args, layer, **kwargs):
            # Layer 0's first run (its device attempt; tracing for shapes aside) fails.
            if layer == 0 and not isinstance(args[2], jax.core.Tracer) and not calls:
                calls.append(layer)
                raise jax.errors.JaxRuntimeError(message)
            return layer_rows(*args, layer=layer, **kwargs)
        return run

    monkeypatch.setattr(evaluate, "_layer_rows", failing("RESOURCE_EXHAUSTED: out of memory"))
    with jax.default_matmul_precision("highest"):
        got = layerwise_logits(program, variables, data, budget_bytes=4096, offload="auto")
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-5, atol=1e-5)
    monkeypatch.setattr(evaluate, "_layer_rows", failing("INTERNAL: something else"))
    with pytest.raises(jax.errors.JaxRuntimeError, match="INTERNAL"):
        layerwise_logits(program, variables, data, budget_bytes=4096, offload="auto")


def test_layerwise_auto_offload_streams_an_output_no_free_block_holds(graph, monkeypatch):
    """Enough bytes free in all, but no free block as large as the hidden layer's 9,600 B
    output: that layer streams without being tried on the device (a try would wait out
    the allocator's retries), and says why; the logits' 3,600 B fit one and stay."""
    program, data, variables = _program(graph)
    with jax.default_matmul_precision("highest"):  # see "Float results" above
        want = layerwise_logits(program, variables, data, budget_bytes=4096)
        monkeypatch.setattr(evaluate, "device_free_bytes", lambda: 100_000)
        monkeypatch.setattr(evaluate, "device_largest_free_block", lambda: 5_000)
        tried, layer_rows = [], evaluate._layer_rows

        def device_run(*args, layer, **kwargs):
            if not isinstance(args[2], jax.core.Tracer):
                tried.append(layer)
            return layer_rows(*args, layer=layer, **kwargs)

        monkeypatch.setattr(evaluate, "_layer_rows", device_run)
        lines = []
        got = layerwise_logits(program, variables, data, budget_bytes=4096, offload="auto",
                               log=lines.append)
    assert tried == [1]
    assert any("layer 1 streams: its output needs 0.0 GiB in one piece" in line
               and "the largest free block 0.0 GiB" in line for line in lines)
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-6, atol=1e-6)


def test_layerwise_auto_offload_holds_an_uploaded_inputs_output_room_first(graph,
                                                                           monkeypatch):
    """A layer that may run on the device and uploads its input takes its output's room
    before the upload where one free block holds both (and gives it back before running,
    so that the output lands below the input); with no such block it takes none (and
    the guard streams the layer); the logits are the device run's either way."""
    program, data, variables = _program(graph)
    host = data._replace(features=np.asarray(data.features))  # layer 0 uploads its input
    n = graph.num_nodes
    with jax.default_matmul_precision("highest"):  # see "Float results" above
        want = layerwise_logits(program, variables, data, budget_bytes=4096)
        held, hold = [], evaluate._hold_output
        rooms, device_layer = [], evaluate._device_layer

        def spy(out, source):
            room = hold(out, source)
            held.append((out.shape, source.shape, room is not None))
            rooms.append(None if room is None else weakref.ref(room))
            return room

        def device_run(*args, **kwargs):  # the room is given back before the layer runs
            assert all(room is None or room() is None for room in rooms)
            return device_layer(*args, **kwargs)

        monkeypatch.setattr(evaluate, "_hold_output", spy)
        monkeypatch.setattr(evaluate, "_device_layer", device_run)
        monkeypatch.setattr(evaluate, "device_free_bytes", lambda: 10**9)
        out_bytes, in_bytes = n * 8 * 4, n * 6 * 4
        for block, holds in ((10**9, [((n, 8), (n, 6), True)]),  # layer 1 reads layer 0's
                             # output on the device; next: room for the output alone
                             (out_bytes + in_bytes - 1, [((n, 8), (n, 6), False)]),
                             # and for neither: both stream, and upload
                             (1_000, [((n, 8), (n, 6), False), ((n, 3), (n, 8), False)])):
            monkeypatch.setattr(evaluate, "device_largest_free_block", lambda b=block: b)
            held.clear()
            got = layerwise_logits(program, variables, host, budget_bytes=4096,
                                   offload="auto")
            np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-6,
                                       atol=1e-6)
            assert held == holds


def test_layerwise_offload_is_checked(graph):
    program, data, variables = _program(graph)
    with pytest.raises(ValueError, match="offload must be False, True or 'auto', got 'yes'"):
        layerwise_logits(program, variables, data, offload="yes")


def test_take_edges_reads_past_2_31_entries():
    """A real edge array past 2**31 entries (int8, built on the device: 2 GiB in all):
    NumPy-style indexing would narrow the uint32 ids to int32 and read entry 0 instead."""
    def build():  # a raw scatter: `.at[]` would narrow the ids the same way
        at = jnp.array([5, 2**31 + 5, 2**31 + 15], jnp.uint32)[:, None]
        dims = jax.lax.ScatterDimensionNumbers(update_window_dims=(),
                                               inserted_window_dims=(0,),
                                               scatter_dims_to_operand_dims=(0,))
        return jax.lax.scatter(jnp.zeros(2**31 + 16, jnp.int8), at,
                               jnp.array([3, 7, 9], jnp.int8), dims)

    values = jax.jit(build)()
    ids = jnp.array([[5, 2**31 + 5], [2**31 + 15, 0]], jnp.uint32)
    got = jax.jit(take_edges)(values, ids)
    np.testing.assert_array_equal(np.asarray(got), [[3, 7], [9, 0]])


def test_pallas_sampler_takes_uint32_offsets(graph):
    frontier, valid = _frontier(graph.num_nodes)
    indptr = jnp.asarray(graph.indptr, jnp.uint32)
    indices = jnp.asarray(graph.indices)
    args = (frontier, valid, jnp.uint32(11), 6)
    got = pk_sample.sample_neighbors(indptr, indices, *args, interpret=True)
    want = uniform.sample_neighbors_reference(jnp.asarray(graph.indptr), indices, *args)
    np.testing.assert_array_equal(np.asarray(got[0]), np.asarray(want[0]))
    np.testing.assert_array_equal(np.asarray(got[1]), np.asarray(want[1]))


def test_pallas_sampler_lowers_at_papers100m_size():
    """uint32 offsets and 3.23B indices: Triton gets 64-bit, zero-extended edge offsets."""
    sds = jax.ShapeDtypeStruct
    args = (sds((111_059_957,), jnp.uint32), sds((3_231_371_744,), jnp.int32),
            sds((1024,), jnp.int32), sds((1024,), jnp.bool_), sds((), jnp.uint32))
    fn = lambda *a: pk_sample.sample_neighbors(*a, 15)
    text = jax.jit(fn).trace(*args).lower(lowering_platforms=("cuda",)).as_text()
    assert "zerognn_sample_neighbors" in text
    assert re.search("extui", text), "edge ids are not zero-extended to 64-bit offsets"


def test_layerwise_offload_reports_each_layer_and_prepares_the_buffer_early(graph,
                                                                          monkeypatch):
    """`log` gets the buffer, the chunk plan, each layer's compile and its run; the buffer
    is prepared ahead, and the layers that stream into it compiled on a thread, only when
    some output surely cannot fit the device."""
    import threading

    program, data, variables = _program(graph)
    lines, makers = [], []
    target = evaluate._stream_target
    monkeypatch.setattr(evaluate, "_stream_target", lambda *a: makers.append(
        (a[3], threading.current_thread() is threading.main_thread())) or target(*a))
    layerwise_logits(program, variables, data, budget_bytes=4096, offload=True,
                     log=lines.append)
    # the hidden layer's host table (locked over the buffer: on a machine's first use it
    # waits for the handlers' build) was made on the compile thread, the logits' here
    assert makers == [(0, False), (1, True)]
    # (on a GPU the buffer lines go on: ", page-locking on a thread")
    assert [line.split(" in ")[0].split(",")[0] for line in lines] == [
        "exact inference: host buffer of 0.0 GiB", "exact inference: 38 chunks a layer",
        "exact inference: layer 1 compiled", "exact inference: layer 1 of 2 streamed to the host",
        "exact inference: host buffer of 0.0 GiB",  # the smaller logits' own
        "exact inference: layer 2 compiled", "exact inference: layer 2 of 2 streamed to the host"]
    plan = evaluate.plan_chunks(np.asarray(data.graph.indptr), 8, 4096)
    assert (f"{plan.num_chunks} chunks a layer, of {plan.rows} rows and "
            f"{plan.edge_capacity} edge slots (chunk budget 0.00 GiB), planned") in lines[1]
    assert "waited for the host buffer's locking" in lines[2]
    # the hidden layer, sure to stream into the shared buffer, compiled on a thread while
    # the input uploaded; the logits, streamed into their own later buffer, when they ran
    assert "on a thread" in lines[2] and "on a thread" not in lines[5]
    # sure to stream: output, input and budget beyond the device's free bytes
    monkeypatch.setattr(evaluate, "device_free_bytes", lambda: 13_000)
    assert evaluate._sure_layers("auto", [9_600, 3_600], [0, 9_600], 4_096) == [True, True]
    assert evaluate._sure_layers("auto", [9_600, 3_600], [400, 0], 4_096) == [True, False]
    assert evaluate._sure_layers("auto", [3_600], [0], 4_096) == [False]
    assert evaluate._sure_layers(False, [9_600], [0], 4_096) == [False]
    assert evaluate._sure_layers(True, [8], [0], 4_096) == [True]


@pytest.mark.parametrize("segment_chunks", [1, 3])
def test_streamed_layers_in_segments_equal_the_device_run(graph, monkeypatch, segment_chunks):
    """A streamed layer dispatched in segments of a few chunks (the last one moved back
    over the one before) stores every row once over: the same logits as on the device."""
    program, data, variables = _program(graph)
    with jax.default_matmul_precision("highest"):  # see "Float results" above
        want = layerwise_logits(program, variables, data, budget_bytes=4096)
        plan = evaluate.plan_chunks(np.asarray(data.graph.indptr), 8, 4096)
        assert plan.num_chunks % 3 and plan.num_chunks > 3  # segments that do not divide
        row_bytes = 8 * 4  # the widest output row: 8 float32 units
        monkeypatch.setattr(evaluate, "_SEGMENT_BYTES", segment_chunks * plan.rows * row_bytes)
        got = layerwise_logits(program, variables, data, budget_bytes=4096, offload=True)
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("dtype", [np.int64, np.uint32])
def test_chunk_plan_on_the_device_equals_the_host_plan(dtype):
    """Offsets on the device give the plan the host computes (largest windows included),
    for several widths, with no new compile per probed window size."""
    rs = np.random.default_rng(3)
    indptr = np.concatenate([[0], np.cumsum(rs.integers(0, 40, 997))]).astype(dtype)
    on_device = jnp.asarray(indptr.astype(np.uint32 if dtype == np.uint32 else np.int32))
    programs = evaluate._max_window._cache_size()
    for width in (1, 8, 64):
        assert evaluate.plan_chunks(on_device, width, 4096) == evaluate.plan_chunks(
            indptr, width, 4096)
    for rows in (1, 2, 500, 997):
        assert evaluate._window_edges(on_device, rows) == evaluate._window_edges(indptr, rows)
    assert evaluate._max_window._cache_size() - programs <= 1  # one for all window sizes
