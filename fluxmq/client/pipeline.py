"""Coalescing concurrent ``publish()`` calls: many callers, few requests.

Each ``AsyncClient.publish()`` awaits its own message's result, but the messages of callers that
publish at the same time to the same queue travel together: a :class:`PublishPipeline` per queue
collects them and sends one Publish request for all of them, with up to ``window`` requests in
flight. Nothing waits on a timer: when a request slot is free the messages collected so far leave
on the next turn of the event loop (a caller alone pays no linger), and while every slot is busy
the next request grows (under load, requests fill up by themselves). ``linger_ms`` (default 0)
adds a wait after the first message of a request, for callers that arrive in a trickle.

Each caller gets its own result and its own error. A request is all or nothing on the broker, so
when one fails for a reason a retry cannot fix (one message too large, say) and it held more than
one message, its messages are sent again one per request: each caller then learns the fate of its
own message, and a neighbour's bad message never fails it. That is safe because every message
carries an idempotency key (yours or a generated one): a message whose first request was in fact
written is answered with its first position and ``duplicate=True``, never stored twice.

Ordering: one caller awaiting each ``publish()`` in turn publishes in order. Between concurrent
callers there is no order to keep (their calls race today, one request each); a caller that
needs the order of many messages uses ``publish_batch`` or a producer with ``max_in_flight=1``.

Bounds: a request holds at most ``messages_max`` messages (<= 1000, the broker's limit) and about
``bytes_max`` bytes; ``pending_max`` messages wait at most (further callers wait for room).
"""

from __future__ import annotations

import asyncio
from collections import deque
from dataclasses import dataclass

from fluxmq._pb.v1 import queue_pb2 as pb
from fluxmq.client._transport import Transport
from fluxmq.client.errors import FluxMQError
from fluxmq.client.producer import MAX_BATCH, PublishResult, send_request

WINDOW_DEFAULT = 4
BYTES_MAX_DEFAULT = 1 << 20
PENDING_MAX_DEFAULT = 10_000


@dataclass(slots=True)
class _Waiting:
    message: pb.PublishMessage
    size_bytes: int
    result: asyncio.Future[PublishResult]


class PublishPipeline:
    """The coalescing sender of one queue (see the module docstring)."""

    def __init__(
        self,
        transport: Transport,
        queue: str,
        *,
        window: int = WINDOW_DEFAULT,
        linger_ms: float = 0.0,
        messages_max: int = MAX_BATCH,
        bytes_max: int = BYTES_MAX_DEFAULT,
        pending_max: int = PENDING_MAX_DEFAULT,
    ) -> None:
        if window < 1:
            raise ValueError(f"window must be at least 1, not {window}")
        if not 1 <= messages_max <= MAX_BATCH:
            raise ValueError(f"messages_max must be 1..{MAX_BATCH}, not {messages_max}")
        if linger_ms < 0 or bytes_max < 1 or pending_max < 1:
            raise ValueError("linger_ms must be >= 0, bytes_max and pending_max positive")
        self.queue = queue
        self._transport = transport
        self._window = window
        self._linger_s = linger_ms / 1000
        self._messages_max = messages_max
        self._bytes_max = bytes_max
        self._pending_max = pending_max
        self._pending: deque[_Waiting] = deque()
        self._in_flight = 0
        self._scheduled = False  # a send is due on the next loop turn (or after the linger)
        self._room = asyncio.Event()
        self._room.set()
        self._tasks: set[asyncio.Task[None]] = set()
        self.requests_sent = 0
        self.messages_sent = 0
        self.requests_split = 0  # failed requests whose messages were sent again one by one

    async def publish(self, message: pb.PublishMessage, size_bytes: int) -> PublishResult:
        """Send ``message`` with whatever else is waiting; -> its own result."""
        while len(self._pending) >= self._pending_max:
            self._room.clear()
            await self._room.wait()
        loop = asyncio.get_running_loop()
        waiting = _Waiting(message, size_bytes, loop.create_future())
        self._pending.append(waiting)
        self._maybe_schedule(loop)
        return await waiting.result

    def _maybe_schedule(self, loop: asyncio.AbstractEventLoop) -> None:
        if self._scheduled or not self._pending or self._in_flight >= self._window:
            return
        self._scheduled = True
        if self._linger_s > 0:
            loop.call_later(self._linger_s, self._send_ready)
        else:
            loop.call_soon(self._send_ready)

    def _send_ready(self) -> None:
        """Start requests for what is waiting, while request slots are free."""
        self._scheduled = False
        while self._pending and self._in_flight < self._window:
            taken = self._take()
            if not taken:
                continue
            self._in_flight += 1
            task = asyncio.ensure_future(self._send(taken))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    def _take(self) -> list[_Waiting]:
        """The next request's messages: callers that gave up (cancelled) are left out."""
        taken: list[_Waiting] = []
        size = 0
        while self._pending and len(taken) < self._messages_max:
            w = self._pending[0]
            if taken and size + w.size_bytes > self._bytes_max:
                break
            self._pending.popleft()
            if w.result.done():
                continue
            taken.append(w)
            size += w.size_bytes
        if len(self._pending) < self._pending_max:
            self._room.set()
        return taken

    async def _send(self, taken: list[_Waiting]) -> None:
        try:
            await self._send_request(taken)
        finally:
            self._in_flight -= 1
            self._maybe_schedule(asyncio.get_running_loop())

    async def _send_request(self, taken: list[_Waiting]) -> None:
        request = pb.PublishRequest(queue=self.queue)
        request.messages.extend(w.message for w in taken)
        try:
            results = await send_request(self._transport, request, safe=True)
        except FluxMQError as err:
            if len(taken) > 1 and not err.retriable:
                # All or nothing on the broker: find out whose message it was.
                self.requests_split += 1
                await asyncio.gather(*(self._send_request([w]) for w in taken))
                return
            _fail(taken, err)
            return
        except BaseException as err:  # cancelled, or a bug: every caller hears of it
            _fail(taken, err)
            raise
        self.requests_sent += 1
        self.messages_sent += len(results)
        for w, r in zip(taken, results, strict=True):
            if not w.result.done():
                w.result.set_result(r)

    async def close(self) -> None:
        """Wait for the requests in flight and those still waiting to be answered."""
        while self._tasks or self._pending:
            if self._tasks:
                await asyncio.gather(*self._tasks, return_exceptions=True)
            else:
                await asyncio.sleep(0)


def _fail(taken: list[_Waiting], err: BaseException) -> None:
    for w in taken:
        if not w.result.done():
            if isinstance(err, asyncio.CancelledError):
                w.result.cancel()
            else:
                w.result.set_exception(err)
