"""Consuming a queue through a consumer group: leases, acks, retries, membership.

A :class:`Consumer` is one member of a group (``consumer_id``, default
``<hostname>-<pid>-<random>``). Started (first ``async for`` step, ``async with``, or
``AsyncClient.consume``), it:

- makes sure the group exists (``create_group=True`` creates it, GROUP_EXISTS is fine), reads
  the group's mode and the queue's lease timeout;
- joins the group (JoinGroup) and heartbeats in the background at the interval the broker asks
  for; when the broker says ``should_rejoin`` it joins again; when it reports *revoking*
  partitions (ordered groups) it finishes the messages it holds from them and heartbeats at
  once, which releases them to their new owner; on ``STALE_GENERATION`` it heartbeats at once
  to learn its generation and retries the request. Every Lease / Ack / Nack / ExtendLease
  carries ``member_id`` and ``generation_id``. In *shared* groups membership is liveness only;
  in *ordered* groups leases come only from the member's assigned partitions;
- receives messages (``mode``): ``"push"`` (the default) opens a ``Consume`` stream with its
  prefetch as the stream's credit (``max_in_flight``): the broker checks the consumer out of
  the group and sends each message in the replicated round that stores it (no round of its
  own), and each ack's round tops the credit up; a stop asks the broker to end the stream
  (EndConsume: nothing more is assigned), reads what it was given to the end, and handles it
  like the rest. ``"poll"`` leases batches with a long poll (``Lease``, ``wait_ms``) while
  fewer than its prefetch limit are held. Either way it renews the leases of
  held messages at about half their lease time (ExtendLease), so a long handler keeps its
  message, and sends acks in batches. A node that shuts down (SIGTERM) ends the stream or the
  long poll at once with NODE_SHUTTING_DOWN: the next one goes to another node without
  waiting, and the held messages are acked there (receipts are valid on any node of the
  queue's group). A stream that fails (a leader change, a node gone, a new generation) is
  opened again, on the leader the error names when it names one.

Each :class:`Message` is acked, nacked or extended with its own methods. With
``AsyncClient.consume`` a handler's success acks the message (``auto_ack``), an exception
nacks it (the queue's retry backoff, or ``nack_delay_ms``); past the queue's ``max_attempts``
the broker dead-letters it. Stopping (the ``stop`` event, a signal, ``Consumer.stop()``) is
graceful: no new leases; the messages already leased are still handled and acked; then the
member leaves the group. Nothing leased is dropped: what is not acked comes back (another
member gets it, or this one after its lease ends).
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import os
import re
import secrets
import socket
import time
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from types import TracebackType
from typing import Any

import grpc

from fluxmq._pb.v1 import queue_pb2 as pb
from fluxmq.client._transport import RetryPolicy, Transport
from fluxmq.client.codecs import Codec
from fluxmq.client.errors import (
    FluxMQError,
    GroupExists,
    NotFound,
    StaleGeneration,
    from_rpc_error,
)

log = logging.getLogger("fluxmq.client")

DEFAULT_BATCH = 100
DEFAULT_WAIT_MS = 1000
MODES = ("push", "poll")
DEFAULT_LEASE_MS = 30_000
RECEIPTS_PER_CALL = 1000
SETTLE_TRIES = 5
_DURATION = re.compile(r"^\s*(\d+)\s*(ms|s|m|h|d)\s*$")
_UNIT_MS = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}

Handler = Callable[["Message"], "Awaitable[Any] | Any"]


def parse_duration_ms(text: str, default_ms: int) -> int:
    """``"30s"`` -> 30000 (the broker's duration strings); ``default_ms`` when empty."""
    m = _DURATION.match(text or "")
    return int(m.group(1)) * _UNIT_MS[m.group(2)] if m else default_ms


def default_consumer_id() -> str:
    return f"{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(3)}"


def status_name(status: int) -> str:
    """``RECEIPT_STATUS_ACKED`` -> ``"ACKED"``."""
    return pb.ReceiptStatus.Name(status).removeprefix("RECEIPT_STATUS_")  # type: ignore[arg-type]


@dataclass(slots=True)
class ConsumerStats:
    """A consumer's counters since it started (``Consumer.stats``; summed by
    ``AsyncClient.stats()``)."""

    leased: int = 0
    acked: int = 0
    nacked: int = 0
    dead_lettered: int = 0
    stale: int = 0  # settles that found the lease gone (the message went back)
    handler_errors: int = 0
    extended: int = 0
    released: int = 0  # leased, never handed out, given back at close


# on_assigned / on_revoked: called with the partitions, plain or async (aiokafka's
# ConsumerRebalanceListener).
RebalanceCallback = Callable[[frozenset[int]], Awaitable[None] | None]


class Message:
    """One leased message. ``data`` is the value decoded with the consumer's codec; ``value``
    the raw bytes. Settle it once with ``ack()``, ``nack()`` (or let ``auto_ack`` do it)."""

    __slots__ = (
        "_consumer",
        "_data",
        "_deadline",
        "_decoded",
        "lost",
        "receipt",
        "record",
        "settled",
    )

    def __init__(self, consumer: Consumer, leased: pb.LeasedMessage, deadline: float) -> None:
        self._consumer = consumer
        self.record = leased.record
        self.receipt = leased.receipt
        self._deadline = deadline  # time.monotonic() when the lease ends, as far as we know
        self._decoded = False
        self._data: Any = None
        self.settled = False  # ack/nack sent (or queued)
        self.lost = False  # a renewal found the lease gone: the broker will redeliver it

    @property
    def queue(self) -> str:
        return self._consumer.queue

    @property
    def group(self) -> str:
        return self._consumer.group

    @property
    def value(self) -> bytes:
        return self.record.value

    @property
    def data(self) -> Any:
        if not self._decoded:
            self._data = self._consumer.codec.decode(self.record.value)
            self._decoded = True
        return self._data

    @property
    def key(self) -> bytes | None:
        return self.record.key if self.record.HasField("key") else None

    @property
    def headers(self) -> dict[str, bytes]:
        return dict(self.record.headers)

    @property
    def partition(self) -> int:
        return self.receipt.partition

    @property
    def offset(self) -> int:
        return self.receipt.offset

    @property
    def attempt(self) -> int:
        """1 on the first delivery."""
        return self.receipt.attempt

    @property
    def timestamp_ms(self) -> int:
        return self.record.timestamp_ms

    @property
    def lease_deadline_ms(self) -> int:
        return self.receipt.lease_deadline_ms

    async def ack(self, *, wait: bool = False) -> str | None:
        """Acks (batched with other acks, sent within a few milliseconds). ``wait=True``
        waits for the broker's answer and returns it: ``ACKED``, ``ALREADY_ACKED`` or
        ``STALE`` (the lease had ended and the message went back: it will be redelivered)."""
        fut = self._consumer._enqueue_ack(self, wait)
        return await fut if fut is not None else None

    async def nack(
        self, *, delay_ms: int | None = None, dead: bool = False, reason: str = ""
    ) -> str:
        """Gives the message back: redelivered after ``delay_ms`` (default: the queue's retry
        backoff), or ``dead=True`` sends it to the dead-letter queue with ``reason``. Past the
        queue's ``max_attempts`` the broker dead-letters it anyway. Returns the status
        (``NACKED``, ``DEAD_LETTERED``, ``STALE``...)."""
        return await self._consumer._nack(self, delay_ms, dead, reason)

    async def extend(self, lease_ms: int | None = None) -> int:
        """Moves the lease deadline to now + ``lease_ms`` (default: the consumer's lease
        time); returns the new deadline (epoch ms), 0 if the lease was gone. Renewal is
        automatic while the consumer runs; this is for explicit control."""
        return await self._consumer._extend_one(self, lease_ms)

    def __repr__(self) -> str:
        return (
            f"Message(queue={self.queue!r}, partition={self.partition}, offset={self.offset}, "
            f"attempt={self.attempt}, value={self.value[:40]!r})"
        )


class Consumer:
    """A consumer-group member; an async iterator of :class:`Message` (see the module doc).

    ``batch``: messages per Lease (1..1000); ``prefetch``: most messages held (leased, not yet
    settled) at once (default ``batch``; ``consume`` uses ``batch + max(batch,
    concurrency)``); ``lease_ms``: lease time (default the queue's ``lease_timeout``);
    ``wait_ms``: the long poll of each Lease (also the longest a stop waits for it);
    ``mode``: ``"push"`` (a Consume stream; the default) or ``"poll"`` (Lease long polls);
    ``auto_ack``: as an iterator, a message is acked when the next one is asked for or the
    ``async with`` block is left normally, nacked when it is left with an exception.

    Leaving the iteration early (``break``) and closing gives back the messages leased but
    never handed out (a Nack redelivering them at once: their attempt counts one more).
    """

    def __init__(
        self,
        transport: Transport,
        queue: str,
        group: str,
        *,
        codec: Codec,
        consumer_id: str | None = None,
        batch: int = DEFAULT_BATCH,
        prefetch: int | None = None,
        lease_ms: int | None = None,
        wait_ms: int = DEFAULT_WAIT_MS,
        mode: str = "push",
        auto_ack: bool = True,
        create_group: bool = False,
        session_timeout_ms: int = 0,
        strategy: str = "",
        ack_linger_ms: float = 5.0,
        stop: asyncio.Event | None = None,
        on_close: Callable[[Consumer], None] | None = None,
        on_assigned: RebalanceCallback | None = None,
        on_revoked: RebalanceCallback | None = None,
    ) -> None:
        if not 1 <= batch <= RECEIPTS_PER_CALL:
            raise ValueError(f"batch must be 1..{RECEIPTS_PER_CALL}")
        if not 0 <= wait_ms <= 60_000:
            raise ValueError("wait_ms must be 0..60000")
        if mode not in MODES:
            raise ValueError(f"mode must be one of {', '.join(map(repr, MODES))}, not {mode!r}")
        self.queue = queue
        self.group = group
        self.codec = codec
        self.consumer_id = consumer_id or default_consumer_id()
        self.stats = ConsumerStats()
        self._transport = transport
        self._batch = batch
        self._prefetch = max(prefetch or batch, 1)
        self._lease_ms_arg = lease_ms
        self._lease_s = (lease_ms or DEFAULT_LEASE_MS) / 1000
        self._wait_ms = wait_ms
        self.mode = mode
        self._stream_call: Any = None  # the open Consume stream (push mode)
        self._end_task: asyncio.Task[None] | None = None  # its graceful end (push mode)
        self._auto_ack = auto_ack
        self._create_group = create_group
        self._session_timeout_ms = session_timeout_ms
        self._strategy = strategy
        self._ack_linger_s = ack_linger_ms / 1000
        self._stop_event = stop
        self._on_close = on_close
        self._on_assigned = on_assigned
        self._on_revoked = on_revoked
        self._revoked_told: frozenset[int] = frozenset()  # told on_revoked, not released yet
        # membership
        self.member_id = ""
        self.generation = 0
        self.assigned: frozenset[int] = frozenset()
        self.revoking: frozenset[int] = frozenset()
        self.pending: frozenset[int] = frozenset()
        self.ordered = False
        self._hb_interval_s = 3.0
        self._hb_at = 0.0
        self._hb_lock = asyncio.Lock()
        self._hb_now = asyncio.Event()
        # held messages: leased and not settled (key: partition, offset, lease id)
        self._held: dict[tuple[int, int, int], Message] = {}
        self._held_changed = asyncio.Event()
        self._buffer: deque[Message] = deque()
        self._buffer_ready = asyncio.Event()
        self._deliver: Callable[[Message], None] = self._to_buffer
        self._current: Message | None = None
        # acks
        self._acks: list[tuple[Message, asyncio.Future[str] | None]] = []
        self._ack_wakeup = asyncio.Event()
        self._ack_full = asyncio.Event()
        self._acks_idle = asyncio.Event()
        self._acks_idle.set()
        # lifecycle
        self._start_lock = asyncio.Lock()
        self._prepared = False
        self._started = False
        self._stopping = False
        self._stopped = asyncio.Event()
        self._closed = False
        self._failure: BaseException | None = None
        self._lease_task: asyncio.Task[None] | None = None
        self._ack_task: asyncio.Task[None] | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._run_ended: asyncio.Event | None = None  # set while run() runs

    # -- lifecycle -------------------------------------------------------------------------------

    async def start(self) -> None:
        async with self._start_lock:
            if self._started:
                return
            if self._closed:
                raise RuntimeError("the consumer is closed")
            if not self._prepared:
                await self._prepare()
            await self._join()
            self._started = True
            loop = self._consume_loop() if self.mode == "push" else self._lease_loop()
            self._lease_task = asyncio.ensure_future(loop)
            self._lease_task.add_done_callback(self._lease_ended)
            self._ack_task = asyncio.ensure_future(self._ack_loop())
            self._tasks = [
                self._ack_task,
                asyncio.ensure_future(self._heartbeat_loop()),
                asyncio.ensure_future(self._renew_loop()),
            ]
            if self._stop_event is not None:
                self._tasks.append(asyncio.ensure_future(self._watch_stop(self._stop_event)))

    async def _prepare(self) -> None:
        if self._create_group:
            with contextlib.suppress(GroupExists):
                await self._call(
                    "CreateGroup", pb.CreateGroupRequest(queue=self.queue, group=self.group),
                    safe=False,
                )  # fmt: skip
        described, queue = await asyncio.gather(
            self._call(
                "DescribeGroup", pb.DescribeGroupRequest(queue=self.queue, group=self.group)
            ),
            self._call("GetQueue", pb.GetQueueRequest(name=self.queue)),
        )
        self.ordered = described.group.mode == pb.DELIVERY_MODE_ORDERED
        if self._lease_ms_arg is None:
            self._lease_s = parse_duration_ms(queue.config.lease_timeout, DEFAULT_LEASE_MS) / 1000
        self._prepared = True

    def _lease_ended(self, task: asyncio.Task[None]) -> None:
        if not task.cancelled() and task.exception() is not None:
            self._fail(task.exception() or RuntimeError("lease loop ended"))
        self._buffer_ready.set()

    def stop(self) -> None:
        """No new leases from now on; what is leased is still handed out (the iteration ends
        after it)."""
        self._stopping = True
        self._stopped.set()
        self._held_changed.set()
        self._buffer_ready.set()
        if self._stream_call is not None:
            self._end_stream(self._stream_call)

    def _end_stream(self, call: Any) -> None:
        """Push mode's stop: the broker checks this consumer in (EndConsume), so the stream
        sends what it was given and ends; the consume loop reads it to its end."""
        if self._end_task is not None:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # no loop to ask the broker from: cut the stream
            call.cancel()
            return
        self._end_task = loop.create_task(self._end_consume(call))

    async def _end_consume(self, call: Any) -> None:
        request = pb.EndConsumeRequest(
            queue=self.queue, group=self.group, consumer_id=self.consumer_id
        )
        try:
            answer = await self._call("EndConsume", request, retry=RetryPolicy(max_attempts=3))
            if answer.ended and self._lease_task is not None:
                await asyncio.wait([self._lease_task], timeout=self._transport.timeout_s)
        except FluxMQError as err:
            # What the broker sent and this consumer does not read stays leased to it until
            # the lease ends (then it goes to another consumer).
            log.warning("fluxmq: ending the Consume stream of %s failed: %s", self.consumer_id,
                        err)  # fmt: skip
        finally:
            call.cancel()  # ended by then, or cut

    async def _watch_stop(self, event: asyncio.Event) -> None:
        await event.wait()
        self.stop()

    def _fail(self, err: BaseException) -> None:
        if self._failure is None:
            log.error("fluxmq: consumer %s of %s/%s failed: %s", self.consumer_id, self.queue,
                      self.group, err)  # fmt: skip
            self._failure = err
        self.stop()

    @property
    def failure(self) -> BaseException | None:
        return self._failure

    @property
    def held(self) -> int:
        """Messages leased to this consumer and not settled yet."""
        return len(self._held)

    async def close(self, *, release: bool = True) -> None:
        """Graceful end: stop leasing, settle (auto-ack) the current message, give back the
        leased messages not handed out (``release``), send pending acks, leave the group.
        While ``run()`` runs, this stops it and waits until it has ended (gracefully)."""
        if self._run_ended is not None:
            self.stop()
            await self._run_ended.wait()
            return
        await self._close(release)

    async def _close(self, release: bool) -> None:
        if self._closed:
            return
        self._closed = True
        self.stop()
        try:
            if self._lease_task is not None:
                with contextlib.suppress(Exception):
                    await self._lease_task
            if self._end_task is not None:
                with contextlib.suppress(Exception):
                    await self._end_task
            if release and self._buffer:
                rest = list(self._buffer)
                self._buffer.clear()
                await self._release(rest)
            await self._flush_acks()
            if self.member_id:
                # What it holds is settled: it is about to give its partitions up.
                held = (self.assigned | self.revoking) - self._revoked_told
                if held:
                    self._revoked_told |= held
                    await self._callback(self._on_revoked, held)
                with contextlib.suppress(FluxMQError):
                    await self._call(
                        "LeaveGroup",
                        pb.LeaveGroupRequest(
                            queue=self.queue, group=self.group, member_id=self.member_id
                        ),
                        retry=RetryPolicy(max_attempts=3),
                    )
        finally:
            for t in self._tasks:
                t.cancel()
            for t in self._tasks:
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await t
            if self._on_close is not None:
                self._on_close(self)

    async def __aenter__(self) -> Consumer:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        cur, self._current = self._current, None
        if cur is not None and self._auto_ack and not cur.settled:
            if exc is None:
                self._enqueue_ack(cur, False)
            else:
                with contextlib.suppress(FluxMQError):
                    await cur.nack(reason=f"{type(exc).__name__}: {exc}"[:200])
        await self.close()

    # -- iteration -------------------------------------------------------------------------------

    def __aiter__(self) -> Consumer:
        return self

    async def __anext__(self) -> Message:
        cur, self._current = self._current, None
        if cur is not None and self._auto_ack and not cur.settled:
            self._enqueue_ack(cur, False)
        if not self._started:
            await self.start()
        while not self._buffer:
            if self._failure is not None:
                raise self._failure
            if self._stopping and (self._lease_task is None or self._lease_task.done()):
                raise StopAsyncIteration
            self._buffer_ready.clear()
            await self._buffer_ready.wait()
        m = self._buffer.popleft()
        self._current = m
        return m

    def _to_buffer(self, m: Message) -> None:
        self._buffer.append(m)
        self._buffer_ready.set()

    # -- handler mode (AsyncClient.consume) ------------------------------------------------------

    async def run(
        self,
        handler: Handler,
        *,
        concurrency: int = 1,
        nack_delay_ms: int | None = None,
        stop: asyncio.Event | None = None,
    ) -> ConsumerStats:
        """Calls ``handler(message)`` for every message, ``concurrency`` at a time (in ordered
        groups messages of one partition go one after the other, in offset order), until
        ``stop`` is set or the consumer fails (then raises). Success acks (with
        ``auto_ack``); an exception nacks. Graceful: see the module doc."""
        if concurrency < 1:
            raise ValueError("concurrency must be at least 1")
        if self._started or self._run_ended is not None:
            raise RuntimeError("run() needs a consumer that has not started")
        self._run_ended = asyncio.Event()
        try:
            return await self._run(handler, concurrency, nack_delay_ms, stop)
        finally:
            self._run_ended.set()
            self._run_ended = None

    async def _run(
        self,
        handler: Handler,
        concurrency: int,
        nack_delay_ms: int | None,
        stop: asyncio.Event | None,
    ) -> ConsumerStats:
        self._prefetch = max(self._prefetch, self._batch + max(self._batch, concurrency))
        workers: list[asyncio.Task[None]] = []
        try:
            await self._prepare()
            # Ordered groups: one lane per worker, a partition always in the same lane (offset
            # order); shared groups: one lane every worker takes from.
            lanes: list[asyncio.Queue[Message | None]] = [
                asyncio.Queue() for _ in range(concurrency if self.ordered else 1)
            ]
            self._deliver = lambda m: lanes[m.partition % len(lanes)].put_nowait(m)
            await self.start()
        except BaseException:
            await self._close(release=False)
            raise
        per_lane = 1 if self.ordered else concurrency
        for lane in lanes:
            for _ in range(per_lane):
                workers.append(asyncio.ensure_future(self._work(lane, handler, nack_delay_ms)))
        graceful = False
        try:
            assert self._lease_task is not None
            waits: list[asyncio.Future[Any]] = [self._lease_task]
            if stop is not None:
                waits.append(asyncio.ensure_future(stop.wait()))
            try:
                await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for w in waits[1:]:
                    w.cancel()
            self.stop()
            with contextlib.suppress(Exception):
                await self._lease_task  # the long poll in flight: its messages are handled too
            for lane in lanes:
                for _ in range(per_lane):
                    lane.put_nowait(None)
            await asyncio.gather(*workers)
            graceful = True
        finally:
            if not graceful:
                for w in workers:
                    w.cancel()
            await self._close(release=False)
        if self._failure is not None:
            raise self._failure
        return self.stats

    async def _work(
        self, lane: asyncio.Queue[Message | None], handler: Handler, nack_delay_ms: int | None
    ) -> None:
        while True:
            m = await lane.get()
            if m is None:
                return
            try:
                result = handler(m)
                if inspect.isawaitable(result):
                    await result
            except Exception as exc:
                self.stats.handler_errors += 1
                log.debug("fluxmq: handler failed on %r: %r", m, exc)
                if not m.settled:
                    try:
                        await m.nack(
                            delay_ms=nack_delay_ms, reason=f"{type(exc).__name__}: {exc}"[:200]
                        )
                    except FluxMQError as err:
                        log.warning("fluxmq: nack of %r failed: %s", m, err)
            else:
                if self._auto_ack and not m.settled:
                    self._enqueue_ack(m, False)

    # -- membership ------------------------------------------------------------------------------

    async def _join(self) -> None:
        before = self.assigned | self.revoking
        a = await self._call(
            "JoinGroup",
            pb.JoinGroupRequest(
                queue=self.queue,
                group=self.group,
                consumer_id=self.consumer_id,
                session_timeout_ms=self._session_timeout_ms,
                strategy=self._strategy,
                member_id=self.member_id,
            ),
        )
        self._adopt(a)
        log.debug("fluxmq: %s joined %s/%s as %s gen %d", self.consumer_id, self.queue,
                  self.group, self.member_id, self.generation)  # fmt: skip
        await self._tell_rebalance(before)

    def _adopt(self, a: pb.MemberAssignment) -> None:
        self.member_id = a.member_id
        self.generation = a.generation_id
        self.assigned = frozenset(a.assigned)
        self.revoking = frozenset(a.revoking)
        self.pending = frozenset(a.pending)
        if a.heartbeat_interval_ms:
            self._hb_interval_s = max(0.05, a.heartbeat_interval_ms / 1000)
        self._hb_at = time.monotonic()

    async def _heartbeat(self, asked_at: float | None = None) -> None:
        """One heartbeat (or a join, if the broker forgot us). With ``asked_at``: skipped if
        another heartbeat completed since then (concurrent refreshes share one)."""
        async with self._hb_lock:
            if asked_at is not None and self._hb_at > asked_at:
                return
            request = pb.HeartbeatRequest(
                queue=self.queue,
                group=self.group,
                member_id=self.member_id,
                generation_id=self.generation,
            )
            try:
                a = await self._call("Heartbeat", request)
            except StaleGeneration:
                # The assignment moved while the broker released partitions for this
                # generation: heartbeat again to learn the new one (nothing is released).
                a = await self._call("Heartbeat", request)
            if a.should_rejoin:
                log.info("fluxmq: %s rejoins %s/%s: %s", self.consumer_id, self.queue,
                         self.group, a.reason)  # fmt: skip
                await self._join()
            else:
                before = self.assigned | self.revoking
                self._adopt(a)
                await self._tell_rebalance(before)

    async def _tell_rebalance(self, before: frozenset[int]) -> None:
        """The rebalance callbacks, after an assignment changed: ``on_assigned`` with the
        partitions newly held; ``on_revoked`` with those lost outright (a new membership
        without them); partitions being revoked are told once their messages are settled
        (``_heartbeat_loop``), before the heartbeat that releases them."""
        held = self.assigned | self.revoking
        lost = before - held - self._revoked_told
        self._revoked_told &= held
        gained = self.assigned - before
        if lost:
            await self._callback(self._on_revoked, lost)
        if gained:
            await self._callback(self._on_assigned, gained)

    async def _callback(self, fn: RebalanceCallback | None, partitions: frozenset[int]) -> None:
        if fn is None:
            return
        try:
            result = fn(partitions)
            if inspect.isawaitable(result):
                await result
        except Exception:  # the application's own: logged, the consumer goes on
            log.exception("fluxmq: rebalance callback of %s/%s failed", self.queue, self.group)

    async def _refresh(self, asked_at: float) -> None:
        """After STALE_GENERATION: learn the current generation now."""
        await self._heartbeat(asked_at)

    async def _heartbeat_loop(self) -> None:
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._hb_now.wait(), self._hb_interval_s)
            self._hb_now.clear()
            try:
                await self._heartbeat()
            except FluxMQError as err:
                if err.retriable:
                    log.warning("fluxmq: heartbeat of %s failed: %s", self.consumer_id, err)
                    continue
                if isinstance(err, NotFound):  # the queue or the group is gone
                    self._fail(err)
                    return
                log.warning("fluxmq: heartbeat of %s failed (%s): joining again",
                            self.consumer_id, err)  # fmt: skip
                try:
                    await self._join()
                except FluxMQError as join_err:
                    if not join_err.retriable:
                        self._fail(join_err)
                        return
                continue
            if self.revoking:
                await self._finish_partitions(self.revoking, self._hb_interval_s)
                fresh = self.revoking - self._revoked_told
                if fresh:
                    self._revoked_told |= fresh
                    await self._callback(self._on_revoked, fresh)
                self._hb_now.set()  # heartbeat at once: it releases them

    async def _finish_partitions(self, partitions: frozenset[int], timeout_s: float) -> None:
        """Waits (at most ``timeout_s``) until no message of ``partitions`` is held."""
        deadline = time.monotonic() + timeout_s
        while any(k[0] in partitions for k in self._held):
            left = deadline - time.monotonic()
            if left <= 0:
                return
            self._held_changed.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._held_changed.wait(), left)

    # -- leasing ---------------------------------------------------------------------------------

    async def _lease_loop(self) -> None:
        failures = 0
        policy = self._transport.retry
        while not self._stopping:
            room = self._prefetch - len(self._held)
            if room < max(1, min(self._batch, self._prefetch // 2)):
                self._held_changed.clear()
                await self._held_changed.wait()
                continue
            req = pb.LeaseRequest(
                queue=self.queue,
                group=self.group,
                consumer_id=self.consumer_id,
                max_messages=min(self._batch, room),
                lease_ms=self._lease_ms_arg or 0,
                wait_ms=self._wait_ms,
                member_id=self.member_id,
                generation_id=self.generation,
            )
            t0 = time.monotonic()
            try:
                resp = await self._call(
                    "Lease", req, timeout_s=self._transport.timeout_s + self._wait_ms / 1000
                )
            except StaleGeneration:
                await self._safely(self._refresh(t0))
                continue
            except FluxMQError as err:
                if not err.retriable:
                    self._fail(err)
                    return
                failures += 1
                log.warning("fluxmq: lease from %s/%s failed: %s", self.queue, self.group, err)
                advised = (err.retry_after_ms or 0) / 1000  # RATE_LIMITED: when to come back
                await self._pause(max(policy.backoff_s(failures) + 0.05, advised))
                continue
            failures = 0
            if not resp.messages:
                if time.monotonic() - t0 < 0.05 and self._wait_ms:
                    await self._pause(0.1)  # no long poll happened (e.g. nothing assigned yet)
                continue
            self._hold(resp.messages, t0)

    async def _consume_loop(self) -> None:
        failures = 0
        policy = self._transport.retry
        while not self._stopping:
            req = pb.ConsumeRequest(
                queue=self.queue,
                group=self.group,
                consumer_id=self.consumer_id,
                max_in_flight=self._prefetch,
                lease_ms=self._lease_ms_arg or 0,
                batch_max=self._batch,
                member_id=self.member_id,
                generation_id=self.generation,
            )
            t0 = time.monotonic()
            target, call = self._transport.server_stream("Consume", req, queue=self.queue)
            self._stream_call = call
            try:
                async for resp in call:
                    failures = 0
                    self._hold(resp.messages, time.monotonic())
            except grpc.aio.AioRpcError as rpc_err:
                err = from_rpc_error(rpc_err)
            except asyncio.CancelledError:
                if not self._stopping:
                    raise  # this task was cancelled, not the stream by stop()
                return
            else:
                continue  # ended (EndConsume, after a stop: the loop ends), or open another
            finally:
                self._stream_call = None
                call.cancel()
            if self._stopping:
                return
            if isinstance(err, StaleGeneration):
                await self._safely(self._refresh(t0))
                continue
            if not err.retriable:
                self._fail(err)
                return
            if self._transport.stream_failed(err, target, self.queue):
                continue  # another node, named or next: no reason to wait
            failures += 1
            log.warning("fluxmq: Consume of %s/%s failed: %s", self.queue, self.group, err)
            advised = (err.retry_after_ms or 0) / 1000
            await self._pause(max(policy.backoff_s(failures) + 0.05, advised))

    def _hold(self, messages: Any, received: float) -> None:
        """Messages just leased (lease deadlines counted from ``received``): held until
        settled, handed out."""
        deadline = received + self._lease_s
        self.stats.leased += len(messages)
        for leased in messages:
            m = Message(self, leased, deadline)
            r = leased.receipt
            self._held[(r.partition, r.offset, r.lease_id)] = m
            self._deliver(m)

    async def _pause(self, seconds: float) -> None:
        """Sleeps, unless the consumer stops first."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._stopped.wait(), seconds)

    async def _safely(self, aw: Awaitable[None]) -> None:
        try:
            await aw
        except FluxMQError as err:
            if not err.retriable:
                self._fail(err)
            else:
                log.warning("fluxmq: %s", err)

    def _unhold(self, m: Message) -> None:
        r = m.receipt
        if self._held.pop((r.partition, r.offset, r.lease_id), None) is not None:
            self._held_changed.set()

    # -- settling --------------------------------------------------------------------------------

    async def _call(
        self,
        method: str,
        request: Any,
        *,
        safe: bool = True,
        timeout_s: float | None = None,
        retry: RetryPolicy | None = None,
    ) -> Any:
        return await self._transport.unary(
            "queue", method, request, safe=safe, queue=self.queue, timeout_s=timeout_s,
            retry=retry,
        )  # fmt: skip

    async def _settle(self, method: str, build: Callable[[], Any]) -> Any:
        """Ack / Nack / ExtendLease with the current member generation; after
        STALE_GENERATION, heartbeat and try again (a few times)."""
        for attempt in range(1, SETTLE_TRIES + 1):
            t0 = time.monotonic()
            try:
                return await self._call(method, build())
            except StaleGeneration:
                if attempt == SETTLE_TRIES:
                    raise
                await self._refresh(t0)
        raise AssertionError("unreachable")

    def _enqueue_ack(self, m: Message, wait: bool) -> asyncio.Future[str] | None:
        if m.settled:
            raise RuntimeError(f"{m!r} is already settled")
        if self._ack_task is None or self._ack_task.done():
            raise RuntimeError("the consumer is closed: the message will be redelivered")
        m.settled = True
        fut: asyncio.Future[str] | None = None
        if wait:
            fut = asyncio.get_running_loop().create_future()
        self._acks.append((m, fut))
        self._acks_idle.clear()
        self._ack_wakeup.set()
        if len(self._acks) >= self._batch:
            self._ack_full.set()
        return fut

    async def _flush_acks(self) -> None:
        if self._acks or not self._acks_idle.is_set():
            self._ack_full.set()
            self._ack_wakeup.set()
            if self._ack_task is None or self._ack_task.done():
                while self._acks:
                    await self._send_acks()
                self._acks_idle.set()
                return
            await self._acks_idle.wait()

    async def _ack_loop(self) -> None:
        while True:
            if not self._acks:
                self._acks_idle.set()
                self._ack_wakeup.clear()
                await self._ack_wakeup.wait()
                continue
            if len(self._acks) < self._batch and self._ack_linger_s > 0:
                self._ack_full.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._ack_full.wait(), self._ack_linger_s)
            await self._send_acks()

    async def _send_acks(self) -> None:
        batch, self._acks = self._acks[:RECEIPTS_PER_CALL], self._acks[RECEIPTS_PER_CALL:]
        receipts = [m.receipt for m, _ in batch]

        def build() -> pb.AckRequest:
            return pb.AckRequest(
                queue=self.queue,
                group=self.group,
                receipts=receipts,
                member_id=self.member_id,
                generation_id=self.generation,
            )

        try:
            resp = await self._settle("Ack", build)
        except FluxMQError as err:
            log.warning("fluxmq: %d acks of %s/%s failed (the messages will be redelivered): %s",
                        len(batch), self.queue, self.group, err)  # fmt: skip
            for m, fut in batch:
                self._unhold(m)
                if fut is not None and not fut.done():
                    fut.set_exception(err)
            return
        for (m, fut), status in zip(batch, resp.statuses, strict=True):
            self._unhold(m)
            if status in (pb.RECEIPT_STATUS_ACKED, pb.RECEIPT_STATUS_ALREADY_ACKED):
                self.stats.acked += 1
            else:
                self.stats.stale += 1
            if fut is not None and not fut.done():
                fut.set_result(status_name(status))

    async def _nack(self, m: Message, delay_ms: int | None, dead: bool, reason: str) -> str:
        if m.settled:
            raise RuntimeError(f"{m!r} is already settled")
        m.settled = True

        def build() -> pb.NackRequest:
            return pb.NackRequest(
                queue=self.queue,
                group=self.group,
                receipts=[m.receipt],
                retry_after_ms=delay_ms or 0,
                dead=dead,
                reason=reason,
                member_id=self.member_id,
                generation_id=self.generation,
            )

        try:
            resp = await self._settle("Nack", build)
        finally:
            self._unhold(m)
        status = resp.statuses[0]
        if status == pb.RECEIPT_STATUS_NACKED:
            self.stats.nacked += 1
        elif status == pb.RECEIPT_STATUS_DEAD_LETTERED:
            self.stats.dead_lettered += 1
        else:
            self.stats.stale += 1
        return status_name(status)

    async def _release(self, messages: list[Message]) -> None:
        """Gives back leased messages that were never handed out: redelivered at once."""
        for i in range(0, len(messages), RECEIPTS_PER_CALL):
            chunk = messages[i : i + RECEIPTS_PER_CALL]
            for m in chunk:
                m.settled = True

            def build(chunk: list[Message] = chunk) -> pb.NackRequest:
                return pb.NackRequest(
                    queue=self.queue,
                    group=self.group,
                    receipts=[m.receipt for m in chunk],
                    retry_after_ms=1,
                    reason="released by a closing consumer",
                    member_id=self.member_id,
                    generation_id=self.generation,
                )

            try:
                await self._settle("Nack", build)
                self.stats.released += len(chunk)
            except FluxMQError as err:
                log.warning("fluxmq: releasing %d messages failed (they come back when their "
                            "lease ends): %s", len(chunk), err)  # fmt: skip
            for m in chunk:
                self._unhold(m)

    # -- lease renewal ---------------------------------------------------------------------------

    async def _extend_one(self, m: Message, lease_ms: int | None) -> int:
        deadlines = await self._extend([m], lease_ms or int(self._lease_s * 1000))
        return deadlines[0]

    async def _extend(self, messages: list[Message], lease_ms: int) -> list[int]:
        t0 = time.monotonic()
        receipts = [m.receipt for m in messages]

        def build() -> pb.ExtendLeaseRequest:
            return pb.ExtendLeaseRequest(
                queue=self.queue,
                group=self.group,
                receipts=receipts,
                lease_ms=lease_ms,
                member_id=self.member_id,
                generation_id=self.generation,
            )

        resp = await self._settle("ExtendLease", build)
        out: list[int] = []
        for m, status, deadline in zip(
            messages, resp.statuses, resp.lease_deadlines_ms, strict=True
        ):
            if status == pb.RECEIPT_STATUS_EXTENDED:
                m._deadline = t0 + lease_ms / 1000
                m.receipt.lease_deadline_ms = deadline
                self.stats.extended += 1
            elif status == pb.RECEIPT_STATUS_STALE or status == pb.RECEIPT_STATUS_UNKNOWN:
                m.lost = True
            out.append(int(deadline))
        return out

    async def _renew_loop(self) -> None:
        """Extends every held lease that is past half its time."""
        tick = max(0.05, min(1.0, self._lease_s / 4))
        lease_ms = max(100, int(self._lease_s * 1000))
        while True:
            await asyncio.sleep(tick)
            now = time.monotonic()
            due = [
                m
                for m in self._held.values()
                if not m.lost and m._deadline - now < self._lease_s / 2
            ]
            for i in range(0, len(due), RECEIPTS_PER_CALL):
                try:
                    await self._extend(due[i : i + RECEIPTS_PER_CALL], lease_ms)
                except FluxMQError as err:
                    if not err.retriable and not isinstance(err, StaleGeneration):
                        self._fail(err)
                        return
                    log.warning("fluxmq: lease renewal failed: %s", err)
