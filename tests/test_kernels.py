"""One suite for every kernel op, run against each implementation through the registry.

Implementations: the XLA references, the Pallas kernels in the Pallas interpreter (CPU),
and the compiled Pallas kernels (marked `gpu`; tests/conftest.py skips those elsewhere).
Each test compares an implementation with the reference on random inputs (exactly for
sampling, relabel and gather; to float32 tolerance for the aggregations and their
gradients) and checks properties of the result.

Interpreter caveats shape the inputs: it implements no masked atomics (the kernels route
masked lanes out of bounds there) and keeps one update per index when an atomic call
has duplicate indices. So wherever a kernel uses atomics, the inputs have distinct live
indices within one atomic call: within one program's block of flattened slots for
relabel, within one fanout slot (column) for the aggregation backward passes. Duplicates
across calls are plentiful. `test_duplicates_on_gpu` drops that restriction on a GPU.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from zerognn_jax._src.ops import aggregate, gather, relabel
from zerognn_jax._src.ops.registry import Kernels
from zerognn_jax._src.pallas import aggregate as pk_aggregate
from zerognn_jax._src.pallas import counter_hash
from zerognn_jax._src.pallas import relabel as pk_relabel
from zerognn_jax._src.pallas import sample as pk_sample
from zerognn_jax._src.pallas.common import Tiling, launch, next_pow2
from zerognn_jax._src.sampling import uniform as sampling

IMPLS = [
    pytest.param(Kernels.parse("xla"), id="xla"),
    pytest.param(Kernels.parse("pallas", interpret=True), id="pallas-interpret"),
    pytest.param(Kernels.parse("pallas"), id="pallas-gpu", marks=pytest.mark.gpu),
]


def _rng(*salt) -> np.random.Generator:
    return np.random.default_rng([1234, *salt])


def _graph(n: int, max_deg: int, seed: int):
    """CSR graph without multi-edges; every 5th node has degree 0."""
    r = _rng(seed)
    deg = r.integers(1, max_deg + 1, n)
    deg[::5] = 0
    rows = [np.sort(r.choice(n, d, replace=False)) for d in deg]
    indptr = np.concatenate([[0], np.cumsum(deg)]).astype(np.int32)
    indices = np.concatenate(rows).astype(np.int32)
    return indptr, indices


def _assert_close(actual, expected, reduce_len: int):
    tol = 2e-6 * math.sqrt(reduce_len)
    scale = max(1.0, float(np.max(np.abs(np.asarray(expected)))))
    np.testing.assert_allclose(np.asarray(actual), np.asarray(expected), rtol=tol, atol=tol * scale)


# ---------------------------------------------------------------------------------- sampling


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize(
    "fanout,replace,all_neighbors",
    [(5, False, False), (20, False, False), (7, True, False), (40, False, True)],
    ids=["floyd-unrolled", "floyd-loop", "replace", "all-neighbors"],
)
def test_sample_matches_reference(impl, fanout, replace, all_neighbors):
    indptr, indices = _graph(200, 40, seed=fanout)
    r = _rng(1, fanout)
    c = 77
    frontier = r.integers(0, 200, c).astype(np.int32)
    valid = r.random(c) < 0.8
    frontier[~valid] = 0
    key = counter_hash.step_key(3, 1, 4, 1)
    args = (jnp.asarray(indptr), jnp.asarray(indices), jnp.asarray(frontier), jnp.asarray(valid))
    opts = dict(replace=replace, all_neighbors=all_neighbors)
    nbr, mask = jax.jit(lambda *a: sampling.sample_neighbors(impl, *a, key, fanout, **opts))(*args)
    ref_nbr, ref_mask = jax.jit(
        lambda *a: sampling.sample_neighbors_reference(*a, key, fanout, **opts)
    )(*args)
    np.testing.assert_array_equal(mask, ref_mask)
    np.testing.assert_array_equal(nbr, ref_nbr)

    nbr, mask = np.asarray(nbr), np.asarray(mask)
    deg = np.where(valid, indptr[frontier + 1] - indptr[frontier], 0)
    assert not nbr[~mask].any()
    for row in range(c):
        lo, hi = indptr[frontier[row]], indptr[frontier[row] + 1]
        taken = nbr[row][mask[row]]
        assert np.isin(taken, indices[lo:hi]).all(), "a sampled pair is not an edge"
        if replace:
            assert mask[row].sum() == (fanout if deg[row] else 0)
            continue
        assert mask[row].sum() == min(deg[row], fanout)
        assert len(set(taken.tolist())) == len(taken), "duplicate without replacement"
        if deg[row] <= fanout:
            np.testing.assert_array_equal(taken, indices[lo:hi])


# ----------------------------------------------------------------------------------- relabel


def _hop(c: int, k: int, n: int, count: int, seed: int):
    """Distinct frontier ids and neighbours distinct within each program's slot block."""
    r = _rng(2, seed)
    frontier = r.permutation(n)[:c].astype(np.int32)
    frontier[count:] = 0
    block, _ = pk_relabel.hop_launch(c, k)
    assert block <= n
    flat = np.concatenate([r.permutation(n)[:block] for _ in range(-(-c * k // block))])
    mask = r.random(c * k) < 0.75
    nbr = np.where(mask, flat[: c * k], 0).astype(np.int32)
    return frontier, nbr.reshape(c, k), mask.reshape(c, k)


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize(
    "c,k,n,count,capacity",
    [(40, 5, 60, 33, 240), (2048, 16, 3000, 2000, 4096), (300, 7, 900, 280, 400)],
    ids=["small", "large-blocks", "overflow"],
)
def test_relabel_matches_reference(impl, c, k, n, count, capacity):
    frontier, nbr, mask = _hop(c, k, n, count, seed=c)
    args = (jnp.asarray(frontier), jnp.int32(count), jnp.asarray(nbr), jnp.asarray(mask))
    out = jax.jit(lambda *a: relabel.relabel(impl, *a, capacity, n))(*args)
    ref = jax.jit(lambda *a: relabel.relabel_reference(*a, capacity, n))(*args)
    for name, got, want in zip(ref._fields, out, ref):
        np.testing.assert_array_equal(got, want, err_msg=name)

    count_next = int(out.count)
    got_frontier, local = np.asarray(out.frontier), np.asarray(out.nbr_local)
    np.testing.assert_array_equal(got_frontier[:count], frontier[:count])
    if count_next <= capacity:
        np.testing.assert_array_equal(got_frontier[local[mask]], nbr[mask])
        assert len(set(got_frontier[:count_next].tolist())) == count_next
        assert not got_frontier[count_next:].any()
    else:
        assert capacity < count_next


@pytest.mark.parametrize("impl", IMPLS)
def test_relabel_does_not_retrace(impl):
    traces = []

    @jax.jit
    def hop(frontier, count, nbr, mask):
        traces.append(None)
        return relabel.relabel(impl, frontier, count, nbr, mask, 128, 60)

    for seed in (0, 1):
        frontier, nbr, mask = _hop(16, 4, 60, 12, seed)
        jax.block_until_ready(hop(frontier, jnp.int32(12), nbr, mask))
    assert len(traces) == 1


# ------------------------------------------------------------------------------------ gather


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("d", [7, 300])
def test_gather_matches_reference(impl, d):
    r = _rng(3, d)
    table = jnp.asarray(r.standard_normal((90, d)).astype(np.float32))
    ids = jnp.asarray(r.integers(0, 90, 45).astype(np.int32))
    valid = jnp.asarray(r.random(45) < 0.8)
    got = jax.jit(lambda *a: gather.gather_rows(impl, *a))(table, ids, valid)
    np.testing.assert_array_equal(got, gather.gather_rows_reference(table, ids, valid))


# ------------------------------------------------------------------------------- aggregation


def _ell(s: int, c: int, k: int, seed: int, repeat_first: bool):
    """nbr [c, k] with distinct rows per slot column; some rows empty, some masked slots."""
    r = _rng(4, seed)
    nbr = np.stack([r.permutation(s)[:c] for _ in range(k)], axis=1).astype(np.int32)
    if repeat_first:
        nbr[:, 1] = nbr[:, 0]  # the same neighbour twice in every row
    mask = r.random((c, k)) < 0.7
    mask[::6] = False  # rows with no neighbour
    nbr[~mask] = 0
    return nbr, mask


def _features(shape, seed: int) -> jax.Array:
    """ReLU-like features: many exact zeros, so the max has ties."""
    return jnp.asarray(np.maximum(_rng(5, seed).standard_normal(shape), 0).astype(np.float32))


AGG_CASES = [
    pytest.param(60, 37, 5, 1, 100, False, id="sage-d100"),
    pytest.param(90, 70, 20, 4, 8, True, id="gat-4heads-k20-dups"),
]


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("s,c,k,heads,f,repeat_first", AGG_CASES)
def test_weighted_sum_and_grads_match_reference(impl, s, c, k, heads, f, repeat_first):
    nbr, mask = _ell(s, c, k, seed=k, repeat_first=repeat_first)
    h = _features((s, heads, f), seed=k)
    w = jnp.asarray(_rng(6, k).random((c, k, heads)).astype(np.float32) * mask[..., None])
    ct = jnp.asarray(_rng(7, k).standard_normal((c, heads, f)).astype(np.float32))
    nbr = jnp.asarray(nbr)

    def loss(fn):
        return jax.jit(jax.value_and_grad(lambda h, w: jnp.sum(fn(h, nbr, w) * ct), (0, 1)))

    out = jax.jit(lambda h, w: aggregate.weighted_sum(impl, h, nbr, w))(h, w)
    _assert_close(out, aggregate.weighted_sum_reference(h, nbr, w), k)
    val, (dh, dw) = loss(lambda *a: aggregate.weighted_sum(impl, *a))(h, w)
    ref_val, (ref_dh, ref_dw) = loss(aggregate.weighted_sum_reference)(h, w)
    _assert_close(val, ref_val, c * k * f)
    _assert_close(dh, ref_dh, k)
    _assert_close(dw, ref_dw, f)


def _numpy_weighted_sum(h, nbr, w, ct):
    """Loops: the output, d(sum(out * ct))/dh and /dw, in float64. A slot whose weights
    are all zero is not read: its weight gradient is zero (the ops' contract)."""
    h, w, ct = (np.asarray(a, np.float64) for a in (h, w, ct))
    out, dh, dw = np.zeros(ct.shape), np.zeros(h.shape), np.zeros(w.shape)
    for c in range(nbr.shape[0]):
        for k in range(nbr.shape[1]):
            s = nbr[c, k]
            out[c] += w[c, k][:, None] * h[s]
            dh[s] += w[c, k][:, None] * ct[c]
            if np.any(w[c, k] != 0):
                dw[c, k] = np.sum(h[s] * ct[c], axis=-1)
    return out, dh, dw


@pytest.mark.parametrize("dtype, tol", [(jnp.float32, 1e-5), (jnp.bfloat16, 2e-2)])
def test_weighted_sum_reference_against_loops(dtype, tol):
    """The XLA reference (the oracle of the kernel tests) against plain loops, with the
    same row gathered by many slots, in float32 and in bfloat16 (float32 accumulation)."""
    s, c, k, heads, f = 60, 50, 6, 2, 5
    nbr, mask = _ell(s, c, k, seed=21, repeat_first=True)
    nbr[:, 2] = 7  # one row fed by a whole column
    h = _features((s, heads, f), seed=21).astype(dtype)
    w = jnp.asarray(_rng(6, 21).random((c, k, heads)) * mask[..., None], dtype)
    ct = jnp.asarray(_rng(7, 21).standard_normal((c, heads, f)), dtype)
    fn = lambda h, w: jnp.sum((aggregate.weighted_sum_reference(h, jnp.asarray(nbr), w)
                               * ct).astype(jnp.float32))
    out = aggregate.weighted_sum_reference(h, jnp.asarray(nbr), w)
    dh, dw = jax.grad(fn, (0, 1))(h, w)
    assert out.dtype == dh.dtype == dw.dtype == dtype
    for got, want in zip((out, dh, dw), _numpy_weighted_sum(h, nbr, w, ct), strict=True):
        got = np.asarray(got, np.float64)
        np.testing.assert_allclose(got, want, rtol=tol, atol=tol * np.abs(want).max())


def test_max_reference_against_loops():
    s, c, k = 50, 40, 6
    nbr, mask = _ell(s, c, k, seed=22, repeat_first=True)
    h = np.asarray(_rng(8, 22).standard_normal((s, 7)), np.float32)
    want = np.zeros((c, 7), np.float32)
    for row in range(c):
        if mask[row].any():
            want[row] = h[nbr[row][mask[row]]].max(axis=0)
    got = aggregate.max_reference(jnp.asarray(h), jnp.asarray(nbr), jnp.asarray(mask))
    np.testing.assert_array_equal(np.asarray(got), want)


def test_max_reference_gradient_of_half_precision_rows_sums_in_float32():
    # 600 rows whose one slot reads source row 0: bfloat16 sums of the ones would stop
    # at 256 (256 + 1 rounds back to 256)
    nbr, mask = jnp.zeros((600, 2), jnp.int32), jnp.array([[True, False]] * 600)
    h = jnp.ones((3, 4), jnp.bfloat16)
    out = aggregate.max_reference(h, nbr, mask)
    assert out.dtype == jnp.bfloat16
    grad = jax.grad(lambda h: aggregate.max_reference(h, nbr, mask).astype(jnp.float32).sum())(h)
    assert grad.dtype == jnp.bfloat16
    np.testing.assert_array_equal(np.asarray(grad, np.float32)[:, 0], [600, 0, 0])


def test_tiling_override_splits_features_and_heads():
    """Feature tiles narrower than a row: heads straddle programs, d weights sum partials."""
    s, c, k, heads, f = 40, 24, 3, 4, 12
    nbr, mask = _ell(s, c, k, seed=11, repeat_first=False)
    h = _features((s, heads, f), seed=11)
    w = jnp.asarray(_rng(6, 11).random((c, k, heads)).astype(np.float32) * mask[..., None])
    nbr = jnp.asarray(nbr)
    tiling = Tiling(block_rows=8, block_cols=16, num_warps=1)

    def loss(fn):
        return jax.jit(jax.value_and_grad(lambda h, w: jnp.sum(fn(h, nbr, w) ** 2), (0, 1)))

    got = loss(lambda *a: pk_aggregate.weighted_sum(*a, interpret=True, tiling=tiling))(h, w)
    want = loss(aggregate.weighted_sum_reference)(h, w)
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
        _assert_close(a, b, k * f)


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("s,c,k,heads,f,repeat_first", AGG_CASES)
def test_max_and_grad_match_reference(impl, s, c, k, heads, f, repeat_first):
    nbr, mask = _ell(s, c, k, seed=k + 1, repeat_first=repeat_first)
    nbr, mask = jnp.asarray(nbr), jnp.asarray(mask)
    h = _features((s, heads * f), seed=k + 1)
    ct = jnp.asarray(_rng(8, k).standard_normal((c, heads * f)).astype(np.float32))

    def grad(fn):
        return jax.jit(jax.grad(lambda h: jnp.sum(fn(h, nbr, mask) * ct)))

    out = jax.jit(lambda h: aggregate.neighbor_max(impl, h, nbr, mask))(h)
    ref = aggregate.max_reference(h, nbr, mask)
    np.testing.assert_array_equal(out, ref)
    assert not np.asarray(out)[::6].any(), "empty rows must be zero"
    got = grad(lambda *a: aggregate.neighbor_max(impl, *a))(h)
    _assert_close(got, grad(aggregate.max_reference)(h), k)


@pytest.mark.parametrize("impl", IMPLS)
def test_max_propagates_nan_as_the_reference(impl):
    """A NaN among a row's live slots is its maximum, and its gradient is NaN on each live
    slot; a NaN behind a masked slot stays out. The Pallas kernel gave the largest other
    value, or 0 for a row of NaNs alone, with finite gradients. (Gradients are taken
    eagerly: the reference's, compiled by XLA:CPU, came out finite.)"""
    nan = np.nan
    h = jnp.asarray([[nan, 1.0], [2.0, nan], [nan, 5.0]], jnp.float32)
    nbr = jnp.asarray([[0, 1], [1, 0], [1, 2]], jnp.int32)
    mask = jnp.asarray([[True, True], [True, False], [True, False]])

    def grad(fn):
        return jax.grad(lambda h: jnp.sum(fn(h, nbr, mask)))(h)

    out = jax.jit(lambda h: aggregate.neighbor_max(impl, h, nbr, mask))(h)
    np.testing.assert_array_equal(out, [[nan, nan], [2.0, nan], [2.0, nan]])
    np.testing.assert_array_equal(out, aggregate.max_reference(h, nbr, mask))
    got = grad(lambda *a: aggregate.neighbor_max(impl, *a))
    np.testing.assert_array_equal(got, [[nan, nan], [nan, nan], [0.0, 0.0]])


# ---------------------------------------------------------------------- GPU-only: duplicates


@pytest.mark.gpu
def test_duplicates_on_gpu():
    """Heavy duplicates inside one program: what the interpreter cannot emulate."""
    r = _rng(9)
    c, k, n, count = 4096, 10, 500, 300
    frontier = jnp.asarray(np.pad(r.permutation(n)[:count], (0, c - count)).astype(np.int32))
    count = jnp.int32(count)
    nbr = jnp.asarray(r.integers(0, n, (c, k)).astype(np.int32))
    mask = jnp.asarray(r.random((c, k)) < 0.8)
    nbr = jnp.where(mask, nbr, 0)
    got = jax.jit(lambda *a: pk_relabel.relabel(*a, 8192, n))(frontier, count, nbr, mask)
    for a, b in zip(got, relabel.relabel_reference(frontier, count, nbr, mask, 8192, n)):
        np.testing.assert_array_equal(a, b)

    h = _features((64, 1, 32), seed=10)
    w = jnp.asarray(r.random((c, k, 1)).astype(np.float32)) * mask[..., None]
    small = jnp.where(mask, nbr % 64, 0)
    pairs = [
        (pk_aggregate.weighted_sum, aggregate.weighted_sum_reference),
        (
            lambda h, n, w: pk_aggregate.neighbor_max(h[:, 0], n, w[..., 0] > 0),
            lambda h, n, w: aggregate.max_reference(h[:, 0], n, w[..., 0] > 0),
        ),
    ]
    for pallas_fn, ref_fn in pairs:
        got, want = (
            jax.jit(jax.grad(lambda h, fn=fn: jnp.sum(fn(h, small, w))))(h)
            for fn in (pallas_fn, ref_fn)
        )
        _assert_close(got, want, c * k)


# ------------------------------------------------------------------------ launch and checks


def test_launch_blocks_are_powers_of_two():
    for rows, lanes in [(1, 1), (77, 16), (1024, 128), (537_000, 8), (13_500, 128)]:
        block, params = launch(pk_aggregate.TILING, rows, lanes)
        assert block == next_pow2(block) <= pk_aggregate.TILING.block_rows
        assert params.num_warps == next_pow2(params.num_warps) <= pk_aggregate.TILING.num_warps
    assert launch(pk_aggregate.TILING, 10**6, 128)[0] == pk_aggregate.TILING.block_rows


def test_pallas_preconditions_name_the_numbers():
    nbr = jnp.zeros((8, 3), jnp.int32)
    mask = jnp.ones((8, 3), bool)
    with pytest.raises(ValueError, match="capacity 4 .* 8"):
        pk_relabel.relabel(jnp.zeros(8, jnp.int32), 8, nbr, mask, 4, 10)
    big = jax.ShapeDtypeStruct((2**22, 4), jnp.int32)  # shapes alone trip the check
    with pytest.raises(ValueError, match="16777216"):
        pk_relabel.relabel(jax.ShapeDtypeStruct((2**22,), jnp.int32), 1, big, big, 2**22, 10)
    with pytest.raises(ValueError, match=r"weights \(8, 3, 2\)"):
        pk_aggregate.weighted_sum(jnp.zeros((5, 1, 4)), nbr, jnp.zeros((8, 3, 2)))
    with pytest.raises(ValueError, match="fanout must be at least 1, got 0"):
        g = jnp.zeros(3, jnp.int32)
        pk_sample.sample_neighbors(g, g, g, jnp.ones(3, bool), jnp.uint32(0), 0)


def test_auto_kernels_are_xla_off_gpu():
    from zerognn_jax._src.ops.registry import Kernels

    chosen = Kernels.parse("auto")
    if jax.default_backend() == "gpu":
        assert chosen == Kernels(sample="pallas", row_adam="pallas")
    else:
        assert chosen == Kernels()


def test_a_kernel_spec_can_start_from_auto_or_one_implementation():
    from zerognn_jax._src.ops.registry import OPS, Kernels

    gpu = jax.default_backend() == "gpu"
    assert Kernels.parse("auto, row_adam=xla") == (Kernels(sample="pallas") if gpu
                                                   else Kernels())
    assert Kernels.parse("auto,gather=pallas").gather == "pallas"
    mixed = Kernels.parse("pallas,aggregate=xla")
    assert [getattr(mixed, op) for op in OPS] == ["pallas"] * 3 + ["xla"] * 2 + ["pallas"]
    with pytest.raises(ValueError, match=r"bad kernel spec 'auto' in kernels 'xla,auto'"):
        Kernels.parse("xla,auto")
    # an op named twice was taken from its last part, silently
    with pytest.raises(ValueError, match=r"'sample=pallas,sample=xla': sample is named twice"):
        Kernels.parse("sample=pallas,sample=xla")
    assert Kernels.parse("aggregate=pallas,max=xla").max == "xla"  # an alias, then one op
    for spec, op in (("max=xla,aggregate=pallas", "max"), ("aggregate=xla,aggregate=pallas",
                                                           "aggregate")):
        with pytest.raises(ValueError, match=f"{spec}': {op} is named twice"):
            Kernels.parse(spec)


def test_a_callable_replaces_an_op(small_graph):
    """Any function with the reference's signature can stand in for an op: here the
    sort-based relabel, which must give the table-based default's minibatch."""
    from zerognn_jax import SamplerConfig, sample_minibatch

    g = small_graph.to_device()
    seeds, valid = jnp.arange(0, 40, 2, dtype=jnp.int32), jnp.ones(20, bool)
    run = lambda k: sample_minibatch(g, seeds, valid, jnp.uint32(9), SamplerConfig((4, 3)),
                                     (128, 256), k)
    chosen = Kernels(relabel=relabel.relabel_sorted)
    assert "relabel=relabel_sorted" in chosen.describe()
    # an interpreted Pallas kernel says so (a summary showed it as a GPU run's)
    assert Kernels(sample="pallas", interpret=True).describe().endswith(
        ",row_adam=xla (interpreted)")
    assert "interpreted" not in Kernels(interpret=True).describe()  # no Pallas kernel
    for a, b in zip(jax.tree_util.tree_leaves(run(chosen)),
                    jax.tree_util.tree_leaves(run(Kernels()))):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    with pytest.raises(ValueError, match="or a callable"):
        Kernels(gather="cuda")
