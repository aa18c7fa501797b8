"""Reading the final answer out of a completion, in the forms instruction-tuned models write it.

`final_answer` takes, in this order: the last `<answer>...</answer>` block, the last `\\boxed{...}`
(braces balanced), and otherwise the last number in the text. `parse_number` reads `1,234`,
`-7`, `3.50`, `$12` and `7/2` as exact `Fraction`s, so that `12`, `12.0` and `$12` are one answer.
"""

from __future__ import annotations

import re
from fractions import Fraction

__all__ = ["final_answer", "parse_number", "tagged_answer"]

_ANSWER_TAG = re.compile(r"<answer>(.*?)</answer>", re.DOTALL | re.IGNORECASE)
_NUMBER = re.compile(r"-?\$?\d[\d,]*(?:\.\d+)?(?:/\d+)?")
_MAX_NUMBER_CHARS = 64


def tagged_answer(text: str) -> str | None:
    """The content of the completion's last `<answer>...</answer>` block (stripped), or None."""
    tagged = _ANSWER_TAG.findall(text)
    return str(tagged[-1]).strip() if tagged else None


def final_answer(text: str) -> str | None:
    """The completion's final answer as written (stripped), or None if it gives none."""
    tagged = tagged_answer(text)
    if tagged is not None:
        return tagged
    boxed = _last_boxed(text)
    if boxed is not None:
        return boxed.strip()
    numbers = _NUMBER.findall(text)
    return numbers[-1] if numbers else None


def _last_boxed(text: str) -> str | None:
    start = text.rfind("\\boxed{")
    if start < 0:
        return None
    depth, i = 1, start + len("\\boxed{")
    for j in range(i, len(text)):
        if text[j] == "{":
            depth += 1
        elif text[j] == "}":
            depth -= 1
            if depth == 0:
                return text[i:j]
    return None


def parse_number(answer: str) -> Fraction | None:
    """`answer` as an exact number if it is one number (with optional $, thousands commas, a
    trailing period), else None."""
    cleaned = answer.strip().rstrip(".").replace(",", "").replace("$", "").strip()
    if (
        not cleaned
        or len(cleaned) > _MAX_NUMBER_CHARS
        or not re.fullmatch(r"-?\d+(?:\.\d+)?(?:/\d+)?", cleaned)
    ):
        return None
    try:
        return Fraction(cleaned)
    except (ValueError, ZeroDivisionError):
        return None
