"""The averaging service's messages as pure rules: building them, and reading them from untrusted bytes.

Three signed kinds, all `protocol.envelope` envelopes from the trainer they name:

- a **round declaration** (DHT record under `dht_keys.averaging_round_key`): the outer step a
  trainer holds and will average for next, its state hash, its codec, when it expects to send,
  and whether it serves its state;
- a **contribution header**, bound to the round (`dht_keys.round_channel_key`): the SHA-256 and
  size of the codec payload that follows it, so a payload cannot be swapped in transit and a
  trainer that sends two different payloads to two members has signed both;
- a **commit**, bound to the round too: which contributions (peer, payload hash) its signer holds
  once the gather ends. Members aggregate exactly the contributions every committer holds.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from protocol import collective_pb2 as pb
from protocol.errors import InvalidMessage
from protocol.untrusted import parse_untrusted

__all__ = [
    "CODEC_NAME_PATTERN",
    "COMMIT_DOMAIN",
    "CONTRIBUTION_DOMAIN",
    "MAX_COMMIT_HELD",
    "MAX_ROUND_STEP",
    "ROUND_DECLARATION_DOMAIN",
    "ROUND_DECLARATION_TTL_S",
    "ContributionHeader",
    "RoundDeclaration",
    "check_round_declaration",
    "commit_payload",
    "parse_commit",
    "parse_contribution_header",
    "parse_round_declaration",
]

ROUND_DECLARATION_DOMAIN = "averaging-round"
CONTRIBUTION_DOMAIN = "averaging-contribution"
COMMIT_DOMAIN = "averaging-commit"

ROUND_DECLARATION_TTL_S = 3600.0
"""Longest a round declaration may be valid for (a trainer renews it every outer step)."""

MAX_ROUND_STEP = 2**53
MAX_COMMIT_HELD = 256
"""Most contributions one commit may name (a group's size is capped far below)."""

CODEC_NAME_PATTERN = re.compile(r"^[a-z0-9_]{1,16}$")
_HASH_PATTERN = re.compile(r"^[0-9a-f]{16}$")


@dataclass(frozen=True)
class RoundDeclaration:
    step: int
    outer_hash: str
    codec: str
    gather_at: float
    serves_state: bool
    final: bool = False
    """The trainer's run ended at `step`: it serves that state and takes part in no more rounds."""

    def payload(self) -> bytes:
        data = pb.RoundDeclaration(
            step=self.step,
            outer_hash=self.outer_hash,
            codec=self.codec,
            gather_at=self.gather_at,
            serves_state=self.serves_state,
            final=self.final,
        ).SerializeToString()
        parse_round_declaration(data)
        return data


@dataclass(frozen=True)
class ContributionHeader:
    step: int
    outer_hash: str
    codec: str
    payload_sha256: bytes
    payload_bytes: int

    def payload(self) -> bytes:
        data = pb.ContributionHeader(
            step=self.step,
            outer_hash=self.outer_hash,
            codec=self.codec,
            payload_sha256=self.payload_sha256,
            payload_bytes=self.payload_bytes,
        ).SerializeToString()
        parse_contribution_header(data)
        return data


def _check_common(step: int, outer_hash: str, codec: str, what: str) -> None:
    if step > MAX_ROUND_STEP:
        raise InvalidMessage(f"{what}: outer step {step} is out of range")
    if not _HASH_PATTERN.fullmatch(outer_hash):
        raise InvalidMessage(f"{what}: outer hash is not 16 hex digits")
    if not CODEC_NAME_PATTERN.fullmatch(codec):
        raise InvalidMessage(f"{what}: codec name is not 1-16 of [a-z0-9_]")


def parse_round_declaration(payload: bytes) -> RoundDeclaration:
    """A round declaration from untrusted bytes (InvalidMessage if malformed or out of range)."""
    message = parse_untrusted(pb.RoundDeclaration, payload, "round declaration")
    _check_common(message.step, message.outer_hash, message.codec, "round declaration")
    if not math.isfinite(message.gather_at) or message.gather_at < 0:
        raise InvalidMessage("round declaration: gather time is not a finite, non-negative time")
    return RoundDeclaration(
        message.step,
        message.outer_hash,
        message.codec,
        message.gather_at,
        message.serves_state,
        message.final,
    )


def check_round_declaration(payload: bytes, _signer: bytes) -> None:
    """The DHT record validator's payload check (the envelope's signer is the trainer itself)."""
    parse_round_declaration(payload)


def parse_contribution_header(payload: bytes) -> ContributionHeader:
    """A contribution header from untrusted bytes."""
    message = parse_untrusted(pb.ContributionHeader, payload, "contribution header")
    _check_common(message.step, message.outer_hash, message.codec, "contribution header")
    if len(message.payload_sha256) != 32:
        raise InvalidMessage("contribution header: payload hash is not 32 bytes")
    return ContributionHeader(
        message.step, message.outer_hash, message.codec, bytes(message.payload_sha256), message.payload_bytes
    )


def parse_commit(payload: bytes) -> tuple[int, dict[bytes, bytes]]:
    """(step, {peer: payload hash}) of a commit from untrusted bytes; a peer named twice is malformed."""
    message = parse_untrusted(pb.Commit, payload, "commit")
    if message.step > MAX_ROUND_STEP:
        raise InvalidMessage(f"commit: outer step {message.step} is out of range")
    if len(message.held) > MAX_COMMIT_HELD:
        raise InvalidMessage(f"commit names {len(message.held)} contributions, more than {MAX_COMMIT_HELD}")
    held: dict[bytes, bytes] = {}
    for item in message.held:
        if len(item.payload_sha256) != 32 or not 0 < len(item.peer) <= 64:
            raise InvalidMessage("commit: a held contribution is malformed")
        if item.peer in held:
            raise InvalidMessage("commit names a peer twice")
        held[bytes(item.peer)] = bytes(item.payload_sha256)
    return message.step, held


def commit_payload(step: int, held: dict[bytes, bytes]) -> bytes:
    """A commit's payload, peers in byte order (checked as a reader would)."""
    message = pb.Commit(step=step, held=[pb.Held(peer=p, payload_sha256=h) for p, h in sorted(held.items())])
    data = message.SerializeToString()
    parse_commit(data)
    return data
