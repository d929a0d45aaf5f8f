"""Lazy (row-sparse) Adam against a dense reference on the touched rows."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from zerognn_jax import RowAdamState, row_adam_init, row_adam_update


def _reference(table, mu, nu, t, rows, grads, valid, lr, b1=0.9, b2=0.999, eps=1e-8):
    """NumPy float64: sum duplicate gradients, then Adam on the touched rows only."""
    table, mu, nu = (np.array(a, np.float64) for a in (table, mu, nu))
    g = {}
    for row, grad, ok in zip(rows, grads, valid):
        if ok:
            g[int(row)] = g.get(int(row), 0.0) + np.asarray(grad, np.float64)
    for row, grad in g.items():
        mu[row] = b1 * mu[row] + (1 - b1) * grad
        nu[row] = b2 * nu[row] + (1 - b2) * grad**2
        step = lr * (mu[row] / (1 - b1**t)) / (np.sqrt(nu[row] / (1 - b2**t)) + eps)
        table[row] -= step
    return table, mu, nu, sorted(g)


def test_updates_equal_dense_reference_on_touched_rows_and_leave_others_unchanged():
    rs = np.random.default_rng(0)
    n, d, r = 50, 4, 24
    table = jnp.asarray(rs.normal(size=(n, d)), jnp.float32)
    state = row_adam_init(table)
    update = jax.jit(lambda *a: row_adam_update(*a, lr=0.01))
    ref = (np.asarray(table), np.zeros((n, d)), np.zeros((n, d)))
    for t in range(1, 4):
        rows = rs.integers(0, n, r)
        rows[:3] = rows[3]  # duplicates: their gradients add up
        grads = rs.normal(size=(r, d)).astype(np.float32)
        valid = rs.random(r) < 0.8
        before = (np.asarray(table), np.asarray(state.mu), np.asarray(state.nu))
        table, state = update(table, state, jnp.asarray(rows, jnp.int32), jnp.asarray(grads),
                              jnp.asarray(valid))
        *ref, touched = _reference(*ref, t, rows, grads, valid, lr=0.01)
        assert int(state.count) == t
        for got, want, old in zip((table, state.mu, state.nu), ref, before):
            got = np.asarray(got)
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
            others = np.setdiff1d(np.arange(n), touched)
            np.testing.assert_array_equal(got[others], old[others])  # bit-unchanged
        assert len(touched) < n


def test_a_single_row_step_matches_optax_adam():
    """One row touched at every step, alone: lazy Adam is Adam on that row."""
    rs = np.random.default_rng(1)
    row = jnp.asarray(rs.normal(size=(1, 3)), jnp.float32)
    table = jnp.concatenate([jnp.zeros((2, 3)), row])
    state, opt = row_adam_init(table), optax.adam(0.05)
    dense, opt_state = row, opt.init(row)
    for _ in range(3):
        g = jnp.asarray(rs.normal(size=(1, 3)), jnp.float32)
        table, state = row_adam_update(table, state, jnp.array([2]), g, lr=0.05)
        upd, opt_state = opt.update(g, opt_state)
        dense = optax.apply_updates(dense, upd)
    np.testing.assert_allclose(np.asarray(table[2]), np.asarray(dense[0]), rtol=1e-6)
    assert not np.asarray(table[:2]).any()


def test_bfloat16_table_keeps_its_dtype_and_float32_moments():
    table = jnp.ones((8, 2), jnp.bfloat16)
    state = row_adam_init(table)
    table, state = row_adam_update(table, state, jnp.array([1, 1]), jnp.ones((2, 2)),
                                   lr=0.1)
    assert table.dtype == jnp.bfloat16 and state.mu.dtype == jnp.float32
    assert isinstance(state, RowAdamState)
    assert float(table[1, 0]) < 1.0 and float(table[0, 0]) == 1.0


def test_gradient_rows_of_the_wrong_shape_are_refused():
    table = jnp.zeros((8, 2))
    with pytest.raises(ValueError, match=r"grads must be \[3, 2\].*got \[3, 5\]"):
        row_adam_update(table, row_adam_init(table), jnp.arange(3), jnp.zeros((3, 5)), lr=0.1)


def test_distinct_rows_skip_the_merge_and_give_the_same_update():
    """`unique=True` (a deduplicated level: valid ids distinct, padding repeated) equals
    the general path that sorts and merges repeats."""
    rs = np.random.default_rng(2)
    table = jnp.asarray(rs.normal(size=(30, 3)), jnp.float32)
    rows = jnp.asarray(np.r_[rs.permutation(30)[:12], [0, 0, 0, 0]], jnp.int32)
    valid = jnp.arange(16) < 12
    grads = jnp.asarray(rs.normal(size=(16, 3)), jnp.float32)
    state = row_adam_init(table)
    a = row_adam_update(table, state, rows, grads, valid, lr=0.1)
    b = row_adam_update(table, state, rows, grads, valid, lr=0.1, unique=True)
    for x, y in zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b)):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
