"""`CallBatcher`: what arrives together is served by one call, one batch at a time, and failures reach every caller."""

from __future__ import annotations

import asyncio
import threading

import pytest

from node.rollouts.batcher import CallBatcher
from tests.helpers.waiting import async_wait_until


def test_items_submitted_together_are_served_by_one_call_in_arrival_order() -> None:
    calls: list[list[int]] = []

    def double(items: list[int]) -> list[int]:
        calls.append(list(items))
        return [2 * item for item in items]

    async def main() -> list[int]:
        batcher = CallBatcher(double, linger_s=0.05, max_batch=8)
        return await asyncio.gather(*(batcher.submit(i) for i in range(3)))

    assert asyncio.run(main()) == [0, 2, 4]
    assert calls == [[0, 1, 2]]


def test_a_full_batch_goes_without_waiting_for_the_linger_and_the_rest_follows() -> None:
    calls: list[list[int]] = []

    def echo(items: list[int]) -> list[int]:
        calls.append(list(items))
        return items

    async def main() -> list[int]:
        batcher = CallBatcher(echo, linger_s=30.0, max_batch=2)
        return list(await asyncio.gather(batcher.submit(1), batcher.submit(2)))

    assert asyncio.run(main()) == [1, 2]
    assert calls == [[1, 2]]  # served as soon as it was full: the 30 s linger never ran out


def test_items_that_arrive_while_a_batch_is_judged_form_the_next_batch() -> None:
    started, release = threading.Event(), threading.Event()
    calls: list[list[str]] = []

    def slow(items: list[str]) -> list[str]:
        calls.append(list(items))
        if len(calls) == 1:
            started.set()
            release.wait(10.0)
        return [item.upper() for item in items]

    async def main() -> list[str]:
        batcher = CallBatcher(slow, linger_s=0.0, max_batch=8)
        first = asyncio.ensure_future(batcher.submit("a"))
        assert await asyncio.to_thread(started.wait, 10.0)
        later = [asyncio.ensure_future(batcher.submit(x)) for x in "bc"]
        await async_wait_until(lambda: batcher.pending == 2, 10.0)
        release.set()
        return [await first, *[await f for f in later]]

    assert asyncio.run(main()) == ["A", "B", "C"]
    assert calls == [["a"], ["b", "c"]]  # one batch at a time


def test_a_failing_batch_fails_every_caller_in_it_and_the_batcher_goes_on() -> None:
    def flaky(items: list[int]) -> list[int]:
        if 0 in items:
            raise ValueError("cannot judge 0")
        return items

    async def main() -> int:
        batcher = CallBatcher(flaky, linger_s=0.02, max_batch=8)
        results = await asyncio.gather(batcher.submit(0), batcher.submit(1), return_exceptions=True)
        assert all(isinstance(r, ValueError) for r in results), results
        return await batcher.submit(5)

    assert asyncio.run(main()) == 5


def test_a_batch_function_that_returns_too_few_results_fails_the_batch() -> None:
    async def main() -> None:
        batcher: CallBatcher[int, int] = CallBatcher(lambda items: items[:1], linger_s=0.02, max_batch=8)
        results = await asyncio.gather(batcher.submit(1), batcher.submit(2), return_exceptions=True)
        assert all(isinstance(r, RuntimeError) for r in results), results

    asyncio.run(main())


def test_a_caller_that_stops_waiting_does_not_stop_the_others() -> None:
    release = threading.Event()

    def echo(items: list[int]) -> list[int]:
        release.wait(10.0)  # held until the impatient caller has given up
        return items

    async def main() -> int:
        batcher = CallBatcher(echo, linger_s=0.0, max_batch=8)
        impatient = asyncio.ensure_future(asyncio.wait_for(batcher.submit(1), 0.01))
        patient = asyncio.ensure_future(batcher.submit(2))
        with pytest.raises(TimeoutError):
            await impatient
        release.set()
        return await patient

    assert asyncio.run(main()) == 2


def test_bad_settings_are_refused() -> None:
    with pytest.raises(ValueError):
        CallBatcher(lambda items: items, linger_s=-1.0, max_batch=1)
    with pytest.raises(ValueError):
        CallBatcher(lambda items: items, linger_s=0.0, max_batch=0)
