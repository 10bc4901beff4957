"""``fluxmqctl offsets get|seek``: a group's committed offsets, and CommitOffsets (checkpointing
a stream queue by hand)."""

from __future__ import annotations

import argparse
from typing import Any

from fluxmq._pb.v1 import queue_pb2 as pb
from fluxmq.cli.conn import Context
from fluxmq.cli.output import message_dict
from fluxmq.cli.values import non_negative


def register(sub: Any, common: argparse.ArgumentParser) -> None:
    noun = sub.add_parser("offsets", help="a group's offsets: get, seek")
    verbs = noun.add_subparsers(dest="verb", required=True, metavar="VERB")

    p = verbs.add_parser("get", parents=[common], help="committed, latest and lag per partition")
    p.add_argument("queue")
    p.add_argument("group")
    p.set_defaults(handler=get)

    p = verbs.add_parser(
        "seek",
        parents=[common],
        help="commit an offset of a stream queue (CommitOffsets)",
        description="Sets the group's committed offset of one partition of a stream queue: the "
        "next offset to read. Work queues move their offsets with acks: use group reset-offsets.",
    )
    p.add_argument("queue")
    p.add_argument("group")
    p.add_argument("--partition", "-p", type=non_negative, required=True)
    p.add_argument("--offset", type=non_negative, required=True)
    p.set_defaults(handler=seek)


def get(args: argparse.Namespace, ctx: Context) -> int:
    resp = ctx.conn.call(
        ctx.conn.queues.GetOffsets, pb.GetOffsetsRequest(queue=args.queue, group=args.group)
    )
    show_offsets(ctx, resp)
    return 0


def seek(args: argparse.Namespace, ctx: Context) -> int:
    resp = ctx.conn.call(
        ctx.conn.queues.CommitOffsets,
        pb.CommitOffsetsRequest(
            queue=args.queue, group=args.group, offsets={args.partition: args.offset}
        ),
    )
    show_offsets(ctx, resp)
    return 0


def show_offsets(ctx: Context, resp: pb.OffsetsResponse) -> None:
    if ctx.out.json:
        ctx.out.doc(message_dict(resp))
        return
    ctx.out.table(
        ["PARTITION", "COMMITTED", "LATEST", "LAG"],
        [[p.partition, p.committed, p.latest, p.lag] for p in resp.partitions],
    )
