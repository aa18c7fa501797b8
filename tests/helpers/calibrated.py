"""A run config whose verification policy is calibrated on its own model (as `hivenet calibrate` writes it)."""

from __future__ import annotations

from training.rl_run import RLRunConfig
from verification.calibration import CalibrationPlan
from verification.calibration_setup import calibrated_config


def calibrated(config: RLRunConfig, *, rollouts: int = 64, cheat_rollouts: int = 8) -> RLRunConfig:
    """`config` with limits calibrated for its `worker_dtype` on the CPU (small counts: for tests)."""
    return calibrated_config(config, CalibrationPlan(honest_rollouts=rollouts, cheat_rollouts=cheat_rollouts))
