"""Tests for training.tasks: seeded prompts and a pure, prompt-dependent, bounded reward."""

from __future__ import annotations

import pytest

from protocol.errors import ConfigError
from training.tasks import BUILTIN_TASKS, NEWLINE, LineLengthTask, Task, get_task

TASK = get_task("line-length")
LINES = LineLengthTask()


def prompt_for(n: int) -> list[int]:
    return list(b"Write %d letters:\n" % n)


def line(n: int, byte: int = ord("a")) -> list[int]:
    return [byte] * n + [NEWLINE]


def test_registry_builds_tasks_and_names_the_known_ones_for_an_unknown_name():
    task = get_task("line-length")
    assert isinstance(task, Task) and task.name == "line-length"
    assert {"line-length", "arithmetic", "countdown"} <= set(BUILTIN_TASKS)
    assert TASK.stop_ids == {NEWLINE}
    with pytest.raises(ConfigError, match="line-length"):
        get_task("no-such-task")


def test_prompt_is_deterministic_and_states_its_target():
    assert TASK.prompt(123) == TASK.prompt(123)
    targets = {LINES.target(seed) for seed in range(200)}
    assert targets == set(range(LINES.min_len, LINES.max_len + 1))
    for seed in (0, 7, 2**64 - 1):
        assert bytes(TASK.prompt(seed)) == b"Write %d letters:\n" % LINES.target(seed)
    assert TASK.max_new_tokens == LINES.max_len + LINES.tolerance


def test_reward_is_one_on_target_and_falls_linearly_to_zero():
    prompt = prompt_for(12)
    assert TASK.reward(prompt, line(12)) == 1.0
    assert TASK.reward(prompt, line(16)) == pytest.approx(0.5)
    assert TASK.reward(prompt, line(8)) == pytest.approx(0.5)
    assert TASK.reward(prompt, line(20)) == 0.0
    assert TASK.reward(prompt, line(3)) == 0.0
    # Only the first line counts.
    assert TASK.reward(prompt, line(12) + line(30)) == 1.0
    assert TASK.reward(prompt, line(30) + line(12)) == 0.0


def test_reward_edge_cases():
    prompt = prompt_for(5)
    assert TASK.reward(prompt, []) == 0.0  # empty completion: the line never ends
    assert TASK.reward(prompt, [ord("a")] * 5) == 0.0  # right length but no newline
    assert TASK.reward(prompt, [NEWLINE]) == pytest.approx(1 - 5 / 8)  # the stop token alone: an empty line
    assert TASK.reward(prompt, [ord("a")] * 100_000 + [NEWLINE]) == 0.0  # huge line
    # Non-ASCII bytes count as bytes.
    assert TASK.reward(prompt, [0xC3, 0xA9, 0xFF, 0x00, 0x80, NEWLINE]) == 1.0
    for completion in ([0xFF] * 40, line(0), line(5, 0), [NEWLINE] * 3, list(range(256))):
        assert 0.0 <= TASK.reward(prompt, completion) <= 1.0


def test_reward_refuses_prompts_the_task_cannot_produce():
    with pytest.raises(ValueError, match="not a 'line-length' prompt"):
        TASK.reward(list(b"Write some letters:\n"), line(3))
    with pytest.raises(ValueError):
        TASK.reward([300, 1], line(3))


def test_no_constant_output_scores_well_but_reading_the_prompt_does():
    prompts = [TASK.prompt(seed) for seed in range(500)]
    constants = [line(n) for n in range(0, 60)] + [[ord("x")] * 20, []]
    best_constant = max(sum(TASK.reward(p, c) for p in prompts) / len(prompts) for c in constants)
    assert best_constant < 0.35  # ~ tolerance / number of targets = 8 / 26
    reader = sum(TASK.reward(p, line(LINES.target(seed))) for seed, p in enumerate(prompts)) / len(prompts)
    assert reader == 1.0


def test_config_is_validated():
    with pytest.raises(ConfigError):
        LineLengthTask(min_len=10, max_len=5)
    with pytest.raises(ConfigError):
        LineLengthTask(tolerance=0)
