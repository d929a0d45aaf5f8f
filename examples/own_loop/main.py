"""Your own training loop on the device sampler: `NeighborLoader` as a data loader.

The loader shuffles the seeds every epoch and yields sampled subgraphs of static shape
(so the jitted step below compiles once per envelope); the loop, the loss and the
optimizer are yours. `zerognn train` / `zg.train` run a whole epoch as one program
instead, without the per-batch return to Python this loop makes.

    python examples/own_loop/main.py --epochs 3
"""

import argparse
import json

import jax
import jax.numpy as jnp
import optax

import zerognn_jax as zg


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dataset", default="tiny")
    p.add_argument("--epochs", type=int, default=3)
    args = p.parse_args(argv)
    ds = zg.load_dataset(args.dataset)
    features, labels = jnp.asarray(ds.features), jnp.asarray(ds.labels.clip(0))
    loader = zg.NeighborLoader(ds.graph, ds.train_idx, fanouts=(10, 5), batch_size=256,
                               key=jax.random.key(0))
    model = zg.make_model("sage", hidden=64, num_layers=2, num_classes=ds.num_classes)
    tx = optax.adam(3e-3)

    def inputs(mb):
        return jnp.where(mb.valid[-1][:, None], features[mb.nodes[-1]], 0.0), zg.views_for(mb)

    @jax.jit
    def step(params, opt_state, mb, drop_key):
        def loss_fn(params):
            x, views = inputs(mb)
            logits = model.apply({"params": params}, x, views, train=True,
                                 rngs={"dropout": drop_key})
            ce = optax.softmax_cross_entropy_with_integer_labels(logits, labels[mb.nodes[0]])
            weight = mb.valid[0].astype(jnp.float32)
            return jnp.sum(ce * weight) / jnp.maximum(jnp.sum(weight), 1.0)

        loss, grads = jax.value_and_grad(loss_fn)(params)
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    first = next(loader.epoch(0)).minibatch
    params = model.init(jax.random.key(1), *inputs(first), train=False)["params"]
    opt_state = tx.init(params)
    losses = []
    for _ in range(args.epochs):
        epoch_losses = []
        for batch in loader:
            params, opt_state, loss = step(params, opt_state, batch.minibatch,
                                           batch.dropout_key)
            epoch_losses.append(loss)
        losses.append(float(jnp.mean(jnp.stack(epoch_losses))))
        print(json.dumps({"epoch": len(losses) - 1, "loss": losses[-1]}))
    return losses


if __name__ == "__main__":
    main()
