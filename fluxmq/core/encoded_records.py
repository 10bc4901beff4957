"""Checking records a client encoded itself (``PublishRequest.encoded``), without decoding them.

A client that encodes one partition's records as the records section of a batch
(proto/fluxmq/v1/RECORD_BATCH.md) spares the broker its hottest loop: reading each message's
fields, checking them and encoding them again. The broker still checks every record against the
queue's limits, but only by walking its lengths: one ``struct`` unpack per record (and a few per
header), no objects per record. The section is then stored as it came; replicas only stamp and
checksum it, as they do for the sections the broker encodes.

What a section must be, beyond the layout: record ``i`` has ``offset_delta == i`` and
``timestamp_delta == 0`` (the leader stamps the time), no idempotency key (a session's
sequence, or nothing, makes resends safe; keyed messages go as ``messages``), header names
UTF-8, 1..256 characters, not starting with ``fluxmq-``, in ascending byte order and each once
(the order the broker stores a message's headers in), and exactly ``count`` records filling it.

Example: one record with value b"hi" and no key, headers or idempotency key is the 22 bytes
``00000000 00000000 ffffffff 00000002 0000 ffff 6869``; ``check_encoded`` answers 2 (its
payload bytes) for it with ``count=1``.
"""

from __future__ import annotations

from fluxmq._pb.v1 import queue_pb2 as pb
from fluxmq.core import limits
from fluxmq.core.errors import FluxError, invalid_argument, message_too_large
from fluxmq.core.errors import partition_out_of_range as _partition_out_of_range
from fluxmq.core.queue_config import QueuePolicy
from storage.record_batch import (
    NO_IDEMPOTENCY_KEY_LENGTH,
    NO_KEY_LENGTH,
    RECORD_HEAD,
    RECORD_HEADER_HEAD,
)

RESERVED_HEADER_PREFIX = "fluxmq-"  # header names of the broker's own (fluxmq-deliver-at)
_RESERVED = RESERVED_HEADER_PREFIX.encode()
FIELD = "encoded"

_unpack_head = RECORD_HEAD.unpack_from
_unpack_header = RECORD_HEADER_HEAD.unpack_from
_HEAD_SIZE = RECORD_HEAD.size
_HEADER_HEAD_SIZE = RECORD_HEADER_HEAD.size


def check_encoded(queue: str, policy: QueuePolicy, encoded: pb.EncodedRecords) -> int:
    """Check ``encoded`` against the queue's limits; -> its payload bytes (keys, values,
    header names and values), as the message path counts them. Every refusal names the record
    and its field (``encoded.records[3].value``)."""
    count = encoded.count
    if not 1 <= count <= limits.PUBLISH_MESSAGES_MAX:
        raise invalid_argument(
            f"{FIELD}.count", f"1..{limits.PUBLISH_MESSAGES_MAX} records; got {count}"
        )
    if encoded.partition >= policy.partitions:
        raise _partition_out_of_range(
            queue, encoded.partition, policy.partitions, f"{FIELD}.partition"
        )
    section = encoded.records
    end = len(section)
    limit = policy.max_message_bytes
    at = 0
    total = 0
    for i in range(count):
        if at + _HEAD_SIZE > end:
            raise _short(i, end)
        offset_delta, timestamp_delta, key_len, value_len, header_count, idem_len = _unpack_head(
            section, at
        )
        if offset_delta != i:
            raise invalid_argument(
                f"{FIELD}.records[{i}].offset_delta", f"is {offset_delta}; record i has i"
            )
        if timestamp_delta:
            raise invalid_argument(
                f"{FIELD}.records[{i}].timestamp_delta", "must be 0: the leader stamps the time"
            )
        if idem_len != NO_IDEMPOTENCY_KEY_LENGTH:
            raise invalid_argument(
                f"{FIELD}.records[{i}].idempotency_key",
                "encoded records carry no idempotency keys; send messages with keys as messages",
            )
        at += _HEAD_SIZE
        size = value_len
        if key_len != NO_KEY_LENGTH:
            if key_len > limits.MESSAGE_KEY_BYTES_MAX:
                raise message_too_large(
                    f"{FIELD}.records[{i}].key", key_len, limits.MESSAGE_KEY_BYTES_MAX
                )
            size += key_len
            at += key_len
        at += value_len
        if header_count:
            at, header_bytes = _check_headers(section, at, end, i, header_count)
            size += header_bytes
        if at > end:
            raise _short(i, end)
        if size > limit:
            raise message_too_large(f"{FIELD}.records[{i}].value", size, limit)
        total += size
    if at != end:
        raise invalid_argument(
            f"{FIELD}.records",
            f"{end - at} bytes follow record {count - 1}; count says {count} records",
        )
    return total


def _check_headers(section: bytes, at: int, end: int, i: int, header_count: int) -> tuple[int, int]:
    field = f"{FIELD}.records[{i}].headers"
    if header_count > limits.MESSAGE_HEADERS_MAX:
        raise invalid_argument(field, f"at most {limits.MESSAGE_HEADERS_MAX} headers")
    previous = b""
    size = 0
    for _ in range(header_count):
        if at + _HEADER_HEAD_SIZE > end:
            raise _short(i, end)
        name_len, value_len = _unpack_header(section, at)
        at += _HEADER_HEAD_SIZE
        name = section[at : at + name_len]
        at += name_len + value_len
        if at > end:
            raise _short(i, end)
        try:
            text = name.decode()
        except UnicodeDecodeError:
            raise invalid_argument(field, "header names are UTF-8") from None
        if not text or len(text) > limits.HEADER_NAME_CHARS_MAX:
            raise invalid_argument(field, "header names are 1..256 characters")
        if name.startswith(_RESERVED):
            raise invalid_argument(
                f"{field}[{text}]",
                f"header names starting with {RESERVED_HEADER_PREFIX!r} are reserved",
            )
        if name <= previous:
            raise invalid_argument(field, "header names in ascending byte order, each once")
        previous = name
        size += name_len + value_len
    return at, size


def _short(i: int, end: int) -> FluxError:
    return invalid_argument(
        f"{FIELD}.records[{i}]", f"runs past the end of the records ({end} bytes)"
    )
