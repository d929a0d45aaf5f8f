"""Pallas GPU kernels (Triton lowering), each the twin of an XLA reference in `zerognn_jax`.

One module per op: `sample` (neighbour sampling), `relabel` (dedup into the next
frontier), `gather` (feature rows), `aggregate` (weighted sum and max over the fanout
axis, with Pallas backward kernels). `common` holds what the kernels share;
`counter_hash` is the project's one source of randomness, plain uint32 arithmetic that
a kernel (which has no PRNG) and its XLA twin both call, so both draw the same bits.

This package imports nothing else of `zerognn_jax` (a room of its own,
`tests/test_architecture.py`): the library's op dispatchers (`zerognn_jax/_src/ops/`)
import a kernel only when it is selected.
"""
