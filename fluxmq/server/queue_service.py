"""QueueService: protobuf in, protobuf out. All the work is in Broker and fluxmq.core."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import grpc

from fluxmq._pb.v1 import queue_pb2 as pb
from fluxmq._pb.v1 import queue_pb2_grpc as pb_grpc
from fluxmq.core import validation
from fluxmq.core.errors import invalid_argument
from fluxmq.core.state_machine import AppendResult
from fluxmq.server.broker import Broker
from fluxmq.server.errors import domain_error, internal_error, status_code, to_rpc_status
from fluxmq.server.interceptors import request_id_var
from storage import Record

PUBLISH_STREAM_IN_FLIGHT_MAX = 64  # requests of one PublishStream being processed at once


def _fill_records(out: Any, partition: int, records: list[Record]) -> None:
    add = out.add
    for r in records:
        rec = add(partition=partition, offset=r.offset, timestamp_ms=r.timestamp_ms, value=r.value)
        if r.key is not None:
            rec.key = r.key
        if r.headers:
            rec.headers.update(r.headers)
        if r.idempotency_key:
            rec.idempotency_key = r.idempotency_key


def _publish_response(result: AppendResult) -> pb.PublishResponse:
    resp = pb.PublishResponse()
    add = resp.results.add
    for partition, offset, ts, duplicate in zip(
        result.partitions, result.offsets, result.timestamps_ms, result.duplicates, strict=True
    ):
        if duplicate:
            add(partition=partition, offset=offset, timestamp_ms=ts, duplicate=True)
        else:
            add(partition=partition, offset=offset, timestamp_ms=ts)
    return resp


class QueueService(pb_grpc.QueueServiceServicer):  # type: ignore[misc]
    def __init__(self, broker: Broker) -> None:
        self._broker = broker

    async def CreateQueue(self, request: pb.CreateQueueRequest, context: Any) -> pb.Queue:
        return await self._broker.create_queue(request.config)

    async def UpdateQueue(self, request: pb.UpdateQueueRequest, context: Any) -> pb.Queue:
        return await self._broker.update_queue(request.config, list(request.update_mask.paths))

    async def GetQueue(self, request: pb.GetQueueRequest, context: Any) -> pb.Queue:
        return self._broker.reader.entry(request.name, "name").queue

    async def ListQueues(
        self, request: pb.ListQueuesRequest, context: Any
    ) -> pb.ListQueuesResponse:
        limit = validation.list_limit(request.limit)
        queues, token = self._broker.reader.list_queues(
            request.prefix, request.label_selector, request.page_token, limit
        )
        return pb.ListQueuesResponse(queues=queues, next_page_token=token)

    async def DeleteQueue(
        self, request: pb.DeleteQueueRequest, context: Any
    ) -> pb.DeleteQueueResponse:
        await self._broker.delete_queue(request.name)
        return pb.DeleteQueueResponse()

    async def PurgeQueue(
        self, request: pb.PurgeQueueRequest, context: Any
    ) -> pb.PurgeQueueResponse:
        return pb.PurgeQueueResponse(purged_messages=await self._broker.purge_queue(request.name))

    async def GetQueueStats(self, request: pb.GetQueueStatsRequest, context: Any) -> pb.QueueStats:
        entry = self._broker.reader.entry(request.name, "name")
        stats = pb.QueueStats(name=entry.name)
        for partition, wm, nbytes in self._broker.reader.stats(entry):
            stats.partitions.add(
                partition=partition,
                low_watermark=wm.low,
                high_watermark=wm.high,
                messages=wm.high - wm.low,
                bytes=nbytes,
            )
            stats.messages += wm.high - wm.low
            stats.bytes += nbytes
        return stats

    async def Publish(self, request: pb.PublishRequest, context: Any) -> pb.PublishResponse:
        timeout_ms = validation.request_timeout_ms(request.request_timeout_ms)
        remaining = context.time_remaining()
        if remaining is not None:
            timeout_ms = min(timeout_ms, max(1, int(remaining * 1000)))
        result = await self._broker.publish(request.queue, request.messages, timeout_ms)
        return _publish_response(result)

    async def PublishStream(
        self, request_iterator: AsyncIterator[pb.PublishStreamRequest], context: Any
    ) -> AsyncIterator[pb.PublishStreamResponse]:
        """Requests are proposed as they arrive (so they share group commits) and answered in
        order; a failed request gets an error response and the stream goes on."""
        window: asyncio.Queue[asyncio.Task[pb.PublishStreamResponse] | None] = asyncio.Queue(
            PUBLISH_STREAM_IN_FLIGHT_MAX
        )

        async def one(req: pb.PublishStreamRequest) -> pb.PublishStreamResponse:
            try:
                timeout_ms = validation.request_timeout_ms(
                    req.publish.request_timeout_ms, "publish.request_timeout_ms"
                )
                result = await self._broker.publish(
                    req.publish.queue, req.publish.messages, timeout_ms
                )
            except Exception as exc:
                rid = request_id_var.get()
                err = domain_error(exc) or internal_error(rid)
                status = to_rpc_status(err, rid)
                return pb.PublishStreamResponse(
                    sequence=req.sequence,
                    error=pb.RequestError(
                        code=status_code(err).value[0],
                        message=err.message,
                        reason=err.reason,
                        status_details=status.SerializeToString(),
                    ),
                )
            resp = pb.PublishStreamResponse(sequence=req.sequence)
            resp.results.extend(_publish_response(result).results)
            return resp

        async def reader() -> None:
            try:
                async for req in request_iterator:
                    await window.put(asyncio.ensure_future(one(req)))
            finally:
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

    async def Fetch(self, request: pb.FetchRequest, context: Any) -> pb.FetchResponse:
        if request.offset < 0:
            raise invalid_argument("offset", f"must be >= 0 (got {request.offset})")
        result = await self._broker.fetch(
            request.queue,
            request.partition,
            request.offset,
            request.max_messages,
            request.max_bytes,
            request.wait_ms,
        )
        resp = pb.FetchResponse(
            next_offset=result.next_offset,
            high_watermark=result.watermarks.high,
            low_watermark=result.watermarks.low,
        )
        _fill_records(resp.records, request.partition, result.records)
        return resp

    async def Tail(self, request: pb.TailRequest, context: Any) -> AsyncIterator[pb.TailResponse]:
        batch_max = request.max_messages or 500
        if batch_max > 10_000:
            raise invalid_argument("max_messages", "at most 10000")
        stream = self._broker.tail(request.queue, request.partitions, request.start, batch_max)
        try:
            async for chunk in stream:
                resp = pb.TailResponse()
                for partition, records in chunk:
                    _fill_records(resp.records, partition, records)
                yield resp
        finally:
            with contextlib.suppress(Exception):
                await stream.aclose()  # type: ignore[attr-defined]

    async def SeekToTimestamp(
        self, request: pb.SeekToTimestampRequest, context: Any
    ) -> pb.SeekToTimestampResponse:
        offset = self._broker.seek(request.queue, request.partition, request.timestamp_ms)
        return pb.SeekToTimestampResponse(offset=offset)


def register(server: grpc.aio.Server, broker: Broker) -> None:
    pb_grpc.add_QueueServiceServicer_to_server(QueueService(broker), server)
