"""Idempotent producer sessions (Kafka's producer id + epoch + sequence), as rows of the store.

A producer asks for a session on a queue (``InitProducer``) and numbers the messages it sends to
each partition: a request carries the sequence of its first message, the next request continues
where the previous one ended. The broker keeps, per producer and partition, the epoch and the
sequence ranges of the last ``BATCHES_REMEMBERED`` stored requests with their base offset and
timestamp: O(1) state however many messages pass, replicated like every other row and kept in
snapshots. A request whose range is one of those is a retry (its answer was lost): it is answered
with the offsets it got the first time, and nothing is stored. A gap means an earlier request is
not stored yet (retriable: the producer sends in order, so the earlier one is on its way or is
being retried), which keeps each partition's order across retries.

Epochs fence zombies: ``InitProducer`` with a producer name gives the same id and the next epoch,
and a request under an older epoch is refused from then on. Without a name every session gets a
new id. State idle for ``IDLE_EXPIRY_MS`` (no publish, no InitProducer) is forgotten by the
retention pass; a request of a forgotten producer is refused with UNKNOWN_PRODUCER.

Rows (keys.py): ``R/ + queue_id + producer_id`` -> epoch, touched_ms, name;
``R/ + queue_id + producer_id + partition`` -> epoch, touched_ms, remembered batches;
``W/ + queue_id + name`` -> producer_id. A producer's rows are contiguous in key order (the
partition rows extend the producer row's key), so the expiry pass reads one producer at a time.

Example: producer 7, epoch 0, partition 2. Request A (first_sequence 0, 3 messages) is stored at
offsets 40..42; request B (first_sequence 3, 2 messages) at 43..44. B is sent again: range [3, 5)
is remembered, so the answer is offsets 43..44, duplicate. A request with first_sequence 9 is
refused OUT_OF_ORDER_SEQUENCE (5 expected); one with first_sequence 0 and 2 messages is refused
(range [0, 2) is not request A's [0, 3)).
"""

from __future__ import annotations

import struct
from collections.abc import Collection
from dataclasses import dataclass

from fluxmq.core import keys, limits
from fluxmq.core.errors import FluxError, invalid_argument
from storage.api import ReadTxn, WriteTxn

BATCHES_REMEMBERED = 5  # the SDK keeps at most 4 requests in flight per partition
IDLE_EXPIRY_MS = 24 * 3_600_000
EXPIRY_ROWS_PER_PASS_MAX = 10_000  # rows the retention pass examines per command
SEQUENCE_MAX = 2**63 - 1
EPOCH_MAX = 2**32 - 1

_PRODUCER = struct.Struct(">Iq")  # epoch, touched_ms; the name follows (utf-8)
_PARTITION = struct.Struct(">IqB")  # epoch, touched_ms, batches remembered
_BATCH = struct.Struct(">QIQq")  # first_sequence, count, base_offset, timestamp_ms
_PRODUCER_KEY_BYTES = len(keys.PRODUCER) + 16


@dataclass(frozen=True, slots=True)
class ProducerGrant:
    producer_id: int
    producer_epoch: int


@dataclass(frozen=True, slots=True)
class Retry:
    """The request's range was stored before: the first outcome, to answer again."""

    base_offset: int
    timestamp_ms: int


@dataclass(frozen=True, slots=True)
class Admit:
    """The request is next in its partition: store it, then :func:`record` it."""

    key: bytes
    epoch: int
    batches: tuple[tuple[int, int, int, int], ...]  # the remembered ones, oldest first
    first_sequence: int
    count: int


def check_name(name: str) -> None:
    if name and not limits.QUEUE_NAME_RE.match(name):
        raise invalid_argument(
            "producer_name", "1..200 characters of [A-Za-z0-9._-] (or empty for a new producer)"
        )


def init(txn: WriteTxn, queue_id: int, name: str, now_ms: int) -> ProducerGrant:
    """A new producer id (epoch 0), or for a known ``name`` the same id under the next epoch."""
    if name:
        raw = txn.get(keys.producer_name_key(queue_id, name))
        if raw is not None:
            producer_id = keys.U64.unpack(raw)[0]
            row = txn.get(keys.producer_key(queue_id, producer_id))
            assert row is not None, "a producer name without its producer row"
            epoch = _PRODUCER.unpack_from(row)[0]
            if epoch >= EPOCH_MAX:
                raise FluxError(
                    "PRODUCER_EPOCH_EXHAUSTED",
                    f"producer {name!r} used every epoch; use another producer name",
                )
            _put_producer(txn, queue_id, producer_id, epoch + 1, now_ms, name)
            return ProducerGrant(producer_id, epoch + 1)
    raw = txn.get(keys.NEXT_PRODUCER_ID)
    producer_id = keys.U64.unpack(raw)[0] if raw else 1
    txn.put(keys.NEXT_PRODUCER_ID, keys.U64.pack(producer_id + 1))
    _put_producer(txn, queue_id, producer_id, 0, now_ms, name)
    if name:
        txn.put(keys.producer_name_key(queue_id, name), keys.U64.pack(producer_id))
    return ProducerGrant(producer_id, 0)


def _put_producer(
    txn: WriteTxn, queue_id: int, producer_id: int, epoch: int, now_ms: int, name: str
) -> None:
    txn.put(keys.producer_key(queue_id, producer_id), _PRODUCER.pack(epoch, now_ms) + name.encode())


def check_sequence(
    txn: ReadTxn,
    queue: str,
    queue_id: int,
    partition: int,
    producer_id: int,
    epoch: int,
    first_sequence: int,
    count: int,
) -> Retry | Admit:
    """Whether a request of ``count`` messages from this producer is a retry, the next one, or
    refused (FluxError)."""
    if first_sequence > SEQUENCE_MAX - count:
        raise invalid_argument("producer.first_sequence", f"at most {SEQUENCE_MAX} in all")
    row = txn.get(keys.producer_key(queue_id, producer_id))
    if row is None:
        raise FluxError(
            "UNKNOWN_PRODUCER",
            f"producer {producer_id} has no session on queue {queue!r} (never started, idle "
            f"longer than {IDLE_EXPIRY_MS // 3_600_000} h, or the queue was re-created): call "
            "InitProducer for a new session",
            metadata={"producer_id": str(producer_id)},
        )
    current = _PRODUCER.unpack_from(row)[0]
    if epoch > current:
        raise invalid_argument(
            "producer.producer_epoch", f"epoch {epoch} was never granted (current {current})"
        )
    key = keys.producer_partition_key(queue_id, producer_id, partition)
    raw = txn.get(key)
    batches: tuple[tuple[int, int, int, int], ...] = ()
    if raw is not None:
        stored_epoch, _touched, n = _PARTITION.unpack_from(raw)
        if stored_epoch == epoch:
            batches = tuple(
                _BATCH.unpack_from(raw, _PARTITION.size + i * _BATCH.size) for i in range(n)
            )
    if epoch < current:
        # A request of a fenced epoch that was stored before the fence is still answered with
        # its offsets (its answer may have been lost): what a producer needs to tell, after it
        # moved to a new epoch itself, which of its old requests it must send again.
        for seq, n, base, ts in batches:
            if seq == first_sequence and n == count:
                return Retry(base, ts)
        raise FluxError(
            "PRODUCER_FENCED",
            f"producer {producer_id} epoch {epoch} was fenced by epoch {current}: a newer "
            "InitProducer of the same producer name; this request was not stored",
            metadata={"producer_id": str(producer_id), "epoch": str(current)},
        )
    expected = batches[-1][0] + batches[-1][1] if batches else 0
    if first_sequence == expected:
        return Admit(key, epoch, batches, first_sequence, count)
    for seq, n, base, ts in batches:
        if seq == first_sequence:
            if n != count:
                raise invalid_argument(
                    "producer.first_sequence",
                    f"sequence {seq} began a request of {n} messages, not {count}",
                )
            return Retry(base, ts)
    if first_sequence > expected:
        raise FluxError(
            "OUT_OF_ORDER_SEQUENCE",
            f"partition {partition} expects sequence {expected} from producer {producer_id}, "
            f"got {first_sequence}: an earlier request is not stored yet",
            retriable=True,
            retry_after_ms=20,
            metadata={"expected_sequence": str(expected)},
        )
    raise invalid_argument(
        "producer.first_sequence",
        f"sequence {first_sequence} is below the next expected ({expected}) and is not one of "
        f"the last {BATCHES_REMEMBERED} requests: too old to tell whether it was stored",
    )


def record(txn: WriteTxn, admit: Admit, base_offset: int, timestamp_ms: int, now_ms: int) -> None:
    """Remember the stored request (the oldest remembered one makes room)."""
    batches = (*admit.batches, (admit.first_sequence, admit.count, base_offset, timestamp_ms))
    batches = batches[-BATCHES_REMEMBERED:]
    txn.put(
        admit.key,
        _PARTITION.pack(admit.epoch, now_ms, len(batches))
        + b"".join(_BATCH.pack(*b) for b in batches),
    )


def expire(txn: WriteTxn, live_queue_ids: Collection[int], now_ms: int) -> int:
    """Forget producers idle for ``IDLE_EXPIRY_MS`` and those of deleted queues; -> how many.

    Examines at most ``EXPIRY_ROWS_PER_PASS_MAX`` rows, continuing where the last pass stopped
    (a cursor row), so a command never holds the writer for long. Depends only on the store and
    ``now_ms``: every replica forgets the same producers.
    """
    raw_cursor = txn.get(keys.PRODUCER_SCAN)
    start = raw_cursor if raw_cursor is not None else None
    doomed: list[bytes] = []
    expired = 0
    examined = 0
    current: bytes | None = None  # the producer key whose rows are being read
    rows: list[bytes] = []
    newest = 0
    name = ""
    resume: bytes | None = None

    def settle() -> None:
        nonlocal expired
        if current is None:
            return
        queue_id = keys.U64.unpack_from(current, len(keys.PRODUCER))[0]
        if queue_id not in live_queue_ids or newest <= now_ms - IDLE_EXPIRY_MS:
            doomed.extend(rows)
            if name:
                doomed.append(keys.producer_name_key(queue_id, name))
            expired += 1

    for key, value in txn.scan(keys.PRODUCER, start):
        producer_key = key[:_PRODUCER_KEY_BYTES]
        if producer_key != current:
            settle()
            if examined >= EXPIRY_ROWS_PER_PASS_MAX:
                resume = producer_key
                current = None
                break
            current, rows, newest, name = producer_key, [], 0, ""
        rows.append(key)
        examined += 1  # noqa: SIM113 (counts rows across producers, not loop turns)
        if len(key) == _PRODUCER_KEY_BYTES:
            _epoch, touched = _PRODUCER.unpack_from(value)
            name = value[_PRODUCER.size :].decode()
        else:
            touched = _PARTITION.unpack_from(value)[1]
        newest = max(newest, touched)
    else:
        settle()
    for key in doomed:
        txn.delete(key)
    if resume is not None:
        txn.put(keys.PRODUCER_SCAN, resume)
    elif raw_cursor is not None:
        txn.delete(keys.PRODUCER_SCAN)
    return expired
