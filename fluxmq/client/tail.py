"""``client.tail(queue)``: a queue's records as they are appended, over the Tail stream, as an
async iterator that survives node failures and leader changes.

The start (earliest, latest, an offset, a time) is turned into one offset per partition when
the tail opens (GetQueueStats, SeekToTimestamp), and every record handed out moves its
partition's position past it. A stream that fails with a retriable error is opened again
(another node when the error says so, else after a backoff) from those positions, so nothing
is skipped and nothing is handed out twice: records below a partition's position are dropped.
Partitions at the same position share one stream (at the start, typically all of them). The
broker sends its stored batches unopened (``record_batches``); the tail checks and decodes them
as ``fetch`` does.

Reading only: no group, no offsets stored (``client.reader`` keeps a group's position).
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import logging
from collections.abc import Sequence
from itertools import count, repeat
from typing import Any

import grpc

from fluxmq._pb.v1 import queue_pb2 as pb
from fluxmq.client.codecs import Codec
from fluxmq.client.errors import FluxMQError, from_rpc_error
from fluxmq.client.reader import StreamRecord
from fluxmq.client.record_batches import add_records

log = logging.getLogger("fluxmq.client")

BATCH_MAX = 500  # records per stream message (the broker's default and limit)
READY_MAX = 64  # stream messages waiting to be handed out, per tail

Start = str | int | datetime.datetime


def start_position(start: Start) -> pb.StartPosition:
    """``"earliest"``, ``"latest"``, an offset (int) or a time (an aware datetime).

    >>> start_position(42).offset, start_position("latest").latest
    (42, True)
    """
    if isinstance(start, bool):
        raise TypeError("start: earliest, latest, an offset or a datetime, not a bool")
    if isinstance(start, int):
        if start < 0:
            raise ValueError("start: an offset is 0 or more")
        return pb.StartPosition(offset=start)
    if isinstance(start, datetime.datetime):
        if start.tzinfo is None:
            raise ValueError("start: a datetime with its time zone (e.g. tzinfo=datetime.UTC)")
        return pb.StartPosition(timestamp_ms=int(start.timestamp() * 1000))
    if start == "earliest":
        return pb.StartPosition(earliest=True)
    if start == "latest":
        return pb.StartPosition(latest=True)
    raise ValueError(f"start: {start!r} is not earliest, latest, an offset or a datetime")


class Tail:
    """See the module doc: ``async for rec in client.tail(queue)`` (better ``async with``)."""

    def __init__(
        self,
        client: Any,  # AsyncClient (not imported: it imports this module)
        queue: str,
        *,
        codec: Codec,
        partitions: Sequence[int] | None = None,
        start: Start = "earliest",
        batch_max: int = BATCH_MAX,
    ) -> None:
        if not 1 <= batch_max <= BATCH_MAX:
            raise ValueError(f"batch_max must be 1..{BATCH_MAX}")
        self.queue = queue
        self.codec = codec
        self._client = client
        self._partitions = list(partitions) if partitions is not None else None
        self._start = start_position(start)
        self._batch_max = batch_max
        self.positions: dict[int, int] = {}  # partition -> the next offset to hand out
        self.reconnects = 0  # streams opened again after a failure (for monitoring)
        self._ready: asyncio.Queue[pb.TailResponse | BaseException] = asyncio.Queue(READY_MAX)
        self._current: list[tuple[int, int, pb.Record]] = []  # (partition, offset, record)
        self._task: asyncio.Task[None] | None = None
        self._started = False
        self._closed = False

    # -- lifecycle -------------------------------------------------------------------------------

    async def start(self) -> None:
        if self._started:
            return
        if self._closed:
            raise RuntimeError("the tail is closed")
        stats = await self._client.admin.queue_stats(self.queue)
        marks = {p.partition: p for p in stats.partitions}
        parts = self._partitions if self._partitions is not None else sorted(marks)
        which = self._start.WhichOneof("position") or "earliest"
        for p in parts:
            if p not in marks:
                raise ValueError(f"queue {self.queue!r} has no partition {p}")
            if which == "earliest":
                self.positions[p] = marks[p].low_watermark
            elif which == "latest":
                self.positions[p] = marks[p].high_watermark
            elif which == "offset":
                self.positions[p] = self._start.offset
            else:
                self.positions[p] = await self._client.admin.offset_for_timestamp(
                    self.queue, p, self._start.timestamp_ms
                )
        self._started = True
        self._task = asyncio.ensure_future(self._stream_routine())

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task

    async def __aenter__(self) -> Tail:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # -- reading ---------------------------------------------------------------------------------

    def __aiter__(self) -> Tail:
        return self

    async def __anext__(self) -> StreamRecord:
        if not self._started:
            await self.start()
        while not self._current:
            if self._closed:
                raise StopAsyncIteration
            got = await self._ready.get()
            if isinstance(got, BaseException):
                await self.close()
                raise got
            self._current = self._fresh(got)
        partition, offset, record = self._current.pop()
        self.positions[partition] = offset + 1
        return StreamRecord(self.codec, partition, record)

    def _fresh(self, resp: pb.TailResponse) -> list[tuple[int, int, pb.Record]]:
        """The records of ``resp`` not handed out yet (a stream opened after a failure sends
        again what was queued from the old one), last first: popped in stream order. Checked
        once per response: the previous one was handed out whole, so positions are current.
        Stored batches are checked (crc32c) and decoded here; CorruptBatchError ends the
        tail."""
        positions = self.positions
        fresh: list[tuple[int, int, pb.Record]] = []
        for part in resp.partitions:
            p = part.partition
            start = max(part.from_offset, positions.get(p, 0))
            if start >= part.next_offset:
                continue
            decoded = pb.TailResponse()
            add_records(decoded.records, part.record_batches, part.log_id, p, start)
            # A partition's records are consecutive from ``start``: no field read per record.
            fresh.extend(zip(repeat(p), count(start), decoded.records, strict=False))
        for record in resp.records:
            partition, offset = record.partition, record.offset
            if offset >= positions.get(partition, 0):
                fresh.append((partition, offset, record))
        fresh.reverse()
        return fresh

    # -- streams ---------------------------------------------------------------------------------

    def _requests(self) -> list[pb.TailRequest]:
        """One Tail request per position shared by partitions (before any failure: one)."""
        by_offset: dict[int, list[int]] = {}
        for p, offset in sorted(self.positions.items()):
            by_offset.setdefault(offset, []).append(p)
        return [
            pb.TailRequest(
                queue=self.queue,
                partitions=parts,
                start=pb.StartPosition(offset=offset),
                max_messages=self._batch_max,
                record_batches=True,
            )
            for offset, parts in sorted(by_offset.items())
        ]

    async def _stream_routine(self) -> None:
        """Runs the streams; after a retriable failure of any, opens them all again from the
        positions handed out (records already queued are dropped by ``__anext__``)."""
        transport = self._client.transport
        policy = transport.retry
        failures = 0
        while True:
            streams = [
                transport.server_stream("Tail", req, queue=self.queue) for req in self._requests()
            ]
            readers = [asyncio.ensure_future(self._read(call)) for _, call in streams]
            try:
                done, _ = await asyncio.wait(readers, return_when=asyncio.FIRST_EXCEPTION)
                failed = next((t for t in done if t.exception() is not None), None)
                caught = failed.exception() if failed is not None else None
                target = streams[readers.index(failed)][0] if failed is not None else ""
            finally:
                for t in readers:
                    t.cancel()
                for _, call in streams:
                    call.cancel()
            if caught is None:
                # Every stream ended without an error (the broker ends a Tail only when it
                # stops serving it): open them again, after a moment.
                await asyncio.sleep(policy.backoff_s(1) + 0.05)
                continue
            if not isinstance(caught, grpc.aio.AioRpcError):
                await self._ready.put(caught)
                return
            err = from_rpc_error(caught)
            if not err.retriable:
                await self._ready.put(err)
                return
            # Opened again from the positions handed out: what is still queued comes again
            # and is dropped (its partition's position has passed it by then).
            self.reconnects += 1
            if transport.stream_failed(err, target, self.queue):
                failures = 0
                continue  # another node, named or next: no reason to wait
            failures += 1
            log.warning("fluxmq: Tail of %s failed: %s", self.queue, err)
            advised = (err.retry_after_ms or 0) / 1000
            await asyncio.sleep(max(policy.backoff_s(failures) + 0.05, advised))

    async def _read(self, call: Any) -> None:
        async for resp in call:
            if resp.partitions or resp.records:
                await self._ready.put(resp)


__all__ = ["FluxMQError", "Start", "Tail", "start_position"]
