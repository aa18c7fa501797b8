"""DiLoCo on a Hugging Face model: pseudo-gradients over all its parameters, trainers bit-identical
after every outer step, the corpus cut into the model's tokens, and a late joiner that downloads
the run's state of the model (parameters, momentum, step) instead of starting over."""

from __future__ import annotations

from pathlib import Path

import pytest

from node.swarm import wait_until
from tests.helpers.trainers import finished, harness, hashes_by_step, tiny_config
from training.model_init import init_model_dir
from training.run_model import HFModelRef


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return init_model_dir(tmp_path_factory.mktemp("models") / "micro", size="micro", pretrain_steps=2)


def test_trainers_of_a_hugging_face_model_agree_bit_for_bit_and_a_late_joiner_catches_up(
    model_dir: Path,
) -> None:
    config = tiny_config(6, inner_steps=4, hf_model=HFModelRef.of_directory(model_dir))
    with harness() as h:
        a, b = h.start_many(config, ["early0", "early1"])
        assert wait_until(lambda: a.steps() >= 2 and b.steps() >= 2, timeout_s=180)
        joined_at = max(a.steps(), b.steps())
        late = h.start(config, "late")
        for trainer in (a, b, late):
            assert wait_until(finished(trainer, 6), timeout_s=240)
        assert [t.error for t in (a, b, late)] == [None, None, None]
        assert all(r.tokens > 0 for t in (a, b) for r in t.reports)
        early = hashes_by_step(a.reports)
        assert sorted(early) == list(range(1, 7)) and hashes_by_step(b.reports) == early
        assert late.reports[0].outer_step > joined_at  # it started from the run's step, not from 0
        shared = [r for r in late.reports if r.num_peers == 3]
        assert shared, "the joiner never averaged with the others"
        assert all(r.outer_hash == early[r.outer_step] for r in shared)
        assert late.reports[-1].outer_hash == early[6]
