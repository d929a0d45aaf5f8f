"""Train with your own optimizer, then restore the checkpoint for inference with the
model only and predict a subset of nodes.

`zg.restore(folder, for_inference=True)` needs neither the config (every checkpoint
records it, with the dataset's root) nor the training optimizer or loss; `zg.predict`
gives the output rows of the nodes asked for (exact layer-wise for models that offer
it, docs/api.md).

    python examples/restore_predict/main.py --epochs 5 --out runs/restore

A folder given again resumes its run: a finished one trains nothing more.
"""

import argparse
import json
import pathlib
import shutil
import tempfile

import numpy as np
import optax

import zerognn_jax as zg
from zerognn_jax.cli.flags import int_tuple, parse_args, run_main


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
    p.add_argument("--out", default=None, help="run folder (default: a new temporary "
                   "one, kept, its path printed as run_folder)")
    args = parse_args(p, argv)
    if args.epochs < 1:  # zg.train takes 0 (evaluate only), but then writes no checkpoint
        p.error(f"--epochs must be at least 1 (the run's checkpoint is restored), got "
                f"{args.epochs}")
    out = pathlib.Path(args.out or tempfile.mkdtemp(prefix="zerognn-restore-"))
    fanouts = args.fanouts
    cfg = zg.TrainConfig(dataset=args.dataset, root=args.root, layers=len(fanouts),
                         fanouts=fanouts, batch_size=128, hidden=args.hidden, dropout=0.2,
                         lr=args.lr, epochs=args.epochs, eval_every=0, progress=False,
                         checkpoint_dir=str(out / "ckpt"))
    tx = optax.chain(optax.clip_by_global_norm(1.0), optax.adamw(args.lr, weight_decay=1e-4))
    try:
        trained = zg.train(cfg, optimizer=tx)
        # Another process would start here: the folder is all it needs.
        back = zg.restore(cfg.checkpoint_dir, for_inference=True)
    except BaseException:
        if args.out is None:  # the temporary folder made for this run holds nothing kept
            shutil.rmtree(out, ignore_errors=True)
        raise
    ds = back.dataset
    subset = np.sort(ds.test_idx)[: max(1, len(ds.test_idx) // 2)]
    logits = np.asarray(zg.predict(back, subset))
    acc = float(np.mean(np.argmax(logits, -1) == ds.labels[subset]))
    same = bool(np.allclose(logits, np.asarray(zg.predict(trained, subset)), atol=1e-5))
    report = {"trained_test_acc": trained.summary["test_acc"], "restored_epoch":
              back.summary["epoch"], "subset": len(subset), "subset_acc": acc,
              "same_as_trained": same, "run_folder": str(out)}
    print(json.dumps(report))
    return report


if __name__ == "__main__":
    run_main(main)
