"""Make torch safe to use in a process forked from ours: one intra-op thread, its pool rebuilt at once.

Two faults of torch after `fork()`, each seen here:

* **The thread pool rebuild races.** torch marks its intra-op thread pool corrupt in a forked child
  (the parent's worker threads do not exist there) and rebuilds it the first time a thread asks
  for it. The rebuild is not thread-safe: a second thread that asks meanwhile gets no pool, and its
  operation fails with `RuntimeError: pool INTERNAL ASSERT FAILED ... Invalid thread pool!`. Every
  new thread asks on its first parallel operation, and the averager process decodes tensor parts
  in several executor threads at once: a decode that failed there left a reducer's part out of a
  whole group's average (seen in CI).
* **OpenMP hangs.** torch's CPU parallelism is GNU OpenMP, which is not fork-safe: if the forking
  thread ran a parallel region before the fork, the child's copy of that thread blocks for good on
  its first parallel region (a tensor op over more than 32768 values), waiting for team threads
  that were not copied. hivemind runs the averager's work in a new thread for this reason; the
  code before it on the child's main thread (`DiLoCoAverager.run`), and any other forked child,
  had no such guard.

`install_torch_fork_safety` registers an after-fork hook that sets torch to one intra-op thread in
every child forked afterwards, on the forking thread, before the child starts any other: the pool
is rebuilt there, once, and no parallel region ever runs in the child. One thread is also what a
forked helper should use: the averager works beside its trainer's own threads. (torch's DataLoader
does the same in its forked workers.)
"""

from __future__ import annotations

import os

import torch

__all__ = ["install_torch_fork_safety"]

_installed = False


def _one_thread() -> None:
    torch.set_num_threads(1)  # asks for the pool: rebuilt here, on the child's only thread


def install_torch_fork_safety() -> None:
    """Give every child this process forks from now on one torch thread (idempotent)."""
    global _installed
    if not _installed:
        os.register_at_fork(after_in_child=_one_thread)
        _installed = True
