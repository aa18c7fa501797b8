"""Errors of the rollout transport, as seen by the submitting or forwarding side, and by handlers."""

from __future__ import annotations

from protocol.errors import HivenetError


class RolloutTransportError(HivenetError):
    """A submission or forward did not get an answer it could use."""


class GroupRefused(RolloutTransportError):
    """Raised by an injected handler to refuse a whole group; its message is sent back to the peer."""


class TicketsRefused(RolloutTransportError):
    """Raised by a ticket handler to issue nothing (its message is sent back), and by the worker's side
    when a validator answered so."""


class SubmissionRefused(RolloutTransportError):
    """The validator (or trainer) answered with an error instead of verdicts; the message is its reason."""


class SubmissionTimeout(RolloutTransportError, TimeoutError):
    """No complete answer arrived in time."""


class PeerUnavailable(RolloutTransportError):
    """The peer could not be reached, refused the stream or closed it without an answer."""
