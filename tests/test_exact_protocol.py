"""Exact inference for any model: the per-layer protocol (nn/layerwise.py) in Linen and
NNX, the one-line reason and the sampled fallback for a model without it, and a link
encoder without `layer()` (issue #35 item 2)."""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import assert_same_runs, labelled_dataset, mean_layer
from flax import nnx

import zerognn_jax as zg
from zerognn_jax._src.training import evaluate

N, D, CLASSES = 240, 8, 3


@pytest.fixture(scope="module")
def dataset():
    return labelled_dataset("protocol", N, D, CLASSES, seed=5, edges=900)


def config(**changes):
    # No epoch: what is checked is evaluation (epochs=0 still evaluates once).
    base = dict(hidden=8, layers=2, fanouts=(4, 4), batch_size=64, epochs=0, progress=False,
                eval_batch_size=64, envelope="conservative")
    return zg.TrainConfig(**{**base, **changes})


class LinenLayers(nn.Module):
    """A Linen model with the per-layer protocol: `setup`, `layer`, `num_layers`."""

    hidden: int
    out: int
    num_layers: int = 2

    def setup(self):
        self.dense = [nn.Dense(self.out if i == self.num_layers - 1 else self.hidden)
                      for i in range(self.num_layers)]

    def layer(self, i, h_src, h_dst, view, *, train):
        h = mean_layer(self.dense[i], h_src, h_dst, view)
        return h if i == self.num_layers - 1 else nn.relu(h)

    def __call__(self, x, views, *, train):
        for i, view in enumerate(views):
            x = self.layer(i, x, None, view, train=train)
        return x


class CompactLayers(nn.Module):
    """The same with `@nn.compact` on `layer`, its Dense named by the layer."""

    hidden: int
    out: int
    num_layers: int = 2

    @nn.compact
    def layer(self, i, h_src, h_dst, view, *, train):
        last = i == self.num_layers - 1
        dense = nn.Dense(self.out if last else self.hidden, name=f"dense_{i}")
        h = mean_layer(dense, h_src, h_dst, view)
        return h if last else nn.relu(h)

    def __call__(self, x, views, *, train):
        for i, view in enumerate(views):
            x = self.layer(i, x, None, view, train=train)
        return x


class NNXLayers(nnx.Module):
    """The same in NNX: the bridge forwards `layer` and `num_layers`."""

    def __init__(self, din, hidden, out, *, rngs):
        self.num_layers = 2
        self.dense = nnx.List([nnx.Linear(2 * din, hidden, rngs=rngs),
                               nnx.Linear(2 * hidden, out, rngs=rngs)])
        self.drop = nnx.Dropout(0.3, rngs=rngs)

    def layer(self, i, h_src, h_dst, view, *, train):
        h = mean_layer(self.dense[i], h_src, h_dst, view)
        return h if i == self.num_layers - 1 else self.drop(nnx.relu(h))

    def __call__(self, x, views, *, train):
        for i, view in enumerate(views):
            x = self.layer(i, x, None, view, train=train)
        return x


class NoLayers(nn.Module):
    """A model that offers only `__call__`."""

    out: int

    @nn.compact
    def __call__(self, x, views, *, train):
        for view in views:
            x = mean_layer(nn.Dense(self.out), x, None, view)
        return x


def _full_neighbourhood(result, dataset):
    """Every node's outputs from full neighbourhoods (the exact values, sampled)."""
    import dataclasses

    sampler = zg.SamplerConfig((-1, -1)).resolve(dataset.graph.max_degree())
    program = dataclasses.replace(result.program, sampler=sampler)
    return zg.sampled_logits(program, result.variables, result.data, np.arange(N),
                             batch_size=N)


@pytest.mark.parametrize("kind", ["linen", "compact", "nnx"])
def test_a_model_with_the_protocol_gets_exact_evaluation(kind, dataset):
    model = {"linen": lambda: LinenLayers(8, CLASSES),
             "compact": lambda: CompactLayers(8, CLASSES),
             "nnx": lambda: NNXLayers(D, 8, CLASSES, rngs=nnx.Rngs(0))}[kind]()
    result = zg.train(config(), dataset, model=model)
    assert result.summary["eval_mode"] == "full" and "eval_note" not in result.summary
    if kind == "compact":  # one Dense per layer, not one shared
        assert set(result.variables["params"]) == {"dense_0", "dense_1"}
    exact = zg.layerwise_logits(result.program, result.variables, result.data)
    np.testing.assert_allclose(np.asarray(exact),
                               np.asarray(_full_neighbourhood(result, dataset)),
                               rtol=1e-5, atol=1e-5)


def test_a_model_without_it_is_told_why_and_sampled(dataset):
    result = zg.train(config(), dataset, model=NoLayers(CLASSES))
    assert result.summary["eval_mode"] == "sampled"
    assert "NoLayers has no layer(i, h_src, h_dst, view" in result.summary["eval_note"]
    assert 0.0 <= result.summary["test_acc"] <= 1.0
    with pytest.raises(TypeError, match="NoLayers has no layer.*use sampled_logits"):
        zg.layerwise_logits(result.program, result.variables, result.data)


def test_a_link_encoder_without_layer_is_evaluated_sampled(dataset):
    """Failed before: LinkModel.num_layers raised AttributeError, which Flax turned into
    a DescriptorAttributeError that `hasattr` let through at the first evaluation."""
    result = zg.train(config(task="link", batch_size=128), dataset, model=NoLayers(8))
    assert result.summary["eval_mode"] == "sampled"
    assert 0.0 <= result.summary["test_auc"] <= 1.0
    assert zg.LinkModel(NoLayers(8), zg.DotDecoder()).num_layers is None


class OwnTable(LinenLayers):
    """`LinenLayers` with a per-node table of its own, joined to layer 0's rows by
    `view.node_ids` (the sources) and `view.dst_ids` (the destinations)."""

    num_nodes: int = N

    def setup(self):
        super().setup()
        self.table = nn.Embed(self.num_nodes, 4)

    def layer(self, i, h_src, h_dst, view, *, train):
        if i == 0:
            h_src = jnp.concatenate([h_src, self.table(view.node_ids)], -1)
            if h_dst is not None:
                h_dst = jnp.concatenate([h_dst, self.table(view.dst_ids)], -1)
        return super().layer(i, h_src, h_dst, view, train=train)


def test_a_table_of_the_models_own_reads_the_rows_of_each_chunk(dataset):
    """Exact inference in many chunks gives the rows of one chunk and of sampling every
    neighbour: a chunk's destinations are not the sources' first rows (node_ids
    [:num_dst] named other nodes than its rows), `dst_ids` names them."""
    res = zg.train(config(eval_mode="none", fanouts=(-1, -1), epochs=1), dataset,
                   model=OwnTable(8, CLASSES))
    whole = np.asarray(evaluate.layerwise_logits(res.program, res.variables, res.data))
    chunks = np.asarray(evaluate.layerwise_logits(res.program, res.variables, res.data,
                                                  budget_bytes=64 * 32 * 4))
    assert evaluate.plan_chunks(res.data.graph.indptr, 8, budget_bytes=64 * 32 * 4
                                ).num_chunks > 1
    np.testing.assert_allclose(chunks, whole, rtol=1e-5, atol=1e-6)
    sampled = np.asarray(zg.predict(res, np.arange(N), mode="sampled"))
    np.testing.assert_allclose(whole, sampled, rtol=1e-5, atol=1e-5)


def test_a_chunk_of_exact_inference_runs_no_loop_of_its_own(dataset):
    """A layer's program loops over its chunks and nothing else: the row of each edge slot
    comes from a search without a loop (ops/search.py), where JAX's default search is a
    `while` inside every chunk (on a GPU a kernel and two copies of the slots' bounds per
    step of the search: about half of a chunk's device time on products-like)."""
    res = zg.train(config(eval_mode="none"), dataset)
    h = evaluate.model_inputs(res.program, res.variables, res.data.features)
    plan = evaluate.plan_chunks(res.data.graph.indptr, 8, budget_bytes=64 * 32 * 4)
    assert plan.num_chunks > 1
    text = evaluate._layer_rows.lower(res.program, res.variables, h, res.data.graph, 0,
                                      layer=0, plan=plan, length=N).as_text()
    assert text.count("stablehlo.while") == 1


@pytest.mark.parametrize("offload, free, want", [
    (False, None, 1), (False, 2 << 30, 1), (False, 16 << 30, 2), (False, 20 << 30, 2),
    (False, 100 << 30, 4), (True, 100 << 30, 1), ("auto", 100 << 30, 1)])
def test_chunk_budget_grows_with_free_memory_where_nothing_streams(monkeypatch, offload, free,
                                                                   want):
    """Without a budget from the caller a chunk holds up to an eighth of the free memory,
    rounded down to a power of two (1 to 4 GiB), when every layer stays on the device;
    1 GiB where layers may stream, or where the device does not say what is free (a
    CPU)."""
    monkeypatch.setattr(evaluate, "device_free_bytes", lambda: free)
    assert evaluate.chunk_budget(offload) == want << 30


def test_a_larger_budget_that_runs_out_of_memory_runs_again_at_the_base(dataset, monkeypatch):
    res = zg.train(config(eval_mode="none"), dataset)
    want = np.asarray(evaluate.layerwise_logits(res.program, res.variables, res.data))
    run, budgets = evaluate._layerwise_logits, []

    def short_of_memory(*args, **kwargs):
        budgets.append(args[3])
        if args[3] > evaluate.BASE_BUDGET:
            raise jax.errors.JaxRuntimeError("RESOURCE_EXHAUSTED: Out of memory")
        return run(*args, **kwargs)

    monkeypatch.setattr(evaluate, "chunk_budget", lambda offload: 2 * evaluate.BASE_BUDGET)
    monkeypatch.setattr(evaluate, "_layerwise_logits", short_of_memory)
    with pytest.warns(UserWarning, match="chunks of 2.00 GiB of edge rows; running again "
                                         "at 1 GiB"):
        got = evaluate.layerwise_logits(res.program, res.variables, res.data)
    assert budgets == [2 * evaluate.BASE_BUDGET, evaluate.BASE_BUDGET]
    assert_same_runs(np.asarray(got), want)
    with pytest.raises(ValueError, match="budget_bytes must be an integer >= 1, got 0"):
        evaluate.layerwise_logits(res.program, res.variables, res.data, budget_bytes=0)


def test_largest_free_block_counts_room_the_allocator_may_still_reserve(monkeypatch):
    """Preallocated, the allocator's largest free block is what one allocation can get;
    growing (XLA_PYTHON_CLIENT_PREALLOCATE=false), the room it has not reserved yet may
    be larger; a CPU says nothing."""
    from zerognn_jax._src.training import memory

    for stats, want in (({"largest_free_block_bytes": 5, "bytes_limit": 100,
                          "pool_bytes": 100}, 5),
                        ({"largest_free_block_bytes": 5, "bytes_limit": 100,
                          "pool_bytes": 40}, 60),
                        ({"largest_free_block_bytes": 70, "bytes_limit": 100,
                          "pool_bytes": 40}, 70),
                        ({"largest_free_block_bytes": 5}, 5), ({}, None)):
        monkeypatch.setattr(memory, "_memory_stat",
                            lambda name, device=None, stats=stats: stats.get(name))
        assert memory.device_largest_free_block() == want


def test_exact_inputs_join_a_split_tables_nodes_to_their_embedding_rows():
    """A feature table split over devices has padding rows past the nodes (the rows a
    device count divides); exact inference joins each node's features to its embedding
    row, the padding left out (the concatenation of unequal rows failed)."""
    from types import SimpleNamespace

    rs = np.random.default_rng(0)
    features, table = rs.normal(size=(13, 5)), rs.normal(size=(11, 2)).astype(np.float32)
    program = SimpleNamespace(embedding=object())  # all that model_inputs reads of it
    for given in (features, jax.numpy.asarray(features, "float32")):
        got = np.asarray(evaluate.model_inputs(program, {"embedding": table}, given))
        np.testing.assert_allclose(got, np.concatenate(
            [np.asarray(given)[:11], table.astype(np.asarray(given).dtype)], 1), rtol=1e-6)
