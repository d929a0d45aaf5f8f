"""The one table from `TrainConfig.task` to the task class (base.py's `Task`): the only
place a task's name is looked up. A task of one's own joins it with `register_task`,
with no edit of the library (tests/test_task_protocol.py trains one)."""

from __future__ import annotations

from zerognn_jax._src.training.tasks.base import Task
from zerognn_jax._src.training.tasks.graph import GraphTask
from zerognn_jax._src.training.tasks.link import LinkTask
from zerognn_jax._src.training.tasks.node import NodeTask
from zerognn_jax._src.training.tasks.typed_link import TypedLinkTask
from zerognn_jax._src.training.tasks.typed_node import TypedNodeTask

# What a task class must have (base.py's `Task`: its methods and class variables; `loss`
# and `score` may be set per instance), checked by `register_task`.
PROTOCOL = tuple(m for m in Task.__dict__ if not m.startswith("_")) + tuple(
    m for m, kind in Task.__annotations__.items() if "ClassVar" in str(kind))
TASKS: dict[str, type[Task]] = {cls.name: cls for cls in (NodeTask, LinkTask, GraphTask)}
# The class that trains a task on a typed dataset (`HeteroDataset`), by task name.
TYPED_TASKS: dict[str, type[Task]] = {cls.name: cls for cls in (TypedNodeTask, TypedLinkTask)}


def task_class(name: str, *, typed: bool = False) -> type[Task]:
    """The task class registered as `name`, or its typed class for a typed dataset
    (ValueError, naming the choices, if none)."""
    if name not in TASKS:
        raise ValueError(f"task must be one of {', '.join(TASKS)}, got {name!r}")
    if typed and name not in TYPED_TASKS:
        raise ValueError(f"task {name!r} does not train typed datasets; typed tasks: "
                         f"{', '.join(TYPED_TASKS)}")
    return TYPED_TASKS[name] if typed else TASKS[name]


def register_task(cls: type[Task]) -> type[Task]:
    """Adds the task class `cls` under `cls.name` (usable as a class decorator).

    Raises:
      TypeError: `cls` is not a class, or lacks a member of the `Task` protocol.
      ValueError: `cls.name` is not a non-empty string, or another class holds it.
    """
    if not isinstance(cls, type):
        raise TypeError(f"register_task takes a task class, got a {type(cls).__name__} "
                        f"instance")
    name = getattr(cls, "name", None)
    if not isinstance(name, str) or not name:
        raise ValueError(f"a task's name must be a non-empty string (TrainConfig.task), "
                         f"got {name!r} on {cls.__qualname__}")
    missing = [m for m in PROTOCOL if not hasattr(cls, m)]
    if missing:
        raise TypeError(f"task {cls.__qualname__} lacks {', '.join(missing)} of the Task "
                        f"protocol (tasks/base.py)")
    if not isinstance(cls.score_name, str) or not cls.score_name:
        raise ValueError(f"a task's score_name must be a non-empty string (records name "
                         f"train_batch_<score_name>), got {cls.score_name!r} on "
                         f"{cls.__qualname__}")
    held = TASKS.get(cls.name)
    if held is not None and held is not cls:
        raise ValueError(f"task {cls.name!r} is already {held.__qualname__}")
    TASKS[cls.name] = cls
    return cls
