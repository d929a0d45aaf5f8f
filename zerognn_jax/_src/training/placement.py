"""Where a run's feature table lives: on the device, or in host memory read by the step.

"auto" keeps it on the device unless graph, features and model would leave the step
less than `HEADROOM` of the device's memory (the step's buffers are sized only later,
by calibration); then the table stays in page-locked host memory and each step reads
its rows over PCIe (ops/host_rows.py). The choice and its reason are printed and
recorded in the run's summary (`Placement.describe`). A host table may keep copies of
its hottest rows (highest degree: most often sampled) on the device (`cache_budget`),
read from there instead, and lays its rows out hottest first (`choose_row_order`) where
a copy of it is made anyway or fits the host's memory.
"""

from __future__ import annotations

import sys
import warnings
from typing import NamedTuple

import numpy as np

from zerognn_jax._src.ops.host_rows import (
    HostTable,
    cache_hot_rows,
    cache_leading_rows,
    reordered_table,
    to_device,
)
from zerognn_jax._src.training.memory import Resident, _gib
from zerognn_jax._src.training.user_frames import user_stacklevel

# The share of device memory "auto" keeps free for the step's buffers.
HEADROOM = 0.25


class Placement(NamedTuple):
    """`where` the table goes ("device" or "host") and why, in words; `measured`: "auto"
    chose by the device's memory."""

    where: str
    reason: str
    measured: bool = False

    def describe(self) -> dict:
        """The run summary's entries: `feature_placement` ("device" or "host", as
        before the reason was recorded) and `feature_placement_why`."""
        return {"feature_placement": self.where, "feature_placement_why": self.reason}


class PlacementWarning(UserWarning):
    """An option of the feature table that its placement leaves unused."""


def choose_placement(setting: str, resident: Resident, limit: int | None, *,
                     sharded: bool = False, columns: int | None = None) -> Placement:
    """The placement for `setting` ("auto", "device", "host") given what would stay
    resident with the table on the device and the device's memory `limit` (None: the
    backend does not say, as on a CPU); `sharded` (shard_features): the device; a table
    of no `columns` (a run on embeddings alone) has nothing to read from the host: the
    device, with a `PlacementWarning` where "host" was asked for."""
    if sharded:
        return Placement("device", "shard_features splits it across the devices")
    if columns == 0:
        if setting == "host":
            warnings.warn("feature_placement 'host' is ignored: the feature table has no "
                          "columns, so the step reads no rows from it", PlacementWarning,
                          stacklevel=user_stacklevel())
        return Placement("device", "the feature table has no columns")
    if setting != "auto":
        return Placement(setting, "asked for (feature_placement)")
    if limit is None:
        return Placement("device", "the device reports no memory limit")
    parts = (f"graph {_gib(resident.graph)} + features {_gib(resident.features)} + model "
             f"{_gib(resident.model)} = {_gib(resident.total)} of {_gib(limit)}")
    if resident.total > (1 - HEADROOM) * limit:
        return Placement("host", f"{parts} would leave the step less than "
                                 f"{HEADROOM:.0%} of the device", True)
    return Placement("device", f"{parts} fit with room for the step", True)


def cache_budget(setting: float | None, placement: Placement, resident: Resident,
                 limit: int | None) -> int:
    """Device bytes for cached rows of a host table: `setting` GiB, or with None half of
    what graph and model leave of the device's memory less `HEADROOM` (none where the
    device reports no limit); 0 for a table on the device."""
    if placement.where != "host":
        return 0
    if setting is not None:
        return int(setting * 2**30)
    if limit is None:
        return 0
    return max(0, int(((1 - HEADROOM) * limit - resident.graph - resident.model) / 2))


def warn_unused_cache(setting: float | None, placement: Placement,
                      row_order: str = "auto", read_ahead: float | None = None) -> None:
    """Warns (`PlacementWarning`) that a positive `feature_cache_gib` (`setting`) sizes
    nothing, that a `host_row_order` other than "auto" lays out nothing and that a
    `read_ahead_gib` (`read_ahead`) reads nothing, where `placement` keeps the table on
    the device; None and 0 ask for no cache and are silent. Not an error: benchmarks
    and older checkpoints set them."""
    if placement.where != "device":
        return
    if read_ahead is not None:
        warnings.warn(f"read_ahead_gib {read_ahead} is ignored: the feature table is on "
                      f"the device ({placement.reason}), so no rows are read from the host",
                      PlacementWarning, stacklevel=user_stacklevel())
    if setting:
        warnings.warn(f"feature_cache_gib {setting} is ignored: the feature table is on "
                      f"the device ({placement.reason}), so no cache of its rows is sized",
                      PlacementWarning, stacklevel=user_stacklevel())
    if row_order != "auto":
        warnings.warn(f"host_row_order {row_order!r} is ignored: the feature table is on "
                      f"the device ({placement.reason}), so no host rows are laid out",
                      PlacementWarning, stacklevel=user_stacklevel())


def warn_unsplit(shard_features: bool, devices: int) -> None:
    """Warns (`PlacementWarning`) that `shard_features` splits the table over a mesh of
    one device (`devices`), where every row stays where it is."""
    if shard_features and devices == 1:
        warnings.warn("shard_features splits the feature table over one device here, "
                      "which keeps all of it: train on more devices (devices 0 takes all "
                      "of this process's) or processes for the split to save memory",
                      PlacementWarning, stacklevel=user_stacklevel())


_COUNT_BLOCK = 1 << 26  # edges counted at a time by `add_drawn_counts`


def add_drawn_counts(out: np.ndarray, indices) -> None:
    """Adds to `out` (int64[N]) how often each node is a neighbour in `indices` (a CSR's
    neighbour ids): how often its feature row is drawn, as the edges estimate it. On a
    directed graph a node's own neighbour count says nothing of that. In pieces:
    bincount copies its input to int64 (8 bytes an edge)."""
    for start in range(0, indices.shape[0], _COUNT_BLOCK):
        out += np.bincount(np.asarray(indices[start:start + _COUNT_BLOCK]),
                           minlength=out.shape[0])


def hottest_first(degree: np.ndarray, count: int) -> np.ndarray:
    """int32[count]: the `count` rows of highest `degree` (int[N]), highest first, ties
    by id (the lowest ids of the last degree taken)."""
    degree = np.asarray(degree).astype(np.int64)  # unsigned degrees: -degree wraps
    count = min(count, degree.shape[0])
    if count == 0:
        return np.zeros(0, np.int32)
    if count == degree.shape[0]:
        return np.argsort(-degree, kind="stable").astype(np.int32)
    last = -np.partition(-degree, count - 1)[count - 1]  # the count-th highest degree
    above = np.flatnonzero(degree > last)
    top = np.concatenate([above, np.flatnonzero(degree == last)[:count - above.size]])
    return top[np.lexsort((top, -degree[top]))].astype(np.int32)


def available_host_bytes() -> int | None:
    """The host memory the kernel says is available (Linux's MemAvailable), or None."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def choose_row_order(setting: str, features, dtype,
                     available: int | None) -> tuple[str, str]:
    """("degree" or "stored", why) for a host table of `features` in `dtype`: "auto"
    lays its rows out by degree (a copy) where a copy is made anyway (another dtype, a
    strided array) or fits in half of the `available` host bytes, and keeps them as
    stored otherwise."""
    if setting != "auto":
        return setting, "asked for (host_row_order)"
    array = np.asarray(features)
    if array.dtype != np.dtype(dtype):
        return "degree", f"converted from {array.dtype} anyway"
    if not array.flags.c_contiguous:
        return "degree", "copied anyway (a strided array)"
    need = array.shape[0] * array.shape[1] * np.dtype(dtype).itemsize
    if available is not None and need <= available / 2:
        return "degree", f"a copy of {_gib(need)} fits the host's {_gib(available)} available"
    have = "an unknown amount" if available is None else _gib(available)
    return "stored", f"a copy of {_gib(need)} would not fit half of {have} available"


def _no_host_copy(features, dtype, order: str) -> str:
    """Why a host table's copy failed to allocate, and the options that need none."""
    stored = np.asarray(features[:0]).dtype
    shape = np.shape(features)
    need = shape[0] * shape[1] * np.dtype(dtype).itemsize
    ways = ["--host-row-order stored"] if order == "degree" else []
    if stored != np.dtype(dtype) and stored.name in ("float32", "bfloat16"):
        ways.append(f"--dtype {stored.name} (the table's own dtype)")
    made = "reordered by degree" if order == "degree" else f"converted to {np.dtype(dtype)}"
    return (f"host memory ran out copying the feature table ({shape[0]:,} x {shape[1]}, "
            f"{made}: {_gib(need)}): free host memory"
            + (f", or read the table in place: {' with '.join(ways)}" if ways else ""))


def place_features(features, dtype, placement: Placement, *, announce: bool,
                   cache_bytes: int = 0, degree=None, row_order: str = "auto"):
    """The feature table in `dtype`: a device array, or a `HostTable` laid out in the
    order `choose_row_order` picks for `row_order` (by `degree`, int[N]: how often each
    row is read, as a graph's degrees estimate it; as stored, no copy is made of a
    C-contiguous array in `dtype`) with, given `cache_bytes`, the rows of highest degree
    that fit them cached on the device. With `announce`, prints the placement, the row
    order and their reasons to stderr when it is the host's or "auto" chose it by the
    device's memory."""
    note = ""
    if placement.where == "device":
        table = to_device(features, dtype)
    else:
        if degree is None and row_order == "degree":
            raise ValueError("host_row_order 'degree' needs the graph's degrees")
        if degree is not None and np.shape(degree) != (np.shape(features)[0],):
            raise ValueError(f"degree must hold one value a row of the table "
                             f"({np.shape(features)[0]}), got shape {np.shape(degree)}")
        order, why = ("stored", "no graph degrees to order by") if degree is None else \
            choose_row_order(row_order, features, dtype, available_host_bytes())
        n = np.shape(features)[0]
        try:
            if order == "degree":
                long = n * np.shape(features)[1] * np.dtype(dtype).itemsize >= 2**30
                log = (lambda line: print(line, file=sys.stderr, flush=True)) \
                    if announce and long else None
                table = reordered_table(features, hottest_first(degree, n), dtype, log=log)
            else:
                table = HostTable(np.ascontiguousarray(
                    np.asarray(features).astype(dtype, copy=False)))
        except MemoryError:
            raise MemoryError(_no_host_copy(features, dtype, order)) from None
        note = f"; rows {'by degree' if order == 'degree' else 'as stored'}: {why}"
        row_bytes = table.shape[1] * table.dtype.itemsize
        # rows as stored need a node -> slot map on the device (4 bytes a node), paid
        # from the cache's bytes; rows by degree find their copies by their positions,
        # and without degrees the first rows as stored are cached
        leading = order == "degree" or degree is None
        count = min(n, max(0, cache_bytes - (0 if leading else 4 * n)) // row_bytes)
        if count:
            table = cache_leading_rows(table, count) if leading else \
                cache_hot_rows(table, hottest_first(degree, count))
            which = "rows of highest degree" if degree is not None else \
                "first rows (no graph degrees)"
            note += (f"; its {count:,} {which} ({count / table.shape[0]:.0%}, "
                     f"{_gib(count * row_bytes)}) cached on the device")
    if announce:
        announce_placement(placement, table.nbytes, note)
    return table


def announce_placement(placement: Placement, nbytes: int, note: str = "") -> None:
    """Prints where a table of `nbytes` went and why to stderr, when that is the host or
    "auto" chose it by the device's memory; `note`: what follows the reason."""
    if placement.where == "host" or placement.measured:
        print(f"features on the {placement.where} ({_gib(nbytes)}): {placement.reason}{note}",
              file=sys.stderr, flush=True)
