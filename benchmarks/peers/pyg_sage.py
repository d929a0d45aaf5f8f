"""GraphSAGE with PyG's `NeighborLoader` and `SAGEConv`, as PyG's own examples train it.

Sampling runs on the CPU in loader worker processes (pinned memory, persistent
workers); each mini-batch subgraph is copied to the GPU, where PyG's `GraphSAGE`
(SAGEConv-mean, ReLU, dropout on hidden activations) runs over the whole sampled
subgraph and the loss is taken on the seeds, the first `batch_size` nodes. Test
accuracy comes from exact layer-wise inference over all nodes with a full-neighbour,
one-hop `NeighborLoader`, as PyG's examples (and `BasicGNN.inference`) do it; the
per-layer embedding table stays on the GPU, and the inference loader carries the graph
only, so its workers do not slice feature rows they would not use.

NeighborLoader needs pyg-lib or torch-sparse (CPU builds suffice: sampling is on the
CPU); see benchmarks/peers.sh for installing the torch-sparse wheels.

    PYTHONPATH=. python3 benchmarks/peers/pyg_sage.py --data F.npz --workers 14
"""

from __future__ import annotations

import sys
import time

import common
import numpy as np
import torch
import torch.nn.functional as F
from torch_geometric.data import Data
from torch_geometric.loader import NeighborLoader
from torch_geometric.nn import GraphSAGE


def to_pyg(data: common.GraphData) -> Data:
    """A PyG `Data`: x float32[N, d], y int64[N], edge_index int64[2, E] (source, target).

    The CSR rows are the targets, so edge_index is sorted by target (column), which lets
    the loader skip its re-sort (`is_sorted=True`).
    """
    deg = torch.from_numpy(np.diff(data.indptr))
    target = torch.repeat_interleave(torch.arange(data.num_nodes), deg)
    source = torch.from_numpy(data.indices).to(torch.int64)
    return Data(x=torch.from_numpy(data.features), y=torch.from_numpy(data.labels),
                edge_index=torch.stack([source, target]), num_nodes=data.num_nodes)


def loader_options(args, device: torch.device) -> dict:
    workers = max(0, args.workers)
    return {"num_workers": workers, "persistent_workers": workers > 0,
            "pin_memory": device.type == "cuda", "is_sorted": True}


def train_loader(pyg: Data, data: common.GraphData, fanouts, args, device) -> NeighborLoader:
    return NeighborLoader(pyg, num_neighbors=fanouts, input_nodes=torch.from_numpy(data.train_idx),
                          batch_size=args.batch, shuffle=True, **loader_options(args, device))


def full_loader(pyg: Data, args, device) -> NeighborLoader:
    """One hop, all neighbours, every node once: the structure only (no x, no y)."""
    graph = Data(edge_index=pyg.edge_index, num_nodes=pyg.num_nodes)
    return NeighborLoader(graph, num_neighbors=[-1], input_nodes=None,
                          batch_size=args.infer_batch, shuffle=False,
                          **loader_options(args, device))


@torch.no_grad()
def layerwise_outputs(model: GraphSAGE, loader: NeighborLoader, x: torch.Tensor,
                      device: torch.device) -> torch.Tensor:
    """Exact inference, one layer over all nodes at a time: the last layer's outputs
    float32[N, d'] on `device`.

    x: float32[N, d] on the CPU; each layer's output table stays on `device`. Batch b's
    rows are nodes n_id[:batch_size] in order. Each batch's rows are copied out:
    `inference_per_layer` returns the last layer's rows as a slice of the output over
    all of the batch's n_id, which would keep that whole output alive (with 256-wide
    link embeddings, more than an 80 GB GPU holds).
    """
    model.eval()
    h = x.to(device)
    for i in range(model.num_layers):
        rows = []
        for batch in loader:
            edge_index = batch.edge_index.to(device, non_blocking=True)
            inputs = h[batch.n_id.to(device, non_blocking=True)]
            rows.append(model.inference_per_layer(i, inputs, edge_index,
                                                  batch.batch_size).clone())
        h = torch.cat(rows, dim=0)
    model.train()
    return h


def layerwise_predict(model: GraphSAGE, loader: NeighborLoader, x: torch.Tensor,
                      device: torch.device) -> np.ndarray:
    """Exact inference's predicted classes, int64[N]."""
    return layerwise_outputs(model, loader, x, device).argmax(dim=1).cpu().numpy()


class Trainer:
    """PyG model, optimiser and the step over one loader batch."""

    def __init__(self, data: common.GraphData, args, device: torch.device):
        torch.manual_seed(args.seed)
        self.device = device
        self.model = GraphSAGE(data.features.shape[1], args.hidden, num_layers=args.layers,
                               out_channels=data.num_classes, dropout=args.dropout).to(device)
        self.opt = torch.optim.Adam(self.model.parameters(), lr=args.lr,
                                    weight_decay=args.weight_decay,
                                    fused=device.type == "cuda")
        self.losses = common.LossLog()

    def step(self, batch) -> None:
        batch = batch.to(self.device, non_blocking=True)
        self.opt.zero_grad(set_to_none=True)
        logits = self.model(batch.x, batch.edge_index)[:batch.batch_size]
        loss = F.cross_entropy(logits, batch.y[:batch.batch_size])
        loss.backward()
        self.opt.step()
        self.losses.add(loss)

    def epoch_loss(self) -> float:
        """Mean training loss over the epoch's steps (one host read per epoch)."""
        return self.losses.epoch_mean()


def hops_from_seeds(num_sampled: int, batch_size: int, src, dst, layers: int) -> np.ndarray:
    """Hop at which each sampled node was reached (seeds 0), int64[num_sampled].

    src, dst: local edge ends. A node is expanded once, at the hop it is first reached,
    so a breadth-first search from the seeds over the sampled edges recovers it.
    """
    hop = np.full(num_sampled, -1, np.int64)
    hop[:batch_size] = 0
    for k in range(layers):
        reached = np.unique(src[hop[dst] == k])
        hop[reached[hop[reached] < 0]] = k + 1
    return hop


def check(loader: NeighborLoader, data: common.GraphData, fanouts, batches: int = 3):
    """Fanout violations in a few sampled subgraphs of `loader` (a list of messages)."""
    problems = []
    for b, batch in enumerate(loader):
        if b == batches:
            break
        n_id = batch.n_id.numpy()
        src, dst = batch.edge_index.numpy()
        hop = hops_from_seeds(n_id.shape[0], batch.batch_size, src, dst, len(fanouts))
        if (hop < 0).any():
            problems.append("a sampled node is not reachable from the seeds")
        for k, fanout in enumerate(fanouts):
            at_k = hop[dst] == k
            problems += common.check_hop(data.indptr, data.indices, n_id[dst[at_k]],
                                         n_id[src[at_k]], n_id[hop == k], fanout)
        if (hop[dst] == len(fanouts)).any():
            problems.append("a node of the last hop was expanded")
    return problems


def main(argv=None) -> int:
    p = common.base_parser(__doc__.splitlines()[0])
    p.add_argument("--infer-batch", type=int, default=4096, help="nodes per inference batch")
    p.add_argument("--system", default="pyg-neighborloader", help="name in the results")
    args = p.parse_args(argv)
    device, out = common.start_run(args)
    fanouts = common.parse_fanouts(args.fanouts, args.layers)
    t0 = time.perf_counter()
    data = common.load_npz(args.data, args.normalize_features)
    pyg = to_pyg(data)
    loader = train_loader(pyg, data, fanouts, args, device)
    if args.check:
        return common.check_result(out, args.system, check(loader, data, fanouts))
    trainer = Trainer(data, args, device)
    setup = time.perf_counter() - t0
    clock, losses, first, peak = common.train_epochs(trainer, lambda: loader, args, device,
                                                     out, args.system)
    t1 = time.perf_counter()
    pred = layerwise_predict(trainer.model, full_loader(pyg, args, device), pyg.x, device)
    extra = {"dataset": data.name, "peak_bytes": peak, "setup_seconds": setup,
             "eval_seconds": time.perf_counter() - t1, **common.split_accuracy(pred, data)}
    out.write(common.summary(args.system, args, clock, first, losses, device, extra))
    return 0


if __name__ == "__main__":
    sys.exit(main())
