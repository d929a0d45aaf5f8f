"""A run's summary record: what ran (model, the user's pieces, evaluation, placement,
early stop, best checkpoint) and what it gave (metrics, times, envelope, memory)."""

from __future__ import annotations

import dataclasses

import jax
import numpy as np

from zerognn_jax._src.nn.models import count_params
from zerognn_jax._src.ops.host_rows import host_table, is_host_resident
from zerognn_jax._src.training import memory
from zerognn_jax._src.training.evaluate import no_layerwise_form, supports_layerwise
from zerognn_jax._src.training.records import strict
from zerognn_jax._src.training.scan import read_ahead_limit, steps_ahead
from zerognn_jax._src.training.tasks.base import BatchedTask, PredictsTypes
from zerognn_jax._src.training.tasks.typed_eval import no_typed_layer_form, typed_layerwise


def run_notes(cfg, program, data, *, model: str | None, custom: dict, best, stopped,
              history, row_normalized: bool | None) -> dict:
    """Summary entries on what ran: the model's name (`model`: the user's class, None for
    the built-in one), the user's pieces (`custom`), how evaluation ran, the best
    checkpoint, an early stop, where the feature table is, whether its rows were
    normalised (None: not a node or link task's table), and how a scan read ahead."""
    notes = {"model": model or cfg.model, "eval_mode": cfg.eval_mode,
             "stopped_early": None if not stopped else {"epoch": history[-1]["epoch"],
                                                        "by": stopped}}
    if custom:
        notes["custom"] = custom
    missing = _no_exact_form(program) if cfg.eval_mode == "full" else None
    if missing:
        notes["eval_mode"] = "sampled"
        notes["eval_note"] = f"{missing}: evaluated on sampled neighbourhoods (the training " \
                             f"fanouts)"
    if cfg.eval_mode == "sampled" and not getattr(program.task, "samples_neighbours", True):
        notes["eval_mode"] = "full"  # whole graphs: no sampled form (warned at the start)
    if best is not None:
        notes["best"] = {"metric": best.metric, "epoch": best.epoch, "value": best.value,
                         "scores": best.scores}
    notes.update(_placement_entries(program, data))
    if row_normalized is not None:
        notes["features_row_normalized"] = row_normalized
    if cfg.engine == "scan":
        notes["sample_ahead"] = steps_ahead(cfg.sample_ahead, data.features)
    if is_host_resident(data.features):
        host = host_table(data.features)
        notes["host_row_order"] = "stored" if host.position is None else "degree"
        cached = getattr(data.features, "rows", None)  # a CachedTable's device rows
        notes["feature_cache_rows"] = 0 if cached is None else int(cached.shape[0])
        if cfg.engine == "scan":
            notes["read_ahead_bytes"] = read_ahead_limit(cfg.read_ahead_bytes)
    return notes


def _no_exact_form(program) -> str | None:
    """Why `program`'s evaluation of mode "full" runs sampled (its model has no exact
    layer-wise form), or None where it is exact; a graph task's whole graphs have no
    other form."""
    if isinstance(program.task, PredictsTypes):
        return None if typed_layerwise(program.model) else no_typed_layer_form(program.model)
    if isinstance(program.task, BatchedTask) or supports_layerwise(program.model):
        return None
    return no_layerwise_form(program.model)


def _placement_entries(program, data) -> dict:
    """The summary's `feature_placement` and `feature_placement_why`: where the table is
    and why (`Placement.describe`); the why is None for a program that does not say."""
    if program.placement is not None:
        return program.placement.describe()
    return {"feature_placement": "host" if is_host_resident(data.features) else "device",
            "feature_placement_why": None}


def _unused_keys(program) -> tuple[str, ...]:
    """The summary's sampling keys that do not apply to `program`: all three for a task
    whose steps sample no neighbours (`Task.samples_neighbours` False: graph batches;
    a task that does not say samples them), the layout where none was chosen."""
    if not getattr(program.task, "samples_neighbours", True):
        return ("fanouts", "sampler", "layout")
    return () if program.layout is not None else ("layout",)


def run_summary(cfg, dataset, program, state, env, cal, history, final, calibrate_seconds,
                compile_seconds, start_epoch, notes, report, *, dataset_given: bool) -> dict:
    """The run's summary record. `epochs` and `median_epoch_seconds` cover every epoch
    trained, resumed runs included; `epochs_run` those trained by this process;
    `compile_seconds` and `calibrate_seconds` this process only (`start_epoch` > 0: it
    resumed from a checkpoint); `config` is every TrainConfig field of the run (lr,
    hidden, layers, dropout, seed, ...), its `dataset` the name of the dataset given to
    `train` where one was (as the checkpoint records it: `cfg.dataset` was not read);
    `fanouts`, `sampler` and `layout` appear where
    they apply (`_unused_keys`); `notes` (`run_notes`) say what ran; `report`, with a
    calibration `cal`, is how its envelope compares with what it saw;
    `embedding_bytes`, with a node embedding (or a typed run's featureless types), what
    its table and two moments hold on each device."""
    times = [h["epoch_seconds"] for h in history]
    summary = {"summary": True, "dataset": dataset.name, "task": cfg.task, "model": cfg.model,
               "params": count_params(state.params),
               "kernels": program.kernels.describe(), "fanouts": list(program.sampler.fanouts),
               "sampler": program.sampler.method,
               "batch_size": program.batch_size, "devices": program.num_shards,
               "processes": jax.process_count(), "global_batch": program.global_batch,
               "shard_features": cfg.shard_features, "epochs": len(history),
               "epochs_run": len(history) - start_epoch,
               "median_epoch_seconds": float(np.median(times)) if times else None,
               "engine": cfg.engine,
               "layout": program.layout and program.layout.describe(),
               "start_epoch": start_epoch, "compile_seconds": compile_seconds,
               "calibrate_seconds": calibrate_seconds,
               "overflows": int(sum(h["overflows"] for h in history)),
               "envelope": list(env.levels), "device": jax.devices()[0].device_kind,
               "peak_bytes_in_use": memory.device_peak_bytes(),
               "jax_version": jax.__version__, **final, **notes,
               "config": dataclasses.asdict(cfg)}
    if dataset_given:  # (the summary had named the default "tiny" it never read)
        summary["config"]["dataset"] = dataset.name
    for key in _unused_keys(program):
        del summary[key]
    if cal is not None:
        summary["envelope_over_ideal"] = report["ratio"]
        summary["calibration_max_counts"] = list(cal.max_counts)
        summary["calibration_mean_counts"] = [float(c) for c in cal.mean_counts]
    if program.embedding is not None:
        emb = program.embedding
        summary["embedding_bytes"] = memory.embedding_bytes(state.embedding.shape[0], emb.dim,
                                                            emb.dtype)
    return strict(summary)
