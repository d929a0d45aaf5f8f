"""Sampled inference against exact inference, for every layout, sampler and batch size.

Each layout (tree, dedup with a flat outer hop, dedup) samples the same subgraphs, so
with fanouts that reach every neighbour sampled logits must equal exact layer-wise ones,
and at the training fanouts sampled accuracy must stay near exact accuracy. The graph is
small against the evaluation batches: a tree's outer level holds many times the graph's
nodes and the nodes span several batches smaller than, equal to and larger than the
training batch.

Each sampler runs each layout once and each batch size once (a diagonal of the grid);
the uniform sampler also runs the tree layout at every batch size.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import random_graph

import zerognn_jax as zg
from zerognn_jax import NeighborLoader, TrainConfig, make_dataset, train, views_for
from zerognn_jax._src.nn.views import EllView, mean_weights
from zerognn_jax._src.training.evaluate import layerwise_logits, node_embeddings, sampled_logits
from zerognn_jax._src.training.tasks.node import accuracy

LAYOUTS = {"tree": dict(dedup=False, flat_outer=False),
           "flat": dict(dedup=True, flat_outer=True),
           "dedup": dict(dedup=True, flat_outer=False)}
TRAIN_BATCH = 32
EVAL_BATCHES = (TRAIN_BATCH // 2, TRAIN_BATCH, 4 * TRAIN_BATCH)


def _cases(sampler: str) -> list[tuple[str, int]]:
    """(layout, evaluation batch size): the diagonal (every layout and every batch size
    once), and for the uniform sampler the tree layout (where sampled evaluation once
    went wrong) at every batch size too."""
    diagonal = list(zip(LAYOUTS, EVAL_BATCHES))
    if sampler == "uniform":
        return diagonal + [("tree", b) for b in EVAL_BATCHES if ("tree", b) not in diagonal]
    return diagonal


def _dataset(name: str, num_nodes: int, num_edges: int, seed: int):
    """Random weighted edges; features that carry a 4-class label; half the nodes train,
    a tenth validate, the rest test."""
    rs = np.random.default_rng(seed)
    g = random_graph(num_nodes, num_edges, seed=seed)
    labels = rs.integers(0, 4, num_nodes)
    feats = rs.normal(size=(num_nodes, 6)).astype(np.float32) + labels[:, None]
    weights = rs.uniform(0.5, 2.0, g.num_edges).astype(np.float32)
    perm = rs.permutation(num_nodes)
    cut = num_nodes // 2, num_nodes // 2 + num_nodes // 10
    return make_dataset(name, g.indptr, g.indices, feats, labels, perm[:cut[0]],
                        perm[cut[0]:cut[1]], perm[cut[1]:], 4, weights=weights)


@pytest.fixture(scope="module")
def graph_400():
    """400 nodes of degree <= 16: all-neighbour trees of a batch are tens of graphs."""
    return _dataset("g400", 400, 1600, seed=7)


@pytest.fixture(scope="module")
def graph_3000():
    """3,000 nodes (1,200 test nodes: a node is 0.08 points of accuracy)."""
    return _dataset("g3000", 3000, 15000, seed=8)


@pytest.fixture(scope="module")
def all_neighbours(graph_400):
    """The run on graph_400 with fanouts that reach every neighbour, one per sampler,
    built once and shared by the tests that read it (they do not modify it). Its
    parameters are the initial ones (epochs=0): the equalities hold for any parameters,
    and these give logits that differ from node to node (checked where they are read)."""
    cache = {}

    def trained(sampler: str):
        if sampler not in cache:
            max_degree = graph_400.graph.max_degree()
            cache[sampler] = _trained(graph_400, sampler, (max_degree, max_degree), epochs=0)
        return cache[sampler]
    return trained


def _trained(dataset, sampler: str, fanouts, epochs: int = 1):
    cfg = TrainConfig(hidden=16, layers=2, fanouts=fanouts, batch_size=TRAIN_BATCH,
                      epochs=epochs, lr=0.01, sampler=sampler, dedup=False, eval_mode="none",
                      progress=False)
    return train(cfg, dataset)


def _with_layout(program, layout: str):
    return dataclasses.replace(program,
                               sampler=dataclasses.replace(program.sampler, **LAYOUTS[layout]))


@pytest.mark.parametrize("sampler", ["uniform", "weighted", "labor"])
def test_sampled_logits_reaching_every_neighbour_equal_exact(graph_400, all_neighbours,
                                                            sampler):
    max_degree = graph_400.graph.max_degree()
    # The largest batch's tree outer level: positions, many times the graph's nodes.
    assert 4 * TRAIN_BATCH * (1 + max_degree) ** 2 > 50 * graph_400.graph.num_nodes
    res = all_neighbours(sampler)
    exact = np.asarray(layerwise_logits(res.program, res.variables, res.data))
    assert exact.std(axis=0).min() > 1e-2  # not a constant the layouts could all return
    nodes = np.arange(graph_400.graph.num_nodes)
    for layout, batch in _cases(sampler):
        program = _with_layout(res.program, layout)
        got = sampled_logits(program, res.variables, res.data, nodes, batch_size=batch)
        np.testing.assert_allclose(np.asarray(got), exact, rtol=1e-4, atol=1e-4,
                                   err_msg=f"{sampler} {layout} eval batch {batch}")


def test_sampled_logits_halve_the_batch_the_device_cannot_hold(graph_400, all_neighbours,
                                                              monkeypatch):
    """A batch that runs the device out of memory is run again at half the size, with a
    warning; every neighbour reached, the logits still equal exact ones."""
    from zerognn_jax._src.training import evaluate

    res = all_neighbours("uniform")
    exact = np.asarray(layerwise_logits(res.program, res.variables, res.data))
    run, sizes, most = evaluate._sampled_pass, [], [TRAIN_BATCH]

    def short_of_memory(*args, envelope, **kwargs):
        sizes.append(envelope.batch_size)
        if envelope.batch_size > most[0]:
            raise jax.errors.JaxRuntimeError("RESOURCE_EXHAUSTED: Out of memory")
        return run(*args, envelope=envelope, **kwargs)

    monkeypatch.setattr(evaluate, "_sampled_pass", short_of_memory)
    nodes = np.arange(graph_400.graph.num_nodes)
    with pytest.warns(UserWarning, match=f"at {2 * TRAIN_BATCH} seeds a batch; running "
                                         f"again at {TRAIN_BATCH}"):
        got = sampled_logits(res.program, res.variables, res.data, nodes,
                             batch_size=4 * TRAIN_BATCH)
    # 400 nodes: 4 and 7 batches a call, then 13 in two calls of 8
    assert sizes == [4 * TRAIN_BATCH, 2 * TRAIN_BATCH, TRAIN_BATCH, TRAIN_BATCH]
    np.testing.assert_allclose(np.asarray(got), exact, rtol=1e-4, atol=1e-4)
    # a served request's batch is rounded up to a power of two, but a halved batch is
    # not rounded up again (200 had run at 256, giving back most of the halving)
    sizes.clear()
    most[0] = 150
    with pytest.warns(UserWarning, match="at 200 seeds a batch; running again at 100"
                      ) as caught:
        got = sampled_logits(res.program, res.variables, res.data, nodes, batch_size=600,
                             bucketed=True)
    assert sizes == [512, 200, 100]
    # the warning names the batch that ran (400 nodes, rounded up), not the one asked
    assert "out of memory at 512 seeds a batch; running again at 200" in str(caught[0].message)
    np.testing.assert_allclose(np.asarray(got), exact, rtol=1e-4, atol=1e-4)


def test_splits_of_different_sizes_share_one_sampled_pass(graph_400, monkeypatch):
    """Each split of a sampled evaluation compiled a pass of its own; they now run in
    calls of the same number of batches of one batch size, one program for all, and
    each split's logits are those of one pass over its batches alone."""
    from zerognn_jax._src.sampling.envelope import conservative
    from zerognn_jax._src.sampling.seeds import ordered_items
    from zerognn_jax._src.training import evaluate

    res = _trained(graph_400, "uniform", (3, 2), epochs=0)
    parts = [np.arange(0, 200), np.arange(200, 240), np.arange(240, 400)]  # 13, 3, 10 batches
    env = conservative(16, res.program.sampler.slots, 400)
    one_pass = lambda nodes: np.asarray(evaluate._sampled_pass(
        res.program, res.variables, res.data, ordered_items(jnp.asarray(nodes), 16),
        jnp.uint32(3), envelope=env)).reshape(-1, 4)[:nodes.size]
    alone = [one_pass(nodes) for nodes in parts]
    run, programs = evaluate._sampled_pass, []

    def record(*args, envelope, **kwargs):
        programs.append((args[3].shape, envelope))
        return run(*args, envelope=envelope, **kwargs)

    monkeypatch.setattr(evaluate, "_sampled_pass", record)
    predictor = evaluate.Predictor(res.program, res.variables, res.data, "sampled", 16, 3)
    got = predictor.split_outputs(parts)
    assert len(programs) == 10 and len(set(programs)) == 1  # 5 + 1 + 4 calls of 3 batches
    for want, out in zip(alone, got):
        assert len(np.unique(want.round(5), axis=0)) > len(want) // 2  # rows differ
        np.testing.assert_array_equal(np.asarray(out), want)


def test_a_nodes_sampled_row_is_the_same_in_any_request(graph_400):
    """Evaluation keyed each batch's draws by its step, so a node's sampled row followed
    its place in the request and the batch size (a request of one node got another
    sample than the evaluation's). Every batch now draws with one step's keys, and a
    node's sample, drawn by its id, is its own; with fanouts below the degrees the rows
    are still samples (not the exact rows)."""
    res = _trained(graph_400, "uniform", (3, 2), epochs=0)
    nodes = np.random.default_rng(0).permutation(400)[:90]
    rows = np.asarray(zg.predict(res, nodes, mode="sampled", batch_size=16, seed=5))
    for at, batch in ((np.arange(90)[::-1], 7), (np.arange(40, 43), 2), ([0], 64)):
        got = np.asarray(zg.predict(res, nodes[at], mode="sampled", batch_size=batch,
                                    seed=5))
        np.testing.assert_allclose(got, rows[at], rtol=1e-5, atol=1e-6)
    other = np.asarray(zg.predict(res, nodes, mode="sampled", batch_size=16, seed=6))
    exact = np.asarray(zg.predict(res, nodes))
    assert not np.allclose(other, rows) and not np.allclose(exact, rows)


def test_sampled_logits_batch_is_at_most_the_nodes(all_neighbours, monkeypatch):
    """An evaluation batch above the nodes asked for runs as one batch of those nodes:
    the buffers follow the batch, and `--eval-batch-size 99999999999` once ran the host
    out of memory after training."""
    from zerognn_jax._src.training import evaluate

    res = all_neighbours("uniform")
    run, sizes = evaluate._sampled_pass, []

    def record(*args, envelope, **kwargs):
        sizes.append(envelope.batch_size)
        return run(*args, envelope=envelope, **kwargs)

    monkeypatch.setattr(evaluate, "_sampled_pass", record)
    nodes = np.arange(100)
    got = sampled_logits(res.program, res.variables, res.data, nodes, batch_size=10**11)
    assert sizes == [100] and got.shape[0] == 100


def test_predictions_of_every_request_size_share_a_few_programs(all_neighbours,
                                                                 monkeypatch):
    """`zg.predict` compiled the sampled pass again for every new number of nodes (a
    probe: 2-3 s each on a CPU, 20 s on a typed graph). A serving call rounds the batch
    up to a power of two and the steps to shared sizes (`bucket`); each node's sample is
    the same."""
    from zerognn_jax._src.training import evaluate

    res = all_neighbours("uniform")
    run, served, plain = evaluate._sampled_pass, [], []
    shapes = [served]

    def record(program, variables, data, padded, seed, *, envelope):
        shapes[-1].append((padded.shape[0], envelope.batch_size))
        return run(program, variables, data, padded, seed, envelope=envelope)

    monkeypatch.setattr(evaluate, "_sampled_pass", record)
    rng = np.random.default_rng(0)
    for n, batch in ((9, 96), (10, 96), (65, 8), (73, 8)):
        nodes = rng.choice(400, n, replace=False)
        shapes.append(served)
        got = np.asarray(zg.predict(res, nodes, mode="sampled", batch_size=batch))
        assert got.shape[0] == n
        shapes.append(plain)
        # the same samples; a product over another row count may round otherwise
        np.testing.assert_allclose(got, sampled_logits(res.program, res.variables,
                                                       res.data, nodes, batch_size=batch),
                                   rtol=1e-5, atol=1e-6)
    # (rows, batch) of each call: 9 and 10 nodes in a batch of 16, a power of two (9 and
    # 10 plain); 65 and 73 nodes in 10 batches of 8 (9 and 10 plain), run 8 batches a call
    assert served == [(16, 16), (16, 16)] + [(64, 8)] * 4
    assert plain == [(9, 9), (10, 10)] + [(64, 8)] * 4


@pytest.mark.parametrize(("nodes", "options", "message"), [
    (np.array([2**32 + 5]), {}, r"nodes must lie in \[0, 400\), found \[4294967301, "),
    ([3, -7, 400], {}, r"nodes must lie in \[0, 400\), found \[-7, 400\]"),
    ([2.7], {}, r"nodes must be a 1-D integer array, got float64\[1\]$"),
    ([[1, 2]], {}, r"nodes must be a 1-D integer array, got int64\[1, 2\]$"),
    (np.arange(400) < 9, {}, r"nodes must be a 1-D integer array, got bool\[400\]"
                             r"; a boolean mask\? pass np\.flatnonzero\(mask\)$"),
    ([1], {"batch_size": 0}, "batch_size must be an integer >= 1, got 0"),
    ([1], {"seed": -1}, r"seed must be an integer in \[0, 2\*\*32\), got -1"),
])
def test_sampled_logits_refuses_what_it_would_misread(all_neighbours, nodes, options,
                                                      message):
    """Ids out of range (an int64 past int32 once wrapped to another node), non-integer
    ids, and a bad batch size or seed are named before any sampling."""
    res = all_neighbours("uniform")
    with pytest.raises(ValueError, match=message):
        sampled_logits(res.program, res.variables, res.data, nodes,
                       **{"batch_size": 8, **options})


def test_predict_names_a_boolean_mask_given_for_node_ids(all_neighbours):
    """PyG's test_mask where zg.predict takes ids: refused (as ids it would be nodes 0
    and 1), saying how to get its ids."""
    res = all_neighbours("uniform")
    mask = np.arange(400) >= 300
    with pytest.raises(ValueError, match=r"^nodes must be a 1-D integer array, got "
                                         r"bool\[400\]; a boolean mask\? pass "
                                         r"np\.flatnonzero\(mask\)$"):
        zg.predict(res, mask)
    assert zg.predict(res, np.flatnonzero(mask)).shape[0] == 100


def test_predict_names_a_dataset_given_for_node_ids(all_neighbours, graph_400):
    """`zg.predict(result, dataset)`, as if it took the data (it reads the run's own): the
    message names the type, where it named a 0-d object array ("got object[]")."""
    res = all_neighbours("uniform")
    for value, what in ((graph_400, "a value of type Dataset"), (None, "None"),
                        (7, "a value of type int")):
        with pytest.raises(ValueError, match=rf"^nodes must be a 1-D integer array of ids, "
                                             rf"got {what}$"):
            zg.predict(res, value)


def test_loader_tree_batches_read_by_position_equal_exact(graph_400, all_neighbours):
    """A user's loop over tree batches, views read by position for inference."""
    max_degree = graph_400.graph.max_degree()
    res = all_neighbours("uniform")
    exact = np.asarray(layerwise_logits(res.program, res.variables, res.data))
    loader = NeighborLoader(graph_400.graph, np.arange(400), fanouts=(max_degree,) * 2,
                            batch_size=64, key=0, dedup=False, sample_ahead=1)
    features = jnp.asarray(graph_400.features)
    seen = 0
    for batch in loader:
        mb = batch.minibatch
        x = jnp.where(mb.valid[-1][:, None], features[mb.nodes[-1]], 0.0)
        views = views_for(mb, positional=(True, True), inference=True)
        out = res.program.model.apply(res.variables, x, views, train=False)
        valid = np.asarray(mb.valid[0])
        seeds = np.asarray(mb.nodes[0])[valid]
        np.testing.assert_allclose(np.asarray(out)[valid], exact[seeds], rtol=1e-4, atol=1e-4)
        seen += len(seeds)
    assert seen == 400


@pytest.mark.parametrize("sampler", ["uniform", "weighted", "labor"])
def test_sampled_accuracy_at_training_fanouts_is_near_exact(graph_3000, sampler):
    ds = graph_3000
    # Sampling's own noise grows as fanouts fall below the degrees (mean 10 here): at
    # (5, 5) sampled accuracy sat ~3 points below exact in every layout, at (8, 8) within
    # 1.2 (products-like's [15, 10, 5] at mean degree 50: 0.5 points on an H100).
    res = _trained(ds, sampler, (8, 8), epochs=3)
    # The largest batch's tree outer level exceeds the graph's nodes.
    assert 4 * TRAIN_BATCH * 9 * 9 > ds.graph.num_nodes
    exact_logits = layerwise_logits(res.program, res.variables, res.data)
    exact = accuracy(np.asarray(exact_logits)[ds.test_idx], ds.labels[ds.test_idx])
    assert exact > 0.6  # 4 classes; the model has learned
    for layout, batch in _cases(sampler):
        program = _with_layout(res.program, layout)
        logits = sampled_logits(program, res.variables, res.data, ds.test_idx,
                                batch_size=batch)
        got = accuracy(logits, ds.labels[ds.test_idx])
        assert abs(got - exact) <= 0.02 + 1e-9, (sampler, layout, batch, got, exact)


def _positional_sage_inputs(c: int, k: int, width: int, seed: int = 0):
    rs = np.random.default_rng(seed)
    h = jnp.asarray(rs.normal(size=(c * (1 + k), width)), jnp.float32)
    deg = rs.integers(0, 2 * k, c)
    mask = np.arange(k)[None, :] < deg[:, None]
    nbr = np.where(mask, c + np.arange(c * k).reshape(c, k), 0).astype(np.int32)
    w = jnp.asarray(rs.normal(size=(2 * width, width)) / np.sqrt(2 * width), jnp.float32)
    return h, jnp.asarray(nbr), jnp.asarray(mask), jnp.asarray(deg, jnp.int32), w


def _sage_layer(h, nbr, mask, deg, w, *, inference: bool):
    """SAGE's [h_dst ; mean of the slots] @ W over a positional block."""
    view = EllView(nbr, mask, jnp.ones(nbr.shape[0], bool), deg,
                   jnp.zeros(h.shape[0], jnp.int32), positional=True,
                   pin_aggregates=inference)
    agg = view.weighted_sum(h[:, None, :], mean_weights(view))[:, 0, :]
    return jnp.concatenate([h[: nbr.shape[0]], agg], axis=-1) @ w


@pytest.mark.gpu
@pytest.mark.parametrize("c, k, width", [(1024, 15, 256), (16384, 10, 256), (2048, 5, 100)])
def test_positional_sage_layer_on_gpu_matches_cpu(c, k, width):
    """The shapes whose inference XLA 0.11.2 miscompiled on an H100 without the barrier
    (relative error ~1 at 256 features), and their training form (differentiated, no
    barrier): loss and gradient."""
    args = _positional_sage_inputs(c, k, width)
    on_cpu = jax.device_put(args, jax.devices("cpu")[0])  # runs where its inputs are
    infer = jax.jit(lambda *a: _sage_layer(*a, inference=True))
    ref, got = np.asarray(infer(*on_cpu)), np.asarray(infer(*args))
    assert np.abs(got - ref).max() <= 1e-2 * np.abs(ref).max()
    loss = lambda h, *rest: jnp.sum(_sage_layer(h, *rest, inference=False) ** 2)
    step = jax.jit(jax.value_and_grad(loss))
    (ref_loss, ref_grad), (got_loss, got_grad) = step(*on_cpu), step(*args)
    assert abs(float(got_loss) - float(ref_loss)) <= 1e-3 * abs(float(ref_loss))
    ref_grad = np.asarray(ref_grad)
    assert np.abs(np.asarray(got_grad) - ref_grad).max() <= 1e-2 * np.abs(ref_grad).max()


def test_link_sampled_embeddings_reaching_every_neighbour_equal_exact(graph_400):
    """Link evaluation's sampled node embeddings, under each layout. The parameters are
    the initial ones (epochs=0, a fifth of the time of one epoch): the equality holds for
    any parameters, and these give embeddings that differ from node to node."""
    max_degree = graph_400.graph.max_degree()
    cfg = TrainConfig(task="link", hidden=16, layers=2, fanouts=(max_degree, max_degree),
                      batch_size=64, epochs=0, eval_mode="none", progress=False)
    res = train(cfg, graph_400)
    exact = np.asarray(node_embeddings(res.program, res.variables, res.data, mode="full"))
    assert exact.std(axis=0).min() > 1e-2  # not a constant the layouts could all return
    for layout in LAYOUTS:
        program = _with_layout(res.program, layout)
        got = node_embeddings(program, res.variables, res.data, mode="sampled", batch_size=48)
        np.testing.assert_allclose(np.asarray(got), exact, rtol=1e-4, atol=1e-4,
                                   err_msg=layout)
