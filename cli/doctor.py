"""`hivenet doctor`: checks what usually goes wrong for a volunteer and prints a fix for each.

Checks: the identity file, versions, free disk and memory, whether each seed is reachable,
and whether a seed can dial this node back from a fresh connection (see node.reachability),
wherever `hivenet join` would ask for that dial-back.
"""

from __future__ import annotations

import shutil
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from cli.output import make_console

if TYPE_CHECKING:
    from node.node import HivenetNode

MIN_FREE_DISK_BYTES = 2 << 30
MIN_FREE_MEMORY_BYTES = 1 << 30


@dataclass
class Check:
    """One line of the report."""

    name: str
    ok: bool
    detail: str
    fix: str = ""


def _check_identity(identity_path: Path | None) -> Check:
    from node.config import default_identity_path
    from node.identity import load_identity
    from protocol.errors import IdentityError

    path = identity_path or default_identity_path()
    if not path.exists():
        return Check("identity", True, f"none yet at {path}; one is created on the first start")
    try:
        identity = load_identity(path)
    except IdentityError as exc:
        return Check("identity", False, str(exc).split(";")[0], str(exc))
    return Check("identity", True, f"{path} -> {identity.peer_id.to_base58()}")


def _check_versions() -> Check:
    import hivemind
    import torch

    from protocol.version import PROTOCOL_VERSION, SOFTWARE_VERSION

    ok = sys.version_info >= (3, 11)
    detail = (
        f"hivenet {SOFTWARE_VERSION} (protocol v{PROTOCOL_VERSION}), hivemind {hivemind.__version__}, "
        f"torch {torch.__version__}, python {sys.version.split()[0]}"
    )
    return Check("versions", ok, detail, "" if ok else "install Python 3.11 or newer")


def _check_resources(directory: Path) -> list[Check]:
    import psutil

    directory = directory if directory.exists() else Path.home()
    free_disk = shutil.disk_usage(directory).free
    free_memory = psutil.virtual_memory().available
    return [
        Check(
            "disk",
            free_disk >= MIN_FREE_DISK_BYTES,
            f"{free_disk / 2**30:.1f} GiB free at {directory}",
            f"free at least {MIN_FREE_DISK_BYTES / 2**30:.0f} GiB for checkpoints and weights",
        ),
        Check(
            "memory",
            free_memory >= MIN_FREE_MEMORY_BYTES,
            f"{free_memory / 2**30:.1f} GiB available",
            f"close programs so that at least {MIN_FREE_MEMORY_BYTES / 2**30:.0f} GiB is available",
        ),
    ]


def _check_network(initial_peers: list[str], timeout_s: float, host: str, port: int) -> list[Check]:
    from node.config import load_config
    from node.node import HivenetNode
    from protocol.errors import HivenetError

    if not initial_peers:
        return [
            Check("seeds", False, "no --initial-peers given", "pass the seed multiaddrs of the run you join")
        ]
    try:
        config = load_config(
            initial_peers=initial_peers,
            bootstrap_timeout_s=timeout_s,
            host=host,
            port=port,
        )
    except HivenetError as exc:
        return [Check("seeds", False, "malformed address", str(exc))]
    # a server (not a client), so that the seeds can dial it back
    probe = HivenetNode(config, announce=False, ephemeral_identity=True)
    checks = []
    try:
        try:
            probe.start()
        except HivenetError as exc:
            return [Check("seeds", False, "none reachable", str(exc))]
        for status in probe.seed_statuses:
            checks.append(
                Check(
                    f"seed {status.address[-16:]}",
                    status.reached,
                    status.error or "reachable",
                    "check the address, that the seed runs, and your outgoing firewall",
                )
            )
        checks.append(_check_dial_back(probe, port))
    finally:
        probe.stop()
    return checks


def _check_dial_back(probe: HivenetNode, port: int) -> Check:
    """Whether a seed can dial the started `probe` back, asked only where `hivenet join` asks it too
    (a skipped check passes, saying why it was skipped)."""
    from node.reachability import dial_back_skip_reason

    skipped = dial_back_skip_reason(probe.config.reachability_check, probe.config.initial_peers)
    if skipped is not None:
        return Check("dial-back", True, f"skipped, as join skips it: {skipped}")
    dial_back = probe.check_reachability()  # the seeds that answered, at this node's own addresses
    return Check(
        "dial-back",
        dial_back.reachable,
        dial_back.detail,
        f"open or forward TCP port {port or '(pass --port)'} to this machine, announce your public address "
        "with --announce, or join with --auto-relay so that peers can reach you through a relay",
    )


def run_doctor(
    *,
    initial_peers: list[str],
    identity_path: Path | None,
    timeout_s: float,
    host: str = "0.0.0.0",
    port: int = 0,
    as_json: bool = False,
) -> bool:
    """Run every check, print the report (one JSON document with `as_json`), and return whether all passed."""
    from cli.output import echo_json

    console = make_console(stderr=as_json)
    checks = [_check_identity(identity_path), _check_versions()]
    checks += _check_resources((identity_path or Path.home()).parent)
    with console.status("checking the network (dialling seeds)..."):
        checks += _check_network(initial_peers, timeout_s, host, port)
    if as_json:
        echo_json({"ok": all(check.ok for check in checks), "checks": [asdict(check) for check in checks]})
        return all(check.ok for check in checks)
    for check in checks:
        mark = "[green]ok  [/]" if check.ok else "[red]FAIL[/]"
        console.print(f"{mark} {check.name:<12} {check.detail}", highlight=False)
        if not check.ok and check.fix:
            console.print(f"       fix: {check.fix}", highlight=False)
    return all(check.ok for check in checks)
