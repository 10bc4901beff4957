"""Publishing: one message, a batch, or a buffering producer.

Every message the SDK sends carries an idempotency key (yours, or a generated one: a random
128-bit producer id plus a sequence number, as unique as a uuid4 per message). A retry after a
lost answer — a broker restarted or a leader failed mid-request — therefore stores nothing twice:
the broker answers a repeated key within the queue's ``dedup_window`` (default 2 minutes) with
the first write's partition and offset and ``duplicate=True``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from types import TracebackType
from typing import Any, NamedTuple

from fluxmq._pb.v1 import queue_pb2 as pb
from fluxmq.client._transport import Transport
from fluxmq.client.codecs import Codec, to_bytes
from fluxmq.client.errors import FluxMQError

log = logging.getLogger("fluxmq.client")

MAX_BATCH = 1000  # messages per Publish request (the broker's limit)
Headers = Mapping[str, str | bytes]
Key = str | bytes


class PublishResult(NamedTuple):
    """Where a message was stored. ``duplicate``: its idempotency key was seen within the
    dedup window, so this is the first write's position and nothing new was stored.
    ``pending``: asynchronous replication, no offset yet."""

    partition: int
    offset: int
    timestamp_ms: int
    duplicate: bool = False
    pending: bool = False


@dataclass(slots=True)
class OutgoingMessage:
    """One message of :func:`publish_batch`, when it needs more than a value."""

    value: Any
    key: Key | None = None
    headers: Headers | None = None
    partition: int | None = None
    delay_ms: int | None = None
    deliver_at_ms: int | None = None
    idempotency_key: str | None = None


class IdempotencyKeys:
    """``<random 128-bit hex>-<n>``: unique per message, cheap to make."""

    __slots__ = ("_n", "_prefix")

    def __init__(self) -> None:
        self._prefix = uuid.uuid4().hex
        self._n = 0

    def next(self) -> str:
        self._n += 1
        return f"{self._prefix}-{self._n}"


def fill(
    m: pb.PublishMessage,
    codec: Codec,
    keys: IdempotencyKeys,
    value: Any,
    key: Key | None = None,
    headers: Headers | None = None,
    partition: int | None = None,
    delay_ms: int | None = None,
    deliver_at_ms: int | None = None,
    idempotency_key: str | None = None,
    idempotent: bool = True,
) -> int:
    """Fills a PublishMessage; returns its size in bytes (key + value + headers). The
    idempotency key is the given one, else (``idempotent``) a generated one."""
    raw = codec.encode(value)
    m.value = raw
    size = len(raw)
    if key is not None:
        k = to_bytes(key)
        m.key = k
        size += len(k)
    if headers:
        for name, v in headers.items():
            hv = to_bytes(v)
            m.headers[name] = hv
            size += len(name) + len(hv)
    if partition is not None:
        m.partition = partition
    if delay_ms:
        m.delay_ms = delay_ms
    if deliver_at_ms:
        m.deliver_at_ms = deliver_at_ms
    if idempotency_key:
        m.idempotency_key = idempotency_key
    elif idempotent:
        m.idempotency_key = keys.next()
    return size


def results_of(resp: pb.PublishResponse) -> list[PublishResult]:
    return [
        PublishResult(r.partition, r.offset, r.timestamp_ms, r.duplicate, r.pending)
        for r in resp.results
    ]


async def send_request(
    transport: Transport,
    request: pb.PublishRequest,
    timeout_s: float | None = None,
    *,
    safe: bool = True,
    give_up: Callable[[FluxMQError], bool] | None = None,
) -> list[PublishResult]:
    """One Publish. ``safe``: every message has an idempotency key (or the request a producer
    session), so a retry after a lost answer stores nothing twice (otherwise only failures
    where nothing was written are retried). ``give_up``: errors not to retry after all."""
    resp = await transport.unary(
        "queue", "Publish", request, safe=safe, queue=request.queue, timeout_s=timeout_s,
        give_up=give_up,
    )  # fmt: skip
    return results_of(resp)


async def publish_batch(
    transport: Transport,
    keys: IdempotencyKeys,
    codec: Codec,
    queue: str,
    messages: Iterable[OutgoingMessage | Any],
    timeout_s: float | None = None,
) -> list[PublishResult]:
    """Publishes in requests of at most 1000 messages, in order; each request is all or
    nothing (a failure raises, and earlier requests of the same call stay published)."""
    out: list[PublishResult] = []
    request = pb.PublishRequest(queue=queue)
    for item in messages:
        m = request.messages.add()
        if isinstance(item, OutgoingMessage):
            fill(
                m, codec, keys, item.value, item.key, item.headers, item.partition,
                item.delay_ms, item.deliver_at_ms, item.idempotency_key,
            )  # fmt: skip
        else:
            fill(m, codec, keys, item)
        if len(request.messages) == MAX_BATCH:
            out.extend(await send_request(transport, request, timeout_s))
            request = pb.PublishRequest(queue=queue)
    if request.messages:
        out.extend(await send_request(transport, request, timeout_s))
    return out


_Batch = tuple[pb.PublishRequest, list["asyncio.Future[PublishResult]"], bool]


class BufferedProducer:
    """Collects messages into Publish requests and sends them in the background.

    A request leaves when it holds ``max_messages`` (<= 1000) messages or ``max_bytes``, or
    ``linger_ms`` after its first message; up to ``max_in_flight`` requests are sent at once
    (order between requests is kept only with ``max_in_flight=1``, the default). ``send``
    waits only when ``max_buffered`` messages are not settled yet (backpressure).

    Each message gets an idempotency key, and failed requests are retried (the client's
    RetryPolicy), so a retry after a lost answer never duplicates a message. A request that
    still fails sets the error on its messages' futures and is raised by the next ``flush()``.
    ``idempotent=False`` sends no generated keys: the broker does less work per message (it
    stores no dedup entry), but a request whose answer was lost is not retried (it may have
    been written), only failures where nothing was written are.

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
        max_messages: int = MAX_BATCH,
        max_bytes: int = 1024 * 1024,
        linger_ms: float = 5.0,
        max_in_flight: int = 1,
        max_buffered: int | None = None,
        timeout_s: float | None = None,
        idempotent: bool = True,
    ) -> None:
        if not 1 <= max_messages <= MAX_BATCH:
            raise ValueError(f"max_messages must be 1..{MAX_BATCH}")
        if max_bytes < 1 or linger_ms < 0 or max_in_flight < 1:
            raise ValueError("max_bytes and max_in_flight must be positive, linger_ms >= 0")
        self.queue = queue
        self._transport = transport
        self._codec = codec
        self._keys = IdempotencyKeys()
        self._max_messages = max_messages
        self._max_bytes = max_bytes
        self._linger_s = linger_ms / 1000
        self._max_in_flight = max_in_flight
        self._max_buffered = max_buffered or max_messages * (max_in_flight + 2)
        self._timeout_s = timeout_s
        self._idempotent = idempotent
        self._keyless = False  # a message of the current request has no idempotency key
        self._loop: asyncio.AbstractEventLoop | None = None
        self._request = pb.PublishRequest(queue=queue)
        self._futures: list[asyncio.Future[PublishResult]] = []
        self._bytes = 0
        # requests to send: (request, its messages' futures, whether it may be repeated)
        self._ready: deque[_Batch] = deque()
        self._wakeup = asyncio.Event()
        self._room = asyncio.Event()
        self._room.set()
        self._idle = asyncio.Event()
        self._idle.set()
        self._unsettled = 0
        self._timer: asyncio.TimerHandle | None = None
        self._workers: list[asyncio.Task[None]] = []
        self._errors: list[BaseException] = []
        self._closing = False
        self.closed = False
        self.sent_messages = 0
        self.sent_requests = 0

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
        while self._unsettled >= self._max_buffered:
            self._room.clear()
            await self._room.wait()
            if self._closing:
                raise RuntimeError("the producer is closed")
        loop = self._loop
        if loop is None:
            loop = self._loop = asyncio.get_running_loop()
        m = self._request.messages.add()
        try:
            size = fill(
                m, self._codec, self._keys, value, key, headers, partition, delay_ms,
                deliver_at_ms, idempotency_key, self._idempotent,
            )  # fmt: skip
        except BaseException:
            del self._request.messages[-1]
            raise
        if not self._idempotent and not idempotency_key:
            self._keyless = True
        fut: asyncio.Future[PublishResult] = loop.create_future()
        self._futures.append(fut)
        self._bytes += size
        self._unsettled += 1
        self._idle.clear()
        if not self._workers:
            self._workers = [
                asyncio.ensure_future(self._worker()) for _ in range(self._max_in_flight)
            ]
        if len(self._futures) >= self._max_messages or self._bytes >= self._max_bytes:
            self._cut()
        elif self._timer is None:
            self._timer = loop.call_later(self._linger_s, self._cut)
        return fut

    def _cut(self) -> None:
        """The buffered messages become a request to send."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if not self._futures:
            return
        self._ready.append((self._request, self._futures, not self._keyless))
        self._keyless = False
        self._request = pb.PublishRequest(queue=self.queue)
        self._futures = []
        self._bytes = 0
        self._wakeup.set()

    async def _worker(self) -> None:
        while True:
            while not self._ready:
                if self._closing:
                    return
                self._wakeup.clear()
                await self._wakeup.wait()
            request, futures, safe = self._ready.popleft()
            try:
                results = await send_request(self._transport, request, self._timeout_s, safe=safe)
            except asyncio.CancelledError:
                for f in futures:
                    f.cancel()
                raise
            except Exception as exc:  # handed to the futures and flush()
                if not isinstance(exc, FluxMQError):
                    log.exception("fluxmq: publishing to %s failed", self.queue)
                self._errors.append(exc)
                for f in futures:
                    if not f.done():
                        f.set_exception(exc)
                        f.exception()  # flush() reports it; no "never retrieved" warning
            else:
                self.sent_requests += 1
                self.sent_messages += len(results)
                for f, r in zip(futures, results, strict=True):
                    if not f.done():
                        f.set_result(r)
            finally:
                self._unsettled -= len(futures)
                if self._unsettled < self._max_buffered:
                    self._room.set()
                if self._unsettled == 0:
                    self._idle.set()

    async def flush(self) -> None:
        """Sends what is buffered and waits until every message sent so far is settled;
        raises the first error of a failed request since the previous flush."""
        self._cut()
        await self._idle.wait()
        if self._errors:
            errors, self._errors = self._errors, []
            raise errors[0]

    async def close(self) -> None:
        """Flushes (raising its error, if any), then stops the background senders."""
        if self.closed:
            return
        try:
            await self.flush()
        finally:
            self._closing = True
            self._wakeup.set()
            self._room.set()
            for w in self._workers:
                if not w.done():
                    w.cancel()
            for w in self._workers:
                with contextlib.suppress(asyncio.CancelledError):
                    await w
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
