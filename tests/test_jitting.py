"""`jit_per_object`: a module's function jitted once per object of a run and freed with it
(ops/jitting.py)."""

from __future__ import annotations

import dataclasses
import gc
import weakref
from typing import NamedTuple

import jax.numpy as jnp
import numpy as np

from zerognn_jax._src.ops.jitting import jit_per_object


@dataclasses.dataclass(frozen=True, eq=False)
class Owner:
    scale: float


class Plain(NamedTuple):  # no __dict__: one jit for the process, keyed by value
    scale: float


TRACES = []


@jit_per_object(static_argnames=("power",))
def scaled(owner, x, *, power: int):
    TRACES.append(owner)
    return owner.scale * x**power


def test_each_object_gets_its_own_jit_and_a_second_call_does_not_retrace():
    TRACES.clear()
    a, b, x = Owner(2.0), Owner(3.0), jnp.arange(4.0)
    np.testing.assert_array_equal(scaled(a, x, power=2), 2.0 * np.arange(4.0) ** 2)
    np.testing.assert_array_equal(scaled(a, x + 1, power=2), 2.0 * np.arange(1.0, 5.0) ** 2)
    assert TRACES == [a]  # traced once for a
    np.testing.assert_array_equal(scaled(b, x, power=2), 3.0 * np.arange(4.0) ** 2)
    scaled(a, x, power=3)  # another static value: traced again for it
    assert TRACES == [a, b, a]
    assert "stablehlo.multiply" in scaled.lower(a, x, power=2).as_text()


def test_objects_without_a_dict_share_one_jit_by_value():
    TRACES.clear()
    x = jnp.arange(3.0)
    np.testing.assert_array_equal(scaled(Plain(2.0), x, power=1), 2.0 * np.arange(3.0))
    scaled(Plain(2.0), x, power=1)  # an equal tuple: the shared jit's cache
    assert len(TRACES) == 1
    assert "stablehlo" in scaled.lower(Plain(2.0), x, power=1).as_text()


def test_the_object_and_its_compiled_function_are_freed_with_it():
    owner = Owner(5.0)
    scaled(owner, jnp.ones(2), power=1)
    gone = weakref.ref(owner)
    del owner
    TRACES.clear()  # (the tests' own record of it)
    gc.collect()
    assert gone() is None
