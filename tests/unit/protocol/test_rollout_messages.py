"""Rollout transport messages: round trips, and every way a group, rollout, verdict or forward is refused."""

from __future__ import annotations

import math
import time
from typing import Any

import pytest

from protocol import rollout_forward_pb2 as fpb
from protocol import rollouts_pb2 as rpb
from protocol.envelope import seal
from protocol.errors import InvalidMessage
from protocol.limits import (
    MAX_ROLLOUT_COMPLETION_TOKENS,
    MAX_ROLLOUT_GROUP_BYTES,
    MAX_ROLLOUT_PROMPT_TOKENS,
    MAX_ROLLOUT_PROOF_BYTES,
    MAX_ROLLOUTS_PER_GROUP,
    MAX_VERDICT_BAN_S,
    MAX_VERDICT_DETAIL_CHARS,
    RECEIPT_TTL_S,
    ROLLOUT_GROUP_TTL_S,
)
from protocol.receipts import MAX_RECEIPT_BYTES, open_receipt
from protocol.rollout_messages import (
    DOMAIN_FORWARD,
    DOMAIN_GROUP,
    open_forward,
    open_group,
    open_verdict,
    parse_rollout,
    rollout_hash,
    seal_forward,
    seal_group,
    seal_verdict,
)
from tests.helpers.rollouts import RUN, key, make_group, make_rollout, peer_bytes, verdicts_for

WORKER = key("worker")
VALIDATOR = key("validator")
OTHER = key("other")
ISSUED = time.time()


def _raw_group(group: rpb.RolloutGroup, private_key: Any = WORKER, **overrides: Any) -> bytes:
    """A group sealed without `seal_group`'s checks, to test what `open_group` refuses."""
    args: dict[str, Any] = dict(
        domain=DOMAIN_GROUP,
        run_id=RUN,
        payload=group.SerializeToString(),
        expires_at=time.time() + 60,
        seq=1,
        max_bytes=4 * MAX_ROLLOUT_GROUP_BYTES,
    )
    args.update(overrides)
    return seal(private_key, **args)


# --- groups and rollouts ------------------------------------------------------------------------


def test_group_round_trip_and_rollout_hash() -> None:
    group = make_group(4)
    envelope, opened = open_group(seal_group(WORKER, run_id=RUN, group=group, seq=5), run_id=RUN)
    assert envelope.signer == peer_bytes(WORKER) and envelope.seq == 5
    assert opened == group
    assert rollout_hash(group.rollouts[1]) == rollout_hash(make_rollout(seed=1).SerializeToString())
    assert rollout_hash(group.rollouts[1]) != rollout_hash(group.rollouts[2])
    assert parse_rollout(group.rollouts[2]) == make_rollout(seed=2)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        (dict(run_id="another-run"), "belongs to run"),
        (dict(signer=peer_bytes(OTHER)), "signed by another peer"),
        (dict(seconds_later=ROLLOUT_GROUP_TTL_S + 120), "expired"),
    ],
)
def test_group_out_of_context_is_refused(kwargs: dict[str, Any], match: str) -> None:
    # "later" counts from sealing: a time fixed at collection would be in the past by the time a
    # long suite reaches this test (the group, sealed then, looked valid for too long, not expired)
    sealed = seal_group(WORKER, run_id=RUN, group=make_group(2), seq=1)
    args: dict[str, Any] = dict(run_id=RUN)
    if "seconds_later" in kwargs:
        args["now"] = time.time() + kwargs.pop("seconds_later")
    args.update(kwargs)
    with pytest.raises(InvalidMessage, match=match):
        open_group(sealed, **args)


def test_group_signed_for_too_long_is_refused() -> None:
    sealed = _raw_group(make_group(2), expires_at=time.time() + 10 * ROLLOUT_GROUP_TTL_S)
    with pytest.raises(InvalidMessage, match="beyond"):
        open_group(sealed, run_id=RUN)


def test_tampered_oversized_and_malformed_groups_are_refused() -> None:
    sealed = bytearray(seal_group(WORKER, run_id=RUN, group=make_group(2), seq=1))
    sealed[-70] ^= 1  # inside the signed body or the signature
    with pytest.raises(InvalidMessage):
        open_group(bytes(sealed), run_id=RUN)
    with pytest.raises(InvalidMessage, match="exceeds"):
        open_group(b"\x00" * (MAX_ROLLOUT_GROUP_BYTES + 1), run_id=RUN)
    with pytest.raises(InvalidMessage, match="must be bytes"):
        open_group("not bytes", run_id=RUN)
    with pytest.raises(InvalidMessage, match="malformed"):
        open_group(b"\xff\xff\xff", run_id=RUN)
    verdict = verdicts_for(VALIDATOR, peer_bytes(WORKER), make_group(1))[0]
    with pytest.raises(InvalidMessage, match="expected 'rollout-group'"):
        open_group(verdict, run_id=RUN)
    payload_garbage = _raw_group(make_group(1), payload=b"\x0a\xff\xff\xff\xff")
    with pytest.raises(InvalidMessage, match="malformed rollout group"):
        open_group(payload_garbage, run_id=RUN)


@pytest.mark.parametrize(
    ("group", "match"),
    [
        (make_group(0), "0 rollouts"),
        (make_group(MAX_ROLLOUTS_PER_GROUP + 1, completion_tokens=1), "65 rollouts"),
        (rpb.RolloutGroup(task="", rollouts=make_group(1).rollouts), "task name"),
        (rpb.RolloutGroup(task="x" * 65, rollouts=make_group(1).rollouts), "task name"),
        (rpb.RolloutGroup(task="length", rollouts=[b"\xff\xff"]), "rollout 0 of the group: malformed"),
    ],
)
def test_group_over_its_caps_is_refused_when_sealed_and_opened(group: rpb.RolloutGroup, match: str) -> None:
    with pytest.raises(InvalidMessage, match=match):
        seal_group(WORKER, run_id=RUN, group=group, seq=1)
    with pytest.raises(InvalidMessage, match=match):
        open_group(_raw_group(group), run_id=RUN)


_BAD_ROLLOUTS = [
    (dict(temperature=math.nan), "temperature nan"),
    (dict(temperature=math.inf), "temperature inf"),
    (dict(temperature=0.0), "temperature 0.0"),
    (dict(temperature=-1.0), "temperature"),
    (dict(temperature=101.0), "temperature"),
    (dict(top_p=math.nan), "top_p nan"),
    (dict(top_p=0.0), "top_p"),
    (dict(top_p=1.5), "top_p"),
    (dict(dtype="int8"), "dtype 'int8'"),
    (dict(dtype=""), "dtype"),
    (dict(prompt_ids=[]), "0 prompt tokens"),
    (dict(prompt_ids=[1] * (MAX_ROLLOUT_PROMPT_TOKENS + 1)), "prompt tokens"),
    (dict(prompt_ids=[2**31]), "prompt token id"),
    (dict(completion_ids=[], proofs=[]), "0 completion tokens"),
    (dict(completion_ids=[1] * 40, proofs=[b"\x01" * 258]), "1 proofs for 40 completion tokens, expected 2"),
    (dict(completion_ids=[1] * 32, proofs=[b"\x01" * 258] * 2), "2 proofs for 32"),
    (dict(completion_ids=[5], proofs=[b"\x01" * (MAX_ROLLOUT_PROOF_BYTES + 1)]), "proof 0 is 4097 bytes"),
    (dict(completion_ids=[5], proofs=[b"\x01"]), "proof 0 is 1 bytes"),
]


@pytest.mark.parametrize(("overrides", "match"), _BAD_ROLLOUTS)
def test_rollout_over_its_caps_is_refused(overrides: dict[str, Any], match: str) -> None:
    data = make_rollout(**overrides).SerializeToString()
    with pytest.raises(InvalidMessage, match=match):
        parse_rollout(data)
    group = rpb.RolloutGroup(task="length", rollouts=[make_rollout().SerializeToString(), data])
    with pytest.raises(InvalidMessage, match="rollout 1 of the group"):
        open_group(_raw_group(group), run_id=RUN)


def test_rollout_longest_allowed_parses_and_longer_is_refused() -> None:
    longest = make_rollout(completion_tokens=MAX_ROLLOUT_COMPLETION_TOKENS)
    assert len(parse_rollout(longest.SerializeToString()).completion_ids) == MAX_ROLLOUT_COMPLETION_TOKENS
    with pytest.raises(InvalidMessage, match="completion tokens"):
        parse_rollout(make_rollout(completion_tokens=MAX_ROLLOUT_COMPLETION_TOKENS + 1).SerializeToString())
    with pytest.raises(InvalidMessage, match="exceeds"):
        parse_rollout(b"\x00" * (8 * 1024 * 1024))


# --- verdicts -----------------------------------------------------------------------------------


def _verdict(**overrides: Any) -> rpb.RolloutVerdict:
    fields: dict[str, Any] = dict(
        worker=peer_bytes(WORKER),
        rollout_hash=bytes(32),
        policy_version=3,
        counter=7,
        index=1,
        tokens=40,
        accepted=True,
        reward=1.0,
        issued_at=ISSUED,
    )
    fields.update(overrides)
    return rpb.RolloutVerdict(**fields)


def test_verdict_round_trip_and_signer_check() -> None:
    sealed = seal_verdict(VALIDATOR, run_id=RUN, verdict=_verdict())
    envelope, verdict = open_verdict(sealed, run_id=RUN, validator=peer_bytes(VALIDATOR))
    assert envelope.signer == peer_bytes(VALIDATOR) and verdict == _verdict()
    with pytest.raises(InvalidMessage, match="signed by another peer"):
        open_verdict(sealed, run_id=RUN, validator=peer_bytes(OTHER))
    with pytest.raises(InvalidMessage, match="belongs to run"):
        open_verdict(sealed, run_id="another-run")
    with pytest.raises(InvalidMessage, match="expected 'rollout-verdict'"):
        open_verdict(seal_group(WORKER, run_id=RUN, group=make_group(1), seq=1), run_id=RUN)


@pytest.mark.parametrize(
    ("overrides", "match"),
    [
        (dict(worker=b"\x00\x01"), "peer id"),
        (dict(rollout_hash=b"\x01" * 31), "31 bytes"),
        (dict(index=MAX_ROLLOUTS_PER_GROUP), "index"),
        (dict(tokens=MAX_ROLLOUT_COMPLETION_TOKENS + 1), "tokens"),
        (dict(reason="stale"), "reason exactly when it rejects"),
        (dict(accepted=False, reward=0.0), "reason exactly when it rejects"),
        (dict(accepted=False, reason="stale", reward=0.5), "reward 0"),
        (dict(reward=math.nan), "reward nan"),
        (dict(reward=1.5), "reward"),
        (dict(reward=-0.1), "reward"),
        (dict(issued_at=math.inf), "issued_at"),
        (dict(accepted=False, reason="x" * 65, reward=0.0), "too long"),
        (dict(banned_until=ISSUED + 60), "banned_until"),  # an accepted rollout bans nobody
        (dict(accepted=False, reason="sampling", reward=0.0, banned_until=ISSUED), "banned_until"),
        (dict(accepted=False, reason="sampling", reward=0.0, banned_until=math.nan), "banned_until"),
        (
            dict(accepted=False, reason="sampling", reward=0.0, banned_until=ISSUED + MAX_VERDICT_BAN_S + 1),
            "banned_until",
        ),
    ],
)
def test_verdict_out_of_range_is_refused(overrides: dict[str, Any], match: str) -> None:
    with pytest.raises(InvalidMessage, match=match):
        seal_verdict(VALIDATOR, run_id=RUN, verdict=_verdict(**overrides))
    _assert_opening_refuses(overrides, match)


def test_a_rejection_may_announce_the_ban_it_caused() -> None:
    verdict = _verdict(accepted=False, reason="sampling", reward=0.0, banned_until=ISSUED + 120)
    _, opened = open_verdict(seal_verdict(VALIDATOR, run_id=RUN, verdict=verdict), run_id=RUN)
    assert opened.banned_until == ISSUED + 120


def _assert_opening_refuses(overrides: dict[str, Any], match: str) -> None:
    raw = seal(
        VALIDATOR,
        domain="rollout-verdict",
        run_id=RUN,
        payload=_verdict(**overrides).SerializeToString(),
        expires_at=time.time() + 60,
        seq=1,
    )
    with pytest.raises(InvalidMessage, match=match):
        open_verdict(raw, run_id=RUN)


def test_a_long_detail_is_cut_so_the_verdict_opens_for_workers_and_ledgers() -> None:
    long = _verdict(accepted=False, reason="reward_error", reward=0.0, detail="\U0001f600" * 10_000)
    sealed = seal_verdict(VALIDATOR, run_id=RUN, verdict=long, seq=5)
    assert len(sealed) <= MAX_RECEIPT_BYTES  # 4-byte characters: the worst case
    envelope, opened = open_verdict(sealed, run_id=RUN, validator=peer_bytes(VALIDATOR))
    assert opened.detail == "\U0001f600" * MAX_VERDICT_DETAIL_CHARS and opened.reason == "reward_error"
    assert envelope.seq == 5 and envelope.expires_at == ISSUED + RECEIPT_TTL_S
    assert open_receipt(sealed, run_id=RUN).reason == "reward_error"
    assert len(long.detail) == 10_000  # the caller's message is left as it was
    _assert_opening_refuses(
        dict(accepted=False, reason="x", detail="d" * (MAX_VERDICT_DETAIL_CHARS + 1), reward=0.0), "too long"
    )


def test_a_verdict_is_a_receipt_for_its_lifetime_only() -> None:
    sealed = seal_verdict(VALIDATOR, run_id=RUN, verdict=_verdict())
    assert open_verdict(sealed, run_id=RUN, now=ISSUED + RECEIPT_TTL_S - 60)[1] == _verdict()
    with pytest.raises(InvalidMessage, match="expired"):
        open_verdict(sealed, run_id=RUN, now=ISSUED + RECEIPT_TTL_S + 3600)
    longer = seal(
        VALIDATOR,
        domain="rollout-verdict",
        run_id=RUN,
        payload=_verdict().SerializeToString(),
        expires_at=ISSUED + 3 * RECEIPT_TTL_S,
        seq=1,
    )
    with pytest.raises(InvalidMessage, match="validity beyond"):
        open_verdict(longer, run_id=RUN, now=ISSUED)


# --- forwards -----------------------------------------------------------------------------------


def _forward(
    group: rpb.RolloutGroup | None = None, verdicts: list[bytes] | None = None, **kwargs: Any
) -> bytes:
    group = group if group is not None else make_group(3)
    sealed_group = seal_group(WORKER, run_id=RUN, group=group, seq=1)
    if verdicts is None:
        verdicts = verdicts_for(VALIDATOR, peer_bytes(WORKER), group)
    return seal_forward(
        kwargs.pop("signer", VALIDATOR), run_id=RUN, sealed_group=sealed_group, sealed_verdicts=verdicts
    )


def test_forward_round_trip() -> None:
    group = make_group(3)
    forwarded = open_forward(_forward(group), run_id=RUN, validator=peer_bytes(VALIDATOR))
    assert forwarded.envelope.signer == peer_bytes(VALIDATOR)
    assert forwarded.group_envelope.signer == peer_bytes(WORKER)
    assert forwarded.group == group
    assert [v.index for v in forwarded.verdicts] == [0, 1, 2]
    assert all(v.accepted and v.reward == 0.5 for v in forwarded.verdicts)
    assert len(forwarded.verdict_envelopes) == 3


def test_forward_refusals() -> None:
    group = make_group(3)
    worker = peer_bytes(WORKER)
    with pytest.raises(InvalidMessage, match="signed by another peer"):
        open_forward(_forward(group), run_id=RUN, validator=peer_bytes(OTHER))
    # verdicts signed by another validator than the one forwarding
    with pytest.raises(InvalidMessage, match=r"verdict 0 of the forward: .*signed by another peer"):
        open_forward(_forward(group, verdicts_for(OTHER, worker, group)), run_id=RUN)
    # verdicts naming another worker than the group's signer
    with pytest.raises(InvalidMessage, match="another worker"):
        open_forward(_forward(group, verdicts_for(VALIDATOR, peer_bytes(OTHER), group)), run_id=RUN)
    # verdicts of another group (same shape, other rollouts)
    other_group = make_group(3, temperature=0.5)
    with pytest.raises(InvalidMessage, match="rollout_hash mismatch"):
        open_forward(_forward(group, verdicts_for(VALIDATOR, worker, other_group)), run_id=RUN)
    other_counter = make_group(3, counter=8)
    with pytest.raises(InvalidMessage, match="counter"):
        open_forward(_forward(group, verdicts_for(VALIDATOR, worker, other_counter)), run_id=RUN)
    verdicts = verdicts_for(VALIDATOR, worker, group)
    with pytest.raises(InvalidMessage, match="2 verdicts for a group of 3"):
        open_forward(_forward(group, verdicts[:2]), run_id=RUN)
    with pytest.raises(InvalidMessage, match="verdict 0 names rollout 1"):
        open_forward(_forward(group, [verdicts[1], verdicts[0], verdicts[2]]), run_id=RUN)
    with pytest.raises(InvalidMessage, match="belongs to run"):
        open_forward(_forward(group), run_id="another-run")


def test_forward_with_a_forged_group_is_refused() -> None:
    group = make_group(2)
    sealed_group = bytearray(seal_group(WORKER, run_id=RUN, group=group, seq=1))
    sealed_group[-3] ^= 1  # breaks the worker's signature
    raw = seal(
        VALIDATOR,
        domain=DOMAIN_FORWARD,
        run_id=RUN,
        payload=fpb.RolloutForward(
            group=bytes(sealed_group), verdicts=verdicts_for(VALIDATOR, peer_bytes(WORKER), group)
        ).SerializeToString(),
        expires_at=time.time() + 60,
        seq=1,
        max_bytes=MAX_ROLLOUT_GROUP_BYTES,
    )
    with pytest.raises(InvalidMessage, match="signature"):
        open_forward(raw, run_id=RUN)
