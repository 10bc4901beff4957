"""Decoding the record batches a Fetch answers with (``FetchRequest.record_batches``), and
encoding the records section a Publish can carry instead of messages (``PublishRequest.encoded``).

The broker hands batches on as it stores them, without opening them; the client checks each
batch's crc32c and decodes its records. The format is the broker's storage format 2,
described byte by byte in ``proto/fluxmq/v1/RECORD_BATCH.md``; the SDK carries its own decoder
(it imports nothing of the broker) and ``proto/fluxmq/v1/record_batch_vector.json`` proves it
reads what the broker writes.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Sequence
from itertools import chain, repeat

from crc32c import crc32c
from google.protobuf.internal.containers import RepeatedCompositeFieldContainer

from fluxmq._pb.v1 import queue_pb2 as pb

FORMAT = 2
_SALT = struct.Struct(">QQ")  # log_id, base offset: salt the crc, not stored in the batch
_HEAD = struct.Struct(">IBHIqqQIQI")
_RECORD = struct.Struct(">IIIIHH")
_HEADER = struct.Struct(">HI")
_NO_KEY = 0xFFFFFFFF
_NO_IDEMPOTENCY_KEY = 0xFFFF
_COMPRESSION_MASK = 0x0007


_pack_record = _RECORD.pack
_pack_header = _HEADER.pack


NO_KEY_LENGTH = _NO_KEY
NO_IDEMPOTENCY_KEY_LENGTH = _NO_IDEMPOTENCY_KEY


def encode_records(messages: Iterable[pb.PublishMessage], first_index: int = 0) -> bytes:
    """The records section of ``messages`` (value, key, headers; nothing else of them), for
    ``PublishRequest.encoded``: record i has offset_delta i (counted from ``first_index``, for
    records that join others) and timestamp_delta 0, headers go by name in ascending byte
    order, no idempotency key. The broker checks the limits."""
    parts: list[bytes] = []
    append = parts.append
    for index, m in enumerate(messages, first_index):
        value = m.value
        key = m.key if m.HasField("key") else None
        named = sorted((name.encode(), v) for name, v in m.headers.items()) if m.headers else ()
        append(
            _pack_record(
                index, 0, _NO_KEY if key is None else len(key), len(value), len(named),
                _NO_IDEMPOTENCY_KEY,
            )
        )  # fmt: skip
        if key:
            append(key)
        append(value)
        for name, v in named:
            append(_pack_header(len(name), len(v)))
            append(name)
            append(v)
    return b"".join(parts)


def encode_values(values: Sequence[bytes], first_index: int = 0) -> list[bytes]:
    """The parts of the records section of ``values`` alone (no key, headers or idempotency
    key; timestamp_delta 0), record i with offset_delta ``first_index`` + i: a head and the
    value by turns, for a ``b"".join`` with other records' parts (no value is copied before
    that join). Same bytes as ``encode_records`` of messages with only these values.

    >>> b"".join(encode_values([b"ab"], 3)).hex()
    '0000000300000000ffffffff000000020000ffff6162'
    """
    heads = map(
        _pack_record, range(first_index, first_index + len(values)), repeat(0), repeat(_NO_KEY),
        map(len, values), repeat(0), repeat(_NO_IDEMPOTENCY_KEY),
    )  # fmt: skip
    return list(chain.from_iterable(zip(heads, values, strict=True)))


class CorruptBatchError(ValueError):
    """A batch failed its checksum or does not decode: nothing of it is returned."""

    def __init__(self, base_offset: int, detail: str) -> None:
        super().__init__(f"record batch at offset {base_offset}: {detail}")
        self.base_offset = base_offset


def records_of(
    batches: Iterable[pb.RecordBatch],
    log_id: int,
    partition: int,
    start_offset: int,
    max_messages: int | None = None,
) -> list[pb.Record]:
    """The records of ``batches`` from ``start_offset`` on (at most ``max_messages``), each
    batch checked first. Raises CorruptBatchError."""
    response = pb.FetchResponse()
    add_records(response.records, batches, log_id, partition, start_offset, max_messages)
    return list(response.records)


def add_records(
    into: RepeatedCompositeFieldContainer[pb.Record],
    batches: Iterable[pb.RecordBatch],
    log_id: int,
    partition: int,
    start_offset: int,
    max_messages: int | None = None,
) -> int:
    """Adds the records of ``batches`` from ``start_offset`` on (at most ``max_messages``) to
    ``into`` (a message's repeated field: made in place, not copied in); returns how many.
    Every batch visited is checked whole (crc32c, then each record); one that fails leaves
    none of its records in ``into``. Raises CorruptBatchError."""
    room = len(into) + max_messages if max_messages is not None else _NO_LIMIT
    added = 0
    for batch in batches:
        if len(into) >= room:
            break
        added += _add_batch(
            into, log_id, batch.base_offset, batch.data, partition, start_offset, room
        )
    return added


def decode(
    log_id: int, base_offset: int, data: bytes, partition: int, start_offset: int = 0
) -> list[pb.Record]:
    """The records of one batch at or above ``start_offset``; the whole batch is checked."""
    response = pb.FetchResponse()
    _add_batch(response.records, log_id, base_offset, data, partition, start_offset, _NO_LIMIT)
    return list(response.records)


_NO_LIMIT = 1 << 62


def _add_batch(
    into: RepeatedCompositeFieldContainer[pb.Record],
    log_id: int,
    base_offset: int,
    data: bytes,
    partition: int,
    start_offset: int,
    room: int,
) -> int:
    """Checks one batch's header and crc32c, then walks and checks each record, adding those at
    or above ``start_offset`` to ``into`` while it holds fewer than ``room``; -> how many it
    added (none when a record fails its check)."""
    size = len(data)
    if size < _HEAD.size:
        raise CorruptBatchError(base_offset, f"{size} bytes, shorter than a batch header")
    crc, fmt, attributes, count, first_ms, last_ms, _pid, _epoch, _seq, section = _HEAD.unpack_from(
        data
    )
    if crc32c(memoryview(data)[4:], crc32c(_SALT.pack(log_id, base_offset))) != crc:
        raise CorruptBatchError(base_offset, "crc32c mismatch")
    if fmt != FORMAT:
        raise CorruptBatchError(base_offset, f"unknown format {fmt}")
    if attributes & _COMPRESSION_MASK:
        raise CorruptBatchError(base_offset, f"unknown compression {attributes & 7}")
    if count < 1 or _HEAD.size + section != size or last_ms < first_ms:
        raise CorruptBatchError(base_offset, "header does not fit the batch")
    before = len(into)
    try:
        _add_records(into, data, base_offset, count, first_ms, partition, start_offset, room)
    except CorruptBatchError:
        del into[before:]  # a corrupt batch adds nothing
        raise
    return len(into) - before


def _add_records(
    into: RepeatedCompositeFieldContainer[pb.Record],
    data: bytes,
    base_offset: int,
    count: int,
    first_ms: int,
    partition: int,
    start_offset: int,
    room: int,
) -> None:
    """Walks the ``count`` records of a batch whose header was checked, adding those from
    ``start_offset`` on while ``into`` holds fewer than ``room``; every record is checked."""
    size = len(data)
    unpack = _RECORD.unpack_from
    record_size = _RECORD.size
    add = into.add
    room_left = room - len(into)
    first_kept = start_offset - base_offset
    at = _HEAD.size
    for index in range(count):
        if at + record_size > size:
            raise CorruptBatchError(base_offset, f"record {index} runs past the end")
        delta, ts_delta, key_len, value_len, header_count, idem_len = unpack(data, at)
        if delta != index:
            raise CorruptBatchError(base_offset, f"record {index} has offset delta {delta}")
        at += record_size
        if key_len == _NO_KEY and not header_count and idem_len == _NO_IDEMPOTENCY_KEY:
            # A value alone (the common record): one step, one message made.
            end = at + value_len
            if end > size:
                raise CorruptBatchError(base_offset, f"record {index} runs past the end")
            if index >= first_kept and room_left > 0:
                room_left -= 1
                add(
                    partition=partition, offset=base_offset + index,
                    timestamp_ms=first_ms + ts_delta, value=data[at:end],
                )  # fmt: skip
            at = end
            continue
        key: bytes | None = None
        if key_len != _NO_KEY:
            key = data[at : at + key_len]
            at += key_len
        value = data[at : at + value_len]
        at += value_len
        headers: dict[str, bytes] = {}
        for _ in range(header_count):
            if at + _HEADER.size > size:
                raise CorruptBatchError(
                    base_offset, f"a header of record {index} runs past the end"
                )
            name_len, hv_len = _HEADER.unpack_from(data, at)
            at += _HEADER.size
            name = _text(data[at : at + name_len], base_offset)
            at += name_len
            headers[name] = data[at : at + hv_len]
            at += hv_len
        idem = ""
        if idem_len != _NO_IDEMPOTENCY_KEY:
            idem = _text(data[at : at + idem_len], base_offset)
            at += idem_len
        if at > size:
            raise CorruptBatchError(base_offset, f"record {index} runs past the end")
        if index < first_kept or room_left <= 0:
            continue
        room_left -= 1
        record = add(
            partition=partition, offset=base_offset + index, timestamp_ms=first_ms + ts_delta,
            value=value,
        )  # fmt: skip
        if key is not None:
            record.key = key
        if headers:
            record.headers.update(headers)
        if idem:
            record.idempotency_key = idem
    if at != size:
        raise CorruptBatchError(base_offset, f"records end at {at}, the batch at {size}")


def _text(raw: bytes, base_offset: int) -> str:
    try:
        return raw.decode()
    except UnicodeDecodeError:
        raise CorruptBatchError(base_offset, "a text field is not utf-8") from None
