"""count_at_most: searchsorted(side="right") without a loop (ops/search.py)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from zerognn_jax._src.ops.search import count_at_most


@pytest.mark.parametrize("n", [0, 1, 2, 7, 8, 9, 1000])
@pytest.mark.parametrize("spread", [5, 10**6], ids=["repeats", "distinct"])
def test_equals_searchsorted_right(n, spread):
    rng = np.random.default_rng(n)
    values = np.sort(rng.integers(0, spread, n)).astype(np.int32)
    queries = rng.integers(-3, spread + 3, (4, 50)).astype(np.int32)  # beyond both ends too
    want = np.searchsorted(values, queries, side="right")
    for run in (count_at_most, jax.jit(count_at_most)):
        got = run(jnp.asarray(values), jnp.asarray(queries))
        assert got.dtype == jnp.int32 and got.shape == queries.shape
        np.testing.assert_array_equal(np.asarray(got), want)


def test_runs_no_loop():
    text = jax.jit(count_at_most).lower(jnp.zeros(16385, jnp.int32),
                                        jnp.zeros(1000, jnp.int32)).as_text()
    assert "stablehlo.while" not in text


def test_refuses_a_table_of_rows():
    with pytest.raises(ValueError, match=r"1-D, got shape \(2, 3\)"):
        count_at_most(jnp.zeros((2, 3), jnp.int32), jnp.zeros(4, jnp.int32))
