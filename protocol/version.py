"""Software and protocol versions; the protocol version is part of every DHT key and signature."""

from __future__ import annotations

SOFTWARE_VERSION = "0.1.0"
PROTOCOL_VERSION = 2
