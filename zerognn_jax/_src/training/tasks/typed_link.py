"""Link prediction on a typed graph: pairs of one relation (src, name, dst), such as
users and the items they bought, through the typed node task's machinery (one step
body, one scan, the typed envelope, the stacked feature and embedding tables).

A step takes a slice of the shuffled training pairs (the positives), draws K negatives
each on the device (sampling/negatives.py; `destination` corrupts the dst end, `pairs`
draws both ends from their types, `shared` draws K dst nodes for the whole step), and
deduplicates the ends into level 0: one frontier per end type (one frontier when both
ends are one type). Level 0's capacities are the most distinct ends a step can hold, so
it never overflows; the levels after it are calibrated and grown as the node task's.
The relational encoder (`HeteroGNN.encode`) gives level 0's rows of both types and the
decoder scores each pair (`OnTypesLink`); the loss is binary cross-entropy, positives
and negatives weighted equally (link.py's `pair_weights`).

Seed-edge exclusion: every sampled slot of the predicted relation, or of its reverse,
that joins the two ends of a positive of the step is masked out before the model reads
the blocks (both directions where the ends are one type), as the homogeneous task does.

Evaluation embeds every node of both types, by exact layer-wise inference or (eval_mode
"sampled", or an encoder without per-layer form) from sampled neighbourhoods of each end
type's nodes in turn (`for_seeds`), and scores the split's fixed pairs
(link_metrics.py); the split comes from `typed_link_split`.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from zerognn_jax._src.data.hetero import relation_name
from zerognn_jax._src.data.hetero_dataset import HeteroDataset
from zerognn_jax._src.data.hetero_links import (
    TypedLinkSplit,
    find_relation,
    relation_pairs,
    reverse_of,
    typed_link_split,
)
from zerognn_jax._src.data.links import read_split_file
from zerognn_jax._src.data.loaders import load_hetero_dataset
from zerognn_jax._src.nn.link_heads import OnTypesLink, make_decoder
from zerognn_jax._src.ops.registry import Kernels
from zerognn_jax._src.sampling.negatives import (
    frontier_of,
    frontier_size,
    negative_pairs,
)
from zerognn_jax._src.sampling.seeds import step_items, step_keys
from zerognn_jax._src.sampling.steps import ItemLevel
from zerognn_jax._src.sampling.typed_minibatch import TypedMiniBatch, sample_typed
from zerognn_jax._src.training.tasks.base import Predictor, TaskBatch, data_log
from zerognn_jax._src.training.tasks.link import (
    EVAL_SPLITS,
    check_link_options,
    check_split_metric,
    evaluate_pairs,
    metric_names,
    pair_member,
    pair_weights,
    sorted_pairs,
    split_pairs,
    split_source,
    warn_split_file,
)
from zerognn_jax._src.training.tasks.losses import label_accuracy, sigmoid_cross_entropy
from zerognn_jax._src.training.tasks.typed_eval import (
    embeds_exactly,
    exact_outputs,
    sampled_logits,
)
from zerognn_jax._src.training.tasks.typed_node import (
    TypedInputs,
    TypedNodeTask,
    _refuse,
    typed_sampler,
)


class PairSample(NamedTuple):
    """A typed link step's sample (`TypedLinkTask.sample_pairs`).

    Attributes:
      mb: the `TypedMiniBatch` around level 0, the ends of the step's pairs.
      pairs: int32[P, 2], P = B (1 + K): each pair's positions among level 0's rows of
        its source and destination types; positives first, then negative j of
        positive i at row B + i K + j.
      labels: float32[P], 1 for positives, 0 for negatives. weight: float32[P],
        `link.pair_weights`.
      items, valid: int32[B, 2] the positive pairs (ids of the end types), bool[B].
      drop_key: the step's dropout key.
    """

    mb: TypedMiniBatch
    pairs: jax.Array
    labels: jax.Array
    weight: jax.Array
    items: jax.Array
    valid: jax.Array
    drop_key: jax.Array


@dataclasses.dataclass(frozen=True)
class _Level0:
    """A step's level 0 from its pairs, as calibration's `level0` hook takes it
    (static: hashable by the task's identity and the kernels)."""

    task: TypedLinkTask
    kernels: Kernels

    def __call__(self, items, valid, key, envelope):
        seeds, seed_valid, _, _ = self.task.level0(items, valid, key, envelope, self.kernels)
        return seeds, seed_valid


def _split(cfg, graph) -> TypedLinkSplit:
    """The split of `graph` a run trains on: read from `cfg.link_split` (whose relation
    `cfg.link_relation`, when given, must name), else drawn by `cfg.seed`."""
    if cfg.link_split is None:
        relation = find_relation(graph, cfg.link_relation)
        return typed_link_split(graph, relation, seed=cfg.seed,
                                mrr_negatives=100 if cfg.link_metric == "mrr" else 0)
    split = read_split_file(cfg.link_split, lambda path: TypedLinkSplit.load(path, graph))
    if cfg.link_relation is not None and \
            find_relation(graph, cfg.link_relation) != split.relation:
        raise ValueError(f"link_split {cfg.link_split!r} holds pairs of "
                         f"{relation_name(split.relation)}; link_relation "
                         f"{cfg.link_relation!r} names "
                         f"{relation_name(find_relation(graph, cfg.link_relation))}")
    warn_split_file(split, cfg)
    return split


@dataclasses.dataclass(frozen=True, eq=False)
class TypedLinkTask(TypedNodeTask):
    """Link prediction between the ends of one relation of a typed graph (`Task`,
    `BatchedTask`, `ScoresPairs` and `PredictsTypes`; module docstring).

    Attributes (beyond `TypedNodeTask`'s, whose `seed_type` is the ends' type, or the
    pair of them):
      split: the `TypedLinkSplit`.
      num_negatives, mode, metric: as `LinkTask`'s.
      exclude_seed_edges: hide the step's positive pairs from its message passing.
    """

    split: TypedLinkSplit | None = None
    num_negatives: int = 1
    mode: str = "destination"
    metric: str = "auc"
    exclude_seed_edges: bool = True
    name = "link"
    score_name = "pair_acc"
    metric_splits = EVAL_SPLITS  # training pairs are not scored

    def __post_init__(self):
        check_link_options(self.mode, self.num_negatives, self.metric)

    @classmethod
    def build(cls, cfg, dataset, *, loss=None, kernels=None):
        """The typed link task of `cfg` on `dataset` (default: `cfg.dataset` loaded),
        a `HeteroDataset`, split on `cfg.link_relation` at random, or as the file
        `cfg.link_split` says; the dataset comes back with the message-passing graph
        (the held-out pairs removed)."""
        del kernels
        _refuse(cfg)
        if loss is not None:
            raise ValueError("loss= applies to node tasks; link prediction trains with "
                             "binary cross-entropy over positive and negative pairs")
        if dataset is None:
            dataset = load_hetero_dataset(cfg.dataset, cfg.root, scale=cfg.scale, seed=cfg.seed,
                                          log=data_log(cfg))
        if not isinstance(dataset, HeteroDataset):
            raise TypeError(f"typed link prediction trains on a HeteroDataset, got "
                            f"{type(dataset).__name__}")
        split = _split(cfg, dataset.graph)
        check_split_metric(split, cfg.link_metric, split_source(cfg, dataset))
        dataset = dataclasses.replace(dataset, graph=split.graph)
        config = typed_sampler(cfg, dataset.graph)
        src, dst = split.ends
        seed_type = src if src == dst else (src, dst)
        inputs = TypedInputs.of(dataset, embed_all=cfg.embedding_dim > 0)
        return cls(config, seed_type, config.plan(seed_type)[-1].types, inputs,
                   sigmoid_cross_entropy, label_accuracy, split=split,
                   num_negatives=cfg.negatives, mode=cfg.negative_mode,
                   metric=cfg.link_metric), dataset

    def output_dim(self, cfg, dataset) -> int:
        """The encoder's width: `cfg.hidden`."""
        del dataset
        return cfg.hidden

    def wrap_model(self, model, cfg, kernels=None):
        """`model`, a relational encoder with `encode` (`HeteroGNN`'s), under the
        configured decoder (`OnTypesLink`)."""
        if not hasattr(model, "encode"):
            raise ValueError(f"typed link prediction needs a relational encoder with "
                             f"encode(x, layers, train=) -> {{type: rows}} (HeteroGNN's); "
                             f"{type(model).__name__} has none")
        kernels = Kernels.parse(cfg.kernels) if kernels is None else kernels
        return OnTypesLink(model, kernels, self.inputs.widths,
                           tuple(t for t, _ in self.inputs.embedded),
                           make_decoder(cfg.decoder, cfg.hidden, init=cfg.init),
                           self.split.ends)

    def device_targets(self, dataset) -> np.ndarray:
        """None on the device: a step's pair labels are built with its negatives."""
        del dataset
        return np.zeros((0,), np.int32)

    def train_items(self, dataset) -> np.ndarray:
        """The training pairs, int32[E, 2] (src id, dst id)."""
        del dataset
        return self.split.train

    def seed_capacities(self, batch_size: int):
        """Level 0's capacities for `batch_size` positives: the most distinct ends of
        their pairs, per end type (one number when both ends are one type)."""
        counts, (src, dst) = self.split.graph.num_nodes, self.split.ends
        b, k = batch_size, self.num_negatives
        if src == dst:
            return min(counts[src], frontier_size(b, k, self.mode))
        sources = b * (1 + k) if self.mode == "pairs" else b
        dests = b + k if self.mode == "shared" else b * (1 + k)
        return min(counts[src], sources), min(counts[dst], dests)

    def seed_capacity(self, batch_size: int) -> int:
        caps = self.seed_capacities(batch_size)
        return caps if isinstance(caps, int) else sum(caps)

    def pairs(self, items, valid, key):
        """(int32[B(1 + K), 2] positives then negatives, bool valid), ids of the end
        types."""
        counts, (src, dst) = self.split.graph.num_nodes, self.split.ends
        neg, neg_valid = negative_pairs(key, items, valid, counts[dst], self.num_negatives,
                                        self.mode, num_sources=counts[src])
        return jnp.concatenate([items, neg]), jnp.concatenate([valid, neg_valid])

    def level0(self, items, valid, key, envelope, kernels):
        """(seeds {type: ids}, seed_valid {type: mask}, int32[P, 2] each pair's
        positions among its ends' seeds, bool[P] valid pairs) of a step's positives."""
        pairs, pair_valid = self.pairs(items, valid, key)
        counts, (src, dst) = self.split.graph.num_nodes, self.split.ends
        caps = envelope.level(0)
        if src == dst:
            f = frontier_of(pairs, jnp.stack([pair_valid, pair_valid], 1), caps[src],
                            counts[src], kernels)
            return ({src: f.seeds}, {src: f.valid}, f.pairs.reshape(-1, 2), pair_valid)
        ends = [frontier_of(pairs[:, j], pair_valid, caps[t], counts[t], kernels)
                for j, t in enumerate((src, dst))]
        return ({src: ends[0].seeds, dst: ends[1].seeds},
                {src: ends[0].valid, dst: ends[1].valid},
                jnp.stack([ends[0].pairs, ends[1].pairs], 1), pair_valid)

    def hide_positives(self, mb: TypedMiniBatch, items, valid) -> TypedMiniBatch:
        """`mb` with every slot of the predicted relation and its reverse that joins a
        positive's two ends masked out (module docstring)."""
        relation = self.split.relation
        reverse = reverse_of(self.split.graph, relation)
        same = relation[0] == relation[2]
        a, b = items[:, 0], items[:, 1]
        if same:
            a, b = jnp.minimum(a, b), jnp.maximum(a, b)
        lo, hi = sorted_pairs(a, b, valid)
        blocks = []
        for hop, level in enumerate(mb.blocks):
            level = dict(level)
            for rel in (r for r in (relation, reverse) if r in level):
                block = level[rel]
                rows = mb.nodes[hop][rel[2]][:, None]
                nbrs = mb.nodes[hop + 1][rel[0]][block.nbr]
                u, v = (nbrs, rows) if rel == relation else (rows, nbrs)
                if same:
                    u, v = jnp.minimum(u, v), jnp.maximum(u, v)
                keep = block.mask & ~pair_member(lo, hi, u, v)
                level[rel] = block._replace(nbr=jnp.where(keep, block.nbr, 0), mask=keep)
            blocks.append(level)
        return mb._replace(blocks=tuple(blocks))

    def sample_pairs(self, graph, perm, batch_index, *, seed: int, epoch, batch_size: int,
                     envelope, kernels: Kernels, active=None) -> PairSample:
        """Batch `batch_index` of the padded permutation `perm` of positive pairs at
        `envelope`, with the keys of (`seed`, `epoch`, `batch_index`): its negatives,
        level 0 and the typed subgraph, the positives hidden (`PairSample`; what a step
        and `HeteroLinkNeighborLoader` sample)."""
        items, valid = step_items(perm, batch_index, batch_size)
        if active is not None:
            valid = valid & active
        key, drop_key = step_keys(seed, epoch, batch_index)
        seeds, seed_valid, local, pair_valid = self.level0(items, valid, key, envelope,
                                                           kernels)
        mb = sample_typed(graph, seeds, seed_valid, key, self.sampler, envelope, kernels)
        if self.exclude_seed_edges:
            mb = self.hide_positives(mb, items, valid)
        b = items.shape[0]
        labels = jnp.concatenate([jnp.ones((b,), jnp.float32),
                                  jnp.zeros((b * self.num_negatives,), jnp.float32)])
        return PairSample(mb, local, labels, pair_weights(pair_valid, self.num_negatives),
                          items, valid, drop_key)

    def sample_batch(self, program, data, perm, batch_index, epoch, envelope, active=None):
        """(TaskBatch, TypedSample, dropout key) of batch `batch_index` at `envelope`:
        labels 1 for the positives, 0 for their negatives; the model scores the pairs'
        positions among level 0's seeds."""
        out = self.sample_pairs(data.graph, perm, batch_index, seed=program.seed, epoch=epoch,
                                batch_size=program.batch_size, envelope=envelope,
                                kernels=program.kernels, active=active)
        inputs = {**self.model_inputs(data, out.mb), "pairs": out.pairs}
        return (TaskBatch(out.labels, out.weight, inputs, ItemLevel(out.items, out.valid)),
                self.sample_of(out.mb), out.drop_key)

    def level0_source(self, batch_size: int, kernels: Kernels) -> tuple:
        """(level 0's capacities, the static callable making level 0 from a step's
        pairs): the `seeds` calibration takes (`calibrate_typed`). The callable is one
        object per task and kernels, kept on the task: calibration's scan is jitted per
        callable (`jit_per_object`), so every call reuses its compilation."""
        made = self.__dict__.setdefault("_level0", {})  # (frozen: set in place)
        return self.seed_capacities(batch_size), made.setdefault(kernels, _Level0(self, kernels))

    def choose_envelope(self, program, data, dataset, cfg):
        """The typed envelope, calibrated on the steps' real level 0 (`_Level0`)."""
        del dataset
        seeds = self.level0_source(program.batch_size, program.kernels)
        return self._chosen_envelope(program, data, self.split.train, cfg, seeds)

    def metric_names(self, dataset) -> tuple[str, ...]:
        del dataset
        return metric_names(self.metric)

    def pair_counts(self) -> tuple[int, int]:
        counts = self.split.graph.num_nodes
        return tuple(counts[t] for t in self.split.ends)

    def _check_target(self, dataset) -> None:
        """(`over`: the run's seeds are its relation's ends, whatever type `dataset`
        names its target)"""

    def graph_pairs(self, dataset) -> tuple[np.ndarray, bool]:
        """(the pairs of the relation in `dataset`'s graph, whether both ends are one
        type): `RanksPairs`, what "train" leaves out of another graph's ranking."""
        src, dst = self.split.ends
        return relation_pairs(dataset.graph[self.split.relation]), src == dst

    @functools.cached_property
    def _end_views(self) -> dict[str, TypedNodeTask]:
        """{end type: a typed node task of that type's seeds}, built once: the jitted
        passes take a view as a static argument, by identity (a frozen dataclass lets
        `cached_property` write its instance dict)."""
        return {t: TypedNodeTask(self.sampler, t, self.sampler.plan(t)[-1].types,
                                 self.inputs)
                for t in dict.fromkeys(self.split.ends)}

    def for_seeds(self, node_type: str) -> TypedNodeTask:
        """`PredictsTypes`: a typed node task whose seeds are the nodes of `node_type`,
        an end of the relation, with this task's sampler and inputs (this task's model
        then gives their embeddings): what sampled inference of that end samples with,
        the same object for the same type."""
        return self._end_views[self.output_type(node_type)]

    def output_type(self, node_type: str | None) -> str:
        """`PredictsTypes`: `node_type`, which must be an end of the relation (it may be
        left out where both ends are one type)."""
        ends = tuple(dict.fromkeys(self.split.ends))
        if node_type is None and len(ends) == 1:
            return ends[0]
        if node_type is None:
            raise ValueError(f"the relation {relation_name(self.split.relation)} has two end "
                             f"types, whose rows differ: set node_type to one of "
                             f"{', '.join(ends)}")
        if node_type not in ends:
            raise ValueError(f"node_type must be an end of the relation "
                             f"{relation_name(self.split.relation)} ({', '.join(ends)}), "
                             f"got {node_type!r}")
        return node_type

    def outputs_of(self, predictor: Predictor, node_type: str, ids) -> jax.Array:
        """`PredictsTypes`: float[len(ids), hidden], the encoder's rows of the
        `node_type` nodes `ids`, exact (mode "full" with an encoder of per-layer form:
        every node embedded, then `ids` picked) or sampled with the training fanouts
        (`predictor.batch_size` nodes a step)."""
        if embeds_exactly(predictor):
            h = exact_outputs(self, predictor.program, predictor.variables, predictor.data)
            return h[node_type][jnp.asarray(ids, jnp.int32)]
        return jnp.asarray(sampled_logits(self.for_seeds(node_type), predictor.program,
                                          predictor.variables, predictor.data,
                                          np.asarray(ids, np.int32),
                                          batch_size=predictor.batch_size,
                                          seed=predictor.seed,
                                          bucketed=predictor.bucketed))

    def pair_table(self, predictor: Predictor) -> tuple[jax.Array, int]:
        """(every end node's embedding, the sources' rows first, then the destinations'
        (one type: one block, offset 0)), in the predictor's mode: `ScoresPairs`."""
        src, dst = self.split.ends
        counts = predictor.data.graph.num_nodes  # (the run's graph, or another: `over`)
        if embeds_exactly(predictor):
            h = exact_outputs(self, predictor.program, predictor.variables, predictor.data)
        else:
            h = {t: self.outputs_of(predictor, t, np.arange(counts[t]))
                 for t in dict.fromkeys((src, dst))}
        if src == dst:
            return h[src], 0
        return jnp.concatenate([h[src], h[dst]]), counts[src]

    def known_pairs(self, splits: tuple[str, ...]) -> tuple[np.ndarray, bool]:
        """(the pairs of `splits`, whether both ends are one type): `RanksPairs`."""
        src, dst = self.split.ends
        return split_pairs(self.split, splits), src == dst

    def evaluate(self, predictor: Predictor, dataset) -> dict:
        """Validation and test metrics of the split's pairs, from every node's embedding
        (both end types; exact or sampled, the predictor's mode)."""
        del dataset
        return evaluate_pairs(self, predictor)
