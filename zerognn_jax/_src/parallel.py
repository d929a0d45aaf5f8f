"""Data parallelism over a device mesh, on one host or several.

One chunk program spans every device of a 1-D mesh (axis "data") through
`jax.shard_map`: the graph, labels, model and optimizer state are replicated, each
device samples its own seeds (the engine's `_step` picks them by `lax.axis_index`) and
gradients are averaged inside the scan. Optionally the feature table is split by rows
across the mesh (`shard_features`); a step then fetches the rows it needs from their
owners with one all-gather of ids and one reduce-scatter of rows.

Several hosts run the same program: each process calls `initialize_distributed` before
JAX starts its backends, and the mesh takes the same number of devices from each.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import AxisType, Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from zerognn_jax._src import kernels as kernels_lib

AXIS = "data"


def initialize_distributed(coordinator: str | None, num_processes: int | None = None,
                           process_id: int | None = None, *, timeout_s: int = 300) -> bool:
    """Joins JAX's distributed runtime; must run before anything touches a JAX backend.

    Args:
      coordinator: "host:port" of process 0's coordinator, "auto" to let JAX detect the
        cluster (SLURM, Open MPI, ...), or None for a single-process run (no-op).
      num_processes, process_id: required with an explicit address.
      timeout_s: how long to wait for every process to connect.

    Returns:
      True if the runtime was initialised.
    """
    if coordinator is None:
        return False
    if coordinator == "auto":
        jax.distributed.initialize(initialization_timeout=timeout_s)
        return True
    if num_processes is None or process_id is None:
        raise ValueError(f"--coordinator {coordinator} needs --num-processes and --process-id "
                         f"(got {num_processes} and {process_id})")
    if not 0 <= process_id < num_processes:
        raise ValueError(f"--process-id {process_id} must lie in [0, {num_processes})")
    jax.distributed.initialize(coordinator, num_processes, process_id,
                               initialization_timeout=timeout_s)
    return True


def make_mesh(devices: int = 0) -> Mesh:
    """A 1-D mesh named "data": the first `devices` local devices of every process.

    `devices=0` takes all local devices. Every process must pass the same number.
    """
    local = jax.local_device_count()
    if not 0 <= devices <= local:
        raise ValueError(f"--devices {devices} must lie in [0, {local}]: this process has "
                         f"{local} local {jax.default_backend()} device(s) (0 = all of them)")
    per_process = devices or local
    by_process: dict[int, list] = {}
    for device in jax.devices():
        by_process.setdefault(device.process_index, []).append(device)
    picked = [d for p in sorted(by_process) for d in by_process[p][:per_process]]
    return jax.make_mesh((len(picked),), (AXIS,), axis_types=(AxisType.Auto,), devices=picked)


def data_parallel(program, mesh: Mesh, *, shard_features: bool = False):
    """`program` (a StepProgram) run over `mesh`: per-device batch unchanged.

    The global batch becomes `program.batch_size * mesh.size`.
    """
    return dataclasses.replace(program, axis_name=AXIS, num_shards=mesh.size, mesh=mesh,
                               shard_features=shard_features)


@functools.cache
def eval_view(program):
    """The program for plain jitted code outside the mesh (evaluation): gathers unsplit.

    A row-sharded feature table is still readable there: XLA's partitioner moves rows.
    Cached, so evaluation programs keyed on the program compile once.
    """
    return dataclasses.replace(program, shard_features=False) if program.shard_features \
        else program


def replicated(mesh: Mesh) -> NamedSharding:
    return NamedSharding(mesh, P())


def row_sharded(mesh: Mesh) -> NamedSharding:
    return NamedSharding(mesh, P(AXIS, None))


def replicate(tree, mesh: Mesh):
    """Every leaf of `tree` copied to every device of `mesh` (no-op where already so)."""
    return jax.device_put(tree, replicated(mesh))


def padded_rows(num_rows: int, mesh: Mesh) -> int:
    """`num_rows` rounded up to a multiple of the mesh size."""
    return -(-num_rows // mesh.size) * mesh.size


def shard_rows(table, mesh: Mesh) -> jax.Array:
    """float[N', d], N' = `padded_rows(N)`: row block k lives on device k; padding is zero.

    Built block by block from host memory, so the whole table never sits on one device
    (a NumPy memmap is read only where this process's devices need it).
    """
    if isinstance(table, jax.Array) and _placed(table, row_sharded(mesh)) \
            and table.shape[0] % mesh.size == 0:
        return table
    host = np.asarray(table)
    n, dim = host.shape
    rows = padded_rows(n, mesh)

    def block(index) -> np.ndarray:
        start, stop, _ = index[0].indices(rows)
        out = np.zeros((stop - start, dim), host.dtype)
        take = host[start:min(stop, n)]
        out[: take.shape[0]] = take
        return out

    return jax.make_array_from_callback((rows, dim), row_sharded(mesh), block)


def place_data(data, program):
    """DeviceData on `program.mesh`: graph and labels replicated, features per program."""
    mesh = program.mesh
    if mesh is None:
        raise ValueError("place_data needs a data-parallel program (see data_parallel)")
    features = shard_rows(data.features, mesh) if program.shard_features \
        else replicate(data.features, mesh)
    return type(data)(replicate(data.graph, mesh), features, replicate(data.labels, mesh))


def data_specs(data, program):
    """shard_map specs for DeviceData: everything P() but row-sharded features."""
    return type(data)(P(), P(AXIS, None) if program.shard_features else P(), P())


def _placed(x, sharding: NamedSharding) -> bool:
    return isinstance(x, jax.Array) and x.sharding.is_equivalent_to(sharding, x.ndim)


def check_placed(data, program) -> None:
    """Raises ValueError unless `data` is laid out as `place_data` lays it out."""
    mesh = program.mesh
    want = type(data)(jax.tree_util.tree_map(lambda _: replicated(mesh), data.graph),
                      row_sharded(mesh) if program.shard_features else replicated(mesh),
                      replicated(mesh))
    for (path, leaf), sharding in zip(jax.tree_util.tree_leaves_with_path(data),
                                      jax.tree_util.tree_leaves(want)):
        if not _placed(leaf, sharding):
            where = jax.tree_util.keystr(path)
            raise ValueError(f"data{where} is not laid out on the program's {mesh.size}-device "
                             f"mesh as {sharding.spec}; call parallel.place_data(data, program) "
                             "once before training")
    if program.shard_features and data.features.shape[0] % mesh.size:
        raise ValueError(f"row-sharded features have {data.features.shape[0]} rows, not a "
                         f"multiple of {mesh.size} devices; use parallel.shard_rows")


def place_args(program, args: tuple) -> tuple:
    """Chunk arguments `(state, data, perm, epoch, start, num_steps)` on the mesh.

    The data must already be placed (checked; moving it every chunk would be slow).
    """
    state, data, *rest = args
    check_placed(data, program)
    return (replicate(state, program.mesh), data, *replicate(tuple(rest), program.mesh))


def shard_chunk(run, program, data):
    """`run(state, data, perm, epoch, start, num_steps)` as one SPMD program on the mesh.

    `check_vma=False` keeps pmap's autodiff semantics, which the step relies on: the
    gradient of replicated parameters is each device's own, averaged by an explicit
    `pmean`. (With the check on, JAX would already sum it over devices in the transpose.)
    """
    specs = (P(), data_specs(data, program), P(), P(), P(), P())
    return jax.shard_map(run, mesh=program.mesh, in_specs=specs, out_specs=P(),
                         check_vma=False)


def gather_sharded_rows(kernels: kernels_lib.Kernels, local: jax.Array, ids: jax.Array,
                        valid: jax.Array, axis_name: str) -> jax.Array:
    """float[C, d]: rows `ids` of a table split by rows over `axis_name` (inside shard_map).

    Args:
      local: float[R, d], this device's rows [k R, (k + 1) R) of the table.
      ids: int32[C], global row ids; valid: bool[C] (invalid rows come back zero).

    Every device gathers, for the ids of all D devices (int32[D C], one all-gather), the
    rows it owns (zero elsewhere), and a reduce-scatter hands each device the sum over
    owners of its own C rows: exactly one owner is non-zero, so the rows are exact.
    """
    rows = local.shape[0]
    wanted = jax.lax.all_gather(jnp.where(valid, ids, -1), axis_name, tiled=True)
    pos = wanted - jax.lax.axis_index(axis_name) * rows
    mine = (pos >= 0) & (pos < rows)
    found = kernels_lib.gather_rows(kernels, local, jnp.where(mine, pos, 0), mine)
    return jax.lax.psum_scatter(found, axis_name, scatter_dimension=0, tiled=True)
