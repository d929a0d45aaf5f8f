"""Which kind of graph a function was given: a one-line TypeError naming what came
instead and what to pass (the loaders' and the link splits' shared check)."""

from __future__ import annotations

from zerognn_jax._src.data.dataset import Dataset
from zerognn_jax._src.data.graph import CSRGraph
from zerognn_jax._src.data.hetero import HeteroGraph
from zerognn_jax._src.data.hetero_dataset import HeteroDataset

# How a user builds each kind of graph, for the message of a wrong one (`require_graph`)
_BUILT_BY = {CSRGraph: "zg.from_edge_index(edge_index, num_nodes=N)",
             HeteroGraph: "zg.hetero_graph(num_nodes, edges)"}


def require_graph(who: str, graph, kind: type, *, dataset_fix: str, elsewhere) -> None:
    """TypeError naming what `who` got as its graph unless it is a `kind` (CSRGraph or
    HeteroGraph), and what to pass instead: `dataset_fix` for a dataset that holds a
    `kind` (its `.graph`), `elsewhere(given, inner)` for the other kind of graph (where
    `inner`, the graph or the dataset's, goes), else how a `kind` is built. (A dataset
    was read as a graph until an AttributeError named neither.)"""
    if isinstance(graph, kind):
        return
    given = type(graph).__name__
    inner = graph.graph if isinstance(graph, Dataset | HeteroDataset) else graph
    if isinstance(inner, kind):
        fix = dataset_fix
    elif isinstance(inner, CSRGraph | HeteroGraph):
        fix = elsewhere(f"a {given}" if inner is graph else f"a {given}'s graph", inner)
    else:
        fix = f"pass a {kind.__name__}, e.g. {_BUILT_BY[kind]}"
    raise TypeError(f"{who} takes a {kind.__name__} as graph, got {given}: {fix}")
