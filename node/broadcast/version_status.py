"""What a node knows about the versions of a run: held here, announced as newest, and who holds them.

`version_statuses` backs `WeightBroadcast.status` (and so `hivenet weights status`): one
`VersionStatus` per version that is either held in the local store or named by the newest
authorised pointer, with the chunks held here and the holders announced in the DHT.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from hivemind.p2p import PeerID

from node.broadcast.records import BroadcastRecords, HolderInfo
from node.broadcast.store import ChunkStore
from protocol.manifest import WeightsPointer

__all__ = ["VersionStatus", "version_statuses"]


@dataclass
class VersionStatus:
    """What is known about one version of a run."""

    version: int
    content_id: bytes
    publisher: PeerID
    total_bytes: int
    num_chunks: int
    local_chunks: int
    """Chunks of this version held (verified) by this node."""
    holders: list[HolderInfo] = field(default_factory=list)


async def version_statuses(store: ChunkStore, records: BroadcastRecords, run_id: str) -> list[VersionStatus]:
    """Versions of `run_id` held in `store` or newest announced, oldest first, with holders and completeness."""
    pointers: dict[int, WeightsPointer] = {}
    latest = await records.find_pointer(run_id)
    if latest is not None:
        pointers[latest.version] = latest
    for version in store.versions(run_id):
        if version not in pointers:
            entry = store.get(run_id, version)
            if entry is not None:
                pointers[version] = entry.manifest.pointer()
    statuses = []
    for version in sorted(pointers):
        pointer = pointers[version]
        entry = store.get(run_id, version)
        local = (
            entry.chunks_held if entry is not None and entry.manifest.content_id == pointer.content_id else 0
        )
        statuses.append(
            VersionStatus(
                version=version,
                content_id=pointer.content_id,
                publisher=PeerID(pointer.publisher),
                total_bytes=pointer.total_bytes,
                num_chunks=pointer.num_chunks,
                local_chunks=local,
                holders=await records.find_holders(run_id, version, pointer.content_id),
            )
        )
    return statuses
