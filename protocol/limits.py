"""Size and time limits applied to everything that arrives from the network."""

from __future__ import annotations

MAX_ENVELOPE_BYTES = 8 * 1024
"""Largest signed envelope accepted in a DHT value (node records are well under 1 KiB)."""

MAX_NODE_RECORD_TTL_S = 300.0
"""A node record may not claim to stay valid longer than this; nodes refresh well before."""

MAX_CLOCK_SKEW_S = 30.0
"""Tolerance for peers' clocks when checking expiries."""

MAX_PUBLIC_NAME_CHARS = 64
MAX_ROLES = 4
MAX_ADDRESSES = 16
MAX_ADDRESS_CHARS = 256
MAX_RUN_ID_CHARS = 64
