"""Running a joined node in the foreground: a live status line, the roles' progress, the node's
contribution once a minute and at exit, and a clean leave on Ctrl-C or SIGTERM."""

from __future__ import annotations

import sys
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from cli.output import plain_printer
from cli.train import describe_report
from protocol.node_record import Role

if TYPE_CHECKING:
    from node.node import HivenetNode
    from training.trainer_thread import TrainerThread

CONTRIBUTION_EVERY_S = 60.0
REACHABILITY_TIMEOUT_S = 60.0


def run_until_interrupted(
    node: HivenetNode,
    label: str,
    trainer_config: Any = None,
    wait_for_trainers: int = 1,
    rl_config: Any = None,
    rl_checkpoint_dir: Path | None = None,
) -> None:
    """Start `node` (and its trainer, if any), show a live status line until Ctrl-C/SIGTERM, then leave cleanly."""
    from rich.live import Live
    from rich.markup import escape

    from cli.output import make_console
    from node.shutdown import StopRequest

    console = make_console(stderr=True)
    print_plain = plain_printer(console)
    stop = StopRequest()
    trainer: TrainerThread | None = None
    rl: Any = None
    try:
        # an RL node's validator and trainer register their stream handlers after the node started:
        # those roles are announced once they serve, so that no worker dials a protocol not served yet
        withheld = (
            [] if rl_config is None else [r for r in node.config.roles if r in (Role.VALIDATOR, Role.TRAINER)]
        )
        with console.status(f"starting {label} (dialling seeds, joining the DHT)..."):
            node.start(should_stop=lambda: stop.requested, withheld_roles=withheld)
        console.print(f"[green]{label} {node.short_id} running[/] on run [bold]{node.config.run_id}[/]")
        for address in node.multiaddrs():
            click.echo(address)
        sys.stdout.flush()
        if label == "node":
            _check_reachability_in_background(node, console)
        if trainer_config is not None and _wait_for_trainers(node, wait_for_trainers, stop, console):
            from training.trainer_node import start_trainer

            trainer, _ = start_trainer(
                node, trainer_config,
                on_progress=lambda report: print_plain(describe_report(report)),
                wait_for_peers=wait_for_trainers - 1, should_stop=lambda: stop.requested,
            )  # fmt: skip
        if rl_config is not None:
            from cli.rl import RLRoles

            rl = RLRoles(node, rl_config, print_plain, checkpoint_dir=rl_checkpoint_dir)
            if withheld:
                node.announce_roles()
        last_summary = time.monotonic()
        with Live(console=console, refresh_per_second=1, transient=True) as live:
            while not stop.requested and (trainer is None or trainer.alive) and (rl is None or rl.alive):
                if time.monotonic() - last_summary >= CONTRIBUTION_EVERY_S:
                    print_plain(_contribution(node, rl))
                    last_summary = time.monotonic()
                node.refresh_view()
                uptime = time.time() - node.started_at
                training = f" | {trainer.summary()}" if trainer is not None else ""
                training += f" | {rl.summary()}" if rl is not None else ""
                training = escape(training)  # it quotes what peers sent (verdict reasons, names)
                live.update(
                    f"[bold]{label}[/] {node.short_id} | DHT peers {node.dht_peer_count()} | live nodes in run "
                    f"{len(node.live_nodes)} | uptime {uptime:,.0f} s{training} | Ctrl-C to leave"
                )
                stop.wait(min(node.config.refresh_interval_s, 5.0))
        if trainer is not None:
            console.print("finishing the outer step in flight and writing a checkpoint...")
            trainer.stop()
        print_plain(_contribution(node, rl))
        console.print("leaving the swarm cleanly...")
    finally:
        if rl is not None:
            rl.stop()
        if trainer is not None:
            trainer.stop()
        node.stop()
    console.print("left.")


def _check_reachability_in_background(node: HivenetNode, console: Any) -> None:
    """Ask the seeds for a dial-back (when the config wants one) and print the outcome, without
    holding up the node or its Ctrl-C: the seed that reached this node earns a receipt."""
    from rich.markup import escape

    from node.reachability import wants_dial_back

    if not wants_dial_back(node.config.reachability_check, node.config.initial_peers):
        return

    def check() -> None:
        try:
            outcome = node.check_reachability(timeout_s=REACHABILITY_TIMEOUT_S)
        except Exception as exc:  # the node stopped meanwhile, or no seed answered in time
            if node.state == "running":
                console.print(f"[yellow]reachability check failed:[/] {escape(repr(exc))}", highlight=False)
            return
        if outcome.reachable:
            console.print(f"[green]reachable:[/] {escape(outcome.detail)}", highlight=False, soft_wrap=True)
        elif not outcome.answered:
            console.print(
                f"[yellow]reachability unknown:[/] {escape(outcome.detail)}. No seed could check it; the node "
                "asks again later (`hivenet doctor` checks now)",
                highlight=False,
                soft_wrap=True,
            )
        else:
            console.print(
                f"[yellow]not reachable from outside:[/] {escape(outcome.detail)}. Peers cannot dial this node: open or "
                "forward its TCP port (--port), announce your public address with --announce, join with "
                "--auto-relay to be reached through a relay, or run `hivenet doctor` for details",
                highlight=False,
                soft_wrap=True,
            )

    threading.Thread(target=check, name="reachability-check", daemon=True).start()


def _contribution(node: HivenetNode, rl: Any) -> str:
    """This node's contribution line (see `cli.contribution`), counted now."""
    from hivemind.p2p import PeerID

    from cli.contribution import contribution_line
    from node.ledger import RunSigners

    if rl is not None:
        trainers = frozenset(PeerID.from_base58(p).to_bytes() for p in rl.config.authorized_publishers)
        validators = frozenset(PeerID.from_base58(p).to_bytes() for p in rl.config.trusted_validators)
        # each trainer runs a validator of its own
        node.own_credit.signers = RunSigners(validators=trainers | validators, trainers=trainers)
    return contribution_line(node.metrics.figures(), node.own_credit.figures(fresh=True))


def _wait_for_trainers(node: HivenetNode, count: int, stop: Any, console: Any) -> bool:
    """Wait until `count` trainers are live in the run; False if a stop was requested first."""
    with console.status(f"waiting for {count} trainers in run {node.config.run_id!r}..."):
        while not stop.requested:
            if len(node.discover(Role.TRAINER)) >= count:
                return True
            stop.wait(1.0)
    return False
