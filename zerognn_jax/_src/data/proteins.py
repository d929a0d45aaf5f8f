"""proteins-like: a synthetic graph of ogbn-proteins' shape whose targets need its edge
features.

At `scale=1`: 132,534 nodes in 8 species, ~19.8M undirected edges stored both ways
(~39.6M directed, ogbn-proteins' counts), 8 edge features in (0, 1), 112 binary targets,
no node features (a constant 1.0 column), and a species split: 6 species for training
(86,619 nodes), one for validation (21,236), one for testing (24,679), ogbn-proteins'
counts. Node, edge and split counts scale with `scale`.

  1. Species sizes are fixed (the training nodes spread 30/20/15/15/10/10 % over six
     species); a random permutation scatters the species over the node ids.
  2. Expected degrees follow a Pareto law (density ~ d^-2.3), capped at 7,750 and at a
     quarter of the node's species, rescaled to the target mean (~298.5). Edges join
     nodes of the same species only (as protein associations do), Chung-Lu style in
     proportion to expected degree (synthetic.py's stub table), loops and duplicates
     dropped. Where the target count would exceed 10 % of the pairs inside species
     (scales below ~0.16), the edge count is capped there, so the mean degree falls.
  3. Every node has a hidden vector h_v ~ N(0, I_8); the undirected edge {u, v} gets
     features sigmoid(h_u + h_v + 0.5 eps), eps ~ N(0, I_8), the same in both directions.
     The mean of a node's incident edge features thus reveals h_v, while the graph's
     structure (drawn without h) says nothing about it.
  4. Target j of node v: with m_v the mean of v's incident edge features and w_j ~
     N(0, I_8) a hidden direction, z_vj = standardised (m_v . w_j) plus N(0, 0.6^2)
     noise, and the target is 1 where z_vj lies above its (1 - r_j) quantile, r_j ~
     U(0.05, 0.5) the target's positive rate. Nodes without edges get z = noise only.
     Node features are constant, so without the edge features nothing predicts the
     targets beyond their base rates.

Each stage draws from its own stream; output is a function of (scale, seed) and the
NumPy version. Measured cost: docs/datasets.md.
"""

from __future__ import annotations

import math

import numpy as np
from scipy.special import expit

from zerognn_jax._src.data import undirected
from zerognn_jax._src.data.dataset import Dataset, make_dataset
from zerognn_jax._src.data.synthetic import _Model, _rng, _sample_edges, _StubTable

PROTEINS_NODES = 132_534
PROTEINS_EDGES = 19_780_626  # undirected; 39,561,252 directed
PROTEINS_SPLIT = (86_619, 21_236, 24_679)  # train, val, test nodes
TRAIN_SPECIES = (0.3, 0.2, 0.15, 0.15, 0.1, 0.1)  # shares of the training nodes
NUM_EDGE_FEATURES = 8
NUM_TARGETS = 112
MAX_DEGREE = 7_750
_DENSITY_CAP = 0.1  # at most this share of the node pairs inside each species
_NOISE = 0.6
_MIN_NODES = 1_000
_CHUNK = 1 << 22
_EDGES = _Model(community_edge_prob=1.0)  # every edge stays inside its species


def proteins_like(scale: float = 1.0, seed: int = 0) -> Dataset:
    """The proteins-like graph (module docstring); counts scale with `scale`."""
    n = round(PROTEINS_NODES * scale)
    if not math.isfinite(scale) or n < _MIN_NODES:
        raise ValueError(f"scale={scale} gives {n} nodes; proteins-like needs >= {_MIN_NODES}")
    sizes = _species_sizes(n)
    species = _rng(seed, 20).permutation(np.repeat(np.arange(sizes.size), sizes))
    species = species.astype(np.int32)
    pairs = int(np.sum(sizes * (sizes - 1) // 2))
    m = min(round(PROTEINS_EDGES * scale), int(_DENSITY_CAP * pairs))
    stubs = _expected_degrees(species, sizes, m, _rng(seed, 21))
    upper = _sample_edges(n, m, _StubTable.build(species, stubs), _EDGES, _rng(seed, 22))
    lo = np.repeat(np.arange(n, dtype=np.int32), np.diff(upper.indptr))
    hidden = _rng(seed, 23).standard_normal((n, NUM_EDGE_FEATURES), dtype=np.float32)
    table = _edge_features(lo, upper.indices, hidden, _rng(seed, 24))
    targets = _targets(lo, upper.indices, table, n, _rng(seed, 25))
    graph = undirected.symmetric_graph(upper, table)
    del upper, lo, table
    train = np.flatnonzero(species < len(TRAIN_SPECIES))
    val = np.flatnonzero(species == len(TRAIN_SPECIES))
    test = np.flatnonzero(species == len(TRAIN_SPECIES) + 1)
    return make_dataset("proteins-like", graph.indptr, graph.indices,
                        np.ones((n, 1), np.float32), None, train, val, test, NUM_TARGETS,
                        targets=targets, target_kind="multilabel",
                        edge_features=graph.edge_features)


def _species_sizes(n: int) -> np.ndarray:
    """int64[8]: six training species, then the validation and the test species."""
    total = sum(PROTEINS_SPLIT)
    train, val = round(n * PROTEINS_SPLIT[0] / total), round(n * PROTEINS_SPLIT[1] / total)
    shares = np.floor(np.asarray(TRAIN_SPECIES) * train).astype(np.int64)
    shares[0] += train - shares.sum()
    return np.concatenate([shares, [val, n - train - val]]).astype(np.int64)


def _expected_degrees(species, sizes, m: int, rng) -> np.ndarray:
    """int64[n] >= 1: Pareto expected degrees, capped per species, summing to ~2m."""
    weights = (1.0 - rng.random(species.shape[0])) ** (-1.0 / (_EDGES.degree_exponent - 1.0))
    cap = np.minimum(MAX_DEGREE, 0.25 * sizes[species])
    degrees = weights * (2 * m / weights.sum())
    for _ in range(8):  # capping lowers the sum; rescale and cap again until stable
        np.minimum(degrees, cap, out=degrees)
        degrees *= 2 * m / degrees.sum()
    return np.maximum(1, np.rint(degrees)).astype(np.int64)


def _edge_features(lo, hi, hidden, rng) -> np.ndarray:
    """float32[E, 8]: sigmoid(h_lo + h_hi + 0.5 eps) per undirected edge, in chunks."""
    out = np.empty((lo.shape[0], NUM_EDGE_FEATURES), np.float32)
    rows = max(1, _CHUNK // NUM_EDGE_FEATURES)
    for start in range(0, lo.shape[0], rows):
        block = out[start:start + rows]
        rng.standard_normal(out=block, dtype=np.float32)
        block *= 0.5
        block += hidden[lo[start:start + rows]]
        block += hidden[hi[start:start + rows]]
        expit(block, out=block)
    return out


def _targets(lo, hi, table, n: int, rng) -> np.ndarray:
    """float32[n, 112] binary targets from each node's mean incident edge features."""
    sums = np.zeros((n, NUM_EDGE_FEATURES), np.float64)
    for col in range(NUM_EDGE_FEATURES):
        sums[:, col] = (np.bincount(lo, table[:, col], minlength=n)
                        + np.bincount(hi, table[:, col], minlength=n))
    degree = np.bincount(lo, minlength=n) + np.bincount(hi, minlength=n)
    has = degree > 0
    means = sums[has] / degree[has, None]
    directions = rng.standard_normal((NUM_EDGE_FEATURES, NUM_TARGETS))
    score = np.zeros((n, NUM_TARGETS))
    proj = means @ directions
    score[has] = (proj - proj.mean(0)) / np.maximum(proj.std(0), 1e-12)
    score += _NOISE * rng.standard_normal((n, NUM_TARGETS))
    rate = rng.uniform(0.05, 0.5, NUM_TARGETS)
    threshold = np.array([np.quantile(score[:, j], 1 - rate[j]) for j in range(NUM_TARGETS)])
    return (score > threshold).astype(np.float32)
