"""The Hugging Face model a run names: where its files are, and the hash its starting weights must have.

`HFModelRef` is the part of a run's config that names an `hf` model: a local directory (every node
holds a copy of the same files) and the content hash of its weights (`causal_lm.weights_hash`). A
node checks its copy against that hash before it starts (`load_run_model`): one holding other
weights refuses, naming both hashes, so it never trains on, generates from or judges by a model
the run does not share. `run_tokenizer` is the directory's tokenizer, checked to fit the model;
`model_skeleton` builds the architecture without reading the weights, for the versions that
arrive through the weight broadcast.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import torch
from pydantic import BaseModel, ConfigDict, Field

from protocol.errors import ModelError
from training.causal_lm import weights_hash
from training.hf_model import HFCausalLM, hf_model_from_config, load_hf_model
from training.model_dir import check_model_dir
from training.tokenizer import HFTokenizer, check_vocab_fits

__all__ = ["HFModelRef", "load_run_model", "model_skeleton", "run_tokenizer"]


class HFModelRef(BaseModel):
    """A run's `hf` model: its directory on this node and the content hash of its starting weights."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    path: Path
    """The model directory (config.json, safetensors weights, tokenizer.json); each node its own copy."""
    weights_sha256: str = Field(pattern=r"^[0-9a-f]{64}$")
    """`weights_hash` of the starting weights (`hivenet model info DIR` prints it)."""

    @classmethod
    def of_directory(cls, path: Path | str) -> HFModelRef:
        """A reference to the model in `path` as it is now (the hash of the weights it holds)."""
        return cls(path=Path(path), weights_sha256=weights_hash(load_hf_model(path).state_dict()))


def load_run_model(
    ref: HFModelRef, *, dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu"
) -> HFCausalLM:
    """The run's starting model from this node's copy; ModelError if its weights are not the run's."""
    model = load_hf_model(ref.path, dtype=torch.float32)
    found = weights_hash(model.state_dict())
    if found != ref.weights_sha256:
        raise ModelError(
            f"the model in {ref.path} holds weights {found[:16]}..., but the run starts from "
            f"{ref.weights_sha256[:16]}...: every node of a run must hold the same starting weights; get "
            "the run's model directory (compare with `hivenet model info DIR`)"
        )
    check_vocab_fits(run_tokenizer(ref), model.vocab_size, str(ref.path))
    return model.to(device=device, dtype=dtype).eval()


@functools.lru_cache(maxsize=8)
def run_tokenizer(ref: HFModelRef) -> HFTokenizer:
    """The tokenizer saved with the run's model (loaded once per process)."""
    return HFTokenizer(ref.path)


@functools.lru_cache(maxsize=8)
def _config(ref: HFModelRef) -> Any:
    from transformers import AutoConfig

    info = check_model_dir(ref.path)
    try:
        return AutoConfig.from_pretrained(info.path, trust_remote_code=False, local_files_only=True)
    except Exception as e:  # a damaged config fails inside transformers, in many kinds
        raise ModelError(f"could not read {info.path / 'config.json'}: {e}") from e


def model_skeleton(ref: HFModelRef) -> HFCausalLM:
    """The run's architecture with placeholder weights (a policy version's state is loaded into it)."""
    return hf_model_from_config(_config(ref), seed=0)
