"""Consumer groups on the asyncio side: turns Lease / Consume / Ack / ... requests into commands,
waits for messages to become ready (long polls, Consume streams), and times the leader's
ExpireLeases passes and the dead-letter alerts.

The decisions (who gets which message, when a lease is over) are all in fluxmq.core.delivery;
this module adds waiting, time and the one-poll-per-consumer rule.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
from collections.abc import AsyncIterator, Hashable, Sequence
from typing import TYPE_CHECKING

from fluxmq import metrics
from fluxmq._pb.internal import commands_pb2 as cpb
from fluxmq._pb.v1 import queue_pb2 as pb
from fluxmq.core import limits, validation
from fluxmq.core import membership as msh
from fluxmq.core.catalog import QueueEntry
from fluxmq.core.errors import FluxError, invalid_argument, nested, queue_not_found
from fluxmq.core.partitioner import prepare_append
from fluxmq.core.state_machine import (
    ExpireResult,
    LeaseResult,
    MemberResult,
    SettleResult,
    TransactResult,
    foreign_receipt,
    member_view,
    no_dead_letter_queue,
)
from fluxmq.server.timer_failures import TimerFailures

if TYPE_CHECKING:
    from fluxmq.server.broker import Broker

log = logging.getLogger(__name__)

EXPIRE_INTERVAL_MS = 100  # how often the leader looks for expired leases and TTLs
IDLE_RECHECK_S = 1.0  # a waiting poll re-checks at least this often (queue deleted, ...)
TRANSACT_PUBLISHES_MAX = 16
TRANSACT_ACKS_MAX = 16


def queue_key(queue_id: int) -> Hashable:
    return ("queue", queue_id)


def group_key(group_id: int) -> Hashable:
    return ("group", group_id)


class Consumers:
    def __init__(self, broker: Broker) -> None:
        self._broker = broker
        self._reader = broker.reader
        # (queue_id, group, consumer_id) of every Lease long poll and Consume stream running:
        # one at a time per consumer, so two workers sharing an id are caught, not interleaved.
        self._active: set[tuple[int, str, str]] = set()
        self.dead_letter_alerts: dict[str, int] = {}  # queue -> depth when the alert was raised
        self.sessions = msh.SessionTracker()
        self._was_leader = False
        self._expiry_failures = TimerFailures("lease expiry pass", log)
        self._alert_failures = TimerFailures("dead-letter alert check", log)

    # -- groups -----------------------------------------------------------------------------

    async def create_group(self, req: pb.CreateGroupRequest) -> pb.Group:
        entry = self._reader.entry(req.queue)
        validation.group_name(req.group)
        if req.mode not in (
            pb.DELIVERY_MODE_UNSPECIFIED,
            pb.DELIVERY_MODE_SHARED,
            pb.DELIVERY_MODE_ORDERED,
        ):
            raise invalid_argument("mode", f"unknown delivery mode {req.mode}")
        validation.group_filter(req.filter)
        validation.start_position(req.start)
        cmd = cpb.CreateGroupCmd(
            queue=req.queue,
            queue_id=entry.queue_id,
            group=req.group,
            start=req.start,
            mode=req.mode,
            filter=req.filter,
            now_ms=self._broker.now_ms(),
        )
        group = await self._broker.submit(cmd)
        assert isinstance(group, pb.Group)
        return group

    async def delete_group(self, queue: str, group: str) -> None:
        entry = self._reader.entry(queue)
        self._reader.group(entry, group)
        await self._broker.submit(
            cpb.DeleteGroupCmd(queue=queue, queue_id=entry.queue_id, group=group)
        )

    # -- lease ------------------------------------------------------------------------------

    def _claim(self, entry: QueueEntry, group: str, consumer_id: str) -> tuple[int, str, str]:
        key = (entry.queue_id, group, consumer_id)
        if key in self._active:
            raise FluxError(
                "CONSUMER_BUSY",
                f"consumer {consumer_id!r} already has a Lease or Consume running on "
                f"{entry.name!r}/{group!r}; give each worker its own consumer_id",
                retriable=True,
                retry_after_ms=1000,
                metadata={"consumer_id": consumer_id, "group": group},
            )
        self._active.add(key)
        return key

    async def lease(self, req: pb.LeaseRequest) -> LeaseResult:
        entry = self._reader.entry(req.queue)
        self._reader.group(entry, req.group)
        consumer = validation.consumer_id(req.consumer_id)
        count = validation.lease_batch(req.max_messages)
        lease_ms = validation.lease_ms(req.lease_ms, entry.policy.lease_ms)
        wait_ms = validation.wait_ms(req.wait_ms)
        ref = self._member_ref(entry, req.group, req.member_id, req.generation_id)
        # A draining node leases nothing more: the answer could be cut off by the shutdown,
        # and the client finds the messages on another node at once.
        self._broker.notifier.check_open()
        key = self._claim(entry, req.group, consumer)
        try:
            loop = asyncio.get_running_loop()
            deadline = loop.time() + wait_ms / 1000
            while True:
                result = await self._lease_once(entry, req.group, consumer, count, lease_ms, ref)
                if result is not None and result.deliveries:
                    return result
                remaining = deadline - loop.time()
                if remaining <= 0:
                    return result or LeaseResult(self._reader.group(entry, req.group).group_id, [])
                await self._wait_ready(entry, req.group, remaining, ref.member_id)
        finally:
            self._active.discard(key)

    def _member_ref(
        self,
        entry: QueueEntry,
        group: str,
        member_id: str,
        generation_id: int,
        *,
        lease: bool = True,
    ) -> cpb.MemberRef:
        if len(member_id) > msh.MEMBER_ID_CHARS_MAX:
            raise invalid_argument("member_id", f"at most {msh.MEMBER_ID_CHARS_MAX} characters")
        self._reader.check_member(entry, group, member_id, generation_id, lease=lease)
        return cpb.MemberRef(member_id=member_id, generation_id=generation_id)

    def _settle_ref(
        self, entry: QueueEntry, group: str, member_id: str, generation_id: int
    ) -> cpb.MemberRef:
        """Acks and the like need no membership; when they name a member it must be current."""
        if not member_id:
            return cpb.MemberRef()
        return self._member_ref(entry, group, member_id, generation_id, lease=False)

    async def _lease_once(
        self,
        entry: QueueEntry,
        group: str,
        consumer: str,
        count: int,
        lease_ms: int,
        ref: cpb.MemberRef,
    ) -> LeaseResult | None:
        """One Lease command, if one could hand anything out (None: not proposed)."""
        self._ensure_same_queue(entry)
        now_ms = self._broker.now_ms()
        ready, _ = self._reader.maybe_ready(entry, group, now_ms, ref.member_id)
        if not ready:
            return None
        cmd = cpb.LeaseCmd(
            queue=entry.name,
            queue_id=entry.queue_id,
            group=group,
            consumer_id=consumer,
            max_messages=count,
            lease_ms=lease_ms,
            now_ms=now_ms,
            member=ref,
        )
        result = await self._broker.submit(cmd)
        assert isinstance(result, LeaseResult)
        if result.deliveries:
            metrics.observe_deliveries(entry.name, result.deliveries)
        return result

    def _ensure_same_queue(self, entry: QueueEntry) -> None:
        current = self._broker.state.catalog.get(entry.name)
        if current is None or current.queue_id != entry.queue_id:
            raise queue_not_found(entry.name)

    async def _wait_ready(
        self, entry: QueueEntry, group: str, timeout_s: float, member_id: str = ""
    ) -> None:
        """Until the queue grows, the group changes, a scheduled message comes due, or
        ``timeout_s`` passes. The events are taken before the check, so no wakeup is lost.
        Raises NODE_SHUTTING_DOWN when the node drains (before or meanwhile)."""
        g = self._reader.group(entry, group)
        notifier = self._broker.notifier
        notifier.check_open()  # draining: no more leases, even of messages ready right now
        events = [notifier.event(queue_key(entry.queue_id)), notifier.event(group_key(g.group_id))]
        now_ms = self._broker.now_ms()
        ready, due_ms = self._reader.maybe_ready(entry, group, now_ms, member_id)
        if ready:
            return
        timeout_s = min(timeout_s, IDLE_RECHECK_S)
        if due_ms is not None:
            timeout_s = min(timeout_s, max(due_ms - now_ms, 1) / 1000)
        await notifier.wait(events, timeout_s)

    async def consume(self, req: pb.ConsumeRequest) -> AsyncIterator[LeaseResult]:
        """Leases pushed as messages become ready, at most max_in_flight unsettled at once."""
        entry = self._reader.entry(req.queue)
        g = self._reader.group(entry, req.group)
        consumer = validation.consumer_id(req.consumer_id)
        window = validation.max_in_flight(req.max_in_flight)
        batch = validation.lease_batch(req.batch_max, "batch_max", default=100)
        lease_ms = validation.lease_ms(req.lease_ms, entry.policy.lease_ms)
        ref = self._member_ref(entry, req.group, req.member_id, req.generation_id)
        key = self._claim(entry, req.group, consumer)
        notifier = self._broker.notifier
        try:
            while True:
                notifier.check_open()  # a draining node ends its streams, even busy ones
                self._ensure_same_queue(entry)
                room = window - self._reader.in_flight(entry, req.group, consumer)
                if room <= 0:
                    # Full: wait for an ack, nack or expiry of this group.
                    event = notifier.event(group_key(g.group_id))
                    if window - self._reader.in_flight(entry, req.group, consumer) <= 0:
                        await notifier.wait([event], IDLE_RECHECK_S)
                    continue
                result = await self._lease_once(
                    entry, req.group, consumer, min(room, batch), lease_ms, ref
                )
                if result is not None and result.deliveries:
                    yield result
                    continue
                await self._wait_ready(entry, req.group, IDLE_RECHECK_S, ref.member_id)
        finally:
            self._active.discard(key)

    # -- settle -----------------------------------------------------------------------------

    def _receipts(
        self, entry: QueueEntry, group: str, receipts: Sequence[pb.Receipt], path: str
    ) -> None:
        validation.receipts_count(len(receipts), path)
        g = self._reader.group(entry, group)
        for i, r in enumerate(receipts):
            if r.group_id != g.group_id:
                raise foreign_receipt(g, f"{path}[{i}]")

    async def ack(self, req: pb.AckRequest) -> SettleResult:
        entry = self._reader.entry(req.queue)
        ref = self._settle_ref(entry, req.group, req.member_id, req.generation_id)
        self._receipts(entry, req.group, req.receipts, "receipts")
        cmd = cpb.AckCmd(
            queue=req.queue,
            queue_id=entry.queue_id,
            group=req.group,
            receipts=req.receipts,
            now_ms=self._broker.now_ms(),
            member=ref,
        )
        result = await self._broker.submit(cmd)
        assert isinstance(result, SettleResult)
        metrics.ACKED_MESSAGES.labels(req.queue).inc(result.statuses.count(pb.RECEIPT_STATUS_ACKED))
        return result

    async def nack(self, req: pb.NackRequest) -> SettleResult:
        entry = self._reader.entry(req.queue)
        self._receipts(entry, req.group, req.receipts, "receipts")
        if req.retry_after_ms and req.retry_at_ms:
            raise invalid_argument("retry_at_ms", "set retry_after_ms or retry_at_ms, not both")
        if req.dead and (req.retry_after_ms or req.retry_at_ms):
            raise invalid_argument("dead", "a dead letter is not retried: drop retry_after_ms")
        if req.dead and entry.policy.dead_letter_queue is None:
            raise no_dead_letter_queue(req.queue)
        if len(req.reason) > 1024:
            raise invalid_argument("reason", "at most 1024 characters")
        now_ms = self._broker.now_ms()
        retry_at = req.retry_at_ms
        if req.retry_after_ms:
            retry_at = now_ms + validation.retry_delay_ms(req.retry_after_ms, "retry_after_ms")
        elif retry_at and retry_at > now_ms + limits.DELAY_MS_MAX:
            raise invalid_argument("retry_at_ms", "at most 7 days ahead")
        cmd = cpb.NackCmd(
            queue=req.queue,
            queue_id=entry.queue_id,
            group=req.group,
            receipts=req.receipts,
            now_ms=now_ms,
            retry_at_ms=max(retry_at, 0),
            dead=req.dead,
            reason=req.reason,
            member=self._settle_ref(entry, req.group, req.member_id, req.generation_id),
        )
        result = await self._broker.submit(cmd)
        assert isinstance(result, SettleResult)
        metrics.NACKED_MESSAGES.labels(req.queue).inc(
            result.statuses.count(pb.RECEIPT_STATUS_NACKED)
        )
        return result

    async def extend(self, req: pb.ExtendLeaseRequest) -> SettleResult:
        entry = self._reader.entry(req.queue)
        self._receipts(entry, req.group, req.receipts, "receipts")
        cmd = cpb.ExtendLeaseCmd(
            queue=req.queue,
            queue_id=entry.queue_id,
            group=req.group,
            receipts=req.receipts,
            now_ms=self._broker.now_ms(),
            lease_ms=validation.lease_ms(req.lease_ms, entry.policy.lease_ms),
            member=self._settle_ref(entry, req.group, req.member_id, req.generation_id),
        )
        result = await self._broker.submit(cmd)
        assert isinstance(result, SettleResult)
        return result

    # -- offsets ----------------------------------------------------------------------------

    async def commit_offsets(self, req: pb.CommitOffsetsRequest) -> pb.OffsetsResponse:
        entry = self._reader.entry(req.queue)
        self._reader.group(entry, req.group)
        if not req.offsets:
            raise invalid_argument("offsets", "name at least one partition")
        await self._broker.submit(
            cpb.CommitOffsetsCmd(
                queue=req.queue,
                queue_id=entry.queue_id,
                group=req.group,
                offsets=req.offsets,
                member=self._settle_ref(entry, req.group, req.member_id, req.generation_id),
            )
        )
        return self._reader.offsets(entry, req.group)

    async def reset_offsets(self, req: pb.ResetOffsetsRequest) -> pb.OffsetsResponse:
        entry = self._reader.entry(req.queue)
        self._reader.group(entry, req.group)
        validation.start_position(req.to, "to")
        await self._broker.submit(
            cpb.ResetOffsetsCmd(
                queue=req.queue,
                queue_id=entry.queue_id,
                group=req.group,
                partitions=req.partitions,
                to=req.to,
            )
        )
        return self._reader.offsets(entry, req.group)

    # -- dead letters -----------------------------------------------------------------------

    async def replay_dead_letters(self, req: pb.ReplayDeadLettersRequest) -> int:
        entry = self._reader.entry(req.queue)
        self._check_ids(req.ids, req.all)
        if req.group:
            validation.group_name(req.group)
        total = 0
        ids = list(req.ids)
        # One command replays at most REPLAY_PER_COMMAND_MAX; "all" takes as many as needed.
        for _ in range(10_000):
            chunk = ids[: limits.REPLAY_PER_COMMAND_MAX]
            ids = ids[limits.REPLAY_PER_COMMAND_MAX :]
            n = await self._broker.submit(
                cpb.ReplayDeadLettersCmd(
                    queue=req.queue,
                    queue_id=entry.queue_id,
                    ids=chunk,
                    all=req.all,
                    group=req.group,
                    now_ms=self._broker.now_ms(),
                )
            )
            assert isinstance(n, int)
            total += n
            if (req.all and n < limits.REPLAY_PER_COMMAND_MAX) or (not req.all and not ids):
                break
        return total

    async def purge_dead_letters(self, req: pb.PurgeDeadLettersRequest) -> int:
        entry = self._reader.entry(req.queue)
        self._check_ids(req.ids, req.all)
        total = 0
        # "all" deletes the queue's own letters one by one (a shared DLQ is never truncated
        # wholesale), at most PURGE_DEAD_LETTERS_PER_COMMAND_MAX per command.
        for _ in range(10_000):
            n = await self._broker.submit(
                cpb.PurgeDeadLettersCmd(
                    queue=req.queue, queue_id=entry.queue_id, ids=req.ids, all=req.all
                )
            )
            assert isinstance(n, int)
            total += n
            if not req.all or n < limits.PURGE_DEAD_LETTERS_PER_COMMAND_MAX:
                break
        return total

    @staticmethod
    def _check_ids(ids: Sequence[int], all_: bool) -> None:
        if all_ and ids:
            raise invalid_argument("ids", "give ids or all, not both")
        if not all_ and not ids:
            raise invalid_argument("ids", "give the ids of the dead letters, or all=true")
        if len(ids) > 100_000:
            raise invalid_argument("ids", "at most 100000 ids")

    # -- transactions -----------------------------------------------------------------------

    async def transact(self, req: pb.TransactRequest) -> TransactResult:
        if not req.acks and not req.publishes:
            raise invalid_argument("acks", "a transaction carries at least one ack or publish")
        if len(req.acks) > TRANSACT_ACKS_MAX:
            raise invalid_argument("acks", f"at most {TRANSACT_ACKS_MAX} ack requests")
        if len(req.publishes) > TRANSACT_PUBLISHES_MAX:
            raise invalid_argument("publishes", f"at most {TRANSACT_PUBLISHES_MAX} publishes")
        timeout_ms = validation.request_timeout_ms(req.request_timeout_ms)
        # Single node: every queue lives in the one local replication group, so any mix of
        # queues can share a transaction.
        cmd = cpb.TransactCmd()
        now_ms = self._broker.now_ms()
        for i, ack in enumerate(req.acks):
            try:
                cmd.acks.append(self._transact_ack(ack, now_ms))
            except FluxError as err:
                raise nested(f"acks[{i}]", err) from None
        for i, pub in enumerate(req.publishes):
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
                entry = self._reader.entry(pub.queue)
                prepared = prepare_append(
                    pub.queue, entry.queue_id, entry.policy, pub.messages, i, now_ms
                )
            except FluxError as err:
                raise nested(f"publishes[{i}]", err) from None
            cmd.appends.append(prepared.command)
        result = await self._broker.submit(cmd, timeout_ms)
        assert isinstance(result, TransactResult)
        return result

    def _transact_ack(self, ack: pb.AckRequest, now_ms: int) -> cpb.AckCmd:
        """One ack of a transaction, checked as an Ack would be (field paths relative to it)."""
        entry = self._reader.entry(ack.queue)
        self._receipts(entry, ack.group, ack.receipts, "receipts")
        return cpb.AckCmd(
            queue=ack.queue,
            queue_id=entry.queue_id,
            group=ack.group,
            receipts=ack.receipts,
            now_ms=now_ms,
            member=self._settle_ref(entry, ack.group, ack.member_id, ack.generation_id),
        )

    # -- membership ---------------------------------------------------------------------------

    def _assignment(
        self, m: pb.GroupMember, group_generation: int, **extra: object
    ) -> pb.MemberAssignment:
        interval = msh.heartbeat_interval_ms(m.session_timeout_ms)
        if m.pending:  # waiting for a release: ask again soon
            interval = max(50, interval // msh.PENDING_HEARTBEAT_DIVISOR)
        return pb.MemberAssignment(
            member_id=m.member_id,
            generation_id=m.generation_id,
            assigned=m.assigned,
            revoking=m.revoking,
            pending=m.pending,
            heartbeat_interval_ms=interval,
            group_generation=group_generation,
            **extra,  # type: ignore[arg-type]
        )

    async def join_group(self, req: pb.JoinGroupRequest) -> pb.MemberAssignment:
        entry = self._reader.entry(req.queue)
        g = self._reader.group(entry, req.group)
        consumer = validation.consumer_id(req.consumer_id)
        strategy, timeout_ms = msh.validate_join(req.strategy, req.session_timeout_ms)
        if len(req.member_id) > msh.MEMBER_ID_CHARS_MAX:
            raise invalid_argument("member_id", f"at most {msh.MEMBER_ID_CHARS_MAX} characters")
        ms = self._reader.membership(entry, req.group)
        member_id = req.member_id
        if not member_id or ms is None or member_id not in ms.members:
            # New (or expired meanwhile): a fresh id, so the old one's requests stay stale.
            member_id = f"{consumer[:64]}-{secrets.token_hex(6)}"
        now_ms = self._broker.now_ms()
        result = await self._broker.submit(
            cpb.JoinGroupCmd(
                queue=req.queue,
                queue_id=entry.queue_id,
                group=req.group,
                consumer_id=consumer,
                member_id=member_id,
                session_timeout_ms=timeout_ms,
                strategy=strategy,
                now_ms=now_ms,
            )
        )
        assert isinstance(result, MemberResult)
        self.sessions.saw(g.group_id, member_id, now_ms)
        metrics.GROUP_JOINS.labels(req.queue).inc()
        return self._assignment(result.member, result.group_generation)

    async def heartbeat(self, req: pb.HeartbeatRequest) -> pb.MemberAssignment:
        """Answered by the leader from its memory; a command only when partitions can move."""
        entry = self._reader.entry(req.queue)
        g = self._reader.group(entry, req.group)
        if not req.member_id:
            raise invalid_argument("member_id", "required (from JoinGroup)")
        self._broker.require_leader()
        ms = self._reader.membership(entry, req.group)
        m = ms.members.get(req.member_id) if ms is not None else None
        if ms is None or m is None:
            return pb.MemberAssignment(
                member_id=req.member_id,
                should_rejoin=True,
                reason="the member is not in the group: its session expired, it left, or the "
                "same consumer joined again",
                heartbeat_interval_ms=msh.heartbeat_interval_ms(msh.SESSION_TIMEOUT_MS_DEFAULT),
                group_generation=ms.group_generation if ms is not None else 0,
            )
        if req.generation_id > m.generation:
            raise invalid_argument(
                "generation_id",
                f"member {m.member_id!r} never had generation {req.generation_id} "
                f"(current {m.generation})",
            )
        now_ms = self._broker.now_ms()
        self.sessions.saw(g.group_id, m.member_id, now_ms)
        view = member_view(m)
        generation = ms.group_generation
        if self._reader.releasable(entry, req.group, m.member_id, req.generation_id):
            result = await self._broker.submit(
                cpb.ReleasePartitionsCmd(
                    queue=req.queue,
                    queue_id=entry.queue_id,
                    group=req.group,
                    member_id=m.member_id,
                    generation_id=req.generation_id,
                )
            )
            if isinstance(result, MemberResult):
                view, generation = result.member, result.group_generation
        return self._assignment(view, generation)

    async def leave_group(self, req: pb.LeaveGroupRequest) -> None:
        entry = self._reader.entry(req.queue)
        g = self._reader.group(entry, req.group)
        if not req.member_id:
            raise invalid_argument("member_id", "required (from JoinGroup)")
        await self._broker.submit(
            cpb.LeaveGroupCmd(
                queue=req.queue,
                queue_id=entry.queue_id,
                group=req.group,
                member_id=req.member_id,
                now_ms=self._broker.now_ms(),
            )
        )
        self.sessions.forget(g.group_id, req.member_id)

    async def maybe_expire_members(self) -> int:
        """Propose ExpireMembers for the sessions that lapsed (leader only)."""
        now_ms = self._broker.now_ms()
        lapsed = self.sessions.lapsed(self._reader.memberships(), now_ms)
        if not lapsed:
            return 0
        cmd = cpb.ExpireMembersCmd(now_ms=now_ms)
        for group_id, member_id in lapsed[: msh.EXPIRES_PER_PASS_MAX]:
            cmd.members.add(group_id=group_id, member_id=member_id)
        result = await self._broker.submit(cmd)
        assert isinstance(result, int)
        if result:
            log.info("expired %d group member(s) whose session lapsed", result)
            metrics.EXPIRED_MEMBERS.inc(result)
        return result

    # -- leader timers ----------------------------------------------------------------------

    async def maybe_expire(self) -> ExpireResult | None:
        """Propose ExpireLeases when a lease deadline or a TTL has passed (checked first)."""
        state = self._broker.state
        now_ms = self._broker.now_ms()
        with state.lock:
            deadline = state.delivery.next_deadline_ms()
        due = deadline is not None and deadline <= now_ms
        if not due:
            policies = {e.queue_id: e.policy for e in state.catalog.values()}
            if any(p.message_ttl_ms for p in policies.values()):
                with state.store.read() as txn, state.lock:
                    due = state.delivery.ttl_due(txn, policies, now_ms)
        if not due:
            return None
        result = await self._broker.submit(cpb.ExpireLeasesCmd(now_ms=now_ms))
        assert isinstance(result, ExpireResult)
        if result.expired_leases:
            metrics.EXPIRED_LEASES.inc(result.expired_leases)
        return result

    async def expire_routine(self) -> None:
        while True:
            await asyncio.sleep(EXPIRE_INTERVAL_MS / 1000)
            if not self._broker.shard.is_leader:
                self._was_leader = False
                self._expiry_failures.stand_down()
                continue
            if not self._was_leader:
                # Heartbeats went to the old leader: every member gets a full session from now.
                self.sessions.reset()
                self._was_leader = True
            try:
                await self.maybe_expire()
                await self.maybe_expire_members()
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                self._expiry_failures.failed(exc)
            else:
                self._expiry_failures.succeeded()

    def maybe_alert_dead_letters(self) -> None:
        """Log once when a queue's own dead letters (in a shared DLQ: only its own) grow past its
        threshold; clear when they drop back."""
        for entry in list(self._broker.state.catalog.values()):
            threshold = entry.policy.dead_letter_alert_threshold
            if not threshold:
                self.dead_letter_alerts.pop(entry.name, None)
                continue
            depth = self._reader.dead_letter_depth(entry)
            if depth > threshold and entry.name not in self.dead_letter_alerts:
                self.dead_letter_alerts[entry.name] = depth
                log.warning(
                    "queue %r has %d dead letters in %r (alert threshold %d)",
                    entry.name,
                    depth,
                    entry.policy.dead_letter_queue,
                    threshold,
                )
            elif depth <= threshold and entry.name in self.dead_letter_alerts:
                del self.dead_letter_alerts[entry.name]
                log.info("queue %r is back to %d dead letters", entry.name, depth)

    async def alert_routine(self) -> None:
        while True:
            await asyncio.sleep(1.0)
            try:
                self.maybe_alert_dead_letters()
            except Exception as exc:
                self._alert_failures.failed(exc)
            else:
                self._alert_failures.succeeded()
