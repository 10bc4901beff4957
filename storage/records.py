"""What both record formats share: the record types, their limits, and the field codecs.

Format 1 (``storage.codec``) and format 2, the record batch (``storage.record_batch``), lay out
a record's fixed head differently, but a key, a value, the headers and the idempotency key are
bounded, encoded and checked alike, by the code here. ``storage.api`` re-exports the types and
limits for the layers above; this module imports nothing of storage, so the modules that encode
records need not import the API.
"""

from __future__ import annotations

import dataclasses
import struct
from collections.abc import Callable
from dataclasses import dataclass

# Hard limits: storage refuses anything larger, whatever the layer above asked for.
RECORD_KEY_BYTES_MAX = 64 * 1024
RECORD_VALUE_BYTES_MAX = 64 * 1024 * 1024
RECORD_HEADERS_MAX = 256
IDEMPOTENCY_KEY_BYTES_MAX = 256
LOG_ID_MAX = 2**64 - 1
OFFSET_MAX = 2**64 - 1

# Limits of the formats themselves, on top of the contract's. A header name is a short label, so
# its u16 length field is its real bound; a header value gets the same bound as a record value,
# so the size of a record stays bounded by its limits rather than by the u32 field width.
HEADER_NAME_BYTES_MAX = 0xFFFF
HEADER_VALUE_BYTES_MAX = RECORD_VALUE_BYTES_MAX

Headers = tuple[tuple[str, bytes], ...]


class StorageError(Exception):
    """Base of every error raised by storage."""


class CorruptRecordError(StorageError):
    """A stored record failed its crc32c check (or could not be decoded). Never returns garbage."""

    def __init__(self, log_id: int, offset: int, detail: str) -> None:
        super().__init__(f"corrupt record in log {log_id} at offset {offset}: {detail}")
        self.log_id = log_id
        self.offset = offset


@dataclass(frozen=True, slots=True)
class NewRecord:
    """A record to append; the log assigns its offset."""

    timestamp_ms: int
    value: bytes
    key: bytes | None = None
    headers: tuple[tuple[str, bytes], ...] = ()
    idempotency_key: str | None = None


@dataclass(frozen=True, slots=True)
class Record:
    """A stored record, read back and checked."""

    offset: int
    timestamp_ms: int
    value: bytes
    key: bytes | None
    headers: tuple[tuple[str, bytes], ...]
    idempotency_key: str | None
    size_bytes: int  # its share of its batch's records section (what reads by bytes count)


_HEADER = struct.Struct(">HI")  # per header: name length u16, value length u32
_HEADER_SIZE = _HEADER.size
_pack_header = _HEADER.pack
_unpack_header = _HEADER.unpack_from


def _record_factory() -> Callable[
    [int, int, bytes, bytes | None, Headers, str | None, int], Record
]:
    """A constructor of ``Record`` that skips the frozen dataclass ``__init__``.

    That ``__init__`` sets each field through ``object.__setattr__``, which is more than half the
    cost of decoding a small record. Filling the slots directly builds an identical object, as
    long as ``Record`` has slots, no ``__post_init__`` and these fields in this order; if that ever
    changes, the plain constructor is used instead.
    """
    names = ("offset", "timestamp_ms", "value", "key", "headers", "idempotency_key", "size_bytes")
    if (
        tuple(field.name for field in dataclasses.fields(Record)) != names
        or hasattr(Record, "__post_init__")
        or not hasattr(Record, "__slots__")
    ):
        return Record
    new = object.__new__
    slots = Record.__dict__
    set_offset, set_timestamp, set_value, set_key, set_headers, set_idem, set_size = (
        slots[name].__set__ for name in names
    )

    def make(
        offset: int,
        timestamp_ms: int,
        value: bytes,
        key: bytes | None,
        headers: Headers,
        idempotency_key: str | None,
        size_bytes: int,
    ) -> Record:
        record = new(Record)
        set_offset(record, offset)
        set_timestamp(record, timestamp_ms)
        set_value(record, value)
        set_key(record, key)
        set_headers(record, headers)
        set_idem(record, idempotency_key)
        set_size(record, size_bytes)
        return record

    return make


make_record = _record_factory()
"""``Record(offset, timestamp_ms, value, key, headers, idempotency_key, size_bytes)``, faster."""


def encode_headers(headers: Headers) -> list[bytes]:
    """The encoded ``headers``, as parts to join; ValueError past a header limit."""
    parts: list[bytes] = []
    for name, header_value in headers:
        raw_name = encode_text(name, "header name")
        if len(raw_name) > HEADER_NAME_BYTES_MAX:
            raise ValueError(
                f"header name of {len(raw_name)} bytes exceeds {HEADER_NAME_BYTES_MAX}"
            )
        if len(header_value) > HEADER_VALUE_BYTES_MAX:
            raise ValueError(
                f"value of header {name!r} has {len(header_value)} bytes, "
                f"exceeds {HEADER_VALUE_BYTES_MAX}"
            )
        parts.append(_pack_header(len(raw_name), len(header_value)))
        parts.append(raw_name)
        parts.append(header_value)
    return parts


def encode_text(text: str, what: str) -> bytes:
    """``text`` as utf-8; ValueError naming ``what`` when it cannot be encoded."""
    try:
        return text.encode()
    except UnicodeEncodeError as e:
        raise ValueError(f"{what} {text!r} is not encodable as utf-8: {e.reason}") from None


def decode_headers(
    buf: bytes, at: int, count: int, log_id: int, offset: int
) -> tuple[Headers, int]:
    """The ``count`` headers encoded in ``buf`` from ``at`` on, and where they end;
    CorruptRecordError at (``log_id``, ``offset``) when they do not fit."""
    if count > RECORD_HEADERS_MAX:
        raise CorruptRecordError(log_id, offset, f"{count} headers over the limit")
    size = len(buf)
    headers: list[tuple[str, bytes]] = []
    for _ in range(count):
        if at + _HEADER_SIZE > size:
            raise CorruptRecordError(log_id, offset, "header runs past the end")
        name_len, value_len = _unpack_header(buf, at)
        name_at = at + _HEADER_SIZE
        value_at = name_at + name_len
        at = value_at + value_len
        if at > size:
            raise CorruptRecordError(log_id, offset, "header runs past the end")
        headers.append((decode_text(buf[name_at:value_at], log_id, offset), buf[value_at:at]))
    return tuple(headers), at


def decode_text(raw: bytes, log_id: int, offset: int) -> str:
    """``raw`` decoded as utf-8; CorruptRecordError at (``log_id``, ``offset``) if it is not."""
    try:
        return raw.decode()
    except UnicodeDecodeError:
        raise CorruptRecordError(log_id, offset, "text field is not valid utf-8") from None
