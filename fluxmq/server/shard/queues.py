"""A shard's queues: create, update, delete, purge, publish and producer sessions."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from fluxmq import metrics
from fluxmq._pb.internal import commands_pb2 as cpb
from fluxmq._pb.v1 import queue_pb2 as pb
from fluxmq.core.commands.results import AppendResult, PurgeResult
from fluxmq.core.errors import FluxError, invalid_argument
from fluxmq.core.partitioner import PreparedAppend, prepare_append, prepare_encoded_append
from fluxmq.core.producers import ProducerGrant, check_name
from fluxmq.core.queue_config import merge_update, normalize_new
from fluxmq.core.reader import QueueReader
from fluxmq.server.shard.proposer import Proposer
from raft import Appended

if TYPE_CHECKING:
    from fluxmq.server.cluster_view import ClusterView


class Queues:
    def __init__(
        self,
        proposer: Proposer,
        reader: QueueReader,
        clock_ms: Callable[[], int],
        directory: ClusterView | None,
    ) -> None:
        self._proposer = proposer
        self._reader = reader
        self._clock_ms = clock_ms
        self._directory = directory
        self._rr_cursor: dict[int, int] = {}  # queue id -> where round-robin goes next

    async def create_queue(self, config: pb.QueueConfig) -> pb.Queue:
        normalized = normalize_new(config)
        self._proposer.check_replication(normalized)
        cmd = cpb.CreateQueueCmd(config=normalized, now_ms=self._clock_ms())
        return await self._proposer.submit(cmd, pb.Queue)

    async def update_queue(self, patch: pb.QueueConfig, paths: list[str]) -> pb.Queue:
        entry = self._reader.entry(patch.name, "config.name")
        merged = merge_update(entry.queue.config, patch, paths)
        self._proposer.check_replication(merged)
        cmd = cpb.UpdateQueueCmd(
            config=merged,
            now_ms=self._clock_ms(),
            queue_id=entry.queue_id,
            expected_updated_at_ms=entry.queue.updated_at_ms,
        )
        return await self._proposer.submit(cmd, pb.Queue)

    async def delete_queue(self, name: str) -> None:
        self._reader.entry(name, "name")
        if self._directory is not None:
            await self._directory.ensure_reachable("DeleteQueue")
        await self._proposer.propose(cpb.DeleteQueueCmd(name=name, now_ms=self._clock_ms()))
        if self._directory is not None:
            await self._directory.unplace_queue(name)

    async def purge_queue(self, name: str, scope: int, destructive: bool) -> PurgeResult:
        entry = self._reader.entry(name, "name")
        if scope not in pb.PurgeScope.values():
            raise invalid_argument("scope", f"unknown purge scope {scope}")
        cmd = cpb.PurgeCmd(
            name=name,
            queue_id=entry.queue_id,
            now_ms=self._clock_ms(),
            scope=scope,  # type: ignore[arg-type]
            destructive=destructive,
        )
        return await self._proposer.submit(cmd, PurgeResult)

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
        entry = self._reader.entry(queue)
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
        self._proposer.check_in_sync(entry.policy.min_in_sync)
        try:
            result = await self._proposer.propose(
                prepared.command,
                min(timeout_ms, entry.policy.ack_timeout_ms),
                on_append=entry.policy.replication_async,
            )
        except FluxError as err:
            if err.reason == "OUTCOME_UNKNOWN":
                raise replication_timeout() from err
            raise
        if isinstance(result, Appended):
            result = _pending(prepared)
        if not isinstance(result, AppendResult):
            raise AssertionError(f"an append answered {type(result).__name__}")
        _count_published(queue, result, prepared.payload_bytes)
        return result

    async def init_producer(self, queue: str, producer_name: str) -> ProducerGrant:
        entry = self._reader.entry(queue)
        check_name(producer_name)
        cmd = cpb.InitProducerCmd(
            queue=queue,
            queue_id=entry.queue_id,
            now_ms=self._clock_ms(),
            producer_name=producer_name,
        )
        return await self._proposer.submit(cmd, ProducerGrant)


def replication_timeout() -> FluxError:
    return FluxError(
        "REPLICATION_TIMEOUT",
        "the write was not confirmed by a majority within the queue's replication.ack_timeout "
        "or the request timeout; it may or may not have been written: send the same request "
        "again (same idempotency keys, or the same producer session stamp), which stores it at "
        "most once",
        retriable=True,
        retry_after_ms=200,
    )


def _pending(prepared: PreparedAppend) -> AppendResult:
    """The answer to an append acknowledged once in the leader's log (replication.async)."""
    n = len(prepared.command.partitions)
    return AppendResult(
        partitions=list(prepared.command.partitions),
        offsets=[0] * n,
        timestamps_ms=[0] * n,
        duplicates=[False] * n,
        high_watermarks={},
        pending=True,
    )


def _count_published(queue: str, result: AppendResult, payload_bytes: int) -> None:
    duplicates = sum(result.duplicates)
    metrics.PUBLISHED_MESSAGES.labels(queue).inc(len(result.partitions) - duplicates)
    metrics.PUBLISHED_BYTES.labels(queue).inc(payload_bytes)
    if duplicates:
        metrics.DUPLICATE_MESSAGES.labels(queue).inc(duplicates)
