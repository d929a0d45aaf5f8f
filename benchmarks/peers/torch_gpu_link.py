"""Link prediction with GPU-resident sampling driven from the host, in plain PyTorch.

The node peer's loop (torch_gpu_sage.py: its sampler, blocks, SAGE layers and exact
inference, imported) extended to edges, step for step as zerognn-jax's link task does
it (docs/link_prediction.md):

1. positives: the next `--batch` rows of an on-device permutation of the training edges;
2. negatives: per positive, `--negatives` destinations drawn uniformly from the N - 1
   nodes other than its destination, its source kept (destination corruption);
3. seed frontier: `torch.unique` of every endpoint (a host sync);
4. sampling around it, hop by hop; in every hop a sampled slot (a, b) whose {a, b} is a
   positive pair of the step is masked before the hop is compacted, so message passing
   never reads the edges to predict (a row keeps one neighbour fewer than it drew, as in
   zerognn-jax, and the mean divides by the neighbours kept);
5. the SAGE encoder (3 x 256 by default, its last layer as wide as the others, no
   activation), a dot-product decoder, binary cross-entropy with logits over positives
   and negatives (negatives weigh 1/K), fused Adam.

`--subgraph` samples and computes as PyG's `LinkNeighborLoader` and `GraphSAGE` do
instead: each hop draws neighbours only for the nodes the previous hop added, so a node
has one set of sampled neighbours (the fanout of the hop after the one that reached
it), and every layer runs over every sampled node with those same edges. Without it,
as zerognn-jax does, hop k draws again for every node of the levels before it, so a
seed's own representation at the inner layers reads fresh, smaller draws (10, then 5).

    PYTHONPATH=. python3 benchmarks/peers/torch_gpu_link.py --data F.npz --steps 300
"""

from __future__ import annotations

import itertools
import sys
import time

import common
import link_data
import link_run
import torch
from torch_gpu_sage import (
    SAGE,
    Block,
    DeviceGraph,
    dst_first,
    layerwise_outputs,
    sample_hop,
    to_block,
)


def sample_link_blocks(graph: DeviceGraph, seeds: torch.Tensor, fanouts, gen, keys,
                       num_nodes: int):
    """Blocks outermost hop first and input_nodes int64[n_L], around `seeds` (the
    frontier, int64[n_0]); slots whose pair is in `keys` (link_run.positive_keys) are
    masked in every hop."""
    blocks, nodes = [], seeds
    for fanout in fanouts:
        nbr, mask = sample_hop(graph, nodes, fanout, gen)
        mask &= ~link_run.is_pair(nodes[:, None], nbr, keys, num_nodes)
        block, nodes = to_block(nodes, nbr, mask)
        blocks.append(block)
    return blocks[::-1], nodes


def sample_link_subgraph(graph: DeviceGraph, seeds: torch.Tensor, fanouts, gen, keys,
                         num_nodes: int) -> tuple[Block, torch.Tensor]:
    """PyG's directional subgraph around `seeds` (int64[n_0]): each hop draws for the
    nodes the hop before added; slots whose pair is in `keys` are masked. Returns one
    Block over every sampled node (num_dst = all of them) and their ids int64[n]."""
    nodes, new_from, srcs, dsts = seeds, 0, [], []
    for fanout in fanouts:
        added = nodes[new_from:]
        nbr, mask = sample_hop(graph, added, fanout, gen)
        mask &= ~link_run.is_pair(added[:, None], nbr, keys, num_nodes)
        slots = mask.reshape(-1).nonzero().squeeze(1)
        n = nodes.shape[0]
        uniq, inverse = torch.unique(torch.cat([nodes, nbr.reshape(-1)[slots]]),
                                     return_inverse=True)
        pos = dst_first(uniq.shape[0], inverse[:n])  # earlier nodes keep their positions
        srcs.append(pos[inverse[n:]])
        dsts.append(new_from + torch.div(slots, fanout, rounding_mode="floor"))
        nodes = torch.empty_like(uniq)
        nodes[pos] = uniq
        new_from = n
    src, dst = torch.cat(srcs), torch.cat(dsts)
    deg = torch.bincount(dst, minlength=nodes.shape[0])
    inv_deg = 1.0 / deg.clamp(min=1).float()[:, None]
    return Block(src, dst, inv_deg, nodes.shape[0]), nodes


def subgraph_forward(model: SAGE, x: torch.Tensor, block: Block) -> torch.Tensor:
    """Every layer over every node of the subgraph, as PyG's GraphSAGE runs."""
    h = x
    for i in range(len(model.lins)):
        h = model.layer(i, h, h, block)
    return h


class LinkTrainer:
    """Holds the device-resident graph, features, training edges, model and optimiser."""

    def __init__(self, data: link_data.LinkData, args, device: torch.device):
        self.device, self.args = device, args
        self.fanouts = common.parse_fanouts(args.fanouts, args.layers)
        self.num_nodes = data.num_nodes
        self.graph = DeviceGraph(torch.from_numpy(data.indptr).to(device),
                                 torch.from_numpy(data.indices).to(device, torch.int64))
        self.feats = torch.from_numpy(data.features).to(device)
        self.train_edges = torch.from_numpy(data.train).to(device)
        self.gen = torch.Generator(device=device)
        self.gen.manual_seed(args.seed)
        torch.manual_seed(args.seed)
        self.model = SAGE(data.features.shape[1], args.hidden, args.hidden, args.layers,
                          args.dropout).to(device)
        self.opt = torch.optim.Adam(self.model.parameters(), lr=args.lr,
                                    weight_decay=args.weight_decay,
                                    fused=device.type == "cuda")
        self.losses = common.LossLog()

    def batches(self):
        """Positive batches int64[<= B, 2], epoch after epoch of on-device permutations."""
        for _ in itertools.count():
            perm = torch.randperm(self.train_edges.shape[0], generator=self.gen,
                                  device=self.device)
            yield from self.train_edges[perm].split(self.args.batch)

    def negatives(self, pos: torch.Tensor) -> torch.Tensor:
        """int64[B, K]: uniform destinations other than each positive's own."""
        draw = torch.randint(0, self.num_nodes - 1, (pos.shape[0], self.args.negatives),
                             generator=self.gen, device=self.device)
        return draw + (draw >= pos[:, 1:2]).long()

    def step(self, pos: torch.Tensor) -> None:
        neg_dst = self.negatives(pos)
        b, k = neg_dst.shape
        ends = torch.cat([pos[:, 0], pos[:, 1], neg_dst.reshape(-1)])
        seeds, local = torch.unique(ends, return_inverse=True)
        keys = link_run.positive_keys(pos, self.num_nodes)
        if self.args.subgraph:
            block, input_nodes = sample_link_subgraph(self.graph, seeds, self.fanouts,
                                                      self.gen, keys, self.num_nodes)
            h = subgraph_forward(self.model, self.feats.index_select(0, input_nodes), block)
        else:
            blocks, input_nodes = sample_link_blocks(self.graph, seeds, self.fanouts,
                                                     self.gen, keys, self.num_nodes)
            h = self.model(self.feats.index_select(0, input_nodes), blocks)
        src, dst, neg = h[local[:b]], h[local[b:2 * b]], h[local[2 * b:]].view(b, k, -1)
        loss = link_run.pair_loss((src * dst).sum(-1), (src[:, None] * neg).sum(-1))
        link_run.train_on(loss, self.opt, self.losses)


def main(argv=None) -> int:
    p = link_run.parser(__doc__.splitlines()[0])
    p.add_argument("--infer-edges", type=int, default=1 << 21,
                   help="edges per chunk of the layer-wise inference")
    p.add_argument("--subgraph", action="store_true",
                   help="sample and compute as PyG does (see the module's docstring)")
    p.add_argument("--system", default=None, help="name in the results (default: "
                   "torch-gpu-link-eager, with --subgraph torch-gpu-link-subgraph)")
    args = p.parse_args(argv)
    device, out = common.start_run(args)
    t0 = time.perf_counter()
    data = link_data.load(args.data)
    trainer = LinkTrainer(data, args, device)
    setup = time.perf_counter() - t0
    common.reset_peak(device)
    measures = link_run.drain_timed(trainer.step, trainer.batches(), device, args)
    losses = trainer.losses.values()
    peak = common.peak_bytes(device)
    t1 = time.perf_counter()
    h = layerwise_outputs(trainer.model, trainer.graph, trainer.feats, data.indptr,
                          args.infer_edges)
    extra = {"peak_bytes": peak, "setup_seconds": setup, "subgraph": args.subgraph,
             "eval_seconds": time.perf_counter() - t1, **link_run.link_metrics(h, data)}
    system = args.system or ("torch-gpu-link-subgraph" if args.subgraph
                             else "torch-gpu-link-eager")
    out.write(link_run.summary(system, args, data, measures, losses, device, extra))
    return 0


if __name__ == "__main__":
    sys.exit(main())
