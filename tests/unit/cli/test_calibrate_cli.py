"""`hivenet calibrate`: the figures printed, the limits written (and merged), refusals that say what to do."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

from cli.main import cli
from protocol.verification_policy import RunVerification
from training.rl_run import RLRunConfig
from verification.calibration import CalibrationOverlap, CalibrationPlan, calibrate
from verification.calibration_setup import calibration_target
from verification.policy_file import load_policy_file, save_policy_file

pytestmark = pytest.mark.usefixtures("one_torch_thread")

SMALL = ["--rollouts", "16", "--cheat-rollouts", "4"]


def test_calibrate_prints_the_figures_and_writes_limits_per_precision_into_one_file(tmp_path: Path) -> None:
    out = tmp_path / "policy.json"
    first = CliRunner().invoke(
        cli, ["calibrate", "--model", "tiny", "--dtype", "bfloat16", "--out", str(out), *SMALL]
    )
    assert first.exit_code == 0, first.output
    assert (
        "honest max" in first.output
        and "near_tie" in first.output
        and "--verification-sha256" in first.output
    )
    second = CliRunner().invoke(cli, ["calibrate", "--dtype", "float32", "--out", str(out), *SMALL])
    assert second.exit_code == 0, second.output
    policy = load_policy_file(out)
    assert policy.model == "tiny" and policy.allowed() == "bfloat16/cpu, float32/cpu"
    assert policy.sha256 in second.output
    assert policy.limits["bfloat16/cpu"].sampling_rel_tol == 0.0  # exact kernels: no near-tie tolerance


def test_calibrate_refuses_a_file_of_another_model_and_a_device_it_lacks(tmp_path: Path) -> None:
    out = save_policy_file(
        RunVerification(model="ab" * 32, limits=load_default_limits()), tmp_path / "p.json"
    )
    before = out.read_text()
    refused = CliRunner().invoke(cli, ["calibrate", "--out", str(out), *SMALL])
    assert refused.exit_code == 1 and "choose another --out" in refused.output
    assert out.read_text() == before
    if not torch.cuda.is_available():
        no_gpu = CliRunner().invoke(
            cli, ["calibrate", "--device", "cuda", "--out", str(tmp_path / "x.json"), *SMALL]
        )
        assert no_gpu.exit_code == 1 and "--device cpu" in no_gpu.output and "Traceback" not in no_gpu.output


def load_default_limits() -> dict:
    from protocol.verification_policy import default_run_verification

    return dict(default_run_verification("tiny").limits)


def test_a_policy_file_that_is_not_one_is_refused_with_what_to_do(tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"format": "hivenet-verification-policy-v1", "model": "tiny", "limits": {}}))
    result = CliRunner().invoke(cli, ["simulate", "--rl", "--verification-policy", str(bad)])
    assert result.exit_code == 1 and "hivenet calibrate" in result.output and "Traceback" not in result.output


def test_where_the_limits_do_not_reject_enough_of_a_cheat_nothing_is_derived_for_writing() -> None:
    target = calibration_target(RLRunConfig(), "float32", torch.device("cpu"))
    unreachable = CalibrationPlan(
        honest_rollouts=8, cheat_rollouts=2, min_detection=1.01
    )  # no class can meet it
    with pytest.raises(CalibrationOverlap, match="no policy written") as caught:
        calibrate(target.factory, target.prompts, target.max_new_tokens, unreachable)
    assert caught.value.calibration.table()[1][0] == "honest max"
