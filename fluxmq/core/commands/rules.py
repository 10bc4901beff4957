"""The consumer-group rules that both sides of a command check: the leader while it turns a
request into a command (against the published ``GroupView``, so it refuses before proposing),
and the apply (against the live ``GroupState``, because the group may have changed between the
two, and a command may reach the log without the leader's check: an older leader, a test).

Each rule is written once, here, and raises the same ``FluxError`` (reason, message, field)
wherever it runs. They read a group only through ``Group``, which both kinds of group fit.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from fluxmq._pb.internal import commands_pb2 as cpb
from fluxmq._pb.v1 import queue_pb2 as pb
from fluxmq.core import membership as msh
from fluxmq.core.catalog import QueueEntry
from fluxmq.core.errors import FluxError, invalid_argument
from fluxmq.core.validation import group_name as validate_group_name
from fluxmq.core.views import GroupView, StateView


class Group(Protocol):
    """What the rules read of a group: the live ``GroupState`` and the ``GroupView`` of a
    commit both have it."""

    @property
    def group_id(self) -> int: ...

    @property
    def name(self) -> str: ...

    @property
    def meta(self) -> pb.Group: ...

    @property
    def membership(self) -> msh.Membership | None: ...

    @property
    def ordered(self) -> bool: ...


def foreign_receipt(g: Group, field_path: str) -> FluxError:
    return FluxError(
        "RECEIPT_MISMATCH",
        f"{field_path} was not issued by group {g.name!r} of queue {g.meta.queue!r}",
        metadata={"field": field_path, "group": g.name},
    )


def member_required(g: Group) -> FluxError:
    return FluxError(
        "MEMBER_REQUIRED",
        f"ordered group {g.name!r} has members: lease with the member_id and generation_id "
        "JoinGroup returned (partitions are assigned to members)",
        metadata={"group": g.name},
    )


def no_dead_letter_queue(queue: str) -> FluxError:
    return FluxError(
        "NO_DEAD_LETTER_QUEUE",
        f"queue {queue!r} has no dead-letter queue (it is one, or dead_letter_disabled is set)",
        metadata={"queue": queue, "field": "dead"},
    )


def check_receipts(g: Group, receipts: Sequence[pb.Receipt], path: str) -> None:
    """Every receipt was issued by ``g`` (a receipt of another group, or of an earlier group of
    the same name, would settle somebody else's lease)."""
    for i, r in enumerate(receipts):
        if r.group_id != g.group_id:
            raise foreign_receipt(g, f"{path}[{i}]")


def has_members(g: Group) -> bool:
    """Whether ``g`` assigns partitions to members: an ordered group somebody joined."""
    return g.ordered and g.membership is not None and bool(g.membership.members)


def check_member(g: Group, ref: cpb.MemberRef, *, exact: bool = False) -> msh.Member | None:
    """The member a request speaks for (None: not a member request); stale ones fail.

    ``exact`` is for leasing: the member's current generation only, and an ordered group with
    members leases to members only (its partitions are assigned)."""
    if not ref.member_id:
        if exact and has_members(g):
            raise member_required(g)
        return None
    return msh.check_member(g.membership, ref.member_id, ref.generation_id, exact=exact)


def check_lease_member(g: Group, ref: cpb.MemberRef, consumer_id: str) -> msh.Member | None:
    """``check_member`` for a lease; a member leases as the consumer it joined as (leases are
    held by consumer id, and a rejoin ends those of the consumer it replaces)."""
    member = check_member(g, ref, exact=True)
    if member is not None and member.consumer_id != consumer_id:
        raise invalid_argument(
            "consumer_id",
            f"member {member.member_id!r} joined as consumer {member.consumer_id!r}",
        )
    return member


def check_dead_letter_queue(entry: QueueEntry, dead: bool) -> None:
    """A nack that dead-letters needs a queue with a DLQ (the message would be lost)."""
    if dead and entry.policy.dead_letter_queue is None:
        raise no_dead_letter_queue(entry.name)


def check_member_id(member_id: str) -> None:
    if len(member_id) > msh.MEMBER_ID_CHARS_MAX:
        raise invalid_argument("member_id", f"at most {msh.MEMBER_ID_CHARS_MAX} characters")


def group_view(view: StateView, entry: QueueEntry, name: str) -> GroupView:
    """The group a request names, as of ``view`` (a malformed name is refused as such)."""
    validate_group_name(name)
    return view.delivery.get(entry.queue_id, entry.name, name)
