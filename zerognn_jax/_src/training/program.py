"""What a training step is made of: the device data, the carried state, the step program.

`StepProgram` is a frozen, pure description (model, optimizer, sampler, batch, kernels,
data parallelism); the engines (scan.py, host.py) drive it and own their compile caches.
"""

from __future__ import annotations

import dataclasses
import weakref
from typing import Any, NamedTuple

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax

from zerognn_jax._src.data.graph import CSRGraph, take_edge_rows
from zerognn_jax._src.nn.views import EllView
from zerognn_jax._src.ops.gather import gather_rows
from zerognn_jax._src.ops.registry import XLA, Kernels, given_kernels
from zerognn_jax._src.sampling.envelope import Envelope, grow
from zerognn_jax._src.sampling.minibatch import MiniBatch, SamplerConfig, sample_minibatch
from zerognn_jax._src.sampling.seeds import epoch_items
from zerognn_jax._src.sampling.steps import sample_step
from zerognn_jax._src.training.embeddings import NodeEmbedding
from zerognn_jax._src.training.layout import Layout
from zerognn_jax._src.training.parallel import DataParallel
from zerognn_jax._src.training.placement import Placement
from zerognn_jax._src.training.tasks.base import BatchedTask, Task, TaskBatch
from zerognn_jax._src.training.tasks.node import NodeTask


class DeviceData(NamedTuple):
    """Everything a step reads, on the device: graph (with its edge-feature table when
    the model reads one), float[N, d] features, and the task's targets
    (`Task.device_targets`: for node tasks int32[N] class ids, or float[N, ...]
    multi-label or regression targets; a pytree of such arrays is fine)."""

    graph: CSRGraph
    features: jax.Array
    targets: jax.Array


class TrainState(NamedTuple):
    """The scan carry.

    Attributes:
      params, batch_stats: model variables; opt_state: optax state.
      overflowed: bool scalar, a step of this chunk overflowed (no updates since).
      failed_step: int32 scalar, the first step that overflowed (valid if overflowed).
      embedding: float[N, dim], the learnable node embedding (`StepProgram.embedding`;
        a typed task's featureless types stacked), or None; embedding_opt: its lazy
        Adam state (row_adam.py), or None.
    """

    params: Any
    batch_stats: Any
    opt_state: Any
    overflowed: jax.Array
    failed_step: jax.Array
    embedding: Any = None
    embedding_opt: Any = None


def require_live(state: TrainState) -> None:
    """ValueError for a state an engine's epoch consumed: its arrays are donated to the
    epoch's program, which updates them in place (JAX's own error named no cause)."""
    if any(isinstance(leaf, jax.Array) and leaf.is_deleted()
           for leaf in jax.tree_util.tree_leaves(state)):
        raise ValueError("the state's arrays were consumed by an earlier run_epoch (the "
                         "engines donate the state they are given and update it in "
                         "place): pass that call's result.state, or give each call a copy, "
                         "jax.tree_util.tree_map(jnp.copy, state)")


def require_rows(data: DeviceData) -> None:
    """ValueError for a feature table with fewer rows than the graph has nodes: a step
    reads a missing row as zeros (the gather's rule for ids out of range), so such a
    table trained without an error. (More rows are a table split over devices, padded.)"""
    nodes, table = getattr(data.graph, "num_nodes", None), data.features
    if isinstance(nodes, int) and getattr(table, "ndim", 0) == 2 and table.shape[0] < nodes:
        raise ValueError(f"data.features must have one row per node of data.graph "
                         f"({nodes}), got shape {tuple(table.shape)}")


def views_for(mb: MiniBatch, kernels: Kernels | str = XLA,
              positional: tuple[bool, ...] = (), *,
              inference: bool = False, edge_table: jax.Array | None = None
              ) -> tuple[EllView, ...]:
    """One EllView per layer, outermost hop first (layer i reads block L - 1 - i).

    `positional` (per hop, seeds' hop first: `SamplerConfig.positional`) marks the hops
    whose levels hold their slots in order, which the views then read by position;
    left out, every view gathers (the same values, more work). `inference`: the views
    serve a forward pass that is not differentiated (`EllView.pin_aggregates`).
    `edge_table` (float[E, D]): each view's `edge_attr` holds its block's rows of it
    (zero in dead slots); the blocks must carry edge ids (`SamplerConfig.edge_ids`).
    Each view's `node_ids` are its source level's global ids."""
    kernels = given_kernels(kernels)
    num_hops = len(mb.blocks)
    flat = tuple(positional) or (False,) * num_hops
    views = []
    for i in range(num_hops):
        hop = num_hops - 1 - i
        block = mb.blocks[hop]
        views.append(EllView(block.nbr, block.mask, mb.valid[hop], mb.degrees[hop],
                             mb.degrees[hop + 1], kernels, flat[hop], inference,
                             block_edge_rows(edge_table, block), mb.nodes[hop + 1]))
    return tuple(views)


def block_edge_rows(table, block):
    """[C, K, D]: the block's slots' rows of the edge table (zero where masked), or None
    without a table."""
    if table is None:
        return None
    if block.eid is None:
        raise ValueError("views with edge features need blocks with edge ids: sample with "
                         "SamplerConfig(edge_ids=True)")
    rows = take_edge_rows(table, block.eid)
    return jnp.where(block.mask[..., None], rows, jnp.zeros((), rows.dtype))


@dataclasses.dataclass(frozen=True, eq=False)
class StepProgram:
    """The pieces a step needs that are not arrays; hashable by identity (a static argument).

    Attributes:
      model: a Flax module with the interface of `nn/models.py`: `model(x, views, *,
        train, **task_inputs)` gives one output row per level-0 node.
      tx: the optax optimizer.
      sampler: what to sample (resolved: no -1 fanouts).
      batch_size: seeds per step and device. seed: the run's seed.
      kernels: the implementation of every op.
      parallel: data parallelism over a mesh (`with_mesh`), or None for one device.
      task: what is learned: level 0, targets, loss and score of a step
        (tasks/base.py's `Task`).
      layout: how `sampler`'s level layout was chosen (layout.py), for the run's
        summary; None for a program built by hand, or one that samples no neighbours.
      placement: where the feature table went and why (placement.py), for the run's
        summary; None for a program built by hand.
      embedding: a learnable node embedding the model reads after the features
        (embeddings.py), or None.
      self_loops_dropped: the graph the steps sample lost its self-loops (the built-in
        gcn and gat add each node's own term themselves): so must another graph the
        model is applied to (`zg.predict(..., dataset=)`).
    """

    model: nn.Module
    tx: optax.GradientTransformation
    sampler: SamplerConfig
    batch_size: int
    seed: int
    kernels: Kernels = XLA
    parallel: DataParallel | None = None
    task: Task = dataclasses.field(default_factory=NodeTask)
    layout: Layout | None = None
    embedding: NodeEmbedding | None = None
    placement: Placement | None = None
    self_loops_dropped: bool = False

    def __post_init__(self):
        safe_for = getattr(self.task, "safe_for", None)  # optional (`Task`)
        if safe_for is not None:  # e.g. a program whose sampler was replaced
            object.__setattr__(self, "task", safe_for(self.sampler))

    @property
    def num_shards(self) -> int:
        return 1 if self.parallel is None else self.parallel.size

    @property
    def global_batch(self) -> int:
        """Seeds per step over all data-parallel shards."""
        return self.batch_size * self.num_shards

    def with_mesh(self, mesh: jax.sharding.Mesh | None, *,
                  shard_features: bool = False) -> StepProgram:
        """This program run data parallel over `mesh` (per-device batch unchanged), or on
        one device with `mesh=None`. The global batch becomes `batch_size * mesh.size`."""
        dp = None if mesh is None else DataParallel(mesh, shard_features)
        return dataclasses.replace(self, parallel=dp)

    def forward(self, variables, data: DeviceData, seeds, valid, key, capacities, *,
                train: bool, dropout_key=None):
        """Samples around the nodes `seeds` and runs the model (no task inputs); returns
        (outputs, new_vars, minibatch)."""
        mb = sample_minibatch(data.graph, seeds, valid, key, self.sampler, capacities,
                              self.kernels)
        logits, new_vars = self.apply_model(variables, data, mb, train=train,
                                            dropout_key=dropout_key)
        return logits, new_vars, mb

    def model_input(self, variables, data: DeviceData, mb: MiniBatch,
                    embedded=None, *, in_mesh: bool = True, rows=None):
        """float[S_L, d (+ dim)]: the outermost level's feature rows, followed by their
        embedding rows with an embedding (`embedded`, if given, else gathered from
        `variables["embedding"]`; `NodeEmbedding.join` puts the two together, or hands
        the built-in GNN the pair (float[S_L, d], float[S_L, dim])). A typed
        sample's rows come one array per type, (float[S_t, d], ...), and with an
        embedding the pair (that, the packed embedding rows). Split features are gathered
        across the mesh inside its program only (`in_mesh`); outside it, the whole table
        is addressable. `rows`, if given, are the feature rows, read already."""
        split = in_mesh and self.parallel is not None and self.parallel.shard_features
        gather = self.parallel.gather_rows if split else gather_rows
        # one id array, or a typed sample's one per type: each gathered into its own rows
        with jax.named_scope("features"):
            x = rows if rows is not None else jax.tree_util.tree_map(
                lambda i, v: gather(self.kernels, data.features, i, v), mb.nodes[-1],
                mb.valid[-1])
        if self.embedding is None:
            return x
        if embedded is None:
            embedded = self.embedding.rows(self.kernels, variables["embedding"],
                                           *self.embedding.ids(mb))
        return self.embedding.join(x, embedded)

    def views(self, data: DeviceData, mb: MiniBatch, *, inference: bool):
        """The model's views of `mb` (`views_for`), with the graph's edge features when
        the sampler gives edge ids."""
        table = data.graph.edge_features if self.sampler.edge_ids else None
        return views_for(mb, self.kernels, self.sampler.positional, inference=inference,
                         edge_table=table)

    def apply_model(self, variables, data: DeviceData, mb: MiniBatch, *, train: bool,
                    dropout_key=None, inputs=None, embedded=None, rows=None):
        """Gathers the outermost level's features and runs the model; (outputs, new_vars).

        `inputs` are the task's extra model inputs (`TaskBatch.model_inputs`);
        `embedded` the level's embedding rows and `rows` its feature rows, if read
        already (`model_input`).

        Shapes follow `mb`: the scan engine passes envelope-sized levels, the host
        engine levels cut to their real or bucketed sizes.
        """
        x = self.model_input(variables, data, mb, embedded, rows=rows)
        variables = {k: v for k, v in variables.items() if k != "embedding"}
        mutable = ["batch_stats"] if train and variables.get("batch_stats") else False
        rngs = {"dropout": dropout_key} if train else {}
        views = self.views(data, mb, inference=not train)
        out = self.model.apply(variables, x, views, train=train, rngs=rngs, mutable=mutable,
                               **(inputs or {}))
        return out if mutable else (out, {})


# The objects `kept_replace` made, per object they were made from.
_KEPT: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def kept_replace(obj, **changes):
    """`dataclasses.replace(obj, **changes)`, the same object for the same changes
    while `obj` lives, and `obj` itself where they change nothing: a program (or a
    task, part of one) is a static argument compared by identity, and a new one each
    call compiled every pass again (a run's model over other graphs: inductive.py)."""
    if all(getattr(obj, name) == value for name, value in changes.items()):
        return obj
    kept = _KEPT.setdefault(obj, {})
    key = tuple(sorted(changes.items()))
    if key not in kept:
        kept[key] = dataclasses.replace(obj, **changes)
    return kept[key]


class TaskSample(NamedTuple):
    """One step's sample, before the model.

    Attributes:
      batch: the task's batch; mb: its sampled minibatch (restricted by the task);
      drop_key: the step's dropout key.
    """

    batch: TaskBatch
    mb: MiniBatch
    drop_key: jax.Array


def sample_batch(program: StepProgram, data: DeviceData, perm, batch_index, epoch,
                 envelope: Envelope, active=None) -> TaskSample:
    """Batch `batch_index` of the epoch's shuffled items `perm`: its level 0 and sampled
    minibatch (`steps.sample_step`, the task as the seed source), and the task's batch.

    `active` (bool, optional) masks every item of a padding step. A `BatchedTask`
    (graph batches) builds the whole sample itself.
    """
    task = program.task
    with jax.named_scope("sample"):  # the phases a profile reads (bench/profiling.py)
        if isinstance(task, BatchedTask):
            return TaskSample(*task.sample_batch(program, data, perm, batch_index, epoch,
                                                 envelope, active))
        step = sample_step(data.graph, perm, batch_index, seed=program.seed, epoch=epoch,
                           batch_size=program.batch_size, config=program.sampler,
                           envelope=envelope, kernels=program.kernels, source=task,
                           active=active)
        batch = task.batch(data, step.items, step.valid, step.key, step.level)
    with jax.named_scope("restrict"):
        mb = task.restrict(step.mb, batch)
    return TaskSample(batch, mb, step.drop_key)


def grown_envelope(program: StepProgram, envelope, counts, policy, graph):
    """The envelope after a step on `graph` overflowed `envelope` with `counts` (its
    sample's): `grow` with no level above the graph's node count, fitted to the
    sampler; a `BatchedTask` grows its own envelope."""
    if isinstance(program.task, BatchedTask):
        return program.task.grow_envelope(program, envelope, counts, policy, graph)
    return program.sampler.fit_envelope(grow(envelope, counts, policy,
                                             num_nodes=graph.num_nodes))


def saved_envelope(program: StepProgram, saved: dict):
    """The envelope a checkpoint recorded ({"batch_size", "capacities"}), fitted."""
    if isinstance(program.task, BatchedTask):
        return program.task.envelope_from(program, saved)
    return program.sampler.fit_envelope(Envelope(saved["batch_size"],
                                                 tuple(saved["capacities"])))


class OptimizerInitError(ValueError):
    """The optimizer's `init` failed on the model's parameters (`init_state`): a
    transformation whose labels or mask name no parameter, say."""


class CollectionsError(ValueError):
    """The model made variables in collections training does not carry (`init_state`):
    they were dropped, and its first use of one failed inside Flax."""


def init_state(program: StepProgram, data: DeviceData, envelope: Envelope,
               items) -> TrainState:
    """Initialises model variables on a real first batch of the task's training `items`,
    and the optimizer.

    With a mesh the state comes back replicated on it.
    """
    perm = epoch_items(jnp.asarray(items, jnp.int32), program.global_batch, program.seed, 0)

    embedding, embedding_opt = (None, None) if program.embedding is None else \
        program.embedding.init(program.embedding.num_rows(data.graph), program.seed)

    def init(data, perm, embedding):
        batch, mb, _ = sample_batch(program, data, perm, 0, 0, envelope)
        x = program.model_input({"embedding": embedding}, data, mb, in_mesh=False)
        init_key = jax.random.PRNGKey(program.seed)
        variables = program.model.init({"params": init_key, "dropout": init_key}, x,
                                       program.views(data, mb, inference=False),
                                       train=False,
                                       **batch.model_inputs)
        # in the same program: eagerly, each state leaf of the optimizer compiled apart
        try:
            return variables, program.tx.init(variables["params"])
        except Exception as err:  # noqa: BLE001 - the optimizer's, not the model's
            lines = str(err).strip().splitlines()
            raise OptimizerInitError(f"the optimizer fails to start on the model's "
                                     f"parameters: {type(err).__name__}: "
                                     f"{lines[0] if lines else ''}") from err

    variables, opt_state = jax.jit(init)(data, perm, embedding)
    if extra := sorted(set(variables) - {"params", "batch_stats"}):
        raise CollectionsError(f"the model keeps variables in the collection"
                               f"{'s' if len(extra) > 1 else ''} "
                               f"{', '.join(map(repr, extra))}; training carries 'params' "
                               f"(trained; NNX's nnx.Param) and 'batch_stats' (updated by "
                               f"the model; NNX's nnx.BatchStat) only: keep its state in "
                               f"those")
    state = TrainState(variables["params"], variables.get("batch_stats", {}), opt_state,
                       jnp.array(False), jnp.array(0, jnp.int32), embedding, embedding_opt)
    if program.parallel is not None:
        return program.parallel.replicate(state)
    # committed to its device, as a state restored from a checkpoint is: a resumed run
    # then lowers the same chunk program and finds it in JAX's compilation cache
    leaves = jax.tree_util.tree_leaves(variables)
    device, = (leaves[0] if leaves else state.overflowed).devices()
    return jax.device_put(state, device)
