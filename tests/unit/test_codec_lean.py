"""``decode_lean_at`` gives the same verdict as ``decode_at`` on every record and every damage."""

from __future__ import annotations

import random

import pytest

from storage.api import CorruptRecordError, NewRecord
from storage.codec import decode_at, decode_lean_at, encode, position

SEEDS = range(40)


def _record(rng: random.Random) -> NewRecord:
    return NewRecord(
        timestamp_ms=rng.randrange(0, 2**40),
        value=rng.randbytes(rng.randrange(0, 64)),
        key=rng.choice([None, b"", rng.randbytes(rng.randrange(1, 9))]),
        headers=rng.choice([(), (("h", b"v"),)]),
        idempotency_key=rng.choice([None, "", f"id-{rng.randrange(1000)}"]),
    )


def _verdict(fn: object, pos: bytes, log_id: int, offset: int, buf: bytes) -> object:
    try:
        return fn(pos, log_id, offset, buf)  # type: ignore[operator]
    except CorruptRecordError as err:
        return ("corrupt", str(err))


@pytest.mark.parametrize("seed", SEEDS)
def test_lean_decode_agrees_with_the_full_decode_on_intact_and_damaged_records(
    seed: int,
) -> None:
    rng = random.Random(seed)
    log_id, offset = rng.randrange(2**20), rng.randrange(2**30)
    pos = position(log_id, offset)
    record = _record(rng)
    buf = encode(log_id, offset, record)
    damaged = [buf, buf[:-1], buf + b"x"]
    for _ in range(20):
        b = bytearray(buf)
        b[rng.randrange(len(b))] ^= 1 << rng.randrange(8)
        damaged.append(bytes(b))
    for candidate in damaged:
        full = _verdict(decode_at, pos, log_id, offset, candidate)
        lean = _verdict(decode_lean_at, pos, log_id, offset, candidate)
        if isinstance(full, tuple):  # corrupt
            assert lean == full or (lean is None and record.headers), (seed, full, lean)
        elif record.headers:
            assert lean is None  # the caller decodes records with headers in full
        else:
            assert lean == (full.timestamp_ms, full.key, full.idempotency_key)
