"""Counting the bytes a process sends to its peers, where it hands them to libp2p streams.

hivemind writes every protobuf message (with its length header) through the static method
`P2P.send_raw_data`; `count_sent_bytes(on_send)` wraps it once for the whole process, so that
matchmaking, all-reduce and state downloads are all counted. The averager's process counts
into one shared counter; the DiLoCo benchmark attributes writes to each of its P2P daemons.
DHT traffic goes through hivemind's DHT process and is not counted.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from hivemind.p2p import P2P

__all__ = ["SendHook", "count_sent_bytes"]

SendHook = Callable[[int, asyncio.StreamWriter], None]
"""Called with the bytes of one write (message plus length header) and the stream it goes to."""


def count_sent_bytes(on_send: SendHook) -> Callable[[], None]:
    """Call `on_send` for every message this process writes to a libp2p stream; returns the undo.

    The undo restores the method as it was before this call, so nested uses undo in reverse order.
    """
    original = P2P.send_raw_data

    async def counted_send_raw_data(
        data: bytes, writer: asyncio.StreamWriter, *, chunk_size: int = 2**16
    ) -> None:
        on_send(len(data) + P2P.HEADER_LEN, writer)
        await original(data, writer, chunk_size=chunk_size)

    P2P.send_raw_data = staticmethod(counted_send_raw_data)  # type: ignore[method-assign]

    def undo() -> None:
        P2P.send_raw_data = original  # type: ignore[method-assign]

    return undo
