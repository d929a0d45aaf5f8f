"""Typed node classification on mag-like (or igbh-like): epoch time, seeds per second
and test accuracy of zerognn-jax, and the same graph written for the PyG peer
(benchmarks/peers/pyg_hetero_sage.py). With `--task link`, link prediction on one
relation instead (`--link-relation`, default writes: authors and their papers; on
`--dataset shop-like`, buys: users and the items they bought; the PyG peer is
benchmarks/peers/pyg_hetero_link.py): training pairs per second and test AUC.

Relational SAGE (`rsage`), 2 layers, fanouts [25, 20] for every relation, batch 1024,
Adam; featureless types (authors, institutions, fields) take learnable `hidden`-wide
embeddings (row-sparse lazy Adam updates here, `SparseAdam` in the PyG peer).
Evaluation samples the test papers with the training fanouts (`--eval-mode sampled`, as
the peer does). MLPerf's R-GAT configuration on igbh-like:

    python3 benchmarks/hetero.py --dataset igbh-like --model rgat \
        --hidden 512 --heads 4 --fanouts 15,10,5 --dtype bfloat16 --epochs 2

    python3 benchmarks/hetero.py --scale 1 --epochs 5 --out OUT/hetero.jsonl \
        --write-npz OUT/mag-like.npz          # then the peer reads OUT/mag-like.npz

The .npz is neutral (NumPy only): `types`, `target`, per type `count_<t>` and `x_<t>`
(features, when the type has them), per relation i `rel_<i>` ("src__name__dst") and
`edge_index_<i>` int64[2, E] (sources, destinations), `y` (target labels), `train`,
`val`, `test` (target ids).

Progress goes to stderr as it happens, one timestamped line per stage (the dataset, the
training's preparation with its compile, each epoch), and `--out` gets the dataset's
line and each epoch's record as soon as they exist: a run stopped at a time limit
leaves what it measured. `--profile TOP` then profiles one more epoch
(`profiling.profile_training_epoch`: device time a step by phase, the busiest kernels
with the operations they came from). igbh-like is generated in memory unless `--root`
is given: its ~37 GB cache would fill half of a 64 GB disk, and a fresh machine has none
to reuse.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import tempfile
import time

import numpy as np
from papers100m import Clock  # this folder: run as `python benchmarks/hetero.py`

import zerognn_jax as zg
from zerognn_jax._src.bench import profiling
from zerognn_jax._src.nn.link_heads import DECODERS
from zerognn_jax._src.training.records import MetricsLog, check_output_paths


def write_npz(ds, path: str) -> None:
    """The typed dataset as the neutral .npz of the module docstring."""
    arrays = {"types": np.array(ds.graph.node_types), "target": np.array(ds.target_type),
              "y": ds.labels.astype(np.int64), "train": ds.train_idx, "val": ds.val_idx,
              "test": ds.test_idx}
    for t, n in ds.graph.node_counts:
        arrays[f"count_{t}"] = np.array(n)
        if t in ds.features:
            arrays[f"x_{t}"] = np.asarray(ds.features[t], np.float32)
    for i, (rel, g) in enumerate(ds.graph.items()):
        dst = np.repeat(np.arange(g.num_nodes), np.diff(np.asarray(g.indptr).astype(np.int64)))
        arrays[f"rel_{i}"] = np.array("__".join(rel))
        arrays[f"edge_index_{i}"] = np.stack([np.asarray(g.indices, np.int64), dst])
    np.savez(path, **arrays)


def log_epoch(clock: Clock, record: dict) -> None:
    """A training callback (with `clock` bound): one progress line per finished epoch
    (the first one's compile apart)."""
    compiled = record.get("compile_seconds") or 0.0
    clock.log(f"epoch {record['epoch']} done: {record['epoch_seconds']:.2f} s"
               + (f" (+ {compiled:.1f} s compiling)" if compiled else "")
               + f", loss {record['loss']:.4f}")


def append_line(path: str | None, record: dict) -> None:
    """Appends `record` as one JSON line to `path` (when given), at once, through the
    metrics log that the trainer then appends its records to."""
    check_output_paths(path, None)  # creates the folder
    log = MetricsLog(path)
    log.write(record)
    log.close()


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dataset", default="mag-like",
                   choices=("mag-like", "igbh-like", "shop-like"))
    p.add_argument("--scale", type=float, default=1.0)
    p.add_argument("--model", default="rsage", choices=zg.HETERO_MODELS)
    p.add_argument("--task", default="node", choices=("node", "link"),
                   help="link: predict the pairs of --link-relation (positives a step: "
                        "--batch-size, one negative each by destination)")
    p.add_argument("--link-relation", default=None,
                   help="with --task link: the relation whose pairs to predict (default "
                        "buys on shop-like, else writes)")
    p.add_argument("--decoder", default="scaled-dot", choices=DECODERS,
                   help="with --task link: how a pair is scored (TrainConfig.decoder)")
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--heads", type=int, default=4, help="attention heads (rgat)")
    p.add_argument("--fanouts", default="25,20")
    p.add_argument("--batch-size", type=int, default=1024)
    p.add_argument("--epochs", type=int, default=5)
    p.add_argument("--lr", type=float, default=None,
                   help="Adam's step size (default: 3e-3 on mag-like, as the PyG peer; 1e-3 "
                        "on igbh-like, where R-GAT at 3e-3 barely learned: docs/benchmarks.md)")
    p.add_argument("--dtype", default="float32")
    p.add_argument("--kernels", default="auto", help="as TrainConfig.kernels, e.g. "
                   "'sample=pallas' (auto's GPU choice but the embeddings' row update in "
                   "its XLA form)")
    p.add_argument("--embedding-dim", type=int, default=0,
                   help="learnable rows of this width for every type, after a featured "
                        "type's features (as TrainConfig; 0: the featureless types' only, "
                        "--hidden wide)")
    p.add_argument("--devices", type=int, default=1,
                   help="devices to train on, data parallel (--batch-size is per device)")
    p.add_argument("--shard-features", action="store_true",
                   help="split the stacked feature table by rows across the devices")
    p.add_argument("--eval-mode", default="sampled", choices=("sampled", "full", "none"),
                   help="none: throughput alone, no evaluation (with sampled or full, "
                        "the last epoch's record is written after the evaluation that "
                        "ends the run)")
    p.add_argument("--feature-placement", default="auto", choices=("auto", "device", "host"),
                   help="where the stacked feature table lives (as TrainConfig)")
    p.add_argument("--feature-cache-gib", type=float, default=None,
                   help="a host table's hottest rows cached on the device (as TrainConfig)")
    p.add_argument("--host-row-order", default="auto", choices=("auto", "degree", "stored"),
                   help="a host table's rows by degree or as stored (as TrainConfig)")
    p.add_argument("--root", default=None,
                   help="data folder caching the dataset (default: .cache/zerognn for "
                        "mag-like and shop-like, none for igbh-like)")
    p.add_argument("--out", default=None, help="JSON lines: the dataset's, each epoch's as it "
                   "ends, the summary")
    p.add_argument("--write-npz", default=None, help="write the graph for the PyG peer")
    p.add_argument("--profile", type=int, default=0, metavar="TOP",
                   help="after training, one more epoch compiled kernel by kernel under the "
                        "profiler: device time a step by phase and its TOP busiest kernels")
    p.add_argument("--hlo-out", default=None,
                   help="with --profile: write the profiled program's optimized HLO here")
    args = p.parse_args(argv)
    if args.hlo_out is not None:
        folder = os.path.dirname(os.path.abspath(args.hlo_out))
        if not args.profile:
            p.error("--hlo-out writes the profiled program: give --profile TOP too")
        if os.path.isdir(args.hlo_out):
            p.error(f"--hlo-out {args.hlo_out} is a folder: give a file's path")
        if not os.path.isdir(folder):
            p.error(f"--hlo-out: the folder {folder} does not exist")
        if not os.access(folder, os.W_OK):
            p.error(f"--hlo-out: cannot write into {folder}")
    root = args.root if args.root is not None else (
        ".cache/zerognn" if args.dataset != "igbh-like" else None)
    clock = Clock(None, seconds_format="{:7.1f} s")
    clock.log(f"{args.dataset} at scale {args.scale:g}: "
              f"{'loading or generating' if root else 'generating'}")
    t0 = time.perf_counter()
    ds = zg.load_hetero_dataset(args.dataset, root, scale=args.scale)
    load_s = time.perf_counter() - t0
    stats = {"nodes": int(sum(ds.num_nodes.values())),
             "directed_edges": int(sum(ds.graph.num_edges.values())),
             "feature_gb": sum(f.nbytes for f in ds.features.values()) / 1e9}
    clock.log(f"dataset ready in {load_s:.1f} s: {stats['nodes']:,} nodes, "
              f"{stats['directed_edges']:,} directed edges, {stats['feature_gb']:.1f} GB of "
              f"features")
    append_line(args.out, {"stage": "dataset", "dataset": args.dataset, "scale": args.scale,
                           "seconds": load_s, **stats})
    if args.write_npz:
        write_npz(ds, args.write_npz)
        clock.log(f"wrote {args.write_npz}")
    fanouts = tuple(int(f) for f in args.fanouts.split(","))
    relation = args.link_relation or ("buys" if args.dataset == "shop-like" else "writes")
    link = {"task": "link", "link_relation": relation, "decoder": args.decoder} \
        if args.task == "link" else {}
    cfg = zg.TrainConfig(**link, dataset=args.dataset, scale=args.scale, model=args.model,
                         hidden=args.hidden, heads=args.heads, layers=len(fanouts), fanouts=fanouts,
                         batch_size=args.batch_size, epochs=args.epochs,
                         lr=args.lr or (1e-3 if args.dataset == "igbh-like" else 3e-3),
                         dtype=args.dtype, kernels=args.kernels, eval_mode=args.eval_mode,
                         embedding_dim=args.embedding_dim, devices=args.devices,
                         shard_features=args.shard_features,
                         eval_every=0, feature_placement=args.feature_placement,
                         feature_cache_gib=args.feature_cache_gib,
                         host_row_order=args.host_row_order, metrics_out=args.out, progress=False)
    clock.log("training: preparing (graph and features to the device, calibration, "
              "initialisation), then compiling and epoch 0")
    result = zg.train(cfg, ds, callbacks=(functools.partial(log_epoch, clock),))
    s = result.summary
    clock.log(f"done: {s['compile_seconds']:.1f} s compiling, "
              f"{s['calibrate_seconds']:.1f} s calibrating")
    items = result.program.task.train_items(ds)  # papers, or a link task's training pairs
    seeds_per_s = items.shape[0] / s["median_epoch_seconds"]
    metric = "test_auc" if args.task == "link" else "test_acc"
    accuracy = "not evaluated" if s.get(metric) is None else f"{100 * s[metric]:.2f} %"
    print(f"| system | device | features | epoch (median) | {args.task} items/s | compile | "
          f"{metric} | load |")
    print("|---|---|---|---|---|---|---|---|")
    print(f"| zerognn-jax {args.dataset} {args.model} {args.dtype} | {s['device']} | "
          f"{s['feature_placement']} | "
          f"{s['median_epoch_seconds']:.3f} s | {seeds_per_s:,.0f} | "
          f"{s['compile_seconds']:.1f} s | {accuracy} | {load_s:.1f} s |")
    print(json.dumps({"seeds_per_second": seeds_per_s, "train_items": int(items.shape[0]),
                      "epochs": [h["epoch_seconds"] for h in result.history],
                      "losses": [h["loss"] for h in result.history],
                      "overflows": s["overflows"], "envelope": s["envelope"]}))
    if args.profile:
        del result  # its device data: the profiled run prepares its own
        clock.log("profiling one more epoch (compiled without command buffers)")
        with tempfile.TemporaryDirectory() as tmp:
            out = profiling.profile_training_epoch(cfg, ds, tmp, top=args.profile,
                                                   hlo_out=args.hlo_out)
        print(json.dumps(out))
        print("| phase | us a step | kernels a step |\n|---|---|---|")
        for phase, (us, launches) in out["phases_us_per_step"].items():
            print(f"| {phase} | {us} | {launches} |")
        print("| kernel | us a step | launches | MB | GB/s | operation |")
        print("|---|---|---|---|---|---|")
        for row in out["top_kernels"]:
            print("| " + " | ".join("" if v is None else str(v) for v in row) + " |")


if __name__ == "__main__":
    main()
