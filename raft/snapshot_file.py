"""The snapshot ("full dump") file of a shard: what replaces a compacted log prefix and what a
lagging or new replica receives, in chunks, instead of the entries it missed.

Layout: MAGIC, u32 header length, a JSON header, the commands of the last two log entries the
snapshot covers (pysyncobj keeps them as the new start of the log), then the state machine's
consistent copy (for the queue broker: an LMDB file). Never a pickle of the state; the state is
streamed from and to disk in chunks, never held in memory whole.
"""

from __future__ import annotations

import json
import os
import shutil
import struct
from dataclasses import dataclass

MAGIC = b"FXSNAP1\n"
_U32 = struct.Struct(">I")
CHUNK_BYTES = 1 << 20
HEADER_BYTES_MAX = 1 << 20

Item = tuple[bytes, int, int]  # (command, index, term)


class SnapshotFileError(Exception):
    pass


@dataclass(frozen=True, slots=True)
class SnapshotInfo:
    last: Item  # the last entry the snapshot covers
    prev: Item  # the one before it
    members: tuple[str, ...]
    state_offset: int
    state_bytes: int

    @property
    def index(self) -> int:
        return self.last[1]


def fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write(path: str, last: Item, prev: Item, members: list[str], state_path: str) -> None:
    """Write the snapshot to ``path`` from the state copy at ``state_path``, and fsync it."""
    state_bytes = os.path.getsize(state_path)
    header = json.dumps(
        {
            "last": [last[1], last[2], len(last[0])],
            "prev": [prev[1], prev[2], len(prev[0])],
            "members": sorted(members),
            "state_bytes": state_bytes,
        }
    ).encode()
    with open(path, "wb") as out:
        out.write(MAGIC + _U32.pack(len(header)) + header)
        out.write(last[0])
        out.write(prev[0])
        with open(state_path, "rb") as src:
            shutil.copyfileobj(src, out, CHUNK_BYTES)
        out.flush()
        os.fsync(out.fileno())


def read_info(path: str) -> SnapshotInfo:
    """Parse and check the header; the state part stays on disk."""
    try:
        size = os.path.getsize(path)
        with open(path, "rb") as f:
            if f.read(len(MAGIC)) != MAGIC:
                raise SnapshotFileError(f"{path!r} is not a FluxMQ snapshot")
            (n,) = _U32.unpack(f.read(4))
            if n > HEADER_BYTES_MAX:
                raise SnapshotFileError(f"{path!r}: header of {n} bytes")
            header = json.loads(f.read(n))
            (li, lt, ln), (pi, pt, pn) = header["last"], header["prev"]
            last = (f.read(ln), int(li), int(lt))
            prev = (f.read(pn), int(pi), int(pt))
            offset = f.tell()
    except (OSError, ValueError, KeyError, struct.error) as e:
        raise SnapshotFileError(f"cannot read the snapshot {path!r}: {e}") from e
    state_bytes = int(header["state_bytes"])
    # Assert right after reading: the file holds exactly what the header announces.
    if len(last[0]) != ln or len(prev[0]) != pn or offset + state_bytes != size:
        raise SnapshotFileError(f"{path!r} is truncated or has trailing bytes")
    if prev[1] + 1 != last[1]:
        raise SnapshotFileError(f"{path!r}: entries {prev[1]} and {last[1]} do not follow")
    return SnapshotInfo(last, prev, tuple(header["members"]), offset, state_bytes)


def extract_state(path: str, info: SnapshotInfo, out_path: str) -> None:
    """Copy the state part of the snapshot to ``out_path`` (streamed)."""
    with open(path, "rb") as src, open(out_path, "wb") as out:
        src.seek(info.state_offset)
        left = info.state_bytes
        while left:
            chunk = src.read(min(CHUNK_BYTES, left))
            if not chunk:
                raise SnapshotFileError(f"{path!r} ended early")
            out.write(chunk)
            left -= len(chunk)
        out.flush()
        os.fsync(out.fileno())
