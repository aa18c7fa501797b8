"""Averager declarations: what a DiLoCo averager says about itself under its run's averaging keys.

hivemind's averagers declare themselves in the DHT as plain values under their PeerID: who is
looking for a group under a matchmaking key, and who serves its state (at which priority) under
`.all_averagers`. Unsigned, anyone could write them for anyone: mark an honest trainer as having
left its group, or advertise a victim at a step it never reached. hivenet's averagers sign them
instead (a `SignedEnvelope` of domain `AVERAGER_DECLARATION_DOMAIN` under the subkey
`hn:<PeerID>`, bound to the DHT key and expiring when the declaration lapses), and the record
validator refuses every unsigned value.
"""

from __future__ import annotations

import math

from protocol import hivenet_pb2 as pb
from protocol.errors import InvalidMessage
from protocol.limits import MAX_AVERAGER_DECLARATION_TTL_S
from protocol.untrusted import parse_untrusted

__all__ = [
    "AVERAGER_DECLARATION_DOMAIN",
    "MAX_AVERAGER_DECLARATION_TTL_S",
    "check_declaration_payload",
    "declaration_payload",
    "parse_declaration",
]

AVERAGER_DECLARATION_DOMAIN = "averager-declaration"
MAX_STATE_PRIORITY = 2.0**53
"""Largest state-sharing priority (an outer step) a declaration may carry: exact as a float."""


def declaration_payload(
    *, looking_for_group: bool = False, shares_state: bool = False, state_priority: float = 0.0
) -> bytes:
    """The serialized declaration (checked as a reader would check it)."""
    payload = pb.AveragerDeclaration(
        looking_for_group=looking_for_group, shares_state=shares_state, state_priority=state_priority
    ).SerializeToString()
    parse_declaration(payload)
    return payload


def parse_declaration(payload: bytes) -> pb.AveragerDeclaration:
    """A declaration from untrusted bytes; InvalidMessage unless its priority is finite and in range."""
    declaration = parse_untrusted(pb.AveragerDeclaration, payload, "averager declaration")
    priority = declaration.state_priority
    if not (math.isfinite(priority) and abs(priority) <= MAX_STATE_PRIORITY):
        raise InvalidMessage(f"averager declaration's state priority {priority} is out of range")
    if priority and not declaration.shares_state:
        raise InvalidMessage("an averager that shares no state declares no state priority")
    return declaration


def check_declaration_payload(payload: bytes, _signer: bytes) -> None:
    """The record validator's payload check (the envelope's signer is the averager itself)."""
    parse_declaration(payload)
