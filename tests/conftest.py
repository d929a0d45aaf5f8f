"""Shared fixtures; tests marked `gpu` skip unless JAX's default backend is a GPU."""

from __future__ import annotations

import pathlib

import jax
import numpy as np
import pytest

from zerognn_jax import from_edge_list

SHARED = pathlib.Path(__file__).resolve().parents[2] / "shared" / "datasets"


def pytest_collection_modifyitems(config, items):
    if jax.default_backend() == "gpu":
        return
    skip = pytest.mark.skip(reason="needs an NVIDIA GPU (JAX backend is "
                                   f"{jax.default_backend()})")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def planetoid_root():
    root = SHARED / "planetoid"
    if not root.is_dir():
        pytest.skip(f"shared Planetoid files not found at {root}")
    return str(root)


def random_graph(num_nodes: int, num_edges: int, seed: int = 0, isolated: int = 0):
    """An undirected random graph; the last `isolated` nodes get no edges."""
    rs = np.random.default_rng(seed)
    hi = num_nodes - isolated
    src, dst = rs.integers(0, hi, num_edges), rs.integers(0, hi, num_edges)
    return from_edge_list(src, dst, num_nodes, make_undirected=True, remove_self_loops=True,
                          remove_duplicates=True)


@pytest.fixture(scope="session")
def small_graph():
    return random_graph(300, 1500, seed=1, isolated=5)
