"""Relational models over typed blocks: relational SAGE against a NumPy reference,
every model's shapes and gradients (into a featureless type's table rows too), and a
few optimizer steps that lower the loss."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import zerognn_jax as zg

WRITES = ("author", "writes", "paper")
CITES = ("paper", "cites", "paper")


@functools.lru_cache(maxsize=4)
def _batch(fanouts=(4, 3), edge_features=False):
    """A 2-hop typed batch of 8 papers (sampled once), the outermost level's features,
    the seeds' labels and the graph; with `edge_features`, citations carry 3 features
    and the blocks their edge ids."""
    rs = np.random.default_rng(0)
    counts = {"author": 40, "paper": 50}
    edges = {WRITES: (rs.integers(0, 40, 200), rs.integers(0, 50, 200)),
             CITES: (rs.integers(0, 50, 150), rs.integers(0, 50, 150))}
    tables = {CITES: rs.standard_normal((150, 3))} if edge_features else None
    # authors get no messages: a root transform
    graph = zg.hetero_graph(counts, edges, edge_features=tables)
    config = zg.TypedSamplerConfig(fanouts, edge_ids=edge_features).resolve(graph)
    env = zg.typed_conservative(config, "paper", 8, graph.num_nodes)
    sample = jax.jit(zg.sample_typed, static_argnames=("config", "envelope"))
    mb = sample(graph.to_device(), jnp.arange(8, dtype=jnp.int32), jnp.ones(8, bool),
                jnp.uint32(3), config=config, envelope=env)
    feats = {"paper": rs.standard_normal((50, 6)).astype(np.float32),
             "author": rs.standard_normal((40, 3)).astype(np.float32)}
    return mb, feats, rs.integers(0, 5, 8), graph


def _init(model, x, mb, hops=2, edges=()):
    """Parameters; views are no pytrees, so they are built inside the traced function
    (as the training step builds them)."""
    init = jax.jit(lambda k, x, mb, e: model.init(k, x, zg.typed_layers(mb, edges=e)[-hops:],
                                                  train=False))
    return init(jax.random.key(1), x, mb, edges)


def _edge_rows(mb, graph, scale: float = 1.0) -> tuple:
    """Per hop {CITES: float32[C, K, 3]}: the sampled citations' features (times
    `scale`), zero in dead slots."""
    table = jnp.asarray(graph[CITES].edge_features)
    return tuple({CITES: scale * jnp.where(hop[CITES].mask[..., None],
                                           table[hop[CITES].eid], 0.0)} for hop in mb.blocks)


def test_rgat_reads_edge_features_in_its_attention():
    """With edge_dims, a relation's edge features enter its attention logits only: zero
    features give the model without them (the same other parameters), others change the
    logits, and their gradient reaches every live slot's row and no dead one."""
    mb, feats, _, graph = _batch(edge_features=True)
    x = {t: jnp.asarray(feats[t])[ids] for t, ids in mb.nodes[-1].items()}
    kw = dict(hidden=8, num_layers=2, num_classes=5, heads=2, target_type="paper",
              relations=graph.relations)
    model = zg.make_hetero_model("rgat", **kw, edge_dims={CITES: 3})
    plain = zg.make_hetero_model("rgat", **kw)
    params = _init(model, x, mb, edges=_edge_rows(mb, graph))
    cites = [k for k in params["params"] if k.endswith("paper__cites__paper")]
    assert cites and all({"edge_kernel", "att_edge"} <= set(params["params"][k]) for k in cites)
    bare = {"params": {k: {n: w for n, w in v.items() if n not in ("edge_kernel", "att_edge")}
                       for k, v in params["params"].items()}}
    run = jax.jit(lambda p, e: model.apply(p, x, zg.typed_layers(mb, edges=e), train=False))
    without = plain.apply(bare, x, zg.typed_layers(mb), train=False)
    np.testing.assert_allclose(np.asarray(run(params, _edge_rows(mb, graph, 0.0))),
                               np.asarray(without), rtol=1e-6, atol=1e-6)
    edges = _edge_rows(mb, graph)
    assert not np.allclose(np.asarray(run(params, edges)), np.asarray(without), atol=1e-3)
    grads = jax.grad(lambda e: jnp.sum(run(params, e) ** 2))(edges)
    for hop, g in zip(mb.blocks, grads):
        live = np.asarray(hop[CITES].mask)
        rows = np.abs(np.asarray(g[CITES])).sum(-1)
        assert (rows[~live] == 0).all() and (rows[live] > 0).mean() > 0.5
    with pytest.raises(ValueError, match="model 'rsage' reads no edge features"):
        zg.make_hetero_model("rsage", **kw, edge_dims={CITES: 3})


def test_relational_sage_sums_a_sage_layer_per_relation():
    mb, feats, _, graph = _batch()
    x = {t: jnp.asarray(feats[t])[ids] for t, ids in mb.nodes[1].items()}
    model = zg.make_hetero_model("rsage", hidden=8, num_layers=1, num_classes=5,
                                 target_type="paper", relations=graph.relations)
    params = _init(model, x, mb, hops=1)  # the seeds' hop alone: one layer
    apply = jax.jit(lambda p, x, mb: model.apply(p, x, zg.typed_layers(mb)[-1:], train=False))
    out = np.asarray(apply(params, x, mb))
    want = 0.0
    assert set(mb.blocks[0]) == {WRITES, CITES}
    for rel, block in mb.blocks[0].items():  # into papers: writes, cites
        p = params["params"][f"convs_0_{'__'.join(rel)}"]["linear"]
        src = np.asarray(x[rel[0]])
        nbr, mask = np.asarray(block.nbr), np.asarray(block.mask)
        mean = (src[nbr] * mask[..., None]).sum(1) / np.maximum(mask.sum(1), 1)[:, None]
        both = np.concatenate([np.asarray(x["paper"])[:8], mean], 1)
        want = want + both @ np.asarray(p["kernel"]) + np.asarray(p["bias"])
    np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name, extra", [("rsage", {}), ("rgcn", {"num_bases": 2}),
                                         ("rgat", {"heads": 2})])
def test_models_give_logits_and_gradients_for_the_seeds(name, extra):
    mb, feats, labels, graph = _batch()
    authors = mb.nodes[-1]["author"]  # featureless: rows of a table kept outside the model
    table = 0.1 * jax.random.normal(jax.random.key(4), (40, 8))
    x = {"paper": jnp.asarray(feats["paper"])[mb.nodes[-1]["paper"]], "author": table[authors]}
    model = zg.make_hetero_model(name, hidden=8, num_layers=2, num_classes=5,
                                 target_type="paper", relations=graph.relations, **extra)
    if name == "rgcn":  # bases need one source width: papers 6 wide, author rows 8
        x["paper"] = jnp.pad(x["paper"], ((0, 0), (0, 2)))
    params = {"model": _init(model, x, mb), "author": table}
    opt = optax.adam(0.05)

    def loss(p):
        logits = model.apply(p["model"], {**x, "author": p["author"][authors]},
                             zg.typed_layers(mb), train=True,
                             rngs={"dropout": jax.random.key(2)})
        assert logits.shape == (8, 5)
        return optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()

    @jax.jit
    def step(p, s):
        value, grads = jax.value_and_grad(loss)(p)
        updates, s = opt.update(grads, s, p)
        return optax.apply_updates(p, updates), s, value, grads

    params, state, first, grads = step(params, opt.init(params))
    assert np.isfinite(float(first))
    assert float(jnp.abs(grads["author"]).sum()) > 0
    for _ in range(15):
        params, state, value, _ = step(params, state)
    assert float(value) < 0.7 * float(first)


def _rel_gat_reference(params, h_src, h_dst, nbr, mask, heads):
    """RelGATConv written out in NumPy, the destinations projected explicitly."""
    p = {k: np.asarray(v, np.float64) for k, v in params["params"].items() if k != "src"}
    w_src = np.asarray(params["params"]["src"]["kernel"], np.float64)
    z_src = (np.asarray(h_src, np.float64) @ w_src).reshape(len(h_src), heads, -1)
    z_dst = (np.asarray(h_dst, np.float64) @ p["dst"]).reshape(len(h_dst), heads, -1)
    out = np.zeros((len(h_dst), z_src.shape[1] * z_src.shape[2]))
    for c in range(len(h_dst)):
        live = nbr[c][mask[c]]
        if live.size:
            e = (z_src[live] * p["att_src"]).sum(-1) + (z_dst[c] * p["att_dst"][0]).sum(-1)
            e = np.where(e > 0, e, 0.2 * e)  # [k, H]
            a = np.exp(e - e.max(0)) / np.exp(e - e.max(0)).sum(0)
            out[c] = (a[..., None] * z_src[live]).sum(0).reshape(-1)
    return out + p["bias"]


@pytest.mark.parametrize("kind", ["ell", "edges"])
def test_rgat_projects_slot_rows_or_source_rows_alike(kind):
    """A relation with fewer edge slots than source rows projects the rows its slots
    read; source rows that no slot reads, appended, switch the path and change nothing.
    Both equal a NumPy GAT whose destinations are projected explicitly (the layer folds
    that projection into its attention term), for sampled blocks and whole-graph edges;
    in bfloat16 the two paths agree to its rounding."""
    rs = np.random.default_rng(5)
    c, k, s = 6, 3, 16  # at most 18 slots against 16 source rows: every row projected
    mask = rs.random((c, k)) < 0.7
    mask[0] = False  # a destination without edges
    nbr = rs.integers(0, s, (c, k))
    if kind == "ell":
        view = zg.EllView(jnp.asarray(nbr, jnp.int32), jnp.asarray(mask), jnp.ones(c, bool),
                          jnp.asarray(mask.sum(1), jnp.int32), jnp.zeros(s, jnp.int32))
    else:  # the live edges in CSR order, as whole-graph layers see them
        view = zg.EdgeView(jnp.asarray(nbr[mask], jnp.int32),
                           jnp.asarray(np.nonzero(mask)[0], jnp.int32),
                           jnp.ones(int(mask.sum()), bool), jnp.ones(c, bool),
                           jnp.asarray(mask.sum(1), jnp.int32), jnp.zeros(s, jnp.int32), c)
    h_src = jnp.asarray(rs.standard_normal((s, 5)), jnp.float32)
    h_dst = jnp.asarray(rs.standard_normal((c, 4)), jnp.float32)
    padded = jnp.concatenate([h_src, jnp.asarray(rs.standard_normal((30, 5)), jnp.float32)])
    conv = zg.RelGATConv(8, heads=2)
    params = conv.init(jax.random.key(0), h_src, h_dst, view)
    rows = conv.apply(params, h_src, h_dst, view)
    slots = conv.apply(params, padded, h_dst, view)  # 46 rows > 18 slots
    assert rows.shape == (c, 8)
    want = _rel_gat_reference(params, h_src, h_dst, nbr, mask, heads=2)
    np.testing.assert_allclose(np.asarray(rows), want, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(np.asarray(slots), want, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(np.asarray(rows[0]), np.asarray(params["params"]["bias"]))
    half = zg.RelGATConv(8, heads=2, dtype=jnp.bfloat16)
    rows16 = half.apply(params, h_src.astype(jnp.bfloat16), h_dst, view)
    slots16 = half.apply(params, padded.astype(jnp.bfloat16), h_dst, view)
    assert rows16.dtype == slots16.dtype == jnp.bfloat16
    np.testing.assert_allclose(np.asarray(slots16, np.float32), want, rtol=0.05, atol=0.05)
    np.testing.assert_allclose(np.asarray(rows16, np.float32), want, rtol=0.05, atol=0.05)


@pytest.mark.parametrize("name, edge_features", [("rgat", False), ("rsage", False),
                                                 ("rgat", True)])
def test_whole_graph_layers_give_the_sampled_forward_of_full_neighbourhoods(name,
                                                                             edge_features):
    """(Whole-graph views carry their relations' edge features, as sampled ones do.)"""
    # every neighbour: sampling is exact
    mb, feats, _, graph = _batch(fanouts=(-1, -1), edge_features=edge_features)
    model = zg.make_hetero_model(name, hidden=8, num_layers=2, num_classes=5, heads=2,
                                 target_type="paper", relations=graph.relations,
                                 edge_dims={CITES: 3} if edge_features else None)
    x = {t: jnp.asarray(feats[t])[ids] for t, ids in mb.nodes[-1].items()}
    x["author"] = jnp.pad(x["author"], ((0, 0), (0, 3)))  # (rgcn's bases want one width)
    edges = _edge_rows(mb, graph) if edge_features else ()
    params = _init(model, x, mb, edges=edges)
    sampled = jax.jit(lambda p, x, mb, e: model.apply(p, x, zg.typed_layers(mb, edges=e),
                                                      train=False))(params, x, mb, edges)
    h = {"paper": jnp.asarray(feats["paper"]),
         "author": jnp.pad(jnp.asarray(feats["author"]), ((0, 0), (0, 3)))}
    for i, types in enumerate((("paper", "author"), ("paper",))):  # levels 1, 0
        whole = zg.whole_graph_layer(graph, types)
        h = model.apply(params, i, h, whole, train=False, method=zg.HeteroGNN.layer)
    np.testing.assert_allclose(np.asarray(h["paper"])[:8], np.asarray(sampled), rtol=1e-4,
                               atol=1e-5)


def test_model_options_are_checked():
    with pytest.raises(ValueError, match="R-GAT needs heads >= 1 dividing hidden"):
        zg.make_hetero_model("rgat", hidden=10, num_layers=2, num_classes=3,
                             target_type="paper", relations=(), heads=4)
    with pytest.raises(ValueError, match="num_bases applies to rgcn"):
        zg.make_hetero_model("rsage", hidden=8, num_layers=2, num_classes=3,
                             target_type="paper", relations=(), num_bases=2)
    with pytest.raises(ValueError, match="unknown model 'hgt'"):
        zg.make_hetero_model("hgt", hidden=8, num_layers=2, num_classes=3, target_type="p",
                             relations=())


def test_rsage_applied_to_a_relation_it_was_not_initialised_with_names_it():
    """rsage reads each relation's parameters to build its one product: a relation
    that no batch sampled while initialising has none, and the error says which."""
    mb, feats, _, graph = _batch()
    x = {t: jnp.asarray(feats[t])[ids] for t, ids in mb.nodes[1].items()}
    model = zg.make_hetero_model("rsage", hidden=8, num_layers=1, num_classes=5,
                                 target_type="paper", relations=graph.relations)
    layer = zg.typed_layers(mb)[-1]
    without = zg.TypedLayer({CITES: layer.views[CITES]}, layer.num_dst)
    params = model.init(jax.random.key(1), x, (without,), train=False)
    with pytest.raises(ValueError, match="author__writes__paper: the model was initialised"):
        model.apply(params, x, (layer,), train=False)
