"""Pure helpers of the core: units, partitioner, commands, queue config."""

from __future__ import annotations

import pytest

from fluxmq._pb.internal import commands_pb2 as cpb
from fluxmq._pb.v1 import queue_pb2 as pb
from fluxmq.core import commands
from fluxmq.core.errors import FluxError
from fluxmq.core.partitioner import PreparedAppend, key_partition, prepare_append
from fluxmq.core.queue_config import merge_update, normalize_new, parse_label_selector, policy_of
from fluxmq.core.units import parse_bytes, parse_duration_ms


@pytest.mark.parametrize(
    ("text", "ms"),
    [("500ms", 500), ("30s", 30_000), ("2m", 120_000), ("1h", 3_600_000), ("7d", 604_800_000)],
)
def test_durations_parse_with_their_unit(text: str, ms: int) -> None:
    assert parse_duration_ms(text, "f") == ms


@pytest.mark.parametrize("text", ["", "10", "1.5s", "-1s", "3 weeks", "1y", "s"])
def test_bad_duration_names_the_field(text: str) -> None:
    with pytest.raises(FluxError) as info:
        parse_duration_ms(text, "config.retention.max_age")
    assert info.value.reason == "INVALID_ARGUMENT"
    assert info.value.violations[0].field == "config.retention.max_age"


def test_sizes_distinguish_decimal_and_binary_units() -> None:
    assert parse_bytes("10MB", "f") == 10_000_000
    assert parse_bytes("10MiB", "f") == 10 * 1024 * 1024
    assert parse_bytes("512", "f") == 512
    with pytest.raises(FluxError):
        parse_bytes("ten megs", "f")


def test_key_hash_is_stable_crc32c() -> None:
    # Pinned values: changing the hash would move every keyed message to another partition.
    assert key_partition(b"a", 3) == 0  # crc32c = 3251651376
    assert key_partition(b"order-42", 16) == 6  # crc32c = 4064620166
    assert key_partition(b"user-1", 16) == 12  # crc32c = 348964012
    assert key_partition(b"", 16) == 0


POLICY3 = policy_of(normalize_new(pb.QueueConfig(name="q", partitions=3)))


def prep(msgs: list[pb.PublishMessage], cursor: int = 0) -> PreparedAppend:
    return prepare_append("q", 1, POLICY3, msgs, cursor, 5)


def test_partition_choice_follows_explicit_then_key_then_round_robin() -> None:
    msgs = [
        pb.PublishMessage(key=b"a"),
        pb.PublishMessage(),
        pb.PublishMessage(partition=2),
        pb.PublishMessage(),
    ]
    out = prep(msgs, 7)
    assert (list(out.command.partitions), out.cursor) == ([0, 1, 2, 2], 9)


def test_explicit_partition_out_of_range_names_the_message() -> None:
    with pytest.raises(FluxError) as info:
        prep([pb.PublishMessage(), pb.PublishMessage(partition=5)])
    assert info.value.reason == "PARTITION_OUT_OF_RANGE"
    assert info.value.violations[0].field == "messages[1].partition"


def test_prepared_append_carries_idempotency_keys_only_when_present() -> None:
    assert list(prep([pb.PublishMessage(value=b"x")]).command.idempotency_keys) == []
    both = prep([pb.PublishMessage(value=b"x"), pb.PublishMessage(idempotency_key="k")])
    assert list(both.command.idempotency_keys) == ["", "k"]


@pytest.mark.parametrize(
    ("msgs", "field"),
    [
        ([], "messages"),
        ([pb.PublishMessage()] * 1001, "messages"),
        (
            [pb.PublishMessage(), pb.PublishMessage(value=b"x" * (1024 * 1024 + 1))],
            "messages[1].value",
        ),
        ([pb.PublishMessage(key=b"k" * (16 * 1024 + 1))], "messages[0].key"),
        ([pb.PublishMessage(headers={f"h{i}": b"" for i in range(65)})], "messages[0].headers"),
        ([pb.PublishMessage(idempotency_key="i" * 257)], "messages[0].idempotency_key"),
    ],
)
def test_invalid_publish_names_the_offending_field(
    msgs: list[pb.PublishMessage], field: str
) -> None:
    with pytest.raises(FluxError) as info:
        prep(msgs)
    assert info.value.violations[0].field == field


def test_commands_round_trip_with_their_op_code() -> None:
    cmd = cpb.ApplyRetentionCmd(now_ms=42)
    raw = commands.encode(cmd)
    assert raw[0] == commands.Op.APPLY_RETENTION
    op, back = commands.decode(raw)
    assert op is commands.Op.APPLY_RETENTION and back == cmd


def test_unknown_op_code_fails_loudly() -> None:
    with pytest.raises(commands.UnknownCommandError):
        commands.decode(b"\xff")


def test_new_queue_gets_defaults_written_out() -> None:
    cfg = normalize_new(pb.QueueConfig(name="orders"))
    assert (cfg.partitions, cfg.type, cfg.dedup_window, cfg.max_message_bytes) == (
        1,
        pb.QUEUE_TYPE_STREAM,
        "2m",
        1024 * 1024,
    )


@pytest.mark.parametrize(
    ("cfg", "field"),
    [
        (pb.QueueConfig(name="bad name"), "config.name"),
        (pb.QueueConfig(name="x" * 201), "config.name"),
        (pb.QueueConfig(name="q", partitions=1025), "config.partitions"),
        (
            pb.QueueConfig(name="q", retention=pb.Retention(max_age="forever")),
            "config.retention.max_age",
        ),
        (
            pb.QueueConfig(name="q", retention=pb.Retention(max_bytes="lots")),
            "config.retention.max_bytes",
        ),
        (pb.QueueConfig(name="q", dedup_window="8d"), "config.dedup_window"),
        (pb.QueueConfig(name="q", max_message_bytes=17 * 1024 * 1024), "config.max_message_bytes"),
    ],
)
def test_invalid_queue_config_names_the_offending_field(cfg: pb.QueueConfig, field: str) -> None:
    with pytest.raises(FluxError) as info:
        normalize_new(cfg)
    assert info.value.violations[0].field == field


def test_update_refuses_shrinking_partitions_and_type_changes() -> None:
    current = normalize_new(pb.QueueConfig(name="q", partitions=4))
    with pytest.raises(FluxError):
        merge_update(current, pb.QueueConfig(name="q", partitions=2), ["partitions"])
    with pytest.raises(FluxError):
        merge_update(current, pb.QueueConfig(name="q", type=pb.QUEUE_TYPE_WORK), ["type"])
    grown = merge_update(current, pb.QueueConfig(name="q", partitions=8), ["partitions"])
    assert grown.partitions == 8


def test_update_mask_changes_only_named_fields() -> None:
    current = normalize_new(
        pb.QueueConfig(name="q", labels={"team": "a"}, retention=pb.Retention(max_age="1h"))
    )
    patch = pb.QueueConfig(name="q", labels={"team": "b"}, retention=pb.Retention(max_age="2h"))
    out = merge_update(current, patch, ["labels"])
    assert dict(out.labels) == {"team": "b"} and out.retention.max_age == "1h"


def test_label_selector_parses_equality_terms() -> None:
    assert parse_label_selector("team=pay, env=prod") == [("team", "pay"), ("env", "prod")]
    with pytest.raises(FluxError):
        parse_label_selector("team")
