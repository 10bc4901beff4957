"""Frames: proposals survive the trip through one log entry unchanged and in order; a damaged
frame is rejected, never half-read; sub-indexes order like (log index, position)."""

from __future__ import annotations

import itertools
import random
import struct
import time

import pytest

from raft import frames
from raft.frames import PROPOSALS_PER_FRAME_MAX, SUB_BITS, FrameError

_U32 = struct.Struct(">I")


def _seed() -> int:
    return time.time_ns() % (1 << 32)


def test_round_trip_keeps_payloads_and_order() -> None:
    seed = _seed()
    rng = random.Random(seed)
    for _ in range(200):
        n = rng.randint(1, 64)
        payloads = [rng.randbytes(rng.choice([0, 1, 7, 100, 3000])) for _ in range(n)]
        frame = frames.encode(payloads)
        assert len(frame) == frames.encoded_size(sum(map(len, payloads)), n), f"seed={seed}"
        assert frames.decode(frame) == payloads, f"seed={seed}"


def test_round_trip_at_the_count_limit_and_of_empty_payloads() -> None:
    payloads = [b""] * PROPOSALS_PER_FRAME_MAX
    assert frames.decode(frames.encode(payloads)) == payloads
    big = [b"x" * (1 << 20)]
    assert frames.decode(frames.encode(big)) == big


def test_decode_accepts_any_bytes_like_input() -> None:
    frame = frames.encode([b"a", b"bc"])
    assert frames.decode(bytearray(frame)) == [b"a", b"bc"]  # type: ignore[arg-type]
    assert frames.decode(memoryview(frame)) == [b"a", b"bc"]  # type: ignore[arg-type]


@pytest.mark.parametrize("count", [0, PROPOSALS_PER_FRAME_MAX + 1])
def test_encode_refuses_an_empty_or_oversized_frame(count: int) -> None:
    with pytest.raises(AssertionError):
        frames.encode([b"x"] * count)


def test_the_count_limit_fits_the_sub_index_bits() -> None:
    assert PROPOSALS_PER_FRAME_MAX <= 1 << SUB_BITS


@pytest.mark.parametrize("count", [0, PROPOSALS_PER_FRAME_MAX + 1, 0xFFFFFFFF])
def test_decode_rejects_a_count_out_of_range(count: int) -> None:
    with pytest.raises(FrameError, match="claims"):
        frames.decode(_U32.pack(count) + b"\0" * 64)


def test_every_strict_prefix_of_a_frame_is_rejected() -> None:
    frame = frames.encode([b"abc", b"", b"defgh", b"i"])
    for cut in range(len(frame)):
        with pytest.raises(FrameError):
            frames.decode(frame[:cut])


def test_trailing_bytes_are_rejected() -> None:
    frame = frames.encode([b"abc", b"d"])
    with pytest.raises(FrameError, match="trailing"):
        frames.decode(frame + b"\0")


def test_a_wrong_count_is_rejected() -> None:
    frame = bytearray(frames.encode([b"abc", b"de", b"f"]))
    for count in (2, 4):
        bad = _U32.pack(count) + bytes(frame[4:])
        with pytest.raises(FrameError):
            frames.decode(bad)


def test_a_length_past_the_end_is_rejected() -> None:
    frame = bytearray(frames.encode([b"abc", b"de"]))
    last_len_at = 4 + 4 + 3
    frame[last_len_at : last_len_at + 4] = _U32.pack(3)  # claims one byte more than there is
    with pytest.raises(FrameError, match="truncated"):
        frames.decode(bytes(frame))
    frame[4:8] = _U32.pack(0xFFFFFFFF)
    with pytest.raises(FrameError, match="truncated"):
        frames.decode(bytes(frame))


def test_random_corruption_never_reads_past_the_frame() -> None:
    # A flipped byte may leave a valid frame (payload bytes) but decode never crashes with
    # anything other than FrameError and never returns more bytes than the frame holds.
    seed = _seed()
    rng = random.Random(seed)
    for _ in range(2000):
        payloads = [rng.randbytes(rng.randint(0, 6)) for _ in range(rng.randint(1, 5))]
        frame = bytearray(frames.encode(payloads))
        for _ in range(rng.randint(1, 3)):
            frame[rng.randrange(len(frame))] = rng.randrange(256)
        try:
            out = frames.decode(bytes(frame))
        except FrameError:
            continue
        assert frames.encode(out) == bytes(frame), f"seed={seed}"


def test_sub_index_orders_like_log_index_then_position() -> None:
    seed = _seed()
    rng = random.Random(seed)
    for _ in range(20_000):
        a = (rng.randint(1, 1 << 40), rng.randrange(PROPOSALS_PER_FRAME_MAX))
        b_log = rng.choice([a[0], a[0] + 1, rng.randint(1, 1 << 40)])
        b = (b_log, rng.randrange(PROPOSALS_PER_FRAME_MAX))
        sa, sb = frames.sub_index(*a), frames.sub_index(*b)
        assert (sa < sb) == (a < b) and (sa == sb) == (a == b), f"seed={seed} {a} {b}"
        assert frames.log_index_of(sa) == a[0], f"seed={seed} {a}"
        assert sa & ((1 << SUB_BITS) - 1) == a[1], f"seed={seed} {a}"


def test_sub_indexes_of_consecutive_entries_increase_strictly() -> None:
    seq = [
        frames.sub_index(log_index, pos)
        for log_index in range(1, 50)
        for pos in (0, 1, PROPOSALS_PER_FRAME_MAX - 1)
    ]
    assert all(x < y for x, y in itertools.pairwise(seq))


def test_sub_index_refuses_a_position_beyond_the_frame_limit() -> None:
    with pytest.raises(AssertionError):
        frames.sub_index(1, PROPOSALS_PER_FRAME_MAX)
    with pytest.raises(AssertionError):
        frames.sub_index(1, -1)
