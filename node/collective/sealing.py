"""Signing a round message for one round of one run, and opening one from a peer.

Contributions' headers and commits are signed envelopes bound to the DHT key of their round
(`protocol.dht_keys.round_channel_key(prefix, step)`): the key names the run (its prefix) and the
outer step, so a message cannot be replayed in another run or another round.
"""

from __future__ import annotations

import re
import time

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from protocol.dht_keys import round_channel_key
from protocol.envelope import open_envelope, seal
from protocol.errors import InvalidMessage

__all__ = ["RUN_ID", "open_for_round", "seal_for_round"]

RUN_ID = ""
"""Messages are bound to their run by the key they are signed for (it holds the run's prefix)."""
_STEP = re.compile(r"[1-9][0-9]{0,15}|0")


def seal_for_round(
    key: Ed25519PrivateKey,
    *,
    prefix: str,
    step: int,
    domain: str,
    payload: bytes,
    ttl_s: float,
    seq: int,
    max_bytes: int,
) -> bytes:
    """`payload` signed with `key` for outer step `step`'s round under `prefix`, valid `ttl_s`."""
    return seal(
        key,
        domain=domain,
        run_id=RUN_ID,
        dht_key=round_channel_key(prefix, step),
        expires_at=time.time() + ttl_s,
        seq=seq,
        payload=payload,
        max_bytes=max_bytes,
    )


def open_for_round(
    sealed: bytes, *, prefix: str, domain: str, signer: bytes, max_bytes: int
) -> tuple[int, bytes]:
    """(step, payload) of an envelope `signer` signed for one of the rounds under `prefix`
    (InvalidMessage if it is not that: another signer, domain, run or a malformed round key)."""
    envelope = open_envelope(sealed, domain=domain, run_id=RUN_ID, signer=signer, max_bytes=max_bytes)
    start = round_channel_key(prefix, 0)[:-1]
    if not envelope.dht_key.startswith(start):
        raise InvalidMessage(f"{domain} is signed for another run or key")
    suffix = envelope.dht_key[len(start) :]
    if not _STEP.fullmatch(suffix):
        raise InvalidMessage(f"{domain} is signed for a malformed round key")
    return int(suffix), envelope.payload
