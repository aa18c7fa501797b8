"""The dashboard's training panel from a ledger of signed receipts: the loss curve is the median of
the vouched-for signers' own losses (a liar, trusted or not, cannot move it), the reward curve the
validators' mean per policy version, and tokens, outer steps and bytes per token what counted."""

from __future__ import annotations

from pathlib import Path

import pytest

from node.dashboard import DashboardData
from node.dashboard.training_view import MAX_POINTS, _spread
from node.ledger import Ledger
from tests.helpers.dashboard_training import rewarded_verdict, training_round
from tests.helpers.receipts import RUN, new_peer


@pytest.fixture
def trained(tmp_path: Path) -> tuple[DashboardData, dict[str, bytes]]:
    keys = {name: new_peer() for name in ("a", "b", "c", "d", "liar", "val", "sybil-val", "worker")}
    peer = {name: peer_id for name, (_, peer_id) in keys.items()}
    key = {name: k for name, (k, _) in keys.items()}
    envelopes = [
        *training_round(
            {peer[n]: (key[n], loss) for n, loss in (("a", 3.0), ("b", 3.2), ("c", 3.1))}, step=1
        ),
        # "c" is trusted but lies; "d" is a volunteer vouched for by the trusted trainers it averaged with
        *training_round(
            {peer[n]: (key[n], loss) for n, loss in (("a", 2.5), ("b", 2.7), ("c", 90.0), ("d", 2.6))}, step=2
        ),
        # a key nobody vouches for claims a tiny loss at step 2 (and an outer step nobody else saw)
        *training_round({peer["a"]: (key["a"], 0.0), peer["liar"]: (key["liar"], 0.001)}, step=2)[1:],
        *training_round({peer["a"]: (key["a"], 0.0), peer["liar"]: (key["liar"], 0.001)}, step=9)[1:],
        rewarded_verdict(key["val"], peer["worker"], version=1, reward=0.2),
        rewarded_verdict(key["val"], peer["worker"], version=1, reward=0.4),
        rewarded_verdict(key["val"], peer["worker"], version=2, reward=0.9),
        rewarded_verdict(key["val"], peer["worker"], version=2, reward=0.0, accepted=False),
        rewarded_verdict(key["sybil-val"], peer["worker"], version=1, reward=1.0),
    ]
    ledger = Ledger(tmp_path / "ledger.db", RUN)
    result = ledger.add_many(envelopes)
    assert result.added == len(envelopes), result.refused
    trusted = [peer[n] for n in ("a", "b", "c", "val")]
    return DashboardData(ledger, trusted=trusted), peer


def test_loss_is_the_median_of_the_counted_signers_losses(
    trained: tuple[DashboardData, dict[str, bytes]],
) -> None:
    data, _ = trained
    loss = {point["step"]: point for point in data.training()["loss"]}
    assert sorted(loss) == [1, 2]  # step 9 has only the unvouched key's word
    assert loss[1]["loss"] == pytest.approx(3.1) and loss[1]["signers"] == 3
    # a, b, c (90, the trusted liar) and d (vouched): the median of 2.5, 2.6, 2.7, 90; the
    # unvouched 0.001 would have made it 2.6, leaving d out 2.7, taking the mean 24.45
    assert loss[2]["loss"] == pytest.approx(2.65) and loss[2]["signers"] == 4
    assert loss[2]["receipts"] == 12


def test_tokens_outer_steps_and_bytes_per_token(trained: tuple[DashboardData, dict[str, bytes]]) -> None:
    data, _ = trained
    panel = data.training()
    assert panel["outer_steps"] == 2 and panel["latest_step"] == 2
    # each trainer's round counted once however many members signed it: 3 at step 1, 4 at step 2
    assert panel["tokens_trained"] == 7 * 1000
    # what every counted signer received from each other member: 3 * 2 + 4 * 3 receipts
    assert panel["bytes_exchanged"] == 18 * 4096
    assert panel["bytes_per_token"] == pytest.approx(18 * 4096 / 7000, abs=1e-3)
    assert panel["receipts"] == 18
    assert panel["left_out"] == 3  # the unvouched key's two training receipts and the sybil's verdict
    assert panel["receipts_url"] == "/api/receipts?kind=training"


def test_reward_is_the_mean_of_accepted_rollouts_per_policy_version(
    trained: tuple[DashboardData, dict[str, bytes]],
) -> None:
    data, _ = trained
    reward = {point["version"]: point for point in data.training()["reward"]}
    assert reward[1]["reward"] == pytest.approx(0.3) and reward[1]["rollouts"] == 2  # not the sybil's 1.0
    assert reward[2]["reward"] == pytest.approx(0.9) and reward[2]["rollouts"] == 1  # the rejection left out


def test_the_rl_figures_count_the_validators_accepted_rollouts(
    trained: tuple[DashboardData, dict[str, bytes]],
) -> None:
    data, _ = trained
    panel = data.training()
    assert panel["rollouts_accepted"] == 3  # not the rejection, nor the sybil validator's verdict
    assert panel["latest_version"] == 2 and panel["latest_reward"] == pytest.approx(0.9)
    assert panel["latest_version_url"] == "/api/receipts?kind=rollout&step=2"


def test_each_point_links_to_the_receipts_behind_it(trained: tuple[DashboardData, dict[str, bytes]]) -> None:
    data, peer = trained
    panel = data.training()
    step_two = next(p for p in panel["loss"] if p["step"] == 2)
    assert step_two["receipts_url"] == "/api/receipts?kind=training&step=2"
    behind = data.receipts(kind="training", step=2)
    assert behind["complete"] and behind["matched"] == 12
    assert {r["signer"] for r in behind["receipts"]} == {data._text(peer[n]) for n in "abcd"}
    assert all(r["step"] == 2 and r["kind"] == "training" for r in behind["receipts"])
    rewards = data.receipts(kind="rollout", step=1)
    assert rewards["matched"] == 2 and {r["signer"] for r in rewards["receipts"]} == {data._text(peer["val"])}
    assert data.receipts(kind="training", step=7)["matched"] == 0
    with pytest.raises(ValueError, match="kind=training"):
        data.receipts(step=1)
    with pytest.raises(ValueError, match="kind=training"):
        data.receipts(kind="seed", step=1)


def test_a_long_curve_is_spread_evenly_with_its_ends() -> None:
    steps = list(range(3, 1003))
    spread = _spread(steps)
    assert len(spread) == MAX_POINTS and spread[0] == 3 and spread[-1] == 1002
    assert spread == sorted(set(spread))
    assert _spread(steps[:10]) == steps[:10]
