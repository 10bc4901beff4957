"""Reading a shard's logs: Fetch (long polls), Tail, Seek. Reads need no Raft round: they are
LMDB read transactions of the committed state, woken by commits."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence

from fluxmq import metrics
from fluxmq._pb.v1 import queue_pb2 as pb
from fluxmq.core import keys, validation
from fluxmq.core.catalog import QueueEntry
from fluxmq.core.commands.leases import start_offset
from fluxmq.core.errors import FluxError, queue_not_found
from fluxmq.core.reader import FetchResult, QueueReader
from fluxmq.server.shard.wakeups import Wakeups
from storage import Store

TAIL_BYTES_MAX = 4 * 1024 * 1024  # one tail read per partition
TAIL_RECHECK_S = 1.0  # an idle tail looks again this often (queue deleted, ...)


class Streams:
    def __init__(self, reader: QueueReader, store: Store, wakeups: Wakeups) -> None:
        self._reader = reader
        self._store = store
        self._wakeups = wakeups

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
        entry = self._reader.entry(queue)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + wait_ms / 1000

        def read() -> FetchResult:
            return self._reader.fetch(entry, partition, offset, max_messages, max_bytes, batches)

        # The first read validates partition and offset before anything is allocated for a wait.
        result = read()
        while result.empty and (remaining := deadline - loop.time()) > 0:
            # Take the event, then read again: an append between the read and the wait wakes us.
            event = self._wakeups.event(keys.log_id(entry.queue_id, partition))
            result = read()
            if not result.empty:
                break
            await self._wakeups.wait([event], remaining)
            current = self._reader.entry(queue)
            if current.queue_id != entry.queue_id:  # deleted and re-created meanwhile
                raise queue_not_found(queue)
            result = read()
        _count_fetched(queue, result)
        return result

    def start_offsets(
        self, entry: QueueEntry, partitions: Sequence[int], start: pb.StartPosition
    ) -> dict[int, int]:
        with self._store.read() as txn:
            return {
                p: start_offset(txn.log(keys.log_id(entry.queue_id, p)), start) for p in partitions
            }

    async def tail(
        self,
        queue: str,
        partitions: Sequence[int],
        start: pb.StartPosition,
        batch_max: int,
        batches: bool = False,
    ) -> AsyncIterator[list[tuple[int, FetchResult]]]:
        """Yields [(partition, what was read)] as records arrive, forever (until cancelled);
        with ``batches`` the stored batches, not opened."""
        entry = self._reader.entry(queue)
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
            self._wakeups.check_open()  # a draining node ends its tails, even busy ones
            events = [self._wakeups.event(keys.log_id(entry.queue_id, p)) for p in parts]
            out = [
                (p, read)
                for p in parts
                if not (read := self._tail_read(queue, entry, p, offsets, batch_max, batches)).empty
            ]
            if out:
                yield out
                continue
            await self._wakeups.wait(events, TAIL_RECHECK_S)
            if self._reader.entry(queue).queue_id != entry.queue_id:
                raise queue_not_found(queue)  # deleted (and maybe re-created): this tail is over

    def _tail_read(
        self,
        queue: str,
        entry: QueueEntry,
        p: int,
        offsets: dict[int, int],
        batch_max: int,
        batches: bool,
    ) -> FetchResult:
        """The next records (or batches) of partition ``p`` from ``offsets[p]``, which it
        moves past them."""
        wm = self._reader.watermarks(entry, p)
        # Retention may have removed what we had not read yet: skip ahead, as Kafka's
        # auto.offset.reset=earliest does.
        offsets[p] = max(offsets[p], wm.low)
        if offsets[p] >= wm.high:
            return FetchResult([], offsets[p], wm)
        try:
            res = self._reader.fetch(entry, p, offsets[p], batch_max, TAIL_BYTES_MAX, batches)
        except FluxError as err:
            if err.reason != "OFFSET_OUT_OF_RANGE":
                raise
            return FetchResult([], offsets[p], wm)  # retention moved low: skip ahead next round
        if not res.empty:
            offsets[p] = res.next_offset
            _count_fetched(queue, res)
        return res

    def seek(self, queue: str, partition: int, timestamp_ms: int) -> int:
        return self._reader.offset_for_timestamp(self._reader.entry(queue), partition, timestamp_ms)


def _count_fetched(queue: str, result: FetchResult) -> None:
    if result.records:
        metrics.FETCHED_MESSAGES.labels(queue).inc(len(result.records))
        metrics.FETCHED_BYTES.labels(queue).inc(sum(len(r.value) for r in result.records))
    elif result.batches:
        metrics.FETCHED_MESSAGES.labels(queue).inc(result.messages)
        metrics.FETCHED_BYTES.labels(queue).inc(sum(len(b.data) for b in result.batches))
