"""The ticket service on a loopback swarm of real p2pd daemons: a worker asks a validator for tickets.

The handler is a stub (the ticket book is tested on its own): the transport under test hands the
asking peer's PeerID, the count and the version to it, carries its tickets or its refusal back,
and bans a peer that sends a malformed or oversized request before reading it whole.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from typing import Any

import pytest

from node.broadcast.wire import read_frame, write_frame
from node.rollouts import PROTO_TICKETS, TicketIntake, TicketsRefused, request_tickets
from protocol import rollouts_pb2 as rpb
from protocol.tickets import encode_ticket_request
from tests.helpers.broadcast import Swarm, SwarmNode, open_swarm
from tests.helpers.rollouts import RUN
from tests.integration.node.test_rollout_transport import client_of


@pytest.fixture(scope="module")
def swarm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Swarm]:
    yield from open_swarm(tmp_path_factory.mktemp("ticket-swarm"), num_nodes=2)


class StubBook:
    def __init__(self, refuse: str = "") -> None:
        self.refuse = refuse
        self.calls: list[tuple[bytes, int, int]] = []

    async def __call__(self, worker: bytes, count: int, version: int) -> list[rpb.Ticket]:
        self.calls.append((worker, count, version))
        if self.refuse:
            raise TicketsRefused(self.refuse)
        return [rpb.Ticket(counter=i, policy_version=version, nonce=bytes([i]) * 16) for i in range(count)]


@asynccontextmanager
async def tickets_on(node: SwarmNode, handler: Any) -> AsyncIterator[TicketIntake]:
    intake = TicketIntake(dht=node.dht, identity=node.identity, run_id=RUN, handler=handler)
    await intake.start()
    try:
        yield intake
    finally:
        await intake.stop()


def test_a_worker_gets_the_tickets_issued_to_its_own_peer_id(swarm: Swarm) -> None:
    worker, validator = swarm.nodes

    async def main() -> None:
        book = StubBook()
        async with tickets_on(validator, book), client_of(worker) as p2p:
            tickets = await request_tickets(
                p2p, validator.identity.peer_id, run_id=RUN, count=3, policy_version=5, timeout_s=20
            )
            assert [(t.counter, t.policy_version) for t in tickets] == [(0, 5), (1, 5), (2, 5)]
            assert book.calls == [(worker.identity.peer_id_bytes, 3, 5)]

    asyncio.run(main())


def test_a_refusal_comes_back_with_its_reason(swarm: Swarm) -> None:
    worker, validator = swarm.nodes

    async def main() -> None:
        async with (
            tickets_on(validator, StubBook(refuse="no tickets: version 9 is not held")),
            client_of(worker) as p2p,
        ):
            with pytest.raises(TicketsRefused, match="version 9 is not held"):
                await request_tickets(
                    p2p, validator.identity.peer_id, run_id=RUN, count=1, policy_version=9, timeout_s=20
                )

    asyncio.run(main())


@pytest.mark.parametrize(
    "frame, why",
    [
        (encode_ticket_request("another-run", 1, 0), "run"),
        (encode_ticket_request(RUN, 999, 0), "1 to"),
        (b"\xff" * 40, "ticket request"),
    ],
)
def test_a_malformed_request_bans_its_sender(swarm: Swarm, frame: bytes, why: str) -> None:
    worker, validator = swarm.nodes

    async def main() -> None:
        book = StubBook()
        async with tickets_on(validator, book) as intake, client_of(worker) as p2p:
            _, reader, writer = await p2p.call_binary_stream_handler(
                validator.identity.peer_id, PROTO_TICKETS
            )
            await write_frame(writer, frame)
            answer = await asyncio.wait_for(read_frame(reader, 1 << 16), 10)
            assert answer is not None
            error = rpb.TicketResponse.FromString(answer).error
            assert why in error and "banned" in error, error
            writer.close()
            assert intake.bans.is_banned(worker.identity.peer_id) and not book.calls

    asyncio.run(main())


def test_an_oversized_declared_request_is_refused_before_buffering(swarm: Swarm) -> None:
    worker, validator = swarm.nodes

    async def main() -> None:
        async with tickets_on(validator, StubBook()) as intake, client_of(worker) as p2p:
            _, reader, writer = await p2p.call_binary_stream_handler(
                validator.identity.peer_id, PROTO_TICKETS
            )
            writer.write((1 << 30).to_bytes(4, "big") + b"\x00" * 16)
            await writer.drain()
            answer = await asyncio.wait_for(read_frame(reader, 1 << 16), 10)
            assert answer is not None and "limit" in rpb.TicketResponse.FromString(answer).error
            writer.close()
            assert intake.bans.is_banned(worker.identity.peer_id)

    asyncio.run(main())
