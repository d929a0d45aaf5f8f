"""Synthetic benchmark graphs: the products-like preset and Graph500-style R-MAT.

products-like: the shape of ogbn-products at `scale=1` (2,449,029 nodes, 61,859,140
undirected edges stored both ways, 100 float32 features, 47 classes, 196,615 training
nodes), from a degree-corrected community model:

  1. Every node gets a community z in [0, 47) with Zipf(1) sizes, and an expected degree
     from a Pareto law (density ~ d^-2.3) capped at ogbn-products' maximum degree 17,481
     (at most a tenth of the nodes at small scales), rescaled to mean 50.5.
  2. Each edge picks one end in proportion to expected degree; the other end comes from
     the same community with probability 0.9 (again degree-proportional), else from
     anywhere. Self-loops and duplicate edges are dropped and more edges are drawn until
     the count is within 0.5 % of the target (Chung-Lu sampling through a table of
     degree "stubs", no sort of the edge list).
  3. Most nodes take their community as label; a "misfit" node draws its label from the
     class prior instead. Misfits are common among low-degree nodes (probability
     0.4 * median degree / degree, at most 0.7), rare among hubs, so edges stay
     homophilous (edge label homophily 0.63) while 36 % of the nodes carry a label
     other than their neighbourhood's.
  4. Features are the label's centroid (N(0, 0.22^2) per coordinate) plus unit Gaussian
     noise: at scale 1 a linear model on the features alone reaches 60 % test accuracy;
     adding 1- and 2-hop neighbour means recovers the community and lifts it to 78 %
     (ogbn-products: MLP 61 %, GraphSAGE 79 %).
  5. Split: a random 196,615 * scale nodes for training, 39,323 * scale for validation
     (ogbn-products' proportions), the rest for testing.

The generator is vectorised NumPy and deterministic for a given (scale, seed) and NumPy
version; each stage draws from its own stream. Measured cost: docs/datasets.md.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from zerognn_jax._src.data import undirected
from zerognn_jax._src.data.dataset import Dataset, make_dataset

PRODUCTS_NODES = 2_449_029
PRODUCTS_EDGES = 61_859_140  # undirected; 123,718,280 directed
PRODUCTS_TRAIN = 196_615
PRODUCTS_VAL = 39_323
NUM_FEATURES = 100
NUM_CLASSES = 47
_MIN_NODES = 1_000
_CHUNK = 1 << 22


@dataclasses.dataclass(frozen=True)
class _Model:
    """Parameters of the products-like model (see the module docstring)."""

    degree_exponent: float = 2.3
    max_degree: int = 17_481
    max_degree_fraction: float = 0.1
    community_edge_prob: float = 0.9
    misfit_scale: float = 0.4
    misfit_max: float = 0.7
    class_zipf: float = 1.0
    centroid_std: float = 0.22
    count_tolerance: float = 5e-3


_PRODUCTS = _Model()


def _rng(seed: int, stream: int) -> np.random.Generator:
    """An independent generator per (seed, stage), so stages do not shift each other."""
    return np.random.default_rng([stream, seed])


def check_scale(scale: float) -> None:
    """Raises ValueError unless a preset's `scale` is a positive, finite number."""
    if not (scale > 0 and math.isfinite(scale)):
        raise ValueError(f"scale must be positive and finite, got {scale}")


def products_like(scale: float = 1.0, seed: int = 0) -> Dataset:
    """The products-like benchmark graph; node, edge and split counts scale with `scale`."""
    check_scale(scale)
    n = round(PRODUCTS_NODES * scale)
    if n < _MIN_NODES:
        raise ValueError(f"scale={scale} gives {n} nodes; products-like needs >= {_MIN_NODES}")
    m = round(PRODUCTS_EDGES * scale)
    model = _PRODUCTS
    stubs = _expected_degrees(n, m, model, _rng(seed, 0))
    community = _draw_classes(n, model, _rng(seed, 1))
    labels = _assign_labels(community, stubs, model, _rng(seed, 2))
    table = _StubTable.build(community, stubs)
    upper = _sample_edges(n, m, table, model, _rng(seed, 3))
    graph = undirected.symmetric_graph(upper)
    features = _features(labels, model.centroid_std, _rng(seed, 4))
    train, val, test = _random_split(
        n, round(PRODUCTS_TRAIN * scale), round(PRODUCTS_VAL * scale), _rng(seed, 5))
    return make_dataset("products-like", graph.indptr, graph.indices, features, labels,
                        train, val, test, NUM_CLASSES)


def _expected_degrees(n: int, m: int, model: _Model, rng) -> np.ndarray:
    """int64[n] >= 1: capped Pareto expected degrees summing to ~2m (the stub counts)."""
    weights = (1.0 - rng.random(n)) ** (-1.0 / (model.degree_exponent - 1.0))
    cap = min(model.max_degree, model.max_degree_fraction * n)
    degrees = weights * (2 * m / weights.sum())
    for _ in range(8):  # capping lowers the sum; rescale and cap again until stable
        np.minimum(degrees, cap, out=degrees)
        degrees *= 2 * m / degrees.sum()
    return np.maximum(1, np.rint(degrees)).astype(np.int64)


def _draw_classes(n: int, model: _Model, rng) -> np.ndarray:
    """int32[n] draws from the Zipf class prior."""
    prior = 1.0 / np.arange(1, NUM_CLASSES + 1) ** model.class_zipf
    return rng.choice(NUM_CLASSES, size=n, p=prior / prior.sum()).astype(np.int32)


def _assign_labels(community, stubs, model: _Model, rng) -> np.ndarray:
    """int32[n]: the community, except for misfits (likelier at low degree)."""
    n = community.shape[0]
    misfit_prob = np.minimum(model.misfit_max, model.misfit_scale * np.median(stubs) / stubs)
    misfit = rng.random(n) < misfit_prob
    return np.where(misfit, _draw_classes(n, model, rng), community).astype(np.int32)


@dataclasses.dataclass(frozen=True)
class _StubTable:
    """Node ids repeated by expected degree, grouped by community.

    Attributes:
      stubs: int32[S], node v appears stubs_v times; community c fills
        [offset[c], offset[c] + size[c]).
      community: int32[n] of every node; offset, size: int64[NUM_CLASSES].
    """

    stubs: np.ndarray
    community: np.ndarray
    offset: np.ndarray
    size: np.ndarray

    @classmethod
    def build(cls, community: np.ndarray, counts: np.ndarray) -> _StubTable:
        order = np.argsort(community, kind="stable").astype(np.int32)
        size = np.bincount(community, weights=counts, minlength=NUM_CLASSES).astype(np.int64)
        offset = np.concatenate([[0], np.cumsum(size)[:-1]])
        return cls(np.repeat(order, counts[order]), community, offset, size)

    def anywhere(self, rng, m: int) -> np.ndarray:
        """int32[m] nodes drawn in proportion to expected degree."""
        return self.stubs[rng.integers(0, self.stubs.shape[0], m, dtype=np.int64)]

    def within(self, rng, nodes: np.ndarray) -> np.ndarray:
        """int32[m] degree-proportional draws from the community of each of `nodes`."""
        c = self.community[nodes]
        pos = self.offset[c] + (rng.random(nodes.shape[0]) * self.size[c]).astype(np.int64)
        return self.stubs[pos]


def _draw_pairs(m: int, table: _StubTable, model: _Model, rng):
    """(lo, hi) int32[<= m]: m homophilous Chung-Lu edges minus self-loops, in chunks."""
    chunks = []
    for start in range(0, m, _CHUNK):
        k = min(_CHUNK, m - start)
        u = table.anywhere(rng, k)
        local = rng.random(k, dtype=np.float32) < model.community_edge_prob
        v = table.anywhere(rng, k)
        v[local] = table.within(rng, u[local])
        chunks.append(undirected.canonical_pairs(u, v))
    lo = np.concatenate([c[0] for c in chunks])
    hi = np.concatenate([c[1] for c in chunks])
    return lo, hi


def _sample_edges(n: int, m: int, table: _StubTable, model: _Model, rng):
    """Upper-triangular bool CSR [n, n] with ~m distinct undirected edges."""
    if m > 0.25 * n * (n - 1):
        raise ValueError(f"{m} edges are too many for a sparse graph on {n} nodes")
    upper = undirected.upper_matrix(*_draw_pairs(m, table, model, rng), n)
    drawn = m
    for _ in range(32):
        if upper.nnz >= m * (1 - model.count_tolerance):
            return upper
        extra = math.ceil((m - upper.nnz) * drawn / upper.nnz)
        upper = upper + undirected.upper_matrix(*_draw_pairs(extra, table, model, rng), n)
        drawn += extra
    raise RuntimeError(f"could not reach {m} distinct edges (have {upper.nnz})")


def _features(labels: np.ndarray, centroid_std: float, rng) -> np.ndarray:
    """float32[n, NUM_FEATURES]: class centroid plus unit Gaussian noise, row by row."""
    centroids = rng.standard_normal((NUM_CLASSES, NUM_FEATURES), dtype=np.float32)
    centroids *= centroid_std
    out = np.empty((labels.shape[0], NUM_FEATURES), np.float32)
    rows = max(1, _CHUNK // NUM_FEATURES)
    for start in range(0, labels.shape[0], rows):
        block = out[start:start + rows]
        rng.standard_normal(out=block, dtype=np.float32)
        block += centroids[labels[start:start + rows]]
    return out


def _random_split(n: int, num_train: int, num_val: int, rng):
    """Disjoint random (train, val, test) node ids, each sorted; test takes the rest."""
    perm = rng.permutation(n).astype(np.int32)
    parts = np.split(perm, [num_train, num_train + num_val])
    return tuple(np.sort(p) for p in parts)


def rmat(scale_log2: int, edge_factor: int = 16, a: float = 0.57, b: float = 0.19,
         c: float = 0.19, seed: int = 0) -> Dataset:
    """A Graph500-style R-MAT stress graph with random features and labels.

    `edge_factor * 2**scale_log2` edges are drawn on `2**scale_log2` nodes: at each of
    `scale_log2` levels an edge falls in the top-left, top-right, bottom-left or
    bottom-right quadrant with probability a, b, c, 1 - a - b - c, which fixes one bit of
    its source and destination ids. Node ids are then shuffled (as Graph500 does), and the
    graph is made undirected with self-loops and duplicates dropped, so it has fewer than
    `edge_factor * 2**scale_log2` undirected edges. Features are unit Gaussian noise
    (float32[n, 100]), labels uniform over 47 classes, the split random in ogbn-products'
    proportions (8.0 % train, 1.6 % val): useful for speed and memory, not accuracy.
    """
    if not 1 <= scale_log2 <= 30:
        raise ValueError(f"scale_log2 must be in [1, 30], got {scale_log2}")
    if edge_factor < 1:
        raise ValueError(f"edge_factor must be >= 1, got {edge_factor}")
    if min(a, b, c) < 0 or a + b + c > 1:
        raise ValueError(f"need a, b, c >= 0 with a + b + c <= 1, got {a}, {b}, {c}")
    n = 1 << scale_log2
    src, dst = _rmat_edges(scale_log2, edge_factor * n, (a, a + b, a + b + c), _rng(seed, 10))
    relabel = _rng(seed, 11).permutation(n).astype(np.int32)
    graph = undirected.undirected_csr(relabel[src], relabel[dst], n)
    labels = _rng(seed, 12).integers(0, NUM_CLASSES, n).astype(np.int32)
    features = _features(labels, 0.0, _rng(seed, 13))
    num_train = round(n * PRODUCTS_TRAIN / PRODUCTS_NODES)
    num_val = round(n * PRODUCTS_VAL / PRODUCTS_NODES)
    train, val, test = _random_split(n, max(1, num_train), num_val, _rng(seed, 14))
    return make_dataset(f"rmat-{scale_log2}", graph.indptr, graph.indices, features, labels,
                        train, val, test, NUM_CLASSES)


def _rmat_edges(levels: int, m: int, bounds: tuple[float, float, float], rng):
    """(src, dst) int32[m]: one uniform draw per edge and level picks the quadrant."""
    ab, abc = bounds[1], bounds[2]
    src = np.zeros(m, np.int32)
    dst = np.zeros(m, np.int32)
    for start in range(0, m, _CHUNK):
        s, d = src[start:start + _CHUNK], dst[start:start + _CHUNK]
        for level in range(levels):
            r = rng.random(s.shape[0], dtype=np.float32)
            s |= (r >= ab).astype(np.int32) << level
            d |= ((r >= bounds[0]) & (r < ab) | (r >= abc)).astype(np.int32) << level
    return src, dst
