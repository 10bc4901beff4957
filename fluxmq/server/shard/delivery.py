"""A shard's consumer groups on the asyncio side: Lease / Consume / Ack / Nack / Extend and
offsets turned into commands, and the waiting for messages to become ready (long polls,
Consume streams).

The decisions (who gets which message, when a lease is over) are all in fluxmq.core.delivery;
this module adds waiting, time and the one-poll-per-consumer rule.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Sequence

from fluxmq import metrics
from fluxmq._pb.internal import commands_pb2 as cpb
from fluxmq._pb.v1 import queue_pb2 as pb
from fluxmq.core import limits, validation
from fluxmq.core import membership as msh
from fluxmq.core.catalog import QueueEntry
from fluxmq.core.errors import FluxError, invalid_argument, queue_not_found
from fluxmq.core.reader import QueueReader
from fluxmq.core.state_machine import (
    LeaseResult,
    SettleResult,
    foreign_receipt,
    no_dead_letter_queue,
)
from fluxmq.server.shard.proposer import Proposer
from fluxmq.server.shard.wakeups import Wakeups, group_key, queue_key

IDLE_RECHECK_S = 1.0  # a waiting poll re-checks at least this often (queue deleted, ...)
NACK_REASON_CHARS_MAX = 1024


class GroupDelivery:
    def __init__(
        self,
        proposer: Proposer,
        reader: QueueReader,
        wakeups: Wakeups,
        clock_ms: Callable[[], int],
    ) -> None:
        self._proposer = proposer
        self._reader = reader
        self._wakeups = wakeups
        self._clock_ms = clock_ms
        # (queue_id, group, consumer_id) of every Lease long poll and Consume stream running:
        # one at a time per consumer, so two workers sharing an id are caught, not interleaved.
        self._active: set[tuple[int, str, str]] = set()

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
            now_ms=self._clock_ms(),
        )
        return await self._proposer.submit(cmd, pb.Group)

    async def delete_group(self, queue: str, group: str) -> None:
        entry = self._reader.entry(queue)
        self._reader.group(entry, group)
        await self._proposer.propose(
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
        self._wakeups.check_open()
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

    def settle_ref(
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
        now_ms = self._clock_ms()
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
        result = await self._proposer.submit(cmd, LeaseResult)
        if result.deliveries:
            metrics.observe_deliveries(entry.name, result.deliveries)
        return result

    def _ensure_same_queue(self, entry: QueueEntry) -> None:
        current = self._reader.catalog.get(entry.name)
        if current is None or current.queue_id != entry.queue_id:
            raise queue_not_found(entry.name)

    async def _wait_ready(
        self, entry: QueueEntry, group: str, timeout_s: float, member_id: str = ""
    ) -> None:
        """Until the queue grows, the group changes, a scheduled message comes due, or
        ``timeout_s`` passes. The events are taken before the check, so no wakeup is lost.
        Raises NODE_SHUTTING_DOWN when the node drains (before or meanwhile)."""
        g = self._reader.group(entry, group)
        wakeups = self._wakeups
        wakeups.check_open()  # draining: no more leases, even of messages ready right now
        events = [wakeups.event(queue_key(entry.queue_id)), wakeups.event(group_key(g.group_id))]
        now_ms = self._clock_ms()
        ready, due_ms = self._reader.maybe_ready(entry, group, now_ms, member_id)
        if ready:
            return
        timeout_s = min(timeout_s, IDLE_RECHECK_S)
        if due_ms is not None:
            timeout_s = min(timeout_s, max(due_ms - now_ms, 1) / 1000)
        await wakeups.wait(events, timeout_s)

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
        wakeups = self._wakeups
        try:
            while True:
                wakeups.check_open()  # a draining node ends its streams, even busy ones
                self._ensure_same_queue(entry)
                room = window - self._reader.in_flight(entry, req.group, consumer)
                if room <= 0:
                    # Full: wait for an ack, nack or expiry of this group.
                    event = wakeups.event(group_key(g.group_id))
                    if window - self._reader.in_flight(entry, req.group, consumer) <= 0:
                        await wakeups.wait([event], IDLE_RECHECK_S)
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

    def check_receipts(
        self, entry: QueueEntry, group: str, receipts: Sequence[pb.Receipt], path: str
    ) -> None:
        validation.receipts_count(len(receipts), path)
        g = self._reader.group(entry, group)
        for i, r in enumerate(receipts):
            if r.group_id != g.group_id:
                raise foreign_receipt(g, f"{path}[{i}]")

    def ack_command(self, req: pb.AckRequest, now_ms: int) -> cpb.AckCmd:
        """An Ack's command, checked (field paths relative to ``req``)."""
        entry = self._reader.entry(req.queue)
        member = self.settle_ref(entry, req.group, req.member_id, req.generation_id)
        self.check_receipts(entry, req.group, req.receipts, "receipts")
        return cpb.AckCmd(
            queue=req.queue,
            queue_id=entry.queue_id,
            group=req.group,
            receipts=req.receipts,
            now_ms=now_ms,
            member=member,
        )

    async def ack(self, req: pb.AckRequest) -> SettleResult:
        cmd = self.ack_command(req, self._clock_ms())
        result = await self._proposer.submit(cmd, SettleResult)
        metrics.ACKED_MESSAGES.labels(req.queue).inc(result.statuses.count(pb.RECEIPT_STATUS_ACKED))
        return result

    async def nack(self, req: pb.NackRequest) -> SettleResult:
        entry = self._reader.entry(req.queue)
        self.check_receipts(entry, req.group, req.receipts, "receipts")
        if req.retry_after_ms and req.retry_at_ms:
            raise invalid_argument("retry_at_ms", "set retry_after_ms or retry_at_ms, not both")
        if req.dead and (req.retry_after_ms or req.retry_at_ms):
            raise invalid_argument("dead", "a dead letter is not retried: drop retry_after_ms")
        if req.dead and entry.policy.dead_letter_queue is None:
            raise no_dead_letter_queue(req.queue)
        if len(req.reason) > NACK_REASON_CHARS_MAX:
            raise invalid_argument("reason", f"at most {NACK_REASON_CHARS_MAX} characters")
        now_ms = self._clock_ms()
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
            member=self.settle_ref(entry, req.group, req.member_id, req.generation_id),
        )
        result = await self._proposer.submit(cmd, SettleResult)
        metrics.NACKED_MESSAGES.labels(req.queue).inc(
            result.statuses.count(pb.RECEIPT_STATUS_NACKED)
        )
        return result

    async def extend(self, req: pb.ExtendLeaseRequest) -> SettleResult:
        entry = self._reader.entry(req.queue)
        self.check_receipts(entry, req.group, req.receipts, "receipts")
        cmd = cpb.ExtendLeaseCmd(
            queue=req.queue,
            queue_id=entry.queue_id,
            group=req.group,
            receipts=req.receipts,
            now_ms=self._clock_ms(),
            lease_ms=validation.lease_ms(req.lease_ms, entry.policy.lease_ms),
            member=self.settle_ref(entry, req.group, req.member_id, req.generation_id),
        )
        return await self._proposer.submit(cmd, SettleResult)

    # -- offsets ----------------------------------------------------------------------------

    async def commit_offsets(self, req: pb.CommitOffsetsRequest) -> pb.OffsetsResponse:
        entry = self._reader.entry(req.queue)
        self._reader.group(entry, req.group)
        if not req.offsets:
            raise invalid_argument("offsets", "name at least one partition")
        await self._proposer.propose(
            cpb.CommitOffsetsCmd(
                queue=req.queue,
                queue_id=entry.queue_id,
                group=req.group,
                offsets=req.offsets,
                member=self.settle_ref(entry, req.group, req.member_id, req.generation_id),
            )
        )
        return self._reader.offsets(entry, req.group)

    async def reset_offsets(self, req: pb.ResetOffsetsRequest) -> pb.OffsetsResponse:
        entry = self._reader.entry(req.queue)
        self._reader.group(entry, req.group)
        validation.start_position(req.to, "to")
        await self._proposer.propose(
            cpb.ResetOffsetsCmd(
                queue=req.queue,
                queue_id=entry.queue_id,
                group=req.group,
                partitions=req.partitions,
                to=req.to,
            )
        )
        return self._reader.offsets(entry, req.group)
