"""proteins-like: a synthetic graph of ogbn-proteins' shape whose targets need its edge
features.

At `scale=1`: 132,534 nodes in 8 species, ~19.8M undirected edges stored both ways
(~39.6M directed, ogbn-proteins' counts), 8 edge features in (0, 1), 112 binary targets,
8 node features, and a species split: 6 species for training
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
  3. Every node has 8 observed features x_v ~ N(0, I_8) (ogbn-proteins has none; OGB's
     examples derive node inputs from the edges, and a preset whose node inputs are
     constant leaves an attention model nothing to weigh). The undirected edge {u, v}
     gets 8 association scores sigmoid(1.5 g), g ~ N(0, I_8), the same in both
     directions, and a strength s_uv = e_uv . c along a hidden unit direction c.
  4. Target j of node v: z_vj = standardised (x-bar_v . w_j) plus N(0, 0.6^2) noise,
     where x-bar_v is the mean of v's neighbours' x weighted by exp(beta s_uv) (beta
     = 5.6: about a tenth of a node's edges carry the weight) and w_j ~ N(0, I_8) is a
     hidden direction; the target is 1 where z_vj lies above its (1 - r_j) quantile,
     r_j ~ U(0.05, 0.5) the target's positive rate. Nodes without edges get z = noise.
     Which neighbours count is written only in the edges' features: a model that reads
     them in its attention (GAT with `edge_dim`) can weigh its neighbours as the
     targets do; without them the plain neighbour mean is all it has, and the edge
     features alone, without the neighbours' x, say nothing.

Each stage draws from its own stream; output is a function of (scale, seed) and the
NumPy version. Measured cost: docs/datasets.md.
"""

from __future__ import annotations

import numpy as np

from zerognn_jax._src.data import undirected
from zerognn_jax._src.data.dataset import Dataset, make_dataset
from zerognn_jax._src.data.synthetic import (
    _Model,
    _rng,
    _sample_edges,
    _StubTable,
    check_scale,
)

PROTEINS_NODES = 132_534
PROTEINS_EDGES = 19_780_626  # undirected; 39,561,252 directed
PROTEINS_SPLIT = (86_619, 21_236, 24_679)  # train, val, test nodes
TRAIN_SPECIES = (0.3, 0.2, 0.15, 0.15, 0.1, 0.1)  # shares of the training nodes
NUM_EDGE_FEATURES = 8
NUM_NODE_FEATURES = 8
NUM_TARGETS = 112
MAX_DEGREE = 7_750
_DENSITY_CAP = 0.1  # at most this share of the node pairs inside each species
_NOISE = 0.6
_EDGE_SCALE = 1.5  # association scores are sigmoid(1.5 g)
_BETA = 5.6  # sharpness of the edge weights exp(beta s_uv)
_MIN_NODES = 1_000
_CHUNK = 1 << 22
_EDGES = _Model(community_edge_prob=1.0)  # every edge stays inside its species


def proteins_like(scale: float = 1.0, seed: int = 0) -> Dataset:
    """The proteins-like graph (module docstring); counts scale with `scale`."""
    check_scale(scale)
    n = round(PROTEINS_NODES * scale)
    if n < _MIN_NODES:
        raise ValueError(f"scale={scale} gives {n} nodes; proteins-like needs >= {_MIN_NODES}")
    sizes = _species_sizes(n)
    species = _rng(seed, 20).permutation(np.repeat(np.arange(sizes.size), sizes))
    species = species.astype(np.int32)
    pairs = int(np.sum(sizes * (sizes - 1) // 2))
    m = min(round(PROTEINS_EDGES * scale), int(_DENSITY_CAP * pairs))
    stubs = _expected_degrees(species, sizes, m, _rng(seed, 21))
    upper = _sample_edges(n, m, _StubTable.build(species, stubs), _EDGES, _rng(seed, 22))
    lo = np.repeat(np.arange(n, dtype=np.int32), np.diff(upper.indptr))
    x = _rng(seed, 23).standard_normal((n, NUM_NODE_FEATURES), dtype=np.float32)
    table = _edge_features(lo.shape[0], _rng(seed, 24))
    targets = _targets(lo, upper.indices, table, x, _rng(seed, 25))
    graph = undirected.symmetric_graph(upper, table)
    del upper, lo, table
    train = np.flatnonzero(species < len(TRAIN_SPECIES))
    val = np.flatnonzero(species == len(TRAIN_SPECIES))
    test = np.flatnonzero(species == len(TRAIN_SPECIES) + 1)
    return make_dataset("proteins-like", graph.indptr, graph.indices,
                        x, None, train, val, test, NUM_TARGETS,
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


def _edge_features(m: int, rng) -> np.ndarray:
    """float32[m, 8]: sigmoid(1.5 g), g ~ N(0, I_8), per undirected edge, in chunks."""
    from scipy.special import expit  # 0.1-0.2 s to import; only this generator needs it

    out = np.empty((m, NUM_EDGE_FEATURES), np.float32)
    rows = max(1, _CHUNK // NUM_EDGE_FEATURES)
    for start in range(0, m, rows):
        block = out[start:start + rows]
        rng.standard_normal(out=block, dtype=np.float32)
        block *= _EDGE_SCALE
        expit(block, out=block)
    return out


def _targets(lo, hi, table, x, rng) -> np.ndarray:
    """float32[n, 112] binary targets from each node's neighbour mean of x, weighted by
    exp(beta s_uv) with s_uv the edge's strength along a hidden direction."""
    n = x.shape[0]
    c = rng.standard_normal(NUM_EDGE_FEATURES)
    c /= np.linalg.norm(c)
    strength = np.empty(lo.shape[0], np.float64)
    for start in range(0, lo.shape[0], _CHUNK):
        strength[start:start + _CHUNK] = table[start:start + _CHUNK] @ c
    weight = np.exp(_BETA * (strength - strength.max(initial=0.0)))
    del strength
    total = np.bincount(lo, weight, minlength=n) + np.bincount(hi, weight, minlength=n)
    sums = np.zeros((n, NUM_NODE_FEATURES), np.float64)
    for col in range(NUM_NODE_FEATURES):
        sums[:, col] = (np.bincount(lo, weight * x[hi, col], minlength=n)
                        + np.bincount(hi, weight * x[lo, col], minlength=n))
    has = total > 0
    directions = rng.standard_normal((NUM_NODE_FEATURES, NUM_TARGETS))
    score = np.zeros((n, NUM_TARGETS))
    proj = (sums[has] / total[has, None]) @ directions
    score[has] = (proj - proj.mean(0)) / np.maximum(proj.std(0), 1e-12)
    score += _NOISE * rng.standard_normal((n, NUM_TARGETS))
    rate = rng.uniform(0.05, 0.5, NUM_TARGETS)
    threshold = np.array([np.quantile(score[:, j], 1 - rate[j]) for j in range(NUM_TARGETS)])
    return (score > threshold).astype(np.float32)
