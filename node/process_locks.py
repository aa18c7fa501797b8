"""Cross-process locks that a killed process cannot leave held, put in place of hivemind's.

hivemind's `MPFuture` (how its DHT and averager processes answer the calls of the process that
started them) guards each process's result pipe and its shared-memory allocator with
`multiprocessing.Lock`s, created once at import and shared by every process forked after that
(`MPFuture._update_lock`, `MPFuture._initialization_lock`, `SharedBytes._lock`). A semaphore has
no owner: a process that dies while holding one (an averager terminated when its shutdown grace
period runs out, a child that crashes or is killed) leaves it held for good, and from then on
every process that answers a call from another one blocks forever. A node's DHT stops answering
its new averager, and the node hangs.

`RobustLock` is held through a POSIX record lock on a file, which the kernel drops when the
process holding it dies, plus a thread lock for the threads of one process (record locks belong
to a process, not a thread). `install_robust_mpfuture_locks` puts such locks in hivemind's place;
importing `node.dht_node` does it, before this package starts any hivemind process.
"""

from __future__ import annotations

import fcntl
import os
import tempfile
import threading
from types import TracebackType

from hivemind.utils.mpfuture import MPFuture, SharedBytes

__all__ = ["RobustLock", "install_robust_mpfuture_locks"]


class RobustLock:
    """A lock shared by this process and the processes it forks, released when its holder dies.

    Use it as a context manager or with `acquire`/`release`, like `multiprocessing.Lock`. Every
    process that will share it must be forked after it was made.
    """

    def __init__(self) -> None:
        fd, path = tempfile.mkstemp(prefix="hivenet-lock-")
        os.unlink(path)  # the open descriptor keeps the file; forked children inherit it
        self._fd = fd
        self._threads = threading.Lock()
        # a thread of the parent may hold the thread lock at fork time; the child has no such thread
        os.register_at_fork(after_in_child=self._after_fork)

    def _after_fork(self) -> None:
        self._threads = threading.Lock()

    def acquire(self, blocking: bool = True) -> bool:
        """Take the lock (waiting for it unless `blocking` is False); True if taken."""
        if not self._threads.acquire(blocking):
            return False
        try:
            fcntl.lockf(self._fd, fcntl.LOCK_EX if blocking else fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            self._threads.release()
            return False
        except BaseException:
            self._threads.release()
            raise
        return True

    def release(self) -> None:
        fcntl.lockf(self._fd, fcntl.LOCK_UN)
        self._threads.release()

    def __enter__(self) -> bool:
        return self.acquire()

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        self.release()


_installed = False
_install_lock = threading.Lock()


def install_robust_mpfuture_locks() -> None:
    """Replace hivemind's MPFuture and shared-memory locks with `RobustLock`s (once per process tree).

    Processes forked before this call keep hivemind's own locks, so it must run before the first
    hivemind process is started.
    """
    global _installed
    with _install_lock:
        if _installed:
            return
        MPFuture._update_lock = RobustLock()  # type: ignore[assignment]
        MPFuture._initialization_lock = RobustLock()  # type: ignore[assignment]
        SharedBytes._lock = RobustLock()  # type: ignore[assignment]
        _installed = True
