"""Records a client encoded itself (``PublishRequest.encoded``): the SDK's encoder writes what the
broker's encoder writes, and the broker's check refuses every bad record, naming it and its field,
before anything is proposed."""

from __future__ import annotations

import struct

import pytest

from fluxmq._pb.v1 import queue_pb2 as pb
from fluxmq.client.record_batches import encode_records
from fluxmq.core import limits
from fluxmq.core.encoded_records import check_encoded
from fluxmq.core.errors import FluxError
from fluxmq.core.partitioner import prepare_append, prepare_encoded_append
from fluxmq.core.queue_config import QueuePolicy
from storage.record_batch import prepare_records

POLICY = QueuePolicy(
    partitions=3,
    max_age_ms=0,
    max_messages=0,
    max_bytes=0,
    dedup_window_ms=120_000,
    max_message_bytes=1024,
)
HEAD = struct.Struct(">IIIIHH")
NO_KEY = 0xFFFFFFFF
NO_IDEM = 0xFFFF

MESSAGES = [
    pb.PublishMessage(value=b"plain"),
    pb.PublishMessage(value=b"", key=b""),  # an empty key is a key
    pb.PublishMessage(value=b"v" * 300, key=b"k1"),
    pb.PublishMessage(value=b"h", headers={"b": b"2", "a": b"1", "\u00e9t\u00e9": b"\xff"}),
]


def encoded(records: bytes, count: int, partition: int = 0) -> pb.EncodedRecords:
    return pb.EncodedRecords(partition=partition, count=count, records=records)


def refused(records: bytes, count: int, partition: int = 0) -> FluxError:
    with pytest.raises(FluxError) as info:
        check_encoded("orders", POLICY, encoded(records, count, partition))
    return info.value


def field_of(err: FluxError) -> str:
    return err.violations[0].field


def record(
    index: int,
    value: bytes = b"v",
    *,
    key: bytes | None = None,
    headers: list[tuple[bytes, bytes]] | None = None,
    timestamp_delta: int = 0,
    idem: bytes | None = None,
) -> bytes:
    headers = headers or []
    head = HEAD.pack(
        index,
        timestamp_delta,
        NO_KEY if key is None else len(key),
        len(value),
        len(headers),
        NO_IDEM if idem is None else len(idem),
    )
    body = (key or b"") + value
    for name, v in headers:
        body += struct.pack(">HI", len(name), len(v)) + name + v
    return head + body + (idem or b"")


def test_sdk_encoder_writes_the_records_the_broker_encodes_for_the_same_messages() -> None:
    fields = [
        (
            m.value,
            m.key if m.HasField("key") else None,
            tuple(sorted(m.headers.items())),
            None,
        )
        for m in MESSAGES
    ]
    assert encode_records(MESSAGES) == prepare_records(fields)


def test_encoded_append_stores_the_section_as_it_came_and_counts_the_payload() -> None:
    section = encode_records(MESSAGES)
    prepared = prepare_encoded_append(
        "orders", 7, POLICY, encoded(section, len(MESSAGES), partition=2), 5, 1_000
    )
    assert list(prepared.command.partitions) == [2] * len(MESSAGES)
    (batch,) = prepared.command.batches
    assert (batch.partition, batch.count, batch.records) == (2, len(MESSAGES), section)
    assert prepared.cursor == 5  # the request named its partition: no round-robin step
    # The same payload count as the message path's (names of ASCII headers are their bytes).
    by_messages = prepare_append("orders", 7, POLICY, MESSAGES[:3], 0, 1_000)
    by_records = check_encoded("orders", POLICY, encoded(encode_records(MESSAGES[:3]), 3))
    assert by_records == by_messages.payload_bytes == 5 + 0 + 302


def test_a_session_stamp_travels_with_encoded_records_and_needs_a_producer_id() -> None:
    section = encode_records(MESSAGES[:1])
    producer = pb.ProducerSession(producer_id=4, producer_epoch=2, first_sequence=9)
    cmd = prepare_encoded_append(
        "orders", 7, POLICY, encoded(section, 1), 0, 1_000, producer
    ).command
    assert (cmd.producer_id, cmd.producer_epoch, cmd.first_sequence) == (4, 2, 9)
    with pytest.raises(FluxError) as info:
        prepare_encoded_append(
            "orders", 7, POLICY, encoded(section, 1), 0, 1_000, pb.ProducerSession()
        )
    assert field_of(info.value) == "producer.producer_id"


@pytest.mark.parametrize("count", [0, limits.PUBLISH_MESSAGES_MAX + 1])
def test_a_record_count_outside_1_to_1000_is_refused(count: int) -> None:
    err = refused(record(0), count)
    assert (err.reason, field_of(err)) == ("INVALID_ARGUMENT", "encoded.count")


def test_a_partition_the_queue_does_not_have_is_refused() -> None:
    err = refused(record(0), 1, partition=3)
    assert (err.reason, field_of(err)) == ("PARTITION_OUT_OF_RANGE", "encoded.partition")


@pytest.mark.parametrize(
    ("bad", "reason", "field"),
    [
        (record(5), "INVALID_ARGUMENT", "encoded.records[1].offset_delta"),
        (record(1, timestamp_delta=3), "INVALID_ARGUMENT", "encoded.records[1].timestamp_delta"),
        (record(1, idem=b"k"), "INVALID_ARGUMENT", "encoded.records[1].idempotency_key"),
        (record(1, b"x" * 1025), "MESSAGE_TOO_LARGE", "encoded.records[1].value"),
        # key and headers count towards the queue's max_message_bytes, as for messages
        (record(1, b"x" * 1000, key=b"k" * 25), "MESSAGE_TOO_LARGE", "encoded.records[1].value"),
        (
            record(1, b"x" * 1000, headers=[(b"n", b"v" * 24)]),
            "MESSAGE_TOO_LARGE",
            "encoded.records[1].value",
        ),
        (
            record(1, key=b"k" * (limits.MESSAGE_KEY_BYTES_MAX + 1)),
            "MESSAGE_TOO_LARGE",
            "encoded.records[1].key",
        ),
        (record(1, headers=[(b"", b"v")]), "INVALID_ARGUMENT", "encoded.records[1].headers"),
        (record(1, headers=[(b"\xff", b"v")]), "INVALID_ARGUMENT", "encoded.records[1].headers"),
        (record(1, headers=[(b"n" * 257, b"")]), "INVALID_ARGUMENT", "encoded.records[1].headers"),
        (
            record(1, headers=[(b"fluxmq-deliver-at", b"1")]),
            "INVALID_ARGUMENT",
            "encoded.records[1].headers[fluxmq-deliver-at]",
        ),
        (
            record(1, headers=[(b"b", b""), (b"a", b"")]),
            "INVALID_ARGUMENT",
            "encoded.records[1].headers",
        ),
        (
            record(1, headers=[(b"a", b""), (b"a", b"")]),
            "INVALID_ARGUMENT",
            "encoded.records[1].headers",
        ),
        (
            record(1, headers=[(b"h%d" % i, b"") for i in range(limits.MESSAGE_HEADERS_MAX + 1)]),
            "INVALID_ARGUMENT",
            "encoded.records[1].headers",
        ),
    ],
)
def test_a_bad_second_record_is_refused_naming_it_and_its_field(
    bad: bytes, reason: str, field: str
) -> None:
    err = refused(record(0) + bad, 2)
    assert (err.reason, field_of(err)) == (reason, field)


def test_records_that_end_early_or_leave_bytes_over_are_refused() -> None:
    two = record(0) + record(1, b"value")
    assert field_of(refused(two[:-1], 2)) == "encoded.records[1]"  # the value is cut
    assert field_of(refused(two[:25], 2)) == "encoded.records[1]"  # the head is cut
    assert field_of(refused(two, 1)) == "encoded.records"  # a record past the count
    assert field_of(refused(two, 3)) == "encoded.records[2]"  # fewer records than the count
    with_header = record(0, headers=[(b"name", b"value")])
    assert field_of(refused(with_header[:-2], 1)) == "encoded.records[0]"
    assert field_of(refused(with_header[:-9], 1)) == "encoded.records[0]"


def test_a_record_at_exactly_the_limits_is_accepted() -> None:
    at_limit = record(0, b"x" * 1000, key=b"k" * 20, headers=[(b"n", b"v" * 3)])
    assert check_encoded("orders", POLICY, encoded(at_limit, 1)) == 1024
