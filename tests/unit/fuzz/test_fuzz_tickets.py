"""Fuzzing the ticket messages: every request or answer either parses within its caps or raises
InvalidMessage, whatever bytes a peer sends (see tests.helpers.fuzzing for the two variants)."""

from __future__ import annotations

from protocol.errors import InvalidMessage
from protocol.limits import (
    MAX_OPEN_TICKETS,
    MAX_TICKET_REQUEST_BYTES,
    MAX_TICKET_RESPONSE_BYTES,
    TICKET_NONCE_BYTES,
)
from protocol.rollouts_pb2 import Ticket
from protocol.tickets import (
    encode_ticket_request,
    encode_ticket_response,
    parse_ticket_request,
    parse_ticket_response,
)
from tests.helpers.fuzzing import arbitrary_or_mutated, fuzz_variants

RUN = "fuzz-run"
REQUEST = encode_ticket_request(RUN, 3, 7)
RESPONSE = encode_ticket_response(
    [Ticket(counter=i, policy_version=7, nonce=bytes([i]) * TICKET_NONCE_BYTES) for i in range(3)]
)


def test_the_seeds_parse() -> None:
    assert parse_ticket_request(REQUEST, run_id=RUN) == (3, 7)
    tickets, error = parse_ticket_response(RESPONSE)
    assert [t.counter for t in tickets] == [0, 1, 2] and error == ""


def _request_property(data: bytes) -> None:
    try:
        count, version = parse_ticket_request(data, run_id=RUN)
    except InvalidMessage:
        return
    assert 1 <= count <= MAX_OPEN_TICKETS and version >= 0


def _response_property(data: bytes) -> None:
    try:
        tickets, error = parse_ticket_response(data)
    except InvalidMessage:
        return
    assert len(tickets) <= MAX_OPEN_TICKETS and not (tickets and error)
    assert all(len(t.nonce) == TICKET_NONCE_BYTES for t in tickets)
    assert len({t.counter for t in tickets}) == len(tickets)


test_ticket_request_fast, test_ticket_request_slow = fuzz_variants(
    _request_property, arbitrary_or_mutated(REQUEST, max_size=MAX_TICKET_REQUEST_BYTES)
)
test_ticket_response_fast, test_ticket_response_slow = fuzz_variants(
    _response_property, arbitrary_or_mutated(RESPONSE, max_size=MAX_TICKET_RESPONSE_BYTES)
)
