"""Typed link prediction with PyG: `HeteroData`, `to_hetero(SAGE, aggr="sum")` and the
hetero `LinkNeighborLoader`, on the graph benchmarks/hetero.py writes (`--write-npz`).

The peer of zerognn-jax's `TrainConfig(task="link", link_relation=R)` with `rsage` on a
typed dataset: predict the pairs of one relation R (mag-like's author `writes` paper by
default).

The split is zerognn-jax's own: the .npz's graph goes through `typed_link_split(graph,
R, seed=--seed)` (JAX kept on the CPU), so both sides train on the same pairs, hold out
the same val/test pairs (removed from R and from its reverse `rev_<name>` in the graph
that message passing reads) and score the same fixed negatives. The split depends only
on the set of distinct pairs and the seed.

The model is pyg_hetero_sage.py's `Model` (a SAGEConv per relation summed per
destination type, ReLU and dropout 0.5 between layers, as many layers as `--fanouts`
has hops), its last layer `--hidden` wide with no classifier; featureless types take
`hidden`-wide `nn.Embedding(sparse=True)` rows drawn from N(0, 0.1^2), trained by
`SparseAdam`, the rest by `Adam`. The decoder is the dot product of a pair's two
embeddings; the loss binary cross-entropy with logits, one negative per positive (equal
weights, as zerognn-jax's 1/K with K = 1).

Training: a shuffled `LinkNeighborLoader` over the training pairs, `--batch-size`
positives a step, `--fanouts` neighbours per hop for every edge type, sampled on the CPU
in `--workers` loader processes. Negatives (`--negative-mode`):
  destination (default): `NegativeSampling("triplet", amount=1)`: per positive (u, v),
    u kept and a destination drawn uniformly from the dst type's nodes. zerognn-jax's
    "destination" mode, except that PyG may draw v itself (probability 1 / N_dst) where
    zerognn-jax never does; neither side checks for other true pairs of u.
  pairs: `NegativeSampling("binary", amount=1)`: both ends drawn uniformly from their
    types (PyG's "binary" corrupts both ends, not the destination alone);
    zerognn-jax's "pairs" mode.

Seed edges: LinkNeighborLoader does not hide the supervision pairs from message
passing. PyG documents that the edges of `edge_label_index` are not masked out during
sampling, so a step's positive pairs, which are edges of R and of its reverse in the
graph, can be sampled as neighbours of their own ends; `disjoint=True` does not change
that (it only gives each seed its own subgraph); PyG's recipe is to split the
supervision edges off beforehand (`RandomLinkSplit(disjoint_train_ratio=...)`), a
different protocol. As zerognn-jax masks the step's positive pairs out of R and its
reverse in every sampled block (tasks/typed_link.py), the training step here drops
every sampled edge of R and of its reverse whose two ends are a positive pair of the
batch (either direction where both ends are one type) before the encoder reads the
batch, as pyg_link.py, the homogeneous peer, does; `--keep-positives` runs the loader's
batches as PyG ships them.

Timing: per epoch the training loop only, closed by `torch.cuda.synchronize()`; with
`--max-steps N` only the first N steps run and the epoch time is extrapolated from them
(`"extrapolated": true`). After the last epoch, val and test AUC and AP (zerognn-jax's
`roc_auc` and `average_precision`) of the split's fixed positives against its
negatives. The embeddings come from sampled inference at the training fanouts (a
`LinkNeighborLoader` over the pairs, no negative sampling, dropout off); zerognn-jax
evaluates with every node's exact embedding (all neighbours), so the figures compare
approximately.

Needs pyg-lib or torch-sparse (see benchmarks/peers.sh). Records are JSON lines on
stdout (and appended to `--out`): one per epoch, then a summary.

    python3 benchmarks/peers/pyg_hetero_link.py --data OUT/mag-like.npz \
        --link-relation writes --workers 14
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import time

import numpy as np
import torch
import torch.nn.functional as F
from pyg_hetero_sage import Model  # this folder: run as `python3 benchmarks/peers/...`
from torch_geometric.data import HeteroData
from torch_geometric.loader import LinkNeighborLoader
from torch_geometric.sampler import NegativeSampling

# --negative-mode (zerognn-jax's negative_mode names) -> PyG's negative sampling mode
NEGATIVE_SAMPLING = {"destination": "triplet", "pairs": "binary"}


def zerognn():
    """(zerognn_jax, its hetero_links module), imported with JAX on the CPU unless
    JAX_PLATFORMS says otherwise: the split and the metrics are NumPy work, and the
    GPU's memory stays PyTorch's. JAX reads the variable when it is first imported, so
    every use of zerognn_jax here comes through this function."""
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    import zerognn_jax
    from zerognn_jax._src.data import hetero_links

    return zerognn_jax, hetero_links


def read_npz(path: str) -> tuple[dict, dict, dict]:
    """({type: count}, {relation: int64[2, E] (sources, destinations)}, {type: float32[n,
    d]} of the featured types) of benchmarks/hetero.py's .npz."""
    with np.load(path, allow_pickle=False) as z:
        types = [str(t) for t in z["types"]]
        counts = {t: int(z[f"count_{t}"]) for t in types}
        features = {t: z[f"x_{t}"] for t in types if f"x_{t}" in z.files}
        edges = {tuple(str(z[f"rel_{i}"]).split("__")): z[f"edge_index_{i}"]
                 for i in range(sum(k.startswith("rel_") for k in z.files))}
    return counts, edges, features


def typed_split(args):
    """(zerognn-jax's TypedLinkSplit of `--link-relation` on the .npz's graph, as its
    trainer makes it for seed `--seed`; the featured types' features)."""
    zg, links = zerognn()
    counts, edges, features = read_npz(args.data)
    graph = zg.hetero_graph(counts, edges)
    relation = links.find_relation(graph, args.link_relation)
    return zg.typed_link_split(graph, relation, seed=args.seed), features


def hetero_data(graph, features: dict) -> HeteroData:
    """A zerognn-jax HeteroGraph (the split's message-passing graph) as PyG's HeteroData:
    `num_nodes` on every type, `x` on the featured ones, per relation `edge_index`
    int64[2, E] (sources, destinations)."""
    _, links = zerognn()
    data = HeteroData()
    for t, n in graph.node_counts:
        data[t].num_nodes = int(n)
        if t in features:
            data[t].x = torch.from_numpy(features[t])
    for rel, g in graph.items():
        data[rel].edge_index = as_index(links.relation_pairs(g))
    return data


def as_index(pairs: np.ndarray) -> torch.Tensor:
    """int[P, 2] (src id, dst id) rows -> int64[2, P], PyG's edge_index layout."""
    return torch.from_numpy(np.ascontiguousarray(pairs.T, np.int64))


def link_loader(data, relation, pairs, args, *, shuffle, neg_sampling=None, labels=None):
    """A LinkNeighborLoader over `pairs` (int64[2, P]) of `relation`, `--fanouts` per hop
    for every edge type, `--batch-size` pairs a batch; the training loader's workers
    persist across epochs."""
    workers = max(0, args.workers)
    fanouts = [int(f) for f in args.fanouts.split(",")]
    return LinkNeighborLoader(
        data, num_neighbors={et: fanouts for et in data.edge_types},
        edge_label_index=(relation, pairs), edge_label=labels, neg_sampling=neg_sampling,
        batch_size=args.batch_size, shuffle=shuffle, num_workers=workers,
        persistent_workers=workers > 0 and shuffle, pin_memory=args.device == "cuda")


def batch_pairs(batch: HeteroData, relation) -> tuple[torch.Tensor, torch.Tensor]:
    """(int64[2, P] each pair's positions among the batch's src-type and dst-type nodes,
    float32[P] labels 1 and 0). "binary" and unsampled batches carry them as
    `edge_label_index` and `edge_label` on the relation; "triplet" ones (amount 1) as
    `src_index` int64[B] on the src type, `dst_pos_index` and `dst_neg_index` int64[B]
    on the dst type, made here into the B positives, then the B negatives."""
    src_t, _, dst_t = relation
    if "edge_label_index" in batch[relation]:
        return batch[relation].edge_label_index, batch[relation].edge_label
    src = batch[src_t].src_index
    index = torch.stack([torch.cat([src, src]), torch.cat([batch[dst_t].dst_pos_index,
                                                           batch[dst_t].dst_neg_index])])
    labels = torch.cat([torch.ones(src.numel(), device=src.device),
                        torch.zeros(src.numel(), device=src.device)])
    return index, labels


def hide_positives(batch: HeteroData, relation, reverse, index, labels) -> None:
    """Drops, in place, every edge of `relation` and of its `reverse` (None: none) in
    `batch` whose ends are one of the batch's positive pairs (`index` columns of label
    1, positions among the src-type and dst-type nodes)."""
    src_t, _, dst_t = relation
    width = batch[dst_t].num_nodes if src_t != dst_t else max(batch[src_t].num_nodes, 1)
    pos = index[:, labels == 1]

    def keys(u, v):
        if src_t == dst_t:  # one type: a pair joins its ends in either direction
            u, v = torch.minimum(u, v), torch.maximum(u, v)
        return u * width + v

    known = keys(pos[0], pos[1])
    for rel, flip in ((relation, False), (reverse, True)):
        if rel is None or rel not in batch.edge_types:
            continue
        edges = batch[rel].edge_index
        u, v = (edges[1], edges[0]) if flip else (edges[0], edges[1])
        batch[rel].edge_index = edges[:, ~torch.isin(keys(u, v), known)]


def pair_scores(h: dict, relation, index: torch.Tensor) -> torch.Tensor:
    """float32[P]: the dot product of each pair's src and dst embeddings."""
    return (h[relation[0]][index[0]] * h[relation[2]][index[1]]).sum(-1)


def optimizers(model: Model, lr: float) -> list:
    """Adam for the dense weights, SparseAdam for the featureless types' tables."""
    tables = list(model.embed.parameters())
    dense = [w for w in model.parameters() if all(w is not t for t in tables)]
    opts = [torch.optim.Adam(dense, lr=lr)]
    if tables:
        opts.append(torch.optim.SparseAdam(tables, lr=lr))
    return opts


def train_epoch(model, opts, loader, relation, reverse, args, device) -> dict:
    """One pass over `loader` (its first `--max-steps` batches when > 0), timed; the
    epoch's record, its time extrapolated to the whole epoch from a partial pass. Each
    batch's positive pairs are hidden from its message passing (`hide_positives`,
    unless `--keep-positives`)."""
    model.train()
    steps = min(args.max_steps, len(loader)) if args.max_steps > 0 else len(loader)
    loss_sum, pairs = torch.zeros((), device=device), 0
    t0 = time.perf_counter()
    for batch in itertools.islice(loader, steps):
        batch = batch.to(device, non_blocking=True)
        index, labels = batch_pairs(batch, relation)
        if not args.keep_positives:
            hide_positives(batch, relation, reverse, index, labels)
        for opt in opts:
            opt.zero_grad()
        loss = F.binary_cross_entropy_with_logits(pair_scores(model(batch), relation, index),
                                                  labels)
        loss.backward()
        for opt in opts:
            opt.step()
        loss_sum += loss.detach() * labels.numel()
        pairs += labels.numel()
    if device.type == "cuda":
        torch.cuda.synchronize()
    seconds = time.perf_counter() - t0
    return {"epoch_seconds": seconds * len(loader) / steps, "loss": float(loss_sum) / pairs,
            "steps": steps, "positives_per_second": pairs / 2 / seconds,  # 1 negative each
            "extrapolated": steps < len(loader)}


@torch.no_grad()
def split_metrics(model, data, relation, edges, args, device) -> dict:
    """{"auc", "ap"} of one split's fixed positives (edges.pos) against its negatives
    (edges.neg), scored from sampled inference at the training fanouts, dropout off."""
    if not edges.pos.shape[0]:
        return {}
    model.eval()
    labels = torch.cat([torch.ones(len(edges.pos)), torch.zeros(len(edges.neg))])
    loader = link_loader(data, relation, as_index(np.concatenate([edges.pos, edges.neg])),
                         args, shuffle=False, labels=labels)
    scores, seen = [], []
    for batch in loader:
        batch = batch.to(device, non_blocking=True)
        index, label = batch_pairs(batch, relation)
        scores.append(pair_scores(model(batch), relation, index).cpu())
        seen.append(label.cpu())
    scores, seen = torch.cat(scores).numpy(), torch.cat(seen).numpy()
    zg, _ = zerognn()
    pos, neg = scores[seen == 1], scores[seen == 0]
    return {"auc": zg.roc_auc(pos, neg), "ap": zg.average_precision(pos, neg)}


def emit(record: dict, path: str | None) -> None:
    """Prints `record` as one JSON line and appends it to `path` when given."""
    line = json.dumps(record)
    print(line, flush=True)
    if path:
        with open(path, "a") as handle:
            handle.write(line + "\n")


def summary(args, split, records: list[dict], metrics: dict, extra: dict) -> dict:
    """The run's final record: medians over the epochs, the metrics, the settings."""
    times = [r["epoch_seconds"] for r in records]
    return {"summary": True, "system": "pyg", "task": "typed-link",
            "relation": "__".join(split.relation),
            "epoch_seconds": float(np.median(times)),
            "positives_per_second": float(np.median([r["positives_per_second"]
                                                     for r in records])),
            **metrics, "epochs": times, "extrapolated": any(r["extrapolated"] for r in records),
            "train_positives": int(split.train.shape[0]), "negative_mode": args.negative_mode,
            "eval": "sampled", "positives_hidden": not args.keep_positives,
            "fanouts": args.fanouts, "batch_size": args.batch_size,
            "hidden": args.hidden, "lr": args.lr, "dropout": args.dropout,
            "workers": args.workers, "seed": args.seed, "device": args.device, **extra}


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data", required=True, help="benchmarks/hetero.py's --write-npz file")
    p.add_argument("--link-relation", default="writes",
                   help="the relation to predict: src__name__dst, or a unique name")
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--fanouts", default="10,5", help="neighbours per hop (one layer each)")
    p.add_argument("--batch-size", type=int, default=1024, help="positive pairs a step")
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--max-steps", type=int, default=0,
                   help="time only the first N steps of each epoch and extrapolate (0: all)")
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--dropout", type=float, default=0.5)
    p.add_argument("--negative-mode", default="destination", choices=tuple(NEGATIVE_SAMPLING))
    p.add_argument("--keep-positives", action="store_true",
                   help="let message passing read the batch's own positive pairs (PyG's "
                        "loader as shipped)")
    p.add_argument("--embedding-init", default="zerognn", choices=("zerognn", "torch"),
                   help="featureless types' rows: N(0, 0.1^2) (zerognn-jax's) or N(0, 1)")
    p.add_argument("--workers", type=int, default=14)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    p.add_argument("--out", default=None, help="append the JSON lines here")
    p.set_defaults(model="sage")  # pyg_hetero_sage.Model's to_hetero(SAGE)
    return p.parse_args(argv)


def main(argv=None) -> None:
    args = parse_args(argv)
    torch.manual_seed(args.seed)
    device = torch.device(args.device)
    t0 = time.perf_counter()
    split, features = typed_split(args)
    data, relation = hetero_data(split.graph, features), split.relation
    _, links = zerognn()
    reverse = links.reverse_of(split.graph, relation)
    model = Model(data, None, args, args.hidden, args.embedding_init).to(device)
    negatives = NegativeSampling(NEGATIVE_SAMPLING[args.negative_mode], amount=1)
    train = link_loader(data, relation, as_index(split.train), args, shuffle=True,
                        neg_sampling=negatives)
    with torch.no_grad():  # materialises the lazy (-1) input widths
        model(next(iter(train)).to(device))
    opts = optimizers(model, args.lr)
    extra = {"setup_seconds": time.perf_counter() - t0, "steps_per_epoch": len(train)}
    records = []
    for epoch in range(args.epochs):
        records.append({"epoch": epoch, **train_epoch(model, opts, train, relation, reverse,
                                                      args, device)})
        emit(records[-1], args.out)
    t1 = time.perf_counter()
    metrics = {f"{name}_{k}": v for name in ("val", "test")
               for k, v in split_metrics(model, data, relation, getattr(split, name), args,
                                         device).items()}
    extra["eval_seconds"] = time.perf_counter() - t1
    emit(summary(args, split, records, metrics, extra), args.out)


if __name__ == "__main__":
    main()
