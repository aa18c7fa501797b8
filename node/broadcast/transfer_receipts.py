"""The fetcher's transfer receipts: after a fetch, one signed receipt per source that delivered.

A fetcher attests what it received, never what a source claims: for each source, the chunks that
source delivered first and that verified against the manifest before they were written
(`VersionFetch.verified_by_source`), their bytes, the version and the sha256 of the signed manifest
they were checked against (`protocol.receipts.seal_transfer_receipt`). A source that delivered
nothing that verified gets no receipt.
"""

from __future__ import annotations

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from node.broadcast.fetch import VersionFetch
from protocol.manifest import sha256
from protocol.receipts import seal_transfer_receipt

__all__ = ["sign_transfer_receipts"]


def sign_transfer_receipts(
    fetch: VersionFetch, private_key: Ed25519PrivateKey, *, issued_at: float | None = None
) -> list[bytes]:
    """One sealed `TransferReceipt` per source of `fetch` with verified chunks, signed with `private_key`."""
    manifest = fetch.manifest
    manifest_hash = sha256(manifest.raw)
    return [
        seal_transfer_receipt(
            private_key,
            run_id=manifest.run_id,
            contributor=source,
            version=manifest.version,
            manifest_hash=manifest_hash,
            chunks=chunks,
            byte_count=fetch.verified_bytes_by_source[source],
            issued_at=issued_at,
        )
        for source, chunks in sorted(fetch.verified_by_source.items())
        if chunks > 0
    ]
