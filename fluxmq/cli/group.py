"""``fluxmqctl group list|describe|create|reset-offsets|delete``: consumer groups of a queue."""

from __future__ import annotations

import argparse
from typing import Any

from fluxmq._pb.v1 import queue_pb2 as pb
from fluxmq.cli.conn import CliError, Context, confirm
from fluxmq.cli.offsets import show_offsets
from fluxmq.cli.output import enum_short, message_dict, show_bytes, show_time
from fluxmq.cli.values import POSITIONS, key_value, non_negative, show_position, start_position

_MODES = {"shared": pb.DELIVERY_MODE_SHARED, "ordered": pb.DELIVERY_MODE_ORDERED}


def register(sub: Any, common: argparse.ArgumentParser) -> None:
    noun = sub.add_parser("group", help="consumer groups: list, describe, create, reset, delete")
    verbs = noun.add_subparsers(dest="verb", required=True, metavar="VERB")

    p = verbs.add_parser("list", parents=[common], help="the groups of a queue")
    p.add_argument("queue")
    p.set_defaults(handler=list_groups)

    p = verbs.add_parser(
        "describe", parents=[common], help="partitions, lag, in-flight, members, generations"
    )
    p.add_argument("queue")
    p.add_argument("group")
    p.set_defaults(handler=describe)

    p = verbs.add_parser("create", parents=[common], help="create a consumer group")
    p.add_argument("queue")
    p.add_argument("group")
    p.add_argument("--mode", choices=tuple(_MODES), default="shared", help="(default shared)")
    p.add_argument(
        "--start",
        type=start_position,
        metavar="POS",
        help=f"where the group starts: {POSITIONS} (default earliest)",
    )
    p.add_argument(
        "--filter-header",
        metavar="K=V",
        type=key_value,
        action="append",
        default=[],
        help="deliver only messages with this header value (repeatable)",
    )
    p.add_argument("--filter-key-prefix", metavar="PREFIX", help="only keys with this prefix")
    p.add_argument(
        "--exist-ok",
        action="store_true",
        help="a group of that name is no error: show it as it is (unchanged)",
    )
    p.set_defaults(handler=create)

    p = verbs.add_parser(
        "reset-offsets",
        parents=[common],
        help="replay or skip: restart delivery at a position",
        description="Drops the leases and retries of the chosen partitions (default every "
        "partition) and restarts delivery at --to. --dry-run shows, per partition, where it "
        "would restart, how many messages that replays (+) or skips (-), and the leases and "
        "retries it would drop, and changes nothing.",
    )
    p.add_argument("queue")
    p.add_argument("group")
    p.add_argument("--to", type=start_position, required=True, metavar="POS", help=POSITIONS)
    p.add_argument(
        "--partition", "-p", type=non_negative, action="append", default=[], help="repeatable"
    )
    p.add_argument("--dry-run", action="store_true", help="show what would move, change nothing")
    p.set_defaults(handler=reset_offsets)

    p = verbs.add_parser("delete", parents=[common], help="delete a consumer group")
    p.add_argument("queue")
    p.add_argument("group")
    p.add_argument("--yes", "-y", action="store_true", help="do not ask")
    p.set_defaults(handler=delete)


def list_groups(args: argparse.Namespace, ctx: Context) -> int:
    resp = ctx.conn.call(ctx.conn.queues.ListGroups, pb.ListGroupsRequest(queue=args.queue))
    if ctx.out.json:
        ctx.out.doc(message_dict(resp))
        return 0
    ctx.out.table(
        ["GROUP", "MODE", "START", "FILTER", "CREATED"],
        [
            [
                g.name,
                enum_short(pb.DeliveryMode.DESCRIPTOR, g.mode),
                show_position(g.start),
                _show_filter(g.filter),
                show_time(g.created_at_ms),
            ]
            for g in resp.groups
        ],
    )
    return 0


def describe(args: argparse.Namespace, ctx: Context) -> int:
    d = ctx.conn.call(
        ctx.conn.queues.DescribeGroup, pb.DescribeGroupRequest(queue=args.queue, group=args.group)
    )
    if ctx.out.json:
        ctx.out.doc(message_dict(d))
        return 0
    g = d.group
    ctx.out.fields(
        [
            ("queue", g.queue),
            ("group", g.name),
            ("mode", enum_short(pb.DeliveryMode.DESCRIPTOR, g.mode)),
            ("start", show_position(g.start)),
            ("filter", _show_filter(g.filter)),
            ("created", show_time(g.created_at_ms)),
            ("generation", d.group_generation),
            ("strategy", d.strategy or "-"),
            ("lag", sum(p.lag for p in d.partitions)),
            ("in flight", sum(p.in_flight for p in d.partitions)),
        ]
    )
    ctx.out.line()
    ctx.out.table(
        [
            "PARTITION",
            "COMMITTED",
            "HIGH",
            "LAG",
            "IN_FLIGHT",
            "SCHEDULED",
            "DEAD",
            "ACKED",
            "FILTERED",
            "SKIPPED",
        ],
        [
            [
                p.partition,
                p.committed,
                p.high_watermark,
                p.lag,
                p.in_flight,
                p.scheduled,
                p.dead,
                p.acked,
                p.filtered,
                p.skipped_by_retention,
            ]
            for p in d.partitions
        ],
    )
    ctx.out.line()
    if d.members:
        ctx.out.table(
            [
                "MEMBER",
                "CONSUMER",
                "GENERATION",
                "ASSIGNED",
                "REVOKING",
                "PENDING",
                "SESSION_MS",
                "JOINED",
            ],
            [
                [
                    m.member_id,
                    m.consumer_id,
                    m.generation_id,
                    _parts(m.assigned),
                    _parts(m.revoking),
                    _parts(m.pending),
                    m.session_timeout_ms,
                    show_time(m.joined_at_ms),
                ]
                for m in d.members
            ],
        )
    else:
        ctx.out.line("members: none joined")
    if d.in_flight_by_consumer:
        ctx.out.line()
        ctx.out.table(["CONSUMER", "IN_FLIGHT"], sorted(d.in_flight_by_consumer.items()))
    if d.streaming:
        ctx.out.line()
        ctx.out.table(
            ["STREAMING", "MAX_IN_FLIGHT", "LEASE_MS", "MEMBER"],
            [[s.consumer_id, s.max_in_flight, s.lease_ms, s.member_id or "-"] for s in d.streaming],
        )
    return 0


def create(args: argparse.Namespace, ctx: Context) -> int:
    request = pb.CreateGroupRequest(
        queue=args.queue,
        group=args.group,
        mode=_MODES[args.mode],
        filter=pb.GroupFilter(header_equals={k: v.encode() for k, v in args.filter_header}),
    )
    if args.start is not None:
        request.start.CopyFrom(args.start)
    if args.filter_key_prefix is not None:
        request.filter.key_prefix = args.filter_key_prefix.encode()
    try:
        g = ctx.conn.call(ctx.conn.queues.CreateGroup, request)
    except CliError as err:
        if not (args.exist_ok and err.reason == "GROUP_EXISTS"):
            raise
        described = ctx.conn.call(
            ctx.conn.queues.DescribeGroup,
            pb.DescribeGroupRequest(queue=args.queue, group=args.group),
        )
        g = described.group
    if ctx.out.json:
        ctx.out.doc(message_dict(g))
        return 0
    ctx.out.fields(
        [
            ("queue", g.queue),
            ("group", g.name),
            ("mode", enum_short(pb.DeliveryMode.DESCRIPTOR, g.mode)),
            ("start", show_position(g.start)),
            ("filter", _show_filter(g.filter)),
            ("group_id", g.group_id),
            ("created", show_time(g.created_at_ms)),
        ]
    )
    return 0


def reset_offsets(args: argparse.Namespace, ctx: Context) -> int:
    resp: pb.OffsetsResponse = ctx.conn.call(
        ctx.conn.queues.ResetOffsets,
        pb.ResetOffsetsRequest(
            queue=args.queue,
            group=args.group,
            partitions=args.partition,
            to=args.to,
            dry_run=args.dry_run,
        ),
    )
    if not args.dry_run:
        show_offsets(ctx, resp)
        return 0
    if ctx.out.json:
        ctx.out.doc({**message_dict(resp), "dry_run": True})
        return 0
    ctx.out.table(
        ["PARTITION", "COMMITTED", "RESET_TO", "MOVE", "LATEST", "IN_FLIGHT", "SCHEDULED"],
        [
            [
                p.partition,
                p.committed,
                p.reset_to,
                f"{p.committed - p.reset_to:+d}" if p.reset_to != p.committed else "0",
                p.latest,
                p.in_flight,
                p.scheduled,
            ]
            for p in resp.partitions
        ],
    )
    ctx.out.line(
        "dry run: nothing changed (MOVE: + replays that many messages, - skips them; "
        "IN_FLIGHT and SCHEDULED are dropped)"
    )
    return 0


def delete(args: argparse.Namespace, ctx: Context) -> int:
    confirm(f"Delete group {args.group!r} of queue {args.queue!r} and its offsets?", args.yes)
    ctx.conn.call(
        ctx.conn.queues.DeleteGroup, pb.DeleteGroupRequest(queue=args.queue, group=args.group)
    )
    if ctx.out.json:
        ctx.out.doc({"deleted": {"queue": args.queue, "group": args.group}})
    else:
        ctx.out.line(f"group {args.group} of queue {args.queue} deleted")
    return 0


def _parts(partitions: Any) -> str:
    return ",".join(str(p) for p in partitions) or "-"


def _show_filter(f: pb.GroupFilter) -> str:
    terms = [f"{k}={show_bytes(v)}" for k, v in sorted(f.header_equals.items())]
    if f.HasField("key_prefix"):
        terms.append(f"key^={show_bytes(f.key_prefix)}")
    return ",".join(terms) or "-"
