"""Builders of structurally valid rollout messages for transport tests (no model, dummy proofs).

The transport checks shapes, caps and signatures, not TOPLOC, so a proof here is any
258-byte string (the size of a real k = 128 proof). `RecordingWriter` stands in for a stream
writer when a stream handler is tested without a network.
"""

from __future__ import annotations

import asyncio
import hashlib
import time
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from protocol import rollouts_pb2 as rpb
from protocol.peer_keys import peer_id_from_private_key
from protocol.rollout_messages import rollout_hash, seal_verdict
from protocol.toploc import num_chunks, proof_length

RUN = "rl-test-run"


def key(name: str) -> Ed25519PrivateKey:
    """A deterministic Ed25519 key per name."""
    return Ed25519PrivateKey.from_private_bytes(hashlib.sha256(name.encode()).digest())


def make_rollout(completion_tokens: int = 40, seed: int = 0, **overrides: Any) -> rpb.Rollout:
    fields: dict[str, Any] = dict(
        prompt_ids=[72, 105, 33],
        completion_ids=[(seed + i) % 256 for i in range(completion_tokens)],
        dtype="bfloat16",
        device="cpu",
        temperature=1.0,
        top_p=0.9,
        seed=seed,
        proofs=[bytes([seed % 256]) * proof_length(32 * 64) for _ in range(num_chunks(completion_tokens))],
    )
    fields.update(overrides)
    return rpb.Rollout(**fields)


def make_group(
    num_rollouts: int = 4, *, policy_version: int = 3, counter: int = 7, **rollout_overrides: Any
) -> rpb.RolloutGroup:
    return rpb.RolloutGroup(
        policy_version=policy_version,
        counter=counter,
        task="length",
        rollouts=[make_rollout(seed=i, **rollout_overrides).SerializeToString() for i in range(num_rollouts)],
    )


def verdicts_for(
    validator: Ed25519PrivateKey,
    worker: bytes,
    group: rpb.RolloutGroup,
    *,
    run_id: str = RUN,
    accept: bool = True,
) -> list[bytes]:
    """One sealed verdict per rollout of `group` (all accepted with reward 0.5, or all rejected)."""
    return [
        seal_verdict(
            validator,
            run_id=run_id,
            verdict=rpb.RolloutVerdict(
                worker=worker,
                rollout_hash=rollout_hash(data),
                policy_version=group.policy_version,
                counter=group.counter,
                index=i,
                tokens=len(rpb.Rollout.FromString(data).completion_ids),
                accepted=accept,
                reason="" if accept else "toploc_mantissa",
                detail="" if accept else "mantissa error 9.1 > 8",
                reward=0.5 if accept else 0.0,
                issued_at=time.time(),
            ),
        )
        for i, data in enumerate(group.rollouts)
    ]


def peer_bytes(private_key: Ed25519PrivateKey) -> bytes:
    return peer_id_from_private_key(private_key)


class RecordingWriter:
    """A stream writer for handler tests: collects what a stream handler writes, and how many
    bytes its `reader` had not consumed at the first write (0 bytes read past a refused header)."""

    def __init__(self, reader: asyncio.StreamReader | None = None) -> None:
        self.data = bytearray()
        self.closed = False
        self.reader = reader
        self.unread_at_first_write: int | None = None

    def write(self, data: bytes) -> None:
        if self.unread_at_first_write is None and self.reader is not None:
            self.unread_at_first_write = len(self.reader._buffer)  # type: ignore[attr-defined]
        self.data.extend(data)

    async def drain(self) -> None:
        return None

    def close(self) -> None:
        self.closed = True

    def responses(self, max_frame_bytes: int | None = None) -> list[bytes]:
        """The length-prefixed frames written, each whole and (if given) at most `max_frame_bytes`."""
        out, data = [], bytes(self.data)
        while data:
            length = int.from_bytes(data[:4], "big")
            assert len(data) >= 4 + length, "a frame was cut short"
            assert max_frame_bytes is None or length <= max_frame_bytes
            out.append(data[4 : 4 + length])
            data = data[4 + length :]
        return out
