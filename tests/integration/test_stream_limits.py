"""Streams are bounded per node and never end with INTERNAL (issue 20, item 7): beyond
``streams_max`` a Tail, Consume or PublishStream is refused at once with RESOURCE_EXHAUSTED /
TOO_MANY_STREAMS (retriable, with RetryInfo) while the open ones keep working; and more Tail
streams than LMDB has reader slots (256) all read every message. Real node processes."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import grpc
import pytest
from google.rpc import error_details_pb2
from grpc_status import rpc_status

from fluxmq._pb.v1 import queue_pb2 as pb
from fluxmq._pb.v1 import queue_pb2_grpc
from storage.lmdb_store import MAX_READERS
from tests.integration.conftest import Node

STREAMS_MAX = 4
WAIT_S = 30.0


@pytest.fixture
def small_node(tmp_path: Path) -> Iterator[Node]:
    n = Node(tmp_path / "node", "--streams-max", str(STREAMS_MAX))
    n.start()
    yield n
    n.stop()


def refusal(err: grpc.aio.AioRpcError) -> tuple[grpc.StatusCode, str, str, int | None]:
    """-> (code, reason, retriable, RetryInfo delay in ms)."""
    status = rpc_status.from_call(err)  # type: ignore[arg-type]
    assert status is not None, f"no rich status: {err.code()} {err.details()}"
    reason, retriable, retry_ms = "", "", None
    for detail in status.details:
        if detail.Is(error_details_pb2.ErrorInfo.DESCRIPTOR):
            info = error_details_pb2.ErrorInfo()
            detail.Unpack(info)
            reason, retriable = info.reason, info.metadata["retriable"]
        elif detail.Is(error_details_pb2.RetryInfo.DESCRIPTOR):
            retry = error_details_pb2.RetryInfo()
            detail.Unpack(retry)
            retry_ms = retry.retry_delay.ToMilliseconds()
    return err.code(), reason, retriable, retry_ms


async def create_stream_queue(stub: queue_pb2_grpc.QueueServiceStub, name: str) -> None:
    config = pb.QueueConfig(name=name, type=pb.QUEUE_TYPE_STREAM)
    await stub.CreateQueue(pb.CreateQueueRequest(config=config), timeout=WAIT_S)


async def publish(stub: queue_pb2_grpc.QueueServiceStub, queue: str, value: bytes) -> None:
    req = pb.PublishRequest(queue=queue, messages=[pb.PublishMessage(value=value)])
    await stub.Publish(req, timeout=WAIT_S)


def tail(stub: queue_pb2_grpc.QueueServiceStub, queue: str) -> grpc.aio.UnaryStreamCall:
    return stub.Tail(pb.TailRequest(queue=queue, start=pb.StartPosition(earliest=True)))


async def first_values(call: grpc.aio.UnaryStreamCall, count: int) -> list[bytes]:
    values: list[bytes] = []
    async with asyncio.timeout(WAIT_S):
        async for resp in call:
            values.extend(r.value for r in resp.records)
            if len(values) >= count:
                return values[:count]
    raise AssertionError(f"the stream ended after {values}")


async def one_publish_stream(stub: queue_pb2_grpc.QueueServiceStub, queue: str) -> None:
    async def requests() -> AsyncIterator[pb.PublishStreamRequest]:
        publish_req = pb.PublishRequest(queue=queue, messages=[pb.PublishMessage(value=b"s")])
        yield pb.PublishStreamRequest(sequence=1, publish=publish_req)

    async with asyncio.timeout(WAIT_S):
        async for _ in stub.PublishStream(requests()):
            pass


async def expect_too_many_streams(attempt: AsyncIterator[object] | object) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as exc:
        async with asyncio.timeout(WAIT_S):
            if isinstance(attempt, grpc.aio.UnaryStreamCall):
                async for _ in attempt:
                    pass
            else:
                await attempt  # type: ignore[misc]
    code, reason, retriable, retry_ms = refusal(exc.value)
    assert (code, reason, retriable) == (
        grpc.StatusCode.RESOURCE_EXHAUSTED,
        "TOO_MANY_STREAMS",
        "true",
    ), exc.value.details()
    assert retry_ms is not None and retry_ms > 0
    assert str(STREAMS_MAX) in (exc.value.details() or "")


async def take_every_stream_slot(
    stub: queue_pb2_grpc.QueueServiceStub,
) -> list[grpc.aio.UnaryStreamCall]:
    """A stream queue "events" holding b"m0", and STREAMS_MAX Tail streams that each read it."""
    await create_stream_queue(stub, "events")
    await publish(stub, "events", b"m0")
    open_calls = [tail(stub, "events") for _ in range(STREAMS_MAX)]
    assert [await first_values(c, 1) for c in open_calls] == [[b"m0"]] * STREAMS_MAX
    return open_calls


def test_streams_beyond_streams_max_are_refused_and_the_open_ones_keep_working(
    small_node: Node,
) -> None:
    async def run() -> None:
        async with grpc.aio.insecure_channel(small_node.address) as ch:
            stub = queue_pb2_grpc.QueueServiceStub(ch)  # type: ignore[no-untyped-call]
            open_calls = await take_every_stream_slot(stub)

            await expect_too_many_streams(tail(stub, "events"))
            consume = stub.Consume(pb.ConsumeRequest(queue="events", group="g", consumer_id="c"))
            await expect_too_many_streams(consume)
            await expect_too_many_streams(one_publish_stream(stub, "events"))

            # The open streams were not disturbed: each gets the next message.
            await publish(stub, "events", b"m1")
            assert [await first_values(c, 1) for c in open_calls] == [[b"m1"]] * STREAMS_MAX

            # A slot frees when a stream ends: the next stream is served.
            open_calls.pop().cancel()
            await asyncio.sleep(0.5)
            again = tail(stub, "events")
            assert await first_values(again, 2) == [b"m0", b"m1"]
            for call in [*open_calls, again]:
                call.cancel()

    asyncio.run(run())


ATTEMPTS = 20


def test_a_refused_publish_stream_reports_its_status_while_the_client_is_still_writing(
    small_node: Node,
) -> None:
    """grpc.aio's client turns the server's status into INTERNAL when one of its writes
    reaches a stream already ended (grpc/grpc#36066): three requests per stream did so in
    most calls before the edge let the client finish writing."""

    async def three_requests() -> AsyncIterator[pb.PublishStreamRequest]:
        for sequence in (1, 2, 3):
            publish_req = pb.PublishRequest(queue="events", messages=[pb.PublishMessage()])
            yield pb.PublishStreamRequest(sequence=sequence, publish=publish_req)

    async def drain(call: grpc.aio.StreamStreamCall) -> None:
        async with asyncio.timeout(WAIT_S):
            async for _ in call:
                pass

    async def run() -> None:
        async with grpc.aio.insecure_channel(small_node.address) as ch:
            stub = queue_pb2_grpc.QueueServiceStub(ch)  # type: ignore[no-untyped-call]
            open_calls = await take_every_stream_slot(stub)
            for _ in range(ATTEMPTS):
                await expect_too_many_streams(drain(stub.PublishStream(three_requests())))
            for call in open_calls:
                call.cancel()

    asyncio.run(run())


def test_more_tail_streams_than_lmdb_reader_slots_all_read_without_internal(
    tmp_path: Path,
) -> None:
    streams = MAX_READERS + 44  # 300
    messages = 5
    node = Node(tmp_path / "node", "--streams-max", str(streams + 10))
    node.start()
    try:

        async def run() -> None:
            channels = [grpc.aio.insecure_channel(node.address) for _ in range(3)]
            try:
                stubs = [queue_pb2_grpc.QueueServiceStub(ch) for ch in channels]  # type: ignore[no-untyped-call]
                await create_stream_queue(stubs[0], "wide")
                calls = [tail(stubs[i % 3], "wide") for i in range(streams)]
                reads = [asyncio.ensure_future(first_values(c, messages)) for c in calls]
                for i in range(messages):
                    await publish(stubs[0], "wide", b"v%d" % i)
                    await asyncio.sleep(0.05)
                results = await asyncio.gather(*reads, return_exceptions=True)
                failures = [r for r in results if isinstance(r, BaseException)]
                assert not failures, failures[:3]
                expected = [b"v%d" % i for i in range(messages)]
                assert all(r == expected for r in results)
                for call in calls:
                    call.cancel()
            finally:
                for ch in channels:
                    await ch.close()

        asyncio.run(run())
        log = node.log_path.read_text()
        assert "MDB_READERS_FULL" not in log and "Traceback" not in log
    finally:
        node.stop()


async def test_streams_max_bounds_the_node_not_each_of_its_shard_processes(
    tmp_path: Path,
) -> None:
    from fluxmq.server.shard_process.siblings import home_process

    node = Node(tmp_path / "node", "--streams-max", str(STREAMS_MAX), "--shard-processes", "2")
    node.start()
    try:
        names = [f"s{i}" for i in range(100)]
        queues = [next(n for n in names if home_process(n, 2) == i) for i in (0, 1)]
        async with grpc.aio.insecure_channel(node.address) as ch:
            stub = queue_pb2_grpc.QueueServiceStub(ch)
            for queue in queues:
                await create_stream_queue(stub, queue)
                await publish(stub, queue, b"m0")
            # Half the node's streams in each shard process: each is under its own bound.
            open_calls = [tail(stub, queues[i % 2]) for i in range(STREAMS_MAX)]
            for call in open_calls:
                assert await first_values(call, 1) == [b"m0"]
            await expect_too_many_streams(tail(stub, queues[0]))
            open_calls.pop().cancel()
            await asyncio.sleep(0.2)
            assert await first_values(tail(stub, queues[0]), 1) == [b"m0"]
            for call in open_calls:
                call.cancel()
    finally:
        node.stop()
