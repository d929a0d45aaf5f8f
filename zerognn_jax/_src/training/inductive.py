"""A node or link run applied to another graph (of one node type, or typed as its own):
the program and device data `zg.predict(result, nodes, dataset=...)` reads (inductive
inference, GraphSAGE's setting: a model trained on one graph gives the rows
of nodes it never saw).

The other graph is prepared as the run prepared its own: its self-loops dropped where
the run's were (the built-in gcn and gat), its feature rows divided by their sums where
the run's were, its edge features in the run's dtype where the model reads them. The
sampler is the run's configuration resolved again for this graph (a fanout of -1 takes
every neighbour of its largest degree), in the run's level layout. A typed run's task
does this for its graph (`PredictsOtherGraphs`), which must have the run's node types,
relations and feature widths.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from zerognn_jax._src.data.dataset import Dataset
from zerognn_jax._src.data.graph import without_self_loops
from zerognn_jax._src.data.planetoid import row_normalize
from zerognn_jax._src.nn.layerwise import supports_layerwise
from zerognn_jax._src.sampling.minibatch import SamplerConfig, prepare_graph
from zerognn_jax._src.training.placement import place_features
from zerognn_jax._src.training.program import DeviceData, StepProgram, kept_replace
from zerognn_jax._src.training.rebuild import config_of
from zerognn_jax._src.training.tasks.base import PredictsOtherGraphs, PredictsTypes
from zerognn_jax._src.training.tasks.typed_eval import typed_layerwise


def other_graph(result, dataset, mode: str) -> tuple[StepProgram, DeviceData]:
    """(program, device data) of `result`'s run over `dataset`, a `Dataset` of a graph
    of the same feature columns (a typed run's: a `HeteroDataset` of its types and
    relations; its labels and splits are not read), for predictions of `mode` ("full"
    or "sampled", as `zg.predict` takes it).

    Raises:
      ValueError: `dataset` is no `Dataset`; the run learned a row per node of its own
        graph (`embedding_dim`), which a new graph's nodes lack; other feature columns,
        or no edge features of the width the model reads; no edge weights where a run
        of the weighted sampler samples (exact inference reads none); a result without
        its run's config (one built by hand); for a typed run, as its task's `over`
        refuses `dataset`.
    """
    program, trained = result.program, result.data
    config = result.summary.get("config") if isinstance(result.summary, dict) else None
    if config is None:
        raise ValueError("this result holds no config of its run (summary['config'], which "
                         "train and restore give): another graph is prepared as it says")
    if isinstance(program.task, PredictsOtherGraphs):
        return _other_typed_graph(program, trained, dataset, config, mode)
    if not isinstance(dataset, Dataset):
        raise ValueError(f"dataset must be a Dataset of the graph to predict "
                         f"(zg.make_dataset; its labels and splits are not read), got "
                         f"{type(dataset).__name__}")
    if program.embedding is not None:
        raise ValueError(f"the run learned a row per node of its own graph (embedding_dim "
                         f"{program.embedding.dim}), which the nodes of dataset "
                         f"{dataset.name!r} lack: a run without embedding_dim predicts "
                         f"other graphs")
    columns = trained.features.shape[1]
    if dataset.features.shape[1] != columns:
        raise ValueError(f"the model trained on {columns} feature columns; dataset "
                         f"{dataset.name!r} has {dataset.features.shape[1]}")
    graph = without_self_loops(dataset.graph) if program.self_loops_dropped else dataset.graph
    graph = graph._replace(edge_features=_edge_table(program, trained, graph, dataset.name))
    samples = mode == "sampled" or not supports_layerwise(program.model)
    features = dataset.features
    if result.summary.get("features_row_normalized"):
        lowest = float(np.min(features)) if np.size(features) else 0.0
        if lowest < 0:
            raise ValueError(f"the run trained on its feature rows each divided by its sum, "
                             f"which needs values >= 0, and the features of dataset "
                             f"{dataset.name!r} hold {lowest:g}")
        features = row_normalize(features)
    sampler = SamplerConfig(tuple(config["fanouts"]), replace=config["replace"],
                            method=config["sampler"], edge_ids=program.sampler.edge_ids)
    sampler = sampler.resolve(graph.max_degree())
    if program.layout is not None:
        sampler = program.layout.apply(sampler)
    program = kept_replace(program, sampler=sampler)
    if sampler.method == "weighted" and graph.weights is None:
        if samples:
            raise ValueError(f"the run samples neighbours by edge weight (sampler "
                             f"'weighted'), and the graph of dataset {dataset.name!r} has "
                             f"no weights: give it weights, or predict exactly "
                             f"(mode='full')")
    else:  # (exact inference samples nothing: no weights to search)
        graph = prepare_graph(graph, sampler)
    return program, _device_data(program, graph, features, jnp.dtype(config["dtype"]))


def _other_typed_graph(program: StepProgram, trained: DeviceData, dataset, config: dict,
                       mode: str) -> tuple[StepProgram, DeviceData]:
    """`other_graph` of a typed run: its task over `dataset` (`PredictsOtherGraphs`),
    which prepares the graph and feature table as the run's."""
    cfg = config_of({"config": config})
    samples = mode == "sampled" or not typed_layerwise(program.model)
    task = program.task.over(cfg, trained.graph, dataset, samples=samples)
    graph, table = task.device_inputs(dataset, jnp.dtype(cfg.dtype),
                                      bool(cfg.normalize_features), samples=samples)
    program = kept_replace(program, task=task)
    return program, _device_data(program, graph, table, jnp.dtype(cfg.dtype))


def _device_data(program: StepProgram, graph, features, dtype) -> DeviceData:
    """The other graph's `DeviceData` (no targets: nothing is scored), its feature
    table where the run's is (on the device, or read from host memory), placed on
    the run's mesh if it has one."""
    none = np.zeros((0,), np.int32)
    if program.placement is not None and program.placement.where == "host":
        # read from host memory as the run's table is (no device cache: rows in order)
        table = place_features(features, dtype, program.placement, announce=False)
    else:
        table = np.asarray(features).astype(dtype, copy=False)
        if program.parallel is None:
            table = jnp.asarray(table)
    if program.parallel is None:
        return DeviceData(graph.to_device(), table, jnp.asarray(none))
    return program.parallel.place_data(DeviceData(graph, table, none))


def pairs_over(result, dataset, mode: str):
    """(program, device data, (sources, destinations) counts) of a link run's pairs:
    its own, or those of `dataset`, another graph (`other_graph`); the program's task
    is the one that embeds them (a typed run's, over that graph)."""
    task = result.program.task
    if dataset is None:
        return result.program, result.data, task.pair_counts()
    program, data = other_graph(result, dataset, mode)
    if isinstance(task, PredictsTypes):  # (a typed graph's counts, by type)
        counts = data.graph.num_nodes
        return program, data, tuple(counts[t] for t in task.split.ends)
    return program, data, (data.graph.num_nodes,) * 2


def _edge_table(program: StepProgram, trained: DeviceData, graph, name: str):
    """The other graph's edge features as the model reads them (the run's width and
    dtype), or None where it reads none."""
    if not program.sampler.edge_ids:
        return None
    want = trained.graph.edge_features
    if graph.edge_features is None or np.shape(graph.edge_features)[1] != want.shape[1]:
        has = ("none" if graph.edge_features is None
               else f"{np.shape(graph.edge_features)[1]} columns")
        raise ValueError(f"the model reads edge features of {want.shape[1]} columns; the "
                         f"graph of dataset {name!r} has {has}")
    return np.asarray(graph.edge_features).astype(want.dtype, copy=False)
