"""The SDK's side of an idempotent producer session on one queue (the broker's side:
fluxmq/core/producers.py).

A session numbers the messages sent to each partition: a request is stamped with the producer
id, the epoch and the sequence of its first message when it is formed, and keeps that stamp for
every resend, so the broker answers a resend whose first attempt was stored with that attempt's
offsets instead of storing it again.

When a request ends in an error, the partition's next sequences would wait forever behind a
range that may never be stored, so the session moves to its next epoch (it is named,
``sdk-<random>`` unless you name it, so InitProducer bumps the epoch). From then on nothing
stamped with the old epoch can be stored any more (the broker fences it), and a request of the
old epoch still open is sent once more with its old stamp: the broker answers it with its
offsets if it was stored before the fence (it remembers the last 5 requests per partition, and
a partition's new-epoch requests wait until its old ones are settled, so the answer is still
there), and fences it otherwise: only then is it stamped again, with the new epoch. So a resend
is never stored twice. Requests stamped again keep their order: they are stamped in the order of
their first stamps, before any new request of the partition.

A named producer (``producer_name``) fences older instances of itself: the previous holder of
the name gets PRODUCER_FENCED on its next publish.
"""

from __future__ import annotations

import asyncio
import itertools
import uuid
from dataclasses import dataclass

from fluxmq._pb.v1 import queue_pb2 as pb
from fluxmq.client._transport import Transport

# Reasons after which a request of an older epoch is asked about once more (and, if fenced,
# stamped again with the current epoch).
RESTAMP_REASONS = frozenset({"PRODUCER_FENCED", "OUT_OF_ORDER_SEQUENCE"})
UNKNOWN_PRODUCER = "UNKNOWN_PRODUCER"
# Requests per partition stamped from the oldest one not settled on, at most: the broker
# remembers 5, and a request whose answer was lost must still be among them when it is asked
# about again, however many later ones were stored meanwhile.
IN_FLIGHT_PER_PARTITION_MAX = 4

Order = tuple[int, int]  # a request's place in its partition: (when first stamped, part)


@dataclass(frozen=True, slots=True)
class Stamp:
    generation: int  # the session's renewals when the stamp was made
    partition: int
    order: Order
    session: pb.ProducerSession


@dataclass(slots=True)
class _Open:
    generation: int | None  # the stamp's generation; None: waiting to be stamped (again)


class ProducerSession:
    """One queue's session: sequences per partition, renewed by epoch."""

    def __init__(self, transport: Transport, queue: str, producer_name: str = "") -> None:
        self._transport = transport
        self._queue = queue
        self._name = producer_name or f"sdk-{uuid.uuid4().hex}"
        self._producer_id = 0
        self._epoch = 0
        self._next: dict[int, int] = {}
        self._starting: asyncio.Future[None] | None = None
        self._orders = itertools.count(1)
        self._open: dict[int, dict[Order, _Open]] = {}  # partition -> requests not settled
        # Per partition, this epoch's stamps from the oldest one not settled on: a request may
        # be settled only after many later ones were stored, and the broker remembers 5.
        self._window: dict[int, list[Order]] = {}
        self._settled: set[Order] = set()
        self._changed: asyncio.Condition | None = None
        self._wakers: set[asyncio.Task[None]] = set()
        self.generation = 0  # bumped by every renewal, before the broker is asked
        self.renewals = 0

    @property
    def producer_name(self) -> str:
        return self._name

    def _condition(self) -> asyncio.Condition:
        if self._changed is None:
            self._changed = asyncio.Condition()
        return self._changed

    async def stamp(self, partition: int, count: int) -> Stamp:
        """The stamp of a new request of ``count`` messages to ``partition`` (after the
        partition's requests of older epochs are settled)."""
        return await self._stamp(partition, count, (next(self._orders), 0))

    async def restamp(self, old: Stamp, count: int, part: int = 0) -> Stamp:
        """A new stamp for a request (or, ``part`` > 0, the ``part``-th message of a request
        sent again one by one) that the broker did not store under ``old``: in its place."""
        order = (old.order[0], part)
        opened = self._open.setdefault(old.partition, {})
        if part == 0:
            opened.pop(old.order, None)
        return await self._stamp(old.partition, count, order)

    def split(self, old: Stamp, parts: int) -> None:
        """``old``'s request is sent again one message at a time: hold a place for each."""
        opened = self._open.setdefault(old.partition, {})
        opened.pop(old.order, None)
        for part in range(1, parts + 1):
            opened[(old.order[0], part)] = _Open(None)
        self._notify()

    def forget(self, old: Stamp, part: int) -> None:
        """The ``part``-th message of a split request is not sent after all."""
        opened = self._open.get(old.partition)
        if opened is not None:
            opened.pop((old.order[0], part), None)
        self._notify()

    def release(self, stamp: Stamp) -> None:
        """The request is settled (stored, or failed for good)."""
        opened = self._open.get(stamp.partition)
        if opened is not None:
            opened.pop(stamp.order, None)
        if stamp.generation == self.generation:
            self._settled.add(stamp.order)
        self._notify()

    def _notify(self) -> None:
        changed = self._changed
        if changed is None:
            return

        async def wake() -> None:
            async with changed:
                changed.notify_all()

        task = asyncio.ensure_future(wake())
        self._wakers.add(task)
        task.add_done_callback(self._wakers.discard)

    async def _stamp(self, partition: int, count: int, order: Order) -> Stamp:
        changed = self._condition()
        opened = self._open.setdefault(partition, {})
        opened[order] = _Open(None)  # in line: stamps are given in order
        try:
            while True:
                await self._ensure_started()
                generation = self.generation
                async with changed:
                    changed.notify_all()  # a request now in line may unblock others
                    await changed.wait_for(lambda: self._may_stamp(partition, order))
                    if generation != self.generation or self._producer_id == 0:
                        continue  # renewed while waiting: start the new epoch first
                    first = self._next.get(partition, 0)
                    self._next[partition] = first + count
                    opened[order] = _Open(generation)
                    self._window.setdefault(partition, []).append(order)
                    session = pb.ProducerSession(
                        producer_id=self._producer_id,
                        producer_epoch=self._epoch,
                        first_sequence=first,
                    )
                    changed.notify_all()
                    return Stamp(generation, partition, order, session)
        except BaseException:
            if opened.get(order) == _Open(None):
                del opened[order]
                self._notify()
            raise

    def _may_stamp(self, partition: int, order: Order) -> bool:
        """No request of the partition is still out under an older epoch, none in line comes
        before ``order``, and the partition has room in flight."""
        current = self.generation
        for other_order, entry in self._open.get(partition, {}).items():
            if other_order == order:
                continue
            if entry.generation is None:
                if other_order < order:
                    return False
            elif entry.generation != current:
                return False
        window = self._window.get(partition)
        if window:
            settled = self._settled
            while window and window[0] in settled:
                settled.discard(window.pop(0))
            return len(window) < IN_FLIGHT_PER_PARTITION_MAX
        return True

    def is_stale(self, stamp: Stamp) -> bool:
        return stamp.generation != self.generation

    def renew(self, stamp: Stamp) -> None:
        """Start the next epoch (once per generation, however many requests ask)."""
        if self.is_stale(stamp):
            return
        self.generation += 1
        self.renewals += 1
        self._producer_id = 0
        self._next.clear()
        self._window.clear()
        self._settled.clear()
        self._notify()

    async def renewed(self) -> None:
        """Wait until the current epoch is granted (so an old stamp is fenced from now on)."""
        await self._ensure_started()

    async def _ensure_started(self) -> None:
        while self._starting is not None or self._producer_id == 0:
            if self._starting is None:
                self._starting = asyncio.ensure_future(self._start())
            starting = self._starting
            try:
                await asyncio.shield(starting)
            finally:
                if self._starting is starting and starting.done():
                    self._starting = None

    async def _start(self) -> None:
        generation = self.generation
        resp = await self._transport.unary(
            "queue", "InitProducer",
            pb.InitProducerRequest(queue=self._queue, producer_name=self._name),
            safe=True, queue=self._queue,
        )  # fmt: skip
        if generation == self.generation:
            self._producer_id = int(resp.producer_id)
            self._epoch = int(resp.producer_epoch)
        self._notify()
