"""`restore`: a trained checkpoint back as variables, train state and step program;
`predict`: a trained model's outputs for given nodes.

    back = restore("runs/ck", model=my_model, for_inference=True)   # the model only
    logits = predict(back, nodes)                                   # float[len(nodes), C]

The checkpoint must be of the same run: its identity (training/checkpoint.py) is
compared with the one `cfg`, the dataset and the user's model, optimizer and loss give,
and the arrays' shapes with the model's. Without `cfg`, the config the checkpoint
records is used and the dataset is loaded from its recorded root (rebuild.py).
`for_inference=True` reads only the model variables: the training optimizer and loss
(and the learning rate) are neither needed nor compared.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from zerognn_jax._src.data.checks import at_least_one, check_ids, is_int, key_seed, node_ids
from zerognn_jax._src.data.links import SplitFileMissing
from zerognn_jax._src.nn.bridge import model_name
from zerognn_jax._src.sampling.calibrate import choose_envelope
from zerognn_jax._src.sampling.envelope import Envelope
from zerognn_jax._src.training.checkpoint_errors import OwnModelNeeded
from zerognn_jax._src.training.checksums import check_checksums
from zerognn_jax._src.training.config import TrainConfig
from zerognn_jax._src.training.evaluate import Predictor
from zerognn_jax._src.training.inductive import other_graph, pairs_over
from zerognn_jax._src.training.program import init_state, saved_envelope
from zerognn_jax._src.training.rebuild import NAMES, check_dataset, config_of
from zerognn_jax._src.training.records import epoch_folder_of, runs_inside
from zerognn_jax._src.training.tasks.base import (
    BatchedTask,
    PredictsItems,
    PredictsNewItems,
    PredictsOtherGraphs,
    PredictsTypes,
    ScoresPairs,
)
from zerognn_jax._src.training.tasks.link_metrics import score_pairs as score_rows
from zerognn_jax._src.training.trainer import (
    TrainResult,
    _saved,
    _variables,
    asked_global_batch,
    prepare,
    relations_of,
    row_normalizes,
    same_level0,
    with_model,
)
from zerognn_jax._src.training.user import user_identity

# Identity keys inference does not compare: they shape only how the model was trained.
INFERENCE_FREE = ("custom.optimizer", "custom.loss", "lr", "weight_decay",
                  "decoupled_weight_decay", "lr_schedule", "warmup_epochs", "grad_clip",
                  "schedule_epochs")


def restore(checkpoint_dir: str, cfg: TrainConfig | None = None, dataset=None, *,
            model=None, optimizer=None, loss=None, best: bool = False,
            epoch: int | None = None, for_inference: bool = False) -> TrainResult:
    """The state saved in `checkpoint_dir`, ready for inference or to train on.

    Args:
      checkpoint_dir: a run's `cfg.checkpoint_dir`.
      cfg: the run's config (default: the one the checkpoint records).
      dataset: the run's dataset (default: loaded as the checkpoint records it; a
        Dataset that was passed to `train()` must be passed again).
      model, optimizer, loss: the ones the run was trained with, if not built in.
      best: the best-validation checkpoint (`cfg.best_metric`) instead of the latest.
      epoch: that epoch's checkpoint instead of the latest.
      for_inference: read the model variables only: `optimizer` and `loss` are not
        needed (ignored), and `state` holds a fresh optimizer state.

    Returns:
      a `TrainResult`: `variables` (for `predict`, `model.apply`, `sampled_logits`,
      `layerwise_logits`, or `train(..., variables=)` to fine-tune), `state` (with the
      optimizer state), `history`, `program`, `data`, `dataset`, and a `summary` of the
      checkpoint ({"checkpoint", "epoch", "best"}, "written_by": the zerognn-jax and JAX
      versions that wrote it, None for a checkpoint older than that record, the last
      record's metrics, and "config": the run's options, as the checkpoint records them
      or as `cfg` gives them, on one device).

    Raises:
      FileNotFoundError: no checkpoint there.
      CheckpointMismatch: the checkpoint is of another run or model, or of a model of
        the user's own and `model` is None.
      ValueError: the run trained on a given Dataset and none is passed; an `epoch` that
        is not an integer; a checkpoint that does not read, or the `epoch` asked for
        removed while it was read by a run still training into the folder (it keeps
        its latest checkpoints; the latest, asked for by no `epoch`, is read again).
    """
    from zerognn_jax._src.training.checkpoint import CheckpointGone

    if epoch is not None and not is_int(epoch):
        raise ValueError(f"epoch must be an integer (a checkpoint's epoch), got {epoch!r}")
    if cfg is not None and not isinstance(cfg, TrainConfig):
        raise TypeError(f"restore takes a TrainConfig as cfg (or None: the one the "
                        f"checkpoint records), got {type(cfg).__name__}")
    if isinstance(dataset, (str, bytes, os.PathLike)):
        raise TypeError(f"dataset {dataset!r} is a name or a path: leave dataset out to "
                        f"load the one the checkpoint records, or pass the dataset object "
                        f"a run trained on")
    directory = _checkpoint_folder(checkpoint_dir, best)
    if for_inference:
        optimizer, loss = None, None
    tries_left = 2
    while True:
        try:
            return _restored(directory, cfg, dataset, model, optimizer, loss, best, epoch,
                             for_inference)
        except CheckpointGone:  # a live run removed it: its latest again, if asked for
            if epoch is not None or not tries_left:
                raise
            tries_left -= 1


def _checkpoint_folder(checkpoint_dir, best: bool) -> Path:
    """The folder of a run's checkpoints that `restore` reads: `checkpoint_dir`, or its
    best/ with `best`; FileNotFoundError naming the one that is missing."""
    from zerognn_jax._src.training.checkpoint import BEST

    checkpoint_dir = Path(checkpoint_dir).expanduser()
    directory = checkpoint_dir / BEST if best else checkpoint_dir
    if not checkpoint_dir.is_dir():
        raise FileNotFoundError(f"no checkpoint folder {checkpoint_dir}")
    if not directory.is_dir():
        raise FileNotFoundError(f"no checkpoint folder {directory} (only a run trained with "
                                f"best_metric, --best-metric, keeps a best checkpoint)")
    return directory


def saved_variables(checkpoint_dir: str, *, best: bool = False) -> dict:
    """The model variables of the latest checkpoint in `checkpoint_dir` (its best with
    `best`), read without the run's dataset or model: {"params", "batch_stats" where the
    model keeps any, "embedding" where the run learned a node embedding}, NumPy arrays in
    the tree they were saved in, for `train(..., variables=)` to start a run of the same
    model from (`zerognn train --init-from`).

    Raises:
      FileNotFoundError: no checkpoint there. ValueError: one that does not read.
    """
    from zerognn_jax._src.training.checkpoint import Checkpointer, readable

    directory = _checkpoint_folder(checkpoint_dir, best)
    ckpt = Checkpointer(str(directory), create=False)
    try:
        if not ckpt.all_epochs():
            raise FileNotFoundError(f"no checkpoint in {directory} (none at all)"
                                    f"{_epoch_folder_hint(directory)}")
        epoch = max(ckpt.all_epochs())
        meta = readable(lambda: ckpt.read_meta(epoch), directory, epoch)
        saved = _model_parts(ckpt, epoch, meta)
    finally:
        ckpt.close()
    out = {"params": saved["params"]}
    if saved.get("batch_stats"):
        out["batch_stats"] = saved["batch_stats"]
    if saved.get("embedding") is not None:
        out["embedding"] = saved["embedding"]
    return jax.tree_util.tree_map(np.asarray, out)


def _restored(directory: Path, cfg, dataset, model, optimizer, loss, best: bool,
              epoch: int | None, for_inference: bool) -> TrainResult:
    """`restore`'s read of `directory` (the checkpoint folder or its best/), once."""
    from zerognn_jax._src.training.checkpoint import Checkpointer, identity, readable

    ckpt = Checkpointer(str(directory), create=False)
    try:
        epochs = sorted(ckpt.all_epochs(), reverse=True) if epoch is None else [epoch]
        if not epochs or epochs[0] not in ckpt.all_epochs():
            none_best = ("; no epoch was kept as best: the best metric had no value in "
                         "any epoch evaluated (null: a split without both classes, say), "
                         "or none was evaluated" if best and not ckpt.all_epochs() else "")
            held = sorted(ckpt.all_epochs())
            raise FileNotFoundError(f"no checkpoint{'' if epoch is None else f' {epoch}'} in "
                                    f"{directory} ("
                                    + (f"it holds epochs {held}" if held else "none at all")
                                    + ")" + _epoch_folder_hint(directory) + none_best)
        meta = readable(lambda: ckpt.read_meta(epochs[0]), directory, epochs[0])
        own = meta.get("identity", {}).get("custom.model")
        if own is not None and model is None:
            raise OwnModelNeeded(f"checkpoint_dir {directory} holds a run of a model of "
                                 f"your own, {own} (epoch {epochs[0]}): pass it as model=",
                                 own)
        check_dataset(meta, dataset)
        recorded = cfg is None
        cfg = cfg or config_of(meta)
        try:
            dataset, data, program = prepare(cfg, dataset, model=model,
                                             optimizer=optimizer, loss=loss)
        except FileNotFoundError as err:
            said = "as its checkpoint records it" if recorded else "as cfg names it"
            if isinstance(err, SplitFileMissing):
                raise FileNotFoundError(f"{err}; {said}: put it back there, or give "
                                        f"restore the run's cfg with link_split naming "
                                        f"where it is now") from None
            if dataset is not None or cfg.dataset.lower() in NAMES:
                raise  # (a named dataset's message says which root to give)
            raise FileNotFoundError(f"{err}: the run's dataset, {said} ({cfg.dataset!r}), "
                                    f"is not there now; give the dataset (dataset=; "
                                    f"zerognn export and predict: --dataset FILE)") from None
        cfg = with_model(cfg, program.task, dataset,  # as `prepare` named it
                         user_model=model is not None)
        relations = relations_of(dataset)
        ident = identity(cfg, dataset.stats(), asked_global_batch(cfg, program),
                         user_identity(model, optimizer, None if loss is None else program.task,
                                       dataset), relations)
        # compared before the envelope, which reads the checkpoint's capacities by the
        # dataset's node types
        ckpt.check(epochs[0], meta, _compared(ident, meta) if for_inference else ident,
                   relations)
        pick = _batched_envelope if isinstance(program.task, BatchedTask) else _envelope
        env = pick(cfg, meta, data, dataset, program)
        state = init_state(program, data, env, program.task.train_items(dataset))
        if for_inference:
            last, state = epochs[0], _inference_state(ckpt, epochs[0], meta, ident, state,
                                                      relations)
        else:
            last = epochs[0]
            restored, meta = ckpt.restore_one(last, meta, ident, _saved(state), relations)
            state = state._replace(**restored)
        history = meta.get("history", [])
        if history:  # saved before its evaluation (pending, or a stop that evaluated it)
            history[-1].update(ckpt.evaluation_of(history[-1]) or
                               _evaluated_later(ckpt, history[-1]))
    finally:
        ckpt.close()
    summary = {"checkpoint": str(directory), "dataset": dataset.name, "task": cfg.task,
               "model": cfg.model if model is None else model_name(model),
               "epoch": last, "best": meta.get("best"), "written_by": meta.get("written_by"),
               **{k: v for k, v in (history[-1] if history else {}).items()
                  if k.startswith(("train_", "val_", "test_", "loss"))}}
    if cfg.task == "link":  # what scores the encoder's embeddings
        summary["decoder"] = cfg.decoder
    if (normalized := row_normalizes(cfg, dataset, program.task)) is not None:
        summary["features_row_normalized"] = normalized  # what `data.features` holds
    summary["config"] = dataclasses.asdict(cfg)  # as `train`'s summary holds it
    return TrainResult(_variables(state), history, summary, program, data, state, dataset)


def _evaluated_later(ckpt, record: dict) -> dict:
    """The evaluation of `record`'s epoch as a newer checkpoint's records hold it ({}
    without one): an older checkpoint is saved before its epoch's evaluation, and the
    folder's evaluation file keeps the newest epoch's alone."""
    from zerognn_jax._src.training.checkpoint import readable

    for newer in sorted((e for e in ckpt.all_epochs() if e > record.get("epoch", -1)),
                        reverse=True):
        try:
            later = readable(lambda e=newer: ckpt.read_meta(e), ckpt.named, newer)
        except ValueError:  # an unreadable newer checkpoint: an older one may tell
            continue
        for kept in later.get("history", []):
            if kept.get("epoch") == record.get("epoch"):
                return {k: v for k, v in kept.items() if k not in record}
    return {}


def _epoch_folder_hint(directory: Path) -> str:
    """Where `directory` is one epoch's folder of a run's checkpoint folder
    (`epoch_folder_of`), or holds a run's checkpoint folder (`runs_inside`), what to
    give instead; "" otherwise."""
    found = epoch_folder_of(directory)
    if found is None:
        nested = runs_inside(directory)
        return (f"; a run's checkpoint folder is inside it, {nested[0]}: give that"
                if nested else "")
    run, best = found
    if best:
        return (f"; {directory} is the best checkpoint's folder of the run folder {run}: "
                f"give {run} with best=True (on the command line: --best)")
    return (f"; {directory} is epoch {directory.name}'s checkpoint of the run folder {run}: "
            f"give {run} with epoch={directory.name} (on the command line: --epoch "
            f"{directory.name})")


def _compared(ident: dict, meta: dict) -> dict:
    """`ident` as inference compares it with the checkpoint's `meta`: what
    `INFERENCE_FREE` names taken from the checkpoint."""
    from zerognn_jax._src.training.checkpoint import ADDED_SINCE

    saved_ident = meta.get("identity", {})
    ident = {k: v for k, v in ident.items() if k not in INFERENCE_FREE}
    ident.update({k: saved_ident[k] for k in INFERENCE_FREE if k in saved_ident})
    # an option the checkpoint predates is compared at what runs did then (ADDED_SINCE)
    ident.update({k: ADDED_SINCE[k] for k in INFERENCE_FREE
                  if k in ADDED_SINCE and k not in saved_ident})
    return ident


def _inference_state(ckpt, epoch: int, meta: dict, ident: dict, state, relations):
    """`state` with the model variables of `epoch`, the identity compared (relations
    named by a graph of `relations`) but for `INFERENCE_FREE`, and the variables'
    shapes with the model's."""
    from zerognn_jax._src.training.checkpoint import CheckpointMismatch, state_spec

    ckpt.check(epoch, meta, _compared(ident, meta), relations)
    saved = _model_parts(ckpt, epoch, meta)
    like = {"params": state.params, "batch_stats": state.batch_stats}
    got = _keyed_as(like, {"params": saved["params"],
                           "batch_stats": saved.get("batch_stats") or {}})
    ckpt.check_arrays(epoch, state_spec(got), state_spec(like))
    put = lambda x, ref: jax.device_put(jnp.asarray(x, ref.dtype), ref.sharding)
    if state.embedding is not None:  # the node embedding is part of the model's inputs
        if "embedding" not in saved or saved["embedding"].shape != state.embedding.shape:
            raise CheckpointMismatch(f"checkpoint_dir {ckpt.named} holds no node "
                                     f"embedding of shape {list(state.embedding.shape)} "
                                     f"(epoch {epoch})")
        state = state._replace(embedding=put(saved["embedding"], state.embedding))
    return state._replace(params=jax.tree_util.tree_map(put, got["params"], state.params),
                          batch_stats=jax.tree_util.tree_map(put, got["batch_stats"],
                                                             state.batch_stats))


def _model_parts(ckpt, epoch: int, meta: dict) -> dict:
    """The model's variables and its node embedding as checkpoint `epoch` saved them
    (not the optimizer's state), their checksums compared with those `meta` records."""
    from zerognn_jax._src.training.checkpoint import readable

    def read():
        parts = ckpt.restore_as_saved(epoch, ("params", "batch_stats", "embedding"))
        check_checksums(epoch, parts, meta.get("checksums"))
        return parts

    return readable(read, ckpt.named, epoch)


def _keyed_as(like, saved):
    """`saved` (a checkpoint's tree as stored, its keys strings) with the keys of `like`
    where a key of `like` is stored as its string: an NNX model's `nnx.List` keys its
    layers 0, 1, ..., which came back as "0", "1" and were taken for other variables.
    Keys either tree lacks are left for the comparison to name."""
    if not (isinstance(like, dict) and isinstance(saved, dict)):
        return saved
    out, taken = {}, set()
    for key, value in like.items():
        stored = key if key in saved else str(key)
        if stored in saved:
            out[key] = _keyed_as(value, saved[stored])
            taken.add(stored)
    out.update((k, v) for k, v in saved.items() if k not in taken)
    return out


def _envelope(cfg, meta, data, dataset, program) -> Envelope:
    """The checkpoint's envelope if it fits this batch, else the conservative one (the
    first batch only gives the variables' shapes: no calibration needed)."""
    env, _ = choose_envelope(data.graph, program.task.train_items(dataset), program.batch_size,
                             program.sampler, method="conservative", seed=cfg.seed,
                             policy=cfg.envelope_policy, kernels=program.kernels,
                             source=program.task)
    saved = meta.get("envelope") or {}
    if saved.get("batch_size") == env.batch_size:  # else saved with another device count
        return Envelope(saved["batch_size"], tuple(saved["capacities"]))
    return env


def _batched_envelope(cfg, meta, data, dataset, program):
    """`_envelope` for a `BatchedTask`: the checkpoint's, else its conservative one."""
    saved = meta.get("envelope") or {}
    task = program.task
    level0 = (task.seed_capacities(program.batch_size) if isinstance(task, PredictsTypes)
              else program.batch_size)
    if "batch_size" in saved and same_level0(saved["batch_size"], level0):
        return saved_envelope(program, saved)
    conservative = dataclasses.replace(cfg, envelope="conservative")
    return program.task.choose_envelope(program, data, dataset, conservative)[0]


def predict(result: TrainResult, nodes, *, mode: str = "full", batch_size: int = 4096,
            seed: int = 0, node_type: str | None = None, dataset=None) -> jax.Array:
    """float[len(nodes), ...]: the output rows (logits; a link encoder's embeddings) of
    the node ids `nodes` from a `train` or `restore` result.

    `mode` "full" is exact layer-wise inference when the model offers the per-layer
    protocol (nn/layerwise.py; every node is computed once, then `nodes` are picked),
    else sampled; "sampled" uses the training fanouts, `batch_size` nodes per step, its
    draws keyed by `seed`. Exact inference reads neither `batch_size` nor `seed`.

    A typed graph's `nodes` are ids of its target type, whose logits come as its
    evaluation computes them (`typed_logits`). A typed link run's are ids of
    `node_type`, one end of its relation (needed where the ends are two types), whose
    embeddings come back. A graph-level run's are ids of graphs of its collection, one
    output row each, as its evaluation computes them (`mode` changes nothing: no
    neighbours are sampled); given `dataset`, another collection (new graphs to
    predict, with the node and edge columns trained on; its targets and splits are not
    read), they are ids of its graphs. A one-type graph's node or link run given
    `dataset`, a `Dataset` of another graph with the feature columns trained on (its
    labels and splits are not read), gives the rows of that graph's nodes `nodes`:
    the model applied to a graph it never saw (inductive inference; inductive.py says
    how the graph is prepared as the run's was). A typed graph's node or link run
    takes a `HeteroDataset` of its node types, relations and feature widths, if every
    type it trained on had features (no learned rows).

    Raises:
      TypeError: `result` not a `TrainResult`.
      ValueError: `nodes` not 1-D integer ids of the graph (of the type they are of; of
        the collection's graphs), an unknown `mode`, a `batch_size` or `seed` that is not
        a whole number in range, or exact evaluation of a typed graph whose feature
        table, kept in host memory, does not fit the device's free memory; a `node_type`
        that is not a type the run predicts (a typed link run: an end of its relation; a
        homogeneous run: none); a `dataset` whose columns (widths, categories; a
        typed graph's types and relations) are not those trained on, or to a run that
        learned a row per node of its own graph (`embedding_dim`; a typed run's
        featureless types).
    """
    require_result("predict", result)
    check_call(mode, batch_size, seed)
    n = result.data.graph.num_nodes
    task = result.program.task
    target = None
    items = isinstance(task, PredictsItems)
    program, data, items_of = result.program, result.data, result.dataset
    if dataset is not None:
        if isinstance(task, PredictsNewItems):
            data, items_of = task.data_of(result.program, result.data, dataset), dataset
        else:  # another graph of the run's types: the run's model over it
            _require_other_graphs(task)
            program, data = other_graph(result, dataset, mode)
            n, task = data.graph.num_nodes, program.task
    if items:
        n = task.num_items(items_of)
    if isinstance(task, PredictsTypes):
        target = task.output_type(node_type)
        n = n[target]
    elif node_type is not None:
        raise ValueError(f"node_type picks a node type of a typed graph's run; this run's "
                         f"graph has one type (its task {task.name!r})")
    nodes = node_ids("nodes", nodes, n, f" ({task.item_name} ids)" if items else
                     "" if target is None else f" ({target!r} ids)")
    if items:
        if not nodes.size:  # no rows: of the trained run's width (new targets are unread)
            data, items_of = result.data, result.dataset
        return task.outputs_of_items(result.program, result.variables, data, items_of,
                                     nodes, batch_size=batch_size)
    predictor = Predictor(program, result.variables, data, mode, batch_size, seed,
                          bucketed=True)
    if target is not None:
        return task.outputs_of(predictor, target, nodes)
    return predictor.outputs(nodes)


def _require_other_graphs(task) -> None:
    """ValueError unless the run of `task` applies to another graph (`dataset=`): a
    node or link run (of a typed graph: `PredictsOtherGraphs`)."""
    if isinstance(task, (PredictsTypes, PredictsItems, BatchedTask)) and \
            not isinstance(task, PredictsOtherGraphs):
        raise ValueError(f"dataset gives a graph-level run new graphs to predict, and a "
                         f"node or link run another graph; this {task.name!r} run "
                         f"predicts the ids of the dataset it trained on")


# Why `over_graph` (and `zerognn export --graph`) refuse a graph-level run.
ANY_GRAPHS = ("a graph-level run's artifact takes any collection's graphs, in the rows "
              "per call export_model's max_nodes and max_edges give: export it as it is")


def over_graph(result: TrainResult, dataset):
    """(program, data): `result`'s run over `dataset`, another graph as `predict` takes
    it (`dataset=`: prepared as the run prepared its own, the fanouts resolved for its
    degrees), sampled as the run samples. `export_model(program, result.variables,
    data, ...)` of them serves that graph (one grown since training, say), whose arrays'
    lengths the artifact's arguments take.

    Raises:
      TypeError: `result` not a `TrainResult`.
      ValueError: a graph-level run (its artifact takes any graphs: `export_model`'s
        `max_nodes` and `max_edges`), or a `dataset` as `predict` refuses it.
    """
    require_result("over_graph", result)
    task = result.program.task
    if isinstance(task, PredictsNewItems):
        raise ValueError(ANY_GRAPHS)
    _require_other_graphs(task)
    return other_graph(result, dataset, "sampled")


def score_pairs(result: TrainResult, pairs, *, mode: str = "full", batch_size: int = 4096,
                seed: int = 0, dataset=None) -> np.ndarray:
    """float32[P]: a link run's scores of `pairs`, int[P, 2] (source id, destination id;
    a typed run's ids of its relation's source and destination types), from a `train`
    or `restore` result: the decoder's logits (a sigmoid gives probabilities) of every
    node's embedding, computed once a call (`mode`, `batch_size` and `seed` as
    `predict`'s: exact inference reads neither of the last two). Given `dataset`,
    another graph (as `predict` takes it: of one node type, or a typed run's types and
    relations), the pairs are of its nodes, embedded by the run's encoder over that
    graph.

    Raises:
      TypeError: `result` not a `TrainResult`.
      ValueError: a run whose task predicts no pairs, `pairs` not int[P, 2], an id out
        of range of its end, an unknown `mode`, a `batch_size` or `seed` out of range; a
        `dataset` as `predict` refuses it.
    """
    require_result("score_pairs", result)
    task = result.program.task
    if not isinstance(task, ScoresPairs):
        raise ValueError(f"score_pairs scores the pairs of a link run (task 'link'); this "
                         f"run's task is {type(task).__name__}")
    check_call(mode, batch_size, seed)
    pairs = np.asarray(pairs)
    if pairs.shape == (0,):  # an empty list, which NumPy reads as float64[0]: no pairs
        pairs = np.zeros((0, 2), np.int64)
    if pairs.ndim != 2 or pairs.shape[1] != 2 or not np.issubdtype(pairs.dtype, np.integer):
        raise ValueError(f"pairs must be int[P, 2] (source, destination), got "
                         f"{pairs.dtype}{list(pairs.shape)}")
    ends = getattr(getattr(task, "split", None), "ends", None)  # a typed split's two types
    program, data, counts = pairs_over(result, dataset, mode)
    for end, (name, n) in enumerate(zip(("source", "destination"), counts)):
        check_ids(f"pairs' {name} ids", pairs[:, end], n,
                  "" if ends is None else f" ({ends[end]!r} ids)")
    predictor = Predictor(program, result.variables, data, mode, batch_size, seed)
    table, offset = program.task.pair_table(predictor)  # (a typed run's, over `dataset`)
    return score_rows(result.program.model, result.variables, table,
                      pairs.astype(np.int64) + [0, offset])


def require_result(name: str, result) -> None:
    """TypeError unless `result` is a run's `TrainResult` (a config, or the variables
    alone, read as one failed on a missing attribute)."""
    if not isinstance(result, TrainResult):
        raise TypeError(f"{name} takes the TrainResult of zg.train or zg.restore, got "
                        f"{type(result).__name__}")


def check_call(mode: str, batch_size, seed) -> None:
    """The options `predict` and `score_pairs` share, checked before any work."""
    if mode not in ("full", "sampled"):
        raise ValueError(f"mode must be 'full' or 'sampled', got {mode!r}")
    at_least_one(batch_size, "batch_size")
    key_seed(seed)
