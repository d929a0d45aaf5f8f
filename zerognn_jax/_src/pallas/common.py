"""What the Pallas kernels share.

Every kernel takes its reference's arguments plus `interpret`. This module holds the
frozen launch configurations, the rule that shrinks blocks for small inputs, the
unroll-or-loop helper, and the data-dependent stores and atomics, which are the one
place that deals with the interpreter's gaps.

Triton lowering rules followed throughout: every block shape is a power of two (rows
and lanes are padded up and masked); randomness is the uint32 counter hash of
`counter_hash`, never a PRNG; atomics get a mask broadcast to the value shape;
integer atomics on blocks do not lower (JAX picks the float rule for any block, see
`docs/kernels.md`), so atomic minima run on float32 and atomic sums on float32 values.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental.pallas import triton as plt

# Programs a launch aims for: about four per SM on an H100/H200 (132 SMs). Blocks shrink
# below their configured size until a launch has this many (or one row per program).
TARGET_PROGRAMS = 512
# Lanes one warp handles comfortably; warps are scaled down for smaller blocks.
LANES_PER_WARP = 256
# Loops over the fanout axis up to this length are unrolled in Python (independent
# gathers in flight); longer ones become `lax.fori_loop` (an scf.for in Triton).
UNROLL_LIMIT = 16


@dataclasses.dataclass(frozen=True)
class Tiling:
    """A frozen launch configuration of one kernel.

    Attributes:
      block_rows: rows per program for large inputs (a power of two).
      block_cols: lanes per program along the feature axis (a power of two).
      num_warps: Triton warps per program for a full block.
      num_stages: Triton software-pipelining stages.
    """

    block_rows: int
    block_cols: int = 1
    num_warps: int = 4
    num_stages: int = 1

    def __post_init__(self):
        for field in ("block_rows", "block_cols", "num_warps"):
            value = getattr(self, field)
            if value < 1 or value & (value - 1):
                raise ValueError(f"Tiling.{field} must be a power of two, got {value}")


def next_pow2(n: int) -> int:
    """Smallest power of two >= n (1 for n <= 1)."""
    return 1 << max(0, int(n) - 1).bit_length()


def prev_pow2(n: int) -> int:
    """Largest power of two <= n (1 for n <= 1)."""
    return 1 << max(0, int(n).bit_length() - 1)


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def launch(tiling: Tiling, rows: int, lanes: int, col_tiles: int = 1):
    """Rows per program and Triton compiler params for `rows` rows of `lanes` lanes.

    `lanes` is the (power-of-two) width of one row's block; `col_tiles` the number of
    programs along the feature axis. Large inputs get `tiling.block_rows`; small ones
    fewer rows per program so that the grid still spreads over the device, and warps
    shrink with the block.
    """
    per_program = max(1, rows * col_tiles // TARGET_PROGRAMS)
    block_rows = min(tiling.block_rows, prev_pow2(per_program))
    warps = min(tiling.num_warps, max(1, block_rows * lanes // LANES_PER_WARP))
    params = plt.CompilerParams(num_warps=warps, num_stages=tiling.num_stages)
    return block_rows, params


def fanout_loop(n: int, body: Callable, carry):
    """`carry = body(j, carry)` for j in range(n): unrolled up to UNROLL_LIMIT, else fori."""
    if n <= UNROLL_LIMIT:
        for j in range(n):
            carry = body(j, carry)
        return carry
    return lax.fori_loop(0, n, body, carry)


def _route(ref, idx: tuple, mask: jax.Array) -> tuple:
    """`idx` with masked lanes sent one past the end of `ref`'s leading axis."""
    return (jnp.where(mask, idx[0], ref.shape[0]), *idx[1:])


def atomic(op: Callable, ref, idx: tuple, val: jax.Array, mask: jax.Array, *, interpret: bool):
    """`op` (a `plt.atomic_*`) at `ref[idx]` where `mask`, on the GPU and in the interpreter.

    On the GPU the mask is broadcast to the value's shape, as Triton requires. The
    interpreter implements no masked atomics; there masked lanes are sent out of bounds,
    where its emulation drops the update. That emulation also keeps only one update per
    index within a call, so tests feed it distinct live indices per call.
    """
    if interpret:
        return op(ref, _route(ref, idx, mask), val)
    return op(ref, idx, val, mask=jnp.broadcast_to(mask, val.shape))


def scatter(ref, idx: tuple, val: jax.Array, mask: jax.Array, *, interpret: bool) -> None:
    """Stores `val` at `ref[idx]` where `mask`; indices may be data dependent.

    The interpreter emulates a masked store by writing the old value back, which can
    undo a live lane's store to the same index; masked lanes are sent out of bounds
    there (the emulation drops those writes). On the GPU the mask stops them.
    """
    if interpret:
        idx = _route(ref, idx, mask)
    plt.store(ref.at[idx], val, mask=jnp.broadcast_to(mask, val.shape))
