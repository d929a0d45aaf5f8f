"""Where a run's feature table lives: on the device, or in host memory read by the step.

"auto" keeps it on the device unless graph, features and model would leave the step
less than `HEADROOM` of the device's memory (the step's buffers are sized only later,
by calibration); then the table stays in page-locked host memory and each step reads
its rows over PCIe (ops/host_rows.py). The choice and its reason are printed. A host
table may keep copies of its hottest rows (highest degree: most often sampled) on the
device (`cache_budget`), read from there instead.
"""

from __future__ import annotations

import sys
from typing import NamedTuple

import numpy as np

from zerognn_jax._src.ops.host_rows import HostTable, cache_hot_rows, to_device
from zerognn_jax._src.training.memory import Resident, _gib

# The share of device memory "auto" keeps free for the step's buffers.
HEADROOM = 0.25


class Placement(NamedTuple):
    """`where` the table goes ("device" or "host") and why, in words; `measured`: "auto"
    chose by the device's memory."""

    where: str
    reason: str
    measured: bool = False


def choose_placement(setting: str, resident: Resident, limit: int | None) -> Placement:
    """The placement for `setting` ("auto", "device", "host") given what would stay
    resident with the table on the device and the device's memory `limit` (None: the
    backend does not say, as on a CPU)."""
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


def hottest_first(indptr: np.ndarray, count: int) -> np.ndarray:
    """int32[count]: the `count` nodes of highest degree, highest first (ties by id)."""
    degree = np.diff(np.asarray(indptr))
    count = min(count, degree.shape[0])
    if count == 0:
        return np.zeros(0, np.int32)
    top = np.argpartition(-degree, count - 1)[:count]
    return top[np.lexsort((top, -degree[top]))].astype(np.int32)


def place_features(features, dtype, placement: Placement, *, announce: bool,
                   cache_bytes: int = 0, indptr=None):
    """The feature table in `dtype`: a device array, or a `HostTable` (no copy when the
    host array is already C-contiguous in `dtype`) with, given `cache_bytes`, the rows
    of highest degree in CSR offsets `indptr` that fit them cached on the device. With
    `announce`, prints the placement and its reason to stderr when it is the host's or
    "auto" chose it by the device's memory."""
    note = ""
    if placement.where == "device":
        table = to_device(features, dtype)
    else:
        table = HostTable(np.ascontiguousarray(np.asarray(features).astype(dtype, copy=False)))
        row_bytes = table.shape[1] * table.dtype.itemsize
        count = min(table.shape[0], cache_bytes // row_bytes)
        if count:
            table = cache_hot_rows(table, hottest_first(indptr, count))
            note = (f", its {count:,} rows of highest degree ({count / table.shape[0]:.0%}, "
                    f"{_gib(count * row_bytes)}) cached on the device")
    if announce and (placement.where == "host" or placement.measured):
        print(f"features on the {placement.where} ({_gib(table.nbytes)}){note}: "
              f"{placement.reason}", file=sys.stderr, flush=True)
    return table
