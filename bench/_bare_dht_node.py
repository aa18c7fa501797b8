"""Baseline for bench/membership.py: a bare hivemind DHT node doing the same membership work.

It stores an unsigned record under one key (subkey = its PeerID), refreshes it, reads the
key back every refresh period and writes the same status file as a hivenet node, so the
benchmark measures hivenet's overhead (signatures, validation, wrapper) over plain hivemind.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import time
from pathlib import Path

import hivemind


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--initial-peer", default=None)
    parser.add_argument("--status-file", type=Path, required=True)
    parser.add_argument("--refresh-interval", type=float, default=2.0)
    parser.add_argument("--record-ttl", type=float, default=8.0)
    args = parser.parse_args()
    stop = False

    def on_signal(*_: object) -> None:
        nonlocal stop
        stop = True

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    dht = hivemind.DHT(
        initial_peers=[args.initial_peer] if args.initial_peer else None,
        host_maddrs=["/ip4/127.0.0.1/tcp/0"],
        start=True,
    )
    me = dht.peer_id.to_base58()
    started = time.time()
    while not stop:
        now = time.time()
        dht.store(
            "bench/nodes",
            {"name": me, "started_at": started},
            expiration_time=now + args.record_ttl,
            subkey=me,
        )
        found = dht.get("bench/nodes", latest=True)
        live = sorted(found.value) if found is not None else []
        tmp = args.status_file.with_suffix(".tmp")
        tmp.write_text(
            json.dumps(
                {
                    "peer_id": me,
                    "multiaddrs": [str(a) for a in dht.get_visible_maddrs()],
                    "live_nodes": live,
                    "pid": os.getpid(),
                }
            )
        )
        os.replace(tmp, args.status_file)
        deadline = time.monotonic() + args.refresh_interval
        while not stop and time.monotonic() < deadline:
            time.sleep(0.1)
    dht.shutdown()


if __name__ == "__main__":
    main()
