"""The user-facing training loop: config in, trained model and per-epoch records out.

`train(cfg, dataset)` builds everything from the config; a user's Flax model (Linen or
NNX), optax optimizer and loss replace the built-in ones (`model=`, `optimizer=`,
`loss=`; training/user.py), and `callbacks=` see every epoch's record (callbacks.py).
docs/api.md shows each.
"""

from __future__ import annotations

import dataclasses
import inspect
import numbers
import os
import time
import warnings
from pathlib import Path
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax

from zerognn_jax._src.data.announce import announced, stderr_log
from zerognn_jax._src.data.dataset import Dataset
from zerognn_jax._src.data.graph import without_self_loops
from zerognn_jax._src.data.links import read_split_file, split_digest
from zerognn_jax._src.data.loaders import is_typed, row_normalize
from zerognn_jax._src.data.storage import reads_as_path
from zerognn_jax._src.nn.bridge import as_linen, model_name
from zerognn_jax._src.nn.layerwise import layer_count
from zerognn_jax._src.nn.models import (
    EDGE_MODELS,
    GNN,
    OWN_TERM_MODELS,
    count_params,
    make_model,
)
from zerognn_jax._src.ops.host_rows import device_bytes, is_host_resident
from zerognn_jax._src.ops.registry import Kernels
from zerognn_jax._src.sampling.calibrate import choose_envelope
from zerognn_jax._src.sampling.minibatch import SamplerConfig, prepare_graph
from zerognn_jax._src.training import interrupts, memory
from zerognn_jax._src.training.callbacks import (
    EarlyStopping,
    check_callbacks,
    replay_early_stopping,
    reset_callbacks,
    run_callbacks,
)
from zerognn_jax._src.training.checkpoint_errors import CheckpointWarning
from zerognn_jax._src.training.checks import (
    check_items,
    check_output_dim,
    check_pieces,
    init_checked,
)
from zerognn_jax._src.training.config import PATHS, TrainConfig
from zerognn_jax._src.training.embeddings import NodeEmbedding
from zerognn_jax._src.training.engines import make_engine
from zerognn_jax._src.training.evaluate import (
    Predictor,
)
from zerognn_jax._src.training.layout import choose_layout
from zerognn_jax._src.training.lock import hold_outputs
from zerognn_jax._src.training.parallel import (
    check_same_across_processes,
    make_mesh,
    run_shards,
)
from zerognn_jax._src.training.placement import (
    add_drawn_counts,
    cache_budget,
    choose_placement,
    place_features,
    warn_unsplit,
    warn_unused_cache,
)
from zerognn_jax._src.training.program import (
    DeviceData,
    StepProgram,
    saved_envelope,
)
from zerognn_jax._src.training.progress import epoch_progress, phase
from zerognn_jax._src.training.rebuild import read_from_path, rebuild_record
from zerognn_jax._src.training.records import (
    MetricsLog,
    TensorBoardLog,
    check_output_paths,
    check_tensorboard,
    remove_if_empty,
    strict,
)
from zerognn_jax._src.training.run_checks import (
    check_arguments,
    check_metrics,
    check_model_choice,
    check_typed_options,
    options_in_the_config,
    patience_metric,
    warn_one_graph_steps,
    warn_unread_options,
    warn_unread_pieces,
)
from zerognn_jax._src.training.scan import read_ahead_bytes
from zerognn_jax._src.training.schedule import make_optimizer, step_size
from zerognn_jax._src.training.summary import run_notes, run_summary
from zerognn_jax._src.training.tasks.base import BatchedTask, PredictsTypes
from zerognn_jax._src.training.tasks.node import has_missing
from zerognn_jax._src.training.tasks.registry import task_class
from zerognn_jax._src.training.user import check_optimizer, start_from, user_identity
from zerognn_jax._src.training.user_frames import user_stacklevel

PLANETOID = ("cora", "citeseer", "pubmed")


@dataclasses.dataclass
class TrainResult:
    """What `train` (and `restore`) return: the model variables ({"params",
    "batch_stats" if any}), one record per epoch, a summary, the step program and device
    data they run with (for `sampled_logits`, `layerwise_logits`, the engines), the whole
    train state (optimizer state included) and the dataset.

    The device data (graph and feature table) stay on the device as long as the result
    is referenced: drop it (`del result`) before training another large graph in the
    same process, or both tables must fit at once."""

    variables: dict
    history: list[dict]
    summary: dict
    program: Any = None
    data: Any = None
    state: Any = None
    dataset: Any = None

    def __repr__(self) -> str:  # what the run gave, not its arrays (a notebook prints it)
        s = self.summary if isinstance(self.summary, dict) else {}
        dataset = s.get("dataset", getattr(self.dataset, "name", None))
        params = s.get("params", count_params((self.variables or {}).get("params", {})))
        scores = "".join(f", {k}={float(v):.4g}" for k, v in s.items()
                         if k.startswith(("val_", "test_")) and isinstance(v, numbers.Real)
                         and not isinstance(v, bool))
        return (f"TrainResult(dataset={dataset!r}, task={s.get('task')!r}, "
                f"model={s.get('model')!r}, params={params}, "
                f"epochs={len(self.history or ())}{scores})")


def row_normalizes(cfg: TrainConfig, dataset, task) -> bool | None:
    """Whether the run trains on its feature rows each divided by its sum: as
    `normalize_features` says, or by default where the dataset's name is a Planetoid one
    and the task asks for it (node tasks, as in the GCN paper; not link prediction, as in
    GAE: docs/link_prediction.md). None for a task that samples no neighbourhoods (graph
    batches, whose node rows stay as given)."""
    if not getattr(task, "samples_neighbours", True):
        return None
    if cfg.normalize_features is not None:
        return cfg.normalize_features
    return dataset.name in PLANETOID and task.row_normalizes_planetoid


def prepare(cfg: TrainConfig, dataset: Dataset | None = None, *, model=None, optimizer=None,
            loss=None):
    """Loads the data and builds (dataset, device data, step program).

    The task class registered as `cfg.task` builds the task and the dataset it trains on
    (`Task.build`: link prediction's graph is the split's message-passing graph), says
    which targets go to the device and wraps the model in its head. `model`,
    `optimizer`, `loss` replace the built-in ones (`train`); an NNX model is wrapped
    into Linen (nn/bridge.py). A `BatchedTask` (graph batches) prepares its own device
    data and program.
    """
    kernels = Kernels.parse(cfg.kernels)
    given = dataset is not None
    typed = is_typed(cfg.dataset if dataset is None else dataset)
    check_model_choice(cfg, dataset, model, typed)
    task, dataset = task_class(cfg.task, typed=typed).build(cfg, dataset, loss=loss,
                                                            kernels=kernels)
    items = task.train_items(dataset)
    check_items(task, items)
    check_output_dim(task, task.output_dim(cfg, dataset))
    cfg = fit_batch(with_model(cfg, task, dataset, user_model=model is not None), items)
    if isinstance(task, BatchedTask):
        if optimizer is not None:
            check_optimizer(optimizer)
        model = model and as_linen(model)
        if model is not None and getattr(task, "samples_neighbours", True):
            _check_layer_count(model, cfg.layers)  # (a typed graph's module)
        if model is not None and isinstance(task, PredictsTypes):
            _check_typed_layer(model)
        data, program = task.prepare_run(cfg, dataset, model=model, tx=optimizer,
                                         kernels=kernels)
        return dataset, data, program
    # The graph the step samples: for gcn and gat without self-loops, each node's own
    # term once, as PyG's layers give it (add_remaining_self_loops). The dataset stays
    # as given: its statistics are the run's identity in checkpoints.
    own_term = model is None and cfg.model in OWN_TERM_MODELS
    source = without_self_loops(dataset.graph) if own_term else dataset.graph
    feats = dataset.features
    if feats.shape[1] == 0 and not cfg.embedding_dim and model is None:
        read = (f" (read from {os.path.abspath(cfg.dataset)})"
                if not given and read_from_path(cfg) else "")
        raise ValueError(f"dataset {dataset.name!r}{read} has no feature columns (features "
                         f"{list(feats.shape)}) and the run learns no node embedding: set "
                         f"embedding_dim (--embedding-dim) or give the nodes features")
    if row_normalizes(cfg, dataset, task):
        feats = row_normalize(feats, default_for=(dataset.name if cfg.normalize_features
                                                  is None else None))
    targets = task.device_targets(dataset)
    edge_dim = _edge_dim(cfg, dataset, user_model=model is not None)
    sampler = SamplerConfig(cfg.fanouts, replace=cfg.replace, method=cfg.sampler,
                            edge_ids=edge_dim is not None)
    sampler = sampler.resolve(source.max_degree())
    dtype = jnp.dtype(cfg.dtype)
    # An edge-feature table no model reads stays on the host; a read one goes in `dtype`
    # (a table already in it, memory-mapped say, is uploaded as it is: no host copy).
    edges = (None if edge_dim is None
             else np.asarray(source.edge_features).astype(dtype, copy=False))
    graph = source._replace(edge_features=edges)
    resident = memory.resident_bytes(graph, feats.shape[1], cfg.dtype,
                                     level_dims(cfg, dataset, task, model),
                                     embedding_dim=cfg.embedding_dim)
    limit = memory.device_memory_limit()
    placement = choose_placement(cfg.feature_placement, resident, limit,
                                 sharded=cfg.shard_features, columns=feats.shape[1])
    warn_unused_cache(cfg.feature_cache_gib, placement, cfg.host_row_order, cfg.read_ahead_gib)
    cache = cache_budget(cfg.feature_cache_gib, placement, resident, limit)
    layout = choose_layout(cfg, task, sampler, cfg.batch_size, dataset.graph.num_nodes,
                           dedup=cfg.dedup, user_model=model is not None,
                           host_features=placement.where == "host")
    sampler = layout.apply(sampler)
    if hasattr(task, "with_sampler"):
        task = task.with_sampler(sampler)
    graph = prepare_graph(graph, sampler)
    built_in = model is None
    model = _model_for(cfg, task, dataset, model, dtype, edge_dim)
    if optimizer is not None:
        check_optimizer(optimizer)
    # the built-in GNN takes features and embedding rows as a pair (models.GNN); a
    # user's model, a GNN subclass included, gets their concatenation
    rate = step_size(cfg, task, dataset)
    embedding = (NodeEmbedding(cfg.embedding_dim, rate, cfg.dtype,
                               apart=built_in and isinstance(model, GNN))
                 if cfg.embedding_dim else None)
    program = StepProgram(task.wrap_model(model, cfg), optimizer or make_optimizer(cfg, rate),
                          sampler, cfg.batch_size, cfg.seed, kernels, task=task, layout=layout,
                          embedding=embedding, placement=placement,
                          self_loops_dropped=own_term)
    return dataset, *_placed(cfg, program, graph, feats, targets, placement, cache)


def _model_for(cfg, task, dataset, model, dtype, edge_dim):
    """The run's Linen model: the built-in `cfg.model` where `model` is None, else the
    user's (an NNX one wrapped), whose `num_layers`, where it has one, must be the hops
    the run samples."""
    if model is None:
        return make_model(cfg.model, hidden=cfg.hidden, num_layers=cfg.layers,
                          num_classes=task.output_dim(cfg, dataset), dropout=cfg.dropout,
                          input_dropout=cfg.input_dropout, norm=cfg.norm, heads=cfg.heads,
                          dtype=dtype, edge_dim=edge_dim, init=cfg.init,
                          activation=cfg.activation, attention_dropout=cfg.attention_dropout,
                          output_heads=cfg.output_heads)
    model = as_linen(model)
    _check_layer_count(model, cfg.layers)
    return model


def _check_typed_layer(model) -> None:
    """ValueError where a typed graph's module has a `layer` that cannot take the typed
    per-layer protocol's (i, h, layer, *, train): exact evaluation calls it after the
    last epoch, where a homogeneous model's layer(i, h_src, h_dst, view) failed with a
    bare TypeError and the run's training was lost without a checkpoint. A wrapper that
    takes any arguments (an NNX module's) is not checked."""
    layer = getattr(model, "layer", None)
    if layer is None or not callable(layer):
        return
    try:
        signature = inspect.signature(layer)
    except (TypeError, ValueError):  # (a callable Python cannot introspect)
        return
    try:
        signature.bind(0, {}, None, train=False)
    except TypeError as err:
        raise ValueError(f"the model {model_name(model)}'s layer{signature} cannot take a "
                         f"typed graph's layer(i, h, layer, *, train) ({err}), which exact "
                         f"evaluation calls after training: give it that signature, or "
                         f"remove it to evaluate on sampled neighbourhoods") from None


def _check_layer_count(model, layers: int) -> None:
    """ValueError where a user's model that offers the per-layer protocol declares
    another `num_layers` than the `layers` hops the run samples: exact inference runs
    `num_layers` layers, and a model handed fewer views than its layers returned a
    hidden layer's rows (named as an output of the wrong width)."""
    count = layer_count(model)
    if count is not None and count != layers:
        raise ValueError(f"the model's num_layers is {count} and the run samples "
                         f"{layers} hops (layers={layers}, one fanout each): "
                         f"exact evaluation runs num_layers layers, a training step "
                         f"one per hop; make them agree")


def _placed(cfg, program, graph, feats, targets, placement, cache) -> tuple:
    """(device data, program): the graph, feature table and targets where `placement`
    puts them (the table in host memory with a device cache of `cache` bytes, or on the
    device), on one device or over the mesh of `cfg.devices` (`program` then runs on it)."""
    mesh = make_mesh(cfg.devices)
    warn_unsplit(cfg.shard_features, mesh.size)
    one_device = mesh.size == 1 and not cfg.shard_features
    dtype = jnp.dtype(cfg.dtype)
    if placement.where == "host" or one_device:
        # A host table is one that every device reads, each with its own copy of the
        # cache. Its rows go in order of how often a node is drawn as a neighbour (as a
        # typed graph's: TypedInputs.degrees); on an undirected graph that is its own
        # neighbour count, but not on a directed one.
        degree = None
        if placement.where == "host":
            degree = np.zeros(graph.num_nodes, np.int64)
            add_drawn_counts(degree, graph.indices)
        table = place_features(feats, dtype, placement,
                               announce=cfg.progress and jax.process_index() == 0,
                               cache_bytes=cache, degree=degree,
                               row_order=cfg.host_row_order)
    else:  # split or copied over the mesh below
        table = np.asarray(feats).astype(dtype, copy=False)  # no copy of a table in `dtype`
    if one_device:
        return DeviceData(graph.to_device(), table, jnp.asarray(targets)), program
    program = program.with_mesh(mesh, shard_features=cfg.shard_features)
    return program.parallel.place_data(DeviceData(graph, table, targets)), program


def fit_batch(cfg: TrainConfig, items) -> TrainConfig:
    """`cfg` with `batch_size` lowered to the training `items` a device gets where it
    asks for more: one step takes them all either way, but the step's buffers, sized by
    the batch, held that many rows of padding (a probe's `batch_size` 200000 on 2,938
    items: 45x the epoch, 7x the memory). The program, its envelope and the summary's
    `batch_size` and `global_batch` take the lowered size; the run's options (the
    summary's `config`) and its checkpoints' identity (`asked_global_batch`) keep the
    size asked."""
    most = max(1, -(-len(items) // run_shards(cfg.devices)))
    return cfg if cfg.batch_size <= most else dataclasses.replace(cfg, batch_size=most)


def asked_global_batch(cfg: TrainConfig, program) -> int:
    """The global batch a run's checkpoints are compared by: `cfg.batch_size` (as
    asked, before `fit_batch`) times the program's devices, so that the checkpoints of a
    run whose batch exceeds its items resume and restore as they did before the batch
    was fitted, on any device count of the same global batch."""
    return cfg.batch_size * program.num_shards


def with_model(cfg: TrainConfig, task, dataset, *, user_model: bool = False) -> TrainConfig:
    """`cfg` with its model named: `cfg.model`, or the default of `task` (built) for
    `dataset` (the one its `build` gave) when `cfg.model` is None: its
    `default_model(dataset)`, or "sage" for a task without one (`Task`). With a model of
    the user's (`user_model`) the field is not read, and is "sage", as the runs of such
    models recorded before per-task defaults (their checkpoints compare it)."""
    if cfg.model is not None:
        return cfg
    default = None if user_model else getattr(task, "default_model", None)
    return dataclasses.replace(cfg, model=default(dataset) if default else "sage")


def _edge_dim(cfg: TrainConfig, dataset: Dataset, *, user_model: bool) -> int | None:
    """The width of the edge features the model reads (`cfg.edge_features`), or None."""
    if not cfg.edge_features:
        return None
    table = dataset.graph.edge_features
    if table is None:
        raise ValueError(f"edge_features is set (--edge-features), and dataset "
                         f"{dataset.name!r} has no "
                         f"edge-feature table (CSRGraph.edge_features)")
    if not user_model and cfg.model not in EDGE_MODELS:
        raise ValueError(f"edge_features is set (--edge-features), and model {cfg.model!r} "
                         f"reads none; "
                         f"models that do: {', '.join(EDGE_MODELS)}")
    return int(table.shape[1])


def level_dims(cfg: TrainConfig, dataset: Dataset, task, model=None) -> tuple[int, ...]:
    """Feature width held at each level, seeds first (for the memory model): the task's
    output width (`Task.output_dim`), then hidden layers, then the input features. A
    user's model is taken to be `model.hidden` wide if it says so, else `cfg.hidden`
    (an estimate: the memory check cannot see it). The input rows carry the node
    embedding after the features (`cfg.embedding_dim`)."""
    out = task.output_dim(cfg, dataset)
    hidden = getattr(model, "hidden", None)
    hidden = hidden if isinstance(hidden, int) else cfg.hidden
    return (out, *([hidden] * (cfg.layers - 1)),
            dataset.features.shape[1] + cfg.embedding_dim)


def evaluate(cfg: TrainConfig, program, variables, data, dataset) -> dict:
    """The task's metrics under `cfg.eval_mode` ({} for "none")."""
    if cfg.eval_mode == "none":
        return {}
    predictor = Predictor(program, variables, data, cfg.eval_mode, cfg.eval_batch_size,
                          cfg.seed)
    return program.task.evaluate(predictor, dataset)


def _variables(state) -> dict:
    out = {"params": state.params}
    if state.batch_stats:
        out["batch_stats"] = state.batch_stats
    if state.embedding is not None:
        out["embedding"] = state.embedding
    return out


class Diverged(FloatingPointError):
    """The training loss became NaN or infinite; nothing of that epoch was saved."""


def _saved(state) -> dict:
    """The part of the train state a checkpoint holds."""
    saved = {"params": state.params, "batch_stats": state.batch_stats,
             "opt_state": state.opt_state}
    if state.embedding is not None:
        saved.update(embedding=state.embedding, embedding_opt=state.embedding_opt)
    return saved


@dataclasses.dataclass(frozen=True)
class _UserParts:
    """What the caller of `train` brought besides the config."""

    identity: dict  # what the checkpoint identity adds for them
    model: str | None  # the user's model class, None for the built-in one
    callbacks: tuple = ()
    variables: dict | None = None  # to start from (fine-tuning)
    dataset_given: bool = False  # a Dataset passed to train(), not loaded by cfg.dataset


@options_in_the_config
def train(cfg: TrainConfig, dataset: Dataset | None = None, *, model=None, optimizer=None,
          loss=None, variables: dict | None = None, callbacks=()) -> TrainResult:
    """Trains on `dataset` (default: `cfg.dataset` loaded); resumes from
    `cfg.checkpoint_dir` if it holds a checkpoint of this run.

    Args:
      cfg: every option of the run.
      dataset: a `Dataset` (class labels, or float targets: `Dataset.with_targets`).
      model: your Flax model instead of `cfg.model`: a `flax.linen.Module` or a
        `flax.nnx.Module` instance (wrapped with `flax.nnx.bridge`, nn/bridge.py), called
        as `model(x, views, train=...)` (nn/models.py gives the interface). Without
        `layer` and `num_layers` methods, evaluation samples (the summary says so).
      optimizer: an optax `GradientTransformation` (schedules, clipping, ...) instead of
        Adam with `cfg.lr` and `cfg.weight_decay`.
      loss: a built-in name ("cross_entropy", "sigmoid", "mse"; "mae" too on a graph
        task), a per-row function
        `(outputs, targets) -> float32[rows]`, or a `NodeTask`; default: the loss of the
        dataset's targets.
      variables: model variables to start from (e.g. `restore(...).variables`, for
        fine-tuning) instead of a fresh initialisation, the node embedding too where
        the run has one ("embedding"); the optimizers start afresh. A
        checkpoint in `cfg.checkpoint_dir` takes precedence (the run resumes, with a
        `CheckpointWarning`).
      callbacks: functions called with each epoch's record; a true result stops training
        after that epoch (callbacks.py, `EarlyStopping`).

    Output paths are checked before anything else, and held for the run (training/lock.py:
    a second run on the same checkpoint folder or metrics file is refused). Folders made
    for them, and a metrics file it created, are removed again when the run fails or is
    refused before writing into them. Inside `interrupts.deferred()` (the CLI) a SIGINT
    or SIGTERM stops the run between phases and chunks.

    Raises:
      ValueError: unusable data, loss or output paths; output paths in use by another
        run (`OutputsInUse`); a checkpoint of another run (`CheckpointMismatch`) or none
        readable.
      TypeError: a model, optimizer, loss or callback of the wrong kind.
      ImportError: `cfg.tensorboard_dir` without tensorboardX installed.
      Diverged: the loss became NaN or infinite.
      interrupts.Interrupted: a signal arrived inside `interrupts.deferred()`.
    """
    check_arguments(cfg, dataset, variables)
    check_same_across_processes(_shared_options(cfg))
    warn_unread_options(cfg, dataset)
    lead = jax.process_index() == 0  # one writer when several processes train together
    metrics = Path(cfg.metrics_out) if lead and cfg.metrics_out else None
    new_metrics = metrics is not None and not metrics.exists()
    created = check_output_paths(cfg.metrics_out if lead else None, cfg.checkpoint_dir)
    try:
        created += check_tensorboard(cfg.tensorboard_dir if lead else None)
        with hold_outputs(cfg.checkpoint_dir if lead else None,
                          cfg.metrics_out if lead else None):
            return _train_held(cfg, dataset, model, optimizer, loss, variables, callbacks,
                               lead)
    except BaseException:
        # refused or failed before writing: no empty metrics file or folders left
        if new_metrics and metrics.is_file() and metrics.stat().st_size == 0:
            metrics.unlink()
        remove_if_empty(created)
        raise


def _shared_options(cfg: TrainConfig) -> dict:
    """The options every process of a run must be given alike: all but the paths (each
    host may mount the data and the shared checkpoint folder elsewhere; the metrics
    and TensorBoard files are the first process's alone) and the progress bar. A
    dataset read from a path counts as one, whichever path."""
    values = {f.name: getattr(cfg, f.name) for f in dataclasses.fields(cfg)
              if f.name not in (*PATHS, "progress")}
    values["dataset"] = "<a path>" if reads_as_path(cfg.dataset) else cfg.dataset
    # (whether there is one: checkpoints are written by every process together, and a
    # stop between phases is agreed at points that only a checkpointing run reaches)
    values["checkpoint_dir"] = "<a path>" if cfg.checkpoint_dir else None
    # a link split by its pairs (read where there are processes to compare)
    values["link_split"] = None if cfg.link_split is None else \
        read_split_file(cfg.link_split, split_digest) if jax.process_count() > 1 \
        else "<a file>"
    return values


def _train_held(cfg, dataset, model, optimizer, loss, variables, callbacks, lead):
    """`train` once the run holds its output paths."""
    own, given = check_callbacks(callbacks), dataset is not None
    dataset, data, program = prepare(cfg, dataset, model=model, optimizer=optimizer,
                                     loss=loss)
    stoppers = ()
    if cfg.patience:
        stopper = EarlyStopping(patience_metric(cfg, program.task, dataset), cfg.patience)
        stopper.__name__ = "patience"  # what the summary's stopped_early names
        stoppers = (stopper,)
    user = _UserParts({}, None, own + stoppers, variables, given)
    asked = cfg.model
    cfg = with_model(cfg, program.task, dataset, user_model=model is not None)  # as `prepare`
    warn_unread_pieces(cfg, model, optimizer, dataset, asked_model=asked)
    user = dataclasses.replace(
        user, identity=user_identity(model, optimizer,
                                     None if loss is None else program.task, dataset),
        model=None if model is None else model_name(model))
    interrupts.check("loading the data")
    check_typed_options(cfg, dataset)
    check_metrics(cfg, program.task, dataset, own)
    warn_one_graph_steps(cfg, dataset, model)
    reset_callbacks(user.callbacks)
    ckpt = None
    if cfg.checkpoint_dir:
        from zerognn_jax._src.training.checkpoint import Checkpointer  # orbax takes ~1 s

        ckpt = Checkpointer(cfg.checkpoint_dir, keep=cfg.checkpoint_keep)
    try:
        return _train(cfg, dataset, data, program, ckpt, lead, user)
    except (interrupts.Interrupted, Diverged) as err:
        last = ckpt.latest_epoch() if ckpt is not None else None
        if last is not None:
            err.add_note(f"the checkpoint of epoch {last} in {cfg.checkpoint_dir} is kept")
        raise
    finally:
        if ckpt is not None:
            ckpt.close()


def _train(cfg, dataset, data, program, ckpt, lead, user: _UserParts) -> TrainResult:
    ident, resumable = _resumable(cfg, dataset, program, ckpt, user.identity)
    t0 = time.perf_counter()
    env, cal = _checkpoint_envelope(program, ckpt, resumable) or announced(
        "execution envelope", lambda: starting_envelope(cfg, program, data, dataset),
        stderr_log(cfg.progress and lead), doing="calibrating the step's buffers")
    calibrate_seconds = time.perf_counter() - t0
    interrupts.check("calibration")
    state = _initial_state(cfg, dataset, data, program, env, user.model)
    if user.variables is not None:
        state = start_from(program, state, user.variables)
    interrupts.check("initialisation", wait_for=state)
    back = _Resumed(state, env, [], 0, None, False, None)
    if resumable:
        back = _resume(cfg, dataset, data, program, ckpt, resumable, ident, back)
    state, env, history, start_epoch, pending, fresh, meta = back
    if user.variables is not None and start_epoch:  # a fine-tune that would resume
        warnings.warn(f"checkpoint_dir {cfg.checkpoint_dir} holds this run's epoch "
                      f"{start_epoch - 1}: the run resumes from it, and the variables "
                      f"given are not used (give another checkpoint_dir to start from "
                      f"them)", CheckpointWarning, stacklevel=user_stacklevel())
    runner = make_engine(cfg.engine, program, chunk_steps=cfg.chunk_steps,
                         policy=cfg.envelope_policy, sample_ahead=cfg.sample_ahead,
                         read_ahead_bytes=cfg.read_ahead_bytes,
                         gemm_backend=cfg.gemm_backend)
    log = MetricsLog(cfg.metrics_out if lead else None, history)  # ([] for a fresh run)
    board = TensorBoardLog(cfg.tensorboard_dir if lead else None)
    # the value to beat comes from the epochs before a pending one, which is offered
    best = _best_checkpoint(cfg, history if pending is None else history[:-1])
    # (an evaluation an older version stored may lack a metric the task reports now,
    # val_loss: that epoch is not ranked)
    if best is not None and pending is not None and best.metric in pending:
        best.offer(start_epoch - 1, pending, _saved(state), meta)
    # the last epoch's evaluation (a finished run rerun is evaluated again, with the
    # evaluation options given now, unless that just happened); the callback that stopped
    final = pending if fresh and start_epoch == cfg.epochs else None
    # early stopping counts on from the epochs a resumed run holds; one it stopped stays
    # stopped (the loop below trains nothing; the run is evaluated again)
    stopped = replay_early_stopping(user.callbacks, history[:-1] if fresh else history)
    if fresh:  # the epoch completed only now: TensorBoard and the callbacks see it
        board.write(history[-1])
        stopped = run_callbacks(user.callbacks, history[-1]) or stopped
        if not stopped or start_epoch == cfg.epochs:  # a stop at the last epoch: nothing
            stopped = None
        else:
            final = pending
    _say_resumed(cfg, lead, start_epoch, stopped)
    bar = epoch_progress(cfg.epochs, start_epoch, cfg.progress and lead)
    try:
        for epoch in range(start_epoch, cfg.epochs):
            if stopped:  # a callback stopped the run at the epoch completed on resume
                break
            try:
                record, state, env = _train_epoch(cfg, runner, state, data, dataset, epoch,
                                                  env, bar, tuple(user.identity))
            except Diverged as err:
                log.write(err.record)
                raise
            history.append(record)
            due = epoch == cfg.epochs - 1 or bool(cfg.eval_every
                                                  and (epoch + 1) % cfg.eval_every == 0)
            meta = {"identity": ident, "history": history, "evaluation_pending": due,
                    "envelope": {"batch_size": env.batch_size,
                                 "capacities": list(env.capacities),
                                 "seeds_per_device": program.batch_size},
                    **rebuild_record(cfg, dataset, user.dataset_given)}
            # The checkpoint comes before the evaluation, so that a run stopped during a
            # long evaluation keeps the epoch's training; a resumed run evaluates it then.
            if ckpt is not None:
                ckpt.save(epoch, _saved(state), meta)
                if due:  # a stop here keeps the epoch: a resumed run evaluates it
                    interrupts.check(f"training epoch {epoch}")
            final, added = _evaluate_epoch(cfg, program, state, data, dataset, record, bar) \
                if due else (None, None)
            # the evaluation adds only its splits' keys (val_acc, ...) and eval_seconds to
            # the record, so the record's training figures are still those its checkpoint
            # holds
            if ckpt is not None and added is not None:
                ckpt.save_evaluation(record, added)
            if best is not None:
                best.offer(epoch, final, _saved(state), {**meta, "evaluation_pending": False})
            log.write(record)  # the record follows its checkpoint, never precedes it
            board.write(record)
            stopped = run_callbacks(user.callbacks, record)
            if epoch < cfg.epochs - 1:  # after the last, only its summary is left to write:
                interrupts.check(f"epoch {epoch}")  # a stop would lose it (no checkpoint)
            if stopped and epoch < cfg.epochs - 1:
                if not due:  # an epoch eval_every skips: evaluated now, as the last epoch
                    # is, into its record (the log's line precedes it; the summary holds
                    # it), its checkpoint and TensorBoard, and offered to the best one
                    final, added = _evaluate_epoch(cfg, program, state, data, dataset,
                                                   record, bar)
                    if ckpt is not None:
                        ckpt.save_evaluation(record, added)
                    if best is not None:
                        best.offer(epoch, final, _saved(state),
                                   {**meta, "evaluation_pending": False})
                    board.write({"epoch": epoch, **added})
                break
        else:
            stopped = None  # a stop asked at the last epoch stops nothing
        if final is None:  # no epoch trained here, or the last one was not evaluated
            final = evaluate(cfg, program, _variables(state), data, dataset)
        notes = run_notes(cfg, program, data, model=user.model, custom=user.identity,
                          best=best, stopped=stopped, history=history,
                          row_normalized=row_normalizes(cfg, dataset, program.task))
        summary = run_summary(cfg, dataset, program, state, env, cal, history, final,
                              calibrate_seconds, runner.compile_seconds, start_epoch, notes,
                              _memory_report(cfg, dataset, program, env, cal),
                              dataset_given=user.dataset_given)
        log.write(summary)
    finally:
        bar.close()
        log.close()
        board.close()
        if best is not None:
            best.close()
    return TrainResult(_variables(state), history, summary, program, data, state, dataset)


def _resumable(cfg, dataset, program, ckpt, custom) -> tuple[dict | None, list]:
    """(this run's checkpoint identity, the checkpoints in `ckpt` it may resume from,
    newest first); (None, []) without a checkpoint folder. A folder of another run
    (`CheckpointMismatch`), one holding more epochs than `cfg.epochs` asks for, or one
    whose best checkpoint ranks another metric than `cfg.best_metric` is refused here,
    before anything is trained."""
    if ckpt is None:
        return None, []
    from zerognn_jax._src.training.checkpoint import (
        check_best_metric,
        check_epochs,
        identity,
    )

    relations = relations_of(dataset)
    ident = identity(cfg, dataset.stats(), asked_global_batch(cfg, program), custom,
                     relations)
    resumable = ckpt.find_resumable(ident, relations)  # another run's fails here
    check_epochs(cfg.epochs, resumable, cfg.checkpoint_dir)
    if resumable and cfg.best_metric:
        check_best_metric(cfg.checkpoint_dir, cfg.best_metric)
    return ident, resumable


def _initial_state(cfg, dataset, data, program, env, user_model):
    """The run's first state, once the step is known to fit in device memory (else a
    ValueError saying what to lower) and a user's model, loss and optimizer
    (`user_model`: its name, None for the built-in one) have been checked against the
    first batch."""
    items = program.task.train_items(dataset)

    def checked_state():
        state = init_checked(program, data, env, items, user_model=user_model)
        check_pieces(program, state, data, env, items,
                     width=program.task.output_dim(cfg, dataset), name=user_model)
        return state

    if isinstance(program.task, BatchedTask):  # the state first: counted as allocated
        state = checked_state()
        step_bytes = getattr(program.task, "envelope_bytes", None)  # optional (base.py)
        rows = getattr(program.task, "feature_rows", None)  # optional too
        if step_bytes is not None:
            ahead = 0 if rows is None else read_ahead_bytes(
                data.features, rows(env), cfg.sample_ahead, cfg.read_ahead_bytes)
            memory.check_step_fits(memory.allocated_resident(data, state),
                                   step_bytes(program, env), memory.device_memory_limit(),
                                   batch_size=program.batch_size, read_ahead_bytes=ahead)
    else:  # the memory model and the checks of a user's pieces read the sampled levels
        dims = level_dims(cfg, dataset, program.task, program.model)
        shards = program.num_shards if cfg.shard_features else 1
        host_table_bytes = (device_bytes(data.features) if is_host_resident(data.features)
                            else None)
        memory.check_fits(env, program.sampler.slots, dims, memory.device_memory_limit(),
                          resident=memory.resident_bytes(data.graph,
                                                         dataset.features.shape[1],
                                                         cfg.dtype, dims,
                                                         feature_shards=shards,
                                                         embedding_dim=cfg.embedding_dim,
                                                         feature_bytes=host_table_bytes),
                          extra_step_bytes=memory.gathered_rows_bytes(
                              env.levels[-1], cfg.embedding_dim, cfg.dtype,
                              program.num_shards),
                          read_ahead_bytes=read_ahead_bytes(
                              data.features, env.levels[-1], cfg.sample_ahead,
                              cfg.read_ahead_bytes)
                          if cfg.engine == "scan" else 0)
        state = checked_state()
    return state


class _Resumed(NamedTuple):
    """Where a run starts: its state and envelope, the records of the epochs it holds
    (`history`), the first epoch to train, and of the last epoch held, its evaluation
    where one was due (`pending`: its metrics; `fresh`: made only now) and its
    checkpoint's metadata (`meta`). A fresh run's holds no epoch."""

    state: Any
    env: Any
    history: list
    start_epoch: int
    pending: dict | None
    fresh: bool
    meta: dict | None


def _resume(cfg, dataset, data, program, ckpt, resumable, ident, fresh_run: _Resumed):
    """`fresh_run` carried on from the newest readable checkpoint of `resumable`: its
    state, its envelope where it was saved for this run's seeds per device, its records,
    and the last epoch's evaluation (read back, or run now where the earlier run stopped
    before it); `fresh_run` itself where no checkpoint could be read."""
    state, env = fresh_run.state, fresh_run.env
    resumed = ckpt.restore_first(resumable, ident, _saved(state), relations_of(dataset))
    if resumed is None:
        return fresh_run
    last, restored, meta = resumed
    state = state._replace(**restored)
    if _envelope_applies(program, meta["envelope"], env):
        env = saved_envelope(program, meta["envelope"])
    history, pending, fresh = meta["history"], None, False
    if meta.get("evaluation_pending"):  # evaluated after its checkpoint, if at all
        entries = ckpt.evaluation_of(history[-1])  # metrics and eval_seconds
        if entries is None:  # the earlier run stopped first: evaluate it now
            entries, fresh = _evaluation_entries(
                *_timed_evaluation(cfg, program, state, data, dataset)), True
            ckpt.save_evaluation(history[-1], entries)
        history[-1].update(strict(entries))
        pending = {k: v for k, v in entries.items() if k != "eval_seconds"}
        meta = {**meta, "evaluation_pending": False}
    elif history and (entries := ckpt.evaluation_of(history[-1])):
        # evaluated after a checkpoint that expected none: a stop at an epoch
        # eval_every skipped (its record and the best checkpoint's value to beat)
        history[-1].update(strict(entries))
    return _Resumed(state, env, history, last + 1, pending, fresh, meta)


def _say_resumed(cfg: TrainConfig, lead: bool, start_epoch: int, stopped) -> None:
    """One line on stderr (with `progress`) where a run resumes: from which checkpoint,
    and what is left to train (a finished run's rerun trained nothing, unsaid)."""
    say = stderr_log(cfg.progress and lead)
    if say is None or not start_epoch:
        return
    if start_epoch >= cfg.epochs:
        left = (f"nothing is left to train at epochs={cfg.epochs} (more epochs train on; "
                f"another checkpoint_dir starts afresh)")
    elif stopped:
        left = "a callback stopped the run there, nothing is left to train"
    elif start_epoch == cfg.epochs - 1:
        left = f"epoch {start_epoch} left to train"
    else:
        left = f"epochs {start_epoch} to {cfg.epochs - 1} left to train"
    say(f"resuming from the checkpoint of epoch {start_epoch - 1} in {cfg.checkpoint_dir}: "
        f"{left}")


def starting_envelope(cfg: TrainConfig, program, data, dataset):
    """(the envelope a run starts from, its calibration or None): the task's own choice
    for graph batches, else calibrated over the training items by the sampler."""
    if isinstance(program.task, BatchedTask):
        return program.task.choose_envelope(program, data, dataset, cfg)
    return choose_envelope(data.graph, program.task.train_items(dataset), program.batch_size,
                           program.sampler, method=cfg.envelope, seed=cfg.seed,
                           policy=cfg.envelope_policy, kernels=program.kernels,
                           source=program.task)


def _checkpoint_envelope(program, ckpt, resumable):
    """(the envelope of the checkpoint a run resumes from, None) where it was saved for
    this run's seeds per device: a resumed run takes it without calibrating again (4.8 s
    of a 22.9 s typed resume on a CPU went to a calibration it then dropped). None for a
    fresh run, a checkpoint of another device count, or one written before checkpoints
    recorded the seeds per device (2026-12-02)."""
    if not resumable:
        return None
    saved = ckpt.read_meta(resumable[0]).get("envelope") or {}
    if saved.get("seeds_per_device") != program.batch_size:
        return None
    return saved_envelope(program, saved), None


def _envelope_applies(program, saved: dict, env) -> bool:
    """Whether a checkpoint's envelope was saved for this run's seeds per device (older
    checkpoints: the same level-0 capacity as `env`'s); else it is another device
    count's."""
    if "seeds_per_device" in saved:
        return saved["seeds_per_device"] == program.batch_size
    return same_level0(saved["batch_size"], env.batch_size)


def same_level0(saved, current) -> bool:
    """Whether a checkpoint's level-0 capacity is `current`'s: an int, or a typed link
    envelope's capacities per end type (a tuple, which JSON gives back as a list)."""
    as_list = lambda v: list(v) if isinstance(v, tuple | list) else [v]
    return as_list(saved) == as_list(current)


def relations_of(dataset) -> tuple:
    """A typed dataset's relations, () for any other."""
    return dataset.graph.relations if is_typed(dataset) else ()


def _best_checkpoint(cfg, history):
    """The best-validation checkpoint of `cfg.best_metric`, or None."""
    if not cfg.best_metric:
        return None
    from zerognn_jax._src.training.checkpoint import BestCheckpoint

    return BestCheckpoint(cfg.checkpoint_dir, cfg.best_metric, history)


def _train_epoch(cfg, runner, state, data, dataset, epoch, env, bar, own):
    """(record, state, envelope) of one epoch's training; Diverged if a step's loss, or
    the state after the last step's update, holds NaN or inf (`own`: the pieces the user
    brought, "optimizer" and "loss" among them, which the message names)."""
    program, compile_before = runner.program, runner.compile_seconds
    t0 = time.perf_counter()
    items = program.task.train_items(dataset)

    def between_chunks(done, total):
        # a signal during the last chunk stops the run after the epoch's checkpoint
        if done < total:
            interrupts.check(f"step {done} of epoch {epoch}")

    if not runner.compile_seconds:  # the first epoch this process runs compiles first
        phase(bar, "compiling")
    res = runner.run_epoch(state, data, items, epoch, env, on_progress=between_chunks)
    wall = time.perf_counter() - t0
    compile_s = runner.compile_seconds - compile_before
    record = {"epoch": epoch, "loss": res.loss,
              f"train_batch_{program.task.score_name}": res.train_acc,
              "epoch_seconds": wall - compile_s, "compile_seconds": compile_s,
              "steps": res.steps, "chunks": res.chunks, "overflows": res.overflows,
              "envelope": list(res.envelope.levels), "max_counts": list(res.max_counts),
              "sampled_edges": res.sampled_edges, **_step_size(res.state.opt_state)}
    finite = not res.steps or bool(_finite(_checked(res.state)))  # the last update's result
    if "loss" in own and (res.first_nonfinite is not None or not finite) \
            and has_missing(dataset):  # (a loss given NaN targets: the first suspect)
        own = (*own, "missing")
    if res.first_nonfinite is not None:
        _diverged(cfg, epoch, res.first_nonfinite, res.steps, record, own)
    if not finite:
        _diverged(cfg, epoch, res.steps - 1, res.steps, record, own, what="state")
    record = strict(record)
    bar.update(1)
    bar.set_postfix(loss=f"{res.loss:.4f}")
    return record, res.state, res.envelope


# What an epoch's record shows of its optimizer's state, where the state holds it once:
# record key -> (the state's field, whether a path to it is the one meant).
STEP_SIZE = {
    "learning_rate": ("learning_rate",  # among optax.inject_hyperparams' values
                      lambda path: len(path) > 1
                      and getattr(path[-2], "name", None) == "hyperparams"),
    "lr_scale": ("scale",  # optax.contrib.reduce_on_plateau's factor
                 lambda path: getattr(path[-1], "tuple_name", None)
                 == "ReduceLROnPlateauState"),
}


def _step_size(opt_state) -> dict:
    """The learning rate an `optax.inject_hyperparams` optimizer holds and the factor
    `optax.contrib.reduce_on_plateau` scales the updates by, after the epoch's last
    step, for each that the optimizer's state holds once as a number."""
    entries = {}
    for key, (field, meant) in STEP_SIZE.items():
        found = [value for path, value in optax.tree_utils.tree_get_all_with_path(
                     opt_state, field) if meant(path)]
        if len(found) == 1 and np.ndim(found[0]) == 0:
            entries[key] = float(found[0])
    return entries


def _timed_evaluation(cfg, program, state, data, dataset) -> tuple[dict, float]:
    """(`evaluate`'s metrics of `state`, the seconds it took: its metrics are host
    numbers, so the device work is done when it returns)."""
    t0 = time.perf_counter()
    evaluated = evaluate(cfg, program, _variables(state), data, dataset)
    return evaluated, time.perf_counter() - t0


def _evaluation_entries(evaluated: dict, seconds: float) -> dict:
    """What an evaluation adds to its epoch's record: its metrics and, where it evaluated
    anything, `eval_seconds` (its wall time, compilation included)."""
    return {**evaluated, "eval_seconds": seconds} if evaluated else dict(evaluated)


def _evaluate_epoch(cfg, program, state, data, dataset, record, bar) -> tuple[dict, dict]:
    """(the epoch's evaluation, what it added to its `record`): added in place
    (`_evaluation_entries`) and to the progress bar."""
    phase(bar, "evaluating")
    evaluated, seconds = _timed_evaluation(cfg, program, state, data, dataset)
    added = _evaluation_entries(evaluated, seconds)
    record.update(strict(added))
    val = next(((k, v) for k, v in record.items() if k.startswith("val_") and v is not None),
               None)
    bar.set_postfix(loss=f"{record['loss']:.4f}", **dict([val] if val else []))
    return evaluated, added


def _checked(state) -> dict:
    """What the state check reads: the model's variables and embedding rows (an
    optimizer's state may hold an infinity on purpose, a running minimum say; a NaN
    update reaches the parameters)."""
    return {"params": state.params, "batch_stats": state.batch_stats,
            "embedding": state.embedding}


@jax.jit
def _finite(tree) -> jax.Array:
    """bool scalar: every float of `tree` is finite."""
    leaves = [x for x in jax.tree.leaves(tree) if jnp.issubdtype(x.dtype, jnp.inexact)]
    return jnp.all(jnp.stack([jnp.isfinite(x).all() for x in leaves])) if leaves \
        else jnp.bool_(True)


def _diverged(cfg, epoch, step, steps, record, own=(), *, what="loss"):
    """Raises Diverged at `step` of `epoch`: its loss (`what` "loss") or, "state", the
    parameters (or embedding rows) its update wrote became NaN or infinite. `own`: the
    user's pieces ("optimizer": its rate is not `cfg.lr`; "loss": the first suspect of
    a first loss that is not finite; "missing": that loss was given targets with missing
    entries, the first suspect at any step)."""
    where = (f"the loss became NaN or infinite at epoch {epoch}, step {step} (of {steps})"
             if what == "loss" else
             f"the parameters became NaN or infinite in the update of epoch {epoch}, step "
             f"{step} (its last; every loss was finite)")
    if "missing" in own:
        hint = ("The targets have missing entries, which your loss receives as NaN: leave "
                "them out of its value and of its gradient (a jnp.where after the NaN is "
                "computed still passes a NaN gradient back; docs/api.md shows a loss that "
                "does not)")
    elif what == "loss" and epoch == 0 and step == 0 and "loss" in own:
        hint = ("It came before any update: check your loss on the first batch's outputs "
                "and targets (it gave NaN or inf), then the features and targets for "
                "extreme values")
    elif what == "loss" and epoch == 0 and step == 0:
        hint = ("It came before any update: check the features and targets for extreme "
                "values (the first batch's loss overflowed), or the model's initialisation")
    elif "optimizer" in own:
        hint = ("Lower your optimizer's learning rate or check the features and targets for "
                "extreme values")
    else:
        hint = (f"Lower lr (now {cfg.lr:g}) or check the features and targets for extreme "
                f"values")
    err = Diverged(f"training diverged: {where}; nothing of this epoch is saved. {hint}")
    err.record = strict({**record, "diverged_at_step": step})
    raise err


def _memory_report(cfg, dataset, program, env, cal) -> dict | None:
    """How the envelope compares with what calibration saw (`memory.memory_report`, or a
    graph task's own), None for a run that did not calibrate (it resumed)."""
    if cal is None:
        return None
    if isinstance(program.task, BatchedTask):
        return program.task.memory_report(program, env, cal)
    return memory.memory_report(env, cal.max_counts, program.sampler.slots,
                                level_dims(cfg, dataset, program.task, program.model))
