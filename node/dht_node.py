"""Starting a hivemind DHT for a node and bootstrapping it from seed nodes, with retries.

Every seed is dialled and pinged on its own, so a seed that cannot be reached is reported
by name; unreachable seeds are retried with exponential backoff until the bootstrap
deadline. A node that reaches no seed at all raises PeerUnreachable.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import socket
import tempfile
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from multiprocessing.connection import Connection
from multiprocessing.reduction import ForkingPickler
from pathlib import Path
from typing import Any

import hivemind
import psutil
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from hivemind.dht.node import DHTNode
from hivemind.p2p import PeerID
from hivemind.p2p.p2p_daemon_bindings.utils import P2PDaemonError
from multiaddr import Multiaddr

from node import dht_guard
from node.config import NodeConfig
from node.dht_quota import QuotaLimits
from node.identity import Identity, create_identity
from node.process_locks import install_robust_mpfuture_locks
from node.runtime import in_dht
from protocol.errors import ConfigError, PeerUnreachable
from protocol.record_validator import SignedRecordValidator

logger = logging.getLogger(__name__)

_PING_TIMEOUT_S = 5.0
_WATCHDOG_PERIOD_S = 0.5
_FIRST_BACKOFF_S = 0.5
_MAX_BACKOFF_S = 8.0
_LOOPBACK_JOIN_TIMEOUT_S = 60.0

# every hivemind process this package starts needs a DHT: they are all forked after this runs
install_robust_mpfuture_locks()


class BootstrapStopped(Exception):
    """`should_stop` turned true while the seeds were being dialled."""


@dataclass
class SeedStatus:
    """Outcome of dialling one initial peer."""

    address: str
    reached: bool
    error: str = ""


class _RequestPipe:
    """The DHT process's end of its request pipe, where a request that cannot be unpickled is dropped.

    A request carries the caller's future, whose own pipe is fetched from the caller's process
    while unpickling. A caller that exits just after sending (an averager shutting down, a
    killed process) makes that fetch fail, with EOFError among others, which hivemind's request
    loop does not catch: the DHT process would die and every later call on it would hang. Such
    a request is raised here as a ConnectionError, which that loop logs before going on; nobody
    is left to answer.
    """

    def __init__(self, pipe: Connection) -> None:
        self._pipe = pipe

    def fileno(self) -> int:
        return self._pipe.fileno()

    def poll(self, timeout: float = 0.0) -> bool:
        return self._pipe.poll(timeout)

    def recv(self) -> Any:
        data = self._pipe.recv_bytes()  # a closed pipe still raises EOFError: the caller is gone
        try:
            return ForkingPickler.loads(data)
        except Exception as e:
            raise ConnectionError(f"dropped a DHT request whose caller could not be reached: {e!r}") from e

    def send(self, obj: object) -> None:
        self._pipe.send(obj)


class _IsolatedDHT(hivemind.DHT):
    """A hivemind DHT whose child process (and p2pd under it) lives in its own process group.

    A terminal's Ctrl-C is sent to the whole foreground process group; if it reached p2pd,
    the daemon would die before the node could withdraw its record. Isolated, only the main
    process sees SIGINT and leaves cleanly. A watchdog takes the group down if the main
    process dies without a goodbye (e.g. SIGKILL), so nothing is orphaned.

    It keeps the private key of its PeerID (`signing_key`), so that what runs on it (the DiLoCo
    averager's signed declarations) can sign as this peer, and the PeerIDs whose records its
    storage quota ranks first (`trusted_owners`: itself and the run's signers it was given).
    """

    def __init__(
        self,
        *args: Any,
        signing_key: Ed25519PrivateKey,
        trusted_owners: frozenset[bytes] = frozenset(),
        quota_limits: QuotaLimits | None = None,
        **kwargs: Any,
    ) -> None:
        self.signing_key = signing_key
        self.trusted_owners = trusted_owners
        self.quota_limits = quota_limits
        super().__init__(*args, **kwargs)

    def run(self) -> None:
        os.setpgrp()
        signal.signal(signal.SIGTERM, signal.SIG_DFL)  # drop handlers inherited from the parent
        parent = os.getppid()

        def watchdog() -> None:
            while os.getppid() == parent:
                time.sleep(_WATCHDOG_PERIOD_S)
            os.killpg(os.getpgrp(), signal.SIGKILL)

        threading.Thread(target=watchdog, name="parent-watchdog", daemon=True).start()
        dht_guard.install(self.trusted_owners, self.quota_limits)
        requests: Connection = self._inner_pipe  # type: ignore[has-type]
        self._inner_pipe = _RequestPipe(requests)
        try:
            super().run()
        finally:
            # daemons started inside the DHT process (e.g. the dial-back probe) end with it
            for child in psutil.Process().children(recursive=True):
                with contextlib.suppress(psutil.Error):
                    child.kill()


def signing_key_of(dht: hivemind.DHT) -> Ed25519PrivateKey | None:
    """The private key of `dht`'s PeerID, if it was started here (`start_dht`, `start_loopback_dht`)."""
    return getattr(dht, "signing_key", None)


def start_dht(config: NodeConfig, identity: Identity, *, client_mode: bool = False) -> hivemind.DHT:
    """Start this node's DHT (its own p2pd) listening per `config`, signed with `identity`.

    Seeds are not dialled here; call `bootstrap` next. A port that is taken (by any program, or by
    another node: p2pd listens with SO_REUSEPORT, so two daemons would share one port and split its
    connections) is a ConfigError naming it.
    """
    if config.port:
        check_port_free(config.host, config.port)
    try:
        return _start_dht(config, identity, client_mode=client_mode)
    except P2PDaemonError as exc:
        raise ConfigError(
            f"the libp2p daemon did not start on {config.host}:{config.port} ({str(exc).strip()[-200:]}): "
            "check --host and --port, or pick --port 0 for any free port"
        ) from None


def check_port_free(host: str, port: int) -> None:
    """ConfigError unless TCP `port` on `host` can be listened on by this node alone."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(
            socket.SOL_SOCKET, socket.SO_REUSEADDR, 1
        )  # only a listener refuses it, not TIME_WAIT
        try:
            probe.bind((host, port))
        except OSError as exc:
            raise ConfigError(
                f"cannot listen on {host}:{port} ({exc.strerror or exc}): another program or another hivenet "
                "node (a seed?) holds that port; stop it, or pick another --port"
            ) from None


def _start_dht(config: NodeConfig, identity: Identity, *, client_mode: bool) -> hivemind.DHT:
    return _IsolatedDHT(
        signing_key=identity.private_key,
        trusted_owners=frozenset(
            [identity.peer_id.to_bytes(), *(PeerID.from_base58(p).to_bytes() for p in config.trusted_signers)]
        ),
        # p2pd refuses to start if it cannot reach its bootstrap peers, so seeds are dialled by
        # `bootstrap` afterwards, where each failure is retried and reported by name
        initial_peers=None,
        start=True,
        client_mode=client_mode,
        host_maddrs=config.host_maddrs,
        announce_maddrs=config.announce_addresses or None,
        identity_path=str(identity.path),
        check_if_identity_free=False,  # hivemind's check assumes RSA keys; we check via node records
        record_validators=[SignedRecordValidator()],
        use_relay=True,
        use_auto_relay=config.use_auto_relay,
        wait_timeout=_PING_TIMEOUT_S,
    )


def start_loopback_dht(
    initial_peers: list[str] | None = None,
    *,
    client_mode: bool = False,
    identity: Identity | None = None,
    quota_limits: QuotaLimits | None = None,
    trusted_owners: frozenset[bytes] = frozenset(),
    listen_ip: str = "127.0.0.1",
) -> hivemind.DHT:
    """A DHT on 127.0.0.1 (or `listen_ip`: a lab host's address) with the production record validator, as `identity` (else an ephemeral one).

    For local swarms (simulations, tests, benchmarks): the records it accepts are checked exactly
    as a public node checks them. Give `identity` when the node also signs records or serves
    streams as that PeerID (the weight broadcast does both); an ephemeral identity is an Ed25519
    key too, whose file is deleted once the daemon has read it. It joins `initial_peers` the way a
    public node joins its seeds (`bootstrap`), after its daemon is up: p2pd dials the peers it is
    handed before it reports ready, so a peer stalled by load would make the daemon fail to start.
    `quota_limits` replaces the defaults of its storage quota (`node.dht_quota`), whose records of
    `trusted_owners` (with its own) outrank everyone's, as the run's signers do on a public node.
    """
    with tempfile.TemporaryDirectory(prefix="hivenet-ephemeral-") as scratch:
        key = identity if identity is not None else create_identity(Path(scratch) / "identity.key")
        dht = _IsolatedDHT(
            signing_key=key.private_key,
            start=True,
            host_maddrs=[f"/ip4/{listen_ip}/tcp/0"],
            client_mode=client_mode,
            quota_limits=quota_limits,
            trusted_owners=trusted_owners | {key.peer_id.to_bytes()},
            record_validators=[SignedRecordValidator()],
            identity_path=str(key.path),
            check_if_identity_free=False,  # hivemind's check assumes RSA keys
        )
    if initial_peers:
        try:
            # a loop of its own on a thread of its own: callers may already run an event loop
            with ThreadPoolExecutor(max_workers=1, thread_name_prefix="loopback-join") as pool:
                pool.submit(asyncio.run, bootstrap(dht, initial_peers, _LOOPBACK_JOIN_TIMEOUT_S)).result()
        except BaseException:
            dht.shutdown()
            raise
    return dht


async def _dial_seed(_dht: hivemind.DHT, node: DHTNode, address: str) -> str:
    """Connect to one seed and ping its DHT; return '' on success or the reason it failed."""
    maddr = Multiaddr(address)
    peer_id = PeerID.from_base58(maddr["p2p"])
    if peer_id == node.peer_id:
        return ""
    try:
        await node.p2p._client.connect(peer_id, [maddr.decapsulate(Multiaddr(f"/p2p/{maddr['p2p']}"))])
    except Exception as exc:
        return f"cannot connect: {str(exc).splitlines()[0] if str(exc) else type(exc).__name__}"
    node_id = await node.protocol.call_ping(peer_id)
    if node_id is None:
        return "connected, but it does not answer DHT requests (is it a hivenet/hivemind node?)"
    await node.find_nearest_nodes([node.node_id])
    return ""


async def bootstrap(
    dht: hivemind.DHT,
    initial_peers: list[str],
    timeout_s: float,
    should_stop: Callable[[], bool] | None = None,
) -> list[SeedStatus]:
    """Dial every initial peer, retrying failures with backoff until `timeout_s` (on the node's loop).

    Returns the status of each seed. Raises PeerUnreachable naming every seed if none was
    reached in time (and there was at least one to reach). `should_stop` is polled between
    tries; once it is true, bootstrap gives up with BootstrapStopped.
    """
    pending = {address: "not tried yet" for address in initial_peers}
    reached: list[str] = []
    deadline = time.monotonic() + timeout_s
    backoff = _FIRST_BACKOFF_S

    def stopping() -> bool:
        return should_stop is not None and should_stop()

    while pending:
        for address in list(pending):
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            if stopping():
                raise BootstrapStopped("stopped while dialling the initial peers")
            try:
                error = await asyncio.wait_for(
                    in_dht(dht, _dial_seed, address=address), timeout=min(remaining, 2 * _PING_TIMEOUT_S)
                )
            except Exception as exc:
                error = f"no answer ({type(exc).__name__})"
            if error:
                pending[address] = error
                logger.debug("seed %s unreachable: %s", address, error)
            else:
                del pending[address]
                reached.append(address)
        if not pending or time.monotonic() + backoff > deadline:
            break
        wake = time.monotonic() + backoff
        while time.monotonic() < wake:
            if stopping():
                raise BootstrapStopped("stopped while dialling the initial peers")
            await asyncio.sleep(0.1)
        backoff = min(backoff * 2, _MAX_BACKOFF_S)

    statuses = [SeedStatus(address, True) for address in reached]
    statuses += [SeedStatus(address, False, error) for address, error in pending.items()]
    if initial_peers and not reached:
        details = "\n  ".join(f"{s.address}: {s.error}" for s in statuses)
        raise PeerUnreachable(
            f"could not reach any of the {len(initial_peers)} initial peer(s) within {timeout_s:.0f} s:\n  {details}\n"
            "Check the addresses (a seed prints its own at start-up), that the seed is running, and that "
            "outgoing TCP to its port is allowed."
        )
    for status in statuses:
        if not status.reached:
            logger.warning(
                "initial peer %s is unreachable (%s); continuing with the others",
                status.address,
                status.error,
            )
    return statuses
