"""RL tasks with verifiable rewards: seeded prompts, and rewards anyone can recompute from the prompt.

- `base`: `Task` (on token ids: what workers, validators and GRPO use), `TextTask` (on text: what
  a task author writes), `TokenizedTask` (a text task on a model's tokenizer), `NEWLINE`.
- `line_length`: `LineLengthTask` ("line-length": a first line of N characters).
- `arithmetic`: `ArithmeticTask` ("arithmetic": word problems, a numeric answer).
- `countdown`: `CountdownTask` ("countdown": reach a target with + - * /), `evaluate_expression`.
- `answers`: `final_answer`, `parse_number` (`<answer>` tags, `\\boxed{}`, the last number).
- `registry`: `get_task`, `available_tasks`, `BUILTIN_TASKS`, `DEFAULT_TASK` and plugins under the `hivenet.tasks`
  entry point.
"""

from training.tasks.arithmetic import ArithmeticTask
from training.tasks.base import NEWLINE, Task, TextTask, TokenizedTask
from training.tasks.countdown import CountdownTask
from training.tasks.line_length import LineLengthTask
from training.tasks.registry import BUILTIN_TASKS, DEFAULT_TASK, ENTRY_POINT_GROUP, available_tasks, get_task

__all__ = [
    "BUILTIN_TASKS",
    "DEFAULT_TASK",
    "ENTRY_POINT_GROUP",
    "NEWLINE",
    "ArithmeticTask",
    "CountdownTask",
    "LineLengthTask",
    "Task",
    "TextTask",
    "TokenizedTask",
    "available_tasks",
    "get_task",
]
