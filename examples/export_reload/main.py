"""Export a trained model with `jax.export`, reload the bytes, and serve predictions.

`zg.export_model` stages one batch of sampled inference (the training fanouts; -1 takes
every neighbour, which makes it exact) with the variables baked in. The serialized
artifact loads in any process with JAX (`jax.export.deserialize`), no zerognn-jax
needed; the graph and the features are its arguments.

    python examples/export_reload/main.py                 # fanouts 10,5: a sampled artifact
    python examples/export_reload/main.py --fanouts=-1,-1 # exact: every neighbour (slower,
                                                          # 12 minutes on 2 busy CPU cores)
"""

import argparse
import json

import jax
import jax.numpy as jnp
import numpy as np

import zerognn_jax as zg
from zerognn_jax.cli.flags import int_tuple, parse_args, run_main


def serve(blob: bytes, graph, features, nodes, batch_size: int) -> np.ndarray:
    """The reloaded artifact's predicted class of each of `nodes`, `batch_size` a call."""
    fn = jax.export.deserialize(blob)
    preds = []
    for start in range(0, len(nodes), batch_size):
        chunk = nodes[start:start + batch_size]
        seeds = np.zeros(batch_size, np.int32)
        seeds[: len(chunk)] = chunk
        valid = np.arange(batch_size) < len(chunk)
        logits = fn.call(graph.indptr, graph.indices, features, jnp.asarray(seeds),
                         jnp.asarray(valid), jnp.uint32(0))
        preds.append(np.asarray(jnp.argmax(logits, -1))[: len(chunk)])
    return np.concatenate(preds)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False)
    p.add_argument("--dataset", default="tiny", help="a dataset name or .npz file")
    p.add_argument("--root", default=None,
                   help="folder of a named dataset's files (Planetoid's ind.* files, OGB's "
                        "folders)")
    p.add_argument("--epochs", type=int, default=5)
    p.add_argument("--fanouts", type=int_tuple, default="10,5", help="per hop, seeds' hop first")
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--lr", type=float, default=3e-3)
    args = parse_args(p, argv)
    fanouts = args.fanouts
    cfg = zg.TrainConfig(dataset=args.dataset, root=args.root, layers=len(fanouts),
                         fanouts=fanouts, batch_size=128, hidden=args.hidden, dropout=0.2,
                         lr=args.lr, epochs=args.epochs, eval_every=0, progress=False)
    result = zg.train(cfg)
    art = zg.export_model(result.program, result.variables, result.data, batch_size=256)
    blob = bytes(art.serialize())
    ds = result.dataset
    preds = serve(blob, result.data.graph, result.data.features, ds.test_idx, 256)
    report = {"trained_test_acc": result.summary["test_acc"], "artifact_bytes": len(blob),
              "served_test_acc": float(np.mean(preds == ds.labels[ds.test_idx]))}
    print(json.dumps(report))
    return report


if __name__ == "__main__":
    run_main(main)
