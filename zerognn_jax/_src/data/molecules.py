"""molhiv-like and molpcba-like: synthetic molecule collections of ogbg-molhiv's and
ogbg-molpcba's shape whose labels depend on substructures.

At `scale=1`: molhiv-like has 41,127 graphs (ogbg-molhiv's count), molpcba-like
437,929; both ~25.5 atoms and ~27.5 bonds per graph (each bond two directed edges),
OGB's 9 categorical atom and 3 bond features with OGB's vocabulary sizes
(ogbg.ATOM_VOCAB, BOND_VOCAB), and an 80/10/10 random split.

  1. Atoms per graph ~ Gamma(5.4, 4.7) rounded, clipped to [2, 222] (mean ~25.5).
  2. A tree: atom i > 0 bonds to atom i - 1 with probability 0.75, else to a uniform
     earlier atom. Rings: Poisson(3.45) extra bonds per graph, each closing a 6-ring
     (atom i to atom i - 5); duplicates dropped.
  3. Elements C, N, O, S, F, Cl, Br, P with shares 72, 11, 11, 2, 1.5, 1.5, 0.5, 0.5 %;
     the other atom features follow (degree, Hs = valence - degree, in-ring, aromatic
     ring atoms as SP2, a little chirality and charge noise), bonds are aromatic in
     rings, else single or (10 %) double.
  4. Motifs: per graph the presence of each element pair joined by a bond (36), and of
     each element in a ring (8). A task's score is the sum of 2 or 3 motif indicators
     (molhiv-like: an N-S bond, an S in a ring, two or more halogens) plus N(0, 0.3^2)
     noise; its positives are the graphs above the (1 - rate) quantile (molhiv-like:
     3.5 %; molpcba-like: 128 tasks, rates U(0.5 %, 5 %), each label missing with a
     per-task probability U(0.2, 0.8)). Motif presence grows with size, but size alone
     predicts little of it: a GNN that sees bonds beats a node-count baseline.

Output is a function of (scale, seed) and the NumPy version.
"""

from __future__ import annotations

import numpy as np

from zerognn_jax._src.data.graphs import GraphCollection, make_collection
from zerognn_jax._src.data.ogbg import ATOM_VOCAB, BOND_VOCAB
from zerognn_jax._src.data.synthetic import check_scale

MOLHIV_GRAPHS, MOLPCBA_GRAPHS = 41_127, 437_929
ELEMENTS = np.array([6, 7, 8, 16, 9, 17, 35, 15])  # atomic numbers
SHARES = np.array([72, 11, 11, 2, 1.5, 1.5, 0.5, 0.5]) / 100
VALENCE = np.array([4, 3, 2, 2, 1, 1, 1, 3])
HALOGENS = np.array([4, 5, 6])  # positions of F, Cl, Br in ELEMENTS
K = ELEMENTS.size


def _rng(seed: int, stream: int) -> np.random.Generator:
    return np.random.default_rng([seed, stream, 0x6D6F6C])


def _sizes(graphs: int, rng) -> np.ndarray:
    return np.clip(np.rint(rng.gamma(5.4, 4.7, graphs)), 2, 222).astype(np.int64)


def _bonds(n_node: np.ndarray, rng) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(graph, u, v) of every bond, u > v local ids, sorted by graph, no duplicates,
    and a ring flag per bond."""
    graph_of = np.repeat(np.arange(n_node.size), n_node)
    first = np.repeat(np.concatenate([[0], np.cumsum(n_node)[:-1]]), n_node)
    local = np.arange(graph_of.size) - first
    child = local > 0
    g, i = graph_of[child], local[child]
    chain = rng.random(i.size) < 0.75
    parent = np.where(chain, i - 1, np.floor(rng.random(i.size) * i).astype(np.int64))
    rings = rng.poisson(3.45, n_node.size) * (n_node >= 6)
    ring_g = np.repeat(np.arange(n_node.size), rings)
    ring_i = 5 + np.floor(rng.random(ring_g.size) * (n_node[ring_g] - 5)).astype(np.int64)
    all_g = np.concatenate([g, ring_g])
    all_u = np.concatenate([i, ring_i])
    all_v = np.concatenate([parent, ring_i - 5])
    is_ring = np.concatenate([np.zeros(i.size, bool), np.ones(ring_g.size, bool)])
    key = (all_g * 256 + all_u) * 256 + all_v
    _, keep = np.unique(key, return_index=True)  # sorted by graph, then u, then v
    return all_g[keep], all_u[keep], all_v[keep], is_ring[keep]


def _ring_atoms(n_node, g, u, ring) -> np.ndarray:
    """bool[N]: atoms on a closed 6-ring (i - 5 .. i of each ring bond)."""
    first = np.concatenate([[0], np.cumsum(n_node)[:-1]])
    flag = np.zeros(int(n_node.sum()), bool)
    top = first[g[ring]] + u[ring]
    for k in range(6):
        flag[top - k] = True
    return flag


def _features(n_node, g, u, v, ring, rng):
    """(element index int[N], atoms int32[N, 9], bond features int32[B, 3])."""
    n = int(n_node.sum())
    first = np.concatenate([[0], np.cumsum(n_node)[:-1]])
    element = rng.choice(K, size=n, p=SHARES)
    gu, gv = first[g] + u, first[g] + v
    degree = np.bincount(np.concatenate([gu, gv]), minlength=n)
    in_ring = _ring_atoms(n_node, g, u, ring)
    aromatic = in_ring & np.isin(element, [0, 1]) & (rng.random(n) < 0.8)
    atoms = np.zeros((n, len(ATOM_VOCAB)), np.int32)
    atoms[:, 0] = ELEMENTS[element] - 1
    atoms[:, 1] = np.where((degree >= 3) & (rng.random(n) < 0.05), 1 + (rng.random(n) < .5), 0)
    atoms[:, 2] = np.minimum(degree, 10)
    atoms[:, 3] = np.where(rng.random(n) < 0.01, 6, 5)  # formal charge +1 or 0
    atoms[:, 4] = np.clip(VALENCE[element] - degree - aromatic, 0, 8)
    atoms[:, 6] = np.where(aromatic, 1, 2)  # SP2, SP3
    atoms[:, 7], atoms[:, 8] = aromatic, in_ring
    both_aromatic = aromatic[gu] & aromatic[gv]
    bond_type = np.where(both_aromatic, 3, np.where(rng.random(g.size) < 0.1, 1, 0))
    bonds = np.stack([bond_type, np.zeros_like(bond_type), bond_type > 0], 1)
    return element, atoms, bonds.astype(np.int32), gu, gv, in_ring


def _motifs(n_node, element, gu, gv, in_ring) -> np.ndarray:
    """bool[G, K * K + K + 1]: bond (a, b) present (ordered pair, both orders set), an
    element in a ring, two or more halogens."""
    graphs = n_node.size
    graph_of = np.repeat(np.arange(graphs), n_node)
    out = np.zeros((graphs, K * K + K + 1), bool)
    for a, b in ((gu, gv), (gv, gu)):
        out[graph_of[a], element[a] * K + element[b]] = True
    ring_nodes = np.flatnonzero(in_ring)
    out[graph_of[ring_nodes], K * K + element[ring_nodes]] = True
    halogens = np.bincount(graph_of, np.isin(element, HALOGENS), minlength=graphs)
    out[:, -1] = halogens >= 2
    return out


def _labels(motifs, weights, rates, rng) -> np.ndarray:
    """float32[G, T]: 1 above each task's (1 - rate) quantile of motif score + noise."""
    score = motifs.astype(np.float32) @ weights
    score += 0.3 * rng.standard_normal(score.shape, dtype=np.float32)
    cut = np.array([np.quantile(score[:, t], 1 - r) for t, r in enumerate(rates)])
    return (score > cut).astype(np.float32)


def _collection(name, graphs, seed, weights, rates, missing) -> GraphCollection:
    n_node = _sizes(graphs, _rng(seed, 1))
    g, u, v, ring = _bonds(n_node, _rng(seed, 2))
    element, atoms, bond_feats, gu, gv, in_ring = _features(n_node, g, u, v, ring,
                                                            _rng(seed, 3))
    labels = _labels(_motifs(n_node, element, gu, gv, in_ring), weights, rates,
                     _rng(seed, 4))
    if missing is not None:
        labels[_rng(seed, 5).random(labels.shape) < missing] = np.nan
    n_bond = np.bincount(g, minlength=graphs)
    senders = np.empty(2 * g.size, np.int64)
    senders[0::2], senders[1::2] = u, v
    receivers = np.empty_like(senders)
    receivers[0::2], receivers[1::2] = v, u
    order = _rng(seed, 6).permutation(graphs)
    n_train, n_val = int(0.8 * graphs), int(0.1 * graphs)
    splits = (np.sort(order[:n_train]), np.sort(order[n_train:n_train + n_val]),
              np.sort(order[n_train + n_val:]))
    return make_collection(name, n_node, 2 * n_bond, senders, receivers, atoms, labels,
                           "binary", edge_features=np.repeat(bond_feats, 2, axis=0),
                           splits=splits, node_vocab=ATOM_VOCAB, edge_vocab=BOND_VOCAB)


def _count(base: int, scale: float, name: str) -> int:
    check_scale(scale)
    graphs = round(base * scale)
    if graphs < 10:
        raise ValueError(f"scale={scale} gives {graphs} graphs; {name} needs >= 10")
    return graphs


def molhiv_like(scale: float = 1.0, seed: int = 0, *,
                positive_rate: float = 0.035) -> GraphCollection:
    """The molhiv-like collection (module docstring): one binary task whose positives
    hold an N-S bond, an S in a ring or two halogens (`positive_rate` of the graphs)."""
    if not 0.0 < positive_rate < 1.0:
        raise ValueError(f"positive_rate must be in (0, 1), got {positive_rate}")
    weights = np.zeros((K * K + K + 1, 1), np.float32)
    n, s = 1, 3  # positions of N and S in ELEMENTS
    weights[[n * K + s, K * K + s, K * K + K], 0] = 1.0
    return _collection("molhiv-like", _count(MOLHIV_GRAPHS, scale, "molhiv-like"), seed,
                       weights, [positive_rate], None)


def molpcba_like(scale: float = 1.0, seed: int = 0) -> GraphCollection:
    """The molpcba-like collection (module docstring): 128 binary tasks with missing
    labels, each on 2 or 3 random motifs."""
    rng = _rng(seed, 7)
    motifs = K * K + K + 1
    weights = np.zeros((motifs, 128), np.float32)
    for t in range(128):
        weights[rng.choice(motifs, size=2 + t % 2, replace=False), t] = 1.0
    rates = rng.uniform(0.005, 0.05, 128)
    missing = rng.uniform(0.2, 0.8, 128)
    return _collection("molpcba-like", _count(MOLPCBA_GRAPHS, scale, "molpcba-like"), seed,
                       weights, rates, missing)
