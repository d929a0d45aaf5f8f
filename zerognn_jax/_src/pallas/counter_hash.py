"""Counter-based random numbers in plain uint32 arithmetic.

Every random choice of the sampler is a pure function of (seed, epoch, step, hop, node
id, slot): never of a buffer capacity or of where a node sits in a buffer. So a run with
a larger execution envelope draws exactly the same subgraphs, and a Pallas kernel (which
has no PRNG of its own) reproduces the XLA twin bit for bit by calling these functions.
Only wrapping uint32 multiply, xor, add and shifts are used, which lower everywhere.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

_GOLDEN = 0x9E3779B9


def _u32(x) -> jax.Array:
    return jnp.asarray(x).astype(jnp.uint32)


def mix32(x: jax.Array) -> jax.Array:
    """A bijective avalanche mix of uint32 words (xor-shift-multiply, two rounds)."""
    x = _u32(x)
    x = x ^ (x >> 16)
    x = x * jnp.uint32(0x7FEB352D)
    x = x ^ (x >> 15)
    x = x * jnp.uint32(0x846CA68B)
    return x ^ (x >> 16)


def hash2(a, b) -> jax.Array:
    """uint32 hash of two words; broadcasting like `a + b`."""
    return mix32(mix32(a) ^ (_u32(b) * jnp.uint32(_GOLDEN) + jnp.uint32(0x632BE5AB)))


def step_key(seed, epoch, step, hop) -> jax.Array:
    """uint32 key for one hop of one training step; all arguments are integers."""
    return hash2(hash2(hash2(seed, epoch), step), hop)


def mulhi32(a: jax.Array, b: jax.Array) -> jax.Array:
    """floor(a * b / 2**32) for uint32 a, b, in 32-bit arithmetic only."""
    a, b = _u32(a), _u32(b)
    mask = jnp.uint32(0xFFFF)
    ah, al, bh, bl = a >> 16, a & mask, b >> 16, b & mask
    mid1, mid2 = ah * bl, al * bh
    low = ((al * bl) >> 16) + (mid1 & mask) + (mid2 & mask)
    return ah * bh + (mid1 >> 16) + (mid2 >> 16) + (low >> 16)


def uniform_below(bits: jax.Array, n: jax.Array) -> jax.Array:
    """Maps uint32 random bits to an int32 in [0, n) (n >= 1), bias below n / 2**32."""
    return mulhi32(bits, _u32(n)).astype(jnp.int32)


def slot_bits(key: jax.Array, node: jax.Array, slot) -> jax.Array:
    """uint32 random bits for (key, node id, slot); broadcasting over node and slot."""
    return hash2(hash2(key, node), slot)
