"""The typed loader over the device sampler (`HeteroNeighborLoader`): seeds covered once an
epoch, real edges of each relation, rows and targets fetched on the device, a small
envelope grown to the same batches, the typed node task's own sampling, a loop of its
own that learns, and its refusals."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import zerognn_jax as zg
from zerognn_jax._src.data.shop import make_shop
from zerognn_jax._src.sampling.seeds import ordered_items
from zerognn_jax._src.sampling.typed_minibatch import sample_typed_step


@pytest.fixture(scope="module")
def shop():
    """Users (featureless) buy items (8 features, labelled by group); items are similar
    to items (data/shop.py)."""
    return make_shop(400, 300, 4, per_user=8, dim=8, name="shop")


def _loader(shop, **kw):
    args = dict(fanouts=(4, 3), batch_size=64, key=jax.random.key(0),
                features=shop.features, targets=shop.labels)
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


def test_a_small_envelope_grows_to_the_same_batches_as_the_task_samples(shop):
    """A forced-small envelope overflows, grows and gives the conservative envelope's
    batches; both are what the typed node task's step samples for that seed and epoch."""
    small_env = zg.TypedEnvelope("item", 64, ((("item", 64), ("user", 8)),) * 2)
    small = _loader(shop, envelope=small_env, shuffle=False)
    large = _loader(shop, envelope="conservative", shuffle=False)
    order = ordered_items(jnp.asarray(shop.train_idx), 64)  # padded with -1, as unshuffled
    task_step = jax.jit(lambda step: sample_typed_step(
        large.graph, order, step, seed=large.seed, epoch=2, batch_size=64,
        config=large.sampler, envelope=large.envelope, kernels=large.kernels).mb.nodes[-1])
    steps = zip(range(2), small.epoch(2), large.epoch(2))  # the first batch overflows
    for step, a, b in steps:
        ref = task_step(jnp.int32(step))
        for t in ("item", "user"):
            np.testing.assert_array_equal(np.asarray(a.minibatch.counts[t]),
                                          np.asarray(b.minibatch.counts[t]))
            n = int(a.minibatch.counts[t][-1])
            for nodes in (b.minibatch.nodes[-1], ref):
                np.testing.assert_array_equal(np.asarray(a.minibatch.nodes[-1][t])[:n],
                                              np.asarray(nodes[t])[:n])
    assert small.envelope.level(2)["user"] > 8


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

    @jax.jit
    def step(params, opt, batch):
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
    test = zg.HeteroNeighborLoader(shop.graph, ("item", shop.test_idx), fanouts=(4, 3),
                                   batch_size=64, key=3, shuffle=False,
                                   features=shop.features, targets=shop.labels,
                                   envelope="conservative")
    right = total = 0
    for batch in test:
        logits = model.apply(params, inputs(batch), batch.layers(), train=False)
        live = np.asarray(batch.seed_mask)
        right += int((np.asarray(logits).argmax(1) == np.asarray(batch.y))[live].sum())
        total += int(live.sum())
    assert total == shop.test_idx.size and right / total > 0.6  # chance: 0.25


@pytest.mark.parametrize("kwargs, match", [
    (dict(nodes=np.arange(5)), "nodes must be a pair \\(node type, ids\\)"),
    (dict(nodes=("paper", np.arange(5))), "nodes' type 'paper' is not a node type"),
    (dict(nodes=("item", np.arange(290, 301))), r"lie in \[0, 300\) \('item' ids\), "
                                                r"found \[290, 300\]"),
    (dict(nodes=("item", np.zeros((0,), int))), "non-empty 1-D integer array"),
    (dict(features={"shop": np.zeros((300, 2))}), "features has type 'shop'"),
    (dict(features={"item": np.zeros((299, 2))}), r"features\['item'\] must be \[300, d\]"),
    (dict(targets=np.zeros(400)), r"targets must have one row per 'item' node \(300\)"),
    (dict(batch_size=0), "batch_size must be >= 1, got 0"),
    (dict(kernels="nope"), "bad kernel spec 'nope'"),
    (dict(envelope=zg.TypedEnvelope("user", 64, ())), "the envelope is for seeds of type "
                                                      "'user'"),
])
def test_bad_input_is_refused_in_one_line(shop, kwargs, match):
    args = dict(nodes=("item", np.arange(10)), fanouts=(2,), batch_size=8, key=0,
                features=shop.features, targets=shop.labels, envelope="conservative")
    nodes = {**args, **kwargs}.pop("nodes")
    rest = {k: v for k, v in {**args, **kwargs}.items() if k != "nodes"}
    with pytest.raises(ValueError, match=match) as err:
        zg.HeteroNeighborLoader(shop.graph, nodes, **rest)
    assert "\n" not in str(err.value)
