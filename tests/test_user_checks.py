"""A user's model, loss and optimizer checked against each other before the epoch
compiles, with one line naming the piece and the shapes (issue #35 item 3)."""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from conftest import assert_same_runs, labelled_dataset

import zerognn_jax as zg

N, D = 200, 6


@pytest.fixture(scope="module")
def dataset():
    return labelled_dataset("checks", N, D, 3, seed=2, edges=800)


def config(**changes):
    base = dict(hidden=8, layers=1, fanouts=(3,), batch_size=35, epochs=1, progress=False,
                eval_mode="none", envelope="conservative")
    return zg.TrainConfig(**{**base, **changes})


class Width(nn.Module):
    """Seeds' own features through one Dense of `out` units."""

    out: int

    @nn.compact
    def __call__(self, x, views, *, train):
        return nn.Dense(self.out)(x[: views[-1].num_dst])


class AllRows(nn.Module):
    """Forgets to cut the outputs to the seeds: one row per sampled node."""

    @nn.compact
    def __call__(self, x, views, *, train):
        return nn.Dense(3)(x)


def test_a_wrong_width_for_float_targets_is_named_before_compiling(dataset):
    """Failed before with `TypeError: sub got incompatible shapes (35, 5), (35, 2)`
    inside the epoch."""
    reg = dataset.with_targets(np.asarray(dataset.features[:, :2]), "regression")
    with pytest.raises(ValueError, match=r"the model Width gives outputs float32\[35, 5\]; "
                                         r"the loss squared_error needs the targets' shape "
                                         r"float32\[35, 2\]"):
        zg.train(config(), reg, model=Width(5))


def test_a_wrong_width_for_class_labels_is_named(dataset):
    """Failed before: 2 scores for 3 classes trained silently (label 2 out of range)."""
    with pytest.raises(ValueError, match=r"Width gives outputs float32\[35, 2\]; the loss "
                                         r"softmax_cross_entropy needs 3 class scores"):
        zg.train(config(), dataset, model=Width(2))


def test_outputs_for_every_sampled_row_are_named(dataset):
    with pytest.raises(ValueError, match=r"AllRows gives outputs float32\[\d+, 3\]; the task "
                                         r"needs one row per target row: \[35, ...\]"):
        zg.train(config(), dataset, model=AllRows())


def test_a_link_encoder_for_every_sampled_row_is_named(dataset):
    """A link task's encoder giving every sampled row trained (pairs are looked up by
    position in its rows) and failed in evaluation, after training, deep inside JAX."""
    with pytest.raises(ValueError, match=r"AllRows fails on its first batch .*the encoder "
                                         r"gives float32\[\d+, 3\]; a link task needs one "
                                         r"embedding row per level-0 node .*: \[\d+, d\]"):
        zg.train(config(task="link", batch_size=16), dataset, model=AllRows())


def test_variables_in_collections_training_drops_are_named(dataset):
    """A Linen collection of the model's own failed inside Flax ("collection 'counters'
    is empty"); an NNX `nnx.Variable` was dropped and started afresh every step."""
    from flax import nnx

    class Counter(nn.Module):
        @nn.compact
        def __call__(self, x, views, *, train):
            self.variable("counters", "n", lambda: jnp.zeros((), jnp.int32))
            return nn.Dense(3)(x[: views[-1].num_dst])

    class NNXCounter(nnx.Module):
        def __init__(self, rngs):
            self.dense, self.count = nnx.Linear(D, 3, rngs=rngs), nnx.Variable(jnp.zeros(()))

        def __call__(self, x, views, *, train):
            return self.dense(x[: views[-1].num_dst])

    for model, collection in ((Counter(), "counters"), (NNXCounter(nnx.Rngs(0)), "Variable")):
        with pytest.raises(ValueError, match=rf"^the model keeps variables in the collection "
                                             rf"'{collection}'; training carries 'params' "):
            zg.train(config(), dataset, model=model)


def test_a_loss_that_does_not_fit_the_outputs_is_named(dataset):
    """Fits the dataset's 3 classes (checked when the task is built), not the model's 5
    outputs: failed before inside the epoch."""
    def brier(outputs, labels):
        return jnp.sum(jnp.square(outputs - jax.nn.one_hot(labels, 3)), -1)

    with pytest.raises(ValueError, match=r"the loss .*brier fails on the model Width's "
                                         r"outputs float32\[35, 5\] and targets int32\[35\]"):
        zg.train(config(), dataset, model=Width(5), loss=brier)


def test_an_optimizer_that_cannot_update_the_parameters_is_named(dataset):
    broken = optax.GradientTransformation(lambda params: (),
                                          lambda g, state, params=None: (g["missing"], state))
    with pytest.raises(ValueError, match=r"the optimizer GradientTransformation fails to "
                                         r"update the model's parameters"):
        zg.train(config(), dataset, model=Width(3), optimizer=broken)
    # one whose init fails (labels that name no parameter) was blamed on the model
    labelled = optax.multi_transform({"a": optax.adam(1e-3)}, {"nothing": "a"})
    with pytest.raises(ValueError, match=r"^the optimizer fails to start on the model's "
                                         r"parameters: "):
        zg.train(config(), dataset, model=Width(3), optimizer=labelled)


def test_a_model_that_fails_on_its_first_batch_is_named(dataset):
    class Broken(nn.Module):
        @nn.compact
        def __call__(self, x, views, *, train):
            return nn.Dense(3)(x) @ jnp.ones((4, 3))

    with pytest.raises(ValueError, match=r"the model .*Broken fails on its first batch"):
        zg.train(config(), dataset, model=Broken())


def test_a_model_that_fails_in_training_mode_alone_is_named(dataset):
    """Checked in evaluation mode only, such models failed inside the compiled epoch
    with a traceback: dropout on an rng stream the engine does not give, and outputs
    cut to the seeds only when not training."""
    class OwnStream(nn.Module):
        @nn.compact
        def __call__(self, x, views, *, train):
            x = nn.Dropout(0.5, rng_collection="drop")(x, deterministic=not train)
            return nn.Dense(3)(x[: views[-1].num_dst])

    class CutWhenEvaluating(nn.Module):
        @nn.compact
        def __call__(self, x, views, *, train):
            return nn.Dense(3)(x if train else x[: views[-1].num_dst])

    with pytest.raises(ValueError, match=r"OwnStream fails on its first batch in training mode "
                                         r"\(train=True; zg.train gives it the rng 'dropout'\)"
                                         r": InvalidRngError"):
        zg.train(config(), dataset, model=OwnStream())
    with pytest.raises(ValueError, match=r"CutWhenEvaluating gives outputs float32\[\d+, 3\] "
                                         r"in training mode .*; the task needs one row per "
                                         r"target row: \[35, ...\]"):
        zg.train(config(), dataset, model=CutWhenEvaluating())


class Rounded(nn.Module):
    """Outputs rounded to integers (or returned with something else beside them)."""

    pair: bool = False

    @nn.compact
    def __call__(self, x, views, *, train):
        out = nn.Dense(3)(x[: views[-1].num_dst])
        return (out, 0) if self.pair else out.astype(jnp.int32)


def test_outputs_that_cannot_carry_a_gradient_are_named(dataset):
    """Integer outputs, or an integer loss, trained to nothing (zero gradients) without a
    word; a tuple of outputs failed with "'tuple' object has no attribute 'shape'"."""
    with pytest.raises(ValueError, match=r"^the model Rounded gives int32\[35, 3\] outputs; "
                                         r"they must be floating point"):
        zg.train(config(), dataset, model=Rounded())
    with pytest.raises(ValueError, match=r"^the model Rounded gives a tuple of outputs; the "
                                         r"task needs one array, one row per target row"):
        zg.train(config(), dataset, model=Rounded(pair=True))
    counted = lambda out, y: (jnp.argmax(out, -1) != y).astype(jnp.int32)
    with pytest.raises(ValueError, match=r"gives int32\[35\] for outputs float32\[35, 3\] .*"
                                         r"one value per row, float32\[35\]"):
        zg.train(config(), dataset, model=Width(3), loss=counted)


def test_an_optimizer_reading_the_loss_gets_each_steps(dataset):
    """`optax.contrib.reduce_on_plateau` takes `value=`: the step's training loss. Over
    accumulation windows of one epoch its best value is the lowest epoch loss."""
    train = int(np.asarray(dataset.train_idx).size)
    batch = next(b for b in range(40, 0, -1) if train % b == 0)  # no partial last batch
    steps = train // batch
    tx = optax.chain(optax.adam(1e-2),
                     optax.contrib.reduce_on_plateau(patience=1, accumulation_size=steps))
    result = zg.train(config(epochs=3, batch_size=batch), dataset, model=Width(3),
                      optimizer=tx)
    losses = [r["loss"] for r in result.history]
    plateau = result.state.opt_state[1]
    assert int(plateau.count) == 0  # three whole windows
    np.testing.assert_allclose(float(plateau.best_value), min(losses), rtol=1e-5)
    assert result.history[-1]["lr_scale"] == float(plateau.scale)
    assert "learning_rate" not in result.history[-1]  # adam's is in no state
    # optax.MultiSteps is no GradientTransformationExtraArgs, and passes the value on
    every = optax.MultiSteps(tx, every_k_schedule=1)
    again = zg.train(config(epochs=3, batch_size=batch), dataset, model=Width(3),
                     optimizer=every)
    assert_same_runs([r["loss"] for r in again.history], losses)


def test_an_injected_learning_rate_is_recorded_each_epoch(dataset):
    schedule = optax.linear_schedule(1e-2, 1e-3, transition_steps=6)
    tx = optax.inject_hyperparams(optax.adam)(learning_rate=schedule)
    result = zg.train(config(epochs=2, batch_size=40), dataset, model=Width(3),
                      optimizer=tx)  # 120 training nodes: 3 steps an epoch
    np.testing.assert_allclose([r["learning_rate"] for r in result.history],
                               [schedule(2), schedule(5)], rtol=1e-6)
    assert "lr_scale" not in result.history[0]
