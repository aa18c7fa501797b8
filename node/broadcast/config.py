"""Configuration of the weight broadcast (one pydantic model; runtime objects are passed separately)."""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, field_validator

from node.config import check_base58_peer_ids
from protocol.limits import MAX_CHUNK_BYTES, MAX_HOLDER_TTL_S, MAX_WEIGHTS_POINTER_TTL_S, MIN_CHUNK_BYTES


class BroadcastConfig(BaseModel):
    """How a node publishes, stores, fetches and serves weights."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    store_dir: Path
    """Folder of the chunk store (one subfolder per run and version)."""
    authorized_publishers: list[str] = Field(default_factory=list)
    """Base58 PeerIDs allowed to publish weights for the run (from the run's config); others are refused."""
    chunk_bytes: int = Field(default=4 * 1024 * 1024, ge=MIN_CHUNK_BYTES, le=MAX_CHUNK_BYTES)
    """Chunk size used when publishing."""
    keep_versions: int = Field(default=2, ge=1)
    """How many of a run's newest versions are kept on disk and announced; older ones are deleted."""
    serving_grace_s: float = Field(default=30.0, ge=0)
    """An older version whose manifest or chunks this node served (or watched) this recently is kept a
    while past `keep_versions`, so that fetches in progress finish instead of stalling on a version
    deleted under them (at most `keep_versions` such versions beyond the newest)."""
    max_inflight_per_peer: int = Field(default=1, ge=1, le=64)
    """Most chunk requests outstanding to one source at a time. One keeps every uploader's FIFO short, so
    a chunk waits where it will be served soon instead of queueing behind a busy peer while an idle one
    holds it too: in `bench/broadcast.py` (N=16, 64 MiB, 1 MiB/s uploads) 2 took 1.50-1.56x the lower
    bound and 1 took 1.24x. Each fetch still keeps one request at every source busy."""
    max_sources: int = Field(default=32, ge=1)
    """Most holders a fetch downloads from at once."""
    max_holders_considered: int = Field(default=16, ge=1)
    """Most announced holders a fetch (or a manifest lookup) considers per refresh: a random sample.
    Only those it picks as sources are dialled, so announcements cannot make fetchers dial anyone."""
    endgame_max_requests: int = Field(default=2, ge=1)
    """In the endgame, the most sources asked at once for one of the last missing chunks."""
    request_timeout_s: float = Field(default=60.0, gt=0)
    """A chunk or manifest request that takes longer than this fails and its source is dropped for a while."""
    holder_ttl_s: float = Field(default=60.0, gt=0, le=MAX_HOLDER_TTL_S)
    """Validity of a holder announcement in the DHT; refreshed every third of it."""
    pointer_ttl_s: float = Field(default=600.0, gt=0, le=MAX_WEIGHTS_POINTER_TTL_S)
    """Validity of a publisher's weights pointer in the DHT; refreshed every third of it."""
    holder_refresh_s: float = Field(default=2.0, gt=0)
    """How often a running fetch looks up new holders in the DHT."""
    follow_poll_s: float = Field(default=5.0, gt=0)
    """How often a node that follows a run looks for a newer version."""
    ban_base_s: float = Field(default=60.0, gt=0)
    """First ban of a peer that sent bad data; each further ban doubles it."""
    ban_max_s: float = Field(default=24 * 3600.0, gt=0)
    """Longest ban."""
    stall_timeout_s: float = Field(default=60.0, gt=0)
    """A fetch that receives no chunk for this long gives up (no reachable peer still holds what is
    missing, e.g. the publisher dropped the version for a newer one)."""
    retry_after_failure_s: float = Field(default=5.0, gt=0)
    """A source that vanished or timed out is not asked again for this long (not a ban)."""
    upload_slots: int = Field(default=2, ge=1, le=64)
    """Chunks uploaded at once; further requests wait in FIFO order. Few slots let each chunk leave at the
    full upload rate, so other peers can re-serve it sooner, instead of every chunk crawling in parallel."""
    max_upload_streams: int = Field(default=64, ge=1)
    """Most concurrent manifest and chunk streams this node serves. When full, a newcomer takes a stream
    of the peer holding the most if that peer holds two more than it (`node.stream_slots`), else it is
    refused as busy; the preempted stream is told it is busy between two responses."""
    max_upload_streams_per_peer: int = Field(default=8, ge=1)
    """Most concurrent manifest and chunk streams one peer may hold open to this node."""
    max_watch_streams: int = Field(default=64, ge=1)
    """Most bitmap watch streams this node serves at once (a budget apart from the upload streams).
    When full, a newcomer takes the oldest watch of the peer holding the most, if it holds more."""
    max_watch_streams_per_peer: int = Field(default=4, ge=1)
    """Most watch streams one peer holds here; a further one replaces that peer's oldest. A fetch
    holds one per source and version."""
    watch_lifetime_s: float = Field(default=300.0, gt=0)
    """A watch stream is closed after this long (its fetcher opens a new one if it still needs it)."""
    upload_bytes_per_s: float | None = Field(default=None, gt=0)
    """Cap on this node's total upload rate (application-level token bucket); None for no cap."""
    stream_idle_timeout_s: float = Field(default=120.0, gt=0)
    """A serving stream with no request for this long is closed."""
    write_timeout_s: float = Field(default=60.0, gt=0)
    """A serving stream whose peer does not take a response within this long is closed (a slow reader
    must not hold a stream or an upload slot). For a chunk it bounds the time spent waiting on the
    peer over the whole payload, not counting waits for the upload cap; fetchers give up on a request
    after `request_timeout_s` anyway."""
    serve: bool = True
    """Serve held chunks to other peers (switch off only for baselines and tests)."""
    publisher_only: bool = False
    """Download only from the version's publisher (the naive baseline of the benchmark)."""

    @field_validator("authorized_publishers")
    @classmethod
    def _check_peer_ids(cls, value: list[str]) -> list[str]:
        return check_base58_peer_ids(value)
