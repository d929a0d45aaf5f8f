"""Data parallelism over a device mesh, on one host or several.

One chunk program spans every device of a 1-D mesh (axis "data") through
`jax.shard_map`: the graph, labels, model and optimizer state are replicated, each
device samples its own seeds (`DataParallel.batch_index`) and gradients are averaged
inside the scan. A `StepProgram` holds a `DataParallel` (`StepProgram.with_mesh`); this
module knows nothing of programs or engines, only meshes and arrays. Optionally the
feature table is split by rows across the mesh (`shard_features`); a step then fetches
the rows it needs from their owners with one all-gather of ids and one reduce-scatter
of rows.

How a step talks between devices is a `Collectives` choice: by default one all-reduce
per step carries the gradients, the batch statistics, the step's target weight and the
overflow flag as one flat buffer, and each device's metrics come back to the host as
scan outputs, summed there once per chunk (docs/multi_gpu.md).

Several hosts run the same program: each process calls `initialize_distributed` before
JAX starts its backends, and the mesh takes the same number of devices from each.
"""

from __future__ import annotations

import dataclasses
import hashlib
import signal
import socket
import threading

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import AxisType, Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from zerognn_jax._src.data.checks import is_int
from zerognn_jax._src.ops.gather import gather_rows
from zerognn_jax._src.ops.registry import Kernels

AXIS = "data"


JOIN_TIMEOUT_S = 300  # how long joining waits for every process of a run, by default


def initialize_distributed(coordinator: str | None, num_processes: int | None = None,
                           process_id: int | None = None, *,
                           timeout_s: int = JOIN_TIMEOUT_S) -> bool:
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
        if num_processes is not None or process_id is not None:
            given = " and ".join(f"{flag} {value}" for flag, value in (
                ("--num-processes", num_processes), ("--process-id", process_id))
                if value is not None)
            raise ValueError(f"{given} join{'s' * (' and ' not in given)} a run over several "
                             f"processes only with --coordinator (or $JAX_COORDINATOR_ADDRESS)")
        return False
    if coordinator == "auto":
        try:
            _keeping_sigterm(lambda: jax.distributed.initialize(
                initialization_timeout=timeout_s))
        except ValueError as err:  # no scheduler's environment to take the address from
            raise ValueError(f"--coordinator auto takes the cluster from its scheduler's "
                             f"environment (SLURM, Open MPI, Kubernetes), and JAX found none "
                             f"here ({err}); give --coordinator HOST:PORT with "
                             f"--num-processes and --process-id") from err
        return True
    if num_processes is None or process_id is None:
        raise ValueError(f"--coordinator {coordinator} needs --num-processes and --process-id "
                         f"(got {num_processes} and {process_id})")
    if num_processes < 1:
        raise ValueError(f"--num-processes must be >= 1, got {num_processes}")
    if not 0 <= process_id < num_processes:
        raise ValueError(f"--process-id {process_id} must lie in [0, {num_processes})")
    host, _, port = coordinator.rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:  # (JAX: IndexError)
        raise ValueError(f"--coordinator {coordinator!r} must be HOST:PORT (process 0's "
                         f"address and a free port on it, as 10.0.0.1:9000) or 'auto'")
    if process_id == 0:
        _require_free_port(coordinator, int(port))
    _keeping_sigterm(lambda: jax.distributed.initialize(
        coordinator, num_processes, process_id, initialization_timeout=timeout_s))
    return True


def _require_free_port(coordinator: str, port: int) -> None:
    """ValueError where process 0's coordinator port is taken on this machine: JAX's
    runtime, failing to serve there, ended the process with a segfault."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # (TIME_WAIT is free)
        try:
            probe.bind(("", port))
        except OSError as err:
            raise ValueError(f"--coordinator {coordinator}: port {port} is taken on this "
                             f"machine ({err.strerror}; another run's coordinator?), where "
                             f"process 0 serves the run's coordinator: give a free "
                             f"port") from None


def _keeping_sigterm(join) -> None:
    """`join()`, with the SIGTERM handler that was there before put back after it:
    JAX's distributed runtime installs its preemption notifier's, which only logs the
    signal, so a run over several processes went on through the SIGTERM a batch
    scheduler sends (the command's stop between phases, or Python's default, is kept)."""
    main = threading.current_thread() is threading.main_thread()
    before = signal.getsignal(signal.SIGTERM) if main else None
    join()
    if before is not None:
        signal.signal(signal.SIGTERM, before)


def check_same_across_processes(values: dict, what: str = "options") -> None:
    """ValueError in every process of a multi-process run when `values` ({name: value},
    the same names in every process) are not equal in all of them, naming those that
    differ and this process's value; nothing for one process. One all-gather of a
    32-bit digest per value: processes given other options had hung in a later
    collective or failed in one with a runtime error that named none of them."""
    if jax.process_count() == 1:
        return
    from jax.experimental import multihost_utils

    digest = lambda v: int.from_bytes(hashlib.blake2b(repr(v).encode(), digest_size=4)
                                      .digest(), "little", signed=True)
    mine = np.array([digest(v) for v in values.values()], np.int32)
    every = np.asarray(multihost_utils.process_allgather(mine))  # [processes, values]
    differ = [name for i, name in enumerate(values) if (every[:, i] != every[0, i]).any()]
    if differ:
        here = jax.process_index()
        raise ValueError(f"the processes of this run were given other {what}: "
                         f"{', '.join(f'{n} {values[n]!r}' for n in differ)} in process "
                         f"{here}, other values in another; give every process the same")


def run_shards(devices: int) -> int:
    """The devices a run of `devices` local devices each process (0: all) steps on, over
    every process: the number its global batch is `batch_size` times."""
    return (devices or jax.local_device_count()) * jax.process_count()


def make_mesh(devices: int = 0) -> Mesh:
    """A 1-D mesh named "data": the first `devices` local devices of every process.

    `devices=0` takes all local devices. Every process must pass the same number.
    """
    if not is_int(devices):
        raise ValueError(f"devices must be an integer, the local devices of each process "
                         f"(0: all of them), got {devices!r}")
    local = jax.local_device_count()
    if not 0 <= devices <= local:
        fake = ("; to try several on a CPU, start the process with JAX_NUM_CPU_DEVICES=N "
                "(or XLA_FLAGS=--xla_force_host_platform_device_count=N)"
                if jax.default_backend() == "cpu" and devices > local else "")
        raise ValueError(f"devices {devices} must lie in [0, {local}]: this process has "
                         f"{local} local {jax.default_backend()} device(s) (0 = all of "
                         f"them){fake}")
    per_process = devices or local
    by_process: dict[int, list] = {}
    for device in jax.devices():
        by_process.setdefault(device.process_index, []).append(device)
    picked = [d for p in sorted(by_process) for d in by_process[p][:per_process]]
    return jax.make_mesh((len(picked),), (AXIS,), axis_types=(AxisType.Auto,), devices=picked)


def replicated(mesh: Mesh) -> NamedSharding:
    return NamedSharding(mesh, P())


def row_sharded(mesh: Mesh) -> NamedSharding:
    return NamedSharding(mesh, P(AXIS, None))


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


def _placed(x, sharding: NamedSharding) -> bool:
    return isinstance(x, jax.Array) and x.sharding.is_equivalent_to(sharding, x.ndim)


GRADS, METRICS, OVERFLOW = ("tree", "flat"), ("psum", "host"), ("late", "early", "packed")


@dataclasses.dataclass(frozen=True)
class Collectives:
    """How a data-parallel step talks between devices (every choice trains the same).

    Attributes:
      grads: "flat": gradients, batch statistics and the step's target weight are summed
        as one buffer per dtype (one all-reduce); "tree": one all-reduce per leaf (XLA's
        combiner may merge them).
      metrics: "host": every device returns its own per-step sums as scan outputs and
        the host adds them up once per chunk; "psum": summed (and maxed) on the devices
        at every step.
      overflow: "packed": the overflow flag rides in the flat gradient buffer; "early":
        its own all-reduce right after sampling; "late": its own all-reduce after the
        step (the original order).
    """

    grads: str = "flat"
    metrics: str = "host"
    overflow: str = "packed"

    def __post_init__(self):
        for name, options in (("grads", GRADS), ("metrics", METRICS), ("overflow", OVERFLOW)):
            if getattr(self, name) not in options:
                raise ValueError(f"collectives {name} must be one of {', '.join(options)}, "
                                 f"got {getattr(self, name)!r}")
        if self.overflow == "packed" and self.grads != "flat":
            raise ValueError("overflow 'packed' rides in the flat gradient buffer: it needs "
                             f"grads 'flat', got {self.grads!r}")

    @classmethod
    def parse(cls, text: str) -> Collectives:
        """"optimised" (the default), "baseline" (tree, psum, late: one collective per
        leaf, metric and flag) or "GRADS.METRICS.OVERFLOW", e.g. "flat.host.early"."""
        presets = {"optimised": cls(), "baseline": cls("tree", "psum", "late")}
        if text in presets:
            return presets[text]
        parts = text.split(".")
        if len(parts) != 3:
            raise ValueError(f"collectives {text!r}: expected optimised, baseline or "
                             f"GRADS.METRICS.OVERFLOW (grads {'|'.join(GRADS)}, metrics "
                             f"{'|'.join(METRICS)}, overflow {'|'.join(OVERFLOW)})")
        return cls(*parts)

    def describe(self) -> str:
        return f"{self.grads}.{self.metrics}.{self.overflow}"


def _is_float(x) -> bool:
    return jnp.issubdtype(x.dtype, jnp.floating)


def psum_flat(tree, extras: jax.Array):
    """(psum of every leaf of `tree`, psum of the float32 vector `extras`) through one
    all-reduce per floating dtype: the leaves of a dtype are concatenated into one
    buffer (`extras` joins the float32 one). Integer leaves are summed one by one."""
    leaves, treedef = jax.tree_util.tree_flatten(tree)
    groups: dict = {jnp.dtype(jnp.float32): []}
    for i, leaf in enumerate(leaves):
        if _is_float(leaf):
            groups.setdefault(jnp.dtype(leaf.dtype), []).append(i)
    out = [None if _is_float(leaf) else jax.lax.psum(leaf, AXIS) for leaf in leaves]
    extras_out = None
    for dtype, idx in groups.items():
        parts = [leaves[i].reshape(-1) for i in idx]
        if dtype == jnp.float32:
            parts.append(extras.astype(jnp.float32))
        summed = jax.lax.psum(jnp.concatenate(parts), AXIS)
        offset = 0
        for i in idx:
            size = leaves[i].size
            out[i] = summed[offset:offset + size].reshape(leaves[i].shape)
            offset += size
        if dtype == jnp.float32:
            extras_out = summed[offset:]
    return jax.tree_util.tree_unflatten(treedef, out), extras_out


@dataclasses.dataclass(frozen=True)
class DataParallel:
    """Data parallelism over a 1-D mesh: what a step program needs to run on many devices.

    Attributes:
      mesh: the mesh (axis "data"), e.g. from `make_mesh`.
      shard_features: the feature table is split by rows across the mesh.
      collectives: how a step reduces its gradients, metrics and overflow flag.
    """

    mesh: Mesh
    shard_features: bool = False
    collectives: Collectives = Collectives()

    def __post_init__(self):
        # a batch a device along "data" alone: another axis would repeat batches, and
        # the batches its size stands for would never be trained
        if not isinstance(self.mesh, Mesh) or self.mesh.axis_names != (AXIS,):
            got = (f"a mesh of axes {self.mesh.axis_names} (shape "
                   f"{dict(self.mesh.shape)})" if isinstance(self.mesh, Mesh)
                   else f"{type(self.mesh).__name__} {self.mesh!r}"[:120])
            raise ValueError(f"mesh must be a 1-D jax.sharding.Mesh of the axis {AXIS!r}, "
                             f"one device a batch (zg.make_mesh(devices)), got {got}")

    @property
    def size(self) -> int:
        return self.mesh.size

    @property
    def host_metrics(self) -> bool:
        """Per-device metrics come back as scan outputs and are summed on the host."""
        return self.collectives.metrics == "host"

    # Inside the mesh program.
    def batch_index(self, step) -> jax.Array:
        """Device d of D takes batch index step * D + d: its seeds and random stream are
        exactly those of that batch index in a one-device run."""
        return step * self.size + jax.lax.axis_index(AXIS)

    def sum(self, tree):
        return jax.tree_util.tree_map(lambda x: jax.lax.psum(x, AXIS), tree)

    def max(self, tree):
        return jax.tree_util.tree_map(lambda x: jax.lax.pmax(x, AXIS), tree)

    def any(self, flag) -> jax.Array:
        """bool scalar: `flag` is set on some device (its own all-reduce)."""
        return jax.lax.psum(flag.astype(jnp.int32), AXIS) > 0

    def average_update(self, grads, batch_stats, weight, overflow):
        """One step's update averaged as a one-device step on the global batch would be.

        Args:
          grads: this device's gradient of its loss, a mean over its rows of weight
            `weight` (float32 scalar; the loss divides by it, by 1 where it is 0:
            `masked_mean`).
          batch_stats: this device's new batch statistics (averaged over devices).
          overflow: bool scalar, this device's minibatch overflowed.

        Returns:
          (grads, batch_stats, agreed): the gradient of the loss averaged over the
          rows of every device, sum_d w_d g_d / sum_d w_d (a device without rows adds
          nothing, so a partial last batch weighs every row alike; 1 stands for a sum
          of 0);
          `agreed` is the overflow flag of any device when the collectives pack it,
          else None (the caller agrees on it).
        """
        scale = jnp.where(weight > 0, weight, 1.0)
        scaled = jax.tree_util.tree_map(lambda g: (g * scale).astype(g.dtype), grads)
        packed = self.collectives.overflow == "packed"
        if self.collectives.grads == "flat":
            extras = jnp.stack([weight, overflow.astype(jnp.float32)]) if packed \
                else weight[None]
            (scaled, stats), extras = psum_flat((scaled, batch_stats), extras)
            total, agreed = extras[0], (extras[1] > 0 if packed else None)
        else:
            scaled, stats, total = self.sum((scaled, batch_stats, weight))
            agreed = None
        div = jnp.where(total > 0, total, 1.0)
        grads = jax.tree_util.tree_map(lambda g: (g / div).astype(g.dtype), scaled)
        stats = jax.tree_util.tree_map(
            lambda s: s / self.size if _is_float(s) else s // self.size, stats)
        return grads, stats, agreed

    def gather_row_grads(self, ids, grads, valid, weight):
        """Every device's embedding rows and their gradient averaged as `average_update`
        averages the parameters' (ids int32[D R], grads [D R, dim], valid bool[D R]),
        so each replica of the table takes the same update.

        Args:
          ids: int32[R] this device's row ids; grads: [R, dim] the gradient of its loss
            (a mean over its `weight` rows); valid: bool[R].
        """
        scaled = grads * jnp.where(weight > 0, weight, 1.0).astype(grads.dtype)
        total = jax.lax.psum(weight, AXIS)
        every = lambda x: jax.lax.all_gather(x, AXIS, tiled=True)
        grads = every(scaled) / jnp.where(total > 0, total, 1.0).astype(grads.dtype)
        return every(ids), grads, every(valid)

    def reduce_metrics(self, sums: dict) -> dict:
        """Per-step metric sums of every device, on the device: counts maxed, the rest
        summed."""
        counts = self.max(sums["counts"])
        rest = self.sum({k: v for k, v in sums.items() if k != "counts"})
        return {**rest, "counts": counts}

    def gather_rows(self, kernels: Kernels, local: jax.Array, ids: jax.Array,
                    valid: jax.Array) -> jax.Array:
        """float[C, d]: rows `ids` of a table split by rows over the mesh.

        Args:
          kernels: the gather's implementation (`Kernels`, ops/registry.py).
          local: float[R, d], this device's rows [k R, (k + 1) R) of the table.
          ids: int32[C], global row ids; valid: bool[C] (invalid rows come back zero).

        Every device gathers, for the ids of all D devices (int32[D C], one
        all-gather), the rows it owns (zero elsewhere), and a reduce-scatter hands each
        device the sum over owners of its own C rows: exactly one owner is non-zero.
        """
        rows = local.shape[0]
        wanted = jax.lax.all_gather(jnp.where(valid, ids, -1), AXIS, tiled=True)
        pos = wanted - jax.lax.axis_index(AXIS) * rows
        mine = (pos >= 0) & (pos < rows)
        found = gather_rows(kernels, local, jnp.where(mine, pos, 0), mine)
        return jax.lax.psum_scatter(found, AXIS, scatter_dimension=0, tiled=True)

    # Around the mesh program.
    def replicate(self, tree):
        """Every leaf of `tree` copied to every device (no-op where already so)."""
        return jax.device_put(tree, replicated(self.mesh))

    def data_shardings(self, data):
        """Per leaf of `data` (graph, features, labels): replicated, features row-split
        when `shard_features`."""
        shardings = jax.tree_util.tree_map(lambda _: replicated(self.mesh), data)
        if self.shard_features:
            shardings = shardings._replace(features=row_sharded(self.mesh))
        return shardings

    def place_data(self, data):
        """`data` (a DeviceData) laid out on the mesh; features split if `shard_features`."""
        features = shard_rows(data.features, self.mesh) if self.shard_features \
            else self.replicate(data.features)
        return self.replicate(data._replace(features=None))._replace(features=features)

    def check_placed(self, data) -> None:
        """Raises ValueError unless `data` is laid out as `place_data` lays it out."""
        for (path, leaf), sharding in zip(jax.tree_util.tree_leaves_with_path(data),
                                          jax.tree_util.tree_leaves(self.data_shardings(data))):
            if not _placed(leaf, sharding):
                raise ValueError(
                    f"data{jax.tree_util.keystr(path)} is not laid out on the program's "
                    f"{self.size}-device mesh as {sharding.spec}; call "
                    "program.parallel.place_data(data) once before training")
        if self.shard_features and data.features.shape[0] % self.size:
            raise ValueError(f"row-sharded features have {data.features.shape[0]} rows, not "
                             f"a multiple of {self.size} devices; use shard_rows")

    def shard_chunk(self, run, data):
        """`run(state, data, perm, scalars) -> (state, metrics)` as one SPMD program on the
        mesh.

        With `host_metrics`, `run` returns each device's metrics with a leading axis of
        1, and the program returns them stacked, `[devices, steps, ...]`
        (`fetch_per_device` brings them to the host). `check_vma=False` keeps pmap's
        autodiff semantics, which the step relies on: the gradient of replicated
        parameters is each device's own, averaged by an explicit reduction. (With the
        check on, JAX would already sum it over devices in the transpose.)
        """
        specs = jax.tree_util.tree_map(lambda s: s.spec, self.data_shardings(data))
        out_specs = (P(), P(AXIS)) if self.host_metrics else P()
        return jax.shard_map(run, mesh=self.mesh, in_specs=(P(), specs, P(), P()),
                             out_specs=out_specs, check_vma=False)


def fetch_per_device(tree):
    """NumPy copies of arrays laid out over the mesh's devices (`P(AXIS)`), whole.

    One process holds all of them (device_get); with several processes each process
    gathers the others' blocks (one collective, once per chunk).
    """
    leaves = jax.tree_util.tree_leaves(tree)
    if all(leaf.is_fully_addressable for leaf in leaves):
        return jax.device_get(tree)
    from jax.experimental import multihost_utils

    return multihost_utils.process_allgather(tree, tiled=True)
