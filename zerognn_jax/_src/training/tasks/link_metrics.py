"""Link prediction's evaluation: decoder scores of fixed pairs, and ranking metrics.

AUC and AP over the split's positives and negatives, MRR with Hits@1/3/10 against
per-positive negatives, or Hits@K against shared negatives (OGB's definitions). A NaN
score makes every metric it enters NaN (it has no rank; sorted, it would rank highest).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from zerognn_jax._src.data.checks import is_int

SCORE_CHUNK = 1 << 16


@functools.partial(jax.jit, static_argnames=("model",))
def _score_chunk(model, variables, h, pairs):
    return model.apply(variables, h[pairs[:, 0]], h[pairs[:, 1]], method="score")


def score_pairs(model, variables, h, pairs) -> np.ndarray:
    """float32[P]: decoder scores of global-id pairs (int[P, 2]), in fixed-size chunks
    (`variables` may hold a node embedding, an input of the encoder, not of the model)."""
    variables = {k: v for k, v in variables.items() if k != "embedding"}
    pairs = np.asarray(pairs, np.int32).reshape(-1, 2)
    out = np.empty(pairs.shape[0], np.float32)
    size = min(SCORE_CHUNK, max(pairs.shape[0], 1))
    for start in range(0, pairs.shape[0], size):
        chunk = pairs[start:start + size]
        padded = np.zeros((size, 2), np.int32)
        padded[: chunk.shape[0]] = chunk
        scores = _score_chunk(model, variables, h, jnp.asarray(padded))
        out[start:start + chunk.shape[0]] = np.asarray(scores)[: chunk.shape[0]]
    return out


def split_metrics(model, variables, h, edges, metric: str) -> dict:
    """The metrics `metric` names for one EvalEdges."""
    pos = score_pairs(model, variables, h, edges.pos)
    if metric == "mrr":
        if not edges.neg_dst.shape[1]:
            raise ValueError("MRR needs per-positive negatives (neg_dst), and this split "
                             "has none: make it with mrr_negatives > 0")
        src = np.repeat(edges.pos[:, 0], edges.neg_dst.shape[1])
        pairs = np.stack([src, edges.neg_dst.reshape(-1)], 1)
        neg = score_pairs(model, variables, h, pairs).reshape(edges.neg_dst.shape)
        return mrr_metrics(pos, neg)
    neg = score_pairs(model, variables, h, edges.neg)
    if metric == "auc":
        return {"auc": scored_auc(pos, neg), "ap": scored_ap(pos, neg)}
    k = int(metric.split("@")[1])
    return {metric: hits_at_k(pos, neg, k)}


def any_nan(*scores) -> bool:
    """Whether any of the score arrays (NumPy or JAX, on the device, any float dtype)
    holds a NaN, checked where it lies and in its own dtype."""
    return any(bool((jnp if isinstance(s, jax.Array) else np).isnan(s).any()) for s in scores)


def _score_array(values, name: str, metric: str) -> np.ndarray:
    """float64[n] of a 1-D array (or list) of real scores; ValueError naming `metric`,
    `name`, the dtype and the shape otherwise (a 2-D `pos` was flattened by one metric
    and refused by NumPy in the other, a scalar met NumPy's errors)."""
    a = np.asarray(values)
    if a.ndim != 1 or not (jnp.issubdtype(a.dtype, jnp.floating)
                           or jnp.issubdtype(a.dtype, jnp.integer)):
        raise ValueError(f"{metric}: {name} must be a 1-D array of scores, got "
                         f"{a.dtype}{list(a.shape)}")
    return a.astype(np.float64)


def _scores(pos, neg, metric: str) -> tuple[np.ndarray, np.ndarray]:
    """(pos, neg) as `_score_array`s, refusing scikit-learn's (labels, scores) order: a
    boolean `pos`, or one of 0s and 1s as long as a `neg` holding a value besides 0 and 1
    (it gave a plausible wrong number). Scores of 0s and 1s on both sides (a heuristic's)
    are scores."""
    first, second = np.asarray(pos), np.asarray(neg)
    labels = first.dtype == bool
    if not labels and first.ndim == second.ndim == 1 and first.size == second.size:
        values = lambda a: set(np.unique(a).tolist())
        labels = first.dtype != object and values(first) == {0, 1} and not (
            second.dtype != object and values(second) <= {0, 1})
    if labels:
        raise ValueError(f"{metric} takes (positive scores, negative scores), not (labels, "
                         f"scores): pass {metric}(scores[labels == 1], scores[labels == 0])")
    return _score_array(first, "pos", metric), _score_array(second, "neg", metric)


def roc_auc(pos, neg) -> float:
    """Area under the ROC curve of positives over negatives (ties count one half).

    `pos` and `neg` are 1-D scores of the positive and of the negative pairs, not
    scikit-learn's (labels, scores): `roc_auc(scores[labels == 1], scores[labels == 0])`;
    a first argument that looks like labels is refused (ValueError)."""
    return scored_auc(*_scores(pos, neg, "roc_auc"))


def average_precision(pos, neg) -> float:
    """Average precision (scikit-learn's definition: sum over thresholds of recall
    steps times precision) of the 1-D scores `pos` of positives (labelled 1) and `neg`
    of negatives, taken as `roc_auc` takes them."""
    return scored_ap(*_scores(pos, neg, "average_precision"))


def scored_auc(pos, neg) -> float:
    """`roc_auc` of score arrays the library made itself (a split's, a column of node or
    graph outputs), unchecked: real scores of 0 and 1 alone are no labels there."""
    pos, neg = np.asarray(pos, np.float64), np.sort(np.asarray(neg, np.float64))
    if not pos.size or not neg.size or any_nan(pos, neg):
        return float("nan")
    below = np.searchsorted(neg, pos, side="left")
    ties = np.searchsorted(neg, pos, side="right") - below
    return float(np.mean((below + 0.5 * ties) / neg.size))


def scored_ap(pos, neg) -> float:
    """`average_precision` of score arrays the library made itself (`scored_auc`)."""
    scores = np.concatenate([np.asarray(pos, np.float64), np.asarray(neg, np.float64)])
    labels = np.concatenate([np.ones(len(pos)), np.zeros(len(neg))])
    if not len(pos) or any_nan(scores):
        return float("nan")
    order = np.argsort(-scores, kind="stable")
    scores, labels = scores[order], labels[order]
    # the end of each tie run (compared, not subtracted: inf - inf is NaN, no tie)
    last = np.r_[np.flatnonzero(scores[1:] != scores[:-1]), scores.size - 1]
    tps = np.cumsum(labels)[last]
    precision = tps / (last + 1)
    recall = tps / tps[-1]
    return float(np.sum(np.diff(np.r_[0.0, recall]) * precision))


def mrr(pos, neg) -> dict:
    """OGB's MRR protocol over scores of your own: positive i ranked among its negatives
    `neg[i]` (ties: the mean of the optimistic and pessimistic rank); {"mrr",
    "hits@1", "hits@3", "hits@10"}, as a link run with `link_metric="mrr"` reports.

    Args:
      pos: float[P], the positive pairs' scores.
      neg: float[P, M], each positive's M negatives' scores (M >= 1).

    Raises:
      ValueError: arrays of other shapes (named with theirs), or no negatives.
    """
    first = _score_array(pos, "pos", "mrr")
    second = np.asarray(neg)
    if second.ndim != 2 or second.shape[0] != first.size or not second.shape[1] or not (
            np.issubdtype(second.dtype, np.floating) or np.issubdtype(second.dtype, np.integer)):
        raise ValueError(f"mrr: neg must be [{first.size}, M] scores, M >= 1 (each "
                         f"positive's negatives), got {second.dtype}{list(second.shape)}")
    if not first.size:  # (no positive: no rank, as roc_auc's nan)
        return dict.fromkeys(("mrr", "hits@1", "hits@3", "hits@10"), float("nan"))
    return mrr_metrics(first, second.astype(np.float64))


def hits_at(pos, neg, k: int) -> float:
    """OGB's Hits@K over scores of your own: the fraction of the positives' scores `pos`
    above the K-th best of the shared negatives' `neg` (1-D both; 1.0 where fewer than
    K negatives), as a link run with `link_metric="hits@K"` reports; ValueError naming
    arrays of other shapes or a K below 1."""
    first, second = _scores(pos, neg, "hits_at")
    if not is_int(k) or k < 1:
        raise ValueError(f"hits_at: k must be an integer >= 1, got {k!r}")
    if not first.size:  # (no positive: no fraction, as roc_auc's nan)
        return float("nan")
    return hits_at_k(first, second, int(k))


def mrr_metrics(pos, neg) -> dict:
    """OGB's MRR protocol: positive i ranked among its negatives neg[i] (ties: the mean
    of the optimistic and pessimistic rank); MRR and Hits@1, 3, 10."""
    pos, neg = np.asarray(pos)[:, None], np.asarray(neg)
    if any_nan(pos, neg):
        return dict.fromkeys(("mrr", "hits@1", "hits@3", "hits@10"), float("nan"))
    rank = 0.5 * ((neg > pos).sum(1) + (neg >= pos).sum(1)) + 1
    return {"mrr": float(np.mean(1.0 / rank)), "hits@1": float(np.mean(rank <= 1)),
            "hits@3": float(np.mean(rank <= 3)), "hits@10": float(np.mean(rank <= 10))}


def hits_at_k(pos, neg, k: int) -> float:
    """OGB's Hits@K: the fraction of positives scored above the K-th best negative."""
    neg = np.asarray(neg)
    if any_nan(pos, neg):
        return float("nan")
    if neg.size < k:
        return 1.0
    kth = np.partition(neg, neg.size - k)[neg.size - k]
    return float(np.mean(np.asarray(pos) > kth))
