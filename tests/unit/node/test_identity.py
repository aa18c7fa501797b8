"""Identity files: creation, persistence and clear errors for bad files (p2pd's use of them: tests/integration)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hivemind.proto import crypto_pb2

from node.identity import create_identity, load_identity, load_or_create_identity
from protocol.errors import IdentityError


def test_created_with_mode_0600_and_reused(key_path: Path) -> None:
    first = load_or_create_identity(key_path)
    assert (key_path.stat().st_mode & 0o777) == 0o600
    second = load_or_create_identity(key_path)
    assert first.peer_id == second.peer_id
    assert first.peer_id.to_base58().startswith("12D3KooW")  # Ed25519, public key inlined


def test_refuses_to_overwrite(key_path: Path) -> None:
    create_identity(key_path)
    with pytest.raises(IdentityError, match="refusing to overwrite"):
        create_identity(key_path)


def test_world_readable_key_is_refused_with_fix(key_path: Path) -> None:
    create_identity(key_path)
    os.chmod(key_path, 0o644)
    with pytest.raises(IdentityError, match="chmod 600"):
        load_identity(key_path)


@pytest.mark.parametrize(
    ("content", "match"),
    [
        (b"not a key at all \xff\xff", "not a libp2p private key"),
        (crypto_pb2.PrivateKey(key_type=crypto_pb2.KeyType.RSA, data=b"x" * 600).SerializeToString(), "RSA"),
        (
            crypto_pb2.PrivateKey(key_type=crypto_pb2.KeyType.Ed25519, data=b"x" * 10).SerializeToString(),
            "truncated",
        ),
        (
            crypto_pb2.PrivateKey(key_type=crypto_pb2.KeyType.Ed25519, data=b"x" * 64).SerializeToString(),
            "corrupt",
        ),
    ],
)
def test_malformed_key_files(key_path: Path, content: bytes, match: str) -> None:
    fd = os.open(key_path, os.O_WRONLY | os.O_CREAT, 0o600)
    os.write(fd, content)
    os.close(fd)
    with pytest.raises(IdentityError, match=match):
        load_identity(key_path)


def test_unreadable_key_file(key_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    create_identity(key_path)

    def denied(self: Path) -> bytes:  # root can read a mode-000 file, so simulate the OS refusing
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(Path, "read_bytes", denied)
    with pytest.raises(IdentityError, match="cannot be read"):
        load_identity(key_path)


def test_second_process_lock_is_refused(key_path: Path) -> None:
    first = create_identity(key_path)
    first.lock()
    try:
        with pytest.raises(IdentityError, match="already in use"):
            load_identity(key_path).lock()
    finally:
        first.unlock()
    load_identity(key_path).lock()  # free again once released
