"""`node.rejoin.Rejoin`: a node whose DHT finds no peer dials its seeds again, and only then."""

from __future__ import annotations

import asyncio

from node.rejoin import Rejoin


class _World:
    def __init__(self, neighbours: list[int], seeds_answer: list[bool]) -> None:
        self.neighbours = neighbours
        self.seeds_answer = seeds_answer
        self.redials = 0

    async def count(self) -> int:
        return self.neighbours.pop(0)

    async def redial(self) -> object:
        self.redials += 1
        if not self.seeds_answer.pop(0):
            raise ConnectionError("no seed answered")
        return None


def test_a_node_with_peers_never_redials() -> None:
    world = _World([3, 1, 2], [])
    rejoin = Rejoin(world.count, world.redial, interval_s=1.0)

    async def main() -> None:
        for _ in range(3):
            await rejoin.check_once()

    asyncio.run(main())
    assert world.redials == 0 and not rejoin.isolated and rejoin.rejoins == 0


def test_a_node_that_lost_every_peer_redials_until_a_seed_answers() -> None:
    world = _World([2, 0, 0, 0, 4], [False, False, True])
    rejoin = Rejoin(world.count, world.redial, interval_s=1.0)
    seen = []

    async def main() -> None:
        for _ in range(5):
            await rejoin.check_once()
            seen.append(rejoin.isolated)

    asyncio.run(main())
    assert seen == [False, True, True, False, False]
    assert world.redials == 3 and rejoin.rejoins == 1


def test_a_lookup_that_fails_is_no_evidence_of_an_outage() -> None:
    async def failing() -> int:
        raise TimeoutError

    world = _World([], [])
    rejoin = Rejoin(failing, world.redial, interval_s=1.0)
    asyncio.run(rejoin.check_once())
    assert world.redials == 0 and not rejoin.isolated


def test_a_node_that_peers_found_again_is_back_before_any_seed_answers() -> None:
    world = _World([0, 3, 2], [False])
    rejoin = Rejoin(world.count, world.redial, interval_s=1.0)
    seen = []

    async def main() -> None:
        for _ in range(3):
            await rejoin.check_once()
            seen.append((rejoin.isolated, rejoin.rejoins))

    asyncio.run(main())
    assert seen == [(True, 0), (False, 1), (False, 1)] and world.redials == 1
