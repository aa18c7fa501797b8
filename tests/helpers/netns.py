"""Hosts on one machine: Linux network namespaces behind a virtual internet, shaped links and NAT.

`Lab` builds, as root, a namespace that plays the internet (one bridge, no addresses of its own,
no route anywhere else), public hosts on it, and home routers: a namespace with one address on the
internet that masquerades for a LAN of its own and drops every inbound connection its hosts did not
open (nftables), as a consumer router without port forwarding does. Each host's link can be shaped
with `tc tbf` in both directions (`netem` is missing from this kernel, so links add no delay beyond
the queueing a rate limit causes) and cut and restored.

Nothing the lab builds touches the root namespace: its only interfaces live in namespaces it
created, so no packet can leave them, and `close` (also run at exit) deletes every namespace, which
takes their links, bridges and rules with them. `skip_reason()` says why a machine cannot host it.
"""

from __future__ import annotations

import atexit
import contextlib
import ipaddress
import itertools
import os
import re
import shutil
import subprocess
from dataclasses import dataclass, field

import psutil

from node.swarm import Placement, SwarmNode

INTERNET = ipaddress.ip_network("10.77.0.0/16")
"""The lab's internet. A private range, so nodes dial it only when told it is dialable
(`--dialable-network`); a LAN behind a router is 192.168.1.0/24, as at home."""
LAN = ipaddress.ip_network("192.168.1.0/24")
_ROUTER_LAN_IP = "192.168.1.1"
_LAB_NAMESPACE = re.compile(r"hn(\d+)x\d+-[a-z0-9-]+")
_MAX_INTERFACE_NAME = 15


def skip_reason() -> str | None:
    """Why this machine cannot build a lab (None if it can)."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    for tool in ("ip", "tc", "nft"):
        if shutil.which(tool) is None:
            return f"`{tool}` is not installed (Debian: iproute2, nftables)"
    probe = f"hnprobe{os.getpid()}"
    made = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    if made.returncode != 0:
        return f"cannot create a network namespace: {made.stderr.strip()}"
    subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    return None


def remove_stale_labs() -> None:
    """Delete the namespaces of labs whose process died without cleaning up (SIGKILL, a crash)."""
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True)
    for line in listed.stdout.splitlines():
        name = line.split(" ")[0]
        match = _LAB_NAMESPACE.fullmatch(name)
        if match is not None and not psutil.pid_exists(int(match.group(1))):
            subprocess.run(["ip", "netns", "del", name], capture_output=True)


def _run(*argv: str) -> None:
    result = subprocess.run(argv, capture_output=True, text=True)
    if result.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)}: {result.stderr.strip()}")


@dataclass
class Host:
    """One machine of the lab: a namespace with one interface (`eth0`) at `ip`."""

    name: str
    namespace: str
    ip: str
    router: Router | None = None
    """The home router it sits behind (None: a public host)."""
    rate_mbit: float | None = None

    @property
    def prefix(self) -> list[str]:
        """Prepend to a command to run it on this host."""
        return ["ip", "netns", "exec", self.namespace]

    def run(self, *argv: str, timeout_s: float = 60) -> subprocess.CompletedProcess[str]:
        return subprocess.run([*self.prefix, *argv], capture_output=True, text=True, timeout=timeout_s)

    @property
    def placement(self) -> Placement:
        """Where `node.swarm.LocalSwarm` starts a node on this host."""
        return Placement(tuple(self.prefix), self.ip)

    @property
    def public_ip(self) -> str:
        """The address others see this host's connections come from."""
        return self.router.wan_ip if self.router is not None else self.ip


@dataclass
class Router:
    """A home router: `wan_ip` on the internet, masquerading for its LAN's hosts."""

    name: str
    namespace: str
    wan_ip: str
    hosts: list[Host] = field(default_factory=list)


class Lab:
    """A virtual internet with public hosts and NATed ones; use as a context manager."""

    _made = itertools.count()

    def __init__(self) -> None:
        remove_stale_labs()
        self.prefix = f"hn{os.getpid()}x{next(Lab._made)}"
        self.internet = f"{self.prefix}-net"
        self.hosts: dict[str, Host] = {}
        self.routers: dict[str, Router] = {}
        self._namespaces: list[str] = []
        self._next_wan = 10
        self._next_lan: dict[str, int] = {}
        self._links = 0
        self._ports: dict[str, tuple[str, str]] = {}
        self._closed = False
        atexit.register(self.close)
        try:
            self._namespace(self.internet)
            self._in(self.internet, "ip", "link", "add", "br0", "type", "bridge")
            self._in(self.internet, "ip", "link", "set", "br0", "up")
        except BaseException:
            self.close()
            raise

    def __enter__(self) -> Lab:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # building ------------------------------------------------------------------------
    def public_host(self, name: str, *, rate_mbit: float | None = None) -> Host:
        """A host with an address on the internet that anyone can dial."""
        namespace = self._namespace(f"{self.prefix}-{name}")
        ip = self._wan_address()
        self._wire(namespace, "eth0", self.internet, "br0", f"{ip}/{INTERNET.prefixlen}")
        host = Host(name, namespace, ip, rate_mbit=rate_mbit)
        self._shape(host)
        self.hosts[name] = host
        return host

    def router(self, name: str) -> Router:
        """A home router on the internet with an empty LAN behind it."""
        namespace = self._namespace(f"{self.prefix}-{name}")
        wan_ip = self._wan_address()
        self._wire(namespace, "wan0", self.internet, "br0", f"{wan_ip}/{INTERNET.prefixlen}")
        self._in(namespace, "ip", "link", "add", "lan0", "type", "bridge")
        self._in(namespace, "ip", "addr", "add", f"{_ROUTER_LAN_IP}/{LAN.prefixlen}", "dev", "lan0")
        self._in(namespace, "ip", "link", "set", "lan0", "up")
        self._in(namespace, "sysctl", "-q", "-w", "net.ipv4.ip_forward=1")
        rules = """
table ip lab {
    chain forward {
        type filter hook forward priority 0; policy drop;
        ct state established,related accept
        iifname "lan0" oifname "wan0" accept
    }
    chain input {
        type filter hook input priority 0; policy drop;
        ct state established,related accept
        iifname "lo" accept
        iifname "lan0" accept
    }
    chain postrouting {
        type nat hook postrouting priority 100; policy accept;
        oifname "wan0" masquerade
    }
}
"""
        result = subprocess.run(
            ["ip", "netns", "exec", namespace, "nft", "-f", "-"], input=rules, capture_output=True, text=True
        )
        if result.returncode != 0:
            raise RuntimeError(f"nft on {name}: {result.stderr.strip()}")
        router = Router(name, namespace, wan_ip)
        self.routers[name] = router
        self._next_lan[name] = 10
        return router

    def host_behind(self, router: Router, name: str, *, rate_mbit: float | None = None) -> Host:
        """A host on `router`'s LAN: it can open connections out, nobody can open one in."""
        namespace = self._namespace(f"{self.prefix}-{name}")
        ip = str(LAN.network_address + self._next_lan[router.name])
        self._next_lan[router.name] += 1
        self._wire(namespace, "eth0", router.namespace, "lan0", f"{ip}/{LAN.prefixlen}")
        self._in(namespace, "ip", "route", "add", "default", "via", _ROUTER_LAN_IP)
        host = Host(name, namespace, ip, router=router, rate_mbit=rate_mbit)
        self._shape(host)
        router.hosts.append(host)
        self.hosts[name] = host
        return host

    # faults --------------------------------------------------------------------------
    def cut(self, host: Host) -> None:
        """Unplug `host`'s cable: its link goes down, connections over it stall."""
        self._in(host.namespace, "ip", "link", "set", "eth0", "down")

    def restore(self, host: Host) -> None:
        self._in(host.namespace, "ip", "link", "set", "eth0", "up")
        if host.router is not None:
            self._in(host.namespace, "ip", "route", "replace", "default", "via", _ROUTER_LAN_IP)

    # teardown ------------------------------------------------------------------------
    def close(self) -> None:
        """Delete every namespace this lab made (with their links, bridges and rules); idempotent."""
        if self._closed:
            return
        self._closed = True
        for namespace in reversed(self._namespaces):
            with contextlib.suppress(OSError):
                self._kill_processes(namespace)
            subprocess.run(["ip", "netns", "del", namespace], capture_output=True)
        self._namespaces.clear()
        atexit.unregister(self.close)

    # internals -----------------------------------------------------------------------
    @staticmethod
    def _kill_processes(namespace: str) -> None:
        listed = subprocess.run(["ip", "netns", "pids", namespace], capture_output=True, text=True)
        for pid in listed.stdout.split():
            with contextlib.suppress(ProcessLookupError, ValueError):
                os.kill(int(pid), 9)

    def _namespace(self, namespace: str) -> str:
        _run("ip", "netns", "add", namespace)
        self._namespaces.append(namespace)
        self._in(namespace, "ip", "link", "set", "lo", "up")
        return namespace

    def _wan_address(self) -> str:
        ip = str(INTERNET.network_address + self._next_wan)
        self._next_wan += 1
        return ip

    def _wire(self, namespace: str, interface: str, switch_namespace: str, bridge: str, address: str) -> None:
        """A veth pair: `interface` at `address` in `namespace`, its other end a port of `bridge`."""
        self._links += 1
        outer = f"{self.prefix}p{self._links}"
        inner = f"{self.prefix}i{self._links}"
        assert len(outer) <= _MAX_INTERFACE_NAME, outer
        _run(
            "ip",
            "link",
            "add",
            inner,
            "netns",
            namespace,
            "type",
            "veth",
            "peer",
            "name",
            outer,
            "netns",
            switch_namespace,
        )
        self._in(namespace, "ip", "link", "set", inner, "name", interface)
        self._in(namespace, "ip", "addr", "add", address, "dev", interface)
        self._in(namespace, "ip", "link", "set", interface, "up")
        self._in(switch_namespace, "ip", "link", "set", outer, "master", bridge)
        self._in(switch_namespace, "ip", "link", "set", outer, "up")
        self._ports[namespace] = (switch_namespace, outer)

    def _shape(self, host: Host) -> None:
        """Rate-limit `host`'s upload (its eth0) and download (its switch port) to `rate_mbit`."""
        if host.rate_mbit is None:
            return
        rate = f"{host.rate_mbit}mbit"
        # a burst of ~10 ms of traffic (at least 32 KiB) and a queue of ~200 ms, as a modem has
        burst = max(32 * 1024, int(host.rate_mbit * 1e6 / 8 / 100))
        switch_namespace, port = self._ports[host.namespace]
        for namespace, device in ((host.namespace, "eth0"), (switch_namespace, port)):
            self._in(
                namespace, "tc", "qdisc", "replace", "dev", device, "root", "tbf",
                "rate", rate, "burst", str(burst), "latency", "200ms",
            )  # fmt: skip

    @staticmethod
    def _in(namespace: str, *argv: str) -> None:
        _run("ip", "netns", "exec", namespace, *argv)


def logged(node: SwarmNode, text: str) -> bool:
    """Whether `node` (of a `node.swarm.LocalSwarm`) has printed `text`."""
    return text in node.log_file.read_text(errors="replace")
