"""What a task is: seeded prompts and a pure reward, as text and as the token ids the RL loop moves.

A task author writes a `TextTask`: `prompt(seed)` gives text (or chat messages) and
`score(prompt_text, completion_text)` a reward in [0, 1] that reads its problem back from the
prompt's text, so that anyone holding the prompt can recompute it. `TokenizedTask` binds a text
task to a model's tokenizer and is the `Task` that workers, validators and trainers use: prompt
ids (chat-formatted when the model has a template), the stop tokens (the model's EOS tokens and
every token whose text contains the task's `stop_text`) and the reward of completion ids.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable

from training.tokenizer import ByteTokenizer, Prompt, Tokenizer

__all__ = ["NEWLINE", "Task", "TextTask", "TokenizedTask"]

NEWLINE = 0x0A
"""Token id of b"\\n" in the byte-level vocabulary."""


@runtime_checkable
class Task(Protocol):
    """A task on token ids: what generation, validation and GRPO use."""

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
    def stop_ids(self) -> frozenset[int]:
        """Generation stops after any of these tokens (kept in the completion); empty: run to the budget."""
        ...

    def prompt(self, prompt_seed: int) -> list[int]:
        """Prompt token ids for `prompt_seed`: the same seed always gives the same prompt."""
        ...

    def reward(self, prompt_ids: Sequence[int], completion_ids: Sequence[int]) -> float:
        """Score of `completion_ids` as an answer to `prompt_ids`, in [0, 1]; pure."""
        ...


@runtime_checkable
class TextTask(Protocol):
    """A task on text: seeded prompts and a reward recomputable from the prompt's text."""

    @property
    def name(self) -> str: ...

    @property
    def max_new_tokens(self) -> int: ...

    @property
    def stop_text(self) -> str | None:
        """Generation may stop at a token containing this text (None: only at the model's EOS)."""
        ...

    def prompt(self, prompt_seed: int) -> Prompt:
        """The prompt for `prompt_seed` (text, or chat messages)."""
        ...

    def score(self, prompt_text: str, completion_text: str) -> float:
        """Reward in [0, 1] of `completion_text` under the prompt whose decoded text is `prompt_text`.

        `prompt_text` may hold a chat template's wrapping around the task's own text. Raises
        ValueError for a prompt this task cannot have produced.
        """
        ...


class TokenizedTask:
    """A `TextTask` on one model's tokenizer, as a `Task`."""

    def __init__(self, text_task: TextTask, tokenizer: Tokenizer | None = None) -> None:
        self.text_task = text_task
        self.tokenizer: Tokenizer = tokenizer if tokenizer is not None else ByteTokenizer()
        stops = set(self.tokenizer.stop_ids)
        if text_task.stop_text:
            stops |= _ids_containing(self.tokenizer, text_task.stop_text)
        self._stop_ids = frozenset(stops)

    @property
    def name(self) -> str:
        return self.text_task.name

    @property
    def max_new_tokens(self) -> int:
        return self.text_task.max_new_tokens

    @property
    def stop_ids(self) -> frozenset[int]:
        return self._stop_ids

    def prompt(self, prompt_seed: int) -> list[int]:
        return self.tokenizer.encode_prompt(self.text_task.prompt(prompt_seed))

    def reward(self, prompt_ids: Sequence[int], completion_ids: Sequence[int]) -> float:
        return self.text_task.score(self.tokenizer.decode(prompt_ids), self.tokenizer.decode(completion_ids))


def _ids_containing(tokenizer: Tokenizer, text: str) -> set[int]:
    return {i for i in range(tokenizer.vocab_size) if text in tokenizer.decode([i])}
