"""Fetching a version's signed manifest: from the publisher or any holder, checked against the pointer.

The pointer (signed by an authorised publisher and read from the DHT) names the version by
content id and the manifest's size, so a manifest can come from anyone: at most the declared
size is read, and it is taken if it is signed by any authorised publisher and describes that
content. A peer whose manifest is bad or describes other content is banned; one that serves a
valid manifest of the same content signed by a publisher this node does not trust is only
passed over (it may hold another trainer's publication of the same weights). Peers are tried publisher first, then a capped
random sample of the holders (each dialled only when its turn comes), until one serves a valid
manifest or the deadline passes.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Awaitable, Callable

from hivemind.p2p import P2P, PeerID

from node.bans import BanList
from node.broadcast.dialing import sample_holders
from node.broadcast.errors import VersionSuperseded, WeightsUnavailable
from node.broadcast.records import HolderInfo
from node.broadcast.requests import NotHeld, request_frame
from node.broadcast.service import PROTO_MANIFEST
from node.broadcast.wire import read_payload
from node.log_limit import LogOncePer
from protocol import broadcast_pb2 as bpb
from protocol.errors import InvalidMessage
from protocol.manifest import Manifest, UnauthorizedPublisher, WeightsPointer, parse_manifest

logger = logging.getLogger(__name__)

_RETRY_S = 1.0
_FAILURE_LOG_INTERVAL_S = 60.0
_failure_logged = LogOncePer(_FAILURE_LOG_INTERVAL_S, max_keys=4096)
"""A peer that cannot serve is asked again every `_RETRY_S`: its failure is logged once per interval."""


async def call_manifest(
    p2p: P2P, peer_id: PeerID, pointer: WeightsPointer, *, authorized: set[bytes], timeout_s: float
) -> Manifest:
    """Fetch a version's manifest from one peer, reading at most the size the signed pointer declares."""
    request = bpb.ManifestRequest(
        run_id=pointer.run_id, version=pointer.version, content_id=pointer.content_id
    ).SerializeToString()

    async def call() -> bytes:
        header, (reader, writer) = await request_frame(p2p, peer_id, PROTO_MANIFEST, request)
        try:
            if header.status == bpb.STATUS_NOT_FOUND:
                raise NotHeld("manifest")
            if header.status != bpb.STATUS_OK:
                raise ConnectionError(f"manifest request refused: {bpb.Status.Name(header.status)}")
            return await read_payload(reader, header.payload_bytes, pointer.manifest_bytes)
        finally:
            writer.close()

    raw = await asyncio.wait_for(call(), timeout_s)
    return parse_manifest(
        raw,
        expected_content_id=pointer.content_id,
        run_id=pointer.run_id,
        version=pointer.version,
        authorized_publishers=authorized,
    )


async def obtain_manifest(
    p2p: P2P,
    pointer: WeightsPointer,
    *,
    find_holders: Callable[[], Awaitable[list[HolderInfo]]],
    dial: Callable[[HolderInfo], Awaitable[None]],
    max_holders: int,
    own_peer_id: PeerID,
    bans: BanList,
    authorized: set[bytes],
    request_timeout_s: float,
    deadline_s: float,
    owner: str = "",
    superseded: Callable[[], Awaitable[bool]] | None = None,
) -> Manifest:
    """The pointer's manifest from the first peer that serves a valid one; WeightsUnavailable after `deadline_s`.

    After a pass in which no peer served it, `superseded()` (when given) is asked whether a newer
    version has replaced this one; if so, VersionSuperseded is raised at once, since holders delete
    replaced versions and waiting for this one would only run out the deadline.
    """
    deadline = time.monotonic() + deadline_s
    publisher = PeerID(pointer.publisher)
    rng = random.Random()
    while True:
        holders = await find_holders()
        first = next((h for h in holders if h.peer_id == publisher), HolderInfo(publisher, 0, 0))
        others = sample_holders(
            [h for h in holders if h.peer_id != publisher],
            max_holders,
            lambda h: h.peer_id == own_peer_id or bans.is_banned(h.peer_id),
            rng,
        )
        for holder in [first, *others]:
            peer_id = holder.peer_id
            if peer_id == own_peer_id or bans.is_banned(peer_id):
                continue
            try:
                await dial(holder)
                return await call_manifest(
                    p2p, peer_id, pointer, authorized=authorized, timeout_s=request_timeout_s
                )
            except UnauthorizedPublisher:
                logger.info(
                    "[%s] %s serves this content under a publisher not trusted here",
                    owner,
                    peer_id.to_base58()[-8:],
                )
            except InvalidMessage as exc:
                bans.ban(peer_id, f"bad manifest: {exc}")
            except Exception as exc:
                level = logging.INFO if _failure_logged((owner, peer_id)) else logging.DEBUG
                logger.log(level, "[%s] manifest from %s failed: %r", owner, peer_id.to_base58()[-8:], exc)
        if superseded is not None and await superseded():
            raise VersionSuperseded(f"{pointer.run_id} v{pointer.version} was replaced by a newer version")
        if time.monotonic() > deadline:
            raise WeightsUnavailable(
                f"no peer served a valid manifest for {pointer.run_id} v{pointer.version}; "
                "check that the publisher or a holder is online"
            )
        await asyncio.sleep(_RETRY_S)
