"""The Raft port's frame reader and handshake table (raft/wire_guard.py), without sockets:
a declared size over the cap is refused from its 4-byte prefix, partial frames assemble,
buffering is linear, and the cap derived for a shard holds its largest legitimate message."""

from __future__ import annotations

import os
import random
import struct
import time

import pytest

from raft import wire
from raft.pysyncobj_shard import ShardConfig
from raft.wire_guard import (
    HANDSHAKE_FRAME_BYTES_MAX,
    LENGTH_BYTES,
    FrameReader,
    FrameTooLargeError,
    PendingHandshakes,
    WireLimits,
    encode_frame,
)
from tests.raft.ticked_node import old_wire_frame


def test_a_declared_size_over_the_cap_is_refused_from_the_length_prefix_alone() -> None:
    reader = FrameReader(frame_bytes_max=1 << 20)
    reader.feed(struct.pack("<i", 0x7FFFFFFF))
    with pytest.raises(FrameTooLargeError) as caught:
        reader.bytes_wanted()
    assert caught.value.declared_bytes == 0x7FFFFFFF and caught.value.limit_bytes == 1 << 20
    with pytest.raises(FrameTooLargeError):
        reader.next_frame()
    assert len(reader) == 4  # nothing of the body was waited for


def test_a_negative_declared_size_is_refused() -> None:
    reader = FrameReader(frame_bytes_max=1 << 20)
    reader.feed(struct.pack("<i", -1) + b"x")
    with pytest.raises(FrameTooLargeError):
        reader.next_frame()


def test_a_frame_exactly_at_the_cap_is_accepted() -> None:
    reader = FrameReader(frame_bytes_max=100)
    reader.feed(encode_frame(b"a" * 100))
    assert reader.next_frame() == b"a" * 100 and len(reader) == 0


def test_partial_frames_assemble_across_reads_and_say_what_they_still_need() -> None:
    reader = FrameReader(frame_bytes_max=1024)
    wire = encode_frame(b"hello") + encode_frame(b"") + encode_frame(b"world!")
    assert reader.bytes_wanted() == 4
    got: list[bytes] = []
    for i, byte in enumerate(wire):
        reader.feed(bytes([byte]))
        if i == 1:
            assert reader.bytes_wanted() == 2  # the rest of the prefix
        if i == 3:
            assert reader.bytes_wanted() == 5  # the body it declares
        while (frame := reader.next_frame()) is not None:
            got.append(frame)
    assert got == [b"hello", b"", b"world!"]
    assert len(reader) == 0 and reader.bytes_wanted() == 4


def test_the_cap_applies_to_each_frame_when_it_becomes_the_next() -> None:
    reader = FrameReader(frame_bytes_max=16)
    reader.feed(encode_frame(b"small") + encode_frame(b"x" * 64))
    assert reader.next_frame() == b"small"
    with pytest.raises(FrameTooLargeError):
        reader.next_frame()
    reader.frame_bytes_max = 64  # raised once the peer authenticated
    assert reader.next_frame() == b"x" * 64


def test_buffering_a_large_frame_in_small_reads_is_linear() -> None:
    """``bytes +=`` copies the whole buffer per read: 32 MiB in 4 KiB reads would copy ~128 GB
    and take minutes. A bytearray takes milliseconds; the bound leaves room for a busy box."""
    reader = FrameReader(frame_bytes_max=64 << 20)
    body_bytes = 32 << 20
    reader.feed(struct.pack("<i", body_bytes))
    chunk = os.urandom(4096)
    start = time.monotonic()
    for _ in range(body_bytes // len(chunk)):
        reader.feed(chunk)
    frame = reader.next_frame()
    assert time.monotonic() - start < 5.0
    assert frame is not None and len(frame) == body_bytes


def test_consuming_many_small_frames_from_one_buffer_is_linear() -> None:
    reader = FrameReader(frame_bytes_max=64)
    count = 200_000
    reader.feed(encode_frame(b"0123456789") * count)
    start = time.monotonic()
    n = 0
    while reader.next_frame() is not None:
        n += 1
    assert n == count and time.monotonic() - start < 5.0


def test_pending_handshakes_refuse_beyond_the_limit_and_free_a_place_when_one_is_done() -> None:
    pending: PendingHandshakes[str] = PendingHandshakes(limit=2, timeout_ms=1000)
    assert pending.admit("a", 0.0) and pending.admit("b", 0.0)
    assert not pending.admit("c", 0.0)
    pending.done("a")
    assert pending.admit("c", 0.0) and len(pending) == 2


def test_pending_handshakes_expire_at_connect_timeout_oldest_first() -> None:
    pending: PendingHandshakes[str] = PendingHandshakes(limit=8, timeout_ms=1500)
    pending.admit("a", 10.0)
    pending.admit("b", 11.0)
    assert pending.expired(11.49) == []
    assert pending.expired(11.5) == ["a"]
    assert pending.expired(20.0) == ["b"]
    assert len(pending) == 0 and pending.expired(30.0) == []


def test_limits_reject_a_handshake_cap_above_the_frame_cap() -> None:
    with pytest.raises(ValueError):
        WireLimits(frame_bytes_max=1024, connect_timeout_ms=1000, handshake_frame_bytes_max=2048)


def _wire_bytes(message: object) -> int:
    """The size ``message`` declares on the wire (what follows the length prefix, as the
    frame cap counts it), sealed as raft/wire.py sends it after the handshake."""
    session = wire.Session(send_key=os.urandom(32), recv_key=os.urandom(32))
    return len(session.seal(message)) - LENGTH_BYTES


def test_the_frame_reader_reads_the_wires_length_prefix() -> None:
    """raft/wire.py writes the prefix; the reader that enforces the caps must read it the same
    way (little-endian, on every architecture)."""
    sealed = wire.Session(send_key=b"k" * 32, recv_key=b"k" * 32).seal({"term": 1})
    reader = FrameReader(frame_bytes_max=1 << 10)
    reader.feed(sealed + wire.frame(wire.KIND_PROOF, b"p" * 32))
    first = reader.next_frame()
    assert first is not None and len(first) == len(sealed) - LENGTH_BYTES
    assert wire.split(first)[0] == wire.KIND_MESSAGE
    second = reader.next_frame()
    assert second is not None and wire.split(second) == (wire.KIND_PROOF, b"p" * 32)
    assert encode_frame(b"xy") == struct.pack("<i", 2) + b"xy"


def test_every_handshake_frame_fits_under_the_handshake_cap() -> None:
    """The longest HELLO of the wire, and the first frame of a node on pysyncobj's old wire
    (which must be read whole to be recognised and refused with a clear line)."""
    longest = wire.hello(os.urandom(wire.NONCE_BYTES), "n" * wire.NODE_ID_BYTES_MAX)
    assert len(longest) - LENGTH_BYTES <= wire.HANDSHAKE_FRAME_BYTES_MAX
    assert wire.HANDSHAKE_FRAME_BYTES_MAX <= HANDSHAKE_FRAME_BYTES_MAX
    old_first = old_wire_frame(os.urandom(32))
    assert len(old_first) - LENGTH_BYTES <= HANDSHAKE_FRAME_BYTES_MAX


def _append_entries(entries: list[tuple[bytes, int, int]]) -> dict[str, object]:
    return {
        "type": "append_entries",
        "term": 1 << 40,
        "commit_index": 1 << 40,
        "entries": entries,
        "prevLogIdx": 1 << 40,
        "prevLogTerm": 1 << 40,
    }


def _batch(cfg: ShardConfig, entry_bytes: int) -> list[tuple[bytes, int, int]]:
    """The entries pysyncobj packs into one message: until their bytes reach the batch size."""
    rng = random.Random(7)
    entries, total, index = [], 0, 1 << 40
    while total < cfg.append_batch_bytes:
        entries.append((rng.randbytes(entry_bytes), index, 1 << 40))
        total += entry_bytes
        index += 1
    return entries


@pytest.mark.parametrize("entry_bytes", [8, 300, 64 << 10])
@pytest.mark.parametrize("entry_bytes_max", [0, 1 << 20])
def test_the_largest_legitimate_append_entries_fits_under_the_derived_frame_cap(
    entry_bytes: int, entry_bytes_max: int
) -> None:
    """Tiny entries are the worst case (pickling costs more than their bytes), then the largest
    entry allowed, which pysyncobj appends after them."""
    cfg = ShardConfig(
        "s",
        "127.0.0.1:1",
        (),
        "/nonexistent",
        "x",
        frame_bytes_max=64 << 10,
        entry_bytes_max=entry_bytes_max,
    )
    entries = _batch(cfg, entry_bytes)
    entries.append((os.urandom(cfg.entry_limit), entries[-1][1] + 1, 1 << 40))
    assert _wire_bytes(_append_entries(entries)) <= cfg.wire_limits.frame_bytes_max


def test_a_snapshot_chunk_fits_under_the_derived_frame_cap() -> None:
    cfg = ShardConfig(
        "s",
        "127.0.0.1:1",
        (),
        "/nonexistent",
        "x",
        frame_bytes_max=1024,
        snapshot_chunk_bytes=1 << 20,
    )
    message = {
        "type": "append_entries",
        "term": 1,
        "commit_index": 1,
        "serialized": (os.urandom(cfg.snapshot_chunk_bytes), True, False),
    }
    assert _wire_bytes(message) <= cfg.wire_limits.frame_bytes_max


def test_the_frame_cap_is_configurable_and_defaults_far_below_what_the_attack_declared() -> None:
    cfg = ShardConfig("s", "127.0.0.1:1", (), "/nonexistent", "x")
    assert cfg.wire_limits.frame_bytes_max < 64 << 20  # the attack declared 2 GiB
    assert (
        ShardConfig(
            "s", "127.0.0.1:1", (), "/nonexistent", "x", wire_frame_bytes_max=123_456
        ).wire_limits.frame_bytes_max
        == 123_456
    )
