"""Caller-supplied text at the edge: log lines stay one escaped, bounded line; errors echo a
bounded part of their input; the metadata layer refuses a bad name with a domain error; refused
admin calls are audited as refused, and at a bounded rate when the caller has no valid key."""

from __future__ import annotations

import asyncio
import io
import logging
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from fluxmq.core import limits
from fluxmq.core.errors import DETAIL_BYTES_MAX, MESSAGE_BYTES_MAX, queue_not_found
from fluxmq.core.queue_config import validate_name
from fluxmq.core.text import LOG_MESSAGE_CHARS_MAX, printable
from fluxmq.core.validation import group_name
from fluxmq.logging_setup import setup
from fluxmq.metadata.embedded import EmbeddedMetadataStore
from fluxmq.metadata.etcd import EtcdMetadataStore
from fluxmq.metadata.metadata import InvalidArgument
from fluxmq.server import guard as guard_module
from fluxmq.server.errors import domain_error, status_code, to_rpc_status
from fluxmq.server.guard import UNAUTHENTICATED_AUDIT, Identity, audit
from fluxmq.server.interceptors import _request_id

HUGE = "y" * (1 << 20)  # 1 MiB
BAD_NAMES = [" ", "a\0b", "../x", "x\n", "é"]


def test_printable_escapes_line_breaks_and_control_characters_and_cuts_long_values() -> None:
    assert printable("x\n<forged audit line>") == "x\\n<forged audit line>"
    assert printable("a\0b\x1b[31m\u202e") == "a\\x00b\\x1b[31m\\u202e"
    assert printable("fine.name-1") == "fine.name-1"
    cut = printable(HUGE)
    assert len(cut) < 250 and cut.endswith(f"({len(HUGE)} chars)")
    # Escaping must not lift the bound: 200 newlines escape to 400 characters.
    assert len(printable("\n" * 300)) < 250


def test_a_valid_queue_name_never_ends_with_a_newline() -> None:
    assert not limits.QUEUE_NAME_RE.match("x\n")
    with pytest.raises(Exception, match="not a queue name"):
        validate_name("x\n")
    with pytest.raises(Exception, match="not a group name"):
        group_name("g\n")


def test_a_label_key_never_ends_with_a_newline() -> None:
    assert limits.LABEL_KEY_RE.match("team")
    assert not limits.LABEL_KEY_RE.match("team\n")


def test_an_error_echoes_a_bounded_part_of_a_huge_input_in_message_metadata_and_violations() -> (
    None
):
    with pytest.raises(Exception) as raised:
        validate_name(HUGE, "name")
    err = domain_error(raised.value)
    assert err is not None and err.reason == "INVALID_ARGUMENT"
    assert len(err.message.encode()) <= MESSAGE_BYTES_MAX
    # Head and tail survive: the field named first, the rule stated last.
    assert err.message.startswith("name: 'yyy") and err.message.endswith("A-Z a-z 0-9 . _ -")
    assert [v.field for v in err.violations] == ["name"]
    assert all(len(v.description.encode()) <= DETAIL_BYTES_MAX for v in err.violations)
    missing = queue_not_found(HUGE)
    assert all(len(v.encode()) <= DETAIL_BYTES_MAX for v in missing.metadata.values())
    # The whole status fits the 8 KiB of trailing metadata a default gRPC client accepts.
    for e in (err, missing):
        assert len(to_rpc_status(e, "r" * 32).SerializeToString()) < 4096


def test_a_valid_name_is_echoed_whole() -> None:
    name = "q" * 200
    err = queue_not_found(name)
    assert name in err.message and err.metadata["queue"] == name


@pytest.mark.parametrize("name", BAD_NAMES)
def test_the_metadata_stores_refuse_a_bad_queue_name_with_invalid_argument(
    name: str, tmp_path: Path
) -> None:
    async def both() -> None:
        embedded = EmbeddedMetadataStore(tmp_path, clock_ms=lambda: 0)
        etcd = EtcdMetadataStore("127.0.0.1:9")  # never reached: the name is checked first
        try:
            for store in (embedded, etcd):
                with pytest.raises(InvalidArgument) as raised:
                    await store.get_placement(name)
                assert isinstance(raised.value, ValueError)  # still bad input to older callers
                err = domain_error(raised.value)
                assert err is not None and status_code(err) == grpc.StatusCode.INVALID_ARGUMENT
                assert [v.field for v in err.violations] == ["queue"]
        finally:
            await embedded.close()
            await etcd.close()

    asyncio.run(both())


@pytest.fixture
def log_text() -> Iterator[io.StringIO]:
    """The node's log setup, writing into a buffer."""
    root = logging.getLogger()
    saved = root.handlers[:], root.level
    out = io.StringIO()
    setup("INFO", as_json=False)
    root.handlers[0].setStream(out)  # type: ignore[attr-defined]
    try:
        yield out
    finally:
        root.handlers[:], _ = saved
        root.setLevel(saved[1])


def test_every_log_message_is_one_escaped_bounded_line(log_text: io.StringIO) -> None:
    logging.getLogger("fluxmq.test").info("queue %s deleted", "x\nFORGED fluxmq.audit line")
    logging.getLogger("fluxmq.test").warning("name %s", HUGE)
    lines = log_text.getvalue().splitlines()
    assert len(lines) == 2, lines
    assert "x\\nFORGED" in lines[0]
    assert len(lines[1]) < LOG_MESSAGE_CHARS_MAX + 200


def test_a_traceback_keeps_its_lines(log_text: io.StringIO) -> None:
    try:
        raise RuntimeError("boom")
    except RuntimeError:
        logging.getLogger("fluxmq.test").exception("failed")
    assert "Traceback" in log_text.getvalue() and len(log_text.getvalue().splitlines()) > 2


ADMIN = Identity("AbCdEfGh", "production", "admin", "default")


def test_refused_admin_calls_are_audited_as_refused_never_as_auth_off(
    log_text: io.StringIO,
) -> None:
    audit(None, "DeleteQueue", "rid1", "UNAUTHENTICATED", "queue x\nF", auth_on=True, refused=True)
    audit(ADMIN, "DeleteQueue", "rid2", "PERMISSION_DENIED", "queue q", auth_on=True, refused=True)
    audit(ADMIN, "DeleteQueue", "rid3", "OK", "queue q", auth_on=True)
    audit(None, "DeleteQueue", "rid4", "OK", "queue q")
    lines = log_text.getvalue().splitlines()
    assert len(lines) == 4, lines
    assert "REFUSED for a caller without a valid key: queue x\\nF -> UNAUTHENTICATED" in lines[0]
    assert "REFUSED for AbCdEfGh (production/admin): queue q -> PERMISSION_DENIED" in lines[1]
    assert "DeleteQueue by AbCdEfGh (production/admin): queue q -> OK" in lines[2]
    assert "by anonymous (auth off)" in lines[3]
    assert "auth off" not in "".join(lines[:3])


def test_refusals_without_a_key_are_audited_at_a_bounded_rate_and_the_gap_is_reported(
    log_text: io.StringIO, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(guard_module, "_refusals", guard_module._RefusalAudit())
    now = [1000.0]
    monkeypatch.setattr(guard_module.time, "monotonic", lambda: now[0])
    calls = 10 * UNAUTHENTICATED_AUDIT.burst
    for i in range(calls):
        audit(None, "DeleteQueue", f"r{i}", "UNAUTHENTICATED", "-", auth_on=True, refused=True)
    assert len(log_text.getvalue().splitlines()) == UNAUTHENTICATED_AUDIT.burst
    now[0] += 1.0  # a second later the budget has refilled a little
    audit(None, "DeleteQueue", "later", "UNAUTHENTICATED", "-", auth_on=True, refused=True)
    last = log_text.getvalue().splitlines()[-1]
    skipped = calls - UNAUTHENTICATED_AUDIT.burst
    assert "request id later" in last and f"({skipped} more such refusals not logged)" in last
    # A caller with a valid key is always audited.
    audit(ADMIN, "DeleteQueue", "k", "PERMISSION_DENIED", "-", auth_on=True, refused=True)
    assert "request id k" in log_text.getvalue().splitlines()[-1]


class _Context:
    def __init__(self, request_id: str) -> None:
        self._md = (("x-request-id", request_id),)

    def invocation_metadata(self) -> tuple[tuple[str, str], ...]:
        return self._md


@pytest.mark.parametrize("sent", ["r1\nFORGED line", "a b", "é", "x" * 129, ""])
def test_a_request_id_that_could_break_a_log_line_is_replaced(sent: str) -> None:
    got = _request_id(_Context(sent))  # type: ignore[arg-type]
    assert got != sent and len(got) == 32 and got.isalnum()


def test_a_printable_request_id_is_kept() -> None:
    assert _request_id(_Context("req-42:abc")) == "req-42:abc"  # type: ignore[arg-type]
