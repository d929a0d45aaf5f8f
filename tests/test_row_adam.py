"""Lazy (row-sparse) Adam against a dense reference on the touched rows."""

from __future__ import annotations

from types import SimpleNamespace
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from zerognn_jax import Kernels, RowAdamState, row_adam_init, row_adam_update
from zerognn_jax._src.pallas.row_adam import row_adam_rows
from zerognn_jax._src.training import row_adam
from zerognn_jax._src.training.embeddings import NodeEmbedding
from zerognn_jax._src.training.row_adam import row_adam_rows_reference
from zerognn_jax._src.training.step import update_embedding


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


@pytest.mark.parametrize("table_rows", [16, 0], ids=["table-merge", "sort-merge"])
def test_updates_equal_dense_reference_on_touched_rows_and_leave_others_unchanged(
        table_rows, monkeypatch):
    """Either general merge of repeats (a table of the N rows' first slots, or
    `jnp.unique`'s sort for a table far larger than the step's rows)."""
    monkeypatch.setattr(row_adam, "TABLE_MERGE_ROWS", table_rows)
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
        grads[~valid] = np.nan  # what an invalid slot holds reaches no row
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


@pytest.mark.parametrize("change, match", [
    ({"state": "optax"}, r"^state must be the RowAdamState of row_adam_init\(table\) .*got "
                         r"tuple$"),
    ({"state": "other"}, r"^state holds moments of shape \[5, 3\], the table is \[8, 2\]"),
    ({"state": "bfloat16"}, r"^state holds moments of dtype bfloat16 and bfloat16; lazy Adam "
                            r"keeps them in float32"),
    ({"rows": jnp.zeros((3, 3), jnp.int32)}, r"^rows must be 1-D integer row ids \[R\], "
                                             r"got int32\[3, 3\]$"),
    ({"rows": jnp.zeros(3)}, r"^rows must be 1-D integer row ids \[R\], got float32\[3\]$"),
    ({"valid": jnp.ones(4, bool)}, r"^valid must hold one flag per row id \(\[3\]\), "
                                   r"got \[4\]$"),
])
def test_other_arguments_that_do_not_fit_are_named(change, match):
    """Each was a JAX error about broadcasting or reshaping (a user trial)."""
    table = jnp.zeros((8, 2))
    args = dict(state=row_adam_init(table), rows=jnp.arange(3), valid=None)
    args.update(change)
    if args["state"] == "optax":
        args["state"] = optax.adam(0.1).init(table)
    elif args["state"] == "other":
        args["state"] = row_adam_init(jnp.zeros((5, 3)))
    elif args["state"] == "bfloat16":  # the XLA form kept them so, the Pallas one refused
        args["state"] = jax.tree.map(lambda a: a.astype(jnp.bfloat16) if a.ndim else a,
                                     row_adam_init(table))
    with pytest.raises(ValueError, match=match):
        row_adam_update(table, args["state"], args["rows"], jnp.zeros((3, 2)), args["valid"],
                        lr=0.1)


@pytest.mark.parametrize("merge", [{}, {"unique": True}, {"repeats": 2}])
def test_ids_outside_the_table_touch_nothing(merge):
    """-1 (a common padding) wrote row N - 1, row and moments, where an id past the end
    was dropped: both touch nothing now, whichever way repeats are merged."""
    rs = np.random.default_rng(4)
    n = 6
    table = jnp.asarray(rs.normal(size=(n, 3)), jnp.float32)
    rows = jnp.asarray([-1, 2, n, -n], jnp.int32)
    grads = jnp.asarray(rs.normal(size=(4, 3)), jnp.float32)
    new, state = row_adam_update(table, row_adam_init(table), rows, grads, lr=0.1, **merge)
    changed = np.flatnonzero((np.asarray(new) != np.asarray(table)).any(1))
    assert changed.tolist() == [2]
    assert np.flatnonzero(np.asarray(state.mu).any(1)).tolist() == [2]
    assert np.flatnonzero(np.asarray(state.nu).any(1)).tolist() == [2]


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


@pytest.mark.parametrize("devices", [2, 3])
def test_rows_of_several_devices_merge_as_the_general_path(devices):
    """`repeats=D` (D devices' rows, each device's valid ids distinct, padding anywhere)
    gives the reference's update: repeats summed, every other row and moment
    bit-unchanged; and the general path's to float rounding."""
    rs = np.random.default_rng(devices)
    n, d, r = 40, 3, 12
    table = jnp.asarray(rs.normal(size=(n, d)), jnp.float32)
    rows = np.concatenate([rs.permutation(n)[:r] for _ in range(devices)])
    rows[:r] = rows[r:2 * r]  # the first two devices hold the same ids
    valid = rs.random(devices * r) < 0.8
    grads = rs.normal(size=(devices * r, d)).astype(np.float32)
    state = row_adam_init(table)
    args = (jnp.asarray(rows, jnp.int32), jnp.asarray(grads), jnp.asarray(valid))
    merged = jax.jit(lambda *a: row_adam_update(table, state, *a, lr=0.1,
                                                repeats=devices))(*args)
    general = row_adam_update(table, state, *args, lr=0.1)
    *ref, touched = _reference(table, np.zeros((n, d)), np.zeros((n, d)), 1, rows, grads,
                               valid, lr=0.1)
    others = np.setdiff1d(np.arange(n), touched)
    for got, want, old in zip(merged[:1] + merged[1][:2], ref, (table, state.mu, state.nu)):
        np.testing.assert_allclose(np.asarray(got), want, rtol=1e-5, atol=1e-6)
        np.testing.assert_array_equal(np.asarray(got)[others], np.asarray(old)[others])
    for x, y in zip(jax.tree_util.tree_leaves(merged), jax.tree_util.tree_leaves(general)):
        np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=1e-6, atol=1e-7)
    assert int(merged[1].count) == 1 and len(touched) < n


@pytest.mark.parametrize("dtype,d", [(jnp.float32, 5), (jnp.bfloat16, 130),
                                     (jnp.float32, (2, 3))])
@pytest.mark.parametrize("unique", [False, True])
def test_pallas_row_update_equals_the_xla_form(dtype, d, unique):
    """The in-place Pallas kernel (interpreted) against the XLA gather-compute-scatter,
    over three steps with repeats (or distinct ids) and padding; a width of 130 takes two
    lane tiles, the second masked; rows of shape [2, 3] are updated as rows of 6 (the
    kernel refused a table that was not [N, D])."""
    rs = np.random.default_rng(3)
    n, r = 40, 24
    d = d if isinstance(d, tuple) else (d,)
    table = jnp.asarray(rs.normal(size=(n, *d)), dtype)
    pallas = Kernels(row_adam="pallas", interpret=True)
    ours = theirs = (table, row_adam_init(table))
    for _ in range(3):
        rows = rs.permutation(n)[:r] if unique else rs.integers(0, n, r)
        valid = jnp.asarray(rs.random(r) < 0.8)
        grads = jnp.asarray(rs.normal(size=(r, *d)), dtype)
        args = (jnp.asarray(rows, jnp.int32), grads, valid)
        before = ours
        ours = row_adam_update(*ours, *args, lr=0.01, unique=unique, kernels=pallas)
        theirs = row_adam_update(*theirs, *args, lr=0.01, unique=unique)
        untouched = np.setdiff1d(np.arange(n), rows[np.asarray(valid)])
        for a, b, old in zip(*map(jax.tree_util.tree_leaves, (ours, theirs, before))):
            # a bfloat16 row may round the other way after float32 sums of another order
            tol = 2**-7 if a.dtype == jnp.bfloat16 else 1e-5
            a, b, old = (np.asarray(x, np.float32) for x in (a, b, old))
            np.testing.assert_allclose(a, b, rtol=tol, atol=1e-6)
            if a.ndim:
                np.testing.assert_array_equal(a[untouched], old[untouched])
    assert not np.array_equal(np.asarray(ours[0], np.float32), np.asarray(table, np.float32))


def test_pallas_row_update_leaves_unused_slots_alone_wherever_they_point():
    """Unused slots of the row update may hold any in-range id (here row 0, which no
    used slot holds): neither form may read or write through them."""
    rs = np.random.default_rng(4)
    n, r, d = 20, 8, 3
    table = jnp.asarray(rs.normal(size=(n, d)), jnp.float32)
    mu, nu = (jnp.asarray(rs.random((n, d)), jnp.float32) for _ in range(2))
    ids = jnp.asarray(np.r_[1 + rs.permutation(n - 1)[:5], [0, 0, 0]], jnp.int32)
    used = jnp.arange(r) < 5
    grads = jnp.asarray(rs.normal(size=(r, d)), jnp.float32)
    args = (table, mu, nu, ids, used, grads, jnp.int32(2))
    opts = dict(lr=0.1, b1=0.9, b2=0.999, eps=1e-8)
    ours = row_adam_rows(*args, **opts, interpret=True)
    theirs = row_adam_rows_reference(*args, **opts)
    for a, b, old in zip(ours, theirs, (table, mu, nu)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-6)
        np.testing.assert_array_equal(np.asarray(a[0]), np.asarray(old[0]))


def test_the_step_runs_the_row_update_its_program_selects():
    """`update_embedding` hands the program's kernels to the table's update: a callable
    registered for "row_adam" runs in place of the XLA form, and its result is kept."""
    class State(NamedTuple):
        embedding: jax.Array
        embedding_opt: RowAdamState

    calls = []

    def recorded(*args, **kw):
        calls.append(kw)
        table, mu, nu = row_adam_rows_reference(*args, **kw)
        return table + 1.0, mu, nu

    emb = NodeEmbedding(dim=2, lr=0.1)
    table = jnp.zeros((6, 2))
    program = SimpleNamespace(embedding=emb, kernels=Kernels(row_adam=recorded),
                              parallel=None, sampler=SimpleNamespace(positional=(False,)))
    out = {"embedding_grads": (jnp.array([1, 4]), jnp.ones((2, 2)), jnp.array([True, True]))}
    new = update_embedding(program, State(table, row_adam_init(table)), out, jnp.bool_(True))
    assert calls and calls[0]["lr"] == 0.1
    np.testing.assert_array_equal(np.asarray(new.embedding[0]), [1.0, 1.0])  # ours kept
    assert float(new.embedding[1, 0]) < 1.0 and int(new.embedding_opt.count) == 1


def test_the_pallas_row_update_refuses_what_it_cannot_write():
    t, ids, used = jnp.zeros((4, 2)), jnp.zeros(2, jnp.int32), jnp.ones(2, bool)
    opts = dict(lr=0.1, b1=0.9, b2=0.999, eps=1e-8, interpret=True)
    with pytest.raises(ValueError, match=r"need a table \[N, D\].*\(4, 2, 1\)"):
        row_adam_rows(t[..., None], t[..., None], t[..., None], ids, used,
                      jnp.zeros((2, 2, 1)), jnp.int32(1), **opts)
    with pytest.raises(ValueError, match="moments must be float32.*bfloat16"):
        half = t.astype(jnp.bfloat16)
        row_adam_rows(t, half, half, ids, used, jnp.zeros((2, 2)), jnp.int32(1), **opts)
