"""`ReceiptExchange`: a node's receipts service: its ledger, served to peers and filled from theirs.

A runtime service (`name`, `async start()`, `async stop()`) that owns nothing but a P2P replica:

- **record**: the receipts this node signs (a fetcher's transfer receipts, a trainer's training
  receipts, a validator's verdicts) or is given (a worker's verdicts) go into its ledger through `record` (from any thread) or
  `store`; the ledger re-verifies them like any other;
- **serve**: `ReceiptServer` answers pulls of the ledger (`node.receipts.server`);
- **pull**: every `pull_interval_s` a cycle picks at most `peers_per_cycle` of the run's live nodes
  (discovery: their signed node records), those pulled longest ago first, dials each at the
  addresses of its own record only, within the weight broadcast's dialling limits
  (`node.broadcast.dialing.HolderDialer`: public IPs unless this node is on loopback only, and
  there only those its seeds attested, each address rarely and with back-off, never one p2pd
  knows as another peer's), and pulls at most
  `max_receipts_per_pull` receipts after the cursor it reached last time
  (`node.receipts.client.pull_receipts`), one peer after another, and at most
  `max_pulled_per_signer` new receipts of any one signer but the run's named ones per `signer_window_s` over all pulls
  (`node.receipts.quota.SignerQuota`; the surplus is logged, counted in `capped` and asked for
  again in a later pull, which resumes at its page).
  Receipts of signers without standing in the run are kept only within small budgets, per peer
  and in all, and evicted first (`node.receipts.standing`), so a flood of receipts signed by
  fresh identities can neither fill the disk nor stop the pulls. Peers that served bad data are
  banned and skipped. The cursors of at most `max_cursors` peers are kept in the ledger too
  (`Ledger.save_pull_cursor`), so a restarted node resumes where it was instead of re-reading
  every peer; at `max_ledger_receipts` receipts a cycle first evicts unvouched ones, and runs only
  if that makes room.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Collection, Iterable

import hivemind
from hivemind.p2p import P2P, PeerID

from node.bans import BanList
from node.broadcast.dialing import HolderDialer
from node.dialable import IPNetwork
from node.identity import Identity
from node.ledger import AddResult, Ledger
from node.membership import LiveNode, discover
from node.receipts.client import PullResult, pull_receipts
from node.receipts.config import ReceiptsConfig
from node.receipts.quota import SignerQuota
from node.receipts.server import ReceiptServer
from node.receipts.standing import StandingFilter
from node.rollouts.peers import member_holder, replicate_p2p
from node.runtime import offload

logger = logging.getLogger(__name__)

FindPeers = Callable[[], Awaitable[list[LiveNode]]]


class ReceiptExchange:
    """A node's receipts service; see the module docstring. Construct, then `await start()` (or
    `node.add_service(...)`)."""

    name = "receipt-exchange"

    def __init__(
        self,
        *,
        dht: hivemind.DHT,
        identity: Identity,
        ledger: Ledger,
        config: ReceiptsConfig | None = None,
        find_peers: FindPeers | None = None,
        p2p: P2P | None = None,
        bans: BanList | None = None,
        on_pulled: Callable[[PullResult], None] | None = None,
        trusted_attesters: Collection[bytes] = frozenset(),
        dialable_networks: Collection[IPNetwork] = (),
    ) -> None:
        """`find_peers`: the live nodes to pull from (default: discovery of the ledger's run);
        `on_pulled`: told what every pull did (a node counts it in its metrics);
        `trusted_attesters`: whose address attestations the dialler believes and `dialable_networks`:
        the private networks it dials too (`HolderDialer`)."""
        self.dht = dht
        self.trusted_attesters = frozenset(trusted_attesters)
        self.dialable_networks = tuple(dialable_networks)
        self.identity = identity
        self.ledger = ledger
        self.config = config if config is not None else ReceiptsConfig()
        self.owner = identity.short_id
        self.bans = (
            bans
            if bans is not None
            else BanList(self.config.ban_base_s, self.config.ban_max_s, owner=self.owner)
        )
        self.find_peers: FindPeers = find_peers if find_peers is not None else self._discover
        self.on_pulled = on_pulled
        self._given_p2p = p2p
        self._p2p: P2P | None = None
        self._server: ReceiptServer | None = None
        self._dialer: HolderDialer | None = None
        self._addresses: tuple[str, ...] | None = None
        self._puller: asyncio.Task[None] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._pending: set[asyncio.Task[AddResult]] = set()
        self.cursors: OrderedDict[bytes, int] = OrderedDict()
        """Each peer's ledger position reached by the last pull, least recently pulled first."""
        self.last_results: list[PullResult] = []
        """What the last pull cycle did, one result per peer."""
        self.recorded = 0
        """Receipts of this node's own stored through `record` or `store`."""
        named = frozenset(PeerID.from_base58(text).to_bytes() for text in self.config.trusted_signers)
        self.quota = SignerQuota(self.config.max_pulled_per_signer, self.config.signer_window_s, exempt=named)
        self.standing = StandingFilter(
            named,
            own=identity.peer_id_bytes,
            per_source=self.config.max_unvouched_per_source,
            total=self.config.max_unvouched,
        )
        self.capped = 0
        """Pulled receipts held back because their signer had used its quota (every pull so far)."""

    @property
    def p2p(self) -> P2P:
        if self._p2p is None:
            raise RuntimeError("the receipt exchange is not running: await start() first")
        return self._p2p

    @property
    def dialer(self) -> HolderDialer:
        if self._dialer is None:
            raise RuntimeError("the receipt exchange is not running: await start() first")
        return self._dialer

    async def _own_addresses(self) -> tuple[str, ...]:
        if self._addresses is None:
            try:
                maddrs = await self.p2p.get_visible_maddrs()
            except Exception:
                return ()
            self._addresses = tuple(str(m) for m in maddrs if "p2p-circuit" not in str(m))
        return self._addresses

    @property
    def server(self) -> ReceiptServer | None:
        return self._server

    async def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        await self._load_cursors()
        self._p2p = self._given_p2p if self._given_p2p is not None else await replicate_p2p(self.dht)
        self._dialer = HolderDialer(
            self._p2p,
            self.identity.peer_id,
            self._own_addresses,
            self.trusted_attesters,
            networks=self.dialable_networks,
        )
        try:
            if self.config.serve:
                self._server = ReceiptServer(
                    dht=None,
                    ledger=self.ledger,
                    config=self.config,
                    p2p=self._p2p,
                    bans=self.bans,
                    owner=self.owner,
                )
                await self._server.start()
        except BaseException:
            await self.stop()
            raise
        if self.config.peers_per_cycle > 0:
            self._puller = asyncio.create_task(self._pull_loop(), name="receipt-pull")

    async def stop(self) -> None:
        puller, self._puller = self._puller, None
        if puller is not None:
            puller.cancel()
            await asyncio.gather(puller, return_exceptions=True)
        if self._pending:  # receipts being stored are finished, not lost
            await asyncio.gather(*self._pending, return_exceptions=True)
        server, self._server = self._server, None
        if server is not None:
            await server.stop()
        p2p, self._p2p = self._p2p, None
        if p2p is not None and self._given_p2p is None:
            with contextlib.suppress(Exception):
                await p2p.shutdown()

    # ---- this node's own receipts ----------------------------------------------------------

    async def store(self, envelopes: Iterable[bytes]) -> AddResult:
        """Verify and store receipts this node signed (or was handed); refused ones are logged."""
        batch = list(envelopes)
        result = await offload(self.ledger.add_many, batch)
        self.recorded += result.added
        for position, reason in result.refused:
            logger.warning("[%s] own receipt %d not stored: %s", self.owner, position, reason)
        return result

    def record(self, envelopes: Iterable[bytes]) -> None:
        """Store receipts in the background; callable from any thread, never blocks (a no-op once stopped)."""
        batch = list(envelopes)
        loop = self._loop
        if not batch or loop is None or loop.is_closed():
            return

        def spawn() -> None:
            task = asyncio.ensure_future(self.store(batch))
            self._pending.add(task)
            task.add_done_callback(self._pending.discard)

        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is loop:
            spawn()
        else:
            with contextlib.suppress(RuntimeError):  # the loop closed meanwhile
                loop.call_soon_threadsafe(spawn)

    # ---- pulling -----------------------------------------------------------------------------

    async def _discover(self) -> list[LiveNode]:
        return await discover(self.dht, self.ledger.run_id)

    def choose_peers(self, live: list[LiveNode]) -> list[LiveNode]:
        """At most `peers_per_cycle` of `live` (not this node, not banned): peers with standing in the run
        first (its signers and credited contributors: they serve the receipts that count), keeping a
        slot for the others, each group never-pulled then least recently pulled. Never-pulled peers
        without standing come in random order: a node record is anyone's to write, so an order it sets
        (an early `started_at`) would let fresh identities keep an honest peer from ever being pulled."""
        own = self.identity.peer_id_bytes
        candidates = {
            node.record.peer_id: node
            for node in live
            if node.record.peer_id != own and not self.bans.is_banned(node.record.peer_id)
        }
        order = {peer: rank for rank, peer in enumerate(self.cursors)}
        noise = {peer: random.random() for peer in candidates}
        ranked = sorted(candidates, key=lambda peer: (order.get(peer, -1), noise[peer]))
        vouched = [peer for peer in ranked if self.standing.has_standing(peer)]
        others = [peer for peer in ranked if not self.standing.has_standing(peer)]
        slots = self.config.peers_per_cycle
        first = vouched[: max(0, slots - 1) if others else slots]
        rest = others[: slots - len(first)]
        extra = vouched[len(first) :][: slots - len(first) - len(rest)]
        return [candidates[peer] for peer in first + rest + extra]

    async def pull_from(self, member: LiveNode) -> PullResult:
        """One bounded pull from `member`, dialled at the addresses of its own record, resuming at its cursor."""
        peer = member.record.peer_id
        cursor = self.cursors.get(peer, 0)
        started = time.monotonic()
        await self.dialer.dial(member_holder(member))
        result = await pull_receipts(
            self.p2p,
            member.peer_id,
            self.ledger,
            bans=self.bans,
            after=cursor,
            max_receipts=self.config.max_receipts_per_pull,
            page_size=self.config.page_size,
            timeout_s=max(1.0, self.config.pull_timeout_s - (time.monotonic() - started)),
            quota=self.quota,
            standing=self.standing,
        )
        if self.on_pulled is not None:
            self.on_pulled(result)
        if result.capped:
            self.capped += result.capped
            logger.warning(
                "[%s] held back %d receipts pulled from %s until a later pull: their signers had stored %d "
                "in the last %g s",
                self.owner,
                result.capped,
                member.short_id,
                self.config.max_pulled_per_signer,
                self.config.signer_window_s,
            )
        self._remember(peer, result.cursor)
        await self._save_cursor(peer, result.cursor)
        return result

    async def _load_cursors(self) -> None:
        """Resume from the cursors the ledger kept (those saved most recently, if there are more)."""
        saved = await offload(self.ledger.pull_cursors)
        for peer, cursor in saved[-self.config.max_cursors :]:
            self._remember(peer, cursor)

    def _remember(self, peer: bytes, cursor: int) -> None:
        self.cursors[peer] = cursor
        self.cursors.move_to_end(peer)
        while len(self.cursors) > self.config.max_cursors:
            self.cursors.popitem(last=False)

    async def _save_cursor(self, peer: bytes, cursor: int) -> None:
        try:
            await offload(self.ledger.save_pull_cursor, peer, cursor, keep=self.config.max_cursors)
        except Exception as exc:  # losing a cursor only costs duplicates after a restart
            logger.warning("[%s] could not save the pull cursor of a peer: %r", self.owner, exc)

    async def pull_cycle(self) -> list[PullResult]:
        """Pull from the peers `choose_peers` picks among the live nodes, one after another."""
        results: list[PullResult] = []
        await offload(self.standing.refresh, self.ledger)
        if not await offload(self.standing.make_room, self.ledger, self.config.max_ledger_receipts):
            logger.warning(
                "[%s] the ledger holds %d receipts or more, none of them evictable: not pulling",
                self.owner,
                self.config.max_ledger_receipts,
            )
            self.last_results = results
            return results
        for member in self.choose_peers(await self.find_peers()):
            result = await self.pull_from(member)
            if result.added or result.failure:
                logger.debug(
                    "[%s] pulled %d new receipts from %s%s",
                    self.owner,
                    result.added,
                    member.short_id,
                    f" ({result.failure})" if result.failure else "",
                )
            results.append(result)
        self.last_results = results
        return results

    async def _pull_loop(self) -> None:
        while True:
            try:
                await self.pull_cycle()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # discovery may fail for a while; the next cycle retries
                logger.info("[%s] receipt pull cycle failed: %r", self.owner, exc)
            await asyncio.sleep(self.config.pull_interval_s)
