"""Frames: many proposals in one Raft log entry.

Proposals that arrive together are coalesced into one entry so that the entry rate (and with it
the fsync and message rate) stays low while the proposal rate is high. Each proposal keeps its own
result: the state machine sees one ``Entry`` per proposal with a *sub-index*
``(log_index << SUB_BITS) | position``, increasing within and across entries, so its "skip what
is already applied" rule works unchanged on replay.

Wire format of a frame: u32 count, then per proposal u32 length + bytes (big endian).
"""

from __future__ import annotations

import struct
from collections.abc import Sequence

SUB_BITS = 16
PROPOSALS_PER_FRAME_MAX = 1 << 12  # well below 1 << SUB_BITS

_U32 = struct.Struct(">I")


class FrameError(Exception):
    pass


def encode(payloads: Sequence[bytes]) -> bytes:
    """>>> decode(encode([b"a", b"", b"bc"]))
    [b'a', b'', b'bc']
    """
    assert 1 <= len(payloads) <= PROPOSALS_PER_FRAME_MAX, len(payloads)
    parts = [_U32.pack(len(payloads))]
    for p in payloads:
        parts.append(_U32.pack(len(p)))
        parts.append(p)
    return b"".join(parts)


def decode(frame: bytes) -> list[bytes]:
    view = memoryview(frame)
    if len(view) < 4:
        raise FrameError("frame shorter than its header")
    (count,) = _U32.unpack_from(view, 0)
    if not 1 <= count <= PROPOSALS_PER_FRAME_MAX:
        raise FrameError(f"frame claims {count} proposals")
    pos = 4
    out: list[bytes] = []
    for _ in range(count):
        if pos + 4 > len(view):
            raise FrameError("frame truncated")
        (n,) = _U32.unpack_from(view, pos)
        pos += 4
        if pos + n > len(view):
            raise FrameError("frame truncated")
        out.append(bytes(view[pos : pos + n]))
        pos += n
    if pos != len(view):
        raise FrameError("trailing bytes after the frame")
    return out


def encoded_size(payload_bytes: int, count: int) -> int:
    return 4 + 4 * count + payload_bytes


def sub_index(log_index: int, position: int) -> int:
    """The state machine's index of proposal ``position`` of the entry at ``log_index``.

    >>> sub_index(7, 0) < sub_index(7, 1) < sub_index(8, 0)
    True
    """
    assert 0 <= position < PROPOSALS_PER_FRAME_MAX
    return (log_index << SUB_BITS) | position


def log_index_of(sub: int) -> int:
    """>>> log_index_of(sub_index(7, 3))
    7
    """
    return sub >> SUB_BITS
