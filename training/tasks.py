"""RL tasks with verifiable rewards: a prompt derived from a seed, a reward recomputable by anyone.

A `Task` turns a `prompt_seed` (from `protocol.assignment.derive_assignment`) into prompt token
ids and scores a completion with a pure function of `(prompt_ids, completion_ids)`, so a
validator recomputes exactly the reward a worker would claim. Tokens are bytes (the byte-level
`TinyGPT` vocabulary).

`LineLengthTask` ("line-length") asks for a line of N bytes, with N written in the prompt
(`b"Write 12 letters:\\n"`). The reward is 1 for a first line of exactly N bytes and falls
linearly to 0 at `tolerance` bytes away; a line that is never ended (no newline in the
completion) scores 0. No fixed output scores well over many prompts (the best constant line
length earns about `tolerance / (max_len - min_len + 1)` on average), so the policy must read N.
A small byte model pretrained on plays (whose lines vary from a few bytes to ~50) improves on it
within a few dozen GRPO steps.

`get_task(name)` looks a task up in the registry `TASKS`.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from protocol.errors import ConfigError

__all__ = ["NEWLINE", "TASKS", "LineLengthTask", "Task", "get_task"]

NEWLINE = 0x0A
"""Token id of b"\\n" (byte-level vocabulary): the end of a line and the tasks' stop token."""


@runtime_checkable
class Task(Protocol):
    """A task family: seeded prompts and a pure, verifiable reward in [0, 1]."""

    # Read-only members, so that frozen dataclasses (and plain attributes) satisfy the protocol.
    @property
    def name(self) -> str:
        """Registry name (what a run's config names)."""
        ...

    @property
    def max_new_tokens(self) -> int:
        """Completion budget every worker generates with."""
        ...

    @property
    def stop_token(self) -> int | None:
        """Generation stops after this token (kept in the completion); None: run to the budget."""
        ...

    def prompt(self, prompt_seed: int) -> list[int]:
        """Prompt token ids for `prompt_seed`: the same seed always gives the same prompt."""
        ...

    def reward(self, prompt_ids: Sequence[int], completion_ids: Sequence[int]) -> float:
        """Score of `completion_ids` as an answer to `prompt_ids`, in [0, 1]; pure."""
        ...


_LENGTH_PROMPT = re.compile(rb"Write ([0-9]{1,4}) letters:\n")


@dataclass(frozen=True)
class LineLengthTask:
    """Write a first line of exactly N bytes, N drawn from `[min_len, max_len]` by the prompt seed."""

    min_len: int = 5
    max_len: int = 30
    tolerance: int = 8
    """Bytes off target at which the reward reaches 0 (linear in between)."""
    name: str = "line-length"
    stop_token: int | None = NEWLINE

    def __post_init__(self) -> None:
        if not 1 <= self.min_len <= self.max_len <= 9999:
            raise ConfigError(f"need 1 <= min_len <= max_len <= 9999, got {self.min_len}..{self.max_len}")
        if self.tolerance < 1:
            raise ConfigError(f"tolerance must be >= 1, got {self.tolerance}")

    @property
    def max_new_tokens(self) -> int:
        """Room for the longest target line, its newline and the whole tolerance band beyond it.

        A completion cut at this budget without a newline could not have scored anyway.
        """
        return self.max_len + self.tolerance

    def target(self, prompt_seed: int) -> int:
        """The line length N asked for by `prompt_seed`."""
        return self.min_len + prompt_seed % (self.max_len - self.min_len + 1)

    def prompt(self, prompt_seed: int) -> list[int]:
        return list(b"Write %d letters:\n" % self.target(prompt_seed))

    def reward(self, prompt_ids: Sequence[int], completion_ids: Sequence[int]) -> float:
        """1 - |len(first line) - N| / tolerance, floored at 0; 0 if the line never ends.

        Raises ValueError for a prompt this task cannot have produced (validators derive the
        prompt themselves, so this is a caller's bug, never a worker's fault).
        """
        if not all(0 <= t < 256 for t in prompt_ids):
            raise ValueError("prompt_ids must be bytes (token ids 0..255)")
        match = _LENGTH_PROMPT.fullmatch(bytes(prompt_ids))
        if match is None:
            raise ValueError(f"not a {self.name!r} prompt: {bytes(prompt_ids)[:64]!r}")
        target = int(match.group(1))
        try:
            line_length = list(completion_ids).index(NEWLINE)
        except ValueError:
            return 0.0
        return max(0.0, 1.0 - abs(line_length - target) / self.tolerance)


TASKS: dict[str, Callable[[], Task]] = {
    "line-length": LineLengthTask,
}
"""Task factories by name."""


def get_task(name: str) -> Task:
    """The registered task `name`; ConfigError (listing the known names) if there is none."""
    factory = TASKS.get(name)
    if factory is None:
        raise ConfigError(f"unknown task {name!r}; known tasks: {', '.join(sorted(TASKS))}")
    return factory()
