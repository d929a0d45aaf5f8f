"""The typed loaders over the device sampler. `HeteroNeighborLoader`: seeds covered once
an epoch, real edges of each relation, rows and targets fetched on the device, a small
envelope grown to the same batches, the typed node task's own sampling, a loop of its
own that learns, its refusals. `HeteroLinkNeighborLoader`: pairs covered once an epoch
(four batches a call, as one at a time), negatives, positives hidden, a loop that learns,
its refusals."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import zerognn_jax as zg
from zerognn_jax._src.data.shop import BUYS, make_shop


@pytest.fixture(scope="module")
def shop_clear():
    """The same graph with less noisy item features (link prediction needs the graph
    whatever the features: its users have none)."""
    return make_shop(400, 300, 4, per_user=8, dim=8, name="shop")


@pytest.fixture(scope="module")
def shop():
    """Users (featureless) buy items (8 features, labelled by group); items are similar
    to items (data/shop.py). Features this noisy leave an item's group to its
    neighbourhood: a loop's model that samples no neighbour scores about 0.57."""
    return make_shop(400, 300, 4, per_user=8, dim=8, noise=3.0, name="shop")


def _loader(shop, **kw):
    args = dict(fanouts=(4, 3), batch_size=64, key=jax.random.key(0),
                features=shop.features, targets=shop.labels, sample_ahead=1)
    return zg.HeteroNeighborLoader(shop.graph, ("item", shop.train_idx), **{**args, **kw})


def _seeds(batch) -> np.ndarray:
    return np.asarray(batch.seeds)[np.asarray(batch.seed_mask)]


def test_an_epoch_covers_the_seeds_with_real_edges_rows_and_targets(shop):
    loader = _loader(shop)
    batches = list(loader)
    assert len(batches) == len(loader) == -(-shop.train_idx.size // 64)
    seen = np.concatenate([_seeds(b) for b in batches])
    assert sorted(seen.tolist()) == sorted(shop.train_idx.tolist())
    assert [b.step for b in batches] == list(range(len(loader)))
    for b in batches[:2]:
        mb = b.minibatch
        live = np.asarray(b.seed_mask)
        np.testing.assert_array_equal(np.asarray(b.y)[live], shop.labels[_seeds(b)])
        ids, ok = np.asarray(b.input_nodes["item"]), np.asarray(mb.valid[-1]["item"])
        np.testing.assert_array_equal(np.asarray(b.x["item"])[ok], shop.features["item"][ids[ok]])
        assert not np.asarray(b.x["item"])[~ok].any() and "user" not in b.x
        for hop, level in enumerate(mb.blocks):  # every live slot is an edge of its relation
            for rel, block in level.items():
                g = shop.graph[rel]
                dst = np.asarray(mb.nodes[hop][rel[2]])
                src = np.asarray(mb.nodes[hop + 1][rel[0]])[np.asarray(block.nbr)]
                mask = np.asarray(block.mask)
                assert mask.any()
                for row in np.flatnonzero(mask.any(1))[:20]:
                    edges = g.indices[g.indptr[dst[row]]:g.indptr[dst[row] + 1]]
                    assert np.isin(src[row][mask[row]], edges).all()
    assert not np.array_equal(_seeds(next(iter(loader))), _seeds(batches[0]))  # epoch 1


def test_a_host_table_gives_the_rows_a_device_table_gives(shop):
    """`features` may hold `zg.HostTable`s, as `NeighborLoader`'s may (a typed loader's
    `jnp.asarray` failed on one with "float() argument must be ... not 'HostTable'"),
    laid out in any row order."""
    items = np.asarray(shop.features["item"], np.float32)
    order = np.random.default_rng(0).permutation(items.shape[0])
    position = np.argsort(order).astype(np.int32)  # node n at row position[n]
    for table in (zg.HostTable(items.copy()), zg.HostTable(items[order].copy(), position)):
        host, device = (next(iter(_loader(shop, features={"item": t})))
                        for t in (table, items))
        np.testing.assert_array_equal(np.asarray(host.x["item"]), np.asarray(device.x["item"]))
        assert np.asarray(host.x["item"]).any()


def test_a_small_envelope_grows_to_the_same_batches(shop):
    """A forced-small envelope overflows, grows (no level past its type's node count)
    and gives the conservative envelope's batches, sampled three at a time against one."""
    small_env = zg.TypedEnvelope("item", 64, ((("item", 64), ("user", 8)),) * 2)
    small = _loader(shop, envelope=small_env, shuffle=False, sample_ahead=3)
    large = _loader(shop, envelope="conservative", shuffle=False, sample_ahead=1)
    for a, b in zip(small.epoch(2), large.epoch(2), strict=True):
        for t in ("item", "user"):
            np.testing.assert_array_equal(np.asarray(a.minibatch.counts[t]),
                                          np.asarray(b.minibatch.counts[t]))
            n = int(a.minibatch.counts[t][-1])
            np.testing.assert_array_equal(np.asarray(a.minibatch.nodes[-1][t])[:n],
                                          np.asarray(b.minibatch.nodes[-1][t])[:n])
    assert small.envelope.level(2)["user"] > 8
    most = {t: -(-n // small.policy.multiple) * small.policy.multiple
            for t, n in shop.graph.num_nodes.items()}  # 384 items, 512 users (by 128)
    assert all(c <= most[t] for level in small.envelope.capacities for t, c in level)


def test_a_loop_of_its_own_learns(shop):
    """Relational SAGE trained with optax over the loader's batches: the items' groups
    (4 classes) are learnt well above chance on the test items."""
    loader = _loader(shop, batch_size=32, envelope="conservative")  # no calibration pass
    model = zg.make_hetero_model("rsage", hidden=16, num_layers=2, num_classes=4,
                                 target_type="item", relations=shop.graph.relations)
    users = jnp.zeros((shop.graph.num_nodes["user"], 16))  # featureless: constant rows

    def inputs(batch):
        return {**batch.x, "user": users[batch.input_nodes["user"]]}

    first = next(iter(loader.epoch(0)))
    params = model.init(jax.random.key(1), inputs(first), first.layers(), train=False)
    tx = optax.adam(1e-2)
    opt = tx.init(params)
    traces = []

    @jax.jit
    def step(params, opt, batch):
        traces.append(1)  # a Python side effect: runs once a trace
        def loss(p):
            logits = model.apply(p, inputs(batch), batch.layers(), train=True,
                                 rngs={"dropout": batch.dropout_key})
            ce = optax.softmax_cross_entropy_with_integer_labels(logits, batch.y)
            w = batch.seed_mask.astype(jnp.float32)
            return jnp.sum(ce * w) / jnp.maximum(jnp.sum(w), 1.0)
        value, grads = jax.value_and_grad(loss)(params)
        updates, opt = tx.update(grads, opt, params)
        return optax.apply_updates(params, updates), opt, value

    for _ in range(6):
        for batch in loader:
            params, opt, _ = step(params, opt, batch)
    assert len(traces) == 1 and len(loader._programs) == 1  # static shapes: one compile
    test = zg.HeteroNeighborLoader(shop.graph, ("item", shop.test_idx), fanouts=(4, 3),
                                   batch_size=64, key=3, shuffle=False,
                                   features=shop.features, targets=shop.labels,
                                   envelope="conservative", sample_ahead=1)
    right = total = 0
    for batch in test:
        logits = model.apply(params, inputs(batch), batch.layers(), train=False)
        live = np.asarray(batch.seed_mask)
        right += int((np.asarray(logits).argmax(1) == np.asarray(batch.y))[live].sum())
        total += int(live.sum())
    assert total == shop.test_idx.size and right / total > 0.8  # chance 0.25


def test_typed_loaders_name_what_they_got_where_they_take_a_graph(shop):
    """A HeteroDataset or a CSRGraph as the typed loaders' graph failed on its
    attributes (`num_nodes` read as a dict, `relations`)."""
    with pytest.raises(TypeError, match=r"^HeteroNeighborLoader takes a HeteroGraph as graph, "
                                        r"got HeteroDataset: pass dataset\.graph \(and "
                                        r"features=dataset\.features for batch\.x\)$"):
        zg.HeteroNeighborLoader(shop, ("item", np.arange(10)), fanouts=(2,), batch_size=8,
                                key=0)
    relation = shop.graph.relations[0]
    with pytest.raises(TypeError, match=r"^HeteroLinkNeighborLoader takes a HeteroGraph as "
                                        r"graph, got CSRGraph: a CSRGraph is sampled by "
                                        r"zg\.LinkNeighborLoader$"):
        zg.HeteroLinkNeighborLoader(shop.graph.graphs[0], relation, np.array([[0, 1]]),
                                    fanouts=(2,), batch_size=8, key=0)
    with pytest.raises(TypeError, match=r"^NeighborLoader takes a CSRGraph as graph, got "
                                        r"HeteroGraph: a HeteroGraph is sampled by "
                                        r"zg\.HeteroNeighborLoader$"):
        zg.NeighborLoader(shop.graph, np.arange(10), fanouts=(2,), batch_size=8, key=0)


@pytest.mark.parametrize("kwargs, match", [
    (dict(nodes=np.arange(5)), "nodes must be a pair \\(node type, ids\\)"),
    (dict(nodes=("paper", np.arange(5))), "nodes' type 'paper' is not a node type"),
    (dict(nodes=("item", np.arange(290, 301))), r"lie in \[0, 300\) \('item' ids\), "
                                                r"found \[290, 300\]"),
    (dict(nodes=("item", np.zeros((0,), int))), "non-empty 1-D integer array"),
    (dict(nodes=("item", np.arange(300) < 40)), r"^nodes' ids must be a non-empty 1-D integer "
                                                r"array, got bool\[300\]; a boolean mask\? "
                                                r"pass np\.flatnonzero\(mask\)$"),
    (dict(features={"shop": np.zeros((300, 2))}), "features has type 'shop'"),
    (dict(features={"item": np.zeros((299, 2))}), r"features\['item'\] must be \[300, d\]"),
    (dict(targets=np.zeros(400)), r"targets must have one row per 'item' node \(300\)"),
    (dict(batch_size=0), "batch_size must be an integer >= 1, got 0"),
    (dict(kernels="nope"), "bad kernel spec 'nope'"),
    pytest.param(dict(kernels="pallas"), "runs sample, relabel, gather, weighted_sum, max, "
                 "row_adam as Pallas kernels, which need an NVIDIA GPU",
                 marks=pytest.mark.skipif(jax.default_backend() == "gpu",
                                          reason="Pallas kernels run on a GPU")),
    (dict(envelope=zg.TypedEnvelope("user", 8, ())), "the envelope is for seeds 'user' with "
                                                     "level-0 capacity 8; the loader's are "
                                                     "'item' with 8"),
    (dict(envelope=zg.TypedEnvelope("item", 16, ())), "level-0 capacity 16; the loader's "
                                                      "are 'item' with 8"),
    (dict(envelope=zg.TypedEnvelope("item", 8, ((("item", 8),),))),
     r"the envelope's levels hold types \[\['item'\]\]; the fanouts sample "
     r"\[\['item', 'user'\]\]"),
    (dict(features=np.zeros((300, 2))), "features must be a dict {node type: float"),
])
def test_bad_input_is_refused_in_one_line(shop, kwargs, match):
    args = dict(nodes=("item", np.arange(10)), fanouts=(2,), batch_size=8, key=0,
                features=shop.features, targets=shop.labels, envelope="conservative")
    nodes = {**args, **kwargs}.pop("nodes")
    rest = {k: v for k, v in {**args, **kwargs}.items() if k != "nodes"}
    with pytest.raises(ValueError, match=match) as err:
        zg.HeteroNeighborLoader(shop.graph, nodes, **rest)
    assert "\n" not in str(err.value)


def test_link_batches_cover_the_pairs_draw_negatives_and_hide_positives(shop):
    split = zg.typed_link_split(shop.graph, BUYS, seed=0)
    loader = zg.HeteroLinkNeighborLoader(split.graph, "buys", split.train, fanouts=(4, 3),
                                         batch_size=128, key=0, num_negatives=2,
                                         features=shop.features, envelope="conservative")
    batches = list(loader)
    b = 128
    positives = np.concatenate([np.asarray(x.edges[:b])[np.asarray(x.weight[:b]) > 0]
                                for x in batches])
    assert sorted(map(tuple, positives.tolist())) == sorted(map(tuple, split.train.tolist()))
    batch = batches[0]
    mb, pairs, edges = batch.minibatch, np.asarray(batch.pairs), np.asarray(batch.edges)
    np.testing.assert_array_equal(np.asarray(mb.nodes[0]["user"])[pairs[:, 0]], edges[:, 0])
    np.testing.assert_array_equal(np.asarray(mb.nodes[0]["item"])[pairs[:, 1]], edges[:, 1])
    np.testing.assert_array_equal(np.asarray(batch.labels), np.repeat([1.0, 0.0], [b, 2 * b]))
    np.testing.assert_allclose(np.asarray(batch.weight), np.repeat([1.0, 0.5], [b, 2 * b]))
    assert (edges[b:, 0] == np.repeat(edges[:b, 0], 2)).all()  # destinations corrupted
    hidden = set(map(tuple, edges[:b].tolist()))
    for hop, level in enumerate(mb.blocks):  # no live slot joins a positive of the batch
        for rel in (BUYS, ("item", "rev_buys", "user")):
            block = level[rel]
            nbrs = np.asarray(mb.nodes[hop + 1][rel[0]])[np.asarray(block.nbr)]
            rows = np.broadcast_to(np.asarray(mb.nodes[hop][rel[2]])[:, None], nbrs.shape)
            users, items = (nbrs, rows) if rel == BUYS else (rows, nbrs)
            live = np.asarray(block.mask)
            assert live.any() and not any((u, i) in hidden
                                          for u, i in zip(users[live], items[live]))
    ids, ok = np.asarray(batch.input_nodes["item"]), np.asarray(mb.valid[-1]["item"])
    np.testing.assert_array_equal(np.asarray(batch.x["item"])[ok], shop.features["item"][ids[ok]])
    # sampled four at a time (the default), the batches are those sampled one at a time
    alone = zg.HeteroLinkNeighborLoader(split.graph, "buys", split.train, fanouts=(4, 3),
                                        batch_size=128, key=0, num_negatives=2,
                                        features=shop.features, envelope=loader.envelope,
                                        sample_ahead=1)
    assert loader.sample_ahead == 4 and len(batches) > 4
    for a, b in zip(batches, alone.epoch(0), strict=True):
        for x, y in zip(jax.tree_util.tree_leaves((a.minibatch, a.edges, a.pairs, a.x)),
                        jax.tree_util.tree_leaves((b.minibatch, b.edges, b.pairs, b.x)),
                        strict=True):
            np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


def test_a_link_loop_of_its_own_learns(shop_clear):
    """Relational SAGE's encoder and a dot decoder over the loader's batches: the
    split's test pairs score above their negatives (AUC above 0.7; random: 0.5)."""
    split = zg.typed_link_split(shop_clear.graph, BUYS, seed=0)
    loader = zg.HeteroLinkNeighborLoader(split.graph, BUYS, split.train, fanouts=(4, 3),
                                         batch_size=256, key=0, features=shop_clear.features,
                                         envelope="conservative", sample_ahead=1)
    model = zg.make_hetero_model("rsage", hidden=16, num_layers=2, num_classes=16,
                                 target_type="item", relations=split.graph.relations)
    users = jnp.zeros((shop_clear.graph.num_nodes["user"], 8))

    def embed(params, batch, train):
        x = {**batch.x, "user": users[batch.input_nodes["user"]]}
        return model.apply(params, x, batch.layers(), train=train, method="encode",
                           rngs={"dropout": batch.dropout_key} if train else {})

    first = next(iter(loader.epoch(0)))
    x0 = {**first.x, "user": users[first.input_nodes["user"]]}
    params = model.init(jax.random.key(1), x0, first.layers(), train=False, method="encode")
    tx = optax.adam(1e-2)
    opt = tx.init(params)

    def scores(params, batch, train):
        h = embed(params, batch, train)
        return jnp.sum(h["user"][batch.pairs[:, 0]] * h["item"][batch.pairs[:, 1]], -1)

    @jax.jit
    def step(params, opt, batch):
        def loss(p):
            bce = optax.sigmoid_binary_cross_entropy(scores(p, batch, True), batch.labels)
            return jnp.sum(bce * batch.weight) / jnp.sum(batch.weight)
        grads = jax.grad(loss)(params)
        updates, opt = tx.update(grads, opt, params)
        return optax.apply_updates(params, updates), opt

    for _ in range(4):
        for batch in loader:
            params, opt = step(params, opt, batch)
    test = zg.HeteroLinkNeighborLoader(split.graph, BUYS, split.test.pos, fanouts=(4, 3),
                                       batch_size=256, key=5, shuffle=False,
                                       exclude_seed_edges=False, features=shop_clear.features,
                                       envelope="conservative", sample_ahead=1)
    pos, neg = [], []
    for batch in test:
        s, w = np.asarray(scores(params, batch, False)), np.asarray(batch.weight)
        pos.append(s[:256][w[:256] > 0])
        neg.append(s[256:][w[256:] > 0])
    assert zg.roc_auc(np.concatenate(pos), np.concatenate(neg)) > 0.7


@pytest.mark.parametrize("kwargs, match", [
    (dict(relation="nope"), "relation 'nope' names no relation of the graph"),
    (dict(relation=("user", "sells", "item")), "is not a relation of the graph"),
    (dict(edges=np.zeros((3,), int)), r"edges must be a non-empty integer \[E, 2\] array"),
    (dict(edges=np.array([[0, 300]])), r"edges' destination ids must lie in \[0, 300\) "
                                       r"\('item' ids\), found \[300, 300\]"),
    (dict(edges=np.array([[400, 0]])), r"edges' source ids must lie in \[0, 400\)"),
    (dict(negative_mode="nope"), "negative mode must be one of destination, pairs, shared, "
                                "got .nope."),
    # the pairs where the relation goes (PyG's order): NumPy's "truth value" error before
    (dict(relation=np.array([[0, 1], [2, 3]]), edges="buys"),
     r"relation must be a \(src, name, dst\) triple or a relation's name, got ndarray: the "
     r"arguments are \(graph, relation, edges\)"),
])
def test_bad_link_input_is_refused_in_one_line(shop, kwargs, match):
    args = {"relation": "buys", "edges": np.array([[0, 1], [2, 3]]), **kwargs}
    with pytest.raises(ValueError, match=match) as err:
        zg.HeteroLinkNeighborLoader(shop.graph, args.pop("relation"), args.pop("edges"),
                                    fanouts=(2,), batch_size=8, key=0,
                                    envelope="conservative", **args)
    assert "\n" not in str(err.value)


def test_a_model_given_no_rows_of_a_type_it_reads_says_which():
    """It was a bare KeyError from inside the model."""
    ds = zg.make_hetero_dataset(
        "toy", {"author": 4, "paper": 8},
        {("author", "writes", "paper"): (np.array([0, 1, 3]), np.array([0, 2, 4]))},
        target_type="paper", labels=np.arange(8) % 2, train_idx=[0, 1, 2, 3], val_idx=[4],
        test_idx=[5], features={"paper": np.ones((8, 3), np.float32)}, add_reverse=True)
    batch = next(iter(zg.HeteroNeighborLoader(ds.graph, ("paper", ds.train_idx),
                                              fanouts=(2, 2), batch_size=4, key=0,
                                              features=ds.features)))
    model = zg.make_hetero_model("rsage", hidden=8, num_layers=2, num_classes=2,
                                 target_type="paper", relations=ds.graph.relations)
    with pytest.raises(ValueError, match="^x has no rows of node type 'author', which the "
                                         "first layer reads"):
        model.init(jax.random.key(0), batch.x, batch.layers(), train=False)

