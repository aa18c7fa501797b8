"""Fixtures of the tests on separate hosts (`tests.helpers.netns`): a lab per module.

These tests run in their own stage (`scripts/test.sh network`), after the slow tier: each module
starts a dozen node processes, and beside the churn soak on a two-core machine they measure
contention rather than the code.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.helpers.netns import INTERNET, Lab, skip_reason

LAB_NETWORK = ["--dialable-network", str(INTERNET)]
"""The lab's internet is a private range: its nodes and seeds are told to treat it as public."""


@pytest.fixture(scope="module")
def lab() -> Iterator[Lab]:
    """An empty lab (the internet only); a module adds the hosts it needs."""
    reason = skip_reason()
    if reason is not None:
        pytest.skip(f"no network namespaces here: {reason}")
    with Lab() as built:
        yield built
