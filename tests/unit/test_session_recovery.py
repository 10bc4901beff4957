"""The SDK's producer session recovering from failures, against a broker twin that runs the
real state machine (in memory): a request whose answer was lost is never stored twice, and
requests stamped again keep their order (fluxmq/client/sessions.py)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import grpc
import pytest

from fluxmq._pb.internal import commands_pb2 as cpb
from fluxmq._pb.v1 import queue_pb2 as pb
from fluxmq.client._transport import PublishCounters
from fluxmq.client.errors import FieldViolation, FluxMQError
from fluxmq.client.pipeline import PublishPipeline
from fluxmq.client.record_batches import decode
from fluxmq.core import commands, keys
from fluxmq.core.commands.results import AppendResult
from fluxmq.core.errors import FluxError
from fluxmq.core.partitioner import prepare_append, prepare_encoded_append
from fluxmq.core.producers import ProducerGrant
from fluxmq.core.queue_config import normalize_new, policy_of
from fluxmq.core.state_machine import QueueStateMachine
from fluxmq.server.errors import status_code
from storage import MemoryStore
from storage.record_batch import (
    NO_IDEMPOTENCY_KEY_LENGTH,
    NO_KEY_LENGTH,
    RECORD_HEAD,
    RECORD_HEADER_HEAD,
    seal,
)

T0 = 1_700_000_000_000
Hook = Callable[[pb.PublishRequest, int], Any]


class Entry:
    def __init__(self, index: int, payload: bytes) -> None:
        self.index = index
        self.payload = payload


class BrokerTwin:
    """One node, one queue ``q``: the real state machine behind a transport's interface. A
    retriable refusal is retried (as the real transport does) unless ``give_up`` says not to.
    ``hook(request, attempt)`` may raise to lose an answer (after the apply) or await to delay.
    """

    closed = False
    timeout_s = 5.0

    def __init__(self, partitions: int = 1, max_message_bytes: int = 0) -> None:
        self.sm = QueueStateMachine(MemoryStore())
        self.index = 0
        cfg = normalize_new(
            pb.QueueConfig(name="q", partitions=partitions, max_message_bytes=max_message_bytes)
        )
        self.queue = self.apply(cpb.CreateQueueCmd(config=cfg, now_ms=T0))
        self.hook: Callable[[pb.PublishRequest, int], Any] | None = None
        self.lost_after_apply: set[bytes] = set()  # first values whose first answer is lost
        self.published = PublishCounters()  # as the real transport: every pipeline adds to it
        self.observed: list[tuple[str, bool]] = []  # (address, answered) per timed call

    def observe(self, address: str, seconds: float, ok: bool) -> None:
        self.observed.append((address, ok))

    def apply(self, cmd: Any) -> Any:
        self.index += 1
        (result,) = self.sm.apply_batch([Entry(self.index, commands.encode(cmd))])
        if isinstance(result, FluxError):
            raise _client_error(result)
        return result

    def leader_of(self, queue: str) -> str:
        return "twin"

    def target(self, queue: str) -> str:
        return "twin"

    def publish_stream(self, address: str) -> Any:
        return RefusedStream()

    async def unary(self, service: str, method: str, request: Any, **kw: Any) -> Any:
        await asyncio.sleep(0)
        if method == "GetQueue":
            return self.queue
        if method == "InitProducer":
            grant = self.apply(
                cpb.InitProducerCmd(
                    queue="q", queue_id=self.queue.queue_id, now_ms=T0,
                    producer_name=request.producer_name,
                )
            )  # fmt: skip
            assert isinstance(grant, ProducerGrant)
            return pb.InitProducerResponse(
                producer_id=grant.producer_id, producer_epoch=grant.producer_epoch
            )
        assert method == "Publish"
        give_up = kw.get("give_up")
        for attempt in range(1, 50):
            try:
                return await self._publish(request, attempt)
            except FluxMQError as err:
                if not err.retriable or (give_up is not None and give_up(err)) or attempt > 40:
                    raise
                await asyncio.sleep(0.002)
        raise AssertionError("unreachable")

    async def _publish(self, request: pb.PublishRequest, attempt: int) -> pb.PublishResponse:
        if self.hook is not None:
            await self.hook(request, attempt)
        producer = request.producer if request.HasField("producer") else None
        policy = policy_of(self.queue.config)
        try:
            if request.HasField("encoded"):
                prepared = prepare_encoded_append(
                    "q", self.queue.queue_id, policy, request.encoded, 0, T0, producer
                )
            else:
                prepared = prepare_append(
                    "q", self.queue.queue_id, policy, request.messages, 0, T0, producer
                )
        except FluxError as err:
            raise _client_error(err) from None
        result = self.apply(prepared.command)
        assert isinstance(result, AppendResult)
        first = first_value(request)
        if first in self.lost_after_apply:
            self.lost_after_apply.discard(first)
            raise FluxMQError(grpc.StatusCode.UNAVAILABLE, "answer lost", retriable=True)
        if request.HasField("encoded"):
            return pb.PublishResponse(
                batch=pb.PublishedBatch(
                    partition=result.partitions[0], base_offset=result.offsets[0],
                    count=len(result.offsets), timestamp_ms=result.timestamps_ms[0],
                    duplicate=result.duplicates[0],
                )
            )  # fmt: skip
        resp = pb.PublishResponse()
        for p, o, ts, dup in zip(
            result.partitions, result.offsets, result.timestamps_ms, result.duplicates, strict=True
        ):
            resp.results.add(partition=p, offset=o, timestamp_ms=ts, duplicate=dup)
        return resp

    def stored(self, partition: int = 0) -> list[bytes]:
        with self.sm.store.read() as txn:
            log = txn.log(keys.log_id(self.queue.queue_id, partition))
            wm = log.watermarks()
            return [r.value for r in log.read(wm.low, 100_000, 1 << 40)] if wm.high else []


class RefusedStream:
    def __aiter__(self) -> RefusedStream:
        return self

    async def __anext__(self) -> Any:
        raise FluxMQError(grpc.StatusCode.RESOURCE_EXHAUSTED, "too many streams")

    async def write(self, request: Any) -> None:
        await asyncio.sleep(0)

    def cancel(self) -> None:
        pass


def _client_error(err: FluxError) -> FluxMQError:
    return FluxMQError(
        status_code(err), err.message, reason=err.reason, retriable=err.retriable,
        field_violations=tuple(FieldViolation(v.field, v.description) for v in err.violations),
        metadata=dict(err.metadata),
    )  # fmt: skip


def first_value(request: pb.PublishRequest) -> bytes:
    """The value of a request's first message, or of its first encoded record."""
    if not request.HasField("encoded"):
        return bytes(first_value(request))
    (record,) = decode(0, 0, seal(0, 0, T0, 1, _first_record(request.encoded.records)), 0)
    return bytes(record.value)


def _first_record(section: bytes) -> bytes:
    _, _, key_len, value_len, header_count, idem_len = RECORD_HEAD.unpack_from(section)
    at = RECORD_HEAD.size + (0 if key_len == NO_KEY_LENGTH else key_len) + value_len
    for _ in range(header_count):
        name_len, header_len = RECORD_HEADER_HEAD.unpack_from(section, at)
        at += RECORD_HEADER_HEAD.size + name_len + header_len
    assert idem_len == NO_IDEMPOTENCY_KEY_LENGTH
    return section[:at]


def message(value: bytes, bad: bool = False) -> pb.PublishMessage:
    m = pb.PublishMessage(value=value)
    if bad:
        m.headers["fluxmq-reserved"] = b"x"  # refused: INVALID_ARGUMENT naming the header
    return m


async def test_a_request_stored_before_the_session_moved_on_is_answered_not_stored_again() -> None:
    broker = BrokerTwin()
    pipe = PublishPipeline(broker, "q", window=4, messages_max=2)  # type: ignore[arg-type]
    await pipe.publish(message(b"warm"), 4)
    # A's answers are all lost (it is stored, its caller hears UNAVAILABLE at last): the session
    # moves to its next epoch. B is stored too, its first answer lost, and its resend arrives
    # only after the new epoch: the broker must answer it, and the SDK must not store it again.
    lost = {b"a1"}
    a_failed = asyncio.Event()

    async def hook(request: pb.PublishRequest, attempt: int) -> None:
        first = first_value(request)
        if first in lost:
            broker.lost_after_apply.add(first)
            if attempt >= 3:
                lost.discard(first)
                a_failed.set()
                raise FluxMQError(grpc.StatusCode.UNAVAILABLE, "gave up", retriable=False)
        if first == b"b1" and attempt == 1:
            broker.lost_after_apply.add(first)
        if first == b"b1" and attempt > 1:
            await a_failed.wait()  # B's resend comes after A's failure renewed the session
            await asyncio.sleep(0.01)

    broker.hook = hook
    calls = [pipe.publish(message(v), 2) for v in (b"a1", b"a2", b"b1", b"b2")]
    outcomes = await asyncio.gather(*calls, return_exceptions=True)
    assert all(isinstance(o, FluxMQError) for o in outcomes[:2]), outcomes
    b1, b2 = outcomes[2:]
    assert not isinstance(b1, BaseException) and not isinstance(b2, BaseException)
    assert (b1.offset, b2.offset) == (3, 4) and b1.duplicate and b2.duplicate
    assert pipe.session.renewals == 1
    broker.hook = None
    after = await pipe.publish(message(b"after"), 5)
    assert after.offset == 5
    assert broker.stored() == [b"warm", b"a1", b"a2", b"b1", b"b2", b"after"]


async def test_requests_stamped_again_keep_their_order() -> None:
    broker = BrokerTwin()
    pipe = PublishPipeline(broker, "q", window=4, messages_max=1)  # type: ignore[arg-type]
    await pipe.publish(message(b"warm"), 4)
    release_b = asyncio.Event()

    async def hook(request: pb.PublishRequest, attempt: int) -> None:
        if first_value(request) == b"b" and attempt == 1:
            await release_b.wait()  # B's first answer comes after C's

    broker.hook = hook

    async def c_then_b() -> None:
        await asyncio.sleep(0.05)
        release_b.set()

    outcomes = await asyncio.gather(
        pipe.publish(message(b"a", bad=True), 1),  # refused: nothing stored, session renewed
        pipe.publish(message(b"b"), 1),
        pipe.publish(message(b"c"), 1),
        c_then_b(),
        return_exceptions=True,
    )
    assert (
        isinstance(outcomes[0], FluxMQError)
        and outcomes[0].code == grpc.StatusCode.INVALID_ARGUMENT
    )
    assert not any(isinstance(o, BaseException) for o in outcomes[1:3]), outcomes
    assert pipe.session.renewals == 1
    assert broker.stored() == [b"warm", b"b", b"c"]


async def test_a_refused_message_of_a_request_is_found_alone_and_its_neighbours_keep_order() -> (
    None
):
    broker = BrokerTwin()
    pipe = PublishPipeline(broker, "q", window=4, messages_max=3)  # type: ignore[arg-type]
    await pipe.publish(message(b"warm"), 4)
    calls = [pipe.publish(message(v, bad=v == b"x2"), 2) for v in (b"x1", b"x2", b"x3")]
    calls += [pipe.publish(message(v), 2) for v in (b"y1", b"y2", b"y3")]
    outcomes = await asyncio.gather(*calls, return_exceptions=True)
    assert isinstance(outcomes[1], FluxMQError)
    assert not any(isinstance(o, BaseException) for i, o in enumerate(outcomes) if i != 1)
    assert broker.stored() == [b"warm", b"x1", b"x3", b"y1", b"y2", b"y3"]


@pytest.mark.parametrize("seed", range(40))
async def test_random_lost_answers_store_every_message_once_in_order(seed: int) -> None:
    import random

    rng = random.Random(seed)
    broker = BrokerTwin()
    pipe = PublishPipeline(broker, "q", window=4, messages_max=rng.choice([1, 2, 5]))  # type: ignore[arg-type]
    values = [b"m%03d" % i for i in range(60)]
    bad = {v for v in values if rng.random() < 0.05}

    async def hook(request: pb.PublishRequest, attempt: int) -> None:
        await asyncio.sleep(rng.random() * 0.003)
        if rng.random() < 0.2:
            broker.lost_after_apply.add(first_value(request))

    broker.hook = hook
    outcomes = await asyncio.gather(
        *(pipe.publish(message(v, bad=v in bad), 4) for v in values), return_exceptions=True
    )
    stored = broker.stored()
    assert len(stored) == len(set(stored)), f"seed {seed}: a message stored twice"
    assert stored == sorted(stored), f"seed {seed}: order broken {stored}"
    for v, o in zip(values, outcomes, strict=True):
        if isinstance(o, BaseException):
            assert v in bad or isinstance(o, FluxMQError), (seed, v, o)
        else:
            assert v in stored and stored.index(v) == o.offset, (seed, v, o)
    assert not (bad & set(stored)), f"seed {seed}"


async def test_a_refused_value_of_a_run_fails_alone_and_the_run_raises_after_the_rest_is_in() -> (
    None
):
    broker = BrokerTwin(max_message_bytes=1024)
    too_large = b"x" * 1025
    pipe = PublishPipeline(broker, "q", window=4, messages_max=3)  # type: ignore[arg-type]
    await pipe.publish(message(b"warm"), 4)
    run = [b"v1", b"v2", too_large, b"v4", b"v5"]
    outcomes = await asyncio.gather(
        pipe.publish_values(run), pipe.publish_values([b"w1", b"w2"]), return_exceptions=True
    )
    refused, others = outcomes
    assert isinstance(refused, FluxMQError) and refused.reason == "MESSAGE_TOO_LARGE"
    # Named as the caller's message (not as an encoded record): the one message of the
    # request that found it alone.
    assert [v.field for v in refused.field_violations] == ["messages[0].value"]
    assert not isinstance(others, BaseException)
    assert [r.offset for r in others] == [5, 6]
    assert broker.stored() == [b"warm", b"v1", b"v2", b"v4", b"v5", b"w1", b"w2"]
    assert pipe.requests_split == 1


async def test_a_run_with_two_refused_values_leaves_no_error_unread() -> None:
    """Every refused value's error is read when the run fails: an unread one is logged as
    "Future exception was never retrieved" once it is collected, in the user's log."""
    import gc

    broker = BrokerTwin(max_message_bytes=1024)
    too_large = b"x" * 1025
    pipe = PublishPipeline(broker, "q", window=4, messages_max=8)  # type: ignore[arg-type]
    loop = asyncio.get_running_loop()
    unread: list[dict[str, Any]] = []
    loop.set_exception_handler(lambda _loop, context: unread.append(context))
    try:
        with pytest.raises(FluxMQError) as refused:
            await pipe.publish_values([b"v1", too_large, too_large, b"v4"])
        assert refused.value.reason == "MESSAGE_TOO_LARGE"
        del refused
        for _ in range(3):
            await asyncio.sleep(0)
        gc.collect()
    finally:
        loop.set_exception_handler(None)
    assert broker.stored() == [b"v1", b"v4"]
    assert [c["message"] for c in unread] == []


@pytest.mark.parametrize("seed", range(20))
async def test_random_lost_answers_store_every_value_of_every_run_once_in_order(seed: int) -> None:
    import random

    rng = random.Random(seed)
    broker = BrokerTwin(max_message_bytes=1024)
    too_large = 1025
    pipe = PublishPipeline(broker, "q", window=4, messages_max=rng.choice([2, 5, 9]))  # type: ignore[arg-type]
    runs: list[list[bytes]] = []
    n = 0
    for _ in range(12):
        run = []
        for _ in range(rng.randint(1, 7)):
            v = b"m%03d" % n
            n += 1
            run.append(v + b"!" * too_large if rng.random() < 0.05 else v)
        runs.append(run)

    async def hook(request: pb.PublishRequest, attempt: int) -> None:
        await asyncio.sleep(rng.random() * 0.003)
        if rng.random() < 0.2:
            broker.lost_after_apply.add(first_value(request))

    broker.hook = hook

    async def publish(run: list[bytes]) -> Any:
        if len(run) == 1 and rng.random() < 0.5:
            return [await pipe.publish(message(run[0]), len(run[0]))]
        return await pipe.publish_values(run)

    outcomes = await asyncio.gather(*(publish(r) for r in runs), return_exceptions=True)
    stored = broker.stored()
    assert len(stored) == len(set(stored)), f"seed {seed}: a value stored twice"
    assert stored == sorted(stored), f"seed {seed}: order broken {stored}"
    for run, outcome in zip(runs, outcomes, strict=True):
        good = [v for v in run if len(v) < too_large]
        if isinstance(outcome, BaseException):
            assert isinstance(outcome, FluxMQError), (seed, run, outcome)
        else:
            assert good == run, (seed, run)
            assert [stored.index(v) for v in run] == [r.offset for r in outcome], (seed, run)
        if len(good) < len(run):
            assert isinstance(outcome, FluxMQError), (seed, run)
        # Lost answers make a request fail at last only after many tries: the good values of
        # a run that succeeded are stored; those of one that failed may or may not be.
        if not isinstance(outcome, BaseException):
            assert all(v in stored for v in good), (seed, run)
    assert not any(len(v) >= too_large for v in stored), f"seed {seed}"


async def test_a_split_request_that_breaks_midway_does_not_hold_its_partition_up() -> None:
    broker = BrokerTwin()
    pipe = PublishPipeline(broker, "q", window=4, messages_max=3)  # type: ignore[arg-type]
    await pipe.publish(message(b"warm"), 4)

    async def hook(request: pb.PublishRequest, attempt: int) -> None:
        if first_value(request) == b"x1" and request.encoded.count == 1:
            raise RuntimeError("a bug in the transport")  # not a broker's answer

    broker.hook = hook
    calls = [pipe.publish(message(v, bad=v == b"x2"), 2) for v in (b"x1", b"x2", b"x3")]
    outcomes = await asyncio.gather(*calls, return_exceptions=True)
    # x1's resend broke the split: x1 and the parts after it hear of it...
    assert all(isinstance(o, BaseException) for o in outcomes), outcomes
    # ...and the partition is not held up by the places they left.
    broker.hook = None
    after = await asyncio.wait_for(pipe.publish(message(b"after"), 5), 5)
    assert broker.stored() == [b"warm", b"after"] and after.offset == 1
