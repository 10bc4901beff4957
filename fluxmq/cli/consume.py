"""``fluxmqctl consume`` (Lease + Ack as a member of a consumer group) and ``fluxmqctl tail`` (the
Tail stream of a queue's partitions): print messages as they come."""

from __future__ import annotations

import argparse
import os
import socket
import sys
from typing import Any

from fluxmq._pb.v1 import queue_pb2 as pb
from fluxmq.cli.conn import Context, UsageError
from fluxmq.cli.output import (
    StreamTable,
    enum_short,
    message_dict,
    show_bytes,
    show_headers,
    show_key,
    show_time,
)
from fluxmq.cli.record_output import FormatError, RecordFormat, json_line
from fluxmq.cli.values import POSITIONS, non_negative, positive, start_position

LEASE_MAX = 1000
WAIT_MS_MAX = 60_000
TAIL_BATCH_MAX = 500


def register(sub: Any, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser(
        "consume",
        parents=[common],
        help="lease messages as a consumer group member, print and ack them",
        description="Leases up to --count messages for --group (long polls of --wait-ms), prints "
        "them and acks them once printed. Stops at --count or when a poll comes back empty. "
        "With --no-ack the messages stay leased until their lease ends (--lease-ms), then they "
        "are delivered again. With --nack they are given back instead (redelivered after the "
        "queue's retry backoff, or --retry-after-ms), with --dead they go to the dead-letter "
        "queue (--reason is kept in the dead letter's fluxmq-dead-reason header).",
    )
    p.add_argument("queue")
    p.add_argument("--group", "-g", required=True)
    p.add_argument("--count", "-n", type=positive, default=10, help="at most this many (10)")
    p.add_argument(
        "--wait-ms", type=non_negative, default=1000, help="long poll per lease (default 1000)"
    )
    settle = p.add_mutually_exclusive_group()
    settle.add_argument("--no-ack", action="store_true", help="print only; leave them leased")
    settle.add_argument(
        "--nack", action="store_true", help="give them back after printing: delivered again"
    )
    settle.add_argument(
        "--dead", action="store_true", help="after printing, send them to the dead-letter queue"
    )
    p.add_argument(
        "--retry-after-ms",
        type=non_negative,
        default=0,
        help="with --nack: redeliver after this long (default the queue's retry backoff)",
    )
    p.add_argument("--reason", default="", help="with --dead: why (kept in the dead letter)")
    _format_argument(p)
    p.add_argument("--lease-ms", type=non_negative, default=0, help="(default the queue's)")
    p.add_argument("--consumer-id", default="", help="(default fluxmqctl-<host>-<pid>)")
    p.set_defaults(handler=consume)

    p = sub.add_parser(
        "tail",
        parents=[common],
        help="stream a queue's records as they are appended",
        description="Follows the Tail stream until --count records were printed, the end was "
        "reached (--exit-at-end) or Ctrl-C (exit code 130). Reads only: no group, no offsets "
        "change.",
    )
    p.add_argument("queue")
    p.add_argument(
        "--partition",
        "-p",
        type=non_negative,
        action="append",
        default=[],
        help="repeatable (default every partition)",
    )
    p.add_argument(
        "--from",
        dest="start",
        type=start_position,
        default=pb.StartPosition(latest=True),
        metavar="POS",
        help=f"{POSITIONS} (default latest)",
    )
    p.add_argument("--count", "-n", type=positive, help="stop after this many records")
    p.add_argument(
        "--exit-at-end",
        "-e",
        action="store_true",
        help="stop at the end: once every partition was read up to its high watermark as of "
        "the start (kcat -e)",
    )
    _format_argument(p)
    p.set_defaults(handler=tail)


def _format_argument(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--format",
        "-f",
        type=_record_format,
        metavar="FMT",
        help="print each record with kcat's tokens instead of a table: %%s value, %%k key, "
        "%%p partition, %%o offset, %%T timestamp ms, %%t queue, %%h headers, %%a attempt, "
        "%%S value size, %%%% percent; \\n \\t escapes (e.g. '%%p:%%o %%s\\n')",
    )


def _record_format(text: str) -> RecordFormat:
    try:
        return RecordFormat(text)
    except FormatError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


def _one_by_one(ctx: Context, args: argparse.Namespace) -> bool:
    """Records printed one at a time (--format, -o jsonl), not in a table or one document."""
    return args.format is not None or ctx.out.jsonl


def _print_one(ctx: Context, args: argparse.Namespace, record: pb.Record, attempt: int = 0) -> None:
    if args.format is not None:
        ctx.out.raw(args.format.render(record, args.queue, attempt))
    else:
        ctx.out.json_line(json_line(record, args.queue, attempt))


def consume(args: argparse.Namespace, ctx: Context) -> int:
    if args.wait_ms > WAIT_MS_MAX:
        raise UsageError(f"--wait-ms: at most {WAIT_MS_MAX}")
    if args.retry_after_ms and not args.nack:
        raise UsageError("--retry-after-ms: only with --nack")
    if args.reason and not args.dead:
        raise UsageError("--reason: only with --dead")
    consumer_id = args.consumer_id or f"fluxmqctl-{socket.gethostname()}-{os.getpid()}"
    table = StreamTable(ctx.out, ["PARTITION", "OFFSET", "ATTEMPT", "KEY", "HEADERS", "VALUE"])
    kept: list[dict[str, Any]] = []  # -o json: printed at the end, acked after that
    unacked: list[pb.Receipt] = []
    remaining = args.count
    while remaining > 0:
        resp = ctx.conn.call(
            ctx.conn.queues.Lease,
            pb.LeaseRequest(
                queue=args.queue,
                group=args.group,
                consumer_id=consumer_id,
                max_messages=min(remaining, LEASE_MAX),
                lease_ms=args.lease_ms,
                wait_ms=args.wait_ms,
            ),
            wait_s=args.wait_ms / 1000,
        )
        if not resp.messages:
            break
        remaining -= len(resp.messages)
        if _one_by_one(ctx, args):
            for m in resp.messages:
                _print_one(ctx, args, m.record, m.receipt.attempt)
            if not args.no_ack:
                _settle(ctx, args, [m.receipt for m in resp.messages])
            continue
        if ctx.out.json:
            kept.extend(message_dict(m) for m in resp.messages)
            unacked.extend(m.receipt for m in resp.messages)
            continue
        table.rows(
            [
                [
                    m.record.partition,
                    m.record.offset,
                    m.receipt.attempt,
                    show_key(m.record),
                    show_headers(m.record.headers, skip_reserved=True),
                    show_bytes(m.record.value),
                ]
                for m in resp.messages
            ]
        )
        if not args.no_ack:
            _settle(ctx, args, [m.receipt for m in resp.messages])
    if ctx.out.json and not _one_by_one(ctx, args):
        settled = _settled_as(args)
        ctx.out.doc({"messages": kept, "acked": settled == "acked", "settled": settled})
        if not args.no_ack:
            for i in range(0, len(unacked), LEASE_MAX):
                _settle(ctx, args, unacked[i : i + LEASE_MAX])
    return 0


def _settled_as(args: argparse.Namespace) -> str:
    """What was done with the printed messages: acked, nacked, dead or left leased."""
    if args.no_ack:
        return "leased"
    return "dead" if args.dead else "nacked" if args.nack else "acked"


def _settle(ctx: Context, args: argparse.Namespace, receipts: list[pb.Receipt]) -> None:
    """Ack the printed messages, or nack them (--nack, --dead)."""
    if args.nack or args.dead:
        nacked = ctx.conn.call(
            ctx.conn.queues.Nack,
            pb.NackRequest(
                queue=args.queue,
                group=args.group,
                receipts=receipts,
                retry_after_ms=args.retry_after_ms,
                dead=args.dead,
                reason=args.reason,
            ),
        )
        _warn(receipts, nacked.statuses, (pb.RECEIPT_STATUS_NACKED,), "nacked")
        return
    resp = ctx.conn.call(
        ctx.conn.queues.Ack, pb.AckRequest(queue=args.queue, group=args.group, receipts=receipts)
    )
    _warn(
        receipts,
        resp.statuses,
        (pb.RECEIPT_STATUS_ACKED, pb.RECEIPT_STATUS_ALREADY_ACKED),
        "acked",
    )


def _warn(receipts: list[pb.Receipt], statuses: Any, ok: tuple[int, ...], done: str) -> None:
    bad = [
        f"{r.partition}/{r.offset}: {enum_short(pb.ReceiptStatus.DESCRIPTOR, s)}"
        for r, s in zip(receipts, statuses, strict=False)
        if s not in ok
    ]
    if bad:
        # The lease ended before the ack (e.g. a slow terminal): they will come again.
        print(f"warning: not {done}: {', '.join(bad)}", flush=True, file=sys.stderr)


def _ends(args: argparse.Namespace, ctx: Context) -> dict[int, int]:
    """--exit-at-end: partition -> the offset where reading it ends (its high watermark now),
    for the partitions that still have records to read from the start position."""
    stats: pb.QueueStats = ctx.conn.call(
        ctx.conn.queues.GetQueueStats, pb.GetQueueStatsRequest(name=args.queue)
    )
    wanted = set(args.partition)
    unknown = sorted(wanted - {p.partition for p in stats.partitions})
    if unknown:
        raise UsageError(f"--partition: {args.queue!r} has no partition {unknown[0]}")
    ends: dict[int, int] = {}
    for part in stats.partitions:
        if wanted and part.partition not in wanted:
            continue
        which = args.start.WhichOneof("position") or "earliest"
        if which == "latest":
            continue
        start = part.low_watermark
        if which == "offset":
            start = max(start, args.start.offset)
        elif which == "timestamp_ms":
            sought: pb.SeekToTimestampResponse = ctx.conn.call(
                ctx.conn.queues.SeekToTimestamp,
                pb.SeekToTimestampRequest(
                    queue=args.queue,
                    partition=part.partition,
                    timestamp_ms=args.start.timestamp_ms,
                ),
            )
            start = max(start, sought.offset)
        if start < part.high_watermark:
            ends[part.partition] = part.high_watermark
    return ends


def tail(args: argparse.Namespace, ctx: Context) -> int:
    ends = _ends(args, ctx) if args.exit_at_end else None
    one_by_one = _one_by_one(ctx, args)
    if ends is not None and not ends:  # nothing to read up to the end
        if ctx.out.json and not one_by_one:
            ctx.out.doc({"records": []})
        return 0
    request = pb.TailRequest(
        queue=args.queue,
        partitions=args.partition,
        start=args.start,
        max_messages=min(args.count or TAIL_BATCH_MAX, TAIL_BATCH_MAX),
    )
    table = StreamTable(ctx.out, ["PARTITION", "OFFSET", "TIME", "KEY", "HEADERS", "VALUE"])
    kept: list[dict[str, Any]] = []
    seen = 0
    stream = ctx.conn.stream(ctx.conn.queues.Tail, request)
    try:
        for resp in stream:
            records = list(resp.records)
            if args.count is not None:
                records = records[: args.count - seen]
            seen += len(records)
            if one_by_one:
                for r in records:
                    _print_one(ctx, args, r)
            elif ctx.out.json:
                kept.extend(message_dict(r) for r in records)
            else:
                table.rows(
                    [
                        [
                            r.partition,
                            r.offset,
                            show_time(r.timestamp_ms),
                            show_key(r),
                            show_headers(r.headers),
                            show_bytes(r.value),
                        ]
                        for r in records
                    ]
                )
            if ends is not None:
                for r in resp.records:
                    if r.partition in ends and r.offset + 1 >= ends[r.partition]:
                        del ends[r.partition]
            if args.count is not None and seen >= args.count:
                break
            if ends is not None and not ends:
                break
    except KeyboardInterrupt:
        if ctx.out.json and not one_by_one:  # what was read so far is still one document
            ctx.out.doc({"records": kept})
        raise
    finally:
        stream.close()  # cancels the call
    if ctx.out.json and not one_by_one:
        ctx.out.doc({"records": kept})
    return 0
