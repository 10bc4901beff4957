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
        "are delivered again.",
    )
    p.add_argument("queue")
    p.add_argument("--group", "-g", required=True)
    p.add_argument("--count", "-n", type=positive, default=10, help="at most this many (10)")
    p.add_argument(
        "--wait-ms", type=non_negative, default=1000, help="long poll per lease (default 1000)"
    )
    p.add_argument("--no-ack", action="store_true", help="print only; leave them leased")
    p.add_argument("--lease-ms", type=non_negative, default=0, help="(default the queue's)")
    p.add_argument("--consumer-id", default="", help="(default fluxmqctl-<host>-<pid>)")
    p.set_defaults(handler=consume)

    p = sub.add_parser(
        "tail",
        parents=[common],
        help="stream a queue's records as they are appended",
        description="Follows the Tail stream until --count records were printed or Ctrl-C "
        "(exit code 130). Reads only: no group, no offsets change.",
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
    p.set_defaults(handler=tail)


def consume(args: argparse.Namespace, ctx: Context) -> int:
    if args.wait_ms > WAIT_MS_MAX:
        raise UsageError(f"--wait-ms: at most {WAIT_MS_MAX}")
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
            _ack(ctx, args, [m.receipt for m in resp.messages])
    if ctx.out.json:
        ctx.out.doc({"messages": kept, "acked": not args.no_ack})
        if not args.no_ack:
            for i in range(0, len(unacked), LEASE_MAX):
                _ack(ctx, args, unacked[i : i + LEASE_MAX])
    return 0


def _ack(ctx: Context, args: argparse.Namespace, receipts: list[pb.Receipt]) -> None:
    resp = ctx.conn.call(
        ctx.conn.queues.Ack, pb.AckRequest(queue=args.queue, group=args.group, receipts=receipts)
    )
    ok = (pb.RECEIPT_STATUS_ACKED, pb.RECEIPT_STATUS_ALREADY_ACKED)
    bad = [
        f"{r.partition}/{r.offset}: {enum_short(pb.ReceiptStatus.DESCRIPTOR, s)}"
        for r, s in zip(receipts, resp.statuses, strict=False)
        if s not in ok
    ]
    if bad:
        # The lease ended before the ack (e.g. a slow terminal): they will come again.
        print(f"warning: not acked: {', '.join(bad)}", flush=True, file=sys.stderr)


def tail(args: argparse.Namespace, ctx: Context) -> int:
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
            if ctx.out.json:
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
            if args.count is not None and seen >= args.count:
                break
    except KeyboardInterrupt:
        if ctx.out.json:  # what was read so far is still one document
            ctx.out.doc({"records": kept})
        raise
    finally:
        stream.close()  # cancels the call
    if ctx.out.json:
        ctx.out.doc({"records": kept})
    return 0
