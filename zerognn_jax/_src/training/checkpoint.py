"""Epoch checkpoints through orbax: model and optimizer state plus a JSON record.

Each checkpoint holds `state` ({params, batch_stats, opt_state}) and `meta`: the run's
`identity` (the options that shape the trained values, and the dataset's size), the
envelope, the shapes of the state's arrays and the epoch records so far. Orbax writes a
checkpoint into a temporary folder and renames it when complete, so a process killed
mid-save leaves the previous checkpoint as the latest one.

Resuming (`find_resumable`, then `restore`): a checkpoint written with other options is
refused with one line naming the options that differ; one that cannot be read, or whose
arrays no longer have the checksums it recorded (checksums.py), is moved aside to
`<epoch>.corrupt` with a `CheckpointWarning`, and the previous one kept is used.

With a user's model, optimizer or loss (`train(model=...)`), the identity also names the
model's class, "custom" for the optimizer and the loss function's name; the model's
parameter shapes are compared through the state's shapes. An optimizer's settings
(learning rate, schedule) cannot be read from it and are not compared.

The best-validation checkpoint (`best_metric`) lives in `<checkpoint_dir>/best`: a second
manager that keeps one checkpoint, chosen by orbax's `best_fn` on the saved metric.
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import json
import logging
import math
import os
import re
import shutil
import sys
import threading
import time
import types
import warnings
from pathlib import Path

import jax
import orbax.checkpoint as ocp

from zerognn_jax._src.data.hetero import named_relation, relation_name
from zerognn_jax._src.data.links import split_digest
from zerognn_jax._src.data.version import VERSION
from zerognn_jax._src.data.writes import atomic_write, write_error
from zerognn_jax._src.training.callbacks import best_mode
from zerognn_jax._src.training.checkpoint_errors import CheckpointMismatch, CheckpointWarning
from zerognn_jax._src.training.checksums import check_checksums, state_checksums
from zerognn_jax._src.training.lock import BEST, EVALUATION, live_holder
from zerognn_jax._src.training.records import dumps

FORMAT = 1
# TrainConfig fields a resumed run may change: they leave the trained values unchanged
# (kernels, envelopes and the GEMM backend give the same result up to rounding; the
# engine and the feature placement may change the default level layout, hence the
# subgraphs sampled from then on, but not the model or its optimizer state; steps
# sampled ahead are the steps sampled one by one; the batch
# is compared as the global batch, so the devices may change with the per-device
# batch; the data are compared by their sizes, not by the name, path or preset scale
# they were loaded from: a preset's file written by `zerognn data generate` resumes a
# run of the preset) or only say how long to train, what to evaluate and where to write.
# Every other field must match the checkpoint, new ones included, except those in
# ADDED_SINCE.
FREE_ON_RESUME = frozenset({
    "epochs", "dataset", "root", "scale", "batch_size", "devices", "shard_features", "kernels",
    "graph_aggregation", "feature_placement", "feature_cache_gib", "host_row_order",
    "chunk_steps", "engine", "envelope", "margin", "multiple", "eval_mode", "eval_every",
    "eval_batch_size", "checkpoint_dir", "metrics_out", "progress", "tensorboard_dir",
    "best_metric", "patience", "checkpoint_keep", "gemm_backend", "sample_ahead",
    "read_ahead_gib",
})
DATASET_KEYS = ("name", "nodes", "directed_edges", "features", "classes", "train",
                "graphs", "edges")
# Dataset counts recorded since 2026-12-01 (a graph collection's graphs and edges: one
# of as many nodes but other graphs had resumed unremarked) and 2026-12-04 (a typed
# graph's node types in order with their counts: the same types listed in another order
# had resumed with their learnable rows swapped); a checkpoint written before is not
# compared on them.
DATASET_ADDED_SINCE = ("dataset.graphs", "dataset.edges", "dataset.node_types")
# TrainConfig fields added after checkpoints began to record their options, with what every
# run did before the field existed: a checkpoint that does not record one resumes under
# that value only.
ADDED_SINCE = {"init": "flax", "link_relation": None, "link_split": None,
               "decoupled_weight_decay": False, "lr_schedule": "constant",
               "warmup_epochs": 0, "grad_clip": 0.0, "activation": "relu",
               "attention_dropout": 0.0, "output_heads": 1}



def identity(cfg, dataset_stats: dict, global_batch: int, extra: dict | None = None,
             relations=()) -> dict:
    """What a checkpoint must agree on with the run resuming from it, as flat JSON: the
    TrainConfig fields not in FREE_ON_RESUME, the global batch (seeds per step over every
    device and process), the dataset's counts (`Dataset.stats()`; its target kind and
    output width when they are not class labels) and `extra` (what the user brought:
    "model", "optimizer", "loss"; as "custom.model", ...), with the relations named by
    `relation_fanouts` and `link_relation` written in full (`full_names`), and a
    `link_split` file by its arrays' digest (`split_digest`: the same pairs resume from
    another path; other pairs saved at the same path do not)."""
    out = {f.name: getattr(cfg, f.name) for f in dataclasses.fields(cfg)
           if f.name not in FREE_ON_RESUME}
    out = full_names(out, relations)
    if cfg.link_split is not None:
        out["link_split"] = split_digest(cfg.link_split)
    out["global_batch"] = global_batch
    if cfg.lr_schedule == "cosine":  # its length is the run's epochs: more of them on
        out["schedule_epochs"] = cfg.epochs  # resume would bend the rest of the curve
    # a graph collection's statistics hold no directed_edges, features or classes, and
    # a graph's counts of graphs and edges (DATASET_ADDED_SINCE)
    out.update({f"dataset.{k}": dataset_stats[k] for k in DATASET_KEYS if k in dataset_stats})
    if "node_types" in dataset_stats:  # in order: the stacked embedding table's row blocks
        out["dataset.node_types"] = [[t, info["nodes"]]
                                     for t, info in dataset_stats["node_types"].items()]
    if dataset_stats.get("target_kind", "classes") != "classes":
        out.update({f"dataset.{k}": dataset_stats[k] for k in ("target_kind", "outputs")})
    out.update({f"custom.{k}": v for k, v in (extra or {}).items()})
    return json.loads(json.dumps(out))


def check_epochs(epochs: int, resumable: list[int], directory: str) -> None:
    """Raises ValueError if the newest of `resumable` (the epochs to resume from, newest
    first) is past `epochs`, the epochs asked: resuming would train nothing."""
    if resumable and resumable[0] + 1 > epochs:
        held = resumable[0] + 1
        raise ValueError(f"epochs {epochs} is below the {held} epochs that checkpoint_dir "
                         f"{directory} holds, so nothing would be trained; ask for epochs "
                         f"{held + 1} or more to train on ({held} to evaluate it again), or "
                         f"use another checkpoint_dir to start afresh")


def written_by() -> dict[str, str]:
    """The versions of this package and of JAX that write a checkpoint (a record read
    by another version says which wrote it; records of earlier versions have none)."""
    return {"zerognn_jax": VERSION, "jax": jax.__version__}


def state_spec(state) -> dict:
    """{path: [shape, dtype]} of every array of `state`."""
    leaves = jax.tree_util.tree_flatten_with_path(state)[0]
    return {jax.tree_util.keystr(path): [list(leaf.shape), str(leaf.dtype)]
            for path, leaf in leaves}


def full_names(ident: dict, relations) -> dict:
    """`ident` (options by name) with the relations of a typed graph's `relations` that
    its `relation_fanouts` keys and `link_relation` name written "src__name__dst": a
    relation's unique name is as valid an option, and either spelling resumes the
    other's checkpoint; so does a link task's `link_relation` None on a graph of one
    relation, which names that relation. A key that names no one relation (a checkpoint
    of another graph) stays as written, to be reported as a difference."""
    def full(key: str) -> str:
        try:
            return relation_name(named_relation(relations, key, "relation"))
        except ValueError:
            return key

    out = dict(ident)
    if out.get("relation_fanouts"):
        out["relation_fanouts"] = {full(k): v for k, v in out["relation_fanouts"].items()}
    if out.get("link_relation"):
        out["link_relation"] = full(out["link_relation"])
    elif out.get("task") == "link" and len(relations) == 1:
        out["link_relation"] = relation_name(relations[0])
    return out


def differences(saved: dict, current: dict) -> list[str]:
    """"key A there, B here" for every key whose value differs (or is absent on one
    side). An option left unset (None: the library picks, as `dedup` and
    `normalize_features`) is said so, where "None" named no value a command line takes;
    set to what the library would pick, it still differs: leaving it unset resumes."""
    absent = object()
    show = lambda v: ("absent" if v is absent else "unset (the default)" if v is None
                      else repr(v))
    keys = list(current) + [k for k in saved if k not in current]
    return [f"{_SHOWN.get(k, k)} {show(saved.get(k, absent))} there, "
            f"{show(current.get(k, absent))} here"
            for k in keys if saved.get(k, absent) != current.get(k, absent)]


# How a state spec's entries of optimizer state begin (`state_spec`: the model's
# optimizer, a learnable embedding's row optimizer).
OPTIMIZER_STATE = ("['opt_state']", "['embedding_opt']")


# Keys of an identity that name no option, or not its value, with what they hold (the
# batch as asked: a batch larger than a device's share of the training items is
# lowered for the run, not for the comparison)
_SHOWN = {"global_batch": "global_batch (batch_size as asked x devices x processes)",
          "schedule_epochs": "epochs (the length of lr_schedule 'cosine')",
          "link_split": "link_split (the digest of its file's pairs)"}


# What tensorstore appends to a message: its specs as JSON, ` [tensorstore_spec='{...}']`.
_PAYLOADS = re.compile(r" \[[\w.\[\]]+='.*$")


# How orbax's wrapper of a failed array read begins its tensorstore spec; its cause says
# what failed.
_ORBAX_SPEC = "See full TensorStore details"


def _short(err: BaseException) -> str:
    """The error's type and first line without tensorstore's payloads (orbax's wrapper of a
    failed read: its cause's); whole otherwise, so a path in it is never cut."""
    text = str(err).strip().splitlines()
    if text and _ORBAX_SPEC in text[0] and err.__cause__ is not None:
        return _short(err.__cause__)
    return f"{type(err).__name__}: {_PAYLOADS.sub('', text[0]) if text else ''}"


class CheckpointGone(ValueError):
    """A checkpoint was removed while it was read: a run still training into the folder
    keeps its latest checkpoints and removes older ones. Nothing is damaged."""


def _gone(directory, epoch: int) -> CheckpointGone:
    """The error of checkpoint `epoch` of `directory` removed while it was read, naming
    the run that holds the folder (or the folder above its best/), if one does."""
    directory = Path(directory)
    holder = live_holder(directory) or (live_holder(directory.parent)
                                        if directory.name == BEST else None)
    by = "" if holder is None else (
        f" by the run training into it (pid {holder.get('pid', '?')} on host "
        f"{holder.get('host', '?')}), which keeps its latest checkpoints and removes "
        f"older ones")
    return CheckpointGone(f"checkpoint {epoch} in {directory} was removed while it was "
                          f"read{by}; read the folder again for its latest, or wait for "
                          f"the run to end")


def readable(read, directory, epoch: int):
    """`read()` of checkpoint `epoch` in `directory`; ValueError naming both and the
    cause's first line where it fails (a file missing, cut short or edited), or
    CheckpointGone where the checkpoint's folder went during the read."""
    try:
        return read()
    except CheckpointMismatch:
        raise
    except Exception as err:  # noqa: BLE001 - any failure to read means damaged
        _drop_frames(err)
        if not (Path(directory) / str(epoch)).exists():
            raise _gone(directory, epoch) from None
        raise ValueError(f"checkpoint {epoch} in {directory} does not read ({_short(err)}); "
                         "pick another (epoch= or best=True; on the command line --epoch "
                         "or --best), or retrain") from err


def _drop_frames(err: BaseException) -> None:
    """Clears the tracebacks of `err` and the exceptions it chains. Their frames hold
    orbax's failed read tasks; kept alive by the error raised in its place, the tasks
    would outlive `_quiet` and print their tracebacks at exit. The types and messages
    stay."""
    seen = set()
    while err is not None and id(err) not in seen:
        seen.add(id(err))
        err.__traceback__ = None
        err = err.__cause__ or err.__context__


def _teardown_noise(unraisable, coroutine=types.CoroutineType) -> bool:
    """Whether an exception Python could not raise is the leftover of a failed orbax
    read or write: a coroutine never awaited, or a tensorstore callback that reached the
    asyncio event loop orbax had already closed (printed as "RuntimeError: Event loop is
    closed" tracebacks, a dozen for one corrupt checkpoint). (What it reads is bound as
    defaults, here and in the hooks that call it: at the interpreter's exit, where a
    Checkpointer never closed still holds a hook, modules' globals are None.)"""
    err = unraisable.exc_value
    return isinstance(unraisable.object, coroutine) or (
        isinstance(err, RuntimeError) and str(err) == "Event loop is closed")


# What marks one of asyncio's reports of a failure nothing awaited ("Task exception was
# never retrieved", "Future ...", "_GatheringFuture ..." when the object is collected;
# "unhandled exception during asyncio.run() shutdown", Python 3.12) as orbax's: its code,
# or the tensorstore error it holds.
_ORBAX_MARKS = ("orbax", "TensorStore", "tensorstore", "OCDBT")


class _OrbaxTasks(logging.Filter):
    """Drops asyncio's reports of orbax's failed reads and writes: the failure they hold
    is the one the save or restore raised."""

    def filter(self, record: logging.LogRecord) -> bool:
        text = record.getMessage()
        first = text.split("\n", 1)[0]
        unawaited = (first.endswith("exception was never retrieved")
                     or first.startswith("unhandled exception during asyncio.run() shutdown"))
        return not (unawaited and any(mark in text for mark in _ORBAX_MARKS))


def quiet_until_exit() -> None:
    """Keeps `_quiet`'s filters of orbax's leftovers for the rest of the process: a command
    that failed is about to exit, and the read tasks of a damaged checkpoint may be
    collected only then (orbax's event loop holds them), each printing its traceback;
    or tensorstore's callbacks, reaching orbax's closed event loop from their own
    threads, report theirs through `sys.excepthook`. Once a process."""
    if _exiting[0]:
        return
    _exiting[0] = True
    logging.getLogger("asyncio").addFilter(_OrbaxTasks())
    sys.unraisablehook = _without_noise(sys.unraisablehook)
    sys.excepthook = _without_closed_loop(sys.excepthook)


_exiting = [False]  # (`quiet_until_exit` ran)


def _without_closed_loop(hook):
    """`hook` (a `sys.excepthook`) that drops "RuntimeError: Event loop is closed"."""
    def excepthook(kind, value, tb, hook=hook):
        if not (isinstance(value, RuntimeError) and str(value) == "Event loop is closed"):
            hook(kind, value, tb)
    return excepthook


def _without_noise(hook):
    """`hook` that first drops `_teardown_noise` (both bound: see there)."""
    return lambda u, noise=_teardown_noise, hook=hook: None if noise(u) else hook(u)


# Failed orbax calls so far (`_quiet`): a context collects garbage only after one.
_failures = [0]


@contextlib.contextmanager
def _quiet():
    """Silences orbax: its log lines, and the asyncio leftovers of a failed read or write
    (`_teardown_noise`, `_OrbaxTasks`), collected here rather than at exit. A
    Checkpointer holds it for its life, as the leftovers may come after the call. The
    collection runs only where a call failed since the context began: in a process
    holding many objects (a test suite) one took ~0.8 s, and every context ran one."""
    logger, tasks, hook = logging.getLogger("absl"), _OrbaxTasks(), sys.unraisablehook
    level, failures = logger.level, _failures[0]
    logger.setLevel(logging.CRITICAL)
    logging.getLogger("asyncio").addFilter(tasks)
    sys.unraisablehook = _without_noise(hook)
    try:
        yield
    except BaseException:
        _failures[0] += 1
        raise
    finally:
        if _failures[0] != failures:
            gc.collect()
        sys.unraisablehook = hook
        logging.getLogger("asyncio").removeFilter(tasks)
        logger.setLevel(level)


def _join_orbax_threads(seconds: float = 10.0) -> None:
    """Waits, at most `seconds` in all, for orbax's threads: after a failed save its
    metadata writer goes on, wrote into the temporary folder once that was removed, and
    logged its failure (a traceback) after `_quiet` or at the process's exit."""
    end = time.monotonic() + seconds
    for thread in threading.enumerate():
        if type(thread).__module__.startswith("orbax.") and thread.is_alive():
            thread.join(max(end - time.monotonic(), 0.0))


class Checkpointer:
    """Saves `{params, batch_stats, opt_state}` and a JSON dict after each epoch.

    With `best_metric` it keeps the one checkpoint whose saved metric of that name is the
    best (`best_mode`), through orbax's `best_fn`.
    """

    def __init__(self, directory: str, *, keep: int = 2, best_metric: str | None = None,
                 create: bool = True):
        self.directory = Path(directory).absolute()  # (orbax's)
        self.named = directory  # as the user gave it, for messages (errors.md's spelling)
        # what a refused identity asks for: a run resumes, a restore (create False) reads
        self._remedy = ("resume with the same settings or use another checkpoint_dir"
                        if create else "restore it with the settings, dataset and model "
                                       "it was trained with")
        self.best_metric = best_metric
        best = {} if best_metric is None else dict(
            best_fn=lambda metrics: float(metrics[best_metric]),
            best_mode=best_mode(best_metric), keep_checkpoints_without_metrics=False)
        with contextlib.ExitStack() as quiet:
            quiet.enter_context(_quiet())  # until close(), or now if orbax fails
            self._manager = ocp.CheckpointManager(
                self.directory,
                options=ocp.CheckpointManagerOptions(
                    max_to_keep=1 if best_metric else keep, create=create,
                    enable_async_checkpointing=False, **best),
                item_names=("state", "meta"),
            )
            self._quiet = quiet.pop_all()

    def latest_epoch(self) -> int | None:
        return self._manager.latest_step()

    def all_epochs(self) -> list[int]:
        return list(self._manager.all_steps())

    def save(self, epoch: int, state: dict, meta: dict, metrics: dict | None = None) -> None:
        """Writes the checkpoint of `epoch`; `meta` gets the format and the state's shapes.
        `metrics` ({name: float}) are what `best_fn` ranks checkpoints by; a best
        checkpoint of `epoch` that exists already (a run resumed before it) is replaced.

        Raises:
          WriteError: the checkpoint could not be written (a full disk, ...): an OSError
            naming the folder and the errno; its temporary folder is removed.
        """
        meta = {"format": FORMAT, "written_by": written_by(), "epoch": epoch,
                "state_spec": state_spec(state), "checksums": state_checksums(state), **meta}
        if self.best_metric is not None and epoch in self._manager.all_steps():
            self._manager.delete(epoch)
        try:
            with _quiet():
                try:
                    saved = self._manager.save(epoch, args=ocp.args.Composite(
                        state=ocp.args.StandardSave(state), meta=ocp.args.JsonSave(meta)),
                        metrics=metrics)
                    self._manager.wait_until_finished()
                except (OSError, ValueError):
                    _join_orbax_threads()
                    raise
        except (OSError, ValueError) as err:  # tensorstore reports a full disk as ValueError
            if jax.process_index() == 0:
                for tmp in self.directory.glob(f"{epoch}.orbax-checkpoint-tmp*"):
                    shutil.rmtree(tmp, ignore_errors=True)
            if (self.directory / str(epoch)).is_dir():  # written: the cleanup failed
                raise write_error("an older checkpoint in checkpoint_dir", self.named, err,
                                  failed="remove", outcome=f"the checkpoint of epoch {epoch} "
                                  f"was written, and a rerun resumes from it") from None
            raise write_error(f"the checkpoint of epoch {epoch} in checkpoint_dir",
                              self.named, err) from None
        if not saved:
            raise RuntimeError(f"orbax did not save epoch {epoch} into {self.named}: a "
                               f"checkpoint of that epoch exists already")

    def save_evaluation(self, record: dict, evaluated: dict) -> None:
        """Records `evaluated`, the evaluation of the epoch whose training `record` (as
        its checkpoint holds it) gives, beside the checkpoints (`evaluation.json`,
        replaced whole): the epoch's checkpoint is written before it is evaluated, and a
        resumed run takes the evaluation from here rather than running it again.

        Raises:
          WriteError: the record could not be written (an OSError naming the file).
        """
        if jax.process_index() != 0:
            return
        text = dumps({"trained": _trained(record), "evaluation": evaluated})
        with atomic_write(self.directory / EVALUATION,
                          "the evaluation record in checkpoint_dir") as f:
            f.write(text.encode())

    def evaluation_of(self, record: dict) -> dict | None:
        """The evaluation `save_evaluation` recorded for the epoch of training `record`,
        or None (none, another epoch's or run's, unreadable, or holding a value that is
        no number: edited or damaged; the epoch is then evaluated again)."""
        try:
            saved = json.loads((self.directory / EVALUATION).read_text())
            evaluated = saved["evaluation"]
            ok = saved["trained"] == _trained(record) and isinstance(evaluated, dict) and \
                all(v is None or (isinstance(v, int | float) and not isinstance(v, bool))
                    for v in evaluated.values())
        except (OSError, ValueError, TypeError, KeyError):
            return None
        return evaluated if ok else None

    def read_meta(self, epoch: int) -> dict:
        with _quiet():
            out = self._manager.restore(epoch, args=ocp.args.Composite(
                meta=ocp.args.JsonRestore()))
        if not isinstance(out["meta"], dict):
            raise ValueError(f"meta is {type(out['meta']).__name__}, not a JSON object")
        recorded = out["meta"].get("epoch", epoch)
        if recorded != epoch:  # its arrays are that epoch's, whatever the folder says
            raise ValueError(f"its record is of epoch {recorded!r}: a folder copied or "
                             f"renamed from another epoch's")
        return out["meta"]

    def restore(self, epoch: int, like: dict) -> tuple[dict, dict]:
        """Restores the checkpoint of `epoch` into the structure and shardings of `like`,
        its arrays' checksums compared with those it recorded (ValueError where one
        differs: bytes damaged on disk)."""
        abstract = jax.tree_util.tree_map(ocp.utils.to_shape_dtype_struct, like)
        with _quiet():
            out = self._manager.restore(epoch, args=ocp.args.Composite(
                state=ocp.args.StandardRestore(abstract), meta=ocp.args.JsonRestore()))
        check_checksums(epoch, out["state"], out["meta"].get("checksums"))
        return out["state"], out["meta"]

    def restore_as_saved(self, epoch: int, parts: tuple[str, ...] | None = None) -> dict:
        """The state of `epoch` in the structure it was saved with (read from the
        checkpoint's metadata, so no optimizer is needed: what inference restores), every
        array whole on this process's first device, whatever mesh saved it. With `parts`,
        only those entries of the state are read (inference: not the optimizer's moments,
        twice a model's bytes under Adam); the others are left out of the result."""
        device = jax.sharding.SingleDeviceSharding(jax.local_devices()[0])
        with _quiet():
            saved = self._shapes(epoch)
            if parts is None:
                abstract = jax.tree_util.tree_map(
                    lambda m: jax.ShapeDtypeStruct(m.shape, m.dtype, sharding=device), saved)
                out = self._manager.restore(epoch, args=ocp.args.Composite(
                    state=ocp.args.StandardRestore(abstract)))
                return out["state"]
            # Leaves given as orbax's PLACEHOLDER are not read.
            abstract = {k: jax.tree_util.tree_map(
                lambda m: jax.ShapeDtypeStruct(m.shape, m.dtype, sharding=device), v)
                if k in parts else jax.tree_util.tree_map(lambda _: ocp.PLACEHOLDER, v)
                for k, v in saved.items()}
            read = jax.tree_util.tree_map(
                lambda a: a if a is ocp.PLACEHOLDER else ocp.ArrayRestoreArgs(sharding=device),
                abstract)
            with ocp.PyTreeCheckpointer() as reader:  # the manager's item reads it whole
                out = reader.restore(self.directory / str(epoch) / "state",
                                     args=ocp.args.PyTreeRestore(abstract, restore_args=read))
        return {k: v for k, v in out.items() if k in parts}

    def _shapes(self, epoch: int) -> dict:
        """The tree of the arrays' shapes and dtypes that checkpoint `epoch` recorded;
        ValueError naming the record where it does not read as one (orbax gives None
        for a record that is no JSON, and fails on one whose keys changed)."""
        record = self.directory / str(epoch) / "state"
        try:
            saved = ocp.StandardCheckpointer().metadata(record).item_metadata
            saved = getattr(saved, "tree", saved)
        except Exception as err:  # noqa: BLE001 - any failure to read means damaged
            saved = f" ({_short(err)})"
        if not isinstance(saved, dict):
            why = saved if isinstance(saved, str) else ""
            raise ValueError(f"the record of its arrays' shapes ({record / '_METADATA'}) "
                             f"does not read{why}: damaged on disk")
        return saved

    def check(self, epoch: int, meta: dict, ident: dict, relations=()) -> None:
        """Raises CheckpointMismatch if `meta` (of `epoch`) records another identity
        (relations named as `full_names` writes them for a graph of `relations`)."""
        self._check(epoch, meta, ident, None, relations)

    def find_resumable(self, ident: dict, relations=()) -> list[int]:
        """The epochs to try resuming from, newest first: from the newest checkpoint whose
        record can be read and has the identity `ident` (unreadable newer ones are set
        aside); [] for a folder without checkpoints.

        Raises:
          CheckpointMismatch: that checkpoint has another identity.
          ValueError: checkpoints exist but none can be read.
        """
        return self._first_readable(ident, None, relations=relations)[0]

    def restore_first(self, epochs: list[int], ident: dict, like: dict,
                      relations=()) -> tuple[int, dict, dict] | None:
        """(epoch, state, meta) of the first of `epochs` whose state restores into the
        structure and shardings of `like` (the ones before it are set aside); None if
        `epochs` is empty. Raises as `find_resumable`, and CheckpointMismatch for a
        checkpoint whose arrays have other shapes than `like`'s."""
        epochs, restored = self._first_readable(ident, like, epochs, relations)
        return None if restored is None else (epochs[0], *restored)

    def restore_one(self, epoch: int, meta: dict, ident: dict, like: dict,
                    relations=()) -> tuple[dict, dict]:
        """(state, meta) of checkpoint `epoch` (whose record is `meta`), restored into
        the structure and shardings of `like`: as `restore_first` of that epoch alone,
        but one that does not read is refused (`readable`), not set aside: a restore
        leaves the folder as it found it, where resuming a run sets aside."""
        self._check(epoch, meta, ident, like, relations)
        return readable(lambda: self.restore(epoch, like), self.directory, epoch)

    def _first_readable(self, ident: dict, like: dict | None, epochs=None, relations=()):
        if epochs is None:
            epochs = sorted(self._manager.all_steps(), reverse=True)
        problems = []
        for i, epoch in enumerate(epochs):
            try:
                meta = self.read_meta(epoch)
                self._check(epoch, meta, ident, like, relations)
                restored = None if like is None else self.restore(epoch, like)
            except CheckpointMismatch:
                raise
            except Exception as err:  # noqa: BLE001 - any failure to read means corrupt
                if not (self.directory / str(epoch)).exists():  # removed by a live run
                    raise _gone(self.named, epoch) from None
                problems.append(f"epoch {epoch}: {_short(err)}")
                continue
            self._set_aside(epochs[:i], problems)
            return epochs[i:], restored
        if problems:
            raise ValueError(f"no readable checkpoint in {self.named} "
                             f"({'; '.join(problems)}); move the folder away to start afresh")
        return [], None

    def _check(self, epoch: int, meta: dict, ident: dict, like: dict | None,
               relations) -> None:
        """Raises CheckpointMismatch if `meta` records another identity or other arrays."""
        where = f"checkpoint_dir {self.named} holds"
        if meta.get("format", FORMAT) != FORMAT:  # (every record this library writes has it)
            by = meta.get("written_by")
            by = by.get("zerognn_jax") if isinstance(by, dict) else None
            raise CheckpointMismatch(
                f"{where} a checkpoint of format {meta['format']!r} (epoch {epoch}"
                f"{'' if by is None else f', written by zerognn-jax {by}'}); "
                f"this version of zerognn-jax reads format {FORMAT}: use the version that "
                f"wrote it, or another checkpoint_dir")
        if "identity" not in meta:
            raise CheckpointMismatch(f"{where} a checkpoint that records no options (epoch "
                                     f"{epoch}, written by an older version); use another "
                                     f"checkpoint_dir")
        # a field made free since the checkpoint was written is free in it too
        saved = {k: v for k, v in meta["identity"].items() if k not in FREE_ON_RESUME}
        saved.update({k: v for k, v in ADDED_SINCE.items() if k not in saved})
        if saved.get("custom.loss") == "partial" and \
                str(ident.get("custom.loss")).startswith("partial("):
            # written before 2026-12-02, when every functools.partial loss was named
            # "partial": taken as the partial given now, as it was then
            saved["custom.loss"] = ident["custom.loss"]
        ident = {k: v for k, v in ident.items()
                 if k in saved or k not in DATASET_ADDED_SINCE}
        if saved.get("lr_schedule") != ident.get("lr_schedule"):  # said by lr_schedule
            saved.pop("schedule_epochs", None)
            ident = {k: v for k, v in ident.items() if k != "schedule_epochs"}
        diff = differences(full_names(saved, relations), ident)
        if diff:
            raise CheckpointMismatch(
                f"{where} a run with other settings (epoch {epoch}): {'; '.join(diff)}; "
                f"{self._remedy}")
        if like is not None:
            self.check_arrays(epoch, meta.get("state_spec", {}), state_spec(like))

    def check_arrays(self, epoch: int, saved: dict, current: dict) -> None:
        """CheckpointMismatch naming the arrays whose shapes or dtypes differ between the
        state specs `saved` (epoch `epoch`'s) and `current`: the model's variables first
        (an optimizer's moments repeat their differences), or the optimizer's state."""
        diff = differences(saved, current)
        if not diff:
            return
        model = [d for d in diff if not d.startswith(OPTIMIZER_STATE)]
        what = ("other model variables" if model else "another optimizer's state (another "
                "optimizer, or a schedule where there was none, or the reverse)")
        shown = (model or diff)[:3]
        more = len(diff) - len(shown)
        raise CheckpointMismatch(
            f"checkpoint_dir {self.named} holds {what} (epoch {epoch}): {'; '.join(shown)}"
            f"{f' (and {more} more)' if more else ''}; {self._remedy}")

    def _set_aside(self, epochs: list[int], problems: list[str]) -> None:
        """Renames the unreadable checkpoints of `epochs` to `<epoch>.corrupt`, so the
        epochs can be saved again, and warns."""
        if not epochs:
            return
        if jax.process_index() == 0:
            for epoch in epochs:
                src, n = self.directory / str(epoch), 0
                dst = self.directory / f"{epoch}.corrupt"
                while dst.exists():
                    n += 1
                    dst = self.directory / f"{epoch}.corrupt-{n}"
                os.replace(src, dst)
        self._manager.reload()
        names = ", ".join(f"{e}.corrupt" for e in epochs)
        warnings.warn(f"unreadable checkpoint in {self.named} ({'; '.join(problems)}); "
                      f"set aside as {names}, resuming from the one before", CheckpointWarning,
                      stacklevel=4)

    def close(self) -> None:
        self._manager.close()
        self._quiet.close()


def _trained(record: dict) -> dict:
    """What tells one epoch's training from any other: its number, loss and wall time."""
    return {k: record.get(k) for k in ("epoch", "loss", "epoch_seconds")}


def check_best_metric(checkpoint_dir: str, metric: str) -> None:
    """Raises CheckpointMismatch if `<checkpoint_dir>/best` holds the best checkpoint of
    another metric than `metric` (a run resumed with another best_metric: its best
    would be ranked by one metric and the folder hold another's). A folder that cannot
    be read is left to the restore that reads it."""
    folder = Path(checkpoint_dir) / BEST
    if not folder.is_dir():
        return
    ckpt = Checkpointer(str(folder), create=False)
    try:
        held = ckpt.latest_epoch()
        kept = None if held is None else ckpt.read_meta(held).get("best", {}).get("metric")
    except (OSError, ValueError, AttributeError):
        return
    finally:
        ckpt.close()
    if held is not None and kept != metric:
        raise CheckpointMismatch(
            f"best_metric {metric!r} is not the metric of the best checkpoint in "
            f"checkpoint_dir {checkpoint_dir} (epoch {held}, kept by {kept!r}): resume with "
            f"best_metric {kept!r}, or use another checkpoint_dir")


class BestCheckpoint:
    """The best-validation checkpoint of a run: `<checkpoint_dir>/best` holds the state
    of the epoch with the best evaluated `metric` so far (`best_mode`).

    `history` (a resumed run's records) gives the value to beat: that of the epoch the
    folder holds (kept by the same metric: `check_best_metric`), not the best of every
    record: epochs a run without `best_metric` trained were never offered, and their
    value named a checkpoint `best/` lacks. Where it holds none (the run before kept no
    best checkpoint) the best is of the epochs from here on, whose states it can hold.
    """

    def __init__(self, checkpoint_dir: str, metric: str, history=()):
        self.metric, self.mode = metric, best_mode(metric)
        self.value, self.epoch, self.scores, self._warned = None, None, {}, False
        self._ckpt = Checkpointer(str(Path(checkpoint_dir) / BEST), best_metric=metric)
        held = self._ckpt.latest_epoch()
        for record in history:
            if held is not None and record.get("epoch") == held:
                self._take(held, record.get(metric), record)

    def _better(self, value) -> bool:
        if value is None or not math.isfinite(value):
            return False
        return self.value is None or (value > self.value if self.mode == "max"
                                      else value < self.value)

    def _take(self, epoch, value, evaluated: dict) -> bool:
        """Takes `epoch` as the best if its `value` is better; `scores` then holds every
        split's score its evaluation gave (`evaluated`: the evaluation, or the epoch's
        record, whose training figures are left out)."""
        if not self._better(value):
            return False
        self.value, self.epoch = float(value), epoch
        self.scores = {k: v for k, v in evaluated.items()
                       if k.startswith(("train_", "val_", "test_"))
                       and not k.startswith("train_batch_")}
        return True

    def offer(self, epoch: int, evaluated: dict | None, state: dict, meta: dict) -> bool:
        """Saves `state` if `evaluated` (the epoch's evaluation, None if it had none)
        holds a better value of the metric; True if it did.

        Raises:
          ValueError: the epoch was evaluated, but without this metric.
        """
        if not evaluated:
            return False
        if self.metric not in evaluated:
            raise ValueError(f"best_metric {self.metric!r} is not among the evaluated "
                             f"metrics: {', '.join(sorted(evaluated))}")
        value = evaluated[self.metric]
        if (value is None or not math.isfinite(value)) and not self._warned:
            self._warned = True  # once a run: a split may lack a value every epoch
            warnings.warn(f"best_metric {self.metric!r} has no value at epoch {epoch} (an "
                          f"empty split, or one class only: ROC-AUC and AP need both): "
                          f"such an epoch cannot become the best checkpoint",
                          CheckpointWarning, stacklevel=2)
        if not self._take(epoch, value, evaluated):
            return False
        self._ckpt.save(epoch, state, {**meta, "best": {"metric": self.metric,
                                                       "value": self.value}},
                        metrics={self.metric: self.value})
        return True

    def close(self) -> None:
        self._ckpt.close()
