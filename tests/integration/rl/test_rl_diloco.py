"""Several RL trainers training one policy with DiLoCo (`training.rl_diloco`).

Fast tests drive `DiLoCoUpdates` with in-process averagers: the published versions are the
outer steps, the learner keeps the outer versions' weights for behaviour log-probs, and two
trainers fed different rollouts end every outer step bit-identical, and every outer step is
reported with what a training receipt is signed from. The slow test runs the
whole loop on loopback: 2 trainers (each with its validator), 2 honest workers, 2 outer steps.
"""

from __future__ import annotations

import copy
import threading
from collections.abc import Sequence
from pathlib import Path

import pytest
import torch
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from hivemind.p2p import PeerID

from node.collective.outer_state import OuterState
from node.collective.round_types import DoneAverage, PendingAverage, RoundOutcome
from protocol.manifest import Manifest
from protocol.receipts import ReceiptKind, open_receipt
from tests.helpers.rl_diloco import (
    FixedStateSource,
    LoneAverager,
    OutvotedAverager,
    PairAverager,
    fetch_published,
    scored_groups,
)
from training.causal_lm import CausalLM
from training.checkpoint import CheckpointError
from training.diloco import OuterStepReport, RoundAverager
from training.grpo import GRPOConfig, StaleRolloutError
from training.model import ModelConfig, TinyGPT
from training.rl_diloco import DiLoCoUpdates, OuterVersionLearner, rl_tokens_per_outer_step
from training.rl_run import RLDiLoCoConfig, RLRunConfig
from training.trainer_node import sign_training_receipts
from verification.rl_simulation import simulate_rl

TINY = ModelConfig(d_model=32, n_layers=1, n_heads=2, max_seq_len=96)
GRPO = GRPOConfig(group_size=4, groups_per_step=1, async_level=1, lr=1e-2)


def updates_for(policy: CausalLM, averager: RoundAverager, inner_steps: int = 2) -> DiLoCoUpdates:
    learner = OuterVersionLearner(policy, GRPO, inner_steps=inner_steps, outer_version=0)
    return DiLoCoUpdates(learner, RLDiLoCoConfig(inner_steps=inner_steps), averager)


def params(model: CausalLM) -> list[torch.Tensor]:
    return [p.detach().clone() for p in model.parameters()]


def test_a_version_per_outer_step_and_behaviour_weights_of_outer_versions() -> None:
    torch.manual_seed(0)
    updates = updates_for(TinyGPT(TINY), LoneAverager())
    start = params(updates.learner.model)

    _, new = updates.step(scored_groups(1, 0))
    assert not new and updates.version == 0
    # the current outer version's rollouts are still welcome after an inner step moved the weights
    _, new = updates.step(scored_groups(2, 0))
    assert new and updates.version == 1
    assert [r.version for r in updates.records] == [1]
    # the model holds the outer parameters now, and they moved
    outer = updates.state.params
    assert all(torch.equal(p, o) for p, o in zip(params(updates.learner.model), outer, strict=True))
    assert not all(torch.equal(a, b) for a, b in zip(start, outer, strict=True))

    # version 0 is within the async level of version 1; a version never published is not
    updates.step(scored_groups(3, 0))
    with pytest.raises(StaleRolloutError):
        updates.step(scored_groups(4, 2))
    updates.step(scored_groups(5, 1))
    assert updates.version == 2
    # only the newest async_level + 1 outer versions are kept; version 0 is now too old
    # (in outer versions, what rollouts carry and what the trainer compares them with)
    assert updates.learner.known_versions == [1, 2]
    with pytest.raises(StaleRolloutError):
        updates.step(scored_groups(6, 0))


def test_behaviour_log_probs_come_from_the_outer_version_that_generated_the_rollouts() -> None:
    torch.manual_seed(1)
    updates = updates_for(TinyGPT(TINY), LoneAverager(), inner_steps=3)
    outer = copy.deepcopy(updates.learner.model)
    updates.step(scored_groups(7, 0))
    behaviour = updates.learner.model_at(updates.learner.internal(0))
    assert all(torch.equal(a, b) for a, b in zip(behaviour.parameters(), outer.parameters(), strict=True))
    assert not all(
        torch.equal(a, b) for a, b in zip(updates.learner.model.parameters(), outer.parameters(), strict=True)
    )


def test_two_trainers_end_every_outer_step_with_identical_states() -> None:
    torch.manual_seed(2)
    policy = TinyGPT(TINY)
    pair = PairAverager(2)
    trainers = [updates_for(copy.deepcopy(policy), pair.member(i)) for i in range(2)]
    alone = updates_for(copy.deepcopy(policy), LoneAverager())

    def train(index: int, updates: DiLoCoUpdates) -> None:
        for step in range(4):  # 2 outer steps, different rollouts on each trainer
            updates.step(scored_groups(100 * index + step, updates.version))

    threads = [threading.Thread(target=train, args=(i, u)) for i, u in enumerate(trainers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    train(0, alone)

    first, second = trainers
    assert [r.version for r in first.records] == [1, 2] == [r.version for r in second.records]
    assert [r.state_hash for r in first.records] == [r.state_hash for r in second.records]
    assert all(r.num_peers == 2 for r in first.records)
    assert pair.steps.count(0) == 2 and pair.steps.count(1) == 2
    for a, b in zip(first.learner.model.parameters(), second.learner.model.parameters(), strict=True):
        assert torch.equal(a, b)
    # they really averaged: trainer 0 alone on the same rollouts ends elsewhere
    assert alone.records[-1].state_hash != first.records[-1].state_hash


def test_the_outer_momentum_survives_a_restart() -> None:
    """A restarted DiLoCo trainer resumes its outer state whole: parameters and momentum (its inner
    optimizer starts afresh, as a non-RL DiLoCo trainer's does)."""
    torch.manual_seed(5)
    updates = updates_for(TinyGPT(TINY), LoneAverager(), inner_steps=1)
    for seed in range(2):
        updates.step(scored_groups(20 + seed, updates.version))
    saved = updates.saved_state()
    assert updates.version == 2 and any(bool(m.abs().sum() > 0) for m in saved.values())

    # what a restart has: the checkpointed weights, its version, and `saved`
    policy = TinyGPT(TINY)
    policy.load_state_dict(updates.learner.state_dict())
    learner = OuterVersionLearner(policy, GRPO, inner_steps=1, outer_version=2)
    resumed = DiLoCoUpdates(learner, RLDiLoCoConfig(inner_steps=1), LoneAverager())
    assert resumed.state.hash() != updates.state.hash()  # without the momentum it is another state
    resumed.restore(saved)
    assert resumed.state.hash() == updates.state.hash()


def test_a_checkpoint_without_fitting_momentum_is_refused() -> None:
    updates = updates_for(TinyGPT(TINY), LoneAverager(), inner_steps=1)
    saved = updates.saved_state()
    with pytest.raises(CheckpointError, match="no DiLoCo outer momentum"):
        updates.restore({})
    first = next(iter(saved))
    with pytest.raises(CheckpointError, match="does not fit"):
        updates.restore({**saved, first: torch.zeros(3)})
    with pytest.raises(CheckpointError, match="not finite"):
        updates.restore({**saved, first: torch.full_like(saved[first], float("nan"))})


def test_a_trainer_outvoted_by_its_group_adopts_the_majority_state() -> None:
    torch.manual_seed(4)
    policy = TinyGPT(TINY)
    majority = OuterState.from_model(TinyGPT(TINY), step=1)
    source = FixedStateSource(majority)
    learner = OuterVersionLearner(policy, GRPO, inner_steps=1, outer_version=0)
    updates = DiLoCoUpdates(learner, RLDiLoCoConfig(inner_steps=1), OutvotedAverager(), state_source=source)

    _, new = updates.step(scored_groups(8, 0))

    assert new and source.asked == [0]
    assert updates.records[-1].resynced and updates.records[-1].state_hash == majority.hash()
    assert updates.version == 1 and updates.state.hash() == majority.hash()
    assert all(torch.equal(p, o) for p, o in zip(params(policy), majority.params, strict=True))
    updates.step(scored_groups(9, 1))  # and trains on from there
    assert updates.version == 2


def test_a_resync_refuses_a_state_that_cannot_predict_the_rollouts_trained_on() -> None:
    """Agreeing sources may be one attacker's identities: a state far worse than ours on the
    rollouts this trainer just trained on is refused, and the trainer keeps its own."""
    torch.manual_seed(4)
    policy = TinyGPT(TINY)
    gen = torch.Generator().manual_seed(7)
    poisoned = OuterState(
        [torch.randn(p.shape, generator=gen) * 50.0 for p in policy.parameters()],
        [torch.zeros_like(p) for p in policy.parameters()],
        1,
    )
    source = FixedStateSource(poisoned)
    learner = OuterVersionLearner(policy, GRPO, inner_steps=1, outer_version=0)
    updates = DiLoCoUpdates(learner, RLDiLoCoConfig(inner_steps=1), OutvotedAverager(), state_source=source)

    _, new = updates.step(scored_groups(8, 0))

    assert new and source.asked == [0]
    assert not updates.records[-1].resynced and updates.state.hash() != poisoned.hash()
    assert not any(torch.equal(p, o) for p, o in zip(params(policy), poisoned.params, strict=True))


class GroupAverager(LoneAverager):
    """Every round is averaged with two others: one contribution accepted (its bytes counted), one refused."""

    ROUND_ID = b"r" * 16
    MEMBER = PeerID.from_base58("12D3KooWGRUVh7ntHADphGqfYLBDGRVS7Z4aprbs7xHF8ECKs5Xh").to_bytes()

    def start_average(
        self, pseudo_grads: Sequence[torch.Tensor], *, step: int, outer_hash: str
    ) -> PendingAverage:
        averaged = [g.clone() for g in pseudo_grads]
        return DoneAverage(
            RoundOutcome(
                averaged=averaged,
                num_peers=2,
                refused_peers=1,
                round_id=self.ROUND_ID,
                received_bytes={self.MEMBER: 1234},
            )
        )


def test_every_outer_step_is_reported_with_what_a_training_receipt_needs() -> None:
    torch.manual_seed(6)
    reports: list[OuterStepReport] = []
    learner = OuterVersionLearner(TinyGPT(TINY), GRPO, inner_steps=2, outer_version=0)
    updates = DiLoCoUpdates(
        learner, RLDiLoCoConfig(inner_steps=2), GroupAverager(), on_round=reports.append, name="t0"
    )
    losses = [float(updates.step(scored_groups(30, 0))[0].loss)]
    assert reports == []  # an inner step is no round
    losses.append(float(updates.step(scored_groups(31, 0))[0].loss))
    (report,) = reports
    assert (report.peer, report.outer_step, report.averaged_step) == ("t0", 1, 0)
    assert (report.num_peers, report.refused_peers) == (2, 1)
    assert report.round_id == GroupAverager.ROUND_ID
    assert report.received_from == {GroupAverager.MEMBER: 1234}
    assert report.outer_hash == updates.state.hash()
    assert report.train_loss == pytest.approx(sum(losses) / 2)
    assert report.tokens == 2 * 4 * 8  # completion tokens trained on: 2 steps of 4 rollouts of 8

    key = Ed25519PrivateKey.generate()
    run = RLRunConfig(run_id="rl-receipts", diloco=RLDiLoCoConfig(inner_steps=2))
    tokens = rl_tokens_per_outer_step(run)
    assert (
        tokens == 2 * run.grpo.groups_per_step * run.grpo.group_size * 38
    )  # line-length's completion budget
    (sealed,) = sign_training_receipts(report, key, run_id=run.run_id, tokens_trained=tokens)
    receipt = open_receipt(sealed, run_id=run.run_id, kinds=frozenset({ReceiptKind.TRAINING}))
    assert (receipt.contributor, receipt.step, receipt.tokens) == (GroupAverager.MEMBER, 0, tokens)
    assert (receipt.evidence, receipt.byte_count) == (GroupAverager.ROUND_ID, 1234)


def test_a_run_stops_only_at_an_outer_step_boundary() -> None:
    RLRunConfig(max_trainer_steps=4, diloco=RLDiLoCoConfig(inner_steps=2))
    with pytest.raises(ValueError, match="must be a multiple of"):
        RLRunConfig(max_trainer_steps=3, diloco=RLDiLoCoConfig(inner_steps=2))


@pytest.mark.slow
def test_two_rl_trainers_train_one_policy_with_diloco(tmp_path: Path) -> None:
    config = RLRunConfig(
        run_id="rl-diloco-test",
        model=TINY,
        grpo=GRPOConfig(group_size=4, groups_per_step=1, async_level=2),
        max_trainer_steps=4,  # GRPO steps per trainer: 2 outer steps of H = 2
        diloco=RLDiLoCoConfig(inner_steps=2, averaging_timeout_s=240.0),
    )
    fetched: dict[str, tuple[Manifest, dict[str, torch.Tensor]]] = {}

    def fetch_from_each(peers: list[str], run: RLRunConfig) -> None:
        assert len(run.authorized_publishers) == 2  # every trainer of the run may publish
        assert run.admitted_trainers == run.authorized_publishers  # and the run names them as its trainers
        for publisher in run.authorized_publishers:
            fetched[publisher] = fetch_published(peers, tmp_path, run.run_id, 2, publisher)

    torch.manual_seed(3)
    result = simulate_rl(
        config, TinyGPT(TINY), workers=2, trainers=2, root=tmp_path, after_training=fetch_from_each
    )

    records = result.trainers
    assert sorted(records) == ["trainer0", "trainer1"]
    first, second = records["trainer0"], records["trainer1"]
    # every outer step averaged both trainers, and both ended it bit-identical
    for record in (first, second):
        assert [s.version for s in record.outer_steps] == [1, 2]
        assert all(s.num_peers == 2 for s in record.outer_steps)
        assert len(record.steps) == 4
    assert [s.state_hash for s in first.outer_steps] == [s.state_hash for s in second.outer_steps]
    assert first.final_state.keys() == second.final_state.keys()
    assert all(torch.equal(first.final_state[k], second.final_state[k]) for k in first.final_state)

    # each published every outer version, with identical content and so one content id: the
    # holders of either publication serve the fetchers of both
    for version in (0, 1, 2):
        a, b = first.manifests[version], second.manifests[version]
        assert a.publisher != b.publisher
        assert a.content_id == b.content_id
        assert (a.total_bytes, a.chunk_bytes, a.chunk_hashes, a.tensors) == (
            b.total_bytes,
            b.chunk_bytes,
            b.chunk_hashes,
            b.tensors,
        )

    # a fresh peer that trusts only one of them fetches the same weights from either
    assert len(fetched) == 2
    for publisher, (manifest, state) in fetched.items():
        assert manifest.publisher == PeerID.from_base58(publisher).to_bytes()
        assert manifest.chunk_hashes == first.manifests[2].chunk_hashes
        assert manifest.content_id == first.manifests[2].content_id == second.manifests[2].content_id
        assert all(torch.equal(state[k], first.final_state[k]) for k in first.final_state)

    # each trained only on rollouts its own validator accepted, and both trained
    for record in (first, second):
        assert record.trained_hashes and record.trained_hashes <= record.accepted_hashes
    assert not first.trained_hashes & second.trained_hashes

    # workers generated on published outer versions only, and every honest rollout was accepted
    published = set(first.manifests)
    for name in ("worker0", "worker1"):
        judged = [g for g in result.groups[name] if not g.error]
        assert judged and {g.version for g in judged} <= published
        assert not any(g.rejected for g in judged)
