"""GraphSAGE with GPU-resident sampling driven from the host, in plain PyTorch.

The setting of DGL's and GraphBolt's GPU samplers, and of the ZeroGNN paper's PyTorch
baselines: the CSR graph and the feature table live on the GPU; per hop, each frontier
node draws up to f neighbours uniformly without replacement (all of them when its
degree is <= f) with torch ops; the sampled edges are compacted to their exact number
and `torch.unique(..., return_inverse=True)` deduplicates the nodes, with the frontier
kept as the prefix of the next one (DGL's dst-first convention). Both sizes are read
back by the host (`nonzero` and `unique` synchronise) to size the next buffers: that
host round trip per hop is what this baseline measures. Then features by
`index_select`, mean aggregation by `index_add_`, SAGE layers W [h_i ; mean_j h_j] + b
with dropout on hidden activations only, cross-entropy, fused Adam.

`--compile` wraps the model (forward and backward, through AOTAutograd) and the
per-hop neighbour draw in `torch.compile(dynamic=True)`, default mode. Dynamic shapes,
because every step has other node and edge counts: static shapes would recompile per
step until the recompile limit, and "reduce-overhead" (CUDA graphs) records one graph
per distinct shape, which buys nothing when shapes never repeat. "max-autotune" would
spend minutes of the benchmark budget autotuning GEMMs of a few hundred columns.

    PYTHONPATH=. python3 benchmarks/peers/torch_gpu_sage.py --data F.npz [--compile]
"""

from __future__ import annotations

import sys
import time
from typing import NamedTuple

import common
import numpy as np
import torch
import torch.nn.functional as F
from torch import nn


class DeviceGraph(NamedTuple):
    """CSR on the device. indptr: int64[N + 1]; indices: int64[E], row v's neighbours."""

    indptr: torch.Tensor
    indices: torch.Tensor


class Block(NamedTuple):
    """One hop as an exact-size bipartite graph (DGL's block).

    src: int64[m], edge sources as positions among the block's source nodes.
    dst: int64[m], edge destinations as positions among its destination nodes, which
      are the first `num_dst` source nodes.
    inv_deg: float32[num_dst, 1], 1 / max(sampled in-degree, 1).
    num_dst: int, a host number.
    """

    src: torch.Tensor
    dst: torch.Tensor
    inv_deg: torch.Tensor
    num_dst: int


def floyd_offsets(deg: torch.Tensor, rand: torch.Tensor, fanout: int) -> torch.Tensor:
    """Per row, min(deg, fanout) distinct offsets in [0, deg), uniformly drawn.

    Robert Floyd's subset draw, vectorised over rows: for i = 0..f-1 with
    j = deg - f + i, draw t uniform in [0, j]; keep t unless it is already taken, in
    which case keep j. Rows with deg <= fanout get 0, 1, ..., deg - 1.
    deg: int64[n]; rand: float32[n, fanout], uniform in [0, 1). Returns int64[n, fanout];
    entries at or past the row's degree are meaningless (mask them).
    """
    k = torch.arange(fanout, device=deg.device)
    top = deg[:, None] - fanout + k                            # Floyd's j, [n, f]
    draw = torch.minimum((rand * (top + 1)).long(), top)       # t in [0, j]
    off = draw.clone()
    for i in range(1, fanout):
        taken = (off[:, :i] == draw[:, i:i + 1]).any(dim=1)
        off[:, i] = torch.where(taken, top[:, i], draw[:, i])
    return torch.where(deg[:, None] > fanout, off, k)


def sample_hop(graph: DeviceGraph, nodes: torch.Tensor, fanout: int,
               gen: torch.Generator | None, draw=floyd_offsets):
    """Neighbours of `nodes` (int64[n]): (nbr int64[n, f] global ids, mask bool[n, f]).

    Fixed width, no host sync; a masked slot's id is meaningless.
    """
    if fanout <= 0:
        raise ValueError(f"training fanouts must be positive, got {fanout}")
    start = graph.indptr[nodes]
    deg = graph.indptr[nodes + 1] - start
    rand = torch.rand((nodes.shape[0], fanout), generator=gen, device=nodes.device)
    off = draw(deg, rand, fanout)
    mask = torch.arange(fanout, device=nodes.device) < deg[:, None]
    slot = torch.where(mask, start[:, None] + off, 0)
    return graph.indices[slot], mask


def dst_first(num_unique: int, front: torch.Tensor) -> torch.Tensor:
    """New positions int64[num_unique] of sorted unique ids, the frontier's first.

    front: int64[n], positions among the unique ids of the frontier (distinct), which
    move to 0..n-1 in frontier order; the other ids follow in sorted order.
    """
    n = front.shape[0]
    is_front = torch.zeros(num_unique, dtype=torch.bool, device=front.device)
    is_front[front] = True
    pos = torch.cumsum(~is_front, 0) - 1 + n
    pos[front] = torch.arange(n, device=front.device)
    return pos


def to_block(nodes: torch.Tensor, nbr: torch.Tensor, mask: torch.Tensor):
    """Compacts one hop: (Block, next_nodes int64[n_next]) with `nodes` as its prefix.

    Two host syncs: `nonzero` sizes the edge list, `unique` the next frontier.
    """
    n, fanout = nbr.shape
    slots = mask.reshape(-1).nonzero().squeeze(1)
    dst = torch.div(slots, fanout, rounding_mode="floor")
    src_ids = nbr.reshape(-1)[slots]
    uniq, inverse = torch.unique(torch.cat([nodes, src_ids]), return_inverse=True)
    pos = dst_first(uniq.shape[0], inverse[:n])
    next_nodes = torch.empty_like(uniq)
    next_nodes[pos] = uniq
    inv_deg = 1.0 / mask.sum(dim=1, keepdim=True).clamp(min=1).float()
    return Block(pos[inverse[n:]], dst, inv_deg, n), next_nodes


def sample_blocks(graph: DeviceGraph, seeds: torch.Tensor, fanouts, gen, draw=floyd_offsets):
    """Blocks for the model, outermost hop first, and input_nodes int64[n_L]."""
    blocks, nodes = [], seeds
    for fanout in fanouts:
        block, nodes = to_block(nodes, *sample_hop(graph, nodes, fanout, gen, draw))
        blocks.append(block)
    return blocks[::-1], nodes


class SAGE(nn.Module):
    """GraphSAGE-mean: layer l maps h to W_l [h_i ; mean_j h_j] + b_l."""

    def __init__(self, d_in: int, hidden: int, num_classes: int, num_layers: int,
                 dropout: float):
        super().__init__()
        widths = [d_in] + [hidden] * (num_layers - 1) + [num_classes]
        self.lins = nn.ModuleList(nn.Linear(2 * a, b) for a, b in zip(widths, widths[1:]))
        self.dropout = dropout
        for lin, a in zip(self.lins, widths):
            # As PyG's SAGEConv (two Linear(a, b) layers) and torch's Linear(a, b) start:
            # weight and bias uniform in +-1/sqrt(a), not +-1/sqrt(2a).
            nn.init.uniform_(lin.weight, -a ** -0.5, a ** -0.5)
            nn.init.uniform_(lin.bias, -a ** -0.5, a ** -0.5)

    def layer(self, i: int, h_src: torch.Tensor, h_dst: torch.Tensor, block: Block):
        """h_src: float32[n_src, d]; h_dst: float32[num_dst, d] -> float32[num_dst, d']."""
        msg = h_src.index_select(0, block.src)
        agg = h_src.new_zeros(h_dst.shape[0], h_src.shape[1]).index_add_(0, block.dst, msg)
        h = self.lins[i](torch.cat([h_dst, agg * block.inv_deg], dim=1))
        if i < len(self.lins) - 1:
            h = F.dropout(F.relu(h), self.dropout, self.training)
        return h

    def forward(self, x: torch.Tensor, blocks):
        """x: float32[n_L, d] input nodes' features -> logits float32[n_0, classes]."""
        h = x
        for i, block in enumerate(blocks):
            h = self.layer(i, h, h[:block.num_dst], block)
        return h


def chunk_bounds(indptr: np.ndarray, max_edges: int) -> list[tuple[int, int]]:
    """Row ranges [a, b) of at most `max_edges` edges each (at least one row each)."""
    n, bounds, a = indptr.shape[0] - 1, [], 0
    while a < n:
        b = int(np.searchsorted(indptr, indptr[a] + max_edges, side="right")) - 1
        b = min(max(b, a + 1), n, a + max_edges)
        bounds.append((a, b))
        a = b
    return bounds


@torch.no_grad()
def layerwise_outputs(model: SAGE, graph: DeviceGraph, feats: torch.Tensor,
                      indptr: np.ndarray, max_edges: int) -> torch.Tensor:
    """Exact full-neighbourhood inference, layer by layer over all nodes: the last
    layer's outputs float32[N, d'] on the features' device."""
    model.eval()
    h, n, bounds = feats, feats.shape[0], chunk_bounds(indptr, max_edges)
    for i in range(len(model.lins)):
        out = torch.empty(n, model.lins[i].out_features, device=feats.device)
        for a, b in bounds:
            lo, hi = int(indptr[a]), int(indptr[b])
            deg = graph.indptr[a + 1:b + 1] - graph.indptr[a:b]
            dst = torch.repeat_interleave(torch.arange(b - a, device=feats.device), deg,
                                          output_size=hi - lo)
            inv = 1.0 / deg.clamp(min=1).float()[:, None]
            out[a:b] = model.layer(i, h, h[a:b], Block(graph.indices[lo:hi], dst, inv, b - a))
        h = out
    model.train()
    return h


def layerwise_predict(model: SAGE, graph: DeviceGraph, feats: torch.Tensor,
                      indptr: np.ndarray, max_edges: int) -> np.ndarray:
    """Exact inference's predicted classes, int64[N]."""
    return layerwise_outputs(model, graph, feats, indptr, max_edges).argmax(dim=1).cpu().numpy()


class Trainer:
    """Holds the device-resident data, the model and the optimiser of one run."""

    def __init__(self, data: common.GraphData, args, device: torch.device):
        self.device, self.args = device, args
        self.fanouts = common.parse_fanouts(args.fanouts, args.layers)
        self.graph = DeviceGraph(torch.from_numpy(data.indptr).to(device),
                                 torch.from_numpy(data.indices).to(device, torch.int64))
        self.feats = torch.from_numpy(data.features).to(device)
        self.labels = torch.from_numpy(data.labels).to(device)
        self.train_idx = torch.from_numpy(data.train_idx).to(device)
        self.gen = torch.Generator(device=device)
        self.gen.manual_seed(args.seed)
        torch.manual_seed(args.seed)
        self.model = SAGE(data.features.shape[1], args.hidden, data.num_classes, args.layers,
                          args.dropout).to(device)
        self.opt = torch.optim.Adam(self.model.parameters(), lr=args.lr,
                                    weight_decay=args.weight_decay,
                                    fused=device.type == "cuda")
        self.forward, self.draw = self.model, floyd_offsets
        if args.compile:
            self.forward = torch.compile(self.model, dynamic=True)
            self.draw = torch.compile(floyd_offsets, dynamic=True)
        self.losses = common.LossLog()

    def batches(self):
        """Seed batches int64[<= B] of one epoch, from an on-device permutation."""
        perm = self.train_idx[torch.randperm(self.train_idx.shape[0], generator=self.gen,
                                             device=self.device)]
        return iter(perm.split(self.args.batch))

    def step(self, seeds: torch.Tensor) -> None:
        blocks, input_nodes = sample_blocks(self.graph, seeds, self.fanouts, self.gen,
                                            self.draw)
        logits = self.forward(self.feats.index_select(0, input_nodes), blocks)
        loss = F.cross_entropy(logits, self.labels[seeds])
        self.opt.zero_grad(set_to_none=True)
        loss.backward()
        self.opt.step()
        self.losses.add(loss)

    def epoch_loss(self) -> float:
        """Mean training loss over the epoch's steps (one host read per epoch)."""
        return self.losses.epoch_mean()


def check(trainer: Trainer, data: common.GraphData, batches: int = 3) -> list[str]:
    """Runs the sampler on a few batches and returns every fanout violation found."""
    problems = []
    for seeds in list(trainer.batches())[:batches]:
        nodes = seeds
        for fanout in trainer.fanouts:
            hop = sample_hop(trainer.graph, nodes, fanout, trainer.gen, trainer.draw)
            block, nxt = to_block(nodes, *hop)
            if not torch.equal(nxt[:nodes.shape[0]], nodes):
                problems.append("the frontier is not the prefix of the next one")
            if torch.unique(nxt).shape[0] != nxt.shape[0]:
                problems.append("the next frontier holds duplicates")
            problems += common.check_hop(
                data.indptr, data.indices, nodes[block.dst].cpu().numpy(),
                nxt[block.src].cpu().numpy(), nodes.cpu().numpy(), fanout)
            nodes = nxt
    return problems


def main(argv=None) -> int:
    p = common.base_parser(__doc__.splitlines()[0])
    p.add_argument("--compile", action="store_true", help="torch.compile model and draw")
    p.add_argument("--infer-edges", type=int, default=1 << 21,
                   help="edges per chunk of the layer-wise inference")
    p.add_argument("--system", default=None, help="name in the results")
    args = p.parse_args(argv)
    system = args.system or ("torch-gpu-compiled" if args.compile else "torch-gpu-eager")
    device, out = common.start_run(args)
    t0 = time.perf_counter()
    data = common.load_npz(args.data, args.normalize_features)
    trainer = Trainer(data, args, device)
    setup = time.perf_counter() - t0
    if args.check:
        return common.check_result(out, system, check(trainer, data))
    clock, losses, first, peak = common.train_epochs(trainer, trainer.batches, args, device,
                                                     out, system)
    t1 = time.perf_counter()
    pred = layerwise_predict(trainer.model, trainer.graph, trainer.feats, data.indptr,
                             args.infer_edges)
    extra = {"dataset": data.name, "peak_bytes": peak, "setup_seconds": setup,
             "eval_seconds": time.perf_counter() - t1, "compile": args.compile,
             **common.split_accuracy(pred, data)}
    out.write(common.summary(system, args, clock, first, losses, device, extra))
    return 0


if __name__ == "__main__":
    sys.exit(main())
