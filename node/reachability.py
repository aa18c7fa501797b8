"""Dial-back: can peers reach this node? Seeds serve the check; `hivenet doctor` asks for it, and
so does `hivenet join` once it has joined a swarm whose seeds are not all on loopback.

The requester names the TCP ports it listens on; the seed dials them **only at the IP address
it observes the request coming from**, so the service cannot be aimed at a third party. The
dial comes from a separate probe daemon of the seed's (no connection shared with the requester,
disconnected after every probe), and libp2p authenticates it against the requester's PeerID.

The requester that was reached signs a seed receipt for the seed that dialled it
(`HivenetNode.check_reachability`, `node.receipts.seeds`): `request_dial_back` says which one.
The seed answers it with an address attestation signed by its identity key
(`protocol.address_attestation`): the requester's PeerID and the addresses the probe reached, which
the requester publishes so that peers that trust this seed dial it there (`node.attestations`,
`node.broadcast.dialing`). A seed without a key (an old one) attests nothing.

Limits: the request is one size-capped frame read under a timeout; loopback, private and
link-local IPs are refused unless the seed itself only listens on loopback (a local test
swarm); each source IP gets one probe per cooldown period (PeerIDs are free to mint, IPs are
not); a few probes run at once, so one slow probe does not lock everyone else out.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
import time
from collections import OrderedDict
from collections.abc import Collection
from dataclasses import dataclass

import hivemind
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from hivemind.dht.node import DHTNode
from hivemind.p2p import P2P, PeerID
from multiaddr import Multiaddr

from node.broadcast.wire import read_frame, write_frame
from node.dialable import IPNetwork, is_dialable_ip, parse_networks
from protocol import hivenet_pb2 as pb
from protocol.address_attestation import (
    MAX_ATTESTATION_BYTES,
    MAX_ATTESTED_ADDRESSES,
    open_attestation,
    seal_attestation,
)
from protocol.errors import InvalidMessage
from protocol.limits import MAX_ADDRESS_CHARS
from protocol.untrusted import parse_untrusted

logger = logging.getLogger(__name__)

DIAL_BACK_PROTOCOL = "hivenet.v1.dial_back"
MAX_DIAL_BACK_ADDRESSES = 8
MAX_DIAL_BACK_REQUEST_BYTES = MAX_DIAL_BACK_ADDRESSES * (MAX_ADDRESS_CHARS + 8)
MAX_DIAL_BACK_RESPONSE_BYTES = 1024 + MAX_ATTESTATION_BYTES
DIAL_BACK_TIMEOUT_S = 10.0
DIAL_BACK_REQUEST_TIMEOUT_S = 5.0
DIAL_BACK_COOLDOWN_S = 30.0
MAX_CONCURRENT_PROBES = 4
_MAX_REMEMBERED_SOURCES = 4096
_IP_PROTOCOLS = ("ip4", "ip6")


def observed_ip(addr: Multiaddr) -> str | None:
    """The IP a stream arrived from, or None if it came through a relay or without an IP."""
    names = [proto.name for proto in addr.protocols()]
    if "p2p-circuit" in names:
        return None
    for name in _IP_PROTOCOLS:
        if name in names:
            return str(addr.value_for_protocol(name))
    return None


def all_loopback(addresses: list[Multiaddr]) -> bool:
    """Whether there are addresses and every one is an IP on loopback (a swarm on one machine)."""
    ips = [observed_ip(address) for address in addresses]
    return bool(ips) and all(ip is not None and ipaddress.ip_address(ip).is_loopback for ip in ips)


def dial_back_skip_reason(mode: str, initial_peers: list[str]) -> str | None:
    """Why a node does not ask its seeds for a dial-back, or None when it asks: `mode` "on"/"off",
    or "auto": unless every initial peer is on loopback, where being reached back proves nothing."""
    if mode != "auto":
        return None if mode == "on" else f"the reachability check is {mode}"
    if not initial_peers:
        return "no seed to ask"
    if all_loopback([Multiaddr(peer) for peer in initial_peers]):
        return "every seed is on loopback: a swarm on this machine needs no dial-back"
    return None


def wants_dial_back(mode: str, initial_peers: list[str]) -> bool:
    """Whether a joining node asks its seeds for a dial-back (see `dial_back_skip_reason`)."""
    return dial_back_skip_reason(mode, initial_peers) is None


def dial_targets(
    addresses: list[str], ip: str, *, allow_private: bool, networks: Collection[IPNetwork] = ()
) -> list[Multiaddr] | str:
    """The multiaddrs to dial for a request: the requested TCP ports at the observed `ip`.

    Returns the reason instead if the request is malformed, names another host, or `ip` is neither
    public nor in one of the dialable `networks` while `allow_private` is off.
    """
    if not 0 < len(addresses) <= MAX_DIAL_BACK_ADDRESSES:
        return f"give 1-{MAX_DIAL_BACK_ADDRESSES} addresses"
    if not allow_private and not is_dialable_ip(ip, networks):
        return (
            f"{ip} is not a public address; a seed dials back only public addresses "
            "(and the networks its operator made dialable with --dialable-network)"
        )
    kind = "ip6" if ":" in ip else "ip4"
    targets: list[Multiaddr] = []
    for address in addresses:
        if len(address) > MAX_ADDRESS_CHARS:
            return "address too long"
        try:
            maddr = Multiaddr(address)
            names = [proto.name for proto in maddr.protocols()]
        except Exception:
            return f"malformed multiaddr {address[:80]!r}"
        if names != [kind, "tcp"]:
            return f"{address[:80]!r} must be /{kind}/<your address>/tcp/<port>, e.g. /{kind}/{ip}/tcp/31337"
        if str(maddr.value_for_protocol(kind)) != ip:
            return f"{address[:80]!r} is not the address this request came from ({ip}); a seed dials only you"
        target = Multiaddr(f"/{kind}/{ip}/tcp/{maddr.value_for_protocol('tcp')}")
        if target not in targets:
            targets.append(target)
    return targets


@dataclass
class _SourceLimiter:
    """One probe per source per cooldown; remembers a bounded number of sources."""

    cooldown_s: float
    seen: OrderedDict[str, float]

    def allow(self, source: str) -> bool:
        now = time.monotonic()
        last = self.seen.get(source)
        if last is not None and now - last < self.cooldown_s:
            return False
        self.seen[source] = now
        self.seen.move_to_end(source)
        while len(self.seen) > _MAX_REMEMBERED_SOURCES:
            self.seen.popitem(last=False)
        return True


class DialBackService:
    """The seed side: dials requesters back at their observed IP, from one reused probe daemon."""

    def __init__(
        self,
        *,
        allow_private: bool,
        networks: Collection[IPNetwork] = (),
        cooldown_s: float = DIAL_BACK_COOLDOWN_S,
        attester: Ed25519PrivateKey | None = None,
    ) -> None:
        """`attester`: the seed's identity key, which signs an attestation for each requester reached;
        `networks`: private networks whose requesters it dials back too (`node.dialable`)."""
        self.allow_private = allow_private
        self.networks = tuple(networks)
        self.attester = attester
        self._limiter = _SourceLimiter(cooldown_s, OrderedDict())
        self._slots = asyncio.Semaphore(MAX_CONCURRENT_PROBES)
        self._probe: P2P | None = None
        self._probe_lock = asyncio.Lock()

    async def handle_stream(
        self, stream_info: object, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        """Serve one request: a capped frame in (under a timeout), one response frame out."""
        try:
            response = await self._answer(stream_info, reader)
            await asyncio.wait_for(
                write_frame(writer, response.SerializeToString()), DIAL_BACK_REQUEST_TIMEOUT_S
            )
        except Exception as exc:
            logger.debug("dial-back stream failed: %r", exc)
        finally:
            writer.close()

    async def _answer(self, stream_info: object, reader: asyncio.StreamReader) -> pb.DialBackResponse:
        try:
            raw = await asyncio.wait_for(
                read_frame(reader, MAX_DIAL_BACK_REQUEST_BYTES), DIAL_BACK_REQUEST_TIMEOUT_S
            )
            request = parse_untrusted(pb.DialBackRequest, raw or b"", "dial-back request")
        except (InvalidMessage, TimeoutError) as exc:
            return pb.DialBackResponse(
                code=pb.DIAL_BACK_BAD_REQUEST, detail=f"unreadable request: {exc}"[:200]
            )
        ip = observed_ip(stream_info.addr)  # type: ignore[attr-defined]
        if ip is None:
            return pb.DialBackResponse(
                code=pb.DIAL_BACK_BAD_REQUEST, detail="connect to the seed directly (not through a relay)"
            )
        targets = dial_targets(
            list(request.addresses), ip, allow_private=self.allow_private, networks=self.networks
        )
        if isinstance(targets, str):
            return pb.DialBackResponse(code=pb.DIAL_BACK_BAD_REQUEST, detail=targets)
        # in a local swarm every node shares the loopback IP, so there the source is the PeerID too
        source = f"{ip}/{stream_info.peer_id}" if self.allow_private else ip  # type: ignore[attr-defined]
        if self._slots.locked() or not self._limiter.allow(source):
            return pb.DialBackResponse(code=pb.DIAL_BACK_RATE_LIMITED, detail="try again in a minute")
        async with self._slots:
            return await self._dial(stream_info.peer_id, targets)  # type: ignore[attr-defined]

    async def _probe_daemon(self) -> P2P:
        async with self._probe_lock:
            if self._probe is None:
                self._probe = await P2P.create(
                    host_maddrs=[], no_listen=True, use_relay=False, auto_nat=False, nat_port_map=False
                )
            return self._probe

    async def _dial(self, requester: PeerID, targets: list[Multiaddr]) -> pb.DialBackResponse:
        probe = await self._probe_daemon()
        with contextlib.suppress(Exception):  # a connection left from an earlier probe must not count
            await probe._client.disconnect(requester)
        try:
            await asyncio.wait_for(probe._client.connect(requester, targets), DIAL_BACK_TIMEOUT_S)
            used = [
                address
                for peer in await probe._client.list_peers()
                if peer.peer_id == requester
                for address in peer.addrs
            ]
        except Exception as exc:
            reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            return pb.DialBackResponse(code=pb.DIAL_BACK_UNREACHABLE, detail=reason[:200])
        finally:
            with contextlib.suppress(Exception):
                await probe._client.disconnect(requester)
        # only a connection to one of the requested addresses proves them reachable (libp2p may
        # also dial addresses it learnt elsewhere)
        if not any(address in targets for address in used):
            return pb.DialBackResponse(
                code=pb.DIAL_BACK_UNREACHABLE,
                detail=f"not reachable at the requested address (connected via {', '.join(map(str, used)) or '-'})"[
                    :200
                ],
            )
        return pb.DialBackResponse(
            code=pb.DIAL_BACK_REACHABLE,
            detail="reached from a separate connection",
            attestation=self._attest(requester, [str(target) for target in targets if target in used]),
        )

    def _attest(self, requester: PeerID, reached: list[str]) -> bytes:
        """The sealed attestation that the probe reached `requester` at `reached` (b"" without a key)."""
        if self.attester is None:
            return b""
        try:
            return seal_attestation(
                self.attester, subject=requester.to_bytes(), addresses=reached[:MAX_ATTESTED_ADDRESSES]
            )
        except InvalidMessage as exc:  # a requester whose PeerID is not an Ed25519 key
            logger.debug("no attestation for %s: %s", requester, exc)
            return b""


async def serve_dial_back(
    _dht: hivemind.DHT,
    node: DHTNode,
    *,
    attester_key: bytes | None = None,
    dialable_networks: tuple[str, ...] = (),
) -> None:
    """Register the dial-back service on a running DHT's p2pd (run via `node.runtime.in_dht`);
    `attester_key`: the raw private key of the seed's identity, which signs the attestations;
    `dialable_networks`: the operator's private networks whose nodes it dials back too."""
    maddrs = await node.p2p.get_visible_maddrs()
    service = DialBackService(
        allow_private=all_loopback([Multiaddr(str(addr)) for addr in maddrs]),
        networks=parse_networks(dialable_networks),
        attester=Ed25519PrivateKey.from_private_bytes(attester_key) if attester_key is not None else None,
    )
    await node.p2p.add_binary_stream_handler(DIAL_BACK_PROTOCOL, service.handle_stream)


@dataclass(frozen=True)
class DialBackOutcome:
    """What asking the seeds for a dial-back found."""

    reachable: bool
    detail: str
    seed: bytes | None = None
    """The PeerID of the seed that reached this node back (None unless `reachable`)."""
    answered: bool = True
    """Whether a seed tried to dial back at all (False: no seed offered the service; nothing is known)."""
    attestation: bytes | None = None
    """The sealed address attestation `seed` answered with, verified: by `seed`, about this node."""


async def request_dial_back(
    _dht: hivemind.DHT, node: DHTNode, seeds: list[str], addresses: list[str]
) -> DialBackOutcome:
    """Ask each seed in turn to dial `addresses` back, until one reaches them (run via `in_dht`)."""
    details = []
    answered = False
    for seed in seeds:
        peer_id = PeerID.from_base58(Multiaddr(seed)["p2p"])
        try:
            response = await asyncio.wait_for(
                _request(node.p2p, peer_id, pb.DialBackRequest(addresses=addresses)), DIAL_BACK_TIMEOUT_S * 2
            )
        except Exception as exc:
            details.append(f"{seed[-12:]}: no dial-back answer ({exc or type(exc).__name__})")
            continue
        answered = True
        if response.code == pb.DIAL_BACK_REACHABLE:
            return DialBackOutcome(
                True,
                f"seed {peer_id.to_base58()[-8:]} reached this node from a separate connection",
                peer_id.to_bytes(),
                attestation=_verified(response.attestation, peer_id, node.p2p.peer_id),
            )
        details.append(f"{peer_id.to_base58()[-8:]}: {pb.DialBackCode.Name(response.code)} {response.detail}")
    return DialBackOutcome(False, "; ".join(details) or "no seed to ask", answered=answered)


async def call_dial_back(
    dht: hivemind.DHT, node: DHTNode, seeds: list[str], addresses: list[str]
) -> tuple[bool, str]:
    """Ask each seed in turn to dial `addresses` back; (reachable, what the seeds said)."""
    outcome = await request_dial_back(dht, node, seeds, addresses)
    return outcome.reachable, outcome.detail


def _verified(attestation: bytes, seed: PeerID, own: PeerID) -> bytes | None:
    """`attestation` if `seed` signed it about this node (an old seed sends none), else None."""
    if not attestation:
        return None
    try:
        open_attestation(attestation, subject=own.to_bytes(), signers={seed.to_bytes()})
    except InvalidMessage as exc:
        logger.info("seed %s sent an invalid address attestation: %s", seed.to_base58()[-8:], exc)
        return None
    return attestation


async def _request(p2p: P2P, peer_id: PeerID, request: pb.DialBackRequest) -> pb.DialBackResponse:
    _, reader, writer = await p2p.call_binary_stream_handler(peer_id, DIAL_BACK_PROTOCOL)
    try:
        await write_frame(writer, request.SerializeToString())
        raw = await read_frame(reader, MAX_DIAL_BACK_RESPONSE_BYTES)
        if not raw:  # every answer names an outcome: nothing at all says nothing about us
            raise ConnectionError("the seed closed the stream without an answer")
        return parse_untrusted(pb.DialBackResponse, raw, "dial-back response")
    finally:
        writer.close()
