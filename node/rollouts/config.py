"""Configuration of the rollout transport's two stream services (pydantic models)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, field_validator

from node.config import check_base58_peer_ids
from protocol.limits import MAX_GROUPS_PER_SUBMISSION, MAX_ROLLOUT_FORWARD_BYTES, MAX_ROLLOUT_GROUP_BYTES


class StreamServiceConfig(BaseModel):
    """Limits shared by the submit and forward intakes."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    frame_timeout_s: float = Field(default=30.0, gt=0)
    """Longest wait for the first frame of a stream and for each later one; a silent stream is closed."""
    handler_timeout_s: float = Field(default=300.0, gt=0)
    """Longest the injected handler may take on one message before the sender is told it failed."""
    max_streams: int = Field(default=32, ge=1)
    """Most streams served at once. When full, a newcomer takes a stream of the peer holding the most if
    that peer holds two more than it (`node.stream_slots`), else it is refused as busy."""
    max_streams_per_peer: int = Field(default=2, ge=1)
    """Most streams one peer may hold open at once; more are refused as busy."""
    refusal_linger_s: float = Field(default=2.0, ge=0)
    """After refusing a stream, how long what the peer still sends is read and discarded so that it can
    read the refusal before the stream closes (closing with unread data resets the stream, and the
    reset can overtake the answer)."""
    ban_base_s: float = Field(default=60.0, gt=0)
    """First ban of a peer that sent a malformed or oversized message; each further ban doubles it."""
    ban_max_s: float = Field(default=24 * 3600.0, gt=0)
    """Longest ban."""


class IntakeConfig(StreamServiceConfig):
    """How a validator's submit intake (`node.rollouts.intake.RolloutIntake`) limits its streams."""

    max_group_bytes: int = Field(default=MAX_ROLLOUT_GROUP_BYTES, ge=1024, le=MAX_ROLLOUT_GROUP_BYTES)
    """Largest sealed group frame read; a longer declared frame is refused before buffering."""
    max_streams_per_peer: int = Field(default=MAX_GROUPS_PER_SUBMISSION, ge=1)
    """Most streams one peer may hold open at once: a worker submits up to this many groups at once."""


class ForwardConfig(StreamServiceConfig):
    """How a trainer's forward intake (`node.rollouts.forward.ForwardIntake`) limits its streams."""

    trusted_validators: list[str] = Field(default_factory=list)
    """Base58 PeerIDs of the validators whose forwards are accepted (from the run's config)."""
    max_forward_bytes: int = Field(default=MAX_ROLLOUT_FORWARD_BYTES, ge=1024, le=MAX_ROLLOUT_FORWARD_BYTES)
    """Largest sealed forward frame read; a longer declared frame is refused before buffering."""

    @field_validator("trusted_validators")
    @classmethod
    def _check_peer_ids(cls, value: list[str]) -> list[str]:
        return check_base58_peer_ids(value)
