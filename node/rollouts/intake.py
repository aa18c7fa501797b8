"""`RolloutIntake`: a validator's submit service, where workers hand in sealed rollout groups.

Protocol `PROTO_SUBMIT`: the worker opens a stream and sends one frame holding its sealed group
(`protocol.rollout_messages.seal_group`); the validator answers one `SubmitResponse` frame with
one sealed verdict per rollout, or with `error` set when it refuses the whole group. A stream may
carry several groups one after another; each frame must arrive within `frame_timeout_s`.

What the transport checks before the validator sees anything: the sender is not banned and under
the stream caps, the frame is at most `max_group_bytes` (checked on its declared length), the
envelope opens for this run and is **signed by the peer that sent it** (a worker submits its own
groups), and the group and its rollouts are within every cap (`open_group`). A sender that fails
any of these is banned. The judgement itself is the injected `handler` (the validator logic,
which lives outside `node`): it returns the sealed verdicts, or raises `GroupRefused` to refuse
the group with a reason. A handler that does CPU-heavy work must offload it from the event loop.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

import hivemind
from hivemind.p2p import P2P, PeerID

from node.bans import BanList
from node.identity import Identity
from node.rollouts.config import IntakeConfig
from node.rollouts.errors import GroupRefused
from node.rollouts.streams import FramedService, clip
from protocol import rollouts_pb2 as rpb
from protocol.envelope import Envelope
from protocol.limits import MAX_ENVELOPE_BYTES, MAX_SUBMIT_RESPONSE_BYTES
from protocol.rollout_messages import open_group
from protocol.version import PROTOCOL_VERSION

logger = logging.getLogger(__name__)

PROTO_SUBMIT = f"/hivenet/{PROTOCOL_VERSION}/rollouts/submit"

GroupHandler = Callable[[bytes, Envelope, rpb.RolloutGroup], Awaitable[list[bytes]]]
"""(worker PeerID bytes, the group's opened envelope, the group) -> one sealed verdict per rollout."""


def submit_response(*, verdicts: list[bytes] | None = None, error: str = "") -> bytes:
    """A serialized SubmitResponse."""
    return rpb.SubmitResponse(verdicts=verdicts or [], error=clip(error)).SerializeToString()


class RolloutIntake(FramedService):
    """A validator's node service serving `PROTO_SUBMIT`; construct, then `await start()` (or add it to a node)."""

    name = "rollout-intake"
    proto = PROTO_SUBMIT
    what = "rollout group"

    def __init__(
        self,
        *,
        dht: hivemind.DHT | None,
        identity: Identity,
        run_id: str,
        handler: GroupHandler,
        config: IntakeConfig | None = None,
        p2p: P2P | None = None,
        bans: BanList | None = None,
    ) -> None:
        config = config if config is not None else IntakeConfig()
        super().__init__(
            dht=dht,
            config=config,
            max_frame_bytes=config.max_group_bytes,
            p2p=p2p,
            bans=bans,
            owner=identity.short_id,
        )
        self.identity = identity
        self.run_id = run_id
        self.handler = handler
        self.groups_received = 0
        """Groups that opened and were handed to the handler."""

    def error_response(self, error: str) -> bytes:
        return submit_response(error=error)

    async def answer(self, peer: PeerID, frame: bytes) -> bytes:
        worker = peer.to_bytes()
        envelope, group = open_group(frame, run_id=self.run_id, signer=worker)
        self.groups_received += 1
        try:
            verdicts = await asyncio.wait_for(
                self.handler(worker, envelope, group), self.config.handler_timeout_s
            )
        except GroupRefused as exc:
            return submit_response(error=f"group refused: {exc}")
        except TimeoutError:
            logger.warning(
                "[%s] judging a group of %s took over %g s",
                self.owner,
                peer.to_base58()[-8:],
                self.config.handler_timeout_s,
            )
            return submit_response(
                error="the validator did not judge the group in time; submit it again later"
            )
        except Exception as exc:
            logger.exception(
                "[%s] the group handler failed on a group of %s", self.owner, peer.to_base58()[-8:]
            )
            return submit_response(error=f"the validator failed to judge the group: {type(exc).__name__}")
        if len(verdicts) != len(group.rollouts) or any(len(v) > MAX_ENVELOPE_BYTES for v in verdicts):
            logger.error(
                "[%s] the group handler returned %d verdicts for %d rollouts (or an oversized one)",
                self.owner,
                len(verdicts),
                len(group.rollouts),
            )
            return submit_response(error="the validator produced an invalid answer")
        response = submit_response(verdicts=verdicts)
        assert len(response) <= MAX_SUBMIT_RESPONSE_BYTES
        return response
