"""Dial-back: can peers reach this node? Seeds serve the check, `hivenet doctor` asks for it.

The seed dials the requester from a brand-new p2pd (fresh identity, no shared connection),
so a success really means a stranger can open a connection to the requester's addresses.
The dial is authenticated by libp2p against the requester's own PeerID, so the service
cannot be used to probe third parties; it runs one probe at a time and at most once per
requester per cooldown period.
"""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict

import hivemind
from hivemind.dht.node import DHTNode
from hivemind.p2p import P2P, P2PContext, PeerID
from multiaddr import Multiaddr

from protocol import hivenet_pb2 as pb
from protocol.limits import MAX_ADDRESS_CHARS

DIAL_BACK_PROTOCOL = "hivenet.v1.dial_back"
MAX_DIAL_BACK_ADDRESSES = 8
DIAL_BACK_TIMEOUT_S = 10.0
DIAL_BACK_COOLDOWN_S = 30.0
_MAX_REMEMBERED_REQUESTERS = 4096


def _dialable(addresses: list[str]) -> list[Multiaddr] | str:
    """Parse requested addresses; return them, or the reason the request is bad."""
    if not 0 < len(addresses) <= MAX_DIAL_BACK_ADDRESSES:
        return f"give 1-{MAX_DIAL_BACK_ADDRESSES} addresses"
    parsed = []
    for address in addresses:
        if len(address) > MAX_ADDRESS_CHARS:
            return "address too long"
        try:
            maddr = Multiaddr(address)
            names = [proto.name for proto in maddr.protocols()]
        except Exception:
            return f"malformed multiaddr {address[:80]!r}"
        if "p2p" in names or "tcp" not in names or not ({"ip4", "ip6", "dns", "dns4", "dns6"} & set(names)):
            return (
                f"{address[:80]!r} must be a host and TCP port without /p2p, e.g. /ip4/203.0.113.5/tcp/31337"
            )
        parsed.append(maddr)
    return parsed


class DialBackService:
    """The seed side: dials requesters back from a fresh daemon, one at a time, rate-limited."""

    def __init__(self) -> None:
        self._lock = asyncio.Lock()
        self._last_request: OrderedDict[PeerID, float] = OrderedDict()

    async def rpc_dial_back(self, request: pb.DialBackRequest, context: P2PContext) -> pb.DialBackResponse:
        addresses = _dialable(list(request.addresses))
        if isinstance(addresses, str):
            return pb.DialBackResponse(code=pb.DIAL_BACK_BAD_REQUEST, detail=addresses)
        requester = context.remote_id
        now = time.monotonic()
        last = self._last_request.get(requester)
        if (last is not None and now - last < DIAL_BACK_COOLDOWN_S) or self._lock.locked():
            return pb.DialBackResponse(code=pb.DIAL_BACK_RATE_LIMITED, detail="try again in a minute")
        self._last_request[requester] = now
        self._last_request.move_to_end(requester)
        while len(self._last_request) > _MAX_REMEMBERED_REQUESTERS:
            self._last_request.popitem(last=False)
        async with self._lock:
            return await self._probe(requester, addresses)

    @staticmethod
    async def _probe(requester: PeerID, addresses: list[Multiaddr]) -> pb.DialBackResponse:
        probe = await P2P.create(
            host_maddrs=[], no_listen=True, use_relay=False, auto_nat=False, nat_port_map=False
        )
        try:
            await asyncio.wait_for(probe._client.connect(requester, addresses), DIAL_BACK_TIMEOUT_S)
        except Exception as exc:
            reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            return pb.DialBackResponse(code=pb.DIAL_BACK_UNREACHABLE, detail=reason[:200])
        finally:
            await probe.shutdown()
        return pb.DialBackResponse(code=pb.DIAL_BACK_REACHABLE, detail="reached from a fresh connection")


async def serve_dial_back(_dht: hivemind.DHT, node: DHTNode) -> None:
    """Register the dial-back service on a running DHT's p2pd (run via `dht.run_coroutine`)."""
    service = DialBackService()
    await node.p2p.add_protobuf_handler(DIAL_BACK_PROTOCOL, service.rpc_dial_back, pb.DialBackRequest)


async def call_dial_back(
    _dht: hivemind.DHT, node: DHTNode, seeds: list[str], addresses: list[str]
) -> tuple[bool, str]:
    """Ask each seed in turn to dial `addresses` back; (reachable, what the seeds said)."""
    details = []
    for seed in seeds:
        peer_id = PeerID.from_base58(Multiaddr(seed)["p2p"])
        try:
            response = await asyncio.wait_for(
                node.p2p.call_protobuf_handler(
                    peer_id, DIAL_BACK_PROTOCOL, pb.DialBackRequest(addresses=addresses), pb.DialBackResponse
                ),
                DIAL_BACK_TIMEOUT_S * 2,
            )
        except Exception as exc:
            details.append(f"{seed[-12:]}: no dial-back service ({type(exc).__name__})")
            continue
        if response.code == pb.DIAL_BACK_REACHABLE:
            return True, f"seed {peer_id.to_base58()[-8:]} reached this node from a fresh connection"
        details.append(f"{peer_id.to_base58()[-8:]}: {pb.DialBackCode.Name(response.code)} {response.detail}")
    return False, "; ".join(details) or "no seed to ask"
