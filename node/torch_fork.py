"""Rebuild torch's intra-op thread pool in a forked child before any of the child's threads can race to.

torch marks its intra-op thread pool corrupt in a forked child (the parent's worker threads do not
exist there) and rebuilds it the first time a thread of the child asks for it. That rebuild is not
thread-safe: while one thread replaces the pool, another that asks for it gets none, and its
operation fails with `RuntimeError: pool INTERNAL ASSERT FAILED ... Invalid thread pool!`. Every
new thread asks on its first parallel operation, so a child whose first torch work runs in several
threads at once hits it: the averager process decodes tensor parts in executor threads, and a
decode that failed there left a reducer's part out of a whole group's average (seen in CI).

`install_torch_pool_rebuild_after_fork` registers an after-fork hook that makes the forking thread
(the child's only thread at that moment) ask for the pool first, so the rebuild is done before
any other thread exists.
"""

from __future__ import annotations

import os

import torch

__all__ = ["install_torch_pool_rebuild_after_fork"]

_installed = False


def _rebuild_pool() -> None:
    torch.set_num_threads(torch.get_num_threads())  # asks for the pool: rebuilt here, on one thread


def install_torch_pool_rebuild_after_fork() -> None:
    """Rebuild torch's thread pool in every child this process forks from now on (idempotent)."""
    global _installed
    if not _installed:
        os.register_at_fork(after_in_child=_rebuild_pool)
        _installed = True
