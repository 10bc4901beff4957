"""Record format 1 (one row per record), and the argument checks both stores share.

Partitions store record batches now (``storage.record_batch``, format 2). Format 1 stays for
what still carries it: log entries written before batches and requests with idempotency keys
hold records ``prepare``d in it, and ``storage.migrate`` reads format-1 stores.

Layout of format 1 (all integers big-endian)::

    crc32c          u32   over position + every byte after this field
    format          u8    1
    timestamp_ms    i64
    key length      u32   0xFFFFFFFF = no key (distinct from an empty key)
    value length    u32
    header count    u16
    idem key length u16   0xFFFF = no idempotency key
    key | value
    per header: name length u16, value length u32, name (utf-8), value
    idempotency key (utf-8)

The *position* is the record's (log_id, offset) as 16 bytes, big-endian. It is not stored in the
record (the LMDB key already holds it), but the crc covers it, so a record that is intact yet
sits at the wrong place fails its check like any flipped byte would. The position doubles as the
LMDB key, which is why the stores hand it over ready-made instead of packing it twice.
"""

from __future__ import annotations

import struct

from crc32c import crc32c

from storage.records import (
    IDEMPOTENCY_KEY_BYTES_MAX,
    LOG_ID_MAX,
    OFFSET_MAX,
    RECORD_HEADERS_MAX,
    RECORD_KEY_BYTES_MAX,
    RECORD_VALUE_BYTES_MAX,
    CorruptRecordError,
    Headers,
    NewRecord,
    Record,
    decode_headers,
    decode_text,
    encode_headers,
    encode_text,
    make_record,
)

FORMAT_V1 = 1

# Limits of the key/value table. LMDB refuses keys longer than its compiled-in maximum (511 with
# the default build; LmdbStore checks it at open) and empty keys, so the memory twin refuses the
# same ones. Values get the record value bound: the table holds bookkeeping, never payloads.
KV_KEY_BYTES_MAX = 511
KV_VALUE_BYTES_MAX = RECORD_VALUE_BYTES_MAX

_NO_KEY = 0xFFFFFFFF
_NO_IDEMPOTENCY_KEY = 0xFFFF

_POSITION = struct.Struct(">QQ")
_CRC = struct.Struct(">I")
_FIELDS = struct.Struct(">BqIIHH")  # everything of the fixed head after the crc
_HEAD = struct.Struct(">IBqIIHH")  # the fixed head as read back, crc included
_HEAD_SIZE = _HEAD.size
_TIMESTAMP_AT = _CRC.size + 1

_pack_position = _POSITION.pack
_pack_crc = _CRC.pack
_pack_fields = _FIELDS.pack
_unpack_head = _HEAD.unpack_from
_unpack_crc = _CRC.unpack_from
_unpack_timestamp = struct.Struct(">q").unpack_from


def position(log_id: int, offset: int) -> bytes:
    """The 16-byte position of a record: the crc's salt and the LMDB key."""
    try:
        return _pack_position(log_id, offset)
    except struct.error:
        raise ValueError(f"position ({log_id}, {offset}) is not a pair of u64") from None


def encode(log_id: int, offset: int, record: NewRecord) -> bytes:
    """Encode ``record`` for storage at (``log_id``, ``offset``); ValueError past any limit."""
    pos = position(log_id, offset)
    body = _encode_body(
        record.timestamp_ms, record.value, record.key, record.headers, record.idempotency_key
    )
    return _pack_crc(crc32c(body, crc32c(pos))) + body


def _encode_body(
    timestamp_ms: int,
    value: bytes,
    key: bytes | None,
    headers: Headers,
    idempotency_key: str | None,
) -> bytes:
    """Everything of a record after its crc field."""
    value_len = len(value)
    if value_len > RECORD_VALUE_BYTES_MAX:
        raise ValueError(f"record value of {value_len} bytes exceeds {RECORD_VALUE_BYTES_MAX}")
    if key is None:
        key_len = _NO_KEY
        key = b""
    else:
        key_len = len(key)
        if key_len > RECORD_KEY_BYTES_MAX:
            raise ValueError(f"record key of {key_len} bytes exceeds {RECORD_KEY_BYTES_MAX}")
    if idempotency_key is None:
        idem_len = _NO_IDEMPOTENCY_KEY
        idem = b""
    else:
        idem = encode_text(idempotency_key, "idempotency key")
        idem_len = len(idem)
        if idem_len > IDEMPOTENCY_KEY_BYTES_MAX:
            raise ValueError(
                f"idempotency key of {idem_len} bytes exceeds {IDEMPOTENCY_KEY_BYTES_MAX}"
            )
    header_count = len(headers)
    if header_count > RECORD_HEADERS_MAX:
        raise ValueError(f"{header_count} headers exceed {RECORD_HEADERS_MAX}")
    try:
        fields = _pack_fields(FORMAT_V1, timestamp_ms, key_len, value_len, header_count, idem_len)
    except struct.error as e:
        # Every length was bounded above, so only the timestamp can be out of range.
        raise ValueError(f"timestamp_ms {timestamp_ms!r} is not a signed 64-bit int") from e
    if headers:
        return b"".join([fields, key, value, *encode_headers(headers), idem])
    return b"".join([fields, key, value, idem])


_PREPARED_TIMESTAMP = struct.Struct(">q")
_PREPARED_HEAD = _FIELDS.size  # format, timestamp, four lengths
_unpack_fields = _FIELDS.unpack_from


def prepare(
    value: bytes,
    key: bytes | None = None,
    headers: Headers = (),
    idempotency_key: str | None = None,
) -> bytes:
    """A record encoded but for its position, timestamp and checksum (see
    ``PartitionLog.append_prepared``); ValueError past any limit, as ``encode``."""
    return _encode_body(0, value, key, headers, idempotency_key)


def seal_at(pos: bytes, timestamp_ms: int, prepared: bytes) -> bytes:
    """The stored form of a prepared record at ``pos``, stamped ``timestamp_ms``.

    Checks what can be checked without walking the headers: the format byte, and that the fixed
    lengths fit in the record. Anything subtler that is wrong fails the full check on read (a
    CorruptRecordError, never garbage), because the checksum made here covers the bytes as given.
    """
    size = len(prepared)
    if size < _PREPARED_HEAD or prepared[0] != FORMAT_V1:
        raise ValueError("not a prepared record (short, or unknown format)")
    _fmt, _ts, key_len, value_len, _hc, idem_len = _unpack_fields(prepared)
    body_len = (
        (0 if key_len == _NO_KEY else key_len)
        + value_len
        + (0 if idem_len == _NO_IDEMPOTENCY_KEY else idem_len)
    )
    if _PREPARED_HEAD + body_len > size:
        raise ValueError("prepared record is shorter than its lengths say")
    try:
        stamp = _PREPARED_TIMESTAMP.pack(timestamp_ms)
    except struct.error as e:
        raise ValueError(f"timestamp_ms {timestamp_ms!r} is not a signed 64-bit int") from e
    body = b"".join((prepared[:1], stamp, prepared[9:]))
    return _pack_crc(crc32c(body, crc32c(pos))) + body


def decode(log_id: int, offset: int, buf: bytes) -> Record:
    """Check and decode the record stored at (``log_id``, ``offset``).

    Raises ``CorruptRecordError`` when the crc does not match or any length is inconsistent.
    """
    return decode_at(position(log_id, offset), log_id, offset, buf)


def decode_at(pos: bytes, log_id: int, offset: int, buf: bytes) -> Record:
    """:func:`decode` for a caller that already holds the record's position bytes."""
    size = len(buf)
    if size < _HEAD_SIZE:
        raise CorruptRecordError(log_id, offset, f"{size} bytes, shorter than a record head")
    crc, fmt, timestamp_ms, key_len, value_len, header_count, idem_len = _unpack_head(buf)
    if crc32c(memoryview(buf)[4:], crc32c(pos)) != crc:
        raise CorruptRecordError(log_id, offset, "crc32c mismatch")
    # The crc matched, so from here on a failed check means an encoder bug or a format this code
    # does not know; either way the bytes are refused rather than guessed at.
    if fmt != FORMAT_V1:
        raise CorruptRecordError(log_id, offset, f"unknown record format {fmt}")
    at = _HEAD_SIZE
    if key_len == _NO_KEY:
        key = None
    elif key_len > RECORD_KEY_BYTES_MAX:
        raise CorruptRecordError(log_id, offset, f"key length {key_len} over the limit")
    else:
        key = buf[at : at + key_len]
        at += key_len
    value_end = at + value_len
    if value_end > size:
        raise CorruptRecordError(log_id, offset, f"value length {value_len} runs past the end")
    value = buf[at:value_end]
    at = value_end
    if header_count:
        headers, at = decode_headers(buf, at, header_count, log_id, offset)
    else:
        headers = ()
    if idem_len == _NO_IDEMPOTENCY_KEY:
        idempotency_key = None
    else:
        if idem_len > IDEMPOTENCY_KEY_BYTES_MAX:
            raise CorruptRecordError(
                log_id, offset, f"idempotency key length {idem_len} over the limit"
            )
        idempotency_key = decode_text(buf[at : at + idem_len], log_id, offset)
        at += idem_len
    if at != size:
        raise CorruptRecordError(log_id, offset, f"lengths add up to {at} bytes, record has {size}")
    return make_record(offset, timestamp_ms, value, key, headers, idempotency_key, size)


# Argument checks shared by both stores, so that they refuse exactly the same calls.


def check_log_id(log_id: int) -> None:
    if not 0 <= log_id <= LOG_ID_MAX:
        raise ValueError(f"log_id {log_id} is outside [0, {LOG_ID_MAX}]")


def check_offset(offset: int, what: str = "offset") -> None:
    if not 0 <= offset <= OFFSET_MAX:
        raise ValueError(f"{what} {offset} is outside [0, {OFFSET_MAX}]")


def check_read_limits(max_records: int, max_bytes: int) -> None:
    if max_records < 1:
        raise ValueError(f"max_records must be at least 1, got {max_records}")
    if max_bytes < 0:
        raise ValueError(f"max_bytes must not be negative, got {max_bytes}")


def check_chunk(max_records: int | None) -> None:
    if max_records is not None and max_records < 1:
        raise ValueError(f"max_records must be None or at least 1, got {max_records}")


def check_append_room(high: int, count: int) -> None:
    # high itself (the next offset) must stay a u64, not only the last appended offset.
    if high + count > OFFSET_MAX:
        raise ValueError(f"appending {count} records at offset {high} overflows u64 offsets")


def check_kv_key(key: bytes) -> None:
    if not isinstance(key, bytes):
        raise TypeError(f"key/value table keys are bytes, got {type(key).__name__}")
    if not 0 < len(key) <= KV_KEY_BYTES_MAX:
        raise ValueError(
            f"key/value table key of {len(key)} bytes is outside [1, {KV_KEY_BYTES_MAX}]"
        )


def check_kv_value(value: bytes) -> None:
    if not isinstance(value, bytes):
        raise TypeError(f"key/value table values are bytes, got {type(value).__name__}")
    if len(value) > KV_VALUE_BYTES_MAX:
        raise ValueError(
            f"key/value table value of {len(value)} bytes exceeds {KV_VALUE_BYTES_MAX}"
        )


def check_scan(prefix: bytes, start: bytes | None) -> None:
    if not isinstance(prefix, bytes):
        raise TypeError(f"scan prefix is bytes, got {type(prefix).__name__}")
    if start is not None and not (isinstance(start, bytes) and start.startswith(prefix)):
        raise ValueError(f"scan start {start!r} does not begin with the prefix {prefix!r}")
