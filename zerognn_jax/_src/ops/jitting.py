"""`jax.jit` for module-level functions of a run's objects, compiled per object and
released with it.

JAX's caches key a jitted function's traces and compiled programs by the function and
its static arguments, and hold those arguments while the function lives. A module's
function lives as long as the process, so a module-level jit given a run's program (or
task) as a static argument kept every run's program, traces and compiled passes (four
quick-start runs in one process: docs/api.md, "Compiled programs kept between runs").
`jit_per_object` jits such a function once per object instead and keeps
the jitted function on that object, so that all of it goes when the run's objects are
garbage-collected (object and jitted function refer to each other: Python's cycle
collector frees them, not the last reference's going).
"""

from __future__ import annotations

import functools

import jax

# The attribute of an object that holds its jitted functions, by function.
ATTRIBUTE = "_zerognn_jits"


def jit_per_object(*, static_argnames: tuple[str, ...] = ()):
    """Decorator: `fn` jitted once per object given as its first argument (the object
    whose life bounds the compiled programs: a `StepProgram`, a seed source), that
    argument bound by identity and every name of `static_argnames` static. An object
    without a `__dict__` keys one jit of `fn` kept for the process (as a static argument
    of a module-level jit would). The result's `lower(obj, ...)` lowers as `jax.jit`'s
    does. Threads that first call it for one object at once share one jitted function
    (`dict.setdefault` keeps the first made), which compiles once."""

    def wrap(fn):
        shared = jax.jit(fn, static_argnums=0, static_argnames=static_argnames)

        def jitted_for(obj):
            kept = getattr(obj, "__dict__", None)
            if kept is None:
                return functools.partial(shared, obj)
            # (set in place: a frozen dataclass refuses setattr)
            jitted = kept.setdefault(ATTRIBUTE, {})
            found = jitted.get(fn)
            if found is None:
                found = jitted.setdefault(fn, jax.jit(functools.partial(fn, obj),
                                                      static_argnames=static_argnames))
            return found

        @functools.wraps(fn)
        def call(obj, *args, **kwargs):
            return jitted_for(obj)(*args, **kwargs)

        def lower(obj, *args, **kwargs):
            kept = getattr(obj, "__dict__", None)
            if kept is None:
                return shared.lower(obj, *args, **kwargs)
            return jitted_for(obj).lower(*args, **kwargs)

        call.lower = lower
        return call

    return wrap
