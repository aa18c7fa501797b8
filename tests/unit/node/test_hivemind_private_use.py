"""Every private part of hivemind this code relies on, in one place, checked against the installed hivemind.

The project uses hivemind through its public API except for these. A rename in hivemind would
make an override dead code, or a swap a no-op, without an error anywhere else (the averaging
path's list is what issue #26 replaces with the node's own runtime); this test fails instead,
naming the use. Add a line here for any new private use, or better, avoid it.
"""

from __future__ import annotations

import importlib
import inspect

import pytest
from hivemind.averaging import averager as hivemind_averager
from hivemind.averaging.partition import TensorPartContainer
from hivemind.dht import node as hivemind_dht_node
from hivemind.dht.protocol import DHTProtocol

PRIVATE_USES = [
    # dialling a peer at given addresses: p2pd's connect, which P2P does not expose
    (
        "hivemind.p2p.p2p_daemon_bindings.p2pclient.Client",
        "connect",
        "node/broadcast/dialing.py, node/dht_node.py",
    ),
    ("hivemind.p2p.p2p_daemon_bindings.p2pclient.Client", "disconnect", "node/reachability.py"),
    ("hivemind.p2p.p2p_daemon_bindings.p2pclient.Client", "list_peers", "node/reachability.py"),
    # a P2P replica bound to the caller's event loop needs the daemon's listen address
    ("hivemind.DHT", "_get_p2p_daemon_listen_maddr", "node/rollouts/peers.py, node/broadcast/broadcaster.py"),
    # the averaging path (issue #26 replaces it with the node's own averaging service)
    ("hivemind.p2p.P2P", "_add_protobuf_stream_handler", "node/averaging/stream_limits.py"),
    ("hivemind.p2p.P2P", "send_raw_data", "node/averaging/traffic.py"),
    ("hivemind.averaging.averager.DecentralizedAverager", "_get_handle_name", "node/averaging/averager.py"),
    (
        "hivemind.averaging.averager.DecentralizedAverager",
        "_aggregate_with_group",
        "node/averaging/averager.py",
    ),
    (
        "hivemind.averaging.averager.DecentralizedAverager",
        "_run_allreduce_inplace_",
        "node/averaging/averager.py",
    ),
    (
        "hivemind.averaging.allreduce.AllReduceRunner",
        "_accumulate_parts_streaming",
        "node/averaging/runner.py",
    ),
    ("hivemind.averaging.allreduce.AllReduceRunner", "_communicate_with_peer", "node/averaging/runner.py"),
    ("hivemind.averaging.partition.TensorPartReducer", "accumulate_part", "node/averaging/runner.py"),
    # the DHT guard's rpc_store hands hivemind's own handler one admitted record at a time, and
    # evicts what its quota displaces from the protocol's storage and cache (node/dht_quota.py)
    ("hivemind.dht.protocol.DHTProtocol", "rpc_store", "node/dht_guard.py"),
    ("hivemind.dht.protocol.DHTProtocol", "IS_DICTIONARY", "node/dht_guard.py"),
    ("hivemind.dht.storage.DictionaryDHTValue", "__delitem__", "node/dht_guard.py"),
    ("hivemind.dht.storage.DHTLocalStorage", "__delitem__", "node/dht_guard.py"),
    ("hivemind.utils.mpfuture.MPFuture", "_update_lock", "node/process_locks.py"),
    ("hivemind.utils.mpfuture.MPFuture", "_initialization_lock", "node/process_locks.py"),
    ("hivemind.utils.mpfuture.SharedBytes", "_lock", "node/process_locks.py"),
]


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


def test_the_swapped_module_globals_are_still_looked_up_where_they_are_swapped() -> None:
    # node/averaging/declarations.py swaps the averager module's Matchmaking, node/dht_guard.py the
    # DHT node module's DHTProtocol: both only work while hivemind looks them up there at run time
    assert "Matchmaking(" in inspect.getsource(hivemind_averager)
    assert "DHTProtocol.create(" in inspect.getsource(hivemind_dht_node)
    # the guard reads the storage and cache that DHTProtocol.create makes (node/dht_guard.py)
    assert "self.storage, self.cache =" in inspect.getsource(DHTProtocol)
    assert hasattr(
        TensorPartContainer, "__init__"
    )  # `_input_parts_by_peer` is set there (runner.py reads it)
    assert "_input_parts_by_peer" in inspect.getsource(TensorPartContainer)
