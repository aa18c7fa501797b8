"""`CallBatcher`: requests that arrive together are served by one call of a blocking batch function.

A validator judges each submitted group with passes whose cost is mostly per call, not per
rollout (every layer's kernels, the TOPLOC and sampling checks, and caches gone cold while it
sat idle), so groups judged together cost less each than groups judged one by one. Intake
handlers `await batcher.submit(item)`: the first item of a batch waits up to `linger_s` for
company (or until `max_batch` items are waiting), then the whole batch goes to `fn` on a worker
thread, one batch at a time; items that arrive meanwhile form the next batch. A worker that
submits several groups at once (`RLRunConfig.groups_per_submission`) gets them judged together.

`fn` takes the items in arrival order and returns one result per item. If it raises, every item
of that batch gets the exception. A caller that stops waiting (its timeout) does not cancel the
work: the item is still judged, as if it had been judged alone, and its result dropped.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Sequence
from typing import Generic, TypeVar

from node.runtime import offload

__all__ = ["CallBatcher"]

T = TypeVar("T")
R = TypeVar("R")


class CallBatcher(Generic[T, R]):
    """Coalesces concurrent `submit` calls into calls of `fn(items) -> results`, on the running loop."""

    def __init__(self, fn: Callable[[list[T]], Sequence[R]], *, linger_s: float, max_batch: int) -> None:
        if linger_s < 0 or max_batch < 1:
            raise ValueError(f"need linger_s >= 0 and max_batch >= 1, got {linger_s} and {max_batch}")
        self.fn = fn
        self.linger_s = linger_s
        self.max_batch = max_batch
        self._waiting: list[tuple[T, asyncio.Future[R]]] = []
        self._full = asyncio.Event()
        self._drainer: asyncio.Task[None] | None = None
        self.batches: list[int] = []
        """The size of every batch served so far (for tests and reports)."""

    @property
    def pending(self) -> int:
        """Items submitted and not yet taken into a batch."""
        return len(self._waiting)

    async def submit(self, item: T) -> R:
        """`fn`'s result for `item`, computed in a batch with whatever else arrived with it."""
        future: asyncio.Future[R] = asyncio.get_running_loop().create_future()
        self._waiting.append((item, future))
        if len(self._waiting) >= self.max_batch:
            self._full.set()
        if self._drainer is None or self._drainer.done():
            self._drainer = asyncio.ensure_future(self._drain())
        return await future

    async def _drain(self) -> None:
        while self._waiting:
            if len(self._waiting) < self.max_batch:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._full.wait(), self.linger_s)
            batch, self._waiting = self._waiting[: self.max_batch], self._waiting[self.max_batch :]
            if len(self._waiting) < self.max_batch:
                self._full.clear()
            self.batches.append(len(batch))
            try:
                results = await offload(self.fn, [item for item, _ in batch])
                if len(results) != len(batch):
                    raise RuntimeError(
                        f"the batch function returned {len(results)} results for {len(batch)} items"
                    )
            except Exception as exc:
                for _, future in batch:
                    if not future.done():
                        future.set_exception(exc)
                continue
            for (_, future), result in zip(batch, results, strict=True):
                if not future.done():
                    future.set_result(result)
