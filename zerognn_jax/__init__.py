"""zerognn-jax: sampling-based GNN training with a whole epoch in one XLA program.

The public API, by stage (docs/architecture.md): data (graphs, datasets), ops (kernel
choice), sampling (sampler, seeds, envelope), nn (edge views, models), training
(programs, engines, the `train` loop, evaluation, data parallelism).
"""

from zerognn_jax._src.data.dataset import Dataset, make_dataset
from zerognn_jax._src.data.graph import (
    CSRGraph,
    from_edge_index,
    from_edge_list,
    from_jraph,
    from_networkx,
    from_scipy,
    mean_edge_features,
    take_edge_rows,
    to_edge_index,
    to_edge_list,
    to_jraph,
    to_networkx,
    to_scipy,
    without_self_loops,
)
from zerognn_jax._src.data.graph_datasets import load_graphs
from zerognn_jax._src.data.graph_interop import (
    PaddingGraphsWarning,
    collection_from_jraph,
    collection_from_pyg,
    collection_to_jraph,
    collection_to_pyg,
)
from zerognn_jax._src.data.graph_storage import load_graphs_file, save_graphs
from zerognn_jax._src.data.graphs import GraphCollection, make_collection
from zerognn_jax._src.data.hetero import (
    HeteroGraph,
    add_reverse_relations,
    as_hetero,
    hetero_from_csr,
    hetero_graph,
)
from zerognn_jax._src.data.hetero_dataset import (
    HeteroDataset,
    from_hetero_data,
    make_hetero_dataset,
    to_hetero_data,
)
from zerognn_jax._src.data.hetero_links import TypedLinkSplit, typed_link_split
from zerognn_jax._src.data.hetero_storage import (
    is_hetero_path,
    load_hetero,
    save_hetero_dir,
    save_hetero_npz,
)
from zerognn_jax._src.data.links import (
    EmptySplitWarning,
    EvalEdges,
    LinkSplit,
    load_ogbl,
    random_link_split,
)
from zerognn_jax._src.data.loaders import (
    load_dataset,
    load_dir,
    load_hetero_dataset,
    load_npz,
    row_normalize,
    save_dir,
    save_npz,
)
from zerognn_jax._src.data.molecules import molhiv_like, molpcba_like
from zerognn_jax._src.data.ogbg import read_ogbg
from zerognn_jax._src.data.pyg_data import dataset_from_pyg, dataset_to_pyg
from zerognn_jax._src.data.version import VERSION
from zerognn_jax._src.data.writes import CacheWarning, WriteError
from zerognn_jax._src.nn.bridge import as_linen
from zerognn_jax._src.nn.graph_models import (
    GRAPH_MODELS,
    CategoricalEncoder,
    GraphGNN,
    Graphs,
    OnGraphs,
    make_graph_model,
    pool,
)
from zerognn_jax._src.nn.hetero import (
    HETERO_MODELS,
    HeteroGNN,
    OnTypes,
    RelGATConv,
    RGCNConv,
    TypedLayer,
    make_hetero_model,
    typed_layers,
    whole_graph_layer,
)
from zerognn_jax._src.nn.layerwise import LayerWise
from zerognn_jax._src.nn.link_heads import (
    DotDecoder,
    LinkModel,
    MLPDecoder,
    OnTypesLink,
    make_decoder,
)
from zerognn_jax._src.nn.models import (
    GNN,
    MLP,
    GATConv,
    GCNConv,
    GINEConv,
    SAGEConv,
    make_model,
)
from zerognn_jax._src.nn.views import EdgeView, EllView, gcn_weights, mean_weights
from zerognn_jax._src.ops.host_rows import HostTable
from zerognn_jax._src.ops.registry import Kernels
from zerognn_jax._src.sampling.calibrate import Calibration, calibrate, choose_envelope
from zerognn_jax._src.sampling.envelope import Envelope, EnvelopePolicy, conservative, grow
from zerognn_jax._src.sampling.graph_batch import GraphBatch, GraphTables, pack_graphs
from zerognn_jax._src.sampling.minibatch import (
    SAMPLERS,
    MiniBatch,
    SamplerConfig,
    prepare_graph,
    sample_minibatch,
)
from zerognn_jax._src.sampling.negatives import negative_pairs, seed_frontier
from zerognn_jax._src.sampling.seeds import (
    counter_key,
    epoch_items,
    epoch_seeds,
    step_items,
    step_keys,
    step_seeds,
)
from zerognn_jax._src.sampling.steps import ITEM_SEEDS, SeedSource
from zerognn_jax._src.sampling.typed_calibrate import (
    TypedCalibration,
    calibrate_typed,
    choose_typed_envelope,
)
from zerognn_jax._src.sampling.typed_config import TypedSamplerConfig
from zerognn_jax._src.sampling.typed_envelope import (
    TypedEnvelope,
    fit_typed_envelope,
    grow_typed,
    typed_conservative,
)
from zerognn_jax._src.sampling.typed_minibatch import (
    TypedMiniBatch,
    prepare_typed_graph,
    sample_typed,
    sample_typed_step,
)
from zerognn_jax._src.training.callbacks import EarlyStopping
from zerognn_jax._src.training.checkpoint_errors import CheckpointMismatch, CheckpointWarning
from zerognn_jax._src.training.compile_cache import CompileCacheWarning, use_compile_cache
from zerognn_jax._src.training.config import TrainConfig
from zerognn_jax._src.training.engines import make_engine
from zerognn_jax._src.training.evaluate import (
    evaluate_splits,
    evaluate_targets,
    layerwise_logits,
    node_embeddings,
    sampled_logits,
)
from zerognn_jax._src.training.export import ExportedModel, export_model, graph_arguments
from zerognn_jax._src.training.host import HostEngine
from zerognn_jax._src.training.inference import (
    over_graph,
    predict,
    restore,
    saved_variables,
    score_pairs,
)
from zerognn_jax._src.training.interrupts import Interrupted
from zerognn_jax._src.training.interrupts import deferred as deferred_interrupts
from zerognn_jax._src.training.loaders import (
    LinkLoaderBatch,
    LinkNeighborLoader,
    LoaderBatch,
    NeighborLoader,
)
from zerognn_jax._src.training.lock import OutputsInUse
from zerognn_jax._src.training.parallel import (
    Collectives,
    DataParallel,
    initialize_distributed,
    make_mesh,
)
from zerognn_jax._src.training.placement import PlacementWarning
from zerognn_jax._src.training.program import (
    DeviceData,
    StepProgram,
    TrainState,
    init_state,
    views_for,
)
from zerognn_jax._src.training.recommend import recommend
from zerognn_jax._src.training.row_adam import RowAdamState, row_adam_init, row_adam_update
from zerognn_jax._src.training.run_checks import IgnoredOptionWarning
from zerognn_jax._src.training.scan import ScanEngine
from zerognn_jax._src.training.step import EpochResult
from zerognn_jax._src.training.tasks.base import (
    BatchedTask,
    PredictsItems,
    PredictsNewItems,
    Task,
    TaskBatch,
)
from zerognn_jax._src.training.tasks.graph import GraphTask, graph_outputs
from zerognn_jax._src.training.tasks.link import LinkTask
from zerognn_jax._src.training.tasks.link_metrics import (
    average_precision,
    hits_at,
    mrr,
    roc_auc,
)
from zerognn_jax._src.training.tasks.losses import (
    sigmoid_cross_entropy,
    softmax_cross_entropy,
    squared_error,
)
from zerognn_jax._src.training.tasks.node import NodeTask, target_metrics
from zerognn_jax._src.training.tasks.registry import TASKS, register_task
from zerognn_jax._src.training.tasks.typed_link import TypedLinkTask
from zerognn_jax._src.training.tasks.typed_node import TypedNodeTask, TypedSample
from zerognn_jax._src.training.trainer import Diverged, TrainResult, train
from zerognn_jax._src.training.typed_loaders import (
    HeteroLinkLoaderBatch,
    HeteroLinkNeighborLoader,
    HeteroLoaderBatch,
    HeteroNeighborLoader,
)

__version__ = VERSION

__all__ = [
    "CSRGraph", "Calibration", "Collectives", "DataParallel", "Dataset", "DeviceData", "EdgeView",
    "EllView", "Envelope", "EnvelopePolicy", "EpochResult", "GATConv", "GCNConv", "GNN",
    "HostEngine", "Kernels", "MLP", "MiniBatch", "SAGEConv", "SamplerConfig", "ScanEngine",
    "StepProgram", "TrainConfig", "TrainResult", "TrainState", "calibrate",
    "choose_envelope", "conservative", "epoch_seeds", "evaluate_splits", "from_edge_list",
    "from_jraph", "from_scipy", "grow", "init_state", "initialize_distributed",
    "layerwise_logits", "load_dataset", "load_npz", "make_dataset", "make_engine",
    "make_mesh", "make_model", "mean_weights", "gcn_weights", "prepare_graph", "SAMPLERS",
    "sample_minibatch",
    "sampled_logits", "save_npz", "step_keys", "step_seeds", "to_jraph", "train",
    "LoaderBatch", "NeighborLoader", "HeteroNeighborLoader", "HeteroLoaderBatch",
    "HeteroLinkNeighborLoader", "HeteroLinkLoaderBatch",
    "counter_key", "views_for", "from_edge_index",
    "CheckpointMismatch", "CheckpointWarning", "Diverged", "EmptySplitWarning",
    "PlacementWarning",
    "IgnoredOptionWarning", "Interrupted", "deferred_interrupts", "OutputsInUse", "WriteError",
    "CompileCacheWarning", "CacheWarning",
    "use_compile_cache",
    "DotDecoder", "EvalEdges", "LinkModel", "LinkSplit", "LinkTask", "MLPDecoder", "load_ogbl",
    "make_decoder", "negative_pairs", "node_embeddings", "random_link_split",
    "seed_frontier",
    "EarlyStopping", "NodeTask", "as_linen", "restore", "saved_variables",
    "sigmoid_cross_entropy",
    "softmax_cross_entropy", "squared_error", "evaluate_targets", "target_metrics",
    "RowAdamState", "row_adam_init", "row_adam_update",
    "from_networkx", "to_edge_index", "to_networkx", "to_scipy", "mean_edge_features",
    "row_normalize",
    "ExportedModel", "export_model", "graph_arguments", "load_dir", "save_dir", "GINEConv",
    "Task", "TaskBatch", "TASKS", "register_task", "step_items", "epoch_items",
    "ITEM_SEEDS", "SeedSource", "take_edge_rows",
    "GraphCollection", "make_collection", "load_graphs", "load_graphs_file", "save_graphs",
    "collection_from_jraph", "collection_to_jraph", "collection_from_pyg",
    "collection_to_pyg", "PaddingGraphsWarning", "molhiv_like", "molpcba_like", "read_ogbg",
    "GRAPH_MODELS",
    "CategoricalEncoder", "GraphGNN", "Graphs", "OnGraphs", "make_graph_model", "pool",
    "GraphBatch", "GraphTables", "pack_graphs", "BatchedTask", "PredictsItems",
    "PredictsNewItems", "GraphTask",
    "graph_outputs",
    "TypedNodeTask", "TypedSample", "TypedLinkTask", "TypedLinkSplit", "typed_link_split",
    "OnTypesLink",
    "HeteroGraph", "HeteroDataset", "add_reverse_relations", "as_hetero", "from_hetero_data",
    "dataset_from_pyg", "dataset_to_pyg",
    "hetero_from_csr", "hetero_graph", "is_hetero_path", "load_hetero", "make_hetero_dataset",
    "save_hetero_dir", "save_hetero_npz", "to_edge_list", "to_hetero_data",
    "TypedCalibration", "TypedEnvelope", "TypedMiniBatch", "TypedSamplerConfig",
    "calibrate_typed", "choose_typed_envelope", "fit_typed_envelope", "grow_typed",
    "prepare_typed_graph", "sample_typed", "sample_typed_step", "typed_conservative",
    "load_hetero_dataset", "HETERO_MODELS", "HeteroGNN", "OnTypes", "RelGATConv", "RGCNConv",
    "TypedLayer", "make_hetero_model", "typed_layers", "whole_graph_layer",
    "LayerWise", "predict", "over_graph", "recommend", "score_pairs", "LinkLoaderBatch",
    "LinkNeighborLoader", "roc_auc", "average_precision", "mrr", "hits_at", "HostTable",
    "without_self_loops",
]
