"""Which partition a message goes to, decided by the SDK (partitioning at the edge).

The rule is the broker's (fluxmq/core/partitioner.py), so a message lands where the broker would
have put it: an explicit ``partition``; else ``crc32c(key) % partitions`` (Castagnoli, initial
value 0: ``crc32c(b"123456789") == 0xE3069283``); else, for keyless messages, a *sticky*
partition that moves on after each request (Kafka's sticky partitioner: requests fill up instead
of being cut into one message per partition). ``proto/fluxmq/v1/key_partition_vector.json`` is
the shared test vector: the SDK and the broker must both reproduce it.

Example: 3 partitions. key b"a": crc32c = 3251651376, 3251651376 % 3 = 0 -> partition 0.

The partition count comes from GetQueue and is kept for ``PARTITIONS_MAX_AGE_S``: a queue may
grow (never shrink), and keys move to the new mapping once the count is read again.
"""

from __future__ import annotations

import asyncio
import time

import crc32c

from fluxmq._pb.v1 import queue_pb2 as pb
from fluxmq.client._transport import Transport

PARTITIONS_MAX_AGE_S = 30.0


def key_partition(key: bytes, partitions: int) -> int:
    if partitions < 1:
        raise ValueError(f"partitions must be at least 1, not {partitions}")
    return int(crc32c.crc32c(key)) % partitions


class PartitionMap:
    """The partition count of one queue, read through GetQueue and kept for a while, and the
    sticky partition of keyless messages."""

    def __init__(self, transport: Transport, queue: str) -> None:
        self._transport = transport
        self._queue = queue
        self._partitions = 0
        self._read_at = 0.0
        self._reading: asyncio.Future[int] | None = None
        self.sticky = 0

    async def partitions(self) -> int:
        """The queue's partition count; raises FluxMQError when GetQueue fails. Callers that
        ask while a read is on its way share it (one GetQueue, and they all queue their
        messages together when it answers)."""
        if self._partitions and time.monotonic() - self._read_at <= PARTITIONS_MAX_AGE_S:
            return self._partitions
        if self._reading is None:
            self._reading = asyncio.ensure_future(self._read())
        reading = self._reading
        try:
            return await asyncio.shield(reading)
        finally:
            if self._reading is reading and reading.done():
                self._reading = None

    async def _read(self) -> int:
        queue = await self._transport.unary(
            "queue", "GetQueue", pb.GetQueueRequest(name=self._queue), safe=True,
            queue=self._queue,
        )  # fmt: skip
        self._partitions = max(1, int(queue.config.partitions))
        self._read_at = time.monotonic()
        self.sticky %= self._partitions
        return self._partitions

    def partition_of(self, message: pb.PublishMessage, partitions: int) -> int:
        if message.HasField("partition"):
            return int(message.partition)
        if message.HasField("key"):
            return key_partition(message.key, partitions)
        return self.keyless(partitions)

    def keyless(self, partitions: int) -> int:
        """The partition a message with neither a partition nor a key goes to now."""
        return self.sticky % partitions

    def request_formed(self, partition: int) -> None:
        """A request for ``partition`` left: keyless messages go to the next one from now on."""
        if partition == self.sticky and self._partitions:
            self.sticky = (self.sticky + 1) % self._partitions
