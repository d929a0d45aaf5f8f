"""What the PyTorch link-prediction peers share: flags, the timed steps, the metrics.

A products-like epoch has ~51k steps of 1024 positives, so a peer trains a fixed number
of steps (`--steps`) from its initial parameters and reports the time per step, the
positive edges per second and the epoch extrapolated from them, then every node's
embedding by exact layer-wise inference and the split's metrics (link_data.py's file):
AUC and AP of the test positives against their fixed negative pairs, and MRR with
Hits@1/3/10 where the split has negative destinations per positive. The metric
functions are zerognn-jax's own (tasks/link_metrics.py), so both sides rank alike.
"""

from __future__ import annotations

import math
import time

import common
import numpy as np

from zerognn_jax._src.training.tasks.link_metrics import average_precision, mrr_metrics, roc_auc

SCORE_CHUNK = 1 << 18


def parser(description: str):
    """The peers' flags: the node peers' (common.base_parser), `--data` a link split,
    `--steps` instead of epochs, and the negatives."""
    p = common.base_parser(description)
    p.set_defaults(epochs=1)
    p.add_argument("--steps", type=int, default=300, help="training steps, all timed "
                   "but the warm, sync-counting and profiled ones")
    p.add_argument("--negatives", type=int, default=1, help="negatives per positive")
    return p


def drain_timed(step, batches, device, args) -> dict:
    """Runs args.steps steps of `step` over the iterator `batches`.

    The first args.warm_steps are untimed, the next ones count host syncs
    (args.sync_steps) and are profiled (args.profile_steps); the rest are timed, the
    window opened and closed by a device sync. Every one is a training step.
    """
    done = [0]

    def run(k):
        ran = common.drain(step, batches, min(k, args.steps - done[0]))
        done[0] += ran
        return ran

    run(args.warm_steps)
    measures = {"syncs_per_step": common.count_syncs(run, args.sync_steps, device)}
    measures.update(common.profile_steps(run, args.profile_steps, device))
    untimed = done[0]
    common.device_sync(device)
    start = time.perf_counter()
    run(args.steps)
    common.device_sync(device)
    seconds = time.perf_counter() - start
    timed = done[0] - untimed
    per_step = seconds / timed if timed else None
    measures.update({"steps": done[0], "timed_steps": timed, "timed_seconds": seconds,
                     "ms_per_step": None if per_step is None else 1e3 * per_step,
                     "positive_edges_per_second": None if not seconds
                     else timed * args.batch / seconds})
    return measures


def train_on(loss, opt, losses) -> None:
    """One optimiser step on `loss`, which is kept in `losses` (a common.LossLog)."""
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
    losses.add(loss)


def loss_ends(losses: list[float], window: int = 20) -> dict:
    """Mean training loss of the first and of the last `window` steps."""
    losses = np.asarray(losses, np.float64)
    return {"loss_first": float(losses[:window].mean()) if losses.size else None,
            "loss_last": float(losses[-window:].mean()) if losses.size else None}


def positive_keys(pairs, num_nodes: int):
    """int64[P] sorted: each pair {u, v} as min * num_nodes + max (torch)."""
    import torch
    lo, hi = torch.minimum(pairs[:, 0], pairs[:, 1]), torch.maximum(pairs[:, 0], pairs[:, 1])
    return torch.sort(lo * num_nodes + hi).values


def is_pair(a, b, keys, num_nodes: int):
    """bool[...]: whether {a, b} is one of the pairs `keys` (positive_keys)."""
    import torch
    lo, hi = torch.minimum(a, b), torch.maximum(a, b)
    return torch.isin(lo * num_nodes + hi, keys)


def pair_loss(pos_scores, neg_scores):
    """Binary cross-entropy with logits: positives (label 1, weight 1) and negatives
    (label 0, weight 1/K each, K per positive), over the total weight, as zerognn-jax's
    link task weighs them. pos_scores: float[B]; neg_scores: float[B, K]."""
    import torch.nn.functional as F
    k = neg_scores.shape[1]
    pos = F.binary_cross_entropy_with_logits(pos_scores, pos_scores.new_ones(()).expand_as(
        pos_scores), reduction="sum")
    neg = F.binary_cross_entropy_with_logits(neg_scores, neg_scores.new_zeros(()).expand_as(
        neg_scores), reduction="sum")
    return (pos + neg / k) / (2 * pos_scores.shape[0])


def score_pairs(h, pairs: np.ndarray) -> np.ndarray:
    """float32[P]: dot products <h_u, h_v> of the pairs int[P, 2]; h float[N, d] (torch)."""
    import torch
    out = []
    for start in range(0, pairs.shape[0], SCORE_CHUNK):
        chunk = torch.from_numpy(pairs[start:start + SCORE_CHUNK]).to(h.device)
        out.append((h[chunk[:, 0]].float() * h[chunk[:, 1]].float()).sum(1).cpu())
    return torch.cat(out).numpy() if out else np.zeros(0, np.float32)


def link_metrics(h, data) -> dict:
    """{val,test}_{auc,ap} and, where the split has neg_dst, {val,test}_{mrr,hits@K}."""
    out = {}
    for split, edges in data.evals.items():
        if not edges["pos"].shape[0]:
            continue
        pos = score_pairs(h, edges["pos"])
        neg = score_pairs(h, edges["neg"])
        out[f"{split}_auc"] = roc_auc(pos, neg)
        out[f"{split}_ap"] = average_precision(pos, neg)
        m = edges["neg_dst"].shape[1]
        if m:
            src = np.repeat(edges["pos"][:, 0], m)
            ranked = score_pairs(h, np.stack([src, edges["neg_dst"].reshape(-1)], 1))
            out.update({f"{split}_{k}": v for k, v in
                        mrr_metrics(pos, ranked.reshape(-1, m)).items()})
    return out


def summary(system: str, args, data, measures: dict, losses: list[float], device,
            extra: dict) -> dict:
    """The run's JSON record: the link fields, then the workload and the environment."""
    epoch_steps = math.ceil(data.train.shape[0] / args.batch)
    per_step = measures.get("ms_per_step")
    record = {
        "summary": True, "task": "link", "system": system, "dataset": data.name,
        "split_seed": data.seed, "train_edges": int(data.train.shape[0]),
        "negatives": args.negatives, "epoch_steps": epoch_steps,
        "epoch_seconds": None if per_step is None else per_step * 1e-3 * epoch_steps,
        "extrapolated": True, **measures, **loss_ends(losses),
        "fanouts": common.parse_fanouts(args.fanouts, args.layers), "batch": args.batch,
        "hidden": args.hidden, "layers": args.layers, "lr": args.lr,
        "dropout": args.dropout, "seed": args.seed, "workers": args.workers,
        "matmul_precision": args.matmul_precision,
    }
    record.update(extra)
    record.update(common.environment(device))
    return record
