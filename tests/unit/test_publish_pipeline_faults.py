"""Review of PublishPipeline (fluxmq/client/pipeline.py): callers that hang, tasks whose
exception nobody reads, and requests beyond the window, against a transport twin."""

from __future__ import annotations

import asyncio
import gc
from typing import Any

import grpc
import pytest

from fluxmq.client import AsyncClient
from fluxmq.client.errors import FluxMQError
from fluxmq.client.pipeline import PublishPipeline
from tests.unit.test_publish_pipeline import TransportTwin, message


class FrozenStream:
    """A PublishStream to a node that stopped reading (frozen process, lost network): a write
    never completes and no answer comes, until the client cancels the call."""

    def __init__(self) -> None:
        self.cancelled = asyncio.Event()
        self.writes = 0

    def __aiter__(self) -> FrozenStream:
        return self

    async def __anext__(self) -> Any:
        await self.cancelled.wait()
        raise asyncio.CancelledError  # as grpc.aio does once the call is cancelled

    async def write(self, request: Any) -> None:
        self.writes += 1
        await self.cancelled.wait()
        raise asyncio.CancelledError

    def cancel(self) -> None:
        self.cancelled.set()


class FrozenNodeTwin(TransportTwin):
    timeout_s = 0.3

    def __init__(self) -> None:
        super().__init__()
        self.streams: list[FrozenStream] = []

    def publish_stream(self, address: str) -> Any:
        stream = FrozenStream()
        self.streams.append(stream)
        return stream


async def test_a_stream_write_that_never_completes_falls_back_within_the_timeout() -> None:
    twin = FrozenNodeTwin()
    pipeline = PublishPipeline(twin, "q")  # type: ignore[arg-type]
    try:
        # The leader is known (leader_of), so the first request already takes the stream.
        result = await asyncio.wait_for(pipeline.publish(message(b"x"), 1), 3.0)
    finally:
        for s in twin.streams:
            s.cancel()
        await asyncio.wait_for(pipeline.close(), 3.0)
    assert twin.streams and twin.streams[0].writes == 1
    assert result.offset == 0 and twin.requests == [[b"x"]]  # sent again, unary


async def test_requests_sent_again_one_by_one_stay_within_the_window() -> None:
    twin = TransportTwin(delay_s=0.01)  # its streams are refused: every request is unary
    pipeline = PublishPipeline(twin, "q", window=1)  # type: ignore[arg-type]
    values = [b"g%d" % i for i in range(30)]
    values.insert(5, b"bad")
    outcomes = await asyncio.gather(
        *(pipeline.publish(message(v), len(v)) for v in values), return_exceptions=True
    )
    assert pipeline.requests_split >= 1
    assert sum(isinstance(o, BaseException) for o in outcomes) == 1
    assert twin.in_flight_max == 1, twin.in_flight_max


async def test_a_publish_after_close_leaves_no_unretrieved_task_exception() -> None:
    loop = asyncio.get_running_loop()
    reported: list[dict[str, Any]] = []
    previous = loop.get_exception_handler()
    loop.set_exception_handler(lambda _loop, context: reported.append(context))
    try:
        client = AsyncClient("127.0.0.1:1")
        await client.close()
        with pytest.raises(Exception):  # noqa: B017 - any clear error will do
            await asyncio.wait_for(client.publish("q", b"late"), 3.0)
        for _ in range(3):
            await asyncio.sleep(0)
        gc.collect()
        await asyncio.sleep(0)
    finally:
        loop.set_exception_handler(previous)
    assert not reported, [c.get("message") for c in reported]


async def test_a_request_that_timed_out_is_not_sent_again_one_message_per_request() -> None:
    """DEADLINE_EXCEEDED (the transport's own retries spent) says nothing about any one
    message: sending each message again alone only multiplies the load and the wait."""

    class Slow(TransportTwin):
        async def unary(self, service: str, method: str, request: Any, **_: Any) -> Any:
            self.requests.append([m.value for m in request.messages])
            await asyncio.sleep(0.01)
            raise FluxMQError(grpc.StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded")

    twin = Slow()
    pipeline = PublishPipeline(twin, "q", window=1)  # type: ignore[arg-type]
    outcomes = await asyncio.gather(
        *(pipeline.publish(message(b"t%d" % i), 2) for i in range(10)), return_exceptions=True
    )
    assert all(isinstance(o, FluxMQError) for o in outcomes), outcomes
    # The callers share one or two requests, none sent again one message at a time.
    assert len(twin.requests) <= 2, [len(r) for r in twin.requests]


async def test_cancelling_the_send_during_a_stream_write_cancels_it_not_resends_unary() -> None:
    """asyncio.run() and the blocking Client's LoopThread.close() cancel every task at the
    end: a request being written on the stream must stop, not go out again on the unary path."""
    twin = FrozenNodeTwin()
    twin.timeout_s = 30.0
    pipeline = PublishPipeline(twin, "q")  # type: ignore[arg-type]
    caller = asyncio.ensure_future(pipeline.publish(message(b"x"), 1))
    for _ in range(20):
        await asyncio.sleep(0)
    assert twin.streams and twin.streams[0].writes == 1  # the write is under way
    sends = list(pipeline._tasks)
    for task in sends:
        task.cancel()
    await asyncio.wait_for(asyncio.gather(*sends, caller, return_exceptions=True), 3.0)
    assert all(t.cancelled() for t in sends), [t for t in sends if not t.cancelled()]
    assert caller.cancelled()
    assert twin.requests == []  # nothing sent once cancelled
