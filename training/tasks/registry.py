"""Finding a task by name: the built-in tasks, and plugins installed under the `hivenet.tasks` entry point.

A package adds a task by declaring, in its `pyproject.toml`,
`[project.entry-points."hivenet.tasks"] my-task = "my_package.tasks:MyTask"`, where `MyTask()` is a
`TextTask` (or a token-level `Task`, for a byte-level model only). Every node of a run builds its task
with `get_task(name, tokenizer)`; a node that lacks the named task refuses to start, saying which
tasks it has and that the plugin must be installed.
"""

from __future__ import annotations

from collections.abc import Callable
from importlib.metadata import EntryPoint, entry_points
from typing import Any

from protocol.errors import ConfigError
from training.task_names import DEFAULT_TASK
from training.tasks.arithmetic import ArithmeticTask
from training.tasks.base import Task, TextTask, TokenizedTask
from training.tasks.countdown import CountdownTask
from training.tasks.line_length import LineLengthTask
from training.tokenizer import ByteTokenizer, Tokenizer

__all__ = ["BUILTIN_TASKS", "DEFAULT_TASK", "ENTRY_POINT_GROUP", "available_tasks", "get_task"]

ENTRY_POINT_GROUP = "hivenet.tasks"

BUILTIN_TASKS: dict[str, Callable[[], Any]] = {
    "line-length": LineLengthTask,
    "arithmetic": ArithmeticTask,
    "countdown": CountdownTask,
}
"""Task factories shipped with hivenet, by name."""
"""The task of an RL run that names none (`training.rl_run.RLRunConfig.task`)."""


def available_tasks() -> dict[str, Callable[[], Any]]:
    """Every task this node can run: the built-ins, then installed plugins (which cannot shadow them)."""
    tasks = dict(BUILTIN_TASKS)
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        tasks.setdefault(ep.name, _plugin_factory(ep))
    return tasks


def _plugin_factory(ep: EntryPoint) -> Callable[[], Any]:
    return lambda: ep.load()()


def get_task(name: str, tokenizer: Tokenizer | None = None) -> Task:
    """The task `name` on `tokenizer`'s token ids (default: the byte-level vocabulary).

    ConfigError, naming the tasks this node has, when no installed task has that name or the
    plugin cannot be loaded.
    """
    factory = available_tasks().get(name)
    if factory is None:
        raise ConfigError(
            f"unknown task {name!r}; this node has: {', '.join(sorted(available_tasks()))}. A task from a "
            f"plugin needs its package installed (it registers under the {ENTRY_POINT_GROUP!r} entry point)"
        )
    try:
        made = factory()
    except Exception as exc:
        raise ConfigError(
            f"the task plugin {name!r} could not be loaded: {exc}; reinstall its package"
        ) from exc
    tokenizer = tokenizer if tokenizer is not None else ByteTokenizer()
    if isinstance(made, TextTask):
        return TokenizedTask(made, tokenizer)
    if isinstance(made, Task):
        if not isinstance(tokenizer, ByteTokenizer):
            raise ConfigError(f"task {name!r} works on byte-level token ids only; use it with --model tiny")
        return made
    raise ConfigError(f"the task plugin {name!r} is neither a TextTask nor a Task; fix or remove its package")
