"""The memory model of a step's buffers and of what stays resident, the fit check, and
the device's memory stats."""

from __future__ import annotations

import dataclasses

import jax
import numpy as np

from zerognn_jax._src.ops.host_rows import is_host_resident
from zerognn_jax._src.sampling.envelope import Envelope


def is_out_of_memory(error: BaseException) -> bool:
    """Whether `error` is JAX's report of an allocation that failed: RESOURCE_EXHAUSTED
    on a GPU, "Out of memory allocating" (an INTERNAL error) on the CPU backend."""
    return isinstance(error, jax.errors.JaxRuntimeError) and (
        "RESOURCE_EXHAUSTED" in str(error) or "Out of memory allocating" in str(error))


def level_bytes(slots, level_dims) -> tuple[int, ...]:
    """Bytes each node costs per level: ids, mask, degree, its block row, activations.

    `level_dims[l]` is the feature width held at level l (the input features at level
    L, hidden widths in between, the classes at level 0); activations are counted
    twice, for the forward value and its gradient.
    """
    per = []
    for level, dim in enumerate(level_dims):
        block = 5 * slots[level] if level < len(slots) else 0
        per.append(9 + block + 8 * dim)
    return tuple(per)


def memory_report(envelope: Envelope, max_counts, slots, level_dims) -> dict:
    """Envelope bytes against the exact-size bytes at the largest counts seen; `slots`
    per row of each hop (`SamplerConfig.slots`)."""
    per = level_bytes(slots, level_dims)
    env_bytes = sum(c * b for c, b in zip(envelope.levels, per))
    ideal = sum(min(int(m), c) * b for m, c, b in zip(max_counts, envelope.levels, per))
    return {
        "levels": [
            {"level": i, "capacity": c, "max_observed": int(m), "bytes_per_node": b}
            for i, (c, m, b) in enumerate(zip(envelope.levels, max_counts, per))
        ],
        "envelope_bytes": int(env_bytes),
        "ideal_bytes": int(ideal),
        "ratio": env_bytes / max(ideal, 1),
    }


@dataclasses.dataclass(frozen=True)
class Resident:
    """Bytes that stay on one device for the whole run.

    Attributes:
      graph: CSR offsets, ids (and weights, and the edge-feature table a model reads)
        of the graph.
      features: this device's rows of the feature table.
      model: parameters, gradients and two Adam moments (float32), and a node
        embedding's table with its two float32 moments.
      feature_dtype: the features' dtype name; feature_shards: devices they are split over.
      host_table: the table is in host memory: `features` are its cached rows and row
        maps on the device.
    """

    graph: int
    features: int
    model: int
    feature_dtype: str = "float32"
    feature_shards: int = 1
    host_table: bool = False

    @property
    def total(self) -> int:
        return self.graph + self.features + self.model


def resident_bytes(graph, num_features: int, feature_dtype, level_dims, *,
                   feature_shards: int = 1, embedding_dim: int = 0,
                   feature_bytes: int | None = None) -> Resident:
    """The resident bytes of `graph` (a CSRGraph, host or device, its edge-feature
    table included), its features ([N, num_features] in `feature_dtype`, row-split over
    `feature_shards` devices; or `feature_bytes` on the device when the table is in host
    memory: its cached rows and row maps, ops/host_rows.device_bytes), a model whose
    layers map level_dims[l + 1] -> level_dims[l] with two weight matrices each
    (GraphSAGE's self and neighbour weights), and a node embedding [N, embedding_dim]
    in `feature_dtype` with two float32 moments."""
    arrays = (graph.indptr, graph.indices, graph.weights, graph.edge_features)
    graph_bytes = sum(int(np.prod(a.shape)) * np.dtype(a.dtype).itemsize
                      for a in arrays if a is not None)
    itemsize = np.dtype(jax.numpy.dtype(feature_dtype)).itemsize
    features = (-(-graph.num_nodes // feature_shards) * num_features * itemsize
                if feature_bytes is None else feature_bytes)
    params = sum(2 * a * b + a for a, b in zip(level_dims[:-1], level_dims[1:]))
    embedding = embedding_bytes(graph.num_nodes, embedding_dim, feature_dtype)
    return Resident(graph_bytes, features, 4 * 4 * params + embedding,
                    jax.numpy.dtype(feature_dtype).name, feature_shards,
                    host_table=feature_bytes is not None)


def allocated_resident(data, state) -> Resident:
    """The resident bytes, on one device, of a run whose device data (`DeviceData`:
    graph, features, targets) and state (`TrainState`) are allocated: each array as its
    sharding lays it out, plus the parameters once more for their gradients."""
    def per_device(tree) -> int:
        return sum(int(np.prod(leaf.sharding.shard_shape(leaf.shape))) * leaf.dtype.itemsize
                   if isinstance(leaf, jax.Array) else int(np.asarray(leaf).nbytes)
                   for leaf in jax.tree_util.tree_leaves(tree))

    features = jax.tree_util.tree_leaves(data.features)
    # a host table's leaves on the device are its row map and cached rows, if any
    dtype = data.features.dtype.name if is_host_resident(data.features) else \
        features[0].dtype.name if features else "float32"
    model = 2 * per_device(state.params) + per_device(
        (state.batch_stats, state.opt_state, state.embedding, state.embedding_opt))
    return Resident(per_device((data.graph, data.targets)), per_device(data.features), model,
                    dtype, host_table=is_host_resident(data.features))


def embedding_bytes(rows: int, dim: int, dtype) -> int:
    """Bytes of a learnable table float[rows, dim] in `dtype` with lazy Adam's two
    float32 moments (embeddings.py; a typed run's featureless types stacked)."""
    return rows * dim * (np.dtype(jax.numpy.dtype(dtype)).itemsize + 8)


def gathered_rows_bytes(rows: int, dim: int, dtype, devices: int) -> int:
    """Step bytes that data parallelism adds to a learnable table's update (an estimate):
    each device gathers every device's `rows` touched rows (`Parallel.gather_row_grads`:
    ids, flags and gradients [rows, dim] in `dtype`) and lazy Adam updates all D rows
    without assuming them distinct (`row_adam_update`: a sort of the ids, the gradient
    widened to float32 and summed, the two float32 moments read and the new rows
    written): per row 17 bytes of ids and sort, and per column the gradient in `dtype`
    plus 16 bytes. Zero on one device, whose update works on its level's rows."""
    if devices <= 1 or dim <= 0:
        return 0
    itemsize = np.dtype(jax.numpy.dtype(dtype)).itemsize
    return devices * rows * (17 + dim * (itemsize + 16))


def _gib(nbytes: int) -> str:
    return f"{nbytes / 2**30:.2f} GiB"


def _advice(resident: Resident, envelope_bytes: int, over: int,
            read_ahead: int = 0) -> list[str]:
    """What would bring the run `over` bytes lower, largest lever first (`read_ahead`:
    bytes of host-table rows read ahead, part of the step's buffers)."""
    tips = [_read_ahead_tip(read_ahead)] if read_ahead else []
    if resident.host_table and resident.features:  # a cache: shard_features refuses it
        tips.append(f"a smaller cache of the host table's rows (--feature-cache-gib, 0: "
                    f"none) frees up to {_gib(resident.features)}")
    elif resident.features:
        if resident.feature_dtype == "float32":
            tips.append(f"bfloat16 features (--dtype bfloat16) save "
                        f"{_gib(resident.features // 2)}")
        tips.append(f"keeping the feature table in host memory (--feature-placement host) "
                    f"frees up to {_gib(resident.features)}")
        tips.append(f"splitting the features over more devices (--shard-features --devices "
                    f"N, now {resident.feature_shards}) saves up to {_gib(resident.features)}")
    tips.append(f"fewer layers, smaller fanouts or batch shrink the step's "
                f"{_gib(envelope_bytes)} of buffers")
    if resident.graph > over:
        tips.append("a device with more memory: the graph alone takes "
                    f"{_gib(resident.graph)}")
    return tips


def check_fits(envelope: Envelope, slots, level_dims, limit_bytes: int | None, *,
               resident: Resident | None = None, extra_step_bytes: int = 0,
               read_ahead_bytes: int = 0) -> None:
    """Raises ValueError when the step's buffers (its levels, plus `extra_step_bytes`:
    `gathered_rows_bytes`, and `read_ahead_bytes` of host-table rows read for several
    steps at once), plus the `resident` graph, features and model when given, exceed
    `limit_bytes`; the message names every part and what to change. Call it before
    compiling."""
    if limit_bytes is None:
        return
    per = level_bytes(slots, level_dims)
    total = (resident.total if resident is not None else 0) + extra_step_bytes \
        + read_ahead_bytes
    for level, (cap, b) in enumerate(zip(envelope.levels, per)):
        total += cap * b
        if total > limit_bytes and resident is None:
            raise ValueError(
                f"the envelope does not fit device memory: level {level} (hop {level}) needs "
                f"capacity {cap:,} nodes x {b} bytes = {cap * b / 2**30:.2f} GiB, bringing "
                f"the step's buffers to {total / 2**30:.2f} GiB of {limit_bytes / 2**30:.2f} "
                "GiB available; lower the batch size or fanouts, or calibrate the envelope"
            )
    if total <= limit_bytes:
        return
    env_bytes = total - resident.total
    _does_not_fit(resident, env_bytes, limit_bytes,
                  _advice(resident, env_bytes, total - limit_bytes, read_ahead_bytes))


def check_step_fits(resident: Resident, step_bytes: int, limit_bytes: int | None, *,
                    batch_size: int, read_ahead_bytes: int = 0) -> None:
    """`check_fits` for a task that sizes its own step (a `BatchedTask`: graph batches,
    typed graphs): raises ValueError when `resident` (its data and the model's state, as
    allocated), `step_bytes` of step buffers and `read_ahead_bytes` of host-table rows
    read for several steps at once exceed `limit_bytes`, naming every part and what to
    change (`batch_size`: the run's, per device)."""
    total = resident.total + step_bytes + read_ahead_bytes
    if limit_bytes is None or total <= limit_bytes:
        return
    tips = [_read_ahead_tip(read_ahead_bytes)] if read_ahead_bytes else []
    besides = " (besides the rows read ahead)" if read_ahead_bytes else ""
    tips.append(f"a smaller batch (--batch-size, now {batch_size}), smaller fanouts (typed "
                f"graphs) or a narrower model shrinks the step's {_gib(step_bytes)} of "
                f"buffers{besides}")
    if resident.graph + resident.features > limit_bytes:
        tips.append(f"a device with more memory: the data alone takes "
                    f"{_gib(resident.graph + resident.features)}")
    _does_not_fit(resident, step_bytes + read_ahead_bytes, limit_bytes, tips)


def _read_ahead_tip(read_ahead: int) -> str:
    return (f"sampling fewer steps ahead (--sample-ahead 1: none) drops up to "
            f"{_gib(read_ahead)} of feature rows read ahead from the host table")


def _does_not_fit(resident: Resident, step_bytes: int, limit_bytes: int, tips) -> None:
    total = resident.total + step_bytes
    held = ("cached rows of the host table" if resident.host_table else
             f"over {resident.feature_shards} device(s)")
    parts = (f"graph {_gib(resident.graph)} + features {_gib(resident.features)} "
             f"({resident.feature_dtype}, {held}) + model "
             f"{_gib(resident.model)} + step buffers {_gib(step_bytes)} = {_gib(total)}")
    raise ValueError(
        f"the run does not fit device memory: {parts}, above the {_gib(limit_bytes)} "
        f"available by {_gib(total - limit_bytes)}. To fit: " + "; ".join(tips))


def _memory_stat(name: str, device=None) -> int | None:
    device = device or jax.local_devices()[0]
    stats = device.memory_stats() if hasattr(device, "memory_stats") else None
    return int(stats[name]) if stats and name in stats else None


def device_memory_limit(device=None) -> int | None:
    """Bytes the device's allocator may use, or None where JAX does not say (CPU)."""
    return _memory_stat("bytes_limit", device)


def device_free_bytes(device=None) -> int | None:
    """Bytes the device's allocator can still hand out (its limit less what is in use),
    or None where JAX does not say (CPU). Fragmentation may leave less in one piece."""
    limit, used = _memory_stat("bytes_limit", device), _memory_stat("bytes_in_use", device)
    return None if limit is None or used is None else limit - used


def device_largest_free_block(device=None) -> int | None:
    """The largest single allocation the device's allocator could hand out now, or None
    where JAX does not say (CPU): its largest free block, or where it has not yet
    reserved its whole limit (XLA_PYTHON_CLIENT_PREALLOCATE=false) the room it may still
    reserve, if that is larger."""
    block = _memory_stat("largest_free_block_bytes", device)
    limit, pool = _memory_stat("bytes_limit", device), _memory_stat("pool_bytes", device)
    if block is None or limit is None or pool is None:
        return block
    return max(block, limit - pool)


def eighth_as_power_of_two(nbytes: int, low: int, high: int) -> int:
    """An eighth of `nbytes` rounded down to a power of two, kept within [low, high]
    (powers of two): a share of device memory that settings a few bytes apart round
    to the same value."""
    share = nbytes // 8
    if share < low:
        return low
    return min(high, 1 << (share.bit_length() - 1))


def device_peak_bytes(device=None) -> int | None:
    """The device allocator's peak use so far in this process, or None (CPU)."""
    return _memory_stat("peak_bytes_in_use", device)
