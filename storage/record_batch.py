"""The encoding of a record batch (format 2): many records under one header and one checksum.

A batch is the unit a partition log stores, replicates and serves: the leader encodes its
records once (:func:`prepare_records`), every replica only stamps and checksums the result
(:func:`seal`), and a reader checks the checksum once per batch before it decodes the records
(:func:`decode`). Offsets stay per record.

Layout (all integers big-endian, fixed-width: ``struct`` unpacks them faster than Python could
walk varints; compactness comes from the deltas and from having no per-record crc, position or
format byte)::

    batch header (51 bytes)
    at  size  field
     0  u32   crc32c            over the salt, then every byte after this field (see below)
     4  u8    format            2 (format 1 is the old one-row-per-record encoding, storage.codec)
     5  u16   attributes        bits 0-2: compression (only 0 = none is defined); the rest is 0
     7  u32   count             records in the batch, >= 1
    11  i64   first_timestamp_ms  the first record's timestamp
    19  i64   last_timestamp_ms   the last record's timestamp (>= first)
    27  u64   producer_id       0 = no producer session
    35  u32   producer_epoch
    39  u64   first_sequence    the producer sequence of the first record (record i has first + i)
    47  u32   records_bytes     length of the records section that follows
    51        records section

    record (20 bytes fixed, then its variable parts)
     0  u32   offset_delta      its index in the batch (records are contiguous)
     4  u32   timestamp_delta   ms above first_timestamp_ms; never decreasing within a batch
     8  u32   key length        0xFFFFFFFF = no key (distinct from an empty key)
    12  u32   value length
    16  u16   header count
    18  u16   idem key length   0xFFFF = no idempotency key
    20        key | value
              per header: name length u16, value length u32, name (utf-8), value
              idempotency key (utf-8)

The *salt* is the batch's position, (log_id, base_offset) as 16 bytes (``codec.position``). It
is not stored in the batch (the store's key holds the base offset), but the crc covers it, so a
batch that is intact yet sits at the wrong place, or in another log, fails its check like any
flipped byte would.

Sizes: a record's ``size_bytes`` is its share of the records section (its 20-byte head and its
variable parts); the records of a batch add up to ``records_bytes``, and the batch header is
counted once, by the batch (``BatchHeader.size_bytes``). A log that stores whole batches counts
batch sizes for retention by bytes, since it deletes whole batches.

Limits are those of format 1 (``storage.records``), refused with the same
ValueError messages, so a record that one format accepts the other accepts too.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from itertools import count as _count
from itertools import repeat

from crc32c import crc32c

from storage.codec import position
from storage.records import (
    IDEMPOTENCY_KEY_BYTES_MAX,
    OFFSET_MAX,
    RECORD_HEADERS_MAX,
    RECORD_KEY_BYTES_MAX,
    RECORD_VALUE_BYTES_MAX,
    CorruptRecordError,
    NewRecord,
    Record,
    decode_headers,
    decode_text,
    encode_headers,
    encode_text,
    make_record,
)

FORMAT_V2 = 2

COMPRESSION_MASK = 0x0007
COMPRESSION_NONE = 0

U32_MAX = 2**32 - 1
U64_MAX = 2**64 - 1
I64_MIN = -(2**63)
I64_MAX = 2**63 - 1

RecordFields = tuple[bytes, bytes | None, tuple[tuple[str, bytes], ...], str | None]
"""(value, key, headers, idempotency_key): a record as the leader receives it, before it has an
offset or a timestamp (the argument order of ``storage.codec.prepare``)."""

_NO_KEY = 0xFFFFFFFF
_NO_IDEMPOTENCY_KEY = 0xFFFF

_CRC = struct.Struct(">I")
_FIELDS = struct.Struct(">BHIqqQIQI")  # the batch header after its crc
_HEAD = struct.Struct(">IBHIqqQIQI")  # the batch header as read back, crc included
_RECORD = struct.Struct(">IIIIHH")

HEADER_SIZE = _HEAD.size
RECORD_HEAD_SIZE = _RECORD.size

_FIRST_TIMESTAMP_DELTA_AT = HEADER_SIZE + 4
_OFFSET_END = OFFSET_MAX + 1  # offsets and sequences of a batch stay below it
_COPY_BYTES_MAX = 4096

# For readers that walk a records section without decoding it (the broker's check of records a
# client encoded): a record's fixed head, a header's head (name length, value length), and the
# lengths that mean "absent".
RECORD_HEAD = _RECORD
RECORD_HEADER_HEAD = struct.Struct(">HI")
NO_KEY_LENGTH = _NO_KEY
NO_IDEMPOTENCY_KEY_LENGTH = _NO_IDEMPOTENCY_KEY

_pack_crc = _CRC.pack
_pack_fields = _FIELDS.pack
_unpack_head = _HEAD.unpack_from
_pack_record = _RECORD.pack
_unpack_record = _RECORD.unpack_from
_unpack_u32 = struct.Struct(">I").unpack_from


class CorruptBatchError(CorruptRecordError):
    """A whole batch failed a check that cannot point at one record (its crc, its header).

    ``offset`` (as for any CorruptRecordError) and ``first_offset`` are the batch's base offset.
    ``last_offset`` is the last offset the header claims, or None when the header is too short or
    too damaged to claim one. After a crc mismatch the claim itself is unverified: a caller that
    knows where the next batch begins (a store's index) knows the damaged range for certain.
    """

    def __init__(
        self, log_id: int, first_offset: int, last_offset: int | None, detail: str
    ) -> None:
        super().__init__(log_id, first_offset, detail)
        self.first_offset = first_offset
        self.last_offset = last_offset


@dataclass(frozen=True, slots=True)
class BatchHeader:
    """What a batch says about itself, read and checked without decoding its records."""

    base_offset: int
    count: int
    first_timestamp_ms: int
    last_timestamp_ms: int
    producer_id: int
    producer_epoch: int
    first_sequence: int
    attributes: int
    size_bytes: int  # the whole batch, header included

    @property
    def last_offset(self) -> int:
        return self.base_offset + self.count - 1


# Encoding.


def prepare_records(records: Sequence[RecordFields]) -> bytes:
    """The records section of a batch of ``records`` (value, key, headers, idempotency_key),
    all to be stamped with one timestamp by :func:`seal`.

    The leader calls this once; replicas seal the bytes without walking them. ValueError past
    any limit, with the messages of ``storage.codec.prepare``.
    """
    if not records:
        raise ValueError("a batch holds at least one record")
    return _section(records, repeat(0))


def seal(
    log_id: int,
    base_offset: int,
    timestamp_ms: int,
    count: int,
    records_section: bytes,
    producer_id: int = 0,
    producer_epoch: int = 0,
    first_sequence: int = 0,
) -> bytes:
    """The stored form of a batch of ``count`` prepared records at (``log_id``, ``base_offset``),
    every record stamped ``timestamp_ms``.

    Checks only what costs nothing per record (ranges, that the section can hold ``count``
    records); the records themselves are not walked. Whatever else is wrong with the section is
    refused on read (a CorruptRecordError, never garbage), because the crc made here covers the
    bytes as given.
    """
    return _seal(
        log_id,
        base_offset,
        timestamp_ms,
        timestamp_ms,
        count,
        records_section,
        producer_id,
        producer_epoch,
        first_sequence,
    )


def encode(
    log_id: int,
    base_offset: int,
    records: Sequence[NewRecord],
    producer_id: int = 0,
    producer_epoch: int = 0,
    first_sequence: int = 0,
) -> bytes:
    """A sealed batch of ``records`` that keeps each record's own timestamp (for rewriting
    records that were stamped one by one, e.g. format-1 data). Timestamps must not decrease and
    may span at most 2**32 - 1 ms (about 49 days); ValueError otherwise or past any limit."""
    if not records:
        raise ValueError("a batch holds at least one record")
    first_ms = records[0].timestamp_ms
    last_ms = records[-1].timestamp_ms
    previous_ms = first_ms
    deltas: list[int] = []
    for index, record in enumerate(records):
        timestamp_ms = record.timestamp_ms
        if timestamp_ms < previous_ms:
            raise ValueError(
                f"timestamp_ms of record {index} ({timestamp_ms}) is below the one before it "
                f"({previous_ms}): timestamps of a batch never decrease"
            )
        previous_ms = timestamp_ms
        deltas.append(timestamp_ms - first_ms)
    if last_ms - first_ms > U32_MAX:
        raise ValueError(f"timestamps of a batch span {last_ms - first_ms} ms, more than {U32_MAX}")
    section = _section([(r.value, r.key, r.headers, r.idempotency_key) for r in records], deltas)
    return _seal(
        log_id,
        base_offset,
        first_ms,
        last_ms,
        len(records),
        section,
        producer_id,
        producer_epoch,
        first_sequence,
    )


def _section(records: Iterable[RecordFields], timestamp_deltas: Iterable[int]) -> bytes:
    # One struct.pack and a few appends per record; the header path only for records with
    # headers. Checks and their order are those of codec._encode_body, so are the messages.
    parts: list[bytes] = []
    append = parts.append
    for index, timestamp_delta, (value, key, headers, idempotency_key) in zip(
        _count(), timestamp_deltas, records
    ):
        value_len = len(value)
        if value_len > RECORD_VALUE_BYTES_MAX:
            raise ValueError(f"record value of {value_len} bytes exceeds {RECORD_VALUE_BYTES_MAX}")
        if key is None:
            key_len = _NO_KEY
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
        append(_pack_record(index, timestamp_delta, key_len, value_len, header_count, idem_len))
        if key:
            append(key)
        append(value)
        if headers:
            parts.extend(encode_headers(headers))
        if idem:
            append(idem)
    return b"".join(parts)


def _seal(
    log_id: int,
    base_offset: int,
    first_timestamp_ms: int,
    last_timestamp_ms: int,
    count: int,
    records_section: bytes,
    producer_id: int,
    producer_epoch: int,
    first_sequence: int,
) -> bytes:
    records_bytes = len(records_section)
    try:
        # struct checks every field's width; the few relations between fields are checked
        # below, and only a refusal pays for working out which field is wrong.
        fields = _pack_fields(
            FORMAT_V2,
            COMPRESSION_NONE,
            count,
            first_timestamp_ms,
            last_timestamp_ms,
            producer_id,
            producer_epoch,
            first_sequence,
            records_bytes,
        )
    except struct.error:
        fields = b""
    if (
        not fields
        or count < 1
        or base_offset < 0
        or base_offset + count > _OFFSET_END
        or first_sequence + count > _OFFSET_END
        or last_timestamp_ms < first_timestamp_ms
        or records_bytes < count * RECORD_HEAD_SIZE
    ):
        raise ValueError(
            _batch_fields_problem(
                base_offset,
                first_timestamp_ms,
                last_timestamp_ms,
                count,
                records_bytes,
                producer_id,
                producer_epoch,
                first_sequence,
            )
        )
    salt = position(log_id, base_offset)
    crc = crc32c(records_section, crc32c(fields, crc32c(salt)))
    return b"".join((_pack_crc(crc), fields, records_section))


def _batch_fields_problem(
    base_offset: int,
    first_timestamp_ms: int,
    last_timestamp_ms: int,
    count: int,
    records_bytes: int,
    producer_id: int,
    producer_epoch: int,
    first_sequence: int,
) -> str:
    """Which field of a batch that seal refused is wrong, and why."""
    if not 1 <= count <= U32_MAX:
        return f"count {count} is outside [1, {U32_MAX}]"
    if not 0 <= base_offset <= OFFSET_MAX - count + 1:
        return f"base_offset {base_offset} with {count} records leaves the u64 offsets"
    for name, value in (
        ("first_timestamp_ms", first_timestamp_ms),
        ("last_timestamp_ms", last_timestamp_ms),
    ):
        if not I64_MIN <= value <= I64_MAX:
            return f"{name} {value!r} is not a signed 64-bit int"
    if last_timestamp_ms < first_timestamp_ms:
        return (
            f"last_timestamp_ms {last_timestamp_ms} is below first_timestamp_ms "
            f"{first_timestamp_ms}"
        )
    if not 0 <= producer_id <= U64_MAX:
        return f"producer_id {producer_id} is not a u64"
    if not 0 <= producer_epoch <= U32_MAX:
        return f"producer_epoch {producer_epoch} is not a u32"
    if not 0 <= first_sequence <= U64_MAX - count + 1:
        return f"first_sequence {first_sequence} with {count} records leaves the u64 sequences"
    if records_bytes > U32_MAX:
        return f"records section of {records_bytes} bytes exceeds {U32_MAX}"
    if records_bytes < count * RECORD_HEAD_SIZE:
        return f"records section of {records_bytes} bytes cannot hold {count} records"
    return "fields out of range"


# Decoding.


def read_header(log_id: int, base_offset: int, buf: bytes, check_crc: bool = True) -> BatchHeader:
    """The checked header of the batch ``buf`` stored at (``log_id``, ``base_offset``).

    Raises CorruptBatchError when the batch is short, fails its crc, or has a format,
    attributes or fields that do not fit together. ``check_crc=False`` skips only the crc (the
    one check that reads the whole batch): a flipped bit inside a header field then goes
    unnoticed, so use it only for hints that a later checked read confirms.
    """
    header = _checked_header(log_id, base_offset, buf, check_crc)
    (
        _crc,
        _fmt,
        attributes,
        count,
        first_ms,
        last_ms,
        producer_id,
        producer_epoch,
        first_sequence,
        _records_bytes,
    ) = header
    return BatchHeader(
        base_offset,
        count,
        first_ms,
        last_ms,
        producer_id,
        producer_epoch,
        first_sequence,
        attributes,
        len(buf),
    )


def decode(
    log_id: int,
    base_offset: int,
    buf: bytes,
    start_offset: int | None = None,
    max_records: int | None = None,
) -> list[Record]:
    """The records of the batch ``buf`` stored at (``log_id``, ``base_offset``), checked.

    The crc is checked once for the batch, then every record is checked as it is decoded
    (lengths add up exactly, offset deltas are the indexes, timestamps within the header's
    range and never decreasing, text is utf-8). Records below ``start_offset`` are left out of
    the result but checked all the same, so a damaged byte anywhere in the batch is refused.
    With ``max_records`` decoding stops once that many are decoded, and the records after them
    are not walked: a reader that wants a few records of a big batch does not pay for the rest
    (the crc covered them; a full read checks them). A failed record check raises
    CorruptRecordError at that record's offset; a failure of the whole batch raises
    CorruptBatchError.
    """
    header = _checked_header(log_id, base_offset, buf, True)
    count = header[3]
    first_ms = header[4]
    skip = 0 if start_offset is None else min(max(start_offset - base_offset, 0), count)
    return _records(
        log_id, base_offset, buf, count, first_ms, header[5] - first_ms, skip, max_records
    )


def trim(log_id: int, base_offset: int, buf: bytes, start_offset: int) -> bytes:
    """The batch ``buf`` (stored at ``base_offset``) without its records below ``start_offset``,
    sealed anew for (``log_id``, ``start_offset``): what a read from the middle of a batch
    hands on. The first sequence moves up with the records left out; producer id and epoch stay.

    The whole batch is checked first (CorruptRecordError as :func:`decode`), so a new crc never
    covers damaged bytes. ``start_offset`` at or below the base returns ``buf`` unchanged
    (unchecked: the reader checks it like any stored batch); past the last record, ValueError.
    """
    if start_offset <= base_offset:
        return buf
    header = _checked_header(log_id, base_offset, buf, True)
    (_crc, _fmt, _attr, count, first_ms, last_ms, producer_id, epoch, first_seq, _rb) = header
    skip = start_offset - base_offset
    if skip >= count:
        raise ValueError(
            f"start_offset {start_offset} is past the batch [{base_offset}, "
            f"{base_offset + count - 1}]"
        )
    kept = _records(log_id, base_offset, buf, count, first_ms, last_ms - first_ms, skip)
    # The kept records are the tail of the batch, which _records checked ends where buf does.
    at = len(buf) - sum(record.size_bytes for record in kept)
    new_first_ms = kept[0].timestamp_ms
    parts: list[bytes] = []
    append = parts.append
    for index, record in enumerate(kept):
        # Only the two deltas change; everything after the fixed head is copied as it is.
        _od, _td, key_len, value_len, header_count, idem_len = _unpack_record(buf, at)
        append(
            _pack_record(
                index,
                record.timestamp_ms - new_first_ms,
                key_len,
                value_len,
                header_count,
                idem_len,
            )
        )
        append(buf[at + RECORD_HEAD_SIZE : at + record.size_bytes])
        at += record.size_bytes
    return _seal(
        log_id,
        start_offset,
        new_first_ms,
        last_ms,
        count - skip,
        b"".join(parts),
        producer_id,
        epoch,
        first_seq + skip,
    )


def _checked_header(
    log_id: int, base_offset: int, buf: bytes, check_crc: bool
) -> tuple[int, int, int, int, int, int, int, int, int, int]:
    """The unpacked header fields, after every check that concerns the batch as a whole."""
    size = len(buf)
    if size < HEADER_SIZE:
        raise CorruptBatchError(
            log_id,
            base_offset,
            None,
            f"{size} bytes, shorter than a batch header ({HEADER_SIZE}), in the batch at "
            f"{base_offset}",
        )
    header: tuple[int, int, int, int, int, int, int, int, int, int] = _unpack_head(buf)
    crc, fmt, attributes, count, first_ms, last_ms, _pid, _epoch, _seq, records_bytes = header
    claimed_last = base_offset + count - 1 if 1 <= count <= OFFSET_MAX - base_offset + 1 else None
    # A small batch is cheaper to copy than to wrap in a memoryview; a large one is not.
    covered = buf[4:] if size <= _COPY_BYTES_MAX else memoryview(buf)[4:]
    if check_crc and crc32c(covered, crc32c(position(log_id, base_offset))) != crc:
        raise CorruptBatchError(
            log_id,
            base_offset,
            claimed_last,
            f"crc32c mismatch in batch [{base_offset}, {_show(claimed_last)}]",
        )
    # From here on (crc matched) a failed check means an encoder bug or a format this code does
    # not know; either way the bytes are refused rather than guessed at.
    if (
        fmt != FORMAT_V2
        or attributes
        or claimed_last is None
        or not 0 <= last_ms - first_ms <= U32_MAX
        or records_bytes != size - HEADER_SIZE
        or records_bytes < count * RECORD_HEAD_SIZE
    ):
        problem = _header_problem(
            fmt, attributes, count, first_ms, last_ms, records_bytes, size, claimed_last
        )
        raise CorruptBatchError(
            log_id,
            base_offset,
            claimed_last,
            f"{problem}, in batch [{base_offset}, {_show(claimed_last)}]",
        )
    return header


def _header_problem(
    fmt: int,
    attributes: int,
    count: int,
    first_ms: int,
    last_ms: int,
    records_bytes: int,
    size: int,
    claimed_last: int | None,
) -> str:
    """What is wrong with header fields that failed the quick check in _checked_header."""
    if fmt != FORMAT_V2:
        if fmt == 1:
            return "format 1 (a per-record row of the old format), not a batch"
        return f"unknown batch format {fmt}"
    compression = attributes & COMPRESSION_MASK
    if compression != COMPRESSION_NONE:
        return f"unknown compression {compression}"
    if attributes & ~COMPRESSION_MASK:
        return f"unknown attribute bits {attributes:#06x}"
    if claimed_last is None:
        return f"count {count} does not fit the offsets"
    if last_ms < first_ms:
        return f"last_timestamp_ms {last_ms} is below first_timestamp_ms {first_ms}"
    if last_ms - first_ms > U32_MAX:
        return f"timestamps span {last_ms - first_ms} ms, more than a u32 delta"
    if records_bytes != size - HEADER_SIZE:
        return f"records_bytes {records_bytes} but {size - HEADER_SIZE} bytes follow the header"
    if records_bytes < count * RECORD_HEAD_SIZE:
        return f"records_bytes {records_bytes} cannot hold {count} records"
    return "fields that do not fit together"


def _show(offset: int | None) -> str:
    return "?" if offset is None else str(offset)


def _records(
    log_id: int,
    base_offset: int,
    buf: bytes,
    count: int,
    first_ms: int,
    span_ms: int,
    skip: int,
    take: int | None = None,
) -> list[Record]:
    """Check every record of a batch whose header passed; decode those from index ``skip``.
    With ``take``, stop once that many are decoded: the records after them are not walked (the
    crc, checked over the whole batch, still stands for them; a full read checks them too)."""
    size = len(buf)
    last_offset = base_offset + count - 1
    if _unpack_u32(buf, _FIRST_TIMESTAMP_DELTA_AT)[0] != 0:
        raise _bad_record(log_id, base_offset, base_offset, last_offset, "timestamp delta not 0")
    records: list[Record] = []
    append = records.append
    make = make_record
    unpack = _unpack_record
    first_kept = base_offset + skip
    previous_delta = 0
    at = HEADER_SIZE
    offset = base_offset
    try:
        # The per-record cost of reading a batch is this loop: every check is one comparison,
        # and a head that runs past the end is left to unpack_from (struct.error, below).
        for offset in range(base_offset, last_offset + 1):
            offset_delta, timestamp_delta, key_len, value_len, header_count, idem_len = unpack(
                buf, at
            )
            if base_offset + offset_delta != offset:
                raise _bad_record(
                    log_id, offset, base_offset, last_offset, f"offset delta {offset_delta}"
                )
            if not previous_delta <= timestamp_delta <= span_ms:
                raise _bad_record(
                    log_id,
                    offset,
                    base_offset,
                    last_offset,
                    f"timestamp delta {timestamp_delta} outside [{previous_delta}, {span_ms}]",
                )
            previous_delta = timestamp_delta
            pos = at + RECORD_HEAD_SIZE
            key: bytes | None
            if key_len == _NO_KEY:
                key = None
            elif key_len <= RECORD_KEY_BYTES_MAX:
                key = buf[pos : pos + key_len]
                pos += key_len
            else:
                raise _bad_record(
                    log_id, offset, base_offset, last_offset, f"key length {key_len} over the limit"
                )
            value_end = pos + value_len
            if value_end > size:
                raise _bad_record(
                    log_id,
                    offset,
                    base_offset,
                    last_offset,
                    f"value length {value_len} runs past the end",
                )
            value = buf[pos:value_end]
            pos = value_end
            if header_count:
                headers, pos = decode_headers(buf, pos, header_count, log_id, offset)
            else:
                headers = ()
            idempotency_key: str | None
            if idem_len == _NO_IDEMPOTENCY_KEY:
                idempotency_key = None
            else:
                idem_end = pos + idem_len
                if idem_len > IDEMPOTENCY_KEY_BYTES_MAX or idem_end > size:
                    raise _bad_record(
                        log_id,
                        offset,
                        base_offset,
                        last_offset,
                        f"idempotency key length {idem_len} over the limit or past the end",
                    )
                idempotency_key = decode_text(buf[pos:idem_end], log_id, offset)
                pos = idem_end
            if offset >= first_kept:
                append(
                    make(
                        offset,
                        first_ms + timestamp_delta,
                        value,
                        key,
                        headers,
                        idempotency_key,
                        pos - at,
                    )
                )
                if take is not None and len(records) >= take:
                    return records
            at = pos
    except struct.error:
        raise _bad_record(
            log_id, offset, base_offset, last_offset, "record head runs past the end"
        ) from None
    if previous_delta != span_ms:
        raise _bad_record(
            log_id,
            last_offset,
            base_offset,
            last_offset,
            f"timestamp delta {previous_delta}, not the header's span {span_ms}",
        )
    if at != size:
        raise _bad_record(
            log_id,
            last_offset,
            base_offset,
            last_offset,
            f"records end at byte {at}, the batch has {size}",
        )
    return records


def _bad_record(
    log_id: int, offset: int, base_offset: int, last_offset: int, detail: str
) -> CorruptRecordError:
    return CorruptRecordError(
        log_id,
        offset,
        f"{detail} (record {offset - base_offset} of batch [{base_offset}, {last_offset}])",
    )
