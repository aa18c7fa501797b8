"""The outer step: plain averaging as a special case, the pseudo-gradient's sign, Nesterov, one trainer round."""

from __future__ import annotations

import threading
from collections.abc import Sequence

import pytest
import torch

from node.collective.outer_state import OuterState, state_hash
from node.collective.round_types import DoneAverage, RoundOutcome
from training.diloco import DiLoCoConfig, DiLoCoTrainer, OuterStepReport, outer_update, pseudo_gradient
from training.model import ModelConfig, TinyGPT


def _state(values: list[torch.Tensor]) -> OuterState:
    return OuterState([v.clone() for v in values], [torch.zeros_like(v) for v in values], 0)


def test_outer_sgd_lr1_momentum0_is_exact_parameter_averaging() -> None:
    gen = torch.Generator().manual_seed(0)
    # Dyadic values (multiples of 1/64 in a small range): every sum and halving below is exact.
    outer = [
        torch.randint(-64, 64, (5, 3), generator=gen) / 64.0,
        torch.randint(-64, 64, (7,), generator=gen) / 64.0,
    ]
    peers = [[o + torch.randint(-8, 8, o.shape, generator=gen) / 64.0 for o in outer] for _ in range(4)]
    deltas = [pseudo_gradient(outer, p) for p in peers]
    mean_delta = [torch.stack([d[i] for d in deltas]).sum(0) / 4 for i in range(2)]
    new = outer_update(_state(outer), mean_delta, DiLoCoConfig(outer_lr=1.0, outer_momentum=0.0))
    plain_average = [torch.stack([p[i] for p in peers]).sum(0) / 4 for i in range(2)]
    assert all(torch.equal(a, b) for a, b in zip(new.params, plain_average, strict=True))
    assert new.step == 1
    # and with random floats it agrees up to rounding
    outer_f = [torch.randn(50, generator=gen)]
    peers_f = [[outer_f[0] + 0.01 * torch.randn(50, generator=gen)] for _ in range(3)]
    mean_f = [torch.stack([pseudo_gradient(outer_f, p)[0] for p in peers_f]).sum(0) / 3]
    new_f = outer_update(_state(outer_f), mean_f, DiLoCoConfig(outer_lr=1.0, outer_momentum=0.0))
    assert torch.allclose(new_f.params[0], torch.stack([p[0] for p in peers_f]).mean(0), atol=1e-6)


def test_pseudo_gradient_has_the_sign_of_a_gradient() -> None:
    # Minimising w^2 from w = 1: the inner step decreases w, so the gradient (2w) and the
    # pseudo-gradient (outer - local) are both positive, and the outer step continues downhill.
    w = torch.nn.Parameter(torch.tensor([1.0]))
    outer = [w.detach().clone()]
    opt = torch.optim.SGD([w], lr=0.1)
    (w**2).sum().backward()
    assert w.grad is not None
    grad = w.grad.clone()
    opt.step()
    delta = pseudo_gradient(outer, [w])
    assert float(delta[0]) > 0 and float(grad[0]) > 0
    new = outer_update(_state(outer), delta, DiLoCoConfig(outer_lr=0.7, outer_momentum=0.9))
    assert float(new.params[0]) < float(outer[0][0])


def test_outer_step_matches_torch_sgd_nesterov_over_several_steps() -> None:
    gen = torch.Generator().manual_seed(1)
    p = torch.nn.Parameter(torch.randn(20, generator=gen))
    sgd = torch.optim.SGD([p], lr=0.7, momentum=0.9, nesterov=True)
    state = _state([p.detach().clone()])
    cfg = DiLoCoConfig()
    for _ in range(5):
        g = torch.randn(20, generator=gen)
        p.grad = g.clone()
        sgd.step()
        state = outer_update(state, [g], cfg)
    assert torch.allclose(state.params[0], p.detach(), atol=1e-6)
    assert state.step == 5


def test_hash_covers_params_and_momentum() -> None:
    s = _state([torch.ones(3)])
    h = s.hash()
    assert h == s.clone().hash() == state_hash(s.params, s.momentum)
    s.momentum[0][1] = 1e-30
    assert s.hash() != h


class _Alone:
    """An averager with no peers: every round is averaged alone."""

    def __init__(self) -> None:
        self.rounds: list[int] = []

    def prepare_round(self, step: int, expected_duration_s: float, outer_hash: str) -> None:
        self.rounds.append(step)

    def start_average(
        self, pseudo_grads: Sequence[torch.Tensor], *, step: int, outer_hash: str
    ) -> DoneAverage:
        return DoneAverage(RoundOutcome(averaged=None, num_peers=1))

    def bytes_sent(self) -> int:
        return 0


def test_single_trainer_rounds_reduce_the_loss() -> None:
    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = TinyGPT(ModelConfig(d_model=32, n_layers=1, n_heads=2, max_seq_len=32))
    text = torch.tensor(list(b"abcabcabd" * 40), dtype=torch.long)
    gen = torch.Generator().manual_seed(0)

    def batch() -> torch.Tensor:
        starts = torch.randint(0, len(text) - 17, (4,), generator=gen)
        return torch.stack([text[s : s + 17] for s in starts.tolist()])

    averager = _Alone()
    cfg = DiLoCoConfig(inner_steps=5, max_outer_steps=6, inner_warmup_steps=0, eval_every_outer_steps=3)
    trainer = DiLoCoTrainer(model, cfg, next_batch=batch, averager=averager, eval_batches=[batch()])
    reports = trainer.run(threading.Event())
    assert [r.outer_step for r in reports] == [1, 2, 3, 4, 5, 6] and averager.rounds == [0, 1, 2, 3, 4, 5]
    assert reports[-1].train_loss < reports[0].train_loss
    assert reports[2].eval_loss is not None and reports[0].eval_loss is None
    assert reports[-1].tokens == 6 * 5 * 4 * 16 and reports[-1].num_peers == 1
    # the model holds the outer parameters after each outer step
    assert all(torch.equal(p, o) for p, o in zip(model.parameters(), trainer.state.params, strict=True))
    stop = threading.Event()
    stop.set()
    assert trainer.run(stop) == []


class _LocalGroup:
    """An in-process group of `n` trainers: the round's mean is computed once and shared by all."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.lock = threading.Lock()
        self.rounds: dict[int, list[list[torch.Tensor]]] = {}
        self.means: dict[int, list[torch.Tensor]] = {}

    def member(self) -> _Member:
        return _Member(self)


class _Member:
    def __init__(self, group: _LocalGroup) -> None:
        self.group = group

    def prepare_round(self, step: int, expected_duration_s: float, outer_hash: str) -> None:
        pass

    def start_average(self, pseudo_grads: Sequence[torch.Tensor], *, step: int, outer_hash: str) -> _Handle:
        with self.group.lock:
            self.group.rounds.setdefault(step, []).append([g.clone() for g in pseudo_grads])
        return _Handle(self.group, step)

    def bytes_sent(self) -> int:
        return 0


class _Handle:
    def __init__(self, group: _LocalGroup, step: int) -> None:
        self.group, self.step = group, step

    def done(self) -> bool:
        with self.group.lock:
            return len(self.group.rounds[self.step]) == self.group.n

    def result(self) -> RoundOutcome:
        while not self.done():
            threading.Event().wait(0.001)
        with self.group.lock:
            if self.step not in self.group.means:
                parts = self.group.rounds[self.step]
                self.group.means[self.step] = [torch.stack(ts).mean(0) for ts in zip(*parts, strict=True)]
            mean = self.group.means[self.step]
        return RoundOutcome(averaged=[m.clone() for m in mean], num_peers=self.group.n)


@pytest.mark.parametrize("overlap", [True, False])
def test_peers_hold_identical_state_after_every_outer_step(overlap: bool) -> None:
    torch.set_num_threads(1)
    group = _LocalGroup(2)
    cfg = DiLoCoConfig(inner_steps=4, max_outer_steps=5, inner_warmup_steps=0, overlap_communication=overlap)
    reports: list[list[OuterStepReport]] = [[], []]

    models = []
    for _ in range(2):  # the same seed gives both peers the same initial weights (built in this thread)
        torch.manual_seed(0)
        models.append(TinyGPT(ModelConfig(d_model=16, n_layers=1, n_heads=2, max_seq_len=16)))

    def work(i: int) -> None:
        model = models[i]
        gen = torch.Generator().manual_seed(100 + i)  # each peer its own data

        def batch() -> torch.Tensor:
            return torch.randint(0, 256, (2, 9), generator=gen)

        trainer = DiLoCoTrainer(model, cfg, next_batch=batch, averager=group.member(), name=f"p{i}")
        reports[i] = trainer.run(threading.Event())

    threads = [threading.Thread(target=work, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert [r.outer_step for r in reports[0]] == [1, 2, 3, 4, 5] == [r.outer_step for r in reports[1]]
    for a, b in zip(reports[0], reports[1], strict=True):
        assert a.outer_hash == b.outer_hash and a.num_peers == 2
    assert len({r.outer_hash for r in reports[0]}) == 5
