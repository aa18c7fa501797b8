"""A thread that keeps the dashboard's view of the swarm fresh by re-reading discovery."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from node.dashboard.data import DashboardData
from node.membership import LiveNode

logger = logging.getLogger(__name__)


class SwarmWatcher:
    """Calls `discover()` every `interval_s` and hands the live nodes to `data`; a failed read keeps the last view."""

    def __init__(self, data: DashboardData, discover: Callable[[], list[LiveNode]], interval_s: float = 5.0):
        self.data = data
        self.discover = discover
        self.interval_s = interval_s
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def refresh(self) -> None:
        try:
            nodes = self.discover()
        except Exception as exc:  # the DHT may be briefly unreachable; show the last view meanwhile
            logger.warning("discovery failed: %r", exc)
            return
        self.data.set_live_nodes(nodes)

    def start(self) -> None:
        self.refresh()
        self._thread = threading.Thread(target=self._run, name="dashboard-discovery", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.refresh()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self.interval_s + 5.0)
