"""A record-batch codec written from ``proto/fluxmq/v1/RECORD_BATCH.md`` alone, for the audit's
fault injector: damage made with it does not go through the project's encoder or decoder
(``storage.record_batch``, ``fluxmq.client.record_batches``), so a bug shared by the broker's
codec and the audit's reading of it cannot hide a fault the tests inject.

Its own crc32c (Castagnoli, table-driven, as the spec names it) keeps it independent of the
``crc32c`` package too. ``test_spec_codec_reads_and_writes_the_shared_vector`` pins it to the
shared test vector, so it writes what the spec says, not what it happens to agree with.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field

HEADER = struct.Struct(">IBHIqqQIQI")  # crc, format, attributes, count, ts first/last, producer
RECORD_HEAD = struct.Struct(">IIIIHH")
NAME_LEN = struct.Struct(">H")
VALUE_LEN = struct.Struct(">I")
NO_KEY = 0xFFFFFFFF
NO_IDEMPOTENCY_KEY = 0xFFFF
FORMAT = 2
META = struct.Struct(">QQQ")  # a log's metadata entry: low, high, size_bytes; then its crc32c


def _table() -> list[int]:
    poly = 0x82F63B78  # Castagnoli, reflected
    out = []
    for n in range(256):
        c = n
        for _ in range(8):
            c = (c >> 1) ^ poly if c & 1 else c >> 1
        out.append(c)
    return out


_CRC_TABLE = _table()


def crc32c(data: bytes, crc: int = 0) -> int:
    """crc32c of ``data``, continuing from ``crc`` (a previous result) when given."""
    c = crc ^ 0xFFFFFFFF
    table = _CRC_TABLE
    for b in data:
        c = table[(c ^ b) & 0xFF] ^ (c >> 8)
    return c ^ 0xFFFFFFFF


def salt(log_id: int, base_offset: int) -> bytes:
    return struct.pack(">QQ", log_id, base_offset)


@dataclass
class SpecRecord:
    timestamp_ms: int
    value: bytes
    key: bytes | None = None
    headers: list[tuple[str, bytes]] = field(default_factory=list)
    idempotency_key: str | None = None


@dataclass
class SpecBatch:
    base_offset: int
    records: list[SpecRecord]
    producer_id: int = 0
    producer_epoch: int = 0
    first_sequence: int = 0
    attributes: int = 0

    @property
    def last_offset(self) -> int:
        return self.base_offset + len(self.records) - 1


def encode_records(records: list[SpecRecord], first_timestamp_ms: int) -> bytes:
    """The records section of a batch (also what ``PublishRequest.encoded.records`` carries)."""
    out = bytearray()
    for i, r in enumerate(records):
        idem = r.idempotency_key.encode() if r.idempotency_key is not None else b""
        out += RECORD_HEAD.pack(
            i,
            r.timestamp_ms - first_timestamp_ms,
            NO_KEY if r.key is None else len(r.key),
            len(r.value),
            len(r.headers),
            NO_IDEMPOTENCY_KEY if r.idempotency_key is None else len(idem),
        )
        out += (r.key or b"") + r.value
        for name, value in r.headers:
            raw = name.encode()
            out += NAME_LEN.pack(len(raw)) + VALUE_LEN.pack(len(value)) + raw + value
        out += idem
    return bytes(out)


def encode(log_id: int, batch: SpecBatch) -> bytes:
    """The stored bytes of ``batch`` in log ``log_id``, sealed with its crc32c."""
    first = batch.records[0].timestamp_ms
    section = encode_records(batch.records, first)
    head = HEADER.pack(
        0,
        FORMAT,
        batch.attributes,
        len(batch.records),
        first,
        batch.records[-1].timestamp_ms,
        batch.producer_id,
        batch.producer_epoch,
        batch.first_sequence,
        len(section),
    )
    body = head[4:] + section
    return struct.pack(">I", crc32c(body, crc32c(salt(log_id, batch.base_offset)))) + body


class SpecDecodeError(ValueError):
    pass


def decode(log_id: int, base_offset: int, data: bytes, check_crc: bool = True) -> SpecBatch:
    if len(data) < HEADER.size:
        raise SpecDecodeError(f"{len(data)} bytes: shorter than a batch header")
    crc, fmt, attributes, count, ts_first, _ts_last, pid, epoch, first_seq, section_len = (
        HEADER.unpack_from(data)
    )
    if check_crc and crc32c(data[4:], crc32c(salt(log_id, base_offset))) != crc:
        raise SpecDecodeError("crc32c mismatch")
    if fmt != FORMAT:
        raise SpecDecodeError(f"format {fmt}")
    at = HEADER.size
    if at + section_len != len(data):
        raise SpecDecodeError("records_bytes does not fill the batch")
    records = []
    for i in range(count):
        delta, ts_delta, key_len, value_len, n_headers, idem_len = RECORD_HEAD.unpack_from(data, at)
        if delta != i:
            raise SpecDecodeError(f"record {i} has offset_delta {delta}")
        at += RECORD_HEAD.size
        key = None
        if key_len != NO_KEY:
            key, at = data[at : at + key_len], at + key_len
        value, at = data[at : at + value_len], at + value_len
        headers = []
        for _ in range(n_headers):
            name_len = NAME_LEN.unpack_from(data, at)[0]
            hv_len = VALUE_LEN.unpack_from(data, at + NAME_LEN.size)[0]
            at += NAME_LEN.size + VALUE_LEN.size
            name = data[at : at + name_len].decode()
            at += name_len
            headers.append((name, data[at : at + hv_len]))
            at += hv_len
        idem = None
        if idem_len != NO_IDEMPOTENCY_KEY:
            idem, at = data[at : at + idem_len].decode(), at + idem_len
        records.append(SpecRecord(ts_first + ts_delta, value, key, headers, idem))
    if at != len(data):
        raise SpecDecodeError("bytes left over after the last record")
    return SpecBatch(base_offset, records, pid, epoch, first_seq, attributes)


def encode_meta(log_id: int, low: int, high: int, size_bytes: int) -> bytes:
    """A log's metadata entry (``logmeta`` database, key u64 log_id): the three numbers and a
    crc32c over them seeded with the crc32c of the key."""
    fields = META.pack(low, high, size_bytes)
    return fields + struct.pack(">I", crc32c(fields, crc32c(struct.pack(">Q", log_id))))


def decode_meta(log_id: int, raw: bytes) -> tuple[int, int, int]:
    fields = raw[: META.size]
    if struct.unpack_from(">I", raw, META.size)[0] != crc32c(
        fields, crc32c(struct.pack(">Q", log_id))
    ):
        raise SpecDecodeError(f"metadata of log {log_id} fails its crc32c")
    low, high, size = META.unpack(fields)
    return low, high, size
