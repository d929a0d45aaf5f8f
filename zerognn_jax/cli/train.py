"""`zerognn train`: every TrainConfig field as a flag."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from zerognn_jax.cli.flags import add_compile_cache_flag, add_config_flags, config_from_args

HELP = {
    "dataset": "tiny (built-in synthetic, generated from --seed), products-like, "
               "proteins-like, papers100m-like, rmat, cora, citeseer, pubmed, ogbn-arxiv, "
               "ogbn-products, ogbn-papers100M, ogbn-proteins, a .npz file or a dataset "
               "directory; link task also: ogbl-collab, ogbl-citation2; graph task: "
               "molhiv-like, molpcba-like, ogbg-molhiv, ogbg-molpcba, a graphs .npz; typed "
               "(node and link tasks): mag-like, igbh-like, shop-like, ogbn-mag, a typed .npz or "
               "directory",
    "root": "folder holding dataset files (OGB layout, Planetoid files, generator cache)",
    "scale": "size factor for synthetic presets (products-like at 1.0 is full size)",
    "model": "the built-in model (typed datasets: rsage, rgcn, rgat; graph task: gin, gine, "
             "gcn, each also -virtual); omitted: the task's, sage, rsage on a typed "
             "dataset, gine-virtual for a graph task whose graphs have edge features, else "
             "gin-virtual",
    "hidden": "width of every hidden layer",
    "layers": "number of message-passing layers (one fanout each; not given, as many as "
              "--fanouts gives)",
    "fanouts": "neighbours sampled per hop, seeds' hop first; -1 = all (--fanouts -1,-1) "
               "(on a typed dataset: per relation)",
    "relation_fanouts": "typed datasets: fanouts of named relations, e.g. "
                        "'cites=25,20;writes=10,0' (src__name__dst or a unique name; 0 skips)",
    "link_relation": "typed datasets, task link: the relation whose pairs to predict "
                     "(src__name__dst or a unique name; optional when it is the only one)",
    "link_split": "task link: a split file (LinkSplit.save, or TypedLinkSplit.save on a "
                  "typed dataset) to train and evaluate on instead of the random split "
                  "by --seed",
    "batch_size": "seeds per step and device: a step trains on batch-size x devices x "
                  "processes seeds (the summary's global_batch; at most the training "
                  "items a device gets)",
    "lr": "Adam learning rate",
    "weight_decay": "L2 penalty on every parameter, added to the gradient (the GCN "
                    "paper's code decays the first layer's weights alone); with "
                    "--decoupled-weight-decay, AdamW's decay",
    "decoupled_weight_decay": "AdamW: the weights shrink by lr x weight-decay a step, "
                              "apart from the gradient (as PyTorch's AdamW)",
    "lr_schedule": "constant, or cosine: the rate falls along a cosine to 0 at the last "
                   "epoch (a resumed run keeps --epochs)",
    "warmup_epochs": "epochs over whose steps the rate rises linearly to --lr first",
    "grad_clip": "clip the model parameters' gradient to this global norm before each "
                 "update (0: none; learnable embedding rows are not clipped)",
    "dropout": "dropout rate on hidden activations",
    "input_dropout": "dropout rate on the raw input features (the GCN paper uses 0.5)",
    "norm": "normalisation after each hidden layer",
    "heads": "attention heads of GAT's hidden layers (must divide --hidden, the heads' "
             "features together: the GAT paper's 8 heads of 8 are --hidden 64 --heads 8)",
    "activation": "after each hidden layer of sage, gcn, gat, gine: relu, or elu (the GAT "
                  "paper's)",
    "attention_dropout": "gat: dropout rate on the attention coefficients while training "
                         "(the GAT paper's 0.6)",
    "output_heads": "gat: attention heads of the output layer, averaged (the GAT paper's "
                    "8 on PubMed)",
    "edge_features": "give the model the sampled edges' features (gat, gine; rgat on a "
                     "typed graph; the dataset needs an edge-feature table)",
    "embedding_dim": "width of a learnable embedding per node (of every type on a typed "
                     "graph), concatenated with its features and trained with row-sparse "
                     "Adam (0: none)",
    "dtype": "float32, or bfloat16 (features and activations in half the bytes; sums and "
             "gradients accumulate in float32)",
    "epochs": "training epochs",
    "seed": "seed of sampling, dropout, initialisation and the seed order, and of a "
            "synthetic dataset's generation (another seed, another graph; a saved --dataset "
            "file keeps one) (0 .. 2**31 - 1)",
    "kernels": "auto (fastest measured per op), xla, pallas (NVIDIA GPUs), or per op: "
               "sample=pallas,relabel=xla,gather=xla,aggregate=xla,row_adam=pallas; a "
               "first part auto, xla or pallas sets the ops not named (auto,row_adam=xla)",
    "sampler": "uniform; weighted (in proportion to the graph's edge weights); or labor "
               "(LABOR-0: one random number per vertex and hop, shared by all rows, so rows "
               "pick the same neighbours; a fanout is then the expected count)",
    "replace": "sample neighbours with replacement",
    "dedup": "deduplicate sampled nodes (--no-dedup: tree sampling, every level in slot "
             "order; default: tree for the built-in SAGE models of node tasks on the scan "
             "engine, sampling uniform or weighted, where the tree's levels hold at most "
             "1/4 of the graph's nodes; dedup elsewhere, and with --embedding-dim or "
             "the features in host memory; the summary's layout says which and why)",
    "flat_outer": "do not deduplicate the outermost hop: the first layer reads its "
                  "neighbours by position (scan engine; same outputs, more feature rows; "
                  "default: on for the built-in SAGE models on the scan engine, off with "
                  "--embedding-dim, the features in host memory or a -1 outer fanout)",
    "sample_ahead": "steps sampled together by one vmapped call (scan engine; unset: 16 "
                    "with the features in host memory, whose rows they then read "
                    "together, 1 on a CPU, else 8)",
    "read_ahead_gib": "the most GiB of host-table rows read at once for the steps sampled "
                      "together (unset: an eighth of the device's memory as a power of two "
                      "between 1 and 4 GiB)",
    "gemm_backend": "whose kernels multiply training's matrices on an NVIDIA GPU: cublas (as "
                    "fast or faster for a step's shapes on an H100), or xla (XLA's own "
                    "choice, mostly its Triton kernels)",
    "chunk_steps": "steps per compiled program; 0 = the whole epoch",
    "engine": "scan, or the host-mediated baseline: host-exact, host-bucketed",
    "envelope": "how buffer capacities are chosen: calibrate (tight, measured on device) "
                "or conservative (the safe bound)",
    "margin": "calibrated capacity = margin x the largest count seen (>= 1); unset: "
              "1.1, and 1.0 where a graph task calibrates (it counts every batch)",
    "multiple": "capacities are rounded up to a multiple of this (>= 1)",
    "eval_mode": "full (exact layer-wise), sampled, or none",
    "eval_every": "evaluate every N epochs (0: only after the last)",
    "eval_batch_size": "nodes per step of sampled evaluation (graphs per step of a graph "
                       "task's evaluation)",
    "normalize_features": "divide each feature row by its sum; features must be >= 0 (default: "
                          "only Planetoid, node tasks)",
    "checkpoint_dir": "save every epoch here and resume from the latest checkpoint",
    "metrics_out": "append one JSON object per epoch, then a summary, to this file (on "
                   "resuming, the records after the file's last summary are replaced by the "
                   "epochs the checkpoint holds)",
    "progress": "show a progress bar on stderr",
    "devices": "devices per process to train on, data parallel (0 = all local devices)",
    "shard_features": "split the feature table by rows across the devices (for tables "
                      "that do not fit one device; each step fetches rows from their owners)",
    "feature_placement": "where the feature table lives: device, host (page-locked host "
                         "memory read over PCIe by the step, for tables larger than the "
                         "GPU; needs nvcc on a GPU, a C++ compiler on a CPU) or auto (host "
                         "only when the device would be left too little room)",
    "feature_cache_gib": "with features on the host: GiB of device memory holding copies "
                         "of the rows of highest degree, read from there instead of over "
                         "PCIe (default: half of what graph and model leave; 0: none)",
    "host_row_order": "with features on the host: lay their rows out by degree (a copy in "
                      "host memory whose reads over PCIe are faster), as stored (no copy), "
                      "or auto (by degree where a copy is made anyway or fits half the "
                      "host's available memory)",
    "best_metric": "keep the checkpoint of the epoch with the best value of this evaluated "
                   "metric (val_acc, val_f1, val_mse, val_rocauc, ...; lower is better for "
                   "*_mse, *_mae and *_loss) in <checkpoint-dir>/best; needs --checkpoint-dir",
    "checkpoint_keep": "how many of the latest epochs' checkpoints --checkpoint-dir keeps "
                       "(older ones are removed; a --best-metric's best is kept apart)",
    "patience": "stop once --best-metric (else val_loss, or the task's first val score "
                "where it reports no loss: val_auc for links) has not improved for this "
                "many evaluated epochs (0: train every epoch)",
    "tensorboard_dir": "write each epoch's scalars here as TensorBoard events (needs the "
                       "tensorboard extra: pip install 'zerognn-jax[tensorboard]')",
    "task": "node (a target per node: classes, multi-label or regression) or link (link "
            "prediction: a random 85/5/10 edge split of the dataset, or OGB's split for "
            "ogbl-collab and ogbl-citation2 under --root; --batch-size counts positive "
            "edges, --hidden is the embedding width) or graph "
            "(one prediction per graph: molhiv-like, molpcba-like, ogbg-molhiv, "
            "ogbg-molpcba or a saved graph collection; --batch-size counts graphs; "
            "--model gin, gine, gcn, or with -virtual; --fanouts does not apply)",
    "readout": "graph task: how a graph's nodes are pooled: sum, mean, max or attention",
    "init": "how the dense layers of SAGE, the MLP and the link task's MLP decoder start: "
            "flax (LeCun-normal weights, zero "
            "bias) or torch (PyG's SAGEConv and torch's Linear: uniform in "
            "+-1/sqrt(fan_in)); docs/link_prediction.md compares the two",
    "graph_aggregation": "graph task: how layers sum messages into nodes: ell (gathers "
                         "over each node's listed edges, no atomics) or segment "
                         "(scatter-adds, the reference); auto: ell on a GPU for batches "
                         "of 128 graphs or more, else segment; the same sums",
    "balance_window": "graph task: deal each window of this many batches' graphs by size "
                      "(fewer padded slots; 0 = plain shuffled batches; with D devices "
                      "a step takes D of the window's batches)",
    "decoder": "link task: score of a pair from its two embeddings: scaled-dot (their "
               "dot product over the square root of their width), dot (the product) or "
               "mlp (an MLP over their elementwise product)",
    "negatives": "link task: negatives drawn per positive edge each step",
    "negative_mode": "link task: destination (corrupt the positive's destination, never "
                     "to itself), pairs (uniform random pairs) or shared (every positive "
                     "of a step meets the same --negatives destinations: many negatives "
                     "for little more work)",
    "link_metric": "link task: auc (AUC and AP), mrr (MRR and Hits@1/3/10 against 100 "
                   "fixed negatives per positive, OGB's own for citation2) or hits@K "
                   "(against shared negatives, as ogbl-collab's hits@50)",
}


def _int_or_from(variable: str):
    """argparse type: an integer; a value that is none names `variable` where it came
    from there (argparse reads a flag's default through its type too, and named the
    flag alone)."""
    def parse(text: str) -> int:
        try:
            return int(text)
        except ValueError:
            where = (f" (the value of ${variable})" if os.environ.get(variable) == text
                     else "")
            raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}{where}"
                                             ) from None
    return parse


def add_distributed_flags(parser: argparse.ArgumentParser) -> None:
    env = os.environ.get
    parser.add_argument(
        "--coordinator", default=env("JAX_COORDINATOR_ADDRESS"),
        help="host:port of process 0 for a run over several processes (hosts), or 'auto' "
             "to detect the cluster (SLURM, Open MPI); default: $JAX_COORDINATOR_ADDRESS, "
             "else a single-process run")
    parser.add_argument("--num-processes", type=_int_or_from("JAX_NUM_PROCESSES"),
                        default=env("JAX_NUM_PROCESSES"),
                        help="processes in the run (default: $JAX_NUM_PROCESSES)")
    parser.add_argument("--process-id", type=_int_or_from("JAX_PROCESS_ID"),
                        default=env("JAX_PROCESS_ID"),
                        help="this process's rank, 0 .. num-processes - 1 "
                             "(default: $JAX_PROCESS_ID)")


def run_train(args: argparse.Namespace) -> int:
    """Handler of `zerognn train`: prints the summary as one line of strict JSON.

    SIGINT, SIGTERM and SIGHUP stop the run between phases (`interrupts.deferred`);
    `main` turns the resulting `Interrupted` into exit code 130, 143 or 129.
    """
    import jax

    from zerognn_jax._src.data.writes import print_line
    from zerognn_jax._src.training import interrupts
    from zerognn_jax._src.training.config import TrainConfig
    from zerognn_jax._src.training.parallel import JOIN_TIMEOUT_S, initialize_distributed
    from zerognn_jax._src.training.records import dumps
    from zerognn_jax._src.training.trainer import train

    with interrupts.deferred():
        # A bad option ends this process before it joins the others: one that has
        # joined waits for them as it exits, and they for it (both hung). Joining must
        # precede JAX's backend, which a config naming Pallas kernels asks for (to
        # refuse them off a GPU): such a config is built once the process has joined.
        early = None if "pallas" in args.kernels else config_from_args(TrainConfig, args)
        if (args.coordinator not in (None, "auto") and args.progress  # (a silent wait)
                and None not in (args.process_id, args.num_processes)):
            print(f"zerognn: process {args.process_id} of {args.num_processes} joining the "
                  f"run at {args.coordinator}; waiting up to {JOIN_TIMEOUT_S} s for every "
                  f"process",
                  file=sys.stderr, flush=True)
        initialize_distributed(args.coordinator, args.num_processes, args.process_id)
        cfg = early or config_from_args(TrainConfig, args)
        variables = _initial_variables(args, cfg)
        try:
            result = train(cfg, variables=variables)
        except ValueError as err:  # (the library's refusals of them begin so)
            if variables is None or not str(err).startswith("variables"):
                raise
            raise ValueError(f"--init-from {args.init_from}: its {err}") from None
    if jax.process_index() == 0:
        print_line(dumps(result.summary), "the run's summary (the run itself finished)")
    return 0


def _initial_variables(args: argparse.Namespace, cfg) -> dict | None:
    """The model's variables (parameters and batch statistics) of --init-from's latest
    checkpoint, or its best with --init-best, for the run to start from; None without
    the flag, or where the run resumes from its own --checkpoint-dir instead. A node
    embedding there (rows of that run's graph) is left out: the run's starts afresh."""
    from zerognn_jax._src.training.inference import saved_variables

    if args.init_from is None:
        if args.init_best:
            raise ValueError("--init-best picks the checkpoint of --init-from: give the "
                             "folder with --init-from")
        return None
    source = Path(args.init_from)
    if cfg.checkpoint_dir is not None:
        if source.resolve() == Path(cfg.checkpoint_dir).resolve():
            raise ValueError(f"--init-from {args.init_from} is this run's --checkpoint-dir, "
                             f"which it resumes from anyway: leave --init-from out")
        if _resumes(cfg.checkpoint_dir):  # (the command run again: it goes on from there)
            return None
    try:
        variables = saved_variables(str(source), best=args.init_best)
    except (FileNotFoundError, ValueError) as err:
        raise type(err)(f"--init-from {args.init_from}: {err}") from None
    if variables.pop("embedding", None) is not None and args.progress:
        print(f"zerognn: --init-from {args.init_from}: its run's node embedding (rows of "
              f"its graph's nodes) is not carried over; this run's starts afresh",
              file=sys.stderr)
    return variables


def _resumes(checkpoint_dir: str) -> bool:
    """`checkpoint_dir` holds a checkpoint a run would resume from."""
    from zerognn_jax._src.training.checkpoint import Checkpointer

    if not Path(checkpoint_dir).is_dir():
        return False
    ckpt = Checkpointer(checkpoint_dir, create=False)
    try:
        return ckpt.latest_epoch() is not None
    finally:
        ckpt.close()


def add_train_command(subparsers) -> argparse.ArgumentParser:
    from zerognn_jax._src.training.config import CHOICES, TrainConfig

    parser = subparsers.add_parser("train", help="train a GNN (default: the built-in tiny graph)",
                                   allow_abbrev=False)
    add_config_flags(parser, TrainConfig(), help=HELP, choices=CHOICES)
    parser.add_argument("--init-from", type=os.path.expanduser, default=None,
                        help="start from the model variables of another run's checkpoint "
                             "folder (its latest epoch), with a fresh optimizer: a "
                             "fine-tune of a model of the same form, on this run's data "
                             "and options (a node embedding, rows of that run's graph, "
                             "starts afresh)")
    parser.add_argument("--init-best", action="store_true",
                        help="with --init-from: its best checkpoint (--best-metric)")
    add_distributed_flags(parser)
    add_compile_cache_flag(parser)
    parser.set_defaults(handler=run_train)
    return parser
