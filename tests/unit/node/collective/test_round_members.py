"""Who a round expects (`node.collective.members.round_candidates`): a trainer whose run has ended
is nobody's candidate, even as last round's member. Whom a trainer asks for the run's state
(`state_sources`)."""

from __future__ import annotations

from node.collective.members import (
    PASS_OVER_ROUNDS,
    PassedOver,
    catching_up,
    left_behind,
    live_standing,
    round_candidates,
    state_sources,
)
from protocol.averaging_round import RoundDeclaration

ME, A, B = b"me", b"peer-a", b"peer-b"


def _declared(step: int, *, final: bool = False) -> RoundDeclaration:
    return RoundDeclaration(step, "0123456789abcdef", "int8", 0.0, True, final)


def _candidates(declared: dict[bytes, RoundDeclaration], also: tuple[bytes, ...] = ()) -> list[bytes]:
    return round_candidates(
        declared, 8, codec="int8", me=ME, standing={A, B}, excluded=lambda _: False, max_others=8, also=also
    )


def test_a_trainer_whose_run_ended_is_not_expected_in_the_next_round() -> None:
    # A declared that its run ended at outer step 8: a round of step 8 must not wait for it
    declared = {A: _declared(8, final=True), B: _declared(8)}
    assert _candidates(declared) == [B]
    # nor as a member of the last round (whose declaration of the next round may lag)
    assert _candidates(declared, also=(A, B)) == [B]


def test_last_rounds_members_are_still_expected_while_they_have_not_ended() -> None:
    assert sorted(_candidates({A: _declared(7)}, also=(A,))) == [A]
    assert sorted(_candidates({}, also=(A, B))) == [A, B]


def test_standing_counts_only_while_its_peers_still_declare_a_round() -> None:
    # Seen in the churn soak: every partner with standing had died, so no live trainer's step
    # counted and a trainer far behind the run never saw that it was left behind.
    declared = {A: _declared(9), B: _declared(9)}
    assert live_standing(declared, {A, b"gone"}) == {A}
    assert left_behind(declared, 3, standing={b"gone"})
    # while one partner lives, only its word counts
    assert not left_behind({A: _declared(3), B: _declared(9), b"c": _declared(9)}, 3, standing={A})


def test_the_state_is_also_asked_of_trainers_still_declaring_the_step_it_must_be_newer_than() -> None:
    # Seen in the churn soak: a member that a round left out asked only the one trainer already
    # declaring the next step, while another member had applied that step (and served it) but not
    # yet declared its next round; with a single source the state was never confirmed.
    declared = {A: _declared(10), B: _declared(9), b"c": _declared(8)}
    assert state_sources(declared, 9, standing=()) == [B, A]  # nearest the median step first
    assert state_sources(declared, 9, standing={A}) == [A, B]  # standing first
    not_serving = RoundDeclaration(10, "0123456789abcdef", "int8", 0.0, False, False)
    assert state_sources({A: not_serving}, 9, standing=()) == []


def test_members_a_round_could_not_reach_are_passed_over_for_the_next_rounds_only() -> None:
    passed = PassedOver()
    ghost, other = b"ghost", b"other"
    passed.remember([ghost], step=4)
    assert [passed.passes_over(ghost, s) for s in (4, 5, 4 + PASS_OVER_ROUNDS, 5 + PASS_OVER_ROUNDS)] == [
        True,
        True,
        True,
        False,
    ]
    assert not passed.passes_over(other, 5)
    passed.remember([ghost], step=4 + PASS_OVER_ROUNDS)  # still unreachable: passed over again
    assert passed.passes_over(ghost, 5 + PASS_OVER_ROUNDS)


def test_a_trainer_declaring_the_step_before_is_catching_up_unless_its_run_ended() -> None:
    me, other = b"me", b"other"
    assert catching_up({other: _declared(4)}, 5, me=me)
    assert not catching_up({other: _declared(5)}, 5, me=me)  # a candidate of the round itself
    assert not catching_up({other: _declared(3)}, 5, me=me)
    assert not catching_up({me: _declared(4)}, 5, me=me)
    assert not catching_up({other: _declared(4, final=True)}, 5, me=me)
