"""The user-facing training loop: config in, trained model and per-epoch records out."""

from __future__ import annotations

import dataclasses
import sys
import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from tqdm.auto import tqdm

from zerognn_jax._src.data.dataset import Dataset
from zerognn_jax._src.data.loaders import load_dataset, row_normalize
from zerognn_jax._src.nn.models import count_params, make_model
from zerognn_jax._src.ops.registry import Kernels
from zerognn_jax._src.sampling.calibrate import choose_envelope
from zerognn_jax._src.sampling.envelope import Envelope
from zerognn_jax._src.sampling.minibatch import SamplerConfig, prepare_graph
from zerognn_jax._src.training import interrupts, memory
from zerognn_jax._src.training.config import TrainConfig
from zerognn_jax._src.training.engines import make_engine
from zerognn_jax._src.training.parallel import make_mesh
from zerognn_jax._src.training.program import DeviceData, StepProgram, init_state
from zerognn_jax._src.training.records import MetricsLog, check_output_paths, strict

PLANETOID = ("cora", "citeseer", "pubmed")


@dataclasses.dataclass
class TrainResult:
    """What `train` returns: final variables, one record per epoch, and a summary."""

    variables: dict
    history: list[dict]
    summary: dict
    program: Any = None
    data: Any = None


def make_optimizer(cfg: TrainConfig) -> optax.GradientTransformation:
    """Adam, with L2 weight decay added to the gradient (as in the GCN paper) if set."""
    adam = optax.adam(cfg.lr)
    return optax.chain(optax.add_decayed_weights(cfg.weight_decay), adam) \
        if cfg.weight_decay else adam


def prepare(cfg: TrainConfig, dataset: Dataset | None = None):
    """Loads the data and builds (dataset, device data, step program)."""
    if dataset is None:
        dataset = load_dataset(cfg.dataset, cfg.root, scale=cfg.scale, seed=cfg.seed)
    feats = dataset.features
    norm = cfg.normalize_features
    if norm or (norm is None and dataset.name in PLANETOID):
        feats = row_normalize(feats)
    labels = np.maximum(dataset.labels, 0).astype(np.int32)
    sampler = SamplerConfig(cfg.fanouts, replace=cfg.replace, dedup=cfg.dedup,
                            method=cfg.sampler)
    sampler = sampler.resolve(dataset.graph.max_degree())
    graph = prepare_graph(dataset.graph, sampler)
    dtype = jnp.dtype(cfg.dtype)
    model = make_model(cfg.model, hidden=cfg.hidden, num_layers=cfg.layers,
                       num_classes=dataset.num_classes, dropout=cfg.dropout,
                       input_dropout=cfg.input_dropout, norm=cfg.norm, heads=cfg.heads,
                       dtype=dtype)
    program = StepProgram(model, make_optimizer(cfg), sampler, cfg.batch_size, cfg.seed,
                          Kernels.parse(cfg.kernels))
    mesh = make_mesh(cfg.devices)
    if mesh.size == 1 and not cfg.shard_features:
        data = DeviceData(graph.to_device(), jnp.asarray(feats, dtype),
                          jnp.asarray(labels))
        return dataset, data, program
    program = program.with_mesh(mesh, shard_features=cfg.shard_features)
    host = DeviceData(graph, np.asarray(feats).astype(dtype), labels)
    return dataset, program.parallel.place_data(host), program


def level_dims(cfg: TrainConfig, dataset: Dataset) -> tuple[int, ...]:
    """Feature width held at each level, seeds first (for the memory model)."""
    return (dataset.num_classes, *([cfg.hidden] * (cfg.layers - 1)), dataset.features.shape[1])


def evaluate(cfg: TrainConfig, program, variables, data, dataset) -> dict:
    """The task's train/val/test metrics under `cfg.eval_mode`."""
    return program.task.evaluate(program, variables, data, dataset, mode=cfg.eval_mode,
                                 batch_size=cfg.eval_batch_size, seed=cfg.seed)


def _variables(state) -> dict:
    out = {"params": state.params}
    if state.batch_stats:
        out["batch_stats"] = state.batch_stats
    return out


class Diverged(FloatingPointError):
    """The training loss became NaN or infinite; nothing of that epoch was saved."""


def _saved(state) -> dict:
    """The part of the train state a checkpoint holds."""
    return {"params": state.params, "batch_stats": state.batch_stats,
            "opt_state": state.opt_state}


def train(cfg: TrainConfig, dataset: Dataset | None = None) -> TrainResult:
    """Trains `cfg.model` on `cfg.dataset`; resumes from `cfg.checkpoint_dir` if it holds one.

    Output paths are checked before anything else. Inside `interrupts.deferred()` (the
    CLI) a SIGINT or SIGTERM stops the run between phases and chunks.

    Raises:
      ValueError: unusable data or output paths; a checkpoint of another run
        (`CheckpointMismatch`) or none readable.
      Diverged: the loss became NaN or infinite.
      interrupts.Interrupted: a signal arrived inside `interrupts.deferred()`.
    """
    lead = jax.process_index() == 0  # one writer when several processes train together
    check_output_paths(cfg.metrics_out if lead else None, cfg.checkpoint_dir)
    dataset, data, program = prepare(cfg, dataset)
    interrupts.check("loading the data")
    ckpt = None
    if cfg.checkpoint_dir:
        from zerognn_jax._src.training.checkpoint import Checkpointer  # orbax takes ~1 s

        ckpt = Checkpointer(cfg.checkpoint_dir)
    try:
        return _train(cfg, dataset, data, program, ckpt, lead)
    except (interrupts.Interrupted, Diverged) as err:
        last = ckpt.latest_epoch() if ckpt is not None else None
        if last is not None:
            err.add_note(f"the checkpoint of epoch {last} in {cfg.checkpoint_dir} is kept")
        raise
    finally:
        if ckpt is not None:
            ckpt.close()


def _train(cfg, dataset, data, program, ckpt, lead) -> TrainResult:
    ident, resumable = None, []
    if ckpt is not None:
        from zerognn_jax._src.training.checkpoint import identity

        ident = identity(cfg, dataset.stats(), program.global_batch)
        resumable = ckpt.find_resumable(ident)  # a checkpoint of another run fails here
    t0 = time.perf_counter()
    env, cal = choose_envelope(data.graph, program.task.train_items(dataset), cfg.batch_size,
                               program.sampler, method=cfg.envelope, seed=cfg.seed,
                               policy=cfg.envelope_policy, kernels=program.kernels)
    calibrate_seconds = time.perf_counter() - t0
    interrupts.check("calibration")
    memory.check_fits(env, program.sampler.slots, level_dims(cfg, dataset),
                      memory.device_memory_limit())
    state = init_state(program, data, env, program.task.train_items(dataset))
    interrupts.check("initialisation", wait_for=state)
    history, start_epoch = [], 0
    resumed = ckpt.restore_first(resumable, ident, _saved(state)) if resumable else None
    if resumed is not None:
        last, restored, meta = resumed
        state = state._replace(**restored)
        saved_env = meta["envelope"]
        if saved_env["batch_size"] == env.batch_size:  # else saved with another device count
            env = Envelope(saved_env["batch_size"], tuple(saved_env["capacities"]))
        history, start_epoch = meta["history"], last + 1
    runner = make_engine(cfg.engine, program, chunk_steps=cfg.chunk_steps,
                         policy=cfg.envelope_policy)
    log = MetricsLog(cfg.metrics_out if lead else None, history if resumed else None)
    bar = tqdm(total=cfg.epochs, initial=start_epoch, desc="epochs", unit="epoch",
               disable=not (cfg.progress and lead), file=sys.stderr, dynamic_ncols=True)
    try:
        for epoch in range(start_epoch, cfg.epochs):
            try:
                record, state, env = _train_epoch(cfg, runner, state, data, dataset, epoch,
                                                  env, bar)
            except Diverged as err:
                log.write(err.record)
                raise
            history.append(record)
            if ckpt is not None:  # the record follows its checkpoint, never precedes it
                ckpt.save(epoch, _saved(state), {
                    "identity": ident, "history": history,
                    "envelope": {"batch_size": env.batch_size,
                                 "capacities": list(env.capacities)}})
            log.write(record)
            interrupts.check(f"epoch {epoch}")
        final = evaluate(cfg, program, _variables(state), data, dataset)
        summary = _summary(cfg, dataset, program, state, env, cal, history, final,
                           calibrate_seconds, runner.compile_seconds, start_epoch)
        log.write(summary)
    finally:
        bar.close()
        log.close()
    return TrainResult(_variables(state), history, summary, program, data)


def _train_epoch(cfg, runner, state, data, dataset, epoch, env, bar):
    program, compile_before = runner.program, runner.compile_seconds
    t0 = time.perf_counter()
    items = program.task.train_items(dataset)
    res = runner.run_epoch(state, data, items, epoch, env, on_progress=lambda done, total:
                           interrupts.check(f"step {done} of epoch {epoch}"))
    wall = time.perf_counter() - t0
    compile_s = runner.compile_seconds - compile_before
    record = {"epoch": epoch, "loss": res.loss, "train_batch_acc": res.train_acc,
              "epoch_seconds": wall - compile_s, "compile_seconds": compile_s,
              "steps": res.steps, "chunks": res.chunks, "overflows": res.overflows,
              "envelope": list(res.envelope.levels), "max_counts": list(res.max_counts),
              "sampled_edges": res.sampled_edges}
    if res.first_nonfinite is not None:
        _diverged(cfg, epoch, res, record)
    last = epoch == cfg.epochs - 1
    if cfg.eval_every and ((epoch + 1) % cfg.eval_every == 0) and not last:
        record.update(evaluate(cfg, program, _variables(res.state), data, dataset))
    record = strict(record)
    bar.update(1)
    val = record.get("val_acc")
    bar.set_postfix(loss=f"{res.loss:.4f}", **({"val": f"{val:.3f}"} if val is not None else {}))
    return record, res.state, res.envelope


def _diverged(cfg, epoch, res, record):
    step = res.first_nonfinite
    err = Diverged(f"training diverged: the loss became NaN or infinite at epoch {epoch}, "
                   f"step {step} (of {res.steps}); nothing of this epoch is saved. Lower lr "
                   f"(now {cfg.lr:g}) or check the features for extreme values")
    err.record = strict({**record, "diverged_at_step": step})
    raise err


def _summary(cfg, dataset, program, state, env, cal, history, final, calibrate_seconds,
             compile_seconds, start_epoch) -> dict:
    """The run's summary record. `epochs` and `median_epoch_seconds` cover every epoch
    trained, resumed runs included; `compile_seconds` and `calibrate_seconds` this
    process only (`start_epoch` > 0: it resumed from a checkpoint); `config` is every
    TrainConfig field of the run (lr, hidden, layers, dropout, seed, ...)."""
    times = [h["epoch_seconds"] for h in history]
    summary = {"summary": True, "dataset": dataset.name, "model": cfg.model,
               "params": count_params(state.params),
               "kernels": program.kernels.describe(), "fanouts": list(program.sampler.fanouts),
               "sampler": program.sampler.method,
               "batch_size": cfg.batch_size, "devices": program.num_shards,
               "processes": jax.process_count(), "global_batch": program.global_batch,
               "shard_features": cfg.shard_features, "epochs": len(history),
               "median_epoch_seconds": float(np.median(times)) if times else None,
               "engine": cfg.engine,
               "start_epoch": start_epoch, "compile_seconds": compile_seconds,
               "calibrate_seconds": calibrate_seconds,
               "overflows": int(sum(h["overflows"] for h in history)),
               "envelope": list(env.levels), "device": jax.devices()[0].device_kind,
               "peak_bytes_in_use": memory.device_peak_bytes(),
               "jax_version": jax.__version__, **final,
               "config": dataclasses.asdict(cfg)}
    if cal is not None:
        report = memory.memory_report(env, cal.max_counts, program.sampler.slots,
                                      level_dims(cfg, dataset))
        summary["envelope_over_ideal"] = report["ratio"]
        summary["calibration_max_counts"] = list(cal.max_counts)
    return strict(summary)
