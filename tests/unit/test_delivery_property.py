"""Seeded random runs of the delivery commands, checked after every step against a model of what
must have happened (conservation: every published message is, for every group, in exactly one
state), plus a twin-replica run (memory and LMDB stores must agree command by command).

A failure names its seed: rerun one with ``Run(seed, MemoryStore()).go(steps)``.
"""

from __future__ import annotations

import random
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import pytest

from fluxmq._pb.internal import commands_pb2 as cpb
from fluxmq._pb.v1 import queue_pb2 as pb
from fluxmq.core import keys
from fluxmq.core.commands.letters import dead_letter_depth
from fluxmq.core.commands.results import (
    AppendResult,
    ExpireResult,
    LeaseResult,
    PurgeResult,
    RetentionResult,
    SettleResult,
)
from fluxmq.core.delivery import Delivery, PartitionView, Push
from fluxmq.core.errors import FluxError
from fluxmq.core.queue_config import normalize_new
from fluxmq.core.reader import QueueReader
from fluxmq.core.state_machine import QueueStateMachine
from fluxmq.core.views import DeliveryView
from storage import LmdbStore, MemoryStore, Store
from storage.api import Record
from tests.unit.test_state_machine import T0, Driver, append_cmd, receipts_of

ACKED = pb.RECEIPT_STATUS_ACKED
ALREADY_ACKED = pb.RECEIPT_STATUS_ALREADY_ACKED
STALE = pb.RECEIPT_STATUS_STALE
NACKED = pb.RECEIPT_STATUS_NACKED
DEAD_LETTERED = pb.RECEIPT_STATUS_DEAD_LETTERED
EXTENDED = pb.RECEIPT_STATUS_EXTENDED

# Where one message is, for one group.
PENDING = "pending"  # ready or scheduled (never delivered, a retry, an expired lease, delayed)
LEASED = "leased"
ACKED_ = "acked"
DEAD = "dead"  # in the DLQ (a replay is a new message)
FILTERED = "filtered"  # not for this group (its filter, or a replay aimed at another group)
GONE = "gone"  # removed by retention before the group was done with it
PURGED = "purged"
DONE = (ACKED_, DEAD, PURGED)

CONSUMERS = ("c1", "c2", "c3")  # lease with Lease
STREAM_CONSUMERS = ("p1", "p2")  # checked out, as Consume streams are
BACKOFF_BASE_MS, BACKOFF_MAX_MS = 50, 400
SCOPES = (
    pb.PURGE_SCOPE_UNSPECIFIED,
    pb.PURGE_SCOPE_READY,
    pb.PURGE_SCOPE_SCHEDULED,
    pb.PURGE_SCOPE_ALL,
)


@dataclass(frozen=True)
class GroupSpec:
    name: str
    mode: int
    filter: pb.GroupFilter


GROUPS = (
    GroupSpec("s1", pb.DELIVERY_MODE_SHARED, pb.GroupFilter()),
    GroupSpec("s2", pb.DELIVERY_MODE_SHARED, pb.GroupFilter(header_equals={"t": b"a"})),
    GroupSpec("o1", pb.DELIVERY_MODE_ORDERED, pb.GroupFilter()),
    GroupSpec("o2", pb.DELIVERY_MODE_ORDERED, pb.GroupFilter(key_prefix=b"k1")),
)


@dataclass
class Msg:
    """A record of the queue, as published (or replayed)."""

    value: bytes
    key: bytes | None
    headers: dict[str, bytes]
    ready_at: int
    ts: int


@dataclass
class Where:
    """One message for one group."""

    state: str
    attempts: int = 0
    due: int = 0  # PENDING: when it may be leased
    member: str = ""
    lease_id: int = 0
    deadline: int = 0


@dataclass(frozen=True)
class DeadInfo:
    group: str
    partition: int
    offset: int
    attempts: int
    reason: str


def for_group(spec: GroupSpec, m: Msg) -> bool:
    """The model's own reading of the filter rules (GroupFilter, replays aimed at a group)."""
    aimed = m.headers.get("fluxmq-replay-group")
    if aimed is not None and aimed.decode() != spec.name:
        return False
    f = spec.filter
    if f.HasField("key_prefix") and (m.key is None or not m.key.startswith(f.key_prefix)):
        return False
    return all(m.headers.get(k) == v for k, v in f.header_equals.items())


def backoff_ms(attempt: int) -> int:
    return int(min(BACKOFF_MAX_MS, BACKOFF_BASE_MS << max(attempt - 1, 0)))


def comparable(result: object) -> object:
    if isinstance(result, FluxError):
        return ("FluxError", result.reason, result.message)
    return result


class Run:
    """One seeded run: a random queue, four groups, random commands, the model, the checks."""

    def __init__(self, seed: int, store: Store, twin: Store | None = None) -> None:
        self.seed = seed
        self.rng = rng = random.Random(seed)
        self.store = store
        self.d = Driver(store)
        self.twin = Driver(twin) if twin is not None else None
        # Consume streams: what the applies pushed to checked-out consumers, per replica.
        self.pushes: list[Push] = []
        self.twin_pushes: list[Push] = []
        self.listen()
        # (group, consumer) -> (session id, max_in_flight, lease_ms) of checkouts in force
        self.checkouts: dict[tuple[str, str], tuple[int, int, int]] = {}
        self.checked_in: tuple[str, str, int] | None = None  # by the last checkin
        self.now = T0
        self.step_no = 0
        self.parts = rng.choice([1, 2, 3])
        self.max_attempts = rng.choice([0, 2, 3])
        self.delay_ms = rng.choice([0, 0, 150])
        self.max_messages = rng.choice([0, 25, 60])
        self.until_consumed = bool(self.max_messages) and rng.random() < 0.4
        self.ttl_ms = rng.choice([0, 0, 0, 4000])
        cfg = pb.QueueConfig(
            name="q",
            type=pb.QUEUE_TYPE_WORK,
            partitions=self.parts,
            max_attempts=self.max_attempts,
            retry_backoff=pb.RetryBackoff(base=f"{BACKOFF_BASE_MS}ms", max=f"{BACKOFF_MAX_MS}ms"),
            retain_until_consumed=self.until_consumed,
        )
        if self.delay_ms:
            cfg.delivery_delay = f"{self.delay_ms}ms"
        if self.ttl_ms:
            cfg.message_ttl = f"{self.ttl_ms}ms"
        if self.max_messages:
            cfg.retention.max_messages = self.max_messages
        q = self.cmd(cpb.CreateQueueCmd(config=normalize_new(cfg), now_ms=T0))
        assert isinstance(q, pb.Queue)
        self.q = q
        self.group_ids: dict[str, int] = {}
        for spec in GROUPS:
            g = self.cmd(
                cpb.CreateGroupCmd(
                    queue="q",
                    queue_id=q.queue_id,
                    group=spec.name,
                    mode=spec.mode,  # type: ignore[arg-type]
                    filter=spec.filter,
                    now_ms=T0,
                )
            )
            assert isinstance(g, pb.Group)
            self.group_ids[spec.name] = g.group_id
        self.msgs: dict[tuple[int, int], Msg] = {}
        self.model: dict[str, dict[tuple[int, int], Where]] = {s.name: {} for s in GROUPS}
        self.high = [0] * self.parts
        self.low = [0] * self.parts
        self.history: dict[str, list[pb.Receipt]] = {s.name: [] for s in GROUPS}
        self.lease_ids: set[int] = set()
        self.expect_dead: list[DeadInfo] = []
        self.expect_replayed: dict[int, DeadInfo] = {}
        self.dlq_next = 0
        self.dlq_live: dict[int, DeadInfo] = {}
        self.counter = 0
        self.reached: Counter[str] = Counter()  # steps after which some message was in a state
        self.reasons: Counter[str] = Counter()  # dead letters by reason
        self.ops = [
            (self.publish, 20),
            (self.lease, 25),
            (self.ack, 14),
            (self.nack, 8),
            (self.extend, 4),
            (self.expire, 12),
            (self.replay, 3),
            (self.purge_dead_letters, 1),
            (self.retention, 5 if self.max_messages else 0),
            (self.purge, 1),
            (self.restart, 1),
            (self.checkout, 3),
            (self.checkin, 2),
        ]

    # -- plumbing -----------------------------------------------------------------------------

    def fail(self, what: str) -> str:
        return f"seed={self.seed} step={self.step_no} now={self.now - T0}: {what}"

    @property
    def sm(self) -> QueueStateMachine:
        return self.d.sm

    def listen(self) -> None:
        self.sm.commit_listener = lambda _logs, _groups, pushes: self.pushes.extend(pushes)
        if self.twin is not None:
            self.twin.sm.commit_listener = lambda _l, _g, pushes: self.twin_pushes.extend(pushes)

    def cmd(self, command: object) -> object:
        result = self.d.one(command)
        if self.twin is not None:
            other = self.twin.one(command)
            assert comparable(other) == comparable(result), self.fail(
                f"replicas disagree on {type(command).__name__}"
            )
            assert self.twin_pushes == self.pushes, self.fail(
                f"replicas assign differently on {type(command).__name__}"
            )
            self.twin_pushes.clear()
        return result

    def view(self, group: str, p: int) -> PartitionView:
        g = self.sm.delivery.get(self.q.queue_id, "q", group)
        return self.sm.delivery.view(g, p)

    def all_views(self, sm: QueueStateMachine) -> list[PartitionView]:
        out = []
        for spec in GROUPS:
            g = sm.delivery.get(self.q.queue_id, "q", spec.name)
            out += [sm.delivery.view(g, p) for p in range(self.parts)]
        return out

    def receipt(self, group: str, p: int, off: int, w: Where) -> pb.Receipt:
        return pb.Receipt(
            partition=p,
            offset=off,
            attempt=w.attempts,
            lease_deadline_ms=w.deadline,
            lease_id=w.lease_id,
            group_id=self.group_ids[group],
        )

    def pick_receipts(self, group: str) -> list[pb.Receipt]:
        rng = self.rng
        leased = [(k, w) for k, w in sorted(self.model[group].items()) if w.state == LEASED]
        chosen = rng.sample(leased, min(len(leased), rng.randint(1, 4)))
        out = [self.receipt(group, p, off, w) for (p, off), w in chosen]
        old = self.history[group][-200:]
        if old and (not out or rng.random() < 0.3):
            out.append(rng.choice(old))  # maybe stale, maybe done, maybe still held
        rng.shuffle(out)
        return out

    def held(self, group: str, r: pb.Receipt) -> tuple[Where, set[int] | None]:
        """-> (where the message is, the statuses allowed if the receipt does not hold it)."""
        w = self.model[group][(r.partition, r.offset)]
        if w.state == LEASED and w.lease_id == r.lease_id:
            return w, None
        if w.state in DONE:
            return w, {ALREADY_ACKED}
        if w.state in (PENDING, LEASED):
            return w, {STALE}
        assert w.state == GONE, self.fail(f"a receipt for a message in state {w.state}")
        return w, {ALREADY_ACKED}

    def to_dead(self, group: str, p: int, off: int, w: Where, reason: str) -> None:
        if off >= self.low[p]:
            w.state = DEAD
            self.expect_dead.append(DeadInfo(group, p, off, w.attempts, reason))
        else:
            w.state = GONE  # retention removed it while it was leased: nothing to dead-letter

    def to_pending(self, p: int, off: int, w: Where, due: int) -> None:
        if off >= self.low[p]:
            w.state, w.due = PENDING, due
        else:
            w.state = GONE  # removed by retention while it was leased: nothing to deliver again

    # -- operations ---------------------------------------------------------------------------

    def publish(self) -> None:
        rng = self.rng
        msgs = []
        for _ in range(rng.randint(1, 4)):
            self.counter += 1
            m = pb.PublishMessage(value=b"v%d" % self.counter)
            if rng.random() < 0.5:
                m.key = b"k%d" % rng.randrange(3)
            else:
                m.partition = rng.randrange(self.parts)
            if rng.random() < 0.5:
                m.headers["t"] = rng.choice([b"a", b"b"])
            if rng.random() < 0.15:
                m.delay_ms = rng.choice([100, 500, 2000])
            msgs.append(m)
        res = self.cmd(append_cmd(self.q, msgs, self.now))
        assert isinstance(res, AppendResult), self.fail(repr(res))

    def lease(self) -> None:
        rng = self.rng
        spec = rng.choice(GROUPS)
        group, model = spec.name, self.model[spec.name]
        member = rng.choice(CONSUMERS)
        n = rng.randint(1, 6)
        lease_ms = rng.choice([200, 500, 1500])
        pending: dict[int, list[int]] = {p: [] for p in range(self.parts)}
        held: set[int] = set()
        for (p, off), w in sorted(model.items()):
            if w.state == PENDING:
                pending[p].append(off)
            elif w.state == LEASED:
                held.add(p)
        with self.store.read() as txn:
            highs = {
                p: txn.log(keys.log_id(self.q.queue_id, p)).watermarks().high
                for p in range(self.parts)
            }
        g = self.sm.delivery.get(self.q.queue_id, "q", group)
        # What the leader asks before it proposes a lease: the published view's answer.
        could = self.sm.view.delivery.get(self.q.queue_id, "q", group).maybe_ready(highs, self.now)
        nexts = [self.sm.delivery.view(g, p).next for p in range(self.parts)]
        res = self.cmd(
            cpb.LeaseCmd(
                queue="q",
                queue_id=self.q.queue_id,
                group=group,
                consumer_id=member,
                max_messages=n,
                lease_ms=lease_ms,
                now_ms=self.now,
            )
        )
        assert isinstance(res, LeaseResult), self.fail(repr(res))
        got = res.deliveries
        self.take_dead_letters(lazy_ttl=True)
        assert len(got) <= n, self.fail("more than max_messages")
        assert could or not got, self.fail(f"maybe_ready said no, the lease gave {len(got)}")
        batches: dict[int, list[int]] = {}
        ready_order: dict[int, list[tuple[int, int]]] = {}
        delayed_head: set[int] = set()
        for x in got:
            key = (x.partition, x.record.offset)
            due = self.grant(group, x, member, lease_ms, "leased")
            ready_order.setdefault(x.partition, []).append((due, x.record.offset))
            if x.record.offset >= nexts[x.partition] and "fluxmq-deliver-at" in (
                self.msgs[key].headers
            ):
                delayed_head.add(x.partition)
            batches.setdefault(x.partition, []).append(x.record.offset)
        if spec.mode == pb.DELIVERY_MODE_ORDERED:
            for p, offs in batches.items():
                assert p not in held, self.fail(f"{group}/{p} leased again while held")
                # The smallest offsets not done (those found past their TTL died on the way).
                want = [o for o in pending[p] if model[(p, o)].state != DEAD][: len(offs)]
                assert offs == want, self.fail(f"{group}/{p} batch {offs}, expected {want}")
            if len(got) < n:
                for p in range(self.parts):
                    left = [o for o in pending[p] if model[(p, o)].state == PENDING]
                    if p not in held and left:
                        first = model[(p, left[0])]
                        assert first.due > self.now, self.fail(f"{group}/{p}: {left[0]} due")
        else:
            # Shared: by ready time (retries and expired leases included). Not checked when a
            # never-seen delayed record came up on the way: the walk over never-delivered
            # records is in offset order, and such a record may be ready later than the next.
            for p, order in ready_order.items():
                if p not in delayed_head:
                    assert order == sorted(order), self.fail(f"{group}/{p} order {order}")
            if len(got) < n:
                due = [k for k, w in model.items() if w.state == PENDING and w.due <= self.now]
                assert not due, self.fail(f"{group} got {len(got)} < {n} with {due[:5]} due")

    def grant(self, group: str, x: Delivery, member: str, lease_ms: int, how: str) -> int:
        """``x`` was leased (``how``: by a Lease, or pushed to a checkout) to ``member``: it
        must have been ready, and it is now held. -> when it was due."""
        key = (x.partition, x.record.offset)
        w = self.model[group][key]
        what = f"{group} {how} {key} to {member}"
        assert w.state == PENDING, self.fail(f"{what} while {w.state} ({w.member})")
        assert w.due <= self.now, self.fail(f"{what} before it was due at {w.due - T0}")
        assert not self.expired(*key), self.fail(f"{what} past its TTL")
        assert x.attempt == w.attempts + 1, self.fail(f"{what}: attempt {x.attempt}")
        assert x.deadline_ms == self.now + lease_ms, self.fail(what)
        assert x.record.value == self.msgs[key].value, self.fail(what)
        assert x.lease_id not in self.lease_ids, self.fail(f"lease id {x.lease_id} reused")
        self.lease_ids.add(x.lease_id)
        w.state, w.attempts, w.member = LEASED, x.attempt, member
        w.lease_id, w.deadline = x.lease_id, x.deadline_ms
        self.history[group].append(self.receipt(group, *key, w))
        return w.due

    def ack(self) -> None:
        group = self.rng.choice(GROUPS).name
        receipts = self.pick_receipts(group)
        if not receipts:
            return
        res = self.cmd(
            cpb.AckCmd(
                queue="q",
                queue_id=self.q.queue_id,
                group=group,
                receipts=receipts,
                now_ms=self.now,
            )
        )
        assert isinstance(res, SettleResult), self.fail(repr(res))
        for r, status in zip(receipts, res.statuses, strict=True):
            w, allowed = self.held(group, r)
            if allowed is None:
                assert status == ACKED, self.fail(f"ack of a held lease gave {status}")
                w.state = ACKED_
            else:
                assert status in allowed, self.fail(f"ack of {w} gave {status}, not {allowed}")

    def nack(self) -> None:
        rng = self.rng
        group = rng.choice(GROUPS).name
        receipts = self.pick_receipts(group)
        if not receipts:
            return
        dead = rng.random() < 0.15
        retry_at = rng.choice([0, 0, self.now, self.now + 300, self.now + 1500])
        reason = rng.choice(["", "boom"])
        res = self.cmd(
            cpb.NackCmd(
                queue="q",
                queue_id=self.q.queue_id,
                group=group,
                receipts=receipts,
                now_ms=self.now,
                retry_at_ms=retry_at,
                dead=dead,
                reason=reason,
            )
        )
        assert isinstance(res, SettleResult), self.fail(repr(res))
        for r, status in zip(receipts, res.statuses, strict=True):
            w, allowed = self.held(group, r)
            if allowed is not None:
                assert status in allowed, self.fail(f"nack of {w} gave {status}, not {allowed}")
                continue
            give_up = bool(self.max_attempts) and w.attempts >= self.max_attempts
            if dead or give_up:
                assert status == DEAD_LETTERED, self.fail(f"nack gave {status}")
                why = (reason or "nacked") if dead else "max_attempts"
                self.to_dead(group, r.partition, r.offset, w, why)
            else:
                assert status == NACKED, self.fail(f"nack gave {status}")
                self.to_pending(
                    r.partition, r.offset, w, retry_at or self.now + backoff_ms(w.attempts)
                )

    def extend(self) -> None:
        group = self.rng.choice(GROUPS).name
        receipts = self.pick_receipts(group)
        if not receipts:
            return
        lease_ms = self.rng.choice([100, 1000, 3000])
        res = self.cmd(
            cpb.ExtendLeaseCmd(
                queue="q",
                queue_id=self.q.queue_id,
                group=group,
                receipts=receipts,
                now_ms=self.now,
                lease_ms=lease_ms,
            )
        )
        assert isinstance(res, SettleResult), self.fail(repr(res))
        for r, status, deadline in zip(receipts, res.statuses, res.deadlines_ms, strict=True):
            w, allowed = self.held(group, r)
            if allowed is None:
                assert (status, deadline) == (EXTENDED, self.now + lease_ms), self.fail("extend")
                w.deadline = deadline
            else:
                assert status in allowed and deadline == 0, self.fail(f"extend gave {status}")

    def expire(self) -> None:
        nexts = {
            (spec.name, p): self.view(spec.name, p).next
            for spec in GROUPS
            for p in range(self.parts)
        }
        res = self.cmd(cpb.ExpireLeasesCmd(now_ms=self.now))
        assert isinstance(res, ExpireResult), self.fail(repr(res))
        expired = 0
        for spec in GROUPS:
            for (p, off), w in sorted(self.model[spec.name].items()):
                if w.state != LEASED or w.deadline > self.now:
                    continue
                expired += 1
                if self.max_attempts and w.attempts >= self.max_attempts:
                    self.to_dead(spec.name, p, off, w, "max_attempts")
                else:
                    self.to_pending(p, off, w, w.deadline)  # behind what was already waiting
        assert res.expired_leases == expired, self.fail(f"{res} but {expired} leases were due")
        # Never-delivered messages past their TTL, oldest first until one is not.
        ttl = 0
        for spec in GROUPS:
            model = self.model[spec.name]
            for p in range(self.parts):
                start = max(nexts[(spec.name, p)], self.low[p])
                for off in range(start, self.high[p]):
                    if not self.expired(p, off):
                        break
                    w = model[(p, off)]
                    if w.state == PENDING:
                        assert w.attempts == 0, self.fail(f"{spec.name} {(p, off)} {w}")
                        ttl += 1
                        w.state = DEAD
                        self.expect_dead.append(DeadInfo(spec.name, p, off, 0, "ttl"))
        assert (res.expired_ttl, res.dead_letters) == (ttl, len(self.expect_dead)), self.fail(
            f"{res}, expected {ttl} by TTL and {len(self.expect_dead)} dead letters"
        )

    def replay(self) -> None:
        rng = self.rng
        live = sorted(self.dlq_live)
        if rng.random() < 0.5:
            group = rng.choice(["", *(s.name for s in GROUPS)])
            ids: list[int] = []
            chosen = [o for o in live if not group or self.dlq_live[o].group == group]
        else:
            group = ""
            ids = rng.sample(live, min(len(live), rng.randint(1, 3)))
            chosen = sorted(ids)
            ids.append(self.dlq_next + 5)  # no such dead letter: ignored
        res = self.cmd(
            cpb.ReplayDeadLettersCmd(
                queue="q",
                queue_id=self.q.queue_id,
                ids=ids,
                all=not ids,
                group=group,
                now_ms=self.now,
            )
        )
        assert res == len(chosen), self.fail(f"replayed {res}, expected {len(chosen)}")
        for o in chosen:
            self.expect_replayed[o] = self.dlq_live.pop(o)

    def purge_dead_letters(self) -> None:
        live = sorted(self.dlq_live)
        ids = self.rng.sample(live, min(len(live), 2)) if self.rng.random() < 0.7 else []
        res = self.cmd(
            cpb.PurgeDeadLettersCmd(queue="q", queue_id=self.q.queue_id, ids=ids, all=not ids)
        )
        gone = ids or live
        assert res == len(gone), self.fail(f"purged {res} dead letters, expected {len(gone)}")
        for o in gone:
            del self.dlq_live[o]

    def retention(self) -> None:
        res = self.cmd(cpb.ApplyRetentionCmd(now_ms=self.now))
        assert isinstance(res, RetentionResult), self.fail(repr(res))

    def purge(self) -> None:
        scope = self.rng.choice(SCOPES)
        destructive = self.rng.random() < 0.3
        ready = scope != pb.PURGE_SCOPE_SCHEDULED
        scheduled = scope != pb.PURGE_SCOPE_READY
        expect = 0
        for spec in GROUPS:
            nexts = [self.view(spec.name, p).next for p in range(self.parts)]
            for (p, off), w in self.model[spec.name].items():
                if (
                    (w.state == LEASED and destructive)
                    or (w.state == PENDING and w.due <= self.now and ready)
                    or (w.state == PENDING and w.due > self.now and scheduled)
                ):
                    w.state = PURGED
                    expect += 1
                elif w.state == FILTERED and ready and scheduled and off >= nexts[p]:
                    expect += 1  # the whole undelivered tail goes at once, filtered or not
        res = self.cmd(
            cpb.PurgeCmd(
                name="q",
                queue_id=self.q.queue_id,
                now_ms=self.now,
                scope=scope,  # type: ignore[arg-type]
                destructive=destructive,
            )
        )
        assert isinstance(res, PurgeResult), self.fail(repr(res))
        assert res.skipped_deliveries == expect, self.fail(f"{res}, expected {expect} dropped")

    def restart(self) -> None:
        before = self.all_views(self.sm)
        self.d.sm = QueueStateMachine(self.store)
        self.listen()
        assert self.all_views(self.sm) == before, self.fail("a restart changed the state")
        checkouts = {
            (g.name, consumer_id): (co.session_id, co.max_in_flight, co.lease_ms)
            for g in self.sm.view.delivery.all_groups()
            for consumer_id, co in g.checkouts.items()
        }
        assert checkouts == self.checkouts, self.fail("a restart changed the checkouts")

    def checkout(self) -> None:
        rng = self.rng
        group = rng.choice(GROUPS).name
        consumer = rng.choice(STREAM_CONSUMERS)
        session = rng.randrange(1, 1 << 63)
        window, lease_ms = rng.randint(1, 5), rng.choice([200, 500, 1500])
        res = self.cmd(
            cpb.CheckoutCmd(
                queue="q",
                queue_id=self.q.queue_id,
                group=group,
                consumer_id=consumer,
                max_in_flight=window,
                lease_ms=lease_ms,
                session_id=session,
                now_ms=self.now,
            )
        )
        assert res == self.group_ids[group], self.fail(repr(res))
        self.checkouts[(group, consumer)] = (session, window, lease_ms)

    def checkin(self) -> None:
        rng = self.rng
        if not self.checkouts:
            return
        (group, consumer), (session, _, _) = rng.choice(sorted(self.checkouts.items()))
        stale = rng.random() < 0.25
        release = rng.random() < 0.5  # the stream's client went away
        cmd = cpb.CheckinCmd(queue="q", queue_id=self.q.queue_id, now_ms=self.now)
        cmd.consumers.add(
            group=group, consumer_id=consumer, session_id=session + stale, release=release
        )
        res = self.cmd(cmd)
        assert res == (0 if stale else 1), self.fail(f"checkin gave {res}")
        if not stale:
            del self.checkouts[(group, consumer)]
            self.checked_in = (group, consumer, session)
            if release:  # its leases end now: the next expiry pass makes them ready
                for w in self.model[group].values():
                    if w.state == LEASED and w.member == consumer and w.deadline > self.now:
                        w.deadline = self.now

    def take_pushes(self) -> None:
        """What the step's applies assigned to checked-out consumers: only ready messages,
        each to one consumer, never past a consumer's credit, to checkouts in force only."""
        pushes, self.pushes = self.pushes, []
        # An assignment walks past messages as a lease does (those past their TTL die).
        self.take_dead_letters(lazy_ttl={group for group, _ in self.checkouts})
        for push in pushes:
            spec = next(s for s in GROUPS if self.group_ids[s.name] == push.group_id)
            group, model = spec.name, self.model[spec.name]
            co = self.checkouts.get((group, push.consumer_id))
            if push.end:  # a checkin of this step: the stream ends after what it was sent
                assert co is None and (group, push.consumer_id, push.session_id) == (
                    self.checked_in
                ), self.fail(f"{push} ends a stream not checked in")
                continue
            assert push.error is None, self.fail(f"a checkout without members revoked: {push}")
            assert co is not None and co[0] == push.session_id, self.fail(f"{push} not out")
            _, window, lease_ms = co
            self.reached["pushed"] += len(push.deliveries)
            for x in push.deliveries:
                self.grant(group, x, push.consumer_id, lease_ms, "pushed")
            held = sum(
                1 for w in model.values() if w.state == LEASED and w.member == push.consumer_id
            )
            assert held <= window, self.fail(f"{group}/{push.consumer_id} holds {held} > {window}")

    # -- what the step did --------------------------------------------------------------------

    def sync(self) -> None:
        """Learn what the step wrote: dead letters, new records (published or replayed), the
        watermarks; what was pushed to checked-out consumers; and check the dead letters are
        exactly the expected ones."""

        replayed: dict[int, DeadInfo] = {}
        with self.store.read() as txn:
            lows = [
                txn.log(keys.log_id(self.q.queue_id, p)).watermarks().low for p in range(self.parts)
            ]
        for p in range(self.parts):
            for r in self.read(self.q.queue_id, p, self.high[p]):
                assert r.offset == self.high[p], self.fail("a record was missed")
                self.high[p] = r.offset + 1
                self.add(p, r)
                origin = dict(r.headers).get("fluxmq-replayed-from")
                if origin is not None:
                    info = self.expect_replayed[int(origin)]
                    replayed[int(origin)] = info
                    assert info.partition == p, self.fail("replayed into another partition")
                    assert r.value == self.msgs[(p, info.offset)].value, self.fail("replay")
                    aimed = dict(r.headers).get("fluxmq-replay-group")
                    assert aimed == info.group.encode(), self.fail("replay not aimed")
            self.low[p] = lows[p]
        assert replayed == self.expect_replayed, self.fail("replayed records")
        self.expect_replayed = {}
        self.take_pushes()
        self.take_dead_letters(lazy_ttl=False)

        for spec in GROUPS:
            for (p, off), w in self.model[spec.name].items():
                if w.state == PENDING and off < self.low[p]:
                    assert not self.until_consumed, self.fail(
                        f"{spec.name} {(p, off)} removed before it was consumed"
                    )
                    w.state = GONE

    def take_dead_letters(self, lazy_ttl: bool | set[str]) -> None:
        """Read the new dead letters: exactly the expected ones, plus (``lazy_ttl``: a lease
        walked past them; a set: of those groups only) messages found past their TTL."""
        expected = {(i.group, i.partition, i.offset): i for i in self.expect_dead}
        assert len(expected) == len(self.expect_dead), self.fail("a message died twice")
        dlq = self.sm.catalog.get("q.dlq")
        for r in self.read(dlq.queue_id, 0, self.dlq_next) if dlq is not None else []:
            h = dict(r.headers)
            info = DeadInfo(
                h["fluxmq-group"].decode(),
                int(h["fluxmq-original-partition"]),
                int(h["fluxmq-original-offset"]),
                int(h["fluxmq-attempts"]),
                h["fluxmq-dead-reason"].decode(),
            )
            assert h["fluxmq-original-queue"] == b"q", self.fail("dead letter origin")
            assert int(h["fluxmq-dead-at"]) == self.now, self.fail("dead-at")
            original = self.msgs[(info.partition, info.offset)]
            assert (r.value, r.key) == (original.value, original.key), self.fail("dead")
            want = expected.pop((info.group, info.partition, info.offset), None)
            if want is None:
                w = self.model[info.group][(info.partition, info.offset)]
                lazy = lazy_ttl if isinstance(lazy_ttl, bool) else info.group in lazy_ttl
                assert lazy and info.reason == "ttl", self.fail(f"unexpected {info}")
                assert w.state == PENDING and self.expired(info.partition, info.offset), self.fail(
                    f"{info} died of its TTL while {w.state}"
                )
                assert info.attempts == w.attempts, self.fail(f"{info}: attempts {w.attempts}")
                w.state = DEAD
            else:
                assert want == info, self.fail(f"dead letter {info}, expected {want}")
            self.dlq_live[r.offset] = info
            self.dlq_next = r.offset + 1
            self.reasons[info.reason] += 1
        assert not expected, self.fail(f"missing dead letters {list(expected.values())}")
        self.expect_dead = []

    def expired(self, p: int, off: int) -> bool:
        return bool(self.ttl_ms) and self.now - self.msgs[(p, off)].ts >= self.ttl_ms

    def read(self, queue_id: int, p: int, start: int) -> list[Record]:
        with self.store.read() as txn:
            log = txn.log(keys.log_id(queue_id, p))
            wm = log.watermarks()
            start = max(start, wm.low)
            return log.read(start, 100_000, 1 << 40) if start < wm.high else []

    def add(self, p: int, r: Record) -> None:
        headers = dict(r.headers)
        at = headers.get("fluxmq-deliver-at")
        ready_at = int(at) if at is not None else r.timestamp_ms + self.delay_ms
        m = self.msgs[(p, r.offset)] = Msg(r.value, r.key, headers, ready_at, r.timestamp_ms)
        for spec in GROUPS:
            state = PENDING if for_group(spec, m) else FILTERED
            self.model[spec.name][(p, r.offset)] = Where(state, due=ready_at)

    # -- the invariants -----------------------------------------------------------------------

    def check(self) -> None:
        sm = self.sm
        # The view the event loop reads, built piece by piece after each commit, is exactly the
        # view built from nothing: no change of the delivery state is left out of it.
        whole = DeliveryView.of(sm.delivery)
        assert sm.view.delivery == whole, self.fail(
            f"published view differs from the state: {_view_diff(sm.view.delivery, whole)}"
        )
        assert sm.view.applied_index == sm.last_applied_index()
        with self.store.read() as txn:
            depth = dead_letter_depth(txn, sm.catalog, sm.catalog["q"])
        assert depth == len(self.dlq_live), self.fail(f"DLQ depth {depth}")
        for spec in GROUPS:
            group = spec.name
            g = sm.delivery.get(self.q.queue_id, "q", group)
            by_part: dict[int, list[tuple[int, Where]]] = {p: [] for p in range(self.parts)}
            members: Counter[str] = Counter()
            for (p, off), w in self.model[group].items():
                by_part[p].append((off, w))
                if w.state == LEASED:
                    members[w.member] += 1
            assert g.in_flight_by_member == dict(members), self.fail(f"{group} in flight")
            for p, items in by_part.items():
                self.check_partition(group, p, sm.delivery.view(g, p), items)

    def check_partition(
        self, group: str, p: int, v: PartitionView, items: list[tuple[int, Where]]
    ) -> None:
        where = f"{group}/{p}"
        leased, scheduled = v.leased, v.scheduled
        counted: Counter[str] = Counter()
        for off, w in items:
            at = f"{where}@{off} {w.state}"
            counted[w.state] += 1
            if w.state == LEASED:
                assert leased.get(off) == (w.member, w.lease_id, w.attempts, w.deadline), self.fail(
                    f"{at}: view says {leased.get(off)}"
                )
            else:
                assert off not in leased, self.fail(f"{at}: leased in the view")
            if w.state == PENDING:
                assert off >= self.low[p], self.fail(f"{at}: below the low watermark")
                if off < v.next:
                    assert scheduled.get(off) == (w.due, w.attempts), self.fail(
                        f"{at} due {w.due - T0} attempts {w.attempts}: view {scheduled.get(off)}"
                    )
                else:
                    assert w.attempts == 0 and off not in scheduled, self.fail(at)
            elif w.state in (*DONE, GONE):
                assert off not in scheduled and off < v.next, self.fail(f"{at}: next {v.next}")
                assert w.state != GONE or off < self.low[p], self.fail(at)
            else:
                assert w.state in (FILTERED, LEASED), self.fail(at)
                assert off not in scheduled, self.fail(f"{at}: scheduled in the view")
        model_leased = {off for off, w in items if w.state == LEASED}
        assert set(leased) == model_leased, self.fail(f"{where}: leased {sorted(leased)}")
        assert v.acked == counted[ACKED_], self.fail(f"{where}: acked {v.acked}")
        assert v.dead == counted[DEAD], self.fail(f"{where}: dead {v.dead}")
        passed = sum(1 for off, w in items if w.state in (FILTERED, GONE, PURGED) and off < v.next)
        assert v.filtered + v.skipped + v.purged == passed, self.fail(
            f"{where}: filtered {v.filtered} + skipped {v.skipped} + purged {v.purged} != {passed}"
        )
        if self.until_consumed:
            assert v.skipped == 0, self.fail(f"{where}: skipped {v.skipped}")
        # Conservation: every offset below the frontier is leased, scheduled or counted once.
        done = v.acked + v.dead + v.filtered + v.skipped + v.purged
        assert v.next == done + len(leased) + len(scheduled), self.fail(f"{where}: {v}")
        assert v.committed == min([*leased, *scheduled], default=v.next), self.fail(f"{v}")
        assert v.next <= self.high[p], self.fail(f"{v}")
        # Nothing below the low watermark waits for a delivery (it could never happen).
        assert all(off >= self.low[p] for off in scheduled), self.fail(f"{v}")

    # -- driving ------------------------------------------------------------------------------

    def go(self, steps: int) -> None:
        rng = self.rng
        funcs = [f for f, _ in self.ops]
        weights = [w for _, w in self.ops]
        for self.step_no in range(steps):
            self.now += rng.choice([0, 0, 10, 50, 100, 250, 600])
            rng.choices(funcs, weights)[0]()
            self.sync()
            self.check()
            for m in self.model.values():
                self.reached.update({w.state for w in m.values()})
            if self.twin is not None:
                assert self.all_views(self.twin.sm) == self.all_views(self.sm), self.fail(
                    "the replicas' views differ"
                )
        # The run must have exercised what it claims to.
        assert self.reached[LEASED] and self.reached[ACKED_], self.fail(f"{self.reached}")


SEEDS = range(12)


@pytest.mark.parametrize("seed", SEEDS)
def test_every_message_is_in_exactly_one_state_for_every_group(seed: int) -> None:
    Run(seed, MemoryStore()).go(500)


def test_the_runs_cover_every_outcome() -> None:
    """The generator is not vacuous: over the seeds, every state is reached."""
    seen: Counter[str] = Counter()
    reasons: Counter[str] = Counter()
    for seed in SEEDS[:6]:
        run = Run(seed, MemoryStore())
        run.go(300)
        seen.update(run.reached)
        reasons.update(run.reasons)
    assert set(seen) == {PENDING, LEASED, ACKED_, DEAD, FILTERED, GONE, PURGED, "pushed"}, seen
    assert set(reasons) == {"ttl", "max_attempts", "nacked", "boom"}, reasons


@pytest.mark.parametrize("seed", [101, 102])
def test_memory_and_lmdb_replicas_apply_the_same_commands_identically(
    seed: int, tmp_path: Path
) -> None:
    lmdb = LmdbStore(str(tmp_path / "db"), sync=False)
    try:
        Run(seed, MemoryStore(), twin=lmdb).go(400)
    finally:
        lmdb.close()


# -- two sources sharing one DLQ ----------------------------------------------------------------

SOURCES = ("a", "b")
SHARED = "shared"


@dataclass(frozen=True)
class Letter:
    origin: str
    group: str
    partition: int
    offset: int  # in the origin queue


class SharedDlqRun:
    """Two work queues whose dead letters go to one DLQ, which also takes messages published
    to it directly. After every step each source's dead-letter view (depth, list) must be
    exactly its own live letters, replays must land in the source the letter came from, and
    nothing a source does may remove another source's letter or a direct message."""

    def __init__(self, seed: int, store: Store) -> None:
        self.seed = seed
        self.rng = rng = random.Random(seed)
        self.store = store
        self.d = Driver(store)
        self.now = T0
        self.step_no = 0
        self.max_attempts = rng.choice([1, 2, 3])
        if rng.random() < 0.5:
            # Made by hand first (empty, no DLQ of its own): it becomes the DLQ when named.
            self.d.create(SHARED, type=pb.QUEUE_TYPE_WORK, dead_letter_disabled=True)
        self.q: dict[str, pb.Queue] = {}
        for name in SOURCES:
            self.q[name] = self.d.create(
                name,
                type=pb.QUEUE_TYPE_WORK,
                partitions=rng.choice([1, 2]),
                max_attempts=self.max_attempts,
                dead_letter_queue=SHARED,
                lease_timeout="1s",
            )
            for grp in ("g", "h"):
                made = self.d.one(
                    cpb.CreateGroupCmd(
                        queue=name, queue_id=self.q[name].queue_id, group=grp, now_ms=T0
                    )
                )
                assert isinstance(made, pb.Group)
        self.held: dict[tuple[str, str], list[pb.Receipt]] = {
            (s, g): [] for s in SOURCES for g in ("g", "h")
        }
        self.counter = 0
        self.next_dlq = 0  # the next offset of the DLQ log to learn
        self.live: dict[str, dict[int, Letter]] = {s: {} for s in SOURCES}
        self.direct: dict[int, bytes] = {}  # DLQ offset -> value published to the DLQ itself
        self.expect_letters: Counter[str] = Counter()  # by origin, written by this step
        self.expect_replayed: dict[str, set[int]] = {s: set() for s in SOURCES}
        self.expect_any: int | None = None  # an expiry pass: letters of either source
        self.read_to = {(s, p): 0 for s in SOURCES for p in range(2)}  # source records read
        self.replayed_in: dict[str, set[int]] = {s: set() for s in SOURCES}
        self.done: Counter[str] = Counter()
        self.ops = [
            (self.publish, 20),
            (self.lease, 20),
            (self.settle, 20),
            (self.expire, 8),
            (self.publish_direct, 3),
            (self.replay, 5),
            (self.purge, 5),
            (self.purge_dlq_itself, 1),
            (self.restart, 1),
        ]

    def fail(self, what: str) -> str:
        return f"seed={self.seed} step={self.step_no}: {what}"

    @property
    def sm(self) -> QueueStateMachine:
        return self.d.sm

    def publish(self) -> None:
        src = self.rng.choice(SOURCES)
        msgs = []
        for _ in range(self.rng.randint(1, 3)):
            self.counter += 1
            msgs.append(pb.PublishMessage(value=b"%s-%d" % (src.encode(), self.counter)))
        res = self.d.one(append_cmd(self.q[src], msgs, self.now))
        assert isinstance(res, AppendResult), self.fail(repr(res))

    def publish_direct(self) -> None:
        self.counter += 1
        value = b"direct-%d" % self.counter
        shared = self.sm.catalog.get(SHARED)
        if shared is None:
            return  # created on the first dead letter
        res = self.d.one(append_cmd(shared.queue, [pb.PublishMessage(value=value)], self.now))
        assert isinstance(res, AppendResult), self.fail(repr(res))
        self.direct[res.offsets[0]] = value
        self.done["direct"] += 1
        self.next_dlq = max(self.next_dlq, res.offsets[0] + 1)

    def lease(self) -> None:
        src, grp = self.rng.choice(SOURCES), self.rng.choice(("g", "h"))
        res = self.d.one(
            cpb.LeaseCmd(
                queue=src,
                queue_id=self.q[src].queue_id,
                group=grp,
                consumer_id="c",
                max_messages=self.rng.randint(1, 4),
                lease_ms=1000,
                now_ms=self.now,
            )
        )
        assert isinstance(res, LeaseResult), self.fail(repr(res))
        for x in res.deliveries:
            assert x.record.value.startswith(src.encode() + b"-"), self.fail(
                f"{src} leased {x.record.value!r}: not one of its messages"
            )
        self.held[(src, grp)].extend(receipts_of(res))

    def settle(self) -> None:
        src, grp = self.rng.choice(SOURCES), self.rng.choice(("g", "h"))
        held = self.held[(src, grp)]
        if not held:
            return
        chosen = [held.pop(self.rng.randrange(len(held))) for _ in range(min(len(held), 2))]
        dead = self.rng.random() < 0.6
        cmd = cpb.NackCmd(
            queue=src,
            queue_id=self.q[src].queue_id,
            group=grp,
            receipts=chosen,
            now_ms=self.now,
            dead=dead,
            retry_at_ms=self.now,
        )
        res = self.d.one(cmd)
        assert isinstance(res, SettleResult), self.fail(repr(res))
        self.expect_letters[src] += sum(1 for s in res.statuses if s == DEAD_LETTERED)

    def expire(self) -> None:
        before = sum(self.expect_letters.values())
        res = self.d.one(cpb.ExpireLeasesCmd(now_ms=self.now))
        assert isinstance(res, ExpireResult), self.fail(repr(res))
        for key in self.held:
            self.held[key] = [r for r in self.held[key] if r.lease_deadline_ms > self.now]
        self.expect_any = before + res.dead_letters

    def replay(self) -> None:
        src = self.rng.choice(SOURCES)
        other = SOURCES[1 - SOURCES.index(src)]
        live = sorted(self.live[src])
        if self.rng.random() < 0.5:
            grp = self.rng.choice(["", "g", "h"])
            ids: list[int] = []
            chosen = {o for o in live if not grp or self.live[src][o].group == grp}
        else:
            grp = ""
            ids = self.rng.sample(live, min(len(live), 2))
            chosen = set(ids)
            ids += sorted(self.live[other])[:2] + sorted(self.direct)[:1]  # never src's
        res = self.d.one(
            cpb.ReplayDeadLettersCmd(
                queue=src,
                queue_id=self.q[src].queue_id,
                ids=ids,
                all=not ids,
                group=grp,
                now_ms=self.now,
            )
        )
        assert res == len(chosen), self.fail(f"{src} replayed {res}, expected {len(chosen)}")
        for o in chosen:
            del self.live[src][o]
        self.expect_replayed[src] |= chosen
        self.done["replay"] += len(chosen)

    def purge(self) -> None:
        src = self.rng.choice(SOURCES)
        other = SOURCES[1 - SOURCES.index(src)]
        live = sorted(self.live[src])
        if self.rng.random() < 0.5:
            ids: list[int] = []
            chosen = set(live)
        else:
            ids = self.rng.sample(live, min(len(live), 2))
            chosen = set(ids)
            ids += sorted(self.live[other])[:2] + sorted(self.direct)[:1]
            if not ids:
                return
        res = self.d.one(
            cpb.PurgeDeadLettersCmd(queue=src, queue_id=self.q[src].queue_id, ids=ids, all=not ids)
        )
        assert res == len(chosen), self.fail(f"{src} purged {res}, expected {len(chosen)}")
        for o in chosen:
            del self.live[src][o]
        self.done["purge"] += len(chosen)

    def purge_dlq_itself(self) -> None:
        """An operator purges the DLQ queue itself (no groups: its whole log goes). Whatever
        was in it is gone for every source; the index must not count it any more."""
        shared = self.sm.catalog.get(SHARED)
        if shared is None:
            return
        res = self.d.one(
            cpb.PurgeCmd(
                name=SHARED,
                queue_id=shared.queue_id,
                now_ms=self.now,
                scope=pb.PURGE_SCOPE_ALL,
                destructive=True,
            )
        )
        assert isinstance(res, PurgeResult), self.fail(repr(res))
        with self.store.read() as txn:
            low = txn.log(keys.log_id(shared.queue_id, 0)).watermarks().low
        for src in SOURCES:
            self.live[src] = {o: x for o, x in self.live[src].items() if o >= low}
        self.direct = {o: v for o, v in self.direct.items() if o >= low}
        self.done["dlq_purge"] += 1

    def restart(self) -> None:
        self.d.sm = QueueStateMachine(self.store)

    # -- learning and checking ----------------------------------------------------------------

    def log(self, queue_id: int, p: int, start: int) -> list[Record]:
        with self.store.read() as txn:
            lg = txn.log(keys.log_id(queue_id, p))
            wm = lg.watermarks()
            start = max(start, wm.low)
            return lg.read(start, 100_000, 1 << 40) if start < wm.high else []

    def sync(self) -> None:
        shared = self.sm.catalog.get(SHARED)
        new: Counter[str] = Counter()
        if shared is not None:
            for r in self.log(shared.queue_id, 0, self.next_dlq):
                self.next_dlq = r.offset + 1
                h = dict(r.headers)
                origin = h["fluxmq-original-queue"].decode()
                assert r.value.startswith(origin.encode() + b"-"), self.fail(
                    f"letter {r.value!r} says it came from {origin}"
                )
                self.live[origin][r.offset] = Letter(
                    origin,
                    h["fluxmq-group"].decode(),
                    int(h["fluxmq-original-partition"]),
                    int(h["fluxmq-original-offset"]),
                )
                new[origin] += 1
        expected = self.expect_any
        if expected is not None:
            assert sum(new.values()) == expected, self.fail(f"{new}, expected {expected}")
            self.expect_any = None
        else:
            assert new == +self.expect_letters, self.fail(f"{new} != {self.expect_letters}")
        self.expect_letters = Counter()
        # Replays land in their own source, one record per replayed letter; a source never
        # holds a message (replayed or not) of the other.
        for src in SOURCES:
            q = self.q[src]
            for p in range(q.config.partitions):
                for r in self.log(q.queue_id, p, self.read_to[(src, p)]):
                    self.read_to[(src, p)] = r.offset + 1
                    assert r.value.startswith(src.encode() + b"-"), self.fail(
                        f"{src} holds {r.value!r}"
                    )
                    origin = dict(r.headers).get("fluxmq-replayed-from")
                    if origin is not None:
                        self.replayed_in[src].add(int(origin))
            got = self.replayed_in[src]
            assert got == self.expect_replayed[src], self.fail(f"{src} replays {sorted(got)}")

    def check(self) -> None:
        reader = QueueReader(self.sm)
        for src in SOURCES:
            entry = self.sm.catalog[src]
            with self.store.read() as txn:
                depth = dead_letter_depth(txn, self.sm.catalog, entry)
            assert depth == len(self.live[src]), self.fail(f"{src} depth {depth}")
            ids: list[int] = []
            token = ""
            for _ in range(100):
                page, token = reader.dead_letters(entry, "", 0, 0, token, 7)
                ids += [dl.id for dl in page]
                if not token:
                    break
            assert ids == sorted(self.live[src]), self.fail(f"{src} lists {ids}")
        shared = self.sm.catalog.get(SHARED)
        if shared is not None:
            assert shared.policy.dead_letter_queue is None, self.fail("the DLQ has a DLQ")
            held = {r.offset: r.value for r in self.log(shared.queue_id, 0, 0)}
            for off, value in self.direct.items():
                assert held.get(off) == value, self.fail(f"direct message {off} removed")
            for src in SOURCES:
                for off in self.live[src]:
                    assert off in held, self.fail(f"live letter {off} of {src} removed")

    def go(self, steps: int) -> None:
        funcs = [f for f, _ in self.ops]
        weights = [w for _, w in self.ops]
        for self.step_no in range(steps):
            self.now += self.rng.choice([0, 10, 100, 600, 1200])
            self.rng.choices(funcs, weights)[0]()
            self.sync()
            self.check()


@pytest.mark.parametrize("seed", range(8))
def test_sources_sharing_a_dlq_see_and_touch_only_their_own_dead_letters(seed: int) -> None:
    run = SharedDlqRun(seed, MemoryStore())
    run.go(400)
    assert run.done["replay"] and run.done["purge"], run.fail(f"vacuous: {run.done}")
    assert run.done["direct"], run.fail("no message was published to the DLQ directly")


@pytest.mark.parametrize("seed", [201])
def test_shared_dlq_runs_alike_on_lmdb(seed: int, tmp_path: Path) -> None:
    lmdb = LmdbStore(str(tmp_path / "db"), sync=False)
    try:
        SharedDlqRun(seed, lmdb).go(300)
    finally:
        lmdb.close()


def _view_diff(published: DeliveryView, whole: DeliveryView) -> str:
    out = []
    for gid in sorted(set(published.by_id) | set(whole.by_id)):
        a, b = published.by_id.get(gid), whole.by_id.get(gid)
        if a == b:
            continue
        if a is None or b is None:
            out.append(f"group {gid}: published {a is not None}, state {b is not None}")
            continue
        for name in ("meta", "queue_id", "in_flight_by_member", "membership", "expiry_head_ms"):
            if getattr(a, name) != getattr(b, name):
                out.append(f"group {gid} {name}: {getattr(a, name)} != {getattr(b, name)}")
        for p in sorted(set(a.parts) | set(b.parts)):
            if a.parts.get(p) != b.parts.get(p):
                out.append(f"group {gid} partition {p}: {a.parts.get(p)} != {b.parts.get(p)}")
    return "; ".join(out) or "by_queue only"
