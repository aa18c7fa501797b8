"""Log lines: one line per record off a terminal (a PeerID is never split), JSON lines on request, a log
file with the same lines, and hivemind's records in the same format."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from pathlib import Path

import pytest
from hivemind.utils.logging import use_hivemind_log_handler

from node.logs import configure_logging, set_log_peer

PEER = "12D3KooWRawPbxPtP1eZaJpumGnyWX2DcUyd3RQnydr3eAto4Az7"


@pytest.fixture
def restored_logging() -> Iterator[None]:
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)
    use_hivemind_log_handler("in_hivemind")
    set_log_peer("--------")


@pytest.mark.usefixtures("restored_logging")
@pytest.mark.parametrize("log_format", ["text", "json"])
def test_each_record_is_one_line_on_stderr_and_in_the_log_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], log_format: str
) -> None:
    log_file = tmp_path / "logs" / "node.log"
    configure_logging(log_file=log_file, log_format=log_format)  # type: ignore[arg-type]
    set_log_peer("ab12cd34")
    message = "a long line naming a peer far to the right of eighty columns: " + PEER
    logging.getLogger("node.membership").info(message)
    logging.getLogger("hivemind.p2p.p2p_daemon").warning("dial failed")
    err = capsys.readouterr().err.splitlines()
    written = log_file.read_text().splitlines()
    assert len(err) == len(written) == 2
    if log_format == "json":
        first, second = (json.loads(line) for line in written)
        assert first == {
            **first,
            "level": "INFO",
            "peer": "ab12cd34",
            "logger": "node.membership",
            "message": message,
        }
        assert second["logger"] == "hivemind.p2p.p2p_daemon" and second["message"] == "dial failed"
        assert [json.loads(line) for line in err] == [first, second]
    else:
        assert err == written
        assert written[0].endswith(f"INFO [ab12cd34] node.membership: {message}")
        assert " WARN" in written[1]  # hivemind names the level WARN
        assert written[1].endswith("[ab12cd34] hivemind.p2p.p2p_daemon: dial failed")


@pytest.mark.usefixtures("restored_logging")
def test_a_message_with_line_breaks_stays_one_line_and_cannot_forge_a_record(
    capsys: pytest.CaptureFixture[str],
) -> None:
    configure_logging()
    set_log_peer("ab12cd34")
    forged = "2026-12-08 00:00:00,000 WARNING [deadbeef] node.bans: banned 12D3KooW..."
    logging.getLogger("node.broadcast").info(
        "manifest from %s failed: %s", "peer", f"dial backoff\n{forged}\r"
    )
    try:
        raise ValueError("boom")
    except ValueError:
        logging.getLogger("node.node").exception("a step failed")
    first, second, *trace = capsys.readouterr().err.splitlines()
    assert first.endswith(f"manifest from peer failed: dial backoff\\n{forged}\\r")
    assert second.endswith("[ab12cd34] node.node: a step failed")
    assert trace and all(line.startswith("  ") for line in trace) and trace[-1] == "  ValueError: boom"
