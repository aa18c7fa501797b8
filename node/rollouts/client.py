"""The worker's side of `PROTO_SUBMIT`: hand a sealed group to a validator, get checked receipts back.

The validator is named by PeerID (found through membership); its addresses come from the node's
own peer store. Every verdict in the answer must be signed by that validator, for this run, and
name this group (worker, policy version, counter, index and rollout hash), or the whole answer is
refused as `InvalidMessage`: a receipt that does not check out is worth nothing.
"""

from __future__ import annotations

from dataclasses import dataclass

from hivemind.p2p import P2P, PeerID

from node.rollouts.errors import SubmissionRefused
from node.rollouts.intake import PROTO_SUBMIT
from node.rollouts.streams import exchange
from protocol import rollouts_pb2 as rpb
from protocol.errors import InvalidMessage
from protocol.limits import MAX_SUBMIT_RESPONSE_BYTES
from protocol.rollout_messages import check_verdicts_match, open_group, open_verdict
from protocol.untrusted import parse_untrusted


@dataclass(frozen=True)
class Receipt:
    """One checked verdict and the sealed envelope it came in (what the worker keeps to show later)."""

    envelope: bytes
    verdict: rpb.RolloutVerdict


async def submit_group_receipts(
    p2p: P2P, validator: PeerID, sealed_group: bytes, *, run_id: str, timeout_s: float
) -> list[Receipt]:
    """Submit `sealed_group` to `validator`; one checked receipt per rollout, in order.

    Raises SubmissionRefused (with the validator's reason) if it refused the group,
    SubmissionTimeout if no full answer came within `timeout_s`, PeerUnavailable if it could not
    be reached, and InvalidMessage if the answer is oversized, malformed or holds a verdict that
    is not the validator's own receipt for this group.
    """
    # our own group: opened to learn the rollouts' hashes the verdicts must name
    group_envelope, group = open_group(sealed_group, run_id=run_id)
    answer = await exchange(
        p2p,
        validator,
        PROTO_SUBMIT,
        sealed_group,
        max_response_bytes=MAX_SUBMIT_RESPONSE_BYTES,
        timeout_s=timeout_s,
    )
    response = parse_untrusted(rpb.SubmitResponse, answer, "submit response")
    if response.error:
        raise SubmissionRefused(f"validator {validator.to_base58()[-8:]} refused the group: {response.error}")
    receipts = []
    for i, sealed in enumerate(response.verdicts):
        try:
            _, verdict = open_verdict(sealed, run_id=run_id, validator=validator.to_bytes())
        except InvalidMessage as exc:
            raise InvalidMessage(f"verdict {i} from validator {validator.to_base58()[-8:]}: {exc}") from None
        receipts.append(Receipt(envelope=sealed, verdict=verdict))
    check_verdicts_match(group_envelope.signer, group, [receipt.verdict for receipt in receipts])
    return receipts


async def submit_group(
    p2p: P2P, validator: PeerID, sealed_group: bytes, *, run_id: str, timeout_s: float
) -> list[rpb.RolloutVerdict]:
    """Submit `sealed_group` to `validator` and return its checked verdicts (see `submit_group_receipts`)."""
    receipts = await submit_group_receipts(p2p, validator, sealed_group, run_id=run_id, timeout_s=timeout_s)
    return [receipt.verdict for receipt in receipts]
