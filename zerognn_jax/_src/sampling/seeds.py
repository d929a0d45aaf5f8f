"""The seed schedule: which training nodes each step of an epoch trains on, and its keys.

Every engine (scan, host-mediated, data parallel, calibration) takes its seeds and its
random streams from here, so they all see the same batches for the same (seed, epoch,
batch index).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from zerognn_jax._src.pallas import counter_hash
from zerognn_jax._src.sampling.envelope import bucket


def counter_key(key) -> jax.Array:
    """uint32 scalar for the counter hash, from any key a user holds (jit-compatible).

    Takes a typed key (`jax.random.key(0)`), a legacy key (`jax.random.PRNGKey(0)`,
    uint32[2]), or an integer scalar (used as the word itself).
    """
    if isinstance(key, int | np.integer):
        if not 0 <= int(key) < 2**32:
            raise ValueError(f"an integer key must lie in [0, 2**32), got {key}")
        return jnp.uint32(key)
    if not isinstance(key, jax.Array):
        given = key
        try:
            key = jnp.asarray(key)
        except (TypeError, ValueError):  # None, a string: JAX's own message names neither
            key = None
        if key is None or not jnp.issubdtype(key.dtype, jnp.number):
            raise ValueError(f"expected a jax.random key, a legacy uint32[2] key or an "
                             f"integer scalar, got {given!r}")
    if jax.dtypes.issubdtype(key.dtype, jax.dtypes.prng_key):
        if key.shape != ():  # JAX's own message: "bits accepts a single key"
            raise ValueError(f"expected one jax.random key, got a batch of them, shape "
                             f"{list(key.shape)} (jax.random.split's; take one: keys[0])")
        return jax.random.bits(key, dtype=jnp.uint32)
    if key.shape == (2,) and key.dtype == jnp.uint32:
        return jax.random.bits(key, dtype=jnp.uint32)
    if key.shape == () and jnp.issubdtype(key.dtype, jnp.integer):
        return key.astype(jnp.uint32)
    raise ValueError(f"expected a jax.random key, a legacy uint32[2] key or an integer "
                     f"scalar, got {key.dtype}{list(key.shape)}")


def epoch_items(items: jax.Array, batch_size: int, seed, epoch) -> jax.Array:
    """int32[steps * B, ...]: the epoch's shuffled training items, padded at the end with -1.

    Items are node ids (int32[n]) or rows of ids (e.g. int32[n, 2] edges), shuffled
    along the first axis. Compiled as one program: run op by op, its dozen small
    kernels each waited for the host's dispatch (about 9 ms of GPU idle before every
    products-like epoch in an H100 profile). Python integers go as one array (one
    transfer); device or traced scalars are stacked.
    """
    return shuffled_items(items, batch_size, seed_epoch(seed, epoch))


def seed_epoch(seed, epoch):
    """int32[2] (seed, epoch): one NumPy array for Python integers, stacked for device or
    traced scalars."""
    if all(isinstance(v, (int, np.integer)) for v in (seed, epoch)):
        return np.array([seed, epoch], np.int32)
    return jnp.stack([jnp.asarray(seed, jnp.int32), jnp.asarray(epoch, jnp.int32)])


@functools.partial(jax.jit, static_argnums=1)
def shuffled_items(items: jax.Array, batch_size: int, seed_epoch: jax.Array) -> jax.Array:
    """`epoch_items` of `seed_epoch` = int32[2] (seed, epoch)."""
    steps = num_steps(items.shape[0], batch_size)
    key = jax.random.fold_in(jax.random.PRNGKey(seed_epoch[0]), seed_epoch[1])
    perm = jax.random.permutation(key, items.astype(jnp.int32), axis=0)
    pad = steps * batch_size - perm.shape[0]
    return jnp.concatenate([perm, jnp.full((pad, *perm.shape[1:]), -1, jnp.int32)])


@functools.partial(jax.jit, static_argnums=1)
def ordered_items(items: jax.Array, batch_size: int) -> jax.Array:
    """int32[steps * B, ...]: the items in their own order, padded at the end with -1
    (`epoch_items` without the shuffle: inference batches in input order)."""
    steps = num_steps(items.shape[0], batch_size)
    pad = steps * batch_size - items.shape[0]
    items = items.astype(jnp.int32)
    return jnp.concatenate([items, jnp.full((pad, *items.shape[1:]), -1, jnp.int32)])


def served_batch(batch: int, limit: int) -> int:
    """The batch a request's `batch` runs at (`serving_items`): below `limit`, rounded
    up to a power of two, at most `limit`."""
    return batch if batch >= limit else min(limit, 1 << (batch - 1).bit_length())


def serving_items(items: jax.Array, batch: int, limit: int) -> tuple[jax.Array, int]:
    """(padded items, batch) of a request of varying size (`zg.predict`): a `batch` below
    `limit` rounded up to a power of two (under twice the request: one program an
    octave, where a quarter more each took a serving process about 40 compilations
    before its requests of 1 to 4,000 nodes found their programs) and the number of
    steps to sizes that requests share (`envelope.bucket`: under 25 % more), padded with
    -1 rows and empty steps, so that a new request size seldom compiles a program of
    its own."""
    batch = served_batch(batch, limit)
    padded = ordered_items(items, batch)
    steps = bucket(padded.shape[0] // batch)
    return jnp.pad(padded, (0, steps * batch - padded.shape[0]), constant_values=-1), batch


# Batches a sampled evaluation runs a call: one program then serves every split (and
# request) whose batches come in calls of this many, however many nodes it has.
EVAL_CALL_STEPS = 8


def padded_parts(parts: list, batch: int, limit: int, bucketed: bool
                 ) -> tuple[list[jax.Array], int, int]:
    """(padded, batch, steps) of an evaluation over the id arrays `parts` (a dataset's
    splits, or one request): each part's items padded to whole batches (`serving_items`
    where `bucketed`, else `ordered_items`), the batch (a served one rounded up, the
    same for every part), and the batches a call runs: `EVAL_CALL_STEPS`, or fewer
    where a part that holds items has fewer, so that no part runs more empty batches
    than real ones (a split of 2 batches beside one of 89 ran 6 empty ones; a batch of
    every neighbour can take seconds on a CPU)."""
    padded = [serving_items(jnp.asarray(ids), batch, limit) if bucketed
              else (ordered_items(jnp.asarray(ids), batch), batch) for ids in parts]
    batch = padded[0][1]
    padded = [rows for rows, _ in padded]
    held = [rows for ids, rows in zip(parts, padded) if len(ids)] or padded
    return padded, batch, min(EVAL_CALL_STEPS, min(rows.shape[0] // batch for rows in held))


# The keys evaluation samples with: those of one step of an epoch no training reaches,
# for every batch (`sample_step`'s `key_step`), so that a node's sample, drawn by its id,
# is the same in any request and batch.
EVAL_EPOCH, EVAL_STEP = 0x7FFFFFFF, 0


def step_calls(padded, batch: int, steps: int) -> list[np.ndarray]:
    """[int32[steps * batch, ...] rows]: the batches of `padded` in calls of `steps`
    batches each (the last filled up with -1 rows, empty batches), on the host: one
    program runs every call of every part (evaluation keys every batch alike:
    `sample_step`'s `key_step`)."""
    rows = np.asarray(padded, np.int32)
    per = steps * batch
    calls = max(1, -(-rows.shape[0] // per))
    fill = np.full((calls * per - rows.shape[0], *rows.shape[1:]), -1, np.int32)
    rows = np.concatenate([rows, fill])
    return [rows[i * per:(i + 1) * per] for i in range(calls)]


def num_steps(num_train: int, batch_size: int) -> int:
    return max(1, -(-num_train // batch_size))


def step_items(perm: jax.Array, step, batch_size: int):
    """(items int32[B, ...], valid bool[B]) for step `step` of a padded permutation."""
    first = jnp.asarray(step * batch_size)
    start = (first,) + (jnp.zeros_like(first),) * (perm.ndim - 1)  # one dtype (x64 too)
    items = jax.lax.dynamic_slice(perm, start, (batch_size, *perm.shape[1:]))
    valid = jnp.all((items >= 0).reshape(batch_size, -1), axis=1)
    return jnp.maximum(items, 0), valid


def step_keys(seed: int, epoch, batch_index) -> tuple[jax.Array, jax.Array]:
    """(sampling key, dropout key) of one batch index.

    The sampling key is a uint32 counter-hash word (`counter_hash.step_key`); the dropout
    key a `jax.random` key folded from the seed, the epoch and the batch index.
    """
    key = counter_hash.step_key(seed, epoch, batch_index, 0)
    drop_key = jax.random.fold_in(jax.random.fold_in(jax.random.PRNGKey(seed), epoch),
                                  batch_index)
    return key, drop_key


# Their former names (public API): for node tasks the items are the seeds.
epoch_seeds = epoch_items
step_seeds = step_items
