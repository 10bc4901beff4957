"""The machinery of the blocking :class:`~fluxmq.client.Client`: an event loop in a daemon
thread, and blocking wrappers of the asyncio objects that live on it."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import inspect
import threading
from collections.abc import AsyncIterator, Callable, Coroutine
from types import TracebackType
from typing import Any, TypeVar

from fluxmq._pb.v1 import queue_pb2 as pb
from fluxmq.client.admin import Admin
from fluxmq.client.buffered import BufferedProducer
from fluxmq.client.consumer import Consumer, Message
from fluxmq.client.producer import PublishResult

T = TypeVar("T")
_END = object()


class LoopThread:
    """An asyncio loop running in a daemon thread; ``run()`` blocks on a coroutine there."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.closed = False
        self._thread = threading.Thread(target=self._main, name="fluxmq-client", daemon=True)
        self._thread.start()

    def _main(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_forever()

    def run(self, coro: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
        if threading.current_thread() is self._thread:
            coro.close()
            raise RuntimeError("a blocking FluxMQ call from the client's own event loop thread")
        if self.closed:
            coro.close()
            raise RuntimeError("the client is closed")
        fut = asyncio.run_coroutine_threadsafe(coro, self.loop)
        try:
            return fut.result(timeout)
        except BaseException:
            fut.cancel()  # e.g. KeyboardInterrupt while waiting: stop the coroutine too
            raise

    def close(self) -> None:
        if self.closed:
            return

        async def shutdown() -> None:
            me = asyncio.current_task()
            tasks = [t for t in asyncio.all_tasks() if t is not me]
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            await self.loop.shutdown_asyncgens()

        with contextlib.suppress(Exception):
            self.run(shutdown(), timeout=10)
        self.closed = True
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)
        if not self._thread.is_alive():
            self.loop.close()


class SyncMessage:
    """A :class:`~fluxmq.client.consumer.Message` whose ``ack`` / ``nack`` / ``extend`` block."""

    __slots__ = ("_loop", "message")

    def __init__(self, message: Message, loop: LoopThread) -> None:
        self.message = message
        self._loop = loop

    data = property(lambda self: self.message.data)
    value = property(lambda self: self.message.value)
    key = property(lambda self: self.message.key)
    headers = property(lambda self: self.message.headers)
    partition = property(lambda self: self.message.partition)
    offset = property(lambda self: self.message.offset)
    attempt = property(lambda self: self.message.attempt)
    timestamp_ms = property(lambda self: self.message.timestamp_ms)
    queue = property(lambda self: self.message.queue)
    group = property(lambda self: self.message.group)

    @property
    def receipt(self) -> pb.Receipt:
        return self.message.receipt

    @property
    def settled(self) -> bool:
        return self.message.settled

    def ack(self, *, wait: bool = False) -> str | None:
        return self._loop.run(self.message.ack(wait=wait))

    def nack(self, *, delay_ms: int | None = None, dead: bool = False, reason: str = "") -> str:
        return self._loop.run(self.message.nack(delay_ms=delay_ms, dead=dead, reason=reason))

    def extend(self, lease_ms: int | None = None) -> int:
        return self._loop.run(self.message.extend(lease_ms))

    def __repr__(self) -> str:
        return repr(self.message)


class _SyncIterator:
    """A blocking iterator over an async one that starts and closes, run on ``loop``."""

    def __init__(self, source: Any, loop: LoopThread) -> None:
        self._source = source
        self._loop = loop

    def __iter__(self) -> _SyncIterator:
        return self

    def _next_item(self) -> Any:
        item = self._loop.run(_next(self._source))
        if item is _END:
            raise StopIteration
        return item

    def __next__(self) -> Any:
        return self._next_item()

    def close(self) -> None:
        self._loop.run(self._source.close())

    def __enter__(self) -> Any:
        self._loop.run(self._source.start())
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


class SyncConsumer(_SyncIterator):
    """A blocking iterator of :class:`SyncMessage`."""

    def __init__(self, consumer: Consumer, loop: LoopThread) -> None:
        super().__init__(consumer, loop)
        self.consumer = consumer

    def __next__(self) -> SyncMessage:
        item = self._next_item()
        assert isinstance(item, Message)
        return SyncMessage(item, self._loop)

    def stop(self) -> None:
        """Thread-safe: no new leases; the iteration ends after what is leased."""
        self._loop.loop.call_soon_threadsafe(self.consumer.stop)

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._loop.run(self.consumer.__aexit__(exc_type, exc, tb))


class SyncRecords(_SyncIterator):
    """A blocking iterator of :class:`~fluxmq.client.reader.StreamRecord` over an async one
    that starts and closes (``client.reader()``, ``client.tail()``); use ``with``."""

    def __init__(self, records: Any, loop: LoopThread) -> None:
        super().__init__(records, loop)
        self.records = records


async def _next(consumer: Any) -> Any:
    try:
        return await consumer.__anext__()
    except StopAsyncIteration:
        return _END


class SyncProducer:
    """A blocking :class:`~fluxmq.client.producer.BufferedProducer`: ``send()`` returns a
    ``concurrent.futures.Future`` of the message's PublishResult."""

    def __init__(self, producer: BufferedProducer, loop: LoopThread) -> None:
        self.producer = producer
        self._loop = loop

    def send(self, value: Any, **kwargs: Any) -> concurrent.futures.Future[PublishResult]:
        out: concurrent.futures.Future[PublishResult] = concurrent.futures.Future()

        async def send() -> None:
            fut = await self.producer.send(value, **kwargs)

            def copy(f: asyncio.Future[PublishResult]) -> None:
                if f.cancelled():
                    out.cancel()
                elif (exc := f.exception()) is not None:
                    out.set_exception(exc)
                else:
                    out.set_result(f.result())

            fut.add_done_callback(copy)

        self._loop.run(send())
        return out

    def flush(self) -> None:
        self._loop.run(self.producer.flush())

    def close(self) -> None:
        self._loop.run(self.producer.close())

    def __enter__(self) -> SyncProducer:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._loop.run(self.producer.__aexit__(exc_type, exc, tb))


class SyncAdmin:
    """:class:`~fluxmq.client.admin.Admin` with blocking methods; the listings
    (``list_queues``, ``list_dead_letters``) return lists (every page)."""

    def __init__(self, admin: Admin, loop: LoopThread) -> None:
        self._admin = admin
        self._loop = loop

    def __getattr__(self, name: str) -> Callable[..., Any]:
        if name.startswith("_"):
            raise AttributeError(name)
        method = getattr(self._admin, name)

        def call(*args: Any, **kwargs: Any) -> Any:
            result = method(*args, **kwargs)
            if inspect.isasyncgen(result):
                return self._loop.run(_collect(result))
            if inspect.iscoroutine(result):
                return self._loop.run(result)
            return result

        call.__name__ = name
        call.__doc__ = method.__doc__
        return call

    def __dir__(self) -> list[str]:
        return [n for n in dir(self._admin) if not n.startswith("_")]


async def _collect(items: AsyncIterator[T]) -> list[T]:
    return [x async for x in items]
