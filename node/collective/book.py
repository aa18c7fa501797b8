"""One round's ledger: the contributions and commits of an outer step's round as they arrive.

A member's round has two phases. While it **gathers**, it keeps at most one contribution per
peer (a second, different one from the same peer is equivocation: both stay out and the peer is
reported). When the gather ends it **commits** to what it holds, and from then on only commits
are taken. The set every member aggregates is `final_set`: the contributions it holds that every
member whose commit it received, and whose contribution it holds, holds too, with the same payload
hash. Members that gathered the same contributions and received the same commits aggregate the
same set. Commits of peers whose contribution a member lacks do not count, so that a stranger's
commit cannot veto the round; the price is that members that gathered different contributions
can aggregate different sets (a peer that reached only some members). They then hold different
states, which the next round's majority check of state hashes finds and resyncs.

A member whose own contribution `final_set` leaves out (a member it holds committed without it:
ours came too late for that member's gather) follows the set only when every member of it
committed exactly that set (`settled_without`: they all aggregate it) and, once it has standing,
every member of it has standing with it. Otherwise it cannot know which set the others apply, and
aggregates nothing: it takes the run's state instead (`AveragingService`). So a commit that names
only its sender's contribution cannot make a running member apply that one alone.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
from collections import Counter
from dataclasses import dataclass, field

from protocol import collective_pb2 as pb
from protocol.averaging_round import ContributionHeader

__all__ = ["MAX_SEND_ATTEMPTS", "Received", "RoundBook"]

MAX_SEND_ATTEMPTS = 3
"""Most times a gather sends our contribution to one member whose service did not take it."""


@dataclass(frozen=True)
class Received:
    header: ContributionHeader
    payload: bytes


@dataclass
class RoundBook:
    step: int
    max_members: int
    contributions: dict[bytes, Received] = field(default_factory=dict)
    commits: dict[bytes, dict[bytes, bytes]] = field(default_factory=dict)
    own_contribution: pb.Contribution | None = None
    own_commit: bytes | None = None
    equivocators: set[bytes] = field(default_factory=set)
    given_contribution: set[bytes] = field(default_factory=set)
    """Peers that got our contribution in an answer (no need to send it to them again)."""
    lost_sends: Counter[bytes] = field(default_factory=Counter)
    """Sends of our contribution per member that failed in transport."""
    unreachable: set[bytes] = field(default_factory=set)
    """Members every send to failed in transport (dead, or gone): the gather does not wait for them."""
    sent_contribution: set[bytes] = field(default_factory=set)
    """Peers our contribution was sent to (in flight or taken): an answer to them need not carry it.
    A send that fails leaves the set, so that the next answer or send carries it."""
    refused_ours: set[bytes] = field(default_factory=set)
    """Peers whose last answer to our contribution refused it (too late for their gather, or they
    had moved on): they aggregate without it."""
    given_commit: set[bytes] = field(default_factory=set)
    """Peers that got our commit in an answer."""
    preferred: list[bytes] = field(default_factory=list)
    """This member and the round's candidates, in the order the service picks members: they always
    have a place; anyone else shares at most `max_members` places, and is kept only if room is left."""
    gathering: bool = True
    changed: asyncio.Event = field(default_factory=asyncio.Event)

    def add_contribution(self, peer: bytes, received: Received) -> str | None:
        """Keep `peer`'s contribution; the reason it is not kept, or None."""
        if not self.gathering:
            return "this round's gather is over"
        if peer in self.equivocators:
            return "this peer sent two different contributions to this round"
        held = self.contributions.get(peer)
        if held is not None:
            if held.header.payload_sha256 != received.header.payload_sha256:
                self.equivocators.add(peer)
                del self.contributions[peer]
                self.changed.set()
                return "a second, different contribution to the same round"
            return None
        if (
            peer not in self.preferred
            and len(set(self.contributions) - set(self.preferred)) >= self.max_members
        ):
            return "this round's group is full"
        self.contributions[peer] = received
        self.changed.set()
        return None

    def add_commit(self, peer: bytes, held: dict[bytes, bytes]) -> None:
        if peer not in self.commits:
            self.commits[peer] = held
            self.changed.set()

    def not_delivered(self, peer: bytes, *, lost: bool = False) -> None:
        """Our contribution did not reach `peer`: its next request gets it in the answer, and the
        gather may send it again. After `MAX_SEND_ATTEMPTS` sends lost in transport the gather
        stops waiting for it (a trainer killed since the last round costs one deadline otherwise)."""
        self.sent_contribution.discard(peer)
        if lost:
            self.lost_sends[peer] += 1
            if self.lost_sends[peer] >= MAX_SEND_ATTEMPTS:
                self.unreachable.add(peer)
        self.changed.set()

    def held(self) -> dict[bytes, bytes]:
        """{peer: payload hash} of the contributions held now."""
        return {p: r.header.payload_sha256 for p, r in self.contributions.items()}

    def prefer(self, peers: list[bytes]) -> None:
        """Give `peers` (this member first, then the candidates in the service's order) a place."""
        self.preferred = list(dict.fromkeys(peers))

    def close_gather(self) -> dict[bytes, bytes]:
        """End the gather and return what this member commits to: the preferred peers' contributions,
        then strangers' in an order they cannot choose, up to `max_members`."""
        self.gathering = False
        rank = {p: i for i, p in enumerate(self.preferred)}
        strangers = sorted(
            (p for p in self.contributions if p not in rank),
            key=lambda p: hashlib.sha256(self.step.to_bytes(8, "big") + p).digest(),
        )
        kept = [p for p in self.preferred if p in self.contributions] + strangers
        for dropped in kept[self.max_members :]:
            del self.contributions[dropped]
        return self.held()

    def missing_commits(self, me: bytes) -> set[bytes]:
        """Members whose commit may still come: not one that refused our contribution without its
        commit (it had none to give: it gathered alone, or had moved on)."""
        return {
            p for p in self.contributions if p != me and p not in self.commits and p not in self.refused_ours
        }

    def final_set(self, me: bytes) -> dict[bytes, bytes]:
        """{peer: payload hash} of the contributions every committer holds, with the same hash."""
        mine = self.held()
        committers = [held for p, held in self.commits.items() if p in mine and p != me]
        return {
            p: digest
            for p, digest in mine.items()
            if p not in self.equivocators and all(held.get(p) == digest for held in committers)
        }

    def settled_without(self, me: bytes, final: dict[bytes, bytes]) -> bool:
        """Whether every member of `final` (which leaves `me` out) committed exactly `final`: each of
        them then aggregates that very set, as no commit it counts leaves anything of it out."""
        return bool(final) and all(self.commits.get(p) == final for p in final if p != me)

    async def wait_changed(self, timeout_s: float) -> None:
        """Wait until something arrives or `timeout_s` passes."""
        self.changed.clear()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.changed.wait(), max(0.0, timeout_s))
