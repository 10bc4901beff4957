"""Dead letters at apply: the DLQ created on first use, dead messages written to it, replay and
purge of a queue's own letters (also in a shared DLQ), and the compaction that follows."""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence

from fluxmq._pb.internal import commands_pb2 as cpb
from fluxmq._pb.v1 import queue_pb2 as pb
from fluxmq.core import dead_letters as dls
from fluxmq.core import keys, limits
from fluxmq.core.catalog import QueueEntry, dead_letter_entry, same_environment
from fluxmq.core.commands.append import append_raw
from fluxmq.core.commands.context import ApplyContext
from fluxmq.core.commands.queues import apply_create_queue
from fluxmq.core.delivery import REPLAY_GROUP_HEADER, DeadLetter, header
from fluxmq.core.errors import FluxError
from fluxmq.core.queue_config import policy_of
from storage.api import ReadTxn, Record, WriteTxn

# Headers of a dead letter (DESIGN §2), added to the original message's own headers.
DEAD_HEADERS = (
    "fluxmq-original-queue",
    "fluxmq-original-partition",
    "fluxmq-original-offset",
    "fluxmq-original-timestamp",
    "fluxmq-attempts",
    "fluxmq-dead-reason",
    "fluxmq-dead-at",
    "fluxmq-group",
)
REPLAYED_FROM_HEADER = "fluxmq-replayed-from"


def dead_letter_queue(ctx: ApplyContext, origin: QueueEntry, now_ms: int) -> QueueEntry | None:
    """The DLQ of ``origin``, created on first use (None: the queue has no DLQ)."""
    name = origin.policy.dead_letter_queue
    if name is None:
        return None
    existing = ctx.cat().get(name)
    if existing is not None:
        # Another environment's queue is never a DLQ (creates refuse that pairing; this
        # guards state written before they did): the message is dropped and counted.
        return existing if same_environment(existing, origin) else None
    config = pb.QueueConfig(
        name=name,
        partitions=1,
        type=pb.QUEUE_TYPE_WORK,
        dedup_window=limits.DEDUP_WINDOW_DEFAULT,
        max_message_bytes=limits.MESSAGE_BYTES_MAX,
        lease_timeout=limits.LEASE_TIMEOUT_DEFAULT,
        dead_letter_disabled=True,
        environment=origin.queue.config.environment,
    )
    config.retry_backoff.base = limits.RETRY_BACKOFF_BASE_DEFAULT
    config.retry_backoff.max = limits.RETRY_BACKOFF_MAX_DEFAULT
    queue = apply_create_queue(ctx, cpb.CreateQueueCmd(config=config, now_ms=now_ms))
    queue.dead_letter_of = origin.name
    ctx.txn.put(keys.queue_key(name), queue.SerializeToString())
    ctx.cat_for_write()[name] = QueueEntry(queue, policy_of(queue.config))
    return ctx.cat()[name]


def write_dead_letters(ctx: ApplyContext, now_ms: int) -> int:
    """The dead messages the delivery state set aside during this command, into their DLQs;
    -> how many were written."""
    pending = ctx.delivery.dead_letters
    if not pending:
        return 0
    ctx.delivery.dead_letters = []
    by_id = {e.queue_id: e for e in ctx.cat().values()}
    written = 0
    for dl in pending:
        origin = by_id[dl.queue_id]
        try:
            dlq = dead_letter_queue(ctx, origin, now_ms)
        except FluxError:
            # The DLQ cannot be created (queue limit): the state already moved on, so the
            # message is dropped and counted rather than failing the command forever.
            dlq = None
        if dlq is None:
            ctx.counters.dead_letters_dropped += 1
            continue
        dls.start_index(ctx.txn, dlq.queue_id)
        headers = _dead_letter_headers(dl, origin, now_ms)
        offset = append_raw(ctx, dlq, 0, now_ms, dl.record.key, dl.record.value, headers)
        dls.add(ctx.txn, dlq.queue_id, origin.name, offset)
        written += 1
    return written


def _dead_letter_headers(
    dl: DeadLetter, origin: QueueEntry, now_ms: int
) -> list[tuple[str, bytes]]:
    extra = (
        origin.name,
        str(dl.partition),
        str(dl.record.offset),
        str(dl.record.timestamp_ms),
        str(dl.attempts),
        dl.reason,
        str(now_ms),
        dl.group,
    )
    headers = [(k, v) for k, v in dl.record.headers if not k.startswith("fluxmq-")]
    headers += [(k, v.encode()) for k, v in zip(DEAD_HEADERS, extra, strict=True)]
    return headers


def apply_replay_dead_letters(ctx: ApplyContext, cmd: cpb.ReplayDeadLettersCmd) -> int:
    """Dead letters of ``cmd.queue`` (only its own, also in a shared DLQ) back to it as new
    messages aimed at their group."""
    origin = ctx.entry(cmd.queue, cmd.queue_id)
    dlq = dead_letter_entry(ctx.cat(), origin)
    if dlq is None:
        return 0
    txn = ctx.txn
    replayed = 0
    group_filter = cmd.group if cmd.all else ""
    for record in _dead_letter_records(txn, dlq, origin, cmd.ids, cmd.all, group_filter):
        group = header(record, "fluxmq-group")
        part = int(header(record, "fluxmq-original-partition") or b"0")
        if part >= origin.policy.partitions:
            part = 0
        headers = [(k, v) for k, v in record.headers if not k.startswith("fluxmq-")]
        if group:
            headers.append((REPLAY_GROUP_HEADER, group))
        headers.append((REPLAYED_FROM_HEADER, str(record.offset).encode()))
        append_raw(ctx, origin, part, cmd.now_ms, record.key, record.value, headers)
        dls.remove(txn, dlq.queue_id, origin.name, record.offset)
        replayed += 1
    compact_dead_letters(txn, dlq, origin)
    return replayed


def apply_purge_dead_letters(ctx: ApplyContext, cmd: cpb.PurgeDeadLettersCmd) -> int:
    """Dead letters of ``cmd.queue`` deleted: only its own. A shared DLQ keeps the other
    queues' letters and anything published to it directly (all = at most
    PURGE_DEAD_LETTERS_PER_COMMAND_MAX per command; the server repeats it)."""
    origin = ctx.entry(cmd.queue, cmd.queue_id)
    dlq = dead_letter_entry(ctx.cat(), origin)
    if dlq is None:
        return 0
    txn = ctx.txn
    if cmd.all:
        chosen = list(
            itertools.islice(
                dls.letter_offsets(txn, dlq.queue_id, origin.name),
                limits.PURGE_DEAD_LETTERS_PER_COMMAND_MAX,
            )
        )
    else:
        chosen = [r.offset for r in _dead_letter_records(txn, dlq, origin, cmd.ids, False)]
    for offset in chosen:
        dls.remove(txn, dlq.queue_id, origin.name, offset)
    compact_dead_letters(txn, dlq, origin)
    return len(chosen)


def _dead_letter_records(
    txn: ReadTxn,
    dlq: QueueEntry,
    origin: QueueEntry,
    ids: Sequence[int],
    all_: bool,
    group: str = "",
) -> list[Record]:
    """The live dead letters of ``origin`` (all, maybe of one group, or those of ``ids``),
    read before any of them changes. "all" takes at most REPLAY_PER_COMMAND_MAX (the server
    repeats the command); ids are capped at the edge."""
    if all_:
        found = (
            r
            for r in dls.letters(txn, dlq.queue_id, origin.name)
            if not group or header(r, "fluxmq-group") == group.encode()
        )
        return list(itertools.islice(found, limits.REPLAY_PER_COMMAND_MAX))
    out = []
    for dl_id in sorted(set(ids)):
        record = dls.letter(txn, dlq.queue_id, origin.name, dl_id)
        if record is not None:
            out.append(record)
    return out


def compact_dead_letters(txn: WriteTxn, dlq: QueueEntry, origin: QueueEntry) -> None:
    """Move the DLQ's low watermark over the run of gone letters it starts with (a letter of
    another queue, or a message published to the DLQ directly, ends the run) and drop the
    rows left below it. Costs the run, not every gone row: a shared DLQ may keep many."""
    log = txn.log(keys.log_id(dlq.queue_id, 0))
    prefix = keys.DEAD_GONE + keys.U64.pack(dlq.queue_id)
    low = log.watermarks().low
    done = []
    for key, _ in txn.scan(prefix):  # rows below low: the DLQ's own retention or purge
        if keys.U64.unpack_from(key, len(prefix))[0] >= low:
            break
        done.append(key)
    cut = low
    for key, _ in txn.scan(prefix, keys.dead_gone_key(dlq.queue_id, low)):
        if keys.U64.unpack_from(key, len(prefix))[0] != cut:
            break
        done.append(key)
        cut += 1
    if cut > low:
        log.truncate_before(cut)
    for key in done:
        txn.delete(key)
    dls.drop_below(txn, dlq.queue_id, origin.name, cut)


def dead_letter_depth(txn: ReadTxn, catalog: Mapping[str, QueueEntry], origin: QueueEntry) -> int:
    """Dead letters of ``origin`` not replayed or purged (read-only, any thread); in a shared
    DLQ only its own."""
    dlq = dead_letter_entry(catalog, origin)
    if dlq is None:
        return 0
    return dls.count(txn, dlq.queue_id, origin.name)
