"""How many pulled receipts one signer may place in this node's ledger per time window.

Signing a receipt is free, so a peer could serve a flood of genuine receipts from identities it
minted, or from one prolific signer, and fill a puller's ledger. Besides the per-peer bound of a
pull (`ReceiptsConfig.max_receipts_per_pull`), `SignerQuota` admits at most `per_window` new
receipts of any one signer per `window_s` from pulls; the surplus is left unverified and counted,
and the pull stops before its page (`node.receipts.client`), so it is asked for again and stored
in a later window: a prolific honest signer's receipts are delayed, never lost. Receipts the
ledger already holds do not count, nor do the node's own receipts (they are not pulled), nor the
receipts of the signers the run names (`exempt`: its trainers and validators, whose verdicts are
the run's own volume, far above any per-signer quota in a busy run, and whose receipts a node needs
to count credit as the signers' own nodes do).

Signers are read from the envelope before it is verified: a receipt that claims a signer it was
not signed by is refused by the ledger right after, and its server banned, so a lie only costs the
liar. The windows are fixed (every count resets when one ends), and at most `max_signers` signers
are counted in one window: past that the least recently seen is forgotten, so memory stays bounded
whatever a peer serves.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict

from protocol import hivenet_pb2
from protocol.limits import MAX_RECEIPT_ENVELOPE_BYTES
from protocol.untrusted import parse_untrusted


def claimed_signer(envelope: bytes) -> bytes | None:
    """The signer a receipt envelope names, unverified (None if it cannot be read as one)."""
    if not isinstance(envelope, bytes) or len(envelope) > MAX_RECEIPT_ENVELOPE_BYTES:
        return None
    try:
        outer = parse_untrusted(hivenet_pb2.SignedEnvelope, envelope, "receipt envelope")
        body = parse_untrusted(hivenet_pb2.EnvelopeBody, outer.body, "receipt envelope body")
    except Exception:
        return None
    return bytes(body.signer)


class SignerQuota:
    """Counts the new receipts each signer placed in the ledger from pulls in the current window."""

    def __init__(
        self,
        per_window: int,
        window_s: float,
        *,
        max_signers: int = 65_536,
        exempt: frozenset[bytes] = frozenset(),
    ) -> None:
        if per_window < 1 or window_s <= 0 or max_signers < 1:
            raise ValueError("per_window and max_signers must be positive, window_s above 0")
        self.per_window = per_window
        self.exempt = exempt
        """Signers admitted without a quota (the run's named signers)."""
        self.window_s = window_s
        self.max_signers = max_signers
        self._window_start = float("-inf")
        self._counts: OrderedDict[bytes, int] = OrderedDict()
        self._lock = threading.Lock()  # pulls store their pages on worker threads
        self.dropped = 0
        """Receipts held back by the quota since the start (every window; one asked for again counts again)."""

    def _roll(self, now: float) -> None:
        if now - self._window_start >= self.window_s:
            self._window_start = now
            self._counts.clear()

    def admit(self, envelopes: list[bytes], *, now: float | None = None) -> tuple[list[bytes], int]:
        """The envelopes within their signers' quotas (in order), and how many were dropped.

        Each admitted envelope is counted against its signer; an envelope whose signer cannot be
        read is admitted uncounted (the ledger refuses it and its server is banned).
        """
        signers = [claimed_signer(envelope) for envelope in envelopes]
        with self._lock:
            return self._admit(envelopes, signers, time.monotonic() if now is None else now)

    def _admit(
        self, envelopes: list[bytes], signers: list[bytes | None], now: float
    ) -> tuple[list[bytes], int]:
        self._roll(now)
        kept: list[bytes] = []
        dropped = 0
        for envelope, signer in zip(envelopes, signers, strict=True):
            if signer is None or signer in self.exempt:
                kept.append(envelope)
                continue
            used = self._counts.get(signer, 0)
            if used >= self.per_window:
                dropped += 1
                continue
            self._counts[signer] = used + 1
            self._counts.move_to_end(signer)
            while len(self._counts) > self.max_signers:
                self._counts.popitem(last=False)
            kept.append(envelope)
        self.dropped += dropped
        return kept, dropped

    def used(self, signer: bytes) -> int:
        """Receipts of `signer` admitted in the current window."""
        return self._counts.get(signer, 0)
