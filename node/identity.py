"""The node's identity: one Ed25519 key file, in the libp2p protobuf format that p2pd reads.

The same key is p2pd's identity (so it fixes the PeerID and the multiaddrs) and signs every
application message. A file lock guarantees that two processes on one machine never run
with the same identity; `node.membership` catches the cross-machine case.
"""

from __future__ import annotations

import fcntl
import os
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import Encoding, NoEncryption, PrivateFormat
from google.protobuf.message import DecodeError
from hivemind.p2p import PeerID
from hivemind.proto import crypto_pb2

from protocol.errors import IdentityError
from protocol.peer_keys import peer_id_from_private_key, public_key_bytes

_ED25519_SEED_BYTES = 32


@dataclass
class Identity:
    """A loaded identity: the private key, its PeerID and the file it came from."""

    private_key: Ed25519PrivateKey
    path: Path
    _lock_file: IO[bytes] | None = field(default=None, repr=False)

    @property
    def peer_id_bytes(self) -> bytes:
        return peer_id_from_private_key(self.private_key)

    @property
    def peer_id(self) -> PeerID:
        return PeerID(self.peer_id_bytes)

    @property
    def short_id(self) -> str:
        """The last 8 characters of the base58 PeerID, for logs and tables."""
        return self.peer_id.to_base58()[-8:]

    def lock(self) -> None:
        """Claim this identity for this process; raise IdentityError if another process holds it."""
        if self._lock_file is not None:
            return
        lock_path = self.path.with_name(self.path.name + ".lock")
        handle = open(lock_path, "a+b")  # noqa: SIM115 - held open for the life of the node
        try:
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.close()
            raise IdentityError(
                f"identity {self.path} is already in use by another running hivenet node on this machine; "
                "stop that node, or give this one its own identity with --identity PATH"
            ) from None
        self._lock_file = handle

    def unlock(self) -> None:
        """Release the claim taken by `lock`."""
        if self._lock_file is not None:
            fcntl.flock(self._lock_file.fileno(), fcntl.LOCK_UN)
            self._lock_file.close()
            self._lock_file = None


def _encode_private_key(private_key: Ed25519PrivateKey) -> bytes:
    seed = private_key.private_bytes(Encoding.Raw, PrivateFormat.Raw, NoEncryption())
    # libp2p stores Ed25519 private keys as seed || public key (64 bytes)
    data = seed + public_key_bytes(private_key.public_key())
    return crypto_pb2.PrivateKey(key_type=crypto_pb2.KeyType.Ed25519, data=data).SerializeToString()


def _decode_private_key(raw: bytes, path: Path) -> Ed25519PrivateKey:
    message = crypto_pb2.PrivateKey()
    try:
        message.ParseFromString(raw)
    except (DecodeError, RuntimeError, ValueError):
        raise IdentityError(
            f"{path} is not a libp2p private key file; move it away and a new identity will be created"
        ) from None
    if message.key_type != crypto_pb2.KeyType.Ed25519:
        kind = crypto_pb2.KeyType.Name(message.key_type) if message.key_type in (0, 1, 2, 3) else "unknown"
        raise IdentityError(
            f"{path} holds a {kind} key; hivenet identities are Ed25519. Move the file away and a new "
            "Ed25519 identity will be created on the next start"
        )
    if len(message.data) not in (64, 96):
        raise IdentityError(
            f"{path} holds a truncated Ed25519 key ({len(message.data)} bytes); restore it from backup"
        )
    private_key = Ed25519PrivateKey.from_private_bytes(message.data[:_ED25519_SEED_BYTES])
    if public_key_bytes(private_key.public_key()) != message.data[_ED25519_SEED_BYTES:64]:
        raise IdentityError(f"{path} is corrupt: its public key does not match its private key")
    return private_key


def create_identity(path: Path) -> Identity:
    """Write a new Ed25519 key to `path` (mode 0600) and return it; refuse to overwrite an existing file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    private_key = Ed25519PrivateKey.generate()
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        raise IdentityError(f"{path} already exists; refusing to overwrite an identity") from None
    with os.fdopen(fd, "wb") as handle:
        handle.write(_encode_private_key(private_key))
    return Identity(private_key=private_key, path=path)


def load_identity(path: Path) -> Identity:
    """Load the identity at `path`; raise IdentityError with a fix if it is unsafe or unusable."""
    try:
        mode = path.stat().st_mode
    except FileNotFoundError:
        raise IdentityError(
            f"no identity at {path}; run `hivenet identity --create` or start a node"
        ) from None
    if not stat.S_ISREG(mode):
        raise IdentityError(f"{path} is not a regular file")
    if mode & 0o077:
        raise IdentityError(
            f"{path} is readable by other users (mode {stat.S_IMODE(mode):o}); anyone who reads it can "
            f"impersonate this node. Fix with: chmod 600 {path}"
        )
    try:
        raw = path.read_bytes()
    except PermissionError:
        raise IdentityError(f"{path} cannot be read by this user; check its owner and permissions") from None
    if len(raw) > 4096:
        raise IdentityError(f"{path} is too large to be a key file")
    return Identity(private_key=_decode_private_key(raw, path), path=path)


def load_or_create_identity(path: Path) -> Identity:
    """Load the identity at `path`, creating it first if the file does not exist."""
    if not path.exists():
        return create_identity(path)
    return load_identity(path)
