"""The DHT record validator: hivemind calls it on every record it is asked to store or return.

A record whose subkey is `hn:<PeerID>` must hold a signed envelope (see protocol.envelope)
that was signed by that PeerID, for exactly this DHT key, in a known domain, whose payload
parses for that domain, and whose DHT expiration lies no further ahead than the domain's
maximum TTL, and never beyond the signed expiry. Anything else under such a subkey is
dropped: never stored, never returned.

Nothing outside the signed namespace is accepted, under any key: hivenet's trainers sign their
round declarations too (`protocol.averaging_round`), and a plain value with a later expiry would
replace a key's whole dictionary of signed records (one unsigned write could hide a run's nodes
or its weights pointer).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from time import monotonic

from hivemind.dht.routing import DHTID
from hivemind.dht.validation import DHTRecord, RecordValidatorBase
from hivemind.p2p import PeerID
from hivemind.utils.serializer import MSGPackSerializer

from protocol.averaging_round import (
    ROUND_DECLARATION_DOMAIN,
    ROUND_DECLARATION_TTL_S,
    check_round_declaration,
)
from protocol.dht_keys import SIGNED_SUBKEY_PREFIX
from protocol.envelope import open_envelope, peek_domain
from protocol.errors import InvalidMessage
from protocol.limits import (
    MAX_CLOCK_SKEW_S,
    MAX_ENVELOPE_BYTES,
    MAX_NODE_RECORD_TTL_S,
)
from protocol.node_record import NODE_RECORD_DOMAIN, NodeRecord

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class DomainRule:
    """How the validator treats signed records of one domain."""

    max_ttl_s: float
    check_payload: Callable[[bytes, bytes], None]
    """(payload, signer) -> None; raises InvalidMessage if the payload is bad."""


def _check_node_record(payload: bytes, signer: bytes) -> None:
    record = NodeRecord.from_payload(payload)
    if record.peer_id != signer:
        raise InvalidMessage("node record describes another peer than its signer")


DOMAIN_RULES: dict[str, DomainRule] = {
    NODE_RECORD_DOMAIN: DomainRule(max_ttl_s=MAX_NODE_RECORD_TTL_S, check_payload=_check_node_record),
    ROUND_DECLARATION_DOMAIN: DomainRule(
        max_ttl_s=ROUND_DECLARATION_TTL_S, check_payload=check_round_declaration
    ),
}
"""Every domain that may be stored in the DHT. Other packages register theirs with `register_domain`."""


def register_domain(domain: str, rule: DomainRule) -> None:
    """Allow signed DHT records of `domain` (call at import time of the module that defines it)."""
    DOMAIN_RULES[domain] = rule


def check_signed_record(record: DHTRecord, now: float | None = None) -> None:
    """Raise InvalidMessage if `record` (with an `hn:` subkey) is not a valid signed record."""
    now = time.time() if now is None else now
    if len(record.value) > MAX_ENVELOPE_BYTES + 16:  # msgpack framing adds a few bytes
        raise InvalidMessage(f"value of {len(record.value)} bytes exceeds the limit")
    subkey = MSGPackSerializer.loads(record.subkey)
    if not (isinstance(subkey, str) and subkey.startswith(SIGNED_SUBKEY_PREFIX)):
        raise InvalidMessage("a signed record's subkey must be hn:<PeerID>")
    try:
        claimed_peer = PeerID.from_base58(subkey[len(SIGNED_SUBKEY_PREFIX) :]).to_bytes()
    except Exception:
        raise InvalidMessage("subkey does not hold a valid PeerID") from None
    value = MSGPackSerializer.loads(record.value)
    if not isinstance(value, bytes):
        raise InvalidMessage(f"signed record value must be bytes, got {type(value).__name__}")
    domain = peek_domain(value)
    rule = DOMAIN_RULES.get(domain)
    if rule is None:
        raise InvalidMessage(f"envelope is of unknown domain {domain!r}")
    envelope = open_envelope(value, domain=domain, signer=claimed_peer, max_ttl_s=rule.max_ttl_s, now=now)
    if DHTID.generate(source=envelope.dht_key).to_bytes() != record.key:
        raise InvalidMessage("envelope was signed for another DHT key")
    # `not <=`: a NaN expiration (never expires in hivemind's storage, never replaced) is refused too
    if not record.expiration_time <= now + rule.max_ttl_s + MAX_CLOCK_SKEW_S:
        raise InvalidMessage(f"expiration is more than {rule.max_ttl_s:.0f} s ahead")
    if not record.expiration_time <= envelope.expires_at:
        raise InvalidMessage("DHT expiration outlives the signed expiry")
    rule.check_payload(envelope.payload, envelope.signer)


class _DropLog:
    """Dropped records are counted and logged in one line a minute: anyone can send any number."""

    EVERY_S = 60.0

    def __init__(self) -> None:
        self.count = 0
        self.logged_at = -float("inf")

    def note(self, why: str) -> None:
        self.count += 1
        now = monotonic()
        if now - self.logged_at >= self.EVERY_S:
            logger.info(
                "dropped %d invalid DHT record(s) since the last such line; latest: %s", self.count, why
            )
            self.count, self.logged_at = 0, now


_DROPS = _DropLog()


class SignedRecordValidator(RecordValidatorBase):
    """hivemind record validator: `check_signed_record` on `hn:` subkeys; every other record is
    refused. Stateless and picklable."""

    def validate(self, record: DHTRecord) -> bool:
        try:
            subkey = MSGPackSerializer.loads(record.subkey)
            if not (isinstance(subkey, str) and subkey.startswith(SIGNED_SUBKEY_PREFIX)):
                raise InvalidMessage("unsigned records are not accepted (subkeys must be hn:<PeerID>)")
            check_signed_record(record)
        except InvalidMessage as exc:
            _DROPS.note(f"invalid: {exc}")
            return False
        except Exception as exc:  # malformed msgpack and the like: never crash the DHT
            _DROPS.note(f"malformed: {exc!r}")
            return False
        return True

    @property
    def priority(self) -> int:
        return 10


# The weight broadcast's DHT domains (pointers, holder announcements); registered here so the
# registry is complete wherever the validator runs.
from protocol.manifest import BROADCAST_DOMAIN_RULES  # noqa: E402

for _domain, (_max_ttl_s, _check) in BROADCAST_DOMAIN_RULES.items():
    register_domain(_domain, DomainRule(max_ttl_s=_max_ttl_s, check_payload=_check))
