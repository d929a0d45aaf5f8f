"""A trained model as a serialized `jax.export` artifact: sampled inference for serving.

`export_model` stages out one batch of sampled inference (sample the seeds' neighbourhood,
gather features, run the model) with the model's variables baked in, every op in its
XLA form. The graph and the feature table stay arguments: they are the data a server
holds, often too large to serialize. Every argument is a plain array, so the artifact
needs no pytree registrations to load: `jax.export.deserialize(blob).call(...)` in any
process with JAX (and `flatbuffers`, which `serialize` needs) runs it, no zerognn-jax
required. A typed graph's model exports the same way, each relation's CSR an argument of
its own: a node model gives its target type's logits, a link model the embeddings of the
nodes of one end of its relation (`export_model`). A graph-level model (a collection of
small graphs) exports as one forward pass over B whole graphs that the caller packs
into fixed node and edge rows, as a jraph user pads a `GraphsTuple`: new graphs, not
the collection's, are what such a server sees (`export_model`, `graph_arguments`).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import NamedTuple

import flax
import jax
import jax.numpy as jnp
import numpy as np

from zerognn_jax._src.data.checks import LibraryWarning, at_least_one, is_int
from zerognn_jax._src.data.graph import CSRGraph
from zerognn_jax._src.data.graphs import GraphCollection
from zerognn_jax._src.data.hetero import HeteroGraph, relation_name
from zerognn_jax._src.data.writes import atomic_write
from zerognn_jax._src.ops.host_rows import host_table, is_host_resident
from zerognn_jax._src.ops.registry import XLA
from zerognn_jax._src.sampling.envelope import MAX_CAPACITY, PastInt32, conservative
from zerognn_jax._src.sampling.graph_batch import GraphTables, pack_graphs
from zerognn_jax._src.sampling.minibatch import SamplerConfig
from zerognn_jax._src.sampling.typed_envelope import typed_conservative, typed_tree_sizes
from zerognn_jax._src.sampling.typed_minibatch import sample_typed
from zerognn_jax._src.training.program import DeviceData, StepProgram
from zerognn_jax._src.training.tasks.base import BatchedTask, PredictsTypes
from zerognn_jax._src.training.tasks.graph import edge_rows
from zerognn_jax._src.training.user_frames import user_stacklevel

PLATFORMS = ("cpu", "cuda", "rocm", "tpu")  # jax.export's names for its lowering targets
# A layout pin (`ops.aggregate.row_major`, R-GAT's projected slots) is a custom call
# outside jax.export's stable list; it only tells XLA's layout assignment what to do.
_PINS = (jax.export.DisabledSafetyCheck.custom_call("LayoutConstraint"),)


def _node_type_told(description: dict) -> str:
    """", one of <type> rows" where an artifact's description names its node type."""
    told = description.get("node_type")
    return "" if told is None else f"; it describes one of {told} rows"


def description_path(path) -> Path:
    """Where an artifact's description is kept: beside it, named `<path>.json`."""
    path = Path(path)
    return path.with_name(f"{path.name}.json")


class ExportedModel(NamedTuple):
    """What `export_model` returns.

    Attributes:
      exported: the `jax.export.Exported`; `.call(*arguments)` gives
        float32[batch_size, outputs] (a link model's: the encoder's embeddings);
        `.serialize()` gives bytes.
      batch_size: seeds per call (pad with any id and `valid=False`); graphs per call
        for a graph-level model.
      arguments: the argument names, in order: (indptr, indices, features, seeds, valid,
        key), with "edge_features" (float[E, D], the graph's table) after "features"
        for a model that reads edge features; a typed graph's are per relation
        (`export_model`); a graph-level model's are (node_features, edge_features,
        senders, receivers, n_node, n_edge), without "edge_features" where the
        collection has none.
      node_type: the type whose rows a typed graph's model gives (its seeds' type);
        None for a graph of one type and for a graph-level model.
    """

    exported: jax.export.Exported
    batch_size: int
    arguments: tuple[str, ...] = ("indptr", "indices", "features", "seeds", "valid", "key")
    node_type: str | None = None

    def save(self, path, notes: Mapping | None = None) -> dict:
        """Writes the artifact to `path` and its description (its size in bytes, batch
        size, argument names and platforms, a graph-level artifact's node and edge rows
        per call, with `notes` added) as one JSON line to
        `description_path(path)`, each file whole or not at all; `read(path)` reads
        them back. Returns the description.

        Raises:
          WriteError: either file could not be written (an OSError naming it).
        """
        taken = sorted(set(notes or ()) & {"bytes", "sha256", "batch_size", "arguments",
                                           "platforms", "node_type", "max_nodes",
                                           "max_edges"})
        if taken:  # (read would take the note for the artifact's own)
            raise ValueError(f"notes may not set what the description says of the artifact "
                             f"itself: {', '.join(taken)}")
        blob = self.serialize()
        described = {"bytes": len(blob), "sha256": hashlib.sha256(blob).hexdigest(),
                     "batch_size": self.batch_size, "arguments": list(self.arguments),
                     "platforms": list(self.exported.platforms), **(notes or {})}
        if self.node_type is not None:
            described["node_type"] = self.node_type
        if "n_node" in self.arguments:  # a graph-level call's rows (`graph_arguments`)
            avals = dict(zip(self.arguments, self.exported.in_avals))
            described.update(max_nodes=avals["node_features"].shape[0],
                             max_edges=avals["senders"].shape[0])
        # the description is renamed into place after the artifact it describes
        with atomic_write(description_path(path), "the artifact's description") as text, \
                atomic_write(path, "the artifact") as f:
            f.write(blob)
            text.write((json.dumps(described) + "\n").encode())
        return described

    @classmethod
    def read(cls, path, description=None) -> ExportedModel:
        """The artifact `save` (or `zerognn export --out path`) wrote, named again by its
        description: by default the file `description_path(path)` beside it; else the
        JSON line the command printed (the file it was kept in, or its dict).

        Raises:
          ValueError: a file jax.export cannot read (truncated, or not an artifact), or
            a description that is not that line or is of another artifact, naming it.
          FileNotFoundError: no artifact at `path`, or no description beside it.
        """
        if description is None:
            if not Path(path).is_file():
                raise FileNotFoundError(f"no artifact at {path}")
            description = description_path(path)
            if not description.is_file():
                raise FileNotFoundError(f"no description of {path} beside it ({description},"
                                        f" which ExportedModel.save and zerognn export "
                                        f"write): give the JSON line zerognn export printed")
        if not isinstance(description, dict):
            text = Path(description).read_text()
            try:
                description = json.loads(text)
            except ValueError:
                raise ValueError(f"{description} is not the JSON line zerognn export "
                                 f"prints") from None
        missing = [k for k in ("batch_size", "arguments") if k not in description]
        if missing:
            raise ValueError(f"the artifact's description has no {' or '.join(missing)}: "
                             f"give the JSON line zerognn export printed")
        blob = bytearray(Path(path).read_bytes())  # (a missing file: FileNotFoundError)
        digest = description.get("sha256")  # (lines printed before 2026-12-06 have none)
        if digest is not None and digest != hashlib.sha256(blob).hexdigest():
            raise ValueError(f"the description is of another artifact than {path} (its "
                             f"sha256 differs{_node_type_told(description)}): give the line "
                             f"its own export printed")
        try:
            exported = jax.export.deserialize(blob)
        except Exception as err:  # flatbuffers' reader: struct.error, AssertionError, ...
            said = str(err).strip().splitlines()[0][:200] if str(err).strip() else \
                type(err).__name__
            raise ValueError(f"{path} is not an artifact jax.export reads (truncated, or "
                             f"another file): {said}") from None
        arguments = tuple(description["arguments"])
        if len(arguments) != len(exported.in_avals):
            raise ValueError(f"the description names {len(arguments)} arguments, the "
                             f"artifact {path} takes {len(exported.in_avals)}: they are of "
                             f"two exports")
        return cls(exported, int(description["batch_size"]), arguments,
                   description.get("node_type"))

    def call(self, *args):
        """`exported.call(*args)`, each argument's shape and dtype checked first against
        the artifact's, the one that differs named (JAX's own error names an argument by
        position only). The graph's arrays are as long as the graph the run trained on:
        `result.data.graph`, which is not the dataset's where training changed it (GAT
        drops self-loops; a link run keeps its training edges)."""
        if len(args) != len(self.arguments):
            raise TypeError(f"the artifact takes {len(self.arguments)} arguments "
                            f"({', '.join(self.arguments)}), got {len(args)}")
        for name, arg, aval in zip(self.arguments, args, self.exported.in_avals):
            shape, dtype = np.shape(arg), getattr(arg, "dtype", None)
            if dtype is not None:  # as JAX takes it: int64 ids as int32 without x64
                dtype = jax.dtypes.canonicalize_dtype(dtype)
            if shape != aval.shape or (dtype is not None and dtype != aval.dtype):
                graph = (" (the graph's arrays are those of the graph the run trained on, "
                         "result.data.graph; art.data_arguments(result.data) gives them)"
                         if name.endswith(("indptr", "indices", "edge_features"))
                         and "n_node" not in self.arguments else "")  # (not packed graphs)
                raise ValueError(f"argument {name} must be {aval.dtype}{list(aval.shape)}, "
                                 f"got {dtype}{list(shape)}{graph}")
        return self.exported.call(*args)

    def serialize(self) -> bytearray:
        """The artifact's bytes (`jax.export`'s serialization: `jax.export.deserialize`
        reads them back in a process without zerognn-jax)."""
        return self.exported.serialize()

    def __repr__(self) -> str:
        # jax.export.Exported's own repr holds the whole serialized module (~290 KB for a
        # small graph model), which would flood a notebook cell
        typed = "" if self.node_type is None else f"node_type={self.node_type!r}, "
        return (f"ExportedModel(batch_size={self.batch_size}, arguments={self.arguments}, "
                f"{typed}"
                f"platforms={tuple(self.exported.platforms)})")

    def data_arguments(self, data: DeviceData) -> tuple:
        """The arrays of `data` (a run's `DeviceData`: `result.data`) that come before
        the seeds, in `arguments`' order: `call(*art.data_arguments(data),
        seeds, valid, key)`. A graph-level artifact takes no data (`graph_arguments`)."""
        if "n_node" in self.arguments:
            raise ValueError("a graph-level artifact takes each call's graphs whole, and "
                             "no data arrays: call it with graph_arguments(...)")
        if not isinstance(data, DeviceData):  # (a dataset's or a graph's arrays differ)
            raise TypeError(f"data_arguments takes the run's DeviceData, result.data (or "
                            f"restore(...).data), got {type(data).__name__}")
        # (a run's table split over devices holds padding rows past its nodes, which the
        # artifact does not take)
        arrays = [_in_node_order(a) for a in _lookup(data, self.arguments[:-3])]
        return tuple(a[:aval.shape[0]] if name == "features" and a.shape[0] > aval.shape[0]
                     else a for name, a, aval in zip(self.arguments, arrays,
                                                      self.exported.in_avals))


# A graph-level artifact's arguments: B graphs' nodes and edges back to back in
# max_nodes and max_edges rows (senders and receivers local to their graph, as
# `make_collection` takes them), then each graph's node and edge count.
GRAPH_ARGUMENTS = ("node_features", "edge_features", "senders", "receivers", "n_node",
                   "n_edge")


def graph_arguments(art: ExportedModel, collection: GraphCollection, ids) -> tuple:
    """The arrays a graph-level artifact `art` takes for graphs `ids` of `collection`
    (at most `art.batch_size`; the rest of the call's graph slots are empty graphs,
    their output rows to be ignored), padded to its shapes: a call's row i is graph
    ids[i]'s output. The collection is any that `make_collection` builds, the graphs
    to serve as well as those trained on.

    Raises:
      ValueError: `art` is not a graph-level artifact, more ids than its batch, an id
        outside the collection, or graphs whose nodes or edges overflow its rows.
    """
    if "n_node" not in art.arguments:
        raise ValueError("graph_arguments packs graphs for a graph-level artifact; this "
                         f"one takes {', '.join(art.arguments)}")
    shapes = dict(zip(art.arguments, art.exported.in_avals))
    batch = shapes["n_node"].shape[0]
    given_ids = np.asarray(ids)
    if given_ids.ndim > 1:
        raise ValueError(f"ids must be a 1-D list of graph ids, got shape "
                         f"{list(given_ids.shape)}")
    given_ids = given_ids.reshape(-1)
    if given_ids.size and not np.issubdtype(given_ids.dtype, np.integer):
        raise ValueError(f"ids must be integer graph ids, got dtype {given_ids.dtype}")
    ids = given_ids.astype(np.int64)
    if ids.size > batch:
        raise ValueError(f"the artifact takes at most {batch} graphs a call, got {ids.size}")
    if ids.size and (ids.min() < 0 or ids.max() >= collection.num_graphs):
        raise ValueError(f"ids must be graph ids in [0, {collection.num_graphs}), found "
                         f"[{ids.min()}, {ids.max()}]")
    _check_fits(shapes, collection)
    no, eo = collection.node_offsets, collection.edge_offsets
    n_node, n_edge = no[ids + 1] - no[ids], eo[ids + 1] - eo[ids]
    rows = {"node_features": shapes["node_features"].shape[0],
            "senders": shapes["senders"].shape[0]}
    if n_node.sum() > rows["node_features"] or n_edge.sum() > rows["senders"]:
        raise ValueError(f"graphs {ids.tolist()} hold {n_node.sum()} nodes and "
                         f"{n_edge.sum()} edges; the artifact has rows for "
                         f"{rows['node_features']} and {rows['senders']}")
    node_rows = np.concatenate([np.arange(no[i], no[i + 1]) for i in ids] or [[]])
    edge_rows = np.concatenate([np.arange(eo[i], eo[i + 1]) for i in ids] or [[]])
    node_rows, edge_rows = node_rows.astype(np.int64), edge_rows.astype(np.int64)

    def padded(name, table, at):
        spec = shapes[name]
        out = np.zeros(spec.shape, spec.dtype)
        out[:at.size] = np.asarray(table)[at].astype(spec.dtype)
        return out

    counts = lambda c: np.pad(c, (0, batch - c.size)).astype(np.int32)
    given = {"node_features": padded("node_features", collection.node_features, node_rows),
             "senders": padded("senders", collection.senders, edge_rows),
             "receivers": padded("receivers", collection.receivers, edge_rows),
             "n_node": counts(n_node), "n_edge": counts(n_edge)}
    if "edge_features" in shapes:
        given["edge_features"] = padded("edge_features", collection.edge_features,
                                        edge_rows)
    return tuple(given[name] for name in art.arguments)


def _check_fits(shapes: dict, collection: GraphCollection) -> None:
    """ValueError unless `collection`'s node and edge columns are the artifact's."""
    table = collection.edge_features
    wanted = {"node features": (shapes["node_features"].shape[1],
                                np.asarray(collection.node_features).shape[1]),
              "edge features": (shapes["edge_features"].shape[1]
                                if "edge_features" in shapes else None,
                                None if table is None else np.asarray(table).shape[1])}
    for what, (artifact, given) in wanted.items():
        if artifact != given:
            has = lambda w: "none" if w is None else f"{w} columns"
            raise ValueError(f"the artifact takes {what} of {has(artifact)}; collection "
                             f"{collection.name!r} has {has(given)}")


def _in_node_order(table):
    """An array as the artifact takes it: a host feature table's NumPy array (a cached
    one's too), its rows in node order where the table keeps them hottest first
    (`HostTable.position`)."""
    if not is_host_resident(table):
        return table
    table = host_table(table)  # (a CachedTable's copies on the device are its rows too)
    if table.position is None:
        return table.array
    return table.array[np.asarray(table.position)]


def _without_padding(program: StepProgram, data: DeviceData) -> DeviceData:
    """`data` with its feature table cut to the graph's rows: a table split over devices
    (`shard_features`) is padded to a multiple of them, and an artifact staged at its
    shape took the padded table only (`zerognn export` of the same run's checkpoint took
    the table itself)."""
    graph, table = data.graph, data.features
    if isinstance(graph, HeteroGraph):
        inputs = getattr(program.task, "inputs", None)
        rows = None if inputs is None else inputs.table_rows(graph.num_nodes)
    else:
        rows = getattr(graph, "num_nodes", None)
    if rows is None or is_host_resident(table) or not hasattr(table, "shape") \
            or table.shape[0] <= rows:
        return data
    return data._replace(features=table[:rows])


def _lookup(data: DeviceData, names) -> list:
    """The arrays of `data` that argument `names` name: "features", a graph's "indptr",
    "indices" or "edge_features", or a typed graph's "<relation>.<that>"."""
    graph = data.graph
    relations = ({relation_name(r): r for r in graph.relations}
                 if isinstance(graph, HeteroGraph) else {})
    out = []
    for name in names:
        owner, _, part = name.rpartition(".")
        out.append(data.features if name == "features" else
                   getattr(graph[relations[owner]] if owner else graph, part))
    return out


def export_model(program: StepProgram, variables, data: DeviceData, *, batch_size: int,
                 platforms: tuple[str, ...] | None = None,
                 node_type: str | None = None, max_nodes: int | None = None,
                 max_edges: int | None = None, max_degree: int | None = None
                 ) -> ExportedModel:
    """Exports sampled inference of `batch_size` seeds with `program`'s sampler and model.

    Args:
      program, variables, data: as `TrainResult.program`, `.variables`, `.data` (or
        `restore`'s); `data` gives the shapes and dtypes of the graph and features the
        artifact will be called with (it is not stored).
      batch_size: seeds per call; the envelope is the conservative one for that batch,
        so no call can overflow.
      platforms: lowering targets, e.g. ("cpu", "cuda"); default: this backend's.
      node_type: a typed link model's end type whose embeddings the artifact gives (it
        may be left out where both ends are one type); a typed node model's target type
        or None; None for a graph of one type.
      max_nodes, max_edges: a graph-level model's node and edge rows per call (below);
        default: `batch_size` times the collection's largest graph, which any
        `batch_size` of its graphs fit.
      max_degree: a graph-level model's sums by gathers over each node's listed edges,
        this many a node (the "ell" aggregation, faster on a GPU for large batches; a
        graph with a node of higher in- or out-degree gets a NaN row); None: by
        scatter-adds, no bound.

    A typed graph's program takes, per relation in the graph's order,
    "<src>__<name>__<dst>.indptr" and ".indices" (and ".edge_features" where its views
    read that relation's table), then the stacked "features" table, then the seeds: ids
    of the target type, whose logits come back, or of a link model's `node_type`, whose
    embeddings come back. Learnable rows are baked in with the variables. A valid seed
    outside its type's nodes (or the graph's) gets a NaN row. A hop taking every
    neighbour, or a fanout the training graph's largest degree cut, has that degree's
    slots: a call whose graph (or a relation) has a longer row gives NaN everywhere,
    where its rows would come back cut. The graph arrays are otherwise taken as valid.

    A graph-level model (`task="graph"`) takes (node_features, edge_features, senders,
    receivers, n_node, n_edge): float[max_nodes, d] node rows and float[max_edges, d_e]
    edge rows (dtypes as the run's `data` holds them, categorical ids as float32 within
    the vocabularies trained on; no edge rows where the collection has none),
    int32[max_edges] senders and receivers local to their graph, int32[batch_size] node
    and edge counts (an empty graph pads a call); it gives float32[batch_size, outputs],
    the evaluation-mode outputs. A graph whose edge names a node outside it gets a NaN
    row (the edge joins no graph), as does one with a categorical id outside the
    vocabulary trained on or not a whole number (the encoder would read another
    column's category), and a call whose counts are negative or sum past the
    rows NaN everywhere: no call reads out of bounds unseen. `graph_arguments` packs a
    collection's graphs for it.

    Raises:
      ValueError: a bad batch size, an unknown platform, a weighted sampler (it reads a
        per-edge table the artifact does not take), a `node_type` the model does not
        predict, rows per call given for a model that is not graph-level or out of
        range, or variables that are not the model's (no `params`, a parameter missing
        or of another shape).
    """
    batch_size = at_least_one(batch_size, "batch_size")
    if batch_size > MAX_CAPACITY:  # seeds, flags and a graph call's counts are int32[B]
        raise ValueError(f"batch_size {batch_size:,} is past int32: give at most "
                         f"{MAX_CAPACITY:,} (far fewer fit a device)")
    if not isinstance(variables, Mapping) or "params" not in variables:
        raise ValueError(f"variables must be the model's variables, a mapping with 'params' "
                         f"(as TrainResult.variables), got {type(variables).__name__}")
    if isinstance(platforms, str):
        raise ValueError(f"platforms must be a tuple of names, e.g. ('cpu', 'cuda'), got "
                         f"{platforms!r}")
    unknown = [p for p in platforms or () if p not in PLATFORMS]
    if unknown:  # jax.export lowers for a name it does not know without a word
        raise ValueError(f"platforms must be among {', '.join(PLATFORMS)}; got "
                         f"{', '.join(map(repr, unknown))}")
    typed = isinstance(program.task, PredictsTypes)
    graphs = isinstance(program.task, BatchedTask) and not typed
    sizes = [f"{name} {value}" for name, value in (("max_nodes", max_nodes),
             ("max_edges", max_edges), ("max_degree", max_degree)) if value is not None]
    if not graphs and sizes:
        raise ValueError(f"{', '.join(sizes)}: only a graph-level model's calls take sizes; "
                         f"this program's task is {program.task.name!r}")
    if graphs:
        if node_type is not None:
            raise ValueError("node_type picks a node type of a typed graph's model; this "
                             "program's model predicts one row per graph")
        rows = _graph_rows(data, batch_size, max_nodes, max_edges)
        if max_degree is not None and (not is_int(max_degree)
                                       or not 1 <= max_degree <= rows[1]):
            raise ValueError(f"max_degree must be an integer in [1, max_edges = {rows[1]}], "
                             f"got {max_degree!r}")
    elif typed:
        seed_type = program.task.output_type(node_type)  # before any lowering
    elif node_type is not None:
        raise ValueError(f"node_type picks a node type of a typed graph's model; this "
                         f"program's graph has one type (its task {program.task.name!r})")
    if not graphs and program.sampler.method == "weighted":
        raise ValueError("export_model serves the uniform and LABOR samplers; this "
                         "program samples by edge weight")
    # The XLA twin of every op: no Triton custom calls, whose serialized form jax.export
    # does not promise to keep loadable, and one artifact lowers for CPU and GPU alike.
    program = dataclasses.replace(program.with_mesh(None), kernels=XLA)
    data = _without_padding(program, data)
    try:
        if graphs:
            return _export_graphs(program, variables, data, batch_size, rows, max_degree,
                                  platforms)
        if typed:  # a typed model's views take their kernels from the model (`OnTypes`)
            program = dataclasses.replace(program, model=program.model.clone(kernels=XLA))
            art = _export_typed(program, variables, data, batch_size, platforms, seed_type)
            return art._replace(node_type=seed_type)
        return _export_one_type(program, variables, data, batch_size, platforms)
    except flax.errors.FlaxError as err:  # a parameter missing or of another shape
        line = str(err).strip().splitlines()[0]
        raise ValueError(f"the variables do not fit this program's model: {line}") from err
    except PastInt32 as err:  # the run fixed its fanouts and levels: the batch is left
        raise ValueError(f"{err.fact}: lower batch_size (now {batch_size:,}; the fanouts "
                         f"and the levels' layout are the run's)") from None


def _export_one_type(program: StepProgram, variables, data: DeviceData, batch_size: int,
                     platforms) -> ExportedModel:
    edges = program.sampler.edge_ids  # the views read the sampled edges' features
    caps = conservative(batch_size, program.sampler.slots, data.graph.num_nodes).capacities

    def infer(given: dict, seeds, valid, key):
        graph = CSRGraph(given["indptr"], given["indices"],
                         edge_features=given.get("edge_features"))
        device = DeviceData(graph, given["features"], None)  # inference reads no targets
        logits, _, _ = program.forward(variables, device, seeds, valid, key, caps,
                                       train=False)
        logits = _nan_past_degree(logits, graph.indptr, _degree_bound(program.sampler))
        return _nan_outside(logits, seeds, valid, data.graph.num_nodes)

    names = ("indptr", "indices", "features") + (("edge_features",) if edges else ())
    return _exported(infer, data, names, batch_size, platforms)


def _degree_bound(config: SamplerConfig, sampled=None) -> int | None:
    """The largest degree of a served graph (or relation) that `config`, resolved for the
    training graph's, samples as its fanouts say; None where any degree is. A hop taking
    every neighbour, and one whose fanout that degree cut (`hop_width`), have as many
    slots as the training graph's largest degree, and LABOR scans no more of a row.
    `sampled`: per hop, whether it is sampled at all (a typed relation's fanout 0)."""
    top = max(config.max_degree, 1)
    cut = [full or (not config.replace and config.method != "labor" and f == top)
           or (config.method == "labor" and config.labor_span(hop) == config.max_degree)
           for hop, (f, full) in enumerate(zip(config.fanouts, config.full))]
    sampled = sampled or (True,) * len(cut)
    return top if any(c and s for c, s in zip(cut, sampled)) else None


def _nan_past_degree(logits, indptr, bound: int | None) -> jax.Array:
    """`logits` all NaN where the served graph has a row longer than `bound`: its rows
    would come back cut to `bound` neighbours, unmarked."""
    if bound is None:
        return logits
    longest = jnp.max(indptr[1:] - indptr[:-1], initial=0)
    return jnp.where(longest > bound, jnp.nan, logits.astype(jnp.float32))


def _nan_outside(logits, seeds, valid, num_nodes: int) -> jax.Array:
    """float32 `logits`, the rows of valid seeds outside [0, num_nodes) NaN: the sampler
    clamps such an id to a node's, whose row would come back unmarked."""
    outside = valid & ((seeds < 0) | (seeds >= num_nodes))
    return jnp.where(outside[:, None], jnp.nan, logits.astype(jnp.float32))


def _exported(infer, data: DeviceData, names: tuple, batch_size: int, platforms):
    """`infer({name: array}, seeds, valid, key)` exported for the shapes of `data`'s
    arrays that `names` name, then the seeds, valid flags and key."""
    shapes = [jax.ShapeDtypeStruct(a.shape, a.dtype) for a in _lookup(data, names)]
    shapes += [jax.ShapeDtypeStruct((batch_size,), jnp.int32),
               jax.ShapeDtypeStruct((batch_size,), jnp.bool_),
               jax.ShapeDtypeStruct((), jnp.uint32)]

    def call(*args):
        return infer(dict(zip(names, args)), *args[len(names):])

    return ExportedModel(_lowered(call, shapes, platforms), batch_size,
                         names + ("seeds", "valid", "key"))


def _lowered(fn, shapes, platforms) -> jax.export.Exported:
    """`fn` jitted and exported for argument `shapes` and `platforms` (left out: this
    backend, by jax.export's name for it: "cuda", not "gpu")."""
    chosen = {"platforms": tuple(platforms)} if platforms else {}
    return jax.export.export(jax.jit(fn), disabled_checks=_PINS, **chosen)(*shapes)


def _export_typed(program: StepProgram, variables, data: DeviceData, batch_size: int,
                  platforms, seed_type: str) -> ExportedModel:
    """`export_model` for a typed graph's task (its docstring), seeds of `seed_type`:
    the typed sampler at the conservative envelope for `batch_size` seeds (tree sizes in
    tree mode)."""
    task, graph = program.task.for_seeds(seed_type), data.graph
    config = task.sampler
    envelope = (typed_conservative(config, seed_type, batch_size, graph.num_nodes)
                if config.dedup else typed_tree_sizes(config, seed_type, batch_size))
    relations = [relation_name(r) for r in graph.relations]
    names = tuple(f"{name}.{part}" for name, g in zip(relations, graph.graphs)
                  for part in ("indptr", "indices", "edge_features")
                  if part != "edge_features" or (config.edge_ids
                                                 and g.edge_features is not None))

    def infer(given: dict, seeds, valid, key):
        graphs = tuple(g._replace(indptr=given[f"{name}.indptr"],
                                  indices=given[f"{name}.indices"], weights=None,
                                  edge_features=given.get(f"{name}.edge_features"))
                       for name, g in zip(relations, graph.graphs))
        device = DeviceData(dataclasses.replace(graph, graphs=graphs), given["features"],
                            None)
        mb = sample_typed(device.graph, seeds, valid, key, config, envelope, XLA)
        logits, _ = program.apply_model(variables, device, task.sample_of(mb), train=False,
                                        inputs=task.model_inputs(device, mb))
        for relation, g in zip(graph.relations, graphs):
            sampled = [f > 0 for f in dict(config.fanouts)[relation]]
            bound = _degree_bound(config.relation_config(relation), sampled)
            logits = _nan_past_degree(logits, g.indptr, bound)
        return _nan_outside(logits, seeds, valid, graph.num_nodes[seed_type])

    return _exported(infer, data, names + ("features",), batch_size, platforms)


def _graph_rows(data: DeviceData, batch_size: int, max_nodes, max_edges) -> tuple[int, int]:
    """(node rows, edge rows) of a graph-level artifact: as given (checked), or
    `batch_size` times the collection's largest graph (all splits; at least one edge
    row: the artifact indexes its edge arrays)."""
    sizes = []
    for what, given, offsets in (("max_nodes", max_nodes, data.targets.node_offsets),
                                 ("max_edges", max_edges, data.targets.edge_offsets)):
        largest = int(np.diff(np.asarray(offsets)).max(initial=0))
        if given is None:
            given = max(batch_size * largest, 1)
            if given >= 2**31 - 1:
                raise ValueError(f"{batch_size} graphs a call of the collection's largest "
                                 f"need {given} rows, past int32: give {what}")
        elif not is_int(given):
            raise ValueError(f"{what} must be an integer, got {given!r}")
        if not 1 <= given < 2**31 - 1:
            raise ValueError(f"{what} must be in [1, 2**31 - 1), got {given}")
        if given < largest:  # (it serves new graphs: a warning, not a refusal)
            warnings.warn(f"{what} {given} is below the {largest} rows of the collection's "
                          f"largest graph: a call cannot take a graph that large",
                          LibraryWarning, stacklevel=user_stacklevel())
        sizes.append(int(given))
    return sizes[0], sizes[1]


def _incidence(ends: jax.Array, rows: int) -> tuple[jax.Array, jax.Array, jax.Array]:
    """(edge slots sorted by `ends` plus one unused entry, int32[rows + 2] offsets, each
    row's degree) of edges meeting node row `ends` (int32[E]; `rows` for no row), as
    `GraphTables` lists a collection's."""
    order = jnp.argsort(ends, stable=True).astype(jnp.int32)
    degree = jnp.zeros(rows + 1, jnp.int32).at[ends].add(1)
    ptr = jnp.concatenate([jnp.zeros(1, jnp.int32), jnp.cumsum(degree)])
    return jnp.append(order, jnp.int32(0)), ptr, degree[:rows]


def _unknown_ids(rows, vocab: tuple[int, ...], graph, batch_size: int) -> jax.Array:
    """bool[batch_size]: the graphs (`graph`: each row's graph; past the call's graphs
    for padding rows, which are dropped) with a categorical id outside [0, vocab) in one
    of its rows, or not a whole number: the encoder would read another column's
    embedding, or none, and give a plausible wrong output."""
    if not vocab:
        return jnp.zeros(batch_size, bool)
    ids = rows[:, :len(vocab)]
    wrong = (ids < 0) | (ids >= jnp.asarray(vocab, ids.dtype)) | (ids != jnp.floor(ids))
    return jnp.zeros(batch_size, bool).at[graph].max(wrong.any(axis=1), mode="drop")


def _export_graphs(program: StepProgram, variables, data: DeviceData, batch_size: int,
                   rows: tuple[int, int], max_degree: int | None,
                   platforms) -> ExportedModel:
    """`export_model` for a graph-level task (its docstring): the call's B graphs packed
    as a step packs them (`pack_graphs`), summed by scatter-adds, or by gathers over
    `max_degree` listed edges a node."""
    if program.embedding is not None:
        raise ValueError("export_model does not serve graph-level models with learnable "
                         "node rows")
    task = dataclasses.replace(program.task,
                               aggregation="segment" if max_degree is None else "ell")
    program = dataclasses.replace(program, task=task)
    max_nodes, max_edges = rows
    edge_table = data.targets.edge_features
    names = tuple(n for n in GRAPH_ARGUMENTS if n != "edge_features" or edge_table is not None)
    width = data.features.shape[1]
    shapes = {"node_features": jax.ShapeDtypeStruct((max_nodes, width), data.features.dtype),
              "senders": jax.ShapeDtypeStruct((max_edges,), jnp.int32),
              "receivers": jax.ShapeDtypeStruct((max_edges,), jnp.int32),
              "n_node": jax.ShapeDtypeStruct((batch_size,), jnp.int32),
              "n_edge": jax.ShapeDtypeStruct((batch_size,), jnp.int32)}
    if edge_table is not None:
        shapes["edge_features"] = jax.ShapeDtypeStruct((max_edges, edge_table.shape[1]),
                                                       edge_table.dtype)

    def infer(*args):
        given = dict(zip(names, args))
        n_node, n_edge = given["n_node"], given["n_edge"]
        offsets = lambda c: jnp.concatenate([jnp.zeros(1, jnp.int32), jnp.cumsum(c)])
        no, eo = offsets(n_node), offsets(n_edge)
        # counts that are negative, or whose running sums pass the rows or wrap int32
        broken = (jnp.any(n_node < 0) | jnp.any(n_edge < 0) | jnp.any(no[1:] < no[:-1])
                  | jnp.any(eo[1:] < eo[:-1]) | (no[-1] > max_nodes) | (eo[-1] > max_edges))
        # an edge slot's graph, and whether both its ends lie in that graph
        slot = jnp.arange(max_edges, dtype=jnp.int32)
        g = jnp.minimum(jnp.searchsorted(eo[1:], slot, side="right"), batch_size - 1)
        outside = lambda e: (e < 0) | (e >= n_node[g])
        bad = (slot < eo[-1]) & (outside(given["senders"]) | outside(given["receivers"]))
        # a node row's graph; rows past the call's nodes name none (batch_size: dropped)
        node_graph = jnp.searchsorted(no[1:], jnp.arange(max_nodes), side="right")
        zeros = jnp.zeros(1, jnp.int32)
        lists, too_wide = (zeros,) * 4, jnp.zeros(batch_size, bool)
        if max_degree is not None:  # each node's edges listed, as GraphTables holds them
            node_row = lambda e: jnp.where((slot < eo[-1]) & ~bad, e + no[g], max_nodes)
            by_r, ptr_r, deg_r = _incidence(node_row(given["receivers"]), max_nodes)
            by_s, ptr_s, deg_s = _incidence(node_row(given["senders"]), max_nodes)
            lists = (by_r, by_s, ptr_r, ptr_s)
            wide = jnp.maximum(deg_r, deg_s) > max_degree
            too_wide = jnp.zeros(batch_size, bool).at[node_graph].max(wide, mode="drop")
        # per-graph degrees are checked above; pack_graphs' own check would fail the call
        tables = GraphTables(no, eo, given["senders"], given["receivers"],
                             given.get("edge_features"), jnp.zeros(batch_size, jnp.float32),
                             *lists, jnp.zeros(batch_size, jnp.int32))
        ids = jnp.arange(batch_size, dtype=jnp.int32)
        gb = pack_graphs(tables, ids, jnp.ones(batch_size, bool), max_nodes + 1, max_edges,
                         max_degree)
        # a bad edge joins no graph (packed, its end would be another graph's node): it
        # becomes a padding edge, and its own graph's row NaN below
        pad = max_nodes
        gb = gb._replace(edge_mask=gb.edge_mask & ~bad,
                         senders=jnp.where(bad, pad, gb.senders),
                         receivers=jnp.where(bad, pad, gb.receivers))
        device = DeviceData(CSRGraph(jnp.zeros(2, jnp.int32), jnp.zeros(1, jnp.int32)),
                            given["node_features"], tables)
        out, _ = program.apply_model(variables, device, gb, train=False,
                                     inputs={"graph": gb, "edges": edge_rows(tables, gb)})
        out = out[:-1].astype(jnp.float32)
        unknown = _unknown_ids(given["node_features"], task.node_vocab, node_graph,
                               batch_size)
        if edge_table is not None:
            unknown |= _unknown_ids(given["edge_features"], task.edge_vocab,
                                    jnp.where(slot < eo[-1], g, batch_size), batch_size)
        bad_graph = jnp.zeros(batch_size, bool).at[g].max(bad) | too_wide | unknown
        return jnp.where((bad_graph | broken)[:, None], jnp.nan, out)

    return ExportedModel(_lowered(infer, [shapes[n] for n in names], platforms), batch_size,
                         names)
