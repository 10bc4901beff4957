"""CPU cost per record of the record batch codec (format 2) beside the per-record rows of
format 1: ``python -m bench.batch_codec``.

Each row encodes, stamps and decodes records of ``--value-bytes`` (default 100; no key,
headers or idempotency key) in batches of 1, 10 and 100:

- format 2: ``record_batch.prepare_records`` (the leader, once per batch), ``seal`` (every
  replica), ``decode`` (a reader);
- format 1: ``codec.prepare`` per record (the leader), ``position`` + ``seal_at`` per record
  (every replica), ``decode_at`` per record (a reader).

Times are the best of ``--repeats`` runs, each about ``--seconds`` long, in microseconds per
record; ``bytes/rec`` is the stored size per record (format 1 counts its 16-byte LMDB key).
Single-threaded and CPU-bound: run it on an idle machine and compare ratios, not absolutes.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

from storage import codec, record_batch
from storage.api import NewRecord

LOG_ID = 7
BASE_OFFSET = 1_000_000
STAMP_MS = 1_700_000_000_000
BATCH_SIZES = (1, 10, 100)


def best_us_per_record(
    work: Callable[[], object], records: int, seconds: float, repeats: int
) -> float:
    """Best of ``repeats`` timings of ``work`` (looped for about ``seconds``), per record."""
    start = time.perf_counter()
    work()
    once_s = max(time.perf_counter() - start, 1e-7)
    loops = max(1, min(1_000_000, int(seconds / once_s)))
    best_s = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(loops):
            work()
        best_s = min(best_s, (time.perf_counter() - start) / loops)
    return best_s / records * 1e6


def format_2_row(batch: int, value: bytes, seconds: float, repeats: int) -> list[float]:
    fields = [(value, None, (), None)] * batch
    section = record_batch.prepare_records(fields)
    sealed = record_batch.seal(LOG_ID, BASE_OFFSET, STAMP_MS, batch, section)

    def prepare() -> object:
        return record_batch.prepare_records(fields)

    def seal() -> object:
        return record_batch.seal(LOG_ID, BASE_OFFSET, STAMP_MS, batch, section)

    def decode() -> object:
        return record_batch.decode(LOG_ID, BASE_OFFSET, sealed)

    costs = [best_us_per_record(f, batch, seconds, repeats) for f in (prepare, seal, decode)]
    return [*costs, sum(costs), len(sealed) / batch]


def format_1_row(batch: int, value: bytes, seconds: float, repeats: int) -> list[float]:
    offsets = range(BASE_OFFSET, BASE_OFFSET + batch)
    prepared = [codec.prepare(value) for _ in offsets]
    stored = [
        (
            codec.position(LOG_ID, offset),
            offset,
            codec.seal_at(codec.position(LOG_ID, offset), STAMP_MS, body),
        )
        for offset, body in zip(offsets, prepared, strict=True)
    ]

    def prepare() -> object:
        return [codec.prepare(value) for _ in offsets]

    def seal() -> object:
        position, seal_at = codec.position, codec.seal_at
        return [
            seal_at(position(LOG_ID, offset), STAMP_MS, body)
            for offset, body in zip(offsets, prepared, strict=True)
        ]

    def decode() -> object:
        decode_at = codec.decode_at
        return [decode_at(pos, LOG_ID, offset, buf) for pos, offset, buf in stored]

    costs = [best_us_per_record(f, batch, seconds, repeats) for f in (prepare, seal, decode)]
    key_bytes = len(stored[0][0])
    return [*costs, sum(costs), sum(len(buf) + key_bytes for _p, _o, buf in stored) / batch]


def check_agreement(value: bytes) -> None:
    """Both formats give back the same record, so the rows compare like with like."""
    sealed = record_batch.seal(
        LOG_ID, BASE_OFFSET, STAMP_MS, 1, record_batch.prepare_records([(value, None, (), None)])
    )
    got = record_batch.decode(LOG_ID, BASE_OFFSET, sealed)[0]
    want = codec.decode(
        LOG_ID, BASE_OFFSET, codec.encode(LOG_ID, BASE_OFFSET, NewRecord(STAMP_MS, value))
    )
    if (got.offset, got.timestamp_ms, got.value, got.key) != (
        want.offset,
        want.timestamp_ms,
        want.value,
        want.key,
    ):
        raise SystemExit(f"formats disagree: {got} vs {want}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--value-bytes", type=int, default=100)
    parser.add_argument("--seconds", type=float, default=0.2, help="per timing run")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)
    if not 0 < args.seconds <= 10 or not 1 <= args.repeats <= 20:
        parser.error("--seconds in (0, 10], --repeats in [1, 20]")
    value = bytes(range(256)) * (args.value_bytes // 256) + bytes(args.value_bytes % 256)
    check_agreement(value)
    columns = ("prepare", "seal", "decode", "total", "bytes/rec")
    print(f"us per record, {args.value_bytes}-byte values, best of {args.repeats}")
    print(f"{'format':<10}{'batch':>6}" + "".join(f"{c:>11}" for c in columns))
    for batch in BATCH_SIZES:
        for name, row in (
            ("1 (rows)", format_1_row(batch, value, args.seconds, args.repeats)),
            ("2 (batch)", format_2_row(batch, value, args.seconds, args.repeats)),
        ):
            cells = "".join(f"{cost:>11.3f}" for cost in row[:4]) + f"{row[4]:>11.1f}"
            print(f"{name:<10}{batch:>6}{cells}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
