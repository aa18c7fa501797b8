"""The on-disk chunk store: one folder per (run, version) with the manifest, the data file and a bitmap.

Layout: `<root>/<run_id>/<version>/manifest.bin` (the signed manifest, written first),
`data.safetensors` (preallocated to the full size, so a full disk fails at once with
DiskFull instead of leaving a corrupt file) and `bitmap.bin` (bit i set = chunk i is on
disk and verified). A chunk is checked against the manifest before it is written, and its
bit is set only after the write, so the bitmap never claims an unverified chunk. On
reopening (a restart), every chunk the bitmap claims is hashed again and dropped if it does
not match, so a download resumes from exactly the chunks that are really there.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import shutil
import threading
from collections.abc import Collection
from pathlib import Path
from typing import Any

from node.broadcast.errors import DiskFull, StoreError
from protocol.chunk_bitmap import bitmap_bytes, bitmap_count, bitmap_get, bitmap_set, parse_bitmap
from protocol.dht_keys import validate_run_id
from protocol.errors import InvalidMessage
from protocol.manifest import Manifest, parse_manifest

logger = logging.getLogger(__name__)

MANIFEST_FILE = "manifest.bin"
DATA_FILE = "data.safetensors"
BITMAP_FILE = "bitmap.bin"
_SPARE_DISK_BYTES = 16 * 1024 * 1024


def _raise_if_disk_full(exc: OSError, what: str, path: Path, needed_bytes: int) -> None:
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        raise DiskFull(
            f"no space left for {what} at {path} ({needed_bytes} bytes needed); free disk space, lower "
            "keep_versions, or point the store elsewhere"
        ) from None


class VersionEntry:
    """One version in the store: its verified manifest, data file and bitmap. Thread-safe writes."""

    def __init__(self, directory: Path, manifest: Manifest, bitmap: bytearray) -> None:
        self.directory = directory
        self.manifest = manifest
        self.bitmap = bitmap
        self.chunks_held = bitmap_count(bitmap)
        self._lock = threading.Lock()
        self._fd: int | None = os.open(directory / DATA_FILE, os.O_RDWR)
        self._bitmap_fd: int | None = os.open(directory / BITMAP_FILE, os.O_RDWR)

    @property
    def run_id(self) -> str:
        return self.manifest.run_id

    @property
    def version(self) -> int:
        return self.manifest.version

    @property
    def complete(self) -> bool:
        return self.chunks_held == self.manifest.num_chunks

    @property
    def data_path(self) -> Path:
        return self.directory / DATA_FILE

    @property
    def closed(self) -> bool:
        return self._fd is None

    def has(self, index: int) -> bool:
        return 0 <= index < self.manifest.num_chunks and bitmap_get(self.bitmap, index)

    def missing(self) -> list[int]:
        """Indices of the chunks not yet held."""
        return [i for i in range(self.manifest.num_chunks) if not bitmap_get(self.bitmap, i)]

    def write_chunk(self, index: int, data: bytes) -> bool:
        """Verify `data` as chunk `index`, write it and mark it held; False if it was already held.

        Raises InvalidMessage if it does not match the manifest (nothing is written), DiskFull
        if the disk is full (the bit stays clear), StoreError if the version was pruned.
        """
        self.manifest.check_chunk(index, data)
        with self._lock:  # held across the write: `close` must never free an fd a write is using
            if self._fd is None or self._bitmap_fd is None:
                raise StoreError(f"version {self.version} of run {self.run_id} was removed from the store")
            if bitmap_get(self.bitmap, index):
                return False
            try:
                written = os.pwrite(self._fd, data, self.manifest.chunk_offset(index))
            except OSError as exc:
                _raise_if_disk_full(exc, f"chunk {index}", self.data_path, len(data))
                raise
            if written != len(data):
                raise DiskFull(f"short write of chunk {index} to {self.data_path}; check free disk space")
            bitmap_set(self.bitmap, index)
            self.chunks_held += 1
            byte = index >> 3
            os.pwrite(self._bitmap_fd, bytes(self.bitmap[byte : byte + 1]), byte)
            if self.complete:
                os.fsync(self._fd)
                os.fsync(self._bitmap_fd)
        return True

    def read_chunk(self, index: int) -> bytes:
        """The bytes of a held chunk; StoreError if it is not held (or the version was pruned)."""
        fd = self._fd
        if fd is None or not self.has(index):
            raise StoreError(f"chunk {index} of version {self.version} is not held")
        size = self.manifest.chunk_size(index)
        data = os.pread(fd, size, self.manifest.chunk_offset(index))
        if len(data) != size:
            raise StoreError(f"chunk {index} of version {self.version} is truncated on disk")
        return data

    def close(self) -> None:
        with self._lock:
            for fd in (self._fd, self._bitmap_fd):
                if fd is not None:
                    os.close(fd)
            self._fd = self._bitmap_fd = None

    def load_state_dict(self) -> dict[str, Any]:
        """The published tensors (torch), read from the complete data file."""
        if not self.complete:
            raise StoreError(
                f"version {self.version} of run {self.run_id} holds {self.chunks_held}/{self.manifest.num_chunks} "
                "chunks; fetch it completely before loading"
            )
        from safetensors.torch import load_file  # torch is imported only when weights are loaded

        return load_file(str(self.data_path))


class ChunkStore:
    """All versions this node holds, under one root folder."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        self._entries: dict[tuple[str, int], VersionEntry] = {}

    def _directory(self, run_id: str, version: int) -> Path:
        return self.root / validate_run_id(run_id) / str(int(version))

    def get(self, run_id: str, version: int) -> VersionEntry | None:
        """The open entry for a version, opening (and re-verifying) it from disk if needed."""
        key = (run_id, int(version))
        entry = self._entries.get(key)
        if entry is not None:
            return entry
        directory = self._directory(run_id, version)
        if not (directory / MANIFEST_FILE).exists():
            return None
        entry = self._open(directory, run_id, int(version))
        if entry is not None:
            self._entries[key] = entry
        return entry

    def _open(self, directory: Path, run_id: str, version: int) -> VersionEntry | None:
        try:
            manifest = parse_manifest(
                (directory / MANIFEST_FILE).read_bytes(), run_id=run_id, version=version
            )
            bitmap = parse_bitmap((directory / BITMAP_FILE).read_bytes(), manifest.num_chunks)
            if (directory / DATA_FILE).stat().st_size != manifest.total_bytes:
                raise StoreError("data file has the wrong size")
        except (OSError, InvalidMessage, StoreError) as exc:
            logger.warning("discarding unreadable version %s/%s in the store: %s", run_id, version, exc)
            shutil.rmtree(directory, ignore_errors=True)
            return None
        # re-verify every chunk the bitmap claims: writes are not fsynced one by one
        dropped = 0
        with open(directory / DATA_FILE, "rb") as data:
            for index in range(manifest.num_chunks):
                if not bitmap_get(bitmap, index):
                    continue
                data.seek(manifest.chunk_offset(index))
                try:
                    manifest.check_chunk(index, data.read(manifest.chunk_size(index)))
                except InvalidMessage:
                    bitmap[index >> 3] &= ~(1 << (index & 7)) & 0xFF
                    dropped += 1
        if dropped:
            logger.warning("dropped %d chunks of %s/%s that failed re-verification", dropped, run_id, version)
            (directory / BITMAP_FILE).write_bytes(bytes(bitmap))
        return VersionEntry(directory, manifest, bitmap)

    def create(self, manifest: Manifest) -> VersionEntry:
        """Open the entry for a verified manifest, creating its folder and preallocated data file if new.

        A version is one content: if the store already holds this content id (under any
        publisher's manifest), that entry is returned. Raises StoreError if it holds other
        content for the version, DiskFull (leaving nothing behind) if the version does not fit on disk.
        """
        existing = self.get(manifest.run_id, manifest.version)
        if existing is not None:
            if existing.manifest.content_id != manifest.content_id:
                raise StoreError(
                    f"the store holds other content for version {manifest.version} of run {manifest.run_id}; "
                    "remove it with `prune` or use a fresh store"
                )
            return existing
        directory = self._directory(manifest.run_id, manifest.version)
        free = shutil.disk_usage(self.root).free
        if free < manifest.total_bytes + _SPARE_DISK_BYTES:
            raise DiskFull(
                f"version {manifest.version} of run {manifest.run_id} needs {manifest.total_bytes} bytes but "
                f"{self.root} has {free} free; free disk space, lower keep_versions or point the store elsewhere"
            )
        partial = directory.with_name(directory.name + ".partial")
        shutil.rmtree(partial, ignore_errors=True)
        partial.mkdir(parents=True)
        try:
            with open(partial / DATA_FILE, "wb") as data:
                try:
                    os.posix_fallocate(data.fileno(), 0, manifest.total_bytes)
                except OSError as exc:
                    _raise_if_disk_full(exc, f"version {manifest.version}", partial, manifest.total_bytes)
                    if exc.errno not in (errno.EOPNOTSUPP, errno.EINVAL):
                        raise
                    data.truncate(manifest.total_bytes)
            (partial / BITMAP_FILE).write_bytes(bytes(bitmap_bytes(manifest.num_chunks)))
            (partial / MANIFEST_FILE).write_bytes(manifest.raw)
        except BaseException:
            shutil.rmtree(partial, ignore_errors=True)
            raise
        os.replace(partial, directory)
        entry = VersionEntry(directory, manifest, bytearray(bitmap_bytes(manifest.num_chunks)))
        self._entries[(manifest.run_id, manifest.version)] = entry
        return entry

    def adopt_complete(self, manifest: Manifest, data_path: Path) -> VersionEntry:
        """Move a file that `manifest` describes (the publisher's own) into the store as a complete version.

        The file must be on the store's filesystem; every chunk is checked against the manifest first.
        """
        if self.get(manifest.run_id, manifest.version) is not None:
            raise StoreError(f"version {manifest.version} of run {manifest.run_id} is already in the store")
        with open(data_path, "rb") as data:
            for index in range(manifest.num_chunks):
                manifest.check_chunk(index, data.read(manifest.chunk_size(index)))
            if data.read(1):
                raise StoreError(f"{data_path} is longer than its manifest says")
        directory = self._directory(manifest.run_id, manifest.version)
        partial = directory.with_name(directory.name + ".partial")
        shutil.rmtree(partial, ignore_errors=True)
        partial.mkdir(parents=True)
        bitmap = bytearray(b"\xff" * bitmap_bytes(manifest.num_chunks))
        spare = len(bitmap) * 8 - manifest.num_chunks
        if spare:
            bitmap[-1] = 0xFF >> spare
        try:
            os.replace(data_path, partial / DATA_FILE)
            (partial / BITMAP_FILE).write_bytes(bytes(bitmap))
            (partial / MANIFEST_FILE).write_bytes(manifest.raw)
        except OSError as exc:
            shutil.rmtree(partial, ignore_errors=True)
            _raise_if_disk_full(exc, f"version {manifest.version}", partial, manifest.total_bytes)
            raise
        os.replace(partial, directory)
        entry = VersionEntry(directory, manifest, bitmap)
        self._entries[(manifest.run_id, manifest.version)] = entry
        return entry

    def versions(self, run_id: str) -> list[int]:
        """Versions of `run_id` on disk, oldest first."""
        run_dir = self.root / validate_run_id(run_id)
        if not run_dir.is_dir():
            return []
        return sorted(
            int(p.name) for p in run_dir.iterdir() if p.name.isdigit() and (p / MANIFEST_FILE).exists()
        )

    def remove(self, run_id: str, version: int) -> None:
        """Delete a version from disk (its open entry stops serving at once)."""
        entry = self._entries.pop((run_id, int(version)), None)
        if entry is not None:
            entry.close()
        shutil.rmtree(self._directory(run_id, version), ignore_errors=True)

    def prune(self, run_id: str, keep_versions: int, protect: Collection[int] = ()) -> list[int]:
        """Delete all but the newest `keep_versions` versions of `run_id` (never those in `protect`)."""
        versions = self.versions(run_id)
        doomed = [v for v in versions[: max(0, len(versions) - keep_versions)] if v not in protect]
        for version in doomed:
            self.remove(run_id, version)
        return doomed

    def close(self) -> None:
        for entry in self._entries.values():
            entry.close()
        self._entries.clear()

    def __enter__(self) -> ChunkStore:
        return self

    def __exit__(self, *exc: object) -> None:
        with contextlib.suppress(Exception):
            self.close()
