"""Who a round expects (`node.collective.members.round_candidates`): a trainer whose run has ended
is nobody's candidate, even as last round's member."""

from __future__ import annotations

from node.collective.members import left_behind, live_standing, round_candidates
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
