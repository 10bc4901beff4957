"""The frames between a node's front end and its shard process.

Every frame is ``u32 length | u8 kind | u32 call_id | payload`` (little-endian; ``length``
counts what follows it). A call is a CALL, then MESSAGE frames either way, then the front end's
HALF_CLOSE (a client stream ended) or CANCEL, and the shard's END (status, trailers and, for
a unary answer, its body). CREDIT grants the other side more MESSAGE frames of a stream: a slow
reader bounds what waits for it. HEALTH (call 0) carries the shard process's serving status of
each gRPC service to the front end's health service. With several shard processes, QUEUES
(call 0) tells the front end the queues of a shard process's shards and ROUTES passes that on
to the others (``siblings``), and the front end, which then serves the metrics port, asks
each for its metrics (METRICS_ASK, answered by METRICS).

Bodies are the gRPC messages' own bytes: neither side opens them on the way through.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from enum import IntEnum

HEADER = struct.Struct("<IBI")  # length (after itself), kind, call id
_U16 = struct.Struct("<H")
_U32 = struct.Struct("<I")
_CALL = struct.Struct("<IB")  # timeout in ms (NO_TIMEOUT: none), shape
_END = struct.Struct("<BI")  # status code, length of details
NO_TIMEOUT = 0xFFFFFFFF
METADATA_ITEMS_MAX = 256
METHOD_BYTES_MAX = 512
# Room in a frame beyond its message for the call's header and metadata.
FRAME_METADATA_BYTES_MAX = 1024 * 1024


class Kind(IntEnum):
    CALL = 1
    MESSAGE = 2
    HALF_CLOSE = 3
    CREDIT = 4
    END = 5
    CANCEL = 6
    HEALTH = 7
    QUEUES = 8  # a shard process's queues, by shard (call 0; siblings.encode_report)
    ROUTES = 9  # another shard process's QUEUES, passed on by the front end (call 0)
    METRICS_ASK = 10  # the front end asks for the shard process's metrics (call: the ask's id)
    METRICS = 11  # the answer: the Prometheus text exposition of the shard process's metrics


class Shape(IntEnum):
    UNARY_UNARY = 0
    UNARY_STREAM = 1
    STREAM_STREAM = 2
    STREAM_UNARY = 3

    @property
    def request_streams(self) -> bool:
        return self in (Shape.STREAM_STREAM, Shape.STREAM_UNARY)

    @property
    def response_streams(self) -> bool:
        return self in (Shape.UNARY_STREAM, Shape.STREAM_STREAM)


Metadata = tuple[tuple[str, "str | bytes"], ...]


class FrameError(ValueError):
    """A frame that does not decode: the channel is closed (the other side is not FluxMQ's)."""


@dataclass(frozen=True, slots=True)
class Call:
    method: str
    timeout_ms: int | None
    shape: Shape
    metadata: Metadata
    body: bytes  # the request of a unary-request call; empty for a streamed request


@dataclass(frozen=True, slots=True)
class End:
    code: int  # grpc.StatusCode's number; 0 is OK
    details: str
    trailers: Metadata
    body: bytes | None  # a unary answer's response (None: none, as on an error)


def frame(kind: Kind, call_id: int, payload: bytes = b"") -> bytes:
    return HEADER.pack(len(payload) + 5, kind, call_id) + payload


def _frame_of(kind: Kind, call_id: int, parts: tuple[bytes, ...]) -> bytes:
    """A frame whose payload is ``parts`` joined: one copy of a large body, not two."""
    return b"".join(_frame_parts(kind, call_id, parts))


def _frame_parts(kind: Kind, call_id: int, parts: tuple[bytes, ...]) -> tuple[bytes, ...]:
    length = sum(len(p) for p in parts) + 5
    return (HEADER.pack(length, kind, call_id), *parts)


def encode_metadata(metadata: Metadata) -> bytes:
    if len(metadata) > METADATA_ITEMS_MAX:
        raise FrameError(f"{len(metadata)} metadata items, at most {METADATA_ITEMS_MAX}")
    parts = [_U16.pack(len(metadata))]
    for key, value in metadata:
        k = key.encode("ascii")
        is_bytes = isinstance(value, bytes)
        v = value if isinstance(value, bytes) else value.encode("utf-8")
        parts += [_U16.pack(len(k)), k, bytes((1 if is_bytes else 0,)), _U32.pack(len(v)), v]
    return b"".join(parts)


def decode_metadata(data: memoryview, at: int) -> tuple[Metadata, int]:
    """-> (metadata, offset after it)."""
    (count,) = _take(_U16, data, at)
    at += 2
    if count > METADATA_ITEMS_MAX:
        raise FrameError(f"{count} metadata items, at most {METADATA_ITEMS_MAX}")
    out: list[tuple[str, str | bytes]] = []
    for _ in range(count):
        (key_len,) = _take(_U16, data, at)
        at += 2
        key = _bytes(data, at, key_len)
        at += key_len
        if at + 5 > len(data):
            raise FrameError("metadata item cut short")
        is_bytes = data[at]
        (value_len,) = _take(_U32, data, at + 1)
        at += 5
        value = _bytes(data, at, value_len)
        at += value_len
        try:
            name = key.decode("ascii")
            out.append((name, value if is_bytes else value.decode("utf-8")))
        except UnicodeDecodeError as err:
            raise FrameError(f"metadata item not text: {err}") from None
    return tuple(out), at


def encode_call(call_id: int, call: Call) -> bytes:
    method = call.method.encode("ascii")
    if len(method) > METHOD_BYTES_MAX:
        raise FrameError(f"method name of {len(method)} bytes, at most {METHOD_BYTES_MAX}")
    timeout = (
        NO_TIMEOUT if call.timeout_ms is None else min(max(call.timeout_ms, 0), NO_TIMEOUT - 1)
    )
    parts = (
        _U16.pack(len(method)),
        method,
        _CALL.pack(timeout, call.shape),
        encode_metadata(call.metadata),
        call.body,
    )
    return _frame_of(Kind.CALL, call_id, parts)


def decode_call(payload: memoryview) -> Call:
    (method_len,) = _take(_U16, payload, 0)
    if method_len > METHOD_BYTES_MAX:
        raise FrameError(f"method name of {method_len} bytes, at most {METHOD_BYTES_MAX}")
    method = _bytes(payload, 2, method_len)
    at = 2 + method_len
    timeout, shape = _take(_CALL, payload, at)
    at += _CALL.size
    try:
        shape_value = Shape(shape)
        name = method.decode("ascii")
    except (ValueError, UnicodeDecodeError) as err:
        raise FrameError(f"bad call header: {err}") from None
    metadata, at = decode_metadata(payload, at)
    return Call(
        name, None if timeout == NO_TIMEOUT else timeout, shape_value, metadata, bytes(payload[at:])
    )


def encode_end(call_id: int, end: End) -> bytes:
    return b"".join(end_parts(call_id, end))


def end_parts(call_id: int, end: End) -> tuple[bytes, ...]:
    """The END frame in pieces, for a gathering write that copies a large answer no more."""
    details = end.details.encode("utf-8")
    body = b"" if end.body is None else end.body
    parts = (
        _END.pack(end.code, len(details)),
        details,
        encode_metadata(end.trailers),
        b"\x00" if end.body is None else b"\x01",
        body,
    )
    return _frame_parts(Kind.END, call_id, parts)


def decode_end(payload: memoryview) -> End:
    code, details_len = _take(_END, payload, 0)
    at = _END.size
    details = _bytes(payload, at, details_len)
    at += details_len
    trailers, at = decode_metadata(payload, at)
    if at >= len(payload):
        raise FrameError("end frame cut short")
    has_body = payload[at]
    if has_body not in (0, 1) or code > 16:
        raise FrameError(f"bad end frame (code {code}, body flag {has_body})")
    try:
        text = details.decode("utf-8")
    except UnicodeDecodeError as err:
        raise FrameError(f"end details not text: {err}") from None
    return End(code, text, trailers, bytes(payload[at + 1 :]) if has_body else None)


def encode_credit(call_id: int, count: int) -> bytes:
    return frame(Kind.CREDIT, call_id, _U32.pack(count))


def decode_credit(payload: memoryview) -> int:
    if len(payload) != 4:
        raise FrameError(f"credit frame of {len(payload)} bytes, not 4")
    return int(_U32.unpack(payload)[0])


def _take(layout: struct.Struct, data: memoryview, at: int) -> tuple[int, ...]:
    if at + layout.size > len(data):
        raise FrameError("frame cut short")
    return layout.unpack_from(data, at)


def _bytes(data: memoryview, at: int, length: int) -> bytes:
    if at + length > len(data):
        raise FrameError("frame cut short")
    return bytes(data[at : at + length])


class FrameReader:
    """Cuts a byte stream into frames: ``feed`` bytes, get (kind, call id, payload) back.
    A frame longer than ``frame_bytes_max`` or of an unknown kind is a FrameError."""

    def __init__(self, frame_bytes_max: int) -> None:
        self._buffer = bytearray()
        self._frame_bytes_max = frame_bytes_max

    def feed(self, data: bytes) -> list[tuple[Kind, int, memoryview]]:
        """Payloads are views of the bytes fed (never of a buffer that changes): whoever
        keeps one past the call copies it, as ``decode_end`` and the relays do."""
        if self._buffer:
            self._buffer += data
            if self._first_incomplete():
                return []  # a large frame arriving in pieces is copied once, when whole
            data = bytes(self._buffer)
            self._buffer.clear()
        out = []
        at = 0
        view = memoryview(data)
        while len(data) - at >= 4:
            length = self._length_at(data, at)
            if len(data) - at - 4 < length:
                break
            _, kind, call_id = HEADER.unpack_from(data, at)
            try:
                kind_value = Kind(kind)
            except ValueError:
                raise FrameError(f"unknown frame kind {kind}") from None
            out.append((kind_value, call_id, view[at + 9 : at + 4 + length]))
            at += 4 + length
        if at < len(data):
            self._buffer += view[at:]
        return out

    def _first_incomplete(self) -> bool:
        buffer = self._buffer
        return len(buffer) < 4 or len(buffer) - 4 < self._length_at(buffer, 0)

    def _length_at(self, data: bytes | bytearray, at: int) -> int:
        """The length field of the frame at ``at``, checked before anything waits for it."""
        length: int = _U32.unpack_from(data, at)[0]
        if length < 5 or length > self._frame_bytes_max:
            raise FrameError(f"frame of {length} bytes (5..{self._frame_bytes_max})")
        return length
