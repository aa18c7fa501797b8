"""RL-run options and output shared by `hivenet simulate --rl` and `hivenet join` on an RL run."""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from protocol.errors import ConfigError
from training.task_names import BUILTIN_TASK_NAMES, DEFAULT_TASK

CHEAT_CHOICES = ("precision", "weights", "none")
TASK_HELP = (
    f"RL task: {DEFAULT_TASK} (default), "
    f"{', '.join(name for name in BUILTIN_TASK_NAMES if name != DEFAULT_TASK)}, or an installed plugin's."
)


def rl_options(func: Callable[..., Any]) -> Callable[..., Any]:
    """Click options that configure an RL run (all optional)."""
    options = [
        click.option("--rl", "rl", is_flag=True, help="Run (or join) a decentralized RL run instead of DiLoCo."),
        click.option("--task", help=TASK_HELP),
        click.option(
            "--model", "model_dir",
            help="The model to train (RL policy or DiLoCo model): 'tiny' (default: the built-in byte-level "
            "model) or a Hugging Face model directory (create one with `hivenet model init DIR`).",
        ),
        click.option(
            "--dtype", "worker_dtype", type=click.Choice(["float32", "bfloat16", "float16"]),
            help="Precision the run's inference workers generate in (validators recompute in it; default float32).",
        ),
        click.option(
            "--model-sha256",
            help="With --model DIR: the hash of the run's starting weights; this node refuses to start if its "
            "copy differs (default: the copy's own hash, printed for the other nodes).",
        ),
        click.option(
            "--verification-policy", "verification_policy", type=click.Path(dir_okay=False),
            help="The run's verification limits, written by `hivenet calibrate` (default: exact limits for "
            "'tiny'; the TOPLOC paper's loose bf16 limits for an uncalibrated --model DIR).",
        ),
        click.option(
            "--verification-sha256",
            help="With --verification-policy: the hash of the run's policy; this node refuses to start if its "
            "file differs (default: the file's own hash, printed for the other nodes).",
        ),
        click.option("--rl-steps", "max_trainer_steps", type=int, help="Stop the RL trainer after this many steps."),
        click.option("--group-size", type=int, help="Completions per prompt (GRPO group)."),
        click.option("--async-level", type=int, help="Rollouts may lag the trainer by this many versions (0: sync)."),
        click.option(
            "--groups-per-submission", type=int,
            help="On an RL inference worker: groups generated, then submitted at once (judged in one batch; default 2).",
        ),
        click.option(
            "--trusted-validator", "trusted_validators", multiple=True,
            help="PeerID of a standalone validator the RL run trusts (repeatable): its trainers learn from what it "
            "forwards, and workers submit to it and to the trainers only.",
        ),
    ]  # fmt: skip
    for option in reversed(options):
        func = option(func)
    return func


RL_OPTION_NAMES = (
    "rl",
    "task",
    "model_dir",
    "model_sha256",
    "worker_dtype",
    "verification_policy",
    "verification_sha256",
    "max_trainer_steps",
    "group_size",
    "async_level",
    "groups_per_submission",
    "trusted_validators",
)


def build_rl_config(run_id: str, **options: Any) -> Any:
    """An RLRunConfig from the CLI's RL options (None means: keep the default)."""
    from pydantic import ValidationError

    from training.grpo import GRPOConfig
    from training.rl_run import RLRunConfig

    grpo = {key: options[key] for key in ("group_size", "async_level") if options.get(key) is not None}
    top: dict[str, Any] = {"run_id": run_id}
    for key in ("task", "max_trainer_steps", "groups_per_submission", "worker_dtype"):
        if options.get(key) is not None:
            top[key] = options[key]
    for key in ("authorized_publishers", "trusted_validators"):
        if options.get(key):
            top[key] = list(options[key])
    hf_model = hf_model_option(options.get("model_dir"), options.get("model_sha256"))
    if hf_model is not None:
        top["hf_model"] = hf_model
    verification = verification_option(options.get("verification_policy"), options.get("verification_sha256"))
    if verification is not None:
        top["verification"] = verification
    elif hf_model is not None:
        click.secho(
            "warning: no --verification-policy: validators apply the TOPLOC paper's loose limits to this model; "
            "calibrate them with `hivenet calibrate --model DIR`",
            fg="yellow",
            err=True,
        )
    try:
        from training.rl_run import run_task

        config = RLRunConfig(grpo=GRPOConfig(**grpo), **top)
        run_task(config)
        return config
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors())
        raise ConfigError(f"invalid RL options: {problems}") from None


def rl_node_roles(roles: list[Any]) -> list[Any]:
    """The roles a node of an RL run announces: a trainer validates what workers submit to it (its own
    validator judges every group before it trains on it), so it announces the validator role too, or
    no worker would ever find it."""
    from protocol.node_record import Role

    if Role.TRAINER in roles and Role.VALIDATOR not in roles:
        return [*roles, Role.VALIDATOR]
    return list(roles)


def non_rl_node_roles(roles: list[Any], *, chosen: bool) -> list[Any]:
    """The roles a node of a run that is not RL announces. A validator judges the rollouts of an RL
    run, so one `chosen` (by flag, config file or environment) is a UsageError. The default role,
    a standalone validator on an RL run, becomes relay here: that one every node is (its p2pd serves
    as a circuit relay for peers that cannot be dialled directly), so the node still takes part in
    the run's membership without claiming to validate."""
    from protocol.node_record import Role

    if Role.VALIDATOR not in roles:
        return list(roles)
    if chosen:
        raise click.UsageError(
            "role validator: a validator judges the rollouts of an RL run, and this run is not one; "
            "add --rl to join an RL run as its validator, or pick another role (trainer, relay)"
        )
    return [Role.RELAY]


def verification_option(path: str | None, sha256: str | None) -> Any:
    """The run's `RunVerification` from `--verification-policy FILE [--verification-sha256 H]`; None
    for the backend's built-in limits."""
    if path is None:
        if sha256:
            raise ConfigError("--verification-sha256 names a --verification-policy FILE; pass the file too")
        return None
    from verification.policy_file import load_policy_file

    policy = load_policy_file(path)
    if sha256 is None:
        click.echo(f"verification policy {path}: --verification-sha256 {policy.sha256}", err=True)
    elif sha256.lower() != policy.sha256:
        raise ConfigError(
            f"verification policy {path} has hash {policy.sha256[:16]}, the run's is {sha256.lower()[:16]}; "
            "get the run's policy file from its operator"
        )
    return policy


def hf_model_option(model_dir: str | None, sha256: str | None) -> Any:
    """The run's `HFModelRef` from `--model DIR [--model-sha256 H]`, checked against this node's copy
    of the directory; None for the `tiny` model."""
    if model_dir in (None, "tiny"):
        if sha256:
            raise ConfigError("--model-sha256 names the weights of a --model DIR; pass the directory too")
        return None
    from training.hf_model import quiet_transformers

    quiet_transformers()
    from training.run_model import HFModelRef, load_run_model

    ref = HFModelRef.of_directory(model_dir)
    if sha256 is None:
        click.echo(f"starting weights of {model_dir}: --model-sha256 {ref.weights_sha256}", err=True)
        return ref
    try:
        claimed = HFModelRef(path=ref.path, weights_sha256=sha256.lower())
    except ValueError:
        raise ConfigError(f"--model-sha256 {sha256!r} is not a SHA-256 (64 hex digits)") from None
    load_run_model(claimed)  # refuses a copy whose weights are not the run's
    return claimed


def run_rl_simulation(config: Any, *, workers: int, cheat: str, device: str = "cpu") -> None:
    """`hivenet simulate --rl`: run the loop on this machine and print a row per trainer step."""
    from rich.table import Table

    from cli.output import make_console
    from node.shutdown import StopRequest
    from training.rl_run import initial_policy
    from training.rl_worker import CheatMode, GroupReport
    from verification.rl_simulation import simulate_rl

    console = make_console()
    cheaters = {} if cheat == "none" or workers < 2 else {workers - 1: CheatMode(cheat)}
    pending: Counter[str] = Counter()
    lock = threading.Lock()

    def on_group(name: str, report: GroupReport) -> None:
        with lock:
            pending["accepted"] += report.accepted
            pending.update(report.rejected)

    def on_step(report: Any) -> None:
        with lock:
            judged = dict(pending)
            pending.clear()
        rejected = ", ".join(f"{k} {v}" for k, v in sorted(judged.items()) if k != "accepted") or "-"
        console.print(
            f"{report.describe()} | accepted {judged.get('accepted', 0)} | rejected {rejected}",
            highlight=False,
        )

    with console.status("pretraining the initial policy briefly on the default corpus..."):
        policy = initial_policy(config, device)
    console.print(
        f"RL run {config.run_id!r}: task {config.task!r}, a seed, a trainer with its validator, {workers} workers"
        + (f" (worker{workers - 1} cheats: {cheat})" if cheaters else "")
    )
    stop = StopRequest()
    result = simulate_rl(config, policy, workers=workers, cheaters=cheaters, on_step=on_step, on_group=on_group,
                         stop_event=stop.event, device=device)  # fmt: skip
    curve = Table(title=f"reward per trainer step ({result.seconds:,.0f} s)")
    for column in ("step", "version", "mean reward", "staleness"):
        curve.add_column(column)
    for step in result.steps:
        curve.add_row(
            str(step.step), str(step.version), f"{step.mean_reward:.3f}", f"{step.mean_staleness:.2f}"
        )
    console.print(curve)
    console.print(learning_summary([step.mean_reward for step in result.steps]))
    workers_table = Table(title="workers, as their validator saw them")
    for column in (
        "worker",
        "honest",
        "groups",
        "accepted",
        "rejected (rollouts, by reason)",
        "trained on",
        "bans",
    ):
        workers_table.add_column(column)
    stats = result.validator_stats
    for name in result.groups:
        seen = stats.workers.get(result.worker_peers[name]) if stats is not None else None
        workers_table.add_row(
            name,
            f"no ({result.cheaters[name]})" if name in result.cheaters else "yes",
            str(seen.groups) if seen else "0",
            str(seen.accepted) if seen else "0",
            ", ".join(f"{k} {v}" for k, v in sorted(seen.rejected.items()))
            if seen and seen.rejected
            else "-",
            str(result.trained_from.get(name, 0)),
            str(seen.strikes) if seen else "0",
        )
    console.print(workers_table)


def learning_summary(rewards: list[float]) -> str:
    """Whether the policy learned, in one line: the mean reward of the first and the last quarter of
    the trainer's steps (one step's reward is too noisy to read a trend from)."""
    if len(rewards) < 4:
        return f"{len(rewards)} trainer steps: too few to compare the start with the end"
    quarter = len(rewards) // 4
    first, last = sum(rewards[:quarter]) / quarter, sum(rewards[-quarter:]) / quarter
    trend = "learned" if last > first else "did not improve"
    return (
        f"mean reward of steps 0-{quarter - 1}: {first:.3f}; of the last {quarter}: {last:.3f} "
        f"({last - first:+.3f}: the policy {trend})"
    )


class RLRoles:
    """The RL roles a joined node runs (trainer with its validator, standalone validator, worker)."""

    def __init__(
        self, node: Any, config: Any, print_line: Callable[[str], None], *, checkpoint_dir: Path | None = None
    ) -> None:
        """`checkpoint_dir`: where a trainer saves every policy version before publishing it and resumes
        from after a restart (None: it starts from the run's initial policy)."""
        from protocol.node_record import Role

        self.node = node
        self.config = config
        self.trainer: Any = None
        self.worker: Any = None
        self.validator: Any = None
        roles = set(node.config.roles)
        if Role.TRAINER in roles:
            from training.devices import resolve_device
            from training.rl_run import initial_policy
            from verification.rl_roles import start_rl_trainer

            policy = initial_policy(config, resolve_device(node.config.device))
            self.trainer, self.validator = start_rl_trainer(
                node,
                config,
                policy,
                checkpoint_dir=checkpoint_dir,
                on_step=lambda r: print_line(r.describe()),
            )
        elif Role.VALIDATOR in roles:
            from verification.rl_roles import StandaloneValidator

            self.validator = StandaloneValidator(node, config).start().validator
        if Role.INFERENCE in roles:
            from training.rl_worker import InferenceWorker

            self.worker = InferenceWorker(node, config, on_group=lambda r: print_line(r.describe())).start()

    @property
    def alive(self) -> bool:
        return all(role.alive for role in (self.trainer, self.worker) if role is not None)

    def summary(self) -> str:
        parts = []
        if self.trainer is not None:
            parts.append(f"policy v{self.trainer.version}")
        if self.worker is not None:
            parts.append(f"groups {len(self.worker.reports)}")
            if self.worker.waiting_for:
                parts.append(f"waiting: {self.worker.waiting_for}")
        if self.validator is not None:
            parts.append(self.validator.stats().describe_totals())
        return " | ".join(parts)

    def stop(self) -> None:
        for role in (self.worker, self.trainer):
            if role is not None:
                role.stop()
