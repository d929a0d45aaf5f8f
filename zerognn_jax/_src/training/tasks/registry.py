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

    Raises ValueError when another class already holds that name.
    """
    held = TASKS.get(cls.name)
    if held is not None and held is not cls:
        raise ValueError(f"task {cls.name!r} is already {held.__qualname__}")
    TASKS[cls.name] = cls
    return cls
