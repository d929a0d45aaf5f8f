"""Link prediction on the task seam: edge mini-batches, decoders, and ranking metrics.

Per step, the engines hand `LinkTask.batch` a slice of the shuffled training edges
(the positives). The task draws K negatives per positive on the device
(sampling/negatives.py), deduplicates every endpoint into the seed frontier (level 0
of the envelope, calibrated like the other levels), and asks the model for one score
per pair: `LinkModel` runs the encoder (any model of nn/models.py, or a user's) on the
sampled subgraph and the decoder (dot product or MLP) on each pair's two embeddings.
The loss is binary cross-entropy with logits over positives (label 1) and negatives
(label 0).

Seed-edge exclusion: `LinkTask.restrict` clears every sampled slot (row a, neighbour b)
of every block whose {a, b} is a positive pair of the step, so message passing cannot
read the edge it is asked to predict (nor its reverse). Masking after sampling leaves
such a row with one neighbour fewer than its fanout drew: a slightly smaller effective
fanout for the positives' endpoints (and GCN's weights rescale by the edges kept).

Evaluation computes every node's embedding once (exact layer-wise inference when the
encoder supports it, else sampled) and scores the split's fixed positives and
negatives: AUC and AP, MRR with Hits@1/3/10 against per-positive negatives, or Hits@K
against shared negatives (OGB's definitions).
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from zerognn_jax._src.data.links import LinkSplit
from zerognn_jax._src.ops.registry import XLA, Kernels
from zerognn_jax._src.sampling.negatives import (
    check_mode,
    endpoints_per_positive,
    negative_pairs,
    seed_frontier,
)
from zerognn_jax._src.training.task import TaskBatch, label_accuracy, sigmoid_cross_entropy

DECODERS = ("dot", "mlp")
LINK_METRICS = ("auc", "mrr", "hits@20", "hits@50", "hits@100")


# ---- decoders and the model wrapper ------------------------------------------------------

class DotDecoder(nn.Module):
    """score(u, v) = <h_u, h_v>."""

    @nn.compact
    def __call__(self, h_src, h_dst, *, train: bool = False):
        del train
        return jnp.sum(h_src.astype(jnp.float32) * h_dst.astype(jnp.float32), axis=-1)


class MLPDecoder(nn.Module):
    """score(u, v) = MLP(h_u * h_v) (OGB's link predictor): `layers` Dense layers of
    width `hidden`, ReLU and dropout between them, one output unit."""

    hidden: int
    layers: int = 2
    dropout: float = 0.0

    @nn.compact
    def __call__(self, h_src, h_dst, *, train: bool = False):
        h = h_src.astype(jnp.float32) * h_dst.astype(jnp.float32)
        for _ in range(self.layers - 1):
            h = nn.relu(nn.Dense(self.hidden)(h))
            h = nn.Dropout(self.dropout, deterministic=not train)(h)
        return nn.Dense(1)(h)[..., 0]


def make_decoder(name: str, hidden: int, dropout: float = 0.0) -> nn.Module:
    """The decoder called `name`: "dot" or "mlp"."""
    if name == "dot":
        return DotDecoder()
    if name == "mlp":
        return MLPDecoder(hidden, dropout=dropout)
    raise ValueError(f"decoder must be one of {', '.join(DECODERS)}, got {name!r}")


class LinkModel(nn.Module):
    """An encoder and a decoder: pair scores for link tasks, embeddings otherwise.

    `model(x, views, train=..., pairs=int32[P, 2])` gives float32[P] scores of pairs of
    level-0 positions; without `pairs` it gives the encoder's level-0 embeddings (what
    sampled evaluation reads). `layer` and `num_layers` are the encoder's, so exact
    layer-wise inference yields every node's embedding; `score` decodes given embeddings.
    """

    encoder: nn.Module
    decoder: nn.Module

    def __call__(self, x, views, *, train: bool, pairs=None):
        h = self.encoder(x, views, train=train)
        if pairs is None:
            return h
        return self.decoder(h[pairs[:, 0]], h[pairs[:, 1]], train=train)

    def score(self, h_src, h_dst):
        return self.decoder(h_src, h_dst, train=False)

    def layer(self, i, h_src, h_dst, view, *, train: bool):
        return self.encoder.layer(i, h_src, h_dst, view, train=train)

    @property
    def num_layers(self) -> int:
        if not hasattr(self.encoder, "layer"):
            raise AttributeError("the encoder has no layer-wise form")
        return self.encoder.num_layers

    @property
    def hidden(self) -> int:
        return getattr(self.encoder, "hidden", 0)


# ---- the task ----------------------------------------------------------------------------

def _lex_less(a_lo, a_hi, b_lo, b_hi):
    return (a_lo < b_lo) | ((a_lo == b_lo) & (a_hi < b_hi))


def pair_member(lo, hi, query_lo, query_hi):
    """bool[...]: whether (query_lo, query_hi) is a row of the lexicographically sorted
    pairs (lo[P], hi[P]); a binary search per query, log2(P) + 1 rounds."""
    p = lo.shape[0]
    left = jnp.zeros(query_lo.shape, jnp.int32)
    right = jnp.full(query_lo.shape, p, jnp.int32)
    for _ in range(max(p, 1).bit_length()):
        mid = (left + right) // 2
        m = jnp.minimum(mid, p - 1)
        go_right = _lex_less(lo[m], hi[m], query_lo, query_hi) & (left < right)
        left = jnp.where(go_right, mid + 1, left)
        right = jnp.where(go_right | (left >= right), right, mid)
    at = jnp.minimum(left, p - 1)
    return (left < p) & (lo[at] == query_lo) & (hi[at] == query_hi)


def exclude_pairs(mb, positives, valid):
    """`mb` with every sampled slot (a, b) whose {a, b} is a row of `positives`
    (int32[B, 2] global ids, bool[B] valid) masked out, in every block."""
    big = jnp.iinfo(jnp.int32).max
    lo = jnp.where(valid, jnp.minimum(positives[:, 0], positives[:, 1]), big)
    hi = jnp.where(valid, jnp.maximum(positives[:, 0], positives[:, 1]), big)
    lo, hi = jax.lax.sort((lo, hi), num_keys=2)
    blocks = []
    for hop, block in enumerate(mb.blocks):
        a = mb.nodes[hop][:, None]
        b = mb.nodes[hop + 1][block.nbr]
        hit = pair_member(lo, hi, jnp.minimum(a, b), jnp.maximum(a, b))
        mask = block.mask & ~hit
        blocks.append(block._replace(nbr=jnp.where(mask, block.nbr, 0), mask=mask))
    return mb._replace(blocks=tuple(blocks))


@dataclasses.dataclass(frozen=True, eq=False)
class LinkTask:
    """Link prediction: positives are training edges, K negatives each, one score per pair.

    Attributes:
      split: the LinkSplit (training edges, evaluation positives and negatives).
      num_negatives: K negatives per positive. mode: "destination" or "pairs"
        (sampling/negatives.py).
      metric: "auc" (AUC and AP), "mrr" (MRR, Hits@1/3/10) or "hits@K".
      exclude_seed_edges: hide the step's positive edges from its message passing.
      kernels: the implementation of the relabel op building the seed frontier.
    """

    split: LinkSplit
    num_negatives: int = 1
    mode: str = "destination"
    metric: str = "auc"
    exclude_seed_edges: bool = True
    kernels: Kernels = XLA
    name = "link"

    def __post_init__(self):
        check_mode(self.mode)
        if self.num_negatives < 1:
            raise ValueError(f"num_negatives must be >= 1, got {self.num_negatives}")
        if self.metric not in LINK_METRICS:
            raise ValueError(f"metric must be one of {', '.join(LINK_METRICS)}, got "
                             f"{self.metric!r}")

    loss = staticmethod(sigmoid_cross_entropy)
    score = staticmethod(label_accuracy)

    @property
    def num_nodes(self) -> int:
        return self.split.num_nodes

    def max_seeds(self, batch_size: int) -> int:
        """The safe seed-frontier size for `batch_size` positives."""
        return min(self.num_nodes,
                   batch_size * endpoints_per_positive(self.num_negatives, self.mode))

    def pairs(self, items, valid, key):
        """(int32[B(1 + K), 2] positives then negatives, bool valid)."""
        neg, neg_valid = negative_pairs(key, items, valid, self.num_nodes, self.num_negatives,
                                        self.mode)
        return (jnp.concatenate([items, neg]), jnp.concatenate([valid, neg_valid]))

    def seed_frontier(self, items, valid, key, capacity: int | None = None):
        """(seeds, valid) of a step at `capacity` (default: the safe size): what
        calibration samples around."""
        out = self._frontier(items, valid, key, capacity)
        return out.seeds, out.valid

    def _frontier(self, items, valid, key, capacity):
        cap = capacity or self.max_seeds(items.shape[0])
        pairs, pair_valid = self.pairs(items, valid, key)
        return seed_frontier(pairs, pair_valid, cap, self.num_nodes, self.kernels)

    def batch(self, data, items, valid, key, capacity: int | None = None) -> TaskBatch:
        """Positives `items` (int32[B, 2]), their negatives, and the seed frontier."""
        del data
        b = items.shape[0]
        _, pair_valid = self.pairs(items, valid, key)
        front = self._frontier(items, valid, key, capacity)
        labels = jnp.concatenate([jnp.ones((b,), jnp.float32),
                                  jnp.zeros((b * self.num_negatives,), jnp.float32)])
        return TaskBatch(front.seeds, front.valid, labels, self.pair_weights(pair_valid),
                         {"pairs": front.pairs}, front.count)

    def pair_weights(self, pair_valid):
        """float32[B(1 + K)]: 1 per real positive, 1/K per real negative, 0 for padding.

        Positives and negatives carry equal total weight whatever K (GAE's `pos_weight`
        balances its loss the same way); unweighted, K negatives per positive make a
        dot-product decoder without a bias minimise the loss by shrinking every
        embedding to zero (loss log 2, AUC 0.5).
        """
        b = pair_valid.shape[0] // (1 + self.num_negatives)
        scale = jnp.concatenate([jnp.ones((b,), jnp.float32),
                                 jnp.full((b * self.num_negatives,), 1.0 / self.num_negatives,
                                          jnp.float32)])
        return pair_valid.astype(jnp.float32) * scale

    def restrict(self, mb, batch: TaskBatch):
        """Hides the step's positive edges (both directions) from every block."""
        if not self.exclude_seed_edges:
            return mb
        b = batch.weight.shape[0] // (1 + self.num_negatives)
        positives = batch.seeds[batch.model_inputs["pairs"][:b]]
        return exclude_pairs(mb, positives, batch.weight[:b] > 0)

    def train_items(self, dataset):
        """The training edges, int32[E, 2]."""
        del dataset
        return self.split.train

    def evaluate(self, program, variables, data, dataset, *, mode: str, batch_size: int,
                 seed: int) -> dict:
        """Validation and test metrics of the split from every node's embedding."""
        del dataset
        if mode == "none":
            return {}
        h = node_embeddings(program, variables, data, mode=mode, batch_size=batch_size,
                            seed=seed)
        out = {}
        for name in ("val", "test"):
            edges = getattr(self.split, name)
            if edges.pos.shape[0]:
                out.update({f"{name}_{k}": v for k, v in
                            split_metrics(program, variables, h, edges, self.metric).items()})
        return out


# ---- evaluation --------------------------------------------------------------------------

def node_embeddings(program, variables, data, *, mode: str = "full", batch_size: int = 4096,
                    seed: int = 0):
    """float[N, d]: every node's embedding, layer-wise exact ("full", when the encoder
    supports it) or from sampled neighbourhoods."""
    from zerognn_jax._src.training.evaluate import (
        layerwise_logits,
        sampled_logits,
        supports_layerwise,
    )

    if mode == "full" and supports_layerwise(program.model):
        return layerwise_logits(program, variables, data)
    nodes = np.arange(data.graph.num_nodes, dtype=np.int32)
    return sampled_logits(program, variables, data, nodes, batch_size=batch_size, seed=seed)


SCORE_CHUNK = 1 << 16


@functools.partial(jax.jit, static_argnames=("model",))
def _score_chunk(model, variables, h, pairs):
    return model.apply(variables, h[pairs[:, 0]], h[pairs[:, 1]], method="score")


def score_pairs(program, variables, h, pairs) -> np.ndarray:
    """float32[P]: decoder scores of global-id pairs (int[P, 2]), in fixed-size chunks."""
    pairs = np.asarray(pairs, np.int32).reshape(-1, 2)
    out = np.empty(pairs.shape[0], np.float32)
    size = min(SCORE_CHUNK, max(pairs.shape[0], 1))
    for start in range(0, pairs.shape[0], size):
        chunk = pairs[start:start + size]
        padded = np.zeros((size, 2), np.int32)
        padded[: chunk.shape[0]] = chunk
        scores = _score_chunk(program.model, variables, h, jnp.asarray(padded))
        out[start:start + chunk.shape[0]] = np.asarray(scores)[: chunk.shape[0]]
    return out


def split_metrics(program, variables, h, edges, metric: str) -> dict:
    """The metrics `metric` names for one EvalEdges."""
    pos = score_pairs(program, variables, h, edges.pos)
    if metric == "mrr":
        if not edges.neg_dst.shape[1]:
            raise ValueError("MRR needs per-positive negatives (neg_dst), and this split "
                             "has none: make it with mrr_negatives > 0")
        src = np.repeat(edges.pos[:, 0], edges.neg_dst.shape[1])
        pairs = np.stack([src, edges.neg_dst.reshape(-1)], 1)
        neg = score_pairs(program, variables, h, pairs).reshape(edges.neg_dst.shape)
        return mrr_metrics(pos, neg)
    neg = score_pairs(program, variables, h, edges.neg)
    if metric == "auc":
        return {"auc": roc_auc(pos, neg), "ap": average_precision(pos, neg)}
    k = int(metric.split("@")[1])
    return {metric: hits_at_k(pos, neg, k)}


def roc_auc(pos, neg) -> float:
    """Area under the ROC curve of positives over negatives (ties count one half)."""
    pos, neg = np.asarray(pos, np.float64), np.sort(np.asarray(neg, np.float64))
    if not pos.size or not neg.size:
        return float("nan")
    below = np.searchsorted(neg, pos, side="left")
    ties = np.searchsorted(neg, pos, side="right") - below
    return float(np.mean((below + 0.5 * ties) / neg.size))


def average_precision(pos, neg) -> float:
    """Average precision (scikit-learn's definition: sum over thresholds of recall
    steps times precision), positives labelled 1."""
    scores = np.concatenate([np.asarray(pos, np.float64), np.asarray(neg, np.float64)])
    labels = np.concatenate([np.ones(len(pos)), np.zeros(len(neg))])
    if not len(pos):
        return float("nan")
    order = np.argsort(-scores, kind="stable")
    scores, labels = scores[order], labels[order]
    last = np.r_[np.flatnonzero(np.diff(scores)), scores.size - 1]  # end of each tie run
    tps = np.cumsum(labels)[last]
    precision = tps / (last + 1)
    recall = tps / tps[-1]
    return float(np.sum(np.diff(np.r_[0.0, recall]) * precision))


def mrr_metrics(pos, neg) -> dict:
    """OGB's MRR protocol: positive i ranked among its negatives neg[i] (ties: the mean
    of the optimistic and pessimistic rank); MRR and Hits@1, 3, 10."""
    pos, neg = np.asarray(pos)[:, None], np.asarray(neg)
    rank = 0.5 * ((neg > pos).sum(1) + (neg >= pos).sum(1)) + 1
    return {"mrr": float(np.mean(1.0 / rank)), "hits@1": float(np.mean(rank <= 1)),
            "hits@3": float(np.mean(rank <= 3)), "hits@10": float(np.mean(rank <= 10))}


def hits_at_k(pos, neg, k: int) -> float:
    """OGB's Hits@K: the fraction of positives scored above the K-th best negative."""
    neg = np.asarray(neg)
    if neg.size < k:
        return 1.0
    kth = np.partition(neg, neg.size - k)[neg.size - k]
    return float(np.mean(np.asarray(pos) > kth))


# ---- what the trainer builds -------------------------------------------------------------

def link_data(cfg, dataset=None) -> tuple[Any, LinkSplit]:
    """(dataset whose graph is the message-passing graph, LinkSplit) for a TrainConfig.

    "ogbl-collab" and "ogbl-citation2" read OGB's split (`cfg.root`); any other dataset
    is loaded as for node tasks and split at random (85/5/10, seeded by `cfg.seed`; 100
    fixed negative destinations per positive when the metric is MRR).
    """
    from zerognn_jax._src.data.dataset import make_dataset
    from zerognn_jax._src.data.links import OGBL, load_ogbl, random_link_split
    from zerognn_jax._src.data.loaders import load_dataset

    if dataset is None and cfg.dataset in OGBL:
        if cfg.root is None:
            raise ValueError(f"{cfg.dataset} is read from OGB's layout under --root")
        features, split = load_ogbl(cfg.dataset, cfg.root)
        g = split.graph
        n = g.num_nodes
        dataset = make_dataset(cfg.dataset, g.indptr, g.indices, features,
                               np.zeros(n, np.int32), np.arange(n), [], [], 1)
        return dataset, split
    if dataset is None:
        dataset = load_dataset(cfg.dataset, cfg.root, scale=cfg.scale, seed=cfg.seed)
    split = random_link_split(dataset.graph, seed=cfg.seed,
                              mrr_negatives=100 if cfg.link_metric == "mrr" else 0)
    return dataclasses.replace(dataset, graph=split.graph), split


def link_program(cfg, program, split: LinkSplit):
    """`program` with its model wrapped by the configured decoder and a LinkTask."""
    model = LinkModel(program.model, make_decoder(cfg.decoder, cfg.hidden))
    task = LinkTask(split, cfg.negatives, cfg.negative_mode, cfg.link_metric,
                    kernels=program.kernels)
    return dataclasses.replace(program, model=model, task=task)
