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
from fluxmq.core.catalog import QueueEntry
from fluxmq.core.errors import FieldViolation, FluxError, invalid_argument, queue_not_found
from fluxmq.core.partitioner import prepare_append, prepare_encoded_append
from fluxmq.core.producers import ProducerGrant, check_name
from fluxmq.core.queue_config import merge_update, normalize_new
from fluxmq.core.reader import FetchResult, QueueReader
from fluxmq.core.state_machine import (
    AppendResult,
    PurgeResult,
    QueueStateMachine,
    RetentionResult,
    retention_due,
    start_offset,
)
from fluxmq.server.cluster_view import ClusterView
from fluxmq.server.consumers import Consumers, group_key, queue_key
from fluxmq.server.errors import domain_error, node_shutting_down
from fluxmq.server.timer_failures import TimerFailures
from raft import Appended, Shard, ShardError
from storage import Record

log = logging.getLogger(__name__)


def wall_clock_ms() -> int:
    return time.time_ns() // 1_000_000


class PartitionNotifier:
    """Wakes long polls, tails and consumers when a partition grows (key: its log id), a queue
    grows (``consumers.queue_key``) or a group changes (``consumers.group_key``). An event
    exists only while somebody waits on it, so memory is bounded by the number of waiters.

    ``drain()`` (SIGTERM) ends every wait through ``wait`` with NODE_SHUTTING_DOWN, and every
    wait after it at once: a client learns within a moment that it should go to another node,
    instead of holding a call the grace period would cancel. Writes never wait here, so they
    go on."""

    def __init__(self) -> None:
        self._events: dict[Hashable, asyncio.Event] = {}
        self._draining = asyncio.Event()

    @property
    def draining(self) -> bool:
        return self._draining.is_set()

    def drain(self) -> None:
        self._draining.set()

    async def until_draining(self) -> None:
        """Returns once the node drains (SIGTERM)."""
        await self._draining.wait()

    def check_open(self) -> None:
        """Raises NODE_SHUTTING_DOWN once the node drains: for calls about to wait or lease."""
        if self._draining.is_set():
            raise node_shutting_down()

    async def wait(self, events: Sequence[asyncio.Event], timeout_s: float) -> None:
        """Until one of ``events`` is set or ``timeout_s`` passes; raises NODE_SHUTTING_DOWN
        when the node drains before or meanwhile."""
        self.check_open()
        waiters = [asyncio.ensure_future(ev.wait()) for ev in (*events, self._draining)]
        try:
            await asyncio.wait(waiters, timeout=timeout_s, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for w in waiters:
                w.cancel()
        self.check_open()

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
ADDRESS_CHECK_MS = 100  # how soon a new leader records its gRPC address in the shard
ADDRESS_RETRY_MS = 1000  # after a failed attempt (no majority, say): calmer


def not_leader(detail: str, leader_grpc: str | None) -> FluxError:
    """NOT_LEADER naming the leader's gRPC address (ErrorInfo ``leader``; "" = not known yet),
    where a client can send the call instead: never a Raft address, which serves no gRPC."""
    return FluxError(
        "NOT_LEADER",
        detail
        + (f"; the leader serves gRPC at {leader_grpc}" if leader_grpc else "; retry shortly"),
        retriable=True,
        retry_after_ms=200,
        metadata={"leader": leader_grpc or ""},
    )


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
        # Where this node serves gRPC and its Raft address in this shard (``advertise``).
        self._grpc_address: str | None = None
        self._raft_address: str | None = None

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
        if self._raft_address is not None:
            self._tasks.append(asyncio.create_task(self._address_routine(), name="node_address"))

    def drain(self) -> None:
        """The node is shutting down: the calls that wait for messages (long polls, Consume,
        Tail) end now with NODE_SHUTTING_DOWN, and new ones are refused; writes go on."""
        self.notifier.drain()

    async def close(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        await self.shard.close()

    # -- proposing --------------------------------------------------------------------------

    async def catch_up(self) -> bool:
        """Before a lookup answers NOT_FOUND: apply everything committed before the call, so
        that it never denies what another node already acknowledged (read-your-writes across
        nodes). -> True: caught up, rerun the lookup; False: nothing to catch up (the shard's
        only replica holds the latest state).

        A leader catches up too: a new one may not have applied the entries its predecessor
        committed, and one cut off from its majority does not know it is deposed; the barrier
        (an empty entry through the log) settles both. When this replica cannot catch up (no
        leader known, or the barrier did not return within CATCH_UP_TIMEOUT_S) it raises a
        retriable GROUP_UNAVAILABLE: its own state may be stale, so NOT_FOUND would be a guess."""
        if len(self.shard.status().members) <= 1:
            return False
        loop = asyncio.get_running_loop()
        deadline = loop.time() + CATCH_UP_TIMEOUT_S
        if not await self.wait_for_leader(CATCH_UP_TIMEOUT_S):
            raise self._not_caught_up("no leader is known to this replica")
        try:
            await asyncio.wait_for(self.shard.barrier(), max(0.0, deadline - loop.time()))
        except TimeoutError:
            raise self._not_caught_up(
                f"it did not catch up with the leader within {CATCH_UP_TIMEOUT_S:g} s"
            ) from None
        except ShardError as exc:
            raise self._not_caught_up(f"its catch-up failed ({exc})") from exc
        return True

    def _not_caught_up(self, why: str) -> FluxError:
        group = self.shard.shard_id
        return FluxError(
            "GROUP_UNAVAILABLE",
            f"replication group {group!r} cannot confirm its latest state on this node: {why}; "
            "the answer is unknown here, retry",
            retriable=True,
            retry_after_ms=500,
            metadata={"group": group},
        )

    async def wait_for_leader(self, timeout_s: float) -> bool:
        """Until the shard knows a leader (bounded); -> whether it does."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while self.shard.leader is None and not self.shard.is_leader:
            if loop.time() >= deadline:
                return False
            await asyncio.sleep(0.02)
        return True

    # -- the shard's leader, by its gRPC address --------------------------------------------

    def advertise(self, grpc_address: str, raft_address: str) -> None:
        """Before ``start``: this node serves gRPC at ``grpc_address`` and is ``raft_address``
        in this shard. Whenever it leads and the shard's replicated state does not map its Raft
        address to that gRPC address yet, it proposes RecordNodeAddress: so every replica of
        every shard can turn the Raft leader it knows into a gRPC address, with or without etcd
        (the Raft log is the one channel every replica of the shard already trusts, and a
        restarted node with another gRPC port corrects the record the first time it leads)."""
        self._grpc_address = grpc_address
        self._raft_address = raft_address

    def leader_address(self) -> str | None:
        """gRPC address of the shard's leader (None: no leader, or it has not recorded its
        address yet; a single node advertises none)."""
        if self.shard.is_leader:
            return self._grpc_address
        leader = self.shard.leader
        if not leader:
            return None
        recorded = self.state.node_address(leader)
        if recorded is None and self.cluster is not None:
            return self.cluster.grpc_address_of(leader)  # a leader of an older version
        return recorded

    def require_leader(self) -> None:
        """For what only the leader can answer (heartbeats live in its memory)."""
        if not self.shard.is_leader:
            raise not_leader(
                "this node does not lead the queue's replication group"
                + ("" if self.shard.leader else "; no leader is elected yet"),
                self.leader_address(),
            )

    async def maybe_record_address(self) -> bool:
        """Leader only: record this node's gRPC address in the shard unless it already is.
        -> whether a command was proposed."""
        raft, grpc_address = self._raft_address, self._grpc_address
        if raft is None or grpc_address is None or not self.shard.is_leader:
            return False
        if self.state.node_address(raft) == grpc_address:
            return False
        await self.submit(cpb.RecordNodeAddressCmd(raft_address=raft, grpc_address=grpc_address))
        return True

    async def _address_routine(self) -> None:
        # Any failure is logged and retried: a task that died here would leave every replica
        # naming no gRPC leader (no redirect, no trailer) for the rest of the process.
        failures = TimerFailures(f"shard {self.shard.shard_id}: recording the gRPC address", log)
        failing = False
        while True:
            await asyncio.sleep((ADDRESS_RETRY_MS if failing else ADDRESS_CHECK_MS) / 1000)
            try:
                await self.maybe_record_address()
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                failures.failed(exc)
                failing = True
            else:
                failures.succeeded()
                failing = False

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
            if err.reason == "NOT_LEADER":  # the shard names a Raft address: name a gRPC one
                err = not_leader(
                    f"this node does not lead replication group {self.shard.shard_id!r}",
                    self.leader_address(),
                )
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
        self,
        queue: str,
        messages: Sequence[pb.PublishMessage],
        timeout_ms: int,
        producer: pb.ProducerSession | None = None,
        encoded: pb.EncodedRecords | None = None,
    ) -> AppendResult:
        """Store ``messages``, or the records a client ``encoded`` (one of the two)."""
        entry = self.reader.entry(queue)
        cursor, now_ms = self._rr_cursor.get(entry.queue_id, 0), self._clock_ms()
        if encoded is None:
            prepared = prepare_append(
                queue, entry.queue_id, entry.policy, messages, cursor, now_ms, producer
            )
        elif messages:
            raise invalid_argument(
                "encoded", "send messages or encoded records in one request, not both"
            )
        else:
            prepared = prepare_encoded_append(
                queue, entry.queue_id, entry.policy, encoded, cursor, now_ms, producer
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
                    "written: send the same request again (same idempotency keys, or the same "
                    "producer session stamp), which stores it at most once",
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
        metrics.PUBLISHED_MESSAGES.labels(queue).inc(len(result.partitions) - duplicates)
        metrics.PUBLISHED_BYTES.labels(queue).inc(prepared.payload_bytes)
        if duplicates:
            metrics.DUPLICATE_MESSAGES.labels(queue).inc(duplicates)
        return result

    async def init_producer(self, queue: str, producer_name: str) -> ProducerGrant:
        entry = self.reader.entry(queue)
        check_name(producer_name)
        grant = await self.submit(
            cpb.InitProducerCmd(
                queue=queue,
                queue_id=entry.queue_id,
                now_ms=self._clock_ms(),
                producer_name=producer_name,
            )
        )
        assert isinstance(grant, ProducerGrant)
        return grant

    # -- reads ------------------------------------------------------------------------------

    async def fetch(
        self,
        queue: str,
        partition: int,
        offset: int,
        max_messages: int,
        max_bytes: int,
        wait_ms: int,
        batches: bool = False,
    ) -> FetchResult:
        max_messages, max_bytes, wait_ms = validation.fetch_limits(max_messages, max_bytes, wait_ms)
        entry = self.reader.entry(queue)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + wait_ms / 1000

        def read() -> FetchResult:
            return self.reader.fetch(entry, partition, offset, max_messages, max_bytes, batches)

        # The first read validates partition and offset before anything is allocated for a wait.
        result = read()
        while result.empty and (remaining := deadline - loop.time()) > 0:
            # Take the event, then read again: an append between the read and the wait wakes us.
            event = self.notifier.event(keys.log_id(entry.queue_id, partition))
            result = read()
            if not result.empty:
                break
            await self.notifier.wait([event], remaining)
            current = self.reader.entry(queue)
            if current.queue_id != entry.queue_id:  # deleted and re-created meanwhile
                raise queue_not_found(queue)
            result = read()
        self._count_fetched(queue, result)
        return result

    def _count_fetched(self, queue: str, result: FetchResult) -> None:
        if result.records:
            metrics.FETCHED_MESSAGES.labels(queue).inc(len(result.records))
            metrics.FETCHED_BYTES.labels(queue).inc(sum(len(r.value) for r in result.records))
        elif result.batches:
            metrics.FETCHED_MESSAGES.labels(queue).inc(result.messages)
            metrics.FETCHED_BYTES.labels(queue).inc(sum(len(b.data) for b in result.batches))

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
            self.notifier.check_open()  # a draining node ends its tails, even busy ones
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
                        self._count_fetched(queue, res)
            if out:
                yield out
                continue
            await self.notifier.wait(events, 1.0)
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
        failures = TimerFailures("retention pass", log)
        while True:
            await asyncio.sleep(self._retention_interval_ms / 1000)
            if not self.shard.is_leader:
                failures.stand_down()
                continue
            try:
                await self.maybe_apply_retention()
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                failures.failed(exc)
            else:
                failures.succeeded()
