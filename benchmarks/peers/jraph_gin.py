"""The jraph-style baseline: the same model as zerognn-jax's graph task (GraphGNN,
OGB's gin-virtual with bond features), batches built and padded on the host (jraph's
`dynamically_batch` convention: fixed node/edge/graph budgets, a padding graph), one
jitted train step per batch.

    python benchmarks/peers/jraph_gin.py [--dataset molhiv-like] [--scale 1] [--epochs 5]
                                         [--batch-size 32]

One JSON line: graphs per second (training graphs over the median epoch time after
the first), test ROC-AUC and AP (means over the tasks) after the last epoch. Budgets
are the largest batch of the run plus the padding node, rounded to 64, as zerognn-jax's
envelope is.
"""

from __future__ import annotations

import argparse
import time

import common
import jax
import jax.numpy as jnp
import numpy as np
import optax

import zerognn_jax as zg
from zerognn_jax._src.data.graph_datasets import PRESETS
from zerognn_jax._src.training.tasks.graph_metrics import graph_metrics
from zerognn_jax._src.training.tasks.losses import masked_sigmoid


def pad_batch(c, ids, n_cap, e_cap):
    """One host-built padded batch (`zg.Graphs` arrays in NumPy) and its targets."""
    b = ids.size
    n_node, n_edge = c.n_node[ids], c.n_edge[ids]
    nodes = np.concatenate([np.arange(*c.node_offsets[g:g + 2]) for g in ids])
    edges = np.concatenate([np.arange(*c.edge_offsets[g:g + 2]) for g in ids])
    shift = np.repeat(np.cumsum(n_node) - n_node, n_edge)
    n, e = nodes.size, edges.size
    x = np.zeros((n_cap, c.node_features.shape[1]), np.float32)
    x[:n] = c.node_features[nodes]
    ef = np.zeros((e_cap, c.edge_features.shape[1]), np.float32)
    ef[:e] = c.edge_features[edges]
    s = np.full(e_cap, n_cap - 1, np.int32)
    r = s.copy()
    s[:e], r[:e] = c.senders[edges] + shift, c.receivers[edges] + shift
    graph = np.full(n_cap, b, np.int32)
    graph[:n] = np.repeat(np.arange(b), n_node)
    graphs = zg.Graphs(x, ef, s, r, np.append(n_node, n_cap - n).astype(np.int32),
                       np.append(n_edge, e_cap - e).astype(np.int32), None, graph,
                       np.arange(n_cap) < n, np.arange(e_cap) < e,
                       np.arange(b + 1) < b)
    targets = np.concatenate([c.targets[ids], np.full((1, c.targets.shape[1]), np.nan,
                                                      np.float32)])
    return graphs, targets


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--dataset", default="molhiv-like", choices=tuple(PRESETS))
    p.add_argument("--scale", type=float, default=1.0)
    p.add_argument("--epochs", type=int, default=5)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--hidden", type=int, default=300)
    p.add_argument("--layers", type=int, default=5)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    c = zg.load_graphs(args.dataset, scale=args.scale)
    b, rng = args.batch_size, np.random.default_rng(args.seed)
    orders = [rng.permutation(c.train_idx) for _ in range(args.epochs)]
    batches = [o[i:i + b] for o in orders for i in range(0, o.size, b)]
    n_cap = -(-max(c.n_node[x].sum() + 1 for x in batches) // 64) * 64
    e_cap = -(-max(c.n_edge[x].sum() for x in batches) // 64) * 64
    model = zg.make_graph_model("gine-virtual", hidden=args.hidden, num_layers=args.layers,
                                out_dim=c.output_dim, node_vocab=c.node_vocab,
                                edge_vocab=c.edge_vocab)
    tx = optax.adam(1e-3)
    g0, _ = pad_batch(c, batches[0], n_cap, e_cap)
    variables = model.init({"params": jax.random.key(0), "dropout": jax.random.key(1)}, g0,
                           train=False)
    params, stats, opt = variables["params"], variables["batch_stats"], None
    opt = tx.init(params)

    @jax.jit
    def step(params, stats, opt, graphs, targets, key):
        def loss_fn(p):
            out, new = model.apply({"params": p, "batch_stats": stats}, graphs, train=True,
                                   rngs={"dropout": key}, mutable=["batch_stats"])
            known = (~jnp.isnan(targets)).sum(-1)
            per = masked_sigmoid(out, targets)
            return jnp.sum(per * known) / jnp.maximum(known.sum(), 1), new["batch_stats"]
        (loss, stats), grads = jax.value_and_grad(loss_fn, has_aux=True)(params)
        updates, opt = tx.update(grads, opt, params)
        return optax.apply_updates(params, updates), stats, opt, loss

    times, key, per_epoch = [], jax.random.key(2), len(batches) // args.epochs
    for epoch in range(args.epochs):
        jax.block_until_ready(params)
        t0 = time.perf_counter()
        for i in range(per_epoch):
            graphs, targets = pad_batch(c, batches[epoch * per_epoch + i], n_cap, e_cap)
            key, sub = jax.random.split(key)
            params, stats, opt, loss = step(params, stats, opt, graphs, targets, sub)
        jax.block_until_ready(params)
        times.append(time.perf_counter() - t0)
    test = c.test_idx
    outs = []
    for i in range(0, test.size, 256):
        graphs, _ = pad_batch(c, test[i:i + 256], n_cap * 8, e_cap * 8)
        out = model.apply({"params": params, "batch_stats": stats}, graphs, train=False)
        outs.append(np.asarray(out)[:-1])
    metrics = graph_metrics(np.concatenate(outs), c.targets[test], "binary")
    return common.graph_result("jraph-style", args, c.train_idx.size, times, metrics,
                               {"dataset": c.name, "budgets": [int(n_cap), int(e_cap)],
                                "device": jax.devices()[0].device_kind})


if __name__ == "__main__":
    main()
