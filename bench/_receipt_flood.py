"""The junk-receipts flood of `bench/robustness.py`: genuine receipts signed by fresh identities.

Two peers serve a node receipts, each signed by an identity minted for it (they count zero in
credit but are genuine, so the ledger cannot refuse them). The flood runs through the pull path's
own storing step (`node.receipts.client`, the page a pull hands the ledger), at the rate seen on a
live node (9,000 receipts in 3 minutes: 50 a second) for 10 minutes' worth, once with the run's
signers known (`node.receipts.standing`: the default budgets) and once with every receipt kept
(what a node did before), and reports the ledger file's growth in MiB of each
(`junk_receipts_stored_mib`, target <= 16; `junk_receipts_unfiltered_mib`, the baseline) and
whether honest receipts pulled after the flood were still stored (`honest_receipts_after_flood`).
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from node.ledger import Ledger
from node.receipts.client import PullResult, _store_page
from node.receipts.config import ReceiptsConfig
from node.receipts.standing import StandingFilter
from tests.helpers import receipts as make
from tests.helpers.receipts import RUN, new_peer

RATE_PER_S = 50
FLOOD_S = 600
PAGE = 256
MIB = 1 << 20


def _junk_page(count: int) -> list[bytes]:
    return [make.training(new_peer()[0], new_peer()[1], tokens=1000) for _ in range(count)]


def _size(path: Path) -> int:
    return sum(p.stat().st_size for p in path.parent.glob(path.name + "*"))


def _flood(path: Path, filtered: bool, receipts: int) -> tuple[float, bool]:
    """Ledger growth (MiB) under the flood, and whether the run's validator's receipts got in after it."""
    validator_key, validator = new_peer()
    _, worker = new_peer()
    config = ReceiptsConfig()
    standing = (
        StandingFilter(
            [validator], own=b"", per_source=config.max_unvouched_per_source, total=config.max_unvouched
        )
        if filtered
        else None
    )
    sources = [os.urandom(38), os.urandom(38)]
    with Ledger(path, RUN) as ledger:
        start = _size(path)
        for i in range(0, receipts, PAGE):
            source = sources[(i // PAGE) % 2]
            _store_page(ledger, _junk_page(min(PAGE, receipts - i)), PullResult(source, 0), None, standing)
        honest = [make.verdict(validator_key, worker, tokens=10) for _ in range(20)]
        result = PullResult(sources[0], 0)
        _store_page(ledger, honest, result, None, standing)
        ledger.close()
        grown = (_size(path) - start) / MIB
    return grown, result.added == len(honest)


def run_receipt_flood(*, quick: bool) -> dict[str, str]:
    receipts = RATE_PER_S * FLOOD_S // (10 if quick else 1)
    with tempfile.TemporaryDirectory(prefix="hivenet-flood-") as tmp:
        filtered, honest_ok = _flood(Path(tmp) / "filtered.db", True, receipts)
        unfiltered, _ = _flood(Path(tmp) / "unfiltered.db", False, receipts)
    print(f"\njunk receipts: {receipts} from fresh signers through 2 peers ({'1 minute' if quick else '10 minutes'} "
          f"at {RATE_PER_S}/s): ledger grew {filtered:.1f} MiB with the standing budgets, {unfiltered:.1f} MiB "
          f"without; honest receipts stored after the flood: {honest_ok}")  # fmt: skip
    return {
        "junk_receipts_stored_mib": f"{filtered:.1f}",
        "junk_receipts_unfiltered_mib": f"{unfiltered:.1f}",
        "honest_receipts_after_flood": "ok" if honest_ok else "lost",
    }
