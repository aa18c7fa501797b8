"""The `line-length` task: write a first line of exactly N characters, N stated in the prompt.

The prompt is `"Write 12 letters:\\n"`. The reward is 1 for a first line of exactly N characters
(bytes, with the byte-level vocabulary) and falls linearly to 0 at `tolerance` characters away; a
line that is never ended (no newline in the completion) scores 0. No fixed output scores well
over many prompts (the best constant line length earns about `tolerance / (max_len - min_len + 1)`
on average), so the policy must read N. A small model pretrained on plays (whose lines vary from
a few characters to ~50) improves on it within a few dozen GRPO steps.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from protocol.errors import ConfigError

__all__ = ["LineLengthTask"]

_LENGTH_PROMPT = re.compile(r"Write ([0-9]{1,4}) letters:\n")


@dataclass(frozen=True)
class LineLengthTask:
    """Write a first line of exactly N characters, N drawn from `[min_len, max_len]` by the prompt seed."""

    min_len: int = 5
    max_len: int = 30
    tolerance: int = 8
    """Characters off target at which the reward reaches 0 (linear in between)."""
    name: str = "line-length"
    stop_text: str | None = "\n"

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

    def prompt(self, prompt_seed: int) -> str:
        return f"Write {self.target(prompt_seed)} letters:\n"

    def score(self, prompt_text: str, completion_text: str) -> float:
        """1 - |len(first line) - N| / tolerance, floored at 0; 0 if the line never ends."""
        matches = _LENGTH_PROMPT.findall(prompt_text)
        if len(matches) != 1:
            raise ValueError(f"not a {self.name!r} prompt: {prompt_text[:64]!r}")
        target = int(matches[0])
        line_length = completion_text.find("\n")
        if line_length < 0:
            return 0.0
        return max(0.0, 1.0 - abs(line_length - target) / self.tolerance)
