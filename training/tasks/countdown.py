"""The `countdown` task: reach a target number from given numbers with + - * /.

The prompt lists three or four numbers and a target that some expression over a subset of them
reaches (built from the seed, so every prompt is solvable). The answer is an expression in
`<answer></answer>` tags (else the completion's last line). The reward reads the numbers and the
target back from the prompt's text: 1 for an expression that uses each given number at most once
(and no other number) and equals the target exactly, else 0. Expressions are parsed with `ast`
and evaluated over exact fractions, never with `eval`.
"""

from __future__ import annotations

import ast
import random
import re
from collections import Counter
from dataclasses import dataclass
from fractions import Fraction

from training.tasks.answers import tagged_answer

__all__ = ["CountdownTask", "evaluate_expression"]

_PROMPT = re.compile(r"Numbers: ((?:\d{1,4}, )*\d{1,4})\. Target: (\d{1,6})\.")
_MAX_EXPRESSION_CHARS = 200
_OPS = {ast.Add: "+", ast.Sub: "-", ast.Mult: "*", ast.Div: "/"}


def evaluate_expression(text: str) -> tuple[Fraction, list[int]] | None:
    """`(value, numbers used)` of an arithmetic expression of whole numbers and + - * / ( ), or
    None if `text` is anything else (or divides by zero)."""
    if len(text) > _MAX_EXPRESSION_CHARS:
        return None
    try:
        tree = ast.parse(text.strip(), mode="eval")
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None
    used: list[int] = []

    def value(node: ast.AST) -> Fraction:
        if isinstance(node, ast.Constant) and type(node.value) is int and node.value >= 0:
            used.append(node.value)
            return Fraction(node.value)
        if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
            left, right = value(node.left), value(node.right)
            if isinstance(node.op, ast.Add):
                return left + right
            if isinstance(node.op, ast.Sub):
                return left - right
            if isinstance(node.op, ast.Mult):
                return left * right
            return left / right
        raise ValueError("not a + - * / expression of whole numbers")

    try:
        return value(tree.body), used
    except (ValueError, ZeroDivisionError, RecursionError):
        return None


@dataclass(frozen=True)
class CountdownTask:
    """Three or four numbers from 1..`max_number` and a reachable positive whole target."""

    max_number: int = 25
    name: str = "countdown"
    max_new_tokens: int = 48
    stop_text: str | None = None

    def problem(self, prompt_seed: int) -> tuple[list[int], int]:
        """The numbers and the target for `prompt_seed`."""
        rng = random.Random(prompt_seed)
        while True:
            numbers = [rng.randint(1, self.max_number) for _ in range(rng.choice((3, 4)))]
            values = [Fraction(n) for n in rng.sample(numbers, rng.randint(2, len(numbers)))]
            total = values[0]
            for v in values[1:]:
                op = rng.choice("+-*/")
                total = {"+": total + v, "-": total - v, "*": total * v, "/": total / v}[op]
            if total.denominator == 1 and 0 < total <= 10_000 and total not in numbers:
                return numbers, int(total)

    def prompt(self, prompt_seed: int) -> str:
        numbers, target = self.problem(prompt_seed)
        return (
            "Using each of the numbers at most once, and only + - * / and parentheses, write an "
            f"expression equal to the target. Put it in <answer></answer> tags.\n"
            f"Numbers: {', '.join(map(str, numbers))}. Target: {target}.\n"
        )

    def score(self, prompt_text: str, completion_text: str) -> float:
        found = _PROMPT.findall(prompt_text)
        if len(found) != 1:
            raise ValueError(f"not a {self.name!r} prompt: {prompt_text[:80]!r}")
        numbers = Counter(int(n) for n in found[0][0].split(", "))
        target = Fraction(int(found[0][1]))
        tagged = tagged_answer(completion_text)
        lines = completion_text.strip().splitlines()
        expression = tagged if tagged is not None else (lines[-1] if lines else "")
        result = evaluate_expression(expression)
        if result is None:
            return 0.0
        value, used = result
        return 1.0 if value == target and not Counter(used) - numbers else 0.0
