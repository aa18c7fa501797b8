"""The upload cap: a new rate applies to the uploads already waiting for it."""

from __future__ import annotations

import asyncio

from node.broadcast.wire import RateLimiter

HANG_GUARD_S = 30.0


def test_an_upload_waiting_for_the_cap_takes_a_new_rate_at_once() -> None:
    async def main() -> None:
        limiter = RateLimiter(1.0, burst_bytes=10)
        await limiter.consume(10)  # the bucket is empty: 1000 more bytes would take 1000 s at 1 B/s
        waiting = asyncio.create_task(limiter.consume(1000))
        await asyncio.sleep(0)  # it has started waiting
        assert not waiting.done()
        limiter.bytes_per_s = 1e9
        await asyncio.wait_for(waiting, HANG_GUARD_S)

        uncapped = RateLimiter(1.0, burst_bytes=10)
        await uncapped.consume(10)
        waiting = asyncio.create_task(uncapped.consume(1000))
        await asyncio.sleep(0)
        uncapped.bytes_per_s = None  # the cap lifted
        await asyncio.wait_for(waiting, HANG_GUARD_S)

    asyncio.run(main())


def test_an_upload_queued_behind_another_passes_when_the_cap_is_lifted() -> None:
    """An upload waiting for the limiter's lock (another one holds it, waiting for tokens) computed
    its refill with a rate of None once the cap was lifted, and failed with a TypeError."""

    async def main() -> None:
        limiter = RateLimiter(1.0, burst_bytes=10)
        await limiter.consume(10)
        first = asyncio.create_task(limiter.consume(1000))
        queued = asyncio.create_task(limiter.consume(1000))
        await asyncio.sleep(0)  # the first waits for tokens, the second for the lock
        assert not first.done() and not queued.done()
        limiter.bytes_per_s = None
        await asyncio.wait_for(asyncio.gather(first, queued), HANG_GUARD_S)

    asyncio.run(main())
