"""A small run for dashboard tests: known keys, a ledger of sealed receipts and discovered node records."""

from __future__ import annotations

import secrets
import time
from dataclasses import dataclass, field
from pathlib import Path

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from node.ledger import Ledger
from node.membership import LiveNode
from protocol.node_record import Capabilities, NodeRecord, Role
from tests.helpers import receipts
from tests.helpers.receipts import RUN, new_peer


@dataclass
class Peer:
    key: Ed25519PrivateKey
    peer_id: bytes
    name: str
    role: Role


@dataclass
class DashboardRun:
    """Two validators, two trainers, three inference workers (one cheating) and the receipts between them.

    The expected figures, for assertions: `worker_tokens[name]` accepted tokens per worker,
    `rejections` (worker name, reason) of every rejected rollout.
    """

    peers: dict[str, Peer] = field(default_factory=dict)
    worker_tokens: dict[str, int] = field(default_factory=dict)
    rejections: list[tuple[str, str]] = field(default_factory=list)

    def add(self, name: str, role: Role) -> Peer:
        key, peer_id = new_peer()
        self.peers[name] = Peer(key, peer_id, name, role)
        return self.peers[name]

    @property
    def trusted(self) -> list[bytes]:
        return [p.peer_id for p in self.peers.values() if p.role in (Role.VALIDATOR, Role.TRAINER)]

    def verdict(
        self, validator: str, worker: str, *, tokens: int, reason: str = "", issued_at: float | None = None
    ) -> bytes:
        if reason:
            self.rejections.append((worker, reason))
        else:
            self.worker_tokens[worker] = self.worker_tokens.get(worker, 0) + tokens
        return receipts.verdict(
            self.peers[validator].key, self.peers[worker].peer_id, tokens=tokens, accepted=not reason,
            reason=reason, issued_at=issued_at,
        )  # fmt: skip

    def live_nodes(self, now: float | None = None) -> list[LiveNode]:
        now = time.time() if now is None else now
        return [
            LiveNode(
                record=NodeRecord(
                    peer_id=p.peer_id,
                    roles=(p.role,),
                    public_name=p.name,
                    run_id=RUN,
                    software_version="0.1.0",
                    protocol_version=1,
                    capabilities=Capabilities(cpu_count=2, memory_bytes=1 << 30),
                    addresses=(),
                    started_at=now - 600.0 * (index + 1),
                    instance_id=secrets.token_bytes(16),
                ),
                expires_at=now + 60.0,
                seq=int((now - 5.0 * (index + 1)) * 1e9),  # signed 5 s, 10 s, ... ago
            )
            for index, p in enumerate(self.peers.values())
        ]


def build_run(path: Path, now: float | None = None) -> tuple[DashboardRun, Ledger]:
    """The run above with its receipts in a new ledger at `path` (issued over the last hour)."""
    now = time.time() if now is None else now
    run = DashboardRun()
    for name in ("val-a", "val-b"):
        run.add(name, Role.VALIDATOR)
    for name in ("trainer-a", "trainer-b"):
        run.add(name, Role.TRAINER)
    for name in ("alice", "bob", "mallory"):
        run.add(name, Role.INFERENCE)
    envelopes = [
        run.verdict("val-a", "alice", tokens=120, issued_at=now - 3000),
        run.verdict("val-b", "alice", tokens=80, issued_at=now - 1200),
        run.verdict("val-a", "bob", tokens=50, issued_at=now - 2400),
        run.verdict("val-a", "mallory", tokens=90, reason="toploc_mantissa", issued_at=now - 1800),
        run.verdict("val-b", "mallory", tokens=90, reason="toploc_mantissa", issued_at=now - 900),
        run.verdict("val-b", "mallory", tokens=40, reason="stale", issued_at=now - 600),
        run.verdict("val-a", "mallory", tokens=30, issued_at=now - 300),
        receipts.training(run.peers["trainer-a"].key, run.peers["trainer-b"].peer_id, tokens=1000, issued_at=now - 2000),
        receipts.training(run.peers["trainer-b"].key, run.peers["trainer-a"].peer_id, tokens=1000, issued_at=now - 2000),
        receipts.transfer(run.peers["alice"].key, run.peers["trainer-a"].peer_id, byte_count=1 << 20, issued_at=now - 1000),
        # signed by nobody the run trusts: shown, never counted
        receipts.transfer(new_peer()[0], run.peers["bob"].peer_id, byte_count=1 << 22, issued_at=now - 500),
    ]  # fmt: skip
    ledger = Ledger(path, RUN)
    result = ledger.add_many(envelopes, now=now)
    assert result.added == len(envelopes), result.refused
    return run, ledger
