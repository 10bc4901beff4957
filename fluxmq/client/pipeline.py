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
own message, and a neighbour's bad message never fails it. That is safe because every request is
stamped with the producer session (or its messages carry their own idempotency keys): a request
that was in fact written is answered with its first positions and ``duplicate=True``, never
stored twice. A session's request carries its messages as records encoded here
(``PublishRequest.encoded``), which the broker checks without reading each message.

Ordering: one caller awaiting each ``publish()`` in turn publishes in order. Between concurrent
callers there is no order to keep (their calls race today, one request each); a caller that
needs the order of many messages uses ``publish_batch`` or a producer with ``max_in_flight=1``.

The wire: the first request goes as a unary call (its answer names the queue's leader in a
cluster); the next travel on one ``PublishStream`` (``_Lane``) to where a unary call would go
(the leader once named; any node forwards), written in order and answered in order. A request
on an open stream costs the broker and the client a fraction of a unary call (measured on one
node with single-message requests, 16 in flight: 1.0-1.4k requests/s on a stream against 0.4k
unary).
Anything unusual goes back to the unary path, which has the retries, backoff, failover and
leader redirects: a request the stream answers with a retriable error, and every request whose
answer a broken or silent stream lost (its outcome is unknown; the idempotency keys make sending
it again safe). A stream the node refuses before answering anything (its stream limit) is not
tried again for ``STREAM_REFUSED_BACKOFF_S``.

Bounds: a request holds at most ``messages_max`` messages (<= 1000, the broker's limit) and about
``bytes_max`` bytes; ``pending_max`` messages wait at most (further callers wait for room).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import struct
import time
import uuid
from bisect import bisect_right
from collections import deque
from dataclasses import dataclass
from itertools import accumulate
from typing import Any

import grpc

from fluxmq._pb.v1 import queue_pb2 as pb
from fluxmq.client._transport import Transport
from fluxmq.client.errors import FieldViolation, FluxMQError, from_request_error
from fluxmq.client.partitioning import PartitionMap
from fluxmq.client.producer import MAX_BATCH, PublishResult, results_of, send_request
from fluxmq.client.record_batches import encode_records, encode_values
from fluxmq.client.sessions import (
    RESTAMP_REASONS,
    UNKNOWN_PRODUCER,
    ProducerSession,
    Stamp,
)

log = logging.getLogger("fluxmq.client")

WINDOW_DEFAULT = 4
BYTES_MAX_DEFAULT = 1 << 20
PENDING_MAX_DEFAULT = 10_000
STREAM_REFUSED_BACKOFF_S = 30.0
# Times one request may be stamped again after renewals of its session before it gives up.
RESTAMPS_MAX = 8
# A stream takes one of a node's stream slots (streams_max, default 200, shared with Tail and
# Consume): one per node per client, whatever the queues, given back after this long unused.
LANE_IDLE_S = 10.0


class LaneBrokenError(Exception):
    """The stream a request was written to broke, ended or fell silent before answering it."""


class _Lane:
    """One open PublishStream to a node: requests (of any queue) written in order, answered in
    order."""

    def __init__(self, call: Any, address: str) -> None:
        self.address = address
        self.answered = 0
        self.broken: BaseException | None = None
        self.ended = False  # the node ended the stream (it drains): not a refusal
        self.used_at = time.monotonic()
        self._call = call
        self._sequence = 0
        self._waiting: deque[tuple[int, asyncio.Future[pb.PublishStreamResponse]]] = deque()
        self._write_lock = asyncio.Lock()
        self._reader = asyncio.ensure_future(self._read_routine())

    @property
    def busy(self) -> bool:
        return bool(self._waiting) or self._write_lock.locked()

    async def _read_routine(self) -> None:
        try:
            async for resp in self._call:
                if not self._waiting:
                    raise LaneBrokenError("an answer to no request")
                sequence, fut = self._waiting.popleft()
                if resp.sequence != sequence:
                    raise LaneBrokenError(f"answer {resp.sequence} where {sequence} was due")
                self.answered += 1
                if not fut.done():
                    fut.set_result(resp)
            self.ended = True
            raise LaneBrokenError("the node ended the stream")
        except asyncio.CancelledError:
            self._break(LaneBrokenError("closed by the client"))
            raise
        except BaseException as err:  # the call failed: every request on it is in doubt
            self._break(err)

    def _break(self, err: BaseException) -> None:
        if self.broken is None:
            self.broken = err
            log.debug("fluxmq: publish stream to %s broke: %s", self.address, err)
        while self._waiting:
            _, fut = self._waiting.popleft()
            if not fut.done():
                fut.set_exception(LaneBrokenError(str(err)))
                fut.exception()  # read by its request, or by nobody once it timed out
        self._call.cancel()

    async def request(self, frame: pb.PublishStreamRequest, timeout_s: float) -> Any:
        """Send ``frame`` (its ``publish`` request; the sequence is set here) on the stream;
        -> its PublishStreamResponse. Raises
        LaneBrokenError when the stream broke, or did not take or answer the request within
        ``timeout_s``; a cancelled caller breaks the lane (what it wrote is in doubt) and is
        cancelled."""
        if self.broken is not None:
            raise LaneBrokenError(str(self.broken))
        self.used_at = time.monotonic()
        fut: asyncio.Future[pb.PublishStreamResponse] = asyncio.get_running_loop().create_future()
        try:
            async with asyncio.timeout(timeout_s):
                async with self._write_lock:  # one write at a time: answers in write order
                    if self.broken is not None:
                        raise LaneBrokenError(str(self.broken))
                    self._sequence += 1
                    self._waiting.append((self._sequence, fut))
                    frame.sequence = self._sequence
                    await self._call.write(frame)
                return await asyncio.shield(fut)
        except asyncio.CancelledError:
            self._break(LaneBrokenError("a request on it was cancelled"))
            raise
        except TimeoutError:
            self._break(TimeoutError(f"no answer within {timeout_s:g} s"))
            raise LaneBrokenError(f"no answer within {timeout_s:g} s") from None
        except LaneBrokenError:
            raise
        except Exception as err:  # the write failed: the connection is gone
            self._break(err)
            raise LaneBrokenError(str(err)) from err

    def abandon(self, why: str) -> None:
        """End the stream now: requests still on it fail with LaneBrokenError(why)."""
        self._break(LaneBrokenError(why))
        self._reader.cancel()

    async def close(self) -> None:
        self.abandon("closed by the client")
        with contextlib.suppress(asyncio.CancelledError):
            await self._reader


class LanePool:
    """A client's publish streams: at most one per node, shared by every queue's pipeline,
    closed after LANE_IDLE_S unused; a node that refused one (before any answer) is not asked
    again for STREAM_REFUSED_BACKOFF_S."""

    def __init__(self, transport: Transport) -> None:
        self._transport = transport
        self._lanes: dict[str, _Lane] = {}
        self._refused_until: dict[str, float] = {}
        self._idle_check: asyncio.TimerHandle | None = None

    def lane(self, address: str) -> _Lane | None:
        lane = self._lanes.get(address)
        if lane is not None and lane.broken is not None:
            self.drop(lane)
            lane = None
        if lane is not None:
            return lane
        if self._transport.closed or time.monotonic() < self._refused_until.get(address, 0.0):
            return None
        lane = self._lanes[address] = _Lane(self._transport.publish_stream(address), address)
        if self._idle_check is None:
            self._idle_check = asyncio.get_running_loop().call_later(LANE_IDLE_S, self._close_idle)
        return lane

    def drop(self, lane: _Lane) -> None:
        if lane.answered == 0 and not lane.ended:  # refused (stream limit?) or unreachable
            self._refused_until[lane.address] = time.monotonic() + STREAM_REFUSED_BACKOFF_S
        if self._lanes.get(lane.address) is lane:
            del self._lanes[lane.address]
        lane.abandon("dropped")

    def _close_idle(self) -> None:
        self._idle_check = None
        now = time.monotonic()
        for lane in list(self._lanes.values()):
            if not lane.busy and now - lane.used_at >= LANE_IDLE_S:
                del self._lanes[lane.address]
                lane.abandon("idle")
        if self._lanes:
            oldest = min(lane.used_at for lane in self._lanes.values())
            self._idle_check = asyncio.get_running_loop().call_later(
                max(0.1, oldest + LANE_IDLE_S - now), self._close_idle
            )

    async def close(self) -> None:
        if self._idle_check is not None:
            self._idle_check.cancel()
            self._idle_check = None
        lanes, self._lanes = list(self._lanes.values()), {}
        for lane in lanes:
            await lane.close()


@dataclass(slots=True)
class _Waiting:
    """One message waiting for a request, or (``values``) a run of values of one
    ``publish_values`` call: its result is then the list of their results."""

    message: pb.PublishMessage | None
    size_bytes: int
    result: asyncio.Future[Any]
    delayed: bool = False  # delay_ms or deliver_at_ms: sent as a message, not encoded
    count: int = 1
    values: list[bytes] | None = None  # encoded into records when a request is formed


# The bucket of messages that bring their own idempotency keys: sent without a session, the
# broker partitions them (a session's request is one partition and carries no keys).
_KEYED = -1
# Messages sent with neither a session nor keys (BufferedProducer(idempotent=False)): unary
# only, and repeated only when nothing was written (a lost answer is an error).
_RAW = -2


class PublishPipeline:
    """The coalescing sender of one queue (see the module docstring)."""

    def __init__(
        self,
        transport: Transport,
        queue: str,
        *,
        lanes: LanePool | None = None,
        window: int = WINDOW_DEFAULT,
        linger_ms: float = 0.0,
        messages_max: int = MAX_BATCH,
        bytes_max: int = BYTES_MAX_DEFAULT,
        pending_max: int = PENDING_MAX_DEFAULT,
        producer_name: str = "",
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
        # Waiting messages by partition (or _KEYED), in the order partitions take turns.
        self._pending: dict[int, deque[_Waiting]] = {}
        self._bucket_bytes: dict[int, int] = {}
        self._bucket_count: dict[int, int] = {}  # messages waiting in each bucket
        self._full = False  # a bucket holds a full request
        self._flushing = False  # flush_now() was called and messages still wait
        self._timer: asyncio.TimerHandle | None = None
        self._waiting = 0
        self._partitions = PartitionMap(transport, queue)
        self.session = ProducerSession(transport, queue, producer_name)
        self._in_flight = 0
        self._scheduled = False  # a send is due on the next loop turn (or after the linger)
        self._room = asyncio.Event()
        self._room.set()
        self._tasks: set[asyncio.Task[None]] = set()
        self._lanes = lanes if lanes is not None else LanePool(transport)
        self._own_lanes = lanes is None
        self._asked_for_leader = False
        self.closed = False
        self.requests_sent = 0
        self.requests_streamed = 0  # of requests_sent, answered on a stream
        self.messages_sent = 0
        self.bytes_sent = 0  # of the messages answered (their values, keys and headers)
        self.requests_split = 0  # failed requests whose messages were sent again one by one

    def _count(self, messages: int, size_bytes: int) -> None:
        """One request answered: this pipeline's counters and the client's."""
        self.requests_sent += 1
        self.messages_sent += messages
        self.bytes_sent += size_bytes
        totals = self._transport.published
        totals.requests_sent += 1
        totals.messages_sent += messages
        totals.bytes_sent += size_bytes

    @property
    def messages_waiting(self) -> int:
        """Messages given to the pipeline and not in a request yet."""
        return self._waiting

    @property
    def requests_in_flight(self) -> int:
        return self._in_flight

    async def publish(self, message: pb.PublishMessage, size_bytes: int) -> PublishResult:
        """Send ``message`` with whatever else is waiting; -> its own result."""
        return await (await self.submit(message, size_bytes))

    async def submit(
        self, message: pb.PublishMessage, size_bytes: int, *, raw: bool = False
    ) -> asyncio.Future[PublishResult]:
        """Queue ``message`` (waiting for room first); -> the future of its result. ``raw``:
        neither a session nor a key (a resend only when nothing was written)."""
        if self.closed or self._transport.closed:
            raise RuntimeError("the client is closed")
        while self._waiting >= self._pending_max:
            self._room.clear()
            await self._room.wait()
            if self.closed:
                raise RuntimeError("the client is closed")
        bucket = _RAW if raw and not message.idempotency_key else await self._bucket_of(message)
        loop = asyncio.get_running_loop()
        waiting = _Waiting(message, size_bytes, loop.create_future(), _delayed(message))
        self._enqueue(bucket, waiting)
        self._waiting += 1
        self._maybe_schedule(loop)
        return waiting.result

    def _enqueue(self, bucket: int, waiting: _Waiting) -> None:
        queue = self._pending.get(bucket)
        if queue is None:
            queue = self._pending[bucket] = deque()
        queue.append(waiting)
        size = self._bucket_bytes.get(bucket, 0) + waiting.size_bytes
        self._bucket_bytes[bucket] = size
        self._bucket_count[bucket] = count = self._bucket_count.get(bucket, 0) + waiting.count
        if count >= self._messages_max or size >= self._bytes_max:
            self._full = True

    async def publish_many(
        self, messages: list[tuple[pb.PublishMessage, int]]
    ) -> list[PublishResult]:
        """Send ``messages`` (message, size in bytes) in order, with whatever else is waiting;
        -> their results, in order. Raises the first error once every message is settled
        (the others may be stored: each message's fate is its own, as with ``publish``)."""
        if self.closed or self._transport.closed:
            raise RuntimeError("the client is closed")
        if not messages:
            return []
        keyed = all(m.idempotency_key for m, _ in messages)
        partitions = 0 if keyed else await self._partition_count()
        loop = asyncio.get_running_loop()
        waiting: list[_Waiting] = []
        for message, size_bytes in messages:
            w = _Waiting(message, size_bytes, loop.create_future(), _delayed(message))
            self._enqueue(self._bucket_in(message, partitions), w)
            waiting.append(w)
        self._waiting += len(waiting)
        self._maybe_schedule(loop)
        return await _outcomes(waiting)

    async def publish_values(self, values: list[bytes]) -> list[PublishResult]:
        """Send ``values`` (already encoded by the codec; no key, headers or delay) in order,
        to the queue's current partition, each encoded into a record here once, in runs of a
        request's size at most; -> their results. Raises the first error once every value is
        settled (as ``publish_many``)."""
        if self.closed or self._transport.closed:
            raise RuntimeError("the client is closed")
        if not values:
            return []
        partitions = await self._partition_count()
        if partitions == 0:  # unknown count: the broker partitions them (generated keys)
            return await self.publish_many([(pb.PublishMessage(value=v), len(v)) for v in values])
        partition = self._partitions.keyless(partitions)
        loop = asyncio.get_running_loop()
        runs = [
            _Waiting(None, size, loop.create_future(), count=len(run), values=run)
            for run, size in runs_of(values, self._messages_max, self._bytes_max)
        ]
        for run in runs:
            while self._waiting and self._waiting + run.count > self._pending_max:
                self._maybe_schedule(loop)
                self._room.clear()
                await self._room.wait()  # pending_max: wait for the runs before to leave
                if self.closed:
                    _fail(runs, RuntimeError("the client is closed"))
                    break
            if run.result.done():
                continue
            self._enqueue(partition, run)
            self._waiting += run.count
        self._maybe_schedule(loop)
        return await _outcomes(runs)

    async def _bucket_of(self, message: pb.PublishMessage) -> int:
        if message.idempotency_key:
            return _KEYED  # no partition count needed
        return self._bucket_in(message, await self._partition_count())

    async def _partition_count(self) -> int:
        """The queue's partition count, or 0 when GetQueue failed (no such queue, no permission
        to read it...): the Publish itself then gets the broker's answer in its own terms."""
        try:
            return await self._partitions.partitions()
        except FluxMQError:
            return 0

    def _bucket_in(self, message: pb.PublishMessage, partitions: int) -> int:
        """The partition ``message`` goes to, written into it (partitioning at the edge), or
        _KEYED for a message with its own idempotency key (or when the count is unknown: then
        it gets a generated one, which makes a resend safe)."""
        if message.idempotency_key:
            return _KEYED
        if partitions == 0:
            message.idempotency_key = uuid.uuid4().hex
            return _KEYED
        partition = self._partitions.partition_of(message, partitions)
        if not message.HasField("partition"):
            message.partition = partition
        return partition

    def _maybe_schedule(self, loop: asyncio.AbstractEventLoop) -> None:
        """Send what waits on the next loop turn, or after the linger; a full request (by count
        or bytes) does not wait for the linger."""
        if not self._waiting or self._in_flight >= self._window:
            return
        if self._scheduled:
            if self._full and self._timer is not None:
                self._timer.cancel()
                self._timer = None
                loop.call_soon(self._send_ready)
            return
        self._scheduled = True
        if self._linger_s > 0 and not self._full:
            self._timer = loop.call_later(self._linger_s, self._send_ready)
        else:
            loop.call_soon(self._send_ready)

    def flush_now(self) -> None:
        """Send what waits now, without the linger (a producer's flush), until nothing waits."""
        self._flushing = self._full = bool(self._waiting)
        self._maybe_schedule(asyncio.get_running_loop())

    def _send_ready(self) -> None:
        """Start requests for what is waiting, while request slots are free."""
        self._scheduled = False
        self._timer = None
        while self._waiting and self._in_flight < self._window:
            bucket, taken = self._take()
            if not taken:
                continue
            self._in_flight += 1
            task = asyncio.ensure_future(self._send(bucket, taken))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    def _take(self) -> tuple[int, list[_Waiting]]:
        """The next request: messages of one bucket, the buckets taking turns; callers that
        gave up (cancelled) are left out."""
        bucket = next(b for b, q in self._pending.items() if q)
        queue = self._pending.pop(bucket)
        taken: list[_Waiting] = []
        size = 0
        removed = 0
        removed_count = 0
        taken_count = 0
        while queue:
            w = queue[0]
            if taken and (
                size + w.size_bytes > self._bytes_max or taken_count + w.count > self._messages_max
            ):
                break
            queue.popleft()
            self._waiting -= w.count
            removed += w.size_bytes
            removed_count += w.count
            if w.result.done():
                continue
            taken.append(w)
            size += w.size_bytes
            taken_count += w.count
        self._pending[bucket] = queue  # to the back: the next request is another bucket's
        self._bucket_bytes[bucket] -= removed
        self._bucket_count[bucket] -= removed_count
        if not self._waiting:
            self._flushing = False
        self._full = self._flushing or any(
            self._bucket_count.get(b, 0) >= self._messages_max
            or self._bucket_bytes.get(b, 0) >= self._bytes_max
            for b, q in self._pending.items()
        )
        if bucket >= 0:
            self._partitions.request_formed(bucket)
        if self._waiting < self._pending_max:
            self._room.set()
        return bucket, taken

    async def _send(self, bucket: int, taken: list[_Waiting]) -> None:
        try:
            if bucket == _KEYED:
                await self._send_request(taken)
            elif bucket == _RAW:
                await self._send_request(taken, safe=False)
            else:
                await self._send_session_request(bucket, taken)
        except asyncio.CancelledError:
            raise
        except Exception:  # every caller of the request has it; nobody awaits this task
            log.debug("fluxmq: publishing to %s failed", self.queue, exc_info=True)
        finally:
            self._in_flight -= 1
            self._maybe_schedule(asyncio.get_running_loop())

    async def _send_request(self, taken: list[_Waiting], safe: bool = True) -> None:
        frame = _stream_request(self.queue)
        request = frame.publish
        request.messages.extend(w.message for w in taken if w.message is not None)
        try:
            # A stream's lost answer is resent: only for messages a resend cannot duplicate.
            results = await self._streamed(frame) if safe else None
            if results is None:
                results = await send_request(self._transport, request, safe=safe)
            else:
                self.requests_streamed += 1
                self._transport.published.requests_streamed += 1
            if len(results) != len(taken):
                raise FluxMQError(
                    grpc.StatusCode.INTERNAL,
                    f"{len(results)} results for {len(taken)} messages",
                )
        except FluxMQError as err:
            if len(taken) > 1 and _about_one_message(err):
                # All or nothing on the broker: find out whose message it was, one request
                # at a time (this slot of the window).
                self.requests_split += 1
                self._transport.published.requests_split += 1
                for w in taken:
                    if not w.result.done():
                        await self._send_request([w], safe)
                return
            _fail(taken, err)  # each caller of the request has the broker's answer
            return
        except BaseException as err:  # cancelled, or a bug: every caller hears of it
            _fail(taken, err)
            raise
        self._count(len(results), sum(w.size_bytes for w in taken))
        for w, r in zip(taken, results, strict=True):
            if not w.result.done():
                w.result.set_result(r)

    async def _send_session_request(
        self, partition: int, taken: list[_Waiting], stamp: Stamp | None = None
    ) -> None:
        """``_send_request`` for messages of one partition under the producer session (see
        fluxmq/client/sessions.py): a resend keeps its stamp, so it is never stored twice.
        ``stamp``: a request sent again one message at a time has its place already."""
        frame = _session_request(self.queue, partition, taken)
        request = frame.publish
        count = _count_of(request)
        session = self.session
        try:
            if stamp is None:
                stamp = await session.stamp(partition, count)
        except FluxMQError as err:  # the session could not start (InitProducer refused)
            _fail(taken, err)
            return
        except BaseException as err:
            _fail(taken, err)
            raise
        try:
            results = await self._stamped(frame, stamp)
            if len(results) != count:
                raise FluxMQError(
                    grpc.StatusCode.INTERNAL, f"{len(results)} results for {count} messages"
                )
        except _Restamped as moved:
            # Its last stamp was never sent: later requests must not wait behind it.
            session.renew(moved.stamp)
            session.release(moved.stamp)
            _fail(taken, moved.error)
            return
        except FluxMQError as err:
            if request.HasField("encoded"):
                _in_message_terms(err)
            # Whatever became of it, the partition's next sequence must not wait behind it:
            # later requests move to the next epoch.
            failed = moved_stamp(err, stamp)
            session.renew(failed)
            if count > 1 and _about_one_message(err) and not session_field(err):
                # All or nothing on the broker: find out whose message it was, one request at
                # a time (this slot of the window), each in this request's place.
                self.requests_split += 1
                self._transport.published.requests_split += 1
                taken = _one_each(taken)
                session.split(failed, len(taken))
                for part, w in enumerate(taken, start=1):
                    if w.result.done():  # its caller gave up: no stamp (a stamp is sent)
                        session.forget(failed, part)
                        continue
                    try:
                        single = await session.restamp(failed, 1, part)
                        await self._send_session_request(partition, [w], single)
                    except BaseException as unexpected:  # cancelled, or a bug
                        # The parts not sent give their places up: later requests of the
                        # partition wait for every place before theirs.
                        for later in range(part + 1, len(taken) + 1):
                            session.forget(failed, later)
                        _fail(taken[part:], unexpected)
                        raise
                return
            session.release(failed)
            _fail(taken, err)
            return
        except BaseException as err:  # cancelled, or a bug: every caller hears of it
            session.renew(stamp)  # it may have gone unsent: nothing may wait behind it
            session.release(stamp)
            _fail(taken, err)
            raise
        session.release(results_stamp(results, stamp))
        self._count(len(results), sum(w.size_bytes for w in taken))
        _settle(taken, results)

    async def _stamped(self, frame: pb.PublishStreamRequest, stamp: Stamp) -> _Results:
        """Send ``frame.publish`` under ``stamp``, stamping it again (in its order) when the
        broker says a stamp of an older epoch was not stored; -> its results (carrying the
        stamp that was stored). Raises FluxMQError (``.stamp`` attribute: the stamp last
        used)."""
        session = self.session
        request = frame.publish
        for _ in range(RESTAMPS_MAX):
            request.producer.CopyFrom(stamp.session)

            def stale(err: FluxMQError, stamp: Stamp = stamp) -> bool:
                return session.is_stale(stamp) and err.reason in RESTAMP_REASONS

            try:
                results = await self._streamed(frame)
                if results is None:
                    results = await send_request(self._transport, request, safe=True, give_up=stale)
                else:
                    self.requests_streamed += 1
                    self._transport.published.requests_streamed += 1
                return _Results(results, stamp)
            except FluxMQError as err:
                if err.reason == UNKNOWN_PRODUCER:
                    # The broker forgot the session (idle expiry): nothing is stored under it.
                    session.renew(stamp)
                    stamp = await session.restamp(stamp, _count_of(request))
                    continue
                if not stale(err):
                    err.stamp = stamp  # type: ignore[attr-defined]
                    raise
            # An older epoch's refusal says nothing of an earlier attempt: once the new epoch
            # is granted, ask again with the old stamp. A stored request is answered with its
            # offsets; anything else is fenced, and only then stamped again.
            await session.renewed()
            try:
                results = await send_request(
                    self._transport, request, safe=True,
                    give_up=lambda err: err.reason in RESTAMP_REASONS,
                )  # fmt: skip
                return _Results(results, stamp)
            except FluxMQError as err:
                if err.reason not in RESTAMP_REASONS:
                    err.stamp = stamp  # type: ignore[attr-defined]
                    raise
            stamp = await session.restamp(stamp, _count_of(request))
        raise _Restamped(
            stamp,
            FluxMQError(
                grpc.StatusCode.UNAVAILABLE,
                f"the producer session of {self.queue!r} was renewed {RESTAMPS_MAX} times while "
                "this request waited; it was not stored",
                retriable=True,
            ),
        )

    async def _streamed(self, frame: pb.PublishStreamRequest) -> list[PublishResult] | None:
        """Send ``frame`` (a stream request around the Publish: built in place, so the
        request, its records up to some 256 KiB, is not copied into one per send) on the lane;
        -> its results, or None when the unary path is to send ``frame.publish`` (no lane, a
        lane lost the answer, or a retriable refusal). Raises the broker's refusal when no
        retry can help."""
        lane = self._maybe_lane()
        if lane is None:
            return None
        t0 = time.monotonic()
        try:
            resp = await lane.request(frame, self._transport.timeout_s)
        except LaneBrokenError:
            self._transport.observe(lane.address, time.monotonic() - t0, ok=False)
            self._lanes.drop(lane)
            return None  # outcome unknown: sent again on the unary path (keys make it safe)
        self._transport.observe(lane.address, time.monotonic() - t0, ok=not resp.HasField("error"))
        if resp.HasField("error"):
            err = from_request_error(resp.error, field_prefix="publish.")
            if err.retriable:
                return None  # the unary path waits, retries, fails over
            raise err
        return results_of(resp)

    def _maybe_lane(self) -> _Lane | None:
        """The lane to where a unary call would go (the queue's leader once an answer named
        it; any node forwards)."""
        if self._transport.leader_of(self.queue) is None and not self._asked_for_leader:
            # A unary answer names the queue's leader (in a cluster): the stream then goes
            # there, not through a node that would forward every request.
            self._asked_for_leader = True
            return None
        return self._lanes.lane(self._transport.target(self.queue))

    async def close(self) -> None:
        """Wait for the requests in flight and those still waiting to be answered (then end
        the streams, if this pipeline owns them)."""
        self.closed = True
        while self._tasks or self._waiting:
            if self._tasks:
                await asyncio.gather(*self._tasks, return_exceptions=True)
            else:
                await asyncio.sleep(0.001)  # a linger timer is due
        if self._own_lanes:
            await self._lanes.close()


class _Results(list[PublishResult]):
    """A request's results and the stamp it was stored under."""

    def __init__(self, results: list[PublishResult], stamp: Stamp) -> None:
        super().__init__(results)
        self.stamp = stamp


class _Restamped(Exception):
    def __init__(self, stamp: Stamp, error: FluxMQError) -> None:
        super().__init__(str(error))
        self.stamp = stamp
        self.error = error


def runs_of(values: list[bytes], count_max: int, bytes_max: int) -> list[tuple[list[bytes], int]]:
    """``values`` cut in order into runs of at most ``count_max`` values and ``bytes_max`` bytes
    (a value larger than that alone): each run and its size in bytes.

    >>> runs_of([b"a", b"bb", b"ccc", b"d", b"e"], count_max=2, bytes_max=4)
    [([b'a', b'bb'], 3), ([b'ccc', b'd'], 4), ([b'e'], 1)]
    >>> runs_of([b"long", b"longer", b"x"], count_max=8, bytes_max=5)
    [([b'long'], 4), ([b'longer'], 6), ([b'x'], 1)]
    """
    assert count_max >= 1 and bytes_max >= 1
    lengths = list(map(len, values))
    out: list[tuple[list[bytes], int]] = []
    start = 0
    while start < len(values):
        end = min(len(values), start + count_max)
        size = sum(lengths[start:end])
        if size > bytes_max:
            sizes = list(accumulate(lengths[start:end]))
            taken = max(1, bisect_right(sizes, bytes_max))
            end, size = start + taken, sizes[taken - 1]
        out.append((values[start:end], size))
        start = end
    return out


def _session_request(queue: str, partition: int, taken: list[_Waiting]) -> pb.PublishStreamRequest:
    """A session's request for ``taken`` (all of ``partition``), in the ``publish`` field of a
    stream request: their records encoded (``PublishRequest.encoded``: the broker checks them
    without reading each message), or the messages themselves when one of them carries what a
    record cannot (a delivery delay)."""
    frame = _stream_request(queue)
    request = frame.publish
    if not any(w.delayed for w in taken):
        try:
            records, count = _encoded(taken)
        except struct.error:  # a length past the format's fields: the broker names it
            pass
        else:
            request.encoded.partition = partition
            request.encoded.count = count
            request.encoded.records = records
            return frame
    for w in taken:
        if w.message is not None:
            request.messages.append(w.message)
        else:
            assert w.values is not None
            request.messages.extend(pb.PublishMessage(value=value) for value in w.values)
    return frame


def _stream_request(queue: str) -> pb.PublishStreamRequest:
    """A stream request whose ``publish`` is filled in place (and sent alone on the unary
    path): sending it on a stream then copies nothing."""
    frame = pb.PublishStreamRequest()
    frame.publish.queue = queue
    return frame


def _encoded(taken: list[_Waiting]) -> tuple[bytes, int]:
    """The records section of ``taken`` and its record count: each stretch of single messages
    encoded in one call, each run of values by its heads and values."""
    parts: list[bytes] = []
    messages: list[pb.PublishMessage] = []
    index = 0
    for w in taken:
        if w.values is None:
            assert w.message is not None
            messages.append(w.message)
            continue
        if messages:
            parts.append(encode_records(messages, index))
            index += len(messages)
            messages = []
        parts += encode_values(w.values, index)
        index += w.count
    if messages:
        parts.append(encode_records(messages, index))
        index += len(messages)
    return b"".join(parts), index


def _one_each(taken: list[_Waiting]) -> list[_Waiting]:
    """``taken`` with each run of values (``publish_values``) cut into one waiting entry per
    value, its run's result gathered from theirs: the entries a split request sends one by
    one."""
    if all(w.values is None for w in taken):
        return taken
    out: list[_Waiting] = []
    loop = asyncio.get_running_loop()
    for w in taken:
        if w.values is None:
            out.append(w)
            continue
        singles = [
            _Waiting(None, len(value), loop.create_future(), values=[value]) for value in w.values
        ]
        out.extend(singles)
        _gather_into(w.result, [single.result for single in singles])
    return out


def _gather_into(run: asyncio.Future[Any], parts: list[asyncio.Future[Any]]) -> None:
    """Settle ``run`` once every one of ``parts`` is: with their results (each a one-element
    list), or with the first error among them; a cancelled run cancels its parts."""
    left = len(parts)

    def done(_: asyncio.Future[Any]) -> None:
        nonlocal left
        left -= 1
        if left or run.done():
            return
        if any(part.cancelled() for part in parts):
            run.cancel()
            return
        # Every part's exception is read, not only the first: an unread one is logged as
        # "Future exception was never retrieved" when the part is collected.
        errors = [part.exception() for part in parts]
        first_error = next((error for error in errors if error is not None), None)
        if first_error is not None:
            run.set_exception(first_error)
            return
        run.set_result([result for part in parts for result in part.result()])

    for part in parts:
        part.add_done_callback(done)
    run.add_done_callback(lambda r: [p.cancel() for p in parts] if r.cancelled() else None)


async def _outcomes(waiting: list[_Waiting]) -> list[PublishResult]:
    """The results of ``waiting``, in order (a run's list in its place); raises the first error
    once every entry is settled (each message's fate is its own: the others may be stored)."""
    results: list[PublishResult] = []
    error: BaseException | None = None
    for w in waiting:
        try:
            outcome = await w.result
        except FluxMQError as err:
            error = error or err
            continue
        if w.values is None:
            results.append(outcome)
        else:
            results.extend(outcome)
    if error is not None:
        raise error
    return results


def _settle(taken: list[_Waiting], results: list[PublishResult]) -> None:
    """Each entry of ``taken`` gets its results: a message its own, a run of values the list
    of theirs."""
    at = 0
    for w in taken:
        if w.values is None:
            if not w.result.done():
                w.result.set_result(results[at])
            at += 1
        else:
            if not w.result.done():
                w.result.set_result(results[at : at + w.count])
            at += w.count
    assert at == len(results)


def _delayed(message: pb.PublishMessage) -> bool:
    return bool(message.delay_ms or message.deliver_at_ms)


_ENCODED_FIELD = re.compile(r"encoded\.(?:records\[(\d+)\]|(partition)|count)")


def _in_message_terms(err: FluxMQError) -> None:
    """Name the fields of a refused request of encoded records as the messages the caller
    published (``encoded.records[3].value`` -> ``messages[3].value``; the partition is
    ``messages[0].partition``): the encoding is the SDK's business, not the caller's."""

    def rename(field: str) -> str:
        def message(match: re.Match[str]) -> str:
            if match.group(1) is not None:
                return f"messages[{match.group(1)}]"
            return "messages[0].partition" if match.group(2) else "messages"

        return _ENCODED_FIELD.sub(message, field, count=1)

    err.field_violations = tuple(
        FieldViolation(rename(v.field), v.description) for v in err.field_violations
    )
    if "field" in err.metadata:
        err.metadata["field"] = rename(err.metadata["field"])
    err.message = rename(err.message)


def _count_of(request: pb.PublishRequest) -> int:
    return request.encoded.count if request.HasField("encoded") else len(request.messages)


def moved_stamp(err: FluxMQError, stamp: Stamp) -> Stamp:
    """The stamp a request failed under (it may have been stamped again on the way)."""
    moved = getattr(err, "stamp", None)
    return moved if isinstance(moved, Stamp) else stamp


def results_stamp(results: list[PublishResult], stamp: Stamp) -> Stamp:
    return results.stamp if isinstance(results, _Results) else stamp


def session_field(err: FluxMQError) -> bool:
    """A refusal of the session's own fields (not of one message): never split on it."""
    return any(v.field.startswith("producer.") for v in err.field_violations)


def _about_one_message(err: FluxMQError) -> bool:
    """A refusal one message of the request can cause (and a request without it would not
    get): worth sending the messages again one by one to tell whose it is."""
    return bool(err.code == grpc.StatusCode.INVALID_ARGUMENT)


def _fail(taken: list[_Waiting], err: BaseException) -> None:
    for w in taken:
        if not w.result.done():
            if isinstance(err, asyncio.CancelledError):
                w.result.cancel()
            else:
                w.result.set_exception(err)
