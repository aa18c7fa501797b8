"""The forward stream: a standalone validator hands a verified group to a trainer.

Protocol `PROTO_FORWARD`: the validator sends one frame holding a sealed `RolloutForward`
(`protocol.rollout_messages.seal_forward`: the worker's sealed group and the validator's sealed
verdicts, unchanged) and the trainer answers one `ForwardResponse` frame (`error` empty when
accepted).

The trainer's `ForwardIntake` serves only validators in `trusted_validators`: any other peer gets
an error before a byte of its stream is read. From a trusted validator it re-checks everything
(`open_forward`): the forward is signed by the validator that opened the stream, the group by its
worker, every verdict by the same validator, naming the group's worker, version, counter and the
hash of the rollout at its index. Only then is the injected handler called; a trusted validator
that sends anything that fails these checks is banned all the same. Deduplicating forwards (the
same group forwarded twice) is the handler's job: the transport does not keep history.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

import hivemind
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from hivemind.p2p import P2P, PeerID

from node.bans import BanList
from node.identity import Identity
from node.rollouts.config import ForwardConfig
from node.rollouts.errors import GroupRefused, SubmissionRefused
from node.rollouts.streams import FramedService, clip, exchange
from protocol import rollout_forward_pb2 as fpb
from protocol.limits import MAX_FORWARD_RESPONSE_BYTES
from protocol.rollout_messages import Forwarded, open_forward, seal_forward
from protocol.untrusted import parse_untrusted
from protocol.version import PROTOCOL_VERSION

logger = logging.getLogger(__name__)

PROTO_FORWARD = f"/hivenet/{PROTOCOL_VERSION}/rollouts/forward"

ForwardHandler = Callable[[bytes, Forwarded], Awaitable[None]]
"""(forwarding validator's PeerID bytes, the checked forward) -> None; raise GroupRefused to refuse it."""


def forward_response(error: str = "") -> bytes:
    return fpb.ForwardResponse(error=clip(error)).SerializeToString()


class ForwardIntake(FramedService):
    """A trainer's node service serving `PROTO_FORWARD` to its trusted validators only."""

    name = "rollout-forward-intake"
    proto = PROTO_FORWARD
    what = "rollout forward"

    def __init__(
        self,
        *,
        dht: hivemind.DHT | None,
        identity: Identity,
        run_id: str,
        handler: ForwardHandler,
        config: ForwardConfig,
        p2p: P2P | None = None,
        bans: BanList | None = None,
    ) -> None:
        super().__init__(
            dht=dht,
            config=config,
            max_frame_bytes=config.max_forward_bytes,
            p2p=p2p,
            bans=bans,
            owner=identity.short_id,
        )
        self.identity = identity
        self.run_id = run_id
        self.handler = handler
        self.trusted = {PeerID.from_base58(text).to_bytes() for text in config.trusted_validators}
        self.forwards_accepted = 0

    def error_response(self, error: str) -> bytes:
        return forward_response(error)

    def refusal(self, peer: PeerID) -> str | None:
        if peer.to_bytes() not in self.trusted:
            return "refused: this trainer accepts forwards only from its trusted validators"
        return None

    async def answer(self, peer: PeerID, frame: bytes) -> bytes:
        validator = peer.to_bytes()
        forwarded = open_forward(frame, run_id=self.run_id, validator=validator)
        try:
            await asyncio.wait_for(self.handler(validator, forwarded), self.config.handler_timeout_s)
        except GroupRefused as exc:
            return forward_response(f"forward refused: {exc}")
        except TimeoutError:
            return forward_response("the trainer did not take the forward in time")
        except Exception as exc:
            logger.exception(
                "[%s] the forward handler failed on a forward of %s", self.owner, peer.to_base58()[-8:]
            )
            return forward_response(f"the trainer failed to take the forward: {type(exc).__name__}")
        self.forwards_accepted += 1
        return forward_response()


async def forward_group(
    p2p: P2P,
    trainer: PeerID,
    *,
    private_key: Ed25519PrivateKey,
    run_id: str,
    sealed_group: bytes,
    sealed_verdicts: list[bytes],
    timeout_s: float,
    seq: int = 0,
) -> None:
    """Forward a worker's sealed group and this validator's sealed verdicts to `trainer`.

    Raises SubmissionRefused (with the trainer's reason) if it refused the forward,
    SubmissionTimeout if no answer came within `timeout_s`, PeerUnavailable if it could not be
    reached, and InvalidMessage if its answer is oversized or malformed.
    """
    sealed = seal_forward(
        private_key, run_id=run_id, sealed_group=sealed_group, sealed_verdicts=sealed_verdicts, seq=seq
    )
    answer = await exchange(
        p2p,
        trainer,
        PROTO_FORWARD,
        sealed,
        max_response_bytes=MAX_FORWARD_RESPONSE_BYTES,
        timeout_s=timeout_s,
    )
    response = parse_untrusted(fpb.ForwardResponse, answer, "forward response")
    if response.error:
        raise SubmissionRefused(f"trainer {trainer.to_base58()[-8:]} refused the forward: {response.error}")
