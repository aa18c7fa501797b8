"""`hivenet dashboard`: the contributor dashboard, a web page over the swarm and a receipts ledger.

`hivenet dashboard --run R --initial-peers ADDR [--ledger PATH] [--trainer PEERID ...]
[--validator PEERID ...]` joins the
swarm as an unannounced client with a throwaway identity, re-reads discovery every few seconds,
pulls the receipts of the live nodes into its ledger (`node.receipts`: at most `--pull-peers` nodes
every `--pull-every` seconds, at most `--pull-max` receipts from each, every one re-verified) and
serves the page (`node.dashboard`) on http://127.0.0.1:8080/ until Ctrl-C. `--host` exposes it to
other machines. Without `--initial-peers` it shows the ledger alone.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

import click

from cli.errors import friendly_errors
from cli.ledger import run_signers, signer_options
from cli.output import setup_logging

if TYPE_CHECKING:
    from node.node import HivenetNode


@click.command()
@click.option(
    "--run", "run_id", default="default", show_default=True, envvar="HIVENET_RUN_ID", help="Run id."
)
@click.option("--initial-peers", "initial_peers", multiple=True, help="Seed multiaddr (repeatable).")
@click.option(
    "--ledger",
    "ledger_path",
    type=click.Path(dir_okay=False, path_type=Path),
    help="The receipts ledger (SQLite) to show; default: an empty one for this session.",
)
@signer_options
@click.option(
    "--half-life-days",
    type=click.FloatRange(min=0, min_open=True),
    default=1.0,
    show_default=True,
    help="Half-life of the recent average.",
)
@click.option(
    "--host",
    default="127.0.0.1",
    show_default=True,
    help="Address to serve on; anything but 127.0.0.1 exposes the page to other machines.",
)
@click.option(
    "--port",
    type=click.IntRange(0, 65535),
    default=8080,
    show_default=True,
    help="TCP port (0: any free one).",
)
@click.option(
    "--refresh",
    "refresh_s",
    type=click.FloatRange(min=0.5),
    default=5.0,
    show_default=True,
    help="Seconds between discovery reads.",
)
@click.option(
    "--pull-peers", type=click.IntRange(0, 64), default=4, show_default=True,
    help="Live nodes whose receipts are pulled into the ledger per cycle (0: do not pull).",
)  # fmt: skip
@click.option(
    "--pull-every", "pull_every_s", type=click.FloatRange(min=0.5), default=10.0, show_default=True,
    help="Seconds between pull cycles.",
)  # fmt: skip
@click.option(
    "--pull-max", type=click.IntRange(1, 1_000_000), default=1024, show_default=True,
    help="Most receipts taken from one node per cycle (the rest follows in later cycles).",
)  # fmt: skip
@click.option(
    "--timeout", "timeout_s", type=float, default=15.0, show_default=True, help="Seconds to reach the seeds."
)
@click.option("-v", "--verbose", is_flag=True, help="Debug logging.")
@friendly_errors
def dashboard(
    run_id: str,
    initial_peers: tuple[str, ...],
    ledger_path: Path | None,
    trainers: tuple[str, ...],
    validators: tuple[str, ...],
    trusted: tuple[str, ...],
    half_life_days: float,
    host: str,
    port: int,
    refresh_s: float,
    pull_peers: int,
    pull_every_s: float,
    pull_max: int,
    timeout_s: float,
    verbose: bool,
) -> None:
    """Serve the contributor dashboard: swarm, verification, weights, leaderboard and a page per node."""
    from cli.swarm_queries import ephemeral_client, initial_peers_or_env
    from node.dashboard import DashboardData, DashboardServer, SwarmWatcher
    from node.ledger import Ledger
    from node.receipts import ReceiptExchange, ReceiptsConfig
    from node.shutdown import StopRequest

    setup_logging(verbose, quiet=not verbose)
    trusted_peers = run_signers(trusted, trainers, validators)
    stop = StopRequest()
    scratch = None
    if ledger_path is None:
        scratch = tempfile.TemporaryDirectory(prefix="hivenet-dashboard-")
        ledger_path = Path(scratch.name) / "ledger.db"
        click.echo("no --ledger given: showing an empty ledger for this session", err=True)
    client: HivenetNode | None = None
    watcher: SwarmWatcher | None = None
    server: DashboardServer | None = None
    with Ledger(ledger_path, run_id) as ledger:
        try:
            data = DashboardData(ledger, trusted=trusted_peers, half_life_s=half_life_days * 86400)
            if initial_peers_or_env(initial_peers):
                client = ephemeral_client(initial_peers, run_id, timeout_s)
                watcher = SwarmWatcher(data, client.discover, interval_s=refresh_s)
                watcher.start()
                if pull_peers:
                    assert client.dht is not None
                    pulls = ReceiptsConfig(
                        serve=False, peers_per_cycle=pull_peers, pull_interval_s=pull_every_s,
                        max_receipts_per_pull=pull_max, trusted_signers=[*trainers, *validators, *trusted],
                    )  # fmt: skip
                    client.add_service(
                        ReceiptExchange(
                            dht=client.dht,
                            identity=client.identity,
                            ledger=ledger,
                            config=pulls,
                            trusted_attesters=client.attestations.trusted,
                        )
                    )
            else:
                click.echo("no --initial-peers given: showing the ledger without the swarm", err=True)
            server = DashboardServer(data, host=host, port=port)
            try:
                server.start()
            except OSError as exc:
                raise click.ClickException(f"cannot serve on {host}:{port}: {exc.strerror or exc}") from None
            if not trusted_peers.everyone:
                click.echo(
                    "no --trainer, --validator or --trusted signer given: every receipt counts zero (shown as "
                    "untrusted)",
                    err=True,
                )
            click.echo(f"dashboard of run {run_id!r} at {server.url} (Ctrl-C to stop)", err=True)
            click.echo(server.url)  # alone on stdout, for scripts
            while not stop.wait(1.0):
                pass
        finally:
            if server is not None:
                server.stop()
            if watcher is not None:
                watcher.stop()
            if client is not None:
                client.stop()
    if scratch is not None:
        scratch.cleanup()
