"""The built-in RL tasks' names and the default task, importable without torch (for the CLI's help).

`training.tasks.registry` maps each name to its task; a test keeps the two in step.
"""

from __future__ import annotations

DEFAULT_TASK = "line-length"
BUILTIN_TASK_NAMES = ("line-length", "arithmetic", "countdown")
