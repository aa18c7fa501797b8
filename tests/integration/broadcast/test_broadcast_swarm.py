"""Integration tests of the weight broadcast on a local swarm of real p2pd daemons."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from node.broadcast.errors import WeightsUnavailable
from node.broadcast.service import PROTO_CHUNK
from node.broadcast.store import VersionEntry
from protocol.manifest import build_manifest
from protocol.receipts import open_receipt
from tests.helpers.broadcast import (
    Swarm,
    assert_state_dicts_equal,
    make_state_dict,
    open_swarm,
    start_broadcast,
)
from tests.helpers.waiting import async_wait_for, async_wait_until


@pytest.fixture(scope="module")
def swarm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Swarm]:
    yield from open_swarm(tmp_path_factory.mktemp("swarm"))


def test_round_trip_publisher_and_three_fetchers(swarm: Swarm, tmp_path: Path) -> None:
    publisher, *fetchers = swarm.nodes[1:5]

    async def main() -> None:
        pub = await start_broadcast(publisher, tmp_path / "pub", [publisher], upload_bytes_per_s=2_000_000)
        peers = [
            await start_broadcast(node, tmp_path / f"f{i}", [publisher]) for i, node in enumerate(fetchers)
        ]
        try:
            state = make_state_dict(seed=1)
            manifest = await pub.publish("roundtrip", 1, state)
            entries = await asyncio.gather(*(peer.fetch("roundtrip") for peer in peers))
            for peer, entry in zip(peers, entries, strict=True):
                assert entry.version == 1 and entry.complete
                assert entry.manifest.content_id == manifest.content_id
                assert_state_dicts_equal(await peer.load("roundtrip", 1), state)
            # fetchers served each other: the publisher's upload is not the only one used
            assert sum(peer.service.uploaded_bytes for peer in peers) > 0
            statuses = await peers[0].status("roundtrip")
            assert [s.version for s in statuses] == [1]
            assert statuses[0].local_chunks == manifest.num_chunks
        finally:
            for b in (pub, *peers):
                await b.stop()

    asyncio.run(main())


def test_corrupt_source_is_banned_and_routed_around(swarm: Swarm, tmp_path: Path) -> None:
    publisher, evil_node, victim_node = swarm.nodes[1:4]

    async def main() -> None:
        pub = await start_broadcast(publisher, tmp_path / "pub", [publisher], upload_bytes_per_s=300_000)
        evil = await start_broadcast(evil_node, tmp_path / "evil", [publisher])
        victim = await start_broadcast(victim_node, tmp_path / "victim", [publisher])
        receipts: list[bytes] = []
        victim.on_receipts = receipts.extend
        try:
            state = make_state_dict(seed=2)
            manifest = await pub.publish("corrupt", 1, state)
            bad = await evil.fetch("corrupt")
            # the evil peer's disk now disagrees with the manifest, but its bitmap still claims every chunk
            with open(bad.data_path, "r+b") as data:
                for index in range(bad.manifest.num_chunks):
                    data.seek(bad.manifest.chunk_offset(index))
                    data.write(b"\xa5" * 8)
            entry = await victim.fetch("corrupt")
            assert entry.complete
            assert_state_dicts_equal(await victim.load("corrupt", 1), state)
            assert victim.bans.is_banned(evil_node.identity.peer_id)
            assert victim.last_fetch is not None and victim.last_fetch.bad_chunks >= 1
            assert not victim.bans.is_banned(publisher.identity.peer_id)
            # the transfer receipts count only chunks that verified: none for the corrupt source
            credited = [open_receipt(receipt, run_id="corrupt") for receipt in receipts]
            assert evil_node.identity.peer_id_bytes not in {r.contributor for r in credited}
            assert sum(r.chunks for r in credited) == manifest.num_chunks
            assert sum(r.byte_count for r in credited) == manifest.total_bytes
        finally:
            for b in (pub, evil, victim):
                await b.stop()

    asyncio.run(main())


def test_the_chunk_that_completes_a_version_is_counted_in_its_sources_receipt(
    swarm: Swarm, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A fetch ends once the version is complete, which the write of its last chunk makes it while
    that chunk's delivery is still being counted. The receipts are signed after the counting: the
    write that completes the version is held until the receipts are signed (or 5 s), so a fetch
    that signed them first would leave that chunk out (seen on a loaded machine: 34 of 35)."""
    publisher, fetcher_node = swarm.nodes[1], swarm.nodes[2]
    fetcher_dir = tmp_path / "fetcher"
    receipted = threading.Event()
    real_write_chunk = VersionEntry.write_chunk

    def write_chunk(entry: VersionEntry, index: int, data: bytes) -> bool:
        written = real_write_chunk(entry, index, data)
        if written and entry.complete and fetcher_dir in entry.data_path.parents:
            receipted.wait(5.0)
        return written

    monkeypatch.setattr(VersionEntry, "write_chunk", write_chunk)

    async def main() -> None:
        pub = await start_broadcast(publisher, tmp_path / "pub", [publisher])
        fetcher = await start_broadcast(fetcher_node, fetcher_dir, [publisher])
        receipts: list[bytes] = []

        def on_receipts(batch: list[bytes]) -> None:
            receipts.extend(batch)
            receipted.set()

        fetcher.on_receipts = on_receipts
        try:
            manifest = await pub.publish("last-chunk", 1, make_state_dict(seed=7))
            assert (await fetcher.fetch("last-chunk")).complete
            credited = [open_receipt(receipt, run_id="last-chunk") for receipt in receipts]
            assert sum(r.chunks for r in credited) == manifest.num_chunks
            assert sum(r.byte_count for r in credited) == manifest.total_bytes
        finally:
            for b in (pub, fetcher):
                await b.stop()

    asyncio.run(main())


def test_forged_pointers_and_manifests_are_refused(swarm: Swarm, tmp_path: Path) -> None:
    publisher, intruder_node, evil_node, victim_node = swarm.nodes[1:5]

    async def main() -> None:
        pub = await start_broadcast(publisher, tmp_path / "pub", [publisher])
        intruder = await start_broadcast(intruder_node, tmp_path / "intruder", [publisher])
        evil = await start_broadcast(evil_node, tmp_path / "evil", [publisher])
        victim = await start_broadcast(victim_node, tmp_path / "victim", [publisher])
        try:
            # an unauthorised publisher's validly signed version is not believed
            await intruder.publish("forged", 7, make_state_dict(seed=3))
            assert await victim.records.find_pointer("forged") is None
            with pytest.raises(WeightsUnavailable):
                await victim.fetch("forged")
            assert victim.store.versions("forged") == []

            # a holder serving a manifest other than the one the signed pointer names is banned
            await pub.publish("mismatch", 1, make_state_dict(seed=4))
            held = await evil.fetch("mismatch")
            other = build_manifest(
                publisher.identity.private_key,  # even the real publisher's signature does not help
                run_id="mismatch",
                version=1,
                total_bytes=held.manifest.total_bytes,
                chunk_bytes=held.manifest.chunk_bytes,
                chunk_hashes=bytes(len(held.manifest.chunk_hashes)),
                tensors=(),
                created_at=0.0,
            )
            object.__setattr__(held.manifest, "raw", other.raw)
            object.__setattr__(held.manifest, "chunk_hashes", other.chunk_hashes)
            pub.service.withdraw("mismatch", 1)  # only the evil holder serves it now
            with pytest.raises(WeightsUnavailable):
                await victim.fetch("mismatch", manifest_timeout_s=2.0)
            assert victim.bans.is_banned(evil_node.identity.peer_id)
            assert victim.store.versions("mismatch") == []
        finally:
            for b in (pub, intruder, evil, victim):
                await b.stop()

    asyncio.run(main())


def test_source_killed_mid_transfer(swarm: Swarm, tmp_path: Path) -> None:
    publisher, victim_node = swarm.nodes[1], swarm.nodes[2]
    helper_node = swarm.add()  # its own p2pd, so it can be killed

    async def main() -> None:
        pub = await start_broadcast(publisher, tmp_path / "pub", [publisher], upload_bytes_per_s=250_000)
        helper = await start_broadcast(
            helper_node, tmp_path / "helper", [publisher], upload_bytes_per_s=250_000
        )
        victim = await start_broadcast(victim_node, tmp_path / "victim", [publisher])
        try:
            state = make_state_dict(seed=5)
            await pub.publish("kill", 1, state)
            num_chunks = (await helper.fetch("kill")).manifest.num_chunks
            fetch = asyncio.create_task(victim.fetch("kill"))

            def quarter_done() -> bool:
                return (
                    victim.last_fetch is not None and victim.last_fetch.entry.chunks_held >= num_chunks // 4
                )

            await async_wait_until(quarter_done, timeout_s=60)
            assert not fetch.done()
            swarm.kill(helper_node)  # p2pd gone: streams break mid-chunk
            entry = await asyncio.wait_for(fetch, timeout=120)
            assert entry.complete
            assert_state_dicts_equal(await victim.load("kill", 1), state)
            assert not victim.bans.is_banned(helper_node.identity.peer_id)  # vanishing is not misbehaving
        finally:
            for b in (pub, helper, victim):
                with contextlib.suppress(Exception):
                    await b.stop()

    asyncio.run(main())


def test_resume_after_restart_fetches_only_missing_chunks(swarm: Swarm, tmp_path: Path) -> None:
    publisher, victim_node = swarm.nodes[1], swarm.nodes[3]

    async def main() -> None:
        pub = await start_broadcast(publisher, tmp_path / "pub", [publisher], upload_bytes_per_s=300_000)
        victim = await start_broadcast(victim_node, tmp_path / "victim", [publisher])
        restarted = None
        try:
            state = make_state_dict(seed=6)
            manifest = await pub.publish("resume", 1, state)
            fetch = asyncio.create_task(victim.fetch("resume"))

            def a_third_held() -> bool:
                held = (
                    victim.last_fetch is not None
                    and victim.last_fetch.entry.chunks_held >= manifest.num_chunks // 3
                )
                if held:  # no further chunk leaves the publisher: the fetch cannot end before its cancel
                    pub.service.limiter.bytes_per_s = 1.0
                return held

            # (A fetch that merely ran on finished before its cancel in a loaded CI run: 35 of 35 chunks.)
            await async_wait_until(a_third_held, timeout_s=60)
            fetch.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await fetch
            await victim.stop()  # the node stops halfway; its store stays on disk
            # the upload caught waiting for the throttled cap goes on at once, finds its reader gone and
            # gives its upload slot back (with a fresh bucket instead it waited on the old one for ever,
            # holding the slot, and the restarted fetch stalled)
            pub.service.limiter.bytes_per_s = 300_000

            restarted = await start_broadcast(victim_node, tmp_path / "victim", [publisher])
            entry = restarted.store.get("resume", 1)
            assert entry is not None and 0 < entry.chunks_held < manifest.num_chunks
            missing = entry.missing()
            await restarted.fetch("resume")
            assert restarted.last_fetch is not None
            assert restarted.last_fetch.bytes_downloaded == sum(manifest.chunk_size(i) for i in missing)
            assert_state_dicts_equal(await restarted.load("resume", 1), state)
        finally:
            for b in (pub, victim, restarted):
                if b is not None:
                    with contextlib.suppress(Exception):
                        await b.stop()

    asyncio.run(main())


def test_oversized_request_is_refused_before_buffering(swarm: Swarm, tmp_path: Path) -> None:
    publisher, rude_node = swarm.nodes[1], swarm.nodes[4]

    async def main() -> None:
        pub = await start_broadcast(publisher, tmp_path / "pub", [publisher])
        rude = await start_broadcast(rude_node, tmp_path / "rude", [publisher])
        try:
            _, reader, writer = await rude.p2p.call_binary_stream_handler(
                publisher.identity.peer_id, PROTO_CHUNK
            )
            writer.write((64 * 1024 * 1024).to_bytes(4, "big") + b"\x00" * 1024)  # claims 64 MiB, sends 1 KiB
            await writer.drain()
            assert await asyncio.wait_for(reader.read(), timeout=30) == b""  # closed without a response
            writer.close()
            await async_wait_until(lambda: pub.bans.is_banned(rude_node.identity.peer_id), timeout_s=10)
        finally:
            for b in (pub, rude):
                await b.stop()

    asyncio.run(main())


def test_old_versions_are_pruned_and_no_longer_announced_and_followers_get_new_ones(
    swarm: Swarm, tmp_path: Path
) -> None:
    publisher, follower_node = swarm.nodes[1], swarm.nodes[5]

    async def main() -> None:
        pub = await start_broadcast(
            publisher, tmp_path / "pub", [publisher], keep_versions=2, holder_ttl_s=3.0
        )
        follower = await start_broadcast(
            follower_node, tmp_path / "follower", [publisher], keep_versions=1, follow_poll_s=0.2
        )
        try:
            manifests = {}
            for version in (1, 2, 3):
                manifests[version] = await pub.publish(
                    "prune", version, make_state_dict(seed=10 + version, total_floats=20_000)
                )
            assert pub.store.versions("prune") == [2, 3]
            assert not (tmp_path / "pub" / "prune" / "1").exists()
            # v1's holder record is no longer refreshed and lapses; v3's stays
            v1, v3 = manifests[1], manifests[3]
            holders_v1: list[object] = [None]

            async def v1_gone() -> bool:
                holders_v1[0] = await follower.records.find_holders("prune", 1, v1.content_id)
                return holders_v1[0] == []

            await async_wait_for(v1_gone, timeout_s=30)  # else v1 is still announced
            assert [h.peer_id for h in await follower.records.find_holders("prune", 3, v3.content_id)] == [
                publisher.identity.peer_id
            ]
            with pytest.raises(WeightsUnavailable):
                await follower.fetch("prune", 1, manifest_timeout_s=1.0)

            seen: list[int] = []
            task = follower.follow("prune", on_version=lambda entry: seen.append(entry.version))
            await async_wait_until(lambda: seen == [3], timeout_s=60)
            await pub.publish("prune", 4, make_state_dict(seed=14, total_floats=20_000))
            await async_wait_until(lambda: seen == [3, 4], timeout_s=60)
            task.cancel()
            assert follower.store.versions("prune") == [4]
            assert pub.store.versions("prune") == [3, 4]
        finally:
            for b in (pub, follower):
                await b.stop()

    asyncio.run(main())


def test_a_fetch_whose_version_is_dropped_everywhere_gives_up(swarm: Swarm, tmp_path: Path) -> None:
    """A version withdrawn by its only holder mid-fetch (e.g. replaced by a newer one) ends the fetch
    with a clear error after the stall timeout instead of waiting for chunks forever."""
    from node.broadcast.errors import FetchStalled

    publisher, fetcher = swarm.nodes[1], swarm.nodes[2]

    async def main() -> None:
        pub = await start_broadcast(publisher, tmp_path / "pub", [publisher], upload_bytes_per_s=200_000)
        follower = await start_broadcast(fetcher, tmp_path / "f", [publisher], stall_timeout_s=3.0)
        try:
            await pub.publish("stall", 1, make_state_dict(seed=21))
            fetch = asyncio.create_task(follower.fetch("stall", 1))
            await async_wait_until(
                lambda: follower.last_fetch is not None and follower.last_fetch.bytes_downloaded > 0,
                timeout_s=60,
            )
            pub.service.withdraw("stall", 1)
            with pytest.raises(FetchStalled, match="fetch again"):
                await asyncio.wait_for(fetch, timeout=60)
        finally:
            for b in (pub, follower):
                await b.stop()

    asyncio.run(main())


def test_a_fetch_of_the_newest_moves_on_when_its_version_is_replaced_before_its_manifest_arrives(
    swarm: Swarm, tmp_path: Path
) -> None:
    """The pointer a fetch of the newest version read names a version that its holders deleted
    (replaced by a newer one) before anyone served its manifest: the fetch takes the newer version
    instead of waiting out its manifest deadline and failing."""
    publisher, fetcher = swarm.nodes[1], swarm.nodes[3]

    async def main() -> None:
        pub = await start_broadcast(publisher, tmp_path / "pub", [publisher])
        follower = await start_broadcast(fetcher, tmp_path / "f", [publisher])
        try:
            await pub.publish("replaced", 1, make_state_dict(seed=31))
            pub.service.withdraw("replaced", 1)  # deleted by its holder, but still named by the pointer
            fetch = asyncio.create_task(follower.fetch("replaced", manifest_timeout_s=120.0))
            await async_wait_until(lambda: follower.supersession_checks > 0, timeout_s=60)
            assert not fetch.done()
            state = make_state_dict(seed=32)
            await pub.publish("replaced", 2, state)
            entry = await asyncio.wait_for(fetch, timeout=60)
            assert entry.version == 2
            assert_state_dicts_equal(await follower.load("replaced", 2), state)
        finally:
            for b in (pub, follower):
                await b.stop()

    asyncio.run(main())


def test_a_version_being_served_outlives_its_replacement_until_its_fetch_completes(
    swarm: Swarm, tmp_path: Path
) -> None:
    """A publisher that keeps one version publishes the next while a peer is still downloading the
    previous one: the version being served is kept, so the fetch completes instead of stalling."""
    publisher, fetcher = swarm.nodes[1], swarm.nodes[4]

    async def main() -> None:
        pub = await start_broadcast(
            publisher, tmp_path / "pub", [publisher], keep_versions=1, upload_bytes_per_s=200_000
        )
        follower = await start_broadcast(fetcher, tmp_path / "f", [publisher], stall_timeout_s=20.0)
        try:
            state = make_state_dict(seed=41)
            await pub.publish("served", 1, state)
            fetch = asyncio.create_task(follower.fetch("served", 1))
            await async_wait_until(
                lambda: follower.last_fetch is not None and follower.last_fetch.bytes_downloaded > 0,
                timeout_s=60,
            )
            await pub.publish("served", 2, make_state_dict(seed=42))
            assert pub.store.versions("served") == [1, 2]  # v1 is being served: kept past keep_versions
            entry = await asyncio.wait_for(fetch, timeout=120)
            assert entry.version == 1
            assert_state_dicts_equal(await follower.load("served", 1), state)
        finally:
            for b in (pub, follower):
                await b.stop()

    asyncio.run(main())
