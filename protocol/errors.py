"""The exception hierarchy: one root (`HivenetError`) and a subclass per kind of failure.

Every message says what happened and what the user can do about it.
"""

from __future__ import annotations


class HivenetError(Exception):
    """Root of all hivenet errors; messages say what happened and what to do."""


class ConfigError(HivenetError, ValueError):
    """A configuration value, flag or config file is invalid."""


class ModelError(ConfigError):
    """A model directory, tokenizer, device or starting-weights hash that a node cannot use."""


class IdentityError(HivenetError):
    """The identity key file is missing, unreadable, malformed, insecure or already in use."""


class InvalidMessage(HivenetError, ValueError):
    """A message from the network is malformed, oversized, badly signed, expired or out of context."""


class ExpiredMessage(InvalidMessage):
    """A correctly signed message whose validity ended: stale (its signer was slow or stuck), not forged."""


class PeerUnreachable(HivenetError):
    """One or more peers (typically seeds) could not be reached in the allotted time."""


class InvalidProofError(HivenetError, ValueError):
    """A TOPLOC proof (or the activations it is checked against) is malformed.

    Raised for a wrong proof length, a modulus of 0 or above 65497, a coefficient outside the
    field, a number of proofs that does not match the number of 32-token chunks, or
    activations that are not a 2-D bfloat16 tensor. The rollout carrying such a proof must be
    rejected; the message says which check failed.
    """
