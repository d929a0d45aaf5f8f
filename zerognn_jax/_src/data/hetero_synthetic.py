"""Typed synthetic benchmark graphs: mag-like (ogbn-mag's shape) and igbh-like (IGBH's).

Both come from one typed community model, whose labels need the typed neighbourhood:

  1. Every node of every type gets a community in [0, C) from a Zipf(1) prior, C the
     number of classes, and a propensity from a Pareto law (density ~ d^-2.3, capped at
     200, about 50 times its mean, and at a hundredth of the type's nodes); the target
     type's community is its label.
  2. Each relation draws its edge count: the destination end (and the source end, when
     the edge is not local) in proportion to propensity; with the relation's
     *locality* the source comes from the destination's community (in proportion to
     propensity within it), else from anywhere. Loops within a type and repeated pairs
     are dropped (a few per cent at small scales).
  3. Target-type features are the label's centroid (N(0, s^2) per coordinate) plus unit
     Gaussian noise, s small: the features alone say little, while a paper's authors
     and fields share its community more often than chance, and their other papers'
     features (two typed hops: paper <- author <- paper) average the noise away. Other
     types get noise around their own community's centroid, or no features (mag-like).

  mag-like's parameters (s = 0.2; localities writes 0.35, cites 0.3, has_topic 0.25,
  affiliated_with 0.5) were chosen with a proxy at scale 0.05: a nearest class-mean
  classifier (means from the training papers) on the paper's own features is right on
  19 % of the test papers (ogbn-mag's MLP: ~26 %), on the sum of its features and the
  means over papers two typed hops away (via authors, via fields) and over cited papers
  on 46 % (ogbn-mag's R-GCN: ~47 %). igbh-like takes s = 0.07 for 1024 columns (the
  same signal per row as 0.2 over 128) and was not tuned.

mag-like at `scale=1` (ogbn-mag's counts): 736,389 papers, 1,134,649 authors, 8,740
institutions, 59,965 fields of study; author-affiliated_with-institution 1,043,998,
author-writes-paper 7,145,660, paper-cites-paper 5,416,271, paper-has_topic-field
7,505,078 edges (21.1M); 349 venues as classes; 128 float32 features on papers only;
a time split as ogbn-mag's: papers of years up to 2017 train (629,571), 2018 validate
(64,879), 2019 test (41,939), years in `node_info["paper"]["year"]`. Reverse relations
come with `add_reverse` (default True, as PyG's ToUndirected: cites made symmetric).

igbh-like at `scale=1` is IGBH-full's shape divided by 32 (fits one 80 GB GPU with
1024-wide bfloat16 features on every type, ~35 GB): 8,417,068 papers, 8,663,153 authors,
22,280 fields of study, 841 institutes, 1,533 journals, 142 conferences; cites
124.9M, written_by 22.4M, topic 32.8M, affiliated_to 3.65M edges (IGBH-full's counts
/ 32, recalled from the IGB release and not checked against a file here), published
(journal) 0.6 and venue (conference) 0.2 per paper (an assumption); 2,983 classes on
58.5 % of the papers (IGBH's labelled share), split 90/5/5 at random.

Each stage draws from its own stream (per type its communities and propensities, per
relation its edges, per type its features, then the split), so no stage shifts another:
output is a function of (scale, seed) and the NumPy version. mag-like draws each stage
from one stream, in order. igbh-like (~35 GB at scale 1) splits its two large stages
into fixed blocks, each with a stream of its own, `SeedSequence([stage, seed],
spawn_key=key)`: a relation's draws in blocks of 2**20 (key (round, block)), a type's
feature rows in blocks of 2**22 entries (key (block,)), so blocks run on several
threads (`threads`: the draws'; building the graph from them and checking the features
use `host_parallel.host_threads()` whatever `threads` says) and the output does not
depend on how many. Its noise is the standard normal to 16 bits (65,536 equally likely
quantiles, |z| <= 4.33, steps under 7e-5 within one standard deviation), in about half
the time of NumPy's normals. It keeps a relation's distinct pairs in (dst, src) order,
CSR's (`from_edge_list` finds their keys ascending and does not sort them again), and
drops the draws past the count at random (mag-like keeps the first draws).
"""

from __future__ import annotations

import dataclasses
import functools
import math
from statistics import NormalDist

import numpy as np

from zerognn_jax._src.data.hetero_dataset import HeteroDataset, make_hetero_dataset
from zerognn_jax._src.data.host_parallel import host_threads, merge_sorted, thread_map
from zerognn_jax._src.data.synthetic import _rng, check_scale
from zerognn_jax._src.data.tables import BFLOAT16

_CHUNK = 1 << 22  # draws per chunk (mag-like), feature entries per block (igbh-like)
_DRAWS = 1 << 20  # draws per block (igbh-like)
_ROUNDS = 8  # draw rounds of a relation, at most
_SUBROWS = 256  # feature rows drawn and cast at a time (in cache)
_PROPENSITY_CAP = 200.0


@dataclasses.dataclass(frozen=True)
class _Preset:
    """A typed community model (module docstring): node types and relations at scale 1.

    relations: ((src, name, dst), edges at scale 1, locality), ...
    features: {type: (width, centroid std)}; types left out have none.
    blockwise: edges and features drawn in blocks of their own streams, on threads
      (module docstring); else one stream per stage, in order.
    """

    name: str
    nodes: dict
    relations: tuple
    target: str
    classes: int
    features: dict
    labelled: float = 1.0
    min_nodes: int = 4
    blockwise: bool = False


MAG = _Preset(
    "mag-like",
    {"paper": 736_389, "author": 1_134_649, "institution": 8_740, "field_of_study": 59_965},
    ((("author", "affiliated_with", "institution"), 1_043_998, 0.5),
     (("author", "writes", "paper"), 7_145_660, 0.35),
     (("paper", "cites", "paper"), 5_416_271, 0.3),
     (("paper", "has_topic", "field_of_study"), 7_505_078, 0.25)),
    "paper", 349, {"paper": (128, 0.2)})
MAG_SPLIT = (629_571, 64_879, 41_939)  # train (years <= 2017), valid (2018), test (2019)

IGBH = _Preset(
    "igbh-like",
    {"paper": 8_417_068, "author": 8_663_153, "fos": 22_280, "institute": 841,
     "journal": 1_533, "conference": 142},
    ((("paper", "cites", "paper"), 124_888_813, 0.3),
     (("paper", "written_by", "author"), 22_398_798, 0.35),
     (("author", "affiliated_to", "institute"), 3_654_997, 0.5),
     (("paper", "topic", "fos"), 32_821_269, 0.25),
     (("paper", "published", "journal"), 5_050_241, 0.5),
     (("paper", "venue", "conference"), 1_683_414, 0.5)),
    "paper", 2_983,
    {t: (1024, 0.07) for t in ("paper", "author", "fos", "institute", "journal",
                               "conference")},
    labelled=0.585, blockwise=True)


class _Pool:
    """Nodes of one type sorted by community with cumulative propensities: draws in
    proportion to propensity from everywhere or from one community.

    A draw u in [0, total) lands at the first position whose cumulative propensity
    exceeds u (`np.searchsorted(cum, u, side="right")`), found from a guide table rather
    than a binary search: with one bucket of width total / N per node, `guide[b]` is
    the answer for the start of bucket b - 1, at most a few positions before the answer
    for any u in bucket b (propensities are >= 1), which a short walk forward reaches.
    """

    def __init__(self, community: np.ndarray, weight: np.ndarray, classes: int):
        ids = community.astype(np.uint16) if classes <= 1 << 16 else community
        self.order = np.argsort(ids, kind="stable").astype(np.int32)  # radix for uint16
        self._walk = np.append(np.cumsum(weight[self.order]), np.inf)  # the walk stops at N
        self.cum = self._walk[:-1]
        sums = np.bincount(community, weights=weight, minlength=classes)
        self.end = np.cumsum(sums)
        self.start = self.end - sums
        n = self.order.size
        self._per_total = n / self.cum[-1]  # buckets per unit of propensity
        self._guide = np.searchsorted(self.cum, np.maximum(np.arange(n) - 1, 0)
                                      / self._per_total, side="right").astype(np.int32)

    def _at(self, u: np.ndarray) -> np.ndarray:
        bucket = np.minimum((u * self._per_total).astype(np.int64), self._guide.size - 1)
        pos = self._guide[bucket].astype(np.int64)
        ahead = np.flatnonzero(self._walk[pos] <= u)
        while ahead.size:
            pos[ahead] += 1
            ahead = ahead[self._walk[pos[ahead]] <= u[ahead]]
        return self.order[np.minimum(pos, self.order.size - 1)]

    def anywhere(self, rng, m: int) -> np.ndarray:
        return self._at(rng.random(m) * self.cum[-1])

    def within(self, rng, communities: np.ndarray) -> np.ndarray:
        lo, hi = self.start[communities], self.end[communities]
        u = lo + rng.random(communities.shape[0]) * (hi - lo)
        empty = hi <= lo
        u[empty] = rng.random(int(empty.sum())) * self.cum[-1]
        return self._at(u)


def _scaled(preset: _Preset, scale: float) -> dict[str, int]:
    check_scale(scale)
    counts = {t: max(preset.min_nodes, round(n * scale)) for t, n in preset.nodes.items()}
    if counts[preset.target] < 100:
        raise ValueError(f"scale={scale} gives {counts[preset.target]} {preset.target} nodes; "
                         f"{preset.name} needs >= 100")
    return counts


def _propensity(n: int, rng) -> np.ndarray:
    """float64[n] >= 1: Pareto propensities capped at min(200, max(1, n / 100)), about
    50 times their mean (4.3)."""
    w = (1.0 - rng.random(n)) ** (-1.0 / 1.3)
    return np.minimum(w, min(_PROPENSITY_CAP, max(1.0, n / 100)))


def _stream(seed: int, stage: int, *block: int) -> np.random.Generator:
    """The generator of one block of a stage (module docstring); `_rng(seed, stage)` is
    the stage's own, which no block's equals."""
    return np.random.default_rng(np.random.SeedSequence([stage, seed], spawn_key=block))


def _draw_chunk(k: int, locality: float, src_pool: _Pool, dst_pool: _Pool, dst_community,
                rng):
    """(src, dst) int32[k] draws of one relation (module docstring, step 2)."""
    dst = dst_pool.anywhere(rng, k)
    src = src_pool.anywhere(rng, k)
    local = rng.random(k) < locality
    src[local] = src_pool.within(rng, dst_community[dst[local]])
    return src, dst


def _draw_pairs(m: int, locality: float, src_pool: _Pool, dst_pool: _Pool, dst_community,
                rng):
    """(src, dst) int64[m] draws of one relation, chunk after chunk from one stream."""
    pairs = [_draw_chunk(min(_CHUNK, m - start), locality, src_pool, dst_pool,
                         dst_community, rng) for start in range(0, m, _CHUNK)]
    return (np.concatenate([p[0] for p in pairs]).astype(np.int64),
            np.concatenate([p[1] for p in pairs]).astype(np.int64))


def _draw_relation(relation, m: int, locality: float, pools, community, rng):
    """(src, dst) int64[~m] of one relation: loops within a type and repeated pairs are
    dropped and more edges drawn until the count is within 1 % of `m` (at most 8 rounds;
    `m` is capped at a quarter of the pairs)."""
    src_t, _, dst_t = relation
    n_dst = pools[dst_t].order.size
    m = min(m, pools[src_t].order.size * n_dst // 4)
    keys, drawn, want = np.zeros(0, np.int64), 0, m
    for _ in range(_ROUNDS):
        src, dst = _draw_pairs(want, locality, pools[src_t], pools[dst_t], community[dst_t],
                               rng)
        drawn += want
        new = src * n_dst + dst
        if src_t == dst_t:
            new = new[src != dst]
        keys = np.concatenate([keys, new])
        keys = keys[np.sort(np.unique(keys, return_index=True)[1])]  # first draws kept
        if keys.size >= 0.99 * m:
            break
        want = math.ceil((m - keys.size) * drawn / max(keys.size, 1))
    keys = keys[:m]
    return keys // n_dst, keys % n_dst


def _key_block(relation, want: int, locality: float, pools, community, seed: int,
               stage: int, rnd: int, b: int) -> np.ndarray:
    """Sorted keys dst * N_src + src of block b of draw round `rnd` (loops dropped)."""
    src_t, _, dst_t = relation
    src, dst = _draw_chunk(min(_DRAWS, want - b * _DRAWS), locality, pools[src_t],
                           pools[dst_t], community[dst_t], _stream(seed, stage, rnd, b))
    keys = dst.astype(np.int64) * pools[src_t].order.size + src
    return np.sort(keys[src != dst] if src_t == dst_t else keys)


def _draw_relation_blocks(relation, m: int, locality: float, pools, community, seed: int,
                          stage: int, threads: int):
    """(src, dst) int64[~m] of one relation in (dst, src) order, as `_draw_relation`
    draws and drops them but in blocks of their own streams (module docstring); the
    pairs past `m` are dropped at random."""
    src_t, _, dst_t = relation
    n_src, n_dst = pools[src_t].order.size, pools[dst_t].order.size
    m = min(m, n_src * n_dst // 4)
    ranges = min(4 * threads, n_dst)
    cuts = np.arange(ranges + 1, dtype=np.int64) * n_dst // ranges * n_src  # by dst
    keys, drawn, want = np.zeros(0, np.int64), 0, m
    for rnd in range(_ROUNDS):
        block = functools.partial(_key_block, relation, want, locality, pools, community,
                                  seed, stage, rnd)
        parts = [keys, *thread_map(block, -(-want // _DRAWS), threads)]
        keys = np.concatenate(merge_sorted(parts, cuts, distinct=True, threads=threads))
        drawn += want
        if keys.size >= 0.99 * m:
            break
        want = math.ceil((m - keys.size) * drawn / max(keys.size, 1))
    if keys.size > m:
        keys = np.delete(keys, _stream(seed, stage, _ROUNDS).choice(keys.size, keys.size - m,
                                                                    replace=False))
    return keys % n_src, keys // n_src


def _features(community, width: int, std: float, classes: int, dtype, rng) -> np.ndarray:
    """[n, width] centroid-plus-noise rows in `dtype`, written block by block."""
    centroids = rng.standard_normal((classes, width), dtype=np.float32) * std
    out = np.empty((community.shape[0], width), dtype)
    rows = max(1, _CHUNK // width)
    for start in range(0, community.shape[0], rows):
        block = rng.standard_normal((min(rows, community.shape[0] - start), width),
                                    dtype=np.float32)
        block += centroids[community[start:start + rows]]
        out[start:start + rows] = block.astype(dtype, copy=False)
    return out


@functools.cache
def _normal_table() -> np.ndarray:
    """float32[65536]: the standard normal's quantiles at (i + 1/2) / 65,536."""
    normal = NormalDist()
    return np.array([normal.inv_cdf((i + 0.5) / 65536) for i in range(65536)], np.float32)


def _normals(rng, n: int) -> np.ndarray:
    """float32[n] standard normals to 16 bits: the quantile at (i + 1/2) / 65,536 of the
    standard normal for i the next 16 bits of `rng`'s 64-bit draws (|z| <= 4.33)."""
    words = rng.bit_generator.random_raw(-(-n // 4)).astype("<u8", copy=False)
    return _normal_table()[words.view("<u2")[:n]]


def _feature_block(out: np.ndarray, community, centroids, seed: int, stage: int,
                   b: int) -> None:
    """Writes block b of `out`'s rows (`_features_blocks`) in `out`'s dtype, `_SUBROWS`
    rows at a time: normals of the block's stream, in order, plus the centroids."""
    rows, width = max(1, _CHUNK // out.shape[1]), out.shape[1]
    rng = _stream(seed, stage, b)
    for start in range(b * rows, min((b + 1) * rows, out.shape[0]), _SUBROWS):
        k = min(_SUBROWS, out.shape[0] - start, (b + 1) * rows - start)
        noise = _normals(rng, k * width).reshape(k, width)
        noise += centroids[community[start:start + k]]
        out[start:start + k] = noise


def _features_blocks(community, width: int, std: float, classes: int, dtype, seed: int,
                     stage: int, threads: int) -> np.ndarray:
    """`_features`' rows drawn in blocks of their own streams (module docstring), the
    centroids from the stage's stream."""
    centroids = _rng(seed, stage).standard_normal((classes, width), dtype=np.float32) * std
    out = np.empty((community.shape[0], width), dtype)
    block = functools.partial(_feature_block, out, community, centroids, seed, stage)
    thread_map(block, -(-community.shape[0] // max(1, _CHUNK // width)), threads)
    return out


def _type_pool(preset: _Preset, n: int, prior, seed: int, i: int):
    """(community, _Pool) of node type i of `preset`, `n` nodes, from its stream."""
    rng = _rng(seed, 100 + i)
    community = rng.choice(preset.classes, size=n, p=prior).astype(np.int32)
    return community, _Pool(community, _propensity(n, rng), preset.classes)


def _typed_community(preset: _Preset, scale: float, seed: int, feature_dtype,
                     threads: int = 1):
    """(counts, edges, features, community) of `preset` at `scale`."""
    counts = _scaled(preset, scale)
    prior = 1.0 / np.arange(1, preset.classes + 1)
    prior /= prior.sum()
    types = list(counts.items())
    made = thread_map(lambda i: _type_pool(preset, types[i][1], prior, seed, i), len(types),
                      threads)
    community = {t: c for (t, _), (c, _) in zip(types, made)}
    pools = {t: p for (t, _), (_, p) in zip(types, made)}
    edges, features = {}, {}
    for i, (rel, m, locality) in enumerate(preset.relations):
        edges[rel] = (_draw_relation_blocks(rel, round(m * scale), locality, pools,
                                            community, seed, 200 + i, threads)
                      if preset.blockwise else
                      _draw_relation(rel, round(m * scale), locality, pools, community,
                                     _rng(seed, 200 + i)))
    for i, (t, (width, std)) in enumerate(preset.features.items()):
        features[t] = (_features_blocks(community[t], width, std, preset.classes,
                                        feature_dtype, seed, 300 + i, threads)
                       if preset.blockwise else
                       _features(community[t], width, std, preset.classes, feature_dtype,
                                 _rng(seed, 300 + i)))
    return counts, edges, features, community


def mag_like(scale: float = 1.0, seed: int = 0, *, add_reverse: bool = True) -> HeteroDataset:
    """The mag-like typed graph (module docstring); counts scale with `scale`."""
    counts, edges, features, community = _typed_community(MAG, scale, seed, np.float32)
    n = counts["paper"]
    total = sum(MAG_SPLIT)
    order = _rng(seed, 400).permutation(n)
    n_test, n_val = round(n * MAG_SPLIT[2] / total), round(n * MAG_SPLIT[1] / total)
    year = np.empty(n, np.int32)
    year[order[:n_test]] = 2019
    year[order[n_test:n_test + n_val]] = 2018
    year[order[n_test + n_val:]] = _rng(seed, 401).integers(2010, 2018, n - n_test - n_val)
    return make_hetero_dataset(
        "mag-like", counts, edges, target_type="paper", labels=community["paper"],
        train_idx=np.flatnonzero(year <= 2017), val_idx=np.flatnonzero(year == 2018),
        test_idx=np.flatnonzero(year == 2019), num_classes=MAG.classes, features=features,
        add_reverse=add_reverse, node_info={"paper": {"year": year}})


def igbh_like(scale: float = 1.0, seed: int = 0, *, feature_dtype: str = "bfloat16",
              add_reverse: bool = True, threads: int | None = None) -> HeteroDataset:
    """The igbh-like typed graph (module docstring), features in `feature_dtype`
    ("bfloat16" or "float32") on every type; counts scale with `scale`. `threads`
    (default `host_threads()`, the CPUs this process may use) draw the blocks; the
    output does not depend on it."""
    dtype = {"bfloat16": BFLOAT16, "float32": np.dtype(np.float32)}.get(feature_dtype)
    if dtype is None:
        raise ValueError(f"feature_dtype must be bfloat16 or float32, got {feature_dtype!r}")
    threads = host_threads() if threads is None else threads
    if threads < 1:
        raise ValueError(f"threads must be at least 1, got {threads}")
    counts, edges, features, community = _typed_community(IGBH, scale, seed, dtype, threads)
    n = counts["paper"]
    rng = _rng(seed, 400)
    labels = np.where(rng.random(n) < IGBH.labelled, community["paper"], -1).astype(np.int32)
    labelled = rng.permutation(np.flatnonzero(labels >= 0))
    n_val = n_test = round(0.05 * labelled.size)
    return make_hetero_dataset(
        "igbh-like", counts, edges, target_type="paper", labels=labels,
        train_idx=np.sort(labelled[n_val + n_test:]), val_idx=np.sort(labelled[:n_val]),
        test_idx=np.sort(labelled[n_val:n_val + n_test]), num_classes=IGBH.classes,
        features=features, add_reverse=add_reverse)
