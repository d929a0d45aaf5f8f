"""The task seam: what every task provides, declared as a `typing.Protocol`.

An engine knows nothing of labels, losses or metrics. A task says which items an epoch
shuffles (node ids, edges, ...), how a step's items become level 0 (the frontier the
sampler starts from, with its capacity in the envelope: `SeedSource`, sampling/steps.py),
which targets live on the device, which rows of the model's outputs a step learns from
(`TaskBatch`), the per-row loss and score, and how a trained model is evaluated. It is
built from a `TrainConfig` and a dataset by `build`; registry.py maps `cfg.task` to the
task class, and nothing else looks at the task's name.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar, NamedTuple, Protocol, runtime_checkable

import flax.linen as nn
import jax
import numpy as np

from zerognn_jax._src.data.announce import Log, stderr_log
from zerognn_jax._src.data.dataset import Dataset
from zerognn_jax._src.data.graph import CSRGraph
from zerognn_jax._src.data.graphs import GraphCollection
from zerognn_jax._src.sampling.minibatch import MiniBatch
from zerognn_jax._src.sampling.steps import ItemLevel, SeedLevel


class TaskBatch(NamedTuple):
    """What a task picks for one step, on the device, with static shapes.

    Attributes:
      targets: a pytree whose leaves have one row per output row.
      weight: float32[rows], 1 for a real target row, 0 for padding (or a row's weight).
      model_inputs: keyword arguments for the model beyond (x, views, train).
      level: the step's level 0 (seeds, valid, count), as `Task.seed_level` built it.
    """

    targets: Any
    weight: jax.Array
    model_inputs: dict
    level: SeedLevel

    @property
    def seeds(self) -> jax.Array:
        """int32[S]: the level-0 node ids."""
        return self.level.seeds


class Predictor(Protocol):
    """A trained model's outputs for evaluation (evaluate.py builds it).

    `mode` is "full" (exact layer-wise when the model supports it) or "sampled";
    `program` and `variables` are the model's, for tasks that decode outputs further;
    `data`, `batch_size` and `seed` serve tasks that run the model themselves (graph
    batches, sampled typed inference).
    """

    mode: str
    program: Any
    variables: dict
    data: Any  # the run's DeviceData
    batch_size: int  # items per evaluation step
    seed: int  # the sampled passes' key

    def outputs(self, nodes) -> jax.Array:
        """float[len(nodes), ...]: the model's output rows of the node ids `nodes`."""
        ...

    def split_outputs(self, parts) -> list:
        """`outputs` of each node id array of `parts` (a dataset's splits), each as
        `outputs` gives it alone: sampled ones from one compiled program for all."""
        ...

    def all_outputs(self) -> jax.Array:
        """float[N, ...]: the output row of every node."""
        ...


class Task(Protocol):
    """What a task provides; `NodeTask` and `LinkTask` implement it.

    Attributes:
      name: the task's `cfg.task` value (registry.py).
      dedups_seeds: level 0 is a deduplicated frontier that calibration sizes
        (`SeedSource`); False: level 0 is the step's items.
      tree_by_default: `dedup=None` may pick tree (no-dedup) sampling for this task
        (`training/layout.py`).
      row_normalizes_planetoid: Planetoid features are row-normalised by default.
      loss: (outputs[rows, ...], targets[rows, ...]) -> float32[rows], per-row losses;
        the engine averages them over the rows of weight 1.
      score: the same shape of function giving a per-row score in [0, 1], or None
        when it means nothing (regression).
      score_name: what the score measures, a string; an epoch's record reports the mean
        score of its training batches as "train_batch_<score_name>" (its value None
        where `score` is None).

    A task may also define `default_model(dataset) -> str`: the built-in model a run
    trains on `dataset` (as `build` gave it) when `cfg.model` is None; without it,
    "sage" (`trainer.with_model`); and `metric_splits`, the splits whose metrics
    `evaluate` reports (without it, train, val and test: `best_metric` is checked
    against them).
    """

    name: ClassVar[str]
    dedups_seeds: ClassVar[bool]
    tree_by_default: ClassVar[bool]
    row_normalizes_planetoid: ClassVar[bool]
    loss: Callable
    score: Callable | None
    score_name: ClassVar[str]

    @classmethod
    def build(cls, cfg, dataset: Dataset | None, *, loss=None, kernels=None
              ) -> tuple[Task, Dataset]:
        """(the task of the run `cfg`, the dataset it trains on): loads `cfg.dataset`
        when `dataset` is None; the dataset may come back changed (link prediction
        trains on a message-passing graph without its held-out edges). `loss` is a
        user's loss (a task that takes none raises ValueError)."""
        ...

    def output_dim(self, cfg, dataset: Dataset) -> int:
        """The width of the model's output rows (the encoder's, for link heads)."""
        ...

    def wrap_model(self, model: nn.Module, cfg) -> nn.Module:
        """The model the step runs: `model` itself, or `model` inside a task head."""
        ...

    def device_targets(self, dataset: Dataset) -> np.ndarray:
        """The targets a step reads from `DeviceData.targets` (a host array or pytree)."""
        ...

    def train_items(self, dataset: Dataset) -> np.ndarray:
        """int32[M, ...]: the rows the engines shuffle into steps."""
        ...

    def seed_capacity(self, batch_size: int) -> int:
        """The safe size of level 0 for `batch_size` items per step."""
        ...

    def seed_level(self, items, valid, key, capacity: int) -> SeedLevel:
        """Level 0 of a step's items at `capacity` (`SeedSource.seed_level`)."""
        ...

    def batch(self, data, items, valid, key, level: SeedLevel) -> TaskBatch:
        """The step's targets, weights and model inputs for its items and level 0."""
        ...

    def restrict(self, mb: MiniBatch, batch: TaskBatch) -> MiniBatch:
        """The sampled minibatch the model may read (e.g. without the step's own edges)."""
        ...

    # Optional: `with_sampler(sampler) -> Task`, the task as the steps of the resolved
    # `SamplerConfig` run it (link prediction's seed-edge mask checks fewer slots in
    # deduplicated levels). `prepare` calls it once the level layout is chosen; a task
    # without it is used as built. `safe_for(sampler) -> Task`, also optional, is the
    # task changed only where it must be to run the steps of `sampler` correctly;
    # `StepProgram` applies it to every program it builds. `samples_neighbours`, an
    # optional class attribute: False where a step samples no neighbourhoods (graph
    # batches), so that the run's summary records no fanouts, sampler or level layout;
    # a task without it samples them.

    def metric_names(self, dataset: Dataset) -> tuple[str, ...]:
        """The names `evaluate` reports, each prefixed by its split ("val_acc", ...)."""
        ...

    def evaluate(self, predictor: Predictor, dataset: Dataset) -> dict:
        """{"<split>_<metric>": float} of the trained model (`metric_names`)."""
        ...


@runtime_checkable
class BatchedTask(Protocol):
    """A task whose steps are batches it builds itself rather than sampled
    neighbourhoods (graph-level tasks pack whole graphs); it implements `Task` as well.

    Where an engine would sample a step (`program.sample_batch`), calibrate the sampler's
    envelope or size its memory (`trainer`), it asks such a task instead; everything
    else (the step body, the scan, overflow recovery, checkpoints, callbacks) is shared.
    Its sample reads like a minibatch of one level: `nodes[-1]` and `valid[-1]` name
    the rows whose features the step gathers, `blocks` is empty, and `counts`,
    `overflow` and `num_edges()` feed the step's metrics and the envelope's growth.
    """

    def prepare_run(self, cfg, dataset, *, model, tx, kernels) -> tuple[Any, Any]:
        """(DeviceData, StepProgram) of the run `cfg` on `dataset`: `model` is the
        user's Linen model or None for the built-in `cfg.model`; `tx` the user's
        optimizer or None for the built-in one (`schedule.make_optimizer`, which the
        task may run in its own form: the graph task's runs over one flat vector)."""
        ...

    def sample_batch(self, program, data, perm, batch_index, epoch, envelope,
                     active=None) -> tuple[TaskBatch, Any, jax.Array]:
        """(task batch, sample, dropout key) of batch `batch_index` of the epoch's
        shuffled items `perm` at `envelope` (`program.sample_batch`'s contract)."""
        ...

    def choose_envelope(self, program, data, dataset, cfg) -> tuple[Any, Any]:
        """(the run's starting Envelope, its Calibration or None)."""
        ...

    def grow_envelope(self, program, envelope, counts, policy, graph=None) -> Any:
        """The envelope after a step overflowed `envelope` with the sample's `counts`
        (as `step_sums` reports them), grown by `policy` (scan.py); `graph`, the graph
        the run samples (`DeviceData.graph`), bounds what a level can hold."""
        ...

    def envelope_from(self, program, saved: dict) -> Any:
        """The envelope a checkpoint recorded ({"batch_size", "capacities"})."""
        ...

    # Optional: `envelope_bytes(program, envelope) -> int`, a step's buffer bytes at
    # `envelope`; with it the trainer checks the run against the device's memory before
    # compiling the epoch (`memory.check_step_fits`), without it the check is skipped.
    # Optional: `feature_rows(envelope) -> int`, the feature-table rows a step reads at
    # `envelope`; with it the check counts the rows a host table reads ahead too.

    def memory_report(self, program, envelope, calibration) -> dict:
        """Envelope bytes against ideal bytes at the counts calibration saw
        (`training.memory.memory_report`'s keys: "envelope_bytes", "ideal_bytes",
        "ratio")."""
        ...


@runtime_checkable
class PredictsTypes(Protocol):
    """A task on a typed graph: `zg.predict` asks it which node type a call's ids are
    of, and for those nodes' output rows."""

    def output_type(self, node_type: str | None) -> str:
        """The type whose rows `predict` gives for its `node_type` argument (None: the
        task's own choice); ValueError naming the choices where there is none."""
        ...

    def outputs_of(self, predictor: Predictor, node_type: str, ids) -> jax.Array:
        """float[len(ids), ...]: the output rows (logits, embeddings) of the
        `node_type` nodes `ids`, in the predictor's mode."""
        ...

    def for_seeds(self, node_type: str) -> SamplesSeeds:
        """The task that samples a batch whose seeds are `node_type` nodes, with this
        task's sampler and inputs, for this task's model to give their output rows
        (sampled inference, `export_model`); the same object for the same type."""
        ...


@runtime_checkable
class PredictsItems(Protocol):
    """A task whose output rows are of its own items, not of nodes (a graph task: one row
    per graph of its collection): `zg.predict` takes the items' ids and asks it."""

    item_name: ClassVar[str]  # what an id names, in messages ("graph")

    def num_items(self, dataset) -> int:
        """How many items `dataset` holds (ids lie in [0, num_items))."""
        ...

    def outputs_of_items(self, program, variables, data, dataset, ids, *,
                         batch_size: int) -> jax.Array:
        """float[len(ids), ...]: the output rows of items `ids` (evaluation mode),
        `batch_size` items a step."""
        ...


@runtime_checkable
class PredictsNewItems(Protocol):
    """A `PredictsItems` task whose trained model also serves items of another dataset
    (new graphs): `zg.predict(..., dataset=...)` asks it for their device data."""

    def data_of(self, program, data, dataset):
        """`DeviceData` of `dataset`'s items, as the model trained on `data` reads them;
        ValueError naming what `dataset` holds that the model did not train on."""
        ...


@runtime_checkable
class PredictsOtherGraphs(Protocol):
    """A typed task whose trained model also serves another typed graph of its types and
    relations (inductive inference): `zg.predict(..., dataset=...)` asks it for itself
    over that graph, and for the graph and feature table the step reads."""

    def over(self, cfg, trained, dataset, *, samples: bool = True) -> PredictsOtherGraphs:
        """The task over `dataset` for the model of run `cfg` that trained on the graph
        `trained`, to give sampled rows (`samples`) or exact ones; ValueError naming
        what `dataset` holds that the model did not train on."""
        ...

    def device_inputs(self, dataset, dtype, normalize: bool, *,
                      samples: bool = True) -> tuple[Any, np.ndarray]:
        """(the graph as the step samples it, or as exact inference reads it where it
        `samples` nothing; the feature table) of `dataset`, on the host, in `dtype`."""
        ...


class SamplesSeeds(Protocol):
    """What sampled inference and `export_model` read of a typed task's view for one
    seed type (`PredictsTypes.for_seeds`; a `TypedNodeTask`)."""

    sampler: Any  # the TypedSamplerConfig, resolved
    seed_type: str

    def sample_of(self, mb) -> Any:
        """The engines' view of a sampled `TypedMiniBatch` (what `apply_model` reads)."""
        ...

    def model_inputs(self, data, mb) -> dict:
        """The model's inputs besides its rows (the minibatch, the edges' features)."""
        ...


@runtime_checkable
class ScoresPairs(Protocol):
    """A link task: its model's decoder scores pairs of nodes from their embeddings
    (`zg.score_pairs`, and the task's own evaluation)."""

    def pair_counts(self) -> tuple[int, int]:
        """The node counts of a pair's two ends (sources, destinations)."""
        ...

    def pair_table(self, predictor: Predictor) -> tuple[jax.Array, int]:
        """(float[R, d] every end node's embedding, offset): a pair (u, v) reads rows u
        and offset + v."""
        ...


@runtime_checkable
class RanksPairs(Protocol):
    """A link task whose destinations `zg.recommend` ranks for a source: it says which
    pairs the ranking leaves out by default."""

    def known_pairs(self, splits: tuple[str, ...]) -> tuple[np.ndarray, bool]:
        """(int[Q, 2] the pairs of the named `splits`, "train", "val", "test" (the
        training pairs, an evaluation split's positives), whether a pair is unordered:
        both ends are of one type, so (v, u) is the pair (u, v) and (u, u) is none)."""
        ...

    def graph_pairs(self, dataset) -> tuple[np.ndarray, bool]:
        """(int[Q, 2] the pairs `dataset`, another graph, holds of what the run predicts
        (a one-type graph's edges; a typed graph's relation), unordered as
        `known_pairs`): what "train" leaves out of that graph's ranking."""
        ...


class ItemsAreLevel0:
    """For tasks whose level 0 is the step's items themselves, one row each (training
    nodes, graphs of a collection, target nodes of a typed graph): the `Task` methods
    that say so."""

    def train_items(self, dataset):
        return dataset.train_idx

    def seed_capacity(self, batch_size: int) -> int:
        return batch_size

    def seed_level(self, items, valid, key, capacity: int) -> ItemLevel:
        del key, capacity
        return ItemLevel(items, valid)


def data_log(cfg) -> Log | None:
    """The `log` a task's `build` gives the loaders: stderr on the first process while
    `cfg.progress` is on, so that a run that generates its dataset says so."""
    return stderr_log(cfg.progress and jax.process_index() == 0)


def require_dataset(value, task: str) -> None:
    """TypeError unless `value` is a `Dataset`, what the `task` ("node", "link") trains
    on; a `CSRGraph` given alone is told how to make one of it (its attributes were
    read as a dataset's: an AttributeError that named neither)."""
    if isinstance(value, Dataset):
        return
    hint = ""
    if isinstance(value, CSRGraph):
        hint = ("; a graph alone becomes one with its features, labels and splits: "
                "zg.make_dataset(name, g.indptr, g.indices, features, labels, train_idx, "
                "val_idx, test_idx, num_classes)")
        if task == "link":  # (the split is the task's own; no node is labelled)
            hint += (", labels all -1, the splits empty and num_classes 1 for link "
                     "prediction alone")
    elif isinstance(value, GraphCollection):
        hint = "; a collection of graphs trains with task='graph' (--task graph)"
    raise TypeError(f"the {task} task trains on a Dataset, got {type(value).__name__}{hint}")
