"""Checksums of a checkpoint's arrays, so that bytes changed on disk are found when it is
read back rather than trained on.

Each array's bits (as unsigned integers of its width; 8-byte types as two words) are
summed with odd weights modulo 2**32 on the device, under one jitted call for a whole
state: a pass over the state's bytes, no copy to the host. An odd weight times a change of
one bit (plus or minus 2**k, k < 32) is never 0 modulo 2**32, so every single flipped bit
changes the sum; a larger corruption goes unseen with a chance of about 2**-32.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

_UNSIGNED = {1: jnp.uint8, 2: jnp.uint16, 4: jnp.uint32, 8: jnp.uint32}
_MIX = np.uint32(0x9E3779B1)  # an odd multiplier spreads the positions' weights


def _checksum(x: jax.Array) -> jax.Array:
    """uint32[]: the weighted sum of `x`'s bits."""
    if x.dtype == jnp.bool_:
        bits = x.astype(jnp.uint32)
    else:  # an 8-byte type becomes two 32-bit words (a trailing axis of 2)
        bits = jax.lax.bitcast_convert_type(x, _UNSIGNED[x.dtype.itemsize])
    bits = bits.reshape(-1).astype(jnp.uint32)
    weights = jnp.arange(bits.shape[0], dtype=jnp.uint32) * _MIX | jnp.uint32(1)
    return jnp.sum(bits * weights, dtype=jnp.uint32)


@jax.jit
def _checksums(leaves: list) -> list:
    return [_checksum(x) for x in leaves]


def _device_bits(leaf):
    """`leaf` for `_checksum`: a JAX array as it is; a NumPy one (or scalar) as its bits,
    unsigned integers of its width (8-byte types as two words, in the order a bitcast
    on the device gives), so that JAX, with 64-bit types off, narrows no value first."""
    if isinstance(leaf, jax.Array):
        return leaf
    host = np.ascontiguousarray(leaf)
    words = np.uint32 if host.dtype.itemsize == 8 else np.dtype(f"u{host.dtype.itemsize}")
    shape = host.shape + ((2,) if host.dtype.itemsize == 8 else ())
    return jnp.asarray(host.reshape(-1).view(words).reshape(shape))


def state_checksums(state) -> dict[str, int]:
    """{path: checksum} of every array of `state` (paths as `jax.tree_util.keystr`
    writes them, as `checkpoint.state_spec` does), read back in one transfer."""
    pairs = jax.tree_util.tree_flatten_with_path(state)[0]
    sums = jax.device_get(_checksums([_device_bits(leaf) for _, leaf in pairs]))
    return {jax.tree_util.keystr(path): int(s) for (path, _), s in zip(pairs, sums)}


def check_checksums(epoch: int, state, saved: dict | None) -> None:
    """Raises ValueError if an array of `state` (read back from the checkpoint of `epoch`)
    has another checksum than `saved` ({path: checksum} its meta recorded; None for a
    checkpoint written before checksums: nothing to compare). Arrays whose paths `saved`
    does not name are not compared."""
    if not saved:
        return
    got = state_checksums(state)
    bad = [path for path, value in got.items() if path in saved and saved[path] != value]
    if bad:
        raise ValueError(f"checkpoint {epoch} holds other bytes than were written in "
                         f"{len(bad)} of its {len(got)} arrays (first {bad[0]}): damaged "
                         f"on disk")
