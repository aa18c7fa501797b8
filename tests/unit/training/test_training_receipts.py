"""A trainer's training receipts: one per other member of its round whose contribution it accepted,
with the tokens of the run's config and the bytes it received; none when it averaged alone."""

from __future__ import annotations

import time

from protocol import hivenet_pb2, receipts_pb2
from protocol.receipts import ReceiptKind, open_receipt
from tests.helpers.receipts import new_peer
from training.diloco import OuterStepReport
from training.trainer_node import sign_training_receipts

RUN = "training-receipts"


def _report(round_id: bytes, received_from: dict[bytes, int]) -> OuterStepReport:
    return OuterStepReport(
        peer="p", outer_step=8, train_loss=1.0, eval_loss=None, num_peers=1 + len(received_from), bytes_sent=0,
        tokens=0, outer_hash="h", inner_time_s=1.0, wall_time_s=1.0, averaged_step=7, round_id=round_id,
        received_from=received_from,
    )  # fmt: skip


def test_each_accepted_member_of_the_round_gets_a_receipt_signed_by_the_trainer() -> None:
    key, trainer = new_peer()
    members = {new_peer()[1]: 4096, new_peer()[1]: 1024}
    sealed = sign_training_receipts(_report(b"g" * 20, members), key, run_id=RUN, tokens_trained=8192)
    receipts = [open_receipt(data, run_id=RUN, now=time.time()) for data in sealed]
    assert {r.contributor: r.byte_count for r in receipts} == members
    for receipt in receipts:
        assert receipt.kind == ReceiptKind.TRAINING and receipt.signer == trainer
        assert (receipt.step, receipt.tokens, receipt.evidence) == (7, 8192, b"g" * 20)


def test_no_receipt_without_a_round_or_for_a_group_id_no_receipt_can_hold() -> None:
    key, _ = new_peer()
    member = {new_peer()[1]: 4096}
    assert sign_training_receipts(_report(b"", member), key, run_id=RUN, tokens_trained=1) == []
    assert sign_training_receipts(_report(b"g" * 65, member), key, run_id=RUN, tokens_trained=1) == []
    assert sign_training_receipts(_report(b"g" * 20, {}), key, run_id=RUN, tokens_trained=1) == []


def _signer_loss(envelope: bytes) -> float:
    body = hivenet_pb2.EnvelopeBody.FromString(hivenet_pb2.SignedEnvelope.FromString(envelope).body)
    return float(receipts_pb2.TrainingReceipt.FromString(body.payload).signer_loss)


def test_receipts_carry_the_trainers_own_loss_and_zero_when_it_is_not_a_number() -> None:
    key, _ = new_peer()
    member = {new_peer()[1]: 4096}
    report = _report(b"g" * 20, member)
    report.train_loss = 3.5
    assert [_signer_loss(e) for e in sign_training_receipts(report, key, run_id=RUN, tokens_trained=1)] == [
        3.5
    ]
    report.train_loss = float("nan")  # a diverged step: the receipt is still signed, the loss not reported
    assert [_signer_loss(e) for e in sign_training_receipts(report, key, run_id=RUN, tokens_trained=1)] == [
        0.0
    ]
