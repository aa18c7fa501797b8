"""A process forked from a node can use torch at once: in several threads, and on its forking thread."""

from __future__ import annotations

import multiprocessing as mp
import threading
from collections.abc import Callable, Iterator

import pytest
import torch

import node.averaging.averager  # noqa: F401  (what forks the averager installs the hook on import)

FORK = mp.get_context("fork")
THREADS = 8
CHILDREN = 5


@pytest.fixture
def two_torch_threads() -> Iterator[None]:
    """The parent uses two intra-op threads (a trainer's default on two cores), restored afterwards."""
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        yield
    finally:
        torch.set_num_threads(before)


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


def _torch_work_on_forking_thread(values: torch.Tensor) -> None:
    values.double().pow(2).sum()


def _exit_codes(target: Callable[[torch.Tensor], None], values: torch.Tensor) -> list[int | None]:
    codes: list[int | None] = []
    for _ in range(CHILDREN):
        child = FORK.Process(target=target, args=(values,))
        child.start()
        child.join(20)
        if child.exitcode is None:  # still running: hung
            child.kill()
            child.join(5)
            codes.append(None)
        else:
            codes.append(child.exitcode)
    return codes


def test_threads_of_a_forked_child_all_get_torch_thread_pool(two_torch_threads: None) -> None:
    values = torch.randn(1_000_000)
    values.norm()  # the parent holds a pool the children inherit
    assert _exit_codes(_first_torch_work_in_threads, values) == [0] * CHILDREN, (
        "a thread of a forked child found no torch thread pool"
    )


def test_a_forked_child_can_run_torch_on_the_thread_that_forked_it(two_torch_threads: None) -> None:
    values = torch.randn(1_000_000)
    values.double().pow(2).sum()  # an OpenMP parallel region on this thread, before the fork
    assert _exit_codes(_torch_work_on_forking_thread, values) == [0] * CHILDREN, (
        "a forked child hung in its first parallel torch operation"
    )
