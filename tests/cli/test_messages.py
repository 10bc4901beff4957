"""``fluxmqctl publish``, ``consume`` and ``tail`` against one broker."""

from __future__ import annotations

import base64
import json
import signal
import subprocess
import time
from pathlib import Path

from fluxmq._pb.v1 import queue_pb2 as pb
from fluxmq._pb.v1 import queue_pb2_grpc
from tests.integration.conftest import Node

from .conftest import Ctl
from .test_queues import table


def b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


def test_publish_and_tail(ctl: Ctl, tmp_path: Path) -> None:
    ctl.ok("queue", "create", "events", "--partitions", "2")

    # arguments: one result per value
    rows = table(
        ctl.ok("publish", "events", "hello", "world", "--key", "user-7", "--header", "src=cli")
    )
    assert len(rows) == 2 and rows[0]["DUPLICATE"] == "no"
    assert rows[0]["PARTITION"] == rows[1]["PARTITION"]  # one key, one partition
    keyed = int(rows[0]["PARTITION"])
    doc = ctl.json("publish", "events", "once", "--partition", "0", "--idempotency-key", "k-1")
    assert doc["published"] == 1 and doc["duplicates"] == 0
    again = ctl.json("publish", "events", "once", "--partition", "0", "--idempotency-key", "k-1")
    assert again["duplicates"] == 1
    assert again["results"][0]["offset"] == doc["results"][0]["offset"]

    # a JSON lines file, with progress forced on (stderr is not a terminal here)
    lines = [
        {"value": "from-file", "key": "f1", "headers": {"h": "v"}, "partition": 1},
        {"value": {"n": 1}, "partition": 1},
        {"value": "delayed", "partition": 1, "delay_ms": 1},
    ]
    src = tmp_path / "in.jsonl"
    src.write_text("\n".join(json.dumps(x) for x in lines) + "\n\n")
    proc = ctl.run("publish", "events", "--file", str(src), "--progress")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("published 3 messages to events")
    assert "100%" in proc.stderr and "3 msgs" in proc.stderr

    # stdin: 2500 plain lines in batches of 1000, and JSON lines via "-"
    piped = ctl.json(
        "publish",
        "events",
        "--file",
        "-",
        "--lines",
        "--partition",
        "0",
        input="".join(f"m{i}\n" for i in range(2500)),
    )
    assert piped["published"] == 2500 and "results" not in piped
    assert (
        ctl.json("publish", "events", "-", input='{"value": "x", "partition": 0}\n')["published"]
        == 1
    )

    # bad input lines: usage errors naming the line, and what was published before
    err = ctl.fails(2, "publish", "events", "-", input='{"value": "ok"}\nnot json\n')
    assert err.startswith("error: input line 2: not JSON")  # the batch was not sent
    assert "published before" not in err
    err = ctl.fails(2, "publish", "events", "-", "--batch", "1", input="{}\n{}\n[1]\n")
    assert err.startswith("error: input line 3: expected an object")
    assert "(2 messages were published before this" in err
    err = ctl.fails(2, "publish", "events", "-", input='{"valeu": "typo"}\n')
    assert "unknown field(s) valeu" in err
    # No VALUE with stdin not a terminal (here /dev/null) reads lines: none, so nothing is sent.
    assert ctl.json("publish", "events")["published"] == 0
    ctl.fails(2, "publish", "events", "a", "--file", str(src))

    # tail partition 1 from the start: the JSON document, values as base64
    tailed = ctl.json("tail", "events", "--partition", "1", "--from", "earliest", "--count", "3")
    recs = tailed["records"]
    if keyed == 1:
        assert [r["value"] for r in recs] == [b64("hello"), b64("world"), b64("from-file")]
        assert recs[0]["key"] == b64("user-7") and recs[0]["headers"] == {"src": b64("cli")}
    else:
        assert [r["value"] for r in recs] == [b64("from-file"), b64('{"n":1}'), b64("delayed")]
        assert recs[0]["key"] == b64("f1") and recs[0]["headers"] == {"h": b64("v")}
    # the table, from an offset of partition 0
    rows = table(ctl.ok("tail", "events", "-p", "0", "--from", "offset:1", "-n", "2"))
    assert [r["PARTITION"] for r in rows] == ["0", "0"]
    assert [r["OFFSET"] for r in rows] == ["1", "2"]
    # from a timestamp (0: everything)
    later = ctl.json("tail", "events", "--from", "time:0", "-n", "1")
    assert len(later["records"]) == 1


def test_tail_follows_and_stops_on_ctrl_c(ctl: Ctl) -> None:
    ctl.ok("queue", "create", "live")
    proc = subprocess.Popen(
        [ctl.exe, "tail", "live", "--count", "2", "--from", "offset:0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=ctl.env(),
    )
    try:
        time.sleep(0.5)  # published while it follows, or just before it started: both arrive
        ctl.ok("publish", "live", "one", "two")
        out, err = proc.communicate(timeout=20)
    finally:
        proc.kill()
    assert proc.returncode == 0, err
    assert [r["VALUE"] for r in table(out)[:2]] == ["one", "two"]

    proc = subprocess.Popen(
        [ctl.exe, "-o", "json", "tail", "live", "--from", "earliest"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=ctl.env(),
    )
    try:
        time.sleep(2.5)  # started and tailing (a loaded machine takes a while to import grpc)
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=20)
    finally:
        proc.kill()
    assert proc.returncode == 130
    assert "Traceback" not in err and err.strip() == "interrupted"
    assert len(json.loads(out)["records"]) == 2  # what was read is still one document


def test_consume(ctl: Ctl) -> None:
    ctl.ok("queue", "create", "tasks", "--type", "work")
    ctl.ok("group", "create", "tasks", "workers")
    ctl.ok("publish", "tasks", "t1", "t2", "t3", "t4", "t5", "--header", "kind=test")

    rows = table(ctl.ok("consume", "tasks", "--group", "workers", "--count", "2"))
    assert [(r["OFFSET"], r["ATTEMPT"], r["VALUE"]) for r in rows] == [
        ("0", "1", "t1"),
        ("1", "1", "t2"),
    ]
    assert rows[0]["HEADERS"] == "kind=test"

    # --no-ack: leased, not acked; they come back after their (short) lease
    doc = ctl.json("consume", "tasks", "-g", "workers", "-n", "1", "--no-ack", "--lease-ms", "200")
    assert doc["acked"] is False
    assert [m["record"]["value"] for m in doc["messages"]] == [b64("t3")]
    offsets = ctl.json("offsets", "get", "tasks", "workers")["partitions"][0]
    assert offsets["committed"] == "2"

    # the rest, until an empty poll; t3 again (attempt 2) once its lease ended
    time.sleep(1.0)
    doc = ctl.json("consume", "tasks", "-g", "workers", "-n", "10", "--wait-ms", "300")
    got = sorted(
        (base64.b64decode(m["record"]["value"]).decode(), m["receipt"]["attempt"])
        for m in doc["messages"]
    )
    assert got == [("t3", 2), ("t4", 1), ("t5", 1)]
    assert ctl.json("offsets", "get", "tasks", "workers")["partitions"][0]["committed"] == "5"
    # nothing left: an empty poll ends the command with exit 0
    assert ctl.json("consume", "tasks", "-g", "workers", "--wait-ms", "100")["messages"] == []
    err = ctl.fails(1, "consume", "tasks", "-g", "nobody", "--wait-ms", "100")
    assert err.startswith("error: GROUP_NOT_FOUND: ")


def test_consume_can_nack_and_dead_letter(ctl: Ctl) -> None:
    """--nack gives the printed messages back (delivered again, next attempt); --dead sends
    them to the dead-letter queue with --reason; misused flags are usage errors."""
    ctl.ok("queue", "create", "jobs", "--type", "work")
    ctl.ok("group", "create", "jobs", "w")
    ctl.ok("publish", "jobs", "j1", "j2")
    doc = ctl.json("consume", "jobs", "-g", "w", "-n", "1", "--nack", "--retry-after-ms", "0")
    assert doc["settled"] == "nacked" and doc["acked"] is False
    assert [m["record"]["value"] for m in doc["messages"]] == [b64("j1")]
    # j1 again (attempt 2), then j2: both sent to the dead-letter queue with the reason
    deadline = time.monotonic() + 10
    got: list[tuple[str, int]] = []
    while len(got) < 2:
        assert time.monotonic() < deadline, got
        doc = ctl.json("consume", "jobs", "-g", "w", "-n", "2", "--dead", "--reason", "bad input",
                       "--wait-ms", "300")  # fmt: skip
        assert doc["settled"] == "dead"
        got += [
            (base64.b64decode(m["record"]["value"]).decode(), m["receipt"]["attempt"])
            for m in doc["messages"]
        ]
    assert sorted(got) == [("j1", 2), ("j2", 1)]
    deadline = time.monotonic() + 10
    while len(dead := ctl.json("dlq", "list", "jobs")["dead_letters"]) < 2:
        assert time.monotonic() < deadline, dead
        time.sleep(0.2)
    assert {d["reason"] for d in dead} == {"bad input"}
    assert ctl.json("offsets", "get", "jobs", "w")["partitions"][0]["committed"] == "2"
    err = ctl.fails(2, "consume", "jobs", "-g", "w", "--reason", "x")
    assert "--reason: only with --dead" in err
    err = ctl.fails(2, "consume", "jobs", "-g", "w", "--dead", "--retry-after-ms", "5")
    assert "--retry-after-ms: only with --nack" in err


def test_tail_exit_at_end_stops_at_the_high_watermarks_of_the_start(ctl: Ctl) -> None:
    ctl.ok("queue", "create", "ended", "--partitions", "2")
    for i in range(5):
        ctl.ok("publish", "ended", f"e{i}", "--partition", str(i % 2))
    doc = ctl.json("tail", "ended", "--from", "earliest", "--exit-at-end")
    assert sorted(base64.b64decode(r["value"]).decode() for r in doc["records"]) == [
        f"e{i}" for i in range(5)
    ]
    rows = table(ctl.ok("tail", "ended", "-e", "--from", "offset:1", "-p", "0"))
    assert [r["VALUE"] for r in rows] == ["e2", "e4"]
    # From the end (the default, latest) there is nothing to read: it exits at once.
    assert ctl.json("tail", "ended", "-e")["records"] == []
    err = ctl.fails(2, "tail", "ended", "-e", "-p", "7")
    assert "has no partition 7" in err


def test_jsonl_streams_one_object_per_record_and_format_strings_render_like_kcat(
    ctl: Ctl, node: Node
) -> None:
    """-o jsonl: one JSON object per record, text where the bytes are UTF-8 and base64 (said
    so) where not; --format: kcat's tokens, bytes as they are; -o jsonl elsewhere: the one
    document on one line."""
    ctl.ok("queue", "create", "lines", "--partitions", "1")
    with node.channel() as ch:
        queue_pb2_grpc.QueueServiceStub(ch).Publish(  # type: ignore[no-untyped-call]
            pb.PublishRequest(
                queue="lines",
                messages=[
                    pb.PublishMessage(value=b"caf\xc3\xa9", key=b"k1", headers={"h": b"v"}),
                    pb.PublishMessage(value=b"\xff\x00bin", headers={"raw": b"\xfe"}),
                ],
            ),
            timeout=10,
        )
    out = ctl.ok("-o", "jsonl", "tail", "lines", "--from", "earliest", "-e")
    first, second = (json.loads(line) for line in out.splitlines())
    assert (first["value"], first["value_encoding"]) == ("café", "utf-8")
    assert (first["key"], first["key_encoding"], first["headers"]) == ("k1", "utf-8", {"h": "v"})
    assert (first["queue"], first["partition"], first["offset"]) == ("lines", 0, 0)
    assert second["value_encoding"] == "base64"
    assert base64.b64decode(second["value"]) == b"\xff\x00bin" and "key" not in second
    assert second["headers_base64"] == ["raw"]
    assert base64.b64decode(second["headers"]["raw"]) == b"\xfe"

    rendered = ctl.ok("tail", "lines", "--from", "earliest", "-e", "-f", r"%t/%p:%o %k=%s (%S)\n",
                      "-n", "1")  # fmt: skip
    assert rendered == "lines/0:0 k1=café (5)\n"
    err = ctl.fails(2, "tail", "lines", "-f", "%q")
    assert "%q is not a token" in err

    ctl.ok("group", "create", "lines", "g")
    out = ctl.ok("-o", "jsonl", "consume", "lines", "-g", "g", "-n", "2", "--wait-ms", "200")
    assert [json.loads(line)["attempt"] for line in out.splitlines()] == [1, 1]
    assert ctl.json("offsets", "get", "lines", "g")["partitions"][0]["committed"] == "2"
    stats = ctl.ok("-o", "jsonl", "queue", "stats", "lines")
    assert len(stats.splitlines()) == 1 and json.loads(stats)["name"] == "lines"
