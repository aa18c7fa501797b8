"""Exceptions of verification: a verifier never crashes, hangs or silently passes on hostile input.

It raises one of these with the reason, and the rollout verdict turns it into a rejection.
`InvalidProofError` is defined with the TOPLOC proof format in `protocol.errors` (workers
and validators share it); it is re-exported here so verification callers find it here too.
"""

from __future__ import annotations

from protocol.errors import InvalidProofError

__all__ = ["InvalidProofError"]
