"""Typed sampling on the device: the one-type case equals the homogeneous sampler,
every sampled pair is an edge of its relation, per-relation fanouts hold (statistically),
and the typed envelope overflows, grows and calibrates as the homogeneous one does."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import random_graph
from scipy import stats

import zerognn_jax as zg
from zerognn_jax._src.sampling.typed_envelope import grow_typed

WRITES = ("author", "writes", "paper")
CITES = ("paper", "cites", "paper")
TOPIC = ("paper", "has_topic", "field")
REV_TOPIC = ("field", "rev_has_topic", "paper")
COUNTS = {"author": 60, "paper": 80, "field": 12}


def _typed_graph(seed=0, weights=False, reverse=True):
    rs = np.random.default_rng(seed)
    edges = {WRITES: (rs.integers(0, 60, 300), rs.integers(0, 80, 300)),
             CITES: (rs.integers(0, 80, 250), rs.integers(0, 80, 250)),
             TOPIC: (rs.integers(0, 80, 200), rs.integers(0, 12, 200))}
    w = {WRITES: rs.random(300) * (rs.random(300) < 0.7)} if weights else None
    g = zg.hetero_graph(COUNTS, edges, weights=w, add_reverse=reverse)
    return g


def _sample(graph, config, envelope, seeds, key=7, valid=None):
    seeds = jnp.asarray(seeds, jnp.int32)
    valid = jnp.ones(seeds.shape, bool) if valid is None else valid
    return jax.jit(zg.sample_typed, static_argnames=("config", "envelope"))(
        graph, seeds, valid, jnp.uint32(key), config=config, envelope=envelope)


@pytest.mark.parametrize("options", [
    dict(), dict(method="weighted", flat_outer=True, fanouts=(-1, 3))])
def test_one_type_equals_the_homogeneous_sampler(options):
    fanouts = options.pop("fanouts", (4, 3))
    graph = random_graph(150, 500, seed=3)
    graph = graph._replace(weights=np.random.default_rng(0).random(graph.num_edges))
    config = zg.SamplerConfig(fanouts, edge_ids=True, **options).resolve(graph.max_degree())
    graph = zg.prepare_graph(graph, config)
    seeds = jnp.arange(0, 64, 2, dtype=jnp.int32)
    valid = jnp.arange(32) < 29
    env = config.fit_envelope(zg.conservative(32, config.slots, graph.num_nodes))
    mb = zg.sample_minibatch(graph.to_device(), seeds, valid, jnp.uint32(11), config,
                             env.capacities)
    hetero = zg.as_hetero(graph)
    typed = zg.TypedSamplerConfig(fanouts, edge_ids=True, **options).resolve(hetero)
    tenv = zg.typed_conservative(typed, "_N", 32, hetero.num_nodes)
    assert tenv.as_envelope() == env  # the conservative bound too, to the entry
    tmb = _sample(hetero.to_device(), typed, tenv, seeds, key=11, valid=valid)
    rel = ("_N", "_E", "_N")
    for lvl in range(len(mb.nodes)):
        np.testing.assert_array_equal(mb.nodes[lvl], tmb.nodes[lvl]["_N"])
        np.testing.assert_array_equal(mb.valid[lvl], tmb.valid[lvl]["_N"])
        np.testing.assert_array_equal(mb.degrees[lvl], tmb.degrees[lvl][rel])
    for block, tblocks in zip(mb.blocks, tmb.blocks):
        for a, b in zip(block, tblocks[rel]):
            np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(mb.counts, tmb.counts["_N"])
    assert bool(mb.overflow) == bool(tmb.overflow)


def test_one_type_calibrates_and_grows_as_the_homogeneous_envelope():
    graph = random_graph(300, 1200, seed=5)
    config = zg.SamplerConfig((5, 4))
    items = np.arange(0, 300, 3)
    cal = zg.calibrate(graph.to_device(), items, 20, config, policy=zg.EnvelopePolicy(
        multiple=8))
    hetero = zg.as_hetero(graph).to_device()
    tcal = zg.calibrate_typed(hetero, items, 20, zg.TypedSamplerConfig((5, 4)), seed_type="_N",
                              policy=zg.EnvelopePolicy(multiple=8))
    assert tcal.envelope.as_envelope() == cal.envelope
    assert tcal.max_counts["_N"] == cal.max_counts
    counts = (20, 90, 260)
    small = zg.Envelope(20, (40, 40))
    typed = zg.TypedSamplerConfig((5, 4)).resolve(hetero)
    grown = grow_typed(zg.TypedEnvelope.from_envelope(small), typed, {"_N": counts})
    assert grown.as_envelope() == zg.grow(small, counts)
    near_all = (20, 90, 290)  # 290 x 1.1 is past the graph's 300 nodes
    policy = zg.EnvelopePolicy(multiple=8)
    grown = grow_typed(zg.TypedEnvelope.from_envelope(small), typed, {"_N": near_all}, policy,
                       num_nodes={"_N": 300})
    assert grown.as_envelope() == zg.grow(small, near_all, policy, num_nodes=300)
    assert grown.as_envelope().capacities == (104, 304)


def _edge_sets(graph):
    out = {}
    for rel, g in graph.items():
        rows, cols = zg.to_edge_list(g)
        out[rel] = set(zip(rows.tolist(), cols.tolist()))
    return out


@pytest.mark.parametrize("dedup", [True, False])
def test_every_sampled_pair_is_an_edge_of_its_relation(dedup):
    graph = _typed_graph()
    fanouts = {r: (3, 2) for r in graph.relations}
    fanouts[REV_TOPIC] = (0, 2)  # not sampled at the seeds' hop
    config = zg.TypedSamplerConfig(fanouts, dedup=dedup, edge_ids=True).resolve(graph)
    env = zg.choose_typed_envelope(graph, None, 16, config, seed_type="paper",
                                   method="conservative")[0]
    mb = _sample(graph.to_device(), config, env, np.arange(16) * 5)
    plan = config.plan("paper")
    assert REV_TOPIC not in plan[0].relations and REV_TOPIC in plan[1].relations
    assert TOPIC not in plan[1].relations  # its destinations (fields) come at level 2
    assert set(mb.nodes[1]) == {"paper", "author"}
    assert set(mb.nodes[2]) == {"paper", "author", "field"}
    edges = _edge_sets(graph)
    seen = 0
    for hop, blocks in enumerate(mb.blocks):
        assert set(blocks) == set(plan[hop].relations)
        for (s, name, d), block in blocks.items():
            dst = np.asarray(mb.nodes[hop][d])
            src = np.asarray(mb.nodes[hop + 1][s])
            nbr, mask, eid = (np.asarray(a) for a in block)
            for i, k in zip(*np.nonzero(mask)):
                assert (dst[i], src[nbr[i, k]]) in edges[(s, name, d)]
                assert graph[(s, name, d)].indices[eid[i, k]] == src[nbr[i, k]]
                seen += 1
            counts = mask.sum(1)
            degree = np.diff(graph[(s, name, d)].indptr)[dst]
            valid = np.asarray(mb.valid[hop][d])
            expect = np.minimum(degree, config.fanout((s, name, d), hop)) * valid
            np.testing.assert_array_equal(counts, expect)  # min(fanout, degree) per row
            for i in range(nbr.shape[0]):  # no repeated edge without replacement
                assert len(set(eid[i][mask[i]])) == mask[i].sum()
    assert seen > 100
    if dedup:
        for level in mb.nodes:  # each type's level holds each node once
            for t, ids in level.items():
                real = np.asarray(ids)[: int(mb.counts[t][mb.nodes.index(level)])]
                assert len(set(real.tolist())) == real.size


def test_per_relation_fanouts_draw_uniformly():
    writes = (np.arange(20), np.zeros(20, int))  # paper 0 has 20 authors
    cites = (np.arange(1, 11), np.zeros(10, int))  # and cites... is cited by 10 papers
    graph = zg.hetero_graph({"author": 20, "paper": 11}, {WRITES: writes, CITES: cites})
    config = zg.TypedSamplerConfig({WRITES: (5,), CITES: (2,)}).resolve(graph)
    env = zg.typed_conservative(config, "paper", 1, graph.num_nodes)
    graph = graph.to_device()
    draw = jax.jit(jax.vmap(lambda k: zg.sample_typed(graph, jnp.zeros(1, jnp.int32),
                                                      jnp.ones(1, bool), k, config, env)))
    mb = draw(jnp.arange(2000, dtype=jnp.uint32))
    for rel, n, f in ((WRITES, 20, 5), (CITES, 10, 2)):
        block = mb.blocks[0][rel]
        s = rel[0]
        ids = np.take_along_axis(np.asarray(mb.nodes[1][s]),
                                 np.asarray(block.nbr).reshape(2000, -1), axis=1)
        assert np.all(np.asarray(block.mask))
        freq = np.bincount(ids.reshape(-1), minlength=n)[-n:] if s == "author" else \
            np.bincount(ids.reshape(-1), minlength=11)[1:]
        # Each neighbour is drawn with probability p = f / n: its count is binomial, and
        # the counts of one row, f distinct of n a draw, have covariance
        # 2000 p (1 - p) n / (n - 1) (I - 1 1' / n), so their scaled squares are
        # chi-square with n - 1 degrees (a bound of 5 sigma per neighbour let Floyd's
        # draw off by one through on the 20 authors).
        p, expect = f / n, 2000 * f / n
        chi2 = np.sum((freq - expect) ** 2) / (expect * (1 - p)) * (n - 1) / n
        assert stats.chi2.sf(chi2, n - 1) > 1e-4, freq


def test_small_capacities_overflow_and_growth_recovers_the_same_batch():
    graph = _typed_graph(seed=2, reverse=False).to_device()
    config = zg.TypedSamplerConfig((3, 2)).resolve(graph)
    safe = zg.typed_conservative(config, "paper", 24, graph.num_nodes)
    seeds = np.arange(24) * 3
    exact = _sample(graph, config, safe, seeds)
    assert not bool(exact.overflow)
    real = {t: np.asarray(c) for t, c in exact.counts.items()}
    small = zg.TypedEnvelope("paper", 24, tuple(
        tuple((t, max(int(real[t][hop]), int(real[t][hop + 1]) * 3 // 4)) for t, _ in level)
        for hop, level in enumerate(safe.capacities)))
    cut = _sample(graph, config, small, seeds)
    assert bool(cut.overflow)  # the authors of level 1 did not fit
    grown = grow_typed(small, config, {t: np.asarray(c) for t, c in cut.counts.items()},
                       zg.EnvelopePolicy(multiple=8))
    mb = _sample(graph, config, grown, seeds)
    assert not bool(mb.overflow)
    for t, c in exact.counts.items():
        np.testing.assert_array_equal(c, mb.counts[t])
        for lvl, level in enumerate(exact.nodes):
            if t in level:
                n = int(c[lvl])
                np.testing.assert_array_equal(level[t][:n], mb.nodes[lvl][t][:n])


def test_weighted_relations_never_draw_zero_weight_edges():
    graph = _typed_graph(weights=True)
    fanouts = {r: (3,) for r in graph.relations}
    config = zg.TypedSamplerConfig(fanouts, method="weighted", edge_ids=True)
    with pytest.raises(ValueError, match="needs edge weights"):
        zg.prepare_typed_graph(graph, config)  # only writes and its reverse have them
    for rel, g in graph.items():
        if g.weights is None:
            fanouts[rel] = (0,)  # relations never sampled need no weights
    config = zg.TypedSamplerConfig(fanouts, method="weighted", edge_ids=True).resolve(graph)
    prepared = zg.prepare_typed_graph(graph, config)
    env = zg.typed_conservative(config, "paper", 40, graph.num_nodes)
    mb = _sample(prepared.to_device(), config, env, np.arange(40) * 2)
    assert set(mb.blocks[0]) == {WRITES}
    block = mb.blocks[0][WRITES]
    eid = np.asarray(block.eid)[np.asarray(block.mask)]
    assert eid.size > 30 and np.all(graph[WRITES].weights[eid] > 0)


def test_fanout_layouts_agree_and_errors_name_the_relation():
    graph = _typed_graph()
    rels = graph.relations
    pyg = zg.TypedSamplerConfig({r: (3, 2) for r in rels}).resolve(graph)
    dgl = zg.TypedSamplerConfig([{r: 3 for r in rels}, {r: 2 for r in rels}]).resolve(graph)
    one = zg.TypedSamplerConfig((3, 2)).resolve(graph)
    assert pyg == dgl == one
    with pytest.raises(ValueError, match="fanouts leave out relation paper__has_topic__field"):
        zg.TypedSamplerConfig({r: (3,) for r in rels if r != TOPIC}).resolve(graph)
    with pytest.raises(ValueError, match="fanouts name a__b__c, which the graph lacks"):
        zg.TypedSamplerConfig({("a", "b", "c"): (3,)}).resolve(graph)
    with pytest.raises(ValueError, match="the fanouts name relation paper__cites__paper at "
                                         "hop 0 but not at hop 1: give each relation"):
        zg.TypedSamplerConfig([{WRITES: 3, CITES: 1}, {WRITES: 2}])
    with pytest.raises(ValueError, match=r"spelled the same way at each \(a triple or the "
                                         r"same name"):  # the hops' keys compared as given
        zg.TypedSamplerConfig([{WRITES: 3, CITES: 1}, {WRITES: 2, "cites": 1}])
    with pytest.raises(ValueError, match="every relation needs the same number of hops"):
        zg.TypedSamplerConfig({WRITES: (3, 2), CITES: (1,)})
    with pytest.raises(ValueError, match=r"fanout of author__writes__paper at hop 0 must be"):
        zg.TypedSamplerConfig({WRITES: (-2,)})
    for zeros in ((0, 0), (3, 0), {WRITES: (0, 2), CITES: (0, 1)}):  # they sampled nothing
        with pytest.raises(ValueError, match=r"^hop \d samples no relation \(every fanout "
                                             r"there is 0\)"):
            zg.TypedSamplerConfig(zeros)
    zg.TypedSamplerConfig({WRITES: (0, 2), CITES: (1, 0)})  # a relation skipped at a hop
    # a hop whose fanouts above 0 all lead into types its batch does not hold yet
    into_papers = {r: ((0, 2) if r[2] == "paper" else (3, 2)) for r in rels}
    with pytest.raises(ValueError, match=r"^hop 0 samples no relation into the 'paper' "
                                         r"nodes a batch of 'paper' seeds holds there \(the "
                                         r"fanouts of .*paper__cites__paper.* are 0"):
        zg.TypedSamplerConfig(into_papers).resolve(graph).plan("paper")
    with pytest.raises(ValueError, match=r"capacity of paper at level 1 \(8\) is below"):
        zg.TypedEnvelope("paper", 16, ((("paper", 8),),))


def test_each_relation_gets_at_most_its_largest_degree_in_slots():
    """Per relation, without replacement: a fanout above the relation's largest
    in-degree becomes that degree (at least 1 for an edgeless relation), 0 skips the hop
    still, -1 takes every neighbour; with replacement and under LABOR fanouts stay."""
    graph = zg.hetero_graph({"a": 5, "b": 5}, {("a", "r", "b"): ([0, 1, 2], [0, 0, 1]),
                                               ("b", "s", "a"): ([], [])})
    fanouts = {("a", "r", "b"): (9, 0, -1), ("b", "s", "a"): (9, 9, 9)}
    cfg = zg.TypedSamplerConfig(fanouts).resolve(graph)
    assert dict(cfg.fanouts) == {("a", "r", "b"): (2, 0, 2), ("b", "s", "a"): (1, 1, 1)}
    assert dict(cfg.all_neighbors)[("a", "r", "b")] == (False, False, True)
    again = zg.TypedSamplerConfig(fanouts, replace=True).resolve(graph)
    assert dict(again.fanouts)[("b", "s", "a")] == (9, 9, 9)
    labor = zg.TypedSamplerConfig({r: (9, 9, 9) for r in fanouts}, method="labor")
    assert dict(labor.resolve(graph).fanouts)[("a", "r", "b")] == (9, 9, 9)


def test_all_zero_weights_of_a_relation_are_refused_naming_it():
    graph = zg.hetero_graph({"a": 5, "b": 5}, {("a", "r", "b"): ([0, 1, 2], [0, 0, 1])},
                            weights={("a", "r", "b"): [0.0, 0.0, 0.0]})
    with pytest.raises(ValueError, match="all 3 edge weights of relation a__r__b are zero"):
        zg.prepare_typed_graph(graph, zg.TypedSamplerConfig((2,), method="weighted"))
    # a negative weight: refused where the graph is built (it was taken there, and refused
    # only once a run sampled by it)
    with pytest.raises(ValueError, match=r"^relation a__r__b: weights must be non-negative "
                                         r"\(the weighted sampler draws each edge in "
                                         r"proportion to its weight\): -1\.0 at edge 1"):
        zg.hetero_graph({"a": 5, "b": 5}, {("a", "r", "b"): ([0, 1, 2], [0, 0, 1])},
                        weights={("a", "r", "b"): [1.0, -1.0, 0.5]})
    # a relation without weights beside one with them is named ("this graph has none")
    graph = zg.hetero_graph({"a": 5, "b": 5}, {("a", "r", "b"): ([0, 1, 2], [0, 0, 1]),
                                               ("b", "s", "b"): ([0], [1])},
                            weights={("a", "r", "b"): [1.0, 2.0, 0.5]})
    with pytest.raises(ValueError, match=r"^weighted sampling needs edge weights, and "
                                         r"relation b__s__b has none: give every relation"):
        zg.prepare_typed_graph(graph, zg.TypedSamplerConfig((2,), method="weighted"))


def test_fanouts_keyed_by_a_relation_name_and_whole_numbers_only():
    graph = _typed_graph()
    by_triple = zg.TypedSamplerConfig({r: (3, 2) for r in graph.relations}).resolve(graph)
    names = {("cites" if r == CITES else "__".join(r)): (3, 2) for r in graph.relations}
    assert zg.TypedSamplerConfig(names).resolve(graph) == by_triple
    per_hop = [{"__".join(r): f for r in graph.relations} for f in (3, 2)]
    assert zg.TypedSamplerConfig(per_hop).resolve(graph) == by_triple
    with pytest.raises(ValueError, match="fanouts 'nothing' names no relation"):
        zg.TypedSamplerConfig({"nothing": (3,)}).resolve(graph)
    # a name two relations share lists those two (it listed every relation)
    twice = zg.hetero_graph({"a": 2, "b": 2}, {("a", "to", "b"): ([0], [1]),
                                               ("b", "to", "b"): ([0], [1]),
                                               ("b", "x", "a"): ([1], [0])})
    with pytest.raises(ValueError, match=r"fanouts 'to' names more than one relation of "
                                         r"the graph \(a__to__b, b__to__b\): give one of "
                                         r"these names$"):
        zg.TypedSamplerConfig({"to": (3,)}).resolve(twice)
    with pytest.raises(ValueError, match="fanouts give relation paper__cites__paper twice"):
        zg.TypedSamplerConfig({"cites": (3,), CITES: (2,)}).resolve(graph)
    for bad in ((2.5,), (True,), ("3",)):
        with pytest.raises(ValueError, match="fanouts must be whole numbers"):
            zg.TypedSamplerConfig(bad)
    with pytest.raises(ValueError, match="fanouts must list one fanout per hop"):
        zg.TypedSamplerConfig(5)
    assert zg.TypedSamplerConfig((3.0,)).fanouts == (3,)


def test_a_second_batch_does_not_retrace():
    graph = _typed_graph(reverse=False).to_device()
    config = zg.TypedSamplerConfig((3,)).resolve(graph)
    env = zg.typed_conservative(config, "paper", 8, graph.num_nodes)
    traces = []

    @jax.jit
    def step(seeds, key):
        traces.append(1)
        return zg.sample_typed(graph, seeds, jnp.ones(8, bool), key, config, env).counts

    step(jnp.arange(8, dtype=jnp.int32), jnp.uint32(1))
    step(jnp.arange(8, 16, dtype=jnp.int32), jnp.uint32(2))
    assert len(traces) == 1


def test_typed_envelope_refuses_an_unknown_seed_type_and_seed_ids_out_of_range():
    graph = _typed_graph()
    config = zg.TypedSamplerConfig((3, 2))
    choose = lambda items, seed_type: zg.choose_typed_envelope(graph, items, 16, config,
                                                               seed_type=seed_type)
    with pytest.raises(ValueError, match=r"^seed_type 'venue' is not a node type of the "
                                         r"graph \(author, paper, field\)$"):
        choose(np.arange(16), "venue")
    with pytest.raises(ValueError, match=r"^items \(the seed nodes\) has paper id 1000000 at "
                                         r"position 0, out of range for 80 paper nodes$"):
        choose(np.arange(16) + 10**6, "paper")
    with pytest.raises(ValueError, match=r"^items \(the seed nodes\) has field id 12 at "
                                         r"position 12, out of range for 12 field "
                                         r"nodes$"):  # paper ids as fields
        choose(np.arange(16), "field")
