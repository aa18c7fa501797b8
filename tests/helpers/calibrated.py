"""A run config whose verification policy is calibrated on its own model (as `hivenet calibrate` writes it)."""

from __future__ import annotations

import torch

from protocol.verification_policy import RunVerification, policy_key
from training.rl_run import RLRunConfig
from verification.calibration import CalibrationPlan, calibrate
from verification.calibration_setup import calibration_target


def calibrated(config: RLRunConfig, *, rollouts: int = 64, cheat_rollouts: int = 8) -> RLRunConfig:
    """`config` with limits calibrated for its `worker_dtype` on the CPU (small counts: for tests)."""
    target = calibration_target(config, config.worker_dtype, torch.device("cpu"))
    plan = CalibrationPlan(honest_rollouts=rollouts, cheat_rollouts=cheat_rollouts)
    result = calibrate(target.factory, target.prompts, target.max_new_tokens, plan)
    limits = {policy_key(config.worker_dtype, "cpu"): result.policy}
    verification = RunVerification(model=target.model_id, limits=limits)
    return RLRunConfig.model_validate({**config.model_dump(), "verification": verification.model_dump()})
