"""Edge features and learnable node embeddings through `zg.train`.

Sampled inference that reaches every neighbour must equal exact layer-wise inference:
each reads the edge-feature rows (and embedding rows) its own way, through edge ids of
sampled slots or through positions of CSR chunks, so a wrong row on either side shows.
"""

from __future__ import annotations

import dataclasses

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import assert_same_runs, random_graph

from zerognn_jax import TrainConfig, make_dataset, predict, restore, train
from zerognn_jax._src.nn.models import GNN
from zerognn_jax._src.training import trainer
from zerognn_jax._src.training.embeddings import NodeEmbedding
from zerognn_jax._src.training.evaluate import layerwise_logits, sampled_logits
from zerognn_jax._src.training.run_checks import ATTENTION_MODELS

D_EDGE = 3


def _edge_dataset(num_nodes: int = 240, num_edges: int = 900, seed: int = 5):
    """A random graph whose edges carry 3 features; a node's label (of 3) is the
    arg-max of the mean of its incident edges' features (its own features are noise)."""
    rs = np.random.default_rng(seed)
    g = random_graph(num_nodes, num_edges, seed=seed)
    table = rs.normal(size=(g.num_edges, D_EDGE)).astype(np.float32)
    sums = np.zeros((num_nodes, D_EDGE))
    np.add.at(sums, np.repeat(np.arange(num_nodes), np.diff(np.asarray(g.indptr))), table)
    labels = np.argmax(sums, 1)
    feats = rs.normal(size=(num_nodes, 4)).astype(np.float32)
    perm = rs.permutation(num_nodes)
    return make_dataset("edges", g.indptr, g.indices, feats, labels, perm[:120],
                        perm[120:160], perm[160:], 3, edge_features=table)


@pytest.fixture(scope="module")
def edge_data():
    return _edge_dataset()


def _cfg(**kw):
    base = dict(dataset="edges", model="gat", edge_features=True, hidden=8,
                layers=2, fanouts=(2, 2), batch_size=32, epochs=1, lr=0.01,
                eval_mode="none", progress=False)
    cfg = {**base, **kw}
    if cfg["model"] in ATTENTION_MODELS:  # heads of another model warn that they do nothing
        cfg.setdefault("heads", 2)
    return TrainConfig(**cfg)


@pytest.fixture(scope="module")
def sage_embedding_run(edge_data):
    """(config, result): two epochs of SAGE with a 4-wide learnable embedding, which
    the built-in GNN aggregates apart from the features: the resume test's
    uninterrupted run, and the apart side of the SAGE comparison."""
    cfg = _cfg(model="sage", edge_features=False, fanouts=(3, 2), epochs=2, embedding_dim=4)
    return cfg, train(cfg, edge_data)


@pytest.mark.parametrize("model,dedup,embedding_dim", [("gat", False, 5), ("gine", True, 0)])
def test_sampled_all_neighbours_equal_exact_with_edge_features(edge_data, model, dedup,
                                                               embedding_dim):
    """No epoch trains: the conservative envelope spares calibrating one (both
    inferences size their own)."""
    deg = edge_data.graph.max_degree()
    res = train(_cfg(model=model, fanouts=(deg, deg), dedup=dedup, epochs=0,
                     embedding_dim=embedding_dim, envelope="conservative"), edge_data)
    assert res.data.graph.edge_features.shape == (edge_data.graph.num_edges, D_EDGE)
    exact = np.asarray(layerwise_logits(res.program, res.variables, res.data))
    nodes = np.arange(edge_data.graph.num_nodes)
    got = sampled_logits(res.program, res.variables, res.data, nodes, batch_size=64)
    np.testing.assert_allclose(np.asarray(got), exact, rtol=1e-4, atol=1e-4)


def test_a_graph_whose_only_edges_are_self_loops_trains_gat_with_edge_features():
    """GAT drops self-loops, leaving a table of no rows, whose gather the sampled views
    failed on ("slice size ... out of range"); every node then has no neighbour."""
    data = make_dataset("loops", np.array([0, 1, 2, 2, 2, 2]), np.array([0, 1]),
                        np.random.default_rng(0).normal(size=(5, 3)).astype(np.float32),
                        np.array([0, 1, 0, 1, 0]), [0, 1, 2], [3], [4], 2,
                        edge_features=np.ones((2, 2), np.float32))
    res = train(_cfg(model="gat", fanouts=(-1, -1), batch_size=4, epochs=1), data)
    assert res.data.graph.edge_features.shape == (0, 2)
    exact = np.asarray(layerwise_logits(res.program, res.variables, res.data))
    got = sampled_logits(res.program, res.variables, res.data, np.arange(5), batch_size=4)
    np.testing.assert_allclose(np.asarray(got), exact, rtol=1e-5, atol=1e-6)


def test_model_outputs_depend_on_the_edge_table(edge_data):
    res = train(_cfg(fanouts=(4, 4), epochs=0, envelope="conservative"), edge_data)
    nodes = np.arange(16)

    def total(table):
        data = res.data._replace(graph=res.data.graph._replace(edge_features=table))
        return jnp.sum(sampled_logits(res.program, res.variables, data, nodes,
                                      batch_size=16))

    grad = np.asarray(jax.grad(total)(res.data.graph.edge_features))
    touched = np.abs(grad).sum(1) > 0
    # The rows read are edges of the seeds' rows (hop 1) and of their neighbours' rows
    # (hop 2); a row's draws depend on its node and hop, so a row gives at most 4 a hop,
    # and each seed's row all 4 of its first hop.
    indptr, indices = np.asarray(edge_data.graph.indptr), np.asarray(edge_data.graph.indices)
    row = np.repeat(np.arange(indptr.size - 1), np.diff(indptr))
    reach = np.union1d(nodes, indices[np.isin(row, nodes)])
    assert touched.any() and not (touched & ~np.isin(row, reach)).any()
    per_row = np.bincount(row[touched], minlength=indptr.size - 1)
    assert per_row.max() <= 2 * 4
    assert (per_row[nodes] >= np.minimum(np.diff(indptr)[nodes], 4)).all(), per_row[nodes]


def test_gine_learns_labels_its_edge_features_carry(edge_data):
    """The built-in GINE's output layer passed its MLP through as many ReLU units as
    classes (3 here): they died within the first epochs and the logits stayed constant
    (train accuracy 0.38 after 20 and 40 epochs). Its inner width is now the model's
    hidden width."""
    cfg = _cfg(model="gine", hidden=16, fanouts=(-1, -1), dropout=0.0, epochs=20,
               eval_mode="full")
    result = train(cfg, edge_data)
    assert result.summary["train_acc"] > 0.8 and result.summary["test_acc"] > 0.7, \
        result.summary
    kernels = {k: v["kernel"].shape for k, v in result.variables["params"]["convs_1"].items()
               if k.startswith("Dense")}
    assert kernels == {"Dense_0": (16, 16), "Dense_1": (16, 3)}


def test_edge_feature_options_refuse_what_cannot_run(edge_data):
    plain = dataclasses.replace(edge_data, graph=edge_data.graph._replace(edge_features=None))
    with pytest.raises(ValueError, match="has no edge-feature table"):
        train(_cfg(fanouts=(2, 2)), plain)
    with pytest.raises(ValueError, match="model 'sage' reads none"):
        train(_cfg(model="sage", fanouts=(2, 2)), edge_data)
    # in Python the field (set edge_features), as every config message names it
    with pytest.raises(ValueError, match=r"'gine' reads edge features: set edge_features "
                                         r"\(--edge-features\)"):
        _cfg(model="gine", edge_features=False)
    with pytest.raises(ValueError, match="embedding_dim must be >= 0"):
        _cfg(embedding_dim=-1)


class _EdgeSums(nn.Module):
    """A user's model that reads the sampled edges' features."""

    @nn.compact
    def __call__(self, x, views, *, train):
        for view in views:
            edges = view.sum_edges(view.edge_features())
            x = nn.Dense(3)(jnp.concatenate([x[: view.num_dst], edges], -1))
        return x


def test_a_users_model_that_reads_edges_is_told_the_option_it_lacks(edge_data):
    with pytest.raises(ValueError, match=r"the model _EdgeSums reads edge features "
                                         r"\(view.edge_features\(\)\), and this run gives "
                                         r"it none: pass edge_features=True "
                                         r"\(--edge-features\)"):
        train(_cfg(model="sage", edge_features=False), edge_data, model=_EdgeSums())
    res = train(_cfg(model="sage"), edge_data, model=_EdgeSums())  # with the option
    assert np.isfinite(res.history[-1]["loss"])


def test_embedding_rows_no_step_read_stay_bit_unchanged(edge_data):
    """One epoch over a 16-node training set with fanout 1: rows no step's outermost
    level held keep their initial values; the rows it held moved."""
    ds = dataclasses.replace(edge_data, train_idx=edge_data.train_idx[:16])
    res = train(_cfg(model="sage", edge_features=False, fanouts=(1, 1), batch_size=8,
                     embedding_dim=4), ds)
    initial, _ = NodeEmbedding(4, 0.01).init(ds.graph.num_nodes, 0)
    table, initial = np.asarray(res.state.embedding), np.asarray(initial)
    touched = np.abs(np.asarray(res.state.embedding_opt.mu)).sum(1) > 0
    assert int(res.state.embedding_opt.count) == 2
    assert 16 <= touched.sum() < ds.graph.num_nodes // 2
    np.testing.assert_array_equal(table[~touched], initial[~touched])
    assert np.all(np.any(table[touched] != initial[touched], axis=1))
    assert set(res.variables) == {"params", "embedding"}


class _OwnEmbedding(nn.Module):
    """A user's model with its own (dense) per-node table, indexed by the view's ids."""

    num_nodes: int

    @nn.compact
    def __call__(self, x, views, *, train):
        seeds = views[0].node_ids[: views[-1].num_dst]  # every level starts with the seeds
        return nn.Dense(2)(nn.relu(nn.Embed(self.num_nodes, 8)(seeds)))


def test_embeddings_learn_labels_features_cannot_carry():
    """Constant features, random labels: only a per-node embedding can fit them, the
    built-in one (lazy Adam) or a user's model reading its views' node ids."""
    rs = np.random.default_rng(0)
    g = random_graph(128, 300, seed=1)
    ds = make_dataset("random-labels", g.indptr, g.indices, np.ones((128, 1), np.float32),
                      rs.integers(0, 2, 128), np.arange(128), np.arange(0), np.arange(0), 2)
    accs = {}
    for name, dim, model in (("none", 0, None), ("built-in", 8, None),
                             ("own", 0, _OwnEmbedding(128))):
        cfg = TrainConfig(dataset="random-labels", model="mlp", hidden=16, layers=2,
                          fanouts=(2, 2), batch_size=64, epochs=40, lr=0.05, dropout=0.0,
                          embedding_dim=dim, eval_mode="none", progress=False)
        accs[name] = train(cfg, ds, model=model).history[-1]["train_batch_acc"]
    assert accs["built-in"] > 0.95 and accs["own"] > 0.95 and accs["none"] < 0.75, accs


def test_embeddings_resume_from_a_checkpoint_as_if_never_stopped(edge_data,
                                                                sage_embedding_run, tmp_path):
    cfg, whole = sage_embedding_run
    first = dataclasses.replace(cfg, epochs=1, checkpoint_dir=str(tmp_path))
    train(first, edge_data)
    resumed = train(dataclasses.replace(first, epochs=2), edge_data)
    assert resumed.history[0]["epoch"] == 0 and len(resumed.history) == 2
    # Bit for bit on the CPU; a GPU's scatter-adds sum in no fixed order.
    same = (np.testing.assert_array_equal if jax.default_backend() == "cpu" else
            lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6))
    same(np.asarray(resumed.state.embedding), np.asarray(whole.state.embedding))
    same(np.asarray(resumed.state.embedding_opt.nu), np.asarray(whole.state.embedding_opt.nu))
    back = restore(str(tmp_path), dataclasses.replace(first, epochs=2), edge_data,
                   for_inference=True)
    np.testing.assert_array_equal(np.asarray(back.variables["embedding"]),
                                  np.asarray(resumed.state.embedding))


def test_given_variables_bring_their_embedding(edge_data, sage_embedding_run):
    """variables= of a run with an embedding start a run from that table (its moments
    fresh): no epochs give the same predictions; variables without the table start the
    run's own afresh (a fine-tune on another graph); a table the run has no place for,
    or of another shape, is refused by name."""
    cfg, whole = sage_embedding_run
    again = train(dataclasses.replace(cfg, epochs=0), edge_data, variables=whole.variables)
    np.testing.assert_array_equal(np.asarray(again.variables["embedding"]),
                                  np.asarray(whole.variables["embedding"]))
    assert not np.asarray(again.state.embedding_opt.nu).any()
    nodes = np.arange(edge_data.graph.num_nodes)
    assert_same_runs(predict(again, nodes), predict(whole, nodes))  # (a GPU's sums drift)
    fresh = train(dataclasses.replace(cfg, epochs=0), edge_data,
                  variables={"params": whole.variables["params"]})  # another graph's
    np.testing.assert_array_equal(np.asarray(fresh.variables["embedding"]),
                                  NodeEmbedding(4, 0.01).init(240, cfg.seed)[0])
    wide = {**whole.variables, "embedding": np.zeros((240, 5), np.float32)}
    with pytest.raises(ValueError, match=r"variables\['embedding'\] has shape \[240, 5\]; "
                                         r"this run's node embedding is \[240, 4\]"):
        train(dataclasses.replace(cfg, epochs=0), edge_data, variables=wide)
    plain = train(dataclasses.replace(cfg, epochs=0, embedding_dim=0), edge_data)
    with pytest.raises(ValueError, match=r"hold a node embedding of shape \[240, 4\], and "
                                         r"this run has none"):
        train(dataclasses.replace(cfg, epochs=0, embedding_dim=0), edge_data,
              variables={**plain.variables, "embedding": whole.variables["embedding"]})


def test_placement_counts_only_the_edge_features_a_model_reads(edge_data, monkeypatch):
    """The memory plan behind feature_placement="auto" sees the edge-feature table when
    the model reads it (in the run's dtype) and not when it stays on the host."""
    from zerognn_jax._src.training import memory, trainer

    seen = []
    plan = memory.resident_bytes
    monkeypatch.setattr(memory, "resident_bytes",
                        lambda graph, *a, **k: seen.append(graph.edge_features) or
                        plan(graph, *a, **k))
    trainer.prepare(_cfg(edge_features=False, model="sage"), edge_data)
    trainer.prepare(_cfg(dtype="bfloat16"), edge_data)
    assert seen[0] is None
    assert seen[1].dtype == jnp.bfloat16 and seen[1].shape == edge_data.graph.edge_features.shape


def test_memory_check_counts_the_embedding_rows_devices_gather(edge_data, monkeypatch):
    """The check before compiling is given the rows a step's embedding update gathers
    over the devices: the outermost level's capacity of the envelope it checks, the
    table's width and dtype, the mesh's size."""
    from zerognn_jax._src.training import memory

    class Checked(Exception):
        pass

    def check(envelope, *args, extra_step_bytes=0, **kw):
        seen.append((envelope, extra_step_bytes))
        raise Checked

    seen, gathered = [], []
    monkeypatch.setattr(memory, "gathered_rows_bytes",
                        lambda *args: gathered.append(args) or 12345)
    monkeypatch.setattr(memory, "check_fits", check)
    with pytest.raises(Checked):
        train(_cfg(model="sage", edge_features=False, embedding_dim=3, dtype="bfloat16"),
              edge_data)
    ((env, extra),) = seen
    assert gathered == [(env.levels[-1], 3, "bfloat16", 1)] and extra == 12345


@pytest.mark.parametrize("model", ["sage", "sage-max"])
def test_sage_aggregates_features_and_embedding_apart_as_if_joined(edge_data, model,
                                                                   sage_embedding_run,
                                                                   monkeypatch):
    """The built-in GNN takes (features, embedding rows) as a pair and its SAGE layer
    aggregates them apart; training equals the concatenated input's, losses and the
    table after two epochs, up to float32 rounding (SAGE's apart run: the module's)."""
    def run(apart: bool):
        class Joined(NodeEmbedding):  # the pair's concatenation, as a user's model gets it
            def __init__(self, *args, **kw):
                super().__init__(*args, **{**kw, "apart": apart})

        cfg = dataclasses.replace(sage_embedding_run[0], model=model)
        if cfg == sage_embedding_run[0] and apart:  # the built-in default: apart
            res = sage_embedding_run[1]
        else:
            monkeypatch.setattr(trainer, "NodeEmbedding", Joined)
            res = train(cfg, edge_data)
        assert res.program.embedding.apart is apart
        return [r["loss"] for r in res.history], np.asarray(res.state.embedding)

    (apart_losses, apart_table), (joined_losses, joined_table) = run(True), run(False)
    np.testing.assert_allclose(apart_losses, joined_losses, rtol=1e-6)
    np.testing.assert_allclose(apart_table, joined_table, rtol=1e-5, atol=1e-7)
    assert not np.array_equal(apart_table, NodeEmbedding(4, 0.01).init(240, 0)[0])


class _HalvedInput(GNN):
    """A user's GNN subclass that touches its input array."""

    def __call__(self, x, views, *, train):
        return super().__call__(x * 0.5, views, train=train)


def test_a_users_gnn_subclass_gets_the_concatenated_input(edge_data):
    model = _HalvedInput("sage", hidden=8, num_layers=2, num_classes=3)
    res = train(_cfg(model="sage", edge_features=False, embedding_dim=4), edge_data,
                model=model)
    assert res.program.embedding.apart is False and np.isfinite(res.history[-1]["loss"])


def test_link_prediction_with_an_embedding_evaluates(edge_data):
    """The decoder scores pairs with the model's variables, not the node embedding."""
    res = train(_cfg(task="link", model="sage", edge_features=False, embedding_dim=4,
                     eval_mode="full"), edge_data)
    assert res.program.embedding.apart is True
    assert 0.0 <= res.history[-1]["test_auc"] <= 1.0
