"""PublishPipeline (fluxmq/client/pipeline.py) against a transport twin: what concurrent
``publish()`` callers share, and what each of them still gets alone."""

from __future__ import annotations

import asyncio
import itertools
from typing import Any

import grpc
import pytest

from fluxmq._pb.v1 import queue_pb2 as pb
from fluxmq.client._transport import PublishCounters
from fluxmq.client.errors import FluxMQError, InvalidArgument
from fluxmq.client.pipeline import PublishPipeline


class TransportTwin:
    """Answers Publish like a one-partition queue: offsets in arrival order. A message whose
    value is ``b"bad"`` makes its whole request fail (all or nothing, as the broker)."""

    closed = False
    timeout_s = 5.0

    def __init__(self, delay_s: float = 0.0) -> None:
        self.delay_s = delay_s
        self.requests: list[list[bytes]] = []
        self.in_flight = 0
        self.in_flight_max = 0
        self._offset = 0
        self.published = PublishCounters()  # as the real transport: every pipeline adds to it
        self.observed: list[tuple[str, bool]] = []  # (address, answered) per timed call

    def observe(self, address: str, seconds: float, ok: bool) -> None:
        self.observed.append((address, ok))

    def leader_of(self, queue: str) -> str | None:
        return "twin"

    def target(self, queue: str) -> str:
        return "twin"

    def publish_stream(self, address: str) -> Any:
        return BrokenStream()

    async def unary(self, service: str, method: str, request: Any, **_: Any) -> Any:
        assert (service, method) == ("queue", "Publish")
        self.in_flight += 1
        self.in_flight_max = max(self.in_flight_max, self.in_flight)
        try:
            await asyncio.sleep(self.delay_s)
            values = [m.value for m in request.messages]
            self.requests.append(values)
            if b"bad" in values:
                raise InvalidArgument(
                    grpc.StatusCode.INVALID_ARGUMENT, "delay_ms is more than 7 days ahead"
                )
            resp = pb.PublishResponse()
            for _ in values:
                resp.results.add(partition=0, offset=self._offset)
                self._offset += 1
            return resp
        finally:
            self.in_flight -= 1


class BrokenStream:
    """A PublishStream the node refuses at once: requests fall back to the unary path (the
    lane itself is tested against a broker, tests/client/test_concurrent_publish.py)."""

    def __aiter__(self) -> BrokenStream:
        return self

    async def __anext__(self) -> Any:
        raise FluxMQError(grpc.StatusCode.RESOURCE_EXHAUSTED, "too many streams")

    async def write(self, request: Any) -> None:
        await asyncio.sleep(0)

    def cancel(self) -> None:
        pass


def message(value: bytes) -> pb.PublishMessage:
    return pb.PublishMessage(value=value, idempotency_key=f"k-{value.decode()}")


async def test_concurrent_callers_share_requests_and_each_gets_its_own_offset() -> None:
    twin = TransportTwin(delay_s=0.01)
    pipeline = PublishPipeline(twin, "q", window=2)  # type: ignore[arg-type]
    values = [b"m%d" % i for i in range(64)]
    results = await asyncio.gather(*(pipeline.publish(message(v), len(v)) for v in values))
    stored = [v for request in twin.requests for v in request]
    assert sorted(stored) == sorted(values)  # every message once
    # Each caller's result is the offset its own message got.
    assert [results[values.index(v)].offset for v in stored] == list(range(64))
    assert len(twin.requests) <= 8, [len(r) for r in twin.requests]


async def test_a_caller_alone_is_sent_at_once_one_request_per_publish() -> None:
    twin = TransportTwin()
    pipeline = PublishPipeline(twin, "q")  # type: ignore[arg-type]
    loop = asyncio.get_running_loop()
    for i in range(5):
        started = loop.time()
        r = await pipeline.publish(message(b"s%d" % i), 2)
        assert r.offset == i
        assert loop.time() - started < 0.5  # no linger timer on the way
    assert twin.requests == [[b"s%d" % i] for i in range(5)]


async def test_requests_in_flight_never_exceed_the_window() -> None:
    twin = TransportTwin(delay_s=0.005)
    pipeline = PublishPipeline(twin, "q", window=3, messages_max=2)  # type: ignore[arg-type]
    await asyncio.gather(*(pipeline.publish(message(b"w%d" % i), 2) for i in range(40)))
    assert twin.in_flight_max == 3
    assert all(len(r) <= 2 for r in twin.requests)


async def test_a_bad_message_fails_only_its_own_caller() -> None:
    twin = TransportTwin(delay_s=0.005)
    pipeline = PublishPipeline(twin, "q", window=1)  # type: ignore[arg-type]
    values = [b"g%d" % i for i in range(10)]
    values.insert(4, b"bad")
    outcomes = await asyncio.gather(
        *(pipeline.publish(message(v), len(v)) for v in values), return_exceptions=True
    )
    bad = outcomes[4]
    assert isinstance(bad, InvalidArgument) and "7 days" in str(bad)
    good = [o for k, o in enumerate(outcomes) if k != 4]
    assert not any(isinstance(o, BaseException) for o in good), good
    assert pipeline.requests_split >= 1
    # Only the good messages were stored, each once.
    assert sorted(o.offset for o in good) == list(range(10))  # type: ignore[union-attr]


async def test_a_retriable_failure_reaches_every_caller_of_the_request_unsplit() -> None:
    class Down(TransportTwin):
        async def unary(self, service: str, method: str, request: Any, **_: Any) -> Any:
            self.requests.append([m.value for m in request.messages])
            raise FluxMQError(grpc.StatusCode.UNAVAILABLE, "no leader", retriable=True)

    twin = Down()
    pipeline = PublishPipeline(twin, "q")  # type: ignore[arg-type]
    outcomes = await asyncio.gather(
        *(pipeline.publish(message(b"r%d" % i), 2) for i in range(5)), return_exceptions=True
    )
    assert all(isinstance(o, FluxMQError) and o.retriable for o in outcomes)
    assert len(twin.requests) == 1  # the transport already retried: no split, no resend


async def test_a_caller_cancelled_before_sending_is_left_out_of_the_request() -> None:
    twin = TransportTwin()
    pipeline = PublishPipeline(twin, "q", linger_ms=50)  # type: ignore[arg-type]
    gone = asyncio.ensure_future(pipeline.publish(message(b"gone"), 4))
    kept = asyncio.ensure_future(pipeline.publish(message(b"kept"), 4))
    await asyncio.sleep(0.01)
    gone.cancel()
    assert (await kept).offset == 0
    with pytest.raises(asyncio.CancelledError):
        await gone
    assert twin.requests == [[b"kept"]]


async def test_pending_messages_are_bounded_and_callers_wait_for_room() -> None:
    twin = TransportTwin(delay_s=0.01)
    pipeline = PublishPipeline(twin, "q", window=1, messages_max=2, pending_max=3)  # type: ignore[arg-type]
    results = await asyncio.gather(*(pipeline.publish(message(b"p%d" % i), 2) for i in range(20)))
    assert sorted(r.offset for r in results) == list(range(20))
    assert max(len(r) for r in twin.requests) <= 2


def test_limits_are_checked() -> None:
    twin = TransportTwin()
    for bad in ({"window": 0}, {"messages_max": 1001}, {"linger_ms": -1}, {"pending_max": 0}):
        with pytest.raises(ValueError):
            PublishPipeline(twin, "q", **bad)  # type: ignore[arg-type]


def test_the_pipelines_pure_helpers_do_what_their_examples_say() -> None:
    import doctest

    from fluxmq.client import pipeline, record_batches

    for module in (pipeline, record_batches):
        result = doctest.testmod(module)
        assert result.attempted >= 1 and result.failed == 0, module.__name__


@pytest.mark.parametrize("seed", range(10))
def test_runs_of_keep_every_value_in_order_within_both_limits(seed: int) -> None:
    import random

    from fluxmq.client.pipeline import runs_of

    rng = random.Random(seed)
    values = [bytes(rng.choice([0, 1, 5, 40, 300])) for _ in range(rng.randint(0, 60))]
    count_max, bytes_max = rng.randint(1, 9), rng.randint(1, 400)
    runs = runs_of(values, count_max, bytes_max)
    assert [v for run, _ in runs for v in run] == values, f"seed {seed}"
    for run, size in runs:
        assert size == sum(map(len, run)) and 1 <= len(run) <= count_max, f"seed {seed}"
        assert size <= bytes_max or len(run) == 1, f"seed {seed}"
    for (run, size), (after, _) in itertools.pairwise(runs):
        # A run ends only where the next value would pass a limit.
        assert len(run) == count_max or size + len(after[0]) > bytes_max, f"seed {seed}"


def test_bytes_values_pass_unchanged_and_other_values_through_the_codec() -> None:
    from fluxmq.client.codecs import AutoCodec, JsonCodec, encode_each

    values: list[Any] = [b"a", b"b"]
    assert encode_each(AutoCodec(), values) == [b"a", b"b"]
    assert encode_each(AutoCodec(), [b"a", "b", {"c": 1}]) == [b"a", b"b", b'{"c":1}']
    assert encode_each(JsonCodec(), ["a"]) == [b'"a"']
    with pytest.raises(TypeError):
        encode_each(JsonCodec(), [b"a"])


async def test_a_request_of_messages_and_runs_encodes_every_record_in_its_place() -> None:
    from fluxmq.client.pipeline import _encoded, _Waiting
    from fluxmq.client.record_batches import encode_records

    loop = asyncio.get_running_loop()
    values = [b"m0", b"m1", b"r2", b"r3", b"m4"]
    taken = [
        _Waiting(pb.PublishMessage(value=b"m0"), 2, loop.create_future()),
        _Waiting(pb.PublishMessage(value=b"m1"), 2, loop.create_future()),
        _Waiting(None, 4, loop.create_future(), count=2, values=[b"r2", b"r3"]),
        _Waiting(pb.PublishMessage(value=b"m4"), 2, loop.create_future()),
    ]
    section, count = _encoded(taken)
    assert count == 5
    assert section == encode_records(pb.PublishMessage(value=v) for v in values)
