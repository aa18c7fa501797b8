"""The averaging service: one DiLoCo round per outer step, on the node's event loop.

A trainer **declares** the outer step it holds and will average for next (a signed record under
`dht_keys.averaging_round_key`, renewed while it lives), with the time it expects to send. When
its inner steps end it encodes its pseudo-gradient with the run's codec, signs a header binding
the payload's hash to the round, and **gathers**: it sends its contribution to every member
declared for the same step (at most `max_group_size`, chosen the same way by every member) and
collects theirs. An answer carries the answerer's own contribution once it has one, so a member
that sends late still gets what it missed. The gather ends when every candidate has contributed
or at the latest declared gather time plus `gather_timeout_s`. Each member then **commits**:
it signs the list of contributions it holds and sends it to their senders, and to any peer
whose commit named ours; a contribution that arrives after the gather is answered with the
commit, so a member too late for another's gather learns that it was left out. Every member
aggregates the contributions held, with the same hash, by every member whose commit it received
(`node.collective.book`), in PeerID order, with deterministic robust arithmetic
(`node.collective.aggregate`), so members that saw the same commits hold bit-identical results.
A round whose members' states disagree, or that most live trainers have moved past, is reported
out of sync and the trainer takes the run's state instead.

Streams are `node.rollouts.streams.FramedService` streams: frames capped before buffering (the
codec's exact payload size plus a small header), per-peer and total stream caps, timeouts, and a
ban for a malformed or badly signed message. A contribution must be signed by the stream's own
peer for this run and step, and its payload must match the signed hash and the codec's size; a
run that names its trainers (`admitted`) takes contributions from them only.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import math
import time
from collections import Counter
from collections.abc import Collection, Coroutine, Sequence
from typing import Any

import torch
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from hivemind.p2p import P2P, PeerID

from node.bans import BanList
from node.collective.book import MAX_SEND_ATTEMPTS, Received, RoundBook
from node.collective.codecs import PseudoGradCodec
from node.collective.config import AveragingConfig
from node.collective.declarations import DeclarationBoard
from node.collective.intake import MAX_COMMIT_ENVELOPE_BYTES, RoundIntake
from node.collective.members import PassedOver, catching_up, left_behind, round_candidates
from node.collective.outcome import tally_round
from node.collective.round_types import RoundOutcome
from node.collective.sealing import seal_for_round
from node.identity import Identity
from node.rollouts.errors import RolloutTransportError
from node.rollouts.streams import FramedService, exchange
from node.runtime import offload
from node.signed_records import SignedRecords
from protocol import collective_pb2 as pb
from protocol.averaging_round import (
    COMMIT_DOMAIN,
    CONTRIBUTION_DOMAIN,
    ContributionHeader,
    RoundDeclaration,
    commit_payload,
)
from protocol.dht_keys import averaging_round_key, round_channel_key
from protocol.errors import ExpiredMessage, InvalidMessage
from protocol.untrusted import parse_untrusted

__all__ = ["AveragingService"]

logger = logging.getLogger(__name__)

_FRAME_SLACK_BYTES = 64 * 1024
"""Room in a frame for a contribution's signed header, or for a whole commit."""
_REDISCOVER_S = 1.0
"""While a gather waits, how often it looks for members that declared the round since it started."""


class AveragingService(FramedService):
    """A trainer's side of the run's averaging rounds (see module docstring)."""

    name = "averaging"
    what = "averaging message"

    def __init__(
        self,
        *,
        dht: object,
        signing_key: Ed25519PrivateKey,
        prefix: str,
        codec: PseudoGradCodec,
        config: AveragingConfig,
        admitted: frozenset[bytes] | None = None,
        p2p: P2P | None = None,
        bans: BanList | None = None,
        label: str = "",
    ) -> None:
        super().__init__(
            dht=dht,  # type: ignore[arg-type]
            config=config,
            max_frame_bytes=codec.max_payload_bytes() + _FRAME_SLACK_BYTES,
            p2p=p2p,
            bans=bans,
            owner=label,
        )
        self.proto = f"/hivenet/averaging/1/{prefix}"
        self.averaging = config
        self.prefix = prefix
        self.codec = codec
        self._num_values = sum(math.prod(shape) for shape in codec.shapes)
        self.admitted = admitted
        self.label = label
        self._key = signing_key
        self._records = SignedRecords(dht, Identity(private_key=signing_key, path=None))  # type: ignore[arg-type]
        self.me = self._records.identity.peer_id_bytes
        self.intake = RoundIntake(prefix, codec, config.max_group_size, self.bans)
        self._board = DeclarationBoard(
            self._records,
            averaging_round_key(prefix),
            ttl_s=config.declaration_ttl_s,
            admits=self.admits,
            label=label,
        )
        self._renewer: asyncio.Task[None] | None = None
        self._sending: set[asyncio.Task[None]] = set()
        self._last_members: set[bytes] = set()
        self._passed_over = PassedOver()
        self.bytes_requested = 0
        """Bytes of the request frames this service sent (its contributions and commits)."""
        self.requests_sent = 0
        """Requests this service tried to send (delivered or not)."""
        self.standing: set[bytes] = set()
        """Peers that averaged with us in a round where we both held the group's state: evidence
        that cannot be minted with a fresh identity."""

    @property
    def bytes_sent(self) -> int:
        """Every byte this service wrote: its requests, its answers and its refusals."""
        return self.bytes_requested + self.bytes_responded

    # ---- lifecycle -------------------------------------------------------------------------

    async def start(self) -> None:
        await super().start()
        self._renewer = asyncio.create_task(self._board.renew_forever())

    async def stop(self) -> None:
        tasks = [*self._sending, *([self._renewer] if self._renewer is not None else [])]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await super().stop()

    # ---- declarations ----------------------------------------------------------------------

    @property
    def declared_step(self) -> int:
        """The outer step we last declared (the round we take messages for, with the next)."""
        return self.intake.low_step

    @property
    def round_key(self) -> str:
        return averaging_round_key(self.prefix)

    async def declare(
        self, step: int, outer_hash: str, gather_at: float, *, serves_state: bool, final: bool = False
    ) -> None:
        """Say which outer step we hold and average for next, or (`final`) that our run ended there;
        drop the books of earlier rounds."""
        declaration = RoundDeclaration(step, outer_hash, self.codec.name, gather_at, serves_state, final)
        self.intake.move_to(step)
        await self._board.publish(declaration)

    async def declarations(self) -> dict[bytes, RoundDeclaration]:
        """Every live trainer's verified declaration (ours excluded; only admitted trainers in a closed run)."""
        return await self._board.read()

    def admits(self, peer: bytes) -> bool:
        return self.admitted is None or peer in self.admitted

    # ---- serving ---------------------------------------------------------------------------

    def error_response(self, error: str) -> bytes:
        return pb.RoundReply(error=error).SerializeToString()

    def refusal(self, peer: PeerID) -> str | None:
        if not self.admits(peer.to_bytes()):
            return "refused: this run names its trainers, and this peer is not one of them"
        return None

    async def answer(self, peer: PeerID, frame: bytes) -> bytes:
        message = parse_untrusted(pb.RoundMessage, frame, "averaging message")
        kind = message.WhichOneof("body")
        try:
            if kind == "contribution":
                reply = self.intake.take_contribution(peer.to_bytes(), message.contribution)
            elif kind == "commit":
                reply = self.intake.take_commit(peer.to_bytes(), message.commit)
            else:
                raise InvalidMessage("averaging message holds neither a contribution nor a commit")
        except ExpiredMessage as exc:  # a slow sender's own stale message: refused, not banned
            reply = pb.RoundReply(error=f"stale: {exc}")
        return reply.SerializeToString()

    # ---- one round -------------------------------------------------------------------------

    async def average(self, step: int, tensors: Sequence[torch.Tensor], outer_hash: str) -> RoundOutcome:
        """Average our pseudo-gradient for outer step `step` with the round's members."""
        started = time.monotonic()
        book = self.intake.book_for(step)
        if book is None:
            raise ValueError(f"average({step}) called after declaring outer step {self.intake.low_step}")
        payload = await offload(self.codec.encode, list(tensors))
        header = ContributionHeader(
            step, outer_hash, self.codec.name, hashlib.sha256(payload).digest(), len(payload)
        )
        own = pb.Contribution(header=self._seal(step, CONTRIBUTION_DOMAIN, header.payload()), payload=payload)
        book.own_contribution = own
        book.prefer([self.me])
        book.add_contribution(self.me, Received(header, payload))

        declared = await self.declarations()
        if left_behind(declared, step, self.standing):
            logger.info("%s: most trainers of the run are past outer step %d: resyncing", self.label, step)
            self._last_members = set()
            return RoundOutcome(None, 1, in_sync=False)
        # Last round's members are expected too: their declaration of this round may not have
        # reached the DHT yet (a loaded machine). One that died costs this round its deadline, once.
        expected = self._candidates(declared, step, book, also=self._last_members)
        book.prefer([self.me, *expected])
        latest = max([d.gather_at for p, d in declared.items() if p in expected] + [time.time()])
        deadline = started + min(
            self.averaging.averaging_timeout_s, latest - time.time() + self.averaging.gather_timeout_s
        )
        message = pb.RoundMessage(contribution=own)
        sent = book.sent_contribution
        sent.add(self.me)
        attempts: Counter[bytes] = Counter()
        # However fast the expected members answer, the gather stays open `min_gather_s`, so that a
        # trainer that has just declared (a joiner) is found and waited for.
        min_end = started + self.averaging.min_gather_s
        discovered = time.monotonic()
        skipped = 0
        while True:
            if len(book.unreachable) > skipped:  # walk past them to the next declared members
                skipped = len(book.unreachable)
                expected = self._candidates(declared, step, book, also=expected)
                book.prefer([self.me, *expected])
            for peer in {*expected, *book.contributions} - sent - book.given_contribution:
                if attempts[peer] < MAX_SEND_ATTEMPTS:
                    attempts[peer] += 1
                    sent.add(peer)
                    self._spawn(self._send(peer, message, book))
            now = time.monotonic()
            alone = len(book.contributions) == 1  # then it waits for trainers on the step before too
            gathered = self._gathered(book, expected) and not (
                alone and catching_up(declared, step, me=self.me)
            )
            if now >= deadline or (gathered and now >= min_end):
                break
            wake = min_end if gathered else deadline
            await book.wait_changed(min(wake, discovered + _REDISCOVER_S) - now)
            if time.monotonic() >= discovered + _REDISCOVER_S:  # who else declared this round meanwhile
                declared = await self.declarations()
                expected = self._candidates(declared, step, book, also=expected)
                book.prefer([self.me, *expected])
                discovered = time.monotonic()
        held = book.close_gather()
        logger.debug(
            "%s: gather of outer step %d ended with %d of %d candidates (+%d others)",
            self.label, step, sum(p in held for p in expected), len(expected),
            len(set(held) - set(expected) - {self.me}),
        )  # fmt: skip
        self._passed_over.remember(book.unreachable - set(held), step)
        if book.unreachable:
            logger.info(
                "%s: %d trainers declared for outer step %d could not be reached: %s",
                self.label, len(book.unreachable), step, _short(sorted(book.unreachable)[:8]),
            )  # fmt: skip
        if len(held) > 1:
            await self._commit(book, step, held, deadline)
        return await self._outcome(book, step, outer_hash)

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        """Run a send in the background: it ends by its own timeout, even after the round (a peer still
        gathering or committing needs what it carries); `stop` cancels what is left."""
        task = asyncio.create_task(coro)
        self._sending.add(task)
        task.add_done_callback(self._sending.discard)

    def _gathered(self, book: RoundBook, candidates: Sequence[bytes]) -> bool:
        return all(
            p in book.contributions
            or p in book.equivocators
            or p in book.unreachable
            or self.bans.is_banned(p)
            for p in candidates
        )

    def _candidates(
        self,
        declared: dict[bytes, RoundDeclaration],
        step: int,
        book: RoundBook,
        also: Collection[bytes] = (),
    ) -> list[bytes]:
        """The round's members as `round_candidates` picks them, passing over those it could not reach
        (a declaration is free: one with no host behind it must not keep a reachable trainer's place)."""
        return round_candidates(
            declared,
            step,
            codec=self.codec.name,
            me=self.me,
            standing=self.standing,
            excluded=lambda peer: (
                peer in book.unreachable
                or self._passed_over.passes_over(peer, step)
                or self.bans.is_banned(peer)
            ),
            max_others=self.averaging.max_group_size - 1,
            also=also,
        )

    def _seal(self, step: int, domain: str, payload: bytes) -> bytes:
        return seal_for_round(
            self._key,
            prefix=self.prefix,
            step=step,
            domain=domain,
            payload=payload,
            ttl_s=self.averaging.averaging_timeout_s + 60.0,
            seq=self._records.next_seq(),
            max_bytes=MAX_COMMIT_ENVELOPE_BYTES,
        )

    async def _send(self, peer: bytes, message: pb.RoundMessage, book: RoundBook) -> None:
        """Send `message` to `peer` and take the contribution or commit its answer carries."""
        request = message.SerializeToString()
        self.bytes_requested += len(request) + 4
        self.requests_sent += 1
        try:
            data = await exchange(
                self.p2p,
                PeerID(peer),
                self.proto,
                request,
                max_response_bytes=self.max_frame_bytes,
                timeout_s=self.averaging.request_timeout_s,
            )
            reply = parse_untrusted(pb.RoundReply, data, "averaging reply")
            if message.HasField("contribution"):
                if reply.error:
                    book.refused_ours.add(peer)
                    book.not_delivered(peer)
                else:
                    book.refused_ours.discard(peer)
            if reply.HasField("contribution") and book.gathering:
                self.intake.take_contribution(peer, reply.contribution)
            if reply.commit:
                self.intake.take_commit(peer, reply.commit)
        except ExpiredMessage as exc:  # its sender was slow or stuck past the round: stale, not forged
            logger.info("%s: stale averaging reply from %s ignored: %s", self.label, PeerID(peer), exc)
        except InvalidMessage as exc:
            self.bans.ban(PeerID(peer), f"bad averaging reply: {exc}")
        except (RolloutTransportError, OSError) as exc:  # the gather's end sums up the unreachable
            logger.debug("%s: averaging exchange with %s failed: %s", self.label, PeerID(peer), exc)
            if message.HasField("contribution"):
                book.not_delivered(peer, lost=True)

    async def _commit(
        self, book: RoundBook, step: int, held: dict[bytes, bytes], gather_deadline: float
    ) -> None:
        book.own_commit = self._seal(step, COMMIT_DOMAIN, commit_payload(step, held))
        message = pb.RoundMessage(commit=book.own_commit)
        # Also to the peers whose commit came first: one that committed to our contribution while
        # we left its own out must learn it, or it would aggregate a set with itself in it.
        committed_to_us = {p for p, theirs in book.commits.items() if self.me in theirs}
        for peer in {*held, *committed_to_us} - {self.me, *book.given_commit}:
            self._spawn(self._send(peer, message, book))
        deadline = max(gather_deadline, time.monotonic()) + self.averaging.commit_timeout_s
        while time.monotonic() < deadline and book.missing_commits(self.me):
            await book.wait_changed(deadline - time.monotonic())

    async def _outcome(self, book: RoundBook, step: int, outer_hash: str) -> RoundOutcome:
        final = book.final_set(self.me)
        logger.debug(
            "%s: round of outer step %d: held %s, commits from %s, aggregating %s",
            self.label, step, _short(book.contributions), _short(book.commits), _short(final),
        )  # fmt: skip
        refused = {p for p in book.refused_ours if p in final and p not in book.commits}
        if any(p in self.standing for p in final if p != self.me):
            refused &= self.standing  # members of standing decide the set: a stranger's view is its own
        if self.me in final and refused:
            # A member whose contribution we hold refused ours (its gather was over, or it had moved
            # on) and we have no commit of it: it aggregates a set without us that we cannot know.
            logger.info(
                "%s: the round of outer step %d: %s refused our contribution: resyncing",
                self.label, step, _short(refused),
            )  # fmt: skip
            self._last_members = set()
            return RoundOutcome(None, 1, in_sync=False)
        follows = book.settled_without(self.me, final) and (
            not self.standing or all(p in self.standing for p in final)
        )
        if self.me not in final and not follows:
            # Left out: a member we hold committed without our contribution (it came too late for
            # it). What the others apply is then a set we cannot know: we take the run's state.
            logger.info(
                "%s: the round of outer step %d left our contribution out: resyncing", self.label, step
            )
            self._last_members = set()
            return RoundOutcome(None, 1, in_sync=False)
        if set(final) == {self.me}:
            self._last_members = set()
            return RoundOutcome(None, 1, in_sync=True)
        tally = await offload(
            tally_round,
            book,
            final,
            me=self.me,
            round_key=round_channel_key(self.prefix, step),
            outer_hash=outer_hash,
            codec=self.codec,
            rule=self.averaging.aggregation,
            max_norm_ratio=self.averaging.max_norm_ratio,
            min_norm=self.averaging.min_norm_per_value * self._num_values**0.5,
        )
        for peer, problem in tally.undecodable.items():  # every member leaves the same ones out
            if peer != self.me:
                self.bans.ban(PeerID(peer), f"averaging: contribution does not decode: {problem}")
        in_sync = tally.outcome.in_sync and tally.outcome.averaged is not None
        self._last_members = set(tally.in_majority) - {self.me} if in_sync else set()
        if in_sync:
            self.standing.update(self._last_members)
        return tally.outcome


def _short(peers: object) -> str:
    return ",".join(sorted(str(PeerID(p))[-4:] for p in peers))  # type: ignore[attr-defined]
