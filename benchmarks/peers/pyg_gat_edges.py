"""GAT with edge features (`GATConv(edge_dim)`) and PyG's `NeighborLoader`, on a
multi-label graph with an edge-feature table (proteins-like), as PyG users train it.

The loader samples on the CPU and slices each subgraph's `edge_attr` rows; the model is
two `GATConv` layers (heads 4 concatenated, then one head) reading the edge features in
their attention, ReLU between, `BCEWithLogitsLoss` on the seeds. Test ROC-AUC (OGB's
metric: the mean over targets with both classes) comes from exact layer-wise inference
with a one-hop, all-neighbour loader, the edge rows sliced by the loader as in training.

    PYTHONPATH=. python3 benchmarks/peers/pyg_gat_edges.py --data proteins.npz \
        --fanouts 15,10 --layers 2 --hidden 128 --epochs 3 --workers 14

The `.npz` is zerognn-jax's own (`save_npz`: indptr, indices, features, targets,
edge_features, splits), e.g. written by benchmarks/edge_features.py --npz-out.
"""

from __future__ import annotations

import sys
import time

import common
import numpy as np
import torch
from torch_geometric.data import Data
from torch_geometric.loader import NeighborLoader
from torch_geometric.nn import GATConv


def load(path: str) -> tuple[Data, dict]:
    """(PyG Data with x, edge_index sorted by target, edge_attr, y float[N, T]; splits)."""
    with np.load(path, allow_pickle=False) as npz:
        a = {k: npz[k] for k in npz.files}
    if "edge_features" not in a or "targets" not in a:
        raise SystemExit(f"{path}: needs edge_features and targets (a multi-label graph)")
    indptr = a["indptr"].astype(np.int64)
    n = indptr.shape[0] - 1
    target = torch.repeat_interleave(torch.arange(n), torch.from_numpy(np.diff(indptr)))
    edge_index = torch.stack([torch.from_numpy(a["indices"].astype(np.int64)), target])
    data = Data(x=torch.from_numpy(a["features"].astype(np.float32)), edge_index=edge_index,
                edge_attr=torch.from_numpy(a["edge_features"].astype(np.float32)),
                y=torch.from_numpy(a["targets"].astype(np.float32)), num_nodes=n)
    splits = {s: torch.from_numpy(a[f"{s}_idx"].astype(np.int64)) for s in ("train", "val",
                                                                           "test")}
    return data, splits


class GAT(torch.nn.Module):
    def __init__(self, d_in: int, hidden: int, out: int, layers: int, heads: int,
                 edge_dim: int):
        super().__init__()
        dims = [d_in] + [hidden] * (layers - 1)
        self.convs = torch.nn.ModuleList(
            [GATConv(dims[i], hidden // heads, heads=heads, edge_dim=edge_dim)
             for i in range(layers - 1)] + [GATConv(dims[-1], out, heads=1, edge_dim=edge_dim)])

    def layer(self, i: int, x, edge_index, edge_attr):
        h = self.convs[i](x, edge_index, edge_attr)
        return h if i == len(self.convs) - 1 else torch.relu(h)

    def forward(self, x, edge_index, edge_attr):
        for i in range(len(self.convs)):
            x = self.layer(i, x, edge_index, edge_attr)
        return x


def roc_auc(scores: np.ndarray, targets: np.ndarray) -> float | None:
    """Mean over target columns with both classes of the ROC-AUC (ties count half)."""
    aucs = []
    for j in range(targets.shape[1]):
        pos, neg = scores[targets[:, j] > 0.5, j], np.sort(scores[targets[:, j] <= 0.5, j])
        if pos.size and neg.size:
            below = np.searchsorted(neg, pos, side="left")
            ties = np.searchsorted(neg, pos, side="right") - below
            aucs.append(float(np.mean((below + 0.5 * ties) / neg.size)))
    return float(np.mean(aucs)) if aucs else None


@torch.no_grad()
def layerwise_scores(model: GAT, data: Data, args, device) -> np.ndarray:
    """Exact outputs of every node, one layer over all nodes at a time."""
    model.eval()
    loader = NeighborLoader(data, num_neighbors=[-1], batch_size=args.infer_batch,
                            shuffle=False, num_workers=args.workers,
                            persistent_workers=False, is_sorted=True)
    h = data.x.to(device)
    for i in range(len(model.convs)):
        rows = []
        for batch in loader:
            out = model.layer(i, h[batch.n_id.to(device)], batch.edge_index.to(device),
                              batch.edge_attr.to(device))
            rows.append(out[:batch.batch_size])
        h = torch.cat(rows)
    return h.float().cpu().numpy()


def main(argv=None) -> int:
    p = common.base_parser(__doc__.splitlines()[0])
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--infer-batch", type=int, default=4096)
    p.add_argument("--system", default="pyg-gat-edge-dim")
    args = p.parse_args(argv)
    device, out = common.start_run(args)
    torch.manual_seed(args.seed)
    fanouts = common.parse_fanouts(args.fanouts, args.layers)
    data, splits = load(args.data)
    workers = max(0, args.workers)
    loader = NeighborLoader(data, num_neighbors=fanouts, input_nodes=splits["train"],
                            batch_size=args.batch, shuffle=True, num_workers=workers,
                            persistent_workers=workers > 0, pin_memory=device.type == "cuda",
                            is_sorted=True)
    model = GAT(data.x.shape[1], args.hidden, data.y.shape[1], args.layers, args.heads,
                data.edge_attr.shape[1]).to(device)
    opt = torch.optim.Adam(model.parameters(), lr=args.lr, fused=device.type == "cuda")
    losses = common.LossLog()
    loss_fn = torch.nn.BCEWithLogitsLoss()

    def step(batch):
        batch = batch.to(device, non_blocking=True)
        opt.zero_grad(set_to_none=True)
        logits = model(batch.x, batch.edge_index, batch.edge_attr)[:batch.batch_size]
        loss = loss_fn(logits, batch.y[:batch.batch_size])
        loss.backward()
        opt.step()
        losses.add(loss)

    clock, first, record = common.EpochClock(device), {}, []
    for epoch in range(args.epochs):
        with clock.epoch():
            measures = common.run_epoch(step, loader, device, args if epoch == 0 else None)
        first = first or measures
        record.append(losses.epoch_mean())
        out.write({"system": args.system, "epoch": epoch, "epoch_seconds": clock.times[-1],
                   "loss": record[-1]})
    t1 = time.perf_counter()
    scores = layerwise_scores(model, data, args, device)
    y = data.y.numpy()
    extra = {f"{s}_rocauc": roc_auc(scores[idx.numpy()], y[idx.numpy()])
             for s, idx in splits.items()}
    extra["eval_seconds"] = time.perf_counter() - t1
    out.write(common.summary(args.system, args, clock, first, record, device, extra))
    return 0


if __name__ == "__main__":
    sys.exit(main())
