"""Which IP addresses a node may dial or dial back: public ones, plus the private networks its
operator declares dialable (`--dialable-network`, for a swarm on a LAN, a cluster or a lab).

Anything else a stranger names (a private, loopback or link-local address) would turn this node
into a scanner of its own network on that stranger's behalf, so it is refused.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Collection, Iterable

IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network
IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address

MAX_DIALABLE_NETWORKS = 32


def parse_networks(items: Iterable[str]) -> list[IPNetwork]:
    """`items` as networks (`10.77.0.0/16`, `fd00::/8`); ValueError naming a bad one."""
    networks: list[IPNetwork] = []
    for item in items:
        try:
            networks.append(ipaddress.ip_network(item.strip(), strict=True))
        except ValueError as exc:
            raise ValueError(
                f"invalid network {item!r} ({exc}): give one as ADDRESS/PREFIX, e.g. 10.77.0.0/16"
            ) from None
    if len(networks) > MAX_DIALABLE_NETWORKS:
        raise ValueError(f"at most {MAX_DIALABLE_NETWORKS} dialable networks")
    return networks


def is_dialable_ip(ip: IPAddress | str, networks: Collection[IPNetwork] = ()) -> bool:
    """Whether `ip` is a global unicast address, or inside one of `networks`."""
    address = ipaddress.ip_address(ip) if isinstance(ip, str) else ip
    if address.is_multicast or address.is_unspecified:
        return False
    return address.is_global or any(address in network for network in networks)
