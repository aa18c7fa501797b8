"""The forward stream: a standalone validator hands a verified group to a trainer.

Protocol `PROTO_FORWARD`: the validator sends one frame holding a sealed `RolloutForward`
(`protocol.rollout_messages.seal_forward`: the worker's sealed group and the validator's sealed
verdicts, unchanged) and the trainer answers one `ForwardResponse` frame (`error` empty when
accepted).

A trainer that took the forward signs the validator's receipt for the work, a validation receipt
(`protocol.receipts.seal_validation_receipt`), and sends it in the response: it names the
validator, the sha256 of the worker's sealed group as forwarded, and the group's rollouts and
completion tokens, counted by the trainer from the group it checked. A refusal carries none. The
trainer keeps a copy (`on_receipts`); the validator keeps the receipt only if it opens, is signed
by the trainer it sent to and names itself and that group (`forward_group`), else ignores it.

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
from typing import Final

import hivemind
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from hivemind.p2p import P2P, PeerID

from node.bans import BanList
from node.identity import Identity
from node.rollouts.config import ForwardConfig
from node.rollouts.errors import GroupRefused, SubmissionRefused
from node.rollouts.streams import FramedService, clip, exchange
from protocol import rollout_forward_pb2 as fpb
from protocol.errors import InvalidMessage
from protocol.limits import MAX_FORWARD_RESPONSE_BYTES
from protocol.peer_keys import peer_id_from_private_key
from protocol.receipts import Receipt, ReceiptKind, open_receipt, seal_validation_receipt
from protocol.rollout_messages import Forwarded, group_hash, open_forward, parse_rollout, seal_forward
from protocol.untrusted import parse_untrusted
from protocol.version import PROTOCOL_VERSION

logger = logging.getLogger(__name__)

PROTO_FORWARD = f"/hivenet/{PROTOCOL_VERSION}/rollouts/forward"

ForwardHandler = Callable[[bytes, Forwarded], Awaitable[None]]
"""(forwarding validator's PeerID bytes, the checked forward) -> None; raise GroupRefused to refuse it."""
ReceiptSink = Callable[[list[bytes]], None]
"""Where sealed receipts go (a node's `receipt_sink`); must not block."""

_VALIDATION: Final = frozenset({ReceiptKind.VALIDATION})
_warned_trainers: set[bytes] = set()
"""Trainers whose bad receipt was logged already: each is logged once a process."""


def forward_response(error: str = "", receipt: bytes = b"") -> bytes:
    return fpb.ForwardResponse(error=clip(error), receipt=receipt).SerializeToString()


def seal_validation(
    private_key: Ed25519PrivateKey, run_id: str, validator: bytes, forwarded: Forwarded
) -> bytes:
    """The trainer's validation receipt for `validator`'s checked forward: the rollouts and completion
    tokens are counted from the forwarded group itself, never taken from the verdicts."""
    tokens = sum(len(parse_rollout(raw).completion_ids) for raw in forwarded.group.rollouts)
    return seal_validation_receipt(
        private_key,
        run_id=run_id,
        contributor=validator,
        group_hash=forwarded.group_hash,
        rollouts=len(forwarded.group.rollouts),
        tokens=tokens,
    )


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
        on_receipts: ReceiptSink | None = None,
    ) -> None:
        """`on_receipts`: handed each validation receipt this trainer signs (the trainer's own copy)."""
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
        self.on_receipts = on_receipts
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
        return forward_response(receipt=self._receipt(validator, forwarded))

    def _receipt(self, validator: bytes, forwarded: Forwarded) -> bytes:
        try:
            receipt = seal_validation(self.identity.private_key, self.run_id, validator, forwarded)
        except InvalidMessage as exc:  # e.g. a trainer that lists itself as a trusted validator
            logger.warning("[%s] no validation receipt for a forward: %s", self.owner, exc)
            return b""
        _hand(self.on_receipts, receipt)
        return receipt


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
    on_receipts: ReceiptSink | None = None,
) -> Receipt | None:
    """Forward a worker's sealed group and this validator's sealed verdicts to `trainer`.

    Returns the trainer's validation receipt, handed to `on_receipts` too, if it sent one that is
    signed by `trainer`, names this validator and this group; None otherwise (a receipt that fails
    those checks is ignored and logged once per trainer).

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
    if not response.receipt:
        return None
    try:
        receipt = open_validation_receipt(
            response.receipt,
            run_id=run_id,
            trainer=trainer.to_bytes(),
            validator=peer_id_from_private_key(private_key),
            sealed_group=sealed_group,
        )
    except InvalidMessage as exc:
        level = logging.DEBUG if trainer.to_bytes() in _warned_trainers else logging.WARNING
        _warned_trainers.add(trainer.to_bytes())
        logger.log(level, "ignoring the validation receipt of trainer %s: %s", trainer.to_base58()[-8:], exc)
        return None
    _hand(on_receipts, receipt.envelope)
    return receipt


def _hand(sink: ReceiptSink | None, receipt: bytes) -> None:
    """Give `sink` the receipt; a failing sink loses the receipt, never the forward it is for."""
    if sink is not None:
        try:
            sink([receipt])
        except Exception:
            logger.exception("a receipt sink failed: a validation receipt is not kept")


def open_validation_receipt(
    data: bytes, *, run_id: str, trainer: bytes, validator: bytes, sealed_group: bytes
) -> Receipt:
    """A trainer's validation receipt for one forward, checked; InvalidMessage unless it opens
    (`open_receipt`), is a validation receipt of `run_id` signed by `trainer`, names `validator`
    as its contributor and the sha256 of `sealed_group` as its evidence."""
    receipt = open_receipt(data, run_id=run_id, kinds=_VALIDATION)
    if receipt.signer != trainer:
        raise InvalidMessage("the receipt is signed by another peer than the trainer")
    if receipt.contributor != validator:
        raise InvalidMessage("the receipt names another validator")
    if receipt.evidence != group_hash(sealed_group):
        raise InvalidMessage("the receipt names another group")
    return receipt
