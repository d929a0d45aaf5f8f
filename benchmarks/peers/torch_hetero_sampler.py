"""PyG's hetero neighbour sampling in plain PyTorch ops, for machines without pyg-lib
or torch-sparse (the CPU parity checks of benchmarks/peers/pyg_hetero_sage.py).

`TorchHeteroSampler` is a `torch_geometric.sampler.NeighborSampler` whose `_sample`
does what pyg-lib's `hetero_neighbor_sample` (CSC, uniform, without replacement,
directional, not disjoint) does, so `NeighborLoader(..., neighbor_sampler=it)` yields
the same kind of batch:

  - the seeds open their type's node list; each node type keeps one global-to-local map
    for the whole batch, so a node appears once however often it is drawn;
  - hop h, edge type by edge type in the graph's order: every node of the destination
    type added at hop h - 1 (the seeds at hop 0) draws min(k, degree) distinct sources
    of that edge type uniformly (k = -1: all of them); sources not yet in their type's
    list are appended; the sampled edge (source, destination) is recorded in local ids;
  - the nodes that a hop adds are expanded at the next hop only, so every node is
    expanded at most once.

Only the random stream differs from pyg-lib's. It is a check of the model and training
loop at small scale, not a benchmark of PyG's sampling speed; use it with
`num_workers=0` (forked workers would copy one generator and draw the same stream).
"""

from __future__ import annotations

import torch
from torch_geometric.sampler import HeteroSamplerOutput, NeighborSampler
from torch_geometric.sampler.base import SubgraphType


def _draw(start: torch.Tensor, deg: torch.Tensor, k: int, gen) -> tuple:
    """(segment, CSC position) of min(k, deg) distinct uniform picks per segment."""
    total = int(deg.sum())
    seg = torch.repeat_interleave(torch.arange(deg.numel()), deg)
    offsets = torch.cumsum(deg, 0) - deg
    rank = torch.arange(total) - offsets[seg]
    pos = start[seg] + rank
    if k < 0:
        return seg, pos
    # a random key per candidate edge; sorting by (segment, key) ranks each segment's
    # edges in a uniformly random order, and its first k are a uniform k-subset
    key = seg.to(torch.float64) + torch.rand(total, generator=gen, dtype=torch.float64)
    order = torch.argsort(key)
    keep = rank < k  # ranks of the sorted order are those of the unsorted one
    return seg[order][keep], pos[order][keep]


class TorchHeteroSampler(NeighborSampler):
    """`NeighborSampler` with the hetero sampling of the module docstring."""

    def __init__(self, *args, seed: int = 0, **kwargs):
        super().__init__(*args, **kwargs)
        if (self.replace or self.disjoint or self.subgraph_type != SubgraphType.directional
                or self.node_time is not None or self.edge_time is not None
                or self.edge_weight is not None):
            raise ValueError("TorchHeteroSampler does uniform, directional, non-disjoint "
                             "sampling without replacement only")
        self.generator = torch.Generator().manual_seed(seed)

    def _sample(self, seed, seed_time=None, **kwargs) -> HeteroSamplerOutput:
        if not isinstance(seed, dict):
            raise ValueError("TorchHeteroSampler samples heterogeneous graphs only")
        fanouts = self.num_neighbors.get_mapped_values(self.edge_types)
        local = {t: torch.full((n,), -1, dtype=torch.long) for t, n in self.num_nodes.items()}
        nodes = {t: torch.empty(0, dtype=torch.long) for t in self.node_types}
        for t, ids in seed.items():
            nodes[t] = ids.to(torch.long)
            local[t][nodes[t]] = torch.arange(ids.numel())
        frontier = {t: (0, nodes[t].numel()) for t in self.node_types}
        counts = {t: [nodes[t].numel()] for t in self.node_types}
        rows, cols, edges = {}, {}, {}
        edge_counts = {et: [] for et in self.edge_types}
        for hop in range(self.num_neighbors.num_hops):
            for et in self.edge_types:
                src_t, _, dst_t = et
                k = fanouts[self.to_rel_type[et]][hop]
                begin, end = frontier[dst_t]
                if k == 0 or end == begin:
                    edge_counts[et].append(0)
                    continue
                colptr, row = self.colptr_dict[self.to_rel_type[et]], self.row_dict[
                    self.to_rel_type[et]]
                dst_global = nodes[dst_t][begin:end]
                start = colptr[dst_global]
                seg, pos = _draw(start, colptr[dst_global + 1] - start, k, self.generator)
                src_global = row[pos]
                fresh = src_global[local[src_t][src_global] < 0]
                if fresh.numel():
                    uniq, inv = torch.unique(fresh, return_inverse=True)
                    first = torch.full((uniq.numel(),), fresh.numel(), dtype=torch.long)
                    first.scatter_reduce_(0, inv, torch.arange(fresh.numel()), "amin")
                    uniq = uniq[torch.argsort(first)]  # order of first appearance
                    local[src_t][uniq] = torch.arange(uniq.numel()) + nodes[src_t].numel()
                    nodes[src_t] = torch.cat([nodes[src_t], uniq])
                rows[et] = torch.cat([rows.get(et, torch.empty(0, dtype=torch.long)),
                                      local[src_t][src_global]])
                cols[et] = torch.cat([cols.get(et, torch.empty(0, dtype=torch.long)),
                                      seg + begin])
                edges[et] = torch.cat([edges.get(et, torch.empty(0, dtype=torch.long)), pos])
                edge_counts[et].append(int(pos.numel()))
            for t in self.node_types:
                counts[t].append(nodes[t].numel() - frontier[t][1])
                frontier[t] = (frontier[t][1], nodes[t].numel())
        return HeteroSamplerOutput(node=nodes, row=rows, col=cols, edge=edges, batch=None,
                                   num_sampled_nodes=counts, num_sampled_edges=edge_counts)
