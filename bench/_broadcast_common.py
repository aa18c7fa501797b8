"""What the broadcast benchmark's coordinator and its worker processes share.

The worker processes (hivenet nodes, shardcast origin/relays/clients) are `bench/broadcast.py`
run in an internal mode; they answer the coordinator with one JSON line per event on stdout.
Only the standard library is imported here: the shardcast nodes run under a scratch venv's
python that has no project dependencies.
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "bench" / "broadcast.py"
"""The entry point the worker processes run (in an internal mode)."""
MIB = 1024 * 1024


def reply(**message: Any) -> None:
    """Send one event to the coordinator (a JSON line on stdout)."""
    sys.stdout.write(json.dumps(message) + "\n")
    sys.stdout.flush()


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while piece := handle.read(8 * MIB):
            digest.update(piece)
    return digest.hexdigest()
