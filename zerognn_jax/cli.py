"""The `zerognn` command line: `train`, `data info`, `data generate`, `bench`."""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys

HELP = {
    "dataset": "tiny (default, embedded synthetic), products-like, rmat, cora, citeseer, "
               "pubmed, ogbn-arxiv, ogbn-products, ogbn-papers100M, or a .npz file",
    "root": "folder holding dataset files (OGB layout, Planetoid files, generator cache)",
    "scale": "size factor for synthetic presets (products-like at 1.0 is full size)",
    "model": "sage, sage-max, sage-sum, gcn, gat or mlp",
    "fanouts": "comma-separated neighbours per hop, seeds' hop first; -1 = all",
    "batch_size": "seeds per step (per device)",
    "kernels": "xla, pallas, or per op: sample=pallas,relabel=xla,gather=xla,aggregate=xla",
    "dedup": "deduplicate sampled nodes (--no-dedup: tree sampling, the ablation)",
    "chunk_steps": "steps per compiled program; 0 = the whole epoch",
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


def _cmd_train(args) -> int:
    from zerognn_jax._src.trainer import TrainConfig, train

    fields = {f.name for f in dataclasses.fields(TrainConfig)}
    cfg = TrainConfig(**{k: v for k, v in vars(args).items() if k in fields})
    result = train(cfg)
    print(json.dumps(result.summary))
    return 0


def build_parser() -> argparse.ArgumentParser:
    from zerognn_jax._src.cli_data import add_data_commands
    from zerognn_jax._src.trainer import TrainConfig

    parser = argparse.ArgumentParser(prog="zerognn", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    train_p = sub.add_parser("train", help="train a GNN (default: the embedded tiny graph)")
    _add_config_flags(train_p, TrainConfig)
    train_p.set_defaults(handler=_cmd_train)
    add_data_commands(sub)
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
