"""Link prediction with PyG's `LinkNeighborLoader` and `GraphSAGE`, as PyG trains it.

Sampling runs on the CPU in loader worker processes (pinned memory, persistent
workers), as pyg_sage.py does for nodes. Per step the loader takes `--batch` training
edges (a shuffled pass over them, epoch after epoch) and
`NegativeSampling("triplet", amount=K)`: per positive (u, v), K destinations drawn
uniformly from all N nodes, u kept (PyG's "binary" mode would draw both ends of each
negative at random). This is zerognn-jax's destination corruption, but that PyG may
draw v itself (probability 1/N) where zerognn-jax never does. The loader samples
`--fanouts` around every endpoint (deduplicated: `disjoint=False`) and returns the
batch's positives and negatives as positions among the sampled nodes
(`src_index`, `dst_pos_index`, `dst_neg_index`).

Seed-edge exclusion: LinkNeighborLoader keeps the supervision edges in the graph it
samples from (it removes nothing when `edge_label_index` edges are also edges of
`edge_index`; PyG's own recipe is to split them off beforehand, `RandomLinkSplit(
disjoint_train_ratio=...)`, a different protocol). So, as zerognn-jax masks the step's
positive pairs in every sampled block, the step here drops every sampled edge whose
two ends are a positive pair of the batch, in either direction, before the encoder
runs: the same edges leave message passing, and a row keeps one neighbour fewer than
it drew, as in zerognn-jax. Dropping them on the GPU costs one host sync (the boolean
index) per step.

Then PyG's `GraphSAGE` over the whole sampled subgraph (SAGEConv-mean, ReLU, dropout on
hidden activations, its last layer `--hidden` wide without activation), the dot
product of each pair's embeddings, binary cross-entropy with logits (negatives weigh
1/K), fused Adam. Evaluation: every node's embedding by exact layer-wise inference
(pyg_sage.py's one-hop full-neighbour NeighborLoader), scored on the split's fixed
pairs.

Needs pyg-lib or torch-sparse (CPU builds suffice); see benchmarks/peers.sh.

    PYTHONPATH=. python3 benchmarks/peers/pyg_link.py --data F.npz --steps 300 --workers 14
"""

from __future__ import annotations

import gc
import itertools
import sys
import time

import common
import link_data
import link_run
import numpy as np
import torch
from pyg_sage import full_loader, layerwise_outputs, loader_options
from torch_geometric.data import Data
from torch_geometric.loader import LinkNeighborLoader
from torch_geometric.nn import GraphSAGE
from torch_geometric.sampler import NegativeSampling


def to_pyg(data: link_data.LinkData) -> Data:
    """x float32[N, d], edge_index int64[2, E] (source, target), sorted by target."""
    deg = torch.from_numpy(np.diff(data.indptr))
    target = torch.repeat_interleave(torch.arange(data.num_nodes), deg)
    source = torch.from_numpy(data.indices).to(torch.int64)
    return Data(x=torch.from_numpy(data.features), edge_index=torch.stack([source, target]),
                num_nodes=data.num_nodes)


def train_loader(pyg: Data, data: link_data.LinkData, fanouts, args, device):
    return LinkNeighborLoader(
        pyg, num_neighbors=fanouts, edge_label_index=torch.from_numpy(data.train.T.copy()),
        neg_sampling=NegativeSampling("triplet", amount=args.negatives),
        batch_size=args.batch, shuffle=True, **loader_options(args, device))


def without_positives(batch) -> torch.Tensor:
    """batch.edge_index less every edge {a, b} that is a positive pair of the batch."""
    pos = torch.stack([batch.src_index, batch.dst_pos_index], 1)
    keys = link_run.positive_keys(pos, batch.num_nodes)
    src, dst = batch.edge_index
    return batch.edge_index[:, ~link_run.is_pair(src, dst, keys, batch.num_nodes)]


class LinkTrainer:
    """PyG encoder, optimiser and the step over one loader batch."""

    def __init__(self, data: link_data.LinkData, args, device: torch.device):
        torch.manual_seed(args.seed)
        self.device = device
        self.model = GraphSAGE(data.features.shape[1], args.hidden, num_layers=args.layers,
                               dropout=args.dropout).to(device)
        self.opt = torch.optim.Adam(self.model.parameters(), lr=args.lr,
                                    weight_decay=args.weight_decay,
                                    fused=device.type == "cuda")
        self.losses = common.LossLog()

    def step(self, batch) -> None:
        batch = batch.to(self.device, non_blocking=True)
        h = self.model(batch.x, without_positives(batch))
        neg = batch.dst_neg_index.view(batch.src_index.shape[0], -1)
        src = h[batch.src_index]
        loss = link_run.pair_loss((src * h[batch.dst_pos_index]).sum(-1),
                                  (src[:, None] * h[neg]).sum(-1))
        link_run.train_on(loss, self.opt, self.losses)


def main(argv=None) -> int:
    p = link_run.parser(__doc__.splitlines()[0])
    p.add_argument("--infer-batch", type=int, default=4096, help="nodes per inference batch")
    p.add_argument("--system", default="pyg-linkneighborloader", help="name in the results")
    args = p.parse_args(argv)
    device, out = common.start_run(args)
    fanouts = common.parse_fanouts(args.fanouts, args.layers)
    t0 = time.perf_counter()
    data = link_data.load(args.data)
    pyg = to_pyg(data)
    loader = train_loader(pyg, data, fanouts, args, device)
    trainer = LinkTrainer(data, args, device)
    setup = time.perf_counter() - t0
    common.reset_peak(device)
    batches = itertools.chain.from_iterable(loader for _ in itertools.count())
    measures = link_run.drain_timed(trainer.step, batches, device, args)
    losses = trainer.losses.values()
    peak = common.peak_bytes(device)
    del loader, batches  # the training loader's workers and batches, before inference
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
    t1 = time.perf_counter()
    extra = {"peak_bytes": peak, "setup_seconds": setup}
    try:
        h = layerwise_outputs(trainer.model, full_loader(pyg, args, device), pyg.x, device)
        extra.update(link_run.link_metrics(h, data))
    except torch.OutOfMemoryError as err:  # the training figures still get written
        extra["eval_error"] = f"exact inference ran out of GPU memory: {str(err)[:160]}"
    extra["eval_seconds"] = time.perf_counter() - t1
    out.write(link_run.summary(args.system, args, data, measures, losses, device, extra))
    return 0


if __name__ == "__main__":
    sys.exit(main())
