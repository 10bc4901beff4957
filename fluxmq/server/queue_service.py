"""QueueService: protobuf in, protobuf out. All the work is in the shard runtime and fluxmq.core."""

from __future__ import annotations

import asyncio
import contextlib
import functools
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from typing import Any, cast

import grpc

from fluxmq._pb.v1 import queue_pb2 as pb
from fluxmq._pb.v1 import queue_pb2_grpc as pb_grpc
from fluxmq.core import validation
from fluxmq.core.commands.results import AppendResult, LeaseResult, SettleResult
from fluxmq.core.errors import FieldViolation, FluxError, invalid_argument, nested
from fluxmq.core.producers import IDLE_EXPIRY_MS
from fluxmq.core.queue_config import normalize_new
from fluxmq.core.reader import page_token_after
from fluxmq.server.errors import domain_error, internal_error, status_code, to_rpc_status
from fluxmq.server.forwarding import was_forwarded, was_targeted
from fluxmq.server.guard import current_identity
from fluxmq.server.interceptors import request_id_var
from fluxmq.server.router import Router, current_shard, shard_unreachable
from fluxmq.server.scoping import Scope, caller_error, stored_queue
from fluxmq.server.shard.runtime import ShardRuntime
from fluxmq.server.shard_process.siblings import (
    NameLocks,
    home_process,
    local_shard_id,
    local_shard_index,
)
from storage import Record

PUBLISH_STREAM_IN_FLIGHT_MAX = 64  # requests of one PublishStream being processed at once


def _fill_records(out: Any, partition: int, records: list[Record], single: bool = False) -> None:
    """Records into a repeated Record field (or, with ``single``, into one Record message)."""
    for r in records:
        if single:
            rec = out
            rec.partition, rec.offset, rec.timestamp_ms = partition, r.offset, r.timestamp_ms
            rec.value = r.value
        else:
            rec = out.add(
                partition=partition, offset=r.offset, timestamp_ms=r.timestamp_ms, value=r.value
            )
        if r.key is not None:
            rec.key = r.key
        if r.headers:
            rec.headers.update(r.headers)
        if r.idempotency_key:
            rec.idempotency_key = r.idempotency_key


def _end(
    latest: dict[str, asyncio.Future[None]], queue: str, ended: asyncio.Future[None], _: object
) -> None:
    """A PublishStream request for ``queue`` ended: the next one for it may be forwarded."""
    ended.set_result(None)
    if latest.get(queue) is ended:
        del latest[queue]


def _published_batch(result: AppendResult) -> pb.PublishedBatch:
    """The answer to a request of encoded records: they are one partition's, stored together
    (or, for a session's retry, remembered together), so one range says where each went."""
    count = len(result.partitions)
    if result.pending:
        return pb.PublishedBatch(partition=result.partitions[0], count=count, pending=True)
    base = result.offsets[0]
    assert result.offsets[-1] == base + count - 1, "an encoded request's records are contiguous"
    return pb.PublishedBatch(
        partition=result.partitions[0],
        base_offset=base,
        count=count,
        timestamp_ms=result.timestamps_ms[0],
        duplicate=result.duplicates[0],
    )


def _publish_response(result: AppendResult, encoded: bool = False) -> pb.PublishResponse:
    if encoded:
        return pb.PublishResponse(batch=_published_batch(result))
    resp = pb.PublishResponse()
    add = resp.results.add
    if result.pending:
        for partition in result.partitions:
            add(partition=partition, pending=True)
        return resp
    for partition, offset, ts, duplicate in zip(
        result.partitions, result.offsets, result.timestamps_ms, result.duplicates, strict=True
    ):
        if duplicate:
            add(partition=partition, offset=offset, timestamp_ms=ts, duplicate=True)
        else:
            add(partition=partition, offset=offset, timestamp_ms=ts)
    return resp


StreamHandler = Callable[["QueueService", Any, Any], AsyncIterator[Any]]


def _holds_stream_slot(handler: StreamHandler) -> StreamHandler:
    """A stream takes one of the node's stream slots for its life (streams_max): beyond them it
    is refused at once with RESOURCE_EXHAUSTED / TOO_MANY_STREAMS, before any work."""

    async def wrapper(self: QueueService, request: Any, context: Any) -> AsyncGenerator[Any, None]:
        with self._forwarder.streams.hold():
            stream = handler(self, request, context)
            try:
                async for item in stream:
                    yield item
            finally:
                with contextlib.suppress(Exception):
                    await stream.aclose()  # type: ignore[attr-defined]

    wrapper.__name__ = handler.__name__
    wrapper.__doc__ = handler.__doc__
    return wrapper


class QueueService(pb_grpc.QueueServiceServicer):
    """Served by the shard the router resolved each call to (``current_shard``; the node's
    first shard when there is only one)."""

    def __init__(self, router: Router) -> None:
        self._router = router
        self._forwarder = router.forwarder
        self._creating = NameLocks()

    @property
    def _shard(self) -> ShardRuntime:
        return current_shard.get() or self._router.home

    async def CreateQueue(self, request: pb.CreateQueueRequest, context: Any) -> pb.Queue:
        view = self._router.view
        if self._router.siblings is not None and view is None:
            return await self._create_in_local_shards(request, context)
        if view is None:
            return await self._router.home.queues.create_queue(request.config)
        config = normalize_new(request.config)
        shards = self._router.shards

        def exists_in(group_id: str) -> bool | None:
            runtime = shards.get(group_id)
            return None if runtime is None else config.name in runtime.state.catalog

        group_id = await view.place_queue(config, exists_in)
        if config.dead_letter_queue:
            await view.place_dead_letter_queue(config.dead_letter_queue, group_id)
        config.replication.group = group_id
        runtime = await self._router.ensure_hosted(group_id)
        if runtime is not None:
            return await runtime.queues.create_queue(config)
        sibling = self._router.sibling_of_group(group_id)
        if sibling is not None and not was_targeted(context):
            forwarded = pb.CreateQueueRequest(config=config)
            created = await self._forwarder.forward(sibling, "CreateQueue", forwarded, context)
            assert isinstance(created, pb.Queue)
            return created
        address = view.address_for_shard(group_id)
        if address is None or was_forwarded(context):
            raise shard_unreachable(group_id)
        forwarded = pb.CreateQueueRequest(config=config)
        queue = await self._forwarder.forward(address, "CreateQueue", forwarded, context)
        assert isinstance(queue, pb.Queue)
        return queue

    async def _create_in_local_shards(
        self, request: pb.CreateQueueRequest, context: Any
    ) -> pb.Queue:
        """Several shard processes: the first places each new queue (the front end sends it
        every CreateQueue), one create of a name at a time: in the local shard its
        ``replication.group`` names, else beside its DLQ when that exists, else in the one its
        name hashes to. A name a shard process has is refused there (QUEUE_EXISTS); a named
        local shard other than its DLQ's is refused (a DLQ is written by its queue's shard)."""
        siblings = self._router.siblings
        assert siblings is not None
        config = request.config
        if was_targeted(context):  # placed by the first shard process: create it here
            return await self._router.home.queues.create_queue(config)
        async with self._creating.hold(config.name):
            target = self._local_shard_of(config.name)  # it exists there: QUEUE_EXISTS
            dlq = config.dead_letter_queue
            dlq_at = self._local_shard_of(dlq) if dlq else None
            if target is None and config.replication.group:
                target = local_shard_index(config.replication.group)
                if target is None or target >= siblings.count:
                    shards = ", ".join(local_shard_id(i) for i in range(siblings.count))
                    raise invalid_argument(
                        "config.replication.group",
                        f"no local shard {config.replication.group!r} on this node ({shards})",
                    )
                if dlq_at is not None and dlq_at != target:
                    raise FluxError(
                        "REPLICATION_UNSATISFIABLE",
                        f"dead_letter_queue {dlq!r} lives in local shard "
                        f"{local_shard_id(dlq_at)!r}; a queue in {local_shard_id(target)!r} "
                        "needs its DLQ in the same shard",
                        violations=(
                            FieldViolation("config.dead_letter_queue", "in another shard"),
                        ),
                    )
            elif target is None:
                # Beside its DLQ when that exists already (its queue's shard writes it).
                target = home_process(config.name, siblings.count) if dlq_at is None else dlq_at
            if target == siblings.index:
                return await self._router.home.queues.create_queue(config)
            there = siblings.address_of(target)
            created = await self._forwarder.forward(there, "CreateQueue", request, context)
            assert isinstance(created, pb.Queue)
            return created

    def _local_shard_of(self, name: str) -> int | None:
        """The shard process that has queue ``name``, or reserves it as the DLQ of one of its
        queues (None: none)."""
        siblings = self._router.siblings
        assert siblings is not None
        if self._router.holds_name(name):
            return siblings.index
        owner = siblings.owner(name)
        return None if owner is None else owner[0]

    async def UpdateQueue(self, request: pb.UpdateQueueRequest, context: Any) -> pb.Queue:
        return await self._shard.queues.update_queue(
            request.config, list(request.update_mask.paths)
        )

    async def GetQueue(self, request: pb.GetQueueRequest, context: Any) -> pb.Queue:
        return self._shard.reader.entry(request.name, "name").queue

    def _caller_scope(self) -> Scope:
        guard, identity = self._router.guard, current_identity.get()
        return guard.scope_of(identity) if guard is not None and identity is not None else None

    async def ListQueues(
        self, request: pb.ListQueuesRequest, context: Any
    ) -> pb.ListQueuesResponse:
        limit = validation.list_limit(request.limit)
        guard, identity = self._router.guard, current_identity.get()
        visible = None
        if guard is not None and identity is not None:
            visible = lambda q: guard.visible(identity, q.config)  # noqa: E731
        pages = [
            b.reader.list_queues(
                request.prefix, request.label_selector, request.page_token, limit, visible
            )
            for b in self._router.shards.values()
        ]
        view = self._router.view
        siblings = self._router.siblings
        addresses: set[str] = set()
        if view is not None and not was_forwarded(context) and not was_targeted(context):
            # Groups this node does not host: one node of each lists its own (this node's
            # other shard processes list theirs).
            addresses = {
                a
                for g in sorted(set(view.shard_records) - set(self._router.shards))
                if not (siblings is not None and view.is_member(g))
                and (a := view.address_for_shard(g)) is not None
            }
        if siblings is not None and not was_targeted(context):
            addresses |= {siblings.address_of(i) for i in siblings.others()}
        answers = await asyncio.gather(
            *(
                self._forwarder.forward(address, "ListQueues", request, context)
                for address in sorted(addresses)
            )
        )
        scope = self._caller_scope()
        for resp in answers:
            # That node's edge showed them in the caller's words: back to stored names,
            # which this node's pages use, before merging and cutting the page.
            queues = [stored_queue(q, scope) for q in resp.queues]
            pages.append((queues, resp.next_page_token))
        merged = {q.config.name: q for queues, _ in pages for q in queues}
        names = sorted(merged)
        more = len(names) > limit or any(token for _, token in pages)
        page = [merged[n] for n in names[:limit]]
        token = page_token_after(page[-1].config.name) if more and page else ""
        return pb.ListQueuesResponse(queues=page, next_page_token=token)

    async def DeleteQueue(
        self, request: pb.DeleteQueueRequest, context: Any
    ) -> pb.DeleteQueueResponse:
        await self._shard.queues.delete_queue(request.name)
        return pb.DeleteQueueResponse()

    async def PurgeQueue(
        self, request: pb.PurgeQueueRequest, context: Any
    ) -> pb.PurgeQueueResponse:
        result = await self._shard.queues.purge_queue(
            request.name, request.scope, request.destructive
        )
        return pb.PurgeQueueResponse(
            purged_messages=result.purged_records, skipped_deliveries=result.skipped_deliveries
        )

    async def GetQueueStats(self, request: pb.GetQueueStatsRequest, context: Any) -> pb.QueueStats:
        entry = self._shard.reader.entry(request.name, "name")
        stats = pb.QueueStats(name=entry.name)
        for partition, wm, nbytes in self._shard.reader.stats(entry):
            stats.partitions.add(
                partition=partition,
                low_watermark=wm.low,
                high_watermark=wm.high,
                messages=wm.high - wm.low,
                bytes=nbytes,
            )
            stats.messages += wm.high - wm.low
            stats.bytes += nbytes
        stats.groups.extend(self._shard.reader.group_lags(entry, self._shard.now_ms()))
        stats.dead_letters = self._shard.reader.dead_letter_depth(entry)
        return stats

    async def Publish(self, request: pb.PublishRequest, context: Any) -> pb.PublishResponse:
        timeout_ms = validation.request_timeout_ms(request.request_timeout_ms)
        remaining = context.time_remaining()
        if remaining is not None:
            timeout_ms = min(timeout_ms, max(1, int(remaining * 1000)))
        producer = request.producer if request.HasField("producer") else None
        encoded = request.encoded if request.HasField("encoded") else None
        result = await self._shard.queues.publish(
            request.queue, request.messages, timeout_ms, producer, encoded
        )
        return _publish_response(result, encoded is not None)

    async def InitProducer(
        self, request: pb.InitProducerRequest, context: Any
    ) -> pb.InitProducerResponse:
        grant = await self._shard.queues.init_producer(request.queue, request.producer_name)
        return pb.InitProducerResponse(
            producer_id=grant.producer_id,
            producer_epoch=grant.producer_epoch,
            idle_expiry_ms=IDLE_EXPIRY_MS,
        )

    @_holds_stream_slot
    async def PublishStream(
        self, request_iterator: AsyncIterator[pb.PublishStreamRequest], context: Any
    ) -> AsyncIterator[pb.PublishStreamResponse]:
        """Requests are proposed as they arrive (so they share group commits) and answered in
        order; a failed request gets an error response and the stream goes on. Requests for one
        queue are appended in the stream's order: those this node forwards (the queue is
        served elsewhere) are sent one after the other, each once the one before it ended."""
        window: asyncio.Queue[asyncio.Task[pb.PublishStreamResponse] | None] = asyncio.Queue(
            PUBLISH_STREAM_IN_FLIGHT_MAX
        )
        # A call's metadata is read once, not per request: forwarded by another node, or by
        # another shard process of this one.
        marks = (was_forwarded(context), was_targeted(context))
        # Per queue, the end of the stream's latest request for it (what a forward waits for);
        # kept only where a request may be forwarded (not on a node alone in one process).
        chained = self._router.view is not None or self._router.siblings is not None
        latest: dict[str, asyncio.Future[None]] = {}
        loop = asyncio.get_running_loop()

        async def one(
            req: pb.PublishStreamRequest, before: asyncio.Future[None] | None
        ) -> pb.PublishStreamResponse:
            return await self._stream_publish(req, marks, context, before)

        async def read_all() -> None:
            async for req in request_iterator:
                if not chained:
                    await window.put(asyncio.ensure_future(one(req, None)))
                    continue
                queue = req.publish.queue
                before = latest.get(queue)
                ended = latest[queue] = loop.create_future()
                task = asyncio.ensure_future(one(req, before))
                # Ended when the task is, even one cancelled before it ran.
                task.add_done_callback(functools.partial(_end, latest, queue, ended))
                await window.put(task)

        async def reader() -> None:
            # A node that drains (SIGTERM) stops reading: the requests read are answered and
            # the stream ends, so an open stream never holds the shutdown for its grace
            # period; the client sends what it wrote after that again elsewhere.
            reading_all = asyncio.ensure_future(read_all())
            draining = asyncio.ensure_future(self._shard.wakeups.until_draining())
            try:
                await asyncio.wait({reading_all, draining}, return_when=asyncio.FIRST_COMPLETED)
                if reading_all.done():
                    reading_all.result()
            finally:
                reading_all.cancel()
                draining.cancel()
                await window.put(None)

        reading = asyncio.ensure_future(reader())
        try:
            while (task := await window.get()) is not None:
                yield await task
            await reading
        finally:
            reading.cancel()
            while not window.empty():
                pending = window.get_nowait()
                if pending is not None:
                    pending.cancel()

    async def _stream_publish(
        self,
        req: pb.PublishStreamRequest,
        marks: tuple[bool, bool],
        context: Any,
        before: asyncio.Future[None] | None,
    ) -> pb.PublishStreamResponse:
        """One request of a PublishStream, answered (an error is an answer, not a raise);
        forwarded once ``before`` (the stream's previous request for its queue) ended."""
        try:
            timeout_ms = validation.request_timeout_ms(req.publish.request_timeout_ms)
            target = await self._router.locate(
                req.publish.queue, forwarded=marks[0], targeted=marks[1]
            )
            if isinstance(target, str):
                if before is not None:
                    await asyncio.wait((before,))
                forwarded = await self._forwarder.forward_unary(
                    target, "Publish", req.publish, context
                )
                resp = pb.PublishStreamResponse(sequence=req.sequence)
                resp.results.extend(forwarded.results)
                if forwarded.HasField("batch"):
                    resp.batch.CopyFrom(forwarded.batch)
                return resp
            producer = req.publish.producer if req.publish.HasField("producer") else None
            encoded = req.publish.encoded if req.publish.HasField("encoded") else None
            result = await target.queues.publish(
                req.publish.queue, req.publish.messages, timeout_ms, producer, encoded
            )
        except Exception as exc:
            return self._stream_error(req.sequence, exc)
        if encoded is not None:
            return pb.PublishStreamResponse(sequence=req.sequence, batch=_published_batch(result))
        resp = pb.PublishStreamResponse(sequence=req.sequence)
        resp.results.extend(_publish_response(result).results)
        return resp

    def _stream_error(self, sequence: int, exc: Exception) -> pb.PublishStreamResponse:
        rid = request_id_var.get()
        err = domain_error(exc)
        # The fields are the Publish's (forwarded or not): name them in the stream's request,
        # as ``publish.messages[0].value``.
        err = internal_error(rid) if err is None else nested("publish", err)
        # The serialized status is out of the edge's reach: in the caller's words now.
        caller_error(err, self._caller_scope())
        status = to_rpc_status(err, rid)
        return pb.PublishStreamResponse(
            sequence=sequence,
            error=pb.RequestError(
                code=status_code(err).value[0],
                message=err.message,
                reason=err.reason,
                status_details=status.SerializeToString(),
            ),
        )

    async def Fetch(self, request: pb.FetchRequest, context: Any) -> pb.FetchResponse:
        if request.offset < 0:
            raise invalid_argument("offset", f"must be >= 0 (got {request.offset})")
        result = await self._shard.streams.fetch(
            request.queue,
            request.partition,
            request.offset,
            request.max_messages,
            request.max_bytes,
            request.wait_ms,
            request.record_batches,
        )
        resp = pb.FetchResponse(
            next_offset=result.next_offset,
            high_watermark=result.watermarks.high,
            low_watermark=result.watermarks.low,
        )
        if request.record_batches:
            resp.log_id = result.log_id
            add = resp.record_batches.add
            for b in result.batches:
                add(base_offset=b.base_offset, data=b.data)
        else:
            _fill_records(resp.records, request.partition, result.records)
        return resp

    @_holds_stream_slot
    async def Tail(self, request: pb.TailRequest, context: Any) -> AsyncIterator[pb.TailResponse]:
        batch_max = request.max_messages or 500
        if batch_max > 10_000:
            raise invalid_argument("max_messages", "at most 10000")
        stream = self._shard.streams.tail(
            request.queue, request.partitions, request.start, batch_max, request.record_batches
        )
        try:
            async for chunk in stream:
                resp = pb.TailResponse()
                for partition, read in chunk:
                    if request.record_batches:
                        part = resp.partitions.add(
                            partition=partition,
                            from_offset=read.start_offset,
                            next_offset=read.next_offset,
                            log_id=read.log_id,
                        )
                        add = part.record_batches.add
                        for b in read.batches:
                            add(base_offset=b.base_offset, data=b.data)
                    else:
                        _fill_records(resp.records, partition, read.records)
                yield resp
        finally:
            with contextlib.suppress(Exception):
                await stream.aclose()  # type: ignore[attr-defined]

    async def SeekToTimestamp(
        self, request: pb.SeekToTimestampRequest, context: Any
    ) -> pb.SeekToTimestampResponse:
        offset = self._shard.streams.seek(request.queue, request.partition, request.timestamp_ms)
        return pb.SeekToTimestampResponse(offset=offset)

    # -- consumer groups --------------------------------------------------------------------

    async def CreateGroup(self, request: pb.CreateGroupRequest, context: Any) -> pb.Group:
        return await self._shard.delivery.create_group(request)

    async def ListGroups(
        self, request: pb.ListGroupsRequest, context: Any
    ) -> pb.ListGroupsResponse:
        entry = self._shard.reader.entry(request.queue)
        return pb.ListGroupsResponse(groups=self._shard.reader.groups(entry))

    async def DescribeGroup(
        self, request: pb.DescribeGroupRequest, context: Any
    ) -> pb.GroupDescription:
        entry = self._shard.reader.entry(request.queue)
        return self._shard.reader.describe_group(entry, request.group, self._shard.now_ms())

    async def DeleteGroup(
        self, request: pb.DeleteGroupRequest, context: Any
    ) -> pb.DeleteGroupResponse:
        await self._shard.delivery.delete_group(request.queue, request.group)
        return pb.DeleteGroupResponse()

    async def JoinGroup(self, request: pb.JoinGroupRequest, context: Any) -> pb.MemberAssignment:
        return await self._shard.members.join_group(request)

    async def Heartbeat(self, request: pb.HeartbeatRequest, context: Any) -> pb.MemberAssignment:
        try:
            return await self._shard.members.heartbeat(request)
        except FluxError as err:
            # Sessions live in the leader's memory: any node takes the heartbeat to it.
            leader = self._shard.proposer.leader_address()
            if err.reason != "NOT_LEADER" or not leader or was_forwarded(context):
                raise
        result = await self._forwarder.forward(leader, "Heartbeat", request, context)
        assert isinstance(result, pb.MemberAssignment)
        return result

    async def LeaveGroup(
        self, request: pb.LeaveGroupRequest, context: Any
    ) -> pb.LeaveGroupResponse:
        await self._shard.members.leave_group(request)
        return pb.LeaveGroupResponse()

    async def Lease(self, request: pb.LeaseRequest, context: Any) -> pb.LeaseResponse:
        result = await self._shard.delivery.lease(request)
        resp = pb.LeaseResponse()
        _fill_leased(resp.messages, result)
        return resp

    @_holds_stream_slot
    async def Consume(
        self, request: pb.ConsumeRequest, context: Any
    ) -> AsyncIterator[pb.ConsumeResponse]:
        stream = self._shard.delivery.consume(request)
        try:
            async for result in stream:
                resp = pb.ConsumeResponse()
                _fill_leased(resp.messages, result)
                yield resp
        finally:
            with contextlib.suppress(Exception):
                await stream.aclose()  # type: ignore[attr-defined]

    async def EndConsume(
        self, request: pb.EndConsumeRequest, context: Any
    ) -> pb.EndConsumeResponse:
        return pb.EndConsumeResponse(ended=await self._shard.delivery.end_consume(request))

    async def Ack(self, request: pb.AckRequest, context: Any) -> pb.AckResponse:
        result = await self._shard.delivery.ack(request)
        return pb.AckResponse(statuses=_statuses(result))

    async def Nack(self, request: pb.NackRequest, context: Any) -> pb.NackResponse:
        result = await self._shard.delivery.nack(request)
        return pb.NackResponse(statuses=_statuses(result))

    async def ExtendLease(
        self, request: pb.ExtendLeaseRequest, context: Any
    ) -> pb.ExtendLeaseResponse:
        result = await self._shard.delivery.extend(request)
        return pb.ExtendLeaseResponse(
            statuses=_statuses(result), lease_deadlines_ms=result.deadlines_ms
        )

    async def CommitOffsets(
        self, request: pb.CommitOffsetsRequest, context: Any
    ) -> pb.OffsetsResponse:
        return await self._shard.delivery.commit_offsets(request)

    async def GetOffsets(self, request: pb.GetOffsetsRequest, context: Any) -> pb.OffsetsResponse:
        entry = self._shard.reader.entry(request.queue)
        return self._shard.reader.offsets(entry, request.group)

    async def ResetOffsets(
        self, request: pb.ResetOffsetsRequest, context: Any
    ) -> pb.OffsetsResponse:
        return await self._shard.delivery.reset_offsets(request)

    async def ListDeadLetters(
        self, request: pb.ListDeadLettersRequest, context: Any
    ) -> pb.ListDeadLettersResponse:
        entry = self._shard.reader.entry(request.queue)
        if request.from_ms < 0 or request.to_ms < 0:
            raise invalid_argument("from_ms", "times are >= 0")
        items, token = self._shard.reader.dead_letters(
            entry,
            request.group,
            request.from_ms,
            request.to_ms,
            request.page_token,
            validation.list_limit(request.limit),
        )
        return pb.ListDeadLettersResponse(dead_letters=items, next_page_token=token)

    async def ReplayDeadLetters(
        self, request: pb.ReplayDeadLettersRequest, context: Any
    ) -> pb.ReplayDeadLettersResponse:
        return pb.ReplayDeadLettersResponse(replayed=await self._shard.dead_letters.replay(request))

    async def PurgeDeadLetters(
        self, request: pb.PurgeDeadLettersRequest, context: Any
    ) -> pb.PurgeDeadLettersResponse:
        return pb.PurgeDeadLettersResponse(purged=await self._shard.dead_letters.purge(request))

    async def Transact(self, request: pb.TransactRequest, context: Any) -> pb.TransactResponse:
        result = await self._shard.transactions.transact(request)
        resp = pb.TransactResponse()
        for ack in result.acks:
            resp.acks.add(statuses=_statuses(ack))
        for append in result.appends:
            resp.publishes.append(_publish_response(append))
        return resp


def _statuses(result: SettleResult) -> list[pb.ReceiptStatus]:
    return cast("list[pb.ReceiptStatus]", result.statuses)


def _fill_leased(out: Any, result: LeaseResult) -> None:
    group_id = result.group_id
    for d in result.deliveries:
        item = out.add()
        _fill_records(item.record, d.partition, [d.record], single=True)
        item.receipt.partition = d.partition
        item.receipt.offset = d.record.offset
        item.receipt.attempt = d.attempt
        item.receipt.lease_deadline_ms = d.deadline_ms
        item.receipt.lease_id = d.lease_id
        item.receipt.group_id = group_id


def register(server: grpc.aio.Server, router: Router) -> None:
    pb_grpc.add_QueueServiceServicer_to_server(  # type: ignore[no-untyped-call]
        QueueService(router), server
    )
