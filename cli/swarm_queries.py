"""Commands that look at a swarm from outside it: `peers` (its live nodes) and `doctor` (what
usually goes wrong for a volunteer), with the throwaway client node they (and `dashboard`) use."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import TYPE_CHECKING

import click

from cli.errors import friendly_errors
from cli.output import json_option
from protocol.node_record import Reachability, Role

if TYPE_CHECKING:
    from node.node import HivenetNode

__all__ = ["REACHABLE", "doctor", "ephemeral_client", "initial_peers_or_env", "peers"]

REACHABLE = {Reachability.PUBLIC: "yes", Reachability.PRIVATE: "no (NAT)", Reachability.UNKNOWN: "?"}
"""What a record's self-reported dial-back outcome reads as in the table."""


def initial_peers_or_env(given: tuple[str, ...]) -> list[str]:
    """The --initial-peers given, else those of HIVENET_INITIAL_PEERS."""
    from node.config import NodeConfig, env_settings

    return list(given) or list(env_settings(NodeConfig).get("initial_peers", []))


def ephemeral_client(initial_peers: tuple[str, ...], run_id: str, timeout_s: float) -> HivenetNode:
    """A started, unannounced client node with a throwaway identity, bootstrapped from `initial_peers`."""
    from node.config import load_config
    from node.node import HivenetNode

    seeds = initial_peers_or_env(initial_peers)
    if not seeds:
        raise click.UsageError(
            "give at least one --initial-peers address (or HIVENET_INITIAL_PEERS; a seed prints its own)"
        )
    config = load_config(
        initial_peers=seeds,
        run_id=run_id,
        host="127.0.0.1",
        bootstrap_timeout_s=timeout_s,
    )
    client = HivenetNode(config, announce=False, ephemeral_identity=True, client_mode=True)
    client.start()
    return client


@click.command()
@click.option("--initial-peers", "initial_peers", multiple=True, help="Seed multiaddr (repeatable).")
@click.option(
    "--run", "run_id", default="default", show_default=True, envvar="HIVENET_RUN_ID", help="Run id."
)
@click.option("--role", type=click.Choice([r.value for r in Role]), help="Only nodes with this role.")
@json_option
@click.option(
    "--timeout", "timeout_s", type=float, default=15.0, show_default=True, help="Seconds to reach seeds."
)
@friendly_errors
def peers(
    initial_peers: tuple[str, ...], run_id: str, role: str | None, as_json: bool, timeout_s: float
) -> None:
    """List the live nodes of a run."""
    from rich.table import Table

    from cli.output import make_console

    client = ephemeral_client(initial_peers, run_id, timeout_s)
    try:
        nodes = client.discover(Role(role) if role else None)
    finally:
        client.stop()
    now = time.time()
    if as_json:
        click.echo(
            json.dumps(
                [
                    {
                        "peer_id": node.peer_id.to_base58(),
                        "name": node.record.public_name,
                        "roles": [str(r) for r in node.record.roles],
                        "version": node.record.software_version,
                        "addresses": list(node.record.addresses),
                        "age_s": round(now - node.record.started_at, 1),
                        "reachability": node.record.reachability.name.lower(),
                    }
                    for node in nodes
                ],
                indent=2,
            )
        )
        return
    table = Table(title=f"live nodes of run {run_id!r}: {len(nodes)}")
    for column in ("peer", "name", "role", "version", "address", "reachable", "age"):
        table.add_column(column)
    for node in nodes:
        table.add_row(
            node.short_id,
            node.record.public_name,
            ",".join(node.record.roles),
            node.record.software_version,
            node.record.addresses[0].split("/p2p/")[0] if node.record.addresses else "-",
            REACHABLE[node.record.reachability],
            f"{now - node.record.started_at:,.0f} s",
        )
    make_console().print(table)


@click.command()
@click.option("--initial-peers", "initial_peers", multiple=True, help="Seed multiaddr (repeatable).")
@click.option("--identity", "identity_path", type=click.Path(path_type=Path), help="Key file to check.")
@click.option("--timeout", "timeout_s", type=float, default=10.0, show_default=True, help="Seconds per seed.")
@click.option("--host", default="0.0.0.0", show_default=True, help="IP the node will listen on.")
@click.option("--port", type=int, default=0, help="TCP port the node will listen on (the one you forwarded).")
@json_option
@friendly_errors
def doctor(
    initial_peers: tuple[str, ...],
    identity_path: Path | None,
    timeout_s: float,
    host: str,
    port: int,
    as_json: bool,
) -> None:
    """Check what usually goes wrong for a volunteer and print a fix for each failure."""
    from cli.doctor import run_doctor

    ok = run_doctor(
        initial_peers=initial_peers_or_env(initial_peers),
        identity_path=identity_path,
        timeout_s=timeout_s,
        host=host,
        port=port,
        as_json=as_json,
    )
    raise SystemExit(0 if ok else 1)
