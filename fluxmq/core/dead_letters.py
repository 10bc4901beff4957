"""Dead letters by origin queue.

Several queues may share one dead-letter queue (as SQS redrive policies and RabbitMQ
dead-letter exchanges allow), and a DLQ may also hold messages published to it directly. So a
queue's dead-letter operations (list, depth, replay, purge, and the alert built on the depth)
never look at the DLQ as a whole: they go through an index of the queue's own letters,
``DEAD_ORIGIN`` rows keyed by (DLQ, origin name, DLQ offset), written in the transaction that
writes the letter and removed when it is replayed or purged. A message that is not a dead letter
of that origin has no row, so nothing done for the origin can reach it.

DLQs written before the index existed carry a ``DEAD_INDEXED`` row (set when the first indexed
letter is written) saying from which offset on the index is complete; the letters below it are
recognised by their ``fluxmq-original-queue`` header (a header clients cannot set: the
``fluxmq-`` prefix is reserved). Without that row, the whole log is read that way.

Which queue may serve as a DLQ is decided here too (``dead_letter_role``), in the state
machine, so two creates racing through different nodes cannot both slip past it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping

from fluxmq._pb.v1 import queue_pb2 as pb
from fluxmq.core import keys
from fluxmq.core.catalog import QueueEntry
from fluxmq.core.delivery import header
from fluxmq.core.errors import FieldViolation, FluxError
from fluxmq.core.queue_config import policy_of
from storage.api import PartitionLogReader, ReadTxn, Record, WriteTxn

ORIGIN_HEADER = "fluxmq-original-queue"
READ_BYTES_MAX = 16 * 1024 * 1024  # one read of the DLQ log
CONFLICT = "DEAD_LETTER_QUEUE_CONFLICT"
FIELD = "config.dead_letter_queue"


def _dlq_log(txn: ReadTxn, dlq_queue_id: int) -> PartitionLogReader:
    return txn.log(keys.log_id(dlq_queue_id, 0))  # a DLQ has one partition


def legacy_end(txn: ReadTxn, dlq_queue_id: int, high: int) -> int:
    """The offset from which the index holds every letter (``high``: none indexed yet)."""
    raw = txn.get(keys.dead_indexed_key(dlq_queue_id))
    return keys.U64.unpack(raw)[0] if raw is not None else high


def letter_offsets(txn: ReadTxn, dlq_queue_id: int, origin: str, start: int = 0) -> Iterator[int]:
    """DLQ offsets of the live dead letters of ``origin``, increasing, from ``start``."""
    log = _dlq_log(txn, dlq_queue_id)
    wm = log.watermarks()
    end = min(legacy_end(txn, dlq_queue_id, wm.high), wm.high)
    offset = max(start, wm.low)
    want = origin.encode()
    while offset < end:
        records = log.read(offset, 1000, READ_BYTES_MAX)
        if not records:
            break
        for record in records:
            if record.offset >= end:
                break
            if header(record, ORIGIN_HEADER) == want and not _gone(txn, dlq_queue_id, record):
                yield record.offset
        offset = min(records[-1].offset + 1, end)
    prefix = keys.dead_origin_prefix(dlq_queue_id, origin)
    first = prefix + keys.U64.pack(max(offset, end))
    for key, _ in txn.scan(prefix, first):
        found = keys.U64.unpack_from(key, len(prefix))[0]
        if found >= wm.high:
            break  # cannot happen: rows are written with their record
        yield found


def _gone(txn: ReadTxn, dlq_queue_id: int, record: Record) -> bool:
    return txn.get(keys.dead_gone_key(dlq_queue_id, record.offset)) is not None


def count(txn: ReadTxn, dlq_queue_id: int, origin: str) -> int:
    """Live dead letters of ``origin``: the indexed ones from their counter (no scan, whatever
    their number), minus rows the DLQ's own retention or purge left below its low watermark,
    plus the letters written before the index, found by their header."""
    wm = _dlq_log(txn, dlq_queue_id).watermarks()
    end = min(legacy_end(txn, dlq_queue_id, wm.high), wm.high)
    legacy = 0
    if wm.low < end:
        for offset in letter_offsets(txn, dlq_queue_id, origin, wm.low):
            if offset >= end:
                break
            legacy += 1
    prefix = keys.dead_origin_prefix(dlq_queue_id, origin)
    below = 0
    for key, _ in txn.scan(prefix):
        if keys.U64.unpack_from(key, len(prefix))[0] >= wm.low:
            break
        below += 1
    return legacy + _counter(txn, dlq_queue_id, origin) - below


def _counter(txn: ReadTxn, dlq_queue_id: int, origin: str) -> int:
    raw = txn.get(keys.dead_origin_count_key(dlq_queue_id, origin))
    return keys.U64.unpack(raw)[0] if raw is not None else 0


def _count_by(txn: WriteTxn, dlq_queue_id: int, origin: str, delta: int) -> None:
    n = _counter(txn, dlq_queue_id, origin) + delta
    assert n >= 0, (dlq_queue_id, origin, n)
    key = keys.dead_origin_count_key(dlq_queue_id, origin)
    if n:
        txn.put(key, keys.U64.pack(n))
    else:
        txn.delete(key)


def letter(txn: ReadTxn, dlq_queue_id: int, origin: str, offset: int) -> Record | None:
    """The record at ``offset`` if it is a live dead letter of ``origin`` (else None)."""
    log = _dlq_log(txn, dlq_queue_id)
    wm = log.watermarks()
    if not wm.low <= offset < wm.high:
        return None
    if offset >= legacy_end(txn, dlq_queue_id, wm.high):
        if txn.get(keys.dead_origin_key(dlq_queue_id, origin, offset)) is None:
            return None
        return log.read(offset, 1, READ_BYTES_MAX)[0]
    record = log.read(offset, 1, READ_BYTES_MAX)[0]
    if header(record, ORIGIN_HEADER) != origin.encode() or _gone(txn, dlq_queue_id, record):
        return None
    return record


def letters(txn: ReadTxn, dlq_queue_id: int, origin: str, start: int = 0) -> Iterator[Record]:
    """The live dead letters of ``origin``, in DLQ order, from ``start``."""
    log = _dlq_log(txn, dlq_queue_id)
    for offset in letter_offsets(txn, dlq_queue_id, origin, start):
        yield log.read(offset, 1, READ_BYTES_MAX)[0]


def add(txn: WriteTxn, dlq_queue_id: int, origin: str, offset: int) -> None:
    """Index the letter just written at ``offset`` (call ``start_index`` before writing it)."""
    txn.put(keys.dead_origin_key(dlq_queue_id, origin, offset), b"")
    _count_by(txn, dlq_queue_id, origin, 1)


def start_index(txn: WriteTxn, dlq_queue_id: int) -> None:
    """Before the first indexed letter of a DLQ: what is below the high watermark now was
    written without the index (nothing, for a DLQ created since)."""
    marker = keys.dead_indexed_key(dlq_queue_id)
    if txn.get(marker) is None:
        high = _dlq_log(txn, dlq_queue_id).watermarks().high
        txn.put(marker, keys.U64.pack(high))


def remove(txn: WriteTxn, dlq_queue_id: int, origin: str, offset: int) -> None:
    """A letter replayed or purged: out of the index, and marked gone for compaction."""
    key = keys.dead_origin_key(dlq_queue_id, origin, offset)
    if txn.get(key) is not None:  # else written before the index: it has no row
        txn.delete(key)
        _count_by(txn, dlq_queue_id, origin, -1)
    txn.put(keys.dead_gone_key(dlq_queue_id, offset), b"")


def drop_below(txn: WriteTxn, dlq_queue_id: int, origin: str, low: int) -> None:
    """Index rows of letters the DLQ no longer holds (its retention or a purge of the DLQ
    itself removed them; readers already skip them)."""
    prefix = keys.dead_origin_prefix(dlq_queue_id, origin)
    stale = []
    for key, _ in txn.scan(prefix):
        if keys.U64.unpack_from(key, len(prefix))[0] >= low:
            break
        stale.append(key)
    for key in stale:
        txn.delete(key)
    if stale:
        _count_by(txn, dlq_queue_id, origin, -len(stale))


# -- which queue may be a DLQ -------------------------------------------------------------------


def conflict(message: str, config: pb.QueueConfig, description: str) -> FluxError:
    return FluxError(
        CONFLICT,
        message,
        violations=(FieldViolation(FIELD, description),),
        metadata={"queue": config.name, "field": FIELD},
    )


def dead_letter_role(
    catalog: Mapping[str, QueueEntry],
    config: pb.QueueConfig,
    old: QueueEntry | None,
    holds_messages: Callable[[QueueEntry], bool],
) -> tuple[str, QueueEntry | None]:
    """Check the DLQ rules for creating (``old`` None) or updating ``config``.

    -> (the queue ``config``'s queue serves as a DLQ, "" if none; an existing queue to turn
    into ``config``'s DLQ, or None). FAILED_PRECONDITION (DEAD_LETTER_QUEUE_CONFLICT) when:
    - the queue is a DLQ (or a name other queues named as theirs) and would get a DLQ itself;
    - it names as its DLQ an existing queue that is not one and has a DLQ of its own or holds
      messages. Naming an existing DLQ (sharing it), a queue not created yet (created on
      demand) or an empty queue without a DLQ (it becomes one) is fine. On update only a
      changed dead_letter_queue is checked, so pairings made before these rules stay usable.
    """
    name = config.name
    own = policy_of(config).dead_letter_queue
    if old is not None:
        serves = str(old.queue.dead_letter_of)
    else:
        sources = sorted(
            e.name
            for e in catalog.values()
            if e.policy.dead_letter_queue == name and e.name != name
        )
        serves = sources[0] if sources else ""
    if serves and own is not None:
        raise conflict(
            f"queue {name!r} is the dead-letter queue of {serves!r}, and a dead-letter queue has "
            "none of its own: set dead_letter_disabled",
            config,
            "a dead-letter queue has no dead-letter queue",
        )
    if own is None or (old is not None and old.policy.dead_letter_queue == own):
        return serves, None
    target = catalog.get(own)
    if target is None or target.queue.dead_letter_of:
        return serves, None
    if target.policy.dead_letter_queue is not None:
        raise conflict(
            f"queue {own!r} has a dead-letter queue of its own ({target.policy.dead_letter_queue!r}"
            f"), so it cannot be the dead-letter queue of {name!r}: name a dead-letter queue or a "
            "new name (created on the first dead letter)",
            config,
            f"{own!r} is not a dead-letter queue",
        )
    if holds_messages(target):
        raise conflict(
            f"queue {own!r} holds messages of its own, so it cannot be the dead-letter queue of "
            f"{name!r}: name a dead-letter queue or a new name (created on the first dead letter)",
            config,
            f"{own!r} holds messages",
        )
    return serves, target
