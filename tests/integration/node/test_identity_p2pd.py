"""Identity files: creation, persistence, p2pd compatibility, and clear errors for bad files."""

from __future__ import annotations

import asyncio
from pathlib import Path

from hivemind.p2p import P2P

from node.identity import create_identity


def test_p2pd_runs_with_the_same_peer_id(key_path: Path) -> None:
    identity = create_identity(key_path)

    async def daemon_peer_id() -> str:
        p2p = await P2P.create(identity_path=str(key_path), check_if_identity_free=False)
        try:
            return p2p.peer_id.to_base58()
        finally:
            await p2p.shutdown()

    assert asyncio.run(daemon_peer_id()) == identity.peer_id.to_base58()
