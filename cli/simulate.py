"""`hivenet simulate`: a whole swarm on this machine, shown live, torn down on exit or Ctrl-C."""

from __future__ import annotations

import time
from typing import Any

from rich.live import Live
from rich.table import Table

from cli.output import make_console
from node.shutdown import StopRequest
from node.swarm import LocalSwarm
from protocol.node_record import Role


def _swarm_table(swarm: LocalSwarm, started: float) -> Table:
    table = Table(
        title=f"local swarm, run {swarm.run_id!r}, up {time.time() - started:,.0f} s (Ctrl-C to stop)"
    )
    for column in ("node", "peer", "roles", "sees", "DHT peers", "state"):
        table.add_column(column)
    everyone = ([swarm.seed] if swarm.seed else []) + list(swarm.nodes.values())
    for node in everyone:
        status = node.status()
        if status is None:
            table.add_row(node.name, "-", ",".join(node.roles), "-", "-", "starting")
            continue
        table.add_row(
            node.name,
            status.peer_id[-8:],
            ",".join(status.roles),
            str(len(status.live_nodes)),
            str(status.dht_peers),
            status.state if node.alive else "exited",
        )
    return table


def run_simulation(*, num_nodes: int, roles: list[Role], duration_s: float | None, run_id: str) -> None:
    """Start a seed and `num_nodes` nodes, wait until they all see each other, and show them."""
    console = make_console()
    started = time.time()
    with LocalSwarm(run_id=run_id) as swarm:
        with console.status(f"starting a seed and {num_nodes} nodes on 127.0.0.1..."):
            swarm.start(num_nodes, roles=[role.value for role in roles])
        console.print(
            f"[green]swarm converged[/]: {num_nodes + 1} nodes see each other after {time.time() - started:.1f} s; "
            f"seed at {swarm.seed_multiaddr}"
        )
        stop = StopRequest()  # from here on, Ctrl-C ends the loop below and the swarm is torn down
        with Live(_swarm_table(swarm, started), console=console, refresh_per_second=1) as live:
            end = None if duration_s is None else time.monotonic() + duration_s
            while not stop.requested and (end is None or time.monotonic() < end):
                stop.wait(1.0)
                live.update(_swarm_table(swarm, started))
        console.print("stopping the swarm...")
    console.print("all nodes stopped.")


def run_training_simulation(num_trainers: int, config: Any) -> None:
    """Run a DiLoCo run of `num_trainers` trainers on 127.0.0.1 and print the loss per outer step."""
    import threading

    from cli.train import describe_report
    from training.simulation import simulate_diloco

    console = make_console()
    stop = threading.Event()
    signals = StopRequest()

    def watch_signals() -> None:
        while not stop.is_set():
            if signals.wait(0.5):
                console.print("stopping: finishing the outer step in flight...")
                stop.set()

    threading.Thread(target=watch_signals, name="signal-watch", daemon=True).start()
    console.print(
        f"DiLoCo on this machine: {num_trainers} trainers, H={config.diloco.inner_steps} inner steps, "
        f"{config.diloco.max_outer_steps} outer steps, {config.compression} pseudo-gradients"
    )
    started = time.time()
    try:
        reports = simulate_diloco(
            num_trainers,
            config,
            lambda report: console.print(describe_report(report), highlight=False, soft_wrap=True),
            stop_event=stop,
        )
    finally:
        stop.set()
    by_step: dict[int, list[Any]] = {}
    for report in reports:
        by_step.setdefault(report.outer_step, []).append(report)
    table = Table(title=f"loss per outer step ({time.time() - started:.0f} s)")
    for column in ("outer step", "mean train loss", "peers averaged", "identical state"):
        table.add_column(column)
    for step, group in sorted(by_step.items()):
        hashes = {r.outer_hash for r in group}
        table.add_row(
            str(step), f"{sum(r.train_loss for r in group) / len(group):.3f}",
            str(max(r.num_peers for r in group)), "yes" if len(hashes) == 1 else f"no ({len(hashes)} states)",
        )  # fmt: skip
    console.print(table)
