"""The rollout transport on a loopback swarm of real p2pd daemons: worker -> validator -> trainer.

Three DHT nodes (a worker, a validator, a trainer); each test starts its services on its own
event loop. The validator's judgement is a stub handler that seals one verdict per rollout: the
transport under test moves bytes and checks them, it does not judge.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from hivemind.p2p import P2P

from node.broadcast.dialing import HolderDialer
from node.broadcast.wire import read_frame, write_frame
from node.identity import Identity
from node.membership import LiveNode
from node.rollouts import (
    PROTO_SUBMIT,
    ForwardConfig,
    ForwardIntake,
    GroupRefused,
    IntakeConfig,
    RolloutIntake,
    SubmissionRefused,
    SubmissionTimeout,
    connect_member,
    forward_group,
    replicate_p2p,
    submit_group,
    submit_group_receipts,
)
from node.rollouts.forward import PROTO_FORWARD
from protocol import rollout_forward_pb2 as fpb
from protocol import rollouts_pb2 as rpb
from protocol.envelope import Envelope
from protocol.errors import InvalidMessage
from protocol.receipts import ReceiptKind, open_receipt, seal_validation_receipt
from protocol.rollout_messages import Forwarded, open_verdict, rollout_hash, seal_group
from tests.helpers.broadcast import Swarm, SwarmNode, open_swarm
from tests.helpers.members import live_member
from tests.helpers.rollouts import RUN, key, make_group, peer_bytes, verdicts_for
from tests.helpers.waiting import async_wait_until

SMALL_GROUP_CAP = 64 * 1024


@pytest.fixture(scope="module")
def swarm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Swarm]:
    yield from open_swarm(tmp_path_factory.mktemp("rollout-swarm"), num_nodes=3)


def _ids(swarm: Swarm) -> tuple[SwarmNode, SwarmNode, SwarmNode]:
    worker, validator, trainer = swarm.nodes
    return worker, validator, trainer


class StubValidator:
    """Seals one accepted verdict per rollout and records what it was handed."""

    def __init__(
        self, identity: Identity, *, hang: bool = False, refuse: str = "", signer: Any = None
    ) -> None:
        self.identity = identity
        self.hang = hang
        """Never answer (a validator that does not answer in time)."""
        self.refuse = refuse
        self.signer = signer if signer is not None else identity.private_key
        self.calls: list[tuple[bytes, Envelope, rpb.RolloutGroup]] = []

    async def __call__(self, worker: bytes, envelope: Envelope, group: rpb.RolloutGroup) -> list[bytes]:
        self.calls.append((worker, envelope, group))
        if self.hang:
            await asyncio.Event().wait()  # never set: cancelled when the stream ends
        if self.refuse:
            raise GroupRefused(self.refuse)
        return verdicts_for(self.signer, worker, group)


@asynccontextmanager
async def intake_on(node: SwarmNode, handler: Any, **config: Any) -> AsyncIterator[RolloutIntake]:
    intake = RolloutIntake(
        dht=node.dht,
        identity=node.identity,
        run_id=RUN,
        handler=handler,
        config=IntakeConfig(**{"max_group_bytes": SMALL_GROUP_CAP, **config}),
    )
    await intake.start()
    try:
        yield intake
    finally:
        await intake.stop()


@asynccontextmanager
async def client_of(node: SwarmNode) -> AsyncIterator[P2P]:
    p2p = await replicate_p2p(node.dht)
    try:
        yield p2p
    finally:
        await p2p.shutdown()


def _sealed(node: SwarmNode, group: rpb.RolloutGroup | None = None) -> tuple[rpb.RolloutGroup, bytes]:
    group = group if group is not None else make_group(4)
    return group, seal_group(node.identity.private_key, run_id=RUN, group=group, seq=1)


def test_submission_gets_its_signed_verdicts(swarm: Swarm) -> None:
    worker, validator, _ = _ids(swarm)

    async def main() -> None:
        stub = StubValidator(validator.identity)
        async with intake_on(validator, stub) as intake, client_of(worker) as p2p:
            group, sealed = _sealed(worker)
            receipts = await submit_group_receipts(
                p2p, validator.identity.peer_id, sealed, run_id=RUN, timeout_s=20
            )
            assert [r.verdict.index for r in receipts] == [0, 1, 2, 3]
            for receipt, data in zip(receipts, group.rollouts, strict=True):
                assert receipt.verdict.accepted and receipt.verdict.rollout_hash == rollout_hash(data)
                assert receipt.verdict.worker == worker.identity.peer_id_bytes
                # the receipt is the validator's envelope, checkable by anyone later
                _, again = open_verdict(
                    receipt.envelope, run_id=RUN, validator=validator.identity.peer_id_bytes
                )
                assert again == receipt.verdict
            assert len(stub.calls) == 1 and stub.calls[0][0] == worker.identity.peer_id_bytes
            assert stub.calls[0][2] == group and intake.groups_received == 1
            # a second group on another stream works the same
            verdicts = await submit_group(
                p2p,
                validator.identity.peer_id,
                _sealed(worker, make_group(2, counter=8))[1],
                run_id=RUN,
                timeout_s=20,
            )
            assert [v.counter for v in verdicts] == [8, 8]
            assert not intake.bans.is_banned(worker.identity.peer_id)

    asyncio.run(main())


def test_oversized_declared_frame_is_refused_before_buffering_and_sender_banned(swarm: Swarm) -> None:
    worker, validator, _ = _ids(swarm)

    async def main() -> None:
        stub = StubValidator(validator.identity)
        async with intake_on(validator, stub) as intake, client_of(worker) as p2p:
            _, reader, writer = await p2p.call_binary_stream_handler(validator.identity.peer_id, PROTO_SUBMIT)
            # declare 1 GiB and send only a few bytes: the intake must answer without waiting for the rest
            writer.write((1 << 30).to_bytes(4, "big") + b"\x00" * 16)
            await writer.drain()
            frame = await asyncio.wait_for(read_frame(reader, 1 << 16), 10)
            assert frame is not None
            response = rpb.SubmitResponse.FromString(frame)
            assert "exceeds the 65536-byte limit" in response.error and "banned" in response.error
            writer.close()
            assert intake.bans.is_banned(worker.identity.peer_id)
            assert not stub.calls
            # a banned worker's next submission is refused with a clear reason, before it is read
            with pytest.raises(SubmissionRefused, match="banned"):
                await submit_group(
                    p2p, validator.identity.peer_id, _sealed(worker)[1], run_id=RUN, timeout_s=20
                )
            assert not stub.calls

    asyncio.run(main())


def test_group_over_the_configured_cap_is_refused(swarm: Swarm) -> None:
    worker, validator, _ = _ids(swarm)

    async def main() -> None:
        stub = StubValidator(validator.identity)
        async with intake_on(validator, stub, max_group_bytes=4096) as intake, client_of(worker) as p2p:
            sealed = _sealed(worker, make_group(16))[1]
            assert len(sealed) > 4096
            with pytest.raises(SubmissionRefused, match="exceeds the 4096-byte limit"):
                await submit_group(p2p, validator.identity.peer_id, sealed, run_id=RUN, timeout_s=20)
            assert intake.bans.is_banned(worker.identity.peer_id) and not stub.calls

    asyncio.run(main())


def test_silent_stream_times_out_without_a_ban(swarm: Swarm) -> None:
    worker, validator, _ = _ids(swarm)

    async def main() -> None:
        async with (
            intake_on(validator, StubValidator(validator.identity), frame_timeout_s=0.5) as intake,
            client_of(worker) as p2p,
        ):
            _, reader, writer = await p2p.call_binary_stream_handler(validator.identity.peer_id, PROTO_SUBMIT)
            frame = await asyncio.wait_for(read_frame(reader, 1 << 16), 10)
            assert frame is not None and "timed out" in rpb.SubmitResponse.FromString(frame).error
            assert await asyncio.wait_for(reader.read(1), 10) == b""  # and the stream is closed
            writer.close()
            assert not intake.bans.is_banned(worker.identity.peer_id)
            # after a first frame, a silent continuation of the same stream times out too
            _, reader, writer = await p2p.call_binary_stream_handler(validator.identity.peer_id, PROTO_SUBMIT)
            await write_frame(writer, _sealed(worker)[1])
            first = await asyncio.wait_for(read_frame(reader, 1 << 20), 10)
            assert first is not None and len(rpb.SubmitResponse.FromString(first).verdicts) == 4
            second = await asyncio.wait_for(read_frame(reader, 1 << 16), 10)
            assert second is not None and "timed out" in rpb.SubmitResponse.FromString(second).error
            writer.close()

    asyncio.run(main())


def test_group_relayed_by_another_peer_is_refused_and_relay_banned(swarm: Swarm) -> None:
    worker, validator, trainer = _ids(swarm)

    async def main() -> None:
        stub = StubValidator(validator.identity)
        async with intake_on(validator, stub) as intake, client_of(trainer) as p2p:
            with pytest.raises(SubmissionRefused, match="signed by another peer"):
                await submit_group(
                    p2p, validator.identity.peer_id, _sealed(worker)[1], run_id=RUN, timeout_s=20
                )
            assert intake.bans.is_banned(trainer.identity.peer_id) and not stub.calls

    asyncio.run(main())


def test_refusal_handler_timeout_and_forged_receipts(swarm: Swarm) -> None:
    worker, validator, _ = _ids(swarm)

    async def main() -> None:
        peer = validator.identity.peer_id
        async with client_of(worker) as p2p:
            async with intake_on(
                validator, StubValidator(validator.identity, refuse="stale: v3 < 5 - 2")
            ) as intake:
                with pytest.raises(SubmissionRefused, match="group refused: stale"):
                    await submit_group(p2p, peer, _sealed(worker)[1], run_id=RUN, timeout_s=20)
                assert not intake.bans.is_banned(worker.identity.peer_id)
            # verdicts signed by someone else than the validator called are worthless
            async with intake_on(validator, StubValidator(validator.identity, signer=key("impostor"))):
                with pytest.raises(InvalidMessage, match="signed by another peer"):
                    await submit_group(p2p, peer, _sealed(worker)[1], run_id=RUN, timeout_s=20)
            # a validator that does not answer in time
            async with intake_on(validator, StubValidator(validator.identity, hang=True)):
                with pytest.raises(SubmissionTimeout, match="within 1 s"):
                    await submit_group(p2p, peer, _sealed(worker)[1], run_id=RUN, timeout_s=1)

    asyncio.run(main())


def test_streams_per_peer_are_capped_a_new_one_replacing_an_idle_one(swarm: Swarm) -> None:
    worker, validator, _ = _ids(swarm)

    async def main() -> None:
        async with (
            intake_on(validator, StubValidator(validator.identity), max_streams_per_peer=1) as intake,
            client_of(worker) as p2p,
        ):
            _, reader, idle = await p2p.call_binary_stream_handler(validator.identity.peer_id, PROTO_SUBMIT)
            await async_wait_until(lambda: intake.open_streams == 1, timeout_s=10)
            # its next stream is served; the idle one it replaces is told so and closed
            verdicts = await submit_group(
                p2p, validator.identity.peer_id, _sealed(worker)[1], run_id=RUN, timeout_s=20
            )
            assert len(verdicts) == 4
            assert b"preempted" in await asyncio.wait_for(reader.read(), timeout=10)
            idle.close()
            await async_wait_until(lambda: intake.open_streams == 0, timeout_s=10)

    asyncio.run(main())


# --- forward ------------------------------------------------------------------------------------


@asynccontextmanager
async def forward_intake_on(
    node: SwarmNode,
    trusted: list[SwarmNode],
    received: list[Forwarded],
    *,
    refuse: str = "",
    kept: list[bytes] | None = None,
    intake_type: type[ForwardIntake] = ForwardIntake,
) -> AsyncIterator[ForwardIntake]:
    """A trainer's forward intake on `node`; `refuse`: its handler refuses every forward with this
    reason; `kept`: where the trainer keeps the validation receipts it signs."""

    async def handler(validator: bytes, forwarded: Forwarded) -> None:
        if refuse:
            raise GroupRefused(refuse)
        received.append(forwarded)

    intake = intake_type(
        dht=node.dht,
        identity=node.identity,
        run_id=RUN,
        handler=handler,
        config=ForwardConfig(trusted_validators=[t.identity.peer_id.to_base58() for t in trusted]),
        on_receipts=None if kept is None else kept.extend,
    )
    await intake.start()
    try:
        yield intake
    finally:
        await intake.stop()


def test_forward_from_trusted_validator_is_checked_and_delivered(swarm: Swarm) -> None:
    worker, validator, trainer = _ids(swarm)

    async def main() -> None:
        received: list[Forwarded] = []
        async with forward_intake_on(trainer, [validator], received) as intake, client_of(validator) as p2p:
            group, sealed = _sealed(worker)
            verdicts = verdicts_for(validator.identity.private_key, worker.identity.peer_id_bytes, group)
            await forward_group(
                p2p,
                trainer.identity.peer_id,
                private_key=validator.identity.private_key,
                run_id=RUN,
                sealed_group=sealed,
                sealed_verdicts=verdicts,
                timeout_s=20,
            )
            assert len(received) == 1 and intake.forwards_accepted == 1
            assert received[0].group == group
            assert received[0].group_envelope.signer == worker.identity.peer_id_bytes
            assert received[0].envelope.signer == validator.identity.peer_id_bytes
            # verdicts that do not match the group: refused and the (trusted) validator banned
            other = make_group(4, temperature=0.5)
            bad = verdicts_for(validator.identity.private_key, worker.identity.peer_id_bytes, other)
            with pytest.raises(SubmissionRefused, match="rollout_hash mismatch"):
                await forward_group(
                    p2p,
                    trainer.identity.peer_id,
                    private_key=validator.identity.private_key,
                    run_id=RUN,
                    sealed_group=sealed,
                    sealed_verdicts=bad,
                    timeout_s=20,
                )
            assert len(received) == 1 and intake.bans.is_banned(validator.identity.peer_id)

    asyncio.run(main())


def test_forward_from_untrusted_validator_is_refused_unread(swarm: Swarm) -> None:
    worker, validator, trainer = _ids(swarm)

    async def main() -> None:
        received: list[Forwarded] = []
        async with forward_intake_on(trainer, [validator], received), client_of(worker) as p2p:
            group, sealed = _sealed(worker)
            # the worker poses as a validator: its own verdicts, its own forward, all validly signed
            verdicts = verdicts_for(worker.identity.private_key, worker.identity.peer_id_bytes, group)
            with pytest.raises(SubmissionRefused, match="only from its trusted validators"):
                await forward_group(
                    p2p,
                    trainer.identity.peer_id,
                    private_key=worker.identity.private_key,
                    run_id=RUN,
                    sealed_group=sealed,
                    sealed_verdicts=verdicts,
                    timeout_s=20,
                )
            assert not received
            # a raw stream from an untrusted peer is answered before anything is read
            _, reader, writer = await p2p.call_binary_stream_handler(trainer.identity.peer_id, PROTO_FORWARD)
            frame = await asyncio.wait_for(read_frame(reader, 1 << 16), 10)
            assert frame is not None and "trusted" in fpb.ForwardResponse.FromString(frame).error
            writer.close()

    asyncio.run(main())


def test_forward_signed_by_another_validator_than_the_stream_is_refused(swarm: Swarm, tmp_path: Path) -> None:
    worker, validator, trainer = _ids(swarm)

    async def main() -> None:
        received: list[Forwarded] = []
        async with forward_intake_on(trainer, [validator], received) as intake, client_of(validator) as p2p:
            group, sealed = _sealed(worker)
            impostor = key("another validator")
            with pytest.raises(SubmissionRefused, match="signed by another peer"):
                await forward_group(
                    p2p,
                    trainer.identity.peer_id,
                    private_key=impostor,
                    run_id=RUN,
                    sealed_group=sealed,
                    sealed_verdicts=verdicts_for(impostor, worker.identity.peer_id_bytes, group),
                    timeout_s=20,
                )
            assert not received and intake.bans.is_banned(validator.identity.peer_id)

    asyncio.run(main())


async def _forward(
    p2p: P2P, validator: SwarmNode, trainer: SwarmNode, worker: SwarmNode, sink: list[bytes], **kw: Any
) -> Any:
    group, sealed = kw.pop("sealed_group", None) or _sealed(worker)
    return await forward_group(
        p2p,
        trainer.identity.peer_id,
        private_key=validator.identity.private_key,
        run_id=RUN,
        sealed_group=sealed,
        sealed_verdicts=verdicts_for(validator.identity.private_key, worker.identity.peer_id_bytes, group),
        timeout_s=20,
        on_receipts=sink.extend,
        **kw,
    )


def test_a_trainer_that_takes_a_forward_gives_the_validator_one_validation_receipt(swarm: Swarm) -> None:
    worker, validator, trainer = _ids(swarm)

    async def main() -> None:
        received: list[Forwarded] = []
        sink: list[bytes] = []
        kept: list[bytes] = []
        async with (
            forward_intake_on(trainer, [validator], received, kept=kept),
            client_of(validator) as p2p,
        ):
            group, sealed = _sealed(worker, make_group(3, counter=21))
            returned = await _forward(p2p, validator, trainer, worker, sink, sealed_group=(group, sealed))
            assert len(received) == 1 and len(sink) == 1
            receipt = open_receipt(sink[0], run_id=RUN)
            assert returned == receipt and kept == sink  # the trainer keeps its own copy
            assert receipt.kind is ReceiptKind.VALIDATION and receipt.role == "validator"
            assert receipt.signer == trainer.identity.peer_id_bytes
            assert receipt.contributor == validator.identity.peer_id_bytes
            assert receipt.evidence == hashlib.sha256(sealed).digest()
            # counted by the trainer from the group: 3 rollouts of 40 completion tokens
            assert (receipt.count, receipt.tokens) == (3, 3 * 40)
            # the same group forwarded again: its receipt makes the same claim (counted once)
            await _forward(p2p, validator, trainer, worker, sink, sealed_group=(group, sealed))
            again = open_receipt(sink[1], run_id=RUN)
            assert (again.kind, again.contributor, again.evidence) == (
                receipt.kind,
                receipt.contributor,
                receipt.evidence,
            )
        # a trainer that refuses the forward signs nothing
        async with (
            forward_intake_on(trainer, [validator], received, refuse="stale", kept=kept),
            client_of(validator) as p2p,
        ):
            with pytest.raises(SubmissionRefused, match="forward refused: stale"):
                await _forward(p2p, validator, trainer, worker, sink)
            assert len(sink) == 2 and len(kept) == 2

    asyncio.run(main())


def _forging_intake(forge: Callable[[ForwardIntake, bytes, Forwarded], bytes]) -> type[ForwardIntake]:
    class Forging(ForwardIntake):
        def _receipt(self, validator: bytes, forwarded: Forwarded) -> bytes:
            return forge(self, validator, forwarded)

    return Forging


def _validation_by(
    key: Any, *, contributor: bytes | None = None, group_hash: bytes | None = None, run_id: str = RUN
) -> Callable[[ForwardIntake, bytes, Forwarded], bytes]:
    def forge(intake: ForwardIntake, validator: bytes, forwarded: Forwarded) -> bytes:
        return seal_validation_receipt(
            key or intake.identity.private_key,
            run_id=run_id,
            contributor=contributor or validator,
            group_hash=group_hash or forwarded.group_hash,
            rollouts=len(forwarded.group.rollouts),
            tokens=10_000,
        )

    return forge


@pytest.mark.parametrize(
    "forge",
    [
        pytest.param(_validation_by(key("impostor")), id="signed-by-another-peer"),
        pytest.param(
            _validation_by(None, contributor=peer_bytes(key("another validator"))), id="another-contributor"
        ),
        pytest.param(_validation_by(None, group_hash=b"x" * 32), id="another-group"),
        pytest.param(_validation_by(None, run_id="another-run"), id="another-run"),
        pytest.param(lambda intake, validator, forwarded: b"\x0a\x03junk", id="garbage"),
    ],
)
def test_a_forged_validation_receipt_is_not_kept(
    swarm: Swarm, forge: Callable[[ForwardIntake, bytes, Forwarded], bytes]
) -> None:
    worker, validator, trainer = _ids(swarm)

    async def main() -> None:
        received: list[Forwarded] = []
        sink: list[bytes] = []
        async with (
            forward_intake_on(trainer, [validator], received, intake_type=_forging_intake(forge)),
            client_of(validator) as p2p,
        ):
            # the forward itself went through: only the receipt is ignored
            assert await _forward(p2p, validator, trainer, worker, sink) is None
            assert len(received) == 1 and sink == []

    asyncio.run(main())


def test_connect_member_dials_only_the_addresses_of_its_own_record(swarm: Swarm) -> None:
    _, validator, trainer = _ids(swarm)

    def member(addresses: tuple[str, ...]) -> LiveNode:
        return live_member(validator.identity.peer_id_bytes, addresses, run_id=RUN, name="validator")

    async def main() -> None:
        own = f"/p2p/{validator.identity.peer_id.to_base58()}"
        addresses = tuple(str(m).removesuffix(own) for m in validator.dht.get_visible_maddrs())

        async def loopback() -> tuple[str, ...]:
            return tuple(str(m) for m in trainer.dht.get_visible_maddrs())

        async with client_of(trainer) as p2p:
            dialer = HolderDialer(p2p, trainer.identity.peer_id, loopback)
            await connect_member(dialer, member(()))
            assert dialer.attempts == 0  # nothing to dial
            await connect_member(dialer, member(addresses))
            assert any(info.peer_id == validator.identity.peer_id for info in await p2p.list_peers())

    asyncio.run(main())
