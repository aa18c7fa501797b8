"""What a Hugging Face model directory must hold before hivenet loads anything from it.

`check_model_dir` reads only `config.json` and file names, never weights or code, and raises a
`ModelError` naming the problem and the fix for: a missing directory or file, a config that asks
for remote code (`auto_map`), an architecture `transformers` cannot build natively, a pickle
checkpoint (`*.bin`, `*.pt`, ...: loading one can run arbitrary code) without safetensors
weights beside it, and a missing fast tokenizer (`tokenizer.json`). Loading then uses
`trust_remote_code=False` and `use_safetensors=True` (`training.hf_model.load_hf_model`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from protocol.errors import ModelError

__all__ = ["PICKLE_SUFFIXES", "ModelDirInfo", "check_model_dir", "native_causal_lm_types"]

PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".pkl", ".pickle")
"""Checkpoint formats that `torch.load` unpickles (and so may run code hidden in them)."""

_MAX_CONFIG_BYTES = 1 << 20


@dataclass(frozen=True)
class ModelDirInfo:
    """What `check_model_dir` found."""

    path: Path
    model_type: str
    """`config.json`'s `model_type` (the architecture family, e.g. "llama", "qwen2", "gpt2")."""
    weight_files: tuple[str, ...]
    """The safetensors files the weights are loaded from."""


def native_causal_lm_types() -> frozenset[str]:
    """`model_type`s that `transformers` builds as causal LMs from its own code."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    return frozenset(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES)


def check_model_dir(path: Path | str) -> ModelDirInfo:
    """Check `path` is a loadable, code-free Hugging Face causal-LM directory; `ModelError` if not."""
    path = Path(path).expanduser()
    if not path.is_dir():
        raise ModelError(
            f"model directory {path} does not exist; pass the directory holding config.json "
            "(create a small one with `hivenet model init DIR`)"
        )
    config = _read_config(path)
    if "auto_map" in config:
        raise ModelError(
            f"{path / 'config.json'} asks for remote code (auto_map); hivenet never runs code from a "
            "checkpoint: use a model whose architecture transformers implements natively"
        )
    model_type = config.get("model_type")
    if not isinstance(model_type, str) or model_type not in native_causal_lm_types():
        raise ModelError(
            f"{path / 'config.json'} names model_type={model_type!r}, which transformers cannot build as "
            "a causal LM from its own code; use a Llama, Qwen2/Qwen3, Mistral or GPT-2 family model"
        )
    names = sorted(p.name for p in path.iterdir() if p.is_file())
    weights = tuple(n for n in names if n.endswith(".safetensors"))
    if not weights:
        pickles = [n for n in names if n.endswith(PICKLE_SUFFIXES)]
        if pickles:
            raise ModelError(
                f"{path} holds only pickle checkpoints ({', '.join(pickles)}), which can run code when "
                "loaded; hivenet loads safetensors only: convert it (load it where you trust it and "
                "`save_pretrained(DIR, safe_serialization=True)`)"
            )
        raise ModelError(f"{path} has no *.safetensors weights; save the model with save_pretrained")
    if "tokenizer.json" not in names:
        raise ModelError(
            f"{path} has no tokenizer.json (the fast tokenizer); save the model's tokenizer there with "
            "`AutoTokenizer.from_pretrained(...).save_pretrained(DIR)`"
        )
    return ModelDirInfo(path=path, model_type=model_type, weight_files=weights)


def _read_config(path: Path) -> dict[str, object]:
    config_path = path / "config.json"
    if not config_path.is_file():
        raise ModelError(f"{path} has no config.json; is it a Hugging Face model directory?")
    if config_path.stat().st_size > _MAX_CONFIG_BYTES:
        raise ModelError(f"{config_path} is over {_MAX_CONFIG_BYTES} bytes; it is not a model config")
    try:
        config = json.loads(config_path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ModelError(
            f"{config_path} is not readable JSON ({e}); restore it from the model's source"
        ) from e
    if not isinstance(config, dict):
        raise ModelError(f"{config_path} is not a JSON object; restore it from the model's source")
    return config
