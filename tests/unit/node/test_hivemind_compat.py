"""Every part of hivemind this code relies on that is not its public API, checked against the installed hivemind.

The project uses hivemind through its public API (DHT, P2P and its stream handlers,
serialization) except for the names below, each with the reason it cannot be avoided. A rename
in hivemind would make such a use fail at run time far from here, or silently do nothing; this
test fails instead, naming the use. It also fails on any hivemind but the pinned one: the list was
checked against that version only. Add a line here for any new private use, or better, avoid it.
"""

from __future__ import annotations

import importlib
import inspect
import re
from pathlib import Path

import hivemind
import pytest
from hivemind.dht import node as hivemind_dht_node
from hivemind.dht.protocol import DHTProtocol

PYPROJECT = Path(__file__).resolve().parents[3] / "pyproject.toml"

PRIVATE_USES = [
    # p2pd client calls that hivemind's P2P does not expose: dialling a peer at given addresses
    # (a seed, a broadcast source, a dial-back target), and the connection list behind the dial-back
    (
        "hivemind.p2p.p2p_daemon_bindings.p2pclient.Client",
        "connect",
        "node/broadcast/dialing.py, node/dht_node.py",
    ),
    ("hivemind.p2p.p2p_daemon_bindings.p2pclient.Client", "disconnect", "node/reachability.py"),
    ("hivemind.p2p.p2p_daemon_bindings.p2pclient.Client", "list_peers", "node/reachability.py"),
    # a P2P replica bound to the caller's event loop needs the daemon's listen address
    # (`DHT.replicate_p2p` caches one replica, bound to the loop of its first caller)
    ("hivemind.DHT", "_get_p2p_daemon_listen_maddr", "node/rollouts/peers.py, node/broadcast/broadcaster.py"),
    # the DHT guard's rpc_store hands hivemind's own handler one admitted record at a time, and
    # evicts what its quota displaces from the protocol's storage and cache (node/dht_quota.py)
    ("hivemind.dht.protocol.DHTProtocol", "rpc_store", "node/dht_guard.py"),
    ("hivemind.dht.protocol.DHTProtocol", "IS_DICTIONARY", "node/dht_guard.py"),
    ("hivemind.dht.storage.DictionaryDHTValue", "__delitem__", "node/dht_guard.py"),
    ("hivemind.dht.storage.DHTLocalStorage", "__delitem__", "node/dht_guard.py"),
    # the DHT runs in a process of its own, driven through MPFutures whose cross-process locks hang
    # every other process when one is killed holding them (node/process_locks.py)
    ("hivemind.utils.mpfuture.MPFuture", "_update_lock", "node/process_locks.py"),
    ("hivemind.utils.mpfuture.MPFuture", "_initialization_lock", "node/process_locks.py"),
    ("hivemind.utils.mpfuture.SharedBytes", "_lock", "node/process_locks.py"),
]


def _pinned_hivemind() -> str:
    match = re.search(r'"hivemind==([^"]+)"', PYPROJECT.read_text())
    assert match, f"{PYPROJECT} pins no exact hivemind version"
    return match.group(1)


def test_the_installed_hivemind_is_the_pinned_one() -> None:
    pinned = _pinned_hivemind()
    assert hivemind.__version__ == pinned, (
        f"hivemind {hivemind.__version__} is installed, but the project pins {pinned} and its private "
        f"uses ({__file__}) were checked against {pinned} only: install hivemind=={pinned} "
        "(bash scripts/setup.sh), or check every use listed here against the new version before "
        "moving the pin"
    )


def _owner(path: str) -> object:
    module, _, name = path.rpartition(".")
    return getattr(importlib.import_module(module), name)


@pytest.mark.parametrize(
    ("owner", "name", "used_by"), PRIVATE_USES, ids=[f"{o}.{n}" for o, n, _ in PRIVATE_USES]
)
def test_each_private_hivemind_name_the_code_relies_on_still_exists(
    owner: str, name: str, used_by: str
) -> None:
    assert hasattr(_owner(owner), name), f"hivemind no longer has {owner}.{name}, which {used_by} relies on"


def test_the_swapped_protocol_class_is_still_looked_up_where_it_is_swapped() -> None:
    # node/dht_guard.py swaps the DHT node module's DHTProtocol: it only works while hivemind
    # looks it up there at run time, and the guard reads the storage and cache that create() makes
    assert "DHTProtocol.create(" in inspect.getsource(hivemind_dht_node)
    assert "self.storage, self.cache =" in inspect.getsource(DHTProtocol)


def test_no_module_outside_the_list_touches_hivemind_averaging() -> None:
    """The DiLoCo round runs on the node's own averaging service: nothing may come back to
    hivemind's averager, its all-reduce or its matchmaking."""
    root = PYPROJECT.parent
    offenders = [
        str(path.relative_to(root))
        for package in ("node", "protocol", "training", "verification", "cli", "bench")
        for path in (root / package).rglob("*.py")
        if re.search(r"hivemind\.averaging|from hivemind import .*DecentralizedAverager", path.read_text())
    ]
    assert offenders == [], f"these modules use hivemind's averager again: {offenders}"
