"""DiLoCo on a Hugging Face model: pseudo-gradients over all its parameters, trainers bit-identical
after every outer step, the corpus cut into the model's tokens, and a late joiner that downloads
the run's state of the model (parameters, momentum, step) instead of starting over."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.helpers.trainers import assert_a_late_joiner_catches_up, tiny_config
from training.model_init import init_model_dir
from training.run_model import HFModelRef


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return init_model_dir(tmp_path_factory.mktemp("models") / "micro", size="micro", pretrain_steps=2)


def test_trainers_of_a_hugging_face_model_agree_bit_for_bit_and_a_late_joiner_catches_up(
    model_dir: Path,
) -> None:
    config = tiny_config(6, inner_steps=4, hf_model=HFModelRef.of_directory(model_dir))
    early0, early1, _ = assert_a_late_joiner_catches_up(config, join_after=2)
    assert all(r.tokens > 0 for t in (early0, early1) for r in t.reports)  # the corpus in the model's tokens
