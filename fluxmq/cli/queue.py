"""``fluxmqctl queue create|list|describe|update|delete|purge|stats``."""

from __future__ import annotations

import argparse
from typing import Any

from google.protobuf import field_mask_pb2

from fluxmq._pb.v1 import queue_pb2 as pb
from fluxmq.cli.conn import CliError, Context, UsageError, confirm
from fluxmq.cli.output import enum_short, flatten, message_dict, show_time
from fluxmq.cli.values import key_value, non_negative, positive, set_field

LIST_PAGE_MAX = 1000
UPDATABLE = (
    "partitions, retention.max_age, retention.max_messages, retention.max_bytes, dedup_window, "
    "max_message_bytes, labels (k=v,k2=v2), lease_timeout, max_attempts, retry_backoff.base, "
    "retry_backoff.max, message_ttl, delivery_delay, dead_letter_queue, dead_letter_disabled, "
    "retain_until_consumed, dead_letter_alert_threshold"
)
_SCOPES = {
    "ready": pb.PURGE_SCOPE_READY,
    "scheduled": pb.PURGE_SCOPE_SCHEDULED,
    "all": pb.PURGE_SCOPE_ALL,
}


def register(sub: Any, common: argparse.ArgumentParser) -> None:
    noun = sub.add_parser("queue", help="create, list, describe, update, delete, purge queues")
    verbs = noun.add_subparsers(dest="verb", required=True, metavar="VERB")

    p = verbs.add_parser("create", parents=[common], help="create a queue")
    p.add_argument("name")
    p.add_argument("--partitions", type=positive, default=0, help="1..1024 (default 1)")
    p.add_argument("--type", choices=("stream", "work"), default="stream", help="(default stream)")
    p.add_argument("--retention-max-age", metavar="DURATION", default="", help='e.g. "7d"')
    p.add_argument("--retention-max-messages", metavar="N", type=non_negative, default=0)
    p.add_argument("--retention-max-bytes", metavar="SIZE", default="", help='e.g. "10GiB"')
    p.add_argument("--dedup-window", metavar="DURATION", default="")
    p.add_argument("--max-attempts", type=non_negative, default=0, help="0 = unlimited")
    p.add_argument("--lease-timeout", metavar="DURATION", default="", help='(default "30s")')
    p.add_argument("--dlq", metavar="NAME", default="", help='dead-letter queue ("<name>.dlq")')
    p.add_argument(
        "--no-dlq",
        action="store_true",
        help="no dead-letter queue: dead messages are dropped (and counted); an empty queue "
        "made so can be named as other queues' shared DLQ (--dlq)",
    )
    p.add_argument("--replication-factor", metavar="N", type=non_negative, default=0)
    p.add_argument("--group", metavar="G", default="", help="replication group (Raft shard)")
    p.add_argument(
        "--label", metavar="K=V", type=key_value, action="append", default=[], help="repeatable"
    )
    p.add_argument(
        "--exist-ok",
        action="store_true",
        help="a queue of that name is no error: show it as it is (its config unchanged)",
    )
    p.set_defaults(handler=create)

    p = verbs.add_parser("list", parents=[common], help="list queues (every page)")
    p.add_argument("--prefix", default="")
    p.add_argument("--selector", default="", metavar="K=V,...", help="labels, e.g. team=pay")
    p.add_argument("--limit", type=positive, default=0, help="show at most this many")
    p.add_argument(
        "--page-size", type=positive, default=LIST_PAGE_MAX, help="queues per request (1000)"
    )
    p.set_defaults(handler=list_queues)

    p = verbs.add_parser("describe", parents=[common], help="a queue's configuration")
    p.add_argument("name")
    p.set_defaults(handler=describe)

    p = verbs.add_parser(
        "update",
        parents=[common],
        help="change fields of a queue",
        description=f"Changes only the fields given (update mask). Fields: {UPDATABLE}.",
    )
    p.add_argument("name")
    p.add_argument(
        "--set",
        dest="assignments",
        metavar="FIELD=VALUE",
        type=key_value,
        action="append",
        required=True,
        help="repeatable, e.g. --set max_attempts=5 --set retention.max_age=3d",
    )
    p.set_defaults(handler=update)

    p = verbs.add_parser("delete", parents=[common], help="delete a queue and its messages")
    p.add_argument("name")
    p.add_argument("--yes", "-y", action="store_true", help="do not ask")
    p.set_defaults(handler=delete)

    p = verbs.add_parser("purge", parents=[common], help="drop messages waiting for delivery")
    p.add_argument("name")
    p.add_argument("--scope", choices=tuple(_SCOPES), required=True)
    p.add_argument("--destructive", action="store_true", help="also revoke every lease")
    p.add_argument("--yes", "-y", action="store_true", help="do not ask")
    p.set_defaults(handler=purge)

    p = verbs.add_parser("stats", parents=[common], help="partitions, sizes, group lag")
    p.add_argument("name")
    p.set_defaults(handler=stats)


def create(args: argparse.Namespace, ctx: Context) -> int:
    config = pb.QueueConfig(
        name=args.name,
        partitions=args.partitions,
        type=pb.QUEUE_TYPE_WORK if args.type == "work" else pb.QUEUE_TYPE_STREAM,
        retention=pb.Retention(
            max_age=args.retention_max_age,
            max_messages=args.retention_max_messages,
            max_bytes=args.retention_max_bytes,
        ),
        dedup_window=args.dedup_window,
        max_attempts=args.max_attempts,
        lease_timeout=args.lease_timeout,
        dead_letter_queue=args.dlq,
        dead_letter_disabled=args.no_dlq,
        replication=pb.Replication(factor=args.replication_factor, group=args.group),
        labels=dict(args.label),
    )
    try:
        queue = ctx.conn.call(ctx.conn.queues.CreateQueue, pb.CreateQueueRequest(config=config))
    except CliError as err:
        if not (args.exist_ok and err.reason == "QUEUE_EXISTS"):
            raise
        queue = ctx.conn.call(ctx.conn.queues.GetQueue, pb.GetQueueRequest(name=args.name))
    _show_queue(ctx, queue)
    return 0


def list_queues(args: argparse.Namespace, ctx: Context) -> int:
    queues: list[pb.Queue] = []
    token = ""
    while True:
        want = args.limit - len(queues) if args.limit else args.page_size
        resp = ctx.conn.call(
            ctx.conn.queues.ListQueues,
            pb.ListQueuesRequest(
                prefix=args.prefix,
                label_selector=args.selector,
                page_token=token,
                limit=min(want, args.page_size, LIST_PAGE_MAX),
            ),
        )
        queues.extend(resp.queues)
        token = resp.next_page_token
        if not token or (args.limit and len(queues) >= args.limit):
            break
    if args.limit:
        queues = queues[: args.limit]
    if ctx.out.json:
        ctx.out.doc({"queues": [message_dict(q) for q in queues]})
        return 0
    rows = []
    for q in queues:
        c = q.config
        rows.append(
            [
                c.name,
                enum_short(pb.QueueType.DESCRIPTOR, c.type),
                c.partitions,
                c.retention.max_age or "-",
                c.replication.group or "-",
                ",".join(f"{k}={v}" for k, v in sorted(c.labels.items())) or "-",
                q.dead_letter_of or "-",
            ]
        )
    ctx.out.table(["NAME", "TYPE", "PARTITIONS", "MAX_AGE", "GROUP", "LABELS", "DLQ_OF"], rows)
    return 0


def describe(args: argparse.Namespace, ctx: Context) -> int:
    queue = ctx.conn.call(ctx.conn.queues.GetQueue, pb.GetQueueRequest(name=args.name))
    _show_queue(ctx, queue)
    return 0


def update(args: argparse.Namespace, ctx: Context) -> int:
    config = pb.QueueConfig(name=args.name)
    paths: list[str] = []
    for path, value in args.assignments:
        if path == "name":
            raise UsageError("--set name: a queue cannot be renamed")
        set_field(config, path, value)
        if path not in paths:
            paths.append(path)
    request = pb.UpdateQueueRequest(
        config=config, update_mask=field_mask_pb2.FieldMask(paths=paths)
    )
    queue = ctx.conn.call(ctx.conn.queues.UpdateQueue, request)
    _show_queue(ctx, queue)
    return 0


def delete(args: argparse.Namespace, ctx: Context) -> int:
    confirm(f"Delete queue {args.name!r} and every message in it?", args.yes)
    ctx.conn.call(ctx.conn.queues.DeleteQueue, pb.DeleteQueueRequest(name=args.name))
    if ctx.out.json:
        ctx.out.doc({"deleted": args.name})
    else:
        ctx.out.line(f"queue {args.name} deleted")
    return 0


def purge(args: argparse.Namespace, ctx: Context) -> int:
    what = f"{args.scope} messages" + (" and every lease" if args.destructive else "")
    confirm(f"Purge the {what} of queue {args.name!r}?", args.yes)
    resp = ctx.conn.call(
        ctx.conn.queues.PurgeQueue,
        pb.PurgeQueueRequest(
            name=args.name, scope=_SCOPES[args.scope], destructive=args.destructive
        ),
    )
    if ctx.out.json:
        ctx.out.doc(message_dict(resp))
    else:
        ctx.out.line(
            f"queue {args.name} purged ({args.scope}): {resp.purged_messages} records removed, "
            f"{resp.skipped_deliveries} deliveries dropped"
        )
    return 0


def stats(args: argparse.Namespace, ctx: Context) -> int:
    st = ctx.conn.call(ctx.conn.queues.GetQueueStats, pb.GetQueueStatsRequest(name=args.name))
    if ctx.out.json:
        ctx.out.doc(message_dict(st))
        return 0
    ctx.out.fields(
        [
            ("queue", st.name),
            ("messages", st.messages),
            ("bytes", st.bytes),
            ("dead letters", st.dead_letters),
        ]
    )
    ctx.out.line()
    ctx.out.table(
        ["PARTITION", "LOW", "HIGH", "MESSAGES", "BYTES"],
        [
            [p.partition, p.low_watermark, p.high_watermark, p.messages, p.bytes]
            for p in st.partitions
        ],
    )
    if st.groups:
        ctx.out.line()
        ctx.out.table(
            ["GROUP", "LAG", "IN_FLIGHT", "SCHEDULED"],
            [[g.name, g.lag, g.in_flight, g.scheduled] for g in st.groups],
        )
    return 0


def _show_queue(ctx: Context, queue: pb.Queue) -> None:
    if ctx.out.json:
        ctx.out.doc(message_dict(queue))
        return
    pairs: list[tuple[str, object]] = list(flatten(queue.config))
    pairs += [
        ("queue_id", queue.queue_id),
        ("created", show_time(queue.created_at_ms)),
        ("updated", show_time(queue.updated_at_ms)),
    ]
    if queue.dead_letter_of:
        pairs.append(("dead_letter_of", queue.dead_letter_of))
    ctx.out.fields(pairs)
