"""How much a DHT node stores for others, and whose records it keeps when that is full.

Every record hivenet accepts is signed by its owner, the PeerID its `hn:` subkey names, and an
identity costs nothing: a flood of valid records from fresh keys is the cheapest attack on a
DHT. Unbounded, one key's dictionary outgrows p2pd's message limit (every lookup of it fails)
and the node's memory grows with the flood. `StoreQuota` bounds what remote peers may store:

- per key: `max_per_key` records and `max_key_bytes` bytes (a lookup's answer stays well under
  the 4 MiB a p2pd message may carry);
- per owner: `max_per_owner` records, under all keys together;
- in all: `max_records` records and `max_bytes` bytes, storage and cache together.

When a cap is reached, the record with the least standing makes way, or the newcomer is refused.
Standing (`Standing`) is what a DHT node can know without trusting anyone's word: an owner it was
told to trust (the run's signers in its config) ranks highest, then owners whose records it has
seen for `established_s` or longer, then newcomers. A record displaces one of a lower rank;
among newcomers the one that came first goes first (what a one-shot flood stored is flushed by
whoever comes next, an honest node included), and among established owners the youngest goes
(a newcomer never displaces an established owner). An owner is remembered as seen even when its
record is refused, so an honest newcomer that keeps refreshing its record is established after
`established_s` and then displaces newcomers. What an attacker can still do is keep many
identities alive for that long, older than the honest node it wants to hide; the caps bound
what that costs everyone else.

This module only decides; `node.dht_guard` calls it for each record a peer asks to store and
carries the decision out on hivemind's storage.
"""

from __future__ import annotations

import time
from collections import OrderedDict, deque
from collections.abc import Callable, Collection
from dataclasses import dataclass, field

__all__ = ["Admission", "QuotaLimits", "Slot", "Standing", "StoreQuota"]


@dataclass(frozen=True)
class QuotaLimits:
    """The caps of a `StoreQuota` (see the module docstring)."""

    max_per_key: int = 1024
    max_key_bytes: int = 2 * 2**20
    max_per_owner: int = 128
    max_records: int = 8192
    max_bytes: int = 16 * 2**20
    established_s: float = 300.0
    remembered_newcomers: int = 32768
    remembered_established: int = 8192


@dataclass(frozen=True)
class Slot:
    """Where one record lives: cache or storage, its DHT key (bytes of its DHTID) and its subkey."""

    in_cache: bool
    key: bytes
    subkey: str


@dataclass
class _Entry:
    owner: bytes
    nbytes: int
    expires_at: float


class Standing:
    """When this node first saw each owner, bounded: newcomers and established owners are remembered
    in separate maps, so a flood of fresh identities only pushes out other newcomers."""

    TRUSTED, ESTABLISHED, NEWCOMER = 2, 1, 0

    def __init__(self, limits: QuotaLimits, trusted: Collection[bytes], clock: Callable[[], float]) -> None:
        self._limits = limits
        self._trusted = frozenset(trusted)
        self._clock = clock
        self._newcomers: OrderedDict[bytes, float] = OrderedDict()
        self._established: OrderedDict[bytes, float] = OrderedDict()

    def seen(self, owner: bytes) -> None:
        """Note a valid record of `owner` (stored or not); promote it once it has been around long enough."""
        now = self._clock()
        if owner in self._established:
            self._established.move_to_end(owner)
            return
        first = self._newcomers.get(owner)
        if first is None:
            self._newcomers[owner] = now
            while len(self._newcomers) > self._limits.remembered_newcomers:
                self._newcomers.popitem(last=False)
        elif now - first >= self._limits.established_s:
            del self._newcomers[owner]
            self._established[owner] = first
            while len(self._established) > self._limits.remembered_established:
                self._established.popitem(last=False)

    def rank(self, owner: bytes) -> tuple[int, float]:
        """(tier, first seen): a higher tier outranks a lower one."""
        if owner in self._trusted:
            return self.TRUSTED, 0.0
        first = self._established.get(owner)
        if first is not None:
            return self.ESTABLISHED, first
        return self.NEWCOMER, self._newcomers.get(owner, self._clock())

    def displaces(self, incoming: bytes, resident: bytes) -> bool:
        """Whether a record of `incoming` may take the place of one of `resident`."""
        (tier_in, first_in), (tier_res, first_res) = self.rank(incoming), self.rank(resident)
        if tier_in != tier_res:
            return tier_in > tier_res
        if tier_in == self.NEWCOMER:
            return True  # among newcomers, first come first gone
        return first_in < first_res  # among established owners, the elder stays

    def victim_order(self, owner: bytes) -> tuple[int, float]:
        """Sort key of residents: the first one is the one to evict first."""
        tier, first = self.rank(owner)
        return (tier, first) if tier == self.NEWCOMER else (tier, -first)


@dataclass
class Admission:
    """The decision on one record: store it (after evicting `victims`) or not, and why not."""

    admitted: bool
    victims: list[Slot] = field(default_factory=list)
    reason: str = ""


class StoreQuota:
    """The records stored here for remote peers, and whether one more fits (see the module docstring).

    `admit` decides without changing anything; once hivemind has stored the record, `stored`
    records it and `evicted` forgets each victim the caller removed from hivemind's storage.
    Records that expire are forgotten by `sweep` (the caller runs it now and then; until then
    they count against the caps, which errs on the safe side).
    """

    def __init__(
        self,
        limits: QuotaLimits | None = None,
        *,
        trusted: Collection[bytes] = (),
        clock: Callable[[], float] = time.monotonic,
        dht_clock: Callable[[], float] = time.time,
    ) -> None:
        self.limits = limits or QuotaLimits()
        self.standing = Standing(self.limits, trusted, clock)
        self._dht_clock = dht_clock
        self._entries: dict[Slot, _Entry] = {}
        self._by_key: dict[tuple[bool, bytes], dict[str, Slot]] = {}
        self._key_bytes: dict[tuple[bool, bytes], int] = {}
        self._per_owner: dict[bytes, int] = {}
        self._arrivals: deque[Slot] = deque()
        self.total_bytes = 0

    def __len__(self) -> int:
        return len(self._entries)

    def admit(self, slot: Slot, owner: bytes, nbytes: int) -> Admission:
        """Whether a valid record of `owner` of `nbytes` fits in `slot`, and what must go to make room."""
        self.standing.seen(owner)
        limits = self.limits
        existing = self._entries.get(slot)
        if existing is not None and existing.owner != owner:
            return Admission(False, reason="the subkey belongs to another owner")
        added = 0 if existing is not None else 1
        grows = nbytes - (existing.nbytes if existing is not None else 0)
        if added and self._per_owner.get(owner, 0) >= limits.max_per_owner:
            return Admission(False, reason=f"its owner holds {limits.max_per_owner} records here already")
        victims: list[Slot] = []
        key = (slot.in_cache, slot.key)
        in_key = self._by_key.get(key, {})
        key_count, key_bytes = len(in_key) + added, self._key_bytes.get(key, 0) + grows
        if key_count > limits.max_per_key or key_bytes > limits.max_key_bytes:
            residents = sorted(
                (s for s in in_key.values() if s != slot),
                key=lambda s: self.standing.victim_order(self._entries[s].owner),
            )
            for resident in residents:
                if key_count <= limits.max_per_key and key_bytes <= limits.max_key_bytes:
                    break
                if not self.standing.displaces(owner, self._entries[resident].owner):
                    break
                victims.append(resident)
                key_count, key_bytes = key_count - 1, key_bytes - self._entries[resident].nbytes
            if key_count > limits.max_per_key or key_bytes > limits.max_key_bytes:
                return Admission(False, reason="its key is full of records with as much standing")
        count = len(self._entries) + added - len(victims)
        total = self.total_bytes + grows - sum(self._entries[v].nbytes for v in victims)
        if count > limits.max_records or total > limits.max_bytes:
            for resident in self._global_victims(owner, exclude={slot, *victims}):
                if count <= limits.max_records and total <= limits.max_bytes:
                    break
                victims.append(resident)
                count, total = count - 1, total - self._entries[resident].nbytes
            if count > limits.max_records or total > limits.max_bytes:
                return Admission(False, reason="this node stores all it will for others")
        return Admission(True, victims)

    def _global_victims(self, owner: bytes, exclude: set[Slot]) -> list[Slot]:
        """Records anywhere that `owner`'s may displace, first to go first: the earliest newcomers
        (in arrival order, without sorting everything), then the rest by standing."""
        while self._arrivals and (
            self._arrivals[0] not in self._entries
            or self.standing.rank(self._entries[self._arrivals[0]].owner)[0] != Standing.NEWCOMER
        ):
            self._arrivals.popleft()
        candidates: list[Slot] = []
        for slot in self._arrivals:
            if len(candidates) >= 64:
                break
            entry = self._entries.get(slot)
            if slot in exclude or entry is None:
                continue
            if self.standing.rank(entry.owner)[0] == Standing.NEWCOMER:
                candidates.append(slot)
        if candidates and self.standing.displaces(owner, self._entries[candidates[0]].owner):
            return candidates
        if self.standing.rank(owner)[0] == Standing.NEWCOMER:
            return []
        others = sorted(
            (s for s in self._entries if s not in exclude),
            key=lambda s: self.standing.victim_order(self._entries[s].owner),
        )
        return [s for s in others if self.standing.displaces(owner, self._entries[s].owner)]

    def stored(self, slot: Slot, owner: bytes, nbytes: int, expires_at: float) -> None:
        """hivemind stored a record admitted into `slot`."""
        existing = self._entries.get(slot)
        if existing is not None:
            self._forget(slot)
        self._entries[slot] = _Entry(owner, nbytes, expires_at)
        key = (slot.in_cache, slot.key)
        self._by_key.setdefault(key, {})[slot.subkey] = slot
        self._key_bytes[key] = self._key_bytes.get(key, 0) + nbytes
        self._per_owner[owner] = self._per_owner.get(owner, 0) + 1
        self.total_bytes += nbytes
        if existing is None:
            self._arrivals.append(slot)

    def evicted(self, slot: Slot) -> None:
        """The record in `slot` was removed from hivemind's storage."""
        if slot in self._entries:
            self._forget(slot)

    def sweep(self, still_held: Callable[[Slot], bool]) -> int:
        """Forget expired records and those hivemind no longer holds; how many were forgotten."""
        now = self._dht_clock()
        gone = [s for s, e in self._entries.items() if e.expires_at < now or not still_held(s)]
        for slot in gone:
            self._forget(slot)
        return len(gone)

    def _forget(self, slot: Slot) -> None:
        entry = self._entries.pop(slot)
        key = (slot.in_cache, slot.key)
        in_key = self._by_key[key]
        del in_key[slot.subkey]
        if in_key:
            self._key_bytes[key] -= entry.nbytes
        else:
            del self._by_key[key], self._key_bytes[key]
        left = self._per_owner[entry.owner] - 1
        if left:
            self._per_owner[entry.owner] = left
        else:
            del self._per_owner[entry.owner]
        self.total_bytes -= entry.nbytes
