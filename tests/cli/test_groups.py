"""``fluxmqctl group ...``, ``offsets ...`` and ``dlq ...`` against one broker."""

from __future__ import annotations

import base64
import time

from fluxmq._pb.v1 import queue_pb2 as pb
from fluxmq._pb.v1 import queue_pb2_grpc
from tests.integration.conftest import Node

from .conftest import Ctl
from .test_queues import fields, table

DEADLINE_S = 15.0


def test_groups_and_offsets(ctl: Ctl, node: Node) -> None:
    ctl.ok("queue", "create", "stream1", "--partitions", "2")
    ctl.ok("publish", "stream1", "a", "b", "c", "--partition", "0")
    ctl.ok("publish", "stream1", "d", "--partition", "1")

    created = fields(ctl.ok("group", "create", "stream1", "readers"))
    assert created["mode"] == "shared" and created["start"] == "earliest"
    g = ctl.json(
        "group",
        "create",
        "stream1",
        "tail-end",
        "--mode",
        "ordered",
        "--start",
        "latest",
        "--filter-header",
        "kind=x",
        "--filter-key-prefix",
        "user-",
    )
    assert g["mode"] == "DELIVERY_MODE_ORDERED" and g["start"] == {"latest": True}
    assert g["filter"]["header_equals"] == {"kind": base64.b64encode(b"x").decode()}
    ctl.fails(1, "group", "create", "stream1", "readers")  # GROUP_EXISTS

    rows = table(ctl.ok("group", "list", "stream1"))
    assert [(r["GROUP"], r["MODE"], r["START"]) for r in rows] == [
        ("readers", "shared", "earliest"),
        ("tail-end", "ordered", "latest"),
    ]
    listed = ctl.json("group", "list", "stream1")["groups"]
    assert [x["name"] for x in listed] == ["readers", "tail-end"]

    # offsets: get, seek (CommitOffsets on a stream queue), both formats
    got = ctl.json("offsets", "get", "stream1", "readers")["partitions"]
    assert [(p["committed"], p["latest"], p["lag"]) for p in got] == [
        ("0", "3", "3"),
        ("0", "1", "1"),
    ]
    rows = table(
        ctl.ok("offsets", "seek", "stream1", "readers", "--partition", "0", "--offset", "2")
    )
    assert rows[0] == {"PARTITION": "0", "COMMITTED": "2", "LATEST": "3", "LAG": "1"}
    err = ctl.fails(1, "offsets", "seek", "stream1", "readers", "-p", "0", "--offset", "99")
    assert err.startswith("error: ") and "request id" in err

    # a member joins the ordered group (as an SDK would): describe shows its partitions and
    # generation
    with node.channel() as ch:
        stub = queue_pb2_grpc.QueueServiceStub(ch)  # type: ignore[no-untyped-call]
        joined = stub.JoinGroup(
            pb.JoinGroupRequest(queue="stream1", group="tail-end", consumer_id="w-1"), timeout=10
        )
    assert sorted(joined.assigned) == [0, 1]
    desc = ctl.json("group", "describe", "stream1", "tail-end")
    assert desc["group"]["name"] == "tail-end" and desc["group_generation"] != "0"
    (member,) = desc["members"]
    assert member["consumer_id"] == "w-1" and member["member_id"] == joined.member_id
    assert member["generation_id"] == str(joined.generation_id)
    assert sorted(member["assigned"]) == [0, 1]
    text = ctl.ok("group", "describe", "stream1", "tail-end")
    head, parts, members = text.split("\n\n")[:3]
    assert fields(head)["mode"] == "ordered" and fields(head)["strategy"] == "sticky"
    assert [r["COMMITTED"] for r in table(parts)] == ["3", "1"]  # started at latest
    (mrow,) = table(members)
    assert mrow["CONSUMER"] == "w-1" and mrow["GENERATION"] == str(joined.generation_id)
    assert (mrow["ASSIGNED"], mrow["REVOKING"], mrow["PENDING"]) == ("0,1", "-", "-")
    # no members: said so
    text = ctl.ok("group", "describe", "stream1", "readers")
    head, parts, rest = text.split("\n\n")[:3]
    assert fields(head)["lag"] == "2" and fields(head)["mode"] == "shared"
    assert [(r["COMMITTED"], r["LAG"]) for r in table(parts)] == [("2", "1"), ("0", "1")]
    assert rest.strip() == "members: none joined"
    assert ctl.json("group", "describe", "stream1", "readers")["members"] == []

    # reset-offsets --dry-run: what would move, per partition, and nothing moves
    before = ctl.json("offsets", "get", "stream1", "readers")
    rows = table(
        ctl.ok(
            "group", "reset-offsets", "stream1", "readers", "--to", "earliest", "--dry-run"
        ).split("dry run:")[0]
    )
    assert [(r["COMMITTED"], r["RESET_TO"], r["MOVE"]) for r in rows] == [
        ("2", "0", "+2"),
        ("0", "0", "0"),
    ]
    doc = ctl.json(
        "group", "reset-offsets", "stream1", "readers", "--to", "latest", "-p", "1", "--dry-run"
    )
    assert doc["dry_run"] is True
    assert [(p["partition"], p["reset_to"]) for p in doc["partitions"]] == [(1, "1")]
    assert ctl.json("offsets", "get", "stream1", "readers") == before
    err = ctl.fails(1, "group", "reset-offsets", "stream1", "readers", "--to", "earliest",
                    "-p", "9", "--dry-run")  # fmt: skip
    assert "PARTITION_OUT_OF_RANGE" in err or "partition" in err

    # reset-offsets: to earliest for one partition, then to an offset / a time for all
    reset = ctl.json(
        "group", "reset-offsets", "stream1", "readers", "--to", "earliest", "--partition", "0"
    )
    assert [p["committed"] for p in reset["partitions"]] == ["0", "0"]
    rows = table(ctl.ok("group", "reset-offsets", "stream1", "readers", "--to", "latest"))
    assert [r["COMMITTED"] for r in rows] == ["3", "1"]
    reset = ctl.json("group", "reset-offsets", "stream1", "readers", "--to", "time:0")
    assert [p["committed"] for p in reset["partitions"]] == ["0", "0"]
    ctl.fails(2, "group", "reset-offsets", "stream1", "readers", "--to", "yesterday")

    # delete
    ctl.fails(2, "group", "delete", "stream1", "tail-end")  # no --yes off a terminal
    assert "deleted" in ctl.ok("group", "delete", "stream1", "tail-end", "--yes")
    assert ctl.json("group", "delete", "stream1", "readers", "--yes") == {
        "deleted": {"queue": "stream1", "group": "readers"}
    }
    assert ctl.json("group", "list", "stream1") == {"groups": []}
    err = ctl.fails(1, "group", "describe", "stream1", "readers")
    assert err.startswith("error: GROUP_NOT_FOUND: ")


def _wait_dead(ctl: Ctl, queue: str, n: int) -> list[dict[str, object]]:
    deadline = time.monotonic() + DEADLINE_S
    while True:
        dead: list[dict[str, object]] = ctl.json("dlq", "list", queue)["dead_letters"]
        if len(dead) >= n or time.monotonic() > deadline:
            return dead
        time.sleep(0.2)


def test_dead_letters(ctl: Ctl) -> None:
    ctl.ok("queue", "create", "fragile", "--type", "work", "--max-attempts", "1")
    ctl.ok("group", "create", "fragile", "workers")
    ctl.ok("publish", "fragile", "p1", "p2", "p3")
    # leased and never acked: with max_attempts 1 the expired leases are dead-lettered
    doc = ctl.json(
        "consume", "fragile", "-g", "workers", "-n", "3", "--no-ack", "--lease-ms", "100"
    )
    assert len(doc["messages"]) == 3
    dead = _wait_dead(ctl, "fragile", 3)
    assert len(dead) == 3
    assert {d["reason"] for d in dead} == {"max_attempts"}
    assert {d["group"] for d in dead} == {"workers"}

    rows = table(ctl.ok("dlq", "list", "fragile", "--group", "workers", "--limit", "2"))
    assert len(rows) == 2 and rows[0]["REASON"] == "max_attempts" and rows[0]["VALUE"] == "p1"
    limited = ctl.json("dlq", "list", "fragile", "--limit", "1")
    assert len(limited["dead_letters"]) == 1 and limited["more"] is True

    # replay one by id: back in the queue for the group, a fresh first attempt
    first = str(dead[0]["id"])
    assert ctl.json("dlq", "replay", "fragile", "--id", first) == {"replayed": "1"}
    doc = ctl.json("consume", "fragile", "-g", "workers", "-n", "5", "--wait-ms", "500")
    assert [(m["record"]["value"], m["receipt"]["attempt"]) for m in doc["messages"]] == [
        (base64.b64encode(b"p1").decode(), 1)
    ]
    # replay --all for the group, consume them; then purge what is left
    out = ctl.ok("dlq", "replay", "fragile", "--all", "--group", "workers")
    assert out.strip() == "replayed 2 dead letters to fragile"
    ctl.ok("consume", "fragile", "-g", "workers", "-n", "2", "--no-ack", "--lease-ms", "100")
    assert len(_wait_dead(ctl, "fragile", 2)) == 2
    ctl.fails(2, "dlq", "purge", "fragile", "--all")  # no --yes off a terminal
    ctl.fails(2, "dlq", "purge", "fragile")  # neither --id nor --all
    ctl.fails(2, "dlq", "replay", "fragile", "--id", "1", "--group", "workers")
    remaining = ctl.json("dlq", "list", "fragile")["dead_letters"]
    one = str(remaining[0]["id"])
    assert ctl.json("dlq", "purge", "fragile", "--id", one, "--yes") == {"purged": "1"}
    assert ctl.ok("dlq", "purge", "fragile", "--all", "--yes").strip() == (
        "purged 1 dead letters of fragile"
    )
    assert ctl.json("dlq", "list", "fragile") == {"dead_letters": [], "more": False}
