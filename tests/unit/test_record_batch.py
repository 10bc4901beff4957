"""The record batch encoding (format 2, storage.record_batch): round trips, limits equal to
format 1's, and that no damage, truncation or misplacement ever decodes into records."""

from __future__ import annotations

import random
import struct

import pytest
from crc32c import crc32c

from storage import codec, records
from storage.api import (
    IDEMPOTENCY_KEY_BYTES_MAX,
    RECORD_HEADERS_MAX,
    RECORD_KEY_BYTES_MAX,
    RECORD_VALUE_BYTES_MAX,
    CorruptRecordError,
    NewRecord,
    Record,
)
from storage.record_batch import (
    HEADER_SIZE,
    RECORD_HEAD_SIZE,
    CorruptBatchError,
    RecordFields,
    decode,
    encode,
    prepare_records,
    read_header,
    seal,
    trim,
)

LOG_ID = 42
BASE = 1000
STAMP_MS = 1_700_000_000_000

SMALL: list[RecordFields] = [
    (b"v0", b"k0", (), None),
    (b"", None, (("h", b"x"), ("\u00e9t\u00e9", b"")), "id-1"),
    (b"value two", b"", (), ""),
]


def _sealed(records: list[RecordFields] = SMALL, **producer: int) -> bytes:
    return seal(LOG_ID, BASE, STAMP_MS, len(records), prepare_records(records), **producer)


def _recrc(buf: bytes | bytearray, log_id: int = LOG_ID, base_offset: int = BASE) -> bytes:
    """``buf`` with a correct crc: damage an encoder could have made, not the disk."""
    crc = crc32c(bytes(buf[4:]), crc32c(codec.position(log_id, base_offset)))
    return struct.pack(">I", crc) + bytes(buf[4:])


def _fields(record: Record) -> RecordFields:
    return (record.value, record.key, record.headers, record.idempotency_key)


def _record_at(buf: bytes, index: int) -> int:
    """Byte position of record ``index`` of a batch (trusting its lengths)."""
    at = HEADER_SIZE
    for _ in range(index):
        _od, _td, key_len, value_len, header_count, idem_len = struct.unpack_from(
            ">IIIIHH", buf, at
        )
        at += RECORD_HEAD_SIZE + (0 if key_len == 0xFFFFFFFF else key_len) + value_len
        for _ in range(header_count):
            name_len, header_value_len = struct.unpack_from(">HI", buf, at)
            at += 6 + name_len + header_value_len
        at += 0 if idem_len == 0xFFFF else idem_len
    return at


def test_layout_matches_the_documented_byte_table() -> None:
    """The stored bytes are a format: this pins them to the module docstring's table."""
    records: list[RecordFields] = [(b"val", b"k", (("h", b"hv"),), "id"), (b"", None, (), None)]
    buf = seal(LOG_ID, BASE, STAMP_MS, 2, prepare_records(records), 5, 6, 7)
    section = (
        struct.pack(">IIIIHH", 0, 0, 1, 3, 1, 2)
        + b"k"
        + b"val"
        + struct.pack(">HI", 1, 2)
        + b"h"
        + b"hv"
        + b"id"
        + struct.pack(">IIIIHH", 1, 0, 0xFFFFFFFF, 0, 0, 0xFFFF)
    )
    fields = struct.pack(">BHIqqQIQI", 2, 0, 2, STAMP_MS, STAMP_MS, 5, 6, 7, len(section)) + section
    crc = crc32c(fields, crc32c(struct.pack(">QQ", LOG_ID, BASE)))
    assert buf == struct.pack(">I", crc) + fields
    assert HEADER_SIZE == 51 and RECORD_HEAD_SIZE == 20


def test_batch_round_trips_every_field() -> None:
    records: list[RecordFields] = [
        (b"plain", None, (), None),
        (b"", b"", (), ""),  # empty key and empty idempotency key, distinct from none
        (
            b"\x00\xff" * 10,
            b"key",
            (("a", b"1"), ("a", b"2"), ("", b"")),
            "\u65e5\u672c-\U0001f600",
        ),
        (b"v", None, tuple((f"h{i}", bytes([i])) for i in range(RECORD_HEADERS_MAX)), None),
    ]
    buf = seal(LOG_ID, BASE, STAMP_MS, len(records), prepare_records(records), 7, 3, 90)
    header = read_header(LOG_ID, BASE, buf)
    assert (header.base_offset, header.count, header.last_offset) == (BASE, 4, BASE + 3)
    assert (header.first_timestamp_ms, header.last_timestamp_ms) == (STAMP_MS, STAMP_MS)
    assert (header.producer_id, header.producer_epoch, header.first_sequence) == (7, 3, 90)
    assert (header.attributes, header.size_bytes) == (0, len(buf))
    decoded = decode(LOG_ID, BASE, buf)
    assert [_fields(r) for r in decoded] == records
    assert [r.offset for r in decoded] == [BASE, BASE + 1, BASE + 2, BASE + 3]
    assert {r.timestamp_ms for r in decoded} == {STAMP_MS}
    assert decoded[0].key is None and decoded[1].key == b""
    assert decoded[0].idempotency_key is None and decoded[1].idempotency_key == ""


def test_batch_round_trips_fields_at_their_limits() -> None:
    biggest: RecordFields = (
        b"v" * RECORD_VALUE_BYTES_MAX,
        b"k" * RECORD_KEY_BYTES_MAX,
        (("n" * records.HEADER_NAME_BYTES_MAX, b"h" * 1024),),
        "\u00e9" * (IDEMPOTENCY_KEY_BYTES_MAX // 2),  # 2 utf-8 bytes each: exactly the limit
    )
    buf = seal(LOG_ID, BASE, STAMP_MS, 2, prepare_records([biggest, (b"", None, (), None)]))
    decoded = decode(LOG_ID, BASE, buf)
    assert _fields(decoded[0]) == biggest
    assert _fields(decoded[1]) == (b"", None, (), None)


def test_extreme_header_values_round_trip() -> None:
    u64, u32 = 2**64 - 1, 2**32 - 1
    buf = seal(u64, u64, -(2**63), 1, prepare_records([(b"x", None, (), None)]), u64, u32, u64)
    header = read_header(u64, u64, buf)
    assert header.last_offset == u64 and header.first_timestamp_ms == -(2**63)
    assert (header.producer_id, header.producer_epoch, header.first_sequence) == (u64, u32, u64)
    assert decode(u64, u64, buf)[0].offset == u64


def test_decoded_sizes_add_up_to_the_records_section() -> None:
    buf = _sealed()
    decoded = decode(LOG_ID, BASE, buf)
    assert sum(r.size_bytes for r in decoded) == len(buf) - HEADER_SIZE
    assert decoded[0].size_bytes == RECORD_HEAD_SIZE + len(b"k0") + len(b"v0")


def test_flipped_byte_anywhere_is_refused() -> None:
    buf = _sealed()
    for at in range(len(buf)):
        for mask in (0x01, 0x80, 0xFF):
            damaged = bytearray(buf)
            damaged[at] ^= mask
            with pytest.raises(CorruptRecordError):
                decode(LOG_ID, BASE, bytes(damaged))
            with pytest.raises(CorruptRecordError):
                read_header(LOG_ID, BASE, bytes(damaged))


def test_batch_at_wrong_offset_fails_crc() -> None:
    buf = _sealed()
    for base in (BASE - 1, BASE + 1, 0):
        with pytest.raises(CorruptBatchError, match="crc32c mismatch"):
            decode(LOG_ID, base, buf)


def test_batch_of_another_log_fails_crc() -> None:
    buf = _sealed()
    with pytest.raises(CorruptBatchError, match="crc32c mismatch"):
        decode(LOG_ID + 1, BASE, buf)


def test_crc_mismatch_reports_the_range_of_the_batch() -> None:
    damaged = bytearray(_sealed())
    damaged[-1] ^= 1
    with pytest.raises(CorruptBatchError) as caught:
        decode(LOG_ID, BASE, bytes(damaged), start_offset=BASE + 2)
    err = caught.value
    assert isinstance(err, CorruptRecordError)
    assert (err.log_id, err.offset, err.first_offset, err.last_offset) == (
        LOG_ID,
        BASE,
        BASE,
        BASE + 2,
    )
    assert f"crc32c mismatch in batch [{BASE}, {BASE + 2}]" in str(err)


def test_truncated_batch_is_refused() -> None:
    buf = _sealed()
    for length in range(len(buf)):
        with pytest.raises(CorruptBatchError) as caught:
            decode(LOG_ID, BASE, buf[:length])
        if length < HEADER_SIZE:
            assert caught.value.last_offset is None
        with pytest.raises(CorruptBatchError):
            read_header(LOG_ID, BASE, buf[:length], check_crc=False)
    with pytest.raises(CorruptBatchError):
        decode(LOG_ID, BASE, buf + b"\x00")


@pytest.mark.parametrize(
    ("at", "value", "reason"),
    [
        (4, 3, "unknown batch format 3"),
        (4, 0, "unknown batch format 0"),
        (4, 1, "format 1"),
        (6, 1, "unknown compression 1"),
        (6, 7, "unknown compression 7"),
        (6, 8, "unknown attribute bits"),
        (5, 0x80, "unknown attribute bits"),
    ],
)
def test_unknown_format_and_compression_refused(at: int, value: int, reason: str) -> None:
    damaged = bytearray(_sealed())
    damaged[at] = value
    resealed = _recrc(damaged)
    for check_crc in (True, False):
        with pytest.raises(CorruptBatchError, match=reason):
            read_header(LOG_ID, BASE, resealed, check_crc=check_crc)
    with pytest.raises(CorruptBatchError, match=reason):
        decode(LOG_ID, BASE, resealed)


def test_inconsistent_header_with_a_valid_crc_is_refused() -> None:
    buf = _sealed()
    zero_count = bytearray(buf)
    zero_count[7:11] = struct.pack(">I", 0)
    with pytest.raises(CorruptBatchError, match="count 0"):
        read_header(LOG_ID, BASE, _recrc(zero_count))
    # Three records from offset 2**64 - 2 would need offset 2**64.
    with pytest.raises(CorruptBatchError, match="does not fit the offsets"):
        read_header(LOG_ID, 2**64 - 2, _recrc(buf, base_offset=2**64 - 2))
    backwards = bytearray(buf)
    backwards[19:27] = struct.pack(">q", STAMP_MS - 1)  # last below first
    with pytest.raises(CorruptBatchError, match="below first_timestamp_ms"):
        read_header(LOG_ID, BASE, _recrc(backwards))
    short_section = bytearray(buf)
    short_section[47:51] = struct.pack(">I", len(buf) - HEADER_SIZE - 1)
    with pytest.raises(CorruptBatchError, match="records_bytes"):
        read_header(LOG_ID, BASE, _recrc(short_section))


def test_record_check_names_the_offset_of_that_record() -> None:
    buf = _sealed()
    # A wrong offset delta in record 2, under a valid crc (an encoder bug, not the disk).
    damaged = bytearray(buf)
    damaged[_record_at(buf, 2) : _record_at(buf, 2) + 4] = struct.pack(">I", 5)
    with pytest.raises(CorruptRecordError) as caught:
        decode(LOG_ID, BASE, _recrc(damaged))
    assert not isinstance(caught.value, CorruptBatchError)
    assert caught.value.offset == BASE + 2
    assert f"batch [{BASE}, {BASE + 2}]" in str(caught.value)
    # Invalid utf-8 in the idempotency key of record 1 (its last byte).
    damaged = bytearray(buf)
    damaged[_record_at(buf, 2) - 1] = 0xFF
    with pytest.raises(CorruptRecordError, match="utf-8") as caught:
        decode(LOG_ID, BASE, _recrc(damaged))
    assert caught.value.offset == BASE + 1


def test_count_that_does_not_match_the_section_is_refused_on_read() -> None:
    section = prepare_records(SMALL)
    for wrong_count in (1, 2, 4):
        buf = seal(LOG_ID, BASE, STAMP_MS, wrong_count, section)
        with pytest.raises(CorruptRecordError):
            decode(LOG_ID, BASE, buf)


def test_every_resealed_mutation_of_the_records_section_is_refused_or_exact() -> None:
    """Damage under a valid crc (what only an encoder bug makes): decode refuses it with a
    CorruptRecordError, never another exception, or returns records whose encoding is exactly
    the bytes given, so nothing is read that the bytes do not say."""
    buf = _sealed()
    for at in range(HEADER_SIZE, len(buf)):
        for mask in (0x01, 0x10, 0xFF):
            damaged = bytearray(buf)
            damaged[at] ^= mask
            resealed = _recrc(damaged)
            try:
                decoded = decode(LOG_ID, BASE, resealed)
            except CorruptRecordError:
                continue
            assert _sealed([_fields(r) for r in decoded]) == resealed, (at, mask)


def test_start_offset_skips_but_checks_all() -> None:
    buf = _sealed()
    assert [r.offset for r in decode(LOG_ID, BASE, buf, start_offset=BASE + 1)] == [
        BASE + 1,
        BASE + 2,
    ]
    assert decode(LOG_ID, BASE, buf, start_offset=BASE + 2) == decode(LOG_ID, BASE, buf)[2:]
    assert decode(LOG_ID, BASE, buf, start_offset=BASE + 3) == []
    assert decode(LOG_ID, BASE, buf, start_offset=0) == decode(LOG_ID, BASE, buf)
    # Damage in a record that is skipped is still found, at that record's offset.
    damaged = bytearray(buf)
    damaged[HEADER_SIZE : HEADER_SIZE + 4] = struct.pack(">I", 1)  # record 0's offset delta
    with pytest.raises(CorruptRecordError) as caught:
        decode(LOG_ID, BASE, _recrc(damaged), start_offset=BASE + 2)
    assert caught.value.offset == BASE
    flipped = bytearray(buf)
    flipped[HEADER_SIZE + RECORD_HEAD_SIZE] ^= 1  # a key byte of record 0
    with pytest.raises(CorruptBatchError):
        decode(LOG_ID, BASE, bytes(flipped), start_offset=BASE + 2)


def test_limits_match_codec_format_1() -> None:
    over_limit: list[RecordFields] = [
        (b"v" * (RECORD_VALUE_BYTES_MAX + 1), None, (), None),
        (b"v", b"k" * (RECORD_KEY_BYTES_MAX + 1), (), None),
        (b"v", None, (), "i" * (IDEMPOTENCY_KEY_BYTES_MAX + 1)),
        (b"v", None, (), "\ud800"),  # a lone surrogate: not encodable as utf-8
        (b"v", None, (("h", b""),) * (RECORD_HEADERS_MAX + 1), None),
        (b"v", None, (("n" * (records.HEADER_NAME_BYTES_MAX + 1), b""),), None),
        (b"v", None, (("\udfff", b""),), None),
        (b"v", None, (("h", b"x" * (records.HEADER_VALUE_BYTES_MAX + 1)),), None),
    ]
    for fields in over_limit:
        with pytest.raises(ValueError) as format_1:
            codec.prepare(*fields)
        with pytest.raises(ValueError) as format_2:
            prepare_records([(b"fine", None, (), None), fields])
        assert str(format_2.value) == str(format_1.value)


def test_empty_batch_is_refused() -> None:
    with pytest.raises(ValueError, match="at least one record"):
        prepare_records([])
    with pytest.raises(ValueError, match="at least one record"):
        encode(LOG_ID, BASE, [])


@pytest.mark.parametrize(
    ("arguments", "field"),
    [
        ({"count": 0}, "count"),
        ({"count": 2**32}, "count"),
        ({"base_offset": -1}, "base_offset"),
        ({"base_offset": 2**64 - 2, "count": 3}, "base_offset"),
        ({"timestamp_ms": 2**63}, "first_timestamp_ms"),
        ({"producer_id": 2**64}, "producer_id"),
        ({"producer_id": -1}, "producer_id"),
        ({"producer_epoch": 2**32}, "producer_epoch"),
        ({"first_sequence": 2**64 - 2, "count": 3}, "first_sequence"),
        ({"count": 4}, "cannot hold 4 records"),  # 3 empty records: too short for 4 heads
    ],
)
def test_seal_refuses_fields_out_of_range(arguments: dict[str, int], field: str) -> None:
    section = prepare_records([(b"", None, (), None)] * 3)
    call: dict[str, int] = {
        "base_offset": BASE,
        "timestamp_ms": STAMP_MS,
        "count": 3,
    } | arguments
    with pytest.raises(ValueError, match=field):
        seal(LOG_ID, records_section=section, **call)


def test_seal_refuses_a_log_id_that_is_not_a_u64() -> None:
    with pytest.raises(ValueError, match="u64"):
        seal(2**64, BASE, STAMP_MS, 1, prepare_records([(b"", None, (), None)]))


def test_encode_keeps_each_timestamp() -> None:
    records = [
        NewRecord(STAMP_MS, b"a"),
        NewRecord(STAMP_MS + 5, b"b", key=b"k"),
        NewRecord(STAMP_MS + 5, b"c"),
        NewRecord(STAMP_MS + 2**32 - 1, b"d"),
    ]
    buf = encode(LOG_ID, BASE, records)
    header = read_header(LOG_ID, BASE, buf)
    assert (header.first_timestamp_ms, header.last_timestamp_ms) == (STAMP_MS, STAMP_MS + 2**32 - 1)
    assert [r.timestamp_ms for r in decode(LOG_ID, BASE, buf)] == [r.timestamp_ms for r in records]


def test_encode_refuses_decreasing_timestamps_and_too_wide_a_span() -> None:
    with pytest.raises(ValueError, match="never decrease"):
        encode(LOG_ID, BASE, [NewRecord(STAMP_MS, b"a"), NewRecord(STAMP_MS - 1, b"b")])
    with pytest.raises(ValueError, match="span"):
        encode(LOG_ID, BASE, [NewRecord(0, b"a"), NewRecord(2**32, b"b")])


def test_decode_refuses_timestamp_deltas_that_leave_the_header_range() -> None:
    buf = encode(LOG_ID, BASE, [NewRecord(10, b"a"), NewRecord(20, b"b"), NewRecord(30, b"c")])
    for index, delta in ((0, 1), (1, 21), (2, 9), (2, 19)):
        damaged = bytearray(buf)
        at = _record_at(buf, index) + 4
        damaged[at : at + 4] = struct.pack(">I", delta)
        with pytest.raises(CorruptRecordError, match="timestamp delta") as caught:
            decode(LOG_ID, BASE, _recrc(damaged))
        assert caught.value.offset in (BASE + index, BASE + 2)


def test_read_header_without_crc_checks_structure_only() -> None:
    damaged = bytearray(_sealed(producer_id=5))
    damaged[27:35] = struct.pack(">Q", 6)  # producer id: a field no structure check covers
    assert read_header(LOG_ID, BASE, bytes(damaged), check_crc=False).producer_id == 6
    with pytest.raises(CorruptBatchError, match="crc32c"):
        read_header(LOG_ID, BASE, bytes(damaged))


def test_trim_drops_the_records_below_start_and_reseals_at_start() -> None:
    records = [NewRecord(STAMP_MS + i, bytes([i]) * i, idempotency_key=f"i{i}") for i in range(6)]
    buf = encode(LOG_ID, BASE, records, producer_id=9, producer_epoch=4, first_sequence=100)
    for start in range(BASE + 1, BASE + 6):
        trimmed = trim(LOG_ID, BASE, buf, start)
        assert decode(LOG_ID, start, trimmed) == decode(LOG_ID, BASE, buf, start_offset=start)
        header = read_header(LOG_ID, start, trimmed)
        assert (header.base_offset, header.last_offset) == (start, BASE + 5)
        assert header.first_timestamp_ms == STAMP_MS + start - BASE
        assert (header.producer_id, header.producer_epoch) == (9, 4)
        assert header.first_sequence == 100 + start - BASE
        with pytest.raises(CorruptBatchError):  # salted with its new base offset
            decode(LOG_ID, BASE, trimmed)
    assert trim(LOG_ID, BASE, buf, BASE) is buf
    with pytest.raises(ValueError, match="past the batch"):
        trim(LOG_ID, BASE, buf, BASE + 6)


def test_trim_never_reseals_a_damaged_batch() -> None:
    buf = _sealed()
    for at in range(len(buf)):
        damaged = bytearray(buf)
        damaged[at] ^= 0x04
        with pytest.raises(CorruptRecordError):
            trim(LOG_ID, BASE, bytes(damaged), BASE + 1)


def _random_record(rng: random.Random, timestamp_ms: int) -> NewRecord:
    def text(limit: int) -> str:
        alphabet = "az09-_\u00e9\u4e2d\U0001f600"
        return "".join(rng.choice(alphabet) for _ in range(rng.randrange(limit)))

    return NewRecord(
        timestamp_ms=timestamp_ms,
        value=rng.randbytes(rng.choice([0, 1, rng.randrange(300)])),
        key=rng.choice([None, b"", rng.randbytes(rng.randrange(1, 40))]),
        headers=tuple(
            (text(10), rng.randbytes(rng.randrange(20))) for _ in range(rng.choice([0, 0, 1, 3]))
        ),
        idempotency_key=rng.choice([None, "", text(60)]),
    )


@pytest.mark.parametrize("seed", range(60))
def test_random_batches_round_trip_and_agree_with_format_1(seed: int) -> None:
    rng = random.Random(seed)
    log_id = rng.randrange(2**64)
    base = rng.randrange(2**64 - 200)
    timestamp_ms = rng.randrange(-(2**40), 2**41)
    records = []
    for _ in range(rng.randrange(1, 60)):
        timestamp_ms += rng.choice([0, 0, 1, rng.randrange(10_000)])
        records.append(_random_record(rng, timestamp_ms))
    producer = {
        "producer_id": rng.randrange(2**64),
        "producer_epoch": rng.randrange(2**32),
        "first_sequence": rng.randrange(2**63),
    }
    buf = encode(log_id, base, records, **producer)
    decoded = decode(log_id, base, buf)
    format_1 = [
        codec.decode(log_id, base + i, codec.encode(log_id, base + i, r))
        for i, r in enumerate(records)
    ]
    fields = ("offset", "timestamp_ms", "value", "key", "headers", "idempotency_key")
    for got, want in zip(decoded, format_1, strict=True):
        assert [getattr(got, f) for f in fields] == [getattr(want, f) for f in fields], seed
    header = read_header(log_id, base, buf)
    assert (header.producer_id, header.producer_epoch, header.first_sequence) == tuple(
        producer.values()
    ), seed
    # The leader's path (one stamp for the batch) gives the same records under that stamp.
    stamp_ms = records[-1].timestamp_ms
    section = prepare_records([(r.value, r.key, r.headers, r.idempotency_key) for r in records])
    sealed = seal(log_id, base, stamp_ms, len(records), section, **producer)
    assert [_fields(r) for r in decode(log_id, base, sealed)] == [
        (r.value, r.key, r.headers, r.idempotency_key) for r in records
    ], seed
    start = base + rng.randrange(len(records))
    assert decode(log_id, start, trim(log_id, base, buf, start)) == decoded[start - base :], seed


def test_max_records_stops_decoding_after_that_many() -> None:
    records = [NewRecord(1_000 + i, b"v%d" % i, key=b"k") for i in range(10)]
    stored = encode(7, 100, records)
    got = decode(7, 100, stored, 103, max_records=2)
    assert [(r.offset, r.value) for r in got] == [(103, b"v3"), (104, b"v4")]
    assert [r.offset for r in decode(7, 100, stored, 108, max_records=5)] == [
        108,
        109,
    ]
    # The crc still covers the records the call did not walk.
    damaged = bytearray(stored)
    damaged[-1] ^= 1
    with pytest.raises(CorruptRecordError):
        decode(7, 100, bytes(damaged), 100, max_records=1)
