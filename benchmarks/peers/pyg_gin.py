"""The PyG baseline on the same molecules (molhiv-like or molpcba-like):
`torch_geometric.loader.DataLoader` batching on the host, OGB's gin-virtual for molecules
(bond-aware GIN convolutions, virtual node, batch norm, dropout 0.5, mean pooling),
5 layers x 300, Adam lr 1e-3, on CUDA if present.

    python benchmarks/peers/pyg_gin.py --data molhiv-like.npz [--epochs 5] [--batch-size 32]
                                       [--workers 0]

`--data` is a graph collection written by `zerognn data generate molhiv-like --out F.npz`
(or molpcba-like; read here with NumPy alone: meta, node_offsets, edge_offsets, senders,
receivers, node_features, edge_features, targets, train_idx, test_idx); the model has one
output per target column. One JSON line: graphs per second (training graphs over the
median epoch time after the first), test ROC-AUC and AP (OGB's definitions, means over
the tasks; zerognn-jax's metric functions) after the last epoch.
"""

from __future__ import annotations

import argparse
import json

import common
import numpy as np
import torch
from torch import nn
from torch_geometric.data import Data
from torch_geometric.loader import DataLoader
from torch_geometric.nn import MessagePassing, global_add_pool, global_mean_pool

ATOM, BOND = (119, 5, 12, 12, 10, 6, 6, 2, 2), (5, 6, 2)


class Encoder(nn.Module):
    def __init__(self, vocab, dim):
        super().__init__()
        self.embs = nn.ModuleList(nn.Embedding(v, dim) for v in vocab)
        for e in self.embs:
            nn.init.xavier_uniform_(e.weight)

    def forward(self, x):
        return sum(e(x[:, k]) for k, e in enumerate(self.embs))


class GINConv(MessagePassing):
    def __init__(self, dim):
        super().__init__(aggr="add")
        self.mlp = nn.Sequential(nn.Linear(dim, 2 * dim), nn.BatchNorm1d(2 * dim), nn.ReLU(),
                                 nn.Linear(2 * dim, dim))
        self.eps = nn.Parameter(torch.zeros(1))
        self.bond = Encoder(BOND, dim)

    def forward(self, x, edge_index, edge_attr):
        out = self.propagate(edge_index, x=x, edge_attr=self.bond(edge_attr))
        return self.mlp((1 + self.eps) * x + out)

    def message(self, x_j, edge_attr):
        return torch.relu(x_j + edge_attr)


class GINVirtual(nn.Module):
    def __init__(self, dim=300, layers=5, tasks=1, dropout=0.5):
        super().__init__()
        self.layers, self.dropout = layers, dropout
        self.atom = Encoder(ATOM, dim)
        self.vn = nn.Embedding(1, dim)
        nn.init.constant_(self.vn.weight, 0)
        self.convs = nn.ModuleList(GINConv(dim) for _ in range(layers))
        self.norms = nn.ModuleList(nn.BatchNorm1d(dim) for _ in range(layers))
        self.vn_mlps = nn.ModuleList(nn.Sequential(
            nn.Linear(dim, 2 * dim), nn.BatchNorm1d(2 * dim), nn.ReLU(),
            nn.Linear(2 * dim, dim), nn.BatchNorm1d(dim), nn.ReLU()) for _ in range(layers - 1))
        self.head = nn.Linear(dim, tasks)

    def forward(self, b):
        drop = lambda h: nn.functional.dropout(h, self.dropout, self.training)
        vn = self.vn(torch.zeros(int(b.batch.max()) + 1, dtype=torch.long, device=b.x.device))
        h = self.atom(b.x)
        for i in range(self.layers):
            h = h + vn[b.batch]
            h_in = h
            h = self.norms[i](self.convs[i](h, b.edge_index, b.edge_attr))
            h = drop(h if i == self.layers - 1 else torch.relu(h))
            if i < self.layers - 1:
                vn = drop(self.vn_mlps[i](global_add_pool(h_in, b.batch) + vn))
        return self.head(global_mean_pool(h, b.batch))


def load(path):
    a = dict(np.load(path, allow_pickle=False))
    out = []
    for g in range(a["node_offsets"].size - 1):
        n0, n1 = a["node_offsets"][g:g + 2]
        e0, e1 = a["edge_offsets"][g:g + 2]
        ei = np.stack([a["senders"][e0:e1], a["receivers"][e0:e1]]).astype(np.int64)
        out.append(Data(x=torch.from_numpy(a["node_features"][n0:n1].astype(np.int64)),
                        edge_index=torch.from_numpy(ei),
                        edge_attr=torch.from_numpy(a["edge_features"][e0:e1].astype(np.int64)),
                        y=torch.from_numpy(a["targets"][g:g + 1])))
    name = json.loads(str(a["meta"]))["name"]
    return out, a["train_idx"], a["test_idx"], a["targets"].shape[1], name


def metrics(scores, targets) -> dict:
    from zerognn_jax._src.training.tasks.graph_metrics import graph_metrics

    return graph_metrics(scores, targets, "binary")


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data", required=True)
    p.add_argument("--epochs", type=int, default=5)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--workers", type=int, default=0)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    torch.manual_seed(args.seed)
    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    graphs, train, test, tasks, name = load(args.data)
    loader = DataLoader([graphs[i] for i in train], batch_size=args.batch_size, shuffle=True,
                        num_workers=args.workers)
    model = GINVirtual(tasks=tasks).to(dev)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    clock = common.EpochClock(dev)
    for _ in range(args.epochs):
        model.train()
        with clock.epoch():
            for b in loader:
                b = b.to(dev)
                out = model(b)
                known = ~torch.isnan(b.y)
                loss = nn.functional.binary_cross_entropy_with_logits(out[known], b.y[known])
                opt.zero_grad()
                loss.backward()
                opt.step()
    model.eval()
    scores, ys = [], []
    with torch.no_grad():
        for b in DataLoader([graphs[i] for i in test], batch_size=256):
            scores.append(model(b.to(dev)).cpu().numpy())
            ys.append(b.y.cpu().numpy())  # PyG moves the batch in place
    return common.graph_result("pyg", args, len(train), clock.times,
                               metrics(np.concatenate(scores), np.concatenate(ys)),
                               {"dataset": name, "device": str(dev),
                                "torch": torch.__version__})


if __name__ == "__main__":
    main()
