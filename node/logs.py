"""Logging setup: every line carries the short PeerID of the node that wrote it, in one format.

On a terminal, lines go through rich. Anywhere else (a pipe, journald, a container log) each record is
one line, never wrapped, so that a PeerID is never split: `TIME LEVEL [PEER] logger: message`, or a
JSON object per line with `log_format="json"`. A log file, when given, gets the same lines. hivemind's
own records go through the same handlers (its own handler is switched off through its public API).
"""

from __future__ import annotations

import json
import logging
import logging.handlers
import sys
from pathlib import Path
from typing import Any, Literal

_peer = "--------"

LogFormat = Literal["text", "json"]
LOG_FORMATS: tuple[str, ...] = ("text", "json")

_TEXT_FORMAT = "%(asctime)s %(levelname)s [%(peer)s] %(name)s: %(message)s"


def set_log_peer(short_id: str) -> None:
    """Name the node whose short PeerID appears in this process's log lines."""
    global _peer
    _peer = short_id


class PeerIdFilter(logging.Filter):
    """Adds `record.peer` (the node's short PeerID) to every log record."""

    def filter(self, record: logging.LogRecord) -> bool:
        record.peer = _peer
        return True


class JsonLineFormatter(logging.Formatter):
    """One JSON object per record: time (unix seconds), level, peer, logger, message (and the exception)."""

    def format(self, record: logging.LogRecord) -> str:
        line = {
            "time": round(record.created, 3),
            "level": record.levelname,
            "peer": getattr(record, "peer", _peer),
            "logger": record.name,
            "message": record.getMessage(),
        }
        if record.exc_info:
            line["exception"] = self.formatException(record.exc_info)
        return json.dumps(line, ensure_ascii=False)


class TextLineFormatter(logging.Formatter):
    """`TIME LEVEL [PEER] logger: message` with the message on that one line: its line breaks (a p2pd
    error lists one dial per line, and a peer's text may carry any) are written as `\\n`, so that no
    message can split a record or forge one. A traceback follows on lines indented by two spaces."""

    def __init__(self) -> None:
        super().__init__(_TEXT_FORMAT)

    def formatMessage(self, record: logging.LogRecord) -> str:
        return super().formatMessage(record).replace("\r", "\\r").replace("\n", "\\n")

    def formatException(self, ei: Any) -> str:
        return "\n".join("  " + line for line in super().formatException(ei).splitlines())

    def formatStack(self, stack_info: str) -> str:
        return "\n".join("  " + line for line in stack_info.splitlines())


def _formatter(log_format: LogFormat) -> logging.Formatter:
    return JsonLineFormatter() if log_format == "json" else TextLineFormatter()


def configure_logging(
    verbose: bool = False,
    quiet: bool = False,
    *,
    log_file: Path | None = None,
    log_format: LogFormat = "text",
) -> None:
    """Log to stderr as `[PEERID] logger: message` (see the module docstring); quiet hivemind unless verbose.

    `quiet` shows warnings only (for commands that draw a progress bar instead). `log_file` also appends
    every line to that file (reopened if logrotate moves it).
    """
    handlers: list[logging.Handler]
    if log_format == "text" and sys.stderr.isatty():
        from rich.console import Console
        from rich.logging import RichHandler

        rich = RichHandler(console=Console(stderr=True), show_path=False, rich_tracebacks=False)
        rich.setFormatter(logging.Formatter("[%(peer)s] %(name)s: %(message)s"))
        handlers = [rich]
    else:
        plain = logging.StreamHandler(sys.stderr)
        plain.setFormatter(_formatter(log_format))
        handlers = [plain]
    if log_file is not None:
        log_file.parent.mkdir(parents=True, exist_ok=True)
        to_file = logging.handlers.WatchedFileHandler(log_file, encoding="utf-8")
        to_file.setFormatter(_formatter(log_format))
        handlers.append(to_file)
    for handler in handlers:
        handler.addFilter(PeerIdFilter())
    logging.basicConfig(
        level=logging.DEBUG if verbose else logging.WARNING if quiet else logging.INFO,
        handlers=handlers,
        force=True,
    )
    from hivemind.utils.logging import use_hivemind_log_handler

    use_hivemind_log_handler("nowhere")  # hivemind's records propagate to these handlers, in this format
    for noisy in ("hivemind", "asyncio"):
        logging.getLogger(noisy).setLevel(logging.INFO if verbose else logging.WARNING)
