"""Commands that run a node: identity, join, seed, simulate (`cli.swarm_queries` has peers and doctor)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from cli.errors import friendly_errors
from cli.options import dialable_network_option
from cli.output import echo_json, json_option, setup_logging
from cli.rl import (
    CHEAT_CHOICES,
    RL_OPTION_NAMES,
    build_rl_config,
    hf_model_option,
    non_rl_node_roles,
    rl_node_roles,
    rl_options,
)
from cli.running import run_until_interrupted
from cli.train import (
    TRAINER_OPTION_NAMES,
    build_trainer_config,
    resolve_trainer_options,
    trainer_options,
)
from protocol.node_record import Role

if TYPE_CHECKING:
    pass

DEFAULT_SEED_PORT = 31337
DEVICE_HELP = "Where this node runs its models: cpu, cuda, cuda:N or mps"


def _node_options(func: Any) -> Any:
    options = [
        click.option("--initial-peers", "initial_peers", multiple=True, help="Seed multiaddr (repeatable)."),
        click.option("--identity", "identity_path", type=click.Path(path_type=Path), help="Key file."),
        click.option(
            "--weights-dir",
            type=click.Path(path_type=Path),
            help="Chunk store for the weights this node serves.",
        ),
        click.option("--public-name", help="Name shown to others."),
        click.option("--run", "run_id", help="Run id to join."),
        click.option("--host", help="IP to listen on (default 0.0.0.0)."),
        click.option("--port", type=int, help="TCP port to listen on (join: any free port; seed: 31337)."),
        click.option(
            "--announce", "announce_addresses", multiple=True, help="Multiaddr to announce (repeatable)."
        ),
        click.option("--record-ttl", "record_ttl_s", type=float, help="Node record TTL in seconds."),
        click.option(
            "--refresh-interval", "refresh_interval_s", type=float, help="Record refresh period (s)."
        ),
        click.option(
            "--bootstrap-timeout", "bootstrap_timeout_s", type=float, help="Seconds to retry seeds."
        ),
        click.option(
            "--auto-relay",
            "use_auto_relay",
            is_flag=True,
            default=None,
            help="Behind NAT: look for relays, so that peers reach this node through one (env HIVENET_USE_AUTO_RELAY).",
        ),
        dialable_network_option,
        click.option("--status-file", type=click.Path(path_type=Path), help="Write a JSON status here."),
        click.option("--status-port", type=int, help="Serve JSON status on 127.0.0.1:PORT/status."),
        click.option(
            "--metrics-host",
            help="Address the status port listens on (default 127.0.0.1); e.g. 0.0.0.0 lets a Prometheus "
            "server elsewhere scrape /metrics (a warning says it is exposed).",
        ),
        click.option(
            "--ledger",
            "ledger_path",
            type=click.Path(dir_okay=False, path_type=Path),
            help="Receipts ledger (SQLite) this node keeps, serves and fills from peers "
            "(join: default one per run in the user data dir).",
        ),
        click.option("--config", "config_file", type=click.Path(path_type=Path), help="TOML config file."),
        click.option("-v", "--verbose", is_flag=True, help="Debug logging."),
    ]
    for option in reversed(options):
        func = option(func)
    return func


def _build_config(config_file: Path | None, **flags: Any) -> Any:
    from node.config import load_config

    for key in ("initial_peers", "announce_addresses", "dialable_networks", "roles"):
        if key in flags and not flags[key]:
            flags[key] = None  # an absent repeatable flag must not override the config file
        elif key in flags:
            flags[key] = list(flags[key])
    return load_config(config_file, **flags)


@click.command()
@click.option(
    "--identity", "identity_path", type=click.Path(path_type=Path), help="Key file (default: user data dir)."
)
@click.option("--create", is_flag=True, help="Create the key file if it does not exist.")
@json_option
@friendly_errors
def identity(identity_path: Path | None, create: bool, as_json: bool) -> None:
    """Show this node's PeerID and key file."""
    from node.config import NodeConfig, default_identity_path, env_settings
    from node.identity import load_identity, load_or_create_identity

    path = identity_path or Path(env_settings(NodeConfig).get("identity_path") or default_identity_path())
    loaded = load_or_create_identity(path) if create else load_identity(path)
    if as_json:
        echo_json({"peer_id": loaded.peer_id.to_base58(), "key_file": str(path)})
        return
    click.echo(f"peer id:  {loaded.peer_id.to_base58()}")
    click.echo(f"key file: {path}")


@click.command()
@click.option(
    "--role",
    "roles",
    multiple=True,
    type=click.Choice([r.value for r in Role if r != Role.SEED]),
    help="Role(s) of this node: trainer, inference, validator (of an RL run), relay "
    "[default: validator on an RL run, else relay].",
)
@_node_options
@trainer_options
@rl_options
@click.option(
    "--publisher", "publishers", multiple=True,
    help="PeerID of one of the run's authorised publishers (repeatable): on an RL run, a trainer whose policy "
    "versions this node follows; for a trainer, another trainer whose outer state it may take when it resyncs.",
)  # fmt: skip
@click.option(
    "--wait-for-trainers", type=click.IntRange(1, 1024), default=1, show_default=True,
    help="With --role trainer: start training once this many trainers (this one included) are ready in the run.",
)  # fmt: skip
@click.option(
    "--reachability-check", "reachability_check", type=click.Choice(["auto", "on", "off"]),
    help="Once joined, ask the seeds to dial this node back and print whether peers can reach it "
    "[default: auto, unless every seed is on loopback].",
)  # fmt: skip
@click.option(
    "--new-swarm", is_flag=True,
    help="Start a new swarm when no --initial-peers are given (otherwise that is an error).",
)  # fmt: skip
@click.option("--device", help=f"{DEVICE_HELP} (env HIVENET_DEVICE).")
@friendly_errors
def join(
    roles: tuple[str, ...],
    config_file: Path | None,
    verbose: bool,
    wait_for_trainers: int,
    new_swarm: bool,
    publishers: tuple[str, ...],
    **flags: Any,
) -> None:
    """Join a swarm and stay until Ctrl-C, then leave cleanly.

    With --role trainer the node trains the run's model with DiLoCo and prints one line per
    outer step (loss, peers in the round, bytes sent). On an RL run (--rl; implied by --role
    inference) a trainer runs GRPO on verified rollouts and validates them itself, a validator
    judges rollouts and forwards the accepted ones, and an inference worker generates assigned
    rollouts and prints a line per group.
    """
    trainer_flags = resolve_trainer_options(
        config_file, {key: flags.pop(key) for key in TRAINER_OPTION_NAMES}
    )
    rl_flags = {key: flags.pop(key) for key in RL_OPTION_NAMES}
    config = _build_config(config_file, roles=roles, **flags)
    is_rl = rl_flags.pop("rl") or Role.INFERENCE in config.roles
    if not is_rl:
        config.roles = non_rl_node_roles(config.roles, chosen="roles" in config.model_fields_set)
    if set(config.roles) & {Role.TRAINER, Role.INFERENCE, Role.VALIDATOR}:
        from training.devices import resolve_device

        resolve_device(config.device)  # a missing GPU is refused before the node starts
    if config.ledger_path is None:
        from node.config import default_ledger_path

        config.ledger_path = default_ledger_path(config.identity_path, config.run_id)
    rl_config = None
    if is_rl:
        rl_config = build_rl_config(config.run_id, authorized_publishers=publishers, **rl_flags)
        if not publishers and Role.TRAINER not in config.roles:
            raise click.UsageError(
                "on an RL run, give the PeerID of the run's trainer with --publisher (its `hivenet join` prints it): "
                "policy versions are only taken from publishers you name"
            )
        config.roles = rl_node_roles(config.roles)
        if Role.INFERENCE in config.roles:
            from training.devices import resolve_device

            rl_config.check_worker_device(resolve_device(config.device).type)
    if not config.initial_peers and not new_swarm:
        raise click.UsageError(
            "no --initial-peers: give the multiaddr of a seed of the swarm to join (a seed prints its own), "
            "or pass --new-swarm to start a new, empty swarm on purpose"
        )
    setup_logging(verbose)
    from node.node import HivenetNode

    trainer = (
        build_trainer_config(
            config.run_id,
            authorized_publishers=list(publishers) or None,
            hf_model=hf_model_option(rl_flags.get("model_dir"), rl_flags.get("model_sha256")),
            device=config.device,
            **trainer_flags,
        )
        if Role.TRAINER in config.roles and not is_rl
        else None
    )
    config.trusted_signers = sorted(
        {
            *config.trusted_signers,
            *publishers,
            *(rl_config.trusted_validators if rl_config else []),
            *(rl_config.admitted_trainers if rl_config else []),
            *(trainer.admitted_trainers if trainer else []),
        }
    )
    run_until_interrupted(
        HivenetNode(config),
        "node",
        trainer_config=trainer,
        wait_for_trainers=wait_for_trainers,
        rl_config=rl_config,
        rl_checkpoint_dir=rl_checkpoint_dir(config, trainer_flags.get("checkpoint_dir")) if is_rl else None,
    )


def rl_checkpoint_dir(config: Any, given: Path | None) -> Path:
    """Where an RL trainer keeps its checkpoint: the --checkpoint-dir given, else one per run in the
    node's own state directory, so that a restarted trainer resumes at its version by default."""
    from node.config import node_state_dir

    return (
        given if given is not None else node_state_dir(config.identity_path) / "checkpoints" / config.run_id
    )


@click.command()
@click.option("--announce-ip", help="Public IP to announce (when the seed is behind port forwarding).")
@_node_options
@friendly_errors
def seed(announce_ip: str | None, config_file: Path | None, verbose: bool, **flags: Any) -> None:
    """Run a seed node: DHT and relay only, with a stable identity and a fixed port.

    Prints the multiaddrs that others pass to --initial-peers; a restart with the same
    identity and port keeps them.
    """
    from node.config import default_identity_path

    if flags.get("identity_path") is None:
        flags["identity_path"] = default_identity_path().with_name("seed.key")
    if flags.get("port") is None:
        flags["port"] = DEFAULT_SEED_PORT
    if announce_ip:
        kind = "ip6" if ":" in announce_ip else "ip4"
        flags["announce_addresses"] = [
            *flags.get("announce_addresses", ()),
            f"/{kind}/{announce_ip}/tcp/{flags['port']}",
        ]
    config = _build_config(config_file, roles=[Role.SEED.value], **flags)
    setup_logging(verbose)
    from node.node import HivenetNode

    run_until_interrupted(HivenetNode(config, dht_only=True), "seed")


@click.command()
@click.option("--nodes", "num_nodes", type=click.IntRange(1, 32), default=3, show_default=True, help="Nodes.")
@click.option(
    "--roles",
    "roles",
    default="relay",
    show_default=True,
    help="Comma-separated roles, assigned round-robin to the nodes.",
)
@click.option(
    "--duration", "duration_s", type=float, default=None, help="Seconds to run (default: until Ctrl-C)."
)
@click.option("--run", "run_id", default="sim", show_default=True, help="Run id.")
@click.option(
    "--trainers", "num_trainers", type=click.IntRange(0, 16), default=0,
    help="Run a whole DiLoCo training run with this many trainers instead (prints the loss per outer step).",
)  # fmt: skip
@trainer_options
@rl_options
@click.option(
    "--workers", type=click.IntRange(1, 8), default=3, show_default=True, help="With --rl: inference workers."
)
@click.option(
    "--cheat", type=click.Choice(CHEAT_CHOICES), default="precision", show_default=True,
    help="With --rl: how the last worker cheats (precision swap, other weights, or none).",
)  # fmt: skip
@click.option("--device", default="cpu", show_default=True, envvar="HIVENET_DEVICE", help=DEVICE_HELP)
@friendly_errors
def simulate(
    num_nodes: int,
    roles: str,
    duration_s: float | None,
    run_id: str,
    num_trainers: int,
    workers: int,
    cheat: str,
    device: str,
    **flags: Any,
) -> None:
    """Start a seed and N nodes on 127.0.0.1, show the swarm, and tear it all down at the end.

    With --trainers N it runs a DiLoCo training run of N trainers on this machine instead; with
    --rl a decentralized RL run: a seed, a trainer with its validator and --workers inference
    workers, the last of them dishonest (--cheat).
    """
    rl_flags = {key: flags.pop(key) for key in RL_OPTION_NAMES}
    trainer_flags = flags
    if rl_flags["rl"] or num_trainers:
        from training.devices import resolve_device

        resolve_device(device)
    if rl_flags.pop("rl"):
        from cli.rl import run_rl_simulation

        if rl_flags.get("max_trainer_steps") is None:
            rl_flags["max_trainer_steps"] = 20
        run_rl_simulation(build_rl_config(run_id, **rl_flags), workers=workers, cheat=cheat, device=device)
        return
    if num_trainers:
        from cli.simulate import run_training_simulation

        trainer_flags = resolve_trainer_options(None, trainer_flags)
        if trainer_flags["max_outer_steps"] is None:
            trainer_flags["max_outer_steps"] = 10
        if trainer_flags.get("inner_steps") is None:
            trainer_flags["inner_steps"] = 50
        hf_model = hf_model_option(rl_flags.get("model_dir"), rl_flags.get("model_sha256"))
        run_training_simulation(
            num_trainers, build_trainer_config(run_id, hf_model=hf_model, device=device, **trainer_flags)
        )
        return
    from cli.simulate import run_simulation

    simulated = [role.value for role in Role if role in (Role.TRAINER, Role.RELAY)]
    names = [part.strip() for part in roles.split(",") if part.strip()]
    unknown = [name for name in names if name not in simulated]
    if unknown or not names:
        raise click.UsageError(
            f"--roles {roles!r}: {', '.join(unknown) or 'no role'} cannot be simulated; "
            f"choose from {', '.join(simulated)} (validators and inference workers: simulate an RL run with --rl)"
        )
    role_list = [Role(name) for name in names]
    run_simulation(num_nodes=num_nodes, roles=role_list, duration_s=duration_s, run_id=run_id)
