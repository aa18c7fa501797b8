"""`hivenet calibrate`: measure honest noise and cheats on a run's model and write its verification limits."""

from __future__ import annotations

from pathlib import Path

import click

from cli.errors import friendly_errors
from cli.node_commands import DEVICE_HELP
from cli.output import setup_logging
from training.task_names import DEFAULT_TASK


@click.command()
@click.option("--model", "model_dir", default="tiny", show_default=True,
              help="The run's model: 'tiny' or a Hugging Face model directory.")  # fmt: skip
@click.option("--dtype", type=click.Choice(["float32", "bfloat16", "float16"]), default="bfloat16",
              show_default=True, help="The precision workers claim and validators recompute in.")  # fmt: skip
@click.option("--device", default="cpu", show_default=True, envvar="HIVENET_DEVICE", help=DEVICE_HELP)
@click.option(
    "--task", help=f"The run's RL task (its prompts and completion length; default {DEFAULT_TASK})."
)
@click.option("--rollouts", type=click.IntRange(min=16), default=1000, show_default=True,
              help="Honest rollouts to measure (batch sizes 1, 4 and 16, two thread counts).")  # fmt: skip
@click.option("--cheat-rollouts", type=click.IntRange(min=4), default=64, show_default=True,
              help="Rollouts per cheat class.")  # fmt: skip
@click.option("--out", type=click.Path(dir_okay=False, path_type=Path), default=Path("verification-policy.json"),
              show_default=True, help="Policy file to write (other precisions and devices it holds are kept).")  # fmt: skip
@click.option(
    "--seed", type=int, default=0, show_default=True, help="Seed of the prompts, sampling seeds and cheats."
)
@friendly_errors
def calibrate(
    model_dir: str,
    dtype: str,
    device: str,
    task: str | None,
    rollouts: int,
    cheat_rollouts: int,
    out: Path,
    seed: int,
) -> None:
    """Calibrate the run's verification limits for one precision and device.

    Generates honest rollouts as workers do and re-verifies them as validators do, then every
    cheat class (precision swaps, quantized or noisy weights, older checkpoints, another model,
    an altered prompt, greedy or other sampling, swapped tokens, an altered tail, near-tie steering);
    prints each figure's honest maximum, each cheat's minimum and the limit between them, and adds
    the limits to --out. Exits 1, writing nothing, where honest rollouts and a cheat's overlap.
    Give the file to every node of the run with --verification-policy.
    """
    setup_logging()
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
    from rich.table import Table

    from cli.output import make_console
    from cli.rl import hf_model_option
    from training.devices import resolve_device
    from training.rl_run import RLRunConfig
    from verification.calibration import CalibrationOverlap, CalibrationPlan
    from verification.calibration import calibrate as run_calibration
    from verification.calibration_setup import calibration_target, merge_policy

    torch_device = resolve_device(device)
    hf_model = hf_model_option(model_dir, None)
    config = RLRunConfig(run_id="calibration", task=task or DEFAULT_TASK, hf_model=hf_model)
    target = calibration_target(config, dtype, torch_device, seed=seed)
    plan = CalibrationPlan(honest_rollouts=rollouts, cheat_rollouts=cheat_rollouts, seed=seed)
    console = make_console(stderr=True)
    progress = Progress(TextColumn("{task.description:<22}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                        console=console)  # fmt: skip
    bars = {"honest": progress.add_task("honest rollouts", total=rollouts)}
    bars["cheats"] = progress.add_task("cheat classes", total=None)

    def report(stage: str, done: int, total: int) -> None:
        bar = bars["honest"] if stage == "honest" else bars["cheats"]
        progress.update(
            bar, completed=done, total=total, description="honest rollouts" if stage == "honest" else stage
        )

    overlap: CalibrationOverlap | None = None
    with progress:
        try:
            result = run_calibration(
                target.factory, target.prompts, target.max_new_tokens, plan, progress=report
            )
        except CalibrationOverlap as exc:
            overlap, result = exc, exc.calibration
    rows = result.table()
    table = Table(
        title=f"{dtype}/{torch_device.type}: worst chunk per rollout (honest max, limit, cheat minima)"
    )
    for name in rows[0]:
        table.add_column(name, justify="left" if name == "rollouts" else "right", no_wrap=name == "rollouts")
    for row in rows[1:]:
        table.add_row(*row)
    make_console().print(table)
    click.echo(
        f"honest logit noise {result.honest_logit_noise:.3g} of the largest |logit|; near-tie tolerance "
        f"{result.near_tie_rel_tol:.3g}; {result.seconds:.0f} s"
    )
    if overlap is not None:
        raise overlap
    policy = merge_policy(out, result, target.model_id)
    click.echo(f"wrote {out} ({policy.allowed()}); give every node of the run:")
    click.echo(f"  --verification-policy {out} --verification-sha256 {policy.sha256}")
