"""One DiLoCo trainer run in a background thread: what a node, a simulation and the tests start.

`TrainerThread(runtime, ...)` trains a built `TrainerRuntime` in a daemon thread once `start`
is called (the runtime is built in the caller's thread: its averager forks a process and
installs signal handlers). It keeps every report (`reports`, `last_report`, `steps`), the
exception the training died of (`error`), and offers:

* `alive`, `summary()`: for a status line;
* `close(timeout_s)`: ask the trainer to stop, let the round in flight finish and the final
  checkpoint be written, then release the averager (the DHT stays the caller's);
* `stop()`: `close`, then raise the error the trainer died of, once (a `HivenetError` as it
  is, anything else as `TrainerFailed`);
* `kill()`: die without a goodbye (SIGKILL the averager, DHT and p2pd processes), as a
  crashed machine would.

With `wait_for_peers=n` the thread first holds the first inner step until `n` other trainers'
averagers advertise themselves (see `_wait_for_peers`).
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable

import psutil

from node.collective.outer_state import OuterState
from protocol.errors import HivenetError
from training.diloco import OuterStepReport
from training.trainer import TrainerRuntime

__all__ = ["TrainerFailed", "TrainerThread"]

logger = logging.getLogger(__name__)

_PEER_POLL_S = 0.5


class TrainerFailed(HivenetError):
    """The trainer thread stopped on an unexpected error (its traceback is in the log)."""


class TrainerThread:
    """Trains one `TrainerRuntime` in a daemon thread and keeps its reports (see module docstring)."""

    def __init__(
        self,
        runtime: TrainerRuntime,
        *,
        stop_event: threading.Event | None = None,
        on_progress: Callable[[OuterStepReport], None] | None = None,
        wait_for_peers: int = 0,
        should_stop: Callable[[], bool] = lambda: False,
    ) -> None:
        """`stop_event` may be shared by several trainers (one event stops them all);
        `should_stop` is also polled while waiting for peers."""
        self.runtime = runtime
        self.stop_event = stop_event if stop_event is not None else threading.Event()
        self.reports: list[OuterStepReport] = []
        self.error: BaseException | None = None
        self._on_progress = on_progress
        self._wait_for = wait_for_peers
        self._should_stop = should_stop
        self._closed = False
        self.thread = threading.Thread(target=self._work, name=runtime.name, daemon=True)

    @property
    def name(self) -> str:
        return self.runtime.name

    def start(self) -> TrainerThread:
        """Start training in the background; returns self."""
        self.thread.start()
        return self

    def _work(self) -> None:
        try:
            if self._wait_for > 0:
                self._wait_for_peers(self._wait_for)
            self.runtime.train(self.stop_event, self._report)
        except BaseException as exc:
            self.error = exc
            logger.exception("%s: trainer stopped on an error", self.name)

    def _report(self, report: OuterStepReport) -> None:
        self.reports.append(report)
        if self._on_progress is not None:
            self._on_progress(report)

    def _wait_for_peers(self, others: int) -> None:
        """Hold the first inner step until `others` other trainers' averagers are up as well.

        A node record appears before its trainer can average; a trainer that reached its first
        outer step while the others were still loading would step alone. Trainers see each other
        by their round declarations, so a waiting trainer declares the round of a fresh model's
        state (step 0) now; training declares its real round before it averages.
        """
        averager = self.runtime.averager
        fresh = OuterState.from_model(self.runtime.model)
        averager.prepare_round(fresh.step, 0.0, fresh.hash())
        while (
            not self.stop_event.is_set() and not self._should_stop() and len(averager.peer_steps()) < others
        ):
            self.stop_event.wait(_PEER_POLL_S)

    # -- progress ---------------------------------------------------------------------------
    @property
    def alive(self) -> bool:
        return self.thread.is_alive()

    @property
    def last_report(self) -> OuterStepReport | None:
        return self.reports[-1] if self.reports else None

    def steps(self) -> int:
        """Outer steps this trainer has applied so far (0 before its first report)."""
        report = self.last_report
        return report.outer_step if report is not None else 0

    def summary(self) -> str:
        report = self.last_report
        if report is None:
            return "training: preparing (loading data, joining the run)"
        return f"outer step {report.outer_step} loss {report.train_loss:.3f} peers {report.num_peers}"

    # -- ending -----------------------------------------------------------------------------
    def request_stop(self) -> None:
        """Ask the trainer to stop after the round in flight (returns at once)."""
        self.stop_event.set()

    def join(self, timeout_s: float) -> None:
        """Wait up to `timeout_s` for the thread to end (at once if it was never started)."""
        if self.thread.ident is not None:
            self.thread.join(timeout=timeout_s)

    def close(self, timeout_s: float = 300.0) -> None:
        """Stop the trainer, wait up to `timeout_s` for its final checkpoint, release the averager."""
        self.request_stop()
        self.join(timeout_s)
        if not self._closed:
            self._closed = True
            with contextlib.suppress(Exception):
                self.runtime.close()

    def stop(self, timeout_s: float = 300.0) -> None:
        """`close`, then raise the error the trainer died of, if any (only once)."""
        self.close(timeout_s)
        error, self.error = self.error, None
        if isinstance(error, HivenetError):
            raise error
        if error is not None:
            raise TrainerFailed(f"the trainer stopped on an unexpected error: {error!r}") from error

    def kill(self) -> None:
        """Die without a goodbye: SIGKILL this trainer's averager, DHT and p2pd processes."""
        self.request_stop()
        procs = []
        # The gather averager has no process of its own: it dies with the DHT's p2pd.
        averager_pid = getattr(self.runtime.averager, "pid", None)
        for pid in (p for p in (averager_pid, self.runtime.dht.pid) if p is not None):
            with contextlib.suppress(psutil.NoSuchProcess):
                proc = psutil.Process(pid)
                procs.extend([proc, *proc.children(recursive=True)])
        for proc in procs:
            with contextlib.suppress(psutil.NoSuchProcess):
                proc.kill()
