"""The `arithmetic` task: short word problems generated from the seed, answered with a number.

Each prompt fills one of a few templates (names, objects and two or three small numbers drawn
from the seed) and asks for the final answer in `<answer></answer>` tags; `\\boxed{}` or a
final number are accepted too (`training.tasks.answers`). The reward reads the template's numbers
back from the prompt's text, recomputes the answer and gives 1 for an exact match, else 0.
"""

from __future__ import annotations

import random
import re
from collections.abc import Callable
from dataclasses import dataclass

from training.tasks.answers import final_answer, parse_number

__all__ = ["ArithmeticTask"]

INSTRUCTION = "Solve the problem. Put the final answer, a number, in <answer></answer> tags."


@dataclass(frozen=True)
class _Template:
    text: str
    """Problem text with `{name}`, `{item}` and number fields `{a}`, `{b}`, `{c}`."""
    answer: Callable[[int, int, int], int]


_TEMPLATES = (
    _Template("{name} has {a} {item}. {name} buys {b} more. How many {item} does {name} have now?",
              lambda a, b, c: a + b),
    _Template("{name} has {a} {item} and gives {b} of them away. How many {item} are left?",
              lambda a, b, c: a - b),
    _Template("{name} buys {a} boxes with {b} {item} in each box. How many {item} is that in all?",
              lambda a, b, c: a * b),
    _Template("{name} has {a} {item}, buys {b} more, then gives away {c}. How many {item} does {name} keep?",
              lambda a, b, c: a + b - c),
    _Template("{name} packs {a} bags of {b} {item} and then eats {c} of them. How many {item} are left?",
              lambda a, b, c: a * b - c),
)  # fmt: skip
_NAMES = ("Ana", "Ben", "Chen", "Dara", "Eli", "Fatima", "Goran", "Hana", "Ivo", "Jun")
_ITEMS = ("apples", "pencils", "stamps", "marbles", "books", "cards", "shells", "coins")


def _pattern(template: str) -> re.Pattern[str]:
    fields = {"name": r"(?P<name>[A-Za-z]+)", "item": r"(?P<item>[a-z]+)"}
    fields |= {n: rf"(?P<{n}>\d{{1,4}})" for n in "abc"}
    out, seen = [], set()
    for literal, field in re.findall(r"([^{]*)(?:\{(\w+)\})?", template):
        out.append(re.escape(literal))
        if field:
            out.append(f"(?P={field})" if field in seen else fields[field])
            seen.add(field)
    return re.compile("".join(out))


_PATTERNS = tuple(_pattern(t.text) for t in _TEMPLATES)


@dataclass(frozen=True)
class ArithmeticTask:
    """One- and two-step word problems with small whole numbers (answers are never negative)."""

    max_number: int = 20
    name: str = "arithmetic"
    max_new_tokens: int = 64
    stop_text: str | None = None

    def problem(self, prompt_seed: int) -> tuple[str, int]:
        """The problem text for `prompt_seed` and its answer."""
        rng = random.Random(prompt_seed)
        index = rng.randrange(len(_TEMPLATES))
        a, b = rng.randint(2, self.max_number), rng.randint(1, self.max_number)
        if index == 1:
            a, b = max(a, b), min(a, b)
        c = rng.randint(0, a + b if index == 3 else a * b)
        template = _TEMPLATES[index]
        text = template.text.format(name=rng.choice(_NAMES), item=rng.choice(_ITEMS), a=a, b=b, c=c)
        return text, template.answer(a, b, c)

    def prompt(self, prompt_seed: int) -> str:
        return f"{INSTRUCTION}\nProblem: {self.problem(prompt_seed)[0]}\n"

    def score(self, prompt_text: str, completion_text: str) -> float:
        expected = self.expected_answer(prompt_text)
        answer = final_answer(completion_text)
        return 1.0 if answer is not None and parse_number(answer) == expected else 0.0

    def expected_answer(self, prompt_text: str) -> int:
        """The answer to the problem stated in `prompt_text`; ValueError if it states none."""
        for template, pattern in zip(_TEMPLATES, _PATTERNS, strict=True):
            found = [m for m in pattern.finditer(prompt_text)]
            if len(found) == 1:
                a, b = int(found[0]["a"]), int(found[0]["b"])
                c = int(found[0]["c"]) if "c" in pattern.groupindex else 0
                return template.answer(a, b, c)
        raise ValueError(f"not an {self.name!r} prompt: {prompt_text[:80]!r}")
