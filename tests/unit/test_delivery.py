"""Consumer-group delivery, driven through the state machine with commands (time is an input:
no sleeps). Every scenario runs against both stores unless it says why not."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from fluxmq._pb.internal import commands_pb2 as cpb
from fluxmq._pb.v1 import queue_pb2 as pb
from fluxmq.core import commands, keys
from fluxmq.core.commands.letters import dead_letter_depth
from fluxmq.core.commands.results import (
    AppendResult,
    ExpireResult,
    LeaseResult,
    PurgeResult,
    RetentionResult,
    SettleResult,
    TransactResult,
)
from fluxmq.core.delivery import PartitionView
from fluxmq.core.errors import FluxError
from fluxmq.core.queue_config import normalize_new
from fluxmq.core.reader import QueueReader
from fluxmq.core.state_machine import QueueStateMachine
from storage import LmdbStore, MemoryStore, Store
from storage.api import Record
from tests.unit.test_state_machine import T0, Driver, E, append_cmd, receipts_of
from tests.unit.test_state_machine import store as store  # the fixture: memory and LMDB

ACKED = pb.RECEIPT_STATUS_ACKED
ALREADY_ACKED = pb.RECEIPT_STATUS_ALREADY_ACKED
UNKNOWN = pb.RECEIPT_STATUS_UNKNOWN
STALE = pb.RECEIPT_STATUS_STALE
NACKED = pb.RECEIPT_STATUS_NACKED
DEAD_LETTERED = pb.RECEIPT_STATUS_DEAD_LETTERED
EXTENDED = pb.RECEIPT_STATUS_EXTENDED

LEASE_MS = 1000


def msg(value: bytes, partition: int = 0, **kw: object) -> pb.PublishMessage:
    return pb.PublishMessage(value=value, partition=partition, **kw)  # type: ignore[arg-type]


@dataclass
class Q:
    """One queue of a Driver, with the delivery commands spelled out once."""

    d: Driver
    q: pb.Queue
    group_ids: dict[str, int] = field(default_factory=dict)

    @property
    def name(self) -> str:
        return str(self.q.config.name)

    @property
    def sm(self) -> QueueStateMachine:
        return self.d.sm

    def publish(self, *msgs: pb.PublishMessage, now: int = T0) -> AppendResult:
        res = self.d.one(append_cmd(self.q, list(msgs), now))
        assert isinstance(res, AppendResult), res
        return res

    def group_cmd(self, name: str = "g", now: int = T0, **kw: object) -> object:
        return self.d.one(
            cpb.CreateGroupCmd(
                queue=self.name,
                queue_id=self.q.queue_id,
                group=name,
                now_ms=now,
                **kw,  # type: ignore[arg-type]
            )
        )

    def group(self, name: str = "g", now: int = T0, **kw: object) -> pb.Group:
        g = self.group_cmd(name, now, **kw)
        assert isinstance(g, pb.Group), g
        self.group_ids[name] = g.group_id
        return g

    def lease_cmd(
        self,
        group: str = "g",
        consumer: str = "c1",
        n: int = 10,
        now: int = T0,
        lease_ms: int = LEASE_MS,
    ) -> object:
        return self.d.one(
            cpb.LeaseCmd(
                queue=self.name,
                queue_id=self.q.queue_id,
                group=group,
                consumer_id=consumer,
                max_messages=n,
                lease_ms=lease_ms,
                now_ms=now,
            )
        )

    def lease(
        self,
        group: str = "g",
        consumer: str = "c1",
        n: int = 10,
        now: int = T0,
        lease_ms: int = LEASE_MS,
    ) -> LeaseResult:
        res = self.lease_cmd(group, consumer, n, now, lease_ms)
        assert isinstance(res, LeaseResult), res
        return res

    @staticmethod
    def receipts(res: LeaseResult) -> list[pb.Receipt]:
        return receipts_of(res)

    def ack_cmd(self, receipts: Sequence[pb.Receipt], group: str = "g", now: int = T0) -> object:
        return self.d.one(
            cpb.AckCmd(
                queue=self.name,
                queue_id=self.q.queue_id,
                group=group,
                receipts=receipts,
                now_ms=now,
            )
        )

    def ack(self, receipts: Sequence[pb.Receipt], group: str = "g", now: int = T0) -> list[int]:
        res = self.ack_cmd(receipts, group, now)
        assert isinstance(res, SettleResult), res
        return res.statuses

    def nack_cmd(
        self,
        receipts: Sequence[pb.Receipt],
        group: str = "g",
        now: int = T0,
        retry_at: int = 0,
        dead: bool = False,
        reason: str = "",
    ) -> object:
        return self.d.one(
            cpb.NackCmd(
                queue=self.name,
                queue_id=self.q.queue_id,
                group=group,
                receipts=receipts,
                now_ms=now,
                retry_at_ms=retry_at,
                dead=dead,
                reason=reason,
            )
        )

    def nack(
        self,
        receipts: Sequence[pb.Receipt],
        group: str = "g",
        now: int = T0,
        retry_at: int = 0,
        dead: bool = False,
        reason: str = "",
    ) -> list[int]:
        res = self.nack_cmd(receipts, group, now, retry_at, dead, reason)
        assert isinstance(res, SettleResult), res
        return res.statuses

    def extend(
        self, receipts: Sequence[pb.Receipt], group: str = "g", now: int = T0, lease_ms: int = 0
    ) -> SettleResult:
        res = self.d.one(
            cpb.ExtendLeaseCmd(
                queue=self.name,
                queue_id=self.q.queue_id,
                group=group,
                receipts=receipts,
                now_ms=now,
                lease_ms=lease_ms,
            )
        )
        assert isinstance(res, SettleResult), res
        return res

    def expire(self, now: int) -> ExpireResult:
        res = self.d.one(cpb.ExpireLeasesCmd(now_ms=now))
        assert isinstance(res, ExpireResult), res
        return res

    def purge(self, now: int = T0, scope: int = 0, destructive: bool = False) -> PurgeResult:
        res = self.d.one(
            cpb.PurgeCmd(
                name=self.name,
                queue_id=self.q.queue_id,
                now_ms=now,
                scope=scope,  # type: ignore[arg-type]
                destructive=destructive,
            )
        )
        assert isinstance(res, PurgeResult), res
        return res

    def retention(self, now: int = T0) -> RetentionResult:
        res = self.d.one(cpb.ApplyRetentionCmd(now_ms=now))
        assert isinstance(res, RetentionResult), res
        return res

    def replay(self, now: int = T0, ids: Sequence[int] = (), group: str = "") -> int:
        res = self.d.one(
            cpb.ReplayDeadLettersCmd(
                queue=self.name,
                queue_id=self.q.queue_id,
                ids=ids,
                all=not ids,
                group=group,
                now_ms=now,
            )
        )
        assert isinstance(res, int), res
        return res

    def view(self, group: str = "g", partition: int = 0) -> PartitionView:
        g = self.sm.delivery.get(self.q.queue_id, self.name, group)
        return self.sm.delivery.view(g, partition)

    def log(self, partition: int = 0, queue: str | None = None) -> list[Record]:
        entry = self.sm.catalog[queue or self.name]
        with self.sm.store.read() as txn:
            lg = txn.log(keys.log_id(entry.queue_id, partition))
            wm = lg.watermarks()
            return lg.read(wm.low, 100_000, 1 << 40) if wm.high > wm.low else []

    def dlq(self) -> list[Record]:
        name = f"{self.name}.dlq"
        return self.log(0, name) if name in self.sm.catalog else []

    def dlq_depth(self) -> int:
        with self.sm.store.read() as txn:
            return dead_letter_depth(txn, self.sm.catalog, self.sm.catalog[self.name])


def make(store: Store, name: str = "q", **kw: object) -> Q:
    d = Driver(store)
    return Q(d, d.create(name, **kw))


def values(res: LeaseResult) -> list[bytes]:
    return [x.record.value for x in res.deliveries]


def offsets(res: LeaseResult) -> list[tuple[int, int]]:
    return [(x.partition, x.record.offset) for x in res.deliveries]


def hdrs(record: Record) -> dict[str, bytes]:
    return dict(record.headers)


def refused(res: object, reason: str) -> FluxError:
    assert isinstance(res, FluxError), res
    assert res.reason == reason, res
    return res


# -- leases, expiry, attempts ----------------------------------------------------------------


def test_expired_lease_is_redelivered_with_the_next_attempt(store: Store) -> None:
    q = make(store)
    q.group()
    q.publish(msg(b"a"))
    first = q.lease(now=T0)
    assert [(x.attempt, x.deadline_ms) for x in first.deliveries] == [(1, T0 + LEASE_MS)]
    assert q.lease(consumer="c2", now=T0 + 10).deliveries == []  # leased: invisible to others
    assert q.expire(T0 + LEASE_MS - 1).expired_leases == 0
    assert q.lease(consumer="c2", now=T0 + LEASE_MS - 1).deliveries == []
    assert q.expire(T0 + LEASE_MS).expired_leases == 1
    assert q.view().scheduled == {0: (T0 + LEASE_MS, 1)}
    again = q.lease(consumer="c2", now=T0 + LEASE_MS)
    assert values(again) == [b"a"]
    (x,) = again.deliveries
    assert x.attempt == 2 and x.lease_id != first.deliveries[0].lease_id
    assert q.view().leased == {0: ("c2", x.lease_id, 2, T0 + 2 * LEASE_MS)}


def test_expired_lease_goes_behind_the_messages_already_waiting_in_shared_mode(
    store: Store,
) -> None:
    q = make(store)
    q.group()
    q.publish(msg(b"m0"), now=T0)
    assert values(q.lease(n=1, now=T0)) == [b"m0"]
    q.publish(msg(b"m1"), msg(b"m2"), now=T0 + 500)  # waiting since before m0's deadline
    q.expire(T0 + LEASE_MS)
    q.publish(msg(b"m3"), now=T0 + 2000)  # ready only after m0 came back
    res = q.lease(consumer="c2", n=10, now=T0 + 2000)
    assert values(res) == [b"m1", b"m2", b"m0", b"m3"]
    assert [x.attempt for x in res.deliveries] == [1, 1, 2, 1]


def test_expired_lease_is_ready_from_its_deadline_even_if_the_expiry_pass_is_late(
    store: Store,
) -> None:
    q = make(store)
    q.group()
    q.publish(msg(b"m0"), now=T0)
    q.lease(n=1, now=T0)
    q.publish(msg(b"m1"), now=T0 + LEASE_MS + 200)  # after m0's deadline
    assert q.expire(T0 + LEASE_MS + 500).expired_leases == 1
    assert q.view().scheduled == {0: (T0 + LEASE_MS, 1)}
    assert values(q.lease(n=10, now=T0 + LEASE_MS + 500)) == [b"m0", b"m1"]


def test_extended_lease_is_not_redelivered_at_its_old_deadline(store: Store) -> None:
    q = make(store)
    q.group()
    q.publish(msg(b"a"))
    rc = q.receipts(q.lease(now=T0))
    ext = q.extend(rc, now=T0 + 900, lease_ms=5000)
    assert ext.statuses == [EXTENDED] and ext.deadlines_ms == [T0 + 5900]
    assert q.expire(T0 + LEASE_MS).expired_leases == 0
    assert q.view().leased[0][3] == T0 + 5900
    assert q.expire(T0 + 5900).expired_leases == 1
    assert q.extend(rc, now=T0 + 6000, lease_ms=5000).statuses == [STALE]


def test_message_past_max_attempts_goes_to_the_dlq_with_its_history(store: Store) -> None:
    q = make(store, max_attempts=2)
    q.group()
    q.publish(msg(b"poison", key=b"k", headers={"trace": b"t1"}), now=T0)
    for attempt in (1, 2):
        now = T0 + (attempt - 1) * 10_000
        (x,) = q.lease(now=now).deliveries
        assert x.attempt == attempt
        res = q.expire(now + LEASE_MS)
        assert (res.expired_leases, res.dead_letters) == (1, attempt - 1)
    (dead,) = q.dlq()
    assert (dead.value, dead.key) == (b"poison", b"k")
    assert hdrs(dead) == {
        "trace": b"t1",
        "fluxmq-original-queue": b"q",
        "fluxmq-original-partition": b"0",
        "fluxmq-original-offset": b"0",
        "fluxmq-original-timestamp": str(T0).encode(),
        "fluxmq-attempts": b"2",
        "fluxmq-dead-reason": b"max_attempts",
        "fluxmq-dead-at": str(T0 + 10_000 + LEASE_MS).encode(),
        "fluxmq-group": b"g",
    }
    v = q.view()
    assert (v.dead, v.committed, v.next, v.leased, v.scheduled) == (1, 1, 1, {}, {})
    assert q.lease(now=T0 + 60_000).deliveries == []
    assert q.sm.catalog["q.dlq"].queue.dead_letter_of == "q"
    assert q.dlq_depth() == 1


def test_nack_of_the_last_allowed_attempt_dead_letters_it(store: Store) -> None:
    q = make(store, max_attempts=1)
    q.group()
    q.publish(msg(b"a"))
    assert q.nack(q.receipts(q.lease()), now=T0 + 5) == [DEAD_LETTERED]
    (dead,) = q.dlq()
    assert hdrs(dead)["fluxmq-dead-reason"] == b"max_attempts"
    assert hdrs(dead)["fluxmq-attempts"] == b"1"
    assert q.view().dead == 1


def test_nack_dead_sends_the_message_to_the_dlq_with_its_reason(store: Store) -> None:
    q = make(store)
    q.group()
    q.publish(msg(b"a"), msg(b"b"))
    rc = q.receipts(q.lease(n=2))
    assert q.nack(rc[:1], now=T0 + 7, dead=True, reason="bad payload") == [DEAD_LETTERED]
    assert q.nack(rc[1:], now=T0 + 8, dead=True) == [DEAD_LETTERED]
    first, second = q.dlq()
    assert (first.value, hdrs(first)["fluxmq-dead-reason"]) == (b"a", b"bad payload")
    assert hdrs(first)["fluxmq-attempts"] == b"1"
    assert hdrs(first)["fluxmq-dead-at"] == str(T0 + 7).encode()
    assert (second.value, hdrs(second)["fluxmq-dead-reason"]) == (b"b", b"nacked")
    v = q.view()
    assert (v.dead, v.committed, v.leased) == (2, 2, {})
    assert q.ack(rc) == [ALREADY_ACKED, ALREADY_ACKED]


def test_nack_dead_without_a_dead_letter_queue_is_refused_and_changes_nothing(
    store: Store,
) -> None:
    q = make(store, dead_letter_disabled=True)
    q.group()
    q.publish(msg(b"a"))
    rc = q.receipts(q.lease())
    before = q.view()
    refused(q.nack_cmd(rc, now=T0 + 1, dead=True), "NO_DEAD_LETTER_QUEUE")
    assert q.view() == before
    assert set(q.sm.catalog) == {"q"}
    assert q.ack(rc) == [ACKED]  # the lease was not touched


def test_undelivered_message_past_its_ttl_goes_to_the_dlq(store: Store) -> None:
    q = make(store, message_ttl="10s")
    q.group()
    q.publish(msg(b"old"), now=T0)
    q.publish(msg(b"young"), now=T0 + 5000)
    res = q.expire(T0 + 9999)
    assert (res.expired_ttl, res.dead_letters) == (0, 0)
    res = q.expire(T0 + 10_000)
    assert (res.expired_ttl, res.dead_letters) == (1, 1)
    (dead,) = q.dlq()
    assert dead.value == b"old"
    assert hdrs(dead)["fluxmq-dead-reason"] == b"ttl"
    assert hdrs(dead)["fluxmq-attempts"] == b"0"
    assert values(q.lease(now=T0 + 10_000)) == [b"young"]
    assert q.view().dead == 1


def test_message_found_past_its_ttl_by_a_lease_is_dead_lettered_not_delivered(
    store: Store,
) -> None:
    q = make(store, message_ttl="10s")
    q.group()
    q.publish(msg(b"old"), now=T0)
    assert q.lease(now=T0 + 10_000).deliveries == []
    assert [r.value for r in q.dlq()] == [b"old"]


def test_ttl_counts_only_the_messages_dead_lettered_for_a_group(store: Store) -> None:
    q = make(store, message_ttl="1s")
    q.group(filter=pb.GroupFilter(key_prefix=b"mine"))
    q.publish(msg(b"a", key=b"mine-1"), msg(b"b", key=b"other"), msg(b"c", key=b"mine-2"))
    res = q.expire(T0 + 1000)
    assert (res.expired_ttl, res.dead_letters) == (2, 2)
    v = q.view()
    assert (v.dead, v.filtered, v.next) == (2, 1, 3)
    assert [r.value for r in q.dlq()] == [b"a", b"c"]


def test_delayed_message_past_its_ttl_is_dead_lettered_instead_of_delivered(store: Store) -> None:
    q = make(store, message_ttl="10s")
    q.group()
    q.publish(msg(b"late", delay_ms=20_000), now=T0)
    assert q.lease(now=T0).deliveries == []  # seen and scheduled for T0 + 20s
    assert q.lease(now=T0 + 20_000).deliveries == []
    (dead,) = q.dlq()
    assert (dead.value, hdrs(dead)["fluxmq-dead-reason"]) == (b"late", b"ttl")
    assert q.view().dead == 1


# -- retries and delays ----------------------------------------------------------------------


def test_nack_with_retry_at_is_not_leasable_before_its_due_time(store: Store) -> None:
    q = make(store)
    q.group()
    q.publish(msg(b"a"))
    due = T0 + 30_000
    assert q.nack(q.receipts(q.lease()), now=T0 + 10, retry_at=due) == [NACKED]
    assert q.view().scheduled == {0: (due, 1)}
    assert q.lease(now=due - 1).deliveries == []
    (x,) = q.lease(now=due).deliveries
    assert (x.record.value, x.attempt) == (b"a", 2)


def test_nack_without_retry_at_waits_for_the_queue_backoff(store: Store) -> None:
    q = make(store, retry_backoff=pb.RetryBackoff(base="1s", max="3s"))
    q.group()
    q.publish(msg(b"a"))
    now = T0
    for attempt, delay in ((1, 1000), (2, 2000), (3, 3000), (4, 3000)):  # doubling, capped
        (x,) = q.lease(now=now).deliveries
        assert x.attempt == attempt
        assert q.nack(q.receipts(LeaseResult(q.group_ids["g"], [x])), now=now) == [NACKED]
        assert q.lease(now=now + delay - 1).deliveries == []
        now += delay


def test_per_message_delay_and_queue_delivery_delay_are_invisible_until_due(
    store: Store,
) -> None:
    q = make(store, delivery_delay="5s")
    q.group()
    q.publish(
        msg(b"queue-delay"),
        msg(b"delay-ms", delay_ms=1000),  # the message's own delay replaces the queue's
        msg(b"deliver-at", deliver_at_ms=T0 + 20_000),
        now=T0,
    )
    seen: list[bytes] = []
    for now, expect in (
        (T0 + 999, []),  # the first look at these records: one millisecond early
        (T0 + 1000, [b"delay-ms"]),
        (T0 + 4999, []),
        (T0 + 5000, [b"queue-delay"]),
        (T0 + 19_999, []),
        (T0 + 20_000, [b"deliver-at"]),
    ):
        got = q.lease(now=now)
        assert values(got) == expect, now
        assert all(x.attempt == 1 for x in got.deliveries)
        seen += values(got)
    assert sorted(seen) == [b"delay-ms", b"deliver-at", b"queue-delay"]


def test_delayed_message_does_not_hold_back_later_ready_ones_in_shared_mode(store: Store) -> None:
    q = make(store)
    q.group()
    q.publish(msg(b"later", delay_ms=60_000), msg(b"now"), now=T0)
    assert values(q.lease(now=T0)) == [b"now"]
    assert q.view().scheduled == {0: (T0 + 60_000, 0)}
    assert values(q.lease(now=T0 + 60_000)) == [b"later"]


# -- dead-letter replay ----------------------------------------------------------------------


def test_replayed_dead_letter_returns_to_its_own_group_only_with_attempts_reset(
    store: Store,
) -> None:
    q = make(store, max_attempts=1)
    for name in ("g", "h"):
        q.group(name)
    q.publish(msg(b"m", key=b"k", headers={"x": b"1"}))
    assert q.ack(q.receipts(q.lease("h")), "h") == [ACKED]
    q.lease("g", now=T0)
    assert q.expire(T0 + LEASE_MS).dead_letters == 1
    assert q.dlq_depth() == 1

    assert q.replay(now=T0 + 5000) == 1
    assert q.dlq_depth() == 0
    (x,) = q.lease("g", now=T0 + 5000).deliveries
    assert (x.record.value, x.record.key, x.attempt, x.record.offset) == (b"m", b"k", 1, 1)
    assert hdrs(x.record)["x"] == b"1"
    assert hdrs(x.record)["fluxmq-replay-group"] == b"g"
    assert "fluxmq-dead-reason" not in hdrs(x.record)
    assert q.ack(q.receipts(LeaseResult(q.group_ids["g"], [x])), "g") == [ACKED]
    # The other group already had its copy: the replay is not for it.
    assert q.lease("h", now=T0 + 5000).deliveries == []
    h = q.view("h")
    assert (h.acked, h.filtered, h.next) == (1, 1, 2)
    assert q.replay(now=T0 + 6000) == 0  # nothing left to replay


def test_replay_of_one_group_leaves_the_other_groups_dead_letters(store: Store) -> None:
    q = make(store, max_attempts=1)
    for name in ("g", "h"):
        q.group(name)
    q.publish(msg(b"m"))
    for name in ("g", "h"):
        q.nack(q.receipts(q.lease(name)), name, dead=True)
    assert q.dlq_depth() == 2
    assert q.replay(now=T0 + 1, group="h") == 1
    assert q.dlq_depth() == 1
    assert q.lease("g", now=T0 + 1).deliveries == []
    assert values(q.lease("h", now=T0 + 1)) == [b"m"]
    assert q.replay(now=T0 + 2, group="g") == 1
    assert q.dlq_depth() == 0
    assert values(q.lease("g", now=T0 + 2)) == [b"m"]


# -- receipts --------------------------------------------------------------------------------


def test_ack_after_redelivery_counts_only_for_the_new_holder(store: Store) -> None:
    q = make(store)
    q.group()
    q.publish(msg(b"a"))
    old = q.receipts(q.lease(consumer="c1", now=T0))
    q.expire(T0 + LEASE_MS)
    new = q.receipts(q.lease(consumer="c2", now=T0 + LEASE_MS))
    assert q.ack(old) == [STALE]
    assert q.view().leased[0][0] == "c2"
    assert q.ack(new) == [ACKED]
    assert q.ack(old) == [ALREADY_ACKED]
    assert q.view().acked == 1


def test_ack_is_idempotent(store: Store) -> None:
    q = make(store)
    q.group()
    q.publish(msg(b"a"), msg(b"b"))
    rc = q.receipts(q.lease(n=1))
    assert q.ack(rc) == [ACKED]
    assert q.ack(rc) == [ALREADY_ACKED]
    assert q.ack(rc + rc) == [ALREADY_ACKED, ALREADY_ACKED]
    v = q.view()
    assert (v.acked, v.committed, v.next) == (1, 1, 1)
    never = pb.Receipt(partition=0, offset=1, lease_id=999, group_id=q.group_ids["g"])
    assert q.ack([never]) == [UNKNOWN]


def test_duplicate_receipt_in_one_ack_is_acked_once(store: Store) -> None:
    q = make(store)
    q.group()
    q.publish(msg(b"a"))
    rc = q.receipts(q.lease())
    assert q.ack(rc + rc) == [ACKED, ALREADY_ACKED]
    assert q.view().acked == 1


def test_receipt_of_another_group_is_refused_and_changes_nothing(store: Store) -> None:
    q = make(store)
    q.group("g")
    q.group("h")
    q.publish(msg(b"a"))
    rc_g = q.receipts(q.lease("g"))
    q.lease("h")
    before = (q.view("g"), q.view("h"))
    for res in (q.ack_cmd(rc_g, "h"), q.nack_cmd(rc_g, "h", dead=True)):
        err = refused(res, "RECEIPT_MISMATCH")
        assert err.metadata["field"] == "receipts[0]"
    assert (q.view("g"), q.view("h")) == before
    assert q.dlq() == []


# -- groups ----------------------------------------------------------------------------------


def test_every_group_gets_every_message_independently(store: Store) -> None:
    q = make(store, partitions=2)
    for name in ("a", "b", "c"):
        q.group(name)
    q.publish(msg(b"0", partition=0), msg(b"1", partition=1), msg(b"2", partition=0))
    got = {name: q.lease(name, n=10) for name in ("a", "b", "c")}
    for res in got.values():
        assert sorted(values(res)) == [b"0", b"1", b"2"]
    assert q.ack(q.receipts(got["a"]), "a") == [ACKED] * 3
    q.expire(T0 + LEASE_MS)  # b's and c's leases come back; a's acks do not affect them
    for name in ("b", "c"):
        assert sorted(values(q.lease(name, now=T0 + LEASE_MS))) == [b"0", b"1", b"2"]
    assert q.lease("a", now=T0 + LEASE_MS).deliveries == []
    assert [q.view("a", p).acked for p in (0, 1)] == [2, 1]


def test_group_created_at_latest_sees_only_new_messages(store: Store) -> None:
    q = make(store, partitions=2)
    q.publish(msg(b"old0", partition=0), msg(b"old1", partition=1))
    q.group("new", start=pb.StartPosition(latest=True))
    q.group("all")
    assert q.view("new", 1).committed == 1
    assert q.lease("new").deliveries == []
    q.publish(msg(b"new0", partition=0), msg(b"new1", partition=1))
    assert sorted(values(q.lease("new"))) == [b"new0", b"new1"]
    assert len(q.lease("all").deliveries) == 4


def test_reset_to_a_timestamp_replays_from_there(store: Store) -> None:
    q = make(store)
    q.group()
    for i in range(3):
        q.publish(msg(b"m%d" % i), now=T0 + i * 1000)
    rc = q.receipts(q.lease(now=T0 + 3000))
    assert q.ack(rc) == [ACKED] * 3
    assert q.lease(now=T0 + 3000).deliveries == []
    res = q.d.one(
        cpb.ResetOffsetsCmd(
            queue="q", queue_id=q.q.queue_id, group="g", to=pb.StartPosition(timestamp_ms=T0 + 500)
        )
    )
    assert res is None
    v = q.view()
    assert (v.committed, v.next) == (1, 1)
    got = q.lease(now=T0 + 4000)
    assert values(got) == [b"m1", b"m2"]
    assert [x.attempt for x in got.deliveries] == [1, 1]


def test_reset_revokes_outstanding_leases(store: Store) -> None:
    q = make(store)
    q.group()
    q.publish(msg(b"a"), msg(b"b"))
    rc = q.receipts(q.lease())
    q.d.one(
        cpb.ResetOffsetsCmd(
            queue="q", queue_id=q.q.queue_id, group="g", to=pb.StartPosition(offset=1)
        )
    )
    v = q.view()
    assert (v.committed, v.next, v.leased, v.scheduled) == (1, 1, {}, {})
    assert q.ack(rc) == [ALREADY_ACKED, STALE]  # the lease of "b" was dropped by the reset
    assert q.expire(T0 + LEASE_MS).expired_leases == 0  # the old deadlines are gone too
    assert values(q.lease(now=T0 + LEASE_MS)) == [b"b"]


def _stored_row(q: Q, group: str = "g", partition: int = 0) -> tuple[int, ...]:
    with q.sm.store.read() as txn:
        raw = txn.get(keys.group_partition_key(q.group_ids[group], partition))
    assert raw is not None
    return tuple(keys.PARTITION_VALUE.unpack(raw))


def test_stored_group_row_accounts_for_every_offset_across_resets(store: Store) -> None:
    """next - base == acked + dead + filtered + skipped + purged + pending, on disk, whatever
    resets skipped or rewound (the audit's totals rule reads exactly this row)."""
    q = make(store)
    q.group(start=pb.StartPosition(offset=0))
    q.publish(*[msg(b"m%d" % i) for i in range(6)])
    rc = q.receipts(q.lease(n=3))
    q.ack(rc[:2])  # one lease stays out
    for to in (5, 1, 6, 0):  # skip ahead, rewind, skip to the end, rewind to the start
        q.d.one(
            cpb.ResetOffsetsCmd(
                queue="q", queue_id=q.q.queue_id, group="g", to=pb.StartPosition(offset=to)
            )
        )
        committed, nxt, acked, dead, filtered, skipped, purged, base = _stored_row(q)
        assert (committed, nxt) == (to, to)
        assert nxt - base == acked + dead + filtered + skipped + purged
    q.ack(q.receipts(q.lease(n=2)))
    committed, nxt, acked, dead, filtered, skipped, purged, base = _stored_row(q)
    assert (committed, nxt, acked) == (2, 2, 4)
    assert nxt - base == acked + dead + filtered + skipped + purged


def test_ordered_mode_holds_a_partition_until_its_batch_is_settled(store: Store) -> None:
    q = make(store)
    q.group(mode=pb.DELIVERY_MODE_ORDERED)
    q.publish(*[msg(b"m%d" % i) for i in range(6)])
    first = q.lease(consumer="c1", n=2)
    assert offsets(first) == [(0, 0), (0, 1)]
    assert q.lease(consumer="c2").deliveries == []
    rc = q.receipts(first)
    assert q.ack(rc[:1]) == [ACKED]
    assert q.lease(consumer="c2").deliveries == []  # offset 1 still leased
    assert q.ack(rc[1:]) == [ACKED]
    second = q.lease(consumer="c2", n=2)
    assert offsets(second) == [(0, 2), (0, 3)]
    # A retry that is not due holds the partition: nothing after it may go first.
    rc = q.receipts(second)
    assert q.nack(rc[:1], now=T0 + 10, retry_at=T0 + 5000) == [NACKED]
    assert q.ack(rc[1:]) == [ACKED]
    assert q.lease(consumer="c3", now=T0 + 4999).deliveries == []
    third = q.lease(consumer="c3", now=T0 + 5000)
    assert offsets(third) == [(0, 2), (0, 4), (0, 5)]
    assert [x.attempt for x in third.deliveries] == [2, 1, 1]


def test_ordered_mode_retry_not_due_holds_back_a_due_retry_behind_it(store: Store) -> None:
    q = make(store)
    q.group(mode=pb.DELIVERY_MODE_ORDERED)
    q.publish(*[msg(b"m%d" % i) for i in range(4)])
    rc = q.receipts(q.lease(n=3, now=T0))
    assert q.nack(rc[:1], now=T0, retry_at=T0 + 5000) == [NACKED]
    assert q.nack(rc[1:2], now=T0, retry_at=T0 + 10) == [NACKED]
    assert q.ack(rc[2:3]) == [ACKED]
    assert q.lease(now=T0 + 10).deliveries == []
    got = q.lease(now=T0 + 5000)
    assert offsets(got) == [(0, 0), (0, 1), (0, 3)]


def test_ordered_mode_holds_only_the_leased_partition(store: Store) -> None:
    q = make(store, partitions=2)
    q.group(mode=pb.DELIVERY_MODE_ORDERED)
    q.publish(*[msg(b"p%d-%d" % (p, i), partition=p) for p in (0, 1) for i in range(3)])
    first = q.lease(consumer="c1", n=2)
    (p,) = {x.partition for x in first.deliveries}
    second = q.lease(consumer="c2", n=10)
    assert offsets(second) == [(1 - p, 0), (1 - p, 1), (1 - p, 2)]
    assert q.lease(consumer="c3", n=10).deliveries == []


def test_ordered_mode_expired_batch_comes_back_in_offset_order(store: Store) -> None:
    q = make(store)
    q.group(mode=pb.DELIVERY_MODE_ORDERED)
    q.publish(*[msg(b"m%d" % i) for i in range(4)])
    q.lease(n=3, now=T0)
    q.expire(T0 + LEASE_MS)
    got = q.lease(consumer="c2", n=10, now=T0 + LEASE_MS)
    assert offsets(got) == [(0, 0), (0, 1), (0, 2), (0, 3)]
    assert [x.attempt for x in got.deliveries] == [2, 2, 2, 1]


def test_ordered_mode_waits_for_a_delayed_message_in_its_partition(store: Store) -> None:
    q = make(store)
    q.group(mode=pb.DELIVERY_MODE_ORDERED)
    q.publish(msg(b"a"), msg(b"b", delay_ms=1000), msg(b"c"), now=T0)
    first = q.lease(now=T0)
    assert values(first) == [b"a"]  # b is not due, and c may not overtake it
    assert q.ack(q.receipts(first), now=T0) == [ACKED]
    assert q.lease(now=T0 + 999).deliveries == []
    assert values(q.lease(now=T0 + 1000)) == [b"b", b"c"]


def test_a_partition_added_after_the_group_was_created_is_read_from_its_start(
    store: Store,
) -> None:
    q = make(store, partitions=1)
    q.group(start=pb.StartPosition(latest=True))
    cfg = pb.QueueConfig()
    cfg.CopyFrom(q.q.config)
    cfg.partitions = 2
    q.q = q.d.one(  # type: ignore[assignment]
        cpb.UpdateQueueCmd(
            config=cfg,
            now_ms=T0,
            queue_id=q.q.queue_id,
            expected_updated_at_ms=q.q.updated_at_ms,
        )
    )
    assert isinstance(q.q, pb.Queue)
    q.publish(msg(b"new-0", partition=0), msg(b"new-1", partition=1))
    assert sorted(values(q.lease())) == [b"new-0", b"new-1"]
    views = [q.view("g", p) for p in (0, 1)]
    restarted = QueueStateMachine(store)
    g = restarted.delivery.get(q.q.queue_id, "q", "g")
    assert [restarted.delivery.view(g, p) for p in (0, 1)] == views


def test_filtered_messages_are_skipped_and_counted(store: Store) -> None:
    q = make(store)
    q.group("by-header", filter=pb.GroupFilter(header_equals={"type": b"order"}))
    q.group("by-key", filter=pb.GroupFilter(key_prefix=b"eu-"))
    q.group("both", filter=pb.GroupFilter(header_equals={"type": b"order"}, key_prefix=b"eu-"))
    q.publish(
        msg(b"0", key=b"eu-1", headers={"type": b"order"}),
        msg(b"1", key=b"us-1", headers={"type": b"order"}),
        msg(b"2", key=b"eu-2", headers={"type": b"refund"}),
        msg(b"3"),
        msg(b"4", key=b"eu-3"),
    )
    for name, want in (
        ("by-header", [b"0", b"1"]),
        ("by-key", [b"0", b"2", b"4"]),
        ("both", [b"0"]),
    ):
        assert values(q.lease(name)) == want, name
        v = q.view(name)
        assert (v.filtered, v.next, len(v.leased)) == (5 - len(want), 5, len(want)), name


# -- transactions ----------------------------------------------------------------------------


def test_transaction_with_one_stale_receipt_applies_nothing(store: Store) -> None:
    q = make(store)
    out = Q(q.d, q.d.create("out"))
    q.group()
    q.publish(msg(b"a"), msg(b"b"))
    stale = q.receipts(q.lease(consumer="c1", n=1, now=T0))
    q.expire(T0 + LEASE_MS)
    fresh = q.receipts(q.lease(consumer="c2", n=2, now=T0 + LEASE_MS))
    good = [r for r in fresh if r.offset == 1]

    def transact(receipts: list[pb.Receipt]) -> object:
        ack = cpb.AckCmd(queue="q", queue_id=q.q.queue_id, group="g", receipts=receipts)
        return q.d.one(cpb.TransactCmd(acks=[ack], appends=[append_cmd(out.q, [msg(b"result")])]))

    before = q.view()
    err = refused(transact(good + stale), "LEASE_NOT_HELD")
    assert err.metadata == {"field": "acks[0].receipts[1]", "status": "RECEIPT_STATUS_STALE"}
    assert out.log() == []
    assert q.view() == before
    res = transact(fresh)
    assert isinstance(res, TransactResult)
    assert res.acks[0].statuses == [ACKED, ACKED] and res.appends[0].offsets == [0]
    assert [r.value for r in out.log()] == [b"result"]
    assert q.view().acked == 2
    refused(transact(good), "LEASE_NOT_HELD")  # already acked: not held any more
    assert len(out.log()) == 1


# -- retention and purge ---------------------------------------------------------------------


def test_retention_moves_a_lagging_group_ahead_and_counts_what_it_skipped(store: Store) -> None:
    q = make(store, retention=pb.Retention(max_messages=3))
    q.group()
    q.publish(*[msg(b"%d" % i) for i in range(10)])
    held = q.receipts(q.lease(n=1))  # offset 0 is with a consumer when retention runs
    q.retention()
    v = q.view()
    assert (v.skipped, v.committed, v.next, list(v.leased)) == (6, 0, 7, [0])
    assert q.ack(held) == [ACKED]  # the consumer had it: its ack still counts
    v = q.view()
    assert (v.acked, v.skipped, v.committed) == (1, 6, 7)
    assert values(q.lease()) == [b"7", b"8", b"9"]


def test_retention_drops_a_retry_that_is_no_longer_stored(store: Store) -> None:
    q = make(store, retention=pb.Retention(max_messages=2))
    q.group()
    q.publish(*[msg(b"%d" % i) for i in range(3)])
    rc = q.receipts(q.lease(n=1))
    q.nack(rc, now=T0, retry_at=T0 + 100)
    q.publish(msg(b"3"), msg(b"4"))
    q.retention()
    v = q.view()
    assert (v.skipped, v.scheduled, v.committed, v.next) == (3, {}, 3, 3)
    assert values(q.lease(now=T0 + 100)) == [b"3", b"4"]


def test_a_lease_that_retention_removed_does_not_hold_an_ordered_partition_once_it_ends(
    store: Store,
) -> None:
    q = make(store, retention=pb.Retention(max_messages=2))
    q.group(mode=pb.DELIVERY_MODE_ORDERED)
    q.publish(*[msg(b"%d" % i) for i in range(2)])
    rc = q.receipts(q.lease(n=1, now=T0))
    q.publish(*[msg(b"%d" % i) for i in range(2, 5)])
    q.retention()  # offsets 0..2 go; 0 is leased and stays with its consumer
    assert q.view().leased.keys() == {0}
    assert q.nack(rc, now=T0 + 1, retry_at=T0 + 600_000) == [NACKED]
    v = q.view()
    assert (v.scheduled, v.skipped, v.committed) == ({}, 3, 3)
    assert q.sm.view.delivery.get(q.q.queue_id, "q", "g").maybe_ready({0: 5}, T0 + 2)
    assert values(q.lease(now=T0 + 2)) == [b"3", b"4"]


def test_an_expired_lease_that_retention_removed_is_skipped(store: Store) -> None:
    q = make(store, retention=pb.Retention(max_messages=1))
    q.group()
    q.publish(msg(b"0"), msg(b"1"))
    rc = q.receipts(q.lease(n=1, now=T0))
    q.retention()
    assert q.expire(T0 + LEASE_MS).expired_leases == 1
    v = q.view()
    assert (v.scheduled, v.skipped, v.committed, v.next) == ({}, 1, 1, 1)
    assert q.ack(rc) == [ALREADY_ACKED]


def test_retain_until_consumed_keeps_what_a_group_has_not_finished(store: Store) -> None:
    q = make(store, retention=pb.Retention(max_messages=3), retain_until_consumed=True)
    q.group()
    q.publish(*[msg(b"%d" % i) for i in range(10)])
    rc = q.receipts(q.lease(n=6))
    assert q.ack([r for r in rc if r.offset != 4]) == [ACKED] * 5
    q.retention()
    assert q.d.watermarks(q.q) == (4, 10)  # offset 4 is leased: it and what follows stay
    assert q.view().skipped == 0
    assert q.ack([r for r in rc if r.offset == 4]) == [ACKED]
    q.retention()
    assert q.d.watermarks(q.q) == (6, 10)  # 6.. not consumed yet
    assert values(q.lease()) == [b"6", b"7", b"8", b"9"]
    assert q.view().skipped == 0


# Before each purge: offset 0 leased, 1 a due retry, 2 a retry due later, 3 ready (never
# delivered, walked past by no lease), 4 delayed (never delivered), 5 ready.
PURGE_CASES = [
    (pb.PURGE_SCOPE_READY, False, {0, 2, 4}),
    (pb.PURGE_SCOPE_SCHEDULED, False, {0, 1, 3, 5}),
    (pb.PURGE_SCOPE_ALL, False, {0}),
    (pb.PURGE_SCOPE_UNSPECIFIED, False, {0}),
    (pb.PURGE_SCOPE_READY, True, {2, 4}),
    (pb.PURGE_SCOPE_SCHEDULED, True, {1, 3, 5}),
    (pb.PURGE_SCOPE_ALL, True, set()),
]


@pytest.mark.parametrize(("scope", "destructive", "left"), PURGE_CASES)
def test_purge_drops_exactly_its_scope_and_leased_messages_only_if_destructive(
    store: Store, scope: int, destructive: bool, left: set[int]
) -> None:
    q = make(store, max_attempts=10)
    q.group()
    q.publish(msg(b"0"), msg(b"1"), msg(b"2"), now=T0)
    rc = q.receipts(q.lease(n=3, now=T0))
    now = T0 + 100
    q.nack(rc[1:2], now=now, retry_at=now)  # due
    q.nack(rc[2:3], now=now, retry_at=now + 60_000)  # not due
    q.publish(msg(b"3"), msg(b"4", delay_ms=30_000), msg(b"5"), now=now)
    res = q.purge(now=now, scope=scope, destructive=destructive)
    assert res.skipped_deliveries == 6 - len(left)
    v = q.view()
    assert v.purged == 6 - len(left)
    assert set(v.leased) | set(v.scheduled) | set(range(v.next, 6)) == left
    # What is left is still delivered, each at its time; nothing purged ever comes back.
    later = q.lease(n=10, now=now + 60_000, consumer="c2")
    want = left - {0}
    assert {x.record.offset for x in later.deliveries} == want
    if 0 in left:
        assert q.ack(rc[:1]) == [ACKED]
    assert q.d.watermarks(q.q)[0] <= min(left, default=6)


def test_purge_of_one_scope_counts_records_not_for_the_group_as_filtered(store: Store) -> None:
    q = make(store)
    q.group(filter=pb.GroupFilter(header_equals={"t": b"x"}))
    q.publish(
        msg(b"0", headers={"t": b"x"}),
        msg(b"1", headers={"t": b"y"}),
        msg(b"2", headers={"t": b"x"}, delay_ms=5000),
    )
    res = q.purge(scope=pb.PURGE_SCOPE_READY)
    assert res.skipped_deliveries == 1
    v = q.view()
    assert (v.purged, v.filtered, v.next, v.scheduled) == (1, 1, 3, {2: (T0 + 5000, 0)})
    assert values(q.lease(now=T0 + 5000)) == [b"2"]


def test_purge_removes_from_the_log_only_what_no_group_needs(store: Store) -> None:
    q = make(store)
    q.group("slow")
    q.group("fast")
    q.publish(msg(b"0"), msg(b"1"), msg(b"2"))
    q.lease("slow", n=1)  # slow holds offset 0
    res = q.purge()  # not destructive: slow keeps its lease
    assert res.purged_records == 0 and res.skipped_deliveries == 2 + 3
    res = q.purge(destructive=True)
    assert res.purged_records == 3 and q.d.watermarks(q.q) == (3, 3)


# -- offsets and groups ----------------------------------------------------------------------


def test_commit_offsets_on_a_work_queue_is_refused(store: Store) -> None:
    q = make(store, type=pb.QUEUE_TYPE_WORK)
    q.group()
    q.publish(msg(b"a"))
    res = q.d.one(cpb.CommitOffsetsCmd(queue="q", queue_id=q.q.queue_id, group="g", offsets={0: 1}))
    refused(res, "NOT_A_STREAM_QUEUE")
    assert q.view().committed == 0


def test_commit_offsets_on_a_stream_queue_moves_the_group(store: Store) -> None:
    q = make(store, type=pb.QUEUE_TYPE_STREAM)
    q.group()
    q.publish(msg(b"a"), msg(b"b"))
    assert (
        q.d.one(cpb.CommitOffsetsCmd(queue="q", queue_id=q.q.queue_id, group="g", offsets={0: 1}))
        is None
    )
    assert values(q.lease()) == [b"b"]
    res = q.d.one(cpb.CommitOffsetsCmd(queue="q", queue_id=q.q.queue_id, group="g", offsets={0: 3}))
    refused(res, "OFFSET_OUT_OF_RANGE")


def test_delete_group_removes_every_row_of_it(store: Store) -> None:
    q = make(store, partitions=2)
    g = q.group("doomed")
    q.group("kept")
    q.publish(*[msg(b"%d" % i, partition=i % 2) for i in range(6)])
    rc = q.receipts(q.lease("doomed", n=3))
    q.nack(rc[:1], "doomed", retry_at=T0 + 10_000)
    q.lease("kept", n=2)
    assert q.d.one(cpb.DeleteGroupCmd(queue="q", queue_id=q.q.queue_id, group="doomed")) is None
    with store.read() as txn:
        assert txn.get(keys.group_key(q.q.queue_id, "doomed")) is None
        assert list(txn.scan(keys.slot_run_prefix(g.group_id))) == []
        kept = q.sm.delivery.get(q.q.queue_id, "q", "kept").group_id
        assert list(txn.scan(keys.slot_run_prefix(kept)))  # the other group's runs stay
        assert list(txn.scan(keys.GROUP_PARTITION + keys.U64.pack(g.group_id))) == []
        assert len(list(txn.scan(keys.GROUP))) == 1
    refused(q.lease_cmd("doomed"), "GROUP_NOT_FOUND")
    assert q.expire(T0 + LEASE_MS).expired_leases == 2  # only kept's leases are left
    sm2 = QueueStateMachine(store)
    assert [x.name for x in sm2.delivery.iter_groups()] == ["kept"]
    # The name can be used again: a new group from the start.
    q.group("doomed", now=T0 + 1)
    assert len(q.lease("doomed", now=T0 + LEASE_MS).deliveries) == 6


def test_unknown_group_is_refused_by_every_command(store: Store) -> None:
    q = make(store, type=pb.QUEUE_TYPE_STREAM)
    qid = q.q.queue_id
    rc = [pb.Receipt(partition=0, offset=0, lease_id=1, group_id=1)]
    for cmd in (
        cpb.LeaseCmd(queue="q", queue_id=qid, group="nope", consumer_id="c", max_messages=1),
        cpb.AckCmd(queue="q", queue_id=qid, group="nope", receipts=rc),
        cpb.NackCmd(queue="q", queue_id=qid, group="nope", receipts=rc),
        cpb.ExtendLeaseCmd(queue="q", queue_id=qid, group="nope", receipts=rc, lease_ms=100),
        cpb.DeleteGroupCmd(queue="q", queue_id=qid, group="nope"),
        cpb.ResetOffsetsCmd(queue="q", queue_id=qid, group="nope"),
        cpb.CommitOffsetsCmd(queue="q", queue_id=qid, group="nope", offsets={0: 0}),
        cpb.TransactCmd(acks=[cpb.AckCmd(queue="q", queue_id=qid, group="nope", receipts=rc)]),
    ):
        err = refused(q.d.one(cmd), "GROUP_NOT_FOUND")
        assert err.metadata == {"queue": "q", "group": "nope"}, type(cmd).__name__


def test_creating_an_existing_group_is_refused(store: Store) -> None:
    q = make(store)
    q.group()
    refused(q.group_cmd("g"), "GROUP_EXISTS")


# -- restart and replay ----------------------------------------------------------------------


def _all_views(sm: QueueStateMachine) -> dict[tuple[str, str, int], PartitionView]:
    out = {}
    for entry in sm.catalog.values():
        for g in sm.delivery.of_queue(entry.queue_id):
            for p in range(entry.policy.partitions):
                out[(entry.name, g.name, p)] = sm.delivery.view(g, p)
    return out


def _busy_history(q: Q) -> None:
    """Leases, acks, nacks, retries, expiries, dead letters, delays, filters, retention."""
    q.group("s")
    q.group("o", mode=pb.DELIVERY_MODE_ORDERED)
    q.group("f", filter=pb.GroupFilter(key_prefix=b"a"))
    for i in range(12):
        key = b"a%d" % i if i % 3 else b"b%d" % i
        delay = 3000 if i % 5 == 0 else 0
        q.publish(msg(b"v%d" % i, partition=i % 3, key=key, delay_ms=delay), now=T0 + i)
    s = q.receipts(q.lease("s", "c1", n=6, now=T0 + 100))
    q.ack(s[:2], "s", now=T0 + 100)
    q.nack(s[2:3], "s", now=T0 + 100)
    q.nack(s[3:4], "s", now=T0 + 100, dead=True, reason="no")
    o = q.receipts(q.lease("o", "c2", n=4, now=T0 + 100))
    q.ack(o[:1], "o", now=T0 + 100)
    q.extend(o[1:2], "o", now=T0 + 100, lease_ms=10_000)
    q.lease("f", "c3", n=3, now=T0 + 100)
    q.expire(T0 + 100 + LEASE_MS)
    q.lease("s", "c2", n=3, now=T0 + 2000)
    q.expire(T0 + 3100)
    q.lease("f", "c1", n=10, now=T0 + 3100)
    q.replay(now=T0 + 3200)
    q.publish(msg(b"late", partition=1), now=T0 + 3300)
    q.retention(now=T0 + 3300)


class RecordingDriver(Driver):
    """A Driver that keeps every entry it applied, to replay them."""

    def __init__(self, store: Store) -> None:
        super().__init__(store)
        self.entries: list[E] = []

    def run(self, *cmds: object) -> list[object]:
        first = self.index + 1
        results = super().run(*cmds)
        self.entries += [E(first + i, commands.encode(c)) for i, c in enumerate(cmds)]
        return results


BUSY_QUEUE = {"partitions": 3, "max_attempts": 2, "retention": pb.Retention(max_messages=3)}


def test_a_restarted_replica_has_the_same_delivery_state(tmp_path: Path) -> None:
    path = str(tmp_path / "db")
    store = LmdbStore(path)
    d = RecordingDriver(store)
    q = Q(d, d.create(**BUSY_QUEUE))  # type: ignore[arg-type]
    _busy_history(q)
    views = _all_views(q.sm)
    applied = q.sm.last_applied_index()
    assert any(v.leased for v in views.values()) and any(v.scheduled for v in views.values())
    assert any(v.dead for v in views.values()) and any(v.skipped for v in views.values())
    store.close()

    store = LmdbStore(path)
    try:
        d2 = Driver(store)
        assert d2.sm.last_applied_index() == applied
        assert _all_views(d2.sm) == views
        # The replication layer may hand over entries that were already applied (after a crash
        # before it learnt the applied index): they change nothing.
        assert d2.sm.apply_batch(d.entries) == [None] * len(d.entries)
        assert _all_views(d2.sm) == views
        assert d2.sm.last_applied_index() == applied
        # ... and the replica goes on exactly like one that never restarted.
        twin = make(MemoryStore(), **BUSY_QUEUE)  # type: ignore[arg-type]
        _busy_history(twin)
        assert _all_views(twin.sm) == views
        restarted = Q(d2, d2.sm.catalog["q"].queue)
        results = []
        for qq in (restarted, twin):
            qq.expire(T0 + 20_000)
            results.append([qq.lease(g, "c9", n=20, now=T0 + 20_000) for g in ("s", "o", "f")])
        assert results[0] == results[1]
        assert _all_views(d2.sm) == _all_views(twin.sm)
    finally:
        store.close()


def test_replayed_delivery_entries_change_nothing(store: Store) -> None:
    d = RecordingDriver(store)
    q = Q(d, d.create())
    q.group()
    q.publish(msg(b"a"), msg(b"b"))
    rc = q.receipts(q.lease(n=1))
    q.ack(rc)
    q.nack(q.receipts(q.lease(n=1)), dead=True)
    before = (q.view(), q.dlq(), q.d.records(q.q))
    assert q.sm.apply_batch(d.entries) == [None] * len(d.entries)
    assert QueueStateMachine(store).apply_batch(d.entries[-3:]) == [None] * 3
    assert (q.view(), q.dlq(), q.d.records(q.q)) == before


# -- a DLQ holds only dead letters, and each source sees only its own ------------------------


def _dead_letter_one(q: Q, value: bytes, now: int = T0) -> None:
    """Publish ``value`` to ``q`` and dead-letter it through group "g"."""
    q.publish(msg(value), now=now)
    got = q.lease(now=now)
    assert values(got) == [value]
    assert q.nack(q.receipts(got), now=now, dead=True) == [DEAD_LETTERED]


def _sharing(store: Store) -> tuple[Q, Q]:
    d = Driver(store)
    a = Q(d, d.create("a", type=pb.QUEUE_TYPE_WORK, dead_letter_queue="shared"))
    b = Q(d, d.create("b", type=pb.QUEUE_TYPE_WORK, dead_letter_queue="shared"))
    a.group()
    b.group()
    return a, b


def _listed(q: Q) -> list[bytes]:
    items, _token = QueueReader(q.sm).dead_letters(q.sm.catalog[q.name], "", 0, 0, "", 100)
    return [dl.record.value for dl in items]


def _update(d: Driver, name: str, **changes: object) -> object:
    entry = d.sm.catalog[name]
    config = pb.QueueConfig()
    config.CopyFrom(entry.queue.config)
    for k, v in changes.items():
        setattr(config, k, v)
    return d.one(
        cpb.UpdateQueueCmd(
            config=normalize_new(config),
            now_ms=T0 + 1,
            queue_id=entry.queue_id,
            expected_updated_at_ms=entry.queue.updated_at_ms,
        )
    )


def test_naming_a_queue_that_holds_messages_as_dlq_is_refused(store: Store) -> None:
    d = Driver(store)
    orders = d.create("orders", type=pb.QUEUE_TYPE_WORK, dead_letter_disabled=True)
    d.append(orders, [b"o1", b"o2", b"o3"])
    cfg = normalize_new(
        pb.QueueConfig(name="jobs", type=pb.QUEUE_TYPE_WORK, dead_letter_queue="orders")
    )
    err = refused(d.one(cpb.CreateQueueCmd(config=cfg, now_ms=T0)), "DEAD_LETTER_QUEUE_CONFLICT")
    assert err.violations[0].field == "config.dead_letter_queue"
    assert err.metadata["field"] == "config.dead_letter_queue"
    assert "holds messages of its own" in err.message
    assert set(d.sm.catalog) == {"orders"}
    assert not d.sm.catalog["orders"].queue.dead_letter_of
    # Nor through an update of an existing queue.
    d.create("jobs", type=pb.QUEUE_TYPE_WORK)
    refused(_update(d, "jobs", dead_letter_queue="orders"), "DEAD_LETTER_QUEUE_CONFLICT")
    assert d.sm.catalog["jobs"].policy.dead_letter_queue == "jobs.dlq"


def test_naming_a_queue_with_a_dlq_of_its_own_as_dlq_is_refused(store: Store) -> None:
    d = Driver(store)
    d.create("source", type=pb.QUEUE_TYPE_WORK)  # its DLQ: source.dlq
    cfg = normalize_new(
        pb.QueueConfig(name="other", type=pb.QUEUE_TYPE_WORK, dead_letter_queue="source")
    )
    err = refused(d.one(cpb.CreateQueueCmd(config=cfg, now_ms=T0)), "DEAD_LETTER_QUEUE_CONFLICT")
    assert "has a dead-letter queue of its own" in err.message
    assert "other" not in d.sm.catalog


def test_a_dead_letter_queue_never_gets_one_of_its_own(store: Store) -> None:
    q = make(store, type=pb.QUEUE_TYPE_WORK)
    q.group()
    _dead_letter_one(q, b"x")
    dlq = q.sm.catalog["q.dlq"]
    assert dlq.queue.dead_letter_of == "q" and dlq.policy.dead_letter_queue is None
    # An update that would give it one (the default "<name>.dlq" included) is refused.
    err = refused(_update(q.d, "q.dlq", dead_letter_disabled=False), "DEAD_LETTER_QUEUE_CONFLICT")
    assert "dead_letter_disabled" in err.message
    assert q.sm.catalog["q.dlq"].policy.dead_letter_queue is None
    # A name some queue reserved as its DLQ is created as a DLQ, never with a DLQ.
    d = q.d
    d.create("r", type=pb.QUEUE_TYPE_WORK, dead_letter_queue="r-dead")
    cfg = normalize_new(pb.QueueConfig(name="r-dead", type=pb.QUEUE_TYPE_WORK))
    refused(d.one(cpb.CreateQueueCmd(config=cfg, now_ms=T0)), "DEAD_LETTER_QUEUE_CONFLICT")
    made = d.create("r-dead", type=pb.QUEUE_TYPE_WORK, dead_letter_disabled=True)
    assert made.dead_letter_of == "r"


def test_an_empty_queue_without_a_dlq_becomes_one_when_named(store: Store) -> None:
    d = Driver(store)
    d.create("parking", type=pb.QUEUE_TYPE_WORK, dead_letter_disabled=True)
    a = Q(d, d.create("a", type=pb.QUEUE_TYPE_WORK, dead_letter_queue="parking"))
    assert d.sm.catalog["parking"].queue.dead_letter_of == "a"
    # A second source may share it (it is a DLQ now).
    d.create("b", type=pb.QUEUE_TYPE_WORK, dead_letter_queue="parking")
    a.group()
    _dead_letter_one(a, b"late")
    assert a.dlq_depth() == 1
    # Reload from the store: the mark is durable.
    d.sm = QueueStateMachine(store)
    assert d.sm.catalog["parking"].queue.dead_letter_of == "a"


def test_queues_sharing_a_dlq_see_only_their_own_dead_letters(store: Store) -> None:
    a, b = _sharing(store)
    _dead_letter_one(a, b"a1")
    _dead_letter_one(b, b"b1")
    _dead_letter_one(a, b"a2")
    assert (a.dlq_depth(), b.dlq_depth()) == (2, 1)
    assert (_listed(a), _listed(b)) == ([b"a1", b"a2"], [b"b1"])
    # A replay of A's letters by id ignores B's letter even when its id is given.
    b_id = 1  # offsets in "shared": a1=0, b1=1, a2=2
    assert a.replay(now=T0 + 1, ids=[b_id]) == 0
    assert a.replay(now=T0 + 1) == 2
    assert values(a.lease(now=T0 + 1)) == [b"a1", b"a2"]
    assert (a.dlq_depth(), b.dlq_depth()) == (0, 1)
    assert _listed(b) == [b"b1"]
    # B's letter goes back to B, never to A.
    assert b.replay(now=T0 + 2) == 1
    assert values(b.lease(now=T0 + 2)) == [b"b1"]
    assert a.lease(now=T0 + 2).deliveries == []


def test_purging_one_sources_dead_letters_keeps_the_others_and_direct_messages(
    store: Store,
) -> None:
    a, b = _sharing(store)
    _dead_letter_one(a, b"a1")
    shared = a.sm.catalog["shared"].queue
    a.d.append(shared, [b"direct"])  # published to the DLQ itself: not anyone's dead letter
    _dead_letter_one(b, b"b1")
    _dead_letter_one(a, b"a2")
    purge = cpb.PurgeDeadLettersCmd(queue="a", queue_id=a.q.queue_id, all=True)
    assert a.d.one(purge) == 2
    assert (a.dlq_depth(), b.dlq_depth()) == (0, 1)
    # a1 was the oldest: the log may drop it, but never the direct message or b1.
    assert [r.value for r in a.log(0, "shared")] == [b"direct", b"b1", b"a2"]
    assert _listed(b) == [b"b1"]
    # B purging by ids that are not its letters deletes nothing.
    by_ids = cpb.PurgeDeadLettersCmd(queue="b", queue_id=b.q.queue_id, ids=[1, 3])
    assert b.d.one(by_ids) == 0
    assert b.dlq_depth() == 1
    b_all = cpb.PurgeDeadLettersCmd(queue="b", queue_id=b.q.queue_id, all=True)
    assert b.d.one(b_all) == 1
    assert (a.dlq_depth(), b.dlq_depth()) == (0, 0)
    # Gone letters stay in the log behind the direct message (nothing truncates past it).
    assert [r.value for r in a.log(0, "shared")] == [b"direct", b"b1", b"a2"]


def test_dead_letters_written_before_the_index_are_scoped_by_their_header(
    store: Store,
) -> None:
    """State written by an older broker (no origin index) stays readable and scoped."""
    a, b = _sharing(store)
    _dead_letter_one(a, b"a1")
    _dead_letter_one(b, b"b1")
    with store.write() as txn:
        old_rows = [
            k
            for prefix in (keys.DEAD_ORIGIN, keys.DEAD_INDEXED, keys.DEAD_ORIGIN_COUNT)
            for k, _ in txn.scan(prefix)
        ]
        assert len(old_rows) == 5  # two letters, the DLQ's marker, two counters
        for k in old_rows:
            txn.delete(k)
    a.d.sm = QueueStateMachine(store)
    assert (a.dlq_depth(), b.dlq_depth()) == (1, 1)
    assert (_listed(a), _listed(b)) == ([b"a1"], [b"b1"])
    _dead_letter_one(a, b"a2", now=T0 + 1)  # the first indexed letter of that DLQ
    assert (_listed(a), _listed(b)) == ([b"a1", b"a2"], [b"b1"])
    purge = cpb.PurgeDeadLettersCmd(queue="a", queue_id=a.q.queue_id, all=True)
    assert a.d.one(purge) == 2
    assert (_listed(a), _listed(b)) == ([], [b"b1"])
    assert b.replay(now=T0 + 2) == 1
    assert values(b.lease(now=T0 + 2)) == [b"b1"]


def test_a_pairing_made_before_the_rules_never_touches_the_named_queues_messages(
    store: Store,
) -> None:
    """Older brokers let "jobs" name "orders", an ordinary queue with messages, as its DLQ. On
    such state, jobs' dead-letter operations see and delete only jobs' own letters."""
    d = Driver(store)
    orders = d.create("orders", type=pb.QUEUE_TYPE_WORK, dead_letter_disabled=True)
    d.append(orders, [b"o1", b"o2", b"o3"])
    jobs = Q(d, d.create("jobs", type=pb.QUEUE_TYPE_WORK))
    with store.write() as txn:  # what an older broker stored for CreateQueue(jobs -> orders)
        legacy = pb.Queue()
        legacy.CopyFrom(jobs.q)
        legacy.config.dead_letter_queue = "orders"
        txn.put(keys.queue_key("jobs"), legacy.SerializeToString())
    d.sm = QueueStateMachine(store)
    jobs.q = d.sm.catalog["jobs"].queue
    assert jobs.dlq_depth() == 0 and _listed(jobs) == []
    purge = cpb.PurgeDeadLettersCmd(queue="jobs", queue_id=jobs.q.queue_id, all=True)
    assert d.one(purge) == 0
    assert d.records(orders) == [b"o1", b"o2", b"o3"]
    # A letter of jobs written there now is jobs' (and only it) to list and purge.
    jobs.group()
    _dead_letter_one(jobs, b"j1")
    assert jobs.dlq_depth() == 1 and _listed(jobs) == [b"j1"]
    assert d.one(purge) == 1
    assert d.records(orders) == [b"o1", b"o2", b"o3", b"j1"]  # j1 gone, kept behind o1..o3
    assert jobs.dlq_depth() == 0
    # An update of jobs that keeps the old pairing is not refused (only a change is checked).
    updated = _update(d, "jobs", max_attempts=5)
    assert isinstance(updated, pb.Queue), updated
