"""The requesting side of the broadcast protocol: one request to one source, its answer checked.

`request_frame` opens (or reuses) a stream and reads the size-capped response header;
`request_chunk` reads one chunk at exactly its manifest size on a pooled stream; `open_watch`
and `read_have_update` follow a source's chunk bitmap, refusing updates that name chunks the
version does not have. Deciding whom to ask for what is the fetch scheduler's job
(`node.broadcast.fetch`); this module only speaks the protocol.
"""

from __future__ import annotations

import asyncio

from hivemind.p2p import P2P, PeerID

from node.broadcast.service import PROTO_CHUNK, PROTO_WATCH, parse_request
from node.broadcast.wire import read_frame, read_payload, write_frame
from protocol import broadcast_pb2 as bpb
from protocol.chunk_bitmap import have_update_cap
from protocol.errors import InvalidMessage
from protocol.limits import MAX_RESPONSE_HEADER_BYTES
from protocol.manifest import Manifest

Stream = tuple[asyncio.StreamReader, asyncio.StreamWriter]


class NotHeld(Exception):
    """The source answered that it does not hold the requested chunk or version."""


class SourceBusy(Exception):
    """The source refused the stream because it serves too many already."""


async def request_frame(
    p2p: P2P, peer_id: PeerID, proto: str, request: bytes, stream: Stream | None = None
) -> tuple[bpb.ResponseHeader, Stream]:
    """Send one request frame (on `stream` or a new stream) and read the capped response header."""
    if stream is None:
        _, reader, writer = await p2p.call_binary_stream_handler(peer_id, proto)
        stream = (reader, writer)
    reader, writer = stream
    try:
        await write_frame(writer, request)
        frame = await read_frame(reader, MAX_RESPONSE_HEADER_BYTES)
        if frame is None:
            raise ConnectionError("source closed the stream")
        header = parse_request(frame, bpb.ResponseHeader)
        assert isinstance(header, bpb.ResponseHeader)
    except BaseException:
        writer.close()
        raise
    return header, stream


async def request_chunk(
    p2p: P2P, peer_id: PeerID, manifest: Manifest, index: int, idle_streams: list[Stream]
) -> bytes:
    """Request one chunk on a stream from `idle_streams` (or a new one), which goes back there if still
    usable; the payload is read only at the chunk's exact size."""
    request = bpb.ChunkRequest(
        run_id=manifest.run_id, version=manifest.version, content_id=manifest.content_id, index=index
    ).SerializeToString()
    stream = idle_streams.pop() if idle_streams else None
    header, stream = await request_frame(p2p, peer_id, PROTO_CHUNK, request, stream)
    try:
        if header.status == bpb.STATUS_NOT_FOUND:
            idle_streams.append(stream)
            raise NotHeld(f"chunk {index}")
        if header.status == bpb.STATUS_BUSY:
            raise SourceBusy(header.detail)
        if header.status != bpb.STATUS_OK:
            raise InvalidMessage(f"unexpected response status {header.status}")
        data = await read_payload(stream[0], header.payload_bytes, manifest.chunk_size(index))
    except NotHeld:
        raise
    except BaseException:
        stream[1].close()
        raise
    idle_streams.append(stream)
    return data


async def open_watch(p2p: P2P, peer_id: PeerID, manifest: Manifest) -> Stream:
    """Ask a source to stream its chunk bitmap for `manifest`'s version; NotHeld if it has none."""
    request = bpb.WatchRequest(
        run_id=manifest.run_id, version=manifest.version, content_id=manifest.content_id
    ).SerializeToString()
    header, stream = await request_frame(p2p, peer_id, PROTO_WATCH, request)
    if header.status != bpb.STATUS_OK:
        stream[1].close()
        raise NotHeld(bpb.Status.Name(header.status))
    return stream


async def read_have_update(reader: asyncio.StreamReader, num_chunks: int) -> bpb.HaveUpdate:
    """Read the next bitmap update of a watch stream; NotHeld once the source dropped the version,
    InvalidMessage if it names a chunk beyond `num_chunks`."""
    frame = await read_frame(reader, have_update_cap(num_chunks))
    if frame is None:
        raise ConnectionError("source closed its bitmap stream")
    update = parse_request(frame, bpb.HaveUpdate)
    assert isinstance(update, bpb.HaveUpdate)
    if update.dropped:
        raise NotHeld("source dropped the version")
    for index in [*update.new_chunks, *update.fetching]:
        if index >= num_chunks:
            raise InvalidMessage(f"bitmap update names chunk {index} of {num_chunks}")
    return update
