"""A shard's consumer groups on the asyncio side: Lease / Consume / Ack / Nack / Extend and
offsets turned into commands, and the waiting for messages to become ready (long polls,
Consume streams).

The decisions (who gets which message, when a lease is over) are all in fluxmq.core.delivery,
and the checks of a request in fluxmq.core.commands.leases (the same the apply makes); this
module adds waiting, time, metrics and the one-poll-per-consumer rule.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
from collections import deque
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field

from fluxmq import metrics
from fluxmq._pb.v1 import queue_pb2 as pb
from fluxmq.core.catalog import QueueEntry
from fluxmq.core.commands.checkout import checkin_cmd, prepare_checkout, prepare_end_consume
from fluxmq.core.commands.leases import (
    LeaseAsk,
    consume_ask,
    lease_ask,
    prepare_ack,
    prepare_commit_offsets,
    prepare_create_group,
    prepare_delete_group,
    prepare_extend,
    prepare_lease,
    prepare_nack,
    prepare_reset_offsets,
)
from fluxmq.core.commands.results import LeaseResult, SettleResult
from fluxmq.core.delivery import Push
from fluxmq.core.errors import FluxError, queue_not_found
from fluxmq.core.reader import QueueReader
from fluxmq.server.shard.proposer import Proposer
from fluxmq.server.shard.wakeups import Wakeups, group_key, queue_key

IDLE_RECHECK_S = 1.0  # a waiting poll re-checks at least this often (queue deleted, ...)


def _new_session_id() -> int:
    return secrets.randbits(63) or 1


@dataclass(slots=True)
class _Stream:
    """A Consume stream open on this node: what the applies pushed to it, not yet sent."""

    session_id: int
    inbox: deque[Push] = field(default_factory=deque)
    checked_out: bool = False  # its Checkout applied
    ended: bool = False  # checked in by the replicated state (nothing to check in)
    event: asyncio.Event = field(default_factory=asyncio.Event)


class GroupDelivery:
    """Requests turn into commands in ``fluxmq.core.commands.leases`` (``prepare_*``, which
    refuse what the apply would refuse); this proposes them, and waits for messages."""

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
        # (group id, consumer id) -> the Consume stream open here for that consumer.
        self._streams: dict[tuple[int, str], _Stream] = {}
        self._checkins: set[asyncio.Task[None]] = set()

    # -- groups -----------------------------------------------------------------------------

    async def create_group(self, req: pb.CreateGroupRequest) -> pb.Group:
        entry = self._reader.entry(req.queue)
        cmd = prepare_create_group(entry, req, self._clock_ms())
        return await self._proposer.submit(cmd, pb.Group)

    async def delete_group(self, queue: str, group: str) -> None:
        entry = self._reader.entry(queue)
        await self._proposer.propose(prepare_delete_group(self._reader.view, entry, group))

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
        ask, wait_ms = lease_ask(self._reader.view, entry, req)
        # A draining node leases nothing more: the answer could be cut off by the shutdown,
        # and the client finds the messages on another node at once.
        self._wakeups.check_open()
        key = self._claim(entry, ask.group, ask.consumer_id)
        try:
            loop = asyncio.get_running_loop()
            deadline = loop.time() + wait_ms / 1000
            while True:
                result = await self._lease_once(entry, ask, ask.max_messages)
                if result is not None and result.deliveries:
                    return result
                remaining = deadline - loop.time()
                if remaining <= 0:
                    return result or LeaseResult(self._reader.group(entry, req.group).group_id, [])
                await self._wait_ready(entry, req.group, remaining, ask.member.member_id)
        finally:
            self._active.discard(key)

    async def _lease_once(
        self, entry: QueueEntry, ask: LeaseAsk, max_messages: int
    ) -> LeaseResult | None:
        """One Lease command, if one could hand anything out (None: not proposed)."""
        self._ensure_same_queue(entry)
        now_ms = self._clock_ms()
        ready, _ = self._reader.maybe_ready(entry, ask.group, now_ms, ask.member.member_id)
        if not ready:
            return None
        cmd = prepare_lease(self._reader.view, entry, ask, max_messages, now_ms)
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
        """Leases pushed as messages become ready, at most max_in_flight unsettled at once.

        The stream checks its consumer out of the group (one replicated command); from then
        on the applies assign it what becomes ready (``fluxmq.core.commands.checkout``) and
        this sends what they assigned, in the round that committed it. When the stream ends
        its consumer is checked in (the leader's orphan pass does it if this node cannot)."""
        entry = self._reader.entry(req.queue)
        ask, window = consume_ask(self._reader.view, entry, req)
        key = self._claim(entry, ask.group, ask.consumer_id)
        stream = _Stream(_new_session_id())
        slot = (ask.group_id, ask.consumer_id)
        self._streams[slot] = stream  # before the checkout: its first pushes must find it
        wakeups = self._wakeups
        client_gone = False
        try:
            wakeups.check_open()
            cmd = prepare_checkout(
                self._reader.view,
                entry,
                ask.group,
                ask.consumer_id,
                ask.member,
                window,
                ask.lease_ms,
                stream.session_id,
                self._clock_ms(),
            )
            await self._proposer.submit(cmd, int)
            stream.checked_out = True
            while True:
                while stream.inbox:
                    push = stream.inbox.popleft()
                    if push.error is not None:
                        raise push.error
                    if push.end:  # checked in (EndConsume): all it was given is sent
                        stream.ended = True
                        return
                    deliveries = list(push.deliveries)
                    metrics.observe_deliveries(entry.name, deliveries)
                    for i in range(0, len(deliveries), ask.max_messages):
                        yield LeaseResult(ask.group_id, deliveries[i : i + ask.max_messages])
                wakeups.check_open()  # a draining node ends its streams, even busy ones
                self._ensure_same_queue(entry)
                # Pushes come from this replica's applies only while it leads: a deposed
                # leader ends the stream, and the client checks out again at the new one.
                self._proposer.require_leader()
                stream.event.clear()
                await wakeups.wait([stream.event], IDLE_RECHECK_S)
        except (asyncio.CancelledError, GeneratorExit):
            # gRPC cancels the handler when the client cancels, its deadline passes or its
            # connection drops: nobody will settle what this stream sent.
            client_gone = True
            raise
        finally:
            if self._streams.get(slot) is stream:
                del self._streams[slot]
            self._active.discard(key)
            if stream.checked_out and not stream.ended:
                self._checkin_later(
                    entry, ask.group, ask.consumer_id, stream.session_id, release=client_gone
                )

    async def end_consume(self, req: pb.EndConsumeRequest) -> bool:
        """Check the consumer in: its stream (wherever it runs) sends what it was given and
        ends. -> whether it had a stream checked out."""
        entry = self._reader.entry(req.queue)
        cmd = prepare_end_consume(self._reader.view, entry, req.group, req.consumer_id)
        if cmd is None:
            return False
        return await self._proposer.submit(cmd, int) > 0

    @property
    def streaming(self) -> bool:
        """Some Consume stream is open here (read from the apply side, lock-free)."""
        return bool(self._streams)

    def pushed(self, pushes: Sequence[Push]) -> None:
        """What a commit assigned to checked-out consumers: to their streams, if open here."""
        for push in pushes:
            stream = self._streams.get((push.group_id, push.consumer_id))
            if stream is not None and stream.session_id == push.session_id:
                stream.inbox.append(push)
                stream.event.set()

    def live_sessions(self) -> set[int]:
        """The session ids of the Consume streams open here."""
        return {s.session_id for s in self._streams.values()}

    def _checkin_later(
        self, entry: QueueEntry, group: str, consumer_id: str, session: int, *, release: bool
    ) -> None:
        """``release``: the client went away, its leases end now (RabbitMQ requeues a closed
        channel's unacked messages). Not on a node that drains or no longer leads: its
        clients go on elsewhere and still settle what they hold."""
        if not self._proposer.is_leader or self._wakeups.draining:
            return  # the leader's orphan pass checks the consumer in (without releasing)
        cmd = checkin_cmd(
            entry, [(group, consumer_id, session)], release=release, now_ms=self._clock_ms()
        )

        async def checkin() -> None:
            # Best effort: when it cannot be done (leadership lost meanwhile, node stopping),
            # the leader's orphan pass checks the consumer in.
            with contextlib.suppress(Exception):
                await self._proposer.propose(cmd)

        task = asyncio.get_running_loop().create_task(checkin(), name="checkin")
        self._checkins.add(task)
        task.add_done_callback(self._checkins.discard)

    # -- settle -----------------------------------------------------------------------------

    async def ack(self, req: pb.AckRequest) -> SettleResult:
        entry = self._reader.entry(req.queue)
        cmd = prepare_ack(self._reader.view, entry, req, self._clock_ms())
        result = await self._proposer.submit(cmd, SettleResult)
        metrics.ACKED_MESSAGES.labels(req.queue).inc(result.statuses.count(pb.RECEIPT_STATUS_ACKED))
        return result

    async def nack(self, req: pb.NackRequest) -> SettleResult:
        entry = self._reader.entry(req.queue)
        cmd = prepare_nack(self._reader.view, entry, req, self._clock_ms())
        result = await self._proposer.submit(cmd, SettleResult)
        metrics.NACKED_MESSAGES.labels(req.queue).inc(
            result.statuses.count(pb.RECEIPT_STATUS_NACKED)
        )
        return result

    async def extend(self, req: pb.ExtendLeaseRequest) -> SettleResult:
        entry = self._reader.entry(req.queue)
        cmd = prepare_extend(self._reader.view, entry, req, self._clock_ms())
        return await self._proposer.submit(cmd, SettleResult)

    # -- offsets ----------------------------------------------------------------------------

    async def commit_offsets(self, req: pb.CommitOffsetsRequest) -> pb.OffsetsResponse:
        entry = self._reader.entry(req.queue)
        await self._proposer.propose(prepare_commit_offsets(self._reader.view, entry, req))
        return self._reader.offsets(entry, req.group)

    async def reset_offsets(self, req: pb.ResetOffsetsRequest) -> pb.OffsetsResponse:
        entry = self._reader.entry(req.queue)
        cmd = prepare_reset_offsets(self._reader.view, entry, req)
        if req.dry_run:
            return self._reader.reset_preview(entry, req.group, cmd.partitions, cmd.to)
        await self._proposer.propose(cmd)
        return self._reader.offsets(entry, req.group)
