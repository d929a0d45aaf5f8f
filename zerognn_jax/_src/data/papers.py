"""papers100M-like: the shape of ogbn-papers100M, generated with JAX on the accelerator.

At `scale=1`: 111,059,956 nodes, ~1.616B undirected citation edges stored both ways
(~3.2B directed: uint32 offsets, data/graph.py), 128 features, 172 classes, and
ogbn-papers100M's 1.1 % labelled split (1,207,179 train, 125,265 val, 214,338 test
nodes; every other node has label -1). Every count scales with `scale`.

The model follows products-like (synthetic.py) in closed form, so that a draw costs
O(1) and no stub table of 2E entries needs device memory:

  1. Classes own contiguous blocks of a "rank space", with Zipf(1) sizes. Rank r of a
     class weighs (r + r0)^-beta, beta = 1 / (2.3 - 1): expected degrees follow a power
     law of density ~ d^-2.3, each class with its hubs.
  2. An edge draws one end: a class in proportion to its total weight, then a rank by
     inverting the class's continuous weight CDF (float32, dithered by its spacing so
     that no rank of a large class is skipped); the other end comes from the same class
     with probability 0.85 (homophily), else is drawn the same way from anywhere.
  3. A random permutation maps rank space to node ids: hubs and classes scatter over
     the ids, so gathers are as cold as in a real graph.
  4. Self-loops and duplicate edges are dropped, and the CSR built, by sorting the
     directed edges by (row, neighbour) in device memory, one bucket of rows at a time:
     a first pass counts each row's entries and cuts the rows into buckets of at most
     `max_sort` entries (XLA sorts at most 2^31 - 1 elements; full scale makes 4 buckets
     of ~0.8B); each bucket then redraws every edge, keeps the entries of its rows and
     sorts and deduplicates them alone. The edges are the same whatever the buckets.
  5. Labels are the class, except for misfits (likelier at low expected degree, as in
     products-like); features are the label's centroid (N(0, 0.25^2) per coordinate)
     plus unit Gaussian noise, written in row blocks in the requested dtype.

Deterministic for a (scale, seed) on one platform (jax.random bits do not depend on the
device; float rounding in step 2 may differ between CPU and GPU). `write_papers100m_like`
streams the dataset into a dataset directory (storage.py), `papers100m_like` returns it
in memory for small scales.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from zerognn_jax._src.data import storage
from zerognn_jax._src.data.dataset import Dataset
from zerognn_jax._src.data.graph import offset_dtype
from zerognn_jax._src.data.synthetic import check_scale

NAME = "papers100m-like"
PAPERS_NODES = 111_059_956
PAPERS_EDGES = 1_615_685_872  # undirected; about 3.23B directed
PAPERS_SPLIT = (1_207_179, 125_265, 214_338)
NUM_FEATURES = 128
NUM_CLASSES = 172
_MIN_NODES = 2_000
_EDGE_CHUNK = 1 << 24  # edges drawn per loop step
_ROW_BLOCK = 1 << 20  # feature rows and CSR entries moved to the host at a time
_MAX_SORT = 1 << 30  # most directed entries sorted at once (one bucket of rows)
_SORT_LIMIT = 2**31 - 1  # XLA's stable sort (and an int32 iota) stop here
# Device bytes per bucket slot at the peak of `_bucket`: XLA:CPU's compiled peak is 29
# (the drawn (src, dst), sort outputs, the iota and order of the second sort, the kept
# neighbours); on GPU each radix sort adds its key and value double buffers (8).
_BUCKET_BYTES = 40


@dataclasses.dataclass(frozen=True)
class _Citation:
    """Parameters of the papers100M-like model (see the module docstring)."""

    degree_exponent: float = 2.3
    rank_offset: float = 8.0
    community_edge_prob: float = 0.85
    misfit_scale: float = 0.4
    misfit_max: float = 0.7
    class_zipf: float = 1.0
    centroid_std: float = 0.25

    @property
    def beta(self) -> float:
        return 1.0 / (self.degree_exponent - 1.0)


_PAPERS = _Citation()


def sizes(scale: float) -> tuple[int, int, tuple[int, int, int]]:
    """(nodes, undirected edges, (train, val, test)) at `scale`."""
    check_scale(scale)
    n = round(PAPERS_NODES * scale)
    if n < _MIN_NODES:
        raise ValueError(f"scale={scale} gives {n} nodes; papers100m-like needs >= {_MIN_NODES}")
    split = tuple(max(1, round(s * scale)) for s in PAPERS_SPLIT)
    return n, round(PAPERS_EDGES * scale), split


def write_papers100m_like(path: str | os.PathLike, scale: float = 1.0, seed: int = 0, *,
                          feature_dtype="float32", max_sort: int = _MAX_SORT,
                          log: Callable[[str], None] | None = None) -> Path:
    """Generates papers100M-like into the dataset directory `path` (atomically).

    `max_sort` bounds the directed entries sorted at once (it changes the memory and the
    passes, not the graph); `log`, if given, receives progress lines (bucket plan and
    estimated peak device memory).
    """
    with storage.write_dir(path, NAME, NUM_CLASSES) as out:
        _generate(out, scale, seed, feature_dtype, max_sort, log)
    return Path(path)


def papers100m_like(scale: float = 1.0, seed: int = 0, *, max_sort: int = _MAX_SORT,
                    log: Callable[[str], None] | None = None) -> Dataset:
    """papers100M-like in host memory, float32 features (for small scales)."""
    out = _Arrays()
    _generate(out, scale, seed, np.float32, max_sort, log)
    a = out.arrays
    return storage.make_dataset(NAME, a["indptr"], a["indices"], a["features"], a["labels"],
                                a["train_idx"], a["val_idx"], a["test_idx"], NUM_CLASSES)


class _Arrays:
    """An in-memory stand-in for `storage.DatasetWriter`."""

    def __init__(self):
        self.arrays: dict[str, np.ndarray] = {}

    def array(self, key, shape, dtype) -> np.ndarray:
        self.arrays[key] = np.empty(shape, dtype)
        return self.arrays[key]

    def put(self, key, values) -> None:
        self.arrays[key] = np.asarray(values)


def seed_key(seed: int) -> jax.Array:
    """A jax.random key of the whole integer `seed` >= 0: its low 32 bits make the key
    (as `jax.random.key(seed)`, which keeps only those, does) and every further 32 bits
    are folded in, so that seeds 2**32 apart give other data."""
    seed = int(seed)
    if seed < 0:
        raise ValueError(f"seed must be >= 0, got {seed}")
    key, seed = jax.random.key(seed & 0xFFFFFFFF), seed >> 32
    while seed:
        key, seed = jax.random.fold_in(key, seed & 0xFFFFFFFF), seed >> 32
    return key


def _generate(out, scale: float, seed: int, feature_dtype, max_sort: int, log) -> None:
    n, m, split = sizes(scale)
    if not 1 <= max_sort <= _SORT_LIMIT:
        raise ValueError(f"max_sort={max_sort:,} must be in 1 .. 2**31 - 1 ({_SORT_LIMIT:,})")
    model = _PAPERS
    key = seed_key(seed)
    keys = [jax.random.fold_in(key, stream) for stream in range(5)]
    sizes_c = _class_sizes(n, model)
    perm = jax.random.permutation(keys[0], n).astype(jnp.int32)  # rank space -> node id
    _write_csr(out, n, m, sizes_c, perm, keys[1], max_sort, log or (lambda line: None))
    labels = _labels(n, m, sizes_c, perm, model, keys[2])
    _write_features(out, labels, model, keys[3], np.dtype(feature_dtype))
    order = jax.random.permutation(keys[4], n).astype(jnp.int32)
    bounds = np.cumsum((0, *split))
    parts = [jnp.sort(order[a:b]) for a, b in zip(bounds[:-1], bounds[1:])]
    labelled = jnp.concatenate(parts)
    stored = jnp.full((n,), -1, jnp.int32).at[labelled].set(labels[labelled])
    _to_host(out, "labels", stored)
    for name, part in zip(("train_idx", "val_idx", "test_idx"), parts):
        _to_host(out, name, part)


def _to_host(out, key: str, values: jax.Array) -> None:
    """Copies a device array into `out[key]` in blocks (no whole second host copy)."""
    _copy_prefix(out.array(key, values.shape, values.dtype), values, _ROW_BLOCK)


def _copy_prefix(dest: np.ndarray, values: jax.Array, block: int) -> None:
    """dest[:] = values[:len(dest)], moved in blocks of one compiled size (len < 2**31)."""
    size = min(block, values.shape[0])
    for start in range(0, dest.shape[0], max(1, size)):
        at = min(start, values.shape[0] - size)  # the last block overlaps the one before
        stop = min(start + size, dest.shape[0])
        dest[start:stop] = np.asarray(_block(values, at, size=size))[start - at:stop - at]


@jax.jit(static_argnames="size")
def _block(values, start, *, size: int):
    return jax.lax.dynamic_slice_in_dim(values, start, size)


def _class_sizes(n: int, model: _Citation) -> np.ndarray:
    """int64[C] Zipf class sizes summing to n, each at least 1."""
    prior = 1.0 / np.arange(1, NUM_CLASSES + 1) ** model.class_zipf
    counts = np.maximum(1, np.floor(prior / prior.sum() * n)).astype(np.int64)
    counts[0] += n - counts.sum()
    return counts


def _cdf_ends(size, model: _Citation):
    """(F(0), F(size)) of a class's weight CDF F(x) = (x + r0)^(1 - beta)."""
    e = 1.0 - model.beta
    return model.rank_offset ** e, (size + model.rank_offset) ** e


def _draw_rank(key, cls, sizes_c, model: _Citation):
    """int32 ranks within classes `cls`, each drawn in proportion to (r + r0)^-beta."""
    k_u, k_dither = jax.random.split(key)
    size = sizes_c[cls].astype(jnp.float32)
    lo, hi = _cdf_ends(size, model)
    y = lo + jax.random.uniform(k_u, cls.shape) * (hi - lo)
    x = y ** (1.0 / (1.0 - model.beta)) - model.rank_offset
    x = x + (jax.random.uniform(k_dither, cls.shape) - 0.5) * jnp.abs(x) * 2.0**-22
    return jnp.clip(jnp.floor(x), 0, size - 1).astype(jnp.int32)


@jax.jit
def _class_weights(sizes_c):
    lo, hi = _cdf_ends(sizes_c.astype(jnp.float32), _PAPERS)
    return hi - lo  # proportional to each class's total weight


def _draw_edges(key, count: int, sizes_c, first, model: _Citation):
    """(u, v) int32[count] in rank space."""
    k_cu, k_ru, k_local, k_cv, k_rv = jax.random.split(key, 5)
    cdf = jnp.cumsum(_class_weights(sizes_c))
    draw_class = lambda k: jnp.minimum(  # inverse CDF over the classes' total weights
        jnp.searchsorted(cdf, jax.random.uniform(k, (count,)) * cdf[-1]), NUM_CLASSES - 1)
    cu = draw_class(k_cu)
    local = jax.random.uniform(k_local, (count,)) < model.community_edge_prob
    cv = jnp.where(local, cu, draw_class(k_cv))
    u = first[cu] + _draw_rank(k_ru, cu, sizes_c, model)
    v = first[cv] + _draw_rank(k_rv, cv, sizes_c, model)
    return u.astype(jnp.int32), v.astype(jnp.int32)


def _write_csr(out, n: int, m: int, sizes_c, perm, key, max_sort: int, log) -> None:
    """Writes `indptr` and `indices` of the symmetric graph without loops or duplicates."""
    chunks = max(1, -(-m // _EDGE_CHUNK))
    draw = dict(m=m, chunk=-(-m // chunks), chunks=chunks, n=n)
    args = (key, perm, jnp.asarray(sizes_c, jnp.int32),
            jnp.asarray(np.cumsum(sizes_c) - sizes_c, jnp.int32))
    counts = np.asarray(_row_counts(*args, **draw), np.int64)
    bounds = _bucket_bounds(counts, max_sort)
    ends = np.cumsum(np.concatenate([[0], counts]))[bounds]
    cap = max(1, int(np.max(np.diff(ends))))
    buckets = len(bounds) - 1
    log(f"papers100m-like CSR: {int(ends[-1]):,} directed entries before deduplication, "
        f"{buckets} bucket(s) of <= {cap:,}; estimated peak device memory "
        f"{_peak_device_bytes(n, cap, buckets, draw['chunk']) / 2**30:.1f} GiB")
    degree, pieces = _sorted_buckets(args, draw, bounds, cap)
    total = sum(kept for _, kept in pieces)
    _to_host(out, "indptr", _indptr(degree, ptr_dtype=offset_dtype(total)))
    del degree
    indices, start = out.array("indices", (total,), np.int32), 0
    while pieces:  # each bucket leaves the device once copied
        dst, kept = pieces.pop(0)
        _copy_prefix(indices[start:start + kept], dst, _EDGE_CHUNK)
        start += kept


def _sorted_buckets(args, draw: dict, bounds: np.ndarray, cap: int):
    """(int32[n] degrees, [(int32[cap] neighbours, kept)] per bucket) on the device."""
    degree, pieces = jnp.zeros((draw["n"],), jnp.int32), []
    for lo, hi in zip(bounds[:-1], bounds[1:]):
        while True:
            dst, more, kept, drawn = _bucket(*args, degree, int(lo), int(hi), cap=cap, **draw)
            if int(drawn) <= cap:
                break
            cap = int(drawn)  # the count pass rounded a draw differently: redo, larger
            if cap > _SORT_LIMIT:
                raise RuntimeError(f"rows {lo}..{hi} drew {cap:,} entries, past 2**31 - 1")
        degree = more
        pieces.append((dst, int(kept)))
    return degree, pieces


def _bucket_bounds(counts: np.ndarray, max_sort: int) -> np.ndarray:
    """Row bounds [0, ..., n] of buckets holding at most `max_sort` entries each, about
    equal: each is filled greedily up to an equal share plus the largest row."""
    cum = np.cumsum(np.concatenate([[0], counts]))
    total, row = int(cum[-1]), int(np.argmax(counts))
    if counts[row] > max_sort:
        raise ValueError(f"row {row} has {int(counts[row]):,} directed entries, more than "
                         f"max_sort={max_sort:,}: a row cannot be split between buckets")
    share = -(-total // max(1, -(-total // max_sort)))
    limit = min(max_sort, share + int(counts[row]))
    bounds = [0]
    while bounds[-1] < counts.shape[0]:
        bounds.append(int(np.searchsorted(cum, cum[bounds[-1]] + limit, side="right")) - 1)
    return np.asarray(bounds)


def _peak_device_bytes(n: int, cap: int, buckets: int, chunk: int) -> int:
    """Estimated peak device bytes of the CSR build: the last bucket at work, the finished
    buckets' neighbours it waits beside, perm and degrees (x2), and one chunk's draws."""
    return _BUCKET_BYTES * cap + 4 * cap * (buckets - 1) + 12 * n + 64 * chunk


def estimate_device_bytes(scale: float = 1.0, max_sort: int = _MAX_SORT) -> int:
    """Estimated peak device bytes of generating papers100M-like's CSR at `scale` (before
    the count pass; the generator logs the figure from the actual bucket sizes)."""
    n, m, _ = sizes(scale)
    entries = round(2 * m * 1.01)  # a few more than the kept 2m; loops are dropped early
    buckets = -(-entries // max_sort)
    chunk = -(-m // max(1, -(-m // _EDGE_CHUNK)))
    return _peak_device_bytes(n, min(max_sort, -(-entries // buckets)), buckets, chunk)


def _draw_chunk(key, i, perm, sizes_c, first, *, m: int, chunk: int):
    """(src, dst) int32[2 * chunk]: chunk i's edges as node ids, stored both ways; padding
    past the m-th edge is a loop (src == dst), as loops are dropped."""
    u, v = _draw_edges(jax.random.fold_in(key, i), chunk, sizes_c, first, _PAPERS)
    live = jnp.arange(chunk) < m - i * chunk
    u, v = perm[u], jnp.where(live, perm[v], perm[u])
    return jnp.concatenate([u, v]), jnp.concatenate([v, u])


@jax.jit(static_argnames=("m", "chunk", "chunks", "n"))
def _row_counts(key, perm, sizes_c, first, *, m: int, chunk: int, chunks: int, n: int):
    """int32[n] directed entries of each row, loops dropped, duplicates still counted."""

    def body(i, counts):
        src, dst = _draw_chunk(key, i, perm, sizes_c, first, m=m, chunk=chunk)
        return counts.at[jnp.where(src == dst, n, src)].add(1, mode="drop")

    return jax.lax.fori_loop(0, chunks, body, jnp.zeros((n,), jnp.int32))


@jax.jit(static_argnames=("m", "chunk", "chunks", "n", "cap"))
def _bucket(key, perm, sizes_c, first, degree, lo, hi, *, m: int, chunk: int, chunks: int,
            n: int, cap: int):
    """Rows lo .. hi - 1 of the CSR, from every edge drawn again.

    Returns dst: int32[cap], the rows' neighbours sorted by (row, neighbour) without loops
    or duplicates, then padding; `degree` plus each row's kept entries; kept; and drawn,
    the rows' entries before deduplication (all were kept only if drawn <= cap).
    """

    def body(i, carry):
        src_buf, dst_buf, count = carry
        src, dst = _draw_chunk(key, i, perm, sizes_c, first, m=m, chunk=chunk)
        take = (src >= lo) & (src < hi) & (src != dst)
        pos = jnp.where(take, count + jnp.cumsum(take, dtype=jnp.int32) - 1, cap)
        return (src_buf.at[pos].set(src, mode="drop"), dst_buf.at[pos].set(dst, mode="drop"),
                count + jnp.sum(take, dtype=jnp.int32))

    fill = jnp.full((cap,), n, jnp.int32)  # padding sorts last
    src, dst, drawn = jax.lax.fori_loop(0, chunks, body, (fill, fill, jnp.int32(0)))
    # (row, neighbour) order from two one-key sorts: by neighbour, then stably by row.
    # The iota is the stable sort's tie-break, so XLA:GPU adds no third operand and both
    # stay two-operand CUB radix sorts.
    dst, src = jax.lax.sort((dst, src), num_keys=1, is_stable=False)
    src, order = jax.lax.sort((src, jax.lax.iota(jnp.int32, cap)), num_keys=1, is_stable=True)
    dst = dst[order]
    dup = jnp.concatenate([jnp.zeros((1,), bool), (src[1:] == src[:-1]) & (dst[1:] == dst[:-1])])
    keep = (src < n) & ~dup
    pos = jnp.where(keep, jnp.cumsum(keep, dtype=jnp.int32) - 1, cap)
    degree = degree.at[jnp.where(keep, src, n)].add(1, mode="drop")
    return fill.at[pos].set(dst, mode="drop"), degree, jnp.sum(keep, dtype=jnp.int32), drawn


@jax.jit(static_argnames="ptr_dtype")
def _indptr(degree, *, ptr_dtype):
    return jnp.concatenate([jnp.zeros((1,), ptr_dtype), jnp.cumsum(degree, dtype=ptr_dtype)])


@jax.jit(static_argnames=("n", "m", "model"))
def _latent(sizes_c, perm, key, *, n: int, m: int, model: _Citation):
    first = jnp.cumsum(sizes_c) - sizes_c
    pos = jnp.arange(n, dtype=jnp.int32)
    cls = jnp.searchsorted(first, pos, side="right").astype(jnp.int32) - 1
    rank = (pos - first[cls]).astype(jnp.float32)
    weight = (rank + model.rank_offset) ** -model.beta
    total = jnp.sum(_class_weights(sizes_c)) / (1.0 - model.beta)
    degree = 2.0 * m * weight / total
    misfit_p = jnp.minimum(model.misfit_max, model.misfit_scale * jnp.median(degree) / degree)
    k_misfit, k_class = jax.random.split(key)
    prior = jnp.cumsum(1.0 / jnp.arange(1, NUM_CLASSES + 1) ** model.class_zipf)
    other = jnp.minimum(jnp.searchsorted(prior, jax.random.uniform(k_class, (n,)) * prior[-1]),
                        NUM_CLASSES - 1).astype(jnp.int32)
    label = jnp.where(jax.random.uniform(k_misfit, (n,)) < misfit_p, other, cls)
    return jnp.zeros((n,), jnp.int32).at[perm].set(label)


def _labels(n, m, sizes_c, perm, model, key) -> jax.Array:
    """int32[n] latent label of every node id (before the split hides most of them)."""
    return _latent(jnp.asarray(sizes_c, jnp.int32), perm, key, n=n, m=m, model=model)


@jax.jit(static_argnames=("rows", "dtype"))
def _feature_rows(centroids, labels, key, start, *, rows: int, dtype):
    lab = jax.lax.dynamic_slice(labels, (start,), (rows,))
    noise = jax.random.normal(jax.random.fold_in(key, start), (rows, NUM_FEATURES))
    return (centroids[lab] + noise).astype(dtype)


def _write_features(out, labels, model: _Citation, key, dtype: np.dtype) -> None:
    """features [n, 128] in `dtype`, generated and moved to the host in row blocks."""
    n = labels.shape[0]
    k_centroid, k_noise = jax.random.split(key)
    centroids = model.centroid_std * jax.random.normal(k_centroid, (NUM_CLASSES, NUM_FEATURES))
    dest = out.array("features", (n, NUM_FEATURES), dtype)
    rows = min(n, _ROW_BLOCK)
    for start in range(0, n, rows):
        start = min(start, n - rows)
        dest[start:start + rows] = np.asarray(_feature_rows(
            centroids, labels, k_noise, start, rows=rows, dtype=jnp.dtype(dtype)))
