"""``fluxmqctl queue ...`` in both output formats against one broker."""

from __future__ import annotations

import re

from .conftest import Ctl


def fields(text: str) -> dict[str, str]:
    """``key: value`` lines -> dict."""
    out = {}
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep and not line.startswith(" "):
            out[key.strip()] = value.strip()
    return out


def table(text: str) -> list[dict[str, str]]:
    """An aligned table (no spaces inside cells) -> rows keyed by header."""
    lines = [line for line in text.splitlines() if line.strip() and not line.startswith("(")]
    headers = lines[0].split()
    return [dict(zip(headers, line.split(), strict=True)) for line in lines[1:]]


def test_queue_lifecycle(ctl: Ctl) -> None:
    out = ctl.ok(
        "queue",
        "create",
        "orders",
        "--partitions",
        "3",
        "--retention-max-age",
        "7d",
        "--label",
        "team=pay",
        "--label",
        "env=prod",
    )
    shown = fields(out)
    assert shown["name"] == "orders"
    assert shown["partitions"] == "3"
    assert shown["type"] == "stream"
    assert shown["retention.max_age"] == "7d"
    assert shown["labels"] == "env=prod,team=pay"

    work = ctl.json(
        "queue",
        "create",
        "jobs",
        "--type",
        "work",
        "--max-attempts",
        "3",
        "--lease-timeout",
        "5s",
        "--dlq",
        "jobs-dead",
        "--replication-factor",
        "0",
    )
    assert work["config"]["type"] == "QUEUE_TYPE_WORK"
    assert work["config"]["max_attempts"] == 3
    assert work["config"]["lease_timeout"] == "5s"
    assert work["config"]["dead_letter_queue"] == "jobs-dead"
    ctl.ok("queue", "create", "other", "--label", "team=ops")

    # describe, both formats
    assert fields(ctl.ok("queue", "describe", "jobs"))["max_attempts"] == "3"
    described = ctl.json("queue", "describe", "orders")
    assert described["config"]["labels"] == {"team": "pay", "env": "prod"}
    assert int(described["queue_id"]) > 0

    # list: every page, prefix, selector, limit
    rows = table(ctl.ok("queue", "list"))
    assert [r["NAME"] for r in rows] == ["jobs", "orders", "other"]
    assert rows[1]["TYPE"] == "stream" and rows[1]["PARTITIONS"] == "3"
    paged = ctl.json("queue", "list", "--page-size", "1")
    assert [q["config"]["name"] for q in paged["queues"]] == ["jobs", "orders", "other"]
    assert [q["config"]["name"] for q in ctl.json("queue", "list", "--prefix", "o")["queues"]] == [
        "orders",
        "other",
    ]
    by_label = ctl.json("queue", "list", "--selector", "team=pay")["queues"]
    assert [q["config"]["name"] for q in by_label] == ["orders"]
    limited = ctl.json("queue", "list", "--limit", "2", "--page-size", "1")["queues"]
    assert len(limited) == 2

    # update with a field mask: only the given fields change
    updated = fields(
        ctl.ok(
            "queue",
            "update",
            "orders",
            "--set",
            "partitions=4",
            "--set",
            "retention.max_age=3d",
            "--set",
            "labels=team=ops",
        )
    )
    assert updated["partitions"] == "4"
    assert updated["retention.max_age"] == "3d"
    assert updated["labels"] == "team=ops"
    assert updated["dedup_window"] == "2m"  # untouched
    upd = ctl.json("queue", "update", "jobs", "--set", "dead_letter_alert_threshold=5")
    assert upd["config"]["dead_letter_alert_threshold"] == "5"
    assert upd["config"]["max_attempts"] == 3

    # stats, both formats
    ctl.ok("publish", "orders", "a", "b", "c", "--partition", "1")
    st = ctl.json("queue", "stats", "orders")
    assert st["name"] == "orders" and st["messages"] == "3"
    assert [p["messages"] for p in st["partitions"]] == ["0", "3", "0", "0"]
    text = ctl.ok("queue", "stats", "orders")
    assert fields(text.split("\n\n")[0])["messages"] == "3"
    parts = table(text.split("\n\n")[1])
    assert parts[1] == {
        "PARTITION": "1",
        "LOW": "0",
        "HIGH": "3",
        "MESSAGES": "3",
        "BYTES": parts[1]["BYTES"],
    }

    # purge: destructive commands need --yes off a terminal
    err = ctl.fails(2, "queue", "purge", "orders", "--scope", "all")
    assert "--yes" in err and len(err.splitlines()) == 1
    purged = ctl.json("queue", "purge", "orders", "--scope", "all", "--yes")
    assert purged["purged_messages"] == "3"
    assert "purged (ready)" in ctl.ok("queue", "purge", "orders", "--scope", "ready", "--yes")
    ctl.ok("queue", "purge", "orders", "--scope", "scheduled", "--destructive", "--yes")

    # delete
    ctl.fails(2, "queue", "delete", "other")
    assert ctl.ok("queue", "delete", "other", "--yes").strip() == "queue other deleted"
    assert ctl.json("queue", "delete", "jobs", "--yes") == {"deleted": "jobs"}
    err = ctl.fails(1, "queue", "describe", "other")
    assert re.fullmatch(r"error: QUEUE_NOT_FOUND: .*other.* \(request id \S+\)", err), err


def test_update_rejects_what_it_cannot_set(ctl: Ctl) -> None:
    ctl.ok("queue", "create", "upd")
    err = ctl.fails(2, "queue", "update", "upd", "--set", "bogus=1")
    assert err.startswith("error: --set bogus: QueueConfig has no field 'bogus'")
    err = ctl.fails(2, "queue", "update", "upd", "--set", "max_attempts=many")
    assert "not an integer" in err
    err = ctl.fails(2, "queue", "update", "upd", "--set", "retention=7d")
    assert "retention.max_age" in err
    # the broker's own refusal: one line with the reason, request id and field violation
    err = ctl.fails(1, "queue", "update", "upd", "--set", "dedup_window=forever")
    assert err.startswith("error: INVALID_ARGUMENT: ") and "(request id " in err
    assert len(err.splitlines()) == 1


def test_a_queue_created_without_a_dlq_can_be_shared_as_other_queues_dlq(ctl: Ctl) -> None:
    """The SQS-style flow: create the dead-letter queue first, then name it from its sources.
    Only a queue made without a DLQ of its own may be named (a DLQ never has one)."""
    ctl.ok("queue", "create", "plain-target")
    err = ctl.fails(1, "queue", "create", "src-0", "--type", "work", "--dlq", "plain-target")
    assert "DEAD_LETTER_QUEUE_CONFLICT" in err or "FAILED_PRECONDITION" in err, err
    shown = fields(ctl.ok("queue", "create", "shared-dead", "--no-dlq"))
    assert shown["dead_letter_disabled"] == "true", shown
    for source in ("src-a", "src-b"):
        made = fields(ctl.ok("queue", "create", source, "--type", "work", "--dlq", "shared-dead"))
        assert made["dead_letter_queue"] == "shared-dead", made
    assert fields(ctl.ok("queue", "describe", "shared-dead"))["dead_letter_of"]
