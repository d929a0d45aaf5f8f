"""The `zerognn` command line: `train`, `data info`, `data generate`, `bench`."""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys

HELP = {
    "dataset": "tiny (default, embedded synthetic), products-like, rmat, cora, citeseer, "
               "pubmed, ogbn-arxiv, ogbn-products, ogbn-papers100M, or a .npz file",
    "root": "folder holding dataset files (OGB layout, Planetoid files, generator cache)",
    "scale": "size factor for synthetic presets (products-like at 1.0 is full size)",
    "model": "sage, sage-max, sage-sum, gcn, gat or mlp",
    "fanouts": "comma-separated neighbours per hop, seeds' hop first; -1 = all",
    "batch_size": "seeds per step and device: a step trains on batch-size x devices x "
                  "processes seeds (the summary's global_batch)",
    "devices": "devices per process to train on, data parallel (0 = all local devices)",
    "shard_features": "split the feature table by rows across the devices (for tables "
                      "that do not fit one device; each step fetches rows from their owners)",
    "kernels": "auto (fastest measured per op), xla, pallas, or per op: "
               "sample=pallas,relabel=xla,gather=xla,aggregate=xla",
    "dtype": "float32, or bfloat16 (features and activations in half the bytes; sums and "
             "gradients accumulate in float32)",
    "dedup": "deduplicate sampled nodes (--no-dedup: tree sampling, the ablation)",
    "chunk_steps": "steps per compiled program; 0 = the whole epoch",
    "engine": "scan (default), or the host-mediated baseline: host-exact, host-bucketed",
    "envelope": "calibrate (tight, measured on device) or conservative",
    "eval_mode": "full (exact layer-wise), sampled, or none",
    "normalize_features": "row-normalise features (default: only for Planetoid)",
    "checkpoint_dir": "save every epoch here and resume from the latest checkpoint",
    "metrics_out": "append one JSON object per epoch, then a summary, to this file",
    "progress": "show a progress bar on stderr",
}


def _add_config_flags(parser: argparse.ArgumentParser, config_cls) -> None:
    for field in dataclasses.fields(config_cls):
        flag = "--" + field.name.replace("_", "-")
        default = field.default
        kind = field.type if isinstance(field.type, str) else field.type.__name__
        help_text = HELP.get(field.name, "") + f" (default: {default})"
        if kind.startswith("bool"):
            parser.add_argument(flag, dest=field.name, default=default, help=help_text,
                                action=argparse.BooleanOptionalAction)
        elif kind.startswith("tuple"):
            parser.add_argument(flag, dest=field.name, default=default, help=help_text,
                                type=_int_tuple)
        else:
            caster = {"int": int, "float": float}.get(kind.split()[0], str)
            parser.add_argument(flag, dest=field.name, default=default, help=help_text,
                                type=caster)


def _int_tuple(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(p) for p in text.split(",") if p.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected comma-separated integers, got {text!r}") from None


def _add_distributed_flags(parser: argparse.ArgumentParser) -> None:
    env = os.environ.get
    parser.add_argument(
        "--coordinator", default=env("JAX_COORDINATOR_ADDRESS"),
        help="host:port of process 0 for a run over several processes (hosts), or 'auto' "
             "to detect the cluster (SLURM, Open MPI); default: $JAX_COORDINATOR_ADDRESS, "
             "else a single-process run")
    parser.add_argument("--num-processes", type=int, default=env("JAX_NUM_PROCESSES"),
                        help="processes in the run (default: $JAX_NUM_PROCESSES)")
    parser.add_argument("--process-id", type=int, default=env("JAX_PROCESS_ID"),
                        help="this process's rank, 0 .. num-processes - 1 "
                             "(default: $JAX_PROCESS_ID)")


def _cmd_train(args) -> int:
    import jax

    from zerognn_jax._src import parallel
    from zerognn_jax._src.trainer import TrainConfig, train

    fields = {f.name for f in dataclasses.fields(TrainConfig)}
    cfg = TrainConfig(**{k: v for k, v in vars(args).items() if k in fields})
    parallel.initialize_distributed(args.coordinator, args.num_processes, args.process_id)
    result = train(cfg)
    if jax.process_index() == 0:
        print(json.dumps(result.summary))
    return 0


def build_parser() -> argparse.ArgumentParser:
    from zerognn_jax._src.bench import add_bench_command
    from zerognn_jax._src.cli_data import add_data_commands
    from zerognn_jax._src.trainer import TrainConfig

    parser = argparse.ArgumentParser(prog="zerognn", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    train_p = sub.add_parser("train", help="train a GNN (default: the embedded tiny graph)")
    _add_config_flags(train_p, TrainConfig)
    _add_distributed_flags(train_p)
    train_p.set_defaults(handler=_cmd_train)
    add_data_commands(sub)
    add_bench_command(sub)
    return parser


def main(argv=None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return args.handler(args)
    except (ValueError, FileNotFoundError) as err:
        print(f"zerognn: error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("zerognn: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
