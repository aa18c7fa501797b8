"""A trainer never takes a downloaded state whose held-out loss is far above its own (#30 item 1).

Sources that agree may all be one attacker's identities: what the trainer can check itself is
what the state does on its held-out batches. A state far worse than its own is refused (it keeps
its own, and says so); a good one, as any honest resync or join brings, is taken. Each outer state,
resynced or not, is handed over for serving before the next round is declared.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence

import pytest
import torch

from node.collective.outer_state import OuterState
from node.collective.round_types import DoneAverage, RoundOutcome
from training.diloco import DiLoCoConfig, DiLoCoTrainer
from training.model import ModelConfig, TinyGPT
from training.state_check import plausible_state

TEXT = torch.tensor(list(b"abcabcabd" * 40), dtype=torch.long)


def _model() -> TinyGPT:
    torch.manual_seed(0)
    return TinyGPT(ModelConfig(d_model=32, n_layers=1, n_heads=2, max_seq_len=32))


def _batches(seed: int, count: int) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    starts = torch.randint(0, len(TEXT) - 17, (count, 4), generator=gen)
    return [torch.stack([TEXT[s : s + 17] for s in row.tolist()]) for row in starts]


class _Outvoted:
    """Every round, the group's majority held another state: the trainer must resync."""

    def prepare_round(self, step: int, expected_duration_s: float, outer_hash: str) -> None:
        pass

    def start_average(
        self, pseudo_grads: Sequence[torch.Tensor], *, step: int, outer_hash: str
    ) -> DoneAverage:
        return DoneAverage(RoundOutcome([g.clone() for g in pseudo_grads], num_peers=3, in_sync=False))

    def bytes_sent(self) -> int:
        return 0


class _Serving:
    """A state source that serves `state` at the step after the one asked for."""

    def __init__(self, state: OuterState) -> None:
        self.state = state

    def fetch_state(self, *, newer_than: int, stop_event: threading.Event | None = None) -> OuterState | None:
        return OuterState(self.state.params, self.state.momentum, newer_than + 1)


def _poisoned(model: TinyGPT) -> OuterState:
    """Large random weights: confident, wrong predictions (constant ones would only be uniform)."""
    gen = torch.Generator().manual_seed(7)
    params = [torch.randn(p.shape, generator=gen) * 50.0 for p in model.parameters()]
    return OuterState(params, [torch.zeros_like(p) for p in params], 0)


def test_a_resync_refuses_a_state_far_worse_than_its_own(caplog: pytest.LogCaptureFixture) -> None:
    model = _model()
    batches = iter(_batches(1, 100))
    config = DiLoCoConfig(inner_steps=3, max_outer_steps=2, inner_warmup_steps=0)
    poisoned = _poisoned(model)
    trainer = DiLoCoTrainer(
        model,
        config,
        next_batch=lambda: next(batches),
        averager=_Outvoted(),
        state_source=_Serving(poisoned),
        eval_batches=_batches(2, 2),
    )
    reports = trainer.run(threading.Event())
    assert [r.resynced for r in reports] == [False, False]
    assert not any(torch.equal(p, q) for p, q in zip(trainer.state.params, poisoned.params, strict=True))
    assert "refusing" in caplog.text


def test_a_resync_takes_a_state_that_does_as_well_as_its_own() -> None:
    model = _model()
    batches = iter(_batches(1, 100))
    config = DiLoCoConfig(inner_steps=3, max_outer_steps=1, inner_warmup_steps=0)
    good = OuterState.from_model(model)  # where the trainer starts: as good as its own
    trainer = DiLoCoTrainer(
        model,
        config,
        next_batch=lambda: next(batches),
        averager=_Outvoted(),
        state_source=_Serving(good),
        eval_batches=_batches(2, 2),
    )
    reports = trainer.run(threading.Event())
    assert [r.resynced for r in reports] == [True]


def test_the_check_refuses_non_finite_and_far_worse_states_and_takes_better_ones() -> None:
    model = _model()
    batches = _batches(2, 2)
    own = OuterState.from_model(model)
    assert plausible_state(model, own, own, batches)
    assert not plausible_state(model, own, _poisoned(model), batches)
    nan = OuterState([torch.full_like(p, float("nan")) for p in own.params], own.momentum, 1)
    assert not plausible_state(model, own, nan, batches)
    assert plausible_state(model, own, _poisoned(model), [])  # nothing to check with: no refusal
    # the model still holds its own parameters afterwards
    assert all(torch.equal(p, o) for p, o in zip(model.parameters(), own.params, strict=True))


class _Recording:
    """An averager that averages alone and notes, in order, each round it is told of."""

    def __init__(self, events: list[str]) -> None:
        self.events = events

    def prepare_round(self, step: int, expected_duration_s: float, outer_hash: str) -> None:
        self.events.append(f"declare {step}")

    def start_average(
        self, pseudo_grads: Sequence[torch.Tensor], *, step: int, outer_hash: str
    ) -> DoneAverage:
        return DoneAverage(RoundOutcome(None, num_peers=1))

    def bytes_sent(self) -> int:
        return 0


@pytest.mark.parametrize("overlap", [False, True])
def test_each_outer_state_is_offered_for_serving_before_the_next_round_is_declared(overlap: bool) -> None:
    # Seen in the churn soak: a trainer that applied a step but had not declared its next round
    # (a slow machine) still served the step before, so a member left out of that round found a
    # single source of the run's state, which nobody could confirm.
    events: list[str] = []
    batches = iter(_batches(1, 100))
    trainer = DiLoCoTrainer(
        _model(),
        DiLoCoConfig(inner_steps=3, max_outer_steps=3, inner_warmup_steps=0, overlap_communication=overlap),
        next_batch=lambda: next(batches),
        averager=_Recording(events),
        on_state_applied=lambda state: events.append(f"serve {state.step}"),
    )
    trainer.run(threading.Event())
    for step in (1, 2):
        assert events.index(f"serve {step}") < events.index(f"declare {step}"), events
    assert events.count("serve 3") == 1


class _InterruptedDownload:
    """A download during which the operator presses Ctrl-C: it sets the stop event it was handed."""

    def __init__(self) -> None:
        self.handed: list[threading.Event | None] = []

    def fetch_state(self, *, newer_than: int, stop_event: threading.Event | None = None) -> OuterState | None:
        self.handed.append(stop_event)
        if stop_event is not None:
            stop_event.set()
        return None


def test_a_resync_download_is_handed_the_runs_stop_event_and_the_run_ends_with_it() -> None:
    model = _model()
    batches = iter(_batches(1, 100))
    config = DiLoCoConfig(inner_steps=3, max_outer_steps=5, inner_warmup_steps=0)
    source = _InterruptedDownload()
    trainer = DiLoCoTrainer(
        model, config, next_batch=lambda: next(batches), averager=_Outvoted(), state_source=source
    )
    stop = threading.Event()
    reports = trainer.run(stop)
    assert source.handed == [stop], "the download could not see the run's stop (Ctrl-C)"
    assert [r.outer_step for r in reports] == [1]
