"""The shared record-batch test vector (proto/fluxmq/v1/record_batch_vector.json): the broker
encodes exactly those bytes, and the broker's and the SDK's decoders read the same records."""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

import pytest

from fluxmq._pb.v1 import queue_pb2 as pb
from fluxmq.client import record_batches as sdk
from storage import NewRecord
from storage import record_batch as broker

VECTOR = Path(__file__).parents[2] / "proto" / "fluxmq" / "v1" / "record_batch_vector.json"
CASES: list[dict[str, Any]] = json.loads(VECTOR.read_text())["cases"]


def new_records(case: dict[str, Any]) -> list[NewRecord]:
    return [
        NewRecord(
            timestamp_ms=r["timestamp_ms"],
            value=bytes.fromhex(r["value_hex"]),
            key=None if r["key_hex"] is None else bytes.fromhex(r["key_hex"]),
            headers=tuple((n, bytes.fromhex(v)) for n, v in r["headers"]),
            idempotency_key=r["idempotency_key"],
        )
        for r in case["records"]
    ]


@pytest.mark.parametrize("case", CASES, ids=[c["name"] for c in CASES])
def test_broker_encodes_the_vector_bytes(case: dict[str, Any]) -> None:
    data = broker.encode(
        case["log_id"], case["base_offset"], new_records(case), case["producer_id"],
        case["producer_epoch"], case["first_sequence"],
    )  # fmt: skip
    assert data.hex() == case["batch_hex"]


@pytest.mark.parametrize("case", CASES, ids=[c["name"] for c in CASES])
def test_broker_and_sdk_decode_the_same_records(case: dict[str, Any]) -> None:
    data = bytes.fromhex(case["batch_hex"])
    expected = new_records(case)
    stored = broker.decode(case["log_id"], case["base_offset"], data)
    client = sdk.decode(case["log_id"], case["base_offset"], data, partition=3)
    assert len(stored) == len(client) == len(expected)
    for want, s, c, r in zip(expected, stored, client, case["records"], strict=True):
        assert s.offset == c.offset == r["offset"]
        assert s.timestamp_ms == c.timestamp_ms == want.timestamp_ms
        assert s.value == c.value == want.value
        assert s.key == want.key and (c.key if c.HasField("key") else None) == want.key
        assert dict(s.headers) == dict(c.headers) == dict(want.headers)
        assert s.idempotency_key == want.idempotency_key
        assert (c.idempotency_key or None) == want.idempotency_key
        assert c.partition == 3


@pytest.mark.parametrize("case", CASES, ids=[c["name"] for c in CASES])
def test_sdk_refuses_every_flipped_byte(case: dict[str, Any]) -> None:
    data = bytes.fromhex(case["batch_hex"])
    for at in range(len(data)):
        damaged = bytearray(data)
        damaged[at] ^= 0x20
        with pytest.raises(sdk.CorruptBatchError):
            sdk.decode(case["log_id"], case["base_offset"], bytes(damaged), 0)


def test_sdk_refuses_a_batch_read_at_another_offset_or_log() -> None:
    case = CASES[2]
    data = bytes.fromhex(case["batch_hex"])
    with pytest.raises(sdk.CorruptBatchError):
        sdk.decode(case["log_id"], case["base_offset"] + 1, data, 0)
    with pytest.raises(sdk.CorruptBatchError):
        sdk.decode(case["log_id"] + 1, case["base_offset"], data, 0)


def test_sdk_skips_records_below_the_start_and_stops_at_max_messages() -> None:
    case = CASES[2]
    batch = pb.RecordBatch(base_offset=case["base_offset"], data=bytes.fromhex(case["batch_hex"]))
    base = case["base_offset"]
    got = sdk.records_of([batch, batch], case["log_id"], 0, base + 1, max_messages=None)
    assert [r.offset for r in got][:2] == [base + 1, base + 2]
    one = sdk.records_of([batch], case["log_id"], 0, base, max_messages=1)
    assert [r.offset for r in one] == [base]


def _batch_of(base_offset: int, section: bytes, count: int) -> pb.RecordBatch:
    return pb.RecordBatch(
        base_offset=base_offset, data=broker.seal(7, base_offset, 1_700_000_000_000, count, section)
    )


def test_records_are_added_in_place_from_the_start_up_to_max_messages() -> None:
    values = [f"v{i}".encode() for i in range(5)]
    first = _batch_of(10, sdk.encode_records(pb.PublishMessage(value=v) for v in values), 5)
    second = _batch_of(15, sdk.encode_records(pb.PublishMessage(value=v) for v in values), 5)
    answer = pb.FetchResponse()
    assert sdk.add_records(answer.records, [first, second], 7, 2, 12, max_messages=6) == 6
    assert [(r.offset, r.value, r.partition) for r in answer.records] == [
        (12, b"v2", 2), (13, b"v3", 2), (14, b"v4", 2), (15, b"v0", 2), (16, b"v1", 2),
        (17, b"v2", 2),
    ]  # fmt: skip
    assert sdk.add_records(answer.records, [second], 7, 2, 18) == 2
    assert [r.offset for r in answer.records][-2:] == [18, 19]


def test_a_batch_that_breaks_midway_adds_none_of_its_records() -> None:
    """A batch whose checksum holds but whose fifth record does not decode (a broker's bug,
    not the disk's): its first four records, already made, are taken back out."""
    good = _batch_of(0, sdk.encode_records([pb.PublishMessage(value=b"a")]), 1)
    section = bytearray(sdk.encode_records(pb.PublishMessage(value=b"b") for _ in range(5)))
    last = len(section) - (len(b"b") + struct.calcsize(">IIIIHH"))
    section[last : last + 4] = struct.pack(">I", 9)  # record 4's offset delta says 9
    broken = _batch_of(1, bytes(section), 5)
    answer = pb.FetchResponse()
    with pytest.raises(sdk.CorruptBatchError, match="record 4 has offset delta 9"):
        sdk.add_records(answer.records, [good, broken], 7, 0, 0)
    assert [r.value for r in answer.records] == [b"a"]


@pytest.mark.parametrize("first_index", [0, 7])
def test_values_alone_encode_to_the_same_records_as_messages_with_only_values(
    first_index: int,
) -> None:
    values = [bytes([i]) * (i * 37 % 300) for i in range(200)]
    parts = sdk.encode_values(values, first_index)
    messages = [pb.PublishMessage(value=v) for v in values]
    assert b"".join(parts) == sdk.encode_records(messages, first_index)
    assert sdk.encode_values([], first_index) == []
