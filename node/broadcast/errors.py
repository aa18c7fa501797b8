"""Errors of the weight broadcast, all under the project's root `HivenetError`."""

from __future__ import annotations

from protocol.errors import HivenetError


class DiskFull(HivenetError):
    """There is not enough disk space for a version; nothing partial is left claiming to be valid."""


class WeightsUnavailable(HivenetError):
    """No authorised pointer, manifest or holder could be found for the requested run and version."""


class StoreError(HivenetError):
    """The on-disk chunk store is missing a version or is in an unexpected state."""


class FetchStalled(WeightsUnavailable):
    """A fetch received nothing for too long: no reachable peer holds the chunks still missing."""


class VersionSuperseded(WeightsUnavailable):
    """The newest version a fetch started on was replaced, and nobody serves its manifest any more."""
