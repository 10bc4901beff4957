"""Consumer-group delivery commands, both sides: groups, Lease, Ack, Nack, ExtendLease, lease
expiry and offsets.

``prepare_<op>`` is the leader's side: a request, checked against the published ``StateView``,
turned into its command (raising what applying that command would raise, so a refusal needs no
round through the log). ``apply_<op>`` is the state machine's handler. Where a rule is checked
on both sides, both call the one function in ``rules``; each side keeps its own order of checks
(the leader's order decides which error a client sees first, and is kept as it always was).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from fluxmq._pb.internal import commands_pb2 as cpb
from fluxmq._pb.v1 import queue_pb2 as pb
from fluxmq.core import keys, limits, validation
from fluxmq.core.catalog import QueueEntry
from fluxmq.core.commands.context import ApplyContext
from fluxmq.core.commands.letters import write_dead_letters
from fluxmq.core.commands.results import ExpireResult, LeaseResult, SettleResult
from fluxmq.core.commands.rules import (
    check_dead_letter_queue,
    check_lease_member,
    check_member,
    check_member_id,
    check_receipts,
    group_view,
    has_members,
)
from fluxmq.core.errors import (
    FluxError,
    invalid_argument,
    offset_out_of_range,
    partition_out_of_range,
)
from fluxmq.core.views import GroupView, StateView
from storage.api import PartitionLogReader

NACK_REASON_CHARS_MAX = 1024
CONSUME_BATCH_DEFAULT = 100

# -- groups ---------------------------------------------------------------------------------


def prepare_create_group(
    entry: QueueEntry, req: pb.CreateGroupRequest, now_ms: int
) -> cpb.CreateGroupCmd:
    validation.group_name(req.group)
    if req.mode not in (
        pb.DELIVERY_MODE_UNSPECIFIED,
        pb.DELIVERY_MODE_SHARED,
        pb.DELIVERY_MODE_ORDERED,
    ):
        raise invalid_argument("mode", f"unknown delivery mode {req.mode}")
    validation.group_filter(req.filter)
    validation.start_position(req.start)
    return cpb.CreateGroupCmd(
        queue=req.queue,
        queue_id=entry.queue_id,
        group=req.group,
        start=req.start,
        mode=req.mode,
        filter=req.filter,
        now_ms=now_ms,
    )


def apply_create_group(ctx: ApplyContext, cmd: cpb.CreateGroupCmd) -> pb.Group:
    entry = ctx.entry(cmd.queue, cmd.queue_id)
    txn = ctx.txn
    raw = txn.get(keys.NEXT_GROUP_ID)
    group_id = keys.U64.unpack(raw)[0] if raw else 1
    meta = pb.Group(
        queue=cmd.queue,
        name=cmd.group,
        mode=cmd.mode or pb.DELIVERY_MODE_SHARED,
        filter=cmd.filter,
        start=cmd.start,
        created_at_ms=cmd.now_ms,
        group_id=group_id,
    )
    starts = {
        p: start_offset(txn.log(keys.log_id(entry.queue_id, p)), cmd.start)
        for p in range(entry.policy.partitions)
    }
    ctx.delivery.create(txn, entry.queue_id, meta, starts)
    txn.put(keys.NEXT_GROUP_ID, keys.U64.pack(group_id + 1))
    return meta


def prepare_delete_group(view: StateView, entry: QueueEntry, group: str) -> cpb.DeleteGroupCmd:
    group_view(view, entry, group)
    return cpb.DeleteGroupCmd(queue=entry.name, queue_id=entry.queue_id, group=group)


def apply_delete_group(ctx: ApplyContext, cmd: cpb.DeleteGroupCmd) -> None:
    _entry, g = ctx.group(cmd.queue, cmd.queue_id, cmd.group)
    ctx.delivery.delete(ctx.txn, g)


def start_offset(log: PartitionLogReader, start: pb.StartPosition) -> int:
    """Where ``start`` points in ``log``: earliest (default) = low watermark, latest = high,
    an offset clamped into [low, high], or the first record at or after a timestamp."""
    wm = log.watermarks()
    which = start.WhichOneof("position") or "earliest"
    if which == "earliest":
        return wm.low
    if which == "latest":
        return wm.high
    if which == "offset":
        return min(max(start.offset, wm.low), wm.high)
    return log.offset_for_timestamp(start.timestamp_ms)


# -- members of requests --------------------------------------------------------------------


def member_ref(
    view: StateView,
    entry: QueueEntry,
    group: str,
    member_id: str,
    generation_id: int,
    *,
    lease: bool = True,
) -> cpb.MemberRef:
    """The member a request speaks for, checked as the apply will check it."""
    check_member_id(member_id)
    ref = cpb.MemberRef(member_id=member_id, generation_id=generation_id)
    check_member(view.delivery.get(entry.queue_id, entry.name, group), ref, exact=lease)
    return ref


def settle_ref(
    view: StateView, entry: QueueEntry, group: str, member_id: str, generation_id: int
) -> cpb.MemberRef:
    """Acks and the like need no membership; when they name a member it must be current."""
    if not member_id:
        return cpb.MemberRef()
    return member_ref(view, entry, group, member_id, generation_id, lease=False)


# -- lease ----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class LeaseAsk:
    """What a Lease or Consume asks for, checked once; each lease it proposes is built from it
    by ``prepare_lease``."""

    group: str
    group_id: int
    consumer_id: str
    max_messages: int  # per lease (Consume: at most this, within its in-flight window)
    lease_ms: int
    member: cpb.MemberRef


def lease_ask(view: StateView, entry: QueueEntry, req: pb.LeaseRequest) -> tuple[LeaseAsk, int]:
    """-> (the ask, how long the request may wait for messages, ms)."""
    g = group_view(view, entry, req.group)
    consumer = validation.consumer_id(req.consumer_id)
    count = validation.lease_batch(req.max_messages)
    lease_ms = validation.lease_ms(req.lease_ms, entry.policy.lease_ms)
    wait_ms = validation.wait_ms(req.wait_ms)
    ref = member_ref(view, entry, req.group, req.member_id, req.generation_id)
    return LeaseAsk(req.group, g.group_id, consumer, count, lease_ms, ref), wait_ms


def consume_ask(view: StateView, entry: QueueEntry, req: pb.ConsumeRequest) -> tuple[LeaseAsk, int]:
    """-> (the ask, how many messages the stream may hold unsettled)."""
    g = group_view(view, entry, req.group)
    consumer = validation.consumer_id(req.consumer_id)
    window = validation.max_in_flight(req.max_in_flight)
    batch = validation.lease_batch(req.batch_max, "batch_max", default=CONSUME_BATCH_DEFAULT)
    lease_ms = validation.lease_ms(req.lease_ms, entry.policy.lease_ms)
    ref = member_ref(view, entry, req.group, req.member_id, req.generation_id)
    return LeaseAsk(req.group, g.group_id, consumer, batch, lease_ms, ref), window


def prepare_lease(
    view: StateView, entry: QueueEntry, ask: LeaseAsk, max_messages: int, now_ms: int
) -> cpb.LeaseCmd:
    """One Lease command of ``ask`` (its member checked again: a long poll outlives views)."""
    g = view.delivery.get(entry.queue_id, entry.name, ask.group)
    check_lease_member(g, ask.member, ask.consumer_id)
    return cpb.LeaseCmd(
        queue=entry.name,
        queue_id=entry.queue_id,
        group=ask.group,
        consumer_id=ask.consumer_id,
        max_messages=max_messages,
        lease_ms=ask.lease_ms,
        now_ms=now_ms,
        member=ask.member,
    )


def apply_lease(ctx: ApplyContext, cmd: cpb.LeaseCmd) -> LeaseResult:
    entry, g = ctx.group(cmd.queue, cmd.queue_id, cmd.group)
    member = check_lease_member(g, cmd.member, cmd.consumer_id)
    only: set[int] | None = None
    if has_members(g):
        assert member is not None, "check_lease_member refuses a member-less lease here"
        only = member.owned
    out = ctx.delivery.lease(
        ctx.txn,
        g,
        entry.policy,
        cmd.consumer_id,
        cmd.max_messages,
        cmd.lease_ms,
        cmd.now_ms,
        only,
    )
    if out:
        ctx.delivery.save_lease_counter(ctx.txn)
    write_dead_letters(ctx, cmd.now_ms)
    return LeaseResult(g.group_id, out)


# -- settle ---------------------------------------------------------------------------------


def receipts_of_group(
    view: StateView, entry: QueueEntry, group: str, receipts: Sequence[pb.Receipt], path: str
) -> GroupView:
    """The group ``receipts`` settle in, if they are all of it."""
    validation.receipts_count(len(receipts), path)
    g = group_view(view, entry, group)
    check_receipts(g, receipts, path)
    return g


def prepare_ack(view: StateView, entry: QueueEntry, req: pb.AckRequest, now_ms: int) -> cpb.AckCmd:
    """An Ack's command (field paths relative to ``req``: a Transact nests them)."""
    member = settle_ref(view, entry, req.group, req.member_id, req.generation_id)
    receipts_of_group(view, entry, req.group, req.receipts, "receipts")
    return cpb.AckCmd(
        queue=req.queue,
        queue_id=entry.queue_id,
        group=req.group,
        receipts=req.receipts,
        now_ms=now_ms,
        member=member,
    )


def apply_ack(ctx: ApplyContext, cmd: cpb.AckCmd) -> SettleResult:
    _entry, g = ctx.group(cmd.queue, cmd.queue_id, cmd.group)
    check_member(g, cmd.member)
    check_receipts(g, cmd.receipts, "receipts")
    return SettleResult(ctx.delivery.ack(ctx.txn, g, cmd.receipts))


def prepare_nack(
    view: StateView, entry: QueueEntry, req: pb.NackRequest, now_ms: int
) -> cpb.NackCmd:
    receipts_of_group(view, entry, req.group, req.receipts, "receipts")
    if req.retry_after_ms and req.retry_at_ms:
        raise invalid_argument("retry_at_ms", "set retry_after_ms or retry_at_ms, not both")
    if req.dead and (req.retry_after_ms or req.retry_at_ms):
        raise invalid_argument("dead", "a dead letter is not retried: drop retry_after_ms")
    check_dead_letter_queue(entry, req.dead)
    if len(req.reason) > NACK_REASON_CHARS_MAX:
        raise invalid_argument("reason", f"at most {NACK_REASON_CHARS_MAX} characters")
    retry_at = req.retry_at_ms
    if req.retry_after_ms:
        retry_at = now_ms + validation.retry_delay_ms(req.retry_after_ms, "retry_after_ms")
    elif retry_at and retry_at > now_ms + limits.DELAY_MS_MAX:
        raise invalid_argument("retry_at_ms", "at most 7 days ahead")
    return cpb.NackCmd(
        queue=req.queue,
        queue_id=entry.queue_id,
        group=req.group,
        receipts=req.receipts,
        now_ms=now_ms,
        retry_at_ms=max(retry_at, 0),
        dead=req.dead,
        reason=req.reason,
        member=settle_ref(view, entry, req.group, req.member_id, req.generation_id),
    )


def apply_nack(ctx: ApplyContext, cmd: cpb.NackCmd) -> SettleResult:
    entry, g = ctx.group(cmd.queue, cmd.queue_id, cmd.group)
    check_member(g, cmd.member)
    check_receipts(g, cmd.receipts, "receipts")
    check_dead_letter_queue(entry, cmd.dead)
    statuses = ctx.delivery.nack(
        ctx.txn,
        g,
        entry.policy,
        cmd.receipts,
        cmd.now_ms,
        cmd.retry_at_ms,
        cmd.dead,
        cmd.reason,
    )
    write_dead_letters(ctx, cmd.now_ms)
    return SettleResult(statuses)


def prepare_extend(
    view: StateView, entry: QueueEntry, req: pb.ExtendLeaseRequest, now_ms: int
) -> cpb.ExtendLeaseCmd:
    receipts_of_group(view, entry, req.group, req.receipts, "receipts")
    return cpb.ExtendLeaseCmd(
        queue=req.queue,
        queue_id=entry.queue_id,
        group=req.group,
        receipts=req.receipts,
        now_ms=now_ms,
        lease_ms=validation.lease_ms(req.lease_ms, entry.policy.lease_ms),
        member=settle_ref(view, entry, req.group, req.member_id, req.generation_id),
    )


def apply_extend(ctx: ApplyContext, cmd: cpb.ExtendLeaseCmd) -> SettleResult:
    _entry, g = ctx.group(cmd.queue, cmd.queue_id, cmd.group)
    check_member(g, cmd.member)
    check_receipts(g, cmd.receipts, "receipts")
    out = ctx.delivery.extend(ctx.txn, g, cmd.receipts, cmd.now_ms, cmd.lease_ms)
    return SettleResult([s for s, _ in out], [d for _, d in out])


def apply_expire_leases(ctx: ApplyContext, cmd: cpb.ExpireLeasesCmd) -> ExpireResult:
    policies = {e.queue_id: e.policy for e in ctx.cat().values()}
    leases, ttl = ctx.delivery.expire(ctx.txn, policies, cmd.now_ms)
    dead = write_dead_letters(ctx, cmd.now_ms)
    return ExpireResult(leases, ttl, dead)


# -- offsets --------------------------------------------------------------------------------


def prepare_commit_offsets(
    view: StateView, entry: QueueEntry, req: pb.CommitOffsetsRequest
) -> cpb.CommitOffsetsCmd:
    group_view(view, entry, req.group)
    if not req.offsets:
        raise invalid_argument("offsets", "name at least one partition")
    return cpb.CommitOffsetsCmd(
        queue=req.queue,
        queue_id=entry.queue_id,
        group=req.group,
        offsets=req.offsets,
        member=settle_ref(view, entry, req.group, req.member_id, req.generation_id),
    )


def apply_commit_offsets(ctx: ApplyContext, cmd: cpb.CommitOffsetsCmd) -> None:
    entry, g = ctx.group(cmd.queue, cmd.queue_id, cmd.group)
    check_member(g, cmd.member)
    if entry.queue.config.type != pb.QUEUE_TYPE_STREAM:
        raise FluxError(
            "NOT_A_STREAM_QUEUE",
            f"queue {entry.name!r} is a work queue: its offsets move with Ack and Nack "
            "(ResetOffsets replays or skips)",
            metadata={"queue": entry.name},
        )
    txn = ctx.txn
    for p, offset in sorted(cmd.offsets.items()):
        if p >= entry.policy.partitions:
            raise partition_out_of_range(entry.name, p, entry.policy.partitions, f"offsets[{p}]")
        wm = txn.log(keys.log_id(entry.queue_id, p)).watermarks()
        if offset > wm.high:
            raise offset_out_of_range(entry.name, p, offset, wm.low, wm.high)
    for p, offset in sorted(cmd.offsets.items()):
        ctx.delivery.reset(txn, g, p, offset)


def prepare_reset_offsets(
    view: StateView, entry: QueueEntry, req: pb.ResetOffsetsRequest
) -> cpb.ResetOffsetsCmd:
    group_view(view, entry, req.group)
    validation.start_position(req.to, "to")
    npart = entry.policy.partitions
    for i, p in enumerate(req.partitions):
        if p >= npart:  # checked again at apply (the queue may change): a dry run needs it now
            raise partition_out_of_range(entry.name, p, npart, f"partitions[{i}]")
    return cpb.ResetOffsetsCmd(
        queue=req.queue,
        queue_id=entry.queue_id,
        group=req.group,
        partitions=req.partitions,
        to=req.to,
    )


def apply_reset_offsets(ctx: ApplyContext, cmd: cpb.ResetOffsetsCmd) -> None:
    entry, g = ctx.group(cmd.queue, cmd.queue_id, cmd.group)
    npart = entry.policy.partitions
    for i, p in enumerate(cmd.partitions):
        if p >= npart:
            raise partition_out_of_range(entry.name, p, npart, f"partitions[{i}]")
    txn = ctx.txn
    for p in sorted(set(cmd.partitions)) if cmd.partitions else range(npart):
        offset = start_offset(txn.log(keys.log_id(entry.queue_id, p)), cmd.to)
        ctx.delivery.reset(txn, g, p, offset)
