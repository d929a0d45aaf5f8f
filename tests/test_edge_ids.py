"""Edge ids in sampled blocks: every sampler and layout points each slot at its CSR edge."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import random_graph

from zerognn_jax import SamplerConfig, sample_minibatch
from zerognn_jax._src.data.graph import csr_from_arrays
from zerognn_jax._src.pallas import counter_hash
from zerognn_jax._src.pallas import sample as pk_sample
from zerognn_jax._src.sampling.minibatch import prepare_graph
from zerognn_jax._src.sampling.uniform import sample_neighbors_reference


@pytest.fixture(scope="module")
def weighted_graph():
    g = random_graph(500, 2500, seed=11, isolated=10)
    w = np.random.default_rng(11).uniform(0.0, 2.0, g.num_edges).astype(np.float32)
    w[::7] = 0.0  # edges of weight zero are never drawn
    return csr_from_arrays(g.indptr, g.indices, w)


CASES = [("uniform", False), ("uniform", True), ("weighted", False), ("weighted", True),
         ("labor", False)]


@pytest.mark.parametrize("method, replace", CASES)
@pytest.mark.parametrize("dedup", [True, False], ids=["dedup", "tree"])
def test_edge_ids_point_at_the_sampled_edges_of_their_rows(weighted_graph, method, replace,
                                                           dedup):
    config = SamplerConfig((6, 4), replace=replace, dedup=dedup, method=method,
                           edge_ids=True).resolve(weighted_graph.max_degree())
    graph = prepare_graph(weighted_graph, config)
    seeds = jnp.arange(0, 480, 5, dtype=jnp.int32)
    valid = jnp.arange(seeds.shape[0]) < 90  # a padded tail
    sample = jax.jit(lambda g: sample_minibatch(g, seeds, valid, jnp.uint32(5), config,
                                                (1024, 4096)))
    mb = sample(graph.to_device())
    plain = jax.jit(lambda g: sample_minibatch(
        g, seeds, valid, jnp.uint32(5), dataclasses.replace(config, edge_ids=False),
        (1024, 4096)))(graph.to_device())
    indptr, indices = np.asarray(weighted_graph.indptr), np.asarray(weighted_graph.indices)
    weights = np.asarray(weighted_graph.weights)
    for hop, block in enumerate(mb.blocks):
        assert plain.blocks[hop].eid is None
        np.testing.assert_array_equal(plain.blocks[hop].nbr, block.nbr)  # nothing else moves
        eid, mask = np.asarray(block.eid), np.asarray(block.mask)
        assert eid.dtype == indptr.dtype
        assert not eid[~mask].any(), "a dead slot holds an edge id"
        dst = np.asarray(mb.nodes[hop])[:, None]
        src = np.asarray(mb.nodes[hop + 1])[np.asarray(block.nbr)]
        lo, hi = indptr[dst], indptr[dst + 1]
        assert ((lo <= eid) & (eid < hi))[mask].all(), "an edge id outside its row"
        np.testing.assert_array_equal(indices[eid][mask], src[mask])
        if method == "weighted":
            assert (weights[eid][mask] > 0).all(), "an edge of weight zero was drawn"
        if not replace:
            for row in np.flatnonzero(mask.any(1)):
                taken = eid[row][mask[row]]
                assert len(set(taken.tolist())) == len(taken), "an edge drawn twice"
    assert sum(int(np.asarray(b.mask).sum()) for b in mb.blocks) > 500


@pytest.mark.parametrize("replace", [False, True])
def test_pallas_sampler_edge_ids_match_the_reference(weighted_graph, replace):
    g = weighted_graph.to_device()
    frontier = jnp.asarray(np.random.default_rng(3).integers(0, 500, 200), jnp.int32)
    valid = jnp.arange(200) < 170
    key = counter_hash.step_key(1, 2, 3, 0)
    args = (g.indptr, g.indices, frontier, valid, key, 6)
    ref = sample_neighbors_reference(*args, replace=replace, with_edges=True)
    got = pk_sample.sample_neighbors(*args, replace=replace, with_edges=True, interpret=True)
    assert len(got) == 3
    for a, b in zip(got, ref):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    plain = pk_sample.sample_neighbors(*args, replace=replace, interpret=True)
    assert len(plain) == 2


def test_edgeless_graph_gives_dead_edge_ids():
    g = csr_from_arrays(np.zeros(5, np.int32), np.zeros(0, np.int32))
    config = SamplerConfig((3,), edge_ids=True)
    mb = sample_minibatch(g.to_device(), jnp.arange(4, dtype=jnp.int32), jnp.ones(4, bool),
                          jnp.uint32(0), config, (16,))
    assert mb.blocks[0].eid.shape == (4, 3) and not np.asarray(mb.blocks[0].eid).any()
    assert not np.asarray(mb.blocks[0].mask).any()


def test_slots_a_link_loader_hides_hold_no_edge_id():
    """The seed-edge mask hid a positive's slots but left their edge ids, so a loop that
    read edge rows by `eid` without the mask read the edge it was asked to predict."""
    from zerognn_jax import LinkNeighborLoader

    g = random_graph(40, 200, seed=3)
    src = np.repeat(np.arange(40), np.diff(np.asarray(g.indptr)))
    pairs = np.stack([src, np.asarray(g.indices)], 1)[:60]
    kw = dict(fanouts=(3, 2), batch_size=20, key=0, edge_ids=True, kernels="xla")
    hidden = 0
    for shown, masked in zip(LinkNeighborLoader(g, pairs, exclude_seed_edges=False, **kw),
                             LinkNeighborLoader(g, pairs, **kw)):
        for raw, block in zip(shown.minibatch.blocks, masked.minibatch.blocks):
            mask, eid = np.asarray(block.mask), np.asarray(block.eid)
            assert not eid[~mask].any()
            np.testing.assert_array_equal(eid[mask], np.asarray(raw.eid)[mask])
            hidden += int(np.sum(np.asarray(raw.mask) & ~mask))
    assert hidden > 0  # the mask hid some slots
