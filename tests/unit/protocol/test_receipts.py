"""Receipts: each kind round-trips into a typed Receipt, and each forged or out-of-bounds one is refused."""

from __future__ import annotations

import hashlib
import time

import pytest

from protocol import hivenet_pb2, receipts_pb2, rollouts_pb2
from protocol.envelope import seal
from protocol.errors import InvalidMessage
from protocol.receipts import (
    DOMAIN_TRAINING,
    DOMAIN_VALIDATION,
    RECEIPT_TTL_S,
    ReceiptKind,
    open_receipt,
    seal_training_receipt,
    seal_validation_receipt,
    stored_payload,
)
from tests.helpers import receipts as make
from tests.helpers.receipts import RUN, new_peer


def test_each_kind_opens_into_a_typed_receipt() -> None:
    signer_key, signer = new_peer()
    _, contributor = new_peer()
    cases = {
        ReceiptKind.ROLLOUT: (make.verdict(signer_key, contributor, tokens=77), "inference"),
        ReceiptKind.TRAINING: (make.training(signer_key, contributor, tokens=900), "trainer"),
        ReceiptKind.TRANSFER: (make.transfer(signer_key, contributor, byte_count=5000), "broadcast"),
        ReceiptKind.SEED: (make.seed(signer_key, contributor), "seed"),
        ReceiptKind.VALIDATION: (make.validation(signer_key, contributor), "validator"),
    }
    for kind, (data, role) in cases.items():
        receipt = open_receipt(data, run_id=RUN)
        assert (receipt.kind, receipt.role) == (kind, role)
        assert receipt.signer == signer and receipt.contributor == contributor
        assert receipt.run_id == RUN and receipt.envelope == data
        assert receipt.receipt_id == hashlib.sha256(data).digest()
    assert open_receipt(cases[ReceiptKind.ROLLOUT][0]).tokens == 77
    assert open_receipt(cases[ReceiptKind.TRAINING][0]).tokens == 900
    transfer = open_receipt(cases[ReceiptKind.TRANSFER][0])
    assert (transfer.byte_count, transfer.chunks, len(transfer.evidence)) == (5000, 4, 32)
    assert open_receipt(cases[ReceiptKind.SEED][0]).count == 1


def test_rejected_verdict_keeps_its_reason() -> None:
    key, _ = new_peer()
    _, worker = new_peer()
    receipt = open_receipt(make.verdict(key, worker, accepted=False, reason="stale"))
    assert not receipt.accepted and receipt.reason == "stale"


def test_self_issued_receipt_is_refused_when_sealed_and_when_opened() -> None:
    key, me = new_peer()
    with pytest.raises(InvalidMessage, match="own work"):
        make.training(key, me)
    # a receipt sealed without the helper's check is refused by every receiver
    payload = receipts_pb2.TrainingReceipt(
        contributor=me, outer_step=1, round_id=b"r", tokens_trained=10, issued_at=time.time()
    ).SerializeToString()
    data = seal(key, domain=DOMAIN_TRAINING, run_id=RUN, payload=payload, expires_at=time.time() + 60, seq=0)
    with pytest.raises(InvalidMessage, match="self-issued"):
        open_receipt(data)


def test_tampered_payload_and_other_run_are_refused() -> None:
    key, _ = new_peer()
    _, worker = new_peer()
    data = make.training(key, worker, tokens=10)
    outer = hivenet_pb2.SignedEnvelope.FromString(data)
    body = hivenet_pb2.EnvelopeBody.FromString(outer.body)
    inner = receipts_pb2.TrainingReceipt.FromString(body.payload)
    inner.tokens_trained = 10**9
    body.payload = inner.SerializeToString()
    forged = hivenet_pb2.SignedEnvelope(body=body.SerializeToString(), signature=outer.signature)
    with pytest.raises(InvalidMessage, match="signature"):
        open_receipt(forged.SerializeToString())
    with pytest.raises(InvalidMessage, match="run"):
        open_receipt(data, run_id="another-run")


def test_non_canonical_encoding_is_refused() -> None:
    """Appending an unknown field keeps the signature valid but would give the receipt a second id."""
    key, _ = new_peer()
    _, worker = new_peer()
    data = make.seed(key, worker)
    with pytest.raises(InvalidMessage, match="canonical"):
        open_receipt(data + b"\x78\x01")  # field 15, varint 1


def test_expiry_is_checked_now_but_not_in_an_audit() -> None:
    key, _ = new_peer()
    _, worker = new_peer()
    issued = time.time() - 40 * 86400
    old = make.transfer(key, worker, issued_at=issued)
    with pytest.raises(InvalidMessage, match="expired"):
        open_receipt(old)
    assert open_receipt(old, audit=True).issued_at == issued
    with pytest.raises(InvalidMessage, match=r"beyond|future"):
        open_receipt(make.transfer(key, worker, issued_at=time.time() + 3600))


def test_validity_beyond_the_receipt_ttl_is_refused_even_in_an_audit() -> None:
    key, _ = new_peer()
    _, worker = new_peer()
    now = time.time()
    payload = receipts_pb2.TrainingReceipt(
        contributor=worker, outer_step=1, round_id=b"r", tokens_trained=1, issued_at=now
    ).SerializeToString()
    data = seal(
        key, domain=DOMAIN_TRAINING, run_id=RUN, payload=payload, expires_at=now + 2 * RECEIPT_TTL_S, seq=0
    )
    for audit in (False, True):
        with pytest.raises(InvalidMessage, match="beyond"):
            open_receipt(data, audit=audit)


@pytest.mark.parametrize(
    ("change", "match"),
    [
        (dict(rollout_hash=b"short"), "rollout_hash"),
        (dict(worker=b"\x00\x02ab"), "peer id"),
        (dict(accepted=True, reason="stale"), "reason"),
        (dict(accepted=False, reason=""), "reason"),
        (dict(reward=float("nan")), "reward nan"),
        (dict(reward=1.5), "reward"),
        (dict(issued_at=float("nan")), "issued_at"),
        (dict(issued_at=-1.0), "unix time"),
        (dict(detail="x" * 600), "too long"),
    ],
)
def test_verdict_fields_out_of_bounds_are_refused(change: dict, match: str) -> None:
    key, _ = new_peer()
    _, worker = new_peer()
    fields: dict = dict(worker=worker, rollout_hash=b"h" * 32, tokens=5, accepted=True, issued_at=time.time())
    fields.update(change)
    payload = rollouts_pb2.RolloutVerdict(**fields).SerializeToString()
    data = seal(
        key, domain="rollout-verdict", run_id=RUN, payload=payload, expires_at=time.time() + 60, seq=0
    )
    with pytest.raises(InvalidMessage, match=match):
        open_receipt(data)


def test_unknown_domain_kind_filter_and_oversize_are_refused() -> None:
    key, _ = new_peer()
    _, worker = new_peer()
    record = seal(key, domain="node-record", run_id=RUN, payload=b"x", expires_at=time.time() + 60, seq=0)
    with pytest.raises(InvalidMessage, match="not a receipt"):
        open_receipt(record)
    with pytest.raises(InvalidMessage, match="not accepted"):
        open_receipt(make.seed(key, worker), kinds=frozenset({ReceiptKind.ROLLOUT}))
    with pytest.raises(InvalidMessage, match="exceeds"):
        open_receipt(b"\x00" * 5000)
    with pytest.raises(InvalidMessage, match="must be bytes"):
        open_receipt("text")
    with pytest.raises(InvalidMessage, match="cap"):
        seal_training_receipt(
            key,
            run_id=RUN,
            contributor=worker,
            outer_step=1,
            round_id=b"r",
            tokens_trained=1 << 41,
            bytes_exchanged=0,
        )


def test_training_receipt_carries_the_signers_loss() -> None:
    key, _ = new_peer()
    _, worker = new_peer()
    data = seal_training_receipt(
        key, run_id=RUN, contributor=worker, outer_step=3, round_id=b"r", tokens_trained=10, bytes_exchanged=5,
        signer_loss=2.25,
    )  # fmt: skip
    opened = open_receipt(data, run_id=RUN)
    payload = stored_payload(opened.envelope, receipts_pb2.TrainingReceipt)
    assert payload is not None and payload.signer_loss == 2.25
    assert stored_payload(b"\xff" * 8, receipts_pb2.TrainingReceipt) is None


@pytest.mark.parametrize("loss", [float("nan"), float("inf"), float("-inf"), -0.5])
def test_training_receipt_with_a_loss_not_finite_or_negative_is_refused(loss: float) -> None:
    key, _ = new_peer()
    _, worker = new_peer()
    now = time.time()
    payload = receipts_pb2.TrainingReceipt(
        contributor=worker, outer_step=1, round_id=b"r", tokens_trained=1, issued_at=now, signer_loss=loss
    ).SerializeToString()
    data = seal(key, domain=DOMAIN_TRAINING, run_id=RUN, payload=payload, expires_at=now + 60, seq=0)
    with pytest.raises(InvalidMessage, match="signer loss"):
        open_receipt(data)
    with pytest.raises(InvalidMessage, match="signer loss"):  # and a node never signs one
        seal_training_receipt(
            key, run_id=RUN, contributor=worker, outer_step=1, round_id=b"r", tokens_trained=1,
            bytes_exchanged=0, signer_loss=loss,
        )  # fmt: skip


def test_validation_receipt_round_trips() -> None:
    trainer_key, trainer = new_peer()
    _, validator = new_peer()
    group_hash = hashlib.sha256(b"the worker's sealed group").digest()
    data = make.validation(trainer_key, validator, tokens=321, rollouts=3, group_hash=group_hash)
    receipt = open_receipt(data, run_id=RUN, kinds=frozenset({ReceiptKind.VALIDATION}))
    assert (receipt.kind, receipt.role) == (ReceiptKind.VALIDATION, "validator")
    assert (receipt.signer, receipt.contributor, receipt.evidence) == (trainer, validator, group_hash)
    assert (receipt.tokens, receipt.count, receipt.step) == (321, 3, 0)
    payload = stored_payload(receipt.envelope, receipts_pb2.ValidationReceipt)
    assert payload is not None and payload.rollouts == 3 and payload.tokens == 321
    with pytest.raises(InvalidMessage, match="own work"):  # a validator cannot sign its own
        make.validation(trainer_key, trainer)


@pytest.mark.parametrize(
    ("change", "match"),
    [
        (dict(group_hash=b"short"), "group hash is 5 bytes"),
        (dict(group_hash=b"h" * 33), "group hash is 33 bytes"),
        (dict(contributor=b""), "expected a PeerID"),
        (dict(contributor=b"\x00\x02ab"), "peer id"),
        (dict(rollouts=0, tokens=0), "0 rollouts"),
        (dict(rollouts=65, tokens=65 * 10), "65 rollouts"),
        (dict(tokens=0), "0 tokens"),
        (dict(tokens=3), "3 tokens for 4 rollouts"),
        (dict(tokens=4 * 4096 + 1), "16385 tokens"),
        (dict(issued_at=float("nan")), "unix time"),
        (dict(issued_at=0.0), "unix time"),
    ],
)
def test_validation_receipt_fields_out_of_bounds_are_refused(change: dict, match: str) -> None:
    key, _ = new_peer()
    _, validator = new_peer()
    now = time.time()
    fields: dict = dict(contributor=validator, group_hash=b"g" * 32, rollouts=4, tokens=400, issued_at=now)
    fields.update(change)
    payload = receipts_pb2.ValidationReceipt(**fields).SerializeToString()
    data = seal(key, domain=DOMAIN_VALIDATION, run_id=RUN, payload=payload, expires_at=now + 60, seq=0)
    with pytest.raises(InvalidMessage, match=match):
        open_receipt(data)
    if "issued_at" not in change:
        with pytest.raises(InvalidMessage, match=match):  # and a node never signs one
            seal_validation_receipt(
                key, run_id=RUN, contributor=fields["contributor"], group_hash=fields["group_hash"],
                rollouts=fields["rollouts"], tokens=fields["tokens"], issued_at=now,
            )  # fmt: skip
