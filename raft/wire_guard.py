"""Limits on what a Raft connection may cost this node before (and after) it authenticates.

Anyone who can reach the Raft port can open connections and send bytes; only holders of the
cluster secret can complete the handshake. So an unauthenticated connection must cost little
and briefly: its declared frame size is checked against a small cap before anything is buffered
beyond one read, it must finish the handshake within ``connect_timeout_ms``, and at most
``handshakes_pending_max`` such connections exist at once (extra ones are closed on accept).
Once authenticated, a peer's frames are capped by the largest message a legitimate replica
sends. Every connection reads at most ``read_bytes_per_event_max`` per readiness event, so one
sender cannot hold the driver thread that serves every shard.

Nothing here knows pysyncobj or sockets: raft/wire_transport.py applies these rules to FluxMQ's
own wire (raft/wire.py). Time is an input (``now_s``), so the rules are tested without sleeping.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Generic, TypeVar

# raft/wire.py's length prefix: a signed 32-bit little-endian int. Fixed byte order (not
# native), so replicas on different architectures read each other's frames.
_LENGTH = struct.Struct("<i")
LENGTH_BYTES = _LENGTH.size
FRAME_BYTES_LIMIT = 0x7FFFFFFF  # what the signed 32-bit prefix can declare

# Every handshake frame of raft/wire.py is under 600 bytes (a HELLO with the longest node id),
# and the first frame of a node on pysyncobj's old wire (a Fernet token) a few hundred, which
# must fit to be recognised and refused with a clear line; this leaves ample room and still
# costs little.
HANDSHAKE_FRAME_BYTES_MAX = 4 << 10
HANDSHAKES_PENDING_MAX = 64
READ_BYTES_PER_EVENT_MAX = 2 << 20

# From a message's payload to its bytes on the wire (raft/wire.py: pickled, then a 6-byte
# header and a 32-byte MAC; nothing compressed or base64'd), worst case. Pickling adds up to
# ~25 bytes per entry, so a batch of 8-byte entries (the smallest raft/frames.py writes) more
# than triples (measured: x3.6); one large entry or a snapshot chunk grows by a few bytes only
# (measured: +301 bytes on 4 MiB), so BLOB_EXPANSION_MAX is headroom, not a measurement.
# tests/raft/test_wire_guard.py seals the worst legitimate messages and checks they fit.
BATCH_EXPANSION_MAX = 8
BLOB_EXPANSION_MAX = 2
WIRE_OVERHEAD_BYTES = 64 << 10


class FrameTooLargeError(Exception):
    """A frame declared more bytes than allowed (or a negative size)."""

    def __init__(self, declared_bytes: int, limit_bytes: int) -> None:
        super().__init__(f"a frame of {declared_bytes} bytes exceeds the limit of {limit_bytes}")
        self.declared_bytes = declared_bytes
        self.limit_bytes = limit_bytes


def wire_frame_bytes_max(
    *, batch_bytes: int, entry_bytes_max: int, snapshot_chunk_bytes: int
) -> int:
    """The largest frame a legitimate replica sends, on the wire.

    pysyncobj packs entries into an append-entries message until their bytes reach
    ``batch_bytes``: entries of less than ``batch_bytes`` in all (possibly many tiny ones), then
    one more of up to ``entry_bytes_max``. A snapshot travels in chunks of
    ``snapshot_chunk_bytes``."""
    append_bytes = BATCH_EXPANSION_MAX * batch_bytes + BLOB_EXPANSION_MAX * entry_bytes_max
    chunk_bytes = BLOB_EXPANSION_MAX * snapshot_chunk_bytes
    return min(FRAME_BYTES_LIMIT, max(append_bytes, chunk_bytes) + WIRE_OVERHEAD_BYTES)


@dataclass(frozen=True, slots=True)
class WireLimits:
    frame_bytes_max: int  # after the handshake: the largest legitimate message, on the wire
    connect_timeout_ms: int  # from accept to a completed handshake
    handshake_frame_bytes_max: int = HANDSHAKE_FRAME_BYTES_MAX
    handshakes_pending_max: int = HANDSHAKES_PENDING_MAX
    read_bytes_per_event_max: int = READ_BYTES_PER_EVENT_MAX

    def __post_init__(self) -> None:
        if not 0 < self.handshake_frame_bytes_max <= self.frame_bytes_max:
            raise ValueError("handshake_frame_bytes_max must be in 1..frame_bytes_max")
        if self.frame_bytes_max > FRAME_BYTES_LIMIT:
            raise ValueError("frame_bytes_max does not fit the 31-bit length prefix")
        if self.connect_timeout_ms <= 0 or self.handshakes_pending_max <= 0:
            raise ValueError("connect_timeout_ms and handshakes_pending_max must be positive")
        if self.read_bytes_per_event_max <= 0:
            raise ValueError("read_bytes_per_event_max must be positive")


class FrameReader:
    """Length-prefixed frames out of a byte stream, in a bytearray (appending and consuming
    from the front are amortised O(1), where ``bytes +=`` copies the whole buffer each time).

    The size a frame declares is checked as soon as its prefix is here: a frame over
    ``frame_bytes_max`` raises ``FrameTooLargeError`` before any of its body is waited for, so
    a reader that reads at most ``bytes_wanted()`` (or one bounded chunk) never holds more than
    about one frame."""

    def __init__(self, frame_bytes_max: int) -> None:
        assert 0 <= frame_bytes_max <= FRAME_BYTES_LIMIT
        self.frame_bytes_max = frame_bytes_max  # raised when a connection authenticates
        self._buffer = bytearray()

    def __len__(self) -> int:
        return len(self._buffer)

    def clear(self) -> None:
        self._buffer = bytearray()

    def feed(self, data: bytes) -> None:
        self._buffer += data

    def bytes_wanted(self) -> int:
        """Bytes still missing from the frame in progress (0: a whole frame is buffered)."""
        if len(self._buffer) < LENGTH_BYTES:
            return LENGTH_BYTES - len(self._buffer)
        return max(0, LENGTH_BYTES + self._declared_bytes() - len(self._buffer))

    def next_frame(self) -> bytes | None:
        """The next complete frame's body, or None until it has arrived."""
        if len(self._buffer) < LENGTH_BYTES:
            return None
        size = self._declared_bytes()
        end = LENGTH_BYTES + size
        if len(self._buffer) < end:
            return None
        with memoryview(self._buffer) as view:
            frame = view[LENGTH_BYTES:end].tobytes()
        del self._buffer[:end]
        return frame

    def _declared_bytes(self) -> int:
        (size,) = _LENGTH.unpack_from(self._buffer, 0)
        if not 0 <= size <= self.frame_bytes_max:
            raise FrameTooLargeError(size, self.frame_bytes_max)
        return int(size)


def encode_frame(body: bytes) -> bytes:
    return _LENGTH.pack(len(body)) + body


C = TypeVar("C")


class PendingHandshakes(Generic[C]):
    """Connections accepted and not yet authenticated, each with its deadline.

    ``admit`` refuses once ``limit`` are pending; ``expired`` hands back (and forgets) those
    past their deadline, oldest first."""

    def __init__(self, limit: int, timeout_ms: int) -> None:
        assert limit > 0 and timeout_ms > 0
        self.limit = limit
        self.timeout_s = timeout_ms / 1000
        self._deadlines: dict[C, float] = {}  # insertion order = deadline order

    def __len__(self) -> int:
        return len(self._deadlines)

    def __contains__(self, conn: object) -> bool:
        return conn in self._deadlines

    def admit(self, conn: C, now_s: float) -> bool:
        if len(self._deadlines) >= self.limit:
            return False
        self._deadlines[conn] = now_s + self.timeout_s
        return True

    def done(self, conn: C) -> None:
        self._deadlines.pop(conn, None)

    def next_deadline_s(self) -> float:
        """The earliest deadline (inf when none is pending)."""
        for deadline in self._deadlines.values():
            return deadline  # insertion order is deadline order
        return float("inf")

    def expired(self, now_s: float) -> list[C]:
        out: list[C] = []
        for conn, deadline in self._deadlines.items():
            if deadline > now_s:
                break  # deadlines grow with admission time
            out.append(conn)
        for conn in out:
            del self._deadlines[conn]
        return out
