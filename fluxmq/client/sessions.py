"""The SDK's side of an idempotent producer session on one queue (the broker's side:
fluxmq/core/producers.py).

A session numbers the messages sent to each partition: a request is stamped with the producer
id, the epoch and the sequence of its first message when it is formed, and keeps that stamp for
every resend, so the broker answers a resend whose first attempt was stored with that attempt's
offsets instead of storing it again.

The session is named (``sdk-<random>`` unless you name it), so starting it again bumps its
epoch. That is how it recovers when a request ends in an error: the partition's next sequence
would wait forever behind a range that was never stored, so the session is renewed, and from the
broker's next answer on every request still stamped with the old epoch is refused
(PRODUCER_FENCED, or OUT_OF_ORDER_SEQUENCE behind the gap): nothing stamped with it can be stored
any more, so those requests are stamped again with the new epoch and sent. A resend of one
request is never stored twice, because a stamp only changes after the broker refused it.

A named producer (``producer_name``) fences older instances of itself: the previous holder of
the name gets PRODUCER_FENCED on its next publish.
"""

from __future__ import annotations

import asyncio
import uuid
from dataclasses import dataclass

from fluxmq._pb.v1 import queue_pb2 as pb
from fluxmq.client._transport import Transport
from fluxmq.client.errors import FluxMQError

# Reasons after which a request is stamped again, if its stamp is older than the session.
RESTAMP_REASONS = frozenset({"PRODUCER_FENCED", "OUT_OF_ORDER_SEQUENCE"})
UNKNOWN_PRODUCER = "UNKNOWN_PRODUCER"


@dataclass(frozen=True, slots=True)
class Stamp:
    generation: int  # the session's renewals when the stamp was made
    session: pb.ProducerSession


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
        self.generation = 0  # bumped by every renewal, before the broker is asked
        self.renewals = 0

    @property
    def producer_name(self) -> str:
        return self._name

    async def stamp(self, partition: int, count: int) -> Stamp:
        """The stamp of a new request of ``count`` messages to ``partition``."""
        while self._starting is not None or self._producer_id == 0:
            if self._starting is None:
                self._starting = asyncio.ensure_future(self._start())
            starting = self._starting
            try:
                await asyncio.shield(starting)
            finally:
                if self._starting is starting and starting.done():
                    self._starting = None
        first = self._next.get(partition, 0)
        self._next[partition] = first + count
        session = pb.ProducerSession(
            producer_id=self._producer_id, producer_epoch=self._epoch, first_sequence=first
        )
        return Stamp(self.generation, session)

    def is_stale(self, stamp: Stamp) -> bool:
        return stamp.generation != self.generation

    def restamp_after(self, err: FluxMQError, stamp: Stamp) -> bool:
        """Whether a request refused with ``err`` is to be stamped again and sent (renewing the
        session when the broker forgot it)."""
        if err.reason == UNKNOWN_PRODUCER:
            self.renew(stamp)
            return True
        return err.reason in RESTAMP_REASONS and self.is_stale(stamp)

    def renew(self, stamp: Stamp) -> None:
        """Start the next epoch (once per generation, however many requests ask)."""
        if self.is_stale(stamp):
            return
        self.generation += 1
        self.renewals += 1
        self._producer_id = 0
        self._next.clear()

    async def _start(self) -> None:
        resp = await self._transport.unary(
            "queue", "InitProducer",
            pb.InitProducerRequest(queue=self._queue, producer_name=self._name),
            safe=True, queue=self._queue,
        )  # fmt: skip
        self._producer_id = int(resp.producer_id)
        self._epoch = int(resp.producer_epoch)
