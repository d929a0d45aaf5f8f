"""Masked batch normalisation (ops/batch_norm.py, nn/graph_models.MaskedBatchNorm)
against Flax's `nn.BatchNorm` given the same row mask: values, gradients, variables."""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import zerognn_jax as zg
from zerognn_jax._src.nn.graph_models import MaskedBatchNorm
from zerognn_jax._src.ops.batch_norm import masked_batch_norm


class FlaxMasked(nn.Module):
    """The reference: Flax's BatchNorm with the mask broadcast over features."""

    @nn.compact
    def __call__(self, x, mask, *, train: bool):
        bn = nn.BatchNorm(use_running_average=not train, momentum=0.9, epsilon=1e-5)
        return bn(x, mask=jnp.broadcast_to(mask[:, None], x.shape))


def _inputs(dtype, rows=60, features=7, seed=0):
    rs = np.random.default_rng(seed)
    x = jnp.asarray(rs.normal(2.0, 3.0, (rows, features)), dtype)
    mask = jnp.asarray(rs.random(rows) < 0.7)
    scale = jnp.asarray(rs.normal(1.0, 0.2, features), jnp.float32)
    bias = jnp.asarray(rs.normal(0.0, 0.2, features), jnp.float32)
    weights = jnp.asarray(rs.normal(size=(rows, features)), jnp.float32)
    return x, mask, scale, bias, weights


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_values_and_gradients_match_flax(dtype):
    x, mask, scale, bias, weights = _inputs(dtype)
    ref = nn.BatchNorm(use_running_average=False, momentum=0.9, epsilon=1e-5)
    stats = {"mean": jnp.zeros(7), "var": jnp.ones(7)}

    # every output read, the statistics' too (they feed the running averages)
    def flax_loss(x, scale, bias):
        y, new = ref.apply({"params": {"scale": scale, "bias": bias}, "batch_stats": stats},
                           x, mask=jnp.broadcast_to(mask[:, None], x.shape),
                           mutable=["batch_stats"])
        s = new["batch_stats"]
        return jnp.sum(y * weights) + 1.3 * jnp.sum(s["mean"]) + 0.7 * jnp.sum(s["var"]), y

    def our_loss(x, scale, bias):
        y, mean, var, _ = masked_batch_norm(x, mask, scale, bias, 1e-5)
        s = {"mean": 0.9 * stats["mean"] + 0.1 * mean, "var": 0.9 * stats["var"] + 0.1 * var}
        return jnp.sum(y * weights) + 1.3 * jnp.sum(s["mean"]) + 0.7 * jnp.sum(s["var"]), y

    (want, y_want), g_want = jax.value_and_grad(flax_loss, (0, 1, 2), has_aux=True)(
        x, scale, bias)
    (got, y_got), g_got = jax.value_and_grad(our_loss, (0, 1, 2), has_aux=True)(
        x, scale, bias)
    assert y_got.dtype == y_want.dtype == jnp.float32
    np.testing.assert_allclose(np.asarray(y_got), np.asarray(y_want), rtol=1e-6, atol=1e-5)
    np.testing.assert_allclose(float(got), float(want), rtol=1e-5)
    for a, b in zip(g_got, g_want):
        assert a.dtype == b.dtype
        tol = 1e-5 if dtype == jnp.float32 else 1e-2  # one bfloat16 rounding of dx
        np.testing.assert_allclose(np.asarray(a, np.float32), np.asarray(b, np.float32),
                                   rtol=tol, atol=tol)
    assert float(masked_batch_norm(x, mask, scale, bias, 1e-5)[3]) == int(np.sum(mask))
    # padding rows take no part in the statistics: changing them moves only themselves
    x2 = jnp.where(mask[:, None], x, 100.0).astype(dtype)
    y2 = masked_batch_norm(x2, mask, scale, bias, 1e-5)[0]
    np.testing.assert_array_equal(np.asarray(y2)[np.asarray(mask)],
                                  np.asarray(y_got)[np.asarray(mask)])


def test_module_keeps_flax_variables_and_running_averages():
    x, mask, *_ = _inputs(jnp.float32, seed=1)
    ours, ref = MaskedBatchNorm(), FlaxMasked()
    v_ours = ours.init(jax.random.key(0), x, mask, train=True)
    v_ref = ref.init(jax.random.key(0), x, mask, train=True)
    assert jax.tree_util.tree_structure(v_ours) == jax.tree_util.tree_structure(v_ref)
    # trained variables of one load in the other: perturb them, then run both ways
    v = jax.tree_util.tree_map(lambda a: a + 0.25, v_ref)
    for train in (True, False):
        y_ours, s_ours = ours.apply(v, x, mask, train=train, mutable=["batch_stats"])
        y_ref, s_ref = ref.apply(v, x, mask, train=train, mutable=["batch_stats"])
        np.testing.assert_allclose(np.asarray(y_ours), np.asarray(y_ref), rtol=1e-6,
                                   atol=1e-5)
        for a, b in zip(jax.tree_util.tree_leaves(s_ours), jax.tree_util.tree_leaves(s_ref)):
            np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-6, atol=1e-6)


def test_a_column_shift_before_the_norm_changes_no_output():
    """Why dense layers that feed a batch norm carry no bias (nn/graph_models.py): in
    training, a per-column shift of the input moves no output row, padding rows
    included, and its gradient is zero up to rounding."""
    x, mask, scale, bias, weights = _inputs(jnp.float32, seed=2)
    shift = jnp.asarray(np.random.default_rng(3).normal(0.0, 5.0, 7), jnp.float32)

    def loss(shift):
        y = masked_batch_norm(x + shift, mask, scale, bias, 1e-5)[0]
        return jnp.sum(y * weights)

    y0 = masked_batch_norm(x, mask, scale, bias, 1e-5)[0]
    y1 = masked_batch_norm(x + shift, mask, scale, bias, 1e-5)[0]
    np.testing.assert_allclose(np.asarray(y1), np.asarray(y0), atol=1e-4)
    grad = jax.grad(loss)(jnp.zeros(7))
    full = jax.grad(lambda x: jnp.sum(masked_batch_norm(x, mask, scale, bias, 1e-5)[0]
                                      * weights))(x)
    assert float(jnp.max(jnp.abs(grad))) < 1e-4 * float(jnp.max(jnp.abs(full))) * x.shape[0]


def test_no_masked_row_gives_finite_values_and_keeps_the_running_statistics():
    """A device whose share of a data-parallel epoch's last step holds no graph: finite
    outputs and gradients (Flax's are NaN), rows passed as x * scale + bias (not
    multiplied by rsqrt(epsilon), which a deep model's stack of them overflowed), and
    running statistics left as they were."""
    x, _, scale, bias, weights = _inputs(jnp.float32, seed=4)
    none = jnp.zeros(x.shape[0], bool)
    np.testing.assert_allclose(np.asarray(masked_batch_norm(x, none, scale, bias, 1e-5)[0]),
                               np.asarray(x * scale + bias), rtol=1e-6, atol=1e-6)

    def loss(x, scale, bias):
        return jnp.sum(masked_batch_norm(x, none, scale, bias, 1e-5)[0] * weights)

    assert float(masked_batch_norm(x, none, scale, bias, 1e-5)[3]) == 0.0
    value, grads = jax.value_and_grad(loss, (0, 1, 2))(x, scale, bias)
    assert np.isfinite(float(value))
    assert all(np.isfinite(np.asarray(g)).all() for g in grads)
    module = MaskedBatchNorm()
    v = module.init(jax.random.key(0), x, none, train=True)
    v = {**v, "batch_stats": jax.tree_util.tree_map(lambda a: a + 0.5, v["batch_stats"])}
    _, s = module.apply(v, x, none, train=True, mutable=["batch_stats"])
    for a, b in zip(jax.tree_util.tree_leaves(s), jax.tree_util.tree_leaves(v["batch_stats"])):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))



def test_a_deep_model_stays_finite_on_a_batch_without_graphs():
    """GIN-virtual 8 x 64 training on a device's share that holds only padding (as a
    packed batch: every padding edge joins the last padding node): the stack of
    normalisations (four a layer) and of sums over the padding edges keeps the padding
    rows finite, so the masked loss's gradient is finite and zero. (Multiplied by
    rsqrt(epsilon) in each normalisation, the rows reached 1.7e27 after 5 layers and NaN
    after 8.)"""
    rs = np.random.default_rng(5)
    rows, edges = 12, 256
    graphs = zg.Graphs(jnp.asarray(rs.normal(size=(rows, 9)), jnp.float32), None,
                       jnp.full(edges, rows - 1, jnp.int32),
                       jnp.full(edges, rows - 1, jnp.int32), jnp.array([0, 0, rows]),
                       jnp.array([0, 0, edges]), None, jnp.full(rows, 2, jnp.int32),
                       jnp.zeros(rows, bool), jnp.zeros(edges, bool), jnp.zeros(3, bool))
    model = zg.make_graph_model("gin-virtual", hidden=64, num_layers=8, out_dim=1,
                                dropout=0.0, readout="mean")
    variables = model.init(jax.random.key(0), graphs, train=False)

    def loss(params):
        out, _ = model.apply({**variables, "params": params}, graphs, train=True,
                             mutable=["batch_stats"])
        return jnp.sum(jnp.where(graphs.graph_mask[:, None], out, 0.0))

    out, _ = model.apply(variables, graphs, train=True, mutable=["batch_stats"])
    assert np.isfinite(np.asarray(out)).all()
    grads = jax.grad(loss)(variables["params"])
    for g in jax.tree_util.tree_leaves(grads):
        assert np.isfinite(np.asarray(g)).all()
        assert not np.asarray(g).any()

def test_module_output_takes_its_dtype_and_float32_statistics():
    rs = np.random.default_rng(3)
    x = jnp.asarray(rs.normal(2.0, 3.0, (24, 5)), jnp.bfloat16)
    mask = jnp.asarray(rs.random(24) < 0.7)
    wide, narrow = MaskedBatchNorm(), MaskedBatchNorm(jnp.bfloat16)
    v = wide.init(jax.random.key(0), x, mask, train=True)
    for train in (True, False):
        want, s_want = wide.apply(v, x, mask, train=train, mutable=["batch_stats"])
        got, s_got = narrow.apply(v, x, mask, train=train, mutable=["batch_stats"])
        assert want.dtype == jnp.float32 and got.dtype == jnp.bfloat16
        np.testing.assert_array_equal(np.asarray(got), np.asarray(want.astype(jnp.bfloat16)))
        for a, b in zip(jax.tree_util.tree_leaves(s_got), jax.tree_util.tree_leaves(s_want)):
            assert a.dtype == jnp.float32
            np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_a_node_models_norm_is_flaxs_with_its_momentum_and_survives_no_seed():
    """The node GNN's `norm="batch"` was Flax's nn.BatchNorm(mask=...), NaN over no row:
    on two devices, a device without seeds in an epoch's last step made the update NaN
    and the run stopped as diverged. RowBatchNorm(0.99) keeps Flax's variables, names and
    values (momentum 0.99 as before) and stays finite on such a share."""
    from zerognn_jax._src.nn.models import RowBatchNorm

    x, mask, *_ = _inputs(jnp.float32, seed=6)
    ours = RowBatchNorm(0.99)
    ref = nn.BatchNorm(momentum=0.99, epsilon=1e-5)
    v = ref.init(jax.random.key(0), x, use_running_average=False,
                 mask=jnp.broadcast_to(mask[:, None], x.shape))
    assert jax.tree_util.tree_structure(ours.init(jax.random.key(0), x, mask, train=True)) \
        == jax.tree_util.tree_structure(v)
    v = jax.tree_util.tree_map(lambda a: a + 0.25, v)
    for train in (True, False):
        y_ours, s_ours = ours.apply(v, x, mask, train=train, mutable=["batch_stats"])
        y_ref, s_ref = ref.apply(v, x, use_running_average=not train, mutable=["batch_stats"],
                                 mask=jnp.broadcast_to(mask[:, None], x.shape))
        np.testing.assert_allclose(np.asarray(y_ours), np.asarray(y_ref), rtol=1e-6, atol=1e-5)
        for a, b in zip(jax.tree_util.tree_leaves(s_ours), jax.tree_util.tree_leaves(s_ref)):
            np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-6, atol=1e-6)
    # a share of no seeds: every destination of the sampled block is padding
    model = zg.make_model("sage", hidden=8, num_layers=2, num_classes=3, dropout=0.0,
                          norm="batch")
    assert isinstance(model.bind({}).norms[0], RowBatchNorm)
    none = jnp.zeros(x.shape[0], bool)
    out, _ = ours.apply(v, x, none, train=True, mutable=["batch_stats"])
    assert np.isfinite(np.asarray(out)).all()
