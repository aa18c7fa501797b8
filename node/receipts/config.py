"""Configuration of the receipts exchange (`node.receipts`): serving limits and the pull schedule."""

from __future__ import annotations

from pydantic import Field, field_validator

from node.config import check_base58_peer_ids
from node.rollouts.config import StreamServiceConfig
from protocol.limits import MAX_RECEIPTS_PER_PAGE


class ReceiptsConfig(StreamServiceConfig):
    """How a node serves its ledger to peers and pulls theirs into it.

    The serving limits (stream caps, frame timeout, bans) are those of every framed stream service
    (`node.rollouts.config.StreamServiceConfig`); the rest bounds what one pull may cost.
    """

    frame_timeout_s: float = Field(default=10.0, gt=0)
    """Longest wait for each request frame of a stream; a silent stream is closed."""
    max_streams: int = Field(default=16, ge=1)
    """Most exchange streams served at once; more are refused as busy."""
    max_streams_per_peer: int = Field(default=1, ge=1)
    """Most exchange streams one peer may hold open at once (a puller needs one)."""
    serve: bool = True
    """Answer other peers' pulls (False: only pull)."""
    pull_interval_s: float = Field(default=30.0, gt=0)
    """Seconds between pull cycles; 0 peers per cycle disables pulling."""
    peers_per_cycle: int = Field(default=4, ge=0)
    """Most live peers pulled from in one cycle (chosen round-robin over the run's live nodes)."""
    page_size: int = Field(default=MAX_RECEIPTS_PER_PAGE, ge=1, le=MAX_RECEIPTS_PER_PAGE)
    """Receipts asked for per request."""
    max_receipts_per_pull: int = Field(default=4 * MAX_RECEIPTS_PER_PAGE, ge=1)
    """Most receipts taken from one peer in one pull; the rest waits for the next cycle (the cursor resumes)."""
    pull_timeout_s: float = Field(default=30.0, gt=0)
    """Longest one pull (dial, every page, verification) may take."""
    max_ledger_receipts: int = Field(default=1_000_000, ge=1)
    """A bound on the disk that peers can fill: at this many receipts a pull cycle first evicts the
    unvouched ones, and is skipped if that leaves no room (the node's own receipts are still stored)."""
    max_cursors: int = Field(default=4096, ge=1)
    """Most peers whose cursor is remembered, in memory and in the ledger (the oldest is forgotten; a
    forgotten peer is re-read from the start, which only costs duplicates)."""
    max_pulled_per_signer: int = Field(default=10_000, ge=1)
    """Most new receipts of any one signer stored from pulls per `signer_window_s` (all peers
    together); the surplus waits for a later window (`node.receipts.quota.SignerQuota`)."""
    signer_window_s: float = Field(default=3600.0, gt=0)
    """The window of `max_pulled_per_signer`."""
    trusted_signers: list[str] = Field(default_factory=list)
    """Base58 PeerIDs the run names as signers (its trainers and validators): their receipts, and those
    of the peers they credited, are kept in full; anyone else's within the budgets below
    (`node.receipts.standing`)."""
    max_unvouched_per_source: int = Field(default=512, ge=0)
    """Most pulled receipts of signers without standing kept from one peer."""
    max_unvouched: int = Field(default=4096, ge=0)
    """Most pulled receipts of signers without standing kept in all (about 12 MiB); past it, and when
    the ledger reaches `max_ledger_receipts`, the oldest of them are evicted first."""

    @field_validator("trusted_signers")
    @classmethod
    def _peer_ids(cls, value: list[str]) -> list[str]:
        return check_base58_peer_ids(value)
