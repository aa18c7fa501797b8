"""Graceful stop on Ctrl-C / SIGTERM: the first signal asks long-running loops to finish.

Raising KeyboardInterrupt at an arbitrary point can land inside library code that swallows
it (hivemind's futures do), which would leave a node that ignores Ctrl-C. Instead the first
signal only sets an event that loops poll; a second signal raises KeyboardInterrupt for
users who really want out at once.
"""

from __future__ import annotations

import signal
import threading
from types import FrameType


class StopRequest:
    """Installs SIGINT/SIGTERM handlers in the main thread; `requested` tells loops to wind down."""

    def __init__(self) -> None:
        self._event = threading.Event()
        for signum in (signal.SIGINT, signal.SIGTERM):
            signal.signal(signum, self._on_signal)

    def _on_signal(self, _signum: int, _frame: FrameType | None) -> None:
        if self._event.is_set():
            raise KeyboardInterrupt
        self._event.set()

    @property
    def requested(self) -> bool:
        return self._event.is_set()

    @property
    def event(self) -> threading.Event:
        """The event set by a stop request (for loops that wait on an Event)."""
        return self._event

    def wait(self, timeout_s: float) -> bool:
        """Sleep up to `timeout_s`, waking early on a stop request; return whether one came."""
        return self._event.wait(timeout_s)

    def request(self) -> None:
        """Ask for a stop from code (e.g. when a run's duration is over)."""
        self._event.set()
