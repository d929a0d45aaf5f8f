"""OGB-style categorical encoders (nn/graph_models.py): the multi-hot product and the
lookups used above MULTI_HOT_LIMIT categories both give the sum of one table row per
column, and each table row's gradient is the sum of the output's gradient over the
rows that read it."""

from __future__ import annotations

import jax
import numpy as np
import pytest

from zerognn_jax._src.nn.graph_models import MULTI_HOT_LIMIT, CategoricalEncoder


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
