"""Featureless types of a typed graph (every type, with `embedding_dim`): their rows of
the stacked embedding table take row-sparse lazy Adam steps inside the step body, only
when the engine keeps the step, and exact and sampled evaluation read the same table.
Unit-level, on a toy graph."""

from __future__ import annotations

import dataclasses
import functools
import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import zerognn_jax as zg
from zerognn_jax._src.training.evaluate import Predictor
from zerognn_jax._src.training.program import init_state, sample_batch
from zerognn_jax._src.training.row_adam import RowAdamState
from zerognn_jax._src.training.scan import Sampled, apply_step
from zerognn_jax._src.training.step import train_step, update_embedding
from zerognn_jax._src.training.tasks.losses import masked_mean
from zerognn_jax._src.training.tasks.typed_eval import typed_logits
from zerognn_jax._src.training.trainer import prepare

CFG = dict(dataset="toy", model="rsage", hidden=8, layers=2, batch_size=8, lr=0.05,
           dropout=0.0, progress=False, eval_mode="none", multiple=8,
           envelope="conservative")


def _toy(edge_features: bool = False):
    """Papers with features; authors and fields without (two tables, stacked). With
    `edge_features`, citations carry 4 features and authorships 2 (their reverses too)."""
    rs = np.random.default_rng(0)
    writes, cites = ("author", "writes", "paper"), ("paper", "cites", "paper")
    edges = {writes: (rs.integers(0, 20, 60), rs.integers(0, 30, 60)),
             cites: (rs.integers(0, 30, 50), rs.integers(0, 30, 50)),
             ("paper", "has", "field"): (rs.integers(0, 30, 40), rs.integers(0, 6, 40))}
    tables = {cites: rs.standard_normal((50, 4)), writes: rs.standard_normal((60, 2))}
    return zg.make_hetero_dataset(
        "toy", {"paper": 30, "author": 20, "field": 6}, edges, target_type="paper",
        labels=rs.integers(0, 3, 30), train_idx=np.arange(20), val_idx=np.arange(20, 25),
        test_idx=np.arange(25, 30), features={"paper": rs.standard_normal((30, 5))},
        edge_features=tables if edge_features else None, add_reverse=True)


@functools.lru_cache(maxsize=4)
def _run(fanouts=(3, 2), options=()):
    """(dataset, data, program, envelope, state) with random moments on every row and
    three steps counted, so that untouched rows have something to keep; `options`:
    (name, value) pairs of TrainConfig's fields."""
    cfg = zg.TrainConfig(**CFG, fanouts=fanouts, **dict(options))
    dataset, data, program = prepare(cfg, _toy())
    env, _ = program.task.choose_envelope(program, data, dataset, cfg)
    state = init_state(program, data, env, dataset.train_idx)
    shape = state.embedding.shape
    mu = 0.01 * jax.random.normal(jax.random.key(5), shape)
    nu = 1e-4 * jax.random.uniform(jax.random.key(6), shape)
    state = state._replace(embedding_opt=RowAdamState(mu, nu, jnp.int32(3)))
    return dataset, data, program, env, state


def _sample(program, data, env):
    perm = jnp.arange(20, dtype=jnp.int32)
    return sample_batch(program, data, perm, 0, 0, env)


def test_featureless_types_share_one_stacked_table():
    dataset, _, program, _, state = _run()
    assert dict(program.task.inputs.embedded_offsets) == {"author": 0, "field": 20}
    assert state.embedding.shape == (26, 8) and state.embedding_opt.mu.shape == (26, 8)
    assert program.embedding.dim == 8 and program.embedding.lr == 0.05
    assert "embed" not in str(jax.tree_util.tree_structure(state.params))


def test_embedding_dim_gives_every_type_rows_after_its_features():
    """With `embedding_dim`, every type has rows of that width in the stacked table; a
    featured type's input is its features, then its row (5 + 4 columns), a featureless
    one's its row alone (4): the first layer's SAGE convs read [destination ; sources]."""
    _, _, program, _, state = _run(options=(("embedding_dim", 4),))
    assert dict(program.task.inputs.embedded_offsets) == {"paper": 0, "author": 30,
                                                          "field": 50}
    assert state.embedding.shape == (56, 4) and program.embedding.dim == 4
    convs = state.params["model"]
    assert convs["convs_0_paper__cites__paper"]["linear"]["kernel"].shape == (9 + 9, 8)
    assert convs["convs_0_author__writes__paper"]["linear"]["kernel"].shape == (9 + 4, 8)


def test_step_bytes_count_the_rows_devices_gather():
    """On D devices a step's buffers include the featureless rows of its outermost
    level gathered from every device; the envelope-over-ideal report leaves them out."""
    from zerognn_jax._src.training import memory

    _, _, program, env, _ = _run()
    cal = types.SimpleNamespace(max_counts=[c for caps in env.levels
                                            for c in (caps.get(t, 0) for t in program.task.types)])
    four = dataclasses.replace(program, parallel=types.SimpleNamespace(size=4))
    assert four.num_shards == 4
    rows = env.levels[-1]["author"] + env.levels[-1]["field"]
    added = program.task.envelope_bytes(four, env) - program.task.envelope_bytes(program, env)
    assert added == memory.gathered_rows_bytes(rows, 8, "float32", 4) > 0
    assert program.task.memory_report(four, env, cal) == \
        program.task.memory_report(program, env, cal)


@pytest.mark.parametrize("options, repeats", [
    ((), False), ((("dedup", False),), True), ((("flat_outer", True),), True),
    ((("embedding_dim", 4),), False)], ids=["dedup", "tree", "flat-outer", "every-type"])
def test_typed_step_updates_its_rows_as_dense_lazy_adam(options, repeats):
    """The step's sparse update against lazy Adam on the dense gradient of the loss
    with respect to the whole table: equal on the rows the step read, every other row
    and its moments bit-unchanged; in tree mode and with a flat outer hop the outer
    level repeats rows, whose gradients must be summed before the update; with
    `embedding_dim`, the featured papers' rows take their steps too."""
    _, data, program, env, state = _run(options=options)
    emb = program.embedding

    @jax.jit
    def step(state):
        batch, mb, key = _sample(program, data, env)
        new, out = train_step(program, state, data, batch, mb, key)
        new = update_embedding(program, new, out, jnp.bool_(True))

        def dense_loss(table):
            variables = {"params": state.params, "batch_stats": state.batch_stats,
                         "embedding": table}
            outputs, _ = program.apply_model(variables, data, mb, train=True,
                                             dropout_key=key, inputs=batch.model_inputs)
            return masked_mean(program.task.loss(outputs, batch.targets), batch.weight)

        return new, jax.grad(dense_loss)(state.embedding), mb

    new, dense, mb = step(state)
    ids, valid = np.asarray(mb.embedded), np.asarray(mb.embedded_valid)
    touched = np.zeros(state.embedding.shape[0], bool)
    touched[ids[valid]] = True
    offsets = dict(program.task.inputs.embedded_offsets)
    for t, off in offsets.items():  # both types' sampled nodes, at their offsets
        nodes = np.asarray(mb.typed.nodes[-1][t])[np.asarray(mb.typed.valid[-1][t])]
        assert nodes.size and touched[off + nodes].all()
    if repeats:  # repeated rows: the update merges them
        assert touched.sum() < valid.sum()
    else:  # a deduplicated level: distinct rows
        assert touched.sum() == valid.sum()
    dense = np.asarray(dense)
    assert not np.any(dense[~touched])

    old, opt = np.asarray(state.embedding), state.embedding_opt
    g, t = dense[touched], 4.0
    mu = 0.9 * np.asarray(opt.mu)[touched] + 0.1 * g
    nu = 0.999 * np.asarray(opt.nu)[touched] + 0.001 * g * g
    want = old[touched] - emb.lr * (mu / (1 - 0.9**t)) / (np.sqrt(nu / (1 - 0.999**t)) + 1e-8)
    np.testing.assert_allclose(np.asarray(new.embedding)[touched], want, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(np.asarray(new.embedding_opt.mu)[touched], mu, rtol=1e-5,
                               atol=1e-7)
    np.testing.assert_allclose(np.asarray(new.embedding_opt.nu)[touched], nu, rtol=1e-5,
                               atol=1e-9)
    for after, before in ((new.embedding, old), (new.embedding_opt.mu, opt.mu),
                          (new.embedding_opt.nu, opt.nu)):
        np.testing.assert_array_equal(np.asarray(after)[~touched],
                                      np.asarray(before)[~touched])
    assert int(new.embedding_opt.count) == 4


def test_a_dropped_step_writes_no_row():
    """A step whose sample overflowed (the engine redoes it at a grown envelope) leaves
    the table, its moments and the step count as they were."""
    _, data, program, env, state = _run()

    @jax.jit
    def step(state):
        batch, mb, key = _sample(program, data, env)
        mb = mb._replace(typed=mb.typed._replace(overflow=jnp.bool_(True)))
        return apply_step(program, state, jnp.int32(0), data,
                          Sampled(batch, mb, key, jnp.bool_(True), None))

    new, metrics = step(state)
    assert bool(metrics["overflow"]) and not bool(metrics["applied"])
    for after, before in zip(jax.tree_util.tree_leaves((new.embedding, new.embedding_opt)),
                             jax.tree_util.tree_leaves((state.embedding,
                                                        state.embedding_opt))):
        np.testing.assert_array_equal(np.asarray(after), np.asarray(before))


@pytest.mark.parametrize("options", [(), (("embedding_dim", 4),)], ids=["featureless",
                                                                       "every-type"])
def test_exact_and_sampled_evaluation_read_the_table(options):
    """With every neighbour sampled, exact and sampled logits agree, and both follow
    the embedding table (zeroing it changes them; with `embedding_dim`, zeroing only
    the featured papers' rows does)."""
    _, data, program, _, state = _run(fanouts=(-1, -1), options=options)
    ids = np.arange(30, dtype=np.int32)
    variables = {"params": state.params, "embedding": state.embedding}
    zeroed = {**variables, "embedding": jnp.zeros_like(state.embedding)}
    if options:
        zeroed["embedding"] = state.embedding.at[:30].set(0)  # the papers' rows
    logits = lambda v, m: typed_logits(program.task, Predictor(program, v, data, m, 16, 0),
                                       ids)
    exact, sampled = logits(variables, "full"), logits(variables, "sampled")
    np.testing.assert_allclose(exact, sampled, rtol=1e-5, atol=1e-5)
    assert np.abs(logits(zeroed, "full") - exact).max() > 1e-4
    assert np.abs(logits(zeroed, "sampled") - sampled).max() > 1e-4


def test_sampled_evaluation_halves_its_batch_when_the_device_runs_out(monkeypatch):
    """A batch the device cannot hold is run again at half the size, with a warning
    (every neighbour sampled: the logits do not depend on the batch); other errors
    raise."""
    from zerognn_jax._src.training.tasks import typed_eval

    _, data, program, _, state = _run(fanouts=(-1, -1))
    ids = np.arange(30, dtype=np.int32)
    variables = {"params": state.params, "embedding": state.embedding}
    logits = lambda: typed_logits(program.task, Predictor(program, variables, data,
                                                          "sampled", 16, 0), ids)
    want, run, sizes = logits(), typed_eval._sampled_pass, []

    def short_of_memory(*args, envelope, **kwargs):
        sizes.append(envelope.batch_size)
        if envelope.batch_size > 4:
            raise jax.errors.JaxRuntimeError("RESOURCE_EXHAUSTED: Out of memory")
        return run(*args, envelope=envelope, **kwargs)

    monkeypatch.setattr(typed_eval, "_sampled_pass", short_of_memory)
    with pytest.warns(UserWarning, match="out of memory at 8 seeds a batch; running again "
                                         "at 4"):
        got = logits()
    assert sizes == [16, 8, 4]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    monkeypatch.setattr(typed_eval, "_sampled_pass", lambda *a, **k: (_ for _ in ()).throw(
        jax.errors.JaxRuntimeError("INTERNAL: something else")))
    with pytest.raises(jax.errors.JaxRuntimeError, match="INTERNAL"):
        logits()


def test_a_run_with_embedding_dim_trains_every_types_rows():
    """`zg.train` with `embedding_dim` on a typed graph: the loss falls, and the rows of
    papers (featured) and authors (featureless) that steps read have moved from their
    first values, the others not."""
    cfg = zg.TrainConfig(**{**CFG, "eval_mode": "full"}, fanouts=(3, 2), embedding_dim=4,
                         epochs=3)
    result = zg.train(cfg, _toy())
    losses = [h["loss"] for h in result.history]
    assert np.isfinite(losses).all() and losses[-1] < losses[0]
    before = np.asarray(_run(options=(("embedding_dim", 4),))[4].embedding)
    moved = np.any(np.asarray(result.state.embedding) != before, axis=1)
    assert moved[:30].any() and moved[30:50].any()
    assert not moved.all()  # rows no step read (two authors here) keep their first values
    assert 0.0 <= result.summary["test_acc"] <= 1.0


def test_rgat_trains_on_edge_features_and_refuses_them_elsewhere():
    """`edge_features` on a typed graph: R-GAT's views carry every relation's table that
    exists (training, sampled and exact evaluation); models that read none refuse it."""
    cfg = zg.TrainConfig(**{**CFG, "model": "rgat", "heads": 2, "eval_mode": "full"},
                         fanouts=(3, 2), edge_features=True, epochs=3)
    result = zg.train(cfg, _toy(True))
    losses = [h["loss"] for h in result.history]
    assert np.isfinite(losses).all() and losses[-1] < losses[0]
    params = result.state.params["model"]
    convs = params["convs_0_paper__cites__paper"]
    assert convs["edge_kernel"].shape == (4, 8)
    assert "edge_kernel" not in params["convs_0_field__rev_has__paper"]
    assert 0.0 <= result.summary["test_acc"] <= 1.0
    with pytest.raises(ValueError, match="model 'rsage' reads no edge features"):
        zg.train(dataclasses.replace(cfg, model="rsage"), _toy(True))
    cites = ("paper", "cites", "paper")
    read = prepare(dataclasses.replace(cfg, dtype="bfloat16"), _toy(True))[1].graph
    assert read[cites].edge_features.dtype == jnp.bfloat16
    unread = prepare(dataclasses.replace(cfg, edge_features=False), _toy(True))[1].graph
    assert all(g.edge_features is None for g in unread.graphs)  # left on the host


def _exact_run(cfg, monkeypatch, chunks: str):
    """(device data, `exact_logits` of the toy's initial variables with keywords to
    come, the (type, rows, length) of each call of typed_eval's `chunks` function)."""
    from zerognn_jax._src.training.tasks import typed_eval

    dataset, data, program = prepare(cfg, _toy(cfg.edge_features))
    env, _ = program.task.choose_envelope(program, data, dataset, cfg)
    state = init_state(program, data, env, dataset.train_idx)
    variables = {"params": state.params, "embedding": state.embedding}
    calls, run = [], getattr(typed_eval, chunks)

    def spy(*args, rows, length, **kwargs):
        calls.append((kwargs["node_type"], rows, length))
        return run(*args, rows=rows, length=length, **kwargs)

    monkeypatch.setattr(typed_eval, chunks, spy)
    return data, functools.partial(typed_eval.exact_logits, program.task, program,
                                   variables, data), calls


# R-GAT without edge features: the chunks of rsage and rgcn (no edge rows) and R-GAT's
# layer over a chunk as with them; its layer without them is test_hetero_models.py's
@pytest.mark.parametrize("model, edges", [("rsage", False), ("rgcn", False), ("rgat", True)])
def test_exact_logits_in_chunks_equal_the_whole_graph_layers(model, edges, monkeypatch):
    """Exact inference over chunks of each type's rows (a budget of a few edge rows: many
    chunks, the last one moved back) gives the logits of whole-graph layers, embedding
    rows and all, and the chunks' edge features where R-GAT reads them. Without a
    budget, a layer runs whole where its edge rows fit half the free memory, else in
    chunks; a model that does not declare `chunked_exact` gets whole layers."""
    from zerognn_jax._src.training.tasks import typed_eval

    cfg = zg.TrainConfig(**{**CFG, "model": model, "heads": 2}, fanouts=(3, 2),
                         edge_features=edges)
    _, logits, calls = _exact_run(cfg, monkeypatch, "_chunked_rows")
    with jax.default_matmul_precision("highest"):
        small = np.asarray(logits(budget_bytes=8 * 8 * 4 * 6))
        assert any(rows < length for _, rows, length in calls)
        assert {t for t, _, _ in calls} == {"paper", "author", "field"}
        for free, chunks in ((10**12, False), (1000, True), (None, False)):
            monkeypatch.setattr(typed_eval, "device_free_bytes", lambda free=free: free)
            calls.clear()
            np.testing.assert_allclose(np.asarray(logits()), small, rtol=1e-5, atol=1e-6)
            assert bool(calls) == chunks
        monkeypatch.setattr(zg.HeteroGNN, "chunked_exact", False)
        calls.clear()
        whole = np.asarray(logits())
    assert not calls
    assert small.shape == (30, 3)
    np.testing.assert_allclose(small, whole, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("options", [{}, {"embedding_dim": 4}], ids=["featureless",
                                                                      "every-type"])
def test_exact_logits_read_a_host_table_too_large_for_the_device_in_chunks(options,
                                                                           monkeypatch):
    """A host feature table that does not fit the device: layer 0 reads each chunk's rows
    from it (papers) and from the embedding table (authors, fields; with
    `embedding_dim` papers too, after their features) as the chunk needs them, and the
    logits equal those over the table read onto the device; a model that does not take
    chunks is told to evaluate by sampling."""
    from zerognn_jax._src.training.tasks import typed_eval

    cfg = zg.TrainConfig(**CFG, fanouts=(3, 2), feature_placement="host", **options)
    data, logits, calls = _exact_run(cfg, monkeypatch, "_host_chunked_rows")
    assert typed_eval.is_host_resident(data.features)
    with jax.default_matmul_precision("highest"):
        want = np.asarray(logits())  # a CPU says nothing of free memory: read onto it
        assert not calls
        free = data.features.nbytes - 1
        monkeypatch.setattr(typed_eval, "device_free_bytes", lambda: free)
        got = np.asarray(logits(budget_bytes=8 * 8 * 4 * 6))
    assert {t for t, _, _ in calls} == {"paper", "author", "field"}
    assert any(rows < length for _, rows, length in calls)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    monkeypatch.setattr(zg.HeteroGNN, "chunked_exact", False)
    with pytest.raises(ValueError, match=rf"onto the device \({data.features.nbytes:,} bytes\) "
                                         rf"and {free:,} bytes are free: evaluate by sampling "
                                         rf".*or give the model chunked_exact"):
        logits()


def test_host_table_chunks_that_run_out_of_memory_run_again_at_the_base(monkeypatch):
    """Layer 0 read from a host table too large for the device, in chunks at a default
    budget above 1 GiB, whose pass runs the device out of memory runs again at 1 GiB,
    with a warning: the logits at 1 GiB. A budget the caller gave is not retried."""
    from zerognn_jax._src.training.tasks import typed_eval

    cfg = zg.TrainConfig(**CFG, fanouts=(3, 2), feature_placement="host")
    data, logits, _ = _exact_run(cfg, monkeypatch, "_host_chunked_rows")
    gib, budgets = 1 << 30, []
    layer = typed_eval._host_layer_in_chunks

    def short_of_memory(*args):  # (task, program, variables, data, table, budget)
        budgets.append(args[-1])
        if args[-1] > gib:
            raise jax.errors.JaxRuntimeError("RESOURCE_EXHAUSTED: Out of memory")
        return layer(*args)

    monkeypatch.setattr(typed_eval, "device_free_bytes", lambda: data.features.nbytes - 1)
    monkeypatch.setattr(typed_eval, "chunk_budget", lambda offload: 4 * gib)
    monkeypatch.setattr(typed_eval, "_host_layer_in_chunks", short_of_memory)
    with jax.default_matmul_precision("highest"):
        want = np.asarray(logits(budget_bytes=gib))
        with pytest.warns(UserWarning) as warned:
            got = np.asarray(logits())
        assert [str(w.message) for w in warned] == [
            "typed exact evaluation: layer 1 ran the device out of memory in chunks of "
            "4.00 GiB of edge rows; running it again at 1 GiB"]
        assert budgets == [gib, 4 * gib, gib]
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
        budgets.clear()
        with pytest.raises(jax.errors.JaxRuntimeError, match="RESOURCE_EXHAUSTED"):
            logits(budget_bytes=4 * gib)
    assert budgets == [4 * gib]


def test_a_whole_graph_layer_that_runs_out_of_memory_runs_in_chunks(monkeypatch):
    """Chosen whole (its edge rows fit half the free memory), a layer whose pass runs the
    device out of memory runs again in chunks, with a warning: the same logits. Any
    other runtime error is raised."""
    from zerognn_jax._src.training.tasks import typed_eval

    _, logits, calls = _exact_run(zg.TrainConfig(**CFG, fanouts=(3, 2)), monkeypatch,
                                  "_chunked_rows")
    with jax.default_matmul_precision("highest"):
        want = np.asarray(logits())
        assert not calls
        layer = typed_eval._exact_layer

        def short_of_memory(message):
            def run(*args, i, **kwargs):
                if i == 1:
                    raise jax.errors.JaxRuntimeError(message)
                return layer(*args, i=i, **kwargs)
            return run

        monkeypatch.setattr(typed_eval, "_exact_layer",
                            short_of_memory("RESOURCE_EXHAUSTED: Out of memory"))
        # 1 GiB on a CPU; an eighth of the free memory on a large device
        with pytest.warns(UserWarning, match=r"layer 2's whole-graph pass ran the device out "
                                             r"of memory; running it in chunks of [\d.]+ GiB"):
            got = np.asarray(logits())
        assert [t for t, _, _ in calls] == ["paper"]  # layer 2's one type, chunked
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
        monkeypatch.setattr(typed_eval, "_exact_layer", short_of_memory("INTERNAL: other"))
        with pytest.raises(jax.errors.JaxRuntimeError, match="INTERNAL"):
            logits()


def test_chunks_at_a_larger_default_budget_that_run_out_of_memory_run_again_at_the_base(
        monkeypatch):
    """Chunks at a default budget above 1 GiB (an eighth of a large device's free memory)
    whose pass runs the device out of memory run again at 1 GiB, with a warning: the same
    logits. A budget the caller gave is not retried."""
    from zerognn_jax._src.training.tasks import typed_eval

    _, logits, _ = _exact_run(zg.TrainConfig(**CFG, fanouts=(3, 2)), monkeypatch,
                              "_chunked_rows")
    gib, budgets = 1 << 30, []
    layer = typed_eval._layer_in_chunks

    def short_of_memory(*args):  # (program, variables, graph, i, types, ..., budget, h)
        budgets.append(args[-2])
        if args[-2] > gib:
            raise jax.errors.JaxRuntimeError("RESOURCE_EXHAUSTED: Out of memory")
        return layer(*args)

    with jax.default_matmul_precision("highest"):
        want = np.asarray(logits(budget_bytes=gib))
        monkeypatch.setattr(typed_eval, "device_free_bytes", lambda: 1000)  # chunks
        monkeypatch.setattr(typed_eval, "chunk_budget", lambda offload: 4 * gib)
        monkeypatch.setattr(typed_eval, "_layer_in_chunks", short_of_memory)
        with pytest.warns(UserWarning) as warned:
            got = np.asarray(logits())
        assert [str(w.message) for w in warned] == [
            f"typed exact evaluation: layer {i} ran the device out of memory in chunks of "
            f"4.00 GiB of edge rows; running it again at 1 GiB" for i in (1, 2)]
        assert budgets == [4 * gib, gib] * 2  # each layer
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
        budgets.clear()
        with pytest.raises(jax.errors.JaxRuntimeError, match="RESOURCE_EXHAUSTED"):
            logits(budget_bytes=4 * gib)
    assert budgets == [4 * gib]
