"""What a trainer takes from the contributions and commits that reach it: the books of the rounds it takes messages for.

A trainer takes messages for the round of the outer step it declared and for the next one (a
member ahead by a step may send early); earlier rounds' books are dropped when it declares a new
step. A contribution must be signed by its sender for this run and round, match the run's codec,
its signed hash and the codec's exact payload size; a commit must name the round it is signed for.
Either kind goes to the round's `RoundBook`, which decides what counts. A malformed message raises
`InvalidMessage` (its sender is banned by the stream layer); a contribution that signs two payloads
for one round bans its sender here.
"""

from __future__ import annotations

import hashlib

from hivemind.p2p import PeerID

from node.bans import BanList
from node.collective.book import Received, RoundBook
from node.collective.codecs import PseudoGradCodec
from node.collective.sealing import open_for_round
from protocol import collective_pb2 as pb
from protocol.averaging_round import (
    COMMIT_DOMAIN,
    CONTRIBUTION_DOMAIN,
    parse_commit,
    parse_contribution_header,
)
from protocol.errors import InvalidMessage

__all__ = ["MAX_COMMIT_ENVELOPE_BYTES", "RoundIntake"]

MAX_COMMIT_ENVELOPE_BYTES = 48 * 1024
_MAX_HEADER_ENVELOPE_BYTES = 8 * 1024


class RoundIntake:
    """The books of the rounds a trainer takes messages for (see module docstring)."""

    def __init__(self, prefix: str, codec: PseudoGradCodec, max_group_size: int, bans: BanList) -> None:
        self.prefix = prefix
        self.codec = codec
        self.max_group_size = max_group_size
        self.bans = bans
        self.books: dict[int, RoundBook] = {}
        self.low_step = 0
        """The outer step last declared: the round messages are taken for, with the next."""

    def move_to(self, step: int) -> None:
        """We declared outer step `step`: drop the books of earlier rounds."""
        self.low_step = step
        for old in [s for s in self.books if s < step]:
            del self.books[old]

    def book_for(self, step: int) -> RoundBook | None:
        """The round of `step`, if it is one we take messages for (ours now, or the next)."""
        if not self.low_step <= step <= self.low_step + 1:
            return None
        book = self.books.get(step)
        if book is None:
            book = self.books[step] = RoundBook(step, self.max_group_size)
        return book

    def _open(self, sealed: bytes, domain: str, peer: bytes, max_bytes: int) -> tuple[int, bytes]:
        return open_for_round(sealed, prefix=self.prefix, domain=domain, signer=peer, max_bytes=max_bytes)

    def take_contribution(self, peer: bytes, contribution: pb.Contribution) -> pb.RoundReply:
        step, header_bytes = self._open(
            contribution.header, CONTRIBUTION_DOMAIN, peer, _MAX_HEADER_ENVELOPE_BYTES
        )
        header = parse_contribution_header(header_bytes)
        if header.step != step:
            raise InvalidMessage("contribution header names another step than the round it is signed for")
        if header.codec != self.codec.name:
            return pb.RoundReply(error=f"this trainer averages with the {self.codec.name!r} codec")
        payload = contribution.payload
        if len(payload) != header.payload_bytes:
            raise InvalidMessage(f"contribution payload of {len(payload)} bytes does not match its header")
        if len(payload) != self.codec.max_payload_bytes():
            raise InvalidMessage(
                f"contribution payload of {len(payload)} bytes is not the codec's {self.codec.max_payload_bytes()}"
            )
        if hashlib.sha256(payload).digest() != header.payload_sha256:
            raise InvalidMessage("contribution payload does not match the hash its sender signed")
        book = self.book_for(step)
        if book is None:
            return pb.RoundReply(error=f"not averaging for outer step {step} (at {self.low_step})")
        problem = book.add_contribution(peer, Received(header, bytes(payload)))
        if problem is not None and peer in book.equivocators:
            self.bans.ban(PeerID(peer), f"averaging: {problem}")
        reply = pb.RoundReply(error=problem or "")
        if not book.gathering and book.own_commit is not None:
            # A contribution too late for our gather: our commit tells its sender which set we
            # aggregate (without it), so that it does not aggregate one with itself in it.
            reply.commit = book.own_commit
            book.given_commit.add(peer)
        # A peer we sent ours to gets it from that request: answering with it too would send every
        # payload twice when two members send to each other at once.
        if book.own_contribution is not None and peer not in book.sent_contribution:
            reply.contribution.CopyFrom(book.own_contribution)
            book.given_contribution.add(peer)
        return reply

    def take_commit(self, peer: bytes, sealed: bytes) -> pb.RoundReply:
        step, payload = self._open(sealed, COMMIT_DOMAIN, peer, MAX_COMMIT_ENVELOPE_BYTES)
        commit_step, held = parse_commit(payload)
        if commit_step != step:
            raise InvalidMessage("commit names another step than the round it is signed for")
        book = self.book_for(step)
        if book is None:
            return pb.RoundReply(error=f"not averaging for outer step {step} (at {self.low_step})")
        book.add_commit(peer, held)
        if book.own_commit is None:
            return pb.RoundReply()
        book.given_commit.add(peer)
        return pb.RoundReply(commit=book.own_commit)
