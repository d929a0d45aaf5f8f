"""`recommend`: each source's k best destinations by a link run's decoder.

Every destination's embedding is computed once a call (`Predictor`, exact or sampled),
then blocks of sources meet blocks of destinations on the device: the decoder scores
each source against each destination of the block (its own score function, broadcast
over the block: the dot decoders' products, or the MLP over the elementwise
products), the pairs left out are set to -inf by a scatter of their positions, and
`lax.top_k` keeps the block's best, merged with the best so far. Only [sources, k]
comes back to the host, whatever the number of destinations.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from zerognn_jax._src.data.checks import at_least_one, node_ids, rectangular
from zerognn_jax._src.data.links import transposed_hint
from zerognn_jax._src.nn.link_heads import MLPDecoder
from zerognn_jax._src.training.evaluate import Predictor
from zerognn_jax._src.training.inductive import pairs_over
from zerognn_jax._src.training.inference import check_call, require_result
from zerognn_jax._src.training.tasks.base import RanksPairs, ScoresPairs

# Destinations scored at once, and floats a block's pair intermediates ([sources,
# destinations, width] for the MLP decoder) may take; sources at once within both.
MAX_DESTINATIONS = 1 << 16
BLOCK_FLOATS = 1 << 25
MAX_SOURCES = 256


def recommend(result, sources, k: int = 10, *, exclude="train", candidates=None,
              mode: str = "full", batch_size: int = 4096, seed: int = 0,
              dataset=None) -> tuple[np.ndarray, np.ndarray]:
    """Each source's `k` best destinations by a link run's decoder score.

    Args:
      result: the `TrainResult` of a link run (`zg.train` or `zg.restore`).
      sources: int[S] source ids (a typed run's: of its relation's source type).
      k: destinations per source, at most the destination count.
      exclude: the pairs never recommended: the pairs of the run's splits named,
        "train" (its training pairs), "val", "test" (their positives) or a tuple of
        them (("train", "val") to rank for the test pairs); None (none of them); or
        int[Q, 2] (source, destination) pairs of your own. Where both ends are of one
        type a pair is unordered, so (v, u) is left out with (u, v), and a source is
        never its own destination, whatever `exclude` says.
      candidates: int[C] distinct destination ids, the only ones ranked (the items of a
        graph whose users and items share one node type, say); None: every node of
        the destination type.
      mode, batch_size, seed: how the embeddings are computed, as `zg.predict` takes
        them.
      dataset: another graph, as `zg.predict` takes it (of one node type, or a typed
        run's types and relations; the run's model over it): `sources` and the
        destinations are its nodes, and "train" in `exclude` stands for the pairs it
        already holds (its edges; a typed graph's pairs of the relation).

    Returns:
      (ids int64[S, k], scores float32[S, k]): each row's destinations by descending
      score (the decoder's logit); where fewer than k destinations are left, the row
      ends in id -1, score -inf.

    Raises:
      TypeError: `result` not a `TrainResult`.
      ValueError: a run whose task ranks no pairs, ids out of range, `k` below 1 or
        above the destination count (the candidates'), candidates given twice or none,
        `exclude` of another form ("val" or "test" with `dataset`, which has no splits),
        or `mode`, `batch_size`, `seed`, `dataset` as `predict` refuses them.
    """
    require_result("recommend", result)
    task = result.program.task
    if not (isinstance(task, ScoresPairs) and isinstance(task, RanksPairs)):
        raise ValueError(f"recommend ranks the destinations of a link run (task 'link'); "
                         f"this run's task is {type(task).__name__}")
    check_call(mode, batch_size, seed)
    program, data, (n_src, n_dst) = pairs_over(result, dataset, mode)
    task = program.task  # (a typed run's, over `dataset`)
    ends = getattr(getattr(task, "split", None), "ends", None)  # a typed split's two types
    kind = lambda end: "" if ends is None else f" ({ends[end]!r} ids)"
    sources = node_ids("sources", sources, n_src, kind(0))
    at_least_one(k, "k")
    ranked = None if candidates is None else _candidates(candidates, n_dst, kind(1))
    if k > (n_dst if ranked is None else ranked.size):
        raise ValueError("k must be at most the " + (
            f"{n_dst} destinations" if ranked is None else f"{ranked.size} candidates") +
            f"{kind(1)}, got {k}")
    named = _split_names(exclude)
    if dataset is not None and named is not None:
        if set(named) != {"train"}:
            raise ValueError(f"exclude names the run's splits, which another graph has "
                             f"not: give 'train' (its edges), None or pairs, got {exclude!r}")
        known, unordered = task.graph_pairs(dataset)
    else:
        known, unordered = task.known_pairs(named or ())
    left_out = _left_out(known if named is not None else exclude, unordered, n_src, n_dst,
                         kind)
    predictor = Predictor(program, result.variables, data, mode, batch_size, seed)
    table, offset = task.pair_table(predictor)
    variables = {n: v for n, v in result.variables.items() if n != "embedding"}
    h_src, h_dst = table[:n_src] if offset else table, table[offset:offset + n_dst]
    if ranked is None:
        return _ranked(program.model, variables, h_src, h_dst, sources, left_out,
                       sources if unordered else None, k)
    # ranked among the candidates' rows by their places, then named by their ids
    place = np.full(n_dst, -1, np.int64)
    place[ranked] = np.arange(ranked.size)
    left_out = np.stack([left_out[:, 0], place[left_out[:, 1]]], 1)
    own = place[sources] if unordered else None
    ids, scores = _ranked(program.model, variables, h_src, h_dst[jnp.asarray(ranked)],
                          sources, left_out[left_out[:, 1] >= 0], own, k)
    return np.where(ids >= 0, ranked[ids], -1), scores


def _candidates(candidates, n_dst: int, kind: str) -> np.ndarray:
    """int64[C] the destination ids `candidates`, checked: some, in range, distinct."""
    ids = node_ids("candidates", candidates, n_dst, kind).astype(np.int64)
    if not ids.size:
        raise ValueError("candidates holds no destination id: give some, or None for all")
    once, counts = np.unique(ids, return_counts=True)
    if (counts > 1).any():
        twice = np.flatnonzero(counts > 1)[0]
        raise ValueError(f"candidates must be distinct ids; {int(once[twice])} is given "
                         f"{int(counts[twice])} times")
    return ids


def _split_names(exclude) -> tuple[str, ...] | None:
    """The split names `exclude` gives ("train", or a tuple of names), None where it
    gives pairs (or None)."""
    if isinstance(exclude, str):
        return (exclude,)
    if isinstance(exclude, (tuple, list)) and exclude and \
            all(isinstance(name, str) for name in exclude):
        return tuple(exclude)
    return None


def _left_out(pairs, unordered: bool, n_src: int, n_dst: int, kind) -> np.ndarray:
    """int64[Q', 2] the pairs to leave out (both ways round where `unordered`), sorted
    by source; `pairs` None: none."""
    if pairs is None:
        return np.zeros((0, 2), np.int64)
    pairs = rectangular("exclude", pairs)
    if pairs.shape == (0,):
        pairs = np.zeros((0, 2), np.int64)
    if pairs.ndim != 2 or pairs.shape[1] != 2 or not np.issubdtype(pairs.dtype, np.integer):
        raise ValueError(f"exclude must name splits ('train', 'val', 'test'), or be None "
                         f"or int[Q, 2] (source, destination) pairs, got "
                         f"{pairs.dtype}{list(pairs.shape)}"
                         f"{transposed_hint(pairs, 'exclude takes')}")
    node_ids("exclude's source ids", pairs[:, 0], n_src, kind(0))
    node_ids("exclude's destination ids", pairs[:, 1], n_dst, kind(1))
    pairs = pairs.astype(np.int64)
    if unordered:
        pairs = np.concatenate([pairs, pairs[:, ::-1]])
    return pairs[np.argsort(pairs[:, 0], kind="stable")]


def _ranked(model, variables, h_src, h_dst, sources, left_out, own, k: int):
    """(ids, scores) of `recommend`, block by block (module docstring); `own`: each
    source's place among the destinations, which it never ranks (-1: none), or None
    where no source is a destination."""
    n_dst, width = h_dst.shape
    # as few blocks as MAX_DESTINATIONS allows, of even size (the last one padded a
    # little), each at least k wide (k <= n_dst)
    blocks = -(-n_dst // MAX_DESTINATIONS)
    block = max(-(-n_dst // blocks), k)
    # the MLP decoder's layers hold [sources, destinations, width]; a dot product's
    # multiply is fused into its sum, and holds the scores alone
    held = block * width if isinstance(getattr(model, "decoder", None), MLPDecoder) else block
    rows = int(max(1, min(MAX_SOURCES, _pow2(len(sources)), BLOCK_FLOATS // held)))
    rows = 1 << (rows.bit_length() - 1)  # a power of two: few shapes compiled
    blocks = [h_dst[first:first + block] for first in range(0, n_dst, block)]
    if blocks[-1].shape[0] < block:  # the last block, padded; its padding never ranks
        blocks[-1] = jnp.pad(blocks[-1], ((0, block - blocks[-1].shape[0]), (0, 0)))
    queued = [(np.zeros((0, k), np.float32), np.zeros((0, k), np.int64))]  # (none asked)
    # every chunk's best, read once all are queued
    for start in range(0, len(sources), rows):
        chunk = sources[start:start + rows]
        padded = np.zeros(rows, np.int32)
        padded[:len(chunk)] = chunk
        out_rows, out_cols = _chunk_pairs(chunk, left_out,
                                          None if own is None else own[start:start + rows])
        best = None
        for i, cand in enumerate(blocks):
            best = _block_best(model, variables, h_src[padded], cand, i * block,
                               min(n_dst - i * block, block), out_rows, out_cols, best, k=k)
        queued.append(best)
    scores = np.concatenate([np.asarray(s) for s, _ in queued])[:len(sources)]
    ids = np.concatenate([np.asarray(i) for _, i in queued])[:len(sources)]
    return np.where(np.isneginf(scores), -1, ids).astype(np.int64), scores


def _chunk_pairs(chunk: np.ndarray, left_out: np.ndarray, own: np.ndarray | None):
    """(rows, destinations) int32[L] of the pairs left out of a chunk of sources (and
    each source's `own` destination, where given and not -1), L a power of two, padded
    with row -1."""
    lo = np.searchsorted(left_out[:, 0], chunk, side="left")
    counts = np.searchsorted(left_out[:, 0], chunk, side="right") - lo
    rows = np.repeat(np.arange(len(chunk)), counts)
    # each source's run of left_out: its start, plus the place in the run
    at = np.repeat(lo, counts) + np.arange(rows.size) - np.repeat(np.cumsum(counts) - counts,
                                                                    counts)
    cols = left_out[at, 1]
    if own is not None:
        mine = np.flatnonzero(own >= 0)
        rows, cols = np.concatenate([rows, mine]), np.concatenate([cols, own[mine]])
    size = _pow2(max(rows.size, 1))
    out_rows, out_cols = np.full(size, -1, np.int32), np.zeros(size, np.int32)
    out_rows[:rows.size], out_cols[:rows.size] = rows, cols
    return out_rows, out_cols


@functools.partial(jax.jit, static_argnames=("model", "k"))
def _block_best(model, variables, h_src, h_dst, first, valid, out_rows, out_cols, best,
                *, k):
    """(scores, ids) float32/int32[R, k] the best of `best` (None at the first block)
    and this block's destinations (ids `first` + column, the first `valid` real),
    the pairs (out_rows, out_cols) never among them."""
    scores = model.apply(variables, h_src[:, None, :], h_dst[None, :, :],
                         method="score").astype(jnp.float32)
    cols = jnp.arange(h_dst.shape[0])
    scores = jnp.where(cols[None, :] < valid, scores, -jnp.inf)
    local = out_cols - first
    inside = (out_rows >= 0) & (local >= 0) & (local < h_dst.shape[0])
    scores = scores.at[jnp.where(inside, out_rows, scores.shape[0]), local].set(
        -jnp.inf, mode="drop")
    top, at = jax.lax.top_k(scores, k)
    at = at + first
    if best is not None:
        both_scores = jnp.concatenate([best[0], top], axis=1)
        both_ids = jnp.concatenate([best[1], at], axis=1)
        top, pick = jax.lax.top_k(both_scores, k)
        at = jnp.take_along_axis(both_ids, pick, axis=1)
    return top, at


def _pow2(n: int) -> int:
    """The least power of two >= n (n >= 1)."""
    return 1 << (int(n) - 1).bit_length()
