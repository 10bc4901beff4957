"""Checkouts (Consume streams' consumers in the replicated state): their limit, their end when
their member is no longer current, and their rows going with their group."""

from __future__ import annotations

import pytest

from fluxmq._pb.internal import commands_pb2 as cpb
from fluxmq._pb.v1 import queue_pb2 as pb
from fluxmq.core import keys, limits
from fluxmq.core.delivery import Push
from fluxmq.core.errors import FluxError
from storage import Store
from tests.unit.test_state_machine import T0
from tests.unit.test_state_machine import store as store  # the fixture: memory and LMDB
from tests.unit.test_state_machine_membership import Grp


def checkout(grp: Grp, consumer: str, session: int, member: cpb.MemberRef | None = None) -> object:
    return grp.one(
        cpb.CheckoutCmd(
            queue=grp.queue,
            queue_id=grp.q.queue_id,
            group=grp.group,
            consumer_id=consumer,
            max_in_flight=10,
            lease_ms=1000,
            session_id=session,
            member=member or cpb.MemberRef(),
            now_ms=T0,
        )
    )


def checkout_rows(grp: Grp) -> list[bytes]:
    with grp.sm.store.read() as txn:
        return [k for k, _ in txn.scan(keys.CHECKOUT)]


def test_a_checkout_beyond_the_groups_limit_is_refused_and_changes_nothing(store: Store) -> None:
    grp = Grp(store, partitions=1, mode=pb.DELIVERY_MODE_SHARED)
    for i in range(limits.CHECKOUTS_PER_GROUP_MAX):
        assert checkout(grp, f"c{i}", i + 1) == grp.group_id
    before = grp.digest()
    res = checkout(grp, "one-too-many", 99_999)
    assert isinstance(res, FluxError) and res.reason == "CHECKOUT_LIMIT" and res.retriable
    assert grp.digest() == before
    # A consumer already checked out may check out again (a new stream replaces its old one).
    assert checkout(grp, "c0", 77) == grp.group_id
    assert grp.g().checkouts["c0"].session_id == 77


def test_a_member_no_longer_current_has_its_checkout_revoked_with_the_reason(
    store: Store,
) -> None:
    grp = Grp(store, partitions=2)
    joined = grp.join("w1", "m1")
    pushes: list[Push] = []
    grp.sm.commit_listener = lambda _l, _g, p: pushes.extend(p)
    ref = cpb.MemberRef(member_id="m1", generation_id=joined.member.generation_id)
    assert checkout(grp, "w1", 5, ref) == grp.group_id
    grp.leave("m1", now=T0 + 1)
    assert [(p.consumer_id, p.session_id) for p in pushes if p.error is not None] == [("w1", 5)]
    revoked = next(p.error for p in pushes if p.error is not None)
    assert revoked is not None and revoked.reason in ("STALE_GENERATION", "UNKNOWN_MEMBER")
    assert "w1" not in grp.g().checkouts and checkout_rows(grp) == []


def test_a_checkout_with_a_stale_member_is_refused(store: Store) -> None:
    grp = Grp(store, partitions=2)
    joined = grp.join("w1", "m1")
    stale = cpb.MemberRef(member_id="m1", generation_id=joined.member.generation_id + 5)
    res = checkout(grp, "w1", 5, stale)
    assert isinstance(res, FluxError) and res.reason == "STALE_GENERATION"
    assert checkout_rows(grp) == []


def test_deleting_a_group_removes_its_checkouts(store: Store) -> None:
    grp = Grp(store, partitions=1, mode=pb.DELIVERY_MODE_SHARED)
    checkout(grp, "c1", 1)
    assert len(checkout_rows(grp)) == 1
    grp.one(cpb.DeleteGroupCmd(queue=grp.queue, queue_id=grp.q.queue_id, group=grp.group))
    assert checkout_rows(grp) == [] and not grp.sm.delivery.checked_out


def test_a_checkin_of_a_group_or_queue_gone_ends_nothing_and_is_not_refused(
    store: Store,
) -> None:
    grp = Grp(store, partitions=1, mode=pb.DELIVERY_MODE_SHARED)
    cmd = cpb.CheckinCmd(queue=grp.queue, queue_id=grp.q.queue_id)
    cmd.consumers.add(group="no-such-group", consumer_id="c1", session_id=1)
    assert grp.one(cmd) == 0
    cmd.queue_id += 1  # another incarnation of the queue
    assert grp.one(cmd) == 0


def _checkin(grp: Grp, consumer: str, session: int, release: bool, now: int) -> object:
    cmd = cpb.CheckinCmd(queue=grp.queue, queue_id=grp.q.queue_id, now_ms=now)
    cmd.consumers.add(group=grp.group, consumer_id=consumer, session_id=session, release=release)
    return grp.one(cmd)


def _leased(grp: Grp) -> dict[int, tuple[str, int, int, int]]:
    return grp.sm.delivery.view(grp.g(), 0).leased


@pytest.mark.parametrize("release", [False, True])
def test_a_released_checkin_gives_the_consumers_messages_back_and_a_plain_one_keeps_them(
    store: Store, release: bool
) -> None:
    grp = Grp(store, partitions=1, mode=pb.DELIVERY_MODE_SHARED)
    checkout(grp, "c1", 5)
    grp.publish(0, b"a", b"b")
    assert {m for m, *_ in _leased(grp).values()} == {"c1"}
    now = T0 + 100
    assert _checkin(grp, "c1", 5, release, now) == 1
    grp.expire_leases(now)
    if release:  # ready again now, the delivery counted (lease expired at the checkin)
        assert _leased(grp) == {}
        scheduled = grp.sm.delivery.view(grp.g(), 0).scheduled
        assert scheduled == {0: (now, 1), 1: (now, 1)}
    else:  # c1's until acked, nacked or its lease (1 s here) runs out
        assert {m for m, *_ in _leased(grp).values()} == {"c1"}


def test_a_release_of_an_older_session_changes_nothing(store: Store) -> None:
    grp = Grp(store, partitions=1, mode=pb.DELIVERY_MODE_SHARED)
    checkout(grp, "c1", 5)
    grp.publish(0, b"a")
    checkout(grp, "c1", 6)  # the consumer's new stream
    before = grp.digest()
    assert _checkin(grp, "c1", 5, True, T0 + 100) == 0
    assert grp.digest() == before and len(_leased(grp)) == 1
