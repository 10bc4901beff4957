"""Consumer-group membership through the queue state machine: JoinGroup, LeaveGroup,
ReleasePartitions, ExpireMembers and the member checks of Lease, Ack, Nack, ExtendLease,
CommitOffsets and Transact, driven with commands (time is an input: no sleeps).

MemoryStore unless a test says otherwise; the seeded twin-replica run names its seed.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from pathlib import Path

from fluxmq._pb.internal import commands_pb2 as cpb
from fluxmq._pb.v1 import queue_pb2 as pb
from fluxmq.core import keys
from fluxmq.core.assignors import assign
from fluxmq.core.commands.results import (
    AppendResult,
    ExpireResult,
    LeaseResult,
    MemberResult,
    SettleResult,
    TransactResult,
)
from fluxmq.core.delivery import GroupState
from fluxmq.core.errors import FluxError
from fluxmq.core.membership import Membership
from fluxmq.core.state_machine import QueueStateMachine
from storage import LmdbStore, MemoryStore, Store
from tests.unit.test_state_machine import T0, Driver, append_cmd, receipts_of

ORDERED = pb.DELIVERY_MODE_ORDERED
SHARED = pb.DELIVERY_MODE_SHARED
ACKED = pb.RECEIPT_STATUS_ACKED
LEASE_MS = 30_000
TIMEOUT = 10_000


class Grp:
    """One queue with one group, the membership commands spelled out once. Every command it
    applies is kept in ``log`` so that another store can apply the same sequence."""

    def __init__(
        self,
        store: Store,
        partitions: int = 4,
        mode: pb.DeliveryMode = ORDERED,
        group: str = "g",
        queue: str = "q",
    ) -> None:
        self.d = Driver(store)
        self.log: list[object] = []
        self.queue = queue
        self.q = self.d.create(queue, partitions=partitions)
        self.log.append(cpb.CreateQueueCmd(config=self.q.config, now_ms=T0))
        self.group = group
        self.group_id = self.create_group(group, mode)

    # -- plumbing ------------------------------------------------------------------------------

    def one(self, cmd: object) -> object:
        self.log.append(cmd)
        return self.d.one(cmd)

    @property
    def sm(self) -> QueueStateMachine:
        return self.d.sm

    def g(self, group: str | None = None) -> GroupState:
        return self.sm.delivery.get(self.q.queue_id, self.queue, group or self.group)

    def ms(self, group: str | None = None) -> Membership:
        ms = self.g(group).membership
        assert ms is not None
        return ms

    def owned(self, group: str | None = None) -> dict[str, list[int]]:
        return {mid: sorted(m.owned) for mid, m in sorted(self.ms(group).members.items())}

    def gen(self, member: str, group: str | None = None) -> int:
        return self.ms(group).members[member].generation

    def digest(self) -> str:
        return self.sm.digest()

    def stored_membership(self, group_id: int) -> bytes | None:
        with self.sm.store.read() as txn:
            return txn.get(keys.membership_key(group_id))

    # -- commands ------------------------------------------------------------------------------

    def create_group(self, group: str, mode: pb.DeliveryMode = ORDERED) -> int:
        g = self.one(
            cpb.CreateGroupCmd(
                queue=self.queue, queue_id=self.q.queue_id, group=group, mode=mode, now_ms=T0
            )
        )
        assert isinstance(g, pb.Group), g
        return int(g.group_id)

    def join_cmd(
        self,
        consumer: str,
        member: str,
        strategy: str = "range",
        now: int = T0,
        group: str | None = None,
        timeout: int = TIMEOUT,
    ) -> object:
        return self.one(
            cpb.JoinGroupCmd(
                queue=self.queue,
                queue_id=self.q.queue_id,
                group=group or self.group,
                consumer_id=consumer,
                member_id=member,
                session_timeout_ms=timeout,
                strategy=strategy,
                now_ms=now,
            )
        )

    def join(self, consumer: str, member: str, **kw: object) -> MemberResult:
        res = self.join_cmd(consumer, member, **kw)  # type: ignore[arg-type]
        assert isinstance(res, MemberResult), res
        return res

    def leave(self, member: str, now: int = T0, group: str | None = None) -> object:
        return self.one(
            cpb.LeaveGroupCmd(
                queue=self.queue,
                queue_id=self.q.queue_id,
                group=group or self.group,
                member_id=member,
                now_ms=now,
            )
        )

    def release(self, member: str, generation: int, group: str | None = None) -> object:
        return self.one(
            cpb.ReleasePartitionsCmd(
                queue=self.queue,
                queue_id=self.q.queue_id,
                group=group or self.group,
                member_id=member,
                generation_id=generation,
            )
        )

    def released(self, member: str, group: str | None = None) -> list[int]:
        res = self.release(member, self.gen(member, group), group)
        assert isinstance(res, MemberResult), res
        return list(res.released)

    def expire_members(self, now: int, *members: tuple[int, str]) -> object:
        return self.one(
            cpb.ExpireMembersCmd(
                now_ms=now,
                members=[cpb.ExpiredMember(group_id=g, member_id=m) for g, m in members],
            )
        )

    def expire_leases(self, now: int) -> ExpireResult:
        res = self.one(cpb.ExpireLeasesCmd(now_ms=now))
        assert isinstance(res, ExpireResult), res
        return res

    def publish(self, partition: int, *values: bytes, now: int = T0) -> AppendResult:
        msgs = [pb.PublishMessage(value=v, partition=partition) for v in values]
        res = self.one(append_cmd(self.q, msgs, now))
        assert isinstance(res, AppendResult), res
        return res

    def lease_cmd(
        self,
        consumer: str,
        member: str = "",
        generation: int = 0,
        n: int = 10,
        now: int = T0,
        group: str | None = None,
    ) -> object:
        return self.one(
            cpb.LeaseCmd(
                queue=self.queue,
                queue_id=self.q.queue_id,
                group=group or self.group,
                consumer_id=consumer,
                max_messages=n,
                lease_ms=LEASE_MS,
                now_ms=now,
                member=cpb.MemberRef(member_id=member, generation_id=generation),
            )
        )

    def lease(self, consumer: str, member: str = "", **kw: object) -> LeaseResult:
        gen = kw.pop("generation", None)
        if gen is None:
            gen = self.gen(member) if member else 0
        res = self.lease_cmd(consumer, member, gen, **kw)  # type: ignore[arg-type]
        assert isinstance(res, LeaseResult), res
        return res

    @staticmethod
    def receipts(res: LeaseResult) -> list[pb.Receipt]:
        return receipts_of(res)

    def ref(self, member: str, generation: int | None = None) -> cpb.MemberRef:
        if generation is None:
            generation = self.gen(member) if member else 0
        return cpb.MemberRef(member_id=member, generation_id=generation)

    def ack_cmd(
        self, receipts: Sequence[pb.Receipt], member: str = "", gen: int | None = None
    ) -> object:
        return self.one(
            cpb.AckCmd(
                queue=self.queue,
                queue_id=self.q.queue_id,
                group=self.group,
                receipts=receipts,
                now_ms=T0,
                member=self.ref(member, gen),
            )
        )

    def nack_cmd(self, receipts: Sequence[pb.Receipt], member: str, gen: int) -> object:
        return self.one(
            cpb.NackCmd(
                queue=self.queue,
                queue_id=self.q.queue_id,
                group=self.group,
                receipts=receipts,
                now_ms=T0,
                member=self.ref(member, gen),
            )
        )

    def extend_cmd(self, receipts: Sequence[pb.Receipt], member: str, gen: int) -> object:
        return self.one(
            cpb.ExtendLeaseCmd(
                queue=self.queue,
                queue_id=self.q.queue_id,
                group=self.group,
                receipts=receipts,
                now_ms=T0,
                lease_ms=LEASE_MS,
                member=self.ref(member, gen),
            )
        )

    def commit_cmd(self, offsets: dict[int, int], member: str, gen: int) -> object:
        return self.one(
            cpb.CommitOffsetsCmd(
                queue=self.queue,
                queue_id=self.q.queue_id,
                group=self.group,
                offsets=offsets,
                member=self.ref(member, gen),
            )
        )

    def transact_cmd(self, receipts: Sequence[pb.Receipt], member: str, gen: int) -> object:
        ack = cpb.AckCmd(
            queue=self.queue,
            queue_id=self.q.queue_id,
            group=self.group,
            receipts=receipts,
            now_ms=T0,
            member=self.ref(member, gen),
        )
        return self.one(cpb.TransactCmd(acks=[ack]))


def refused(res: object, reason: str) -> FluxError:
    assert isinstance(res, FluxError), res
    assert res.reason == reason, res
    return res


def comparable(res: object) -> object:
    if isinstance(res, FluxError):  # compared by identity otherwise
        return ("FluxError", res.reason, res.message, res.metadata, res.violations)
    return res


def where(res: LeaseResult) -> list[tuple[int, bytes]]:
    return [(x.partition, x.record.value) for x in res.deliveries]


def one_per_partition(grp: Grp, partitions: int, tag: str = "") -> None:
    for p in range(partitions):
        grp.publish(p, f"p{p}{tag}".encode())


# -- join and lease --------------------------------------------------------------------------


def test_join_on_an_ordered_group_assigns_partitions_and_a_member_leases_only_its_own() -> None:
    grp = Grp(MemoryStore(), partitions=4)
    one_per_partition(grp, 4)
    a = grp.join("ca", "a")
    assert list(a.member.assigned) == [0, 1, 2, 3] and a.member.generation_id == 1
    assert a.group_generation == 1
    b = grp.join("cb", "b")
    assert (list(b.member.assigned), list(b.member.pending)) == ([], [2, 3])
    assert grp.ms().members["a"].revoking == {2, 3}
    # a stops getting work from the partitions it is giving up; b waits for them.
    assert sorted(where(grp.lease("ca", "a"))) == [(0, b"p0"), (1, b"p1")]
    assert grp.lease("cb", "b").deliveries == []
    assert grp.released("a") == [2, 3]
    assert grp.owned() == {"a": [0, 1], "b": [2, 3]}
    assert sorted(where(grp.lease("cb", "b"))) == [(2, b"p2"), (3, b"p3")]
    one_per_partition(grp, 4, "'")
    assert grp.lease("ca", "a").deliveries == []  # a's partitions still have a batch out
    assert grp.lease("cb", "b").deliveries == []


def test_join_result_reports_the_members_view_and_a_rejoin_changes_nothing() -> None:
    grp = Grp(MemoryStore(), partitions=3)
    first = grp.join("ca", "a", now=T0 + 5)
    assert first.member == pb.GroupMember(
        member_id="a",
        consumer_id="ca",
        generation_id=1,
        assigned=[0, 1, 2],
        session_timeout_ms=TIMEOUT,
        joined_at_ms=T0 + 5,
    )
    before = grp.digest()
    again = grp.join("ca", "a", now=T0 + 50)
    assert again.member == first.member and again.group_generation == first.group_generation
    assert grp.digest() == before
    refused(grp.join_cmd("someone-else", "a"), "INVALID_ARGUMENT")
    refused(grp.join_cmd("cb", "b", strategy="sticky"), "INVALID_ARGUMENT")
    assert grp.digest() == before


def test_lease_without_member_id_on_an_ordered_group_with_members_is_refused() -> None:
    grp = Grp(MemoryStore(), partitions=2)
    one_per_partition(grp, 2)
    grp.join("ca", "a")
    before = grp.digest()
    refused(grp.lease_cmd("ca"), "MEMBER_REQUIRED")
    refused(grp.lease_cmd("anyone"), "MEMBER_REQUIRED")
    assert grp.digest() == before


def test_a_shared_group_with_members_still_serves_plain_consumers() -> None:
    grp = Grp(MemoryStore(), partitions=2, mode=SHARED)
    one_per_partition(grp, 2)
    a = grp.join("ca", "a")
    assert list(a.member.assigned) == [] and a.member.generation_id == 1
    assert sorted(where(grp.lease("plain"))) == [(0, b"p0"), (1, b"p1")]


def test_lease_with_another_consumer_id_than_the_member_joined_with_is_refused() -> None:
    grp = Grp(MemoryStore(), partitions=2)
    one_per_partition(grp, 2)
    grp.join("ca", "a")
    before = grp.digest()
    err = refused(grp.lease_cmd("cb", "a", grp.gen("a")), "INVALID_ARGUMENT")
    assert err.metadata["field"] == "consumer_id"
    assert grp.digest() == before


# -- stale generations -------------------------------------------------------------------------


def test_requests_with_a_stale_generation_are_refused_and_change_nothing() -> None:
    grp = Grp(MemoryStore(), partitions=4)
    one_per_partition(grp, 4)
    one_per_partition(grp, 4, "'")
    grp.join("ca", "a")
    old = grp.gen("a")
    leased = grp.receipts(grp.lease("ca", "a", n=4))
    assert len(leased) == 4
    grp.join("cb", "b")  # a loses 2 and 3: requests a made before are stale
    a = grp.ms().members["a"]
    assert a.fenced_below == a.generation > old
    before = grp.digest()
    for gen in (old, a.generation + 1):  # before the fence, and from the future
        refused(grp.lease_cmd("ca", "a", gen), "STALE_GENERATION")
        refused(grp.ack_cmd(leased, "a", gen), "STALE_GENERATION")
        refused(grp.nack_cmd(leased, "a", gen), "STALE_GENERATION")
        refused(grp.extend_cmd(leased, "a", gen), "STALE_GENERATION")
        refused(grp.commit_cmd({0: 1}, "a", gen), "STALE_GENERATION")
        refused(grp.transact_cmd(leased, "a", gen), "STALE_GENERATION")
        refused(grp.release("a", gen), "STALE_GENERATION")
    for member in ("nobody", "b-typo"):
        refused(grp.lease_cmd("ca", member, 1), "STALE_GENERATION")
        refused(grp.ack_cmd(leased, member, 1), "STALE_GENERATION")
        refused(grp.release(member, 1), "STALE_GENERATION")
    assert grp.digest() == before
    # At the current generation the same requests go through.
    res = grp.ack_cmd(leased, "a", a.generation)
    assert isinstance(res, SettleResult) and res.statuses == [ACKED] * 4
    assert grp.commit_cmd({0: 1}, "a", a.generation) is None


def test_a_member_that_only_gained_settles_with_older_generations_but_leases_with_current() -> None:
    grp = Grp(MemoryStore(), partitions=4)
    one_per_partition(grp, 4)
    grp.join("ca", "a")
    grp.join("cb", "b")
    first_b = grp.gen("b")
    assert grp.released("a") == [2, 3]  # b gains: a new generation, no fence
    assert grp.gen("b") > first_b and grp.ms().members["b"].fenced_below == first_b
    # New work needs the current generation: b must first learn that it owns 2 and 3.
    before = grp.digest()
    refused(grp.lease_cmd("cb", "b", first_b), "STALE_GENERATION")
    assert grp.digest() == before
    res = grp.lease_cmd("cb", "b", grp.gen("b"))
    assert isinstance(res, LeaseResult) and sorted(where(res)) == [(2, b"p2"), (3, b"p3")]
    # Settling does not: b was never fenced.
    acked = grp.ack_cmd(grp.receipts(res), "b", first_b)
    assert isinstance(acked, SettleResult) and acked.statuses == [ACKED, ACKED]
    assert grp.commit_cmd({2: 1}, "b", first_b) is None


def test_transact_with_a_stale_member_applies_neither_its_acks_nor_its_appends() -> None:
    grp = Grp(MemoryStore(), partitions=2)
    one_per_partition(grp, 2)
    grp.join("ca", "a")
    old = grp.gen("a")
    leased = grp.receipts(grp.lease("ca", "a"))
    grp.join("cb", "b")
    append = append_cmd(grp.q, [pb.PublishMessage(value=b"out", partition=0)])
    ack = cpb.AckCmd(
        queue=grp.queue,
        queue_id=grp.q.queue_id,
        group=grp.group,
        receipts=leased,
        now_ms=T0,
        member=grp.ref("a", old),
    )
    before = grp.digest()
    refused(grp.one(cpb.TransactCmd(acks=[ack], appends=[append])), "STALE_GENERATION")
    assert grp.digest() == before
    ack.member.generation_id = grp.gen("a")
    res = grp.one(cpb.TransactCmd(acks=[ack], appends=[append]))
    assert isinstance(res, TransactResult) and res.acks[0].statuses == [ACKED, ACKED]


# -- release -----------------------------------------------------------------------------------


def test_a_revoked_partition_with_a_lease_out_moves_only_after_the_lease_is_settled() -> None:
    grp = Grp(MemoryStore(), partitions=2)
    grp.publish(0, b"a0")
    grp.publish(1, b"a1", b"a1'")
    grp.join("ca", "a")
    # One message per lease: the second lease takes the other partition (the first is held).
    first, second = grp.lease("ca", "a", n=1), grp.lease("ca", "a", n=1)
    held = {r.partition: r for r in grp.receipts(first) + grp.receipts(second)}
    assert sorted(held) == [0, 1]
    grp.join("cb", "b")
    assert grp.ms().members["a"].revoking == {1} and grp.ms().members["b"].pending == {1}
    assert grp.released("a") == []  # a batch of partition 1 is still out
    assert grp.ms().members["b"].pending == {1}
    assert grp.lease("cb", "b").deliveries == []
    res = grp.ack_cmd([held[1]], "a")
    assert isinstance(res, SettleResult) and res.statuses == [ACKED]
    before = grp.gen("a")
    refused(grp.release("a", before - 1), "STALE_GENERATION")  # from before it lost 1
    assert grp.released("a") == [1]
    assert grp.owned() == {"a": [0], "b": [1]}
    assert grp.gen("a") == before  # giving up what it already agreed to give is no change
    assert where(grp.lease("cb", "b")) == [(1, b"a1'")]
    # partition 0 stays a's, its batch still out
    assert grp.lease("ca", "a").deliveries == []


def test_a_release_with_a_generation_older_than_the_revoke_releases_nothing() -> None:
    grp = Grp(MemoryStore(), partitions=4)
    grp.join("ca", "a")
    grp.join("cb", "b")
    grp.released("a")
    grp.join("cc", "c")  # range over 3: a [0, 1], b [2], c [3]: b revokes 3
    b = grp.ms().members["b"]
    assert b.revoking == {3} and b.fenced_below == b.generation
    refused(grp.release("b", b.fenced_below - 1), "STALE_GENERATION")
    assert b.revoking == {3}
    assert grp.released("b") == [3]
    assert grp.owned() == {"a": [0, 1], "b": [2], "c": [3]}


# -- members leaving or expiring ---------------------------------------------------------------


def test_an_expired_member_leases_end_now_and_its_partitions_go_to_the_others_at_once() -> None:
    grp = Grp(MemoryStore(), partitions=2)
    grp.publish(0, b"m0")
    grp.publish(1, b"m1")
    grp.join("ca", "a")
    grp.join("cb", "b")
    assert grp.released("a") == [1]
    leased = grp.lease("ca", "a")
    assert where(leased) == [(0, b"m0")]
    gen_b = grp.gen("b")
    t1 = T0 + 100  # long before the lease's own deadline
    assert grp.expire_members(t1, (grp.group_id, "a"), (grp.group_id, "gone")) == 1
    assert set(grp.ms().members) == {"b"}
    b = grp.ms().members["b"]
    assert sorted(b.owned) == [0, 1] and not b.pending and not b.revoking
    assert b.generation > gen_b and b.fenced_below <= gen_b
    # The expired lease still holds partition 0 until the next ExpireLeases pass, at t1.
    assert where(grp.lease("cb", "b", now=t1)) == [(1, b"m1")]
    assert grp.expire_leases(t1).expired_leases == 1
    again = grp.lease("cb", "b", now=t1)
    assert where(again) == [(0, b"m0")] and again.deliveries[0].attempt == 2
    refused(grp.ack_cmd(grp.receipts(leased), "a", 1), "STALE_GENERATION")
    # Expiring again, or in a group that does not exist, does nothing.
    before = grp.digest()
    assert grp.expire_members(t1 + 1, (grp.group_id, "a"), (999, "b")) == 0
    assert grp.digest() == before


def test_an_expired_member_with_leases_on_a_revoked_partition_frees_it_at_once() -> None:
    grp = Grp(MemoryStore(), partitions=2)
    grp.publish(1, b"m1")
    grp.join("ca", "a")
    assert where(grp.lease("ca", "a")) == [(1, b"m1")]
    grp.join("cb", "b")
    assert grp.released("a") == []  # busy
    t1 = T0 + 100
    assert grp.expire_members(t1, (grp.group_id, "a")) == 1
    assert grp.owned() == {"b": [0, 1]}
    assert grp.lease("cb", "b", now=t1).deliveries == []  # until the lease pass
    assert grp.expire_leases(t1).expired_leases == 1
    assert where(grp.lease("cb", "b", now=t1)) == [(1, b"m1")]


def test_leave_group_removes_the_member_and_hands_its_partitions_over() -> None:
    grp = Grp(MemoryStore(), partitions=3)
    one_per_partition(grp, 3)
    grp.join("ca", "a")
    grp.join("cb", "b")
    grp.released("a")
    leased = grp.lease("cb", "b")
    assert {p for p, _ in where(leased)} == set(grp.ms().members["b"].owned)
    assert grp.leave("b", now=T0 + 10) == 1
    assert grp.owned() == {"a": [0, 1, 2]}
    assert grp.leave("b", now=T0 + 10) == 0
    assert grp.expire_leases(T0 + 10).expired_leases == len(leased.deliveries)
    got = grp.lease("ca", "a", now=T0 + 10)
    again = [x for x in got.deliveries if x.partition in {p for p, _ in where(leased)}]
    assert [(x.partition, x.record.value, x.attempt) for x in again] == [
        (x.partition, x.record.value, 2) for x in leased.deliveries
    ]
    assert grp.leave("a") == 1 and grp.ms().members == {}
    # Nobody left: the group is a plain ordered group again.
    assert isinstance(grp.lease_cmd("anyone"), LeaseResult)


def test_a_consumer_rejoining_under_a_new_member_id_replaces_its_old_member() -> None:
    grp = Grp(MemoryStore(), partitions=2)
    grp.join("ca", "a")
    old = grp.gen("a")
    grp.join("cb", "b")
    grp.released("a")
    res = grp.join("ca", "a2")
    assert set(grp.ms().members) == {"a2", "b"}
    assert res.member.consumer_id == "ca"
    refused(grp.lease_cmd("ca", "a", old), "STALE_GENERATION")
    refused(grp.release("a", grp.ms().group_generation), "STALE_GENERATION")


# -- group and queue lifecycle -----------------------------------------------------------------


def test_delete_group_removes_the_membership_row() -> None:
    grp = Grp(MemoryStore(), partitions=2)
    grp.join("ca", "a")
    assert grp.stored_membership(grp.group_id) is not None
    assert grp.one(cpb.DeleteGroupCmd(queue="q", queue_id=grp.q.queue_id, group="g")) is None
    assert grp.stored_membership(grp.group_id) is None
    new_id = grp.create_group("g")
    assert grp.g().membership is None and grp.stored_membership(new_id) is None
    assert isinstance(grp.lease_cmd("ca"), LeaseResult)  # no members: no member needed
    assert grp.expire_members(T0, (grp.group_id, "a")) == 0  # the old group id is gone


def test_delete_queue_removes_the_membership_rows_of_its_groups() -> None:
    grp = Grp(MemoryStore(), partitions=2)
    grp.join("ca", "a")
    other = grp.create_group("h", SHARED)
    grp.join("ca", "a", group="h")
    assert grp.stored_membership(other) is not None
    assert grp.one(cpb.DeleteQueueCmd(name="q", now_ms=T0)) is None
    assert grp.stored_membership(grp.group_id) is None and grp.stored_membership(other) is None


def test_growing_partitions_rebalances_ordered_groups_with_members_only() -> None:
    store = MemoryStore()
    grp = Grp(store, partitions=2)
    shared = grp.create_group("s", SHARED)
    grp.join("ca", "a")
    grp.join("cb", "b")
    grp.released("a")
    grp.join("ca", "a", group="s")
    assert grp.owned() == {"a": [0], "b": [1]}
    shared_before = grp.stored_membership(shared)
    cfg = pb.QueueConfig()
    cfg.CopyFrom(grp.q.config)
    cfg.partitions = 5
    res = grp.one(
        cpb.UpdateQueueCmd(
            config=cfg,
            now_ms=T0 + 1,
            queue_id=grp.q.queue_id,
            expected_updated_at_ms=grp.q.updated_at_ms,
        )
    )
    assert isinstance(res, pb.Queue) and res.config.partitions == 5
    grp.q = res
    ms = grp.ms()
    ms.check()
    # range over 5: a [0, 1, 2], b [3, 4]. 1 is b's: revoked; 2, 3, 4 were nobody's: granted.
    assert grp.owned() == {"a": [0, 2], "b": [3, 4]}
    assert ms.members["b"].revoking == {1} and ms.members["a"].pending == {1}
    assert grp.stored_membership(grp.group_id) == ms.to_proto().SerializeToString()
    assert grp.stored_membership(shared) == shared_before
    assert grp.released("b") == [1]
    assert grp.owned() == assign("range", ["a", "b"], 5)
    grp.publish(4, b"new")
    assert where(grp.lease("cb", "b")) == [(4, b"new")]


# -- durability and determinism ----------------------------------------------------------------


def test_membership_survives_a_restart_and_matches_a_memory_replica(tmp_path: Path) -> None:
    path = str(tmp_path)
    store = LmdbStore(path)
    grp = Grp(store, partitions=4)
    one_per_partition(grp, 4)
    grp.join("ca", "a", strategy="sticky")
    out = grp.lease("ca", "a", n=1)
    grp.join("cb", "b", strategy="sticky")
    grp.released("a")
    grp.join("cc", "c", strategy="sticky", timeout=20_000)
    stale_gen = grp.ms().members["a"].fenced_below - 1
    before_ms = grp.ms().to_proto().SerializeToString()
    before_digest = grp.digest()
    log = list(grp.log)
    store.close()

    reopened = LmdbStore(path)
    try:
        d = Driver(reopened)
        g = d.sm.delivery.get(grp.q.queue_id, "q", "g")
        assert g.membership is not None
        assert g.membership.to_proto().SerializeToString() == before_ms
        assert d.sm.digest() == before_digest
        replica = Driver(MemoryStore())
        replica.run(*log)
        assert replica.sm.digest() == before_digest
        # The restarted replica goes on fencing and releasing the same way.
        ref = cpb.MemberRef(member_id="a", generation_id=stale_gen)
        ack = cpb.AckCmd(
            queue="q",
            queue_id=grp.q.queue_id,
            group="g",
            receipts=Grp.receipts(out),
            now_ms=T0,
            member=ref,
        )
        for drv in (d, replica):
            refused(drv.one(ack), "STALE_GENERATION")
        ack.member.generation_id = g.membership.members["a"].generation
        rel = cpb.ReleasePartitionsCmd(queue="q", queue_id=grp.q.queue_id, group="g", member_id="a")
        rel.generation_id = ack.member.generation_id
        results = [[comparable(r) for r in drv.run(ack, rel)] for drv in (d, replica)]
        assert results[0] == results[1]
        assert isinstance(results[0][0], SettleResult) and isinstance(results[0][1], MemberResult)
        assert d.sm.digest() == replica.sm.digest()
    finally:
        reopened.close()


class Leader:
    """Picks the next command from replica A's state, as a leader would; every command goes to
    both replicas (B in random batches, sometimes restarting from its store in between) and both
    must answer alike."""

    def __init__(self, seed: int) -> None:
        self.seed = seed
        self.rng = random.Random(seed)
        self.a = Grp(MemoryStore(), partitions=self.rng.randint(1, 6))
        self.strategy = self.rng.choice(["range", "round_robin", "sticky"])
        self.b = Driver(MemoryStore())
        self.b_results = self.b.run(*self.a.log)
        self.a_results: list[object] = [None] * len(self.b_results)  # set up: not compared
        self.sent = len(self.a.log)
        self.now = T0
        self.consumers = 0
        self.members = 0
        self.outstanding: list[tuple[str, pb.Receipt]] = []

    def live(self) -> dict[str, tuple[str, int, int]]:
        ms = self.a.g().membership
        if ms is None:
            return {}
        return {mid: (m.consumer_id, m.generation, m.fenced_below) for mid, m in ms.members.items()}

    def step(self) -> None:
        rng, a = self.rng, self.a
        self.now += rng.randint(0, 2_000)
        live = self.live()
        mids = sorted(live)
        action = rng.choice(
            ["join", "join", "replace", "leave", "expire", "release", "release", "stale"]
            + ["lease"] * 4
            + ["ack", "ack", "nack", "extend", "publish", "publish", "expire_leases", "grow"]
        )
        if not mids and action not in ("publish", "expire_leases", "grow"):
            action = "join"
        res: object
        if action == "join":
            self.consumers += 1
            self.members += 1
            res = a.join_cmd(f"c{self.consumers}", f"m{self.members}", self.strategy, self.now)
        elif action == "replace":
            self.members += 1
            res = a.join_cmd(live[rng.choice(mids)][0], f"m{self.members}", self.strategy, self.now)
        elif action == "leave":
            res = a.leave(rng.choice(mids), self.now)
        elif action == "expire":
            picked = rng.sample(mids, rng.randint(1, len(mids)))
            res = a.expire_members(self.now, *[(a.group_id, m) for m in picked])
        elif action == "release":
            mid = rng.choice(mids)
            res = a.release(mid, live[mid][1])
            if isinstance(res, MemberResult):
                for p in res.released:
                    assert not a.sm.delivery.busy(a.g(), p), (self.seed, p)
        elif action == "stale":
            mid = rng.choice(mids)
            gen = rng.choice([live[mid][2] - 1, live[mid][1] + 1])
            before = a.digest()
            res = a.lease_cmd(live[mid][0], mid, max(gen, 0), now=self.now)
            refused(res, "STALE_GENERATION")  # a lease needs the member's current generation
            assert a.digest() == before, self.seed
        elif action == "lease":
            mid = "" if rng.random() < 0.1 else rng.choice(mids)
            consumer = live[mid][0] if mid else "plain"
            gen = live[mid][1] if mid else 0
            res = a.lease_cmd(consumer, mid, gen, n=rng.randint(1, 5), now=self.now)
            if mid:
                assert isinstance(res, LeaseResult), (self.seed, res)
                owned = a.ms().members[mid].owned
                assert {x.partition for x in res.deliveries} <= owned, (self.seed, res, owned)
                self.outstanding += [(mid, r) for r in Grp.receipts(res)]
            else:
                refused(res, "MEMBER_REQUIRED")
        elif action in ("ack", "nack", "extend") and self.outstanding:
            k = rng.randint(1, len(self.outstanding))
            settle, self.outstanding = self.outstanding[:k], self.outstanding[k:]
            mid = settle[0][0]
            gen = live.get(mid, ("", 1, 0))[1]
            receipts = [r for m, r in settle if m == mid]
            if action == "ack":
                res = a.ack_cmd(receipts, mid, gen)
            elif action == "nack":
                res = a.nack_cmd(receipts, mid, gen)
            else:
                res = a.extend_cmd(receipts, mid, gen)
            if mid not in live:
                refused(res, "STALE_GENERATION")
        elif action == "expire_leases":
            res = a.expire_leases(self.now)
        elif action == "grow":
            q = a.sm.catalog["q"].queue
            cfg = pb.QueueConfig()
            cfg.CopyFrom(q.config)
            cfg.partitions = min(q.config.partitions + 1, 12)
            res = a.one(
                cpb.UpdateQueueCmd(
                    config=cfg,
                    now_ms=self.now,
                    queue_id=q.queue_id,
                    expected_updated_at_ms=q.updated_at_ms,
                )
            )
            a.q = a.sm.catalog["q"].queue
        else:
            npart = a.sm.catalog["q"].policy.partitions
            res = a.publish(rng.randrange(npart), b"x", now=self.now)
        self.a_results.append(res)
        if a.g().membership is not None:
            a.ms().check()
        if rng.random() < 0.3:
            self.flush()

    def flush(self) -> None:
        cmds = self.a.log[self.sent :]
        self.sent = len(self.a.log)
        self.b_results += self.b.run(*cmds)
        assert len(self.a_results) == len(self.b_results)
        for i, (x, y) in enumerate(zip(self.a_results, self.b_results, strict=True)):
            assert x is None or comparable(x) == comparable(y), (self.seed, i, x, y)
        assert self.a.digest() == self.b.sm.digest(), self.seed
        if self.rng.random() < 0.2:  # B restarts: everything it knows comes from its store
            self.b = Driver(self.b.sm.store)
            assert self.b.sm.last_applied_index() == self.a.d.index, self.seed


def test_two_replicas_applying_the_same_membership_commands_end_equal() -> None:
    for seed in range(25):
        leader = Leader(seed)
        for _ in range(80):
            leader.step()
        leader.flush()
        ms = leader.a.g().membership
        other = leader.b.sm.delivery.get(leader.a.q.queue_id, "q", "g").membership
        assert ms == other, seed
