"""DiLoCo on a Hugging Face model: pseudo-gradients over all its parameters, trainers bit-identical
after every outer step, the corpus cut into the model's tokens."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.helpers.trainers import tiny_config
from training.model_init import init_model_dir
from training.run_model import HFModelRef
from training.simulation import simulate_diloco


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return init_model_dir(tmp_path_factory.mktemp("models") / "micro", size="micro", pretrain_steps=2)


def test_two_trainers_of_a_hugging_face_model_agree_bit_for_bit(model_dir: Path) -> None:
    ref = HFModelRef.of_directory(model_dir)
    config = tiny_config(
        3, inner_steps=4, hf_model=ref, target_group_size=2, sender_timeout_s=15.0, averaging_timeout_s=60.0
    )
    reports = simulate_diloco(2, config)
    by_step: dict[int, set[str]] = {}
    for report in reports:
        assert report.num_peers == 2 and report.tokens > 0
        by_step.setdefault(report.outer_step, set()).add(report.outer_hash)
    assert sorted(by_step) == [1, 2, 3] and all(len(hashes) == 1 for hashes in by_step.values())
