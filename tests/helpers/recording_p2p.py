"""A stand-in for hivemind's P2P that records the addresses a `HolderDialer` dials (nothing is dialled)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any


class RecordingP2P:
    """Records every address dialled; `reachable=False` makes every dial fail as p2pd's would."""

    def __init__(self, *, reachable: bool = True) -> None:
        self.dialled: list[str] = []
        self.reachable = reachable
        self._client = SimpleNamespace(connect=self._connect)

    async def _connect(self, peer_id: Any, addresses: list[Any]) -> None:
        self.dialled += [str(a) for a in addresses]
        if not self.reachable:
            raise ConnectionError("nobody there")

    async def list_peers(self) -> list[Any]:
        return []
