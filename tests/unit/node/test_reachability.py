"""Which addresses the dial-back service agrees to dial: only the requester's own observed IP.

Pure functions only: nothing here sends a packet (the addresses are never dialled).
"""

from __future__ import annotations

import pytest
from multiaddr import Multiaddr

from node.dialable import is_dialable_ip, parse_networks
from node.reachability import (
    MAX_DIAL_BACK_ADDRESSES,
    dial_back_skip_reason,
    dial_targets,
    observed_ip,
    wants_dial_back,
)


def test_dials_the_requested_ports_at_the_observed_ip() -> None:
    targets = dial_targets(
        ["/ip4/8.8.4.4/tcp/31337", "/ip4/8.8.4.4/tcp/4001"], "8.8.4.4", allow_private=False
    )
    assert targets == [Multiaddr("/ip4/8.8.4.4/tcp/31337"), Multiaddr("/ip4/8.8.4.4/tcp/4001")]


@pytest.mark.parametrize(
    ("addresses", "reason"),
    [
        (["/ip4/9.9.9.9/tcp/22"], "not the address this request came from"),
        (["/dns4/example.com/tcp/80"], "must be /ip4/"),
        (["/ip4/8.8.4.4/udp/1"], "must be /ip4/"),
        (
            ["/ip4/8.8.4.4/tcp/1/p2p/12D3KooWJWoaqZhDaoEFshF7Rh1bpY9ohihFhzcW6d69Lr2NASuq"],
            "must be /ip4/",
        ),
        (["not a multiaddr"], "malformed"),
        ([], "give 1-"),
        (["/ip4/8.8.4.4/tcp/1"] * (MAX_DIAL_BACK_ADDRESSES + 1), "give 1-"),
        (["/ip4/8.8.4.4/tcp/" + "1" * 300], "too long"),
    ],
)
def test_requests_aimed_elsewhere_or_malformed_are_refused(addresses: list[str], reason: str) -> None:
    result = dial_targets(addresses, "8.8.4.4", allow_private=False)
    assert isinstance(result, str) and reason in result


@pytest.mark.parametrize(
    "ip", ["127.0.0.1", "10.1.2.3", "192.168.0.4", "172.16.0.1", "169.254.1.1", "::1", "fe80::1"]
)
def test_private_requesters_are_dialled_only_by_a_local_swarm_seed(ip: str) -> None:
    kind = "ip6" if ":" in ip else "ip4"
    request = [f"/{kind}/{ip}/tcp/4001"]
    refused = dial_targets(request, ip, allow_private=False)
    assert isinstance(refused, str) and "not a public address" in refused
    assert dial_targets(request, ip, allow_private=True) == [Multiaddr(request[0])]
    assert not is_dialable_ip(ip)


@pytest.mark.parametrize("ip", ["10.77.3.4", "fd00:77::5"])
def test_a_seed_dials_back_requesters_in_the_networks_its_operator_made_dialable(ip: str) -> None:
    kind = "ip6" if ":" in ip else "ip4"
    networks = parse_networks(["10.77.0.0/16", "fd00:77::/32"])
    request = [f"/{kind}/{ip}/tcp/4001"]
    assert dial_targets(request, ip, allow_private=False, networks=networks) == [Multiaddr(request[0])]
    outside = "10.78.0.1"
    refused = dial_targets([f"/ip4/{outside}/tcp/4001"], outside, allow_private=False, networks=networks)
    assert isinstance(refused, str) and "--dialable-network" in refused


@pytest.mark.parametrize("ip", ["100.64.0.7", "0.0.0.0", "224.0.0.1", "192.0.2.1", "::"])
def test_shared_unspecified_multicast_and_documentation_addresses_are_never_public(ip: str) -> None:
    assert not is_dialable_ip(ip)


def test_a_dialable_network_that_is_not_a_network_is_refused_with_an_example() -> None:
    with pytest.raises(ValueError, match=r"e\.g\. 10\.77\.0\.0/16"):
        parse_networks(["10.77.0.1/16"])  # host bits set: a typo for the network or for one host
    with pytest.raises(ValueError, match=r"e\.g\. 10\.77\.0\.0/16"):
        parse_networks(["lan"])


def test_observed_ip_of_direct_and_relayed_streams() -> None:
    assert observed_ip(Multiaddr("/ip4/8.8.4.4/tcp/5555")) == "8.8.4.4"
    assert observed_ip(Multiaddr("/ip6/2606:4700::1111/tcp/5555")) == "2606:4700::1111"
    relayed = "/ip4/198.51.100.1/tcp/1/p2p/12D3KooWJWoaqZhDaoEFshF7Rh1bpY9ohihFhzcW6d69Lr2NASuq/p2p-circuit"
    assert observed_ip(Multiaddr(relayed)) is None


SEED_ID = "12D3KooWJWoaqZhDaoEFshF7Rh1bpY9ohihFhzcW6d69Lr2NASuq"


@pytest.mark.parametrize(
    ("mode", "seeds", "wanted"),
    [
        ("auto", [f"/ip4/203.0.113.5/tcp/31337/p2p/{SEED_ID}"], True),
        ("auto", [f"/dns4/seed.example.org/tcp/31337/p2p/{SEED_ID}"], True),
        # one public seed among loopback ones: this node may be reached from outside
        ("auto", [f"/ip4/127.0.0.1/tcp/1/p2p/{SEED_ID}", f"/ip4/203.0.113.5/tcp/2/p2p/{SEED_ID}"], True),
        ("auto", [f"/ip4/127.0.0.1/tcp/1/p2p/{SEED_ID}", f"/ip6/::1/tcp/2/p2p/{SEED_ID}"], False),
        ("auto", [], False),  # a new swarm: nobody to ask
        ("on", [f"/ip4/127.0.0.1/tcp/1/p2p/{SEED_ID}"], True),
        ("off", [f"/ip4/203.0.113.5/tcp/31337/p2p/{SEED_ID}"], False),
    ],
)
def test_a_joiner_asks_for_a_dial_back_unless_its_swarm_is_on_loopback_or_told_not_to(
    mode: str, seeds: list[str], wanted: bool
) -> None:
    assert wants_dial_back(mode, seeds) is wanted
    assert (dial_back_skip_reason(mode, seeds) is None) is wanted


def test_a_skipped_dial_back_says_why() -> None:
    loopback, public = f"/ip4/127.0.0.1/tcp/1/p2p/{SEED_ID}", f"/ip4/203.0.113.5/tcp/31337/p2p/{SEED_ID}"
    assert dial_back_skip_reason("auto", [loopback]) == (
        "every seed is on loopback: a swarm on this machine needs no dial-back"
    )
    assert dial_back_skip_reason("off", [public]) == "the reachability check is off"
    assert dial_back_skip_reason("auto", []) == "no seed to ask"
