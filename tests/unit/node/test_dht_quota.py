"""The DHT storage quota: bounded per key, per owner and in all, and whose records make way when full."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from node.dht_quota import QuotaLimits, Slot, StoreQuota

FAR = 2e9  # a DHT expiry long after the test
SMALL = QuotaLimits(
    max_per_key=4, max_key_bytes=4000, max_per_owner=3, max_records=10, max_bytes=10_000, established_s=300.0
)


class VirtualClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


def _owner(n: int) -> bytes:
    return b"peer-%05d" % n


def _slot(key: int, owner: int) -> Slot:
    return Slot(False, b"key-%d" % key, f"hn:{owner}")


def _quota(clock: VirtualClock, **kwargs: object) -> StoreQuota:
    return StoreQuota(SMALL, clock=clock, dht_clock=lambda: 1e9, **kwargs)  # type: ignore[arg-type]


def _store(quota: StoreQuota, key: int, owner: int, nbytes: int = 100) -> bool:
    """Admit a record and carry the decision out as the guard does; whether it was stored."""
    slot = _slot(key, owner)
    admission = quota.admit(slot, _owner(owner), nbytes)
    if admission.admitted:
        for victim in admission.victims:
            quota.evicted(victim)
        quota.stored(slot, _owner(owner), nbytes, FAR)
    return admission.admitted


def _owners_in(quota: StoreQuota, key: int) -> set[int]:
    return {int(s.subkey[3:]) for s in quota._entries if s.key == b"key-%d" % key}


def _establish(quota: StoreQuota, clock: VirtualClock, *owners: int) -> None:
    for owner in owners:
        quota.standing.seen(_owner(owner))
    clock.advance(SMALL.established_s)
    for owner in owners:
        quota.standing.seen(_owner(owner))


def test_a_full_key_lets_a_newcomer_in_by_evicting_the_earliest_newcomer() -> None:
    clock = VirtualClock()
    quota = _quota(clock)
    for owner in range(4):
        assert _store(quota, 0, owner)
        clock.advance(1)
    assert _store(quota, 0, 99)  # a one-shot flood is flushed by whoever comes next
    assert _owners_in(quota, 0) == {1, 2, 3, 99}


def test_newcomers_never_displace_established_owners() -> None:
    clock = VirtualClock()
    quota = _quota(clock)
    _establish(quota, clock, 1, 2)
    assert _store(quota, 0, 1) and _store(quota, 0, 2)
    for sybil in range(100, 140):
        _store(quota, 0, sybil)
    assert {1, 2} <= _owners_in(quota, 0) and len(_owners_in(quota, 0)) == 4
    _establish(quota, clock, 3, 4)
    assert _store(quota, 0, 3) and _store(quota, 0, 4)  # established owners displace newcomers
    assert _owners_in(quota, 0) == {1, 2, 3, 4}
    assert not _store(quota, 0, 200)  # a key full of established owners refuses newcomers


def test_an_elder_displaces_the_youngest_established_owner_and_trusted_ones_outrank_all() -> None:
    clock = VirtualClock()
    quota = _quota(clock, trusted=[_owner(7)])
    _establish(quota, clock, 1)
    clock.advance(10)
    _establish(quota, clock, 2, 3, 4, 5)
    assert all(_store(quota, 0, owner) for owner in (2, 3, 4, 5))
    assert _store(quota, 0, 1)  # older than every resident: the youngest resident goes
    assert 1 in _owners_in(quota, 0) and len(_owners_in(quota, 0)) == 4
    assert _store(quota, 0, 7)
    assert 7 in _owners_in(quota, 0)


def test_a_newcomer_flushed_by_a_flood_that_keeps_refreshing_is_established_and_stays() -> None:
    clock = VirtualClock()
    quota = _quota(clock)
    assert _store(quota, 0, 50)
    sybils = iter(range(100, 10_000))
    for _ in range(int(SMALL.established_s) // 10):  # a sustained flood of fresh identities, 8 every 10 s
        for sybil in [next(sybils) for _ in range(8)]:
            _store(quota, 0, sybil)
        assert 50 not in _owners_in(quota, 0)  # a newcomer among newcomers: flushed
        _store(quota, 0, 50)  # the honest node refreshes its record
        clock.advance(10)
    assert _store(quota, 0, 50)  # seen since before the flood, it is established now
    for sybil in [next(sybils) for _ in range(40)]:
        _store(quota, 0, sybil)
    assert 50 in _owners_in(quota, 0)


def test_per_key_bytes_per_owner_and_totals_are_capped() -> None:
    clock = VirtualClock()
    quota = _quota(clock)
    assert _store(quota, 0, 1, nbytes=3000)
    assert _store(quota, 0, 2, nbytes=1500)  # evicts owner 1's 3000 bytes to fit the key's 4000
    assert _owners_in(quota, 0) == {2}
    assert _store(quota, 1, 5) and _store(quota, 2, 5) and _store(quota, 3, 5)
    assert not _store(quota, 4, 5)  # its owner holds max_per_owner records already
    assert _store(quota, 1, 5)  # refreshing a record it holds is always fine
    for n in range(100, 200):
        _store(quota, 10 + n, n)
    assert len(quota) <= SMALL.max_records and quota.total_bytes <= SMALL.max_bytes


def test_sweep_forgets_expired_records_and_what_hivemind_dropped() -> None:
    clock = VirtualClock()
    now = [1e9]
    quota = StoreQuota(SMALL, clock=clock, dht_clock=lambda: now[0])
    quota.admit(_slot(0, 1), _owner(1), 10)
    quota.stored(_slot(0, 1), _owner(1), 10, expires_at=now[0] + 5)
    quota.stored(_slot(0, 2), _owner(2), 10, expires_at=now[0] + 500)
    quota.stored(_slot(0, 3), _owner(3), 10, expires_at=now[0] + 500)
    now[0] += 10
    assert quota.sweep(lambda slot: slot != _slot(0, 3)) == 2
    assert len(quota) == 1 and quota.total_bytes == 10


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(st.integers(0, 5), st.integers(0, 40), st.integers(1, 3000), st.integers(0, 120)),
        max_size=120,
    )
)
def test_no_sequence_of_stores_breaks_a_cap(operations: list[tuple[int, int, int, int]]) -> None:
    clock = VirtualClock()
    quota = _quota(clock, trusted=[_owner(0)])
    for key, owner, nbytes, wait in operations:
        clock.advance(wait)
        _store(quota, key, owner, nbytes)
        for k in range(6):
            in_key = [e for s, e in quota._entries.items() if s.key == b"key-%d" % k]
            assert len(in_key) <= SMALL.max_per_key
            assert sum(e.nbytes for e in in_key) <= SMALL.max_key_bytes
        assert len(quota) <= SMALL.max_records and quota.total_bytes <= SMALL.max_bytes
        assert quota.total_bytes == sum(e.nbytes for e in quota._entries.values())


def test_a_full_key_answers_within_a_p2pd_message() -> None:
    p2pd_message_limit = 4 * 2**20  # what a find response may carry
    assert QuotaLimits().max_key_bytes <= p2pd_message_limit // 2  # the node's own records come on top
