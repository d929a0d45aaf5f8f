"""zerognn-jax: sampling-based GNN training with a whole epoch in one XLA program."""

from zerognn_jax._src.blocks import EdgeView, EllView, gcn_weights, mean_weights
from zerognn_jax._src.dataset import Dataset, make_dataset
from zerognn_jax._src.datasets import load_dataset, load_npz, save_npz
from zerognn_jax._src.engine import DeviceData, StepProgram, TrainState, init_state, run_epoch
from zerognn_jax._src.envelope import Calibration, Envelope, calibrate, conservative, grow
from zerognn_jax._src.evaluate import layerwise_logits, sampled_logits
from zerognn_jax._src.graph import CSRGraph, from_edge_list, from_jraph, from_scipy, to_jraph
from zerognn_jax._src.kernels import Kernels
from zerognn_jax._src.models import GNN, MLP, GATConv, GCNConv, SAGEConv, make_model
from zerognn_jax._src.parallel import data_parallel, initialize_distributed, make_mesh, place_data
from zerognn_jax._src.sampler import MiniBatch, SamplerConfig, sample_minibatch
from zerognn_jax._src.trainer import TrainConfig, TrainResult, train

__version__ = "0.1.0"

__all__ = [
    "CSRGraph", "Calibration", "Dataset", "DeviceData", "EdgeView", "EllView", "Envelope",
    "GATConv", "GCNConv", "GNN", "Kernels", "MLP", "MiniBatch", "SAGEConv", "SamplerConfig",
    "StepProgram", "TrainConfig", "TrainResult", "TrainState", "calibrate", "conservative",
    "data_parallel", "from_edge_list", "from_jraph", "from_scipy", "gcn_weights", "grow",
    "init_state", "initialize_distributed", "layerwise_logits", "load_dataset", "load_npz",
    "make_dataset", "make_mesh", "make_model", "mean_weights", "place_data", "run_epoch",
    "sample_minibatch", "sampled_logits", "save_npz", "to_jraph", "train",
]
