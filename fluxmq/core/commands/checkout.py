"""Consumers checked out of their group (RabbitMQ quorum queues' model): Checkout, Checkin,
and the assignment every apply makes to checked-out consumers.

A Consume stream checks its consumer out once (``CheckoutCmd``: its credit, lease time and the
stream's session id). From then on, whenever a command's apply may have made messages ready or
freed credit (it appended to the group's queue, or changed the group: an ack, a nack, an
expiry, a member change), ``assign_checked_out`` leases ready messages to the checked-out
consumers with credit, in the same transaction, from the command and the state only: every
replica assigns the same messages to the same consumers with the same lease ids and deadlines.
The leader then sends them on the streams (``Push``) in the round that committed them, instead
of a second round of its own (a Lease) after a wake-up. A ``CheckinCmd`` ends a checkout; with
``release`` (the stream's client went away) the consumer's leases also end at the command's
time, so the next expiry pass hands its unsettled messages to the others.

Worked example (shared mode): group ``g`` has consumers ``a`` (max_in_flight 2, holds 1) and
``b`` (max_in_flight 10, holds 0); an append of 5 records applies. Both have credit (1 and 10);
the first pass gives each at most ``ceil(5 / 2) = 3`` in the rotated order of their ids, so
``a`` gets 1 (its credit) and ``b`` 3; the second pass gives what is left: ``b`` gets the 5th.
In ordered mode there is no share: a partition goes to one consumer at a time, whole.
"""

from __future__ import annotations

from collections.abc import Iterable

from fluxmq._pb.internal import commands_pb2 as cpb
from fluxmq.core import keys, validation
from fluxmq.core.catalog import QueueEntry
from fluxmq.core.commands.codec import Command, Op
from fluxmq.core.commands.context import ApplyContext
from fluxmq.core.commands.letters import write_dead_letters
from fluxmq.core.commands.rules import check_lease_member, group_view, has_members
from fluxmq.core.delivery import Checkout, GroupState, Push
from fluxmq.core.errors import FluxError
from fluxmq.core.views import StateView

# -- checkout / checkin ---------------------------------------------------------------------


def prepare_checkout(
    view: StateView,
    entry: QueueEntry,
    group: str,
    consumer_id: str,
    member: cpb.MemberRef,
    max_in_flight: int,
    lease_ms: int,
    session_id: int,
    now_ms: int,
) -> cpb.CheckoutCmd:
    """The arguments come checked (``consume_ask``); the member is checked again here, since
    a stream outlives the view it was asked against."""
    g = view.delivery.get(entry.queue_id, entry.name, group)
    check_lease_member(g, member, consumer_id)
    return cpb.CheckoutCmd(
        queue=entry.name,
        queue_id=entry.queue_id,
        group=group,
        consumer_id=consumer_id,
        max_in_flight=max_in_flight,
        lease_ms=lease_ms,
        session_id=session_id,
        member=member,
        now_ms=now_ms,
    )


def apply_checkout(ctx: ApplyContext, cmd: cpb.CheckoutCmd) -> int:
    """-> the group id. What the consumer gets now is assigned after the command (the group
    changed), like anything an apply makes ready."""
    _entry, g = ctx.group(cmd.queue, cmd.queue_id, cmd.group)
    check_lease_member(g, cmd.member, cmd.consumer_id)
    co = Checkout(cmd.consumer_id, cmd.max_in_flight, cmd.lease_ms, cmd.session_id, cmd.member)
    ctx.delivery.checkout(ctx.txn, g, co)
    return g.group_id


def prepare_end_consume(
    view: StateView, entry: QueueEntry, group: str, consumer_id: str
) -> cpb.CheckinCmd | None:
    """EndConsume: the checkin of the consumer's current checkout (None: it has none)."""
    co = group_view(view, entry, group).checkouts.get(validation.consumer_id(consumer_id))
    if co is None:
        return None
    return checkin_cmd(entry, [(group, co.consumer_id, co.session_id)])


def checkin_cmd(
    entry: QueueEntry,
    ends: Iterable[tuple[str, str, int]],
    *,
    release: bool = False,
    now_ms: int = 0,
) -> cpb.CheckinCmd:
    """``ends``: (group, consumer id, session id) of streams of ``entry`` that ended.
    ``release``: their clients went away; the consumers' leases end at ``now_ms``."""
    assert not release or now_ms > 0, now_ms
    cmd = cpb.CheckinCmd(queue=entry.name, queue_id=entry.queue_id, now_ms=now_ms)
    for group, consumer_id, session_id in ends:
        cmd.consumers.add(
            group=group, consumer_id=consumer_id, session_id=session_id, release=release
        )
    return cmd


def apply_checkin(ctx: ApplyContext, cmd: cpb.CheckinCmd) -> int:
    """-> how many checkouts ended (a group or queue gone meanwhile ended them already)."""
    entry = ctx.cat().get(cmd.queue)
    if entry is None or entry.queue_id != cmd.queue_id:
        return 0
    named = ctx.delivery.groups.get(entry.queue_id, {})
    ended = 0
    for c in cmd.consumers:
        g = named.get(c.group)
        if (
            g is not None
            and c.session_id
            and ctx.delivery.checkin(ctx.txn, g, c.consumer_id, c.session_id)
        ):
            ended += 1
            # A stream still open (EndConsume) sends what it was given, then ends.
            ctx.delivery.pushes.append(Push(g.group_id, c.consumer_id, c.session_id, end=True))
            if c.release and cmd.now_ms > 0:
                # Its client is gone: what it held goes back to the group now (the next expiry
                # pass makes it ready, behind what waits, with the attempt counted), not when
                # the leases would have run out.
                ctx.delivery.expire_member_leases(ctx.txn, g, c.consumer_id, cmd.now_ms)
    return ended


# -- assignment -----------------------------------------------------------------------------


def command_now_ms(op: Op, cmd: Command) -> int:
    """The time a command carries (0: none; then it assigns nothing)."""
    if op == Op.TRANSACT:
        times = [a.now_ms for a in cmd.acks] + [a.now_ms for a in cmd.appends]
        return max(times, default=0)
    return int(getattr(cmd, "now_ms", 0))


def assign_checked_out(ctx: ApplyContext, op: Op, cmd: Command) -> None:
    """After a command applied: serve the checkouts of the groups it may have made ready."""
    delivery = ctx.delivery
    if not delivery.checked_out:
        return
    now_ms = command_now_ms(op, cmd)
    if now_ms <= 0:
        return
    if op == Op.EXPIRE_LEASES:  # the leader's timer: whatever came due anywhere
        ids = set(delivery.checked_out)
    else:
        ids = delivery.changed & delivery.checked_out
        for queue_id in ctx.grown:
            ids.update(g.group_id for g in delivery.of_queue(queue_id) if g.checkouts)
    if not ids:
        return
    assigned = False
    for group_id in sorted(ids):
        g = delivery.by_id(group_id)
        if g is None or not g.checkouts:
            continue
        entry = ctx.cat().get(g.meta.queue)
        if entry is None or entry.queue_id != g.queue_id:
            continue
        assigned |= _assign_group(ctx, entry, g, now_ms)
    if assigned:
        delivery.save_lease_counter(ctx.txn)
    write_dead_letters(ctx, now_ms)  # TTL-expired records the walk passed


def _assign_group(ctx: ApplyContext, entry: QueueEntry, g: GroupState, now_ms: int) -> bool:
    delivery = ctx.delivery
    ids = sorted(g.checkouts)
    first = delivery.rotation % len(ids)  # every consumer gets its turn to go first
    eligible: list[tuple[Checkout, set[int] | None, int]] = []
    for consumer_id in ids[first:] + ids[:first]:
        co = g.checkouts[consumer_id]
        try:
            member = check_lease_member(g, co.member, consumer_id)
        except FluxError as err:  # expired, left, or rebalanced away: the stream ends
            delivery.checkin(ctx.txn, g, consumer_id, co.session_id)
            delivery.pushes.append(Push(g.group_id, consumer_id, co.session_id, error=err))
            continue
        credit = co.max_in_flight - g.in_flight_by_member.get(consumer_id, 0)
        if credit > 0:
            only = member.owned if member is not None and has_members(g) else None
            eligible.append((co, only, credit))
    if not eligible:
        return False
    # Walk only the partitions where something may be ready: after an ack on a drained queue
    # (the common case) no consumer walks at all. Leaving the others out changes nothing, a
    # walk over them would lease nothing and its retention catch-up would find nothing to do.
    ready = _ready_bounds(ctx, entry, g)
    if not ready:
        return False
    walk = set(ready)
    eligible = [
        (co, walk if only is None else only & walk, credit) for co, only, credit in eligible
    ]
    # Shared: a fair share each first, then what is left. Ordered: a partition goes to one
    # consumer at a time anyway, so each takes whole partitions (a share would cut them short).
    rounds: tuple[int | None, ...] = (None,)
    if not g.ordered:
        rounds = (max(1, -(-sum(ready.values()) // len(eligible))), None)
    assigned = False
    for n, limit in enumerate(rounds):
        if n and not assigned:
            break  # nothing was ready for anybody
        for i, (co, only, credit) in enumerate(eligible):
            want = credit if limit is None else min(credit, limit)
            if want <= 0:
                continue
            out = delivery.lease(
                ctx.txn, g, entry.policy, co.consumer_id, want, co.lease_ms, now_ms, only
            )
            if out:
                assigned = True
                eligible[i] = (co, only, credit - len(out))
                delivery.pushes.append(Push(g.group_id, co.consumer_id, co.session_id, tuple(out)))
    return assigned


def _ready_bounds(ctx: ApplyContext, entry: QueueEntry, g: GroupState) -> dict[int, int]:
    """Partition -> at most how many messages of ``g`` could be ready there (never delivered,
    or scheduled), for the partitions where that is more than none."""
    out = {}
    for p in range(entry.policy.partitions):
        high = ctx.txn.log(keys.log_id(entry.queue_id, p)).watermarks().high
        part = g.parts.get(p)
        bound = high - (part.next if part is not None else 0)
        bound += part.scheduled if part is not None else 0
        if bound > 0:
            out[p] = bound
    return out
