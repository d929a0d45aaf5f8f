"""Graph batching and the graph task: every training graph exactly once per epoch
(plain and size-balanced), packed batches that keep each graph's nodes and edges,
exact overflow recovery, the models' readouts, a user's model. Learning beyond a
node-count baseline: tests/test_examples.py (examples/graph)."""

from __future__ import annotations

import dataclasses
import functools
import json
import re
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from conftest import runs_rtol

import zerognn_jax as zg
from zerognn_jax._src.sampling import graph_batch
from zerognn_jax._src.sampling.envelope import round_up
from zerognn_jax._src.sampling.graph_batch import graph_tables, step_graphs
from zerognn_jax._src.training import trainer
from zerognn_jax._src.training.trainer import prepare


@pytest.fixture(scope="module")
def molecules():
    return zg.molhiv_like(0.008, seed=3, positive_rate=0.3)  # 329 graphs


def epoch_graphs(collection, batch_size, window, epoch=0):
    """Every step's (ids, valid) of one epoch, and the step count."""
    items = jnp.asarray(collection.train_idx)
    perm = zg.epoch_items(items, batch_size, 0, epoch)
    n_node = jnp.asarray(collection.n_node, jnp.int32)
    steps = perm.shape[0] // batch_size
    one = jax.jit(lambda s: step_graphs(perm, s, batch_size, window, n_node))
    return [one(s) for s in range(steps)]


@pytest.mark.parametrize("window", [0, 4])
def test_every_graph_once_per_epoch(molecules, window):
    seen = [np.asarray(ids)[np.asarray(valid)] for ids, valid in
            epoch_graphs(molecules, 24, window, epoch=1)]
    seen = np.sort(np.concatenate(seen))
    np.testing.assert_array_equal(seen, np.sort(molecules.train_idx))


def test_balancing_narrows_batch_sizes(molecules):
    totals = {}
    for window in (0, 8):
        steps = epoch_graphs(molecules, 24, window)[:-1]  # the last step is short
        totals[window] = [int(molecules.n_node[np.asarray(i)[np.asarray(v)]].sum())
                          for i, v in steps]
    assert np.std(totals[8]) < 0.5 * np.std(totals[0])


def test_pack_keeps_each_graph(molecules):
    tables = jax.tree_util.tree_map(jnp.asarray, graph_tables(molecules))
    ids = np.array([5, 0, 17, 2], np.int32)
    valid = np.array([True, True, True, False])
    pack = jax.jit(zg.pack_graphs, static_argnums=(3, 4, 5))
    gb = pack(tables, ids, valid, 256, 512, 6)
    n = molecules.n_node[ids[:3]].sum()
    e = molecules.n_edge[ids[:3]].sum()
    degree = int(np.asarray(tables.max_degree)[ids[:3]].max())
    assert not gb.overflow and list(gb.counts) == [n + 1, e, degree]
    rows = np.concatenate([np.arange(*molecules.node_offsets[g:g + 2]) for g in ids[:3]])
    np.testing.assert_array_equal(np.asarray(gb.node_ids)[:n], rows)
    graph_of = np.asarray(gb.node_graph)
    s, r, mask = (np.asarray(a) for a in (gb.senders, gb.receivers, gb.edge_mask))
    np.testing.assert_array_equal(graph_of[s[mask]], graph_of[r[mask]])  # inside graphs
    assert (s[~mask] == 255).all() and (r[~mask] == 255).all() and graph_of[255] == 4
    np.testing.assert_array_equal(gb.n_node, [*molecules.n_node[ids[:3]], 0, 256 - n])
    for slots, ends in ((gb.in_slots, r), (gb.out_slots, s)):  # each node's real edges
        listed = sorted((v, int(k)) for v, row in enumerate(np.asarray(slots)) for k in row
                        if k < 512)
        assert listed == sorted((int(ends[k]), k) for k in np.flatnonzero(mask))
    narrow = zg.pack_graphs(tables, ids, valid, 256, 512, degree - 1)
    assert bool(narrow.overflow) and int(narrow.counts[2]) == degree
    small = zg.pack_graphs(tables, ids, valid, int(n), 512)  # no slot for the padding node
    assert bool(small.overflow) and int(small.counts[0]) == n + 1


def test_pack_compares_or_searches_alike(molecules, monkeypatch):
    """Slot owners come from comparing every slot with every graph's end up to
    COMPARE_ALL_LIMIT pairs and from a binary search above it: the same packing."""
    tables = jax.tree_util.tree_map(jnp.asarray, graph_tables(molecules))
    ids = jnp.asarray(np.arange(3, 31), jnp.int32)
    valid = jnp.arange(28) < 25
    packed = []
    for limit in (graph_batch.COMPARE_ALL_LIMIT, 0):
        monkeypatch.setattr(graph_batch, "COMPARE_ALL_LIMIT", limit)
        packed.append(zg.pack_graphs(tables, ids, valid, 1024, 2048, 8))
    for a, b in zip(*packed):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    assert int(np.asarray(packed[0].node_graph).max()) == 28  # the padding graph's slot


def test_pack_searches_without_a_loop(monkeypatch):
    """Above COMPARE_ALL_LIMIT the slots' graphs come from a search without a loop:
    JAX's default search would put a `while` of log2(B) iterations inside every step's
    program."""
    monkeypatch.setattr(graph_batch, "COMPARE_ALL_LIMIT", 0)
    ends = jnp.asarray([3, 3, 9, 20], jnp.int32)
    text = jax.jit(lambda e: graph_batch._slot_graph(e, 24)).lower(ends).as_text()
    assert "stablehlo.while" not in text
    np.testing.assert_array_equal(np.asarray(graph_batch._slot_graph(ends, 24)),
                                  [0, 0, 0] + [2] * 6 + [3] * 11 + [4] * 4)


def test_readouts():
    graphs = zg.Graphs(jnp.array([[1.0], [3.0], [5.0], [0.0]]), None, jnp.zeros(1, jnp.int32),
                       jnp.zeros(1, jnp.int32), jnp.array([2, 1, 1]), jnp.array([0, 0, 1]),
                       None, jnp.array([0, 0, 1, 2]), jnp.array([True, True, True, False]),
                       jnp.array([False]), jnp.array([True, True, False]))
    for how, want in (("sum", [4, 5]), ("mean", [2, 5]), ("max", [3, 5])):
        np.testing.assert_allclose(zg.pool(graphs.nodes, graphs, how)[:2, 0], want)


def test_attention_readout_weighs_a_graphs_nodes():
    """Attention pooling is a weighted mean of a graph's nodes (the weights sum to one):
    on graphs whose nodes GIN cannot tell apart (a triangle and an edge, each node with
    the same features) it gives the mean readout's logits with the same parameters; on a
    path of distinct nodes it gives others."""
    rs = np.random.default_rng(0)
    nodes = np.concatenate([np.tile(rs.normal(size=4), (3, 1)),
                            np.tile(rs.normal(size=4), (2, 1)), rs.normal(size=(3, 4)),
                            np.zeros((1, 4))])  # triangle 0-2, edge 3-4, path 5-7, padding
    pairs = [(0, 1), (1, 2), (0, 2), (3, 4), (5, 6), (6, 7)]
    send = jnp.array([n for p in pairs for n in p] + [8], jnp.int32)
    recv = jnp.array([n for p in pairs for n in p[::-1]] + [8], jnp.int32)
    graphs = zg.Graphs(jnp.asarray(nodes, jnp.float32), None, send, recv,
                       jnp.array([3, 2, 3, 1]), jnp.array([6, 2, 4, 1]), None,
                       jnp.array([0, 0, 0, 1, 1, 2, 2, 2, 3]), jnp.arange(9) < 8,
                       jnp.arange(13) < 12, jnp.arange(4) < 3)
    models = {how: zg.make_graph_model("gin", hidden=8, num_layers=2, out_dim=3, dropout=0.0,
                                       readout=how) for how in ("attention", "mean")}
    variables = models["attention"].init(jax.random.key(0), graphs, train=False)
    att, mean = (np.asarray(m.apply(variables, graphs, train=False)) for m in models.values())
    np.testing.assert_allclose(att[:2], mean[:2], rtol=1e-5, atol=1e-6)
    assert np.abs(att[2] - mean[2]).max() > 1e-3


def config(**kw):
    base = dict(task="graph", dataset="molhiv-like", model="gine", hidden=16, layers=2,
                batch_size=24, epochs=2, lr=3e-3, progress=False, sample_ahead=1,
                eval_batch_size=512, dropout=0.0)
    return zg.TrainConfig(**{**base, **kw})


@pytest.fixture
def full_precision():
    """float32 matrix products in full float32: a GPU's default (TF32) leaves two runs
    that pad the same batches differently ~1e-3 apart (seen on an H200), above the
    tolerances of the tests that compare them; a CPU computes them alike either way."""
    with jax.default_matmul_precision("highest"):
        yield


@pytest.mark.usefixtures("full_precision")
def test_overflow_recovery_is_exact(molecules):
    """An envelope below some batches overflows, grows and reruns them; the run equals
    one that had the grown envelope from the start (one engine: the grown envelope's
    program is compiled once and serves both runs)."""
    cfg = config(layers=1, hidden=8)
    # SGD: Adam would turn the rounding noise of a zero gradient (a bias before batch
    # norm) into full steps, which the runs, padded differently, need not share.
    _, data, program = prepare(cfg, molecules, optimizer=optax.sgd(0.1))
    items = program.task.train_items(molecules)
    fitting, _ = program.task.choose_envelope(program, data, molecules, cfg)
    engine = zg.ScanEngine(program, chunk_steps=4)
    start = zg.init_state(program, data, fitting, items)
    runs = {}
    env = zg.Envelope(fitting.batch_size - 192, fitting.capacities)  # some batches overflow
    for name in ("small", "grown"):
        state = jax.tree_util.tree_map(jnp.copy, start)  # the engine donates its state
        losses, overflows = [], 0
        for epoch in range(2):
            res = engine.run_epoch(state, data, items, epoch, env)
            state, env = res.state, res.envelope
            losses.append(res.loss)
            overflows += res.overflows
        runs[name] = (losses, overflows, state)
    assert runs["small"][1] > 0 and runs["grown"][1] == 0
    # Same batches, different padding: sums over longer padded rows may round apart.
    np.testing.assert_allclose(runs["small"][0], runs["grown"][0], rtol=1e-5)
    flat = lambda s: np.concatenate([np.ravel(x) for x in jax.tree_util.tree_leaves(s.params)])
    np.testing.assert_allclose(flat(runs["small"][2]), flat(runs["grown"][2]), rtol=1e-4,
                               atol=1e-6)


def test_calibration_takes_the_largest_batch_without_a_margin_unless_given(molecules):
    """Calibration counts every batch of the run's epochs, so its largest is exact: by
    default the envelope is that batch rounded to 64 slots; a margin given widens it.
    Unset, the margin of every other envelope (sampled calibration, growth) is 1.1."""
    cfg = config()
    assert cfg.margin is None and cfg.envelope_policy.margin == 1.1
    _, data, program = prepare(cfg, molecules)
    env, cal = program.task.choose_envelope(program, data, molecules, cfg)
    nodes, edges = cal.max_counts[:2]
    assert (env.batch_size, env.capacities[0]) == (round_up(nodes, 64), round_up(edges, 64))
    wide, _ = program.task.choose_envelope(program, data, molecules,
                                           dataclasses.replace(cfg, margin=1.5))
    assert (wide.batch_size, wide.capacities[0]) == (round_up(1.5 * nodes, 64),
                                                     round_up(1.5 * edges, 64))


@pytest.mark.usefixtures("full_precision")
@pytest.mark.parametrize("model", ["gine-virtual", "gcn"])
def test_ell_trains_as_segment_and_recovers_a_narrow_width(molecules, model):
    """The ELL aggregation (the GPU's choice) trains an epoch as the scatter-add
    reference does (GINE: edge features; GCN: degrees from the lists); for GINE an
    envelope whose K is below the molecules' degrees overflows, widens and redoes
    those batches."""
    from zerognn_jax._src.training.tasks.graph import ell_envelope

    runs = {}
    for aggregation in ("segment", "ell"):
        cfg = config(layers=2, hidden=8, model=model, graph_aggregation=aggregation)
        _, data, program = prepare(cfg, molecules, optimizer=optax.sgd(0.1))
        items = program.task.train_items(molecules)
        env, _ = program.task.choose_envelope(program, data, molecules, cfg)
        narrow = aggregation == "ell" and model == "gine-virtual"
        if narrow:
            nodes, edges, width = program.task.capacities(env)
            assert width > 2
            env = ell_envelope(nodes, edges, 2)
        state = zg.init_state(program, data, env, items)
        runs[aggregation] = zg.ScanEngine(program, chunk_steps=8).run_epoch(
            state, data, items, 0, env)
    assert runs["segment"].overflows == 0
    if narrow:
        assert runs["ell"].overflows > 0
        assert program.task.capacities(runs["ell"].envelope)[2] > 2  # K widened
    np.testing.assert_allclose(runs["ell"].loss, runs["segment"].loss, rtol=1e-5)
    flat = lambda s: np.concatenate([np.ravel(x) for x in jax.tree_util.tree_leaves(s.params)])
    # a GPU's scatter-adds sum in any order: an epoch of SGD drifts the two apart (on an
    # H200, 8 % of the values by up to 7.8e-5 once, none the next run)
    on_cpu = jax.default_backend() == "cpu"
    np.testing.assert_allclose(flat(runs["ell"].state), flat(runs["segment"].state),
                               rtol=1e-4 if on_cpu else runs_rtol(),
                               atol=1e-6 if on_cpu else 1e-4)


def test_ell_envelope_grows_its_width():
    """Node slots x K ELL slots: a batch with a larger degree widens K (and a growth
    in node slots keeps it); a checkpoint saved without ELL slots starts narrow."""
    task = zg.GraphTask(aggregation="ell")
    policy = zg.EnvelopePolicy(margin=1.0, multiple=64)
    env = task.grow_envelope(None, zg.Envelope(128, (256, 128 * 4)), (100, 200, 6), policy)
    assert task.capacities(env) == (128, 256, 6)
    env = task.grow_envelope(None, env, (300, 200, 2), policy)
    assert task.capacities(env) == (320, 640, 6)  # edges grow with the nodes
    assert task.capacities(task.envelope_from(None, {"batch_size": 64, "capacities": [256]})) \
        == (64, 256, 4)
    segment = zg.GraphTask(aggregation="segment")
    assert segment.capacities(segment.grow_envelope(None, zg.Envelope(128, (256,)),
                                                    (100, 300, 9), policy)) == (128, 320, None)
    # only the degree overflowed: the slots stay, even under the engine's 1024 rounding
    wide = task.grow_envelope(None, zg.Envelope(128, (256, 128 * 4)), (100, 200, 9),
                              zg.EnvelopePolicy())
    assert task.capacities(wide) == (128, 256, 9)
    with pytest.raises(ValueError, match="'ell' or 'segment', got 'scatter'"):
        zg.GraphTask(aggregation="scatter")


@functools.cache
def _user_model():
    import flax.linen as nn

    class SumOfNodes(nn.Module):
        """A user's graph-level model: a linear map of the summed node features."""

        @nn.compact
        def __call__(self, graphs, *, train):
            del train
            return nn.Dense(1)(zg.pool(graphs.nodes, graphs, "sum"))

    return SumOfNodes()


def test_a_users_nnx_graph_model_trains(molecules):
    """An NNX module taking the batch of graphs (as a Linen one does) was called as a
    node model, (x, views): "missing 1 required positional argument: 'views'"."""
    from flax import nnx

    class NNXSumOfNodes(nnx.Module):
        def __init__(self, rngs):
            self.dense = nnx.Linear(molecules.node_features.shape[1], 1, rngs=rngs)

        def __call__(self, graphs, *, train):
            return self.dense(zg.pool(graphs.nodes, graphs, "sum"))

    result = zg.train(config(model=None, epochs=1, eval_mode="none"), molecules,
                      model=NNXSumOfNodes(nnx.Rngs(0)))
    assert result.summary["model"].endswith("NNXSumOfNodes")
    assert np.isfinite(result.history[0]["loss"])


def test_user_model_resume_and_errors(molecules, tmp_path):
    cfg = config(model=None, epochs=1, eval_mode="none", checkpoint_dir=str(tmp_path))
    result = zg.train(cfg, molecules, model=_user_model())
    assert result.summary["model"].endswith("SumOfNodes") and np.isfinite(result.history[0]["loss"])
    # a model of the user's leaves the field as its runs recorded it (their checkpoints
    # compare it), not the graph task's default
    assert result.summary["config"]["model"] == "sage"
    resumed = zg.train(dataclasses.replace(cfg, epochs=2), molecules, model=_user_model())
    assert (resumed.summary["start_epoch"], resumed.summary["epochs_run"]) == (1, 1)
    assert [h["loss"] for h in resumed.history][:1] == [result.history[0]["loss"]]
    # another collection of as many nodes is refused by its graphs' count (it resumed);
    # a checkpoint from before graphs and edges were recorded is not compared on them
    meta = tmp_path / "1" / "meta" / "metadata"
    record = json.loads(meta.read_text())
    graphs = record["identity"]["dataset.graphs"]
    assert graphs == molecules.num_graphs
    record["identity"]["dataset.graphs"] = graphs + 7
    meta.write_text(json.dumps(record))
    more = dataclasses.replace(cfg, epochs=3)
    with pytest.raises(zg.CheckpointMismatch,
                       match=rf"dataset.graphs {graphs + 7} there, {graphs} here"):
        zg.train(more, molecules, model=_user_model())
    for key in ("dataset.graphs", "dataset.edges"):
        del record["identity"][key]
    meta.write_text(json.dumps(record))
    assert zg.train(more, molecules, model=_user_model()).summary["start_epoch"] == 2
    unlabelled = dataclasses.replace(molecules, targets=np.where(
        np.isin(np.arange(molecules.num_graphs), molecules.train_idx)[:, None], np.nan,
        molecules.targets))
    with pytest.raises(ValueError, match=r"molhiv-like's training graphs have no target: "
                                         r"every entry of targets\[train_idx\] is missing"):
        zg.train(config(), unlabelled)
    with pytest.raises(ValueError, match="unknown graph model 'sage'"):
        zg.train(config(model="sage"), molecules)
    with pytest.raises(ValueError, match="runs on the scan engine"):
        config(engine="host-exact")
    with pytest.raises(ValueError, match="node rows on every device: drop shard_features"):
        config(devices=2, shard_features=True)
    with pytest.raises(TypeError, match="trains on a GraphCollection"):
        zg.train(config(), zg.load_dataset("tiny"))


def test_a_config_naming_no_model_takes_gin_virtual_reading_edges_where_there_are(molecules):
    """`TrainConfig.model` None takes the graph task's model: GIN with a virtual node,
    GINE (OGB's GIN-virtual) on graphs with edge features; `init` is checked against
    the model taken."""
    cfg = zg.TrainConfig(task="graph", dataset="molhiv-like", hidden=8, layers=2,
                         batch_size=16, progress=False)
    assert cfg.model is None
    bare = dataclasses.replace(molecules, edge_features=None, edge_vocab=())
    for collection, conv in ((molecules, "gine"), (bare, "gin")):
        _, _, program = prepare(cfg, collection)
        gnn = program.model.model
        assert (gnn.conv, gnn.virtual_node) == (conv, True)
        assert trainer.with_model(cfg, program.task, collection).model == f"{conv}-virtual"
    with pytest.raises(ValueError, match=r"init='torch' \(--init\) applies to the models "
                                         r"sage, .+ not 'gine-virtual'"):
        prepare(dataclasses.replace(cfg, init="torch"), molecules)


def test_a_user_graph_model_that_does_not_fit_is_refused_before_training(molecules):
    """As on node tasks, the first batch is traced through a user's model and the loss
    before the epoch compiles: a forgotten readout (a row per node) is named."""
    import flax.linen as nn

    class PerNode(nn.Module):
        @nn.compact
        def __call__(self, graphs, *, train):
            del train
            return nn.Dense(1)(graphs.nodes)

    with pytest.raises(ValueError, match=r"the model .*PerNode gives outputs float32\[\d+, 1\]; "
                                         r"the task needs one row per target row"):
        zg.train(config(epochs=1, eval_mode="none"), molecules, model=PerNode())

    class ThreeScores(nn.Module):  # one binary target a graph: trained before, silently
        @nn.compact
        def __call__(self, graphs, *, train):
            del train
            return nn.Dense(3)(zg.pool(graphs.nodes, graphs, "sum"))

    with pytest.raises(ValueError, match=r"the model .*ThreeScores gives outputs float32\[\d+, "
                                         r"3\]; the loss masked_sigmoid needs the targets' "
                                         r"shape float32\[\d+, 1\]"):
        zg.train(config(epochs=1, eval_mode="none"), molecules, model=ThreeScores())


def test_memory_check_counts_the_allocated_run_and_names_its_parts(molecules, tmp_path,
                                                                   monkeypatch):
    """Before compiling the epoch, the collection, the model's state as allocated and
    the envelope's step buffers are checked against the device's memory; a run over it
    stops with every part named and writes nothing."""
    from zerognn_jax._src.training import memory

    cfg = config(epochs=1, eval_mode="none")
    _, data, program = prepare(cfg, molecules)
    env, cal = program.task.choose_envelope(program, data, molecules, cfg)
    state = zg.init_state(program, data, env, program.task.train_items(molecules))
    resident = memory.allocated_resident(data, state)
    assert resident.features == molecules.node_features.size * 4  # ids kept in float32
    params = sum(x.size * 4 for x in jax.tree_util.tree_leaves(state.params))
    assert resident.model >= 4 * params  # params, gradients, two Adam moments
    step = program.task.envelope_bytes(program, env)
    nodes, (edges,) = env.batch_size, env.capacities  # segment sums on a CPU: no ELL slots
    assert program.task.envelope_bytes(program, zg.Envelope(2 * nodes, (2 * edges,))) > step
    assert program.task.memory_report(program, env, cal)["ratio"] >= 1.0  # holds the peak
    fits = resident.total + step
    memory.check_step_fits(resident, step, fits, batch_size=24)
    checked = []
    monkeypatch.setattr(memory, "device_memory_limit",
                        lambda device=None: checked.append(1) or fits - 1)
    metrics = tmp_path / "m.jsonl"
    with pytest.raises(ValueError, match=r"does not fit device memory: graph .* model .* \+ "
                                         r"step buffers .*smaller batch \(--batch-size, now "
                                         r"24\)"):
        zg.train(dataclasses.replace(cfg, metrics_out=str(metrics)), molecules)
    assert checked and not (metrics.exists() and metrics.read_text())


def test_a_batched_task_need_not_size_its_step():
    """`envelope_bytes` is optional (tasks/base.py): a task with the protocol's other
    methods is still a BatchedTask (its runs skip the memory check)."""
    names = ("prepare_run", "sample_batch", "choose_envelope", "grow_envelope",
             "envelope_from", "memory_report")
    older = type("Older", (), {name: getattr(zg.GraphTask, name) for name in names})
    assert isinstance(older(), zg.BatchedTask)


def test_graphs_without_edges_and_empty_splits_train_and_report_no_value():
    """A collection without a single edge trains on its nodes' own features; its
    default splits (every graph in train) report no value (None) for val and test; an
    empty train split is refused before anything runs."""
    rs = np.random.default_rng(0)
    make = functools.partial(zg.make_collection, "bare", [3] * 16, [0] * 16, [], [],
                             rs.random((48, 4)).astype(np.float32),
                             (np.arange(16) % 2)[:, None].astype(np.float32), "binary")
    cfg = zg.TrainConfig(task="graph", dataset="bare", model="gin", hidden=8, layers=2,
                         batch_size=8, epochs=1, progress=False)
    last = zg.train(cfg, make()).history[-1]
    assert np.isfinite(last["loss"])
    assert [last[f"{s}_{m}"] for s in ("val", "test") for m in ("rocauc", "ap")] == [None] * 4
    with pytest.raises(ValueError, match="bare's train_idx is empty: there is nothing to "
                                         "train on"):
        zg.train(cfg, make(splits=([], range(8), range(8, 16))))
    # steps of one graph: batch norm before the mean readout leaves the model nothing to
    # learn; a sum still sees the node count
    with pytest.warns(UserWarning, match=r"^every training step holds one graph \(bare has "
                                         r"one training graph\): model 'gin' "):
        zg.train(cfg, make(splits=([0], range(1, 8), range(8, 16))))
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        zg.train(dataclasses.replace(cfg, readout="sum"),
                 make(splits=([0], range(1, 8), range(8, 16))))
    assert not [w for w in seen if "one graph" in str(w.message)]


@pytest.mark.usefixtures("full_precision")
def test_predict_gives_one_row_per_graph_as_the_evaluation_does(molecules, tmp_path):
    """`zg.predict` on a graph-level run takes graph ids of its collection: their output
    rows give the test ROC-AUC its evaluation reported, in any order and batching, and
    the same from the restored run; ids past the graphs, a node type and a bad batch
    size are named in one line (predict had called the graph model without its batch)."""
    from zerognn_jax._src.training.tasks.graph_metrics import graph_metrics

    result = zg.train(config(epochs=1, checkpoint_dir=str(tmp_path)), molecules)
    assert isinstance(result.program.task, zg.PredictsItems)  # the seam predict asks
    ids = np.asarray(molecules.test_idx)
    rows = np.asarray(zg.predict(result, ids))
    assert rows.shape == (ids.size, 1)
    got = graph_metrics(rows, molecules.targets[ids], molecules.target_kind)["rocauc"]
    assert got == pytest.approx(result.summary["test_rocauc"], abs=1e-6)
    order = np.random.default_rng(0).permutation(ids.size)
    np.testing.assert_allclose(np.asarray(zg.predict(result, ids[order], batch_size=7)),
                               rows[order], rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match="trained on a GraphCollection passed to train"):
        zg.restore(str(tmp_path), for_inference=True)
    back = zg.restore(str(tmp_path), dataset=molecules, for_inference=True)
    np.testing.assert_allclose(np.asarray(zg.predict(back, ids)), rows, rtol=1e-5, atol=1e-6)
    # requests of other graphs share a few programs (exact capacities made a program for
    # most requests); their rows are the evaluation's as above
    from zerognn_jax._src.training.tasks import graph as graph_task

    run, programs = graph_task._eval_pass, set()

    def record(*args, caps, batch_size):
        programs.add((args[3].shape[0], caps, batch_size))
        return run(*args, caps=caps, batch_size=batch_size)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(graph_task, "_eval_pass", record)
        for seed in range(6):
            pick = np.random.default_rng(seed).choice(ids.size, 12, replace=False)
            np.testing.assert_allclose(np.asarray(zg.predict(result, ids[pick])), rows[pick],
                                       rtol=1e-5, atol=1e-6)
    assert len(programs) <= 2 and all(b == 16 for _, _, b in programs)  # 12: a power of 2
    n = molecules.num_graphs
    with pytest.raises(ValueError, match=rf"nodes must lie in \[0, {n}\) \(graph ids\), "
                                         rf"found \[0, {n}\]"):
        zg.predict(result, [0, n])
    assert zg.predict(result, []).shape == (0, rows.shape[1])  # `[]` is float64 to NumPy
    with pytest.raises(ValueError, match="node_type picks a node type of a typed graph's"):
        zg.predict(result, [0], node_type="atom")
    for bad in (0, 2.5, "64", True):
        with pytest.raises(ValueError, match=f"batch_size must be an integer >= 1, got "
                                             f"{re.escape(repr(bad))}"):
            zg.predict(result, [0], batch_size=bad)
    for bad in (-1, 1.5, 2**32):
        with pytest.raises(ValueError, match=rf"seed must be an integer in \[0, 2\*\*32\), "
                                             rf"got {re.escape(repr(bad))}"):
            zg.predict(result, [0], seed=bad)


def subset(collection, ids, **changes):
    """A new collection of `collection`'s graphs `ids`, in that order."""
    graphs = [collection.graph(int(g)) for g in ids]
    cat = lambda key: np.concatenate([g[key] for g in graphs])
    given = dict(n_node=[len(g["nodes"]) for g in graphs],
                 n_edge=[len(g["senders"]) for g in graphs], senders=cat("senders"),
                 receivers=cat("receivers"), node_features=cat("nodes"),
                 targets=np.stack([g["target"] for g in graphs]),
                 target_kind=collection.target_kind, edge_features=cat("edges"),
                 node_vocab=collection.node_vocab, edge_vocab=collection.edge_vocab)
    return zg.make_collection("new", **{**given, **changes})


@pytest.mark.usefixtures("full_precision")
def test_predict_takes_new_graphs_with_the_columns_trained_on(molecules):
    """`zg.predict(..., dataset=new)` gives the rows of a new collection's graphs: here
    a few of the training collection's, reversed, which give their rows there. Columns,
    categories or a task that cannot take them are named in one line (an id past its
    column's vocabulary had read another column's embedding)."""
    result = zg.train(config(epochs=1), molecules)
    ids = np.asarray(molecules.test_idx)[:9]
    want = np.asarray(zg.predict(result, ids))
    new = subset(molecules, ids[::-1])
    got = np.asarray(zg.predict(result, np.arange(9), dataset=new, batch_size=4))
    np.testing.assert_allclose(got, want[::-1], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(np.asarray(zg.predict(result, [8, 0], dataset=new)),
                               want[[0, 8]], rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match=r"nodes must lie in \[0, 9\) \(graph ids\)"):
        zg.predict(result, [9], dataset=new)
    # no graphs asked: rows of the trained width, whatever targets the new graphs hold
    classes = subset(molecules, ids, targets=np.arange(9) % 3, target_kind="classes",
                     num_classes=3)
    assert zg.predict(result, [], dataset=classes).shape == (0, want.shape[1])
    assert zg.predict(result, [0], dataset=classes).shape == (1, want.shape[1])
    nodes = np.asarray(new.node_features)
    wider = nodes.copy()
    wider[0, 0] = molecules.node_vocab[0]
    vocab = (molecules.node_vocab[0] + 1, *molecules.node_vocab[1:])
    with pytest.raises(ValueError, match=rf"^node features column 0 holds "
                                         rf"{molecules.node_vocab[0]}, outside the "
                                         rf"vocabulary trained on \[0, "
                                         rf"{molecules.node_vocab[0]}\)$"):
        zg.predict(result, [0], dataset=subset(molecules, ids, node_features=wider,
                                               node_vocab=vocab))
    floats = nodes.astype(np.float32)
    with pytest.raises(ValueError, match="^the model trained on categorical node features; "
                                         "these are float$"):
        zg.predict(result, [0], dataset=subset(molecules, ids, node_features=floats,
                                               node_vocab=()))
    with pytest.raises(ValueError, match=rf"^the model trained on node features of "
                                         rf"{nodes.shape[1]} columns; these have "
                                         rf"{nodes.shape[1] - 1}$"):
        zg.predict(result, [0], dataset=subset(molecules, ids, node_features=nodes[:, 1:],
                                               node_vocab=molecules.node_vocab[1:]))
    with pytest.raises(ValueError, match="^the model trained on edge features of 3 columns; "
                                         "collection 'new' has none$"):
        zg.predict(result, [0], dataset=subset(molecules, ids, edge_features=None,
                                               edge_vocab=()))
    with pytest.raises(ValueError, match="dataset must be a GraphCollection of the graphs"):
        zg.predict(result, [0], dataset=molecules.node_features)


def test_a_built_in_loss_must_fit_the_targets_kind():
    """sigmoid on regression targets was taken and trained to a negative loss; each kind
    takes its own built-in losses (regression both mae and mse)."""
    from zerognn_jax._src.training.tasks.graph import graph_task

    with pytest.raises(ValueError, match=r"^loss 'sigmoid' does not fit regression targets, "
                                         r"whose loss is 'mae' or 'mse'$"):
        graph_task("sigmoid", "regression")
    with pytest.raises(ValueError, match=r"^loss 'mae' does not fit binary targets, whose "
                                         r"loss is 'sigmoid'$"):
        graph_task("mae", "binary")
    with pytest.raises(ValueError, match=r"loss 'mse' does not fit classes targets"):
        graph_task("mse", "classes")
    assert graph_task("mse", "regression").kind == "regression"
