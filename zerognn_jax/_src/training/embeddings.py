"""Learnable node embeddings: a float[N, dim] table trained row-sparsely inside the scan.

The table is part of the train state (`TrainState.embedding`, with its lazy Adam state
in `TrainState.embedding_opt`), not of the model's parameters: the optimizer of the
parameters (dense Adam over every leaf) never sees it. A step gathers the rows of its
outermost level, the model reads them after the node's features (concatenated, or as
the pair (features, rows) that the built-in GNN aggregates apart: `NodeEmbedding.apart`),
and the gradient of those rows goes through `row_adam_update` (row_adam.py): only the rows the
step read, and their moments, are written. A typed run's featureless types share the
machinery as one stacked table (`TypedEmbedding`, tasks/typed_node.py), which says
through `num_rows`, `ids` and `join` how many rows it has, which a step reads and how
they reach the model.

With data parallelism the table is replicated, every device updating its copy with the
rows and gradients of all devices (one all-gather of ids and gradient rows per step), so
the copies stay equal. Replicas cost N x dim x 12 bytes per device (table plus two
float32 moments); sharding the rows by owner would save that at the price of an
all-to-all of row requests and of gradients each step, which pays only for tables far
larger than the features themselves.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from zerognn_jax._src.ops.gather import gather_rows
from zerognn_jax._src.ops.registry import Kernels
from zerognn_jax._src.training.row_adam import RowAdamState, row_adam_init, row_adam_update
from zerognn_jax._src.training.schedule import StepSize, peak_rate

# The table's initial values: normal with this standard deviation, a scale comparable to
# standardised input features.
INIT_STD = 0.1


@dataclasses.dataclass(frozen=True)
class NodeEmbedding:
    """What a run's node embedding is; static (hashable).

    Attributes:
      dim: the table's width. lr: lazy Adam's step size (a number, or the run's
        `schedule.StepSize`: the rows follow the parameters' rate). dtype: the table's storage
        dtype ("float32" or "bfloat16"; the moments are float32).
      apart: `join` hands the model the pair (features, embedding rows) rather than
        their concatenation (the built-in `GNN`, which aggregates them apart).
    """

    dim: int
    lr: float | StepSize
    dtype: str = "float32"
    apart: bool = False

    def __post_init__(self):
        if self.dim < 1 or not peak_rate(self.lr) > 0:
            raise ValueError(f"a node embedding needs dim >= 1 and lr > 0, got dim "
                             f"{self.dim}, lr {self.lr}")

    def init(self, num_nodes: int, seed: int) -> tuple[jax.Array, RowAdamState]:
        """(table float[num_nodes, dim], its zero lazy Adam state)."""
        key = jax.random.fold_in(jax.random.PRNGKey(seed), 0x454D42)  # "EMB"
        table = (INIT_STD * jax.random.normal(key, (num_nodes, self.dim), jnp.float32))
        table = table.astype(self.dtype)
        return table, row_adam_init(table)

    def num_rows(self, graph) -> int:
        """The table's rows for the run's graph: one per node."""
        return graph.num_nodes

    def ids(self, mb) -> tuple[jax.Array, jax.Array]:
        """(int32[R] table rows, bool[R] valid) a step reads: its outermost level's nodes."""
        return mb.nodes[-1], mb.valid[-1]

    def join(self, x: jax.Array, embedded: jax.Array):
        """The model's input from the level's feature rows `x` and their embedding rows:
        float[S, d + dim], each node's embedding after its features; with `apart`, the
        two blocks as a pair (float[S, d], float[S, dim]) in `x`'s dtype."""
        embedded = embedded.astype(x.dtype)
        return (x, embedded) if self.apart else jnp.concatenate([x, embedded], axis=1)

    def rows(self, kernels: Kernels, table: jax.Array, ids, valid) -> jax.Array:
        """float[C, dim]: the rows `ids` (zero where not `valid`)."""
        return gather_rows(kernels, table, ids, valid)

    def update(self, table: jax.Array, opt: RowAdamState, ids, grads, valid, *,
               unique: bool, repeats: int | None = None, taken=True,
               kernels: Kernels | None = None) -> tuple[jax.Array, RowAdamState]:
        """One lazy Adam step on the rows `ids` with gradient rows `grads` (`unique`: the
        valid ids are known to be distinct, so no sort merges repeats; `repeats`: each
        appears at most that many times; `taken`: the step counts, else nothing
        changes, when no row is valid; `kernels`: who runs the row update, op
        "row_adam")."""
        return row_adam_update(table, opt, ids, grads, valid, lr=self.lr, unique=unique,
                               repeats=repeats, taken=taken, kernels=kernels)
