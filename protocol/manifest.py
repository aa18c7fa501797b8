"""Weight-broadcast formats and rules: signed manifests, DHT pointers, holder announcements, bitmaps.

A **manifest** describes one published version of a run's weights: the safetensors file's
size, the chunk size, the SHA-256 of every chunk and the tensor layout, signed by the
publisher's Ed25519 key (`MANIFEST_CONTEXT` || body). A version is named by its **content
id**: the SHA-256 of a canonical encoding of what defines its bytes (run, version, sizes,
chunk hashes, tensor layout), not of the signed manifest, so publishers holding bit-identical
weights publish the same content id and their chunks are interchangeable. Manifests can be
large, so they are not DHT values: the DHT carries a small signed **pointer** (run, version,
content id, manifest size, publisher) and peers fetch a manifest from any holder of that
content id, checking its signature, its publisher and its content id. A **holder
announcement** is a short-lived signed DHT value saying that a peer holds (part of) a version's
content. Only publishers listed for the run are believed. Chunk bitmaps and frame caps are in
`protocol.chunk_bitmap`.

Everything here is pure: `parse_*` turn untrusted bytes into typed objects or raise
InvalidMessage (UnauthorizedPublisher when the signer is not allowed to publish).
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Callable, Collection
from dataclasses import dataclass, field

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from multiaddr import Multiaddr

from protocol import broadcast_pb2 as bpb
from protocol.address_attestation import check_attestation_list
from protocol.dht_keys import validate_run_id
from protocol.errors import ConfigError, InvalidMessage
from protocol.limits import (
    MAX_ADDRESS_CHARS,
    MAX_ADDRESSES,
    MAX_CHUNK_BYTES,
    MAX_HOLDER_TTL_S,
    MAX_MANIFEST_BYTES,
    MAX_MANIFEST_TENSORS,
    MAX_TENSOR_NAME_CHARS,
    MAX_TENSOR_RANK,
    MAX_WEIGHTS_BYTES,
    MAX_WEIGHTS_POINTER_TTL_S,
    MIN_CHUNK_BYTES,
)
from protocol.peer_keys import peer_id_from_private_key, signature_verifies
from protocol.untrusted import capped_bytes, parse_untrusted
from protocol.version import PROTOCOL_VERSION

MANIFEST_CONTEXT = b"hivenet-weights-manifest-v1\x00"
"""Prefixed to the manifest body before signing, so the signature is valid for nothing else."""

WEIGHTS_POINTER_DOMAIN = "weights-pointer"
"""Envelope domain of the DHT pointer to a version's manifest."""

WEIGHTS_HOLDER_DOMAIN = "weights-holder"
"""Envelope domain of a holder announcement."""

CONTENT_ID_CONTEXT = b"hivenet-weights-content-v1\x00"
"""Prefixed to the canonical content encoding before hashing it into a content id."""

HASH_BYTES = 32
"""SHA-256 digest size; chunk hashes and content ids."""

_MAX_VERSION = (1 << 63) - 1


class UnauthorizedPublisher(InvalidMessage):
    """A manifest or pointer is signed by a peer not listed as a publisher of the run."""


def sha256(data: bytes | memoryview) -> bytes:
    """The SHA-256 digest of `data`."""
    return hashlib.sha256(data).digest()


def num_chunks_for(total_bytes: int, chunk_bytes: int) -> int:
    """How many chunks a file of `total_bytes` has when cut into `chunk_bytes` pieces (at least one)."""
    return max(1, -(-total_bytes // chunk_bytes))


def check_chunk_bytes(chunk_bytes: int) -> int:
    """Return `chunk_bytes` if it is an allowed chunk size, else raise ConfigError saying the range."""
    if not (MIN_CHUNK_BYTES <= chunk_bytes <= MAX_CHUNK_BYTES):
        raise ConfigError(
            f"chunk size {chunk_bytes} bytes is out of range: use {MIN_CHUNK_BYTES}..{MAX_CHUNK_BYTES} bytes"
        )
    return chunk_bytes


@dataclass(frozen=True)
class TensorInfo:
    """Where one tensor's bytes lie in the published safetensors file."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    begin_bytes: int
    end_bytes: int


@dataclass(frozen=True)
class Manifest:
    """A verified manifest: the publisher really signed all of this."""

    run_id: str
    version: int
    publisher: bytes
    created_at: float
    total_bytes: int
    chunk_bytes: int
    chunk_hashes: bytes = field(repr=False)
    """SHA-256 of every chunk, concatenated."""
    tensors: tuple[TensorInfo, ...] = field(repr=False)
    raw: bytes = field(repr=False)
    """The serialized SignedManifest, exactly as signed."""
    content_id: bytes
    """What names this version's bytes, whoever published them (see `content_id_of`)."""

    @property
    def num_chunks(self) -> int:
        return len(self.chunk_hashes) // HASH_BYTES

    def chunk_hash(self, index: int) -> bytes:
        """The expected SHA-256 of chunk `index`."""
        return self.chunk_hashes[index * HASH_BYTES : (index + 1) * HASH_BYTES]

    def chunk_offset(self, index: int) -> int:
        """Byte offset of chunk `index` in the file."""
        return index * self.chunk_bytes

    def chunk_size(self, index: int) -> int:
        """Exact size of chunk `index`: the chunk size, except possibly for the last chunk."""
        if not 0 <= index < self.num_chunks:
            raise IndexError(f"chunk {index} out of range 0..{self.num_chunks - 1}")
        return min(self.chunk_bytes, self.total_bytes - index * self.chunk_bytes)

    def check_chunk(self, index: int, data: bytes | memoryview) -> None:
        """Raise InvalidMessage unless `data` is exactly chunk `index` as published."""
        if len(data) != self.chunk_size(index):
            raise InvalidMessage(
                f"chunk {index} has {len(data)} bytes, the manifest says {self.chunk_size(index)}"
            )
        if sha256(data) != self.chunk_hash(index):
            raise InvalidMessage(f"chunk {index} does not match its hash in the manifest")

    def pointer(self) -> WeightsPointer:
        """The DHT pointer to this manifest."""
        return WeightsPointer(
            run_id=self.run_id,
            version=self.version,
            content_id=self.content_id,
            manifest_bytes=len(self.raw),
            num_chunks=self.num_chunks,
            total_bytes=self.total_bytes,
            publisher=self.publisher,
        )


def content_id_of(
    *,
    run_id: str,
    version: int,
    total_bytes: int,
    chunk_bytes: int,
    chunk_hashes: bytes,
    tensors: Collection[TensorInfo],
) -> bytes:
    """The content id of a version: SHA-256 of a canonical, unambiguous encoding of exactly the fields
    that define its bytes (never the publisher, the publication time or the signature)."""

    def text(value: str) -> bytes:
        encoded = value.encode("utf-8")
        return struct.pack(">I", len(encoded)) + encoded

    parts = [
        CONTENT_ID_CONTEXT,
        text(run_id),
        struct.pack(">QQQ", version, total_bytes, chunk_bytes),
        struct.pack(">I", len(chunk_hashes)) + chunk_hashes,
        struct.pack(">I", len(tensors)),
    ]
    for t in tensors:
        parts += [
            text(t.name),
            text(t.dtype),
            struct.pack(f">I{len(t.shape)}Q", len(t.shape), *t.shape),
            struct.pack(">QQ", t.begin_bytes, t.end_bytes),
        ]
    return sha256(b"".join(parts))


def build_manifest(
    private_key: Ed25519PrivateKey,
    *,
    run_id: str,
    version: int,
    total_bytes: int,
    chunk_bytes: int,
    chunk_hashes: bytes,
    tensors: Collection[TensorInfo],
    created_at: float,
) -> Manifest:
    """Sign a manifest for a file already cut into chunks; return it parsed back (so it is checked)."""
    body = bpb.ManifestBody(
        protocol_version=PROTOCOL_VERSION,
        run_id=run_id,
        version=version,
        publisher=peer_id_from_private_key(private_key),
        created_at=created_at,
        total_bytes=total_bytes,
        chunk_bytes=chunk_bytes,
        chunk_hashes=chunk_hashes,
        tensors=[
            bpb.TensorLayout(
                name=t.name,
                dtype=t.dtype,
                shape=list(t.shape),
                begin_bytes=t.begin_bytes,
                end_bytes=t.end_bytes,
            )
            for t in tensors
        ],
    ).SerializeToString()
    raw = bpb.SignedManifest(
        body=body, signature=private_key.sign(MANIFEST_CONTEXT + body)
    ).SerializeToString()
    return parse_manifest(raw)


def _check_authorized(signer: bytes, authorized_publishers: Collection[bytes] | None) -> None:
    if authorized_publishers is not None and signer not in authorized_publishers:
        raise UnauthorizedPublisher("signed by a peer that is not an authorised publisher of this run")


def parse_manifest(
    data: object,
    *,
    expected_content_id: bytes | None = None,
    run_id: str | None = None,
    version: int | None = None,
    authorized_publishers: Collection[bytes] | None = None,
) -> Manifest:
    """Verify an untrusted serialized manifest and return it.

    Raises InvalidMessage if it is not bytes, too large, malformed, badly signed, of another
    protocol version, run or version, internally inconsistent, or describes other content than
    `expected_content_id`; UnauthorizedPublisher if it is otherwise valid (the content asked
    for, when given) but its signer is not in `authorized_publishers`, which says nothing
    against the peer that served it: it may trust other publishers of the same content.
    """
    data = capped_bytes(data, MAX_MANIFEST_BYTES, "manifest")
    signed = parse_untrusted(bpb.SignedManifest, data, "manifest")
    body = parse_untrusted(bpb.ManifestBody, signed.body, "manifest body")
    if not signature_verifies(body.publisher, signed.signature, MANIFEST_CONTEXT + signed.body):
        raise InvalidMessage("manifest signature does not verify")
    if body.protocol_version != PROTOCOL_VERSION:
        raise InvalidMessage(
            f"manifest uses protocol v{body.protocol_version}, this node speaks v{PROTOCOL_VERSION}"
        )
    try:
        validate_run_id(body.run_id)
    except ConfigError as exc:
        raise InvalidMessage(str(exc)) from None
    if run_id is not None and body.run_id != run_id:
        raise InvalidMessage(f"manifest belongs to run {body.run_id!r}, expected {run_id!r}")
    if version is not None and body.version != version:
        raise InvalidMessage(f"manifest is for version {body.version}, expected {version}")
    if body.version > _MAX_VERSION:
        raise InvalidMessage("manifest version is out of range")
    if not (MIN_CHUNK_BYTES <= body.chunk_bytes <= MAX_CHUNK_BYTES):
        raise InvalidMessage(f"manifest chunk size {body.chunk_bytes} is out of range")
    if not (0 < body.total_bytes <= MAX_WEIGHTS_BYTES):
        raise InvalidMessage(f"manifest total size {body.total_bytes} is out of range")
    expected_chunks = num_chunks_for(body.total_bytes, body.chunk_bytes)
    if len(body.chunk_hashes) != expected_chunks * HASH_BYTES:
        raise InvalidMessage(
            f"manifest lists {len(body.chunk_hashes) // HASH_BYTES} hashes for {expected_chunks} chunks"
        )
    if len(body.tensors) > MAX_MANIFEST_TENSORS:
        raise InvalidMessage(f"manifest lists {len(body.tensors)} tensors, more than {MAX_MANIFEST_TENSORS}")
    tensors = []
    for t in body.tensors:
        if (
            not (0 < len(t.name) <= MAX_TENSOR_NAME_CHARS)
            or len(t.dtype) > 16
            or len(t.shape) > MAX_TENSOR_RANK
        ):
            raise InvalidMessage("manifest holds a malformed tensor entry")
        if not (t.begin_bytes <= t.end_bytes <= body.total_bytes):
            raise InvalidMessage(f"tensor {t.name!r} lies outside the file")
        tensors.append(TensorInfo(t.name, t.dtype, tuple(t.shape), t.begin_bytes, t.end_bytes))
    content_id = content_id_of(
        run_id=body.run_id,
        version=body.version,
        total_bytes=body.total_bytes,
        chunk_bytes=body.chunk_bytes,
        chunk_hashes=body.chunk_hashes,
        tensors=tensors,
    )
    if expected_content_id is not None and content_id != expected_content_id:
        raise InvalidMessage("manifest describes other content than the content id asked for")
    _check_authorized(body.publisher, authorized_publishers)
    return Manifest(
        run_id=body.run_id,
        version=body.version,
        publisher=body.publisher,
        created_at=body.created_at,
        total_bytes=body.total_bytes,
        chunk_bytes=body.chunk_bytes,
        chunk_hashes=body.chunk_hashes,
        tensors=tuple(tensors),
        raw=data,
        content_id=content_id,
    )


@dataclass(frozen=True)
class WeightsPointer:
    """The signed DHT value naming a version by content id, with its publisher's manifest size."""

    run_id: str
    version: int
    content_id: bytes
    manifest_bytes: int
    """Size of the publisher's signed manifest: the most bytes read when fetching a manifest."""
    num_chunks: int
    total_bytes: int
    publisher: bytes

    def to_payload(self) -> bytes:
        return bpb.WeightsPointer(
            run_id=self.run_id,
            version=self.version,
            content_id=self.content_id,
            manifest_bytes=self.manifest_bytes,
            num_chunks=self.num_chunks,
            total_bytes=self.total_bytes,
            publisher=self.publisher,
        ).SerializeToString()

    @classmethod
    def from_payload(cls, payload: bytes) -> WeightsPointer:
        """Parse and check an untrusted pointer payload; raise InvalidMessage if it is bad."""
        message = parse_untrusted(bpb.WeightsPointer, payload, "weights pointer")
        if len(message.content_id) != HASH_BYTES:
            raise InvalidMessage("weights pointer holds a malformed content id")
        if not (0 < message.total_bytes <= MAX_WEIGHTS_BYTES) or message.version > _MAX_VERSION:
            raise InvalidMessage("weights pointer declares an out-of-range size or version")
        if not (0 < message.num_chunks <= num_chunks_for(message.total_bytes, MIN_CHUNK_BYTES)):
            raise InvalidMessage("weights pointer declares an impossible chunk count")
        if not (
            HASH_BYTES * message.num_chunks < message.manifest_bytes <= manifest_bytes_cap(message.num_chunks)
        ):
            raise InvalidMessage("weights pointer declares an impossible manifest size")
        return cls(
            run_id=message.run_id,
            version=message.version,
            content_id=message.content_id,
            manifest_bytes=message.manifest_bytes,
            num_chunks=message.num_chunks,
            total_bytes=message.total_bytes,
            publisher=message.publisher,
        )


def manifest_bytes_cap(num_chunks: int) -> int:
    """The most bytes a manifest for `num_chunks` chunks may take (hashes plus a bounded tensor layout)."""
    per_tensor = MAX_TENSOR_NAME_CHARS + 16 + 11 * MAX_TENSOR_RANK + 40
    return min(MAX_MANIFEST_BYTES, 4096 + (HASH_BYTES + 4) * num_chunks + per_tensor * MAX_MANIFEST_TENSORS)


@dataclass(frozen=True)
class HolderAnnouncement:
    """A peer's signed claim that it holds (part of) a version's content; checked chunk by chunk on use."""

    run_id: str
    version: int
    content_id: bytes
    chunks_held: int
    num_chunks: int
    addresses: tuple[str, ...] = ()
    """Multiaddrs (without /p2p) at which the holder can be dialled."""
    attestations: tuple[bytes, ...] = ()
    """The holder's sealed address attestations (`protocol.address_attestation`; unverified here)."""

    def to_payload(self) -> bytes:
        return bpb.HolderAnnouncement(
            run_id=self.run_id,
            version=self.version,
            content_id=self.content_id,
            chunks_held=self.chunks_held,
            num_chunks=self.num_chunks,
            addresses=list(self.addresses),
            attestations=list(self.attestations),
        ).SerializeToString()

    @classmethod
    def from_payload(cls, payload: bytes) -> HolderAnnouncement:
        """Parse and check an untrusted announcement payload; raise InvalidMessage if it is bad."""
        message = parse_untrusted(bpb.HolderAnnouncement, payload, "holder announcement")
        if len(message.content_id) != HASH_BYTES or message.chunks_held > message.num_chunks:
            raise InvalidMessage("holder announcement is inconsistent")
        if message.version > _MAX_VERSION:
            raise InvalidMessage("holder announcement version is out of range")
        if len(message.addresses) > MAX_ADDRESSES or any(
            len(a) > MAX_ADDRESS_CHARS for a in message.addresses
        ):
            raise InvalidMessage("holder announcement lists too many or too long addresses")
        for address in message.addresses:
            try:
                Multiaddr(address)
            except Exception:
                raise InvalidMessage(f"holder announcement lists an invalid multiaddr {address!r}") from None
        return cls(
            run_id=message.run_id,
            version=message.version,
            content_id=message.content_id,
            chunks_held=message.chunks_held,
            num_chunks=message.num_chunks,
            addresses=tuple(message.addresses),
            attestations=check_attestation_list(message.attestations, "holder announcement"),
        )

    @property
    def complete(self) -> bool:
        return self.chunks_held == self.num_chunks


def _check_pointer_record(payload: bytes, signer: bytes) -> None:
    pointer = WeightsPointer.from_payload(payload)
    if pointer.publisher != signer:
        raise InvalidMessage("weights pointer names another publisher than its signer")


def _check_holder_record(payload: bytes, signer: bytes) -> None:
    HolderAnnouncement.from_payload(payload)


BROADCAST_DOMAIN_RULES: dict[str, tuple[float, Callable[[bytes, bytes], None]]] = {
    WEIGHTS_POINTER_DOMAIN: (MAX_WEIGHTS_POINTER_TTL_S, _check_pointer_record),
    WEIGHTS_HOLDER_DOMAIN: (MAX_HOLDER_TTL_S, _check_holder_record),
}
"""Domain -> (max TTL in s, payload check); protocol.record_validator registers these."""
