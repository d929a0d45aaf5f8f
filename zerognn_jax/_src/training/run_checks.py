"""What `train` checks of its arguments and options before it trains or writes anything:
arguments of the wrong kind, options that only another task, engine or model reads
(`IgnoredOptionWarning`), a built-in model the task and dataset do not take, typed-graph
options on a graph without types, and metrics no epoch reports."""

from __future__ import annotations

import dataclasses
import functools
import inspect
import os
import warnings

from zerognn_jax._src.data.checks import LibraryWarning
from zerognn_jax._src.data.loaders import is_typed, require_known
from zerognn_jax._src.data.storage import reads_as_path
from zerognn_jax._src.nn.hetero import HETERO_MODELS
from zerognn_jax._src.nn.models import MODELS
from zerognn_jax._src.training.callbacks import EarlyStopping
from zerognn_jax._src.training.config import TrainConfig
from zerognn_jax._src.training.tasks.registry import task_class
from zerognn_jax._src.training.user_frames import user_stacklevel


def options_in_the_config(train):
    """`train`, refusing `TrainConfig`'s options given as its own keyword arguments
    (`zg.train(cfg, epochs=3)`; `dataset`, a name of both, stays train's own and
    `check_arguments` refuses a name there) by a TypeError that says where they go,
    where Python's said only "unexpected keyword argument"."""
    own = inspect.signature(train).parameters
    fields = [field.name for field in dataclasses.fields(TrainConfig)]

    @functools.wraps(train)
    def checked(*args, **kwargs):
        misplaced = [name for name in kwargs if name not in own and name in fields]
        if misplaced:
            given = ", ".join(f"{name}={kwargs[name]!r}" for name in misplaced)
            raise TypeError(f"train() takes the run's options in its TrainConfig, not as "
                            f"its own arguments: got {given}; give "
                            f"zg.train(zg.TrainConfig({given}, ...)), or "
                            f"dataclasses.replace(cfg, {given}) for a config you have")
        return train(*args, **kwargs)

    return checked


def check_arguments(cfg, dataset, variables) -> None:
    """TypeError or ValueError for arguments of `train` that are not what it takes."""
    if not isinstance(cfg, TrainConfig):
        raise TypeError(f"train takes a TrainConfig as cfg, got {type(cfg).__name__}: "
                        f"build one with zg.TrainConfig(...)")
    if isinstance(dataset, (str, bytes, os.PathLike)):
        raise TypeError(f"dataset {dataset!r} is a name or a path: give it as "
                        f"TrainConfig(dataset=...) and pass no dataset")
    if variables is not None and "params" not in variables:
        raise ValueError(f"variables hold no 'params' (as restore(...).variables does): "
                         f"got {sorted(variables)}")


# Options some tasks only read, by what reads them and whether a task does (from its
# name, its class and whether its dataset is typed): set where it does not (away from
# their defaults) they are ignored.
TASK_OPTIONS = {
    "link tasks": (lambda name, task, typed: name == "link",
                   ("decoder", "negatives", "negative_mode", "link_metric")),
    "graph tasks": (lambda name, task, typed: name == "graph",
                    ("readout", "balance_window", "graph_aggregation")),
    # a task that packs whole graphs (`samples_neighbours` False) samples nothing
    "neighbour sampling": (lambda name, task, typed: getattr(task, "samples_neighbours", True),
                           ("fanouts", "relation_fanouts", "sampler", "replace", "dedup",
                            "flat_outer")),
    # the graph models (nn/graph_models.py) drop out and normalise inside their layers,
    # and have no attention heads
    "node and link models": (lambda name, task, typed: name != "graph",
                             ("input_dropout", "heads")),
    # a graph task keeps its collection's node rows on the device as given
    "the feature tables of node and link tasks": (
        lambda name, task, typed: name != "graph",
        ("normalize_features", "host_row_order", "read_ahead_gib")),
    "the models of one-type graphs' node and link tasks": (
        lambda name, task, typed: name != "graph" and not typed, ("norm",)),
}


# the built-in models that read `heads`
ATTENTION_MODELS = ("gat", "rgat")
# Options only some built-in models read: (what each is, the models that read it). Set
# for another built-in model they are warned of, not refused, so that one grid of
# options can sweep several models.
MODEL_ONLY_OPTIONS = {
    "heads": (f"attention heads of the models {', '.join(ATTENTION_MODELS)}",
              ATTENTION_MODELS),
    "attention_dropout": ("dropout on the attention coefficients of model gat", ("gat",)),
    "output_heads": ("attention heads of the output layer of model gat", ("gat",)),
}


class IgnoredOptionWarning(UserWarning):
    """An option set away from its default that only another task reads."""


def warn_unread_options(cfg: TrainConfig, dataset) -> None:
    """Warns (`IgnoredOptionWarning`) naming the options `cfg` sets that only another
    task reads (`dataset`: the one given to `train`, else `cfg.dataset` names it)."""
    defaults = {f.name: f.default for f in dataclasses.fields(TrainConfig)}
    typed = is_typed(cfg.dataset if dataset is None else dataset)
    task = task_class(cfg.task, typed=typed)  # a task no such dataset trains: its error first
    where = " of a typed graph" if typed else ""
    for readers, (reads, names) in TASK_OPTIONS.items():
        unread = [f"{n} {getattr(cfg, n)!r}" for n in names
                  if not reads(cfg.task, task, typed) and getattr(cfg, n) != defaults[n]]
        if unread:
            warnings.warn(f"{', '.join(unread)}: options of {readers}, ignored by this "
                          f"{cfg.task} task{where}", IgnoredOptionWarning,
                          stacklevel=user_stacklevel())
    scan_only = [f"{n} {getattr(cfg, n)!r}" for n in ("chunk_steps", "sample_ahead",
                                                       "read_ahead_gib")
                 if getattr(cfg, n) != defaults[n]]
    if cfg.engine != "scan" and scan_only:
        warnings.warn(f"{', '.join(scan_only)}: options of the scan engine, ignored by "
                      f"engine {cfg.engine!r}", IgnoredOptionWarning,
                      stacklevel=user_stacklevel())
    if dataset is None and cfg.root is not None and reads_as_path(cfg.dataset):
        warnings.warn(f"root {cfg.root!r}: the folder of datasets read by name, ignored "
                      f"for dataset {cfg.dataset!r}, a path read as it is given",
                      IgnoredOptionWarning, stacklevel=user_stacklevel())
    samples = getattr(task, "samples_neighbours", True)
    if cfg.flat_outer and cfg.dedup is False and samples:  # checkpoints of such runs exist
        warnings.warn("flat_outer True is ignored with dedup False: tree mode lays out every "
                      "hop in slot order already", IgnoredOptionWarning,
                      stacklevel=user_stacklevel())
    if cfg.eval_mode == "sampled" and not samples:
        warnings.warn(f"eval_mode 'sampled': this {cfg.task} task evaluates whole graphs, "
                      f"exactly ('full'; 'none' skips it)", IgnoredOptionWarning,
                      stacklevel=user_stacklevel())


def _built_in_model_options(task: str, typed: bool) -> tuple[str, ...]:
    """The options the task's built-in models read and a model of the user's replaces
    (those no model of the task reads are `TASK_OPTIONS`' to name)."""
    if task == "graph":
        return ("dropout", "readout")
    if typed:
        return ("dropout", "input_dropout", "heads", "attention_dropout", "output_heads")
    return ("dropout", "input_dropout", "norm", "heads", "activation", "attention_dropout",
            "output_heads")


def warn_unread_pieces(cfg: TrainConfig, model, optimizer, dataset, *,
                       asked_model: str | None = None) -> None:
    """Warns (`IgnoredOptionWarning`, pointing at the caller of `train`) of the options
    of `MODEL_ONLY_OPTIONS` set for a built-in model that does not read them, of the
    built-in models' options set beside a
    model of the user's (`asked_model`: the built-in model `cfg` named before the run
    filled it in, None if it named none), and of `weight_decay` set beside an optimizer
    of the user's, neither of which they reach."""
    for name, (what, readers) in MODEL_ONLY_OPTIONS.items():
        if model is None and cfg.model not in readers \
                and getattr(cfg, name) != getattr(TrainConfig, name) \
                and not (name == "heads" and cfg.task == "graph"):  # (warned of already)
            warnings.warn(f"{name} {getattr(cfg, name)!r}: {what}, ignored by model "
                          f"{cfg.model!r}", IgnoredOptionWarning,
                          stacklevel=user_stacklevel())
    unread = [f"{n} {getattr(cfg, n)!r}"
              for n in _built_in_model_options(cfg.task, is_typed(dataset))
              if getattr(cfg, n) != getattr(TrainConfig, n)]
    if asked_model is not None:
        unread.insert(0, f"model {asked_model!r}")
    if model is not None and unread:
        warnings.warn(f"{', '.join(unread)}: options of the built-in models, ignored with "
                      f"one of yours", IgnoredOptionWarning, stacklevel=user_stacklevel())
    # (lr, lr_schedule and warmup_epochs also step learnable embedding rows, which a
    # user's optimizer leaves alone)
    unread = [f"{n} {getattr(cfg, n)!r}"
              for n in ("weight_decay", "decoupled_weight_decay", "grad_clip")
              if getattr(cfg, n) != getattr(TrainConfig, n)]
    if optimizer is not None and unread:
        warnings.warn(f"{', '.join(unread)}: options of the built-in optimizer, ignored "
                      f"with one of yours", IgnoredOptionWarning, stacklevel=user_stacklevel())
    rows = [f"{n} {getattr(cfg, n)!r}" for n in ("lr_schedule", "warmup_epochs")
            if getattr(cfg, n) != getattr(TrainConfig, n)]
    if optimizer is not None and rows:
        warnings.warn(f"{', '.join(rows)}: with an optimizer of yours, these step only "
                      f"learnable embedding rows (embedding_dim, a typed graph's "
                      f"featureless types), as lr does; put a schedule in your optimizer",
                      IgnoredOptionWarning, stacklevel=user_stacklevel())


def _named(cfg, dataset) -> str:
    """The name of the dataset a run trains on, for messages: `cfg.dataset`, or the given
    dataset's name."""
    return cfg.dataset if dataset is None else getattr(dataset, "name", type(dataset).__name__)


def check_typed_options(cfg, dataset) -> None:
    """Refuses, before training (not in `prepare`: a run restored from an older
    checkpoint may have recorded it unused), relation fanouts on a dataset without
    relations, a link relation outside a typed link task and a link split outside a
    link task."""
    if cfg.link_relation is not None and (cfg.task != "link" or not is_typed(dataset)):
        raise ValueError(f"link_relation (--link-relation) names the relation a typed "
                         f"dataset's link task predicts; this run trains task "
                         f"{cfg.task!r} on {_named(cfg, dataset)!r}")
    if cfg.link_split is not None and cfg.task != "link":
        raise ValueError(f"link_split (--link-split) {cfg.link_split!r} is a split of "
                         f"pairs for the link task; this run trains task {cfg.task!r}")
    if cfg.relation_fanouts and not is_typed(dataset):
        fix = ("graph tasks sample no neighbours" if cfg.task == "graph"
               else "give fanouts (--fanouts)")
        raise ValueError(f"relation_fanouts (--relation-fanouts) samples the relations of a "
                         f"typed dataset; {_named(cfg, dataset)!r} has one node and one edge "
                         f"type: {fix}")


def patience_metric(cfg, task, dataset) -> str:
    """The metric `cfg.patience` stops the run by: its `best_metric`, else val_loss where
    `task` reports a loss, else the first of its metrics on the val split (val_auc for
    link prediction, val_rocauc for binary graph targets, ...)."""
    if cfg.best_metric:
        return cfg.best_metric
    listed = getattr(task, "metric_names", None)  # (a task of one's own may list none)
    names = tuple(listed(dataset) or ()) if listed is not None else ()
    return "val_loss" if not names or "loss" in names else f"val_{names[0]}"


def check_metrics(cfg, task, dataset, callbacks=()) -> None:
    """Refuses, before anything is trained or written, a `best_metric` (or an
    `EarlyStopping` callback's metric, or `patience_metric`) that the task's metrics
    (`metric_names`, each prefixed by a split it scores, "val_acc": its `metric_splits`,
    else train, val and test; or listed so prefixed) do not name; a plain "acc" too,
    which no epoch's record holds. A callback may also watch the training loss ("loss")
    and the batches' score ("train_batch_acc"). A task that does not list its metrics is
    not checked here."""
    listed = getattr(task, "metric_names", None)
    # (what asks, the metric, whether it may watch every record's own entries too,
    # whether its metric was chosen by the user: patience's follows best_metric's)
    asked = [(f"best_metric {cfg.best_metric!r}", cfg.best_metric, False, True)] \
        if cfg.best_metric else []
    asked += [(f"EarlyStopping's metric {cb.metric!r}", cb.metric, True, True)
              for cb in callbacks if isinstance(cb, EarlyStopping)]
    if cfg.patience:
        metric = patience_metric(cfg, task, dataset)
        asked.append((f"patience {cfg.patience}'s metric {metric!r}", metric, True, False))
    trained = ["loss", f"train_batch_{getattr(task, 'score_name', 'acc')}"]
    evaluated = ("train_", "val_", "test_")  # (a record's own entries are not)
    # the last epoch alone is evaluated: a stop there stops nothing
    unevaluated = "eval_mode is 'none'" if cfg.eval_mode == "none" else \
        f"eval_every {cfg.eval_every} evaluates the last of {cfg.epochs} epochs alone" \
        if cfg.epochs > 1 and (cfg.eval_every == 0 or cfg.eval_every >= cfg.epochs) else None
    # the node and graph tasks' splits are the dataset's own, known before training
    empty = [split for split in ("val", "test") if cfg.task in ("node", "graph")
             and getattr(dataset, f"{split}_idx", None) is not None
             and len(getattr(dataset, f"{split}_idx")) == 0]
    for what, metric, watches, chosen in asked:  # (best_metric: refused by TrainConfig)
        if watches and unevaluated and metric not in trained and metric.startswith(evaluated):
            more = ("set eval_mode 'full' or 'sampled'" if cfg.eval_mode == "none"
                    else "evaluate more often (a smaller eval_every)")
            other = f", or watch one of {', '.join(trained)}" if chosen else ""
            raise ValueError(f"{what} needs evaluation, and {unevaluated} (it would never "
                             f"stop the run): {more}{other}")
        for split in empty:
            if metric.startswith(f"{split}_"):
                never = "stop the run" if watches else "keep a best checkpoint"
                raise ValueError(f"{what} scores the {split} split, and "
                                 f"{_named(cfg, dataset)!r} has none (an empty {split}_idx): "
                                 f"it would never {never}; give the dataset a {split} split "
                                 f"or watch another metric")
    names = tuple(listed(dataset) or ()) if asked and listed is not None else ()
    if names:
        splits = getattr(task, "metric_splits", ("train", "val", "test"))
        known = [f"{split}_{name}" for split in splits for name in names]
        known += [n for n in names if n.startswith(tuple(f"{s}_" for s in splits))]
        for what, metric, watches, _ in asked:
            if metric not in known and not (watches and metric in trained):
                raise ValueError(f"{what} is not a metric this task reports; choose one of "
                                 f"{', '.join(known + (trained if watches else []))}")
    for what, metric, watches, _ in asked:  # (allowed: a study may mean it)
        if metric.startswith("test_"):
            chooses = "stops the run" if watches else "keeps the checkpoint"
            warnings.warn(f"{what} {chooses} by the test split, whose scores then no longer "
                          f"estimate unseen data: choose by a val_ metric", LibraryWarning,
                          stacklevel=user_stacklevel())


def warn_one_graph_steps(cfg, dataset, model) -> None:
    """Warns where every training step of a graph task holds one graph and a built-in
    model pools by mean: those batch-normalise the step's nodes before they pool, so a
    step's single graph pools to the normalisation's bias whatever it holds, and its loss
    cannot fall below the prior's (ln 2 for a binary target). A sum (the node count
    times the bias), a max or an attention pooling still see the graph."""
    if cfg.task != "graph" or model is not None or cfg.readout != "mean":
        return
    if min(cfg.batch_size, len(dataset.train_idx)) == 1:
        why = (f"batch_size {cfg.batch_size}" if cfg.batch_size == 1 else
               f"{dataset.name} has one training graph")
        warnings.warn(f"every training step holds one graph ({why}): model "
                      f"{cfg.model!r} batch-normalises a step's nodes before its mean "
                      f"readout pools them, so one graph pools to the same row whatever "
                      f"it holds and the model cannot learn; train on steps of two graphs "
                      f"or more, or pool by sum, max or attention", LibraryWarning,
                      stacklevel=user_stacklevel())


def check_model_choice(cfg: TrainConfig, dataset, model, typed: bool) -> None:
    """Refuses a built-in model the run's task and dataset do not take (a relational one
    off a typed graph, a graph-level one for nodes or links, a model of one-type graphs
    on a typed one), and `init` beside a model of the user's (`model`), which starts as
    its own layers say."""
    if model is not None and cfg.init != "flax":
        raise ValueError(f"init={cfg.init!r} starts the built-in models; a model of yours "
                         f"starts as its own layers say: drop init")
    if model is None and cfg.model in HETERO_MODELS and not typed and cfg.task != "graph":
        if dataset is None:  # a missing or misspelled name says so, not "one type"
            require_known(str(cfg.dataset))
        raise ValueError(f"model {cfg.model!r} is a relational model for typed datasets; "
                         f"{_named(cfg, dataset)!r} has one node and one edge type: choose "
                         f"one of {', '.join(MODELS)}")
    takes = HETERO_MODELS if typed else MODELS  # (what the built-in node and link tasks take)
    if model is None and cfg.task in ("node", "link") and cfg.model not in (None, *takes):
        # (TrainConfig takes built-in names only; a relational one off a typed graph is
        # refused above)
        kind = ("a model of one-type graphs" if cfg.model in MODELS else
                "a graph-level model (--task graph)")  # gcn is both: typed graphs get here
        raise ValueError(f"model {cfg.model!r} is {kind}; this {cfg.task} task"
                         f"{' of a typed graph' if typed else ''} takes one of "
                         f"{', '.join(takes)}")
