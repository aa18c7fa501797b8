"""`hivenet model init`: a small, real Hugging Face model directory built on this machine.

`init_model_dir` writes what a downloaded checkpoint holds, so that `from_pretrained(DIR)` and
every `--model DIR` option work exactly as with one:

* a byte-level BPE tokenizer trained with `tokenizers` on the default corpus, with an
  end-of-text token and a ChatML chat template (`tokenizer.json`, `tokenizer_config.json`);
* a Llama- or Qwen2-family `config.json` of the chosen size (`SIZES`);
* weights from a brief, seeded pretraining on the corpus, run on one thread so that the same
  arguments give the same weights on any machine, and cached by those arguments;
* `model.safetensors` and `generation_config.json` (its EOS tokens), via `save_pretrained`.
"""

from __future__ import annotations

import hashlib
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import torch
from platformdirs import user_cache_dir
from safetensors.torch import load_model, save_model

from protocol.errors import ConfigError, ModelError
from training.data import DataConfig, load_corpus
from training.hf_model import HFCausalLM, hf_model_from_config
from training.rl_sync import one_torch_thread

__all__ = ["CHAT_TEMPLATE", "FAMILIES", "SIZES", "check_target", "init_model_dir"]

logger = logging.getLogger(__name__)

Family = Literal["llama", "qwen2"]
FAMILIES: tuple[Family, ...] = ("llama", "qwen2")


@dataclass(frozen=True)
class ModelShape:
    """The shape of a model `init_model_dir` builds."""

    hidden: int
    layers: int
    heads: int
    kv_heads: int
    mlp: int
    vocab: int
    positions: int


SIZES: dict[str, ModelShape] = {
    "micro": ModelShape(hidden=64, layers=2, heads=4, kv_heads=2, mlp=176, vocab=512, positions=256),
    "tiny": ModelShape(hidden=256, layers=4, heads=4, kv_heads=2, mlp=688, vocab=2048, positions=512),
}
"""Model shapes by name: `micro` (~0.1M parameters, for tests) and `tiny` (~3.4M, the demo's)."""

END_OF_TEXT, IM_START, IM_END = "<|endoftext|>", "<|im_start|>", "<|im_end|>"

CHAT_TEMPLATE = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + "
    "'<|im_end|>' + '\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
"""ChatML, the format of Qwen's templates."""

_FORMAT = "hivenet-model-init-v1"
_TOKENIZER_TEXT_CHARS_PER_TOKEN = 1000  # text the tokenizer is trained on, per vocabulary entry
_PRETRAIN_DATA = DataConfig(seq_len=128, batch_size=16)


def init_model_dir(
    path: Path | str,
    *,
    family: Family = "llama",
    size: str = "tiny",
    seed: int = 0,
    pretrain_steps: int = 300,
    lr: float = 3e-3,
    cache_dir: Path | None = None,
    progress: Callable[[int, int, float], None] | None = None,
) -> Path:
    """Write a model directory at `path` (created; must not hold a model already) and return it.

    `progress(step, steps, loss)` is called during pretraining (not when the weights are cached).
    """
    if family not in FAMILIES:
        raise ConfigError(f"unknown family {family!r}; choose one of {', '.join(FAMILIES)}")
    if size not in SIZES:
        raise ConfigError(f"unknown size {size!r}; choose one of {', '.join(SIZES)}")
    path = check_target(path)
    shape = SIZES[size]
    corpus = load_corpus(_PRETRAIN_DATA)
    text = corpus.blocks.flatten().numpy().tobytes().decode("utf-8", errors="replace")
    tokenizer = _train_tokenizer(text[: _TOKENIZER_TEXT_CHARS_PER_TOKEN * shape.vocab], shape.vocab)
    config = _config(family, shape, tokenizer)
    key_text = "|".join([_FORMAT, family, size, str(seed), str(pretrain_steps), repr(lr), corpus.name])
    key = hashlib.sha256(key_text.encode()).hexdigest()[:20]
    cached = (cache_dir or Path(user_cache_dir("hivenet")) / "models") / f"{family}-{size}-{key}.safetensors"
    model = _cached_model(cached, config, seed)
    if model is None:
        model = hf_model_from_config(config, seed=seed)
        with one_torch_thread():
            _pretrain(model, tokenizer, text, steps=pretrain_steps, seed=seed, lr=lr, progress=progress)
        cached.parent.mkdir(parents=True, exist_ok=True)
        tmp = cached.with_suffix(f".tmp{os.getpid()}")
        save_model(model.hf, str(tmp))  # safetensors' own handling of the tied embedding and head
        tmp.replace(cached)
    path.mkdir(parents=True, exist_ok=True)
    model.hf.save_pretrained(path, safe_serialization=True)
    tokenizer.save_pretrained(path)
    return path


def check_target(path: Path | str) -> Path:
    """`path`, if a model directory may be written there; ModelError if it already holds a model."""
    path = Path(path).expanduser()
    if (path / "config.json").exists():
        raise ModelError(f"{path} already holds a model; choose an empty directory or delete it")
    return path


def _cached_model(cached: Path, config: Any, seed: int) -> HFCausalLM | None:
    """The pretrained model in the cache, or None (a torn or foreign file is deleted)."""
    if not cached.exists():
        return None
    model = hf_model_from_config(config, seed=seed)
    try:
        load_model(model.hf, str(cached))
    except Exception as e:  # a torn or foreign cache file raises many kinds: retrain over it
        logger.warning("ignoring unreadable cached weights %s (%s)", cached, e)
        cached.unlink(missing_ok=True)
        return None
    return model.eval()


def _train_tokenizer(text: str, vocab_size: int) -> Any:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[END_OF_TEXT, IM_START, IM_END],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    lines = text.splitlines(keepends=True)
    bpe.train_from_iterator((("".join(lines[i : i + 64])) for i in range(0, len(lines), 64)), trainer=trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=bpe,
        eos_token=END_OF_TEXT,
        pad_token=END_OF_TEXT,
        chat_template=CHAT_TEMPLATE,
        model_max_length=max(shape.positions for shape in SIZES.values()),
    )


def _config(family: Family, shape: ModelShape, tokenizer: Any) -> Any:
    from transformers import LlamaConfig, Qwen2Config

    eos = [tokenizer.convert_tokens_to_ids(IM_END), tokenizer.convert_tokens_to_ids(END_OF_TEXT)]
    common: dict[str, Any] = {
        "vocab_size": len(tokenizer),
        "hidden_size": shape.hidden,
        "intermediate_size": shape.mlp,
        "num_hidden_layers": shape.layers,
        "num_attention_heads": shape.heads,
        "num_key_value_heads": shape.kv_heads,
        "max_position_embeddings": shape.positions,
        "tie_word_embeddings": True,
        "bos_token_id": None,
        "eos_token_id": eos,
        "pad_token_id": tokenizer.convert_tokens_to_ids(END_OF_TEXT),
    }
    return LlamaConfig(**common) if family == "llama" else Qwen2Config(**common)


def _pretrain(
    model: HFCausalLM,
    tokenizer: Any,
    text: str,
    *,
    steps: int,
    seed: int,
    lr: float,
    progress: Callable[[int, int, float], None] | None,
) -> None:
    if steps <= 0:
        return
    window = min(_PRETRAIN_DATA.seq_len, model.max_seq_len - 1) + 1
    needed_chars = steps * _PRETRAIN_DATA.batch_size * window * 16  # ~4 characters a token, 4 times over
    ids = torch.tensor(tokenizer.backend_tokenizer.encode(text[:needed_chars]).ids, dtype=torch.long)
    generator = torch.Generator().manual_seed(seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    model.train()
    for step in range(steps):
        starts = torch.randint(0, len(ids) - window, (_PRETRAIN_DATA.batch_size,), generator=generator)
        batch = torch.stack([ids[s : s + window] for s in starts.tolist()])
        for group in optimizer.param_groups:  # linear warm-up over the first tenth, then constant
            group["lr"] = lr * min(1.0, (step + 1) / max(1, steps // 10))
        loss = model.loss(batch[:, :-1], batch[:, 1:])
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        if progress is not None:
            progress(step + 1, steps, loss.item())
    model.eval()
