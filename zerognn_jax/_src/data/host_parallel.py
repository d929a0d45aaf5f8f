"""Host work in blocks on threads: how many threads, a map over block indices, and a
merge of sorted int64 runs by ranges.

NumPy's fills, casts, sorts and reductions release the GIL, so a block per task on a
thread pool runs in parallel; each block is a function of its index alone, so results
do not depend on the number of threads.
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor

import numpy as np


def host_threads() -> int:
    """Threads for host work in blocks: the CPUs this process may run on, at most 32
    (NumPy's fills, casts, sorts and reductions release the GIL)."""
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return max(1, min(32, cpus or 1))


def thread_map(fn, count: int, threads: int) -> list:
    """[fn(0), ..., fn(count - 1)], computed on up to `threads` threads."""
    if threads <= 1 or count <= 1:
        return [fn(i) for i in range(count)]
    with ThreadPoolExecutor(min(threads, count)) as pool:
        return list(pool.map(fn, range(count)))


def merge_sorted(parts, cuts: np.ndarray, *, distinct: bool = False,
                 threads: int = 1) -> list[np.ndarray]:
    """The entries of the ascending int64 arrays `parts` that lie in [cuts[0], cuts[-1]),
    in ascending order (each value once when `distinct`), as one array per range
    [cuts[i], cuts[i + 1]) of the ascending `cuts`; the ranges are merged on `threads`
    threads and their arrays do not depend on how many."""
    parts = list(parts) or [np.zeros(0, np.int64)]
    at = [np.searchsorted(p, cuts) for p in parts]

    def merge(i):
        run = np.concatenate([p[a[i]:a[i + 1]] for p, a in zip(parts, at)])
        run.sort(kind="stable")  # timsort: merges the sorted runs rather than sorting afresh
        if distinct and run.size:
            keep = np.ones(run.shape, bool)
            np.not_equal(run[1:], run[:-1], out=keep[1:])
            run = run[keep]
        return run

    return thread_map(merge, len(cuts) - 1, threads)
