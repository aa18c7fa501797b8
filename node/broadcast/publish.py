"""Publishing: serialise weights to safetensors, cut them into chunks, hash them and sign the manifest.

`prepare_file` turns a safetensors file into a signed manifest plus a complete entry in the
chunk store (the file is copied in, or moved with `move=True`); `serialize_state_dict` writes
a torch state dict as safetensors (torch is imported only here, lazily).
"""

from __future__ import annotations

import json
import os
import shutil
import time
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from node.broadcast.errors import DiskFull
from node.broadcast.store import ChunkStore, VersionEntry
from protocol.errors import ConfigError
from protocol.limits import MAX_MANIFEST_TENSORS
from protocol.manifest import TensorInfo, build_manifest, check_chunk_bytes, sha256

_MAX_SAFETENSORS_HEADER_BYTES = 100 * 1024 * 1024


def read_safetensors_layout(path: Path) -> list[TensorInfo]:
    """The tensors of a safetensors file with their absolute byte ranges; ConfigError if it is not one."""
    size = path.stat().st_size
    with open(path, "rb") as handle:
        prefix = handle.read(8)
        if len(prefix) != 8:
            raise ConfigError(f"{path} is not a safetensors file (too short)")
        header_bytes = int.from_bytes(prefix, "little")
        if header_bytes > min(_MAX_SAFETENSORS_HEADER_BYTES, size - 8):
            raise ConfigError(f"{path} is not a safetensors file (bad header length)")
        try:
            header = json.loads(handle.read(header_bytes))
        except (UnicodeDecodeError, json.JSONDecodeError):
            raise ConfigError(f"{path} is not a safetensors file (header is not JSON)") from None
    if not isinstance(header, dict):
        raise ConfigError(f"{path} is not a safetensors file (header is not a JSON object)")
    base = 8 + header_bytes
    tensors = []
    for name, info in header.items():
        if name == "__metadata__":
            continue
        try:
            begin, end = (int(x) for x in info["data_offsets"])
            tensors.append(
                TensorInfo(
                    name, str(info["dtype"]), tuple(int(d) for d in info["shape"]), base + begin, base + end
                )
            )
        except (KeyError, TypeError, ValueError):
            raise ConfigError(f"{path} is not a safetensors file (bad entry for {name!r})") from None
        if not (base <= base + begin <= base + end <= size):
            raise ConfigError(f"{path} is truncated: tensor {name!r} lies outside the file")
    if len(tensors) > MAX_MANIFEST_TENSORS:
        raise ConfigError(
            f"{path} holds {len(tensors)} tensors; at most {MAX_MANIFEST_TENSORS} can be published"
        )
    return tensors


def hash_chunks(path: Path, chunk_bytes: int) -> bytes:
    """The SHA-256 of every `chunk_bytes` piece of the file, concatenated."""
    hashes = bytearray()
    with open(path, "rb") as handle:
        while piece := handle.read(chunk_bytes):
            hashes += sha256(piece)
    return bytes(hashes)


def serialize_state_dict(state_dict: Mapping[str, Any], path: Path) -> None:
    """Write a torch state dict as a safetensors file (tensors made contiguous, on CPU)."""
    from safetensors.torch import save_file

    tensors = {name: tensor.detach().to("cpu").contiguous() for name, tensor in state_dict.items()}
    try:
        save_file(tensors, str(path))
    except OSError as exc:
        path.unlink(missing_ok=True)
        raise DiskFull(f"could not write {path}: {exc}; free disk space") from None


def prepare_file(
    store: ChunkStore,
    private_key: Ed25519PrivateKey,
    *,
    run_id: str,
    version: int,
    path: Path,
    chunk_bytes: int,
    move: bool = False,
) -> VersionEntry:
    """Sign a manifest for the safetensors file at `path` and put the file into the store as a complete version."""
    check_chunk_bytes(chunk_bytes)
    if version < 0:
        raise ConfigError(f"version must be >= 0, got {version}")
    tensors = read_safetensors_layout(path)
    total_bytes = path.stat().st_size
    manifest = build_manifest(
        private_key,
        run_id=run_id,
        version=version,
        total_bytes=total_bytes,
        chunk_bytes=chunk_bytes,
        chunk_hashes=hash_chunks(path, chunk_bytes),
        tensors=tensors,
        created_at=time.time(),
    )
    if store.get(run_id, version) is not None:
        raise ConfigError(f"version {version} of run {run_id} is already in the store; publish a new version")
    if move:
        staged = path
    else:
        staged = store.root / f".staging-{uuid.uuid4().hex}.safetensors"
        try:
            shutil.copyfile(path, staged)
        except OSError as exc:
            staged.unlink(missing_ok=True)
            raise DiskFull(f"could not copy {path} into the store: {exc}; free disk space") from None
    try:
        return store.adopt_complete(manifest, staged)
    finally:
        if staged.exists() and not move:
            os.unlink(staged)


def prepare_state_dict(
    store: ChunkStore,
    private_key: Ed25519PrivateKey,
    *,
    run_id: str,
    version: int,
    state_dict: Mapping[str, Any],
    chunk_bytes: int,
) -> VersionEntry:
    """Serialise `state_dict` (safetensors), sign its manifest and store it as a complete version."""
    staged = store.root / f".staging-{uuid.uuid4().hex}.safetensors"
    serialize_state_dict(state_dict, staged)
    try:
        return prepare_file(
            store,
            private_key,
            run_id=run_id,
            version=version,
            path=staged,
            chunk_bytes=chunk_bytes,
            move=True,
        )
    finally:
        staged.unlink(missing_ok=True)
