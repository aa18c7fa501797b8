"""The node runtime: one asyncio event loop per process, the services it hosts, and the one
bridge between that loop and synchronous code.

Networking runs on the loop, in a daemon thread of its own; training and the CLI are
synchronous. They meet here and nowhere else:

- `runtime.call(coro, timeout_s=...)`: from any other thread, run a coroutine on the loop and
  wait for its result (exceptions propagate; a timeout cancels the coroutine);
- `runtime.submit(coro)`: the same without waiting, returning a `concurrent.futures.Future`;
- `await offload(fn, *args)`: from the loop, run blocking code (disk, hashing, torch) on a
  worker thread;
- `await in_dht(dht, fn, ...)`: from the loop, run `fn(dht, dht_node, ...)` inside hivemind's
  DHT process and await its result.

A `Service` has a name and `async start()` / `async stop()`; the runtime starts services in
the order they are added and stops them in reverse, each stop bounded by a timeout, so one
stuck service cannot keep the node from leaving.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import functools
import logging
import threading
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, Protocol, TypeVar

from protocol.errors import HivenetError

logger = logging.getLogger(__name__)

T = TypeVar("T")

_STOP_TIMEOUT_S = 10.0


class RuntimeStopped(HivenetError):
    """The node's event loop is not running (never started, or already closed)."""


class Service(Protocol):
    """A component the runtime hosts: started and stopped on the node's event loop."""

    name: str

    async def start(self) -> None: ...

    async def stop(self) -> None: ...


async def offload(fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> T:
    """Run blocking `fn(*args, **kwargs)` on a worker thread without blocking the loop."""
    return await asyncio.to_thread(fn, *args, **kwargs)


async def in_dht(dht: Any, fn: Callable[..., Awaitable[T]], /, **kwargs: Any) -> T:
    """Run `fn(dht, dht_node, **kwargs)` inside hivemind's DHT process; await the result here."""
    return await dht.run_coroutine(functools.partial(fn, **kwargs) if kwargs else fn, return_future=True)


async def _cancel_other_tasks() -> None:
    current = asyncio.current_task()
    tasks = [task for task in asyncio.all_tasks() if task is not current]
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


class NodeRuntime:
    """One event loop on a daemon thread, plus the services running on it."""

    def __init__(self, name: str = "hivenet") -> None:
        self.name = name
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._services: list[Service] = []

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        if self._loop is None or self._loop.is_closed():
            raise RuntimeStopped(f"the {self.name} runtime is not running")
        return self._loop

    @property
    def running(self) -> bool:
        return self._loop is not None and self._loop.is_running()

    def start(self) -> NodeRuntime:
        """Start the loop thread; returns once the loop runs. Idempotent."""
        if self.running:
            return self
        ready = threading.Event()
        loop = asyncio.new_event_loop()

        def run() -> None:
            asyncio.set_event_loop(loop)
            loop.call_soon(ready.set)
            try:
                loop.run_forever()
            finally:
                with contextlib.suppress(Exception):
                    loop.run_until_complete(loop.shutdown_asyncgens())
                loop.close()

        self._loop = loop
        self._thread = threading.Thread(target=run, name=f"{self.name}-loop", daemon=True)
        self._thread.start()
        ready.wait()
        return self

    def in_loop_thread(self) -> bool:
        return self._thread is not None and threading.current_thread() is self._thread

    def submit(self, coro: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
        """Schedule `coro` on the loop from another thread; returns a thread-safe future."""
        try:
            loop = self.loop
        except RuntimeStopped:
            coro.close()
            raise
        return asyncio.run_coroutine_threadsafe(coro, loop)

    def call(self, coro: Coroutine[Any, Any, T], *, timeout_s: float | None = None) -> T:
        """Run `coro` on the loop and wait for its result from a synchronous thread.

        Raises TimeoutError (after cancelling the coroutine) if it takes longer than
        `timeout_s`. Calling it from the loop's own thread would deadlock, so that is refused.
        """
        if self.in_loop_thread():
            coro.close()
            raise RuntimeError("NodeRuntime.call from the event loop itself; await the coroutine instead")
        future = self.submit(coro)
        try:
            return future.result(timeout=timeout_s)
        except concurrent.futures.TimeoutError:
            future.cancel()
            raise TimeoutError(f"timed out after {timeout_s} s") from None
        except BaseException:
            future.cancel()
            raise

    # services

    @property
    def services(self) -> list[Service]:
        return list(self._services)

    def add_service(self, service: Service) -> Service:
        """Start `service` on the loop (blocking until started) and keep it for `close()`."""
        self.call(service.start())
        self._services.append(service)
        logger.debug("service %s started", service.name)
        return service

    def stop_service(self, service: Service) -> None:
        """Stop one service now (it is no longer stopped by `close()`)."""
        if service in self._services:
            self._services.remove(service)
            self._stop_one(service)

    def _stop_one(self, service: Service) -> None:
        try:
            self.call(service.stop(), timeout_s=_STOP_TIMEOUT_S)
        except Exception as exc:
            logger.warning("service %s did not stop cleanly: %r", service.name, exc)

    def close(self) -> None:
        """Stop every service (last added first), then the loop. Idempotent."""
        if not self.running:
            return
        while self._services:
            self._stop_one(self._services.pop())
        with contextlib.suppress(Exception):
            self.call(_cancel_other_tasks(), timeout_s=_STOP_TIMEOUT_S)
        loop = self.loop
        loop.call_soon_threadsafe(loop.stop)
        if self._thread is not None and not self.in_loop_thread():
            self._thread.join(timeout=_STOP_TIMEOUT_S)
        self._thread = None
