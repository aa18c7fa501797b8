"""StreamSlots: the caps, the fair-share preemption rule and `serve`, on a fake clock (no sleeps)."""

from __future__ import annotations

import asyncio

import pytest

from node.stream_slots import StreamPreempted, StreamSlot, StreamSlots


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        self.now += 1.0  # every reading is later than the last: admissions and idles are ordered
        return self.now


def admitted(slots: StreamSlots, peer: bytes) -> StreamSlot:
    slot = slots.admit(peer)
    assert isinstance(slot, StreamSlot), slot
    return slot


def test_caps_count_per_peer_and_release_frees_a_slot_once() -> None:
    slots = StreamSlots(max_total=3, max_per_peer=2, clock=FakeClock())
    a1, _, b1 = admitted(slots, b"a"), admitted(slots, b"a"), admitted(slots, b"b")
    assert (slots.total, slots.of(b"a"), slots.of(b"b"), slots.of(b"c"), slots.peers) == (3, 2, 1, 0, 2)
    slots.release(a1)
    slots.release(a1)  # a second release changes nothing
    assert (slots.total, slots.of(b"a")) == (2, 1)
    slots.release(b1)
    assert (slots.total, slots.peers) == (1, 1)
    with pytest.raises(ValueError):
        StreamSlots(max_total=0, max_per_peer=1)


def test_a_peer_at_its_cap_gives_up_its_own_longest_idle_stream_never_one_mid_response() -> None:
    """Its client hung up and opened the next stream before the service saw the last one close."""
    slots = StreamSlots(max_total=4, max_per_peer=2, clock=FakeClock())
    a1, a2, b1 = admitted(slots, b"a"), admitted(slots, b"a"), admitted(slots, b"b")
    a3 = admitted(slots, b"a")
    assert a1.preempted and not a2.preempted and not b1.preempted
    assert (slots.of(b"a"), slots.total, slots.preemptions) == (2, 3, 1)
    with a2.responding(), a3.responding():  # every stream it holds is writing a response
        assert slots.admit(b"a") == "at most 2 streams per peer"
    assert (slots.of(b"a"), slots.total) == (2, 3)


def test_a_full_budget_refuses_when_no_peer_holds_two_more_than_the_newcomer() -> None:
    slots = StreamSlots(max_total=3, max_per_peer=3, clock=FakeClock())
    for peer in (b"a", b"b", b"c"):
        admitted(slots, peer)
    # everyone holds one: a newcomer holding none would only trade places with an equal
    assert slots.admit(b"d") == "too many streams, try again later"
    assert slots.preemptions == 0
    # and a peer one stream short of the heaviest does not take that stream back and forth
    slots = StreamSlots(max_total=3, max_per_peer=3, clock=FakeClock())
    admitted(slots, b"a"), admitted(slots, b"a"), admitted(slots, b"b")
    assert slots.admit(b"b") == "too many streams, try again later"
    assert (slots.of(b"a"), slots.of(b"b"), slots.preemptions) == (2, 1, 0)


def test_sybils_holding_every_slot_lose_one_to_a_newcomer_and_cannot_take_it_back() -> None:
    """The attack of issue 12: T/P identities each at the per-peer cap fill the budget."""
    total, per_peer = 8, 2
    slots = StreamSlots(max_total=total, max_per_peer=per_peer, clock=FakeClock())
    sybils = [f"sybil{i}".encode() for i in range(total // per_peer)]
    held = {sybil: [admitted(slots, sybil), admitted(slots, sybil)] for sybil in sybils}
    assert slots.total == total
    honest = admitted(slots, b"honest")
    assert slots.total == total and slots.preemptions == 1
    preempted = [s for streams in held.values() for s in streams if s.preempted]
    assert len(preempted) == 1
    # the sybils keep reopening what they lost, and new sybils join: the honest peer's single stream stays
    for round_ in range(5):
        for sybil in [*sybils, f"new sybil {round_}".encode()]:
            slot = slots.admit(sybil)
            assert isinstance(slot, (StreamSlot, str))
    assert not honest.preempted and slots.of(b"honest") == 1
    assert slots.total == total


def test_the_longest_idle_stream_of_the_heaviest_peers_is_preempted() -> None:
    clock = FakeClock()
    slots = StreamSlots(max_total=5, max_per_peer=3, clock=clock)
    a1, a2 = admitted(slots, b"a"), admitted(slots, b"a")
    b1, b2 = admitted(slots, b"b"), admitted(slots, b"b")
    admitted(slots, b"c")
    with a1.responding():
        pass  # a1 answered a request just now: it is the most recently idle of a's
    # a and b hold two each; among their streams not responding, a2 has been idle the longest
    admitted(slots, b"d")
    assert a2.preempted and not (a1.preempted or b1.preempted or b2.preempted)
    assert (slots.of(b"a"), slots.of(b"b"), slots.of(b"d"), slots.total) == (1, 2, 1, 5)


def test_a_stream_in_the_middle_of_a_response_is_passed_over_or_ends_after_it() -> None:
    slots = StreamSlots(max_total=2, max_per_peer=2, clock=FakeClock())
    first, second = admitted(slots, b"a"), admitted(slots, b"a")
    with first.responding():
        admitted(slots, b"b")  # first is responding: the idle one goes
        assert second.preempted and not first.preempted
    slots = StreamSlots(max_total=2, max_per_peer=2, clock=FakeClock())
    first, second = admitted(slots, b"a"), admitted(slots, b"a")
    with pytest.raises(StreamPreempted), first.responding(), second.responding():
        admitted(slots, b"b")  # both are responding: the newest is preempted, at the end of its response
        assert second.preempted and not first.preempted
        assert slots.total == 2 and slots.of(b"a") == 1  # its slot is the newcomer's already
    # a response that fails ends with its own error, not StreamPreempted
    slots = StreamSlots(max_total=2, max_per_peer=2, clock=FakeClock())
    first, second = admitted(slots, b"a"), admitted(slots, b"a")
    with pytest.raises(ConnectionError), first.responding(), second.responding():
        admitted(slots, b"b")
        raise ConnectionError("the peer hung up")
    assert second.preempted


def test_serve_reports_preemption_and_cancels_an_idle_stream() -> None:
    async def main() -> None:
        slots = StreamSlots(max_total=2, max_per_peer=2, clock=FakeClock())
        waiting = asyncio.Event()
        request = asyncio.Event()  # never set: a peer that never sends its request

        async def silent_stream() -> None:
            waiting.set()
            await request.wait()

        first, second = admitted(slots, b"sybil"), admitted(slots, b"sybil")
        serving = [asyncio.ensure_future(slots.serve(s, silent_stream())) for s in (first, second)]
        await waiting.wait()
        newcomer = admitted(slots, b"honest")

        async def answered() -> None:
            with newcomer.responding():
                pass

        assert await slots.serve(newcomer, answered()) is True
        done, pending = await asyncio.wait(serving, return_when=asyncio.FIRST_COMPLETED)
        assert [task.result() for task in done] == [False]
        assert slots.of(b"sybil") == 1 and slots.of(b"honest") == 0 and slots.total == 1
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
        assert slots.total == 0

    asyncio.run(main())


def test_serve_lets_a_response_finish_then_reports_preemption_and_propagates_errors() -> None:
    async def main() -> None:
        slots = StreamSlots(max_total=2, max_per_peer=2, clock=FakeClock())
        slot = admitted(slots, b"a")
        writing, written = asyncio.Event(), asyncio.Event()
        sent: list[str] = []

        async def one_response() -> None:
            with slot.responding():
                writing.set()
                await written.wait()
                sent.append("whole response")
            sent.append("next request")  # never reached: preempted at the end of the response

        serving = asyncio.ensure_future(slots.serve(slot, one_response()))
        await writing.wait()
        slots.preempt(slot)  # while it is writing a response: the response is finished first
        assert slots.total == 0
        written.set()
        assert await serving is False
        assert sent == ["whole response"]

        failing = admitted(slots, b"c")

        async def bad_request() -> None:
            raise ValueError("malformed")

        with pytest.raises(ValueError):
            await slots.serve(failing, bad_request())
        assert slots.of(b"c") == 0

    asyncio.run(main())


def test_cancelling_the_caller_cancels_the_stream_and_frees_its_slot() -> None:
    async def main() -> None:
        slots = StreamSlots(max_total=1, max_per_peer=1, clock=FakeClock())
        slot = admitted(slots, b"a")
        started, cancelled = asyncio.Event(), asyncio.Event()

        async def stream() -> None:
            started.set()
            try:
                await asyncio.Event().wait()
            finally:
                cancelled.set()

        serving = asyncio.ensure_future(slots.serve(slot, stream()))
        await started.wait()
        serving.cancel()
        with pytest.raises(asyncio.CancelledError):
            await serving
        assert cancelled.is_set() and slots.total == 0

    asyncio.run(main())
