"""Link prediction on the task seam: edge mini-batches, negatives, a seed frontier.

Per step, the engines hand `LinkTask.seed_level` a slice of the shuffled training
edges (the positives). The task draws K negatives per positive on the device
(sampling/negatives.py) and deduplicates every endpoint into the seed frontier (level 0
of the envelope, calibrated like the other levels); `LinkTask.batch` asks the model
for one score per pair: `LinkModel` (nn/link_heads.py) runs the encoder on the sampled
subgraph and the decoder on each pair's two embeddings. The loss is binary
cross-entropy with logits over positives (label 1) and negatives (label 0).

Seed-edge exclusion: `LinkTask.restrict` clears every sampled slot (row a, neighbour b)
of every block whose {a, b} is a positive pair of the step, so message passing cannot
read the edge it is asked to predict (nor its reverse). Masking after sampling leaves
such a row with one neighbour fewer than its fanout drew: a slightly smaller effective
fanout for the positives' endpoints (and GCN's weights rescale by the edges kept).

Evaluation computes every node's embedding once (exact layer-wise inference when the
encoder supports it, else sampled) and scores the split's fixed positives and
negatives (link_metrics.py).
"""

from __future__ import annotations

import dataclasses
import warnings

import jax
import jax.numpy as jnp
import numpy as np

from zerognn_jax._src.data.checks import LibraryWarning, at_least_one
from zerognn_jax._src.data.dataset import Dataset, make_dataset
from zerognn_jax._src.data.graph import to_edge_list
from zerognn_jax._src.data.links import (
    OGBL,
    EmptySplitWarning,
    EvalEdges,
    LinkSplit,
    edge_positions,
    load_ogbl,
    random_link_split,
    read_split_file,
    training_graph,
)
from zerognn_jax._src.data.loaders import load_dataset
from zerognn_jax._src.nn.link_heads import LinkModel, make_decoder
from zerognn_jax._src.ops.registry import XLA, Kernels
from zerognn_jax._src.sampling.minibatch import SamplerConfig
from zerognn_jax._src.sampling.negatives import (
    SeedFrontier,
    check_mode,
    frontier_size,
    negative_pairs,
    seed_frontier,
)
from zerognn_jax._src.training.tasks.base import Predictor, TaskBatch, data_log, require_dataset
from zerognn_jax._src.training.tasks.link_metrics import split_metrics
from zerognn_jax._src.training.tasks.losses import label_accuracy, sigmoid_cross_entropy
from zerognn_jax._src.training.user_frames import user_stacklevel

LINK_METRICS = ("auc", "mrr", "hits@20", "hits@50", "hits@100")
EVAL_SPLITS = ("val", "test")


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


def sorted_pairs(first, second, valid):
    """(lo, hi): the pairs (first[i], second[i]) where `valid`, sorted
    lexicographically, the invalid ones after them (int32 max), as `pair_member`
    searches them."""
    big = jnp.iinfo(jnp.int32).max
    return jax.lax.sort((jnp.where(valid, first, big), jnp.where(valid, second, big)),
                        num_keys=2)


def exclude_pairs(mb, positives, valid, positions, unique_levels: int = 1):
    """`mb` with every sampled slot (a, b) whose {a, b} is a row of `positives`
    (int32[B, 2] global ids, bool[B] valid; `positions`, int32[B, 2], their ends as rows
    of level 0) masked out, in every block.

    Every level begins with level 0's nodes, the step's endpoints (sampling keeps the
    current level as the next one's prefix). In the first `unique_levels` levels, which
    hold each node once (level 0, and every level a deduplicated hop made), an endpoint
    can only be the row of level 0 that holds it, so those blocks compare only the two
    rows of each positive with its other end (`_hide_at_rows`). A level that may repeat
    nodes (after a positional hop: tree layout, a flat outer hop) has every slot of
    every row searched. The result is the same either way.
    """
    lo, hi = sorted_pairs(jnp.minimum(positives[:, 0], positives[:, 1]),
                          jnp.maximum(positives[:, 0], positives[:, 1]), valid)
    endpoints = mb.nodes[0].shape[0]
    blocks = []
    for hop, block in enumerate(mb.blocks):
        rows = block.nbr.shape[0]
        if hop < unique_levels:
            rows = min(rows, endpoints)
            hit = _hide_at_rows(block, mb.nodes[hop + 1], positives, valid, positions, rows)
        else:
            a = mb.nodes[hop][:rows, None]
            b = mb.nodes[hop + 1][block.nbr[:rows]]
            hit = pair_member(lo, hi, jnp.minimum(a, b), jnp.maximum(a, b))
        keep = block.mask[:rows] & ~hit
        # slots masked by sampling already hold neighbour 0 (sampling/minibatch.py); the
        # rows past `rows` joined on as they are (an update of the first rows in place,
        # `.at[:rows].set`, crashed XLA's GPU compile of the sharded step, JAX 0.11.2)
        nbr = _first_rows(block.nbr, jnp.where(keep, block.nbr[:rows], 0))
        eid = None if block.eid is None else _first_rows(
            block.eid, jnp.where(keep, block.eid[:rows], jnp.zeros((), block.eid.dtype)))
        blocks.append(block._replace(nbr=nbr, mask=_first_rows(block.mask, keep), eid=eid))
    return mb._replace(blocks=tuple(blocks))


def _first_rows(array, first):
    """`array` with its first `first.shape[0]` rows replaced by `first`."""
    rows = first.shape[0]
    return first if rows == array.shape[0] else jnp.concatenate([first, array[rows:]])


def _hide_at_rows(block, next_nodes, positives, valid, positions, rows: int):
    """bool[rows, K]: the slots of `block`'s first `rows` rows (each node at most once)
    that join a valid positive's two ends: row `positions[p, 0]` holding `positives[p,
    1]`, and the reverse. B x K slots compared instead of rows x K searched."""
    # int32: a native atomic max; row `rows` is the spare one of ops/relabel.py's SPARE
    hit = jnp.zeros((rows + 1, block.nbr.shape[1]), jnp.int32)
    for end in (0, 1):
        at = positions[:, end]
        other = positives[:, 1 - end]
        match = block.mask[at] & (next_nodes[block.nbr[at]] == other[:, None])
        hit = hit.at[jnp.where(valid, at, rows)].max(match.astype(jnp.int32))
    return hit[:rows] > 0


def unique_levels(sampler: SamplerConfig) -> int:
    """How many levels, from level 0, hold each node once under `sampler`: level 0 (a
    deduplicated frontier) and each level before the first positional hop."""
    count = 1
    for positional in sampler.positional:
        if positional:
            break
        count += 1
    return count


def pair_weights(pair_valid, num_negatives: int):
    """float32[B(1 + K)]: 1 per real positive, 1/K per real negative, 0 for padding
    (and for a shared negative that hits its positive's own destination).

    Positives and negatives carry equal total weight whatever K (GAE's `pos_weight`
    balances its loss the same way); unweighted, K negatives per positive make a
    dot-product decoder without a bias minimise the loss by shrinking every
    embedding to zero (loss log 2, AUC 0.5).
    """
    b = pair_valid.shape[0] // (1 + num_negatives)
    scale = jnp.concatenate([jnp.ones((b,), jnp.float32),
                             jnp.full((b * num_negatives,), 1.0 / num_negatives, jnp.float32)])
    return pair_valid.astype(jnp.float32) * scale


def check_link_options(mode: str, num_negatives: int, metric: str) -> None:
    """ValueError for a negative mode, negative count or metric a link task lacks."""
    check_mode(mode)
    at_least_one(num_negatives, "num_negatives")
    if metric not in LINK_METRICS:
        raise ValueError(f"metric must be one of {', '.join(LINK_METRICS)}, got {metric!r}")


def check_split_metric(split, metric: str, what: str) -> None:
    """ValueError, before any training, when an evaluation split of `split` (a
    `LinkSplit` or `TypedLinkSplit` of `what`: `split_source`) lacks the negatives
    `metric` ranks its positives against: MRR needs negatives per positive (OGB's
    target_node_neg), AUC and Hits@K negative pairs (OGB's edge_neg); without them AP
    and Hits@K came out as 1.0 for any model. Warns (`EmptySplitWarning`) when a split
    has fewer negative pairs than Hits@K's K: OGB's Hits@K is then 1.0."""
    for name in EVAL_SPLITS:
        edges = getattr(split, name)
        if not edges.pos.shape[0]:
            continue
        if not edges.neg_dst.shape[1] and not edges.neg.shape[0]:
            raise ValueError(f"{what}'s {name} split has no negatives of either kind, "
                             f"neither pairs (OGB's edge_neg) nor destinations per positive "
                             f"(OGB's target_node_neg): no link_metric can score it")
        if metric == "mrr" and not edges.neg_dst.shape[1]:
            raise ValueError(f"{what}'s {name} split has no negatives per positive (OGB's "
                             f"target_node_neg), which link_metric 'mrr' ranks each positive "
                             f"against: use 'auc' or 'hits@K'")
        if metric != "mrr" and not edges.neg.shape[0]:
            raise ValueError(f"{what}'s {name} split has no negative pairs (OGB's edge_neg), "
                             f"which link_metric {metric!r} scores the positives against: "
                             f"use 'mrr'")
        k = int(metric.split("@")[1]) if metric.startswith("hits@") else 0
        if edges.neg.shape[0] < k:
            warnings.warn(f"{what}'s {name} split has {edges.neg.shape[0]} negative pairs, "
                          f"fewer than hits@{k}'s {k}: every model scores 1.0 there (OGB's "
                          f"rule); 'auc' ranks them all", EmptySplitWarning, stacklevel=3)


def metric_names(metric: str) -> tuple[str, ...]:
    """The names a split's metrics get for `metric` (link_metrics.py)."""
    if metric == "auc":
        return ("auc", "ap")
    if metric == "mrr":
        return ("mrr", "hits@1", "hits@3", "hits@10")
    return (metric,)


@dataclasses.dataclass(frozen=True, eq=False)
class LinkTask:
    """Link prediction: positives are training edges, K negatives each, one score per
    pair (`Task`).

    Attributes:
      split: the LinkSplit (training edges, evaluation positives and negatives).
      num_negatives: K negatives per positive. mode: "destination", "pairs" or
        "shared" (sampling/negatives.py).
      metric: "auc" (AUC and AP), "mrr" (MRR, Hits@1/3/10) or "hits@K".
      exclude_seed_edges: hide the step's positive edges from its message passing.
      kernels: the implementation of the relabel op building the seed frontier.
      unique_levels: how many levels hold each node once (`unique_levels` of the
        sampler, set by `with_sampler`); the seed-edge mask checks fewer slots in those
        (`exclude_pairs`). The default, 1, is right for any sampler.
    """

    split: LinkSplit
    num_negatives: int = 1
    mode: str = "destination"
    metric: str = "auc"
    exclude_seed_edges: bool = True
    kernels: Kernels = XLA
    unique_levels: int = 1
    name = "link"
    score_name = "pair_acc"  # positive and negative pairs classified by the logit's sign
    metric_splits = EVAL_SPLITS  # training pairs are not scored
    dedups_seeds = True
    tree_by_default = False  # the frontier's size varies: dedup sizes the levels after it
    row_normalizes_planetoid = False  # GAE trains on raw features

    def __post_init__(self):
        check_link_options(self.mode, self.num_negatives, self.metric)

    loss = staticmethod(sigmoid_cross_entropy)
    score = staticmethod(label_accuracy)

    @classmethod
    def build(cls, cfg, dataset: Dataset | None, *, loss=None, kernels=None
              ) -> tuple[LinkTask, Dataset]:
        """The link task of `cfg` (`link_data` gives its split and training graph)."""
        if loss is not None:
            raise ValueError("loss= applies to node tasks; link prediction trains with "
                             "binary cross-entropy over positive and negative pairs")
        dataset, split = link_data(cfg, dataset)
        check_split_metric(split, cfg.link_metric, split_source(cfg, dataset))
        return cls(split, cfg.negatives, cfg.negative_mode, cfg.link_metric,
                   kernels=kernels or XLA), dataset

    def with_sampler(self, sampler: SamplerConfig) -> LinkTask:
        """This task as the steps of `sampler` run it (`Task.with_sampler`)."""
        return dataclasses.replace(self, unique_levels=unique_levels(sampler))

    def safe_for(self, sampler: SamplerConfig) -> LinkTask:
        """This task, counting on no more deduplicated levels than `sampler` gives (its
        mask would otherwise skip rows that may hold a positive's endpoint); itself
        where it already does (`Task.safe_for`)."""
        most = unique_levels(sampler)
        return self if self.unique_levels <= most else \
            dataclasses.replace(self, unique_levels=most)

    @property
    def num_nodes(self) -> int:
        return self.split.num_nodes

    def output_dim(self, cfg, dataset: Dataset) -> int:
        """The encoder's width: `cfg.hidden`."""
        del dataset
        return cfg.hidden

    def wrap_model(self, model, cfg) -> LinkModel:
        """`model` as the encoder of the configured decoder."""
        return LinkModel(model, make_decoder(cfg.decoder, cfg.hidden, init=cfg.init))

    def device_targets(self, dataset: Dataset) -> np.ndarray:
        """None on the device: a step's pair labels are built with its negatives."""
        del dataset
        return np.zeros((0,), np.int32)

    def train_items(self, dataset: Dataset):
        """The training edges, int32[E, 2]."""
        del dataset
        return self.split.train

    def seed_capacity(self, batch_size: int) -> int:
        """The safe seed-frontier size for `batch_size` positives."""
        return min(self.num_nodes, frontier_size(batch_size, self.num_negatives, self.mode))

    def pairs(self, items, valid, key):
        """(int32[B(1 + K), 2] positives then negatives, bool valid)."""
        neg, neg_valid = negative_pairs(key, items, valid, self.num_nodes, self.num_negatives,
                                        self.mode)
        return (jnp.concatenate([items, neg]), jnp.concatenate([valid, neg_valid]))

    def seed_level(self, items, valid, key, capacity: int) -> SeedFrontier:
        """Every endpoint of the step's pairs, deduplicated into `capacity` slots."""
        pairs, pair_valid = self.pairs(items, valid, key)
        return seed_frontier(pairs, pair_valid, capacity, self.num_nodes, self.kernels)

    def batch(self, data, items, valid, key, level: SeedFrontier) -> TaskBatch:
        """Labels 1 for the positives `items` (int32[B, 2]), 0 for their negatives; the
        model scores the pairs' positions in level 0."""
        del data
        b = items.shape[0]
        _, pair_valid = self.pairs(items, valid, key)
        labels = jnp.concatenate([jnp.ones((b,), jnp.float32),
                                  jnp.zeros((b * self.num_negatives,), jnp.float32)])
        return TaskBatch(labels, self.pair_weights(pair_valid), {"pairs": level.pairs}, level)

    def pair_weights(self, pair_valid):
        """`pair_weights` with this task's K."""
        return pair_weights(pair_valid, self.num_negatives)

    def restrict(self, mb, batch: TaskBatch):
        """Hides the step's positive edges (both directions) from every block."""
        if not self.exclude_seed_edges:
            return mb
        b = batch.weight.shape[0] // (1 + self.num_negatives)
        at = batch.model_inputs["pairs"][:b]
        return exclude_pairs(mb, batch.seeds[at], batch.weight[:b] > 0, at,
                             self.unique_levels)

    def metric_names(self, dataset: Dataset) -> tuple[str, ...]:
        del dataset
        return metric_names(self.metric)

    def pair_counts(self) -> tuple[int, int]:
        return self.num_nodes, self.num_nodes

    def pair_table(self, predictor: Predictor) -> tuple[jax.Array, int]:
        """(every node's embedding, 0): `ScoresPairs`, in the predictor's mode."""
        return predictor.all_outputs(), 0

    def known_pairs(self, splits: tuple[str, ...]) -> tuple[np.ndarray, bool]:
        """(the pairs of `splits`, True): `RanksPairs`; an edge is unordered."""
        return split_pairs(self.split, splits), True

    def graph_pairs(self, dataset: Dataset) -> tuple[np.ndarray, bool]:
        """(the edges of `dataset`'s graph as (source, destination) pairs, True):
        `RanksPairs`, what "train" leaves out of another graph's ranking."""
        rows, cols = to_edge_list(dataset.graph)
        return np.stack([cols, rows], 1), True

    def evaluate(self, predictor: Predictor, dataset: Dataset) -> dict:
        """Validation and test metrics of the split from every node's embedding."""
        del dataset
        return evaluate_pairs(self, predictor)


def evaluate_pairs(task, predictor: Predictor) -> dict:
    """{"<split>_<metric>": value} of the validation and test pairs of `task.split`
    (`metric_names(task.metric)`, None for a split without pairs), scored from the
    embeddings of `task.pair_table` (`ScoresPairs`): a pair (u, v) reads rows u and
    offset + v."""
    table, shift = task.pair_table(predictor)
    out = {}
    for name in EVAL_SPLITS:
        edges = getattr(task.split, name)
        metrics = dict.fromkeys(metric_names(task.metric))  # None: a split without pairs
        if edges.pos.shape[0]:
            if shift:  # the destinations' rows follow the sources'
                edges = EvalEdges(edges.pos + [0, shift], edges.neg + [0, shift],
                                  edges.neg_dst + shift)
            metrics = split_metrics(predictor.program.model, predictor.variables, table,
                                    edges, task.metric)
        out.update({f"{name}_{k}": v for k, v in metrics.items()})
    return out


def warn_split_file(split, cfg) -> None:
    """Warns (`EmptySplitWarning`) when the split file `cfg.link_split` holds no
    validation and no test pairs: every metric of the run would be null, as the random
    split warns where its shares round down to none; and (`LibraryWarning`) when val or
    test positives of the file are training pairs too (either way round where both ends
    are of one type), which the model then passes messages over and fits: their metric
    measures what it remembers, not what it predicts."""
    if not (split.val.pos.shape[0] or split.test.pos.shape[0]):
        warnings.warn(f"link_split {cfg.link_split!r} holds no val and no test pairs: the "
                      f"run's metrics are null", EmptySplitWarning,
                      stacklevel=user_stacklevel())
    ends = getattr(split, "ends", None)  # a typed split's two types
    trained = np.asarray(split.train, np.int64)
    if ends is None or ends[0] == ends[1]:
        trained = np.concatenate([trained, trained[:, ::-1]])
    for name in ("val", "test"):
        pos = np.asarray(getattr(split, name).pos, np.int64)
        if not pos.shape[0]:
            continue
        width = int(max(trained.max(), pos.max())) + 1
        seen = np.isin(pos[:, 0] * width + pos[:, 1], trained[:, 0] * width + trained[:, 1])
        if seen.any():
            u, v = pos[np.argmax(seen)]
            warnings.warn(f"link_split {cfg.link_split!r}: {int(seen.sum())} of its "
                          f"{pos.shape[0]} {name} positives are training pairs too (the "
                          f"first: ({u}, {v})); the model trains on them, and their "
                          f"{name} metric measures what it remembers", LibraryWarning,
                          stacklevel=user_stacklevel())


def split_pairs(split, names: tuple[str, ...]) -> np.ndarray:
    """int64[Q, 2] the pairs of the splits `names` of a `LinkSplit` or `TypedLinkSplit`:
    "train" its training pairs, "val" and "test" their positives; ValueError naming an
    unknown one."""
    pairs = {"train": split.train, "val": split.val.pos, "test": split.test.pos}
    unknown = [name for name in names if name not in pairs]
    if unknown:
        raise ValueError(f"splits are named 'train', 'val' and 'test', got {unknown[0]!r}")
    return np.concatenate([np.zeros((0, 2), np.int64),
                           *(np.asarray(pairs[n], np.int64) for n in names)])


def split_source(cfg, dataset) -> str:
    """Where a run's link split comes from, for messages: the file `cfg.link_split`
    names, else the dataset it is drawn from."""
    return f"the split file {cfg.link_split}" if cfg.link_split else dataset.name


def link_data(cfg, dataset: Dataset | None = None) -> tuple[Dataset, LinkSplit]:
    """(dataset whose graph is the message-passing graph, LinkSplit) for a TrainConfig.

    "ogbl-collab" and "ogbl-citation2" read OGB's split (`cfg.root`); any other dataset
    is loaded as for node tasks and split as `cfg.link_split` (a `LinkSplit.save` file)
    gives it, else at random (85/5/10, seeded by `cfg.seed`; 100 fixed negative
    destinations per positive when the metric is MRR).
    """
    if dataset is None and cfg.dataset in OGBL:
        if cfg.link_split is not None:
            raise ValueError(f"{cfg.dataset} is read with OGB's own split; link_split "
                             f"{cfg.link_split!r} splits the other datasets")
        if cfg.root is None:
            raise ValueError(f"{cfg.dataset} is read from OGB's layout under --root")
        features, split = load_ogbl(cfg.dataset, cfg.root)
        g = split.graph
        n = g.num_nodes
        dataset = make_dataset(cfg.dataset, g.indptr, g.indices, features,
                               np.zeros(n, np.int32), np.arange(n), [], [], 1)
        return dataset, split
    if dataset is None:
        dataset = load_dataset(cfg.dataset, cfg.root, scale=cfg.scale, seed=cfg.seed,
                               log=data_log(cfg))
    require_dataset(dataset, "link")
    if cfg.link_split is None:
        split = random_link_split(dataset.graph, seed=cfg.seed,
                                  mrr_negatives=100 if cfg.link_metric == "mrr" else 0)
    else:
        split = read_split_file(cfg.link_split, LinkSplit.load)
        if split.num_nodes != dataset.num_nodes:
            raise ValueError(f"link_split {cfg.link_split!r} splits the pairs of "
                             f"{split.num_nodes} nodes; dataset {dataset.name!r} has "
                             f"{dataset.num_nodes}")
        split = _edge_tables_from(split, dataset, cfg)
        warn_split_file(split, cfg)
    return dataclasses.replace(dataset, graph=split.graph), split


def _edge_tables_from(split: LinkSplit, dataset, cfg) -> LinkSplit:
    """`split` whose message-passing graph takes its training edges' feature rows and
    weights from the dataset's graph where the split's file kept none (a split built
    over a graph without them), each pair's from its edge either way round. A training
    pair that is no edge of that graph leaves the split as it is, or, where the run
    reads edge features or draws by weight, is refused naming the pair."""
    g, graph = split.graph, dataset.graph
    wanted = [name for name in ("edge_features", "weights")
              if getattr(g, name) is None and getattr(graph, name) is not None]
    if not wanted:
        return split
    theirs = edge_positions(graph, split.train[:, 0], split.train[:, 1], either_way=True)
    if (theirs < 0).any():
        if cfg.edge_features or cfg.sampler == "weighted":
            u, v = split.train[int(np.argmax(theirs < 0))]
            raise ValueError(f"link_split {cfg.link_split!r} keeps no edge features or "
                             f"weights, and its training pair ({u}, {v}) is no edge of "
                             f"dataset {dataset.name!r}, whose {' and '.join(wanted)} it "
                             f"would take: save the split over the dataset's graph")
        return split
    ours = edge_positions(g, split.train[:, 0], split.train[:, 1])  # (its own edges)
    rows = {name: None if getattr(source, name) is None else
            np.asarray(getattr(source, name))[at]
            for name in ("edge_features", "weights")
            for source, at in [(graph, theirs) if name in wanted else (g, ours)]}
    return dataclasses.replace(split, graph=training_graph(
        split.train, split.num_nodes, rows["edge_features"], rows["weights"]))
