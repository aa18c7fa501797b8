"""The attacks of `bench/robustness.py`: DHT squatting, upload-slot squatting, poisoned state, an
oversized averaging frame.

All on 127.0.0.1 against the landed code, from plain hivemind clients, with the scenarios the tests
run (`tests.helpers.squatting`, `tests.helpers.poisoning`), and the oversized frame here:

* **Squatting**: each of `SQUAT_ATTACKS` squats one key of a live run (plain value, an honest
  peer's subkey and a 1 MiB value, 31 years each); it is survived when no honest node keeps or
  returns a squat and the honest operation still works; one more writes an unsigned round
  declaration in a trainer's name (a step it never reached). The "64 values
  of 1 MiB" attack at one node is survived when every store is refused and the node's DHT
  process grows by less than a quarter of what was sent. Reported:
  `squat_attacks_survived=<survived>/<attacks>`.
* **Upload-slot squatting** (`tests.helpers.upload_slots`): two identities hold every manifest and
  chunk stream of a publisher with silent streams while an honest node fetches a small version;
  reported: `upload_slot_squat_fetch`, `ok` if the fetch completed, else `BLOCKED`.
* **Poisoned state**: in each variant (`own-hash`, `copied-hash`) a joiner resyncs while an
  attacker serves parameters of 1e4; reported: `poisoned_state_accepted`, how many it took.
* **Oversized averaging frame**: a peer opens a stream to an honest trainer's averaging service
  (`node.collective.service.AveragingService`, hosted by a `GatherAverager`), declares a frame of
  `DECLARED_FRAME_BYTES` (the most a 4-byte frame length can say) and streams up to
  `OVERSIZED_STREAM_BYTES` of zeros into it, until the service closes the stream; reported:
  `averager_rss_growth_mib`, the peak RSS of the process hosting the service (this one: there is
  no averager process any more, a trainer averages in its own process) over its RSS before
  (target <= 16). (It replaces the old attack on the removed hivemind all-reduce averager, a
  2^40-byte aggregation part streamed into the averager's own process.)
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import psutil
from hivemind.p2p import P2P

from node.collective.averager import GatherAverager
from tests.helpers.poisoning import POISONING_VARIANTS, fetch_as_joiner, poison_accepted, poisoned_run
from tests.helpers.squat_swarm import (
    LARGE_VALUE_BYTES,
    LARGE_VALUES,
    SquatOutcome,
    SquatSwarm,
    open_squat_swarm,
)
from tests.helpers.squatting import (
    SQUAT_ATTACKS,
    attack_with_large_values,
    run_squat_attack,
)
from tests.helpers.upload_slots import squat_upload_slots

OVERSIZED_STREAM_BYTES = 384 * 1024 * 1024
DECLARED_FRAME_BYTES = 2**32 - 1
ATTACK_CHUNK_BYTES = 1 << 20
MIB = 2**20


@dataclass
class OversizedOutcome:
    """What streaming into a frame declared far too large did to the process hosting the service."""

    rss_before: int
    rss_peak: int
    rss_after: int
    sent: int
    """Bytes handed to the stream (what the service read of them is bounded by its frame cap)."""
    banned: bool

    @property
    def growth(self) -> int:
        """Peak RSS of the service's process over its RSS before the attack, in bytes."""
        return self.rss_peak - self.rss_before


async def stream_oversized_frame(
    target: GatherAverager, maddrs: list[str], total_bytes: int
) -> OversizedOutcome:
    """Declare a `DECLARED_FRAME_BYTES` frame to `target`'s averaging service and stream up to
    `total_bytes` of it, from a fresh P2P daemon that knows `maddrs` (the target's DHT's).

    The RSS of this process (the service's) is read before, after every chunk, and once the target
    has closed the stream (or 10 s after the last chunk, if it keeps it open).
    """
    process = psutil.Process(os.getpid())
    p2p = await P2P.create(initial_peers=maddrs)
    try:
        if target.bans.is_banned(p2p.peer_id):
            raise RuntimeError("the attacker is banned before it attacked")
        _, reader, writer = await p2p.call_binary_stream_handler(target.p2p.peer_id, target.rounds.proto)
        before = process.memory_info().rss
        peak, sent = before, 0
        chunk = bytes(ATTACK_CHUNK_BYTES)
        writer.write(DECLARED_FRAME_BYTES.to_bytes(4, "big"))
        try:
            while sent < total_bytes:
                writer.write(chunk)
                sent += len(chunk)
                await asyncio.wait_for(writer.drain(), 10)
                peak = max(peak, process.memory_info().rss)
        except (ConnectionError, TimeoutError, OSError):
            pass
        with contextlib.suppress(
            TimeoutError, ConnectionError, OSError
        ):  # the target's answer, then its close
            await asyncio.wait_for(reader.read(), 10)
        after = process.memory_info().rss
        writer.close()
        return OversizedOutcome(before, max(peak, after), after, sent, target.bans.is_banned(p2p.peer_id))
    finally:
        await p2p.shutdown()


def _squat(swarm: SquatSwarm, attack: str) -> SquatOutcome:
    try:
        return run_squat_attack(swarm, attack)
    except Exception as exc:  # an attack that breaks the honest operation outright is not survived
        return SquatOutcome(attack, 0, False, f"failed: {exc!r}")


def _large_values(swarm: SquatSwarm) -> SquatOutcome:
    sent = LARGE_VALUES * LARGE_VALUE_BYTES
    try:
        outcome = attack_with_large_values(swarm)
    except Exception as exc:
        return SquatOutcome(f"{LARGE_VALUES} x 1 MiB", 0, False, f"failed: {exc!r}")
    return SquatOutcome(
        f"{LARGE_VALUES} x 1 MiB",
        outcome.accepted,
        outcome.growth < sent // 4,
        f"{outcome.accepted} of {LARGE_VALUES} stored; the node's DHT process grew by "
        f"{outcome.growth / MIB:.1f} MiB",
    )


def _upload_slots(swarm: SquatSwarm) -> bool:
    """Whether an honest fetch completes while a few identities hold all of the publisher's upload streams."""
    directory = swarm.root / swarm.fresh_name("uploadslots")
    try:
        outcome = asyncio.run(squat_upload_slots(swarm.publisher, swarm.follower, directory))
    except Exception as exc:  # an attack that breaks the scenario outright is not survived
        print(f"\nupload-slot squatting: failed: {exc!r}")
        return False
    fetch = "completed" if outcome.fetched else f"FAILED {outcome.error}"
    print(
        f"\nupload-slot squatting: honest fetch {fetch}; {outcome.preemptions} attacker stream(s) "
        f"preempted, {outcome.told_preempted} told so"
    )
    return outcome.fetched


def _print_squats(outcomes: list[SquatOutcome]) -> None:
    print(f"\n{'squatted key':<21}{'kept':>5}  {'honest op':<10}detail")
    for o in outcomes:
        print(f"{o.attack:<21}{o.squats_kept:>5}  {'ok' if o.honest_ok else 'BROKEN':<10}{o.detail}")


def _poisoning() -> dict[str, str]:
    """Per variant: what the joiner took ('honest state', 'nothing', 'POISONED state' or the error)."""
    taken: dict[str, str] = {}
    for variant in POISONING_VARIANTS:
        try:
            with poisoned_run(variant) as joiner:
                fetched = fetch_as_joiner(joiner)
        except Exception as exc:
            taken[variant] = f"failed: {exc!r}"
            continue
        if poison_accepted(fetched):
            taken[variant] = "POISONED state"
        else:
            taken[variant] = "nothing" if fetched is None else "honest state"
    return taken


def run_attacks() -> dict[str, str]:
    """Run every attack once, print their tables, and return the RESULT fields."""
    start = time.perf_counter()
    for name in (
        "node.bans",
        "node.membership",
        "node.collective.service",
        "node.collective.state_service",
        "node.rollouts.streams",
    ):
        logging.getLogger(name).setLevel(
            logging.ERROR
        )  # each refused attack is logged: keep the tables readable
    with (
        tempfile.TemporaryDirectory(prefix="hivenet-robustness-") as tmp,
        open_squat_swarm(Path(tmp)) as swarm,
    ):
        squats = [_squat(swarm, attack) for attack in SQUAT_ATTACKS]
        squats.append(_large_values(swarm))
        upload_slots_ok = _upload_slots(swarm)
        target = swarm.start_averagers()[0]  # on the publisher's node
        maddrs = [str(a) for a in swarm.publisher.dht.get_visible_maddrs()]
        oversized = asyncio.run(stream_oversized_frame(target, maddrs, OVERSIZED_STREAM_BYTES))
    _print_squats(squats)
    squat_s = time.perf_counter() - start
    print(
        f"\noversized averaging frame: declared {DECLARED_FRAME_BYTES} bytes, streamed "
        f"{oversized.sent / MIB:.0f} MiB to the stream before the service closed it; RSS of its process "
        f"{oversized.rss_before / MIB:.0f} MiB before, "
        f"{oversized.rss_peak / MIB:.0f} MiB at peak, {oversized.rss_after / MIB:.0f} MiB after; "
        f"sender banned: {oversized.banned}"
    )
    taken = _poisoning()
    print(f"\n{'poisoning variant':<18}the joiner took")
    for variant, what in taken.items():
        print(f"{variant:<18}{what}")
    print(
        f"(squatting and oversized message {squat_s:.0f} s, poisoning "
        f"{time.perf_counter() - start - squat_s:.0f} s)",
        flush=True,
    )
    survived = sum(o.survived for o in squats)
    accepted = sum(what == "POISONED state" for what in taken.values())
    return {
        "squat_attacks_survived": f"{survived}/{len(squats)}",
        "upload_slot_squat_fetch": "ok" if upload_slots_ok else "BLOCKED",
        "poisoned_state_accepted": str(accepted),
        "averager_rss_growth_mib": f"{oversized.growth / MIB:.1f}",
    }
