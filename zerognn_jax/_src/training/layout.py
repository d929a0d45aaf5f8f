"""Which sampled levels are deduplicated: the one place a run's level layout is decided.

Three layouts (sampling/minibatch.py): "dedup" (every level deduplicated, sizes from
the envelope), "dedup, flat outer hop" (the outermost level in slot order, not
deduplicated) and "tree" (no level deduplicated, exact sizes, no metadata). `choose_layout`
picks one from the options and says why (`typed_layout` for a typed graph); the run's
summary records both.
"""

from __future__ import annotations

import dataclasses

from zerognn_jax._src.sampling.minibatch import SamplerConfig


@dataclasses.dataclass(frozen=True)
class Layout:
    """A run's level layout and the reason it was chosen."""

    dedup: bool
    flat_outer: bool
    why: str

    @property
    def name(self) -> str:
        if not self.dedup:
            return "tree"
        return "dedup, flat outer hop" if self.flat_outer else "dedup"

    def apply(self, sampler: SamplerConfig) -> SamplerConfig:
        return dataclasses.replace(sampler, dedup=self.dedup, flat_outer=self.flat_outer)

    def describe(self) -> dict:
        return {"layout": self.name, "why": self.why}


def choose_layout(cfg, task, sampler: SamplerConfig, batch_size: int, num_nodes: int, *,
                  dedup: bool | None, user_model: bool = False,
                  host_features: bool = False) -> Layout:
    """The layout of a run of `cfg` (its model, engine, sampler and `flat_outer`),
    `task`, the resolved `sampler`, seeds of `batch_size` per device on `num_nodes`.

    `dedup` is the request (`cfg.dedup`: True, False for tree mode, None to let this
    function pick). Tree mode is picked only for the built-in SAGE models on the scan
    engine, for tasks whose level 0 is their items (`Task.tree_by_default`), with a
    sampler that draws each row on its own (LABOR shares draws across a level), when
    the tree's levels are small against the graph (`SamplerConfig.tree_is_small`).
    A flat outer hop is on by default for the built-in SAGE models on the scan engine,
    whose first layer reads its sources without transforming them, unless the outer hop
    takes every neighbour (a -1 fanout: its slot-ordered level would be as wide as the
    largest degree for every row). With `host_features` (the table in host memory, its
    rows read over PCIe) every level is deduplicated unless asked otherwise: a repeated
    row would cross the bus again. So is every level with a learnable node embedding
    (`cfg.embedding_dim`, unless `dedup=False`), the outermost without a flat hop unless
    `flat_outer=True` asks: the step then updates each of its embedding rows once, where
    the tree's repeated rows are sorted and merged first (products-like, 64 wide,
    bfloat16, H100, 2180771: 0.269 s an epoch against 0.390 s; docs/benchmarks.md).
    """
    sage = not user_model and cfg.model.startswith("sage")
    scan = cfg.engine == "scan"
    if dedup is False:  # every hop in slot order: no flat outer hop to ask for
        return Layout(False, False, "dedup=False asks for tree mode")
    if host_features and dedup is None:
        return Layout(True, bool(cfg.flat_outer),
                      f"dedup: features in host memory, each row read over PCIe once per "
                      f"step; flat_outer={bool(cfg.flat_outer)}")
    if cfg.embedding_dim:  # dedup is None or True here
        if cfg.flat_outer:
            return Layout(True, True, "dedup; flat_outer=True: a learnable embedding's "
                                      "repeated outer rows are merged before their update")
        return Layout(True, False, "dedup, no flat outer hop: a learnable embedding "
                                   "updates each row it read once (no merge of repeats)")
    if cfg.flat_outer is not None or user_model:
        flat = bool(cfg.flat_outer)
        flat_why = f"flat_outer={cfg.flat_outer}" if cfg.flat_outer is not None else \
            "a user's model may transform its sources: no flat outer hop"
    elif sampler.all_neighbors and sampler.all_neighbors[-1]:
        flat = False
        flat_why = ("the outer hop takes every neighbour: in slot order its level would "
                    "hold C x (1 + largest degree) rows; no flat outer hop")
    else:
        flat = sage and scan
        flat_why = ("SAGE on the scan engine reads outer sources untransformed: flat outer "
                    "hop" if flat else "not SAGE on the scan engine: no flat outer hop")
    if dedup is None and sage and scan and task.tree_by_default and cfg.sampler != "labor":
        if sampler.tree_is_small(batch_size, num_nodes):
            return Layout(False, False, "tree mode: SAGE on the scan engine, and the tree's "
                                        "levels are small against the graph")
        return Layout(True, flat, f"dedup: the tree's levels are large against the graph; "
                                  f"{flat_why}")
    if dedup:
        why = "dedup=True"
    elif cfg.sampler == "labor":
        why = ("dedup: LABOR shares its draws across a level's rows, so its levels are "
               "deduplicated (a tree would repeat every vertex the rows agree on)")
    else:
        why = "dedup: tree mode is picked for SAGE node-like tasks on the scan engine only"
    return Layout(True, flat, f"{why}; {flat_why}")


def typed_layout(cfg) -> Layout:
    """The layout of a typed graph's run (tasks/typed_node.py): every level
    deduplicated per node type unless `dedup=False` asks for tree mode; a flat outer hop
    only where `flat_outer=True` asks."""
    flat = bool(cfg.flat_outer)
    if cfg.dedup is False:
        return Layout(False, False, "dedup=False asks for tree mode")
    return Layout(True, flat, f"dedup: typed graphs deduplicate every level per type "
                              f"unless dedup=False; flat_outer={flat}")
