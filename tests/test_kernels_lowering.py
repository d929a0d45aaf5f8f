"""CUDA lowering checks of every Pallas kernel, run on the CPU.

The interpreter (tests/test_kernels.py) checks what the kernels compute, not that they
lower to Triton: that path is only taken for a GPU. Here each op is lowered for "cuda"
from shapes alone (no GPU, no data), forward and backward, at small and products-like
sizes, so a kernel that Triton's Pallas lowering rejects (a block that is not a power of
two, an unsupported primitive, an atomic that does not lower) fails on every CI run.
"""

from __future__ import annotations

import functools
import re

import jax
import jax.numpy as jnp
import pytest

from zerognn_jax._src.pallas import aggregate, gather, relabel, row_adam, sample
from zerognn_jax._src.pallas.common import Tiling

I32, F32, BOOL = jnp.int32, jnp.float32, jnp.bool_
N, E = 2_449_029, 123_718_280  # products-like graph


def _sds(shape, dtype):
    return jax.ShapeDtypeStruct(shape, dtype)


def _lowered_kernels(fn, *args) -> list[str]:
    """Names of the Triton kernels in `fn`'s CUDA lowering."""
    text = jax.jit(fn).trace(*args).lower(lowering_platforms=("cuda",)).as_text()
    names = re.findall(r'name = "(zerognn_\w+)"', text)
    assert len(names) == text.count("__gpu$xla.gpu.triton"), "a Triton call without a name="
    return sorted(set(names))


@pytest.mark.parametrize(
    "c,fanout,opts",
    [
        (77, 5, {}),
        (1024, 15, {}),
        (13_500, 20, {}),
        (122_000, 5, {"replace": True}),
        (300, 40, {"all_neighbors": True}),
        (1024, 15, {"with_edges": True}),
    ],
)
def test_sample_lowers(c, fanout, opts):
    args = (_sds((N + 1,), I32), _sds((E,), I32), _sds((c,), I32), _sds((c,), BOOL))
    key = _sds((), jnp.uint32)
    fn = lambda *a: sample.sample_neighbors(*a, fanout, **opts)
    assert _lowered_kernels(fn, *args, key) == ["zerognn_sample_neighbors"]


@pytest.mark.parametrize("c,k,capacity", [(40, 5, 256), (1024, 15, 16_384), (122_112, 5, 732_672)])
def test_relabel_lowers(c, k, capacity):
    args = (_sds((c,), I32), _sds((), I32), _sds((c, k), I32), _sds((c, k), BOOL))
    names = _lowered_kernels(lambda *a: relabel.relabel(*a, capacity, N), *args)
    assert names == [f"zerognn_relabel_{s}" for s in ("assign", "claim", "count", "localise")]


@pytest.mark.parametrize("c,d", [(45, 7), (537_000, 100), (1024, 300)])
def test_gather_lowers(c, d):
    args = (_sds((N, d), F32), _sds((c,), I32), _sds((c,), BOOL))
    assert _lowered_kernels(gather.gather_rows, *args) == ["zerognn_gather_rows"]


# (rows, width, slots, table dtype): tiny, and mag-like's stacked featureless types with
# a deduplicated step's rows in bfloat16
@pytest.mark.parametrize("n,d,r,dtype", [(40, 7, 9, F32), (1_203_354, 256, 174_080, jnp.bfloat16)])
def test_row_adam_lowers_in_place(n, d, r, dtype):
    args = (_sds((n, d), dtype), _sds((n, d), F32), _sds((n, d), F32), _sds((r,), I32),
            _sds((r,), BOOL), _sds((r, d), dtype), _sds((), I32))
    fn = functools.partial(row_adam.row_adam_rows, lr=0.01, b1=0.9, b2=0.999, eps=1e-8)
    assert _lowered_kernels(fn, *args) == ["zerognn_row_adam"]
    text = jax.jit(fn).trace(*args).lower(lowering_platforms=("cuda",)).as_text()
    assert text.count("#stablehlo.output_operand_alias<") == 3  # table, mu, nu in place


@pytest.mark.parametrize(
    "s,c,k,heads,f,tiling",
    [
        (537_000, 122_000, 5, 1, 100, None),
        (13_500, 1024, 15, 1, 256, None),
        (300, 70, 20, 4, 64, None),
        (13_500, 1024, 10, 4, 64, Tiling(block_rows=8, block_cols=64, num_warps=8)),
    ],
)
def test_weighted_sum_lowers_with_backward(s, c, k, heads, f, tiling):
    args = (_sds((s, heads, f), F32), _sds((c, k), I32), _sds((c, k, heads), F32))

    def fwd_bwd(h, nbr, w):
        loss = lambda h, w: jnp.sum(aggregate.weighted_sum(h, nbr, w, tiling=tiling))
        return jax.grad(loss, (0, 1))(h, w)

    assert _lowered_kernels(fwd_bwd, *args) == [
        "zerognn_weighted_sum",
        "zerognn_weighted_sum_bwd",
    ]


@pytest.mark.parametrize("s,c,k,d", [(537_000, 122_000, 5, 100), (300, 70, 20, 256)])
def test_neighbor_max_lowers_with_backward(s, c, k, d):
    args = (_sds((s, d), F32), _sds((c, k), I32), _sds((c, k), BOOL))

    def fwd_bwd(h, nbr, mask):
        return jax.grad(lambda h: jnp.sum(aggregate.neighbor_max(h, nbr, mask)))(h)

    assert _lowered_kernels(fwd_bwd, *args) == ["zerognn_neighbor_max", "zerognn_neighbor_max_bwd"]
