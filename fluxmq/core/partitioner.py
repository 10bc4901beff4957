"""Turning a Publish request into an Append command (pure): validation, partition choice and
record encoding in one pass over the messages, because this is the broker's hottest loop.

Partition rules, in order: an explicit ``partition``; else the key's stable hash,
``crc32c(key) % partitions`` (crc32c/Castagnoli, initial value 0 — the same function every
client can compute); else round-robin over keyless messages, continuing from ``cursor``.

Example: 3 partitions, cursor 7, messages [key=b"a", no key, partition=2, no key]:
crc32c(b"a") = 3251651376 -> 3251651376 % 3 = 0; then 7 % 3 = 1; then 2; then 8 % 3 = 2.
Partitions [0, 1, 2, 2], new cursor 9.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import crc32c

from fluxmq._pb.internal import commands_pb2 as cpb
from fluxmq._pb.v1 import queue_pb2 as pb
from fluxmq.core import limits
from fluxmq.core.encoded_records import RESERVED_HEADER_PREFIX, check_encoded
from fluxmq.core.errors import invalid_argument, message_too_large, partition_out_of_range
from fluxmq.core.queue_config import QueuePolicy
from storage.codec import prepare
from storage.record_batch import RecordFields, prepare_records


def key_partition(key: bytes, partitions: int) -> int:
    return int(crc32c.crc32c(key)) % partitions


@dataclass(frozen=True, slots=True)
class PreparedAppend:
    command: cpb.AppendCmd
    cursor: int  # the round-robin cursor after this request
    payload_bytes: int  # key + value + header bytes, for metrics


DELIVER_AT_HEADER = "fluxmq-deliver-at"  # decimal ms: the message is invisible to groups until


def _deliver_at(msg: pb.PublishMessage, i: int, now_ms: int) -> bytes:
    if msg.deliver_at_ms and msg.delay_ms:
        raise invalid_argument(f"messages[{i}].delay_ms", "set deliver_at_ms or delay_ms, not both")
    if msg.delay_ms:
        if msg.delay_ms > limits.DELAY_MS_MAX:
            raise invalid_argument(f"messages[{i}].delay_ms", "at most 7 days")
        at = now_ms + msg.delay_ms
    else:
        if msg.deliver_at_ms > now_ms + limits.DELAY_MS_MAX:
            raise invalid_argument(f"messages[{i}].deliver_at_ms", "at most 7 days ahead")
        at = msg.deliver_at_ms
    return str(at).encode()


def _message_fields(
    msg: pb.PublishMessage, i: int, now_ms: int, limit: int
) -> tuple[RecordFields, int]:
    """One message's record fields, checked against the queue's limits; -> (fields, the bytes
    that count against max_message_bytes: key + value + headers)."""
    value = msg.value
    size = len(value)
    key: bytes | None = None
    if msg.HasField("key"):
        key = msg.key
        if len(key) > limits.MESSAGE_KEY_BYTES_MAX:
            raise message_too_large(f"messages[{i}].key", len(key), limits.MESSAGE_KEY_BYTES_MAX)
        size += len(key)
    headers: tuple[tuple[str, bytes], ...] = ()
    if msg.headers:
        if len(msg.headers) > limits.MESSAGE_HEADERS_MAX:
            raise invalid_argument(
                f"messages[{i}].headers", f"at most {limits.MESSAGE_HEADERS_MAX} headers"
            )
        headers = tuple(sorted(msg.headers.items()))
        for name, header_value in headers:
            if not name or len(name) > limits.HEADER_NAME_CHARS_MAX:
                raise invalid_argument(
                    f"messages[{i}].headers", "header names are 1..256 characters"
                )
            if name.startswith(RESERVED_HEADER_PREFIX):
                raise invalid_argument(
                    f"messages[{i}].headers[{name}]",
                    f"header names starting with {RESERVED_HEADER_PREFIX!r} are reserved",
                )
            size += len(name) + len(header_value)
    if msg.deliver_at_ms or msg.delay_ms:
        headers = tuple(sorted((*headers, (DELIVER_AT_HEADER, _deliver_at(msg, i, now_ms)))))
    if size > limit:
        raise message_too_large(f"messages[{i}].value", size, limit)
    idem = msg.idempotency_key
    if idem and len(idem.encode()) > limits.IDEMPOTENCY_KEY_BYTES_MAX:
        raise invalid_argument(f"messages[{i}].idempotency_key", "at most 256 bytes")
    return (value, key, headers, idem or None), size


def prepare_append(
    queue: str,
    queue_id: int,
    policy: QueuePolicy,
    messages: Sequence[pb.PublishMessage],
    cursor: int,
    now_ms: int,
    producer: pb.ProducerSession | None = None,
) -> PreparedAppend:
    """Validate ``messages`` against the queue's limits and build the Append command.

    Every refusal names the offending field (``messages[3].value``); nothing is proposed for a
    refused request. With a ``producer`` session every message names the same partition and
    none has an idempotency key (the session's sequence is what makes a retry safe).
    """
    count = len(messages)
    if count == 0:
        raise invalid_argument("messages", "a publish carries 1..1000 messages; got none")
    if count > limits.PUBLISH_MESSAGES_MAX:
        raise invalid_argument(
            "messages", f"a publish carries 1..{limits.PUBLISH_MESSAGES_MAX} messages; got {count}"
        )
    npart = policy.partitions
    fields: list[RecordFields] = []
    partitions: list[int] = []
    idempotency_keys: list[str] = []
    total = 0
    for i, msg in enumerate(messages):
        record, size = _message_fields(msg, i, now_ms, policy.max_message_bytes)
        key = record[1]
        if msg.HasField("partition"):
            if msg.partition >= npart:
                raise partition_out_of_range(
                    queue, msg.partition, npart, f"messages[{i}].partition"
                )
            partitions.append(msg.partition)
        elif key is not None:
            partitions.append(int(crc32c.crc32c(key)) % npart)
        else:
            partitions.append(cursor % npart)
            cursor += 1
        fields.append(record)
        idempotency_keys.append(msg.idempotency_key)
        total += size
    any_idempotency_key = any(idempotency_keys)
    command = cpb.AppendCmd(queue=queue, queue_id=queue_id, now_ms=now_ms, partitions=partitions)
    if any_idempotency_key:
        # A duplicate is left out of what is stored, which only apply knows: one record each.
        command.records.extend(prepare(*f) for f in fields)
        command.idempotency_keys.extend(idempotency_keys)
    else:
        _add_batches(command, fields, partitions)
    if producer is not None:
        _check_session(messages, producer)
        command.producer_id = producer.producer_id
        command.producer_epoch = producer.producer_epoch
        command.first_sequence = producer.first_sequence
    return PreparedAppend(command, cursor, total)


def prepare_encoded_append(
    queue: str,
    queue_id: int,
    policy: QueuePolicy,
    encoded: pb.EncodedRecords,
    cursor: int,
    now_ms: int,
    producer: pb.ProducerSession | None = None,
) -> PreparedAppend:
    """The Append command of records the client encoded (``PublishRequest.encoded``): checked
    record by record (fluxmq/core/encoded_records.py), stored as they came; the partition is
    the one the request names (no partitioning here)."""
    total = check_encoded(queue, policy, encoded)
    command = cpb.AppendCmd(
        queue=queue,
        queue_id=queue_id,
        now_ms=now_ms,
        partitions=[encoded.partition] * encoded.count,
    )
    command.batches.add(partition=encoded.partition, count=encoded.count, records=encoded.records)
    if producer is not None:
        if producer.producer_id == 0:
            raise invalid_argument("producer.producer_id", "set it to the id InitProducer gave")
        command.producer_id = producer.producer_id
        command.producer_epoch = producer.producer_epoch
        command.first_sequence = producer.first_sequence
    return PreparedAppend(command, cursor, total)


def _add_batches(
    command: cpb.AppendCmd, fields: Sequence[RecordFields], partitions: Sequence[int]
) -> None:
    """One records section per partition, its records in request order (DESIGN: the broker
    encodes a request's records once; replicas only stamp and checksum each batch)."""
    first = partitions[0]
    if all(p == first for p in partitions):
        command.batches.add(partition=first, count=len(fields), records=prepare_records(fields))
        return
    by_partition: dict[int, list[RecordFields]] = {}
    for f, p in zip(fields, partitions, strict=True):
        by_partition.setdefault(p, []).append(f)
    for p, group in by_partition.items():
        command.batches.add(partition=p, count=len(group), records=prepare_records(group))


def _check_session(messages: Sequence[pb.PublishMessage], producer: pb.ProducerSession) -> None:
    if producer.producer_id == 0:
        raise invalid_argument("producer.producer_id", "set it to the id InitProducer gave")
    first = messages[0]
    if not first.HasField("partition"):
        raise invalid_argument(
            "messages[0].partition",
            "a producer session's messages name their partition (one partition per request)",
        )
    partition = first.partition
    for i, msg in enumerate(messages):
        if not msg.HasField("partition") or msg.partition != partition:
            raise invalid_argument(
                f"messages[{i}].partition",
                f"a producer session's request is for one partition; messages[0] is for "
                f"partition {partition}",
            )
        if msg.idempotency_key:
            raise invalid_argument(
                f"messages[{i}].idempotency_key",
                "a producer session deduplicates by sequence; send messages with their own "
                "idempotency keys without a session",
            )
