"""`AveragingService` against untrusted input, driven without libp2p or a DHT.

The service is built with stand-ins: a DHT that records what `declare` stores (the declared step
sets the rounds it takes messages for, through the public path), a P2P that answers `average`'s
requests in memory, and a `declarations` override (what the DHT would list). Frames go in through
`handle_stream` with in-memory streams (so a refused message shows as its reply and its ban) or
through `answer` directly.

Covered: a contribution or commit signed by another key than the stream's peer, for another run
or a malformed round key, for another step than its key's; a payload that does not match its
signed hash, its header's size or the codec's exact size; another codec; a step outside the
declared window; an equivocator (banned, out of the aggregate); a contribution after the gather;
a commit naming too many peers; frames of neither kind and fuzzed bytes; a peer the run does not
admit; an oversized frame. After each attack an honest contribution is still taken. An honest
round: a member's contribution is taken, answers carry the service's own contribution once it has
one (to members it did not reach with its own request), and the round aggregates what every
committer holds.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import time
from collections.abc import Callable
from typing import Any

import pytest
import torch
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from hivemind.p2p import PeerID
from hypothesis import strategies as st

from node.broadcast.wire import encode_frame
from node.collective.codecs import DenseInt8Codec
from node.collective.config import AveragingConfig
from node.collective.round_types import RoundOutcome
from node.collective.service import AveragingService
from protocol import collective_pb2 as pb
from protocol.averaging_round import (
    COMMIT_DOMAIN,
    CONTRIBUTION_DOMAIN,
    MAX_COMMIT_HELD,
    ROUND_DECLARATION_DOMAIN,
    RoundDeclaration,
    parse_commit,
    parse_contribution_header,
    parse_round_declaration,
)
from protocol.dht_keys import averaging_prefix, averaging_round_key, round_channel_key
from protocol.envelope import open_envelope, seal
from protocol.errors import InvalidMessage
from tests.helpers.fuzzing import arbitrary_or_mutated, fuzz_variants, mutated, run_bounded
from tests.helpers.rollouts import RecordingWriter, key, peer_bytes
from tests.helpers.waiting import async_wait_until

PREFIX = averaging_prefix("collective-inputs")
SHAPES = [(4, 8), (8,)]
CODEC = DenseInt8Codec(SHAPES)  # stateless: one instance encodes every test peer's payload
HASH = "0123456789abcdef"
STEP = 7
EXPIRES = 4_000_000_000.0  # fixed, so that sealed frames (and the fuzz seeds) are the same bytes every run
BANNED = "refused, sender banned: "

SERVICE = key("averaging inputs service")
HONEST, LATE = key("averaging inputs honest"), key("averaging inputs late honest")
ATTACKER = key("averaging inputs attacker")
MEMBER_A, MEMBER_B = key("averaging inputs member a"), key("averaging inputs member b")
EQUIVOCATOR = key("averaging inputs equivocator")
SYBILS = [key(f"averaging inputs sybil {i}") for i in range(2)]
OUTSIDER = key("averaging inputs outsider")
KEYS = {
    peer_bytes(k): k
    for k in (SERVICE, HONEST, LATE, ATTACKER, MEMBER_A, MEMBER_B, EQUIVOCATOR, OUTSIDER, *SYBILS)
}


def pid(private_key: Ed25519PrivateKey) -> PeerID:
    return PeerID(peer_bytes(private_key))


def tensors(seed: int) -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    return [torch.randn(shape, generator=generator) for shape in SHAPES]


def payload_of(seed: int) -> bytes:
    return CODEC.encode(tensors(seed))


def sha(data: bytes) -> bytes:
    return hashlib.sha256(data).digest()


def seal_for(signer: Ed25519PrivateKey, domain: str, dht_key: str, payload: bytes) -> bytes:
    return seal(
        signer,
        domain=domain,
        run_id="",
        dht_key=dht_key,
        expires_at=EXPIRES,
        seq=1,
        payload=payload,
        max_bytes=64 * 1024,
    )


def contribution(
    signer: Ed25519PrivateKey,
    step: int = STEP,
    *,
    seed: int = 0,
    codec: str = CODEC.name,
    header_step: int | None = None,
    dht_key: str | None = None,
    domain: str = CONTRIBUTION_DOMAIN,
    signed_payload: bytes | None = None,
    payload: bytes | None = None,
    payload_bytes: int | None = None,
) -> pb.RoundMessage:
    """A contribution frame; by default an honest one. The header's hash and size describe
    `signed_payload` (the codec's encoding of `tensors(seed)`); `payload` is what is sent."""
    signed = payload_of(seed) if signed_payload is None else signed_payload
    header = pb.ContributionHeader(
        step=step if header_step is None else header_step,
        outer_hash=HASH,
        codec=codec,
        payload_sha256=sha(signed),
        payload_bytes=len(signed) if payload_bytes is None else payload_bytes,
    )
    key_ = round_channel_key(PREFIX, step) if dht_key is None else dht_key
    sealed = seal_for(signer, domain, key_, header.SerializeToString())
    return pb.RoundMessage(
        contribution=pb.Contribution(header=sealed, payload=signed if payload is None else payload)
    )


def commit(
    signer: Ed25519PrivateKey,
    held: dict[bytes, bytes],
    step: int = STEP,
    *,
    inner_step: int | None = None,
    dht_key: str | None = None,
) -> pb.RoundMessage:
    """A commit frame (built as raw protobuf, so that it may break the rules `commit_payload` checks)."""
    body = pb.Commit(
        step=step if inner_step is None else inner_step,
        held=[pb.Held(peer=p, payload_sha256=h) for p, h in sorted(held.items())],
    )
    key_ = round_channel_key(PREFIX, step) if dht_key is None else dht_key
    return pb.RoundMessage(commit=seal_for(signer, COMMIT_DOMAIN, key_, body.SerializeToString()))


def declaration(step: int = STEP) -> RoundDeclaration:
    return RoundDeclaration(step, HASH, CODEC.name, time.time(), True)


def opened_commit(service: AveragingService, sealed: bytes, step: int = STEP) -> dict[bytes, bytes]:
    """What a commit the service signed holds (checked as a member would open it)."""
    envelope = open_envelope(
        sealed, domain=COMMIT_DOMAIN, run_id="", dht_key=round_channel_key(PREFIX, step), signer=service.me
    )
    commit_step, held = parse_commit(envelope.payload)
    assert commit_step == step
    return held


class StandInDHT:
    """What `declare` stores into (hivemind's `DHT.store` signature); nothing leaves the process."""

    def __init__(self) -> None:
        self.stored: list[tuple[str, bytes]] = []

    async def store(
        self, key: str, value: bytes, expiration_time: float, subkey: Any = None, return_future: bool = False
    ) -> bool:
        self.stored.append((key, value))
        return True


Respond = Callable[[bytes, pb.RoundMessage], pb.RoundReply]


class _AnsweringWriter:
    """The requesting side's writer of one stand-in stream: the request frame it is given is
    recorded and answered at once into the stream's reader."""

    def __init__(self, p2p: StandInP2P, peer: bytes, reader: asyncio.StreamReader) -> None:
        self.p2p, self.peer, self.reader = p2p, peer, reader

    def write(self, data: bytes) -> None:
        message = pb.RoundMessage.FromString(data[4:])
        self.p2p.requests.append((self.peer, message))
        self.reader.feed_data(encode_frame(self.p2p.respond(self.peer, message).SerializeToString()))
        self.reader.feed_eof()

    async def drain(self) -> None:
        return None

    def close(self) -> None:
        return None


class StandInP2P:
    """hivemind's P2P stream API as `start`/`stop` and `exchange` use it, in memory: each request
    `average` sends is recorded and answered by `respond` (by default as an agreeing member: an
    empty answer to a contribution, and its own commit echoing the service's to a commit)."""

    def __init__(self, respond: Respond | None = None) -> None:
        self.respond: Respond = respond or self.agreeing
        self.requests: list[tuple[bytes, pb.RoundMessage]] = []

    def agreeing(self, peer: bytes, message: pb.RoundMessage) -> pb.RoundReply:
        if not message.commit:
            return pb.RoundReply()
        held = open_envelope(message.commit, domain=COMMIT_DOMAIN, run_id="").payload
        step, holds = parse_commit(held)
        return pb.RoundReply(commit=commit(KEYS[peer], holds, step).commit)

    def sent(self, kind: str) -> list[tuple[bytes, pb.RoundMessage]]:
        return [(p, m) for p, m in self.requests if m.WhichOneof("body") == kind]

    async def add_binary_stream_handler(self, name: str, handler: Any, balanced: bool = False) -> None:
        return None

    async def remove_binary_stream_handler(self, name: str) -> None:
        return None

    async def call_binary_stream_handler(
        self, peer_id: PeerID, name: str
    ) -> tuple[None, asyncio.StreamReader, _AnsweringWriter]:
        reader = asyncio.StreamReader()
        return None, reader, _AnsweringWriter(self, peer_id.to_bytes(), reader)


class Service(AveragingService):
    """The service with the DHT's list of declared trainers stood in (the network is not touched)."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.declared: dict[bytes, RoundDeclaration] = {}
        """The other trainers' declarations, as the DHT would list them (tests set it)."""

    async def declarations(self) -> dict[bytes, RoundDeclaration]:
        return {p: d for p, d in self.declared.items() if p != self.me and self.admits(p)}


async def make_service(
    *, admitted: frozenset[bytes] | None = None, p2p: StandInP2P | None = None, **config: Any
) -> Service:
    settings: dict[str, Any] = dict(
        refusal_linger_s=0.0,
        min_gather_s=0.0,
        gather_timeout_s=10.0,
        commit_timeout_s=10.0,
        aggregation="mean",
    )
    settings.update(config)
    service = Service(
        dht=StandInDHT(),
        signing_key=SERVICE,
        prefix=PREFIX,
        codec=DenseInt8Codec(SHAPES),
        config=AveragingConfig(**settings),
        admitted=admitted,
        p2p=p2p,  # type: ignore[arg-type]
        label="inputs",
    )
    await service.declare(STEP, HASH, time.time(), serves_state=True)
    return service


async def stream(
    service: AveragingService, sender: Ed25519PrivateKey, message: pb.RoundMessage | bytes
) -> tuple[pb.RoundReply, RecordingWriter]:
    """One frame through `handle_stream` with in-memory streams: the reply, and the writer."""
    frame = message if isinstance(message, bytes) else message.SerializeToString()
    reader = asyncio.StreamReader()
    reader.feed_data(encode_frame(frame))
    reader.feed_eof()
    writer = RecordingWriter(reader)
    await service.handle_stream(pid(sender), reader, writer)  # type: ignore[arg-type]
    assert writer.closed
    (response,) = writer.responses(service.max_frame_bytes)
    return pb.RoundReply.FromString(response), writer


async def send(
    service: AveragingService, sender: Ed25519PrivateKey, message: pb.RoundMessage | bytes
) -> pb.RoundReply:
    return (await stream(service, sender, message))[0]


async def assert_refused_and_banned(
    service: AveragingService, sender: Ed25519PrivateKey, message: pb.RoundMessage | bytes, reason: str
) -> None:
    reply = await send(service, sender, message)
    assert reply.error == BANNED + reason
    assert not reply.HasField("contribution") and not reply.commit
    assert service.bans.is_banned(pid(sender))


async def assert_error_without_ban(
    service: AveragingService, sender: Ed25519PrivateKey, message: pb.RoundMessage, error: str
) -> None:
    reply = await send(service, sender, message)
    assert reply.error == error
    assert not service.bans.is_banned(pid(sender))


async def assert_honest_taken(
    service: AveragingService, step: int = STEP, sender: Ed25519PrivateKey = LATE
) -> None:
    """An honest peer's contribution is still taken (no error, no ban)."""
    reply = await send(service, sender, contribution(sender, step, seed=99))
    assert reply == pb.RoundReply()
    assert not service.bans.is_banned(pid(sender))


# ---- honest input, and the declared window ------------------------------------------------------


def test_an_honest_contribution_and_commit_are_taken_for_the_declared_step_and_the_next() -> None:
    async def main() -> None:
        service = await make_service()
        assert isinstance(service.dht, StandInDHT)
        ((round_key, stored),) = service.dht.stored
        record = open_envelope(stored, domain=ROUND_DECLARATION_DOMAIN, run_id="", signer=service.me)
        assert round_key == averaging_round_key(PREFIX) == record.dht_key
        assert parse_round_declaration(record.payload).step == service.declared_step == STEP
        for step in (STEP, STEP + 1):
            assert await send(service, HONEST, contribution(HONEST, step)) == pb.RoundReply()
            # the same contribution again is no equivocation
            assert await send(service, HONEST, contribution(HONEST, step)) == pb.RoundReply()
            held = {peer_bytes(HONEST): sha(payload_of(0))}
            assert await send(service, HONEST, commit(HONEST, held, step)) == pb.RoundReply()
        assert not service.bans.is_banned(pid(HONEST))

    asyncio.run(main())


@pytest.mark.parametrize("kind", ["contribution", "commit"])
@pytest.mark.parametrize("step", [STEP - 1, STEP + 2, 0, 2**40])
def test_a_message_for_a_step_outside_the_declared_window_gets_an_error_without_a_ban(
    step: int, kind: str
) -> None:
    async def main() -> None:
        service = await make_service()
        held = {peer_bytes(ATTACKER): sha(payload_of(0))}
        message = contribution(ATTACKER, step) if kind == "contribution" else commit(ATTACKER, held, step)
        await assert_error_without_ban(
            service, ATTACKER, message, f"not averaging for outer step {step} (at {STEP})"
        )
        await assert_honest_taken(service, STEP)
        await assert_honest_taken(service, STEP + 1)

    asyncio.run(main())


def test_declaring_a_later_step_moves_the_window_and_drops_the_earlier_round() -> None:
    async def main() -> None:
        service = await make_service()
        await assert_honest_taken(service, STEP)
        await service.declare(STEP + 1, HASH, time.time(), serves_state=True)
        await assert_error_without_ban(
            service,
            HONEST,
            contribution(HONEST, STEP),
            f"not averaging for outer step {STEP} (at {STEP + 1})",
        )
        # the round of STEP + 1 is fresh: LATE's contribution to it is taken as a first one
        await assert_honest_taken(service, STEP + 1)
        await assert_honest_taken(service, STEP + 2)

    asyncio.run(main())


# ---- forged, relayed or misbound signatures -----------------------------------------------------

SIGNED_BY_ANOTHER = "envelope is signed by another peer than the one it claims to describe"


def test_a_contribution_signed_by_another_key_is_refused_and_its_relayer_banned() -> None:
    async def main() -> None:
        service = await make_service()
        relayed = contribution(HONEST)  # HONEST's own, genuinely signed, sent by the attacker
        await assert_refused_and_banned(service, ATTACKER, relayed, SIGNED_BY_ANOTHER)
        assert not service.bans.is_banned(pid(HONEST))  # a relay cannot get the signer banned
        # nor take the signer's place in the round: its own sending is taken as its first
        assert await send(service, HONEST, relayed) == pb.RoundReply()
        assert await send(service, HONEST, contribution(HONEST, seed=1)) == pb.RoundReply(
            error="a second, different contribution to the same round"
        )
        await assert_honest_taken(service)

    asyncio.run(main())


def test_a_commit_signed_by_another_key_is_refused_and_its_relayer_banned() -> None:
    async def main() -> None:
        service = await make_service()
        relayed = commit(HONEST, {peer_bytes(HONEST): sha(payload_of(0))})
        await assert_refused_and_banned(service, ATTACKER, relayed, SIGNED_BY_ANOTHER)
        assert not service.bans.is_banned(pid(HONEST))
        assert await send(service, HONEST, relayed) == pb.RoundReply()
        await assert_honest_taken(service)

    asyncio.run(main())


BOUND_TO = "averaging-contribution is signed for "


@pytest.mark.parametrize(
    ("dht_key", "reason"),
    [
        (round_channel_key(averaging_prefix("another-run"), STEP), BOUND_TO + "another run or key"),
        (averaging_round_key(PREFIX), BOUND_TO + "another run or key"),  # the declarations' key
        (f"{PREFIX}.round", BOUND_TO + "another run or key"),
        (f"x{PREFIX}.round.{STEP}", BOUND_TO + "another run or key"),
        (f"{PREFIX}.round.", BOUND_TO + "a malformed round key"),
        (f"{PREFIX}.round.-{STEP}", BOUND_TO + "a malformed round key"),
        (f"{PREFIX}.round.+{STEP}", BOUND_TO + "a malformed round key"),
        (f"{PREFIX}.round.{STEP}.0", BOUND_TO + "a malformed round key"),
        (f"{PREFIX}.round. {STEP}", BOUND_TO + "a malformed round key"),
        (f"{PREFIX}.round." + "0" * 16 + str(STEP), BOUND_TO + "a malformed round key"),  # 17 digits
    ],
)
def test_a_header_signed_for_another_run_or_a_malformed_round_key_is_refused(
    dht_key: str, reason: str
) -> None:
    async def main() -> None:
        service = await make_service()
        await assert_refused_and_banned(service, ATTACKER, contribution(ATTACKER, dht_key=dht_key), reason)
        await assert_honest_taken(service)

    asyncio.run(main())


def test_a_round_key_with_a_non_ascii_digit_is_refused_as_malformed() -> None:
    async def main() -> None:
        service = await make_service()
        forged = contribution(ATTACKER, dht_key=f"{PREFIX}.round.\u00b2")  # superscript two
        with pytest.raises(InvalidMessage, match="malformed round key"):
            await service.answer(pid(ATTACKER), forged.SerializeToString())
        await assert_refused_and_banned(service, ATTACKER, forged, BOUND_TO + "a malformed round key")
        await assert_honest_taken(service)

    asyncio.run(main())


def test_a_header_of_another_domain_or_run_is_refused() -> None:
    async def main() -> None:
        service = await make_service()
        as_commit = contribution(ATTACKER, domain=COMMIT_DOMAIN)  # a commit envelope passed off as a header
        await assert_refused_and_banned(
            service,
            ATTACKER,
            as_commit,
            f"envelope is a {COMMIT_DOMAIN!r} message, expected {CONTRIBUTION_DOMAIN!r}",
        )
        header = pb.ContributionHeader(
            step=STEP,
            outer_hash=HASH,
            codec=CODEC.name,
            payload_sha256=sha(payload_of(0)),
            payload_bytes=len(payload_of(0)),
        ).SerializeToString()
        other_run = seal(
            SYBILS[0],
            domain=CONTRIBUTION_DOMAIN,
            run_id="another-run",
            dht_key=round_channel_key(PREFIX, STEP),
            expires_at=EXPIRES,
            seq=1,
            payload=header,
        )
        message = pb.RoundMessage(contribution=pb.Contribution(header=other_run, payload=payload_of(0)))
        await assert_refused_and_banned(
            service, SYBILS[0], message, "envelope belongs to run 'another-run', expected ''"
        )
        await assert_honest_taken(service)

    asyncio.run(main())


def test_a_header_whose_step_differs_from_its_round_key_is_refused() -> None:
    async def main() -> None:
        service = await make_service()
        shifted = contribution(ATTACKER, STEP, header_step=STEP + 1)  # both steps are in the window
        await assert_refused_and_banned(
            service,
            ATTACKER,
            shifted,
            "contribution header names another step than the round it is signed for",
        )
        await assert_honest_taken(service)
        await assert_honest_taken(service, STEP + 1)

    asyncio.run(main())


# ---- payloads that do not match what was signed -------------------------------------------------

PAYLOAD = payload_of(0)
FLIPPED = PAYLOAD[:4] + bytes([PAYLOAD[4] ^ 1]) + PAYLOAD[5:]  # one bit of the first block's scale


@pytest.mark.parametrize(
    ("fields", "reason"),
    [
        ({"payload": FLIPPED}, "contribution payload does not match the hash its sender signed"),
        (
            {"payload_bytes": len(PAYLOAD) + 1},
            f"contribution payload of {len(PAYLOAD)} bytes does not match its header",
        ),
        (
            {"payload_bytes": len(PAYLOAD) - 1},
            f"contribution payload of {len(PAYLOAD)} bytes does not match its header",
        ),
        (
            {"payload": PAYLOAD + b"\0"},
            f"contribution payload of {len(PAYLOAD) + 1} bytes does not match its header",
        ),
        (  # longer than the codec's exact size, with a header that says so and a matching hash
            {"signed_payload": PAYLOAD + b"\0"},
            f"contribution payload of {len(PAYLOAD) + 1} bytes is not the codec's {len(PAYLOAD)}",
        ),
    ],
    ids=["hash", "header-size-over", "header-size-under", "payload-longer-than-header", "longer-than-codec"],
)
def test_a_payload_that_does_not_match_its_header_is_refused_and_its_sender_banned(
    fields: dict[str, Any], reason: str
) -> None:
    async def main() -> None:
        service = await make_service()
        await assert_refused_and_banned(service, ATTACKER, contribution(ATTACKER, **fields), reason)
        await assert_honest_taken(service)

    asyncio.run(main())


@pytest.mark.parametrize("signed_payload", [PAYLOAD[:-1], b""], ids=["one-byte-short", "empty"])
def test_a_payload_shorter_than_the_codecs_exact_size_is_refused(signed_payload: bytes) -> None:
    async def main() -> None:
        service = await make_service()
        short = contribution(ATTACKER, signed_payload=signed_payload)
        reply = await send(service, ATTACKER, short)
        assert reply.error.startswith(BANNED)
        assert service.bans.is_banned(pid(ATTACKER))
        await assert_honest_taken(service)

    asyncio.run(main())


def test_a_header_for_another_codec_gets_an_error_without_a_ban() -> None:
    async def main() -> None:
        service = await make_service()
        other = contribution(HONEST, codec="sparse")
        await assert_error_without_ban(service, HONEST, other, "this trainer averages with the 'int8' codec")
        # not taken: the same peer's int8 contribution is its first, no equivocation
        assert await send(service, HONEST, contribution(HONEST)) == pb.RoundReply()
        await assert_honest_taken(service)

    asyncio.run(main())


# ---- commits ------------------------------------------------------------------------------------


def _held(count: int) -> dict[bytes, bytes]:
    return {i.to_bytes(2, "big") + b"peer": bytes([i % 256]) * 32 for i in range(count)}


def test_commit_limits_step_and_count() -> None:
    async def main() -> None:
        service = await make_service()
        shifted = commit(ATTACKER, _held(1), STEP, inner_step=STEP + 1)
        await assert_refused_and_banned(
            service, ATTACKER, shifted, "commit names another step than the round it is signed for"
        )
        too_many = commit(SYBILS[0], _held(MAX_COMMIT_HELD + 1))
        await assert_refused_and_banned(
            service,
            SYBILS[0],
            too_many,
            f"commit names {MAX_COMMIT_HELD + 1} contributions, more than {MAX_COMMIT_HELD}",
        )
        # at the cap it is taken; the service has not committed yet, so its answer carries nothing
        assert await send(service, HONEST, commit(HONEST, _held(MAX_COMMIT_HELD))) == pb.RoundReply()
        await assert_honest_taken(service)

    asyncio.run(main())


# ---- frames that are not messages ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("frame", "reason"),
    [
        (b"", "averaging message holds neither a contribution nor a commit"),
        # an empty member of the oneof is still that kind, and an empty envelope is refused as one
        (
            pb.RoundMessage(commit=b"").SerializeToString(),
            f"envelope is a '' message, expected {COMMIT_DOMAIN!r}",
        ),
        (
            pb.RoundMessage(contribution=pb.Contribution()).SerializeToString(),
            f"envelope is a '' message, expected {CONTRIBUTION_DOMAIN!r}",
        ),
        (b"\xff" * 10, None),
        (pb.RoundMessage(commit=b"\x01\x02").SerializeToString(), None),
    ],
    ids=["empty", "empty-commit", "empty-contribution", "garbage", "garbage-commit"],
)
def test_a_frame_of_neither_kind_or_garbage_is_refused_and_its_sender_banned(
    frame: bytes, reason: str | None
) -> None:
    async def main() -> None:
        service = await make_service()
        with pytest.raises(InvalidMessage):
            await service.answer(pid(ATTACKER), frame)
        assert not service.bans.is_banned(pid(ATTACKER))  # `answer` refuses; the stream bans
        reply = await send(service, ATTACKER, frame)
        if reason is not None:
            assert reply.error == BANNED + reason
        assert reply.error.startswith(BANNED) and service.bans.is_banned(pid(ATTACKER))
        await assert_honest_taken(service)

    asyncio.run(main())


CONTRIBUTION_FRAME = contribution(HONEST).SerializeToString()
COMMIT_FRAME = commit(HONEST, {peer_bytes(HONEST): sha(PAYLOAD)}).SerializeToString()


def _under_honest_header(payload: bytes) -> bytes:
    """A frame whose signed header is honest and whose payload is `payload` (the fuzz reaches the
    payload checks, which a mutation of a whole frame seldom does without breaking it first)."""
    honest = pb.RoundMessage.FromString(CONTRIBUTION_FRAME).contribution
    return pb.RoundMessage(
        contribution=pb.Contribution(header=honest.header, payload=payload)
    ).SerializeToString()


def _answer_property(frame: bytes) -> None:
    async def main() -> bytes | None:
        service = await make_service()
        try:
            return await service.answer(pid(HONEST), frame)
        except InvalidMessage:
            return None

    data = run_bounded(main())
    if data is None:
        return
    reply = pb.RoundReply.FromString(data)
    assert not reply.HasField("contribution") and not reply.commit  # the service has not averaged
    message = pb.RoundMessage.FromString(frame)
    if not reply.error and message.WhichOneof("body") == "contribution":  # taken: exactly what was signed
        signed = open_envelope(
            message.contribution.header, domain=CONTRIBUTION_DOMAIN, signer=peer_bytes(HONEST)
        )
        header = parse_contribution_header(signed.payload)
        payload = message.contribution.payload
        assert (sha(payload), len(payload)) == (header.payload_sha256, header.payload_bytes)


test_answer_fuzz_fast, test_answer_fuzz_slow = fuzz_variants(
    _answer_property,
    st.one_of(
        arbitrary_or_mutated(CONTRIBUTION_FRAME),
        arbitrary_or_mutated(COMMIT_FRAME),
        mutated(PAYLOAD).map(_under_honest_header),
    ),
)


def test_the_fuzz_seeds_are_answered() -> None:
    """The fuzz mutates frames that are taken as they are (else it would only explore refusals)."""

    async def main() -> None:
        service = await make_service()
        for frame in (CONTRIBUTION_FRAME, COMMIT_FRAME):
            assert pb.RoundReply.FromString(await service.answer(pid(HONEST), frame)) == pb.RoundReply()

    asyncio.run(main())


# ---- stream admission ---------------------------------------------------------------------------


def test_a_peer_the_run_does_not_admit_is_refused_before_its_frame_is_read() -> None:
    async def main() -> None:
        admitted = frozenset({peer_bytes(HONEST), peer_bytes(LATE)})
        service = await make_service(admitted=admitted)
        refusal = "refused: this run names its trainers, and this peer is not one of them"
        assert service.refusal(pid(OUTSIDER)) == refusal and service.refusal(pid(HONEST)) is None
        frame = contribution(OUTSIDER).SerializeToString()
        reply, writer = await stream(service, OUTSIDER, frame)
        assert reply == pb.RoundReply(error=refusal)
        assert writer.unread_at_first_write == 4 + len(frame)  # refused before a byte was read
        assert not service.bans.is_banned(pid(OUTSIDER))
        # the refusal is a frame the service sent: bytes per token counts it
        assert service.bytes_sent == 4 + len(reply.SerializeToString())
        await assert_honest_taken(service)

    asyncio.run(main())


def test_an_oversized_frame_is_refused_before_buffering_and_its_sender_banned() -> None:
    async def main() -> None:
        service = await make_service()
        declared = service.max_frame_bytes + 1
        body = b"\0" * 4096
        reader = asyncio.StreamReader()
        reader.feed_data(declared.to_bytes(4, "big") + body)
        reader.feed_eof()
        writer = RecordingWriter(reader)
        await service.handle_stream(pid(ATTACKER), reader, writer)  # type: ignore[arg-type]
        (response,) = writer.responses()
        error = f"frame of {declared} bytes exceeds the {service.max_frame_bytes}-byte limit"
        assert pb.RoundReply.FromString(response).error == BANNED + error
        assert writer.unread_at_first_write == len(body)  # only the length was read
        assert service.bans.is_banned(pid(ATTACKER))
        # a frame of exactly the cap is read whole (and refused for what it holds, not its size)
        at_cap = b"\0" * service.max_frame_bytes
        reply, writer = await stream(service, SYBILS[0], at_cap)
        assert writer.unread_at_first_write == 0
        assert reply.error.startswith(BANNED + "malformed averaging message")
        await assert_honest_taken(service)

    asyncio.run(main())


# ---- rounds: equivocation, the gather's end, an honest exchange ---------------------------------


async def _run_round(service: Service, step: int = STEP, seed: int = 50) -> RoundOutcome:
    await service.start()
    try:
        return await asyncio.wait_for(service.average(step, tensors(seed), HASH), 30)
    finally:
        await service.stop()


def test_an_equivocator_is_banned_and_kept_out_of_the_round() -> None:
    async def main() -> None:
        p2p = StandInP2P()
        service = await make_service(p2p=p2p)
        equivocator = pid(EQUIVOCATOR)
        first = contribution(EQUIVOCATOR, seed=3)
        assert await send(service, EQUIVOCATOR, first) == pb.RoundReply()
        second = await send(service, EQUIVOCATOR, contribution(EQUIVOCATOR, seed=4))
        assert second.error == "a second, different contribution to the same round"
        assert service.bans.is_banned(equivocator)
        again = await service.answer(equivocator, first.SerializeToString())  # its first one, again
        assert (
            pb.RoundReply.FromString(again).error
            == "this peer sent two different contributions to this round"
        )
        banned = await send(service, EQUIVOCATOR, first)
        assert banned.error == "refused: this peer is banned for sending malformed or oversized messages"
        assert await send(service, MEMBER_A, contribution(MEMBER_A, seed=5)) == pb.RoundReply()

        # member A holds the equivocator's first contribution, and says so in its commit
        def respond(peer: bytes, message: pb.RoundMessage) -> pb.RoundReply:
            reply = p2p.agreeing(peer, message)
            if reply.commit:
                held = {**opened_commit(service, message.commit), peer_bytes(EQUIVOCATOR): sha(payload_of(3))}
                reply.commit = commit(KEYS[peer], held).commit
            return reply

        p2p.respond = respond
        service.declared = {peer_bytes(MEMBER_A): declaration(), peer_bytes(EQUIVOCATOR): declaration()}
        outcome = await _run_round(service)
        assert outcome.received_bytes == {peer_bytes(MEMBER_A): len(PAYLOAD)}
        assert outcome.num_peers == 2 and outcome.in_sync
        ((to, sealed),) = [(p, m.commit) for p, m in p2p.sent("commit")]
        assert to == peer_bytes(MEMBER_A)
        assert set(opened_commit(service, sealed)) == {service.me, peer_bytes(MEMBER_A)}
        assert all(p != peer_bytes(EQUIVOCATOR) for p, _ in p2p.requests)

    asyncio.run(main())


def test_a_contribution_after_the_gather_gets_an_error_without_a_ban() -> None:
    async def main() -> None:
        service = await make_service(p2p=StandInP2P())
        service.declared = {}
        outcome = await _run_round(service)  # alone: the gather ends at once
        assert outcome.averaged is None and outcome.num_peers == 1
        await assert_error_without_ban(service, HONEST, contribution(HONEST), "this round's gather is over")
        await assert_honest_taken(service, STEP + 1)

    asyncio.run(main())


@pytest.mark.parametrize(
    "refusal", ["this round's gather is over", f"not averaging for outer step {STEP} (at {STEP + 1})"]
)
def test_a_member_that_refused_our_contribution_without_a_commit_makes_us_resync(refusal: str) -> None:
    # Seen in the elastic test's last round: the other survivor's gather had ended alone before our
    # contribution came (it answered so, and had no commit to send); we held its contribution and
    # aggregated both, it applied its own alone: two states, and no round after to find it.
    def respond(peer: bytes, message: pb.RoundMessage) -> pb.RoundReply:
        if message.HasField("contribution"):
            return pb.RoundReply(error=refusal)
        return pb.RoundReply()  # no commit: it has none for this round

    async def main() -> None:
        service = await make_service(p2p=StandInP2P(respond))
        a = peer_bytes(MEMBER_A)
        assert await send(service, MEMBER_A, contribution(MEMBER_A, seed=1)) == pb.RoundReply()
        service.declared = {a: declaration()}
        outcome = await _run_round(service)
        assert (outcome.in_sync, outcome.averaged, outcome.num_peers) == (False, None, 1)

    asyncio.run(main())


@pytest.mark.parametrize("refuser_has_standing", [False, True])
def test_a_refusal_without_a_commit_moves_a_trainer_with_standing_only_if_the_refuser_has_standing(
    refuser_has_standing: bool,
) -> None:
    # A stranger (a fresh identity with a live host) that sends its contribution and refuses ours
    # made every round of a running trainer end in a resync: one identity stopped its progress. With
    # a member of standing in the round, the members of standing decide the set: the stranger's
    # contribution counts only as their commits hold it, and what it aggregates itself is its own
    # affair (a member of standing that refuses ours still makes us resync, as before).
    def respond(peer: bytes, message: pb.RoundMessage) -> pb.RoundReply:
        if peer == peer_bytes(ATTACKER):
            if message.HasField("contribution"):
                return pb.RoundReply(error="this round's gather is over")
            return pb.RoundReply()  # and never a commit
        return StandInP2P.agreeing(p2p, peer, message)

    async def main() -> None:
        service = await make_service(p2p=p2p)
        a, stranger = peer_bytes(MEMBER_A), peer_bytes(ATTACKER)
        service.standing.add(a)
        if refuser_has_standing:
            service.standing.add(stranger)
        assert await send(service, MEMBER_A, contribution(MEMBER_A, seed=1)) == pb.RoundReply()
        assert await send(service, ATTACKER, contribution(ATTACKER, seed=2)) == pb.RoundReply()
        service.declared = {a: declaration()}
        outcome = await _run_round(service)
        if refuser_has_standing:
            assert (outcome.in_sync, outcome.averaged) == (False, None)
        else:
            assert outcome.in_sync and outcome.num_peers == 3, outcome

    p2p = StandInP2P(respond)
    asyncio.run(main())


def test_a_gather_alone_waits_for_a_trainer_still_on_the_step_before() -> None:
    # Seen in the churn soak under load: the only other trainers were resyncing (declaring the step
    # before) when a member's gather began; it ended alone at once, refused their contributions as
    # too late, and left them to resync to a state nobody could confirm: the run stalled.
    async def main() -> None:
        p2p = StandInP2P()
        service = await make_service(p2p=p2p, gather_timeout_s=30.0)
        b = peer_bytes(MEMBER_B)
        service.declared = {b: declaration(STEP - 1)}
        await service.start()
        try:
            task = asyncio.ensure_future(service.average(STEP, tensors(50), HASH))

            def started() -> bool:
                book = service.intake.books.get(STEP)
                return task.done() or (book is not None and book.own_contribution is not None)

            await async_wait_until(started, 10, 0.01)
            reply = await send(service, MEMBER_B, contribution(MEMBER_B, seed=3))
            assert not reply.error, reply.error  # the gather was still open
            outcome = await asyncio.wait_for(task, 30)
        finally:
            await service.stop()
        assert outcome.in_sync and outcome.num_peers == 2, outcome

    asyncio.run(main())


def test_a_contribution_too_late_for_the_gather_is_answered_with_the_commit_that_leaves_it_out() -> None:
    # Seen in the churn soak: a joiner's contribution reached the members after their gathers had
    # ended, their commits never reached it, and it aggregated a set with itself in it while they
    # aggregated one without it: two states after one round, and nobody knew.
    async def main() -> None:
        p2p = StandInP2P()
        service = await make_service(p2p=p2p)
        a = peer_bytes(MEMBER_A)
        assert await send(service, MEMBER_A, contribution(MEMBER_A, seed=1)) == pb.RoundReply()
        service.declared = {a: declaration()}
        outcome = await _run_round(service)
        assert outcome.num_peers == 2 and outcome.in_sync
        ((_, own),) = [(p, m.commit) for p, m in p2p.sent("commit")]
        reply = await send(service, HONEST, contribution(HONEST))
        assert reply.error == "this round's gather is over" and reply.commit == own
        assert set(opened_commit(service, reply.commit)) == {service.me, a}
        assert not service.bans.is_banned(pid(HONEST))

    asyncio.run(main())


def test_a_peer_that_committed_to_our_contribution_gets_our_commit_though_we_left_its_own_out() -> None:
    async def main() -> None:
        p2p = StandInP2P()
        service = await make_service(p2p=p2p)
        a, late = peer_bytes(MEMBER_A), peer_bytes(LATE)
        assert await send(service, MEMBER_A, contribution(MEMBER_A, seed=1)) == pb.RoundReply()
        # LATE gathered our contribution and A's and committed to them, but its own never reached us
        ours = sha(CODEC.encode(tensors(50)))
        theirs = {late: sha(payload_of(7)), a: sha(contribution(MEMBER_A, seed=1).contribution.payload)}
        assert await send(service, LATE, commit(LATE, {**theirs, service.me: ours})) == pb.RoundReply()
        service.declared = {a: declaration()}
        outcome = await _run_round(service)
        assert outcome.num_peers == 2 and outcome.in_sync
        assert {p for p, _ in p2p.sent("commit")} == {a, late}
        stranger = await send(service, HONEST, commit(HONEST, {peer_bytes(HONEST): sha(payload_of(8))}))
        assert stranger.commit  # answered, as any commit is, but never sent ours unasked
        assert {p for p, _ in p2p.sent("commit")} == {a, late}

    asyncio.run(main())


def test_an_honest_exchange_takes_a_members_contribution_and_answers_with_the_services_own() -> None:
    """Answers carry the service's own contribution to a member that did not get it from the service's
    own request (here B, whose service was not ready for the round yet), and only to such a member:
    two members that send to each other at once must not each get the other's payload twice."""
    not_ready = pb.RoundReply(error=f"not averaging for outer step {STEP} (at {STEP - 1})")

    def respond(peer: bytes, message: pb.RoundMessage) -> pb.RoundReply:
        if peer == peer_bytes(MEMBER_B) and message.HasField("contribution"):
            return not_ready
        return p2p.agreeing(peer, message)

    async def main() -> None:
        service = await make_service(p2p=p2p)
        a, b = peer_bytes(MEMBER_A), peer_bytes(MEMBER_B)
        from_a, from_b = contribution(MEMBER_A, seed=1), contribution(MEMBER_B, seed=2)
        # before the service averages, A's contribution is taken and the answer has nothing of its own
        assert await send(service, MEMBER_A, from_a) == pb.RoundReply()

        service.declared = {a: declaration(), b: declaration()}
        await service.start()
        try:
            task = asyncio.ensure_future(service.average(STEP, tensors(50), HASH))
            await async_wait_until(lambda: {p for p, _ in p2p.sent("contribution")} == {a, b}, 10, 0.01)
            assert not task.done()  # B has not contributed: the gather goes on
            sent = {p: m.contribution for p, m in p2p.sent("contribution")}
            assert set(sent) == {a, b}
            own = sent[a]
            assert sent[b] == own
            header = parse_contribution_header(
                open_envelope(
                    own.header,
                    domain=CONTRIBUTION_DOMAIN,
                    run_id="",
                    dht_key=round_channel_key(PREFIX, STEP),
                    signer=service.me,
                ).payload
            )
            assert (header.step, header.outer_hash, header.payload_sha256) == (STEP, HASH, sha(own.payload))
            assert torch.allclose(
                torch.cat([t.flatten() for t in CODEC.decode(own.payload)]),
                torch.cat([t.flatten() for t in tensors(50)]),
                atol=0.05,
            )

            # A took the service's own from its request; B refused it, so B's answer carries it
            assert await send(service, MEMBER_A, from_a) == pb.RoundReply()
            assert await send(service, MEMBER_B, from_b) == pb.RoundReply(contribution=own)
            outcome = await asyncio.wait_for(task, 10)
        finally:
            await service.stop()

        payloads = {a: from_a.contribution.payload, b: from_b.contribution.payload, service.me: own.payload}
        assert outcome.in_sync and outcome.num_peers == 3 and outcome.refused_peers == 0
        assert outcome.received_bytes == {a: len(PAYLOAD), b: len(PAYLOAD)}
        assert outcome.averaged is not None
        expected = [
            torch.stack(parts).mean(0)
            for parts in zip(*(CODEC.decode(p) for p in payloads.values()), strict=True)
        ]
        for got, want in zip(outcome.averaged, expected, strict=True):
            assert torch.allclose(got, want, atol=1e-6)
        assert service.standing == {a, b}
        commits = {p: m.commit for p, m in p2p.sent("commit")}
        assert set(commits) == {a, b}
        assert opened_commit(service, commits[a]) == {p: sha(data) for p, data in payloads.items()}
        # a commit that arrives after the round is answered with the service's own
        reply = await send(service, MEMBER_A, commit(MEMBER_A, opened_commit(service, commits[a])))
        assert reply == pb.RoundReply(commit=commits[a])
        assert not any(service.bans.is_banned(pid(k)) for k in (MEMBER_A, MEMBER_B))

    p2p = StandInP2P(respond)
    asyncio.run(main())


def test_contributions_of_non_candidates_cannot_crowd_out_the_services_own() -> None:
    async def main() -> None:
        p2p = StandInP2P()
        service = await make_service(p2p=p2p, max_group_size=2, gather_timeout_s=0.2, commit_timeout_s=0.2)
        for i, sybil in enumerate(SYBILS):  # today both are taken, and the book is full
            await send(service, sybil, contribution(sybil, seed=10 + i))
        service.declared = {peer_bytes(MEMBER_A): declaration()}
        outcome = await _run_round(service)
        for _, message in p2p.sent("commit"):
            assert service.me in opened_commit(service, message.commit)
        assert outcome.num_peers == len(outcome.received_bytes) + 1  # its own is in what it aggregated

    asyncio.run(main())


def test_a_contribution_the_norm_cap_refuses_is_not_counted_as_averaged() -> None:
    # Before, a contribution refused by the norm cap still counted in `num_peers` and earned its
    # sender a training receipt (`received_bytes`) and standing.
    async def main() -> None:
        p2p = StandInP2P()
        service = await make_service(p2p=p2p, max_norm_ratio=3.0)
        a, b = peer_bytes(MEMBER_A), peer_bytes(MEMBER_B)
        huge = CODEC.encode([t * 1000 for t in tensors(2)])
        service.declared = {a: declaration(), b: declaration()}
        await service.start()
        try:
            task = asyncio.ensure_future(service.average(STEP, tensors(50), HASH))
            await async_wait_until(lambda: len(p2p.sent("contribution")) == 2 or task.done(), 10, 0.01)
            await send(service, MEMBER_A, contribution(MEMBER_A, seed=1))
            await send(service, MEMBER_B, contribution(MEMBER_B, signed_payload=huge))
            outcome = await asyncio.wait_for(task, 10)
        finally:
            await service.stop()
        assert outcome.num_peers == 2 and outcome.refused_peers == 1
        assert set(outcome.received_bytes) == {a}
        assert service.standing == {a}

    asyncio.run(main())


def _expired_commit(signer: Ed25519PrivateKey, held: dict[bytes, bytes], step: int = STEP) -> bytes:
    body = pb.Commit(step=step, held=[pb.Held(peer=p, payload_sha256=h) for p, h in sorted(held.items())])
    return seal(
        signer,
        domain=COMMIT_DOMAIN,
        run_id="",
        dht_key=round_channel_key(PREFIX, step),
        expires_at=1.0,
        seq=1,
        payload=body.SerializeToString(),
        max_bytes=64 * 1024,
    )


def test_a_stale_message_or_answer_is_refused_without_banning_its_slow_signer(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Seen in the churn soak: a member stuck past its round (a long state download) still answered
    with its own commit, signed a minute and a half before; that expired envelope got it banned, with
    doubling strikes, by every late member it answered. A stale message is its own signer's, so it
    is refused or ignored, and nobody is banned for it."""

    def respond(peer: bytes, message: pb.RoundMessage) -> pb.RoundReply:
        if message.commit:
            held = parse_commit(open_envelope(message.commit, domain=COMMIT_DOMAIN, run_id="").payload)[1]
            return pb.RoundReply(commit=_expired_commit(KEYS[peer], held))
        return pb.RoundReply(contribution=contribution(KEYS[peer], seed=1).contribution)

    async def main() -> None:
        service = await make_service(p2p=p2p, gather_timeout_s=0.5, commit_timeout_s=0.5)
        held = {peer_bytes(HONEST): sha(payload_of(0))}
        stale = pb.RoundMessage(commit=_expired_commit(HONEST, held))
        await assert_error_without_ban(service, HONEST, stale, "stale: envelope has expired")
        await assert_honest_taken(service)

        service = await make_service(p2p=p2p, gather_timeout_s=0.5, commit_timeout_s=0.5)
        service.declared = {peer_bytes(MEMBER_A): declaration()}
        await service.start()
        try:
            await asyncio.wait_for(service.average(STEP, tensors(50), HASH), 10)
            await async_wait_until(lambda: "stale averaging reply" in caplog.text, 10, 0.01)
        finally:
            await service.stop()
        assert not service.bans.is_banned(pid(MEMBER_A))

    p2p = StandInP2P(respond)
    caplog.set_level(logging.INFO, logger="node.collective.service")
    asyncio.run(main())
