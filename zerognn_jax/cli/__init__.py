"""The `zerognn` command line: `train`, `data info`, `data generate`, `bench`."""

from __future__ import annotations

import argparse
import sys

from zerognn_jax.cli.bench import add_bench_command
from zerognn_jax.cli.data import add_data_commands
from zerognn_jax.cli.train import add_train_command


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="zerognn", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    add_train_command(sub)
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
