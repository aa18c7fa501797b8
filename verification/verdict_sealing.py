"""The verdicts a validator signs: one per rollout of a judged group, one per abandoned ticket.

Each is a `RolloutVerdict` sealed as a receipt (`protocol.rollout_messages.seal_verdict`). A ban
is put on record in the verdict that caused it (`banned_until`), so that every ledger holding the
receipt knows of it.
"""

from __future__ import annotations

from protocol import rollouts_pb2
from protocol.limits import MAX_VERDICT_BAN_S
from protocol.peer_keys import Signer
from protocol.rollout_messages import ABANDONED, seal_verdict
from verification.rollout_checks import RolloutItem
from verification.tickets import Ticket, ticket_evidence

__all__ = ["seal_abandoned_verdicts", "seal_group_verdicts"]


def _ban_end(now: float, ban_s: float) -> float:
    return now + min(ban_s, MAX_VERDICT_BAN_S)


def seal_group_verdicts(
    signer: Signer,
    *,
    run_id: str,
    worker: bytes,
    version: int,
    counter: int,
    items: list[RolloutItem],
    accepted: bool,
    ban: tuple[int, float] | None,
    now: float,
    first_seq: int,
) -> list[bytes]:
    """One signed verdict per rollout of a judged group; the rollout that got the worker banned (`ban`:
    its index and the ban's length) says so in its verdict."""
    ban_index, ban_s = ban if ban is not None else (-1, 0.0)
    return [
        seal_verdict(
            signer,
            run_id=run_id,
            verdict=rollouts_pb2.RolloutVerdict(
                worker=worker,
                rollout_hash=item.hash,
                policy_version=version,
                counter=counter,
                index=item.index,
                tokens=item.tokens,
                accepted=accepted,
                reason="" if accepted else str(item.reason),
                detail="accepted" if accepted else item.detail,
                reward=item.reward if accepted else 0.0,
                issued_at=now,
                banned_until=_ban_end(now, ban_s) if item.index == ban_index and ban_s > 0 else 0.0,
            ),
            seq=first_seq + i,
        )
        for i, item in enumerate(items)
    ]


def seal_abandoned_verdicts(
    signer: Signer, *, run_id: str, tickets: list[Ticket], ban_s: float, now: float, first_seq: int
) -> list[bytes]:
    """One signed `abandoned` verdict per ticket of one worker that expired unused (the last carries
    the ban they caused, if any), so that abandoned assignments are on record as rejections are."""
    return [
        seal_verdict(
            signer,
            run_id=run_id,
            verdict=rollouts_pb2.RolloutVerdict(
                worker=ticket.worker,
                rollout_hash=ticket_evidence(signer.peer_id, ticket),
                policy_version=ticket.policy_version,
                counter=ticket.counter,
                index=0,
                tokens=0,
                accepted=False,
                reason=ABANDONED,
                detail=f"ticket {ticket.counter} of policy version {ticket.policy_version} expired unused",
                reward=0.0,
                issued_at=now,
                banned_until=_ban_end(now, ban_s) if i == len(tickets) - 1 and ban_s > 0 else 0.0,
            ),
            seq=first_seq + i,
        )
        for i, ticket in enumerate(tickets)
    ]
