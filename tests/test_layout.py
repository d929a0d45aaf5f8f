"""The level layout decision (training/layout.py), without training."""

from __future__ import annotations

from zerognn_jax import SamplerConfig, TrainConfig
from zerognn_jax._src.training.layout import choose_layout
from zerognn_jax._src.training.tasks.node import NodeTask


def _layout(fanouts, *, max_degree=50, num_nodes=10_000, user_model=False, **cfg):
    config = TrainConfig(**{"model": "sage", **cfg}, fanouts=fanouts, layers=len(fanouts))
    sampler = SamplerConfig(fanouts).resolve(max_degree)
    return choose_layout(config, NodeTask(), sampler, 64, num_nodes, dedup=config.dedup,
                         user_model=user_model)


def test_sage_on_the_scan_engine_reads_a_flat_outer_hop():
    layout = _layout((5, 3), num_nodes=100)  # the tree is large against 100 nodes
    assert (layout.dedup, layout.flat_outer) == (True, True)


def test_an_outer_hop_of_every_neighbour_is_not_laid_flat():
    layout = _layout((5, -1), num_nodes=100)
    assert (layout.dedup, layout.flat_outer) == (True, False)
    assert "every neighbour" in layout.why
    asked = _layout((5, -1), num_nodes=100, flat_outer=True)  # an explicit request stands
    assert asked.flat_outer and "flat_outer=True" in asked.why


def test_a_fanout_above_the_largest_degree_keeps_the_flat_outer_hop():
    layout = _layout((5, 80), num_nodes=100)  # 80 slots capped at the degree, 50
    assert (layout.dedup, layout.flat_outer) == (True, True)


def test_tree_mode_when_asked_or_small_and_no_flat_hop_for_user_models():
    assert not _layout((5, 3), dedup=False).dedup
    assert _layout((2, 2), num_nodes=10**7).name == "tree"
    user = _layout((5, 3), num_nodes=100, user_model=True)
    assert not user.flat_outer and "user's model" in user.why


def test_an_embedding_deduplicates_every_level_unless_asked_otherwise():
    """A learnable embedding's rows are the outermost level's: deduplicated, no flat hop,
    where without one the same run would be a tree or flat."""
    assert _layout((2, 2), num_nodes=10**7).name == "tree"
    for nodes in (10**7, 100):
        layout = _layout((2, 2), num_nodes=nodes, embedding_dim=8)
        assert (layout.dedup, layout.flat_outer) == (True, False) and "embedding" in layout.why
    assert not _layout((2, 2), num_nodes=10**7, embedding_dim=8, dedup=False).dedup
    asked = _layout((2, 2), num_nodes=100, embedding_dim=8, dedup=True)
    assert (asked.dedup, asked.flat_outer) == (True, False)
    flat = _layout((2, 2), embedding_dim=8, flat_outer=True)
    assert flat.flat_outer and "merged" in flat.why


def test_labor_deduplicates_and_says_it_is_for_its_shared_draws():
    """Where uniform sampling would take a tree, LABOR's levels are deduplicated, and
    the reason given is LABOR's shared draws, not the model or the engine."""
    assert _layout((2, 2), num_nodes=10**7).name == "tree"
    for nodes in (10**7, 100):
        layout = _layout((2, 2), num_nodes=nodes, sampler="labor")
        assert layout.dedup and "LABOR shares its draws" in layout.why
        assert "SAGE node-like tasks" not in layout.why
    assert not _layout((2, 2), num_nodes=10**7, sampler="labor", dedup=False).dedup
