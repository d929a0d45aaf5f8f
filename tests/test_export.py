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

from zerognn_jax import TrainConfig, export_model, layerwise_logits, make_dataset, train
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


def test_exported_full_neighbourhood_model_equals_exact_inference():
    """With every neighbour sampled, the artifact must give exact layer-wise logits."""
    res = _train((-1, -1))
    d = res.data
    back = jax.export.deserialize(export_model(res.program, res.variables, d,
                                               batch_size=32).serialize())
    seeds = jnp.arange(100, 132, dtype=jnp.int32)
    got = back.call(d.graph.indptr, d.graph.indices, d.features, seeds, jnp.ones(32, bool),
                    jnp.uint32(3))
    exact = np.asarray(layerwise_logits(res.program, res.variables, d))[100:132]
    np.testing.assert_allclose(np.asarray(got), exact, rtol=1e-4, atol=1e-4)


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
    if options["model"] == "rsage":  # views that ran Pallas kernels export their XLA twins
        from zerognn_jax._src.ops.registry import Kernels

        pallas = dataclasses.replace(p, model=p.model.clone(kernels=Kernels.parse("pallas")))
        text = export_model(pallas, v, d, batch_size=8, platforms=("cuda",)).exported
        assert "triton" not in text.mlir_module()


def test_export_refuses_a_graph_collection():
    """A graph-level program is refused in one line naming its task."""
    from zerognn_jax import molhiv_like
    from zerognn_jax._src.training.trainer import prepare

    cfg = TrainConfig(task="graph", dataset="molhiv-like", model="gin", hidden=8, layers=2,
                      batch_size=8, epochs=1, eval_mode="none", progress=False)
    _, data, program = prepare(cfg, molhiv_like(0.002, seed=1))
    with pytest.raises(ValueError, match=r"\(GraphTask\) batches graph collections, which "
                                         r"are not served yet"):
        export_model(program, {}, data, batch_size=4)


def test_export_refuses_bad_batch_node_type_and_weighted_sampler(trained):
    p, v, d = trained.program, trained.variables, trained.data
    with pytest.raises(ValueError, match="batch_size must be a positive int, got 0"):
        export_model(p, v, d, batch_size=0)
    with pytest.raises(ValueError, match="node_type picks a node type of a typed graph's "
                                         "model; this program's graph has one type"):
        export_model(p, v, d, batch_size=8, node_type="paper")
    weighted = dataclasses.replace(p, sampler=dataclasses.replace(p.sampler, method="weighted"))
    with pytest.raises(ValueError, match="samples by edge weight"):
        export_model(weighted, v, d, batch_size=8)


def test_one_artifact_lowers_for_cpu_and_cuda(trained):
    out = export_model(trained.program, trained.variables, trained.data, batch_size=8,
                       platforms=("cpu", "cuda"))
    assert out.exported.platforms == ("cpu", "cuda")
    back = jax.export.deserialize(out.serialize())
    d = trained.data
    got = back.call(d.graph.indptr, d.graph.indices, d.features,
                    jnp.arange(8, dtype=jnp.int32), jnp.ones(8, bool), jnp.uint32(1))
    assert got.shape == (8, 3) and bool(jnp.all(jnp.isfinite(got)))
