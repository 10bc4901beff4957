"""Transact: acks and appends of one shard's queues, all or nothing. The leader builds each part
as Ack and Publish would (their field paths nested under ``acks[i]`` / ``publishes[i]``); the
apply checks every part before it writes any."""

from __future__ import annotations

from fluxmq._pb.internal import commands_pb2 as cpb
from fluxmq._pb.v1 import queue_pb2 as pb
from fluxmq.core.catalog import find_entry
from fluxmq.core.commands.append import append_checked, check_append
from fluxmq.core.commands.context import ApplyContext
from fluxmq.core.commands.leases import prepare_ack
from fluxmq.core.commands.results import SettleResult, TransactResult
from fluxmq.core.commands.rules import check_member, check_receipts
from fluxmq.core.delivery import GroupState
from fluxmq.core.errors import FluxError, invalid_argument, nested
from fluxmq.core.partitioner import prepare_append
from fluxmq.core.views import StateView


def prepare_transact(view: StateView, req: pb.TransactRequest, now_ms: int) -> cpb.TransactCmd:
    """The command of a Transact whose queues all live in this shard (the router saw to that,
    so any mix of them can share one command)."""
    cmd = cpb.TransactCmd()
    for i, ack in enumerate(req.acks):
        try:
            entry = find_entry(view.catalog, ack.queue)
            cmd.acks.append(prepare_ack(view, entry, ack, now_ms))
        except FluxError as err:
            raise nested(f"acks[{i}]", err) from None
    for i, pub in enumerate(req.publishes):
        cmd.appends.append(_prepare_publish(view, i, pub, now_ms))
    return cmd


def _prepare_publish(view: StateView, i: int, pub: pb.PublishRequest, now_ms: int) -> cpb.AppendCmd:
    if pub.HasField("producer"):
        raise invalid_argument(
            f"publishes[{i}].producer",
            "a transaction is all or nothing already; producer sessions are for Publish",
        )
    if pub.HasField("encoded"):
        raise invalid_argument(
            f"publishes[{i}].encoded",
            "a transaction's publishes carry messages; encoded records are for Publish",
        )
    try:
        entry = find_entry(view.catalog, pub.queue)
        prepared = prepare_append(pub.queue, entry.queue_id, entry.policy, pub.messages, i, now_ms)
    except FluxError as err:
        raise nested(f"publishes[{i}]", err) from None
    return prepared.command


def apply_transact(ctx: ApplyContext, cmd: cpb.TransactCmd) -> TransactResult:
    """All or nothing: everything is checked before anything is written."""
    groups = _check_acks(ctx, cmd)
    entries = [check_append(ctx, append) for append in cmd.appends]
    acks = [
        SettleResult(ctx.delivery.ack(ctx.txn, g, ack.receipts))
        for g, ack in zip(groups, cmd.acks, strict=True)
    ]
    appends = [
        append_checked(ctx, entry, append)
        for entry, append in zip(entries, cmd.appends, strict=True)
    ]
    return TransactResult(acks, appends)


def _check_acks(ctx: ApplyContext, cmd: cpb.TransactCmd) -> list[GroupState]:
    """The group of each ack, once every receipt is known to be held (and named once)."""
    groups: list[GroupState] = []
    seen: set[tuple[int, int, int]] = set()
    for i, ack in enumerate(cmd.acks):
        _entry, g = ctx.group(ack.queue, ack.queue_id, ack.group)
        check_member(g, ack.member)
        check_receipts(g, ack.receipts, f"acks[{i}].receipts")
        for j, status in enumerate(ctx.delivery.check_held(g, ack.receipts)):
            r = ack.receipts[j]
            key = (g.group_id, r.partition, r.offset)
            if status or key in seen:
                name = pb.ReceiptStatus.Name(status or pb.RECEIPT_STATUS_ALREADY_ACKED)
                raise FluxError(
                    "LEASE_NOT_HELD",
                    f"acks[{i}].receipts[{j}] is {name}: the transaction was not applied",
                    metadata={"field": f"acks[{i}].receipts[{j}]", "status": name},
                )
            seen.add(key)
        groups.append(g)
    return groups
