"""Each consumer-group rule is written once (fluxmq.core.commands.rules) and refuses alike on
both sides: the leader preparing a command against the published view (``prepare_*``), and the
apply of a command that skipped that preparation (built by hand here, as an older leader or a
race could put it in the log), applied through ``QueueStateMachine.apply_batch``."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from fluxmq._pb.internal import commands_pb2 as cpb
from fluxmq._pb.v1 import queue_pb2 as pb
from fluxmq.core.catalog import QueueEntry
from fluxmq.core.commands.leases import (
    LeaseAsk,
    lease_ask,
    prepare_ack,
    prepare_commit_offsets,
    prepare_extend,
    prepare_lease,
    prepare_nack,
)
from fluxmq.core.commands.results import LeaseResult, MemberResult, SettleResult
from fluxmq.core.commands.transact import prepare_transact
from fluxmq.core.errors import FluxError
from storage import Store
from tests.unit.test_state_machine import T0, Driver, receipts_of
from tests.unit.test_state_machine import store as store  # the fixture: memory and LMDB

LEASE_MS = 30_000


def refusal(err: object) -> tuple[str, str, dict[str, str], object]:
    """What a client sees of a refusal: reason, message, ErrorInfo metadata, violations."""
    assert isinstance(err, FluxError), err
    return err.reason, err.message, dict(err.metadata), err.violations


def prepared_refusal(prepare: Callable[[], object]) -> tuple[str, str, dict[str, str], object]:
    with pytest.raises(FluxError) as info:
        prepare()
    return refusal(info.value)


class Setup:
    """One queue ``q`` with groups; helpers for what both sides need."""

    def __init__(self, store: Store, **queue: object) -> None:
        self.d = Driver(store)
        self.q = self.d.create("q", **queue)

    @property
    def entry(self) -> QueueEntry:
        return self.d.sm.view.catalog["q"]

    def group(self, name: str, mode: pb.DeliveryMode = pb.DELIVERY_MODE_SHARED) -> int:
        g = self.d.one(
            cpb.CreateGroupCmd(
                queue="q", queue_id=self.q.queue_id, group=name, mode=mode, now_ms=T0
            )
        )
        assert isinstance(g, pb.Group)
        return int(g.group_id)

    def lease(self, group: str, consumer: str = "c", member: cpb.MemberRef | None = None) -> object:
        return self.d.one(
            cpb.LeaseCmd(
                queue="q",
                queue_id=self.q.queue_id,
                group=group,
                consumer_id=consumer,
                max_messages=10,
                lease_ms=LEASE_MS,
                now_ms=T0,
                member=member,
            )
        )

    def join(self, group: str, consumer: str, member_id: str) -> MemberResult:
        res = self.d.one(
            cpb.JoinGroupCmd(
                queue="q",
                queue_id=self.q.queue_id,
                group=group,
                consumer_id=consumer,
                member_id=member_id,
                session_timeout_ms=10_000,
                strategy="range",
                now_ms=T0,
            )
        )
        assert isinstance(res, MemberResult), res
        return res


def leased_receipts(s: Setup, group: str) -> list[pb.Receipt]:
    s.d.append(s.q, [b"a", b"b"])
    res = s.lease(group)
    assert isinstance(res, LeaseResult) and res.deliveries
    return receipts_of(res)


# -- receipts belong to the group -------------------------------------------------------------


def test_foreign_receipt_is_refused_alike_by_prepare_and_apply(store: Store) -> None:
    s = Setup(store)
    s.group("mine")
    s.group("other")
    receipts = leased_receipts(s, "mine")
    req = pb.AckRequest(queue="q", group="other", receipts=receipts)
    leader = prepared_refusal(lambda: prepare_ack(s.d.sm.view, s.entry, req, T0))
    cmd = cpb.AckCmd(queue="q", queue_id=s.q.queue_id, group="other", receipts=receipts, now_ms=T0)
    applied = refusal(s.d.one(cmd))
    assert leader == applied
    assert applied[0] == "RECEIPT_MISMATCH"
    assert applied[2] == {"field": "receipts[0]", "group": "other"}


def test_foreign_receipt_of_a_nack_or_an_extend_is_refused_alike(store: Store) -> None:
    s = Setup(store)
    s.group("mine")
    s.group("other")
    receipts = leased_receipts(s, "mine")
    view, entry, qid = s.d.sm.view, s.entry, s.q.queue_id
    nack = pb.NackRequest(queue="q", group="other", receipts=receipts)
    extend = pb.ExtendLeaseRequest(queue="q", group="other", receipts=receipts)
    by_leader = [
        prepared_refusal(lambda: prepare_nack(view, entry, nack, T0)),
        prepared_refusal(lambda: prepare_extend(view, entry, extend, T0)),
    ]
    by_apply = [
        refusal(s.d.one(cpb.NackCmd(queue="q", queue_id=qid, group="other", receipts=receipts))),
        refusal(
            s.d.one(cpb.ExtendLeaseCmd(queue="q", queue_id=qid, group="other", receipts=receipts))
        ),
    ]
    assert by_leader == by_apply
    assert {r[0] for r in by_apply} == {"RECEIPT_MISMATCH"}


def test_foreign_receipt_in_a_transaction_names_the_same_field_on_both_sides(
    store: Store,
) -> None:
    s = Setup(store)
    s.group("mine")
    s.group("other")
    receipts = leased_receipts(s, "mine")
    ack = pb.AckRequest(queue="q", group="other", receipts=receipts)
    req = pb.TransactRequest(acks=[ack])
    leader = prepared_refusal(lambda: prepare_transact(s.d.sm.view, req, T0))
    cmd = cpb.TransactCmd(
        acks=[cpb.AckCmd(queue="q", queue_id=s.q.queue_id, group="other", receipts=receipts)]
    )
    applied = refusal(s.d.one(cmd))
    assert leader == applied
    assert applied[2]["field"] == "acks[0].receipts[0]"


# -- members and generations ------------------------------------------------------------------


def test_stale_generation_is_refused_alike_by_prepare_and_apply(store: Store) -> None:
    s = Setup(store, partitions=2)
    s.group("g", pb.DELIVERY_MODE_ORDERED)
    joined = s.join("g", "c", "m-1")
    future = joined.member.generation_id + 1  # a generation the member never had
    commit = pb.CommitOffsetsRequest(
        queue="q", group="g", offsets={0: 0}, member_id="m-1", generation_id=future
    )
    leader = prepared_refusal(lambda: prepare_commit_offsets(s.d.sm.view, s.entry, commit))
    stale_ref = cpb.MemberRef(member_id="m-1", generation_id=future)
    cmd = cpb.CommitOffsetsCmd(
        queue="q", queue_id=s.q.queue_id, group="g", offsets={0: 0}, member=stale_ref
    )
    applied = refusal(s.d.one(cmd))
    assert leader == applied
    assert applied[0] == "STALE_GENERATION"


def test_lease_with_a_stale_generation_is_refused_alike(store: Store) -> None:
    s = Setup(store, partitions=2)
    s.group("g", pb.DELIVERY_MODE_ORDERED)
    joined = s.join("g", "c", "m-1")
    old = joined.member.generation_id - 1  # leasing needs the member's current generation
    req = pb.LeaseRequest(queue="q", group="g", consumer_id="c", member_id="m-1", generation_id=old)
    leader = prepared_refusal(lambda: lease_ask(s.d.sm.view, s.entry, req))
    applied = refusal(s.lease("g", member=cpb.MemberRef(member_id="m-1", generation_id=old)))
    assert leader == applied
    assert applied[0] == "STALE_GENERATION"


def test_member_less_lease_of_an_ordered_group_with_members_is_refused_alike(
    store: Store,
) -> None:
    s = Setup(store, partitions=2)
    s.group("g", pb.DELIVERY_MODE_ORDERED)
    s.join("g", "c", "m-1")
    s.d.append(s.q, [b"a"])
    req = pb.LeaseRequest(queue="q", group="g", consumer_id="c")
    leader = prepared_refusal(lambda: lease_ask(s.d.sm.view, s.entry, req))
    applied = refusal(s.lease("g"))
    assert leader == applied
    assert applied[0] == "MEMBER_REQUIRED"
    assert applied[2] == {"group": "g"}


def test_lease_as_another_consumer_than_the_member_joined_as_is_refused_alike(
    store: Store,
) -> None:
    s = Setup(store, partitions=2)
    group_id = s.group("g", pb.DELIVERY_MODE_ORDERED)
    joined = s.join("g", "c", "m-1")
    ref = cpb.MemberRef(member_id="m-1", generation_id=joined.member.generation_id)
    ask = LeaseAsk("g", group_id, "impostor", 10, LEASE_MS, ref)
    leader = prepared_refusal(lambda: prepare_lease(s.d.sm.view, s.entry, ask, 10, T0))
    applied = refusal(s.lease("g", consumer="impostor", member=ref))
    assert leader == applied
    assert applied[0] == "INVALID_ARGUMENT" and applied[2] == {"field": "consumer_id"}


# -- dead letters -----------------------------------------------------------------------------


def test_nack_dead_without_a_dead_letter_queue_is_refused_alike(store: Store) -> None:
    s = Setup(store, dead_letter_disabled=True)
    s.group("g")
    receipts = leased_receipts(s, "g")
    req = pb.NackRequest(queue="q", group="g", receipts=receipts, dead=True)
    leader = prepared_refusal(lambda: prepare_nack(s.d.sm.view, s.entry, req, T0))
    cmd = cpb.NackCmd(
        queue="q", queue_id=s.q.queue_id, group="g", receipts=receipts, dead=True, now_ms=T0
    )
    applied = refusal(s.d.one(cmd))
    assert leader == applied
    assert applied[0] == "NO_DEAD_LETTER_QUEUE"
    assert applied[2] == {"queue": "q", "field": "dead"}


# -- what passes the leader passes the apply --------------------------------------------------


def test_a_prepared_ack_of_the_group_own_receipts_applies(store: Store) -> None:
    s = Setup(store)
    s.group("g")
    receipts = leased_receipts(s, "g")
    cmd = prepare_ack(
        s.d.sm.view, s.entry, pb.AckRequest(queue="q", group="g", receipts=receipts), T0
    )
    res = s.d.one(cmd)
    assert isinstance(res, SettleResult)
    assert res.statuses == [pb.RECEIPT_STATUS_ACKED] * len(receipts)
