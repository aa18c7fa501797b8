"""The inner learning-rate schedule (warmup + cosine over the whole run) and per-outer-step token counts."""

from __future__ import annotations

import itertools
import math
import threading
from collections.abc import Sequence

import pytest
import torch

from node.collective.outer_state import OuterState
from node.collective.round_types import RoundOutcome
from training.diloco import DiLoCoConfig, DiLoCoTrainer
from training.model import ModelConfig, TinyGPT

BATCH, SEQ = 2, 9  # a batch of 2 sequences of 9 tokens: 2 * 8 training tokens per inner step


def test_warmup_then_cosine_to_the_floor_at_the_last_step() -> None:
    cfg = DiLoCoConfig(inner_lr=1e-2, inner_steps=10, max_outer_steps=10, inner_warmup_steps=10)
    assert cfg.total_inner_steps() == 100
    assert [cfg.inner_lr_at(s) for s in range(3)] == pytest.approx([1e-3, 2e-3, 3e-3])
    assert cfg.inner_lr_at(9) == pytest.approx(1e-2)  # the last warmup step reaches the peak
    assert cfg.inner_lr_at(10) == pytest.approx(1e-2)  # decay starts from the peak
    assert cfg.inner_lr_at(99) == pytest.approx(1e-3)  # inner_lr * inner_lr_min_ratio at the last step
    assert cfg.inner_lr_at(500) == pytest.approx(1e-3)  # and stays there
    mid = 10 + (99 - 10) / 2
    assert cfg.inner_lr_at(int(mid)) == pytest.approx(
        1e-3 + 9e-3 * 0.5 * (1 + math.cos(math.pi * (int(mid) - 10) / 89))
    )
    after = [cfg.inner_lr_at(s) for s in range(10, 100)]
    assert all(a >= b for a, b in itertools.pairwise(after))
    # a baseline with another step count stretches the same schedule over its own run
    assert cfg.inner_lr_at(399, total_steps=400) == pytest.approx(1e-3)
    assert cfg.inner_lr_at(99, total_steps=400) > 5e-3


def test_constant_schedule_and_open_ended_runs_keep_the_peak() -> None:
    constant = DiLoCoConfig(inner_lr=1e-2, max_outer_steps=5, inner_lr_schedule="constant")
    assert constant.inner_lr_at(10_000) == 1e-2 and constant.inner_lr_at(0) == pytest.approx(1e-2 / 50)
    open_ended = DiLoCoConfig(inner_lr=1e-2, max_outer_steps=None)
    assert open_ended.total_inner_steps() is None and open_ended.inner_lr_at(10_000) == 1e-2
    no_warmup = DiLoCoConfig(inner_lr=1e-2, inner_warmup_steps=0, max_outer_steps=5, inner_steps=2)
    assert no_warmup.inner_lr_at(0) == 1e-2 and no_warmup.inner_lr_at(9) == pytest.approx(1e-3)


class _Handle:
    """A round whose average arrives after `done()` was asked `after` times (never early if None)."""

    def __init__(self, after: int | None) -> None:
        self.after, self.asked = after, 0

    def done(self) -> bool:
        self.asked += 1
        return self.after is not None and self.asked > self.after

    def result(self) -> RoundOutcome:
        return RoundOutcome(averaged=None, num_peers=1)


class _Averager:
    def __init__(self, after: int | None) -> None:
        self.after = after

    def prepare_round(self, step: int, expected_duration_s: float, outer_hash: str) -> None:
        pass

    def start_average(self, pseudo_grads: Sequence[torch.Tensor], *, step: int, outer_hash: str) -> _Handle:
        return _Handle(self.after)

    def bytes_sent(self) -> int:
        return 0


def _trainer(
    cfg: DiLoCoConfig, after: int | None, steps_seen: list[int], state: OuterState | None = None
) -> DiLoCoTrainer:
    torch.manual_seed(0)
    model = TinyGPT(ModelConfig(d_model=16, n_layers=1, n_heads=2, max_seq_len=16))
    gen = torch.Generator().manual_seed(1)
    trainer: DiLoCoTrainer | None = None

    def batch() -> torch.Tensor:
        assert trainer is not None
        steps_seen.append(trainer.global_inner_step)  # the step whose lr this batch is trained with
        return torch.randint(0, 256, (BATCH, SEQ), generator=gen)

    trainer = DiLoCoTrainer(model, cfg, next_batch=batch, averager=_Averager(after), initial_state=state)
    return trainer


@pytest.mark.parametrize("overlap", [True, False])
@pytest.mark.parametrize("arrives_after", [0, 2, None])
def test_tokens_grow_by_one_round_per_outer_step(overlap: bool, arrives_after: int | None) -> None:
    """Regression: with overlap, a report counted the next round's tokens up to whenever it arrived."""
    torch.set_num_threads(1)
    h = 5
    cfg = DiLoCoConfig(inner_steps=h, max_outer_steps=4, overlap_communication=overlap)
    steps_seen: list[int] = []
    reports = _trainer(cfg, arrives_after, steps_seen).run(threading.Event())
    assert [r.outer_step for r in reports] == [1, 2, 3, 4]
    per_round = h * BATCH * (SEQ - 1)
    assert [r.tokens for r in reports] == [per_round * k for k in (1, 2, 3, 4)]
    # the schedule walks the run's inner steps once each, in order, however the rounds overlap
    assert steps_seen == list(range(4 * h))


def test_a_trainer_joining_at_a_later_outer_step_continues_the_schedule() -> None:
    torch.set_num_threads(1)
    cfg = DiLoCoConfig(inner_steps=3, max_outer_steps=5)
    steps_seen: list[int] = []
    first = _trainer(cfg, 1, [])
    joined = _trainer(cfg, 1, steps_seen, state=OuterState.from_model(first.model, step=3))
    reports = joined.run(threading.Event())
    assert [r.outer_step for r in reports] == [4, 5]
    assert steps_seen == list(range(9, 15))


@pytest.mark.parametrize("arrives_after", [0, 2])
def test_a_lone_trainer_overlapping_follows_the_synchronous_trajectory(arrives_after: int) -> None:
    """The next round starts from the eager outer step, which is exact when averaging alone.

    Regression: the next round's inner steps started from the local parameters, so with
    overlap every round drifted from the synchronous schedule (about 0.4% of final loss).
    """
    torch.set_num_threads(1)
    runs = {}
    for overlap in (True, False):
        cfg = DiLoCoConfig(inner_steps=4, max_outer_steps=4, overlap_communication=overlap)
        runs[overlap] = _trainer(cfg, arrives_after, []).run(threading.Event())
    assert [r.outer_hash for r in runs[True]] == [r.outer_hash for r in runs[False]]
    # each average arrived after the inner steps it was waited through (the last round waits)
    waited = [r.extra["steps_until_average"] for r in runs[True]]
    assert waited == [arrives_after + 1] * 3 + [0]
