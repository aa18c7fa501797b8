"""Verdict receipts: a validator's `RolloutVerdict` sealed in an envelope it signs.

The worker keeps the sealed verdict as proof of its accepted work; anyone verifies it with
`protocol.envelope.open_envelope(data, domain=VERDICT_DOMAIN, run_id=..., signer=validator)`.
A receipt is shown long after the rollout (contribution accounting), so it stays valid for
30 days, unlike the short-lived records of the DHT.

Until `protocol.rollout_messages` (with `DOMAIN_VERDICT`, `seal_verdict` and `open_verdict`)
lands, the domain and sealing are defined here; then `seal_receipt` should defer to it.
"""

from __future__ import annotations

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from protocol import rollouts_pb2
from protocol.envelope import seal

__all__ = ["MAX_DETAIL_CHARS", "RECEIPT_TTL_S", "VERDICT_DOMAIN", "seal_receipt"]

VERDICT_DOMAIN = "rollout-verdict"
"""Envelope domain of a verdict (`protocol.rollout_messages.DOMAIN_VERDICT` once that lands)."""

RECEIPT_TTL_S = 30 * 24 * 3600.0
"""How long a verdict's signature stays valid."""

MAX_DETAIL_CHARS = 400
"""A verdict's detail is cut to this, so a sealed verdict stays far below the envelope size limit
(`protocol.limits.MAX_ENVELOPE_BYTES`, which `open_envelope` also applies)."""


def seal_receipt(
    private_key: Ed25519PrivateKey,
    *,
    run_id: str,
    verdict: rollouts_pb2.RolloutVerdict,
    ttl_s: float = RECEIPT_TTL_S,
    seq: int,
) -> bytes:
    """The signed envelope of `verdict` (its detail cut to `MAX_DETAIL_CHARS`), valid from `issued_at` for `ttl_s`."""
    if len(verdict.detail) > MAX_DETAIL_CHARS:
        trimmed = rollouts_pb2.RolloutVerdict()
        trimmed.CopyFrom(verdict)
        trimmed.detail = verdict.detail[:MAX_DETAIL_CHARS]
        verdict = trimmed
    return seal(
        private_key,
        domain=VERDICT_DOMAIN,
        run_id=run_id,
        payload=verdict.SerializeToString(),
        expires_at=verdict.issued_at + ttl_s,
        seq=seq,
    )
