"""Turning a task's text (or chat messages) into token ids and back, the same way on every node.

`Tokenizer` is what tasks and the RL loop need: `encode_prompt` (a plain prompt, or chat messages
rendered with the model's chat template and the assistant's turn opened), `decode`, and the
token ids that end a completion (`stop_ids`: the model's EOS tokens). Worker and validator each
derive a prompt's ids themselves with the same tokenizer files, so they agree on them exactly.

- `ByteTokenizer`: `TinyGPT`'s vocabulary, one token per UTF-8 byte; no chat template (messages
  are joined by lines) and no EOS token. It decodes one character per byte (latin-1), so that
  text lengths count bytes and decoding loses nothing.
- `HFTokenizer`: the fast tokenizer saved in a model directory (`tokenizer.json`), its chat
  template and its EOS token(s), including those of `generation_config.json`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from protocol.errors import ModelError

__all__ = ["ByteTokenizer", "HFTokenizer", "Prompt", "Tokenizer", "check_vocab_fits"]

Prompt = str | Sequence[Mapping[str, str]]
"""A task's prompt: plain text, or chat messages (`{"role": ..., "content": ...}`)."""


@runtime_checkable
class Tokenizer(Protocol):
    """Text to token ids and back for one model (see the module docstring)."""

    @property
    def vocab_size(self) -> int:
        """Number of token ids the tokenizer can produce."""
        ...

    @property
    def stop_ids(self) -> frozenset[int]:
        """Token ids that end a completion (kept in it)."""
        ...

    def encode_prompt(self, prompt: Prompt) -> list[int]:
        """Token ids of a prompt, ready for the model to continue."""
        ...

    def decode(self, ids: Sequence[int]) -> str:
        """Text of `ids` (stop tokens and other special tokens left out)."""
        ...


class ByteTokenizer:
    """One token per UTF-8 byte (`TinyGPT`'s vocabulary of 256)."""

    vocab_size = 256
    stop_ids: frozenset[int] = frozenset()

    def encode_prompt(self, prompt: Prompt) -> list[int]:
        text = prompt if isinstance(prompt, str) else "\n".join(m["content"] for m in prompt) + "\n"
        return list(text.encode("utf-8"))

    def decode(self, ids: Sequence[int]) -> str:
        """One character per byte; ValueError for an id that is not a byte."""
        if not all(0 <= int(i) < 256 for i in ids):
            raise ValueError("byte-level token ids must be in 0..255")
        return bytes(int(i) for i in ids).decode("latin-1")


class HFTokenizer:
    """The fast tokenizer of a Hugging Face model directory (no code from the directory runs)."""

    def __init__(self, path: Path | str) -> None:
        from transformers import AutoTokenizer

        path = Path(path)
        if not (path / "tokenizer.json").is_file():
            raise ModelError(f"{path} has no tokenizer.json; save the model's fast tokenizer there")
        try:
            self._tok: Any = AutoTokenizer.from_pretrained(
                path, trust_remote_code=False, local_files_only=True, use_fast=True
            )
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise ModelError(f"could not load the tokenizer in {path}: {e}; check tokenizer.json") from e
        self._stop_ids = frozenset(_eos_ids(self._tok, path))

    @property
    def vocab_size(self) -> int:
        return len(self._tok)

    @property
    def stop_ids(self) -> frozenset[int]:
        return self._stop_ids

    @property
    def has_chat_template(self) -> bool:
        """Whether the model directory ships a chat template (then every prompt is chat-formatted)."""
        return bool(getattr(self._tok, "chat_template", None))

    def encode_prompt(self, prompt: Prompt) -> list[int]:
        if self.has_chat_template:
            messages = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else list(prompt)
            ids = self._tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
            if isinstance(ids, Mapping) or hasattr(ids, "keys"):
                ids = ids["input_ids"]
            return [int(i) for i in ids]
        text = prompt if isinstance(prompt, str) else "\n".join(m["content"] for m in prompt) + "\n"
        return [int(i) for i in self._tok.encode(text, add_special_tokens=True)]

    def encode(self, text: str) -> list[int]:
        """Ids of plain `text`, without special tokens (pretraining data)."""
        return [int(i) for i in self._tok.encode(text, add_special_tokens=False)]

    def decode(self, ids: Sequence[int]) -> str:
        return str(self._tok.decode([int(i) for i in ids], skip_special_tokens=True))


def _eos_ids(tok: Any, path: Path) -> set[int]:
    ids: set[int] = set()
    if tok.eos_token_id is not None:
        ids.add(int(tok.eos_token_id))
    generation_config = path / "generation_config.json"
    if generation_config.is_file():
        try:
            eos = json.loads(generation_config.read_text(encoding="utf-8")).get("eos_token_id")
        except (OSError, ValueError, AttributeError):
            eos = None
        for value in eos if isinstance(eos, list) else [eos]:
            if isinstance(value, int) and not isinstance(value, bool) and 0 <= value < len(tok):
                ids.add(value)
    return ids


def check_vocab_fits(tokenizer: Tokenizer, model_vocab_size: int, where: str) -> None:
    """ModelError unless every id the tokenizer can produce has a row in the model's embedding."""
    if tokenizer.vocab_size > model_vocab_size:
        raise ModelError(
            f"the tokenizer in {where} has {tokenizer.vocab_size} tokens but the model only "
            f"{model_vocab_size} embedding rows: they do not belong together; use the tokenizer saved "
            "with the model"
        )
