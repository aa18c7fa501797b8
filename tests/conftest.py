"""Shared fixtures and the suite's policies (the bounded wait helper is `node.swarm.wait_until`).

- Every test session gets its own data directory (`XDG_DATA_HOME`, inherited by the processes
  tests start), so no test reads or writes the user's identity, weights or ledgers, and
  parallel workers (pytest-xdist) never share such files.
- Under `CI=true` a skipped test fails (`tests.helpers.suite_policy`): CI must provide what
  every test needs.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers.suite_policy import pytest_runtest_makereport  # noqa: F401  (the CI skip policy)


def pytest_configure(config: pytest.Config) -> None:
    data_home = tempfile.mkdtemp(prefix="hivenet-test-data-")
    config.stash[_DATA_HOME] = data_home
    os.environ["XDG_DATA_HOME"] = data_home


def pytest_unconfigure(config: pytest.Config) -> None:
    data_home = config.stash.get(_DATA_HOME, None)
    if data_home is not None:
        shutil.rmtree(data_home, ignore_errors=True)


_DATA_HOME = pytest.StashKey[str]()


@pytest.fixture
def key_path(tmp_path: Path) -> Iterator[Path]:
    """A path where a test may create an identity."""
    yield tmp_path / "identity.key"


@pytest.fixture(scope="module")
def one_torch_thread() -> Iterator[None]:
    """Small tensor ops on a shared 2-core machine: one torch thread is fastest and least disruptive."""
    import torch  # only the modules that ask for this fixture pay for importing torch

    old = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(old)
