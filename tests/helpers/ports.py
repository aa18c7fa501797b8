"""A TCP port on 127.0.0.1 that another program holds, for tests of "port in use" errors."""

from __future__ import annotations

import contextlib
import socket
from collections.abc import Iterator


@contextlib.contextmanager
def held_port() -> Iterator[int]:
    """A port some other listener holds until the block ends."""
    holder = socket.socket()
    try:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        yield holder.getsockname()[1]
    finally:
        holder.close()
