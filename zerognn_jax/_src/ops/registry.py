"""Which implementation each op runs: the XLA reference, its Pallas twin, or a callable.

Ops: `sample` (neighbour sampling), `relabel` (dedup into the next frontier), `gather`
(feature rows), `weighted_sum` and `max` (aggregation over the fanout axis), `row_adam`
(lazy Adam's update of an embedding table's rows, `training/row_adam.py`). Each op's
module in this folder holds its reference and a dispatcher that asks `implementation`
what to run; Pallas kernels (`pallas/`) are imported only when selected.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable

import jax

OPS = ("sample", "relabel", "gather", "weighted_sum", "max", "row_adam")
# The ops whose interpreted Pallas kernels sum ids repeated within a block wrongly.
INTERPRETER_INEXACT = ("relabel", "weighted_sum", "max")
IMPLEMENTATIONS = ("xla", "pallas")
# "aggregate" in a spec string names both aggregation ops at once.
_ALIASES = {"aggregate": ("weighted_sum", "max")}

Impl = str | Callable


@dataclasses.dataclass(frozen=True)
class Kernels:
    """Per op: "xla" (the reference), "pallas", or a callable with the reference's signature.

    Hashable (callables hash by identity), so it can be a static argument.
    `interpret=True` runs Pallas kernels through the Pallas interpreter, for the kernels'
    tests on a CPU: it sums ids repeated within one program's block wrongly (one atomic
    update per index and call), so relabel, weighted_sum and max are exact there only on
    inputs whose live ids are distinct within a block, and the loaders refuse them
    (`as_kernels`).
    """

    sample: Impl = "xla"
    relabel: Impl = "xla"
    gather: Impl = "xla"
    weighted_sum: Impl = "xla"
    max: Impl = "xla"
    row_adam: Impl = "xla"
    interpret: bool = False

    def __post_init__(self):
        for op in OPS:
            impl = getattr(self, op)
            if not callable(impl) and impl not in IMPLEMENTATIONS:
                raise ValueError(f"kernel implementation for {op!r} must be one of "
                                 f"{IMPLEMENTATIONS} or a callable, got {impl!r}")

    @classmethod
    def parse(cls, spec: str, *, interpret: bool = False, gpu: bool | None = None) -> Kernels:
        """From "auto", "xla", "pallas", or per op: "sample=pallas,aggregate=xla" (others
        xla, or what the first part says: "auto,row_adam=xla" is auto's choice but for
        that op).

        "auto" picks what measured fastest on an H100 (docs/kernels.md): the Pallas
        sampler and lazy Adam's in-place row update with XLA for the other ops on a
        GPU (`gpu`; None: JAX's default backend, which asking starts), XLA everywhere
        else.
        """
        # (empty parts, "xla," say, are skipped: runs recorded with them restore)
        parts = [p.strip() for p in spec.split(",") if p.strip()]
        if not parts:
            raise ValueError(f"bad kernel spec: kernels {spec!r} names nothing; expected "
                             f"'auto', 'xla' or 'pallas', then OP=IMPL with OP in "
                             f"{(*OPS, *_ALIASES)}")
        choices = {}
        if parts[0] == "auto":
            gpu = jax.default_backend() == "gpu" if gpu is None else gpu
            choices, parts = (dict(sample="pallas", row_adam="pallas") if gpu else {}), parts[1:]
        elif parts[0] in IMPLEMENTATIONS:
            choices, parts = dict.fromkeys(OPS, parts[0]), parts[1:]
        single, aliases = set(), set()
        for part in parts:
            op, sep, impl = (s.strip() for s in part.partition("="))
            if not sep or (op not in OPS and op not in _ALIASES):
                raise ValueError(f"bad kernel spec {part!r} in kernels {spec!r}: expected 'auto', "
                                 f"'xla' or 'pallas', then OP=IMPL with OP in "
                                 f"{(*OPS, *_ALIASES)}")
            # an op or alias named again, or an alias after one of its ops, would undo a
            # choice silently (an alias and then one of its ops refines the alias)
            if op in _ALIASES:
                twice = op if op in aliases else next(
                    (o for o in _ALIASES[op] if o in single), None)
                aliases.add(op)
            else:
                twice = op if op in single else None
                single.add(op)
            if twice is not None:
                raise ValueError(f"bad kernel spec in kernels {spec!r}: {twice} is named "
                                 f"twice")
            if impl not in IMPLEMENTATIONS:  # a callable is no spec's word
                raise ValueError(f"bad kernel spec {part!r} in kernels {spec!r}: {op} takes "
                                 f"{' or '.join(map(repr, IMPLEMENTATIONS))}, got {impl!r}")
            choices.update(dict.fromkeys(_ALIASES.get(op, (op,)), impl))
        return cls(**choices, interpret=interpret)

    def describe(self) -> str:
        """Each op's choice ("sample=pallas,relabel=xla,..."), and " (interpreted)"
        where Pallas kernels run in the interpreter (a CPU run many times slower)."""
        name = lambda impl: impl if isinstance(impl, str) else getattr(
            impl, "__name__", type(impl).__name__)
        interpreted = self.interpret and any(getattr(self, op) == "pallas" for op in OPS)
        return ",".join(f"{op}={name(getattr(self, op))}" for op in OPS) + (
            " (interpreted)" if interpreted else "")


XLA = Kernels()


@functools.cache
def _pallas(op: str) -> Callable:
    from zerognn_jax._src.pallas import aggregate, gather, relabel, row_adam, sample

    return {"sample": sample.sample_neighbors, "relabel": relabel.relabel,
            "gather": gather.gather_rows, "weighted_sum": aggregate.weighted_sum,
            "max": aggregate.neighbor_max, "row_adam": row_adam.row_adam_rows}[op]


def implementation(kernels: Kernels, op: str) -> Callable | None:
    """The callable `kernels` selects for `op`, or None for the XLA reference."""
    impl = getattr(kernels, op)
    if impl == "xla":
        return None
    if impl == "pallas":
        return functools.partial(_pallas(op), interpret=kernels.interpret)
    return impl


def as_kernels(kernels: Kernels | str) -> Kernels:
    """`kernels`, or the `Kernels` its spec names (`Kernels.parse`); ValueError for Pallas
    kernels off an NVIDIA GPU (outside interpret mode), as `TrainConfig` refuses them, and
    for the interpreted kernels that sum repeated ids wrongly (`Kernels`)."""
    spec = kernels
    kernels = Kernels.parse(kernels) if isinstance(kernels, str) else kernels
    pallas = [op for op in OPS if getattr(kernels, op) == "pallas"]
    inexact = [op for op in pallas if op in INTERPRETER_INEXACT]
    if kernels.interpret and inexact:
        raise ValueError(f"kernels {spec!r} interprets {', '.join(inexact)} as Pallas "
                         f"kernels, which the interpreter computes wrongly where ids repeat "
                         f"within a block, as sampled batches' do (docs/kernels.md): it is "
                         f"for the kernels' tests; use those ops' 'xla' form here")
    return _on_a_gpu(kernels, spec)


def _on_a_gpu(kernels: Kernels, spec) -> Kernels:
    """`kernels`; ValueError where they run Pallas kernels, not interpreted, off a GPU
    (JAX's own error came from deep inside the lowering)."""
    pallas = [op for op in OPS if getattr(kernels, op) == "pallas"]
    if pallas and not kernels.interpret and jax.default_backend() != "gpu":
        raise ValueError(f"kernels {spec!r} runs {', '.join(pallas)} as Pallas kernels, "
                         f"which need an NVIDIA GPU; JAX's backend here is "
                         f"{jax.default_backend()}: use kernels 'xla' or 'auto'")
    return kernels


def given_kernels(kernels: Kernels | str) -> Kernels:
    """What a public op's `kernels=` names: a spec string read and checked by
    `as_kernels`; a `Kernels` as it is (the kernels' tests pass interpreted ones), but
    for Pallas kernels off a GPU outside interpret mode."""
    if isinstance(kernels, str):
        return as_kernels(kernels)
    return _on_a_gpu(kernels, kernels.describe())
