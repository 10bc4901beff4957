"""The node's queue operations on the asyncio side: turns requests into commands, proposes them
to the shard, waits for data (long polls, tails), and times the leader's periodic commands.

Pure policy lives in fluxmq.core; this module only adds I/O and time.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Callable, Hashable, Iterable, Sequence

from fluxmq import metrics
from fluxmq._pb.internal import commands_pb2 as cpb
from fluxmq._pb.v1 import queue_pb2 as pb
from fluxmq.core import commands, keys, validation
from fluxmq.core.errors import FieldViolation, FluxError, invalid_argument, queue_not_found
from fluxmq.core.partitioner import prepare_append
from fluxmq.core.queue_config import merge_update, normalize_new
from fluxmq.core.reader import FetchResult, QueueReader
from fluxmq.core.state_machine import (
    AppendResult,
    PurgeResult,
    QueueEntry,
    QueueStateMachine,
    RetentionResult,
    retention_due,
    start_offset,
)
from fluxmq.server.cluster_view import ClusterView
from fluxmq.server.consumers import Consumers, group_key, queue_key
from fluxmq.server.errors import domain_error
from raft import Appended, Shard, ShardError
from storage import Record

log = logging.getLogger(__name__)


def wall_clock_ms() -> int:
    return time.time_ns() // 1_000_000


class PartitionNotifier:
    """Wakes long polls, tails and consumers when a partition grows (key: its log id), a queue
    grows (``consumers.queue_key``) or a group changes (``consumers.group_key``). An event
    exists only while somebody waits on it, so memory is bounded by the number of waiters."""

    def __init__(self) -> None:
        self._events: dict[Hashable, asyncio.Event] = {}

    def event(self, key: Hashable) -> asyncio.Event:
        ev = self._events.get(key)
        if ev is None:
            ev = self._events[key] = asyncio.Event()
        return ev

    def notify(self, keys_: Iterable[Hashable]) -> None:
        for key in keys_:
            ev = self._events.pop(key, None)
            if ev is not None:
                ev.set()

    def committed(self, log_ids: Sequence[int], group_ids: Sequence[int]) -> None:
        self.notify(log_ids)
        self.notify({queue_key(log_id >> keys.PARTITION_BITS) for log_id in log_ids})
        self.notify(group_key(g) for g in group_ids)


CATCH_UP_TIMEOUT_S = 2.0


class Broker:
    def __init__(
        self,
        state: QueueStateMachine,
        shard: Shard,
        *,
        clock_ms: Callable[[], int] = wall_clock_ms,
        retention_interval_ms: int = 1000,
    ) -> None:
        self.state = state
        self.reader = QueueReader(state)
        self.shard = shard
        self.notifier = PartitionNotifier()
        self._clock_ms = clock_ms
        self._retention_interval_ms = retention_interval_ms
        self._rr_cursor: dict[int, int] = {}
        self._tasks: list[asyncio.Task[None]] = []
        self.consumers = Consumers(self)
        # Cluster metadata (placement, directory); None on a node without a metadata store.
        self.cluster: ClusterView | None = None

    def now_ms(self) -> int:
        return self._clock_ms()

    # -- lifecycle --------------------------------------------------------------------------

    async def start(self) -> None:
        loop = asyncio.get_running_loop()

        def on_commit(log_ids: list[int], group_ids: list[int]) -> None:
            loop.call_soon_threadsafe(self.notifier.committed, log_ids, group_ids)

        self.state.commit_listener = on_commit
        await self.shard.start()
        self._tasks.append(asyncio.create_task(self._retention_routine(), name="retention"))
        self._tasks.append(
            asyncio.create_task(self.consumers.expire_routine(), name="expire_leases")
        )
        self._tasks.append(
            asyncio.create_task(self.consumers.alert_routine(), name="dead_letter_alerts")
        )

    async def close(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        await self.shard.close()

    # -- proposing --------------------------------------------------------------------------

    async def catch_up(self) -> bool:
        """On a follower: apply everything committed so far, so that a lookup that failed on
        state not replicated here yet can be retried. -> False when there is nothing to do
        (this replica leads: its state is the latest)."""
        if self.shard.is_leader or self.shard.leader is None:
            return False  # leading, or cut off: the local state is all there is
        try:
            await asyncio.wait_for(self.shard.barrier(), CATCH_UP_TIMEOUT_S)
        except (TimeoutError, ShardError):
            return False  # could not catch up in time: answer from the local state
        return True

    async def wait_for_leader(self, timeout_s: float) -> bool:
        """Until the shard knows a leader (bounded); -> whether it does."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while self.shard.leader is None and not self.shard.is_leader:
            if loop.time() >= deadline:
                return False
            await asyncio.sleep(0.02)
        return True

    def leader_address(self) -> str | None:
        """gRPC address of the shard's leader (None: unknown, or no directory)."""
        return self.cluster.leader_grpc_address() if self.cluster is not None else None

    def require_leader(self) -> None:
        """For what only the leader can answer (heartbeats live in its memory)."""
        if not self.shard.is_leader:
            leader = self.shard.leader
            raise FluxError(
                "NOT_LEADER",
                "this node does not lead the queue's replication group"
                + (f"; the leader is {leader}" if leader else "; no leader is elected yet"),
                retriable=True,
                retry_after_ms=200,
                metadata={"leader": leader or ""},
            )

    async def submit(
        self, cmd: commands.Command, timeout_ms: int | None = None, *, on_append: bool = False
    ) -> object:
        loop = asyncio.get_running_loop()
        deadline = None if timeout_ms is None else loop.time() + timeout_ms / 1000
        try:
            result = await self.shard.propose(commands.encode(cmd), deadline, on_append=on_append)
        except Exception as exc:
            err = domain_error(exc)
            if err is None:
                raise
            raise err from exc
        if isinstance(result, FluxError):
            raise result
        return result

    # -- queues -----------------------------------------------------------------------------

    def check_replication(self, config: pb.QueueConfig, prefix: str = "config") -> None:
        """The queue's replication must fit the shard it is placed on (this node's shard)."""
        replicas = len(self.shard.status().members)
        rep = config.replication
        if rep.factor and rep.factor != replicas:
            raise FluxError(
                "REPLICATION_UNSATISFIABLE",
                f"replication.factor {rep.factor} cannot be placed: this node's shard has "
                f"{replicas} replica(s) (0 means all of them)",
                violations=(
                    FieldViolation(f"{prefix}.replication.factor", f"must be 0 or {replicas}"),
                ),
            )
        if rep.min_in_sync > replicas:
            raise FluxError(
                "REPLICATION_UNSATISFIABLE",
                f"replication.min_in_sync {rep.min_in_sync} exceeds the shard's {replicas} "
                "replica(s)",
                violations=(
                    FieldViolation(f"{prefix}.replication.min_in_sync", f"at most {replicas}"),
                ),
            )

    def check_in_sync(self, min_in_sync: int) -> None:
        if not min_in_sync:
            return  # a majority: Raft's commit rule already waits for it
        in_sync = self.shard.status().in_sync
        if in_sync < min_in_sync:
            raise FluxError(
                "NOT_ENOUGH_REPLICAS",
                f"{in_sync} replica(s) in sync, the queue's replication.min_in_sync is "
                f"{min_in_sync}: nothing was written",
                retriable=True,
                retry_after_ms=500,
            )

    async def create_queue(self, config: pb.QueueConfig) -> pb.Queue:
        normalized = normalize_new(config)
        self.check_replication(normalized)
        cmd = cpb.CreateQueueCmd(config=normalized, now_ms=self._clock_ms())
        queue = await self.submit(cmd)
        assert isinstance(queue, pb.Queue)
        return queue

    async def update_queue(self, patch: pb.QueueConfig, paths: list[str]) -> pb.Queue:
        entry = self.reader.entry(patch.name, "config.name")
        merged = merge_update(entry.queue.config, patch, paths)
        self.check_replication(merged)
        cmd = cpb.UpdateQueueCmd(
            config=merged,
            now_ms=self._clock_ms(),
            queue_id=entry.queue_id,
            expected_updated_at_ms=entry.queue.updated_at_ms,
        )
        queue = await self.submit(cmd)
        assert isinstance(queue, pb.Queue)
        return queue

    async def delete_queue(self, name: str) -> None:
        self.reader.entry(name, "name")
        if self.cluster is not None:
            await self.cluster.ensure_reachable("DeleteQueue")
        await self.submit(cpb.DeleteQueueCmd(name=name, now_ms=self._clock_ms()))
        if self.cluster is not None:
            await self.cluster.unplace_queue(name)

    async def purge_queue(self, name: str, scope: int, destructive: bool) -> PurgeResult:
        entry = self.reader.entry(name, "name")
        if scope not in pb.PurgeScope.values():
            raise invalid_argument("scope", f"unknown purge scope {scope}")
        purged = await self.submit(
            cpb.PurgeCmd(
                name=name,
                queue_id=entry.queue_id,
                now_ms=self._clock_ms(),
                scope=scope,  # type: ignore[arg-type]
                destructive=destructive,
            )
        )
        assert isinstance(purged, PurgeResult)
        return purged

    # -- publish ----------------------------------------------------------------------------

    async def publish(
        self, queue: str, messages: Sequence[pb.PublishMessage], timeout_ms: int
    ) -> AppendResult:
        entry = self.reader.entry(queue)
        prepared = prepare_append(
            queue,
            entry.queue_id,
            entry.policy,
            messages,
            self._rr_cursor.get(entry.queue_id, 0),
            self._clock_ms(),
        )
        self._rr_cursor[entry.queue_id] = prepared.cursor
        self.check_in_sync(entry.policy.min_in_sync)
        try:
            result = await self.submit(
                prepared.command,
                min(timeout_ms, entry.policy.ack_timeout_ms),
                on_append=entry.policy.replication_async,
            )
        except FluxError as err:
            if err.reason == "OUTCOME_UNKNOWN":
                raise FluxError(
                    "REPLICATION_TIMEOUT",
                    "the write was not confirmed by a majority within the queue's "
                    "replication.ack_timeout or the request timeout; it may or may not have been "
                    "written: retry with the same idempotency keys",
                    retriable=True,
                    retry_after_ms=200,
                ) from err
            raise
        if isinstance(result, Appended):
            n = len(prepared.command.partitions)
            result = AppendResult(
                partitions=list(prepared.command.partitions),
                offsets=[0] * n,
                timestamps_ms=[0] * n,
                duplicates=[False] * n,
                high_watermarks={},
                pending=True,
            )
        assert isinstance(result, AppendResult)
        duplicates = sum(result.duplicates)
        metrics.PUBLISHED_MESSAGES.labels(queue).inc(len(messages) - duplicates)
        metrics.PUBLISHED_BYTES.labels(queue).inc(prepared.payload_bytes)
        if duplicates:
            metrics.DUPLICATE_MESSAGES.labels(queue).inc(duplicates)
        return result

    # -- reads ------------------------------------------------------------------------------

    async def fetch(
        self,
        queue: str,
        partition: int,
        offset: int,
        max_messages: int,
        max_bytes: int,
        wait_ms: int,
    ) -> FetchResult:
        max_messages, max_bytes, wait_ms = validation.fetch_limits(max_messages, max_bytes, wait_ms)
        entry = self.reader.entry(queue)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + wait_ms / 1000
        # The first read validates partition and offset before anything is allocated for a wait.
        result = self.reader.fetch(entry, partition, offset, max_messages, max_bytes)
        while not result.records and (remaining := deadline - loop.time()) > 0:
            # Take the event, then read again: an append between the read and the wait wakes us.
            event = self.notifier.event(keys.log_id(entry.queue_id, partition))
            result = self.reader.fetch(entry, partition, offset, max_messages, max_bytes)
            if result.records:
                break
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(event.wait(), remaining)
            current = self.reader.entry(queue)
            if current.queue_id != entry.queue_id:  # deleted and re-created meanwhile
                raise queue_not_found(queue)
            result = self.reader.fetch(entry, partition, offset, max_messages, max_bytes)
        self._count_fetched(queue, result.records)
        return result

    def _count_fetched(self, queue: str, records: list[Record]) -> None:
        if records:
            metrics.FETCHED_MESSAGES.labels(queue).inc(len(records))
            metrics.FETCHED_BYTES.labels(queue).inc(sum(len(r.value) for r in records))

    def start_offsets(
        self, entry: QueueEntry, partitions: Sequence[int], start: pb.StartPosition
    ) -> dict[int, int]:
        with self.state.store.read() as txn:
            return {
                p: start_offset(txn.log(keys.log_id(entry.queue_id, p)), start) for p in partitions
            }

    async def tail(
        self, queue: str, partitions: Sequence[int], start: pb.StartPosition, batch_max: int
    ) -> AsyncIterator[list[tuple[int, list[Record]]]]:
        """Yields [(partition, records)] as records arrive, forever (until cancelled)."""
        entry = self.reader.entry(queue)
        parts = list(partitions) or list(range(entry.policy.partitions))
        for i, p in enumerate(parts):
            if p >= entry.policy.partitions:
                raise FluxError(
                    "PARTITION_OUT_OF_RANGE",
                    f"queue {queue!r} has partitions 0..{entry.policy.partitions - 1}",
                    metadata={"field": f"partitions[{i}]"},
                )
        offsets = self.start_offsets(entry, parts, start)
        while True:
            events = [self.notifier.event(keys.log_id(entry.queue_id, p)) for p in parts]
            out = []
            for p in parts:
                wm = self.reader.watermarks(entry, p)
                # Retention may have removed what we had not read yet: skip ahead, as Kafka's
                # auto.offset.reset=earliest does.
                offsets[p] = max(offsets[p], wm.low)
                if offsets[p] < wm.high:
                    try:
                        res = self.reader.fetch(entry, p, offsets[p], batch_max, 4 * 1024 * 1024)
                    except FluxError as err:
                        if err.reason != "OFFSET_OUT_OF_RANGE":
                            raise
                        continue  # retention moved low since we looked: skip ahead next round
                    if res.records:
                        offsets[p] = res.next_offset
                        out.append((p, res.records))
                        self._count_fetched(queue, res.records)
            if out:
                yield out
                continue
            waiters = [asyncio.ensure_future(ev.wait()) for ev in events]
            try:
                await asyncio.wait(waiters, timeout=1.0, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for w in waiters:
                    w.cancel()
            if self.reader.entry(queue).queue_id != entry.queue_id:
                raise queue_not_found(queue)  # deleted (and maybe re-created): this tail is over

    def seek(self, queue: str, partition: int, timestamp_ms: int) -> int:
        return self.reader.offset_for_timestamp(self.reader.entry(queue), partition, timestamp_ms)

    # -- leader timers ----------------------------------------------------------------------

    async def maybe_apply_retention(self) -> RetentionResult | None:
        """Propose ApplyRetention when it would change something (checked read-only first)."""
        now_ms = self._clock_ms()
        with self.state.store.read() as txn:
            with self.state.lock:
                due = retention_due(txn, self.state.catalog, now_ms, self.state.consumed_floor)
            if not due:
                return None
        result = await self.submit(cpb.ApplyRetentionCmd(now_ms=now_ms))
        assert isinstance(result, RetentionResult)
        if result.removed_records:
            metrics.RETENTION_REMOVED_MESSAGES.inc(result.removed_records)
        return result

    async def _retention_routine(self) -> None:
        while True:
            await asyncio.sleep(self._retention_interval_ms / 1000)
            if not self.shard.is_leader:
                continue
            try:
                await self.maybe_apply_retention()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("retention pass failed; retrying on the next tick")
