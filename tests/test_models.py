"""Models: exact layer-wise inference equals the full-neighbourhood sampled forward."""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from conftest import random_graph

from zerognn_jax import (
    DeviceData,
    EllView,
    Envelope,
    GATConv,
    SamplerConfig,
    ScanEngine,
    StepProgram,
    TrainConfig,
    init_state,
    layerwise_logits,
    make_dataset,
    make_model,
    mean_weights,
    train,
)
from zerognn_jax._src.nn.link_heads import make_decoder
from zerognn_jax._src.nn.views import EdgeView
from zerognn_jax._src.training import evaluate as evaluate_lib


def _data(num_nodes=120):
    graph = random_graph(num_nodes, 500, seed=4, isolated=3)
    rs = np.random.default_rng(0)
    feats = rs.normal(size=(num_nodes, 6)).astype(np.float32)
    labels = rs.integers(0, 3, num_nodes).astype(np.int32)
    return graph, DeviceData(graph.to_device(), jnp.asarray(feats), jnp.asarray(labels))


@pytest.mark.parametrize("name, norm", [
    ("sage", "none"), ("sage-sum", "layer"), ("sage-max", "none"), ("gcn", "none"),
    ("gat", "batch"),
])
def test_layerwise_equals_full_neighbourhood_forward(name, norm):
    graph, data = _data()
    n = graph.num_nodes
    model = make_model(name, hidden=8, num_layers=2, num_classes=3, dropout=0.5, norm=norm)
    sampler = SamplerConfig((-1, -1)).resolve(graph.max_degree())
    program = StepProgram(model, optax.sgd(0.1), sampler, n, seed=0)
    env = Envelope(n, (n, n))
    state = init_state(program, data, env, np.arange(n))
    variables = {"params": state.params}
    if state.batch_stats:
        variables["batch_stats"] = jax.tree_util.tree_map(lambda x: x + 0.3, state.batch_stats)
    sampled, _, _ = program.forward(variables, data, jnp.arange(n, dtype=jnp.int32),
                                    jnp.ones(n, bool), jnp.uint32(0), env.capacities,
                                    train=False)
    # Small chunks force several chunks per layer and the padding path.
    plan = evaluate_lib.plan_chunks(np.asarray(graph.indptr), 8, budget_bytes=2048)
    assert plan.num_chunks > 1
    exact = layerwise_logits(program, variables, data, budget_bytes=2048)
    np.testing.assert_allclose(np.asarray(exact), np.asarray(sampled), rtol=1e-5, atol=1e-5)


class TwoHopMean(nn.Module):
    """A user model written against the documented interface (views, train flag)."""

    num_classes: int

    @nn.compact
    def __call__(self, x, views, *, train):
        h = x
        for view in views:
            agg = view.weighted_sum(h[:, None, :], mean_weights(view))[:, 0, :]
            h = nn.relu(nn.Dense(16)(jnp.concatenate([h[: view.num_dst], agg], -1)))
        return nn.Dense(self.num_classes)(h)


def test_custom_model_trains_through_the_engine():
    graph, data = _data()
    program = StepProgram(TwoHopMean(3), optax.adam(1e-2), SamplerConfig((4, 4)), 16, seed=1)
    env = Envelope(16, (128, 128))
    state = init_state(program, data, env, np.arange(100))
    engine, losses = ScanEngine(program), []
    for epoch in range(4):  # one program: the later epochs cost no compile
        res = engine.run_epoch(state, data, np.arange(100), epoch, env)
        state = res.state
        losses.append(res.loss)
    assert res.steps == 7 and len(engine._programs) == 1
    # it fits its 100 nodes' labels (1.15 -> 1.01; they are random, so it memorises)
    assert losses[-1] < losses[0] - 0.05, losses
    assert not evaluate_lib.supports_layerwise(program.model)


@pytest.mark.parametrize("name", ["sage", "gcn", "gat", "sage-max", "mlp"])
def test_bfloat16_model_follows_float32(name):
    """Same parameters, bfloat16 computation: float32 logits within bfloat16 rounding."""
    graph, data = _data()
    n = graph.num_nodes
    sampler = SamplerConfig((4, 4))
    env = Envelope(n, (n, n))
    logits = {}
    for dtype in (jnp.float32, jnp.bfloat16):
        model = make_model(name, hidden=16, num_layers=2, num_classes=3, dtype=dtype)
        program = StepProgram(model, optax.sgd(0.1), sampler, n, seed=0)
        d = data._replace(features=data.features.astype(dtype))
        params = init_state(program, d, env, np.arange(n)).params
        logits[dtype], _, _ = program.forward({"params": params}, d, jnp.arange(n, dtype=jnp.int32),
                                              jnp.ones(n, bool), jnp.uint32(3), env.capacities,
                                              train=False)
        assert jax.tree_util.tree_leaves(params)[0].dtype == jnp.float32
    assert logits[jnp.bfloat16].dtype == jnp.float32
    ref = np.asarray(logits[jnp.float32])
    np.testing.assert_allclose(np.asarray(logits[jnp.bfloat16]), ref, rtol=0.05,
                               atol=0.05 * np.abs(ref).max())


def test_unknown_model_name():
    with pytest.raises(ValueError, match="unknown model 'gin'"):
        make_model("gin", hidden=4, num_layers=2, num_classes=2)
    with pytest.raises(ValueError, match="unknown model 'gcn-max'"):
        make_model("gcn-max", hidden=4, num_layers=2, num_classes=2)


def _random_views(num_layers, rows=(8, 16, 32), fanout=3, seed=0):
    """`num_layers` random EllViews, outermost first: layer i maps rows[L-i] -> rows[L-1-i]."""
    rs = np.random.default_rng(seed)
    views = []
    for i in range(num_layers):
        dst, src = rows[num_layers - 1 - i], rows[num_layers - i]
        nbr = rs.integers(0, src, (dst, fanout)).astype(np.int32)
        mask = rs.random((dst, fanout)) < 0.8
        views.append(EllView(jnp.asarray(np.where(mask, nbr, 0)), jnp.asarray(mask),
                             jnp.ones(dst, bool), jnp.full(dst, fanout, jnp.int32),
                             jnp.full(src, fanout, jnp.int32)))
    x = jnp.asarray(rs.normal(size=(rows[num_layers], 5)).astype(np.float32))
    return x, tuple(views)


def _train_eval_differ(model, num_layers) -> bool:
    x, views = _random_views(num_layers)
    variables = model.init(jax.random.PRNGKey(0), x, views, train=False)
    train = model.apply(variables, x, views, train=True, rngs={"dropout": jax.random.PRNGKey(1)})
    return not np.allclose(train, model.apply(variables, x, views, train=False))


@pytest.mark.parametrize("name", ["sage", "sage-max", "gcn", "gat", "mlp"])
def test_default_dropout_leaves_features_whole(name):
    """Under the default config the first layer sees the raw features undropped, as in
    PyG's and DGL's examples; hidden activations are dropped; `input_dropout` drops the
    features. (One layer: only the features can be dropped; two: hidden ones too.)"""
    make = lambda layers, **kw: make_model(name, hidden=8, num_layers=layers, num_classes=3,
                                           dropout=0.5, **kw)
    assert not _train_eval_differ(make(1), 1)
    assert _train_eval_differ(make(1, input_dropout=0.5), 1)
    assert _train_eval_differ(make(2), 2)


def test_gat_attention_dropout_drops_coefficients_only_while_training():
    """One layer (no hidden dropout, no input dropout): training and evaluation differ
    only through the attention's dropout; evaluation equals the model without it; the
    kept coefficients are scaled up, so a row's output averages to the undropped one."""
    plain = make_model("gat", hidden=8, num_layers=1, num_classes=4, heads=1)
    dropped = make_model("gat", hidden=8, num_layers=1, num_classes=4, heads=1,
                         attention_dropout=0.5)
    x, views = _random_views(1, rows=(64, 128), fanout=6)
    variables = plain.init(jax.random.PRNGKey(0), x, views, train=False)
    want = plain.apply(variables, x, views, train=False)
    np.testing.assert_array_equal(dropped.apply(variables, x, views, train=False), want)
    np.testing.assert_array_equal(plain.apply(variables, x, views, train=True,
                                              rngs={"dropout": jax.random.PRNGKey(1)}), want)
    runs = [dropped.apply(variables, x, views, train=True,
                          rngs={"dropout": jax.random.PRNGKey(k)}) for k in range(400)]
    assert not np.allclose(runs[0], want) and not np.allclose(runs[0], runs[1])
    # the mean of 400 draws: within 4 standard errors of the undropped output
    runs = np.stack([np.asarray(r) for r in runs])
    err = runs.std(0) / np.sqrt(len(runs))
    assert np.all(np.abs(runs.mean(0) - np.asarray(want)) <= 4 * err + 1e-6)


def test_gat_heads_averaged_are_the_mean_of_the_concatenated_heads():
    """concat=False: every head computes all the features and the output is their mean
    (PyG's GATConv(concat=False)); from the same parameters, the concatenated layer's
    heads averaged give it. A head count that does not divide the features is refused
    where the heads are concatenated (it had given a narrower output)."""
    x, views = _random_views(1, rows=(16, 32), fanout=4)
    averaged = GATConv(6, heads=3, concat=False)
    variables = averaged.init(jax.random.PRNGKey(0), x, x[:16], views[0])
    assert variables["params"]["bias"].shape == (6,)
    out = averaged.apply(variables, x, x[:16], views[0])
    side = GATConv(18, heads=3).apply(
        {"params": {**variables["params"], "bias": jnp.zeros(18)}}, x, x[:16], views[0])
    np.testing.assert_allclose(out, side.reshape(16, 3, 6).mean(1), rtol=1e-6, atol=1e-6)
    with pytest.raises(ValueError, match="heads >= 1 dividing features.*got features 7, "
                                         "heads 2"):
        GATConv(7, heads=2).init(jax.random.PRNGKey(0), x, x[:16], views[0])
    assert GATConv(7, heads=2, concat=False).init(
        jax.random.PRNGKey(0), x, x[:16], views[0])["params"]["bias"].shape == (7,)


def test_gat_output_heads_are_averaged_into_the_classes():
    """output_heads > 1 gives gat's output layer that many heads, averaged: the output
    keeps num_classes columns; other models read it no more than `heads`."""
    x, views = _random_views(2)
    one = make_model("gat", hidden=8, num_layers=2, num_classes=3, heads=2)
    many = make_model("gat", hidden=8, num_layers=2, num_classes=3, heads=2, output_heads=4)
    params = many.init(jax.random.PRNGKey(0), x, views, train=False)
    assert params["params"]["convs_1"]["Dense_0"]["kernel"].shape == (8, 12)
    assert many.apply(params, x, views, train=False).shape == (8, 3)
    assert one.init(jax.random.PRNGKey(0), x, views, train=False)["params"]["convs_1"][
        "Dense_0"]["kernel"].shape == (8, 3)
    sage = make_model("sage", hidden=8, num_layers=2, num_classes=3)
    variables = sage.init(jax.random.PRNGKey(0), x, views, train=False)
    np.testing.assert_array_equal(
        make_model("sage", hidden=8, num_layers=2, num_classes=3, output_heads=2).apply(
            variables, x, views, train=False), sage.apply(variables, x, views, train=False))
    for refused in (lambda: TrainConfig(model="gat", output_heads=0),
                    lambda: make_model("gat", hidden=8, num_layers=2, num_classes=3,
                                       output_heads=0)):
        with pytest.raises(ValueError, match="output_heads must be at least 1, got 0"):
            refused()


@pytest.mark.parametrize("name", ["sage", "gcn", "gat"])
def test_elu_follows_each_hidden_layer_where_asked(name):
    """activation "elu" replaces ReLU after the hidden layers (the output layer takes
    none): negative hidden values reach the next layer, so the outputs differ."""
    kw = dict(hidden=8, num_layers=2, num_classes=3, dropout=0.0)
    relu, elu = make_model(name, **kw), make_model(name, activation="elu", **kw)
    x, views = _random_views(2)
    variables = relu.init(jax.random.PRNGKey(0), x, views, train=False)
    assert not np.allclose(relu.apply(variables, x, views, train=False),
                           elu.apply(variables, x, views, train=False))
    with pytest.raises(ValueError, match=r"unknown activation 'tanh'; choose one of relu, elu"):
        make_model(name, activation="tanh", **kw)


@pytest.mark.parametrize("name", ["sage", "sage-sum"])
def test_sage_projecting_its_sources_first_computes_the_same_layer(name, monkeypatch):
    """Wide inputs into a narrow output over many slots: the sources' rows are projected
    by W_neigh before the mean (or sum); outputs and gradients match the concatenation's
    to float32 rounding, from the same parameters, and the form is taken only there."""
    from zerognn_jax._src.nn import models

    model = make_model(name, hidden=4, num_layers=2, num_classes=3, dropout=0.0)
    rs = np.random.default_rng(2)
    x, views = _random_views(2, rows=(8, 16, 32), fanout=12)
    x = jnp.asarray(rs.normal(size=(32, 200)).astype(np.float32))  # 200 features into 4
    variables = model.init(jax.random.PRNGKey(0), x, views, train=False)
    loss = lambda v: jnp.sum(jnp.sin(model.apply(v, x, views, train=False)))
    taken = []
    first = models.SAGEConv._projects_first
    monkeypatch.setattr(models.SAGEConv, "_projects_first",
                        lambda self, h, view: taken.append(first(self, h, view)) or taken[-1])
    out, grads = model.apply(variables, x, views, train=False), jax.grad(loss)(variables)
    assert taken[:2] == [True, False]  # layer 0 (200 -> 4 over 16 x 12 slots), not layer 1
    monkeypatch.setattr(models.SAGEConv, "_projects_first", lambda self, h, view: False)
    np.testing.assert_allclose(out, model.apply(variables, x, views, train=False),
                               rtol=1e-5, atol=1e-5)
    # (sums of 192 slots x 200 features in another order: float32 rounding at the
    # gradients' scale)
    for a, b in zip(jax.tree.leaves(grads), jax.tree.leaves(jax.grad(loss)(variables))):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=2e-5 * float(np.abs(b).max()))


@pytest.mark.parametrize("projects", [False, True])
def test_sage_over_sources_of_another_width_than_its_destinations(projects, monkeypatch):
    """A typed graph's relation joins types of other widths (papers' 128 features,
    authors' embedding rows): the projected form split its kernel at twice the
    destinations' width and failed where the concatenation's form trained."""
    from zerognn_jax._src.nn import models

    monkeypatch.setattr(models.SAGEConv, "_projects_first", lambda self, h, view: projects)
    conv = models.SAGEConv(8)
    (view,), rs = _random_views(1, rows=(16, 200), fanout=64)[1], np.random.default_rng(5)
    h_src = jnp.asarray(rs.normal(size=(200, 256)).astype(np.float32))
    h_dst = jnp.asarray(rs.normal(size=(16, 64)).astype(np.float32))
    variables = conv.init(jax.random.PRNGKey(0), h_src, h_dst, view)
    assert variables["params"]["linear"]["kernel"].shape == (64 + 256, 8)
    out = conv.apply(variables, h_src, h_dst, view)
    kernel = variables["params"]["linear"]["kernel"]
    agg = view.weighted_sum(h_src[:, None, :], models.mean_weights(view))[:, 0, :]
    want = h_dst @ kernel[:64] + agg @ kernel[64:] + variables["params"]["linear"]["bias"]
    np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-5)


def _dense_params(model, num_layers, width=5):
    """{name: (kernel, bias)} of every dense layer of `model`, started on inputs `width`
    wide (the layers' fan-ins follow from their kernels)."""
    x, views = _random_views(num_layers)
    x = jnp.ones((x.shape[0], width), jnp.float32)
    params = model.init(jax.random.PRNGKey(3), x, views, train=False)["params"]
    flat = jax.tree_util.tree_flatten_with_path(params)[0]
    out = {}
    for path, leaf in flat:
        name = "/".join(str(getattr(k, "key", k)) for k in path[:-1])
        out.setdefault(name, {})[path[-1].key] = np.asarray(leaf)
    return {k: (v["kernel"], v["bias"]) for k, v in out.items()}


@pytest.mark.parametrize("name", ["sage", "mlp"])
def test_torch_init_draws_as_pyg_and_torch_linear(name):
    """init="torch": weights and biases uniform in +-1/sqrt(fan_in), SAGE's fan-in being
    one half of its [self ; neighbours] input (PyG's two Linear layers); the default
    ("flax") keeps LeCun-normal weights over the whole input and zero biases."""
    width = 64
    make = lambda init: make_model(name, hidden=128, num_layers=2, num_classes=96,
                                   init=init)
    torch_like = _dense_params(make("torch"), 2, width)
    for kernel, bias in torch_like.values():
        fan_in = kernel.shape[0] // 2 if name == "sage" else kernel.shape[0]
        bound = fan_in ** -0.5
        for values in (kernel, bias):
            assert np.abs(values).max() <= bound
            assert np.abs(values).max() > 0.9 * bound  # the draws reach near the bound
        # uniform in +-b has variance b^2 / 3 (thousands of draws: within 10 %)
        assert abs(kernel.var() / (bound ** 2 / 3) - 1) < 0.1
    for kernel, bias in _dense_params(make("flax"), 2, width).values():
        assert not bias.any()
        assert abs(kernel.std() * np.sqrt(kernel.shape[0]) - 1) < 0.1  # LeCun: 1/fan_in


def test_torch_init_reaches_the_link_decoder_and_is_refused_elsewhere():
    """The MLP link decoder starts as torch's Linear under init="torch"; a model init
    does not apply to, or a model of the user's, is refused with the reason."""
    decoder = make_decoder("mlp", 32, init="torch")
    h = jnp.ones((4, 32))
    params = decoder.init(jax.random.PRNGKey(0), h, h)["params"]
    for layer in params.values():
        bound = layer["kernel"].shape[0] ** -0.5
        assert 0 < np.abs(layer["bias"]).max() <= bound
        assert np.abs(layer["kernel"]).max() <= bound
    with pytest.raises(ValueError, match="init must be one of flax, torch, got 'xavier'"):
        TrainConfig(init="xavier")
    with pytest.raises(ValueError, match=r"init='torch' \(--init\) applies to the models sage, "
                                         "sage-max, sage-sum, mlp, not 'gcn'"):
        TrainConfig(model="gcn", init="torch")
    with pytest.raises(ValueError, match="not 'gat', which starts as its own layers say"):
        make_model("gat", hidden=8, num_layers=2, num_classes=2, init="torch")
    graph, data = _data()
    ds = make_dataset("init", graph.indptr, graph.indices, np.asarray(data.features),
                      np.asarray(data.targets), np.arange(60), [], [], 3)
    own = make_model("sage", hidden=8, num_layers=2, num_classes=3)
    with pytest.raises(ValueError, match="a model of yours starts as its own layers say"):
        train(TrainConfig(init="torch", layers=2, fanouts=(3, 3), epochs=1), ds, model=own)
    with pytest.raises(ValueError, match="a model of yours starts as its own layers say"):
        train(TrainConfig(task="graph", init="torch", epochs=1), ds, model=own)
    # through the trainer: a link run's encoder and MLP decoder start with biases
    run = train(TrainConfig(task="link", decoder="mlp", init="torch", layers=2, hidden=8,
                            fanouts=(3, 3), epochs=0, eval_mode="none", progress=False), ds)
    biases = {"/".join(str(getattr(k, "key", k)) for k in path): np.asarray(leaf)
              for path, leaf in jax.tree_util.tree_flatten_with_path(
                  run.variables["params"])[0] if path[-1].key == "bias"}
    assert len(biases) == 4 and all(b.any() for b in biases.values()), biases.keys()


def test_config_default_has_no_input_dropout():
    cfg = TrainConfig()
    assert cfg.dropout == 0.5 and cfg.input_dropout == 0.0
    with pytest.raises(ValueError, match="input_dropout must be in"):
        TrainConfig(input_dropout=1.0)


def _autodiff_weighted_sum(h_src, nbr, weights):
    """The aggregation written plainly, its gradient left to autodiff (the oracle)."""
    acc = jnp.promote_types(h_src.dtype, jnp.float32)
    out = jnp.sum(h_src.astype(acc)[nbr] * weights[..., None].astype(acc), axis=1)
    return out.astype(h_src.dtype)


@pytest.mark.parametrize("dtype, tol", [("float32", 1e-5), ("bfloat16", 2e-2)])
@pytest.mark.parametrize("name", ["sage", "sage-sum", "gcn", "gat"])
def test_custom_backward_matches_autodiff(name, dtype, tol):
    """Parameter gradients of whole models through the gathering backward of the
    weighted sum equal autodiff's scatter, on a graph with isolated nodes (degree 0),
    fanouts above most degrees and padded rows (the last batch is short)."""
    from zerognn_jax import Kernels

    graph, data = _data()
    data = data._replace(features=data.features.astype(dtype))
    sampler = SamplerConfig((6, 4))
    model = make_model(name, hidden=8, num_layers=2, num_classes=3, dropout=0.0,
                       dtype=jnp.dtype(dtype))
    env = Envelope(40, (256, 512))
    seeds = jnp.arange(0, 100, 3, dtype=jnp.int32)  # 34 seeds in a batch of 40
    seeds = jnp.concatenate([seeds, jnp.zeros(6, jnp.int32)])
    valid = jnp.arange(40) < 34
    grads = {}
    for label, kernels in (("custom", Kernels()),
                           ("autodiff", Kernels(weighted_sum=_autodiff_weighted_sum))):
        program = StepProgram(model, optax.sgd(0.1), sampler, 40, seed=2, kernels=kernels)
        if label == "custom":  # one set of parameters for both: the kernels hold none
            params = init_state(program, data, env, np.arange(100)).params

        def loss(params, program=program):
            logits, _, _ = program.forward({"params": params}, data, seeds, valid,
                                           jnp.uint32(5), env.capacities, train=False)
            return jnp.sum(jnp.where(valid[:, None], logits, 0.0) ** 2)

        # Under jit: one compile per backward rather than every op dispatched eagerly.
        grads[label] = jax.jit(jax.grad(loss))(params)
    for a, b in zip(jax.tree_util.tree_leaves(grads["custom"]),
                    jax.tree_util.tree_leaves(grads["autodiff"])):
        scale = float(np.abs(np.asarray(b, np.float32)).max()) or 1.0
        np.testing.assert_allclose(np.asarray(a, np.float32), np.asarray(b, np.float32),
                                   rtol=tol, atol=tol * scale)


def test_exact_edge_sums_accumulate_in_float32_and_drop_padding():
    """A hub of 4,096 bfloat16 ones: summed in bfloat16 the total stops at 256 (256 + 1
    rounds back to 256); in float32 it is exact. Padding slots (mask False) add nothing
    even with nonzero weights."""
    hub, pad = 4096, 100
    dst = jnp.concatenate([jnp.zeros(hub, jnp.int32), jnp.ones(3, jnp.int32),
                           jnp.full(pad, 1, jnp.int32)])  # padding clipped onto the last row
    mask = jnp.arange(hub + 3 + pad) < hub + 3
    view = EdgeView(jnp.zeros(hub + 3 + pad, jnp.int32), dst, mask, jnp.ones(2, bool),
                    jnp.array([hub, 3]), jnp.array([hub + 3]), num_dst=2)
    h = jnp.ones((1, 1, 1), jnp.bfloat16)
    out = view.weighted_sum(h, jnp.ones((hub + 3 + pad, 1), jnp.bfloat16))
    assert out.dtype == jnp.bfloat16
    np.testing.assert_array_equal(np.asarray(out, np.float32).ravel(), [hub, 3])
    assert float(view.max(jnp.full((1, 1), 2.0, jnp.bfloat16))[1, 0]) == 2.0


def test_an_edge_chunks_max_keeps_an_infinite_max():
    """Exact inference's max had turned every non-finite max into 0 (its test for a
    destination without edges), where the sampled views keep an infinite one."""
    h = jnp.array([[np.inf, -np.inf], [1.0, -np.inf], [2.0, 3.0]])
    # destination 0 <- sources 0, 1; destination 1 <- source 1; destination 2: no edges
    view = EdgeView(jnp.array([0, 1, 1, 0], jnp.int32), jnp.array([0, 0, 1, 2], jnp.int32),
                    jnp.array([True, True, True, False]), jnp.ones(3, bool),
                    jnp.array([2, 1, 0]), jnp.array([1, 2, 0]), num_dst=3)
    np.testing.assert_array_equal(np.asarray(view.max(h)),
                                  [[np.inf, -np.inf], [1.0, -np.inf], [0.0, 0.0]])


def test_an_edge_chunks_weighted_sum_keeps_the_rows_dtype():
    """As the sampled views' does (bfloat16 rows gave float32 sums; a user trial)."""
    view = EdgeView(jnp.array([0, 1, 1, 0], jnp.int32), jnp.array([0, 0, 1, 2], jnp.int32),
                    jnp.array([True, True, True, False]), jnp.ones(3, bool),
                    jnp.array([2, 1, 0]), jnp.array([1, 2, 0]), num_dst=3)
    h = jnp.array([[[1.0, 2.0]], [[3.0, 4.0]], [[5.0, 6.0]]], jnp.bfloat16)
    out = view.weighted_sum(h, jnp.array([[0.5], [0.5], [1.0], [0.0]], jnp.float32))
    assert out.dtype == jnp.bfloat16
    np.testing.assert_array_equal(np.asarray(out, np.float32)[:, 0],
                                  [[2.0, 3.0], [3.0, 4.0], [0.0, 0.0]])
    with pytest.raises(ValueError, match=r"weights \[4\] \+ \[H\]; got h_src \[3, 2\]"):
        view.weighted_sum(h[:, 0], jnp.ones((4, 1)))  # it had returned [3, 4, 2]


@pytest.mark.parametrize("name", ["sage", "sage-sum", "sage-max", "gcn", "gat"])
def test_positional_levels_compute_what_dedup_computes(name):
    """A flat outer hop and tree mode (levels in slot order, read by position) give
    the dedup'd model's logits and parameter gradients, with padded seeds, isolated
    nodes (degree 0) and fanouts above most degrees."""
    graph, data = _data()
    model = make_model(name, hidden=8, num_layers=2, num_classes=3, dropout=0.0)
    seeds = jnp.concatenate([jnp.arange(0, 100, 3, dtype=jnp.int32), jnp.zeros(6, jnp.int32)])
    valid = jnp.arange(40) < 34
    results = {}
    for label, sampler in (("dedup", SamplerConfig((6, 4))),
                           ("flat", SamplerConfig((6, 4), flat_outer=True)),
                           ("tree", SamplerConfig((6, 4), dedup=False))):
        program = StepProgram(model, optax.sgd(0.1), sampler, 40, seed=2)
        env = sampler.fit_envelope(Envelope(40, (128, 512)))
        if label == "dedup":
            params = init_state(program, data, env, np.arange(100)).params

        def loss(params, program=program, env=env):
            logits, _, mb = program.forward({"params": params}, data, seeds, valid,
                                            jnp.uint32(5), env.capacities, train=False)
            return jnp.sum(jnp.where(valid[:, None], logits, 0.0) ** 2), mb

        # Under jit: one compile per layout rather than every op dispatched eagerly.
        (value, mb), grads = jax.jit(jax.value_and_grad(loss, has_aux=True))(params)
        results[label] = (value, grads)
        assert [n.shape[0] for n in mb.nodes] == [40, *env.capacities]
    assert env.capacities == (40 * 7, 40 * 7 * 5)  # tree: exact sizes
    for label in ("flat", "tree"):
        np.testing.assert_allclose(results[label][0], results["dedup"][0], rtol=1e-5)
        for a, b in zip(jax.tree_util.tree_leaves(results[label][1]),
                        jax.tree_util.tree_leaves(results["dedup"][1])):
            scale = float(np.abs(np.asarray(b)).max()) or 1.0
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5 * scale)


def test_positional_view_checks_its_source_rows():
    view = EllView(jnp.zeros((4, 3), jnp.int32), jnp.ones((4, 3), bool), jnp.ones(4, bool),
                   jnp.ones(4, jnp.int32), jnp.ones(16, jnp.int32), positional=True)
    with pytest.raises(ValueError, match="reads 16 source rows, got 12"):
        view.weighted_sum(jnp.zeros((12, 1, 2)), jnp.ones((4, 3, 1)))


@pytest.mark.parametrize("name", ["gcn", "gat"])
def test_a_graphs_self_loops_do_not_count_a_nodes_own_term_twice(name):
    """GCN and GAT add each node's own term, as PyG's GCNConv and GATConv add self-loops
    (add_remaining_self_loops; GAT removes and adds them): a loop in the graph gave the
    node its own term twice, and other outputs than the same graph without it."""
    import dataclasses

    import zerognn_jax as zg

    loops = np.array([[0, 1, 2, 2, 3, 4, 5, 6, 2, 1], [1, 2, 3, 2, 4, 5, 6, 0, 0, 1]])
    x = np.random.default_rng(0).standard_normal((8, 5)).astype(np.float32)
    y = np.arange(8) % 2

    def dataset(remove):
        g = zg.from_edge_index(loops, num_nodes=8, remove_self_loops=remove)
        return make_dataset("loops", g.indptr, g.indices, x, y, np.arange(4), np.arange(4, 6),
                            np.arange(6, 8), 2)

    cfg = TrainConfig(model=name, layers=1, fanouts=(-1,), batch_size=4, epochs=1, hidden=8,
                      heads=1, dropout=0.0, eval_mode="none", progress=False)
    with_loops = train(cfg, dataset(False))
    without = train(dataclasses.replace(cfg, epochs=0), dataset(True),
                    variables=with_loops.variables)
    # the dataset, whose statistics checkpoints compare, stays as given (the 2 loops kept)
    assert with_loops.dataset.graph.num_edges == 10 and with_loops.data.graph.num_edges == 8
    nodes = np.arange(8)
    np.testing.assert_allclose(np.asarray(zg.predict(with_loops, nodes)),
                               np.asarray(zg.predict(without, nodes)), rtol=1e-5, atol=1e-6)
