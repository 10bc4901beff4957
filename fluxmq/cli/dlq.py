"""``fluxmqctl dlq list|replay|purge``: the dead letters of a queue (its own only: queues that
share one dead-letter queue never see or touch each other's letters)."""

from __future__ import annotations

import argparse
from typing import Any

from fluxmq._pb.v1 import queue_pb2 as pb
from fluxmq.cli.conn import Context, UsageError, confirm
from fluxmq.cli.output import message_dict, show_bytes, show_key, show_time
from fluxmq.cli.values import non_negative, positive

PAGE_MAX = 1000


def register(sub: Any, common: argparse.ArgumentParser) -> None:
    noun = sub.add_parser("dlq", help="dead letters of a queue: list, replay, purge")
    verbs = noun.add_subparsers(dest="verb", required=True, metavar="VERB")

    p = verbs.add_parser("list", parents=[common], help="dead letters, oldest first")
    p.add_argument("queue", help="the origin queue")
    p.add_argument("--group", "-g", default="", help="only this group's")
    p.add_argument("--limit", type=positive, default=100, help="at most this many (100)")
    p.add_argument("--from-ms", type=non_negative, default=0, help="dead at or after")
    p.add_argument("--to-ms", type=non_negative, default=0, help="dead before")
    p.set_defaults(handler=list_dead)

    p = verbs.add_parser(
        "replay",
        parents=[common],
        help="send dead letters back to the queue (for the group that dead-lettered them)",
    )
    p.add_argument("queue", help="the origin queue")
    _select(p)
    p.add_argument("--group", "-g", default="", help="with --all: only this group's")
    p.set_defaults(handler=replay)

    p = verbs.add_parser("purge", parents=[common], help="delete dead letters")
    p.add_argument("queue", help="the origin queue")
    _select(p)
    p.add_argument("--yes", "-y", action="store_true", help="do not ask")
    p.set_defaults(handler=purge)


def _select(p: argparse.ArgumentParser) -> None:
    which = p.add_mutually_exclusive_group(required=True)
    which.add_argument(
        "--id",
        dest="ids",
        metavar="ID",
        type=non_negative,
        action="append",
        help="a dead letter's id",
    )
    which.add_argument("--all", action="store_true", help="every dead letter of the queue")


def list_dead(args: argparse.Namespace, ctx: Context) -> int:
    dead: list[pb.DeadLetter] = []
    token = ""
    while len(dead) < args.limit:
        resp = ctx.conn.call(
            ctx.conn.queues.ListDeadLetters,
            pb.ListDeadLettersRequest(
                queue=args.queue,
                group=args.group,
                from_ms=args.from_ms,
                to_ms=args.to_ms,
                page_token=token,
                limit=min(args.limit - len(dead), PAGE_MAX),
            ),
        )
        dead.extend(resp.dead_letters)
        token = resp.next_page_token
        if not token:
            break
    dead = dead[: args.limit]
    if ctx.out.json:
        ctx.out.doc({"dead_letters": [message_dict(d) for d in dead], "more": bool(token)})
        return 0
    ctx.out.table(
        ["ID", "GROUP", "REASON", "ATTEMPTS", "DEAD_AT", "FROM", "KEY", "VALUE"],
        [
            [
                d.id,
                d.group or "-",
                d.reason or "-",
                d.attempts,
                show_time(d.dead_at_ms),
                f"{d.original_partition}/{d.original_offset}",
                show_key(d.record),
                show_bytes(d.record.value),
            ]
            for d in dead
        ],
    )
    if token:
        ctx.out.line(f"(more than {len(dead)}: raise --limit)")
    return 0


def replay(args: argparse.Namespace, ctx: Context) -> int:
    if args.group and not args.all:
        raise UsageError("--group goes with --all")
    resp = ctx.conn.call(
        ctx.conn.queues.ReplayDeadLetters,
        pb.ReplayDeadLettersRequest(
            queue=args.queue, ids=args.ids or [], all=args.all, group=args.group
        ),
    )
    if ctx.out.json:
        ctx.out.doc(message_dict(resp))
    else:
        ctx.out.line(f"replayed {resp.replayed} dead letters to {args.queue}")
    return 0


def purge(args: argparse.Namespace, ctx: Context) -> int:
    what = "every dead letter" if args.all else f"{len(args.ids)} dead letter(s)"
    confirm(f"Delete {what} of queue {args.queue!r} (other queues' letters stay)?", args.yes)
    resp = ctx.conn.call(
        ctx.conn.queues.PurgeDeadLetters,
        pb.PurgeDeadLettersRequest(queue=args.queue, ids=args.ids or [], all=args.all),
    )
    if ctx.out.json:
        ctx.out.doc(message_dict(resp))
    else:
        ctx.out.line(f"purged {resp.purged} dead letters of {args.queue}")
    return 0
