"""A run names its Hugging Face model by the hash of its starting weights: a node holding other
weights refuses to start, and versions arriving by broadcast load into the run's architecture."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from cli.rl import build_rl_config
from protocol.errors import ConfigError, ModelError
from protocol.verification_policy import EXACT_POLICY, PAPER_POLICY, RunVerification
from training.causal_lm import weights_hash
from training.hf_model import HFCausalLM
from training.model_init import init_model_dir
from training.rl_run import RLRunConfig, initial_policy, model_from_state, run_tokenizer
from training.run_model import HFModelRef, load_run_model
from training.tokenizer import ByteTokenizer, HFTokenizer
from verification.policy_file import save_policy_file


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return init_model_dir(tmp_path_factory.mktemp("models") / "micro", size="micro", pretrain_steps=2)


def test_a_copy_with_other_weights_is_refused_naming_both_hashes(model_dir: Path) -> None:
    ref = HFModelRef.of_directory(model_dir)
    assert weights_hash(load_run_model(ref).state_dict()) == ref.weights_sha256
    wrong = HFModelRef(path=model_dir, weights_sha256="0" * 64)
    with pytest.raises(
        ModelError, match=rf"holds weights {ref.weights_sha256[:16]}.*starts from 0000000000000000"
    ):
        load_run_model(wrong)
    with pytest.raises(ModelError, match="same starting weights"):
        build_rl_config("r", model_dir=str(model_dir), model_sha256="a" * 64)
    with pytest.raises(ConfigError, match="not a SHA-256"):
        build_rl_config("r", model_dir=str(model_dir), model_sha256="abc")
    with pytest.raises(ConfigError, match="pass the directory too"):
        build_rl_config("r", model_sha256="a" * 64)


def test_the_run_config_names_the_model_and_every_role_builds_it_from_that(model_dir: Path) -> None:
    config = build_rl_config("r", model_dir=str(model_dir), task="arithmetic")
    assert isinstance(config, RLRunConfig) and config.hf_model is not None
    assert RLRunConfig.model_validate_json(config.model_dump_json()) == config
    assert isinstance(run_tokenizer(config), HFTokenizer)
    policy = initial_policy(config)
    assert isinstance(policy, HFCausalLM)
    version = model_from_state(config, policy.state_dict(), torch.float32)
    assert not version.training and weights_hash(version.state_dict()) == weights_hash(policy.state_dict())
    assert model_from_state(config, policy.state_dict(), torch.bfloat16).dtype == torch.bfloat16
    tiny = build_rl_config("r", model_dir="tiny")
    assert tiny.hf_model is None and isinstance(run_tokenizer(tiny), ByteTokenizer)


def test_an_unknown_task_or_a_missing_model_directory_is_refused_before_anything_runs(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="unknown task 'nope'"):
        build_rl_config("r", task="nope")
    with pytest.raises(ModelError, match="does not exist"):
        build_rl_config("r", model_dir=str(tmp_path / "missing"))


def test_a_corpus_for_a_hugging_face_model_is_cut_into_its_tokens(model_dir: Path) -> None:
    from training.data import DataConfig, load_corpus
    from training.run_model import run_tokenizer

    tokenizer = run_tokenizer(HFModelRef.of_directory(model_dir))
    config = DataConfig(source="stdlib", max_corpus_bytes=100_000, block_bytes=256, seq_len=32, batch_size=2)
    corpus = load_corpus(config, tokenizer.encode)
    batch = corpus.sampler(0, 2).next_batch()
    assert batch.shape == (2, 33) and int(batch.max()) < tokenizer.vocab_size
    assert int(corpus.blocks.max()) > 255  # merged BPE tokens, not bytes
    text = tokenizer.decode(corpus.blocks[0].tolist())
    assert text and tokenizer.encode(text)[:8] == corpus.blocks[0, :8].tolist()


def test_a_diloco_trainer_config_names_the_model_the_same_way(model_dir: Path) -> None:
    from cli.rl import hf_model_option
    from cli.train import build_trainer_config

    ref = hf_model_option(str(model_dir), None)
    config = build_trainer_config("r", hf_model=ref)
    assert config.hf_model == ref and hf_model_option("tiny", None) is None
    assert build_trainer_config("r", hf_model=None).hf_model is None


def test_an_uncalibrated_model_gets_the_papers_limits_and_a_policy_must_fit_the_run(
    model_dir: Path, tmp_path: Path
) -> None:
    tiny = build_rl_config("r", worker_dtype="bfloat16")
    assert tiny.run_verification.for_claim("bfloat16", "cpu") == EXACT_POLICY
    hf = build_rl_config("r", model_dir=str(model_dir), worker_dtype="bfloat16")
    assert hf.run_verification.model == "uncalibrated"
    assert hf.run_verification.for_claim("bfloat16", "cuda") == PAPER_POLICY

    weights = hf.hf_model.weights_sha256 if hf.hf_model else ""
    only_fp32 = RunVerification(model=weights, limits={"float32/cpu": EXACT_POLICY})
    path = save_policy_file(only_fp32, tmp_path / "policy.json")
    with pytest.raises(ConfigError, match="does not allow bfloat16"):
        build_rl_config("r", model_dir=str(model_dir), worker_dtype="bfloat16", verification_policy=str(path))
    config = build_rl_config("r", model_dir=str(model_dir), verification_policy=str(path))
    assert config.run_verification.sha256 == only_fp32.sha256
    config.check_worker_device("cpu")
    with pytest.raises(ConfigError, match="does not allow float32 on cuda"):
        config.check_worker_device("cuda")
    with pytest.raises(ConfigError, match="calibrated on"):
        build_rl_config("r", verification_policy=str(path))  # a policy of another model
    with pytest.raises(ConfigError, match="has hash"):
        build_rl_config(
            "r", model_dir=str(model_dir), verification_policy=str(path), verification_sha256="ab" * 32
        )
    (tmp_path / "junk.json").write_text("{}")
    with pytest.raises(ConfigError, match="hivenet calibrate"):
        build_rl_config("r", verification_policy=str(tmp_path / "junk.json"))
