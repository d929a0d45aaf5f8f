"""Shared pieces of the PyTorch peer baselines: data, results, timing and GPU measures.

torch is imported where it is used, so the JAX peers (zerognn_link.py, jraph_gin.py)
write their results through here too.

The dataset is the neutral file that `zerognn data generate ... --out F.npz` writes
(NumPy `.npz`, read with `allow_pickle=False`):

  format_version  int64[]       1
  name            str[]
  num_classes     int64[]
  indptr          int32[N + 1]  (int64 past 2**31 - 1 edges)
  indices         int32[E]      row v lists the neighbours v aggregates from; an
                                undirected graph is stored both ways
  weights         float32[E]    optional
  features        float32[N, d]
  labels          int32[N]      -1 for unlabelled nodes
  train_idx, val_idx, test_idx  int32[*]

Every measure degrades to None off CUDA. Definitions follow docs/benchmarks.md's:
epoch time is the median over the epochs after the first (warm-up); the GPU execution
fraction is the union of device busy intervals (kernels, copies, memsets) over the
wall time of a window that starts and ends with a device sync.
"""

from __future__ import annotations

import contextlib
import gzip
import json
import os
import platform
import statistics
import tempfile
import time
import warnings
from collections.abc import Callable
from typing import NamedTuple

import numpy as np

from zerognn_jax._src.bench.profiling import union_length

FORMAT_VERSION = 1
REQUIRED_KEYS = ("format_version", "name", "num_classes", "indptr", "indices", "features",
                 "labels", "train_idx", "val_idx", "test_idx")
DEVICE_EVENT_CATEGORIES = ("kernel", "gpu_memcpy", "gpu_memset")


class GraphData(NamedTuple):
    """A node-classification dataset as NumPy arrays.

    indptr: int64[N + 1], CSR offsets. indices: int32 or int64[E], row v's slice lists
    the sources of v's in-edges. features: float32[N, d]. labels: int64[N], -1 where
    unlabelled. train_idx, val_idx, test_idx: int64[*]. weights: float32[E] or None.
    """

    name: str
    num_classes: int
    indptr: np.ndarray
    indices: np.ndarray
    features: np.ndarray
    labels: np.ndarray
    train_idx: np.ndarray
    val_idx: np.ndarray
    test_idx: np.ndarray
    weights: np.ndarray | None = None

    @property
    def num_nodes(self) -> int:
        return self.indptr.shape[0] - 1

    @property
    def num_edges(self) -> int:
        return self.indices.shape[0]


def row_normalize(features: np.ndarray) -> np.ndarray:
    """float32[N, d] -> float32[N, d]: each row over its sum, all-zero rows kept (as
    zerognn-jax's trainer treats the Planetoid datasets' bag-of-words features)."""
    features = np.asarray(features, np.float32)
    sums = features.sum(axis=1, keepdims=True)
    return features / np.where(sums == 0, 1, sums)


def load_npz(path: str | os.PathLike, normalize: bool = False) -> GraphData:
    """Reads a dataset file, row-normalising its features if `normalize`; ValueError
    names the file and what is wrong with it."""
    with np.load(path, allow_pickle=False) as npz:
        missing = [k for k in REQUIRED_KEYS if k not in npz.files]
        if missing:
            raise ValueError(f"{path}: missing key(s) {', '.join(missing)}")
        arrays = {k: npz[k] for k in npz.files}
    version = int(arrays["format_version"])
    if version != FORMAT_VERSION:
        raise ValueError(f"{path}: format_version {version}, expected {FORMAT_VERSION}")
    indptr = arrays["indptr"].astype(np.int64)
    n = indptr.shape[0] - 1
    if arrays["features"].shape[0] != n or arrays["labels"].shape[0] != n:
        raise ValueError(f"{path}: {n} nodes in indptr, features {arrays['features'].shape}, "
                         f"labels {arrays['labels'].shape}")
    if int(indptr[-1]) != arrays["indices"].shape[0]:
        raise ValueError(f"{path}: indptr ends at {int(indptr[-1])}, "
                         f"{arrays['indices'].shape[0]} indices")
    features = arrays["features"]
    if normalize:
        features = row_normalize(features)
    return GraphData(
        name=str(arrays["name"]), num_classes=int(arrays["num_classes"]), indptr=indptr,
        indices=arrays["indices"], features=np.ascontiguousarray(features, np.float32),
        labels=arrays["labels"].astype(np.int64),
        train_idx=arrays["train_idx"].astype(np.int64),
        val_idx=arrays["val_idx"].astype(np.int64),
        test_idx=arrays["test_idx"].astype(np.int64), weights=arrays.get("weights"))


def _jsonable(value):
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, np.ndarray):
        return value.tolist()
    return str(value)


class LossLog:
    """Per-step training losses kept on the device, averaged once per epoch (one host read)."""

    def __init__(self):
        self._losses = []

    def add(self, loss) -> None:
        self._losses.append(loss.detach())

    def epoch_mean(self) -> float:
        import torch

        value = float(torch.stack(self._losses).mean()) if self._losses else float("nan")
        self._losses = []
        return value

    def values(self) -> list[float]:
        """Every step's loss since the last epoch_mean, in order (one host read)."""
        import torch

        return torch.stack(self._losses).cpu().tolist() if self._losses else []


class JsonLines:
    """Prints each record as one JSON line and appends it to `path` (flushed at once)."""

    def __init__(self, path: str | os.PathLike | None):
        self.path = path

    def write(self, record: dict) -> None:
        line = json.dumps(record, default=_jsonable)
        print(line, flush=True)
        if self.path:
            with open(self.path, "a") as handle:
                handle.write(line + "\n")


def is_cuda(device) -> bool:
    return getattr(device, "type", str(device)) == "cuda"


def device_sync(device) -> None:
    if is_cuda(device):
        import torch
        torch.cuda.synchronize(device)


class EpochClock:
    """Wall time of epochs, each ended by a device sync; `times` holds seconds."""

    def __init__(self, device):
        self.device = device
        self.times: list[float] = []

    @contextlib.contextmanager
    def epoch(self):
        device_sync(self.device)
        start = time.perf_counter()
        yield
        device_sync(self.device)
        self.times.append(time.perf_counter() - start)

    def median(self, warmup: int = 1) -> float | None:
        """Median over the epochs after `warmup` (all epochs if there are no others)."""
        kept = self.times[warmup:] or self.times
        return statistics.median(kept) if kept else None


def reset_peak(device) -> None:
    if is_cuda(device):
        import torch
        torch.cuda.reset_peak_memory_stats(device)


def peak_bytes(device) -> int | None:
    """Most bytes the caching allocator had handed out since the last reset_peak."""
    if not is_cuda(device):
        return None
    import torch
    return int(torch.cuda.max_memory_allocated(device))


def device_events(trace_path: str) -> list[dict]:
    """The device-side events (kernels, copies, memsets) of a Chrome-format trace."""
    opener = gzip.open if trace_path.endswith(".gz") else open
    with opener(trace_path, "rt") as handle:
        events = json.load(handle)["traceEvents"]
    return [e for e in events
            if e.get("ph") == "X" and e.get("cat") in DEVICE_EVENT_CATEGORIES]


def profile_steps(run_steps: Callable[[int], int], steps: int, device) -> dict:
    """GPU execution fraction and launches per step over `steps` training steps.

    `run_steps(k)` runs up to k steps and returns how many it ran. The window starts
    and ends with a device sync, so all its device work lies inside. Only CUDA
    activity is recorded (CUPTI), to keep the profiler's host overhead small.
    Returns {"gpu_fraction", "launches_per_step", "copies_per_step",
    "profiled_steps"}, all None off CUDA or when no step ran.
    """
    empty = {"gpu_fraction": None, "launches_per_step": None, "copies_per_step": None,
             "profiled_steps": 0}
    if not is_cuda(device) or steps <= 0:
        return empty
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        device_sync(device)
        start = time.perf_counter()
        ran = run_steps(steps)
        device_sync(device)
        wall = time.perf_counter() - start
    if ran == 0:
        return empty
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "trace.json")
        prof.export_chrome_trace(path)
        events = device_events(path)
    busy_us = union_length((float(e["ts"]), float(e["ts"]) + float(e["dur"])) for e in events)
    kernels = sum(e["cat"] == "kernel" for e in events)
    return {"gpu_fraction": min(1.0, busy_us * 1e-6 / wall),
            "launches_per_step": kernels / ran,
            "copies_per_step": (len(events) - kernels) / ran, "profiled_steps": ran}


def count_syncs(run_steps: Callable[[int], int], steps: int, device) -> float | None:
    """Host syncs per step: the warnings of `torch.cuda.set_sync_debug_mode("warn")`.

    Every synchronizing CUDA call (`.item()`, `nonzero`, `unique`, a blocking copy)
    raises one warning; they are recorded, not shown. None off CUDA.
    """
    if not is_cuda(device) or steps <= 0:
        return None
    import torch
    device_sync(device)
    before = torch.cuda.get_sync_debug_mode()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            ran = run_steps(steps)
        finally:
            torch.cuda.set_sync_debug_mode(before)
    device_sync(device)
    syncs = sum("synchroniz" in str(w.message) for w in caught)
    return syncs / ran if ran else None


def environment(device) -> dict:
    """Device name and library versions for a summary line."""
    import torch
    info = {"device": str(device), "device_name": platform.processor() or "cpu",
            "torch_version": torch.__version__, "cuda_version": torch.version.cuda}
    if is_cuda(device):
        info["device_name"] = torch.cuda.get_device_name(device)
    try:
        import torch_geometric
        info["pyg_version"] = torch_geometric.__version__
    except ImportError:
        info["pyg_version"] = None
    return info


def split_accuracy(logits_argmax: np.ndarray, data: GraphData) -> dict:
    """{"train_acc", "val_acc", "test_acc"} of predicted classes int[N] on each split."""
    out = {}
    for split in ("train", "val", "test"):
        idx = getattr(data, f"{split}_idx")
        out[f"{split}_acc"] = (float((logits_argmax[idx] == data.labels[idx]).mean())
                               if idx.size else None)
    return out


def check_hop(indptr: np.ndarray, indices: np.ndarray, dst: np.ndarray, src: np.ndarray,
              nodes: np.ndarray, fanout: int) -> list[str]:
    """Problems of one sampled hop, as messages (empty when it obeys the fanout).

    nodes: int[n] global ids of the hop's destination nodes. dst, src: int[m] global
    ids of the sampled edges (src is a neighbour that dst aggregates from). Each node
    must get exactly min(degree, fanout) distinct in-edges (all when degree <= fanout,
    fanout -1 meaning all), every one of them an edge of the graph.
    """
    indptr = np.asarray(indptr, np.int64)
    n_all = indptr.shape[0] - 1
    deg = indptr[nodes + 1] - indptr[nodes]
    want = deg if fanout < 0 else np.minimum(deg, fanout)
    order = np.argsort(nodes)
    inside = np.isin(dst, nodes)
    got = np.empty(nodes.shape[0], np.int64)
    got[order] = np.bincount(np.searchsorted(nodes[order], dst[inside]),
                             minlength=nodes.shape[0])
    problems = []
    if not inside.all():
        problems.append("an edge ends at a node outside the hop")
    if (got != want).any():
        bad = int(np.flatnonzero(got != want)[0])
        problems.append(f"node {int(nodes[bad])}: {int(got[bad])} neighbours sampled, "
                        f"expected min(degree {int(deg[bad])}, fanout {fanout})")
    keys = dst.astype(np.int64) * n_all + src.astype(np.int64)
    if np.unique(keys).shape[0] != keys.shape[0]:
        problems.append("a neighbour is sampled twice for one node")
    rows = np.repeat(np.arange(n_all, dtype=np.int64), np.diff(indptr))
    real = rows * n_all + np.asarray(indices, np.int64)
    if not np.isin(keys, real).all():
        problems.append("a sampled pair is not an edge of the graph")
    return problems


def drain(step: Callable, batches, limit: float) -> int:
    """Runs `step(batch)` on up to `limit` batches of the iterator; returns how many."""
    ran = 0
    while ran < limit:
        batch = next(batches, None)
        if batch is None:
            break
        step(batch)
        ran += 1
    return ran


def run_epoch(step: Callable, batches, device, args=None) -> dict:
    """One pass of `step` over `batches`; with `args`, measures inside the pass.

    The measured epoch (the untimed warm-up one) runs args.warm_steps steps, then counts
    host syncs over args.sync_steps steps and profiles args.profile_steps steps, then
    finishes the epoch: every measured step is a real training step, so the model sees
    exactly the same updates as without measuring.
    """
    batches = iter(batches)
    done = [0]

    def run(k):
        ran = drain(step, batches, k)
        done[0] += ran
        return ran

    measures = {}
    if args is not None:
        run(args.warm_steps)
        measures["syncs_per_step"] = count_syncs(run, args.sync_steps, device)
        measures.update(profile_steps(run, args.profile_steps, device))
    run(float("inf"))
    measures["steps"] = done[0]
    return measures


def base_parser(description: str):
    """The flags every peer baseline takes (the products-like workload by default)."""
    import argparse
    p = argparse.ArgumentParser(description=description,
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--data", required=True, help="dataset .npz (zerognn data generate)")
    p.add_argument("--epochs", type=int, default=5)
    p.add_argument("--workers", type=int, default=0, help="loader worker processes")
    p.add_argument("--out", default=None, help="append JSON lines here")
    p.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    p.add_argument("--fanouts", default="15,10,5", help="neighbours per hop, seeds' hop first")
    p.add_argument("--batch", type=int, default=1024)
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--layers", type=int, default=3)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--weight-decay", type=float, default=0.0,
                   help="L2 penalty added to the gradient (Adam's weight_decay)")
    p.add_argument("--dropout", type=float, default=0.5)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--normalize-features", action="store_true",
                   help="row-normalise the features, as zerognn-jax does for Planetoid")
    p.add_argument("--matmul-precision", default="high", choices=("highest", "high"),
                   help="float32 matmuls: high allows TF32, as XLA's default on GPUs does")
    p.add_argument("--warm-steps", type=int, default=10, help="steps before measuring")
    p.add_argument("--sync-steps", type=int, default=5, help="steps to count syncs over")
    p.add_argument("--profile-steps", type=int, default=20, help="steps to profile")
    p.add_argument("--check", action="store_true",
                   help="check that a few sampled subgraphs obey the fanouts, then exit")
    return p


def parse_fanouts(text: str, layers: int) -> list[int]:
    fanouts = [int(f) for f in text.split(",") if f.strip()]
    if len(fanouts) != layers:
        raise SystemExit(f"{len(fanouts)} fanouts ({text}) for {layers} layers")
    return fanouts


def start_run(args) -> tuple:
    """The run's torch device (`--device`), with float32 matmuls at
    `--matmul-precision`, and the JsonLines its records go to (stdout and `--out`)."""
    import torch
    torch.set_float32_matmul_precision(args.matmul_precision)
    return torch.device(args.device), JsonLines(args.out)


def check_result(out: JsonLines, system: str, problems: list[str]) -> int:
    """Writes the record of a `--check` run (the first ten problems); the exit status,
    1 when the check found problems."""
    out.write({"system": system, "check": "fanouts", "ok": not problems,
               "problems": problems[:10]})
    return 1 if problems else 0


def train_epochs(trainer, epoch_batches: Callable, args, device, out: JsonLines,
                 system: str) -> tuple[EpochClock, list[float], dict, int | None]:
    """Trains args.epochs epochs of `trainer.step` over the batches `epoch_batches()`
    returns (called inside each epoch's timing), writing a record per epoch.

    The first epoch also measures (run_epoch with `args`). Returns the clock, the
    epochs' mean losses (`trainer.epoch_loss()`), the first epoch's measures and the
    peak bytes allocated over the epochs (None off CUDA).
    """
    clock, losses, first = EpochClock(device), [], {}
    reset_peak(device)
    for epoch in range(args.epochs):
        with clock.epoch():
            measures = run_epoch(trainer.step, epoch_batches(), device,
                                 args if epoch == 0 else None)
        losses.append(trainer.epoch_loss())
        first = first or measures
        out.write({"system": system, "epoch": epoch, "epoch_seconds": clock.times[-1],
                   "loss": losses[-1], **measures})
    return clock, losses, first, peak_bytes(device)


def summary(system: str, args, clock: EpochClock, first: dict, losses: list[float],
            device, extra: dict) -> dict:
    """The final JSON record of a run (the fields table.py reads, and context)."""
    record = {
        "summary": True, "system": system, "epochs": len(clock.times),
        "epoch_seconds": clock.median(), "epoch_seconds_runs": clock.times,
        "gpu_fraction": first.get("gpu_fraction"),
        "syncs_per_step": first.get("syncs_per_step"),
        "launches_per_step": first.get("launches_per_step"),
        "copies_per_step": first.get("copies_per_step"),
        "steps_per_epoch": first.get("steps"), "loss": losses,
        "fanouts": parse_fanouts(args.fanouts, args.layers), "batch": args.batch,
        "hidden": args.hidden, "layers": args.layers, "lr": args.lr,
        "weight_decay": args.weight_decay, "dropout": args.dropout, "seed": args.seed,
        "normalize_features": args.normalize_features,
        "workers": args.workers, "matmul_precision": args.matmul_precision,
    }
    record.update(extra)
    record.update(environment(device))
    return record


def graph_result(system: str, args, train_graphs: int, times: list[float],
                 metrics: dict, extra: dict) -> dict:
    """The one JSON line (printed) of a graph-classification peer (pyg_gin.py,
    jraph_gin.py): training graphs per second over the median epoch after the first,
    the test ROC-AUC and AP (`metrics`: graph_metrics' "rocauc" and "ap"), then
    `extra`."""
    epoch_s = statistics.median(times[1:] or times)
    row = {"system": system, "batch_size": args.batch_size,
           "graphs_per_s": train_graphs / epoch_s, "epoch_s": epoch_s,
           "test_rocauc": metrics["rocauc"], "test_ap": metrics["ap"],
           "epochs": args.epochs, **extra}
    JsonLines(None).write(row)
    return row
