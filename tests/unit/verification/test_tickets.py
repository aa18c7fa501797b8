"""Tickets: each assignment's version is named before its nonce is drawn, its counter and nonce are the
validator's; every ticket is judged once or counted as abandoned; a grinder can neither choose a
version after the outcome nor re-roll a counter."""

from __future__ import annotations

from pathlib import Path

import pytest

from node.rollouts.errors import TicketsRefused
from tests.helpers.rl_workers import zero_nonces
from tests.helpers.validator_setup import ALICE, BOB, GROUP, RUN, assert_group_rejected, reasons
from verification.tickets import TicketBook
from verification.validator import abandon_allowance

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _plain(make_validator, versions=(0,), **kwargs):
    """A validator that issues tickets only when asked (as on the network)."""
    return make_validator(versions=versions, tickets_on_request=True, **kwargs)


def test_a_group_needs_a_ticket_from_this_validator(make_validator, honest) -> None:
    validator = _plain(make_validator)
    sealed, accepted = validator.judge_group(ALICE, honest(0, 0))
    assert_group_rejected(validator, sealed, accepted, "no_ticket")
    assert not validator.bans.is_banned(ALICE) and validator.stats().groups == 0

    [ticket] = validator.issue_tickets(ALICE, 1, 0)
    assert (ticket.counter, ticket.policy_version) == (0, 0)
    sealed, accepted = validator.judge_group(ALICE, honest(0, 0))
    assert reasons(sealed) == [""] * GROUP and len(accepted) == GROUP


def test_the_ticket_fixes_the_version_so_a_grinder_cannot_choose_it(
    make_validator, alice, bob, policies
) -> None:
    validator = _plain(make_validator, versions=(0, 1))
    [mine] = validator.issue_tickets(ALICE, 1, 1)
    assert mine.policy_version == 1  # the version asked for, fixed before the nonce is drawn
    # the grinder generates its counter with the older version too and submits whichever scored best
    older = alice.group(policies[0], 0, mine.counter)
    sealed, accepted = validator.judge_group(ALICE, older)
    assert accepted == [] and reasons(sealed) == ["wrong_version"] * GROUP
    assert validator.bans.is_banned(ALICE)  # honest software never does this
    # the honest control: the ticket's version is accepted
    [theirs] = validator.issue_tickets(BOB, 1, 1)
    sealed, accepted = validator.judge_group(BOB, bob.group(policies[1], 1, theirs.counter))
    assert reasons(sealed) == [""] * GROUP


def test_a_judged_counter_cannot_be_re_rolled_on_another_version(make_validator, alice, policies) -> None:
    validator = _plain(make_validator, versions=(0, 1))
    [ticket] = validator.issue_tickets(ALICE, 1, 1)
    sealed, _ = validator.judge_group(ALICE, alice.group(policies[1], 1, ticket.counter))
    assert reasons(sealed) == [""] * GROUP
    for version in (0, 1):  # the same counter again, on any version the validator still accepts
        sealed, accepted = validator.judge_group(
            ALICE, alice.group(policies[version], version, ticket.counter)
        )
        assert_group_rejected(validator, sealed, accepted, "replay")
    assert validator.stats().workers[ALICE].groups == 1


def test_asking_again_returns_the_open_tickets_and_no_new_one_until_they_are_submitted(
    make_validator, honest
) -> None:
    validator = _plain(make_validator)
    first = validator.issue_tickets(ALICE, 2, 0)
    assert [t.counter for t in first] == [0, 1]
    assert validator.issue_tickets(ALICE, 2, 0) == first  # a lost answer or a restart costs nothing
    assert validator.issue_tickets(ALICE, 8, 0) == first  # and no new one while these are open
    validator.judge_group(ALICE, honest(0, 0))
    # the worker dropped ticket 1 (it scored badly): it gets it back, and only it, until it submits it
    assert validator.issue_tickets(ALICE, 8, 0) == first[1:]
    validator.judge_group(ALICE, honest(0, 1))
    fresh = validator.issue_tickets(ALICE, 64, 0)
    assert [t.counter for t in fresh] == list(range(2, 2 + validator.tickets.max_open))


def test_nonces_are_fresh_so_a_group_for_one_validator_is_refused_by_another(
    make_validator, alice, policies
) -> None:
    one = _plain(make_validator, tickets=TicketBook(run_id=RUN))
    other = _plain(make_validator, tickets=TicketBook(run_id=RUN))
    [a] = one.issue_tickets(ALICE, 1, 0)
    group = alice.group(policies[0], 0, a.counter, nonce=a.nonce)
    sealed, _ = one.judge_group(ALICE, group)
    assert reasons(sealed) == [""] * GROUP
    sealed, accepted = other.judge_group(ALICE, group)  # replayed at a second validator of the run
    assert_group_rejected(other, sealed, accepted, "no_ticket")
    [b] = other.issue_tickets(ALICE, 1, 0)
    assert b.counter == a.counter and b.nonce != a.nonce
    sealed, accepted = other.judge_group(ALICE, group)  # ... even once it issued that counter
    assert accepted == [] and "prompt_mismatch" in reasons(sealed)


def test_a_restarted_validator_remembers_every_ticket(make_validator, honest, tmp_path: Path) -> None:
    path = tmp_path / "tickets.db"
    validator = _plain(make_validator, tickets=TicketBook(path, run_id=RUN, nonces=zero_nonces))
    assert [t.counter for t in validator.issue_tickets(ALICE, 2, 0)] == [0, 1]
    sealed, _ = validator.judge_group(ALICE, honest(0, 0))
    assert reasons(sealed) == [""] * GROUP
    validator.tickets.close()

    restarted = _plain(make_validator, tickets=TicketBook(path, run_id=RUN, nonces=zero_nonces))
    sealed, accepted = restarted.judge_group(ALICE, honest(0, 0))
    assert_group_rejected(restarted, sealed, accepted, "replay")
    assert [t.counter for t in restarted.issue_tickets(ALICE, 1, 0)] == [1]  # still open, none re-issued
    sealed, _ = restarted.judge_group(ALICE, honest(0, 1))
    assert reasons(sealed) == [""] * GROUP
    assert [t.counter for t in restarted.issue_tickets(ALICE, 1, 0)] == [2]
    with pytest.raises(ValueError, match="holds the tickets of run"):
        TicketBook(path, run_id="another-run")


def test_expired_tickets_count_as_abandoned_and_too_many_ban_the_worker(
    make_validator, clock, policies
) -> None:
    validator = _plain(make_validator)
    grace = validator.tickets.grace_s
    dropped = validator.issue_tickets(ALICE, 8, 0)  # generated, none submitted: the ones that came out badly
    validator.issue_tickets(BOB, 1, 0)
    for version in (1, 2, 3):
        validator.add_version(version, policies[version])
    validator.set_trainer_step(3)  # version 0 is too old to judge now
    clock.now += grace / 2
    validator.issue_tickets(BOB, 1, 3)  # within the grace a slow worker may still submit them
    assert validator.stats().abandoned == 0

    clock.now += grace
    with pytest.raises(TicketsRefused, match="banned"):
        validator.issue_tickets(ALICE, 1, 0)
    stats = validator.stats()
    assert stats.workers[ALICE].abandoned == len(dropped) > abandon_allowance(0)
    assert validator.bans.is_banned(ALICE)
    # one abandoned ticket is within the allowance: no ban
    assert stats.workers[BOB].abandoned == 1 and not validator.bans.is_banned(BOB)


def test_a_stale_ticket_submitted_within_the_grace_is_judged_not_abandoned(
    make_validator, honest, policies
) -> None:
    validator = _plain(make_validator)
    validator.issue_tickets(ALICE, 1, 0)
    for version in (1, 2, 3):
        validator.add_version(version, policies[version])
    validator.set_trainer_step(3)
    sealed, accepted = validator.judge_group(ALICE, honest(0, 0))
    assert_group_rejected(validator, sealed, accepted, "stale")
    stats = validator.stats().workers[ALICE]
    assert (stats.groups, stats.abandoned) == (1, 0) and not validator.bans.is_banned(ALICE)


def test_no_tickets_without_a_version_or_beyond_the_total_cap(make_validator) -> None:
    empty = _plain(make_validator, versions=())
    with pytest.raises(TicketsRefused, match="not held"):
        empty.issue_tickets(ALICE, 1, 0)
    capped = _plain(make_validator, tickets=TicketBook(run_id=RUN, max_open_total=3))
    assert len(capped.issue_tickets(ALICE, 2, 0)) == 2
    assert len(capped.issue_tickets(BOB, 2, 0)) == 1
    with pytest.raises(TicketsRefused, match="busy"):
        capped.issue_tickets(b"\x00\x24" + bytes(36), 1, 0)


def test_the_book_forgets_idle_never_judged_workers_first_when_full() -> None:
    book = TicketBook(run_id=RUN, max_workers=4, nonces=zero_nonces)
    workers = [bytes([i]) * 38 for i in range(6)]
    book.issue(workers[0], 1, 0, 0.0)
    book.judged(workers[0], 0)  # has history: kept
    for worker in workers[1:4]:
        book.issue(worker, 1, 0, 0.0)
    assert book.expire(lambda version: False, 0.0) == [] and len(book.expire(lambda v: False, 1e9)) == 3
    assert book.issue(workers[4], 1, 0, 0.0)  # full: the idle sybils make room
    counts = book.counts()
    assert workers[0] in counts and workers[4] in counts and len(counts) <= 4


def test_no_tickets_of_a_version_not_held_or_too_old(make_validator, policies) -> None:
    validator = _plain(make_validator, versions=(0, 1, 2, 3))
    validator.set_trainer_step(3)
    with pytest.raises(TicketsRefused, match="not held"):
        validator.issue_tickets(ALICE, 1, 4)
    with pytest.raises(TicketsRefused, match="behind"):
        validator.issue_tickets(ALICE, 1, 0)
    assert [t.policy_version for t in validator.issue_tickets(ALICE, 2, 1)] == [1, 1]
