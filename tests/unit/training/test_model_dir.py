"""`hivenet model init` directories, and what loading a model directory refuses: missing files,
pickle checkpoints, remote code, foreign architectures and tokenizers that do not fit the model."""

from __future__ import annotations

import json
import pickle
import shutil
from pathlib import Path

import pytest
import torch

from protocol.errors import ModelError
from training.causal_lm import weights_hash
from training.hf_model import HFCausalLM, load_hf_model
from training.model_init import END_OF_TEXT, IM_END, init_model_dir
from training.tasks import get_task
from training.tokenizer import HFTokenizer, check_vocab_fits


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("weights-cache")


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory, cache: Path) -> Path:
    return init_model_dir(
        tmp_path_factory.mktemp("models") / "micro", size="micro", pretrain_steps=3, cache_dir=cache
    )


def test_an_initialised_directory_loads_like_a_downloaded_checkpoint(model_dir: Path) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    names = {p.name for p in model_dir.iterdir()}
    assert {"config.json", "model.safetensors", "tokenizer.json", "generation_config.json"} <= names
    model = load_hf_model(model_dir)
    assert isinstance(model, HFCausalLM) and model.family == "llama" and not model.training
    plain = AutoModelForCausalLM.from_pretrained(model_dir)
    assert weights_hash(plain.state_dict()) == weights_hash(model.state_dict())
    tokenizer = HFTokenizer(model_dir)
    raw = AutoTokenizer.from_pretrained(model_dir)
    assert tokenizer.stop_ids == {raw.convert_tokens_to_ids(IM_END), raw.convert_tokens_to_ids(END_OF_TEXT)}
    check_vocab_fits(tokenizer, model.vocab_size, str(model_dir))
    prompt = tokenizer.encode_prompt("Write 7 letters:\n")
    assert tokenizer.has_chat_template and tokenizer.decode(prompt).startswith("user\nWrite 7 letters:")


def test_worker_and_validator_tokenize_every_task_prompt_identically(model_dir: Path) -> None:
    worker, validator = HFTokenizer(model_dir), HFTokenizer(model_dir)
    for name in ("line-length", "arithmetic", "countdown"):
        on_worker, on_validator = get_task(name, worker), get_task(name, validator)
        assert on_worker.stop_ids == on_validator.stop_ids and worker.stop_ids <= on_worker.stop_ids
        for seed in range(25):
            prompt = on_worker.prompt(seed)
            assert prompt == on_validator.prompt(seed)
            # the reward reads its problem back from the prompt's tokens, through the chat template
            assert 0.0 <= on_validator.reward(prompt, worker.encode_prompt("12")[-3:]) <= 1.0


def test_the_same_arguments_give_the_same_weights_cached_or_not(
    model_dir: Path, cache: Path, tmp_path: Path
) -> None:
    again = init_model_dir(tmp_path / "again", size="micro", pretrain_steps=3, cache_dir=cache)
    fresh = init_model_dir(tmp_path / "fresh", size="micro", pretrain_steps=3, cache_dir=tmp_path / "cache")
    hashes = {weights_hash(load_hf_model(d).state_dict()) for d in (model_dir, again, fresh)}
    assert len(hashes) == 1
    other = init_model_dir(tmp_path / "other", size="micro", pretrain_steps=3, seed=1, cache_dir=cache)
    assert weights_hash(load_hf_model(other).state_dict()) not in hashes
    with pytest.raises(ModelError, match="already holds a model"):
        init_model_dir(again, size="micro", pretrain_steps=3, cache_dir=cache)


def _copy(model_dir: Path, tmp_path: Path) -> Path:
    target = tmp_path / "copy"
    shutil.copytree(model_dir, target)
    return target


def _edit_config(path: Path, **changes: object) -> None:
    config = json.loads((path / "config.json").read_text())
    config.update(changes)
    (path / "config.json").write_text(json.dumps(config))


class _Planted:
    """Unpickling this writes a marker file: proof that a pickle was loaded."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[object, tuple[str, str]]:
        return (Path.write_text, (str(self.marker), "unpickled"))  # type: ignore[return-value]


def test_a_pickle_checkpoint_is_refused_and_never_unpickled(model_dir: Path, tmp_path: Path) -> None:
    path = _copy(model_dir, tmp_path)
    marker = tmp_path / "ran"
    (path / "pytorch_model.bin").write_bytes(pickle.dumps(_Planted(marker)))
    load_hf_model(path)  # safetensors beside it: those are what load
    (path / "model.safetensors").unlink()
    with pytest.raises(ModelError, match=r"pickle checkpoints \(pytorch_model.bin\).*safetensors"):
        load_hf_model(path)
    assert not marker.exists()


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        (lambda p: (p / "config.json").unlink(), "no config.json"),
        (lambda p: (p / "config.json").write_text("{not json"), "not readable JSON"),
        (lambda p: _edit_config(p, auto_map={"AutoModelForCausalLM": "evil.Model"}), "remote code"),
        (lambda p: _edit_config(p, model_type="my-own-arch"), "cannot build as a causal LM"),
        (lambda p: (p / "tokenizer.json").unlink(), "no tokenizer.json"),
        (lambda p: (p / "model.safetensors").unlink(), r"no \*.safetensors weights"),
        (lambda p: (p / "model.safetensors").write_bytes(b"\0" * 64), "could not load the model"),
        (lambda p: shutil.rmtree(p), "does not exist"),
    ],
)
def test_a_broken_model_directory_is_one_clear_error(
    model_dir: Path, tmp_path: Path, damage, message
) -> None:
    path = _copy(model_dir, tmp_path)
    damage(path)
    with pytest.raises(ModelError, match=message):
        load_hf_model(path)


def test_a_tokenizer_larger_than_the_model_vocabulary_is_refused(model_dir: Path) -> None:
    tokenizer = HFTokenizer(model_dir)
    with pytest.raises(ModelError, match="do not belong together"):
        check_vocab_fits(tokenizer, tokenizer.vocab_size - 1, "DIR")


def test_a_model_runs_in_the_dtype_it_is_loaded_in(model_dir: Path) -> None:
    assert load_hf_model(model_dir, dtype=torch.bfloat16).dtype == torch.bfloat16
