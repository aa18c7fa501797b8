"""Who a trainer averages with in a round, whether the run has left its round behind, and whom it asks for the run's state.

Pure functions of the round declarations a trainer reads (`AveragingService.declarations`) and
of its standing (the peers it has averaged with in sync): every member of a round computes the
same candidates from the same declarations, so they contact the same peers. `PassedOver`
remembers the declared members a round could not reach, which the next few rounds skip.
"""

from __future__ import annotations

import hashlib
import statistics
from collections.abc import Callable, Collection, Mapping

from protocol.averaging_round import RoundDeclaration

__all__ = ["PassedOver", "catching_up", "left_behind", "live_standing", "round_candidates", "state_sources"]


PASS_OVER_ROUNDS = 3
"""How many further rounds pass over a declared member that a round could not reach."""


class PassedOver:
    """Declared members a round could not reach (and that sent nothing), passed over by the next
    `PASS_OVER_ROUNDS` rounds: a declaration is free to sign, and one with no live host behind it
    would otherwise cost every round its failed sends again. One that does live still gets our
    contribution in the answer to its own."""

    def __init__(self) -> None:
        self._until: dict[bytes, int] = {}

    def remember(self, unreachable: Collection[bytes], step: int) -> None:
        """The round of outer step `step` could not reach `unreachable`."""
        self._until = {p: until for p, until in self._until.items() if until >= step}
        for peer in unreachable:
            self._until[peer] = step + PASS_OVER_ROUNDS

    def passes_over(self, peer: bytes, step: int) -> bool:
        return self._until.get(peer, -1) >= step


def live_standing(declared: Mapping[bytes, RoundDeclaration], standing: Collection[bytes]) -> set[bytes]:
    """The peers with standing (`standing`: those we averaged in sync with) that still declare a round.
    Once every one of them is gone, a trainer has no more evidence than a newcomer, and is one again."""
    return {p for p in declared if p in standing}


def left_behind(declared: Mapping[bytes, RoundDeclaration], step: int, standing: Collection[bytes]) -> bool:
    """Whether most live trainers are past `step`. While a trainer has live peers with standing
    (`live_standing`), only their declarations count: a step is what its trainer says, and identities
    cost nothing."""
    live = live_standing(declared, standing)
    counted = [d.step for p, d in declared.items() if not live or p in live]
    return bool(counted) and statistics.median_low([*counted, step]) > step


def catching_up(declared: Mapping[bytes, RoundDeclaration], step: int, *, me: bytes) -> bool:
    """Whether a live trainer other than `me` still declares the step before `step`: one that is
    resyncing, joining or slower, whose contribution to `step`'s round may still come. A member
    alone waits for it: a state averaged alone has no second witness, and the trainers its round
    left out would resync to it (or fail to) and be late again."""
    return any(p != me and d.step == step - 1 and not d.final for p, d in declared.items())


def round_candidates(
    declared: Mapping[bytes, RoundDeclaration],
    step: int,
    *,
    codec: str,
    me: bytes,
    standing: Collection[bytes],
    excluded: Callable[[bytes], bool],
    max_others: int,
    also: Collection[bytes] = (),
) -> list[bytes]:
    """The members every trainer of the round picks alike: those declared for `step` with `codec`,
    and `also` (last round's members, whose declaration may lag), except `me` and `excluded` peers;
    peers with standing first, then the rest in an order fixed by the step, at most `max_others`."""
    ended = {p for p, d in declared.items() if d.final}
    eligible = [
        p
        for p, d in declared.items()
        if d.step == step and d.codec == codec and not d.final and not excluded(p)
    ]
    eligible += [p for p in also if p not in eligible and p not in ended and p != me and not excluded(p)]
    eligible.sort(key=lambda p: (p not in standing, hashlib.sha256(step.to_bytes(8, "big") + p).digest()))
    return eligible[:max_others]


def state_sources(
    declared: Mapping[bytes, RoundDeclaration], newer_than: int, standing: Collection[bytes]
) -> list[bytes]:
    """Trainers that may serve a state past outer step `newer_than`, best first: those with standing,
    then those nearest the median step. A trainer declares the round of a step after it applied
    that step and began serving it, so one still declaring `newer_than` may already serve the next:
    it is asked too (it answers "stale" if not)."""
    offers = {p: d.step for p, d in declared.items() if d.serves_state and d.step >= newer_than}
    if not offers:
        return []
    median = statistics.median_low(offers.values())
    return sorted(offers, key=lambda p: (p not in standing, abs(offers[p] - median)))
