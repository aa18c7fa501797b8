"""Ticket messages: a worker asks a validator for assignments, the validator answers with tickets.

Both sides parse what the other sent as untrusted bytes: the validator a `TicketRequest` (this
run, a count from 1 to `MAX_OPEN_TICKETS`, a policy version), the worker a `TicketResponse` (at most as many
tickets as the cap, each with a nonce of `TICKET_NONCE_BYTES`, distinct counters). What a ticket
means is in `protocol.assignment`.
"""

from __future__ import annotations

from collections.abc import Sequence

from protocol import rollouts_pb2 as rpb
from protocol.errors import InvalidMessage
from protocol.limits import MAX_OPEN_TICKETS, MAX_SUBMIT_ERROR_CHARS, TICKET_NONCE_BYTES
from protocol.untrusted import parse_untrusted

__all__ = [
    "encode_ticket_request",
    "encode_ticket_response",
    "parse_ticket_request",
    "parse_ticket_response",
]

_MAX_COUNTER = 2**62


def encode_ticket_request(run_id: str, count: int, policy_version: int) -> bytes:
    return rpb.TicketRequest(run_id=run_id, count=count, policy_version=policy_version).SerializeToString()


def parse_ticket_request(frame: bytes, *, run_id: str) -> tuple[int, int]:
    """How many tickets a request for `run_id` asks for, and of which policy version; InvalidMessage
    when malformed."""
    request = parse_untrusted(rpb.TicketRequest, frame, "ticket request")
    if request.run_id != run_id:
        raise InvalidMessage(
            f"ticket request for run {request.run_id[:64]!r}, this validator serves {run_id!r}"
        )
    if not 1 <= request.count <= MAX_OPEN_TICKETS:
        raise InvalidMessage(
            f"a ticket request asks for 1 to {MAX_OPEN_TICKETS} tickets, not {request.count}"
        )
    if request.policy_version >= _MAX_COUNTER:
        raise InvalidMessage("a ticket request's policy version is out of range")
    return int(request.count), int(request.policy_version)


def encode_ticket_response(tickets: Sequence[rpb.Ticket] = (), error: str = "") -> bytes:
    return rpb.TicketResponse(tickets=list(tickets), error=error[:MAX_SUBMIT_ERROR_CHARS]).SerializeToString()


def parse_ticket_response(frame: bytes) -> tuple[list[rpb.Ticket], str]:
    """The tickets of a validator's answer and its error (empty when it issued tickets).

    InvalidMessage when the answer is malformed: too many tickets, a nonce of the wrong length, a
    counter or version out of range, a counter twice, or tickets alongside an error.
    """
    response = parse_untrusted(rpb.TicketResponse, frame, "ticket response")
    tickets = list(response.tickets)
    if len(tickets) > MAX_OPEN_TICKETS:
        raise InvalidMessage(
            f"{len(tickets)} tickets in one answer, at most {MAX_OPEN_TICKETS} are open at once"
        )
    if response.error and tickets:
        raise InvalidMessage("a ticket answer holds both tickets and an error")
    for ticket in tickets:
        if len(ticket.nonce) != TICKET_NONCE_BYTES:
            raise InvalidMessage(f"a ticket nonce holds {len(ticket.nonce)} bytes, not {TICKET_NONCE_BYTES}")
        if ticket.counter >= _MAX_COUNTER or ticket.policy_version >= _MAX_COUNTER:
            raise InvalidMessage("a ticket's counter or policy version is out of range")
    if len({ticket.counter for ticket in tickets}) != len(tickets):
        raise InvalidMessage("a ticket answer names one counter twice")
    return tickets, response.error
