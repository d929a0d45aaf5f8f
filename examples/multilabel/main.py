"""Multi-label node targets, early stopping, the best checkpoint, and restore for inference.

Each node of the built-in tiny graph gets 4 binary labels (the bits of its class id);
`zg.train` fits them with the built-in GraphSAGE and binary cross-entropy, stops early
when validation micro-F1 stops improving, keeps the best epoch's checkpoint, and
`zg.restore` loads that checkpoint back to predict the test nodes' labels.

    python examples/multilabel/main.py --epochs 20 --out runs/multilabel
    python examples/multilabel/main.py --out runs/multilabel-tb --tensorboard  # + tb/
                                                      # (needs tensorboardX)

A folder given again resumes its run: a finished one trains nothing more (its
summary's "epochs" counts the epochs the folder holds), and its TensorBoard scalars are
those of the epochs trained with `--tensorboard` on.
"""

import argparse
import json
import pathlib
import shutil
import tempfile

import numpy as np

import zerognn_jax as zg
from zerognn_jax.cli.flags import run_main


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False)
    p.add_argument("--epochs", type=int, default=20)
    p.add_argument("--out", default=None, help="run folder (default: a new temporary "
                   "one, kept, its path printed as run_folder)")
    p.add_argument("--tensorboard", action="store_true", help="write TensorBoard scalars")
    args = p.parse_args(argv)
    if args.epochs < 1:  # zg.train takes 0 (evaluate only), but then keeps no best epoch
        p.error(f"--epochs must be at least 1 (the best epoch's checkpoint is restored), "
                f"got {args.epochs}")
    out = pathlib.Path(args.out or tempfile.mkdtemp(prefix="zerognn-multilabel-"))
    ds = zg.load_dataset("tiny")
    bits = (ds.labels.clip(0)[:, None] >> np.arange(4)) & 1
    ds = ds.with_targets(bits.astype(np.float32), "multilabel")
    cfg = zg.TrainConfig(hidden=64, layers=2, fanouts=(10, 5), batch_size=128, lr=1e-2,
                         epochs=args.epochs, progress=False, eval_mode="full",
                         checkpoint_dir=str(out / "ck"), best_metric="val_f1",
                         metrics_out=str(out / "metrics.jsonl"),
                         tensorboard_dir=str(out / "tb") if args.tensorboard else None)
    try:
        result = zg.train(cfg, ds, callbacks=[zg.EarlyStopping("val_f1", patience=3)])
        best = zg.restore(cfg.checkpoint_dir, cfg, ds, best=True)
    except BaseException:
        if args.out is None:  # the temporary folder made for this run holds nothing kept
            shutil.rmtree(out, ignore_errors=True)
        raise
    logits = zg.layerwise_logits(best.program, best.variables, best.data)
    pred = np.asarray(logits)[ds.test_idx] > 0
    f1 = zg.target_metrics(np.asarray(logits)[ds.test_idx], ds.targets[ds.test_idx],
                           "multilabel")["f1"]
    report = {"epochs": result.summary["epochs"], "best": result.summary["best"],
              "stopped_early": result.summary["stopped_early"],
              "test_f1_of_best": f1, "predicted_positive": float(pred.mean()),
              "run_folder": str(out)}
    print(json.dumps(report))
    return report


if __name__ == "__main__":
    run_main(main)
