"""The frames between a front end and its shard process: every frame decodes to what was
encoded, and damaged bytes are refused with FrameError only (never another exception, never a
frame that was not sent)."""

from __future__ import annotations

import random

import pytest

from fluxmq.server.shard_process import frames as fr
from fluxmq.server.shard_process.frames import FrameError, FrameReader, Kind, Shape

SEEDS = range(200)


def _metadata(rng: random.Random) -> fr.Metadata:
    out: list[tuple[str, str | bytes]] = []
    for i in range(rng.randrange(6)):
        if rng.random() < 0.3:
            out.append((f"k{i}-bin", rng.randbytes(rng.randrange(40))))
        else:
            out.append((f"k{i}", "".join(rng.choice("abcé日x ") for _ in range(rng.randrange(20)))))
    return tuple(out)


def _call(rng: random.Random) -> fr.Call:
    shape = rng.choice(list(Shape))
    return fr.Call(
        f"/fluxmq.v1.QueueService/M{rng.randrange(100)}",
        rng.choice([None, 0, rng.randrange(10**6)]),
        shape,
        _metadata(rng),
        b"" if shape.request_streams else rng.randbytes(rng.randrange(300)),
    )


def _end(rng: random.Random) -> fr.End:
    return fr.End(
        rng.randrange(17),
        rng.choice(["", "queue 'q' not found", "é" * 3]),
        _metadata(rng),
        rng.choice([None, b"", rng.randbytes(rng.randrange(100))]),
    )


def _frames(rng: random.Random) -> list[tuple[bytes, tuple[Kind, int, object]]]:
    out: list[tuple[bytes, tuple[Kind, int, object]]] = []
    for _ in range(rng.randrange(1, 8)):
        call_id = rng.randrange(1, 2**32)
        pick = rng.randrange(5)
        if pick == 0:
            call = _call(rng)
            out.append((fr.encode_call(call_id, call), (Kind.CALL, call_id, call)))
        elif pick == 1:
            end = _end(rng)
            out.append((fr.encode_end(call_id, end), (Kind.END, call_id, end)))
        elif pick == 2:
            body = rng.randbytes(rng.randrange(500))
            out.append((fr.frame(Kind.MESSAGE, call_id, body), (Kind.MESSAGE, call_id, body)))
        elif pick == 3:
            n = rng.randrange(2**32)
            out.append((fr.encode_credit(call_id, n), (Kind.CREDIT, call_id, n)))
        else:
            kind = rng.choice([Kind.CANCEL, Kind.HALF_CLOSE])
            out.append((fr.frame(kind, call_id), (kind, call_id, b"")))
    return out


def _decoded(kind: Kind, call_id: int, payload: memoryview) -> tuple[Kind, int, object]:
    if kind is Kind.CALL:
        return kind, call_id, fr.decode_call(payload)
    if kind is Kind.END:
        return kind, call_id, fr.decode_end(payload)
    if kind is Kind.CREDIT:
        return kind, call_id, fr.decode_credit(payload)
    return kind, call_id, bytes(payload)


def test_frames_decode_to_what_was_sent_however_the_stream_is_cut() -> None:
    for seed in SEEDS:
        _round_trip(seed)


def _round_trip(seed: int) -> None:
    rng = random.Random(seed)
    sent = _frames(rng)
    stream = b"".join(data for data, _ in sent)
    reader = FrameReader(1 << 20)
    got = []
    at = 0
    while at < len(stream):  # the socket hands over arbitrary pieces
        step = rng.randrange(1, 64)
        got += [_decoded(*f) for f in reader.feed(stream[at : at + step])]
        at += step
    assert got == [expected for _, expected in sent], f"seed {seed}"


def test_damaged_frames_are_refused_with_frame_error_only() -> None:
    for seed in range(2000):
        try:
            _damaged(seed)
        except Exception as err:
            raise AssertionError(f"seed {seed}: {err!r}") from err


def _damaged(seed: int) -> None:
    rng = random.Random(seed)
    data, _ = rng.choice(_frames(rng))
    damaged = bytearray(data)
    for _ in range(rng.randrange(1, 4)):
        damaged[rng.randrange(len(damaged))] = rng.randrange(256)
    if rng.random() < 0.3:
        damaged = damaged[: rng.randrange(len(damaged))]
    try:
        for kind, call_id, payload in FrameReader(1 << 20).feed(bytes(damaged)):
            _decoded(kind, call_id, payload)
    except FrameError:
        pass


def test_a_frame_longer_than_the_limit_is_refused_before_it_is_read() -> None:
    reader = FrameReader(1000)
    with pytest.raises(FrameError, match="frame of 2005 bytes"):
        reader.feed(fr.frame(Kind.MESSAGE, 1, b"x" * 2000)[:20])


def test_an_unknown_frame_kind_is_refused() -> None:
    data = bytearray(fr.frame(Kind.CANCEL, 1))
    data[4] = 99
    with pytest.raises(FrameError, match="unknown frame kind 99"):
        FrameReader(1000).feed(bytes(data))


def test_too_many_metadata_items_are_refused_on_both_sides() -> None:
    many = tuple((f"k{i}", "v") for i in range(fr.METADATA_ITEMS_MAX + 1))
    with pytest.raises(FrameError):
        fr.encode_metadata(many)
    forged = fr._U16.pack(fr.METADATA_ITEMS_MAX + 1)
    with pytest.raises(FrameError, match="metadata items"):
        fr.decode_metadata(memoryview(forged), 0)
