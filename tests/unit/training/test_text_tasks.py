"""The text tasks (arithmetic, countdown), answer extraction, and task plugins by entry point."""

from __future__ import annotations

import textwrap
from fractions import Fraction
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from protocol.errors import ConfigError
from training.tasks import ArithmeticTask, CountdownTask, TokenizedTask, available_tasks, get_task
from training.tasks.answers import final_answer, parse_number
from training.tasks.countdown import evaluate_expression
from training.tokenizer import ByteTokenizer

ARITHMETIC, COUNTDOWN = ArithmeticTask(), CountdownTask()


def test_answers_are_read_in_the_forms_models_write_them() -> None:
    assert final_answer("so 3 + 4 = 7. <answer> 7 </answer>") == "7"
    assert final_answer("<answer>1</answer> no wait <answer>12</answer>") == "12"
    assert final_answer(r"The total is \boxed{1,200}.") == "1,200"
    assert final_answer(r"\boxed{\frac{1}{2}} then \boxed{ 42 }") == "42"
    assert final_answer("first 3, then 5, finally 8.") == "8"
    assert final_answer("no number here") is None
    assert parse_number("1,200") == parse_number("1200.0") == parse_number("$1200.") == 1200
    assert parse_number("7/2") == Fraction(7, 2) and parse_number("-3") == -3
    assert parse_number("seven") is None and parse_number("1/0") is None and parse_number("9" * 100) is None


def test_every_arithmetic_prompt_states_a_problem_the_reward_reads_back() -> None:
    for seed in range(400):
        text, answer = ARITHMETIC.problem(seed)
        prompt = ARITHMETIC.prompt(seed)
        assert text in prompt and answer >= 0
        assert ARITHMETIC.expected_answer(prompt) == answer
        wrapped = (
            f"<|im_start|>user\n{prompt}<|im_end|>\n<|im_start|>assistant\n"  # a chat template's wrapping
        )
        assert ARITHMETIC.score(wrapped, f"<answer>{answer}</answer>") == 1.0
        assert ARITHMETIC.score(wrapped, rf"... \boxed{{{answer}}}") == 1.0
        assert ARITHMETIC.score(wrapped, f"<answer>{answer + 1}</answer>") == 0.0
    assert len({ARITHMETIC.prompt(seed) for seed in range(400)}) > 350
    with pytest.raises(ValueError, match="not an 'arithmetic' prompt"):
        ARITHMETIC.score("What is the capital of France?", "7")


def test_every_countdown_prompt_is_solvable_and_only_exact_answers_with_given_numbers_score() -> None:
    for seed in range(200):
        numbers, target = COUNTDOWN.problem(seed)
        assert 3 <= len(numbers) <= 4 and 0 < target <= 10_000
    prompt = "Numbers: 3, 7, 25. Target: 46.\n"
    assert COUNTDOWN.score(prompt, "<answer>25 + 7 * 3</answer>") == 1.0
    assert COUNTDOWN.score(prompt, "thinking...\n(25 - 3) * 2 + 2") == 0.0  # 2 is not given
    assert COUNTDOWN.score(prompt, "<answer>25 + 7 * 3 + 0</answer>") == 0.0
    assert COUNTDOWN.score(prompt, "<answer>25 + 25 - 4</answer>") == 0.0  # 25 used twice
    assert COUNTDOWN.score(prompt, "<answer>__import__('os')</answer>") == 0.0
    assert COUNTDOWN.score(prompt, "<answer>7 ** 2 - 3</answer>") == 0.0  # no powers
    assert COUNTDOWN.score(prompt, "<answer>" + "(" * 150 + "3" + ")" * 150 + "</answer>") == 0.0
    with pytest.raises(ValueError):
        COUNTDOWN.score("Numbers: 3. Target: 4.\nNumbers: 1. Target: 2.\n", "1")


@given(st.text(max_size=300))
def test_the_expression_evaluator_never_raises_on_any_text(text: str) -> None:
    result = evaluate_expression(text)
    assert result is None or isinstance(result[0], Fraction)


def test_text_tasks_run_on_the_byte_vocabulary_too() -> None:
    task = get_task("arithmetic", ByteTokenizer())
    assert isinstance(task, TokenizedTask) and task.stop_ids == frozenset()
    prompt = task.prompt(5)
    answer = ARITHMETIC.problem(5)[1]
    assert task.reward(prompt, list(f"<answer>{answer}</answer>".encode())) == 1.0


def test_a_task_plugin_installed_under_the_entry_point_is_found_by_name(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    package = tmp_path / "echo_task_plugin"
    package.mkdir()
    (package / "__init__.py").write_text(
        textwrap.dedent(
            """
            from dataclasses import dataclass

            @dataclass(frozen=True)
            class EchoTask:
                name: str = "echo"
                max_new_tokens: int = 8
                stop_text: str | None = None

                def prompt(self, prompt_seed):
                    return f"Say {prompt_seed % 10}:"

                def score(self, prompt_text, completion_text):
                    return 1.0 if completion_text.strip() == prompt_text[-2] else 0.0
            """
        )
    )
    dist = tmp_path / "echo_task_plugin-1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: echo-task-plugin\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text("[hivenet.tasks]\necho = echo_task_plugin:EchoTask\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert "echo" in available_tasks()
    task = get_task("echo")
    assert task.reward(task.prompt(3), list(b"3")) == 1.0


def test_a_task_nobody_installed_is_a_clear_error_naming_the_installed_ones() -> None:
    with pytest.raises(
        ConfigError, match=r"unknown task 'no-such-task'; this node has: arithmetic, countdown"
    ):
        get_task("no-such-task")
