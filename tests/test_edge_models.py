"""Layers that read edge features: GAT with `edge_dim` and GINE, over sampled blocks and
exact edge chunks."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import random_graph

from zerognn_jax import EdgeView, EllView, GATConv, GINEConv

D_EDGE = 3


@pytest.fixture(scope="module")
def block():
    """Every edge of a random graph as one ELL block ([N, K], all neighbours) and as one
    CSR edge chunk, with the same per-edge features and node features."""
    g = random_graph(40, 120, seed=4)
    indptr, indices = np.asarray(g.indptr), np.asarray(g.indices)
    n, deg = g.num_nodes, np.diff(indptr)
    k = int(deg.max())
    rs = np.random.default_rng(4)
    feats = rs.normal(size=(g.num_edges, D_EDGE)).astype(np.float32)
    mask = np.arange(k)[None, :] < deg[:, None]
    pos = np.where(mask, indptr[:-1, None] + np.arange(k)[None, :], 0)
    h = jnp.asarray(rs.normal(size=(n, 6)), jnp.float32)
    degs = jnp.asarray(deg, jnp.int32)
    ell = EllView(jnp.asarray(np.where(mask, indices[pos], 0)), jnp.asarray(mask),
                  jnp.ones(n, bool), degs, degs,
                  edge_attr=jnp.asarray(np.where(mask[..., None], feats[pos], 0.0)))
    dst = np.repeat(np.arange(n), deg)
    edges = EdgeView(jnp.asarray(indices), jnp.asarray(dst, jnp.int32),
                     jnp.ones(g.num_edges, bool), jnp.ones(n, bool), degs, degs, n,
                     edge_attr=jnp.asarray(feats))
    return h, ell, edges


LAYERS = [GATConv(8, heads=2, edge_dim=D_EDGE), GINEConv(5), GINEConv(5, train_eps=True)]


@pytest.mark.parametrize("layer", LAYERS, ids=["gat-edge", "gine", "gine-train-eps"])
def test_sampled_block_and_exact_chunk_give_the_same_outputs(block, layer):
    h, ell, edges = block
    params = layer.init(jax.random.PRNGKey(0), h, h, ell)
    a = layer.apply(params, h, h, ell)
    b = layer.apply(params, h, h, edges)
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("layer", LAYERS, ids=["gat-edge", "gine", "gine-train-eps"])
def test_outputs_depend_on_the_edge_features(block, layer):
    h, ell, _ = block
    params = layer.init(jax.random.PRNGKey(1), h, h, ell)

    def loss(edge_attr):
        view = EllView(ell.nbr, ell.mask, ell.dst_valid, ell.dst_deg, ell.src_deg,
                       edge_attr=edge_attr)
        return jnp.sum(layer.apply(params, h, h, view) ** 2)

    grad = np.asarray(jax.grad(loss)(ell.edge_attr))
    live = np.asarray(ell.mask)
    assert np.abs(grad[live]).max() > 1e-4  # every live slot's features matter
    assert (np.abs(grad[live]).sum(-1) > 0).mean() > 0.9
    assert not grad[~live].any()  # dead slots never do


def test_gat_without_edge_dim_has_no_edge_parameters(block):
    h, ell, _ = block
    params = GATConv(8, heads=2).init(jax.random.PRNGKey(0), h, h, ell)["params"]
    assert "edge" not in params and "att_edge" not in params


def test_missing_or_mismatched_edge_features_are_named(block):
    h, ell, _ = block
    bare = EllView(ell.nbr, ell.mask, ell.dst_valid, ell.dst_deg, ell.src_deg)
    with pytest.raises(ValueError, match=r"reads edge features, and its view carries none: "
                                         r"build the views with zg.views_for\(mb, "
                                         r"edge_table=...\) from blocks sampled with "
                                         r"SamplerConfig\(edge_ids=True\)"):
        GINEConv(4).init(jax.random.PRNGKey(0), h, h, bare)
    with pytest.raises(ValueError, match="edge_dim 5, and its view's edge features are 3"):
        GATConv(8, heads=2, edge_dim=5).init(jax.random.PRNGKey(0), h, h, ell)


def test_gat_edge_attention_matches_its_definition(block):
    """PyG's `GATConv(edge_dim)` logit a_src.Wh_j + a_dst.Wh_i + a_edge.(W_e e_ij), its
    self-loop taking the mean edge feature, written out per node in NumPy."""
    h, ell, _ = block
    layer = LAYERS[0]
    params = layer.init(jax.random.PRNGKey(2), h, h, ell)
    out = np.asarray(layer.apply(params, h, h, ell))
    p = jax.tree.map(np.asarray, params["params"])
    heads, f = 2, 4
    z = (np.asarray(h) @ p["Dense_0"]["kernel"]).reshape(-1, heads, f)
    a_src, a_dst, a_edge = p["att_src"][0], p["att_dst"][0], p["att_edge"][0]
    nbr, mask, attr = np.asarray(ell.nbr), np.asarray(ell.mask), np.asarray(ell.edge_attr)
    leaky = lambda v: np.where(v > 0, v, 0.2 * v)
    for i in range(z.shape[0]):
        live = nbr[i][mask[i]]
        e = attr[i][mask[i]]
        edge = (e @ p["edge"]["kernel"]).reshape(-1, heads, f)
        self_edge = (e.mean(0) @ p["edge"]["kernel"]).reshape(heads, f)
        logits = np.concatenate([
            (z[live] * a_src).sum(-1) + (z[i] * a_dst).sum(-1) + (edge * a_edge).sum(-1),
            ((z[i] * a_src).sum(-1) + (z[i] * a_dst).sum(-1)
             + (self_edge * a_edge).sum(-1))[None]])
        w = np.exp(leaky(logits) - leaky(logits).max(0))
        w /= w.sum(0)
        want = np.einsum("jh,jhf->hf", w, np.concatenate([z[live], z[i][None]]))
        np.testing.assert_allclose(out[i], want.reshape(-1) + p["bias"], rtol=1e-4,
                                   atol=1e-5)
