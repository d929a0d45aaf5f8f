"""The user-facing training loop: config in, trained model and per-epoch records out."""

from __future__ import annotations

import dataclasses
import json
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
from zerognn_jax._src.sampling.minibatch import SamplerConfig
from zerognn_jax._src.training import memory
from zerognn_jax._src.training.config import TrainConfig
from zerognn_jax._src.training.engines import make_engine
from zerognn_jax._src.training.evaluate import evaluate_splits
from zerognn_jax._src.training.parallel import make_mesh
from zerognn_jax._src.training.program import DeviceData, StepProgram, init_state

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
    sampler = SamplerConfig(cfg.fanouts, replace=cfg.replace, dedup=cfg.dedup)
    sampler = sampler.resolve(dataset.graph.max_degree())
    dtype = jnp.dtype(cfg.dtype)
    model = make_model(cfg.model, hidden=cfg.hidden, num_layers=cfg.layers,
                       num_classes=dataset.num_classes, dropout=cfg.dropout,
                       input_dropout=cfg.input_dropout, norm=cfg.norm, heads=cfg.heads,
                       dtype=dtype)
    program = StepProgram(model, make_optimizer(cfg), sampler, cfg.batch_size, cfg.seed,
                          Kernels.parse(cfg.kernels))
    mesh = make_mesh(cfg.devices)
    if mesh.size == 1 and not cfg.shard_features:
        data = DeviceData(dataset.graph.to_device(), jnp.asarray(feats, dtype),
                          jnp.asarray(labels))
        return dataset, data, program
    program = program.with_mesh(mesh, shard_features=cfg.shard_features)
    host = DeviceData(dataset.graph, np.asarray(feats).astype(dtype), labels)
    return dataset, program.parallel.place_data(host), program


def level_dims(cfg: TrainConfig, dataset: Dataset) -> tuple[int, ...]:
    """Feature width held at each level, seeds first (for the memory model)."""
    return (dataset.num_classes, *([cfg.hidden] * (cfg.layers - 1)), dataset.features.shape[1])


def evaluate(cfg: TrainConfig, program, variables, data, dataset) -> dict:
    """Train/val/test accuracy under `cfg.eval_mode`."""
    return evaluate_splits(program, variables, data, dataset, mode=cfg.eval_mode,
                           batch_size=cfg.eval_batch_size, seed=cfg.seed)


def _variables(state) -> dict:
    out = {"params": state.params}
    if state.batch_stats:
        out["batch_stats"] = state.batch_stats
    return out


def _write_json(handle, record: dict) -> None:
    if handle is not None:
        handle.write(json.dumps(record) + "\n")
        handle.flush()


def train(cfg: TrainConfig, dataset: Dataset | None = None) -> TrainResult:
    """Trains `cfg.model` on `cfg.dataset`; resumes from `cfg.checkpoint_dir` if it holds one."""
    dataset, data, program = prepare(cfg, dataset)
    t0 = time.perf_counter()
    env, cal = choose_envelope(data.graph, dataset.train_idx, cfg.batch_size, program.sampler,
                               method=cfg.envelope, seed=cfg.seed,
                               policy=cfg.envelope_policy, kernels=program.kernels)
    calibrate_seconds = time.perf_counter() - t0
    memory.check_fits(env, program.sampler.fanouts, level_dims(cfg, dataset),
                      memory.device_memory_limit())
    state = init_state(program, data, env, dataset.train_idx)
    runner = make_engine(cfg.engine, program, chunk_steps=cfg.chunk_steps,
                         policy=cfg.envelope_policy)
    history, start_epoch, ckpt = [], 0, None
    if cfg.checkpoint_dir:
        from zerognn_jax._src.training.checkpoint import Checkpointer

        ckpt = Checkpointer(cfg.checkpoint_dir)
        last = ckpt.latest_epoch()
        if last is not None:
            like = {"params": state.params, "batch_stats": state.batch_stats,
                    "opt_state": state.opt_state}
            restored, meta = ckpt.restore(last, like)
            state = state._replace(**restored)
            if meta["batch_size"] == env.batch_size:  # else saved with another device count
                env = Envelope(meta["batch_size"], tuple(meta["capacities"]))
            history, start_epoch = meta["history"], last + 1
    lead = jax.process_index() == 0  # one writer when several processes train together
    metrics_file = open(cfg.metrics_out, "a") if cfg.metrics_out and lead else None  # noqa: SIM115
    bar = tqdm(total=cfg.epochs, initial=start_epoch, desc="epochs", unit="epoch",
               disable=not (cfg.progress and lead), file=sys.stderr, dynamic_ncols=True)
    try:
        for epoch in range(start_epoch, cfg.epochs):
            record, state, env = _train_epoch(cfg, runner, state, data, dataset, epoch, env, bar)
            history.append(record)
            _write_json(metrics_file, record)
            if ckpt is not None:
                ckpt.save(epoch, {"params": state.params, "batch_stats": state.batch_stats,
                                  "opt_state": state.opt_state},
                          {"batch_size": env.batch_size, "capacities": list(env.capacities),
                           "history": history})
        final = evaluate(cfg, program, _variables(state), data, dataset)
        summary = _summary(cfg, dataset, program, state, env, cal, history, final,
                           calibrate_seconds)
        _write_json(metrics_file, summary)
    finally:
        bar.close()
        if metrics_file is not None:
            metrics_file.close()
        if ckpt is not None:
            ckpt.close()
    return TrainResult(_variables(state), history, summary, program, data)


def _train_epoch(cfg, runner, state, data, dataset, epoch, env, bar):
    program, compile_before = runner.program, runner.compile_seconds
    t0 = time.perf_counter()
    res = runner.run_epoch(state, data, dataset.train_idx, epoch, env)
    wall = time.perf_counter() - t0
    compile_s = runner.compile_seconds - compile_before
    record = {"epoch": epoch, "loss": res.loss, "train_batch_acc": res.train_acc,
              "epoch_seconds": wall - compile_s, "compile_seconds": compile_s,
              "steps": res.steps, "chunks": res.chunks, "overflows": res.overflows,
              "envelope": list(res.envelope.levels), "max_counts": list(res.max_counts),
              "sampled_edges": res.sampled_edges}
    last = epoch == cfg.epochs - 1
    if cfg.eval_every and ((epoch + 1) % cfg.eval_every == 0) and not last:
        record.update(evaluate(cfg, program, _variables(res.state), data, dataset))
    bar.update(1)
    bar.set_postfix(loss=f"{res.loss:.4f}", **({"val": f"{record['val_acc']:.3f}"}
                                                if "val_acc" in record else {}))
    return record, res.state, res.envelope


def _summary(cfg, dataset, program, state, env, cal, history, final,
             calibrate_seconds) -> dict:
    times = [h["epoch_seconds"] for h in history]
    summary = {"summary": True, "dataset": dataset.name, "model": cfg.model,
               "params": count_params(state.params),
               "kernels": program.kernels.describe(), "fanouts": list(program.sampler.fanouts),
               "batch_size": cfg.batch_size, "devices": program.num_shards,
               "processes": jax.process_count(), "global_batch": program.global_batch,
               "shard_features": cfg.shard_features, "epochs": len(history),
               "median_epoch_seconds": float(np.median(times)) if times else None,
               "engine": cfg.engine,
               "compile_seconds": sum(h["compile_seconds"] for h in history),
               "calibrate_seconds": calibrate_seconds,
               "overflows": int(sum(h["overflows"] for h in history)),
               "envelope": list(env.levels), "device": jax.devices()[0].device_kind,
               "peak_bytes_in_use": memory.device_peak_bytes(),
               "jax_version": jax.__version__, **final}
    if cal is not None:
        report = memory.memory_report(env, cal.max_counts, program.sampler.fanouts,
                                      level_dims(cfg, dataset))
        summary["envelope_over_ideal"] = report["ratio"]
        summary["calibration_max_counts"] = list(cal.max_counts)
    return summary
