"""The attacks of `bench/robustness.py`: DHT squatting, upload-slot squatting, poisoned state, an
oversized averager message.

All on 127.0.0.1 against the landed code, from plain hivemind clients, with the scenarios the tests
run (`tests.helpers.squatting`, `tests.helpers.poisoning`, `tests.helpers.averager_streams`):

* **Squatting**: each of `SQUAT_ATTACKS` squats one key of a live run (plain value, an honest
  peer's subkey and a 1 MiB value, 31 years each); it is survived when no honest node keeps or
  returns a squat and the honest operation still works; one more writes hivemind's unsigned
  averager declarations in a trainer's name (a false step, "left its group"). The "64 values
  of 1 MiB" attack at one node is survived when every store is refused and the node's DHT
  process grows by less than a quarter of what was sent. Reported:
  `squat_attacks_survived=<survived>/<attacks>`.
* **Upload-slot squatting** (`tests.helpers.upload_slots`): two identities hold every manifest and
  chunk stream of a publisher with silent streams while an honest node fetches a small version;
  reported: `upload_slot_squat_fetch`, `ok` if the fetch completed, else `BLOCKED`.
* **Poisoned state**: in each variant (`own-hash`, `copied-hash`) a joiner resyncs while an
  attacker serves parameters of 1e4; reported: `poisoned_state_accepted`, how many it took.
* **Oversized averager message**: a peer declares a 2^40-byte aggregation part and streams up to
  `OVERSIZED_STREAM_BYTES` into one averager, until the averager closes the stream; reported:
  `averager_rss_growth_mib`, the peak RSS of the averager's process over its RSS before (target <= 16).
"""

from __future__ import annotations

import asyncio
import logging
import tempfile
import time
from pathlib import Path

from tests.helpers.averager_streams import OversizedOutcome, stream_oversized_message
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
MIB = 2**20


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
    for name in ("node.bans", "node.membership", "node.averaging.state_sync"):
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
        target = swarm.start_averagers()[0]
        oversized: OversizedOutcome = asyncio.run(
            stream_oversized_message(target, OVERSIZED_STREAM_BYTES, max_streams=1)
        )
    _print_squats(squats)
    squat_s = time.perf_counter() - start
    print(
        f"\noversized averager message: declared 2^40 bytes, streamed {oversized.sent / MIB:.0f} MiB "
        f"before the averager closed the stream; averager RSS {oversized.rss_before / MIB:.0f} MiB before, "
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
