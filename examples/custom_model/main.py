"""Plugging your own Flax module into the engine.

A model is any Linen module called as `model(x, views, train=...)`: `x` holds the
features of the outermost sampled level, `views[i]` is layer i's edges (outermost hop
first) and offers `weighted_sum`, `max`, `softmax`, `src_of_edges`, `dst_of_edges`, and
`num_dst` (its destinations are the first `num_dst` rows of its sources). Return the
logits of the seeds (the first `views[-1].num_dst` rows).

    python examples/custom_model/main.py --epochs 5
"""

import argparse
import json

import flax.linen as nn
import jax.numpy as jnp
import optax

import zerognn_jax as zg


class MeanConcat(nn.Module):
    """Each layer: [own features, mean of sampled neighbours] -> Dense -> ReLU."""

    hidden: int
    num_classes: int

    @nn.compact
    def __call__(self, x, views, *, train):
        h = x
        for i, view in enumerate(views):
            neigh = view.weighted_sum(h[:, None, :], zg.mean_weights(view))[:, 0, :]
            h = jnp.concatenate([h[: view.num_dst], neigh], axis=-1)
            last = i == len(views) - 1
            h = nn.Dense(self.num_classes if last else self.hidden)(h)
            h = h if last else nn.relu(h)
        return h


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dataset", default="tiny")
    p.add_argument("--epochs", type=int, default=5)
    args = p.parse_args(argv)
    dataset = zg.load_dataset(args.dataset)
    data = zg.DeviceData(dataset.graph.to_device(), jnp.asarray(dataset.features),
                         jnp.asarray(dataset.labels.clip(0)))
    program = zg.StepProgram(MeanConcat(64, dataset.num_classes), optax.adam(3e-3),
                             zg.SamplerConfig((10, 5)), batch_size=128, seed=0)
    calibration = zg.calibrate(data.graph, dataset.train_idx, 128, program.sampler)
    envelope = calibration.envelope
    state = zg.init_state(program, data, envelope, dataset.train_idx)
    engine = zg.ScanEngine(program)  # compiles the epoch once, reuses it every epoch
    for epoch in range(args.epochs):
        result = engine.run_epoch(state, data, dataset.train_idx, epoch, envelope)
        state, envelope = result.state, result.envelope
        print(json.dumps({"epoch": epoch, "loss": result.loss, "train_acc": result.train_acc}))
    logits = zg.sampled_logits(program, {"params": state.params}, data, dataset.test_idx,
                               batch_size=512)
    acc = float(jnp.mean(jnp.argmax(logits, -1) == dataset.labels[dataset.test_idx]))
    print(json.dumps({"test_acc": acc}))
    return acc


if __name__ == "__main__":
    main()
