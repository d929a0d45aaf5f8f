"""`zerognn bench`: the training flags (with the bench's workload as defaults; none for
what its configurations set, other tasks, evaluation or training outputs) plus what to
measure. The runner is `zerognn_jax/_src/bench/run.py`, whose docstring gives the
protocol."""

from __future__ import annotations

import argparse
import json
import pathlib

from zerognn_jax.cli.flags import add_config_flags, config_from_args, int_tuple, name_tuple
from zerognn_jax.cli.train import HELP as TRAIN_HELP

HELP = dict(TRAIN_HELP, epochs="timed epochs per configuration",
            model="the built-in model; omitted: sage",
            dataset="a graph of one node type: tiny (built-in synthetic, generated from "
                    "--seed), products-like, proteins-like, papers100m-like, rmat, cora, "
                    "citeseer, pubmed, ogbn-arxiv, ogbn-products, ogbn-papers100M, "
                    "ogbn-proteins, a .npz file or a dataset directory",
            margin="calibrated capacity = margin x the largest count seen (>= 1); unset: 1.1",
            fanouts="neighbours sampled per hop, seeds' hop first; -1 = all (--fanouts -1,-1)",
            edge_features="give the model the sampled edges' features (gat, gine; the "
                          "dataset needs an edge-feature table)",
            embedding_dim="width of a learnable embedding per node, concatenated with its "
                          "features and trained with row-sparse Adam (0: none)",
            init="how the dense layers of SAGE and the MLP start: flax (LeCun-normal "
                 "weights, zero bias) or torch (PyG's SAGEConv and torch's Linear: uniform "
                 "in +-1/sqrt(fan_in))",
            flat_outer="do not deduplicate the outermost hop (the scan configurations that "
                       "deduplicate; host engines and scan-tree lay out their own levels; "
                       "default: as zerognn train picks)")
# Training options the bench takes no flags for, so that giving one is an error rather
# than ignored: what each configuration sets itself, the task and what only link and
# graph tasks read (it measures node classification), evaluation and training outputs
# (it evaluates nothing and writes only its own records).
NOT_MEASURED = ("engine", "kernels", "dtype", "dedup", "task",
                "decoder", "negatives", "negative_mode", "link_metric", "link_relation",
                "link_split",
                "readout", "balance_window", "graph_aggregation", "relation_fanouts",
                "eval_mode", "eval_every", "eval_batch_size", "checkpoint_dir", "metrics_out",
                "best_metric", "patience", "checkpoint_keep", "tensorboard_dir")


class _SetByConfigs(argparse.Action):
    """A training flag that each of the bench's configurations sets: an error that says
    so, rather than "unrecognized arguments"."""

    def __call__(self, parser, namespace, values, option_string=None):
        from zerognn_jax._src.bench.workload import VARIANTS

        parser.error(f"{option_string} is what each configuration sets: choose the "
                     f"configurations with --configs ({', '.join(VARIANTS)})")


def add_bench_flags(parser: argparse.ArgumentParser) -> None:
    from zerognn_jax._src.bench.run import BenchOptions
    from zerognn_jax._src.bench.workload import VARIANTS
    from zerognn_jax._src.nn.models import MODELS
    from zerognn_jax._src.training.config import CHOICES

    d = BenchOptions()
    add_config_flags(parser, d.train, help=HELP, choices=dict(CHOICES, model=MODELS),
                     skip=NOT_MEASURED)
    add = parser.add_argument
    add("--configs", type=name_tuple, default=d.configs,
        help=f"comma-separated subset of {','.join(VARIANTS)} (default: all)")
    add("--host-steps", type=int, default=d.host_steps,
        help="host engines run only the first N steps of an epoch, scaled to the epoch")
    add("--check-steps", type=int, default=d.check_steps,
        help="first compare the scan and host-exact engines over N steps")
    add("--phases", action=argparse.BooleanOptionalAction, default=d.phases,
        help="time sampling-only and sampling+gather epochs, copy bandwidth, roofline")
    add("--batch-sizes", type=int_tuple, default=d.batch_sizes,
        help="step time vs batch size for scan-xla and host-bucketed, e.g. 256,1024,8192")
    add("--isolate", action=argparse.BooleanOptionalAction, default=d.isolate,
        help="one process per configuration (peak memory per configuration)")
    add("--deadline", type=float, default=d.deadline,
        help="seconds after which remaining measurements are skipped")
    add("--out", default=d.out, help="append the JSON lines to this file")
    add("--plot", default=d.plot,
        help="write a plot of the results here: .png, .pdf, .svg or .jpg (needs matplotlib)")
    add("--trace-dir", default=d.trace_dir, help="keep the profiler traces here")
    add("--envelope-cache", default=d.envelope_cache,
        help="JSON file to share the calibrated envelope between processes")
    add("--options-json", help=argparse.SUPPRESS)  # a child process's whole options
    for flag in ("--engine", "--kernels", "--dtype", "--dedup", "--no-dedup"):
        add(flag, action=_SetByConfigs, nargs="?", help=argparse.SUPPRESS,
            dest=argparse.SUPPRESS)


def options_from_args(args: argparse.Namespace):
    from zerognn_jax._src.bench.run import BenchOptions, check_dataset_kind
    from zerognn_jax._src.training.config import TrainConfig

    if args.options_json:
        return BenchOptions(**json.loads(pathlib.Path(args.options_json).read_text()))
    check_dataset_kind(args.dataset)
    defaults = BenchOptions().train
    train = config_from_args(TrainConfig, args,
                             **{name: getattr(defaults, name) for name in NOT_MEASURED})
    return config_from_args(BenchOptions, args, train=train)


def run_bench(args: argparse.Namespace) -> int:
    """Handler of `zerognn bench`; a signal stops it between measurements (exit 128 + N)."""
    from zerognn_jax._src.bench.run import run
    from zerognn_jax._src.training import interrupts

    with interrupts.deferred():
        records = run(options_from_args(args))
    # (the summary's "nothing measured" is no failure: every record says why it skipped)
    return 0 if all(r["status"] in ("ok", "skipped") for r in records
                    if r["kind"] != "summary") else 1


def add_bench_command(subparsers) -> argparse.ArgumentParser:
    from zerognn_jax._src.bench import run

    parser = subparsers.add_parser(
        "bench", help="time the scan engine against the host-mediated baseline",
        description=run.__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
        allow_abbrev=False)
    add_bench_flags(parser)
    parser.set_defaults(handler=run_bench)
    return parser
