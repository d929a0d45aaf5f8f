"""The kernel registry: one switch per op between the XLA reference and its Pallas twin.

Ops: `sample` (neighbour sampling), `relabel` (dedup into the next frontier), `gather`
(feature rows), `aggregate` (weighted sum / max over the fanout axis). The XLA versions
are the default everywhere; Pallas kernels are imported only when selected.
"""

from __future__ import annotations

import dataclasses
import functools

import jax

from zerognn_jax._src import aggregate, relabel, sampling

OPS = ("sample", "relabel", "gather", "aggregate")
IMPLEMENTATIONS = ("xla", "pallas")


@dataclasses.dataclass(frozen=True)
class Kernels:
    """Which implementation each op uses; hashable, so it can be a static argument.

    `interpret=True` runs Pallas kernels through the Pallas interpreter (CPU tests).
    """

    sample: str = "xla"
    relabel: str = "xla"
    gather: str = "xla"
    aggregate: str = "xla"
    interpret: bool = False

    def __post_init__(self):
        for op in OPS:
            impl = getattr(self, op)
            if impl not in IMPLEMENTATIONS:
                raise ValueError(
                    f"kernel implementation for {op!r} must be one of {IMPLEMENTATIONS}, "
                    f"got {impl!r}"
                )

    @classmethod
    def parse(cls, spec: str, *, interpret: bool = False) -> Kernels:
        """From "auto", "xla", "pallas", or per op: "sample=pallas,relabel=xla" (others xla).

        "auto" picks what measured fastest on an H100 (docs/kernels.md): the Pallas
        sampler with XLA for the other ops on a GPU, XLA everywhere else.
        """
        spec = spec.strip()
        if spec == "auto":
            return cls(sample="pallas") if jax.default_backend() == "gpu" else cls()
        if spec in IMPLEMENTATIONS:
            return cls(**{op: spec for op in OPS}, interpret=interpret)
        choices = {}
        for part in filter(None, (p.strip() for p in spec.split(","))):
            op, sep, impl = part.partition("=")
            if not sep or op.strip() not in OPS:
                raise ValueError(
                    f"bad kernel spec {part!r} in {spec!r}: expected 'auto', 'xla', 'pallas' or "
                    f"OP=IMPL with OP in {OPS}"
                )
            choices[op.strip()] = impl.strip()
        return cls(**choices, interpret=interpret)

    def describe(self) -> str:
        return ",".join(f"{op}={getattr(self, op)}" for op in OPS)


XLA = Kernels()


@functools.cache
def _pallas(op: str):
    from pallas_kernels import aggregate as pk_aggregate
    from pallas_kernels import gather as pk_gather
    from pallas_kernels import relabel as pk_relabel
    from pallas_kernels import sample as pk_sample

    return {
        "sample": pk_sample.sample_neighbors,
        "relabel": pk_relabel.relabel,
        "gather": pk_gather.gather_rows,
        "weighted_sum": pk_aggregate.weighted_sum,
        "max": pk_aggregate.neighbor_max,
    }[op]


def sample_neighbors(kernels: Kernels, *args, **kwargs):
    """`sampling.sample_neighbors_reference` or its Pallas twin."""
    if kernels.sample == "pallas":
        return _pallas("sample")(*args, interpret=kernels.interpret, **kwargs)
    return sampling.sample_neighbors_reference(*args, **kwargs)


def relabel_hop(kernels: Kernels, *args, **kwargs) -> relabel.Relabeled:
    """`relabel.relabel_reference` or its Pallas twin."""
    if kernels.relabel == "pallas":
        return _pallas("relabel")(*args, interpret=kernels.interpret, **kwargs)
    return relabel.relabel_reference(*args, **kwargs)


def gather_rows(kernels: Kernels, table, ids, valid) -> jax.Array:
    """`aggregate.gather_rows_reference` or its Pallas twin."""
    if kernels.gather == "pallas":
        return _pallas("gather")(table, ids, valid, interpret=kernels.interpret)
    return aggregate.gather_rows_reference(table, ids, valid)


def weighted_sum(kernels: Kernels, h_src, nbr, weights) -> jax.Array:
    """`aggregate.weighted_sum_reference` or its Pallas twin."""
    if kernels.aggregate == "pallas":
        return _pallas("weighted_sum")(h_src, nbr, weights, interpret=kernels.interpret)
    return aggregate.weighted_sum_reference(h_src, nbr, weights)


def neighbor_max(kernels: Kernels, h_src, nbr, mask) -> jax.Array:
    """`aggregate.max_reference` or its Pallas twin."""
    if kernels.aggregate == "pallas":
        return _pallas("max")(h_src, nbr, mask, interpret=kernels.interpret)
    return aggregate.max_reference(h_src, nbr, mask)
