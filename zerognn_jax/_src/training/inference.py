"""`restore`: a trained checkpoint back as variables, train state and step program.

    result = restore("runs/ck", cfg, dataset, model=my_model)   # or best=True
    logits = sampled_logits(result.program, result.variables, result.data, nodes,
                            batch_size=1024)

The checkpoint must be of the same run: its identity (training/checkpoint.py) is
compared with the one `cfg`, the dataset and the user's model, optimizer and loss give,
and the arrays' shapes with the model's. Without `cfg`, the options recorded in the
checkpoint are used (and the dataset is loaded by its recorded name, unless given).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from zerognn_jax._src.sampling.calibrate import choose_envelope
from zerognn_jax._src.sampling.envelope import Envelope
from zerognn_jax._src.training.config import TrainConfig
from zerognn_jax._src.training.program import init_state, saved_envelope
from zerognn_jax._src.training.tasks.base import BatchedTask
from zerognn_jax._src.training.trainer import TrainResult, _saved, _variables, prepare
from zerognn_jax._src.training.user import user_identity


def config_of(ident: dict) -> TrainConfig:
    """The TrainConfig a checkpoint's identity records, on one device (the global batch
    as the batch; the options that do not shape the trained values take their defaults;
    no progress bar)."""
    names = {f.name for f in dataclasses.fields(TrainConfig)}
    values = {k: v for k, v in ident.items() if k in names}
    if "global_batch" in ident:
        values["batch_size"] = ident["global_batch"]
    return TrainConfig(**values, dataset=ident.get("dataset.name", "tiny"), progress=False)


def restore(checkpoint_dir: str, cfg: TrainConfig | None = None, dataset=None, *,
            model=None, optimizer=None, loss=None, best: bool = False,
            epoch: int | None = None) -> TrainResult:
    """The state saved in `checkpoint_dir`, ready for inference or to train on.

    Args:
      checkpoint_dir: a run's `cfg.checkpoint_dir`.
      cfg: the run's config (default: the one the checkpoint records).
      dataset: the run's dataset (default: loaded by `cfg.dataset`).
      model, optimizer, loss: the ones the run was trained with, if not built in.
      best: the best-validation checkpoint (`cfg.best_metric`) instead of the latest.
      epoch: that epoch's checkpoint instead of the latest.

    Returns:
      a `TrainResult`: `variables` (for `model.apply`, `sampled_logits`,
      `layerwise_logits`, or `train(..., variables=)` to fine-tune), `state` (with the
      optimizer state), `history`, `program`, `data`, `dataset`, and a `summary` of the
      checkpoint ({"checkpoint", "epoch", "best"} and the last record's metrics).

    Raises:
      FileNotFoundError: no checkpoint there.
      CheckpointMismatch: the checkpoint is of another run or model.
    """
    from zerognn_jax._src.training.checkpoint import BEST, Checkpointer, identity

    directory = Path(checkpoint_dir) / BEST if best else Path(checkpoint_dir)
    if not directory.is_dir():
        raise FileNotFoundError(f"no checkpoint folder {directory}"
                                + (" (was best_metric set?)" if best else ""))
    ckpt = Checkpointer(str(directory), create=False)
    try:
        epochs = sorted(ckpt.all_epochs(), reverse=True) if epoch is None else [epoch]
        if not epochs or epochs[0] not in ckpt.all_epochs():
            raise FileNotFoundError(f"no checkpoint {'' if epoch is None else epoch} in "
                                    f"{directory} (it holds {sorted(ckpt.all_epochs())})")
        meta = ckpt.read_meta(epochs[0])
        cfg = cfg or config_of(meta.get("identity", {}))
        dataset, data, program = prepare(cfg, dataset, model=model, optimizer=optimizer,
                                         loss=loss)
        ident = identity(cfg, dataset.stats(), program.global_batch,
                         user_identity(model, optimizer, None if loss is None else program.task,
                                       dataset))
        pick = _batched_envelope if isinstance(program.task, BatchedTask) else _envelope
        env = pick(cfg, meta, data, dataset, program)
        state = init_state(program, data, env, program.task.train_items(dataset))
        last, restored, meta = ckpt.restore_first(epochs, ident, _saved(state))
    finally:
        ckpt.close()
    state = state._replace(**restored)
    history = meta.get("history", [])
    summary = {"checkpoint": str(directory), "epoch": last, "best": meta.get("best"),
               **{k: v for k, v in (history[-1] if history else {}).items()
                  if k.startswith(("train_", "val_", "test_", "loss"))}}
    return TrainResult(_variables(state), history, summary, program, data, state, dataset)


def _envelope(cfg, meta, data, dataset, program) -> Envelope:
    """The checkpoint's envelope if it fits this batch, else the conservative one (the
    first batch only gives the variables' shapes: no calibration needed)."""
    env, _ = choose_envelope(data.graph, program.task.train_items(dataset), cfg.batch_size,
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
    if saved.get("batch_size") == cfg.batch_size:
        return saved_envelope(program, saved)
    conservative = dataclasses.replace(cfg, envelope="conservative")
    return program.task.choose_envelope(program, data, dataset, conservative)[0]
