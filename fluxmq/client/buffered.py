"""``client.producer(queue)``: a buffering producer on top of the queue's publish pipeline."""

from __future__ import annotations

import asyncio
import logging
from types import TracebackType
from typing import Any

from fluxmq._pb.v1 import queue_pb2 as pb
from fluxmq.client._transport import Transport
from fluxmq.client.codecs import Codec
from fluxmq.client.pipeline import LanePool, PublishPipeline
from fluxmq.client.producer import (
    MAX_BATCH,
    Headers,
    Key,
    PublishResult,
    fill,
)

log = logging.getLogger("fluxmq.client")


class BufferedProducer:
    """Collects messages into Publish requests and sends them in the background.

    A request leaves when it holds ``max_messages`` (<= 1000) messages or ``max_bytes``, or
    ``linger_ms`` after its first message; up to ``max_in_flight`` requests are sent at once.
    ``send`` waits only when ``max_buffered`` messages are not settled yet (backpressure).

    The messages travel like ``publish()``'s (fluxmq/client/pipeline.py): the SDK picks each
    message's partition, a request holds one partition's messages in the producer session
    (fluxmq/client/sessions.py), and a resend after a lost answer is answered with the first
    offsets, never stored twice; each partition keeps its order, also across retries and with
    several requests in flight. Messages with your own ``idempotency_key`` are deduplicated
    by it instead. A request that still fails sets the error on its messages' futures and is
    raised by the next ``flush()``. ``idempotent=False`` sends neither a session nor keys: a
    request whose answer was lost is not sent again (it may have been written), only failures
    where nothing was written are.

    ::

        async with client.producer("orders", linger_ms=5) as producer:
            fut = await producer.send({"id": 1}, key="user-7")
            ...
        # leaving the block flushed everything; (await fut).offset is known
    """

    def __init__(
        self,
        transport: Transport,
        queue: str,
        codec: Codec,
        *,
        lanes: LanePool | None = None,
        max_messages: int = MAX_BATCH,
        max_bytes: int = 1024 * 1024,
        linger_ms: float = 5.0,
        max_in_flight: int = 1,
        max_buffered: int | None = None,
        idempotent: bool = True,
    ) -> None:
        if not 1 <= max_messages <= MAX_BATCH:
            raise ValueError(f"max_messages must be 1..{MAX_BATCH}")
        if max_bytes < 1 or linger_ms < 0 or max_in_flight < 1:
            raise ValueError("max_bytes and max_in_flight must be positive, linger_ms >= 0")
        self.queue = queue
        self._codec = codec
        self._idempotent = idempotent
        self._pipeline = PublishPipeline(
            transport,
            queue,
            lanes=lanes,
            window=max_in_flight,
            linger_ms=linger_ms,
            messages_max=max_messages,
            bytes_max=max_bytes,
            pending_max=max_buffered or max_messages * (max_in_flight + 2),
        )
        self._unsettled: set[asyncio.Future[PublishResult]] = set()
        self._idle = asyncio.Event()
        self._idle.set()
        self._errors: list[BaseException] = []
        self._closing = False
        self.closed = False

    @property
    def pipeline(self) -> PublishPipeline:
        return self._pipeline

    @property
    def sent_requests(self) -> int:
        return self._pipeline.requests_sent

    @property
    def sent_messages(self) -> int:
        return self._pipeline.messages_sent

    async def send(
        self,
        value: Any,
        *,
        key: Key | None = None,
        headers: Headers | None = None,
        partition: int | None = None,
        delay_ms: int | None = None,
        deliver_at_ms: int | None = None,
        idempotency_key: str | None = None,
    ) -> asyncio.Future[PublishResult]:
        """Buffers one message; returns a future of its PublishResult (await it, or not)."""
        if self._closing:
            raise RuntimeError("the producer is closed")
        m = pb.PublishMessage()
        size = fill(
            m, self._codec, value, key, headers, partition, delay_ms,
            deliver_at_ms, idempotency_key,
        )  # fmt: skip
        fut = await self._pipeline.submit(m, size, raw=not self._idempotent)
        self._unsettled.add(fut)
        self._idle.clear()
        fut.add_done_callback(self._settled)
        return fut

    def _settled(self, fut: asyncio.Future[PublishResult]) -> None:
        self._unsettled.discard(fut)
        if not fut.cancelled() and fut.exception() is not None:
            self._errors.append(fut.exception())  # type: ignore[arg-type]
        if not self._unsettled:
            self._idle.set()

    async def flush(self) -> None:
        """Sends what is buffered and waits until every message sent so far is settled;
        raises the first error of a failed request since the previous flush."""
        self._pipeline.flush_now()
        await self._idle.wait()
        if self._errors:
            errors, self._errors = self._errors, []
            raise errors[0]

    async def close(self) -> None:
        """Flushes (raising its error, if any), then stops."""
        if self.closed:
            return
        try:
            await self.flush()
        finally:
            self._closing = True
            await self._pipeline.close()
            self.closed = True

    async def __aenter__(self) -> BufferedProducer:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if exc is None:
            await self.close()
            return
        try:
            await self.close()
        except Exception:  # the exception already on its way matters more
            log.exception("fluxmq: flushing producer of %s failed", self.queue)
