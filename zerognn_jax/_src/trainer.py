"""The user-facing training loop: config in, trained model and per-epoch records out."""

from __future__ import annotations

import dataclasses
import json
import math
import sys
import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from tqdm.auto import tqdm

from zerognn_jax._src import engine, host_engine, parallel
from zerognn_jax._src import envelope as envelope_lib
from zerognn_jax._src import evaluate as evaluate_lib
from zerognn_jax._src.dataset import Dataset
from zerognn_jax._src.datasets import load_dataset, row_normalize
from zerognn_jax._src.kernels import Kernels
from zerognn_jax._src.models import count_params, make_model
from zerognn_jax._src.sampler import SamplerConfig

PLANETOID = ("cora", "citeseer", "pubmed")
DTYPES = ("float32", "bfloat16")


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    """Everything `train` needs; the CLI flags map one to one onto these fields.

    `fanouts` lists the seeds' hop first; -1 means all neighbours. `eval_mode` is
    "full" (exact layer-wise), "sampled" (the training fanouts) or "none".
    `normalize_features=None` row-normalises Planetoid features and leaves others.
    `envelope` is "calibrate" (tight, measured) or "conservative" (the safe bound).
    `chunk_steps=0` compiles a whole epoch into one program.
    `dtype` is the model's computation dtype and the feature table's on the device:
    "float32", or "bfloat16" (half the bytes; sums and gradients accumulate in float32).
    `engine` is "scan" (a chunk of steps per program) or the host-mediated baseline,
    "host-exact" or "host-bucketed" (see host_engine.py).
    `devices` is the number of devices per process to train on (0 = all local ones);
    `batch_size` is per device, so a step trains on batch_size x devices x processes
    seeds. `shard_features` splits the feature table by rows across those devices.
    """

    dataset: str = "tiny"
    root: str | None = None
    scale: float = 1.0
    model: str = "sage"
    hidden: int = 256
    layers: int = 3
    fanouts: tuple[int, ...] = (15, 10, 5)
    batch_size: int = 1024
    lr: float = 3e-3
    weight_decay: float = 0.0
    dropout: float = 0.5
    input_dropout: float = 0.0
    norm: str = "none"
    heads: int = 4
    dtype: str = "float32"
    epochs: int = 10
    seed: int = 0
    kernels: str = "auto"
    replace: bool = False
    dedup: bool = True
    chunk_steps: int = 0
    engine: str = "scan"
    envelope: str = "calibrate"
    margin: float = 1.1
    multiple: int = 128
    eval_mode: str = "full"
    eval_every: int = 1
    eval_batch_size: int = 4096
    normalize_features: bool | None = None
    checkpoint_dir: str | None = None
    metrics_out: str | None = None
    progress: bool = True
    devices: int = 1
    shard_features: bool = False

    def __post_init__(self):
        object.__setattr__(self, "fanouts", tuple(int(f) for f in self.fanouts))
        checks = [
            (self.layers >= 1, f"layers must be >= 1, got {self.layers}"),
            (len(self.fanouts) == self.layers,
             f"need one fanout per layer: {self.layers} layers but fanouts {self.fanouts}"),
            (self.batch_size >= 1, f"batch_size must be >= 1, got {self.batch_size}"),
            (self.epochs >= 0, f"epochs must be >= 0, got {self.epochs}"),
            (self.lr > 0 and math.isfinite(self.lr), f"lr must be positive, got {self.lr}"),
            (0.0 <= self.dropout < 1.0, f"dropout must be in [0, 1), got {self.dropout}"),
            (0.0 <= self.input_dropout < 1.0,
             f"input_dropout must be in [0, 1), got {self.input_dropout}"),
            (self.hidden >= 1, f"hidden must be >= 1, got {self.hidden}"),
            (self.dtype in DTYPES, f"dtype must be one of {DTYPES}, got {self.dtype!r}"),
            (self.eval_mode in ("full", "sampled", "none"),
             f"eval_mode must be full, sampled or none, got {self.eval_mode!r}"),
            (self.envelope in ("calibrate", "conservative"),
             f"envelope must be calibrate or conservative, got {self.envelope!r}"),
            (self.chunk_steps >= 0, f"chunk_steps must be >= 0, got {self.chunk_steps}"),
            (self.engine in host_engine.ENGINES,
             f"engine must be one of {host_engine.ENGINES}, got {self.engine!r}"),
            (self.devices >= 0, f"devices must be >= 0 (0 = all local devices), "
                                f"got {self.devices}"),
            (self.engine == "scan" or (self.devices == 1 and not self.shard_features),
             f"the host-mediated engine {self.engine!r} runs on one device without split "
             f"features; got devices={self.devices}, shard_features={self.shard_features}"),
        ]
        for ok, message in checks:
            if not ok:
                raise ValueError(message)


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
                       input_dropout=cfg.input_dropout, norm=cfg.norm,
                       heads=cfg.heads, dtype=dtype)
    program = engine.StepProgram(model, make_optimizer(cfg), sampler, cfg.batch_size, cfg.seed,
                                 Kernels.parse(cfg.kernels))
    mesh = parallel.make_mesh(cfg.devices)
    if mesh.size == 1 and not cfg.shard_features:
        data = engine.DeviceData(dataset.graph.to_device(), jnp.asarray(feats, dtype),
                                 jnp.asarray(labels))
        return dataset, data, program
    program = parallel.data_parallel(program, mesh, shard_features=cfg.shard_features)
    host = engine.DeviceData(dataset.graph, np.asarray(feats).astype(dtype), labels)
    return dataset, parallel.place_data(host, program), program


def choose_envelope(cfg: TrainConfig, dataset: Dataset, data, program) -> tuple:
    """The starting envelope (and the calibration record, if calibrated)."""
    fanouts = program.sampler.fanouts
    if not cfg.dedup:
        from zerognn_jax._src.sampler import tree_sizes

        sizes = tree_sizes(cfg.batch_size, fanouts)
        return envelope_lib.Envelope(cfg.batch_size, sizes[1:]), None
    if cfg.envelope == "conservative":
        return envelope_lib.conservative(cfg.batch_size, fanouts, dataset.num_nodes,
                                         cfg.multiple), None
    cal = envelope_lib.calibrate(data.graph, dataset.train_idx, cfg.batch_size, program.sampler,
                                 seed=cfg.seed, margin=cfg.margin, multiple=cfg.multiple,
                                 kernels=program.kernels)
    return cal.envelope, cal


def level_dims(cfg: TrainConfig, dataset: Dataset) -> tuple[int, ...]:
    """Feature width held at each level, seeds first (for the memory model)."""
    return (dataset.num_classes, *([cfg.hidden] * (cfg.layers - 1)), dataset.features.shape[1])


def evaluate(cfg: TrainConfig, program, variables, data, dataset) -> dict:
    """Train/val/test accuracy under `cfg.eval_mode`."""
    splits = {s: getattr(dataset, f"{s}_idx") for s in ("train", "val", "test")}
    program = parallel.eval_view(program)
    if cfg.eval_mode == "none":
        return {}
    if cfg.eval_mode == "full" and evaluate_lib.supports_layerwise(program.model):
        logits = evaluate_lib.layerwise_logits(program, variables, data)
        return {f"{s}_acc": evaluate_lib.accuracy(logits, dataset.labels, idx)
                for s, idx in splits.items()}
    result = {}
    for split, idx in splits.items():
        logits = evaluate_lib.sampled_logits(program, variables, data, idx,
                                             batch_size=cfg.eval_batch_size, seed=cfg.seed)
        result[f"{split}_acc"] = evaluate_lib.accuracy(logits, dataset.labels[idx],
                                                       np.arange(len(idx)))
    return result


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
    env, cal = choose_envelope(cfg, dataset, data, program)
    calibrate_seconds = time.perf_counter() - t0
    dims = level_dims(cfg, dataset)
    envelope_lib.check_fits(env, program.sampler.fanouts, dims,
                            envelope_lib.device_memory_limit())
    state = engine.init_state(program, data, env, dataset.train_idx)
    runner = host_engine.make_runner(cfg.engine, program, chunk_steps=cfg.chunk_steps)
    history, start_epoch, ckpt = [], 0, None
    if cfg.checkpoint_dir:
        from zerognn_jax._src.checkpoint import Checkpointer

        ckpt = Checkpointer(cfg.checkpoint_dir)
        last = ckpt.latest_epoch()
        if last is not None:
            like = {"params": state.params, "batch_stats": state.batch_stats,
                    "opt_state": state.opt_state}
            restored, meta = ckpt.restore(last, like)
            state = state._replace(**restored)
            if meta["batch_size"] == env.batch_size:  # else saved with another device count
                env = envelope_lib.Envelope(meta["batch_size"], tuple(meta["capacities"]))
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
    res = runner.run_epoch(state, data, dataset.train_idx, epoch, env, margin=cfg.margin,
                           multiple=cfg.multiple)
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
               "shard_features": program.shard_features, "epochs": len(history),
               "median_epoch_seconds": float(np.median(times)) if times else None,
               "engine": cfg.engine,
               "compile_seconds": sum(h["compile_seconds"] for h in history),
               "calibrate_seconds": calibrate_seconds,
               "overflows": int(sum(h["overflows"] for h in history)),
               "envelope": list(env.levels), "device": jax.devices()[0].device_kind,
               "peak_bytes_in_use": envelope_lib.device_peak_bytes(),
               "jax_version": jax.__version__, **final}
    if cal is not None:
        report = envelope_lib.memory_report(env, cal.max_counts, program.sampler.fanouts,
                                            level_dims(cfg, dataset))
        summary["envelope_over_ideal"] = report["ratio"]
        summary["calibration_max_counts"] = list(cal.max_counts)
    return summary
