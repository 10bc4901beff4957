"""Reading a stream queue as a group that only tracks offsets (Kafka's consumer model).

A :class:`StreamReader` reads every partition of a ``stream`` queue (or the ones named) from
the group's committed offsets, with Fetch long polls that the broker wakes as a commit stores
new records: no replicated round per record, and no lease. Its position moves past each record
it hands out; the positions are committed (CommitOffsets, one replicated round for all
partitions) in the background every ``commit_interval_ms`` and at close, so a reader that
stops and a new one of the same group go on from there. Delivery is at least once: records
handed out after the last commit are read again by the next reader of the group. Several
groups each read everything (fan-out) at the cost of their reads only.

Work queues are leased instead (``AsyncClient.consumer``): each message is held by one
consumer of a group until acked.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Sequence
from typing import Any

from fluxmq._pb.v1 import queue_pb2 as pb
from fluxmq.client.codecs import Codec
from fluxmq.client.errors import FluxMQError, GroupExists

log = logging.getLogger("fluxmq.client")

DEFAULT_FETCH_MAX = 500
DEFAULT_WAIT_MS = 1000
DEFAULT_COMMIT_INTERVAL_MS = 1000
BUFFERED_FETCHES_MAX = 2  # per partition: fetched answers waiting to be handed out


class StreamRecord:
    """One record of a stream queue, as read. ``data`` is the value decoded with the reader's
    codec; ``value`` the raw bytes."""

    __slots__ = ("_codec", "partition", "record")

    def __init__(self, codec: Codec, partition: int, record: pb.Record) -> None:
        self._codec = codec
        self.partition = partition
        self.record = record

    @property
    def offset(self) -> int:
        return int(self.record.offset)

    @property
    def value(self) -> bytes:
        return bytes(self.record.value)

    @property
    def data(self) -> Any:
        return self._codec.decode(self.record.value)

    @property
    def key(self) -> bytes | None:
        return self.record.key if self.record.HasField("key") else None

    @property
    def headers(self) -> dict[str, bytes]:
        return dict(self.record.headers)

    @property
    def timestamp_ms(self) -> int:
        return int(self.record.timestamp_ms)

    def __repr__(self) -> str:
        return f"StreamRecord(partition={self.partition}, offset={self.offset})"


class StreamReader:
    """See the module doc. ``async for rec in client.reader(queue, group)``; better inside
    ``async with``, so that leaving commits the position and stops the fetches.

    ``partitions``: which to read (default all); ``fetch_max``: records per Fetch;
    ``wait_ms``: each Fetch's long poll; ``commit_interval_ms``: how often the position is
    committed (0: only by ``commit()`` and at close)."""

    def __init__(
        self,
        client: Any,  # AsyncClient (not imported: it imports this module)
        queue: str,
        group: str,
        *,
        codec: Codec,
        partitions: Sequence[int] | None = None,
        fetch_max: int = DEFAULT_FETCH_MAX,
        wait_ms: int = DEFAULT_WAIT_MS,
        commit_interval_ms: int = DEFAULT_COMMIT_INTERVAL_MS,
        create_group: bool = False,
    ) -> None:
        if not 1 <= fetch_max <= 10_000:
            raise ValueError("fetch_max must be 1..10000")
        if not 0 <= wait_ms <= 60_000:
            raise ValueError("wait_ms must be 0..60000")
        if commit_interval_ms < 0:
            raise ValueError("commit_interval_ms must be 0 or more")
        self.queue = queue
        self.group = group
        self.codec = codec
        self._client = client
        self._partitions = list(partitions) if partitions is not None else None
        self._fetch_max = fetch_max
        self._wait_ms = wait_ms
        self._commit_interval_s = commit_interval_ms / 1000
        self._create_group = create_group
        self.positions: dict[int, int] = {}  # partition -> the next offset to hand out
        self._committed: dict[int, int] = {}  # partition -> the offset last committed
        self._ready: asyncio.Queue[tuple[int, list[pb.Record]] | BaseException] = asyncio.Queue()
        self._current: list[StreamRecord] = []
        self._room: dict[int, asyncio.Semaphore] = {}
        self._tasks: list[asyncio.Task[None]] = []
        self._started = False
        self._closed = False

    # -- lifecycle -------------------------------------------------------------------------------

    async def start(self) -> None:
        if self._started:
            return
        if self._closed:
            raise RuntimeError("the reader is closed")
        admin = self._client.admin
        if self._create_group:
            with contextlib.suppress(GroupExists):
                await admin.create_group(self.queue, self.group)
        offsets = {
            p.partition: p.committed for p in await admin.get_offsets(self.queue, self.group)
        }
        parts = self._partitions if self._partitions is not None else sorted(offsets)
        for p in parts:
            if p not in offsets:
                raise ValueError(f"queue {self.queue!r} has no partition {p}")
            self.positions[p] = self._committed[p] = offsets[p]
            self._room[p] = asyncio.Semaphore(BUFFERED_FETCHES_MAX)
        self._started = True
        self._tasks = [asyncio.ensure_future(self._fetch_routine(p, offsets[p])) for p in parts]
        if self._commit_interval_s:
            self._tasks.append(asyncio.ensure_future(self._commit_routine()))

    async def close(self) -> None:
        """Commits the position, stops the fetches."""
        if self._closed:
            return
        self._closed = True
        for t in self._tasks:
            t.cancel()
        for t in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await t
        if self._started:
            await self.commit()

    async def __aenter__(self) -> StreamReader:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # -- reading ---------------------------------------------------------------------------------

    def __aiter__(self) -> StreamReader:
        return self

    async def __anext__(self) -> StreamRecord:
        await self.start()
        while not self._current:
            if self._closed:
                raise StopAsyncIteration
            got = await self._ready.get()
            if isinstance(got, BaseException):
                raise got
            p, records = got
            self._room[p].release()
            self._current = [StreamRecord(self.codec, p, r) for r in records]
            self._current.reverse()  # popped from the end, in offset order
        rec = self._current.pop()
        self.positions[rec.partition] = rec.offset + 1
        return rec

    async def _fetch_routine(self, partition: int, offset: int) -> None:
        while True:
            await self._room[partition].acquire()
            try:
                resp = await self._client.fetch(
                    self.queue, partition, offset, max_messages=self._fetch_max,
                    wait_ms=self._wait_ms,
                )  # fmt: skip
            except FluxMQError as err:
                self._room[partition].release()
                if err.retriable:
                    log.warning("fluxmq: fetch of %s/%d failed: %s", self.queue, partition, err)
                    await asyncio.sleep(0.2)
                    continue
                self._ready.put_nowait(err)
                return
            if not resp.records:
                self._room[partition].release()
                # Retention may have moved past us: go on from what is still there.
                offset = max(offset, resp.low_watermark)
                if not self._wait_ms:
                    await asyncio.sleep(0.1)  # no long poll to wait in
                continue
            offset = resp.next_offset
            self._ready.put_nowait((partition, list(resp.records)))

    # -- committing ------------------------------------------------------------------------------

    async def commit(self) -> None:
        """Commits the position of every partition that moved since the last commit."""
        moved = {p: o for p, o in self.positions.items() if self._committed.get(p) != o}
        if not moved:
            return
        await self._client.admin.commit_offsets(self.queue, self.group, moved)
        self._committed.update(moved)

    async def _commit_routine(self) -> None:
        while True:
            await asyncio.sleep(self._commit_interval_s)
            try:
                await self.commit()
            except FluxMQError as err:
                log.warning("fluxmq: commit of %s/%s failed: %s", self.queue, self.group, err)
