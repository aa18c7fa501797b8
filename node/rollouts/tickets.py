"""The ticket service: a worker asks the validator it will submit to for assignments.

Protocol `PROTO_TICKETS`: the worker sends one `TicketRequest` frame (this run, how many tickets, of
which policy version), the validator answers one `TicketResponse` frame (the worker's open tickets there, topped up, or
an error saying why it issues none). The request is capped at `MAX_TICKET_REQUEST_BYTES` before
it is buffered; a malformed one (another run, a count out of range) bans its sender. Who asks is
the stream's authenticated PeerID: a ticket is issued to the peer that asked and is only good for
that peer's groups. Issuing is the injected `handler` (the validator's ticket book lives outside
`node`); it raises `TicketsRefused` to issue nothing with a reason.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

import hivemind
from hivemind.p2p import P2P, PeerID

from node.bans import BanList
from node.identity import Identity
from node.rollouts.config import StreamServiceConfig
from node.rollouts.errors import TicketsRefused
from node.rollouts.streams import FramedService, exchange
from protocol import rollouts_pb2 as rpb
from protocol.limits import MAX_TICKET_REQUEST_BYTES, MAX_TICKET_RESPONSE_BYTES
from protocol.tickets import (
    encode_ticket_request,
    encode_ticket_response,
    parse_ticket_request,
    parse_ticket_response,
)
from protocol.version import PROTOCOL_VERSION

__all__ = ["PROTO_TICKETS", "TicketHandler", "TicketIntake", "request_tickets"]

logger = logging.getLogger(__name__)

PROTO_TICKETS = f"/hivenet/{PROTOCOL_VERSION}/rollouts/tickets"

TicketHandler = Callable[[bytes, int, int], Awaitable[list[rpb.Ticket]]]
"""(worker PeerID bytes, tickets wanted, policy version) -> the worker's open tickets, topped up."""


class TicketIntake(FramedService):
    """A validator's node service serving `PROTO_TICKETS`; construct, then `await start()` (or add it to a node)."""

    name = "ticket-intake"
    proto = PROTO_TICKETS
    what = "ticket request"

    def __init__(
        self,
        *,
        dht: hivemind.DHT | None,
        identity: Identity,
        run_id: str,
        handler: TicketHandler,
        config: StreamServiceConfig | None = None,
        p2p: P2P | None = None,
        bans: BanList | None = None,
    ) -> None:
        config = config if config is not None else StreamServiceConfig(handler_timeout_s=10.0)
        super().__init__(
            dht=dht,
            config=config,
            max_frame_bytes=MAX_TICKET_REQUEST_BYTES,
            p2p=p2p,
            bans=bans,
            owner=identity.short_id,
        )
        self.run_id = run_id
        self.handler = handler
        self.requests_answered = 0

    def error_response(self, error: str) -> bytes:
        return encode_ticket_response(error=error)

    async def answer(self, peer: PeerID, frame: bytes) -> bytes:
        count, version = parse_ticket_request(frame, run_id=self.run_id)
        try:
            tickets = await self.handler(peer.to_bytes(), count, version)
        except TicketsRefused as exc:
            return encode_ticket_response(error=str(exc))
        except Exception as exc:
            logger.exception("[%s] issuing tickets to %s failed", self.owner, peer.to_base58()[-8:])
            return encode_ticket_response(
                error=f"the validator failed to issue tickets: {type(exc).__name__}"
            )
        self.requests_answered += 1
        return encode_ticket_response(tickets)


async def request_tickets(
    p2p: P2P, validator: PeerID, *, run_id: str, count: int, policy_version: int, timeout_s: float
) -> list[rpb.Ticket]:
    """Ask `validator` for `count` tickets of `run_id`: this worker's open tickets there, topped up with
    tickets of `policy_version`.

    Raises TicketsRefused with the validator's reason when it issues none, SubmissionTimeout or
    PeerUnavailable when it does not answer, and InvalidMessage when the answer is malformed.
    """
    answer = await exchange(
        p2p,
        validator,
        PROTO_TICKETS,
        encode_ticket_request(run_id, count, policy_version),
        max_response_bytes=MAX_TICKET_RESPONSE_BYTES,
        timeout_s=timeout_s,
    )
    tickets, error = parse_ticket_response(answer)
    if error:
        raise TicketsRefused(f"validator {validator.to_base58()[-8:]} issues no tickets: {error}")
    return tickets
