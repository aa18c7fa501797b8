"""Logging setup: every line carries the short PeerID of the node that wrote it."""

from __future__ import annotations

import logging

_peer = "--------"


def set_log_peer(short_id: str) -> None:
    """Name the node whose short PeerID appears in this process's log lines."""
    global _peer
    _peer = short_id


class PeerIdFilter(logging.Filter):
    """Adds `record.peer` (the node's short PeerID) to every log record."""

    def filter(self, record: logging.LogRecord) -> bool:
        record.peer = _peer
        return True


def configure_logging(verbose: bool = False, quiet: bool = False) -> None:
    """Log through rich to stderr as `[PEERID] logger: message`; quiet hivemind unless verbose.

    `quiet` shows warnings only (for commands that draw a progress bar instead).
    """
    from rich.console import Console
    from rich.logging import RichHandler

    handler = RichHandler(console=Console(stderr=True), show_path=False, rich_tracebacks=False)
    handler.addFilter(PeerIdFilter())
    logging.basicConfig(
        level=logging.DEBUG if verbose else logging.WARNING if quiet else logging.INFO,
        format="[%(peer)s] %(name)s: %(message)s",
        handlers=[handler],
        force=True,
    )
    for noisy in ("hivemind", "asyncio"):
        logging.getLogger(noisy).setLevel(logging.INFO if verbose else logging.WARNING)
