"""Trainer options shared by `hivenet join --role trainer` and `hivenet simulate --trainers N`,
and the progress line both print.

Each option can also be set in the `[trainer]` table of the config file or by an environment
variable `HIVENET_TRAINER_<OPTION>` (`HIVENET_TRAINER_INNER_STEPS=20`); a flag wins over the
variable, which wins over the file (`resolve_trainer_options`).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

import click
from pydantic import BaseModel, ConfigDict, ValidationError

from protocol.errors import ConfigError

TRAINER_ENV_PREFIX = "HIVENET_TRAINER_"


class TrainerOptions(BaseModel):
    """The trainer options as the config file's [trainer] table and the environment give them."""

    model_config = ConfigDict(extra="forbid")

    inner_steps: int | None = None
    max_outer_steps: int | None = None
    outer_lr: float | None = None
    compression: Literal["int8", "sparse"] | None = None
    sparse_density: float | None = None
    data_paths: list[Path] | None = None
    checkpoint_dir: Path | None = None
    seq_len: int | None = None
    batch_size: int | None = None
    max_group_size: int | None = None
    matchmaking_time_s: float | None = None
    admitted_trainers: list[str] | None = None


TRAINER_OPTION_NAMES = tuple(TrainerOptions.model_fields)


def resolve_trainer_options(config_file: Path | None, flags: dict[str, Any]) -> dict[str, Any]:
    """The trainer options from the config file's [trainer] table, then the environment, then the
    `flags` that are set (None or an empty tuple: not given)."""
    from node.config import TRAINER_TABLE, config_table, env_settings, explain_validation_error

    values: dict[str, Any] = dict(config_table(config_file, TRAINER_TABLE))
    values.update(env_settings(TrainerOptions, TRAINER_ENV_PREFIX))
    values.update({key: value for key, value in flags.items() if value not in (None, ())})
    try:
        options = TrainerOptions(**values)
    except ValidationError as exc:
        where = f"[{TRAINER_TABLE}] of {config_file}, " if config_file else ""
        raise explain_validation_error(
            exc, TrainerOptions, "trainer options", f"{where}{TRAINER_ENV_PREFIX}* variables and flags"
        ) from None
    return options.model_dump()


def trainer_options(func: Callable[..., Any]) -> Callable[..., Any]:
    """Click options that configure a DiLoCo trainer (all optional)."""
    options = [
        click.option("--inner-steps", type=int, help="DiLoCo H: inner AdamW steps per outer step."),
        click.option("--outer-steps", "max_outer_steps", type=int, help="Stop after this many outer steps."),
        click.option("--outer-lr", type=float, help="Outer Nesterov learning rate (default 0.7)."),
        click.option(
            "--compression", type=click.Choice(["int8", "sparse"]),
            help="Pseudo-gradient codec: int8 (dense, the default) or sparse (SparseLoCo: top-k, 2-bit).",
        ),
        click.option(
            "--sparse-density", type=float,
            help="Fraction of each chunk's values the sparse codec sends (default 0.015).",
        ),
        click.option(
            "--data", "data_paths", multiple=True, type=click.Path(exists=True, path_type=Path),
            help="Train on these text files/directories instead of the default corpus (repeatable).",
        ),
        click.option("--checkpoint-dir", type=click.Path(path_type=Path), help="Write/resume checkpoints here (an RL trainer keeps one per run in its state directory by default)."),
        click.option("--seq-len", type=int, help="Tokens per training sequence."),
        click.option(
            "--max-group-size", type=int,
            help="Most trainers one outer step averages with, this one included (default 32).",
        ),
        click.option(
            "--matchmaking-time", "matchmaking_time_s", type=float,
            help="Seconds an outer step's gather stays open for trainers that declared it late (default 2).",
        ),
        click.option("--batch-size", type=int, help="Sequences per inner step."),
        click.option(
            "--admitted-trainer", "admitted_trainers", multiple=True,
            help="PeerID of one of the run's trainers, when the run names them (repeatable): average only with "
            "these, and take steps and state only from them. Default: an open run, anyone may train.",
        ),
    ]  # fmt: skip
    for option in reversed(options):
        func = option(func)
    return func


def build_trainer_config(run_id: str, **options: Any) -> Any:
    """A TrainerConfig from the CLI's trainer options (None means: keep the default)."""
    from pydantic import ValidationError

    from training.data import DataConfig
    from training.diloco import DiLoCoConfig
    from training.trainer import TrainerConfig

    diloco = {
        key: options[key]
        for key in ("inner_steps", "max_outer_steps", "outer_lr")
        if options.get(key) is not None
    }
    data: dict[str, Any] = {
        key: options[key] for key in ("seq_len", "batch_size") if options.get(key) is not None
    }
    if options.get("data_paths"):
        data.update(source="files", paths=tuple(options["data_paths"]))
    top: dict[str, Any] = {"run_id": run_id}
    for key in (
        "compression",
        "sparse_density",
        "checkpoint_dir",
        "max_group_size",
        "matchmaking_time_s",
        "authorized_publishers",
        "admitted_trainers",
    ):
        if options.get(key) is not None:
            top[key] = list(options[key]) if key == "admitted_trainers" else options[key]
    for key in ("hf_model", "device"):
        if options.get(key) is not None:
            top[key] = options[key]
    try:
        return TrainerConfig(diloco=DiLoCoConfig(**diloco), data=DataConfig(**data), **top)
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors())
        raise ConfigError(f"invalid trainer options: {problems}") from None


def describe_report(report: Any) -> str:
    """One line of progress for an OuterStepReport."""
    eval_part = f" eval {report.eval_loss:.3f}" if report.eval_loss is not None else ""
    return (
        f"outer step {report.outer_step:>4} | {report.peer} | loss {report.train_loss:.3f}{eval_part} | "
        f"peers {report.num_peers} | sent {report.bytes_sent / 2**20:,.2f} MiB | tokens {report.tokens:,} | "
        f"state {report.outer_hash}" + (" | resynced" if report.resynced else "")
    )
