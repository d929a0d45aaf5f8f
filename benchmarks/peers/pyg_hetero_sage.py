"""Relational SAGE with PyG: `HeteroData`, `to_hetero(SAGE, aggr="sum")` and the hetero
`NeighborLoader`, on the graph benchmarks/hetero.py writes (`--write-npz`); with
`--model rgat`, MLPerf's R-GAT instead (below).

The same workload as zerognn-jax's `rsage`: a SAGEConv per relation summed per
destination type, 2 layers, fanouts [25, 20] for every edge type, batch 1024 target
nodes, Adam, dropout 0.5 on hidden activations (a `torch.nn.Dropout` module: to_hetero's
fx trace would freeze `F.dropout(training=self.training)` on); featureless types take
learnable `nn.Embedding(sparse=True)` rows of `hidden` width trained by `SparseAdam`
(lazy Adam, as zerognn-jax's row-sparse tables), drawn from N(0, 0.1^2) as zerognn-jax's
are (`--embedding-init torch`: nn.Embedding's N(0, 1)). Sampling runs on the CPU in
loader workers. Test accuracy: the test nodes sampled with the training fanouts, dropout
off (as benchmarks/hetero.py evaluates by default). docs/hetero.md ("The PyG peer")
lists what else matches.

`--model rgat` is zerognn-jax's `rgat` (MLPerf's reference layout): per layer a
`HeteroConv` of one `GATConv((-1, -1), hidden // heads, heads, add_self_loops=False)` per
relation, summed per destination type, every layer `hidden` wide, leaky ReLU (slope
0.01) and dropout between layers, then a `Linear` classifier on the target type's rows;
with `--fanouts 15,10,5 --hidden 512 --heads 4` on igbh-like, MLPerf's configuration.

NeighborLoader needs pyg-lib or torch-sparse (see benchmarks/peers.sh for installing
the torch-sparse wheels); without either, `--sampler torch` samples with
torch_hetero_sampler.py (small CPU checks only).

    python3 benchmarks/peers/pyg_hetero_sage.py --data OUT/mag-like.npz --workers 14
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np
import torch
import torch.nn.functional as F
from torch_geometric.data import HeteroData
from torch_geometric.loader import NeighborLoader
from torch_geometric.nn import GATConv, HeteroConv, SAGEConv, to_hetero


def load(path: str) -> tuple[HeteroData, str]:
    """The neutral .npz (benchmarks/hetero.py) as a HeteroData, and the target type."""
    z = np.load(path)
    data, target = HeteroData(), str(z["target"])
    for t in (str(t) for t in z["types"]):
        data[t].num_nodes = int(z[f"count_{t}"])
        if f"x_{t}" in z:
            data[t].x = torch.from_numpy(z[f"x_{t}"])
    i = 0
    while f"rel_{i}" in z:
        rel = tuple(str(z[f"rel_{i}"]).split("__"))
        data[rel].edge_index = torch.from_numpy(z[f"edge_index_{i}"])
        i += 1
    data[target].y = torch.from_numpy(z["y"])
    for split in ("train", "val", "test"):
        data[target][f"{split}_idx"] = torch.from_numpy(z[split].astype(np.int64))
    return data, target


class SAGE(torch.nn.Module):
    def __init__(self, hidden: int, out: int, layers: int, dropout: float):
        super().__init__()
        self.convs = torch.nn.ModuleList(
            [SAGEConv((-1, -1), hidden if i < layers - 1 else out) for i in range(layers)])
        # a module, not F.dropout(training=self.training): to_hetero traces the forward
        # with torch.fx, which bakes `self.training` in as the constant True, so dropout
        # would stay on in model.eval() (PyG warns about it when it transforms)
        self.dropout = torch.nn.Dropout(dropout)

    def forward(self, x, edge_index):
        for i, conv in enumerate(self.convs):
            x = conv(x, edge_index)
            if i < len(self.convs) - 1:
                x = self.dropout(F.relu(x))
        return x


class RGAT(torch.nn.Module):
    """MLPerf's R-GAT (module docstring): logits of the `target` type's rows."""

    def __init__(self, edge_types, target: str, hidden: int, out: int, layers: int,
                 heads: int, dropout: float):
        super().__init__()
        self.target = target
        self.convs = torch.nn.ModuleList(
            [HeteroConv({et: GATConv((-1, -1), hidden // heads, heads=heads,
                                     add_self_loops=False) for et in edge_types},
                        aggr="sum") for _ in range(layers)])
        self.dropout = torch.nn.Dropout(dropout)
        self.linear = torch.nn.Linear(hidden, out)

    def forward(self, x, edge_index):
        for i, conv in enumerate(self.convs):
            x = conv(x, edge_index)
            if i < len(self.convs) - 1:
                x = {t: self.dropout(F.leaky_relu(v, 0.01)) for t, v in x.items()}
        return {self.target: self.linear(x[self.target])}


class Model(torch.nn.Module):
    """Embeddings of the featureless types, then `to_hetero(SAGE)` or `RGAT`."""

    def __init__(self, data: HeteroData, target: str, args, out: int,
                 embedding_init: str = "zerognn"):
        super().__init__()
        hidden, layers = args.hidden, len(args.fanouts.split(","))
        self.embed = torch.nn.ModuleDict(
            {t: torch.nn.Embedding(data[t].num_nodes, hidden, sparse=True)
             for t in data.node_types if "x" not in data[t]})
        if embedding_init == "zerognn":  # N(0, 0.1^2), as zerognn-jax's tables
            for table in self.embed.values():
                torch.nn.init.normal_(table.weight, std=0.1)
        if args.model == "rgat":
            self.gnn = RGAT(data.edge_types, target, hidden, out, layers, args.heads,
                            args.dropout)
        else:
            self.gnn = to_hetero(SAGE(hidden, out, layers, args.dropout), data.metadata(),
                                 aggr="sum")

    def forward(self, batch: HeteroData):
        x = {t: self.embed[t](batch[t].n_id) if t in self.embed else batch[t].x
             for t in batch.node_types}
        return self.gnn(x, batch.edge_index_dict)


def loader(data, target, idx, args, shuffle):
    workers = max(0, args.workers)
    fanouts = {et: [int(f) for f in args.fanouts.split(",")] for et in data.edge_types}
    sampler = None
    if args.sampler == "torch":
        from torch_hetero_sampler import TorchHeteroSampler
        sampler = TorchHeteroSampler(data, fanouts, seed=args.seed)
    return NeighborLoader(data, num_neighbors=fanouts, input_nodes=(target, idx),
                          batch_size=args.batch_size, shuffle=shuffle, num_workers=workers,
                          persistent_workers=workers > 0, pin_memory=torch.cuda.is_available(),
                          neighbor_sampler=sampler)


@torch.no_grad()
def test_accuracy(model, data, target, args, device) -> float:
    model.eval()
    correct = total = 0
    for batch in loader(data, target, data[target].test_idx, args, False):
        batch = batch.to(device, non_blocking=True)
        b = batch[target].batch_size
        pred = model(batch)[target][:b].argmax(-1)
        correct += int((pred == batch[target].y[:b]).sum())
        total += b
    return correct / max(total, 1)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data", required=True)
    p.add_argument("--model", default="sage", choices=("sage", "rgat"))
    p.add_argument("--heads", type=int, default=4, help="attention heads (rgat)")
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--fanouts", default="25,20")
    p.add_argument("--batch-size", type=int, default=1024)
    p.add_argument("--epochs", type=int, default=5)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--dropout", type=float, default=0.5)
    p.add_argument("--workers", type=int, default=14)
    p.add_argument("--embedding-init", default="zerognn", choices=("zerognn", "torch"),
                   help="featureless types' rows: N(0, 0.1^2) as zerognn-jax's tables "
                        "(default), or torch nn.Embedding's N(0, 1)")
    p.add_argument("--sampler", default="pyg", choices=("pyg", "torch"),
                   help="pyg: NeighborSampler (pyg-lib or torch-sparse); torch: the same "
                        "sampling in PyTorch ops (torch_hetero_sampler.py), CPU checks")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    torch.manual_seed(args.seed)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    data, target = load(args.data)
    for t in data.node_types:
        data[t].n_id = torch.arange(data[t].num_nodes)
    classes = int(data[target].y.max()) + 1
    if args.model == "rgat" and (args.heads < 1 or args.hidden % args.heads):
        p.error(f"--heads {args.heads} must divide --hidden {args.hidden}")
    model = Model(data, target, args, classes, args.embedding_init).to(device)
    train = loader(data, target, data[target].train_idx, args, True)
    with torch.no_grad():  # materialises the lazy (-1) input widths
        model(next(iter(train)).to(device))
    tables = list(model.embed.parameters())
    dense = [w for w in model.parameters() if all(w is not t for t in tables)]
    opts = [torch.optim.Adam(dense, lr=args.lr)]
    if tables:
        opts.append(torch.optim.SparseAdam(tables, lr=args.lr))
    times = []
    for epoch in range(args.epochs):
        model.train()
        t0 = time.perf_counter()
        loss_sum, seeds = torch.zeros((), device=device), 0
        for batch in train:
            batch = batch.to(device, non_blocking=True)
            b = batch[target].batch_size
            for opt in opts:
                opt.zero_grad()
            loss = F.cross_entropy(model(batch)[target][:b], batch[target].y[:b])
            loss.backward()
            for opt in opts:
                opt.step()
            loss_sum += loss.detach() * b
            seeds += b
        if device.type == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
        # the epoch's mean loss over its seeds, as zerognn-jax's epoch records give it
        print(json.dumps({"epoch": epoch, "epoch_seconds": times[-1],
                          "loss": float(loss_sum) / max(seeds, 1)}), flush=True)
    acc = test_accuracy(model, data, target, args, device)
    print("| system | epoch (median) | test acc |\n|---|---|---|")
    name = "HeteroConv(GATConv) R-GAT" if args.model == "rgat" else "to_hetero(SAGE)"
    print(f"| PyG {name} + NeighborLoader ({args.workers} workers) | "
          f"{float(np.median(times)):.2f} s | {100 * acc:.2f} % |")
    print(json.dumps({"summary": True, "median_epoch_seconds": float(np.median(times)),
                      "test_acc": acc, "epochs": times}))


if __name__ == "__main__":
    main()
