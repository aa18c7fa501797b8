"""Unit tests of the chunk store (verify before write, resume, prune, full disk) and of capped framing."""

from __future__ import annotations

import asyncio
import errno
import os
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from node.broadcast.errors import DiskFull
from node.broadcast.publish import prepare_state_dict, read_safetensors_layout
from node.broadcast.store import DATA_FILE, ChunkStore
from node.broadcast.wire import encode_frame, read_frame, read_payload
from protocol.errors import InvalidMessage
from protocol.manifest import parse_manifest
from tests.helpers.broadcast import assert_state_dicts_equal, make_state_dict

CHUNK = 16 * 1024


def _published(tmp_path: Path, version: int = 1) -> tuple[ChunkStore, bytes]:
    """A publisher store holding one version; returns it and the version's manifest bytes."""
    store = ChunkStore(tmp_path / "publisher")
    entry = prepare_state_dict(
        store,
        Ed25519PrivateKey.generate(),
        run_id="r",
        version=version,
        state_dict=make_state_dict(version),
        chunk_bytes=CHUNK,
    )
    return store, entry.manifest.raw


def test_publish_layout_and_load(tmp_path: Path) -> None:
    store, _ = _published(tmp_path)
    entry = store.get("r", 1)
    assert entry is not None and entry.complete
    assert_state_dicts_equal(entry.load_state_dict(), make_state_dict(1))
    layout = {t.name: t for t in entry.manifest.tensors}
    assert layout == {t.name: t for t in read_safetensors_layout(entry.data_path)}
    assert layout["block.0.mlp.weight"].dtype == "BF16"


def test_chunks_are_verified_before_write_and_resume_keeps_only_good_chunks(tmp_path: Path) -> None:
    source, raw = _published(tmp_path)
    src = source.get("r", 1)
    assert src is not None
    manifest = parse_manifest(raw)
    store = ChunkStore(tmp_path / "fetcher")
    entry = store.create(manifest)
    assert entry.chunks_held == 0 and (entry.directory / DATA_FILE).stat().st_size == manifest.total_bytes

    with pytest.raises(InvalidMessage):
        entry.write_chunk(0, b"\x00" * manifest.chunk_size(0))
    assert not entry.has(0)
    for index in range(0, manifest.num_chunks, 2):
        assert entry.write_chunk(index, src.read_chunk(index))
    assert not entry.write_chunk(0, src.read_chunk(0))  # duplicate
    held = entry.chunks_held
    store.close()

    # corrupt one chunk the bitmap claims, as a crash between data and bitmap writes could
    with open(entry.directory / DATA_FILE, "r+b") as data:
        data.seek(manifest.chunk_offset(2))
        data.write(b"\xff" * 10)
    reopened = ChunkStore(tmp_path / "fetcher").get("r", 1)
    assert reopened is not None
    assert reopened.chunks_held == held - 1 and not reopened.has(2) and reopened.has(0)
    assert reopened.missing() == [i for i in range(manifest.num_chunks) if i % 2 == 1 or i == 2]
    for index in reopened.missing():
        reopened.write_chunk(index, src.read_chunk(index))
    assert reopened.complete
    assert_state_dicts_equal(reopened.load_state_dict(), make_state_dict(1))


def test_prune_keeps_the_newest_versions(tmp_path: Path) -> None:
    store = ChunkStore(tmp_path / "s")
    key = Ed25519PrivateKey.generate()
    for version in (1, 2, 3, 4):
        prepare_state_dict(
            store,
            key,
            run_id="r",
            version=version,
            state_dict=make_state_dict(version, 4000),
            chunk_bytes=CHUNK,
        )
    assert store.prune("r", keep_versions=2, protect={1}) == [2]
    assert store.versions("r") == [1, 3, 4]
    assert store.prune("r", keep_versions=2) == [1]
    assert store.versions("r") == [3, 4] and store.get("r", 1) is None
    assert not (tmp_path / "s" / "r" / "1").exists()


def test_full_disk_is_a_clear_error_and_leaves_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _, raw = _published(tmp_path)
    store = ChunkStore(tmp_path / "full")

    def no_space(fd: int, offset: int, length: int) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "posix_fallocate", no_space)
    with pytest.raises(DiskFull, match="no space left"):
        store.create(parse_manifest(raw))
    assert store.versions("r") == [] and list((tmp_path / "full" / "r").iterdir()) == []


def test_frames_and_payloads_are_capped_before_buffering() -> None:
    async def main() -> None:
        reader = asyncio.StreamReader()
        reader.feed_data((10**9).to_bytes(4, "big") + b"only a few bytes")  # claims 1 GB, never sends it
        with pytest.raises(InvalidMessage, match="exceeds"):
            await asyncio.wait_for(read_frame(reader, 1024), timeout=5)

        reader = asyncio.StreamReader()
        reader.feed_data(b"abc")
        with pytest.raises(InvalidMessage, match="declared"):
            await asyncio.wait_for(
                read_payload(reader, declared_bytes=10**9, expected_bytes=CHUNK), timeout=5
            )

        reader = asyncio.StreamReader()
        reader.feed_data(encode_frame(b"hello"))
        reader.feed_eof()
        assert await read_frame(reader, 1024) == b"hello"
        assert await read_frame(reader, 1024) is None

    asyncio.run(main())


def test_bans_grow_with_each_offence() -> None:
    from hivemind.p2p import PeerID

    from node.bans import BanList

    bans = BanList(base_s=10.0, max_s=25.0)
    peer = PeerID(b"\x00\x24" + bytes(36))
    assert not bans.is_banned(peer)
    assert bans.ban(peer, "bad chunk: 1") == 10.0
    assert bans.is_banned(peer) and bans.strikes(peer) == 1
    assert bans.ban(peer, "bad chunk: 2") == 20.0
    assert bans.ban(peer, "bad request: 3") == 25.0  # capped
    assert bans.reasons == {"bad chunk": 2, "bad request": 1}
