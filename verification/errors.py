"""Exceptions raised by verification: malformed proofs and rollout claims.

A verifier never crashes, hangs or silently passes on hostile input; it raises one of these
with the reason, and the rollout verdict turns it into a rejection.
"""

from __future__ import annotations

from protocol.errors import HivenetError

__all__ = ["InvalidProofError"]


class InvalidProofError(HivenetError, ValueError):
    """A TOPLOC proof (or the activations it is checked against) is malformed.

    Raised for a wrong proof length, a modulus of 0 or above 65497, a coefficient outside the
    field, a number of proofs that does not match the number of 32-token chunks, or
    activations that are not a 2-D bfloat16 tensor. The rollout carrying such a proof must be
    rejected; the message says which check failed.
    """
