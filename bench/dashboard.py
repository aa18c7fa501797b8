"""Benchmark: the contribution ledger behind the dashboard, on a synthetic run.

Builds a synthetic run of 1,000 contributors and 1,000,000 receipts (`--quick`: 50,000, same keys
in the result): 70% validator verdicts (a tenth of them rejections), 15% training receipts between
the run's 50 trainers, 10% transfer receipts between contributors, 5% seed service receipts,
issued over the last week. The receipts are signed in worker processes beforehand (not timed)
and written to a scratch file; then, in this one process (one core):

1. `receipt_verify_per_s`: intake into a fresh ledger with `Ledger.add_many` in batches of 5,000:
   every receipt fully re-verified (`open_receipt`: canonical encoding, Ed25519 signature, run,
   caps) and inserted, one SQLite transaction per batch (target >= 10,000/s on one core).
   `receipt_verify_per_s_cpu` is the same in this process's CPU time, which leaves out the time
   the scheduler gave to other processes on a shared machine.
2. What bounds it: `open_receipt_per_s` (verification alone, no SQLite) and
   `ed25519_verify_per_s` (one bare Ed25519 verify of a 200-byte message as hivenet checks
   signatures, `protocol.peer_keys.signature_verifies`, libsodium), beside the same verify with
   `cryptography` (OpenSSL), `openssl_verify_per_s`, and their ratio `verify_speedup_vs_openssl`.
3. `ledger_bytes_per_receipt`: the SQLite file after a WAL checkpoint, divided by the receipts.
4. `duplicate_per_s`: re-offering a stored batch (recognised by id, no signature check).
5. `credit_s`: computing the whole credit table (sybil rule, recent averages) from the ledger.

6. `page_p95_ms`: the dashboard (`node.dashboard`, its standard-library HTTP server) on the
   ledger, 20 concurrent clients each asking alternately for the leaderboard (`/api/leaderboard`)
   and a random contributor's node page (`/api/node/<PeerID>`): the 95th percentile latency over
   both (target <= 200 ms); `leaderboard_p95_ms` and `node_page_p95_ms` separately, and
   `dashboard_snapshot_s`, the first request, which computes the credit and the panels' aggregates
   (cached afterwards). The clients run in this process, so they share its interpreter with the
   server: the figure is pessimistic.
7. `live_page_p95_ms`: the same requests again while new receipts keep arriving (50 every 0.25 s,
   as in a running swarm, for six times `dashboard_snapshot_s` and at least 10 s: `live_s`), so
   that the snapshot behind the panels keeps going out of date; `live_snapshots`, how many
   different snapshots the live updates announced meanwhile.

Usage: `python bench/dashboard.py [--quick] [--receipts N]`. The last line is `RESULT key=value ...`.
"""

from __future__ import annotations

import argparse
import hashlib
import http.client
import multiprocessing
import os
import random
import struct
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey  # noqa: E402

from node.dashboard import DashboardData, DashboardServer, peer_text  # noqa: E402
from node.ledger import Ledger  # noqa: E402
from protocol import receipts_pb2, rollouts_pb2  # noqa: E402
from protocol.peer_keys import peer_id_from_private_key, signature_verifies  # noqa: E402
from protocol.receipts import (  # noqa: E402
    open_receipt,
    seal_seed_receipt,
    seal_training_receipt,
    seal_transfer_receipt,
)
from protocol.rollout_messages import seal_verdict  # noqa: E402

RUN = "bench-ledger"
CONTRIBUTORS = 1000
TRAINERS = 50  # the first contributors train; they and the validators are the run's trusted signers
VALIDATORS = 20
SEEDS = 5
BATCH = 5000
WEEK_S = 7 * 86400.0
GEN_CHUNK = 2000
PAGE_CLIENTS = 20
PAGE_REQUESTS = 30
"""Requests per client (alternately the leaderboard and a node page)."""
LIVE_BATCH = 50
LIVE_PERIOD_S = 0.25
"""While the clients load pages again, a writer adds `LIVE_BATCH` new receipts every `LIVE_PERIOD_S`..."""
LIVE_MIN_S = 10.0
LIVE_SNAPSHOTS_COVERED = 6.0
"""...for `LIVE_SNAPSHOTS_COVERED` times the first snapshot's computing time, at least `LIVE_MIN_S`."""


def _key(label: str, index: int) -> Ed25519PrivateKey:
    return Ed25519PrivateKey.from_private_bytes(hashlib.sha256(f"{label}-{index}".encode()).digest())


class Population:
    """The synthetic run's keys, derived from fixed labels so every worker process rebuilds them alike."""

    def __init__(self) -> None:
        self.contributors = [_key("contributor", i) for i in range(CONTRIBUTORS)]
        self.validators = [_key("validator", i) for i in range(VALIDATORS)]
        self.seeds = [_key("seed", i) for i in range(SEEDS)]
        self.contributor_ids = [peer_id_from_private_key(k) for k in self.contributors]
        self.seed_ids = [peer_id_from_private_key(k) for k in self.seeds]

    def trusted(self) -> list[bytes]:
        return self.contributor_ids[:TRAINERS] + [peer_id_from_private_key(k) for k in self.validators]


_POPULATION: Population | None = None


def _receipt(population: Population, index: int, now: float) -> bytes:
    rng = random.Random(index)
    issued = now - rng.random() * WEEK_S
    pick = rng.random()
    if pick < 0.70:
        accepted = rng.random() >= 0.1
        verdict = rollouts_pb2.RolloutVerdict(
            worker=population.contributor_ids[rng.randrange(CONTRIBUTORS)],
            rollout_hash=rng.randbytes(32),
            policy_version=rng.randrange(1000),
            counter=index,
            tokens=rng.randrange(64, 512),
            accepted=accepted,
            reason="" if accepted else rng.choice(["stale", "toploc_mantissa", "sampling"]),
            reward=rng.random() if accepted else 0.0,
            issued_at=issued,
        )
        return seal_verdict(population.validators[rng.randrange(VALIDATORS)], run_id=RUN, verdict=verdict)
    if pick < 0.85:
        signer, contributor = rng.sample(range(TRAINERS), 2)
        return seal_training_receipt(
            population.contributors[signer],
            run_id=RUN,
            contributor=population.contributor_ids[contributor],
            outer_step=rng.randrange(10_000),
            round_id=rng.randbytes(16),
            tokens_trained=50 * 8 * 128,
            bytes_exchanged=rng.randrange(1 << 20, 1 << 24),
            issued_at=issued,
        )
    if pick < 0.95:
        signer, contributor = rng.sample(range(CONTRIBUTORS), 2)
        return seal_transfer_receipt(
            population.contributors[signer],
            run_id=RUN,
            contributor=population.contributor_ids[contributor],
            version=rng.randrange(1000),
            manifest_hash=rng.randbytes(32),
            chunks=rng.randrange(1, 64),
            byte_count=rng.randrange(1 << 18, 1 << 26),
            issued_at=issued,
        )
    return seal_seed_receipt(
        population.contributors[rng.randrange(CONTRIBUTORS)],
        run_id=RUN,
        contributor=population.seed_ids[rng.randrange(SEEDS)],
        service=rng.choice([receipts_pb2.SEED_SERVICE_BOOTSTRAP, receipts_pb2.SEED_SERVICE_DIAL_BACK]),
        session_id=rng.randbytes(16),
        issued_at=issued,
    )


def _generate_chunk(args: tuple[int, int, float]) -> bytes:
    global _POPULATION
    start, count, now = args
    if _POPULATION is None:
        _POPULATION = Population()
    parts = []
    for index in range(start, start + count):
        data = _receipt(_POPULATION, index, now)
        parts.append(struct.pack(">H", len(data)) + data)
    return b"".join(parts)


def generate(path: Path, total: int, now: float) -> None:
    """Sign `total` receipts in worker processes into `path` (length-prefixed envelopes)."""
    jobs = [(start, min(GEN_CHUNK, total - start), now) for start in range(0, total, GEN_CHUNK)]
    with path.open("wb") as out, multiprocessing.Pool(os.cpu_count() or 1) as pool:
        for done, chunk in enumerate(pool.imap(_generate_chunk, jobs), start=1):
            out.write(chunk)
            if done % 50 == 0 or done == len(jobs):
                print(f"  signed {min(done * GEN_CHUNK, total):,} / {total:,}", flush=True)
        # on disk before the timed intake starts, so that its checkpoints do not wait behind the
        # write-back of this file
        out.flush()
        os.fsync(out.fileno())


def batches(path: Path, size: int) -> Iterator[list[bytes]]:
    with path.open("rb") as handle:
        batch: list[bytes] = []
        while header := handle.read(2):
            (length,) = struct.unpack(">H", header)
            batch.append(handle.read(length))
            if len(batch) == size:
                yield batch
                batch = []
        if batch:
            yield batch


def bare_verify_rates(samples: int = 2000) -> tuple[float, float]:
    """Bare Ed25519 verifies per CPU-second: hivenet's (libsodium) and `cryptography`'s (OpenSSL)."""
    key = Ed25519PrivateKey.generate()
    public, message = key.public_key(), b"m" * 200
    signature, peer = key.sign(message), peer_id_from_private_key(key)
    started = time.process_time()
    for _ in range(samples):
        assert signature_verifies(peer, signature, message)
    ours = samples / (time.process_time() - started)
    started = time.process_time()
    for _ in range(samples):
        public.verify(signature, message)
    return ours, samples / (time.process_time() - started)


def _percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))]


def page_latencies(
    ledger: Ledger, population: Population, contributors: list[bytes], requests: int, first_live: int
) -> dict[str, object]:
    """Serve the ledger with the dashboard and time leaderboard and node-page requests of 20 clients:
    on the ledger as it is, then while new receipts (indices from `first_live`) keep arriving."""
    data = DashboardData(ledger, trusted=population.trusted())
    server = DashboardServer(data, port=0)
    server.start()
    assert server.port is not None
    port = server.port
    peers = [peer_text(peer) for peer in contributors]
    timings: dict[str, list[float]] = {"leaderboard": [], "node": []}
    failures: list[str] = []
    lock = threading.Lock()
    writing = threading.Event()

    def get(connection: http.client.HTTPConnection, path: str) -> float:
        started = time.perf_counter()
        connection.request("GET", path)
        response = connection.getresponse()
        response.read()
        if response.status != 200:
            failures.append(f"{path}: {response.status}")
        return time.perf_counter() - started

    def client(index: int, live: bool) -> None:
        rng = random.Random(index)
        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
        mine: dict[str, list[float]] = {"leaderboard": [], "node": []}
        number = 0
        while (writing.is_set() or number == 0) if live else number < requests:
            if number % 2 == 0:
                mine["leaderboard"].append(get(connection, "/api/leaderboard"))
            else:
                mine["node"].append(get(connection, f"/api/node/{rng.choice(peers)}"))
            number += 1
        connection.close()
        with lock:
            for key, values in mine.items():
                timings[key].extend(values)

    def load_pages(live: bool) -> list[float]:
        for values in timings.values():
            values.clear()
        threads = [threading.Thread(target=client, args=(i, live)) for i in range(PAGE_CLIENTS)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        return timings["leaderboard"] + timings["node"]

    shown: set[int] = set()

    def writer(seconds: float) -> None:
        index, ends = first_live, time.monotonic() + seconds
        try:
            while time.monotonic() < ends:
                now = time.time()
                ledger.add_many([_receipt(population, i, now) for i in range(index, index + LIVE_BATCH)])
                index += LIVE_BATCH
                shown.add(int(data.version()["receipts"]))  # what a browser's live updates would see
                time.sleep(LIVE_PERIOD_S)
        finally:
            writing.clear()

    try:
        warm = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
        snapshot_s = get(warm, "/api/leaderboard")
        warm.close()
        both = load_pages(live=False)
        static = {
            "page_p95_ms": round(_percentile(both, 0.95) * 1000, 1),
            "leaderboard_p95_ms": round(_percentile(timings["leaderboard"], 0.95) * 1000, 1),
            "node_page_p95_ms": round(_percentile(timings["node"], 0.95) * 1000, 1),
        }
        # long enough for the snapshot to be recomputed while the clients load pages
        live_s = max(LIVE_MIN_S, LIVE_SNAPSHOTS_COVERED * snapshot_s)
        writing.set()
        adding = threading.Thread(target=writer, args=(live_s,))
        adding.start()
        live_both = load_pages(live=True)
        adding.join()
    finally:
        server.stop()
    if failures:
        raise SystemExit(f"dashboard requests failed: {failures[:3]}")
    return {
        **static,
        "live_page_p95_ms": round(_percentile(live_both, 0.95) * 1000, 1),
        "live_s": f"{live_s:.0f}",
        "live_snapshots": len(shown),
        "dashboard_snapshot_s": f"{snapshot_s:.2f}",
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="50,000 receipts (under 3 minutes)")
    parser.add_argument("--receipts", type=int, help="receipts in the synthetic ledger (default 1,000,000)")
    args = parser.parse_args()
    total = args.receipts or (50_000 if args.quick else 1_000_000)
    now = time.time()
    population = Population()

    with tempfile.TemporaryDirectory(prefix="bench-ledger-") as scratch:
        receipts_file = Path(scratch) / "receipts.bin"
        print(f"signing {total:,} receipts of {CONTRIBUTORS:,} contributors (not timed)", flush=True)
        generate(receipts_file, total, now)

        sample = next(batches(receipts_file, BATCH))
        started = time.process_time()
        for data in sample:
            open_receipt(data, run_id=RUN, now=now)
        open_rate = len(sample) / (time.process_time() - started)

        db = Path(scratch) / "ledger.db"
        added = 0
        with Ledger(db, RUN) as ledger:
            wall, cpu = time.perf_counter(), time.process_time()
            for batch in batches(receipts_file, BATCH):
                result = ledger.add_many(batch, now=now)
                if result.refused:
                    raise SystemExit(f"synthetic receipts refused: {result.refused[:3]}")
                added += result.added
            wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
            print(f"  ingested {added:,} receipts in {wall:.1f} s ({cpu:.1f} s CPU)", flush=True)

            started = time.perf_counter()
            duplicates = ledger.add_many(sample, now=now).duplicates
            duplicate_rate = duplicates / (time.perf_counter() - started)

            started = time.perf_counter()
            report = ledger.credit(trusted=population.trusted(), now=now)
            credit_s = time.perf_counter() - started

            print(f"  dashboard: {PAGE_CLIENTS} clients x {PAGE_REQUESTS} requests", flush=True)
            pages = page_latencies(ledger, population, list(report.contributors), PAGE_REQUESTS, added)
        # a fresh connection checkpoints the WAL into the main file when the last one closes
        size = db.stat().st_size + sum(p.stat().st_size for p in db.parent.glob("ledger.db-*"))
        counts = report.standing_counts()
    verify_rate, openssl_rate = bare_verify_rates()

    fields = {
        "receipts": added,
        "contributors": len(report.contributors),
        "receipt_verify_per_s": round(added / wall),
        "receipt_verify_per_s_cpu": round(added / cpu),
        "open_receipt_per_s": round(open_rate),
        "ed25519_verify_per_s": round(verify_rate),
        "openssl_verify_per_s": round(openssl_rate),
        "verify_speedup_vs_openssl": f"{verify_rate / openssl_rate:.2f}",
        "ledger_bytes_per_receipt": round(size / added),
        "duplicate_per_s": round(duplicate_rate),
        "credit_s": f"{credit_s:.2f}",
        **pages,
    }
    print()
    print(f"{'measure':<34} | value")
    print(f"{'receipts / contributors':<34} | {added:,} / {len(report.contributors):,}")
    print(f"{'intake, verify + insert (wall)':<34} | {fields['receipt_verify_per_s']:,} receipts/s")
    print(f"{'intake, verify + insert (CPU)':<34} | {fields['receipt_verify_per_s_cpu']:,} receipts/s")
    print(f"{'open_receipt alone (CPU)':<34} | {fields['open_receipt_per_s']:,} receipts/s")
    print(f"{'bare Ed25519 verify (CPU)':<34} | {fields['ed25519_verify_per_s']:,} /s")
    print(f"{'same with OpenSSL (CPU)':<34} | {fields['openssl_verify_per_s']:,} /s")
    print(f"{'re-offered duplicates':<34} | {fields['duplicate_per_s']:,} receipts/s")
    print(f"{'ledger size':<34} | {fields['ledger_bytes_per_receipt']} bytes/receipt")
    print(f"{'credit table (whole ledger)':<34} | {credit_s:.2f} s")
    print(f"{'receipt standing':<34} | {', '.join(f'{k} {v:,}' for k, v in counts.items() if v)}")
    print(f"{'dashboard first request (snapshot)':<34} | {pages['dashboard_snapshot_s']} s")
    print(
        f"{'page p95, ' + str(PAGE_CLIENTS) + ' clients':<34} | {pages['page_p95_ms']} ms (leaderboard "
        f"{pages['leaderboard_p95_ms']} ms, node page {pages['node_page_p95_ms']} ms)"
    )
    print(
        f"{'same while receipts arrive':<34} | {pages['live_page_p95_ms']} ms ({LIVE_BATCH} new receipts "
        f"every {LIVE_PERIOD_S} s for {pages['live_s']} s; panels updated {pages['live_snapshots']} times)"
    )
    print("RESULT " + " ".join(f"{key}={value}" for key, value in fields.items()))


if __name__ == "__main__":
    main()
