"""Consumer-group membership commands: JoinGroup and LeaveGroup (leader side and apply), and at
apply the partitions a member releases and the members whose session lapsed."""

from __future__ import annotations

from fluxmq._pb.internal import commands_pb2 as cpb
from fluxmq._pb.v1 import queue_pb2 as pb
from fluxmq.core import membership as msh
from fluxmq.core import validation
from fluxmq.core.catalog import QueueEntry
from fluxmq.core.commands.context import ApplyContext
from fluxmq.core.commands.results import MemberResult, member_view
from fluxmq.core.commands.rules import check_member_id
from fluxmq.core.delivery import GroupState
from fluxmq.core.errors import invalid_argument
from fluxmq.core.views import GroupView


def require_member_id(member_id: str) -> None:
    if not member_id:
        raise invalid_argument("member_id", "required (from JoinGroup)")


def prepare_join(
    g: GroupView, entry: QueueEntry, req: pb.JoinGroupRequest, now_ms: int, token: str
) -> cpb.JoinGroupCmd:
    """A JoinGroup's command; a new member's id is its consumer id and ``token`` (random)."""
    consumer = validation.consumer_id(req.consumer_id)
    strategy, timeout_ms = msh.validate_join(req.strategy, req.session_timeout_ms)
    check_member_id(req.member_id)
    ms = g.membership
    member_id = req.member_id
    if not member_id or ms is None or member_id not in ms.members:
        # New (or expired meanwhile): a fresh id, so the old one's requests stay stale.
        member_id = f"{consumer[:64]}-{token}"
    return cpb.JoinGroupCmd(
        queue=req.queue,
        queue_id=entry.queue_id,
        group=req.group,
        consumer_id=consumer,
        member_id=member_id,
        session_timeout_ms=timeout_ms,
        strategy=strategy,
        now_ms=now_ms,
    )


def apply_join_group(ctx: ApplyContext, cmd: cpb.JoinGroupCmd) -> MemberResult:
    entry, g = ctx.group(cmd.queue, cmd.queue_id, cmd.group)
    ms = g.membership or msh.Membership(0, cmd.strategy, {})
    replaced = ms.by_consumer(cmd.consumer_id)
    m = msh.join(
        ms,
        entry.policy.partitions,
        cmd.consumer_id,
        cmd.member_id,
        cmd.session_timeout_ms,
        cmd.strategy,
        cmd.now_ms,
        assigns=g.ordered,
    )
    if replaced is not None and replaced.member_id != cmd.member_id:
        # A restarted worker: the receipts of its old incarnation are lost with it, so its
        # leases end now rather than hold ordered partitions until their deadlines.
        ctx.delivery.expire_member_leases(ctx.txn, g, cmd.consumer_id, cmd.now_ms)
    g.membership = ms
    ctx.delivery.save_membership(ctx.txn, g)
    return MemberResult(member_view(m), ms.group_generation)


def prepare_leave(entry: QueueEntry, req: pb.LeaveGroupRequest, now_ms: int) -> cpb.LeaveGroupCmd:
    require_member_id(req.member_id)
    return cpb.LeaveGroupCmd(
        queue=req.queue,
        queue_id=entry.queue_id,
        group=req.group,
        member_id=req.member_id,
        now_ms=now_ms,
    )


def apply_leave_group(ctx: ApplyContext, cmd: cpb.LeaveGroupCmd) -> int:
    entry, g = ctx.group(cmd.queue, cmd.queue_id, cmd.group)
    return _remove_members(ctx, entry, g, [cmd.member_id], cmd.now_ms)


def _remove_members(
    ctx: ApplyContext, entry: QueueEntry, g: GroupState, member_ids: list[str], now_ms: int
) -> int:
    ms = g.membership
    gone = [ms.members[mid] for mid in member_ids if ms is not None and mid in ms.members]
    if ms is None or not gone:
        return 0
    for m in gone:
        ctx.delivery.expire_member_leases(ctx.txn, g, m.consumer_id, now_ms)
    msh.remove(ms, [m.member_id for m in gone], entry.policy.partitions, assigns=g.ordered)
    ctx.delivery.save_membership(ctx.txn, g)
    return len(gone)


def apply_release_partitions(ctx: ApplyContext, cmd: cpb.ReleasePartitionsCmd) -> MemberResult:
    _entry, g = ctx.group(cmd.queue, cmd.queue_id, cmd.group)
    m = msh.check_member(g.membership, cmd.member_id, cmd.generation_id)
    ms = g.membership
    assert ms is not None
    released = msh.release(ms, cmd.member_id, cmd.generation_id, lambda p: ctx.delivery.busy(g, p))
    if released:
        ctx.delivery.save_membership(ctx.txn, g)
    return MemberResult(member_view(m), ms.group_generation, released)


def apply_expire_members(ctx: ApplyContext, cmd: cpb.ExpireMembersCmd) -> int:
    by_group: dict[int, list[str]] = {}
    for e in cmd.members:
        by_group.setdefault(e.group_id, []).append(e.member_id)
    cat = {e.queue_id: e for e in ctx.cat().values()}
    expired = 0
    for group_id, member_ids in sorted(by_group.items()):
        g = ctx.delivery.by_id(group_id)
        entry = cat.get(g.queue_id) if g is not None else None
        if g is None or entry is None:
            continue  # deleted meanwhile
        expired += _remove_members(ctx, entry, g, member_ids, cmd.now_ms)
    return expired
