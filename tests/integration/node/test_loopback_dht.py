"""A loopback DHT joins its swarm even when its initial peer is too busy to answer at first.

Under CPU load a peer's daemon can stall for seconds. p2pd dials its bootstrap peers before it
reports ready, so a DHT whose daemon was handed the initial peers failed to start at all
("Daemon failed to start") when the only peer stalled past p2pd's dial timeout. The node must
start regardless and join once the peer answers again.
"""

from __future__ import annotations

import os
import signal
import threading

import hivemind
import psutil
from hivemind.dht.node import DHTNode

from node.dht_node import start_loopback_dht


def _daemons_of(pid: int) -> list[psutil.Process]:
    return [p for p in psutil.Process(pid).children(recursive=True) if "p2pd" in p.name()]


def test_a_joiner_starts_and_joins_while_its_only_peer_is_stalled() -> None:
    seed = start_loopback_dht()
    joiner = None
    try:
        daemons = _daemons_of(seed.pid)
        assert daemons, "the seed's p2pd was not found"
        address = [str(a) for a in seed.get_visible_maddrs()]
        _signal_all(daemons, signal.SIGSTOP)  # a starved peer: TCP accepts, nothing answers
        resume = threading.Timer(8.0, _signal_all, args=(daemons, signal.SIGCONT))
        resume.start()
        try:
            joiner = start_loopback_dht(address)
        finally:
            resume.join()
        assert str(seed.peer_id) in _routing_peers(joiner)
    finally:
        for dht in (joiner, seed):
            if dht is not None:
                dht.shutdown()


def _signal_all(processes: list[psutil.Process], signum: int) -> None:
    for process in processes:
        os.kill(process.pid, signum)


def _routing_peers(dht: hivemind.DHT) -> list[str]:
    return list(dht.run_coroutine(_peers_in_routing_table))


async def _peers_in_routing_table(_dht: hivemind.DHT, node: DHTNode) -> list[str]:
    return [str(peer_id) for peer_id in node.protocol.routing_table.peer_id_to_uid]
