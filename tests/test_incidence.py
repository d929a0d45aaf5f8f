"""The edge/node sums of packed graphs (ops/incidence.py): the fixed-width (ELL) form
against the segment_sum reference, forward and gradients, on random packed graphs with
isolated nodes, padding edges and nodes at the row width."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from zerognn_jax._src.ops.incidence import (
    Incidence,
    edges_to_nodes,
    edges_to_nodes_reference,
    nodes_to_edges,
    nodes_to_edges_reference,
)

NODES, EDGES, REAL, FEATURES = 12, 24, 17, 5


def random_incidence(seed: int, width: int):
    """Edges of 17 real edge slots (7 padding slots joined to the last node) and each
    node's ELL row of its live edges. Node 0 has `width` incoming edges; nodes 10 and
    11 (padding) have none."""
    rng = np.random.default_rng(seed)
    ends = np.full(EDGES, NODES - 1, np.int32)
    ends[:width] = 0
    ends[width:REAL] = rng.integers(1, 10, REAL - width)
    live = np.arange(EDGES) < REAL
    slots = np.full((NODES, width), EDGES, np.int32)
    for v in range(NODES):
        mine = np.flatnonzero(live & (ends == v))
        assert mine.size <= width  # rows at most `width` wide, as packing guarantees
        slots[v, :mine.size] = rng.permutation(mine)
    return ends, live, slots


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_ell_sums_and_gradients_match_segment_sum(dtype):
    ends, live, slots = random_incidence(0, width=6)
    ell = Incidence(jnp.asarray(ends), jnp.asarray(live), jnp.asarray(slots))
    ref = ell._replace(slots=None)
    keys = jax.random.split(jax.random.PRNGKey(1), 3)
    data = jax.random.normal(keys[0], (EDGES, FEATURES)).astype(dtype)
    h = jax.random.normal(keys[1], (NODES, FEATURES)).astype(dtype)
    w = jax.random.normal(keys[2], (NODES, FEATURES)).astype(dtype)

    def loss(inc, data, h):  # both ops and both gradients
        out = edges_to_nodes(jnp.tanh(data) * nodes_to_edges(h, inc), inc, NODES)
        return jnp.sum((out * w).astype(jnp.float32))

    tol = dict(rtol=1e-6 * 4, atol=1e-6) if dtype == jnp.float32 else dict(rtol=2e-2, atol=2e-2)
    run = jax.jit(jax.value_and_grad(loss, argnums=(1, 2)))
    (want, want_g), (got, got_g) = run(ref, data, h), run(ell, data, h)
    np.testing.assert_allclose(got, want, **tol)
    for a, b in zip(got_g, want_g):
        np.testing.assert_allclose(np.asarray(a, np.float32), np.asarray(b, np.float32), **tol)
    # eagerly too, and each op alone against its reference
    np.testing.assert_allclose(np.asarray(edges_to_nodes(data, ell, NODES), np.float32),
                               np.asarray(edges_to_nodes_reference(data, ref, NODES),
                                          np.float32), **tol)
    np.testing.assert_array_equal(nodes_to_edges(h, ell), nodes_to_edges_reference(h, ref))
    assert not np.asarray(edges_to_nodes(data, ell, NODES))[NODES - 2:].any()  # degree 0


def test_rows_must_match_the_nodes():
    ends, live, slots = random_incidence(2, width=6)
    inc = Incidence(jnp.asarray(ends), jnp.asarray(live), jnp.asarray(slots))
    with pytest.raises(ValueError, match="12 node rows, the output 13"):
        edges_to_nodes(jnp.zeros((EDGES, 1)), inc, NODES + 1)


@pytest.mark.parametrize("backend, batch, expected", [
    ("gpu", 32, "segment"), ("gpu", 127, "segment"), ("gpu", 128, "ell"),
    ("gpu", 256, "ell"), ("cpu", 256, "segment")])
def test_auto_aggregation_follows_backend_and_batch_size(monkeypatch, backend, batch,
                                                         expected):
    from zerognn_jax._src.training.tasks import graph

    monkeypatch.setattr(graph.jax, "default_backend", lambda: backend)
    assert graph.resolve_aggregation("auto", batch) == expected
    assert graph.resolve_aggregation("segment", 256) == "segment"
    assert graph.resolve_aggregation("ell", 8) == "ell"


def test_segment_sums_of_half_precision_rows_accumulate_in_float32():
    # 600 live edges into node 0: summed in bfloat16 the ones would stop at 256
    # (256 + 1 rounds back to 256), forward and in the gather's gradient
    inc = Incidence(jnp.zeros(600, jnp.int32), jnp.ones(600, bool))
    out = edges_to_nodes(jnp.ones((600, 2), jnp.bfloat16), inc, 2)
    assert out.dtype == jnp.bfloat16
    np.testing.assert_array_equal(np.asarray(out, np.float32)[:, 0], [600, 0])
    h = jnp.ones((2, 2), jnp.bfloat16)
    grad = jax.grad(lambda h: nodes_to_edges(h, inc).astype(jnp.float32).sum())(h)
    assert grad.dtype == jnp.bfloat16
    np.testing.assert_array_equal(np.asarray(grad, np.float32)[:, 0], [600, 0])


def test_integer_rows_are_gathered_and_summed_as_they_are():
    # 2**24 + 1 has no float32 value: a detour through float32 would round it
    inc = Incidence(jnp.zeros(2, jnp.int32), jnp.ones(2, bool))
    big = 2**24 + 1
    h = jnp.array([[big], [0]], jnp.int32)
    np.testing.assert_array_equal(nodes_to_edges(h, inc), [[big], [big]])
    out = edges_to_nodes(jnp.full((2, 1), big, jnp.int32), inc, 2)
    assert out.dtype == jnp.int32
    np.testing.assert_array_equal(out, [[2 * big], [0]])
