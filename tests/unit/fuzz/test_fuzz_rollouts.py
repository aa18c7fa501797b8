"""Fuzzing the rollout transport's readers: `open_group`, `parse_rollout`, `open_verdict`,
`open_forward` and the submit intake's whole stream handler.

Every input either opens or raises `InvalidMessage` within the deadline; what opens satisfies
every cap. Structured rollouts (edge floats, odd dtypes, wrong proof counts) are accepted exactly
when the rules say so. The intake is driven without libp2p through `handle_stream` with an
in-memory reader: it must finish, answer only well-formed capped responses, hand the handler only
groups that opened, and ban a sender whose frame declares more than the cap without reading past
the header (what follows is at most discarded after the refusal). Each property runs twice (see tests.helpers.fuzzing): fast and `slow`.
"""

from __future__ import annotations

import asyncio
import math
from pathlib import Path
from typing import Any

from hivemind.p2p import PeerID
from hypothesis import strategies as st

from node.broadcast.wire import encode_frame
from node.identity import Identity
from node.rollouts import IntakeConfig, RolloutIntake
from protocol import rollouts_pb2 as rpb
from protocol.envelope import Envelope
from protocol.errors import InvalidMessage
from protocol.limits import (
    MAX_ROLLOUT_COMPLETION_TOKENS,
    MAX_ROLLOUT_PROOF_BYTES,
    MAX_ROLLOUT_TEMPERATURE,
    MAX_ROLLOUTS_PER_GROUP,
    MAX_SUBMIT_RESPONSE_BYTES,
    MIN_ROLLOUT_PROOF_BYTES,
)
from protocol.rollout_messages import (
    ROLLOUT_DTYPES,
    open_forward,
    open_group,
    open_verdict,
    parse_rollout,
    seal_forward,
    seal_group,
)
from protocol.toploc import num_chunks
from tests.helpers.fuzzing import EDGE_FLOATS, arbitrary_or_mutated, fuzz_variants, run_bounded
from tests.helpers.rollouts import (
    RUN,
    RecordingWriter,
    key,
    make_group,
    make_rollout,
    peer_bytes,
    verdicts_for,
)

NOW = 1_800_000_000.0
WORKER = key("fuzz worker")
VALIDATOR = key("fuzz validator")
GROUP = make_group(2, completion_tokens=33)
SEALED_GROUP = seal_group(WORKER, run_id=RUN, group=GROUP, seq=1, now=NOW)
VERDICTS = verdicts_for(VALIDATOR, peer_bytes(WORKER), GROUP)
SEALED_FORWARD = seal_forward(
    VALIDATOR, run_id=RUN, sealed_group=SEALED_GROUP, sealed_verdicts=VERDICTS, now=NOW
)
ROLLOUT = make_rollout(completion_tokens=40).SerializeToString()


def _check_rollout(rollout: rpb.Rollout) -> None:
    assert 1 <= len(rollout.completion_ids) <= MAX_ROLLOUT_COMPLETION_TOKENS
    assert rollout.dtype in ROLLOUT_DTYPES
    assert math.isfinite(rollout.temperature) and 0 < rollout.temperature <= MAX_ROLLOUT_TEMPERATURE
    assert math.isfinite(rollout.top_p) and 0 < rollout.top_p <= 1
    assert len(rollout.proofs) == num_chunks(len(rollout.completion_ids))


def _open_group_property(data: bytes) -> None:
    try:
        envelope, group = open_group(data, run_id=RUN, now=NOW)
    except InvalidMessage:
        return
    assert envelope.signer == peer_bytes(WORKER)  # only the worker's own signature can open
    assert 1 <= len(group.rollouts) <= MAX_ROLLOUTS_PER_GROUP
    for data_ in group.rollouts:
        _check_rollout(parse_rollout(data_))


test_open_group_fast, test_open_group_slow = fuzz_variants(
    _open_group_property, arbitrary_or_mutated(SEALED_GROUP, max_size=4096)
)


def _parse_rollout_property(data: bytes) -> None:
    try:
        rollout = parse_rollout(data)
    except InvalidMessage:
        return
    _check_rollout(rollout)


test_parse_rollout_fast, test_parse_rollout_slow = fuzz_variants(
    _parse_rollout_property, arbitrary_or_mutated(ROLLOUT, max_size=4096)
)


def _structured_rollout_property(
    temperature: float, top_p: float, dtype: str, tokens: int, extra_proofs: int, proof_bytes: int
) -> None:
    completion = list(range(tokens))
    proofs = [b"\x01" * proof_bytes] * max(0, num_chunks(tokens) + extra_proofs)
    data = make_rollout(
        temperature=temperature, top_p=top_p, dtype=dtype, completion_ids=completion, proofs=proofs
    ).SerializeToString()
    t32 = rpb.Rollout.FromString(data).temperature  # the float32 the wire holds
    p32 = rpb.Rollout.FromString(data).top_p
    valid = (
        math.isfinite(t32)
        and 0 < t32 <= MAX_ROLLOUT_TEMPERATURE
        and math.isfinite(p32)
        and 0 < p32 <= 1
        and dtype in ROLLOUT_DTYPES
        and tokens >= 1
        and extra_proofs == 0
        and (tokens == 0 or MIN_ROLLOUT_PROOF_BYTES <= proof_bytes <= MAX_ROLLOUT_PROOF_BYTES)
    )
    try:
        parse_rollout(data)
    except InvalidMessage:
        assert not valid
        return
    assert valid


_FLOATS = st.one_of(
    EDGE_FLOATS, st.floats(-1.0, 200.0, width=32), st.sampled_from([1e-45, 1.0, 100.0, 100.00001])
)
test_structured_rollout_fast, test_structured_rollout_slow = fuzz_variants(
    _structured_rollout_property,
    _FLOATS,
    _FLOATS,
    st.sampled_from([*ROLLOUT_DTYPES, "", "int8", "float64", "bfloat16\x00"]),
    st.integers(0, 100),
    st.sampled_from([0, 0, 0, -1, 1]),
    st.sampled_from([0, 1, 3, 4, 258, MAX_ROLLOUT_PROOF_BYTES, MAX_ROLLOUT_PROOF_BYTES + 1]),
)


def _open_verdict_property(data: bytes) -> None:
    try:
        envelope, verdict = open_verdict(data, run_id=RUN, validator=peer_bytes(VALIDATOR), now=NOW)
    except InvalidMessage:
        return
    assert envelope.signer == peer_bytes(VALIDATOR)
    assert len(verdict.rollout_hash) == 32 and 0 <= verdict.reward <= 1
    assert verdict.accepted != bool(verdict.reason)


test_open_verdict_fast, test_open_verdict_slow = fuzz_variants(
    _open_verdict_property, arbitrary_or_mutated(VERDICTS[0], max_size=1024)
)


def _open_forward_property(data: bytes) -> None:
    try:
        forwarded = open_forward(data, run_id=RUN, validator=peer_bytes(VALIDATOR), now=NOW)
    except InvalidMessage:
        return
    assert forwarded.group_envelope.signer == peer_bytes(WORKER)
    assert len(forwarded.verdicts) == len(forwarded.group.rollouts)


test_open_forward_fast, test_open_forward_slow = fuzz_variants(
    _open_forward_property, arbitrary_or_mutated(SEALED_FORWARD, max_size=4096)
)


# --- the submit intake's stream handler ---------------------------------------------------------


def _responses(writer: RecordingWriter) -> list[rpb.SubmitResponse]:
    return [rpb.SubmitResponse.FromString(f) for f in writer.responses(MAX_SUBMIT_RESPONSE_BYTES)]


_CAP = 4096


def _intake(calls: list[Any]) -> RolloutIntake:
    async def handler(worker: bytes, envelope: Envelope, group: rpb.RolloutGroup) -> list[bytes]:
        calls.append(group)
        return verdicts_for(VALIDATOR, worker, group)

    return RolloutIntake(
        dht=None,
        identity=Identity(private_key=VALIDATOR, path=Path("/nonexistent/validator.key")),
        run_id=RUN,
        handler=handler,
        config=IntakeConfig(max_group_bytes=_CAP, frame_timeout_s=0.05, refusal_linger_s=0.05),
    )


# the intake opens groups against the wall clock: a fresh seal of the seed group
_LIVE_FRAME = encode_frame(seal_group(WORKER, run_id=RUN, group=GROUP, seq=1))


def _intake_stream_property(data: bytes, keep_open: bool) -> None:
    calls: list[Any] = []
    intake = _intake(calls)
    writer = RecordingWriter()

    async def serve() -> None:
        reader = asyncio.StreamReader()
        reader.feed_data(data)
        if not keep_open:
            reader.feed_eof()
        await intake.handle_stream(PeerID(peer_bytes(WORKER)), reader, writer)  # type: ignore[arg-type]

    run_bounded(serve())
    assert writer.closed
    responses = _responses(writer)
    for group in calls:
        assert 1 <= len(group.rollouts) <= MAX_ROLLOUTS_PER_GROUP
    assert sum(1 for r in responses if r.verdicts) == len(calls)
    for response in responses:
        assert bool(response.verdicts) != bool(response.error)
    if intake.bans.is_banned(PeerID(peer_bytes(WORKER))):
        assert "banned" in responses[-1].error


test_intake_stream_fast, test_intake_stream_slow = fuzz_variants(
    _intake_stream_property,
    st.one_of(arbitrary_or_mutated(_LIVE_FRAME, max_size=4096), arbitrary_or_mutated(_LIVE_FRAME * 2)),
    st.booleans(),
)


def _intake_huge_header_property(declared: int, body: bytes) -> None:
    calls: list[Any] = []
    intake = _intake(calls)
    writers: list[RecordingWriter] = []

    async def serve() -> None:
        reader = asyncio.StreamReader()
        reader.feed_data(declared.to_bytes(4, "big") + body)
        reader.feed_eof()
        writers.append(RecordingWriter(reader))
        await intake.handle_stream(PeerID(peer_bytes(WORKER)), reader, writers[0])  # type: ignore[arg-type]

    run_bounded(serve())
    (writer,) = writers
    assert writer.unread_at_first_write == len(body)  # refused when nothing past the header was read
    assert not calls and intake.bans.is_banned(PeerID(peer_bytes(WORKER)))
    (response,) = _responses(writer)
    assert "exceeds" in response.error


test_intake_huge_header_fast, test_intake_huge_header_slow = fuzz_variants(
    _intake_huge_header_property, st.integers(_CAP + 1, (1 << 32) - 1), st.binary(min_size=1, max_size=256)
)
