"""A process forked from a node can run torch in several threads at once from its start."""

from __future__ import annotations

import multiprocessing as mp
import threading

import torch

import node.averaging.averager  # noqa: F401  (what forks the averager installs the rebuild on import)

FORK = mp.get_context("fork")
THREADS = 8


def _first_torch_work_in_threads(values: torch.Tensor) -> None:
    """Exit 1 if a thread's first parallel torch operation fails (as the averager's decoders did)."""
    errors: list[RuntimeError] = []
    start = threading.Barrier(THREADS)

    def work() -> None:
        start.wait()
        try:
            values.norm()
        except RuntimeError as e:
            errors.append(e)

    threads = [threading.Thread(target=work) for _ in range(THREADS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    raise SystemExit(1 if errors else 0)


def test_threads_of_a_forked_child_all_get_torch_thread_pool() -> None:
    torch.set_num_threads(torch.get_num_threads())  # the parent holds a pool the children inherit
    values = torch.randn(1_000_000)
    values.norm()
    exit_codes = []
    for _ in range(5):
        child = FORK.Process(target=_first_torch_work_in_threads, args=(values,))
        child.start()
        child.join(60)
        exit_codes.append(child.exitcode)
    assert exit_codes == [0] * 5, "a thread of a forked child found no torch thread pool"
