"""Retention at apply: the records policies let go, expired idempotency keys, deleted queues'
logs (the trash) and lapsed producer sessions, each pass bounded; and the read-only question
the leader asks first, whether a pass would change anything."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping

from fluxmq._pb.internal import commands_pb2 as cpb
from fluxmq.core import keys, limits, producers
from fluxmq.core.catalog import QueueEntry
from fluxmq.core.commands.context import ApplyContext
from fluxmq.core.commands.results import RetentionResult
from fluxmq.core.queue_config import QueuePolicy
from storage.api import PartitionLogReader, ReadTxn

RETENTION_HEADERS_PER_READ = 16


def apply_retention(ctx: ApplyContext, cmd: cpb.ApplyRetentionCmd) -> RetentionResult:
    txn = ctx.txn
    result = RetentionResult()
    budget = limits.RETENTION_RECORDS_PER_PASS_MAX
    # Queue id order, not dict order: a replica that restarted rebuilt its catalog in another
    # order, and the shared budget must be spent identically everywhere.
    for entry in sorted(ctx.cat().values(), key=_by_queue_id):
        if budget <= 0:
            break
        if not entry.policy.has_retention:
            continue
        for partition in range(entry.policy.partitions):
            log = txn.log(keys.log_id(entry.queue_id, partition))
            cut = retention_cut(log, entry.policy, cmd.now_ms)
            if entry.policy.retain_until_consumed:
                cut = min(cut, ctx.consumed_floor(entry, partition, cut))
            if cut > log.watermarks().low and budget > 0:
                done = log.truncate_before(cut, max_records=budget)
                budget -= done.removed_records
                result.removed_records += done.removed_records
                result.removed_bytes += done.removed_bytes
                low = log.watermarks().low
                for g in ctx.delivery.of_queue(entry.queue_id):
                    ctx.delivery.catch_up(txn, g, partition, low)
    result.expired_dedup_keys = _expire_dedup(ctx, cmd.now_ms)
    result.dropped_records = _drop_trash(ctx)
    live = {e.queue_id for e in ctx.cat().values()}
    result.expired_producers = producers.expire(txn, live, cmd.now_ms)
    return result


def _by_queue_id(entry: QueueEntry) -> int:
    return entry.queue_id


def _expire_dedup(ctx: ApplyContext, now_ms: int) -> int:
    txn = ctx.txn
    windows = {e.queue_id: e.policy.dedup_window_ms for e in ctx.cat().values()}
    doomed: list[tuple[bytes, bytes]] = []
    for key, _ in _expired_dedup_rows(txn, windows, now_ms):
        queue_id, _ts, idem = keys.split_dedup_expiry_key(key)
        doomed.append((key, keys.dedup_key(queue_id, idem)))
        if len(doomed) >= limits.DEDUP_EXPIRIES_PER_PASS_MAX:
            break
    for expiry_key, dedup_key in doomed:
        txn.delete(expiry_key)
        txn.delete(dedup_key)
    return len(doomed)


def _drop_trash(ctx: ApplyContext) -> int:
    txn = ctx.txn
    budget = limits.DROP_RECORDS_PER_PASS_MAX
    dropped = 0
    gone: list[bytes] = []
    for key, _ in txn.scan(keys.TRASH):
        log = txn.log(keys.U64.unpack_from(key, len(keys.TRASH))[0])
        wm = log.watermarks()
        chunk = min(budget, wm.high - wm.low)
        if log.drop(max_records=budget):
            gone.append(key)
        dropped += chunk
        budget -= chunk
        if budget <= 0:
            break
    for key in gone:
        txn.delete(key)
    return dropped


def retention_cut(reader: PartitionLogReader, policy: QueuePolicy, now_ms: int) -> int:
    """The offset below which ``policy`` says records of ``log`` must go (>= low).

    Example: low=0, high=100, max_messages=30 -> 70. Age is computed the same way; bytes cut
    whole batches, oldest first, until the rest fits. The largest cut wins.
    """
    wm = reader.watermarks()
    cut = wm.low
    if policy.max_messages and wm.high - wm.low > policy.max_messages:
        cut = max(cut, wm.high - policy.max_messages)
    if policy.max_age_ms and wm.high > cut:
        cut = max(cut, reader.offset_for_timestamp(now_ms - policy.max_age_ms + 1))
    if policy.max_bytes and wm.high > cut:
        # Whole batches, oldest first (what deleting them frees), within the per-pass budget.
        excess = reader.size_bytes() - policy.max_bytes
        offset = wm.low
        examined = 0
        # A few headers at a time: reading one checks its whole batch, so read what is cut.
        while excess > 0 and offset < wm.high and examined < limits.RETENTION_BATCHES_PER_PASS_MAX:
            headers = reader.batch_headers(offset, RETENTION_HEADERS_PER_READ)
            if not headers:
                break
            for header in headers:
                examined += 1
                excess -= header.size_bytes
                offset = header.last_offset + 1
                cut = max(cut, offset)
                if excess <= 0:
                    break
    return cut


def _expired_dedup_rows(
    txn: ReadTxn, windows: dict[int, int], now_ms: int
) -> Iterator[tuple[bytes, bytes]]:
    """Expiry rows whose key is past its queue's window (or whose queue is gone), oldest first
    within each queue."""
    start: bytes | None = None
    while True:
        advanced = False
        for key, value in txn.scan(keys.DEDUP_EXPIRY, start):
            queue_id, ts, _ = keys.split_dedup_expiry_key(key)
            window = windows.get(queue_id)
            if window is None or now_ms - ts >= window:
                yield key, value
                continue
            # The rest of this queue's rows are younger: jump to the next queue.
            start = keys.DEDUP_EXPIRY + keys.U64.pack(queue_id + 1)
            advanced = True
            break
        if not advanced:
            return


def retention_due(
    txn: ReadTxn,
    catalog: Mapping[str, QueueEntry],
    now_ms: int,
    floor: Callable[[QueueEntry, int, int], int] | None = None,
) -> bool:
    """Whether an ApplyRetention command at ``now_ms`` would change anything (read-only).
    ``floor(entry, partition, cut)`` bounds the cut of retain_until_consumed queues."""
    for entry in catalog.values():
        if not entry.policy.has_retention:
            continue
        for partition in range(entry.policy.partitions):
            log = txn.log(keys.log_id(entry.queue_id, partition))
            cut = retention_cut(log, entry.policy, now_ms)
            if entry.policy.retain_until_consumed and floor is not None:
                cut = floor(entry, partition, cut)
            if cut > log.watermarks().low:
                return True
    windows = {e.queue_id: e.policy.dedup_window_ms for e in catalog.values()}
    for _ in _expired_dedup_rows(txn, windows, now_ms):
        return True
    return any(True for _ in txn.scan(keys.TRASH))
