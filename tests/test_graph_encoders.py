"""OGB-style categorical encoders and the per-graph pooling (nn/graph_models.py): the
multi-hot product and the lookups used above MULTI_HOT_LIMIT categories both give the
sum of one table row per column, and each table row's gradient is the sum of the
output's gradient over the rows that read it; pooling half-precision rows sums them
in float32."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from zerognn_jax._src.nn.graph_models import (
    MULTI_HOT_LIMIT,
    CategoricalEncoder,
    Graphs,
    broadcast,
    pool,
)


@pytest.mark.parametrize("vocab", [(119, 4, 12), (MULTI_HOT_LIMIT, 3)],
                         ids=["multi-hot", "lookup"])
def test_encoder_sums_one_row_per_column(vocab):
    rs = np.random.default_rng(0)
    ids = np.stack([rs.integers(0, v, 40) for v in vocab], axis=1).astype(np.int32)
    enc = CategoricalEncoder(vocab, 6)
    params = enc.init(jax.random.key(0), ids)
    out = np.asarray(enc.apply(params, ids))
    tables = [np.asarray(params["params"][f"column{k}"]["embedding"])
              for k in range(len(vocab))]
    want = sum(t[ids[:, k]] for k, t in enumerate(tables))
    np.testing.assert_allclose(out, want, rtol=1e-6, atol=1e-6)
    w = rs.normal(size=out.shape).astype(np.float32)
    grads = jax.jit(jax.grad(lambda p: (enc.apply(p, ids) * w).sum()))(params)["params"]
    for k, v in enumerate(vocab):  # each row's gradient: the sum of w over its uses
        want = np.zeros((v, 6), np.float32)
        np.add.at(want, ids[:, k], w)
        np.testing.assert_allclose(np.asarray(grads[f"column{k}"]["embedding"]), want,
                                   rtol=1e-5, atol=1e-5)


def test_pooling_half_precision_rows_accumulates_in_float32():
    # 600 nodes in graph 0, 1 in graph 1, the padding graph empty: summed in bfloat16
    # the ones would stop at 256 (256 + 1 rounds back to 256).
    n_node = np.array([600, 1, 0], np.int32)
    node_graph = jnp.asarray(np.repeat(np.arange(3), n_node), jnp.int32)
    graphs = Graphs(nodes=None, edges=None, senders=None, receivers=None,
                    n_node=jnp.asarray(n_node), n_edge=None, globals=None,
                    node_graph=node_graph, node_mask=None, edge_mask=None, graph_mask=None)
    h = jnp.ones((601, 2), jnp.bfloat16)
    for how, want in (("sum", [600, 1, 0]), ("mean", [1, 1, 0]), ("max", [1, 1, 0])):
        out = pool(h, graphs, how)
        assert out.dtype == jnp.bfloat16
        np.testing.assert_array_equal(np.asarray(out, np.float32)[:, 0], want)
    # integer rows are pooled as they are: a mean of ids stays a true division
    mean = pool(jnp.arange(601, dtype=jnp.int32)[:, None], graphs, "mean")
    np.testing.assert_allclose(np.asarray(mean)[:, 0], [299.5, 600, 0])
    rows = jnp.ones((3, 2), jnp.bfloat16)
    assert broadcast(rows, graphs).dtype == jnp.bfloat16
    grad = jax.grad(lambda r: broadcast(r, graphs).astype(np.float32).sum())(rows)
    np.testing.assert_array_equal(np.asarray(grad, np.float32)[:, 0], [600, 1, 0])
