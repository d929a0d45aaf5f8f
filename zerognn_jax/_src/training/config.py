"""`TrainConfig`: every option of a training run, validated once, when it is built."""

from __future__ import annotations

import dataclasses
import difflib
import functools
import math
import numbers
import os

import jax

from zerognn_jax._src.data.graph_datasets import GRAPH_NAMES, graph_task_needed
from zerognn_jax._src.data.hetero import relation_name
from zerognn_jax._src.nn.graph_models import GRAPH_MODELS, READOUTS
from zerognn_jax._src.nn.hetero import HETERO_MODELS
from zerognn_jax._src.nn.link_heads import DECODERS
from zerognn_jax._src.nn.models import ACTIVATIONS, INITS, MODELS, NORMS, check_init
from zerognn_jax._src.ops.registry import OPS, Kernels
from zerognn_jax._src.sampling.envelope import EnvelopePolicy
from zerognn_jax._src.sampling.minibatch import MAX_HOPS, SAMPLERS
from zerognn_jax._src.sampling.negatives import NEGATIVE_MODES, check_frontier
from zerognn_jax._src.training.config_types import ConfigTypeError, check_types
from zerognn_jax._src.training.engines import ENGINES
from zerognn_jax._src.training.schedule import SCHEDULES
from zerognn_jax._src.training.tasks.base import BatchedTask
from zerognn_jax._src.training.tasks.graph import AGGREGATIONS
from zerognn_jax._src.training.tasks.link import LINK_METRICS
from zerognn_jax._src.training.tasks.registry import TASKS
from zerognn_jax._src.training.xla_options import GEMM_BACKENDS

DTYPES = ("float32", "bfloat16")
FEATURE_PLACEMENTS = ("auto", "device", "host")
HOST_ROW_ORDERS = ("auto", "degree", "stored")
# The closed sets among the options (the CLI offers them as choices); tasks are the
# registry's (its names, read when a config is built).
CHOICES = {
    "model": tuple(dict.fromkeys((*MODELS, *GRAPH_MODELS, *HETERO_MODELS))),
    "readout": READOUTS, "init": INITS,
    "norm": NORMS, "dtype": DTYPES, "engine": ENGINES,
    "envelope": ("calibrate", "conservative"), "eval_mode": ("full", "sampled", "none"),
    "sampler": SAMPLERS, "task": TASKS, "decoder": DECODERS,
    "negative_mode": NEGATIVE_MODES, "link_metric": LINK_METRICS,
    "graph_aggregation": AGGREGATIONS, "feature_placement": FEATURE_PLACEMENTS,
    "host_row_order": HOST_ROW_ORDERS, "gemm_backend": GEMM_BACKENDS,
    "lr_schedule": SCHEDULES, "activation": tuple(ACTIVATIONS),
}
# The built-in models whose hidden layers take `activation` (typed and graph models, and
# the MLP, keep ReLU).
HIDDEN_ACTIVATED = tuple(m for m in MODELS if m != "mlp")


# The parts of a run's options, in the order TrainConfig declares them; the CLI keeps
# one flat flag per field, and a checkpoint's identity reads the fields by name.
GROUPS = {
    "task": ("task", "decoder", "negatives", "negative_mode", "link_metric",
             "link_relation", "link_split"),
    "data": ("dataset", "root", "scale", "normalize_features"),
    "model": ("model", "hidden", "layers", "dropout", "input_dropout", "norm", "heads",
              "dtype", "edge_features", "embedding_dim", "readout", "init", "activation",
              "attention_dropout", "output_heads"),
    "sampler": ("fanouts", "relation_fanouts", "batch_size", "sampler", "replace", "dedup",
                "flat_outer",
                "envelope", "margin", "multiple", "balance_window"),
    "optimizer": ("lr", "weight_decay", "decoupled_weight_decay", "lr_schedule",
                  "warmup_epochs", "grad_clip"),
    "engine": ("engine", "kernels", "graph_aggregation", "chunk_steps", "sample_ahead",
               "read_ahead_gib", "devices", "shard_features", "feature_placement",
               "feature_cache_gib", "host_row_order", "gemm_backend"),
    "run": ("epochs", "seed", "eval_mode", "eval_every", "eval_batch_size", "checkpoint_dir",
            "metrics_out", "progress", "best_metric", "patience", "checkpoint_keep",
            "tensorboard_dir"),
}

# The options that name files or folders (`dataset` when it is one).
PATHS = ("dataset", "root", "link_split", "checkpoint_dir", "metrics_out", "tensorboard_dir")


@dataclasses.dataclass(frozen=True, kw_only=True)
class TrainConfig:
    """Everything `train` needs; the CLI flags map one to one onto these fields, which
    come in the parts of `GROUPS`. Values are checked by type (config_types.py), then
    by range, when the config is built.

    Task. `task` is a name in the task registry (tasks/registry.py): "node"
    (classification, regression) or "link" (link prediction, docs/link_prediction.md:
    `batch_size` then counts positive edges per step; the model is the encoder, its
    output width `hidden`; `decoder` ("scaled-dot": the embeddings' product over
    sqrt(hidden), "dot" or "mlp"), `negatives` per positive, `negative_mode` and
    `link_metric` apply to it only; on a typed dataset `link_relation` names the
    relation whose pairs it predicts ("src__name__dst", a (src, name, dst) triple, or a
    name one relation has), docs/hetero.md; `link_split` names a split file to train
    and evaluate on, written by `LinkSplit.save` (or `TypedLinkSplit.save` for a typed
    dataset), instead of the random split by `seed`) or "graph" (one prediction per
    graph of a graph collection, docs/graph_tasks.md: `batch_size` counts graphs per
    step; `model` is gin, gine, gcn or one of them with "-virtual"; `readout` pools the
    nodes; fanouts do not apply; `balance_window` > 1 deals each window of that many
    batches by size, a step taking one batch per device).

    Data. `dataset` is a name or path (`load_dataset`); `normalize_features=None`
    row-normalises Planetoid features where the task asks for it (node tasks) and
    leaves others; True divides each feature row of any dataset by its sum (refused for
    negative values, whose rows can sum to about zero), False leaves them.

    Model. `model` names a built-in model; None (the default) takes the task's: sage
    for node and link tasks, rsage on a typed dataset, and for graph tasks gine-virtual
    on graphs with edge features, gin-virtual on others (the run's config records the
    model taken). On node and link tasks gcn and gat add each node's own term themselves,
    as PyG's GCNConv and GATConv add self-loops, so they sample the graph without its
    self-loops (each node's term counted once). `hidden` is every hidden layer's width,
    `layers` the number of message-passing layers (one fanout each), `dropout` the rate
    after each hidden layer and `input_dropout` the rate on the input features (the GCN
    paper's 0.5); `norm` ("none", "layer", "batch") normalises after each hidden layer;
    `heads` are GAT's attention heads (they must divide `hidden`: `hidden` is every head's
    features together, the GAT paper's 8 heads of 8 are hidden 64, heads 8).
    `activation` follows each hidden layer of sage, gcn, gat and gine: "relu" or "elu"
    (the GAT paper's); `attention_dropout` drops gat's attention coefficients while
    training (the GAT paper's 0.6); `output_heads` are the heads of gat's output layer,
    each computing every output and averaged (1 by default; the GAT paper's 8 on PubMed).
    `dtype` is the model's computation dtype and
    the feature table's on the device: "float32", or "bfloat16" (half the bytes; sums
    and gradients accumulate in float32). `edge_features` gives the model the sampled
    edges' rows of the graph's edge-feature table (gat reads them in its attention,
    gine needs them; docs/api.md, "Edge features"). `embedding_dim` > 0 adds a learnable
    embedding of that width per node, concatenated with the node's features, trained
    with row-sparse (lazy) Adam at `lr` inside the compiled epoch (row_adam.py); on a
    typed graph, to every type's nodes (whose featureless types otherwise have
    `hidden`-wide rows; docs/hetero.md).
    `init` is how the dense layers of the built-in SAGE models and the MLP (and the
    link task's MLP decoder) start: "flax" (LeCun-normal weights, zero bias) or "torch"
    (as PyG's SAGEConv and torch.nn.Linear: weights and bias uniform in
    +-1/sqrt(fan_in)). Which learns better depends on the data: products-like's link
    prediction sat at a loss of log 2 for longer from "flax", Cora's scored higher from
    it (docs/link_prediction.md, "Learning after 800 steps").

    Sampler. `fanouts` lists the seeds' hop first; -1 means all neighbours. On a typed
    dataset (docs/hetero.md) every relation takes `fanouts`, except those named in
    `relation_fanouts` ({"src__name__dst", a (src, name, dst) triple or a relation's
    unique name: per-hop fanouts; 0 skips the relation at that hop; triples are kept
    as their "src__name__dst" names). `replace` samples with replacement. `sampler` is
    "uniform", "weighted" (by the graph's edge weights) or "labor" (LABOR-0;
    docs/samplers.md). `dedup` deduplicates each sampled level; False is tree mode
    (every level in slot order, exact sizes); None (the default) lets
    `layout.choose_layout` pick (tree mode for the built-in SAGE models on the scan
    engine when the tree's levels are small against the graph; every level deduplicated
    with a learnable embedding, `embedding_dim` > 0). `flat_outer` leaves the
    outermost hop undeduplicated, laid out in slot order (`SamplerConfig.flat_outer`;
    scan engine only); None (the default): `choose_layout` decides. The summary records
    the layout and why. `envelope` is "calibrate" (tight, measured) or "conservative"
    (the safe bound); `margin` and `multiple` size it (`envelope_policy`). `margin`
    None (the default) is 1.1, except where a graph task calibrates: it counts every
    batch of the run's epochs, so their largest is exact and it takes 1.0 (an
    overflow, e.g. on resuming with more epochs, grows the envelope with 1.1). The default
    multiple, 1024, kept level sizes in a form XLA's split-K GEMMs took without first
    copying the operands into padded buffers (13-18 % of a bfloat16 products-like epoch
    on an H100, docs/benchmarks.md; measured with XLA's Triton products, before
    `gemm_backend` "cublas" became the default).

    Optimizer. Adam with `lr`, plus L2 `weight_decay` added to the gradient, or with
    `decoupled_weight_decay` AdamW's (the weights shrink by lr x weight_decay a step).
    `lr_schedule` "constant" keeps `lr`; "cosine" lowers it along a cosine to 0 at the
    last of `epochs` (resuming then needs the same epochs). `warmup_epochs` first
    raise the rate linearly over their steps (the first step at lr / warmup steps).
    Learnable embedding rows follow the same rate. `grad_clip` > 0 clips the gradient
    to that global norm (over the model's parameters; learnable embedding rows, stepped
    apart by lazy Adam, are not clipped) before the update.

    Engine. `engine` is "scan" (a chunk of steps per program) or the host-mediated
    baseline, "host-exact" or "host-bucketed" (see host.py). `kernels` is a spec string
    that `Kernels.parse` reads ("auto", "xla", "pallas", or per op);
    `graph_aggregation` is how graph-task layers sum messages ("ell": gathers over
    listed edges; "segment": scatter-adds, the reference; "auto": ell on a GPU for
    batches of 128 graphs or more).
    `chunk_steps=0` compiles a whole epoch into one program. `sample_ahead` steps are
    sampled by one vmapped call (`ScanEngine.sample_ahead`; a host feature table's rows
    are then read for several of them at once; None: 16 with the features in host
    memory, 1 on a CPU, else 8), in calls of at most `read_ahead_gib` GiB of rows (None:
    an eighth of the device's memory as a power of two between 1 and 4 GiB;
    scan.read_ahead_limit).
    `devices` is the number of devices per process to train on (0 = all
    local ones); `batch_size` is per device, so a step trains on batch_size x devices x
    processes seeds; a run lowers a batch larger than the training items a device gets
    to that share (one step an epoch either way: the summary's `batch_size` and
    `global_batch` are what was trained; its `config` and checkpoints keep the size
    asked). `shard_features` splits the feature table by rows across those
    devices. `feature_placement` says where the feature table lives: "device", or "host"
    (page-locked host memory, whose rows the step reads over PCIe: ops/host_rows.py,
    docs/host_features.md), or "auto": the host when graph, features and model would
    leave the device less than a quarter of its memory for the step, else the device
    (the choice and its reason are printed, and recorded in the summary).
    `feature_cache_gib` of device memory hold copies of a host table's rows of highest
    degree (None: half of what graph and model leave of that three quarters; 0: none;
    with the table on the device it is ignored, with a warning). `host_row_order` lays a
    host table's rows out by "degree" (a copy in host memory, hottest rows first: a
    step's reads fall into less of it and run faster over PCIe) or as "stored" (no copy
    of a C-contiguous table in `dtype`); "auto" copies where a copy is made anyway
    (another dtype, a strided array) or fits half of the host's available memory (the
    choice and its reason are printed).
    `gemm_backend` says whose kernels multiply the training programs' matrices on an
    NVIDIA GPU: "cublas" (the default, as fast or faster for a step's shapes on an H100)
    or "xla" (XLA's own choice, mostly Triton kernels of its own; xla_options.py).

    Run. `seed` seeds sampling, dropout, initialisation and the seed order, and also the
    generation of a synthetic dataset named by `dataset` (products-like, mag-like, ...:
    another seed is another graph; pass the dataset or a saved file to keep one graph
    across seeds). `eval_mode` is "full" (exact layer-wise), "sampled" (the training
    fanouts) or "none"; it runs every `eval_every` epochs (0: after the last only), on
    `eval_batch_size` nodes (graphs, on a graph task) a step where it samples.
    `checkpoint_dir` saves every epoch, keeps the latest `checkpoint_keep`, and resumes
    from the latest; `metrics_out` appends
    a JSON line per epoch and then the summary; `progress` shows a bar and the run's
    announcements on stderr. `best_metric` (e.g. "val_acc", "val_f1", "val_mse"; lower is better for
    `*_mse` and `*_loss`) keeps the checkpoint of the best evaluated epoch in
    `<checkpoint_dir>/best` (`restore(..., best=True)`). `patience` (0: off) stops the run
    once `best_metric` (else `val_loss`, or a task without a loss among its metrics: its
    first val score, `val_auc` say) has not improved for that many evaluated epochs (an
    `EarlyStopping` joins the run's callbacks). `tensorboard_dir` writes every
    epoch's scalars there as TensorBoard events (needs the `tensorboard` extra).
    """

    # task
    task: str = "node"
    decoder: str = "scaled-dot"
    negatives: int = 1
    negative_mode: str = "destination"
    link_metric: str = "auc"
    link_relation: str | None = None
    link_split: str | None = None
    # data
    dataset: str = "tiny"
    root: str | None = None
    scale: float = 1.0
    normalize_features: bool | None = None
    # model
    model: str | None = None
    hidden: int = 256
    layers: int = 3
    dropout: float = 0.5
    input_dropout: float = 0.0
    norm: str = "none"
    heads: int = 4
    dtype: str = "float32"
    edge_features: bool = False
    embedding_dim: int = 0
    readout: str = "mean"
    init: str = "flax"
    activation: str = "relu"
    attention_dropout: float = 0.0
    output_heads: int = 1
    # sampler and envelope
    fanouts: tuple[int, ...] = (15, 10, 5)
    relation_fanouts: dict[str, tuple[int, ...]] | None = None
    batch_size: int = 1024
    sampler: str = "uniform"
    replace: bool = False
    dedup: bool | None = None
    flat_outer: bool | None = None
    envelope: str = "calibrate"
    margin: float | None = None
    multiple: int = 1024
    balance_window: int = 0
    # optimizer
    lr: float = 3e-3
    weight_decay: float = 0.0
    decoupled_weight_decay: bool = False
    lr_schedule: str = "constant"
    warmup_epochs: int = 0
    grad_clip: float = 0.0
    # engine
    engine: str = "scan"
    kernels: str = "auto"
    graph_aggregation: str = "auto"
    chunk_steps: int = 0
    sample_ahead: int | None = None
    read_ahead_gib: float | None = None
    devices: int = 1
    shard_features: bool = False
    feature_placement: str = "auto"
    feature_cache_gib: float | None = None
    host_row_order: str = "auto"
    gemm_backend: str = "cublas"
    # run
    epochs: int = 10
    seed: int = 0
    eval_mode: str = "full"
    eval_every: int = 1
    eval_batch_size: int = 4096
    checkpoint_dir: str | None = None
    metrics_out: str | None = None
    progress: bool = True
    best_metric: str | None = None
    patience: int = 0
    checkpoint_keep: int = 2
    tensorboard_dir: str | None = None

    def group(self, name: str) -> dict:
        """The options of one part of `GROUPS`, e.g. `cfg.group("optimizer")`."""
        return {field: getattr(self, field) for field in GROUPS[name]}

    def __post_init__(self):
        _relations_named(self)
        _fanouts_of_the_right_form(self)
        check_types(self)
        for name in PATHS:  # "~/runs" is the home folder's, as a shell would read it
            value = getattr(self, name)
            if isinstance(value, str) and value.startswith("~"):
                object.__setattr__(self, name, os.path.expanduser(value))
        for name, options in CHOICES.items():
            value = getattr(self, name)
            if value not in options and not (name == "model" and value is None):
                own = (" (a task of your own joins them by zg.register_task, in every "
                       "process that trains or restores it)" if name == "task" else "")
                raise ValueError(f"{name} must be one of {', '.join(options)}, got "
                                 f"{value!r}{own}")
        check_init(self.init, self.model)  # the built-in models' own rule
        for name in ("link_split", "checkpoint_dir", "metrics_out", "tensorboard_dir"):
            path = getattr(self, name)
            if path is not None and not str(path).strip():
                raise ValueError(f"{name} must be a path (left unset: none), got {path!r}")
        try:  # bytes that are no UTF-8 reach Python as surrogates, orbax's C++ refuses them
            str(self.checkpoint_dir or "").encode("utf-8")
        except UnicodeEncodeError:
            raise ValueError(f"checkpoint_dir {self.checkpoint_dir!r} is not UTF-8 text, "
                             f"which checkpoints (orbax) need: name the folder in UTF-8"
                             ) from None
        if not str(self.dataset).strip():
            raise ValueError(f"dataset must name a dataset or a folder, got {self.dataset!r}")
        if self.root is not None and not str(self.root).strip():
            raise ValueError(f"root must be a folder (left unset: the default), got "
                             f"{self.root!r}")
        finite = lambda x: math.isfinite(x)
        batched = issubclass(TASKS[self.task], BatchedTask)  # graph batches: no fanouts
        for hop, fanout in enumerate(self.fanouts):
            if fanout <= 0 and fanout != -1:
                raise ValueError(f"fanouts must be positive or -1 (all) at every hop, got "
                                 f"{fanout} at hop {hop} (on a typed graph, set "
                                 f"relation_fanouts with a 0 at a hop to skip one relation "
                                 f"there)")
        for rel, per_hop in (self.relation_fanouts or {}).items():
            if any(f < -1 for f in per_hop):
                raise ValueError(f"relation_fanouts[{rel!r}] must be >= 0 or -1 (all) at every "
                                 f"hop, got {per_hop}")
        if not batched and self.dataset.lower() in GRAPH_NAMES:  # before its fanouts
            raise ValueError(graph_task_needed(self.dataset))
        layers = f"{self.layers} layer{'s' if self.layers != 1 else ''}"
        checks = [
            (self.layers >= 1, f"layers must be >= 1, got {self.layers}"),
            (batched or self.layers <= MAX_HOPS,  # (graph tasks sample no hops)
             f"layers must be at most {MAX_HOPS} (one sampled hop each), got {self.layers}"),
            (batched or bool(self.fanouts),
             f"need one fanout per layer: {layers} but no fanouts; give "
             f"{self.layers} fanout{'s' if self.layers != 1 else ''} (-1: every "
             f"neighbour)"),
            (batched or not self.fanouts or len(self.fanouts) == self.layers,
             f"need one fanout per layer: {layers} but fanouts {self.fanouts}; "
             f"set layers to {len(self.fanouts)} (--layers {len(self.fanouts)}) or give "
             f"{self.layers} fanout{'s' if self.layers != 1 else ''}"),
            (self.batch_size >= 1, f"batch_size must be >= 1, got {self.batch_size}"),
            (self.epochs >= 0, f"epochs must be >= 0, got {self.epochs}"),
            (0 <= self.seed < 2**31, f"seed must be in [0, 2**31), got {self.seed}"),
            (self.lr > 0 and finite(self.lr), f"lr must be positive and finite, got {self.lr}"),
            (self.weight_decay >= 0 and finite(self.weight_decay),
             f"weight_decay must be >= 0 and finite, got {self.weight_decay}"),
            (not self.decoupled_weight_decay or self.weight_decay > 0,
             "decoupled_weight_decay applies weight_decay, which is 0: set weight_decay "
             "(--weight-decay)"),
            (self.warmup_epochs >= 0,
             f"warmup_epochs must be >= 0 (0: none), got {self.warmup_epochs}"),
            (not self.epochs or self.warmup_epochs <= self.epochs,
             f"warmup_epochs {self.warmup_epochs} is more than the run's {self.epochs} "
             f"epochs: the rate would never reach lr; warm up for {self.epochs} at most"),
            (self.lr_schedule != "cosine" or not self.epochs
             or self.warmup_epochs < self.epochs,
             f"lr_schedule 'cosine' decays after warmup_epochs {self.warmup_epochs}, and "
             f"the run has {self.epochs} epochs: warm up for fewer epochs than it trains"),
            (0.0 <= self.attention_dropout < 1.0,
             f"attention_dropout must be in [0, 1), got {self.attention_dropout}"),
            (self.output_heads >= 1,
             f"output_heads must be at least 1, got {self.output_heads}"),
            (self.activation == "relu" or (not batched and self.model in HIDDEN_ACTIVATED),
             f"activation {self.activation!r} applies to the models "
             f"{', '.join(HIDDEN_ACTIVATED)}: " + (
                 "name one (model None takes the task's and the dataset's default)"
                 if self.model is None else f"model {self.model!r} keeps ReLU")),
            (self.grad_clip >= 0 and finite(self.grad_clip),
             f"grad_clip must be >= 0 and finite (0: no clipping), got {self.grad_clip}"),
            (0.0 <= self.dropout < 1.0, f"dropout must be in [0, 1), got {self.dropout}"),
            (0.0 <= self.input_dropout < 1.0,
             f"input_dropout must be in [0, 1), got {self.input_dropout}"),
            (self.hidden >= 1, f"hidden must be >= 1, got {self.hidden}"),
            (self.heads >= 1, f"heads must be >= 1, got {self.heads}"),
            (self.embedding_dim >= 0,
             f"embedding_dim must be >= 0 (0: no embeddings), got {self.embedding_dim}"),
            (batched or self.model != "gine" or self.edge_features,
             "model 'gine' reads edge features: set edge_features (--edge-features)"),
            (not batched or not self.edge_features,
             f"the {self.task} task reads its graphs' edge features whenever the collection "
             f"has them (gine and the other models that take them), unasked: drop "
             f"edge_features (--edge-features)"),
            (not batched or not self.embedding_dim,
             f"the {self.task} task takes no node embedding (a learned row per node of one "
             f"graph; a collection's nodes are each graph's own): drop embedding_dim "
             f"(--embedding-dim)"),
            (self.model != "gat" or self.layers == 1 or self.heads < 1
             or self.hidden % self.heads == 0,
             f"GAT splits hidden over its heads: hidden {self.hidden} is not a multiple of "
             f"heads {self.heads}"),
            (self.scale > 0 and finite(self.scale),
             f"scale must be positive and finite, got {self.scale}"),
            (self.chunk_steps >= 0, f"chunk_steps must be >= 0, got {self.chunk_steps}"),
            (self.sampler != "labor" or not self.replace,
             "the labor sampler draws without replacement: drop replace (--replace)"),
            (self.eval_every >= 0, f"eval_every must be >= 0, got {self.eval_every}"),
            (self.eval_batch_size >= 1,
             f"eval_batch_size must be >= 1, got {self.eval_batch_size}"),
            (self.devices >= 0, f"devices must be >= 0 (0 = all local devices), "
                                f"got {self.devices}"),
            (self.negatives >= 1, f"negatives must be >= 1, got {self.negatives}"),
            (self.best_metric is None or bool(self.best_metric.strip()),
             f"best_metric must name a metric (val_acc, val_loss, ...), got "
             f"{self.best_metric!r}"),
            (self.best_metric is None or bool(self.checkpoint_dir),
             f"best_metric {self.best_metric!r} keeps a checkpoint: set checkpoint_dir"),
            (self.best_metric is None or self.eval_mode != "none",
             f"best_metric {self.best_metric!r} needs evaluation: eval_mode is 'none'"),
            (self.checkpoint_keep >= 1,
             f"checkpoint_keep must be >= 1 (the latest epochs a checkpoint_dir keeps), "
             f"got {self.checkpoint_keep}"),
            (self.patience >= 0, f"patience must be >= 0 (0: no early stop), got "
                                 f"{self.patience}"),
            (not self.patience or self.eval_mode != "none",
             f"patience {self.patience} counts evaluated epochs: eval_mode is 'none'"),
            (self.sample_ahead is None or self.sample_ahead >= 1,
             f"sample_ahead must be >= 1, got {self.sample_ahead}"),
            (self.read_ahead_gib is None or (finite(self.read_ahead_gib)
                                             and self.read_ahead_bytes >= 1),
             f"read_ahead_gib must be positive and at least one byte (2**-30 GiB), got "
             f"{self.read_ahead_gib}"),
            (self.balance_window >= 0,
             f"balance_window must be >= 0, got {self.balance_window}"),
            (not batched or self.engine == "scan",
             f"the {self.task} task runs on the scan engine; got engine {self.engine!r}"),
            (not batched or not self.shard_features,
             f"the {self.task} task keeps every graph's node rows on every device: drop "
             f"shard_features"),
            (self.engine == "scan" or not (self.flat_outer or self.dedup is False),
             f"the host-mediated engine {self.engine!r} cuts deduplicated levels to their "
             f"counts: drop flat_outer and keep dedup"),
            (self.feature_cache_gib is None or (self.feature_cache_gib >= 0
                                                and finite(self.feature_cache_gib)),
             f"feature_cache_gib must be >= 0 and finite (or None: sized by the device), "
             f"got {self.feature_cache_gib}"),
            (self.feature_placement != "host" or not self.shard_features,
             "feature_placement 'host' keeps one table in host memory that every device "
             "reads: drop shard_features"),
            (self.feature_placement != "host" or not batched,
             f"the {self.task} task keeps its graphs' features on the device: drop "
             f"feature_placement 'host'"),
            (self.engine == "scan" or (self.devices == 1 and not self.shard_features),
             f"the host-mediated engine {self.engine!r} runs on one device without split "
             f"features; got devices={self.devices}, shard_features={self.shard_features}"),
        ]
        for ok, message in checks:
            if not ok:
                raise ValueError(message)
        if self.task == "link":
            check_frontier(self.batch_size, self.negatives, self.negative_mode, "negatives")
        _check_int32(self)
        # raises on a bad spec; "auto" is read as off a GPU, so that a default config does
        # not start JAX's backend (a multi-process run must join the others first)
        kernels = Kernels.parse(self.kernels, gpu=False)
        pallas = [op for op in OPS if getattr(kernels, op) == "pallas"]
        if pallas and jax.default_backend() != "gpu":
            raise ValueError(
                f"kernels {self.kernels!r} runs {', '.join(pallas)} as Pallas kernels, which "
                f"need an NVIDIA GPU; JAX's backend here is {jax.default_backend()}: use "
                f"kernels 'xla' or 'auto'")
        self.envelope_policy  # noqa: B018 (validates margin and multiple)

    @property
    def read_ahead_bytes(self) -> int | None:
        """`read_ahead_gib` in bytes (None: the device decides)."""
        return None if self.read_ahead_gib is None else int(self.read_ahead_gib * 2**30)

    @property
    def envelope_policy(self) -> EnvelopePolicy:
        if self.margin is None:  # EnvelopePolicy's own default margin, 1.1
            return EnvelopePolicy(multiple=self.multiple)
        return EnvelopePolicy(self.margin, self.multiple)


# What other libraries call an option (PyG's `hidden_channels`, `num_layers`,
# `num_neighbors`, `neg_sampling_ratio`, `edge_dim`; DGL examples' `n_hidden`, `fan_out`,
# `num_heads`; optax's and Keras's `learning_rate`; Flax's `rate`), which no spelling
# distance leads to: TrainConfig's name for it.
OTHER_NAMES = {
    "learning_rate": "lr", "wd": "weight_decay",
    "hidden_channels": "hidden", "hidden_dim": "hidden", "hidden_size": "hidden",
    "n_hidden": "hidden", "num_hidden": "hidden",
    "num_layers": "layers", "n_layers": "layers",
    "num_neighbors": "fanouts", "fan_out": "fanouts", "fan_outs": "fanouts",
    "num_epochs": "epochs", "n_epochs": "epochs", "max_epochs": "epochs",
    "dropout_rate": "dropout", "num_heads": "heads", "n_heads": "heads",
    "neg_sampling_ratio": "negatives", "num_negatives": "negatives",
    "random_seed": "seed", "eval_steps": "eval_every",
    "edge_dim": "edge_features", "edge_attr": "edge_features",
}


def _naming_unknown_options(init):
    """`TrainConfig.__init__`, refusing an option it does not have by a TypeError that
    names the closest ones it has (a misspelt `epoch=3` suggests `epochs`, another
    library's `learning_rate` suggests `lr`)."""
    fields = [field.name for field in dataclasses.fields(TrainConfig)]

    @functools.wraps(init)
    def checked(self, *args, **options):
        unknown = [name for name in options if name not in fields]
        if unknown:
            def hint(name):
                close = [OTHER_NAMES[name]] if name in OTHER_NAMES else \
                    difflib.get_close_matches(name, fields, n=3, cutoff=0.75)
                if close == ["fanouts"] and isinstance(options[name], dict):
                    close = ["relation_fanouts"]  # PyG's num_neighbors per edge type
                return f" (did you mean {' or '.join(map(repr, close))}?)" if close else ""
            raise TypeError("TrainConfig has no option " + "; no option ".join(
                f"{name!r}{hint(name)}" for name in unknown) + "; the options are "
                "TrainConfig's fields (docs/api.md)")
        init(self, *args, **options)

    return checked


TrainConfig.__init__ = _naming_unknown_options(TrainConfig.__init__)


def _check_int32(cfg) -> None:
    """ValueError naming the first whole-number option (or fanout) past int32: counts,
    sizes and positions are int32 on the device, where such a value cannot be held."""
    for field in dataclasses.fields(cfg):
        value = getattr(cfg, field.name)
        if isinstance(value, dict):
            numbers, name = [n for per_hop in value.values() for n in per_hop], \
                f"{field.name} {value}:"
        elif isinstance(value, tuple):
            numbers, name = value, f"{field.name} {value}:"
        else:
            numbers, name = (value,), field.name
        for n in numbers:
            if isinstance(n, int) and not isinstance(n, bool) and not -2**31 <= n < 2**31:
                raise ValueError(f"{name} {n} is past int32 (2**31 - 1): counts and sizes "
                                 f"are int32 on the device")


def _fanouts_of_the_right_form(cfg: TrainConfig) -> None:
    """ConfigTypeError for the forms of fanouts other libraries take that TrainConfig
    takes elsewhere or not at all: a dict per relation (PyG's `num_neighbors` of a
    typed graph: `relation_fanouts`), one number for every layer, a relation's one
    number in `relation_fanouts`."""
    fanouts, per_relation = cfg.fanouts, cfg.relation_fanouts
    whole = lambda n: isinstance(n, numbers.Integral) and not isinstance(n, bool)
    layers = int(cfg.layers) if whole(cfg.layers) and 1 <= cfg.layers <= 8 else 2
    each = lambda n: (int(n),) * layers
    where = f" for {layers} layer{'s' * (layers > 1)}"
    if isinstance(fanouts, dict):
        raise ConfigTypeError(f"TrainConfig.fanouts must be one fanout per layer (a typed "
                              f"graph's for every relation), e.g. (15, 10); fanouts per "
                              f"relation go in relation_fanouts (the relations it leaves "
                              f"out take fanouts), got {fanouts!r}")
    if whole(fanouts):
        raise ConfigTypeError(f"TrainConfig.fanouts must be one fanout per layer, e.g. "
                              f"{each(fanouts)}{where}, got {int(fanouts)} "
                              f"({type(fanouts).__name__})")
    if isinstance(per_relation, dict) and any(whole(v) for v in per_relation.values()):
        key, n = next((k, v) for k, v in per_relation.items() if whole(v))
        raise ConfigTypeError(f"TrainConfig.relation_fanouts must give each relation one "
                              f"fanout per layer, e.g. {{{key!r}: {each(n)}}}{where}, got "
                              f"{per_relation!r}")


def _relations_named(cfg: TrainConfig) -> None:
    """`link_relation` and `relation_fanouts`' keys given as (src, name, dst) triples,
    as PyG writes edge types, kept as their "src__name__dst" names (a config holds
    text, as its JSON record and the command line do)."""
    def named(key):
        triple = (isinstance(key, tuple | list) and len(key) == 3
                  and all(isinstance(part, str) for part in key))
        return relation_name(tuple(key)) if triple else key

    object.__setattr__(cfg, "link_relation", named(cfg.link_relation))
    if isinstance(cfg.relation_fanouts, dict):
        fanouts = {}
        for key, per_hop in cfg.relation_fanouts.items():
            if named(key) in fanouts:  # (one would have replaced the other)
                raise ValueError(f"relation_fanouts give {named(key)} twice, as a triple and "
                                 f"by its name: keep one")
            fanouts[named(key)] = per_hop
        object.__setattr__(cfg, "relation_fanouts", fanouts)
