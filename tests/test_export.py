"""A model exported with jax.export, serialized, loaded back and called. The runs keep
their initial parameters (epochs=0): what each test compares, the artifact against the
live model or exact inference, holds for any parameters."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import random_graph

from zerognn_jax import (
    TrainConfig,
    export_model,
    graph_arguments,
    layerwise_logits,
    make_dataset,
    train,
)
from zerognn_jax._src.ops.host_rows import host_table
from zerognn_jax._src.sampling.envelope import conservative


def _train(fanouts, **options):
    """A run on a random 300-node graph; with `edge_features` in `options`, a GAT reading
    a 3-column edge-feature table."""
    rs = np.random.default_rng(2)
    g = random_graph(300, 1500, seed=2)
    labels = rs.integers(0, 3, 300)
    feats = rs.normal(size=(300, 5)).astype(np.float32) + labels[:, None]
    ds = make_dataset("g300", g.indptr, g.indices, feats, labels, np.arange(200),
                      np.arange(200, 250), np.arange(250, 300), 3)
    if options.get("edge_features"):
        table = rs.normal(size=(g.indices.shape[0], 3)).astype(np.float32)
        ds = dataclasses.replace(ds, graph=ds.graph._replace(edge_features=table))
    cfg = TrainConfig(hidden=8, layers=2, fanouts=fanouts, batch_size=32, epochs=0,
                      eval_mode="none", progress=False, **options)
    return train(cfg, ds)


@pytest.fixture(scope="module")
def trained():
    return _train((4, 3))


def _with_a_longer_row(indptr, node: int, sources: int):
    """(indptr, indices): a graph (or relation) of the same row and edge counts, its
    neighbours drawn from `sources` nodes, whose row `node` has one neighbour more than
    any row of `indptr`'s."""
    degrees = np.diff(np.asarray(indptr))
    need = degrees.max() + 1 - degrees[node]
    donors = np.flatnonzero(degrees > 1)
    donors = donors[donors != node][:need]
    degrees[donors] -= 1
    degrees[node] += need
    indices = np.random.default_rng(0).integers(0, sources, degrees.sum()).astype(np.int32)
    return jnp.asarray(np.r_[0, np.cumsum(degrees)].astype(np.int32)), jnp.asarray(indices)


def test_exported_full_neighbourhood_model_equals_exact_inference(trained):
    """With every neighbour sampled, the artifact must give exact layer-wise logits. Its
    rows are as wide as the training graph's largest degree: a served graph with a
    longer row gets NaN everywhere (it came back cut to that width, unmarked), where an
    artifact whose fanouts no degree cut samples it as any other."""
    res = _train((-1, -1))
    d = res.data
    back = jax.export.deserialize(export_model(res.program, res.variables, d,
                                               batch_size=32).serialize())
    seeds = jnp.arange(100, 132, dtype=jnp.int32)
    got = back.call(d.graph.indptr, d.graph.indices, d.features, seeds, jnp.ones(32, bool),
                    jnp.uint32(3))
    exact = np.asarray(layerwise_logits(res.program, res.variables, d))[100:132]
    np.testing.assert_allclose(np.asarray(got), exact, rtol=1e-4, atol=1e-4)
    indptr, indices = _with_a_longer_row(d.graph.indptr, 100, 300)
    got = back.call(indptr, indices, d.features, seeds, jnp.ones(32, bool), jnp.uint32(3))
    assert np.isnan(np.asarray(got)).all()
    p, v, d = trained.program, trained.variables, trained.data  # fanouts 4, 3
    assert 4 < d.graph.max_degree()
    sampled = jax.export.deserialize(export_model(p, v, d, batch_size=32).serialize())
    got = sampled.call(indptr, indices, d.features, seeds, jnp.ones(32, bool), jnp.uint32(3))
    assert np.isfinite(np.asarray(got)).all()


def test_exported_model_round_trips_and_matches_the_live_model(trained):
    p, v, d = trained.program, trained.variables, trained.data
    out = export_model(p, v, d, batch_size=16)
    back = jax.export.deserialize(out.serialize())
    seeds = jnp.arange(250, 266, dtype=jnp.int32)
    valid = jnp.arange(16) < 12
    key = jnp.uint32(7)
    got = back.call(d.graph.indptr, d.graph.indices, d.features, seeds, valid, key)
    caps = conservative(16, p.sampler.slots, d.graph.num_nodes).capacities
    want, _, _ = p.forward(v, d, seeds, valid, key, caps, train=False)
    assert got.shape == (16, 3) and got.dtype == jnp.float32
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-5, atol=1e-6)
    assert out.arguments[:3] == ("indptr", "indices", "features")
    # a short repr (the Exported's own printed the whole serialized module)
    assert len(repr(out)) < 200 and len(repr(out.exported)) > 10_000
    assert repr(out) == (f"ExportedModel(batch_size=16, arguments={out.arguments}, "
                         f"platforms={tuple(out.exported.platforms)})")
    # a valid seed outside the graph gets a NaN row (its id would be clamped to a node's)
    outside = seeds.at[:3].set(jnp.array([300, -1, 10**6], jnp.int32))
    got = np.asarray(back.call(d.graph.indptr, d.graph.indices, d.features, outside, valid,
                               key))
    assert np.isnan(got[:3]).all() and np.isfinite(got[3:]).all()


def test_an_artifacts_call_names_the_argument_of_another_shape(trained):
    """`ExportedModel.call` checks every argument against the artifact's first: JAX's
    own error named an argument by position only ("args[1].shape[0]"), and a graph that
    is not the one the run trained on (GAT's drops self-loops) was a puzzle."""
    p, v, d = trained.program, trained.variables, trained.data
    art = export_model(p, v, d, batch_size=16)
    seeds, valid, key = jnp.arange(16, dtype=jnp.int32), jnp.ones(16, bool), jnp.uint32(2)
    got = art.call(*art.data_arguments(d), seeds, valid, key)
    want = art.exported.call(*art.data_arguments(d), seeds, valid, key)
    np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
    # NumPy's int64 ids are taken as JAX takes them (int32 without x64), not refused
    again = art.call(*art.data_arguments(d), np.arange(16), np.ones(16, bool), key)
    np.testing.assert_array_equal(np.asarray(again), np.asarray(want))
    edges = d.graph.indices.shape[0]
    with pytest.raises(ValueError, match=rf"^argument indices must be int32\[{edges}\], got "
                                         rf"int32\[{edges - 3}\] \(the graph's arrays are "
                                         rf"those of the graph the run trained on"):
        art.call(d.graph.indptr, d.graph.indices[3:], d.features, seeds, valid, key)
    with pytest.raises(ValueError, match=r"^argument valid must be bool\[16\], got int32\[16\]$"):
        art.call(*art.data_arguments(d), seeds, seeds, key)
    with pytest.raises(TypeError, match=r"takes 6 arguments \(indptr, indices, features, "
                                        r"seeds, valid, key\), got 5"):
        art.call(*art.data_arguments(d), seeds, valid)


def test_a_model_reading_edge_features_takes_the_table_as_an_argument():
    """GAT with edge features in its attention: the artifact takes the graph's edge
    table after the features and gives the live model's outputs, which the table moves
    (zeroed, they change)."""
    res = _train((4, 3), model="gat", heads=2, edge_features=True)
    p, v, d = res.program, res.variables, res.data
    out = export_model(p, v, d, batch_size=16)
    assert out.arguments == ("indptr", "indices", "features", "edge_features", "seeds",
                             "valid", "key")
    tables = (d.graph.indptr, d.graph.indices, d.features, d.graph.edge_features)
    assert all(a is b for a, b in zip(out.data_arguments(d), tables, strict=True))
    back = jax.export.deserialize(out.serialize())
    seeds, valid, key = jnp.arange(250, 266, dtype=jnp.int32), jnp.ones(16, bool), jnp.uint32(5)
    got = back.call(*tables, seeds, valid, key)
    caps = conservative(16, p.sampler.slots, d.graph.num_nodes).capacities
    want, _, _ = p.forward(v, d, seeds, valid, key, caps, train=False)
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-5, atol=1e-6)
    zeroed = back.call(d.graph.indptr, d.graph.indices, d.features,
                       jnp.zeros_like(d.graph.edge_features), seeds, valid, key)
    assert np.abs(np.asarray(zeroed) - np.asarray(got)).max() > 1e-4


def test_data_arguments_of_a_run_with_host_features_are_arrays_in_node_order():
    """A run whose feature table stays in host memory, laid out hottest rows first, with
    some of its rows cached on the device or none: the artifact takes the table in node
    order. `data_arguments` handed the HostTable itself, which the artifact refused, and
    a CachedTable (a GPU's default) still."""
    for cache in (0, 20 * 5 * 4 / 2**30):  # none; 20 rows of 5 float32 columns
        res = _train((4, 3), feature_placement="host", host_row_order="degree",
                     feature_cache_gib=cache)
        p, v, d = res.program, res.variables, res.data
        host = host_table(d.features)
        assert (host is d.features) == (cache == 0)
        assert host.position is not None  # rows laid out by degree, not by id
        out = export_model(p, v, d, batch_size=16)
        indptr, indices, table = out.data_arguments(d)
        assert isinstance(table, np.ndarray)
        np.testing.assert_array_equal(table, np.asarray(host.array)[
            np.asarray(host.position)])
        back = jax.export.deserialize(out.serialize())
        seeds, valid = jnp.arange(250, 266, dtype=jnp.int32), jnp.ones(16, bool)
        got = back.call(indptr, indices, table, seeds, valid, jnp.uint32(5))
        caps = conservative(16, p.sampler.slots, d.graph.num_nodes).capacities
        want, _, _ = p.forward(v, d, seeds, valid, jnp.uint32(5), caps, train=False)
        np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-5, atol=1e-6)


def test_a_table_padded_past_the_nodes_is_exported_at_the_nodes(trained):
    """A run's table split over devices (`shard_features`) has zero rows past its nodes,
    up to a multiple of the devices; an artifact staged from that data took the padded
    table only (`zerognn export` of the run's checkpoint takes the table itself). It is
    staged at the graph's rows, and `data_arguments` of the padded data gives those."""
    p, v, d = trained.program, trained.variables, trained.data
    n = d.graph.num_nodes
    padded = d._replace(features=jnp.concatenate([d.features, jnp.zeros((3, 5))]))
    out = export_model(p, v, padded, batch_size=16)
    assert out.exported.in_avals[2].shape[0] == n
    indptr, indices, table = out.data_arguments(padded)
    np.testing.assert_array_equal(np.asarray(table), np.asarray(d.features))
    seeds, valid, key = jnp.arange(250, 266, dtype=jnp.int32), jnp.ones(16, bool), jnp.uint32(5)
    np.testing.assert_array_equal(np.asarray(out.exported.call(indptr, indices, table, seeds,
                                                               valid, key)),
                                  np.asarray(export_model(p, v, d, batch_size=16).exported.call(
                                      d.graph.indptr, d.graph.indices, d.features, seeds,
                                      valid, key)))


def _typed(**options):
    """A typed run: papers with features, citations with 2 edge features, featureless
    authors; every neighbour sampled."""
    from zerognn_jax import make_hetero_dataset

    rs = np.random.default_rng(0)
    cites, writes = ("paper", "cites", "paper"), ("author", "writes", "paper")
    ds = make_hetero_dataset(
        "two-types", {"paper": 40, "author": 20},
        {cites: (rs.integers(0, 40, 90), rs.integers(0, 40, 90)),
         writes: (rs.integers(0, 20, 60), rs.integers(0, 40, 60))},
        target_type="paper", labels=rs.integers(0, 3, 40), train_idx=np.arange(24),
        val_idx=np.arange(24, 32), test_idx=np.arange(32, 40),
        features={"paper": rs.normal(size=(40, 4))},
        edge_features={cites: rs.normal(size=(90, 2))}, add_reverse=True)
    cfg = TrainConfig(dataset="two-types", hidden=8, layers=2, fanouts=(-1, -1),
                      batch_size=8, epochs=0, eval_mode="none", progress=False, **options)
    return train(cfg, ds)


@pytest.mark.parametrize("options", [dict(model="rsage"),
                                     dict(model="rgat", heads=2, edge_features=True,
                                          embedding_dim=3)], ids=["rsage", "rgat-edges"])
def test_a_typed_model_exports_and_equals_exact_inference(options):
    """A typed graph's artifact takes each relation's CSR (and edge table where the
    views read one), the stacked features and paper ids; with every neighbour sampled
    it gives the exact logits (learnable rows baked in); it lowers for CUDA too."""
    from zerognn_jax._src.training.evaluate import Predictor
    from zerognn_jax._src.training.tasks.typed_eval import typed_logits

    res = _typed(**options)
    p, v, d = res.program, res.variables, res.data
    out = export_model(p, v, d, batch_size=8, platforms=("cpu", "cuda"))
    names = ["paper__cites__paper.indptr", "paper__cites__paper.indices"]
    if options.get("edge_features"):
        names.append("paper__cites__paper.edge_features")
    assert list(out.arguments[:len(names)]) == names
    assert out.arguments[-4:] == ("features", "seeds", "valid", "key")
    arrays = {f"{name}.{part}": getattr(g, part) for name, g in
              zip(("__".join(r) for r in d.graph.relations), d.graph.graphs)
              for part in ("indptr", "indices", "edge_features")}
    tables = out.data_arguments(d)  # each relation's arrays, then the features
    assert all(a is b for a, b in zip(tables, [arrays[n] for n in out.arguments[:-4]]
                                      + [d.features], strict=True))
    back = jax.export.deserialize(out.serialize())
    seeds, valid = jnp.arange(30, 38, dtype=jnp.int32), jnp.arange(8) < 6
    got = back.call(*tables, seeds, valid, jnp.uint32(4))
    exact = typed_logits(p.task, Predictor(p, v, d, "full", 8, 0), np.arange(30, 36))
    assert got.shape == (8, 3)
    np.testing.assert_allclose(np.asarray(got)[:6], exact, rtol=1e-4, atol=1e-5)
    papers = d.graph.num_nodes["paper"]  # a paper id past the papers: a NaN row
    got = np.asarray(back.call(*tables, seeds.at[0].set(papers), valid, jnp.uint32(4)))
    assert np.isnan(got[0]).all() and np.isfinite(got[1:]).all()
    # a relation with a row longer than any it had in training: cut, so NaN everywhere
    at = out.arguments.index("author__writes__paper.indptr")
    longer = list(tables)
    longer[at:at + 2] = _with_a_longer_row(tables[at], 0, d.graph.num_nodes["author"])
    assert np.isnan(np.asarray(back.call(*longer, seeds, valid, jnp.uint32(4)))).all()
    if options["model"] == "rsage":  # views that ran Pallas kernels export their XLA twins
        from zerognn_jax._src.ops.registry import Kernels

        pallas = dataclasses.replace(p, model=p.model.clone(kernels=Kernels.parse("pallas")))
        text = export_model(pallas, v, d, batch_size=8, platforms=("cuda",)).exported
        assert "triton" not in text.mlir_module()


@pytest.fixture(scope="module")
def molecules():
    """A GINE-virtual run on 82 molecules: categorical atoms and bonds, a virtual node."""
    from zerognn_jax import molhiv_like

    mol = molhiv_like(0.002, seed=1)
    cfg = TrainConfig(task="graph", dataset="molhiv-like", model="gine-virtual", hidden=8,
                      layers=2, batch_size=8, epochs=0, eval_mode="none", progress=False)
    return mol, train(cfg, mol)


def test_a_graph_level_artifact_gives_the_live_models_outputs_for_packed_graphs(molecules):
    """Graphs packed into the artifact's rows give the outputs evaluation gives them;
    a graph whose edge leaves it or with an id outside its vocabulary, or a call past
    the rows, gives NaN rows."""
    from zerognn_jax._src.training.tasks.graph import graph_outputs

    mol, res = molecules
    art = export_model(res.program, res.variables, res.data, batch_size=4, max_nodes=150,
                       max_edges=300)
    assert art.arguments == ("node_features", "edge_features", "senders", "receivers",
                             "n_node", "n_edge")
    call = jax.export.deserialize(art.serialize()).call
    ids = [5, 0, 17]
    given = graph_arguments(art, mol, ids)
    got = np.asarray(call(*given))
    want = graph_outputs(res.program, res.variables, res.data, np.array(ids), mol,
                         batch_size=3)
    np.testing.assert_allclose(got[:3], want, rtol=1e-5, atol=1e-6)
    assert np.isfinite(got[3]).all()  # the empty graph that pads the call
    assert not np.allclose(got[0], got[1])  # rows of their own graphs

    n_node, n_edge = given[4], given[5]
    for end in (2, 3):  # a sender, then a receiver, of graph 5 named outside it
        moved = list(given)
        moved[end] = given[end].copy()
        moved[end][0] = n_node[0]
        bad = np.asarray(call(*moved))
        assert np.isnan(bad[0]).all()
        np.testing.assert_allclose(bad[1:3], want[1:], rtol=1e-5, atol=1e-6)
    empty = list(given)  # an edge (0 -> 0) listed under the empty fourth graph
    empty[5] = n_edge + np.array([0, 0, 0, 1], np.int32)
    bad = np.asarray(call(*empty))
    assert np.isnan(bad[3]).all() and np.isfinite(bad[:3]).all()
    np.testing.assert_allclose(bad[1:3], want[1:], rtol=1e-5, atol=1e-6)
    # a category outside the vocabulary trained on (the encoder's tables are stacked:
    # column 0's id past its vocabulary read column 1's rows), negative, or fractional
    first_edge = n_node[0] + n_node[1], n_edge[0] + n_edge[1]  # graph 17's first rows
    for table, row, value in ((0, 0, mol.node_vocab[0]), (0, first_edge[0], -1.0),
                              (1, first_edge[1], 0.5), (1, 0, mol.edge_vocab[0])):
        odd = list(given)
        odd[table] = given[table].copy()
        odd[table][row, 0] = value
        bad = np.asarray(call(*odd))
        graph = 0 if row == 0 else 2
        assert np.isnan(bad[graph]).all(), (table, row, value)
        assert np.isfinite(np.delete(bad, graph, axis=0)).all(), (table, row, value)
    for counts in ([0, 0, 0, 151], [0, 0, 0, -1], [2**31 - 1, 2**31 - 1, 0, 0]):
        wrong = list(given)  # past the 150 rows, negative, or wrapping int32
        wrong[4] = np.array(counts, np.int32)
        assert np.isnan(np.asarray(call(*wrong))).all(), counts

    with pytest.raises(ValueError, match="at most 4 graphs a call, got 5"):
        graph_arguments(art, mol, [0, 1, 2, 3, 4])
    with pytest.raises(ValueError, match=r"graph ids in \[0, 82\), found \[0, 82\]"):
        graph_arguments(art, mol, [0, 82])
    with pytest.raises(ValueError, match="the artifact has rows for 150 and 300"):
        graph_arguments(art, mol, np.argsort(-np.diff(mol.node_offsets))[:4])
    with pytest.raises(ValueError, match="takes each call's graphs whole"):
        art.data_arguments(res.data)
    with pytest.raises(ValueError, match="ids must be integer graph ids, got dtype float64"):
        graph_arguments(art, mol, [1.5])
    with pytest.raises(ValueError, match=r"ids must be a 1-D list of graph ids, got shape "
                                         r"\[1, 2\]"):
        graph_arguments(art, mol, [[1, 2]])
    plain = dataclasses.replace(mol, edge_features=None, edge_vocab=())
    with pytest.raises(ValueError, match="takes edge features of 3 columns; collection "
                                         "'molhiv-like' has none"):
        graph_arguments(art, plain, [0])


def test_a_graph_level_artifact_of_float_features_and_no_edges():
    """A GIN on float node features of graphs without edges: default rows (one edge
    row at least) and the live model's outputs."""
    from zerognn_jax import make_collection
    from zerognn_jax._src.training.tasks.graph import graph_outputs

    rs = np.random.default_rng(4)
    n_node = rs.integers(1, 6, 24)
    feats = rs.normal(size=(int(n_node.sum()), 3)).astype(np.float32)
    col = make_collection("dots", n_node, np.zeros(24, int), [], [], feats,
                          rs.integers(0, 2, 24), "classes", num_classes=2,
                          splits=(np.arange(16), np.arange(16, 20), np.arange(20, 24)))
    cfg = TrainConfig(task="graph", dataset="dots", model="gin", hidden=8, layers=2,
                      batch_size=4, epochs=0, eval_mode="none", progress=False)
    res = train(cfg, col)
    art = export_model(res.program, res.variables, res.data, batch_size=4)
    assert art.arguments == ("node_features", "senders", "receivers", "n_node", "n_edge")
    assert art.exported.in_avals[1].shape == (1,)
    got = np.asarray(art.exported.call(*graph_arguments(art, col, [20, 21, 22, 23])))
    want = graph_outputs(res.program, res.variables, res.data, np.arange(20, 24), col,
                         batch_size=4)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_a_graph_level_artifact_summing_by_listed_edges_gives_the_same_outputs(molecules):
    """With max_degree the artifact lists each node's edges and sums by gathers: the
    outputs evaluation gives, and a NaN row for a graph with a node past the bound."""
    from zerognn_jax._src.training.tasks.graph import graph_outputs

    mol, res = molecules
    ids = np.array([5, 0, 17])
    want = graph_outputs(res.program, res.variables, res.data, ids, mol, batch_size=3)
    art = export_model(res.program, res.variables, res.data, batch_size=4, max_nodes=150,
                       max_edges=300, max_degree=6)
    given = graph_arguments(art, mol, ids)
    got = np.asarray(art.exported.call(*given))
    np.testing.assert_allclose(got[:3], want, rtol=1e-5, atol=1e-6)
    n_edge = given[5]
    star = list(given)  # graph 0's edges all redirected into its node 0: past 6 a node
    first = slice(0, int(n_edge[0]))
    for end in (2, 3):
        star[end] = given[end].copy()
        star[end][first] = 0
    assert int(n_edge[0]) > 6
    wide = np.asarray(art.exported.call(*star))
    assert np.isnan(wide[0]).all()
    np.testing.assert_allclose(wide[1:3], want[1:], rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match=r"max_degree must be an integer in \[1, max_edges "
                                         r"= 300\], got 0"):
        export_model(res.program, res.variables, res.data, batch_size=4, max_nodes=150,
                     max_edges=300, max_degree=0)


def test_a_graph_level_artifact_is_sized_for_any_batch_of_the_collection(molecules, trained):
    mol, res = molecules
    art = export_model(res.program, res.variables, res.data, batch_size=3)
    largest = lambda offsets: 3 * int(np.diff(offsets).max())
    assert art.exported.in_avals[0].shape == (largest(mol.node_offsets), 9)
    assert art.exported.in_avals[2].shape == (largest(mol.edge_offsets),)
    with pytest.raises(ValueError, match=r"max_edges must be in \[1, 2\*\*31 - 1\), got 0"):
        export_model(res.program, res.variables, res.data, batch_size=3, max_edges=0)
    with pytest.raises(ValueError, match="max_nodes must be an integer, got 2.5"):
        export_model(res.program, res.variables, res.data, batch_size=3, max_nodes=2.5)
    # rows that fit no graph as large as the collection's largest are warned of
    rows = int(np.diff(mol.node_offsets).max())
    with pytest.warns(UserWarning, match=rf"^max_nodes 3 is below the {rows} rows of the "
                                         rf"collection's largest graph: a call cannot take "
                                         rf"a graph that large$"):
        export_model(res.program, res.variables, res.data, batch_size=3, max_nodes=3)
    with pytest.raises(ValueError, match="one row per graph"):
        export_model(res.program, res.variables, res.data, batch_size=3, node_type="a")
    with pytest.raises(ValueError, match="max_nodes 10, max_degree 3: only a graph-level "
                                         "model's calls take sizes; this program's task "
                                         "is 'node'"):
        export_model(trained.program, trained.variables, trained.data, batch_size=4,
                     max_nodes=10, max_degree=3)
    node_art = export_model(trained.program, trained.variables, trained.data, batch_size=4)
    with pytest.raises(ValueError, match="packs graphs for a graph-level artifact"):
        graph_arguments(node_art, mol, [0])


def test_export_refuses_bad_batch_node_type_and_weighted_sampler(trained):
    p, v, d = trained.program, trained.variables, trained.data
    with pytest.raises(ValueError, match="batch_size must be an integer >= 1, got 0"):
        export_model(p, v, d, batch_size=0)
    with pytest.raises(ValueError, match="node_type picks a node type of a typed graph's "
                                         "model; this program's graph has one type"):
        export_model(p, v, d, batch_size=8, node_type="paper")
    weighted = dataclasses.replace(p, sampler=dataclasses.replace(p.sampler, method="weighted"))
    with pytest.raises(ValueError, match="samples by edge weight"):
        export_model(weighted, v, d, batch_size=8)
    with pytest.raises(ValueError, match="batch_size must be an integer >= 1, got True"):
        export_model(p, v, d, batch_size=True)
    with pytest.raises(ValueError, match=r"variables must be the model's variables, a mapping "
                                         r"with 'params'"):
        export_model(p, v["params"], d, batch_size=8)
    with pytest.raises(ValueError, match=r"platforms must be a tuple of names"):
        export_model(p, v, d, batch_size=8, platforms="cpu")
    other = {**v, "params": {"elsewhere": {"kernel": jax.tree_util.tree_leaves(v["params"])[0]}}}
    with pytest.raises(ValueError, match="the variables do not fit this program's model"):
        export_model(p, other, d, batch_size=8)


def test_one_artifact_lowers_for_cpu_and_cuda(trained):
    out = export_model(trained.program, trained.variables, trained.data, batch_size=8,
                       platforms=("cpu", "cuda"))
    assert out.exported.platforms == ("cpu", "cuda")
    back = jax.export.deserialize(out.serialize())
    d = trained.data
    got = back.call(d.graph.indptr, d.graph.indices, d.features,
                    jnp.arange(8, dtype=jnp.int32), jnp.ones(8, bool), jnp.uint32(1))
    assert got.shape == (8, 3) and bool(jnp.all(jnp.isfinite(got)))
