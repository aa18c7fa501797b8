"""Fuzzing the text peers send into this node's terminal, logs and tables: verdict reasons and
details, node records' versions and accelerator names.

Every hostile string (rich markup, ANSI and OSC escapes, control characters, line breaks, huge
strings) is either refused where it is parsed or arrives printable and is printed as it is: a
worker's report line and a `peers` table row never raise and never carry an escape character to
the operator's terminal. Each property runs twice (see tests.helpers.fuzzing): fast and `slow`.
"""

from __future__ import annotations

import io
import logging
from types import SimpleNamespace

from hypothesis import strategies as st
from pydantic import ValidationError
from rich.console import Console
from rich.table import Table

from cli.output import plain_printer
from protocol import rollouts_pb2 as rpb
from protocol.envelope import seal
from protocol.errors import InvalidMessage
from protocol.node_record import Capabilities, NodeRecord, Role
from protocol.peer_keys import peer_id_from_private_key
from protocol.rollout_messages import DOMAIN_VERDICT, open_verdict, seal_verdict
from tests.helpers.fuzzing import HOSTILE_TEXT_SAMPLES, fuzz_variants
from tests.helpers.rollouts import RUN, key, peer_bytes
from training.rl_worker import GroupReport, InferenceWorker

NOW = 1_800_000_000.0
VALIDATOR = key("text validator")
WORKER = key("text worker")
HOSTILE = st.one_of(
    st.sampled_from(HOSTILE_TEXT_SAMPLES),
    st.text(max_size=300),
    st.text(alphabet=st.sampled_from("[]/\x1b\x07\n;=ab"), max_size=60),
    st.integers(1000, 200_000).map(lambda n: "[" * n),
)


def _rendered(line: str) -> str:
    out = io.StringIO()
    plain_printer(Console(file=out, force_terminal=True, width=100))(line)
    return out.getvalue()


def _verdict_text_property(reason: str, detail: str) -> None:
    verdict = rpb.RolloutVerdict(
        worker=peer_bytes(WORKER), rollout_hash=b"\x01" * 32, accepted=False, reason=reason, detail=detail,
        issued_at=NOW,
    )  # fmt: skip
    # a hostile validator signs whatever it likes: it does not go through seal_verdict's cleaning
    try:
        sealed = seal(
            VALIDATOR,
            domain=DOMAIN_VERDICT,
            run_id=RUN,
            payload=verdict.SerializeToString(),
            expires_at=NOW + 60,
            seq=0,
        )
        _, opened = open_verdict(sealed, run_id=RUN, validator=peer_bytes(VALIDATOR), now=NOW)
    except InvalidMessage:  # too big to seal, or refused when opened
        return
    assert opened.reason.isidentifier() and opened.detail.isprintable()
    report = GroupReport(1, 0, "validatr", 10, 0.5)
    report.rejected[opened.reason] += 1
    shown = _rendered(f"{report.describe()} {opened.detail}")
    assert opened.reason in shown and "\x07" not in shown


test_verdict_text_fast, test_verdict_text_slow = fuzz_variants(_verdict_text_property, HOSTILE, HOSTILE)


def _our_verdicts_are_always_openable_property(detail: str) -> None:
    sealed = seal_verdict(
        VALIDATOR, run_id=RUN, verdict=rpb.RolloutVerdict(
            worker=peer_bytes(WORKER), rollout_hash=b"\x01" * 32, accepted=False, reason="reward_error",
            detail=detail, issued_at=NOW,
        ),
    )  # fmt: skip
    _, opened = open_verdict(sealed, run_id=RUN, validator=peer_bytes(VALIDATOR), now=NOW)
    assert opened.detail.isprintable()


test_our_verdicts_fast, test_our_verdicts_slow = fuzz_variants(
    _our_verdicts_are_always_openable_property, HOSTILE
)


def _record_text_property(version: str, accelerator: str) -> None:
    try:
        record = NodeRecord(
            peer_id=peer_id_from_private_key(WORKER), roles=(Role.INFERENCE,), public_name="n", run_id=RUN,
            software_version=version, protocol_version=1,
            capabilities=Capabilities(cpu_count=1, memory_bytes=1, accelerator=accelerator),
            addresses=(), started_at=NOW, instance_id=b"\x01" * 8,
        )  # fmt: skip
        record = NodeRecord.from_payload(record.to_payload())
    except (ValidationError, InvalidMessage):
        return
    table = Table()
    for column in ("version", "accelerator"):
        table.add_column(column)
    table.add_row(record.software_version, record.capabilities.accelerator)  # markup on, as `hivenet peers`
    out = io.StringIO()
    Console(file=out, width=200).print(table)
    assert record.software_version[:20] in out.getvalue() or len(record.software_version) > 20


test_record_text_fast, test_record_text_slow = fuzz_variants(_record_text_property, HOSTILE, HOSTILE)


def test_a_report_that_cannot_be_printed_does_not_stop_the_worker(caplog: object) -> None:
    def broken(report: GroupReport) -> None:
        raise RuntimeError("the terminal went away")

    worker = SimpleNamespace(node=SimpleNamespace(short_id="w0"), reports=[], on_group=broken)
    with (logging.getLogger("training.rl_worker").handlers and None) or __import__(
        "contextlib"
    ).nullcontext():
        InferenceWorker._report(worker, GroupReport(3, 0, "v", 1, 0.1))  # type: ignore[arg-type]
    assert len(worker.reports) == 1
