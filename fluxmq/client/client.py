"""The entry points: :class:`AsyncClient` (asyncio) and :class:`Client` (blocking)."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
import signal
import threading
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any, TypeVar

import grpc

from fluxmq._pb.v1 import admin_pb2
from fluxmq._pb.v1 import queue_pb2 as pb
from fluxmq.client._security import Credentials, PathLike
from fluxmq.client._sync import (
    LoopThread,
    SyncAdmin,
    SyncConsumer,
    SyncMessage,
    SyncProducer,
    SyncRecords,
)
from fluxmq.client._transport import NodeLatency, RetryPolicy, Transport
from fluxmq.client.admin import Admin
from fluxmq.client.arguments import check_integers
from fluxmq.client.buffered import BufferedProducer
from fluxmq.client.codecs import Codec, encode_each, get_codec
from fluxmq.client.consumer import (
    DEFAULT_BATCH,
    DEFAULT_WAIT_MS,
    Consumer,
    ConsumerStats,
    Handler,
    Message,
    RebalanceCallback,
)
from fluxmq.client.errors import FluxMQError
from fluxmq.client.pipeline import WINDOW_DEFAULT, LanePool, PublishPipeline
from fluxmq.client.producer import (
    MAX_BATCH,
    Headers,
    Key,
    OutgoingMessage,
    PublishResult,
    fill,
)
from fluxmq.client.reader import DEFAULT_COMMIT_INTERVAL_MS, DEFAULT_FETCH_MAX, StreamReader
from fluxmq.client.reader import DEFAULT_WAIT_MS as DEFAULT_READ_WAIT_MS
from fluxmq.client.record_batches import CorruptBatchError, add_records
from fluxmq.client.tail import BATCH_MAX as TAIL_BATCH_MAX
from fluxmq.client.tail import Start, Tail

log = logging.getLogger("fluxmq.client")

DEFAULT_ADDRESS = "127.0.0.1:7070"
_T = TypeVar("_T")


def default_addresses() -> str:
    return os.environ.get("FLUXMQ_ADDR", DEFAULT_ADDRESS)


class AsyncClient:
    """A FluxMQ client for asyncio.

    ``addresses``: one ``host:port``, a comma-separated list or a list of seed nodes (default
    ``$FLUXMQ_ADDR`` or 127.0.0.1:7070); ``timeout_s``: the deadline of each attempt of a call;
    ``retry``: attempts and backoff of retriable failures; ``codec``: how values are encoded
    and decoded by default (``"auto"``: bytes as they are, str as UTF-8, other values as JSON;
    messages' ``data`` are then bytes).

    Security: ``api_key`` (default ``$FLUXMQ_API_KEY``; ``""`` = none) goes with every call as
    ``authorization: Bearer <key>`` and is never logged or shown (``repr`` masks it as
    ``fmq_live_sk_<id>…``). ``tls_ca_file`` (PEM CA bundle) or ``tls_root_certificates`` (its
    bytes), or ``tls=True`` (the system's roots), make every channel TLS; ``tls_cert_file`` +
    ``tls_key_file`` add a client certificate (mutual TLS). A call the broker rate-limits
    (RESOURCE_EXHAUSTED with RetryInfo) is retried after the advised delay, within ``retry``.

    ``async with AsyncClient(...) as client`` also asks the first reachable node for the
    cluster's other nodes (GetClusterStatus) and adds them to the seeds; ``close()`` flushes
    open producers, stops open consumers gracefully, then closes the channels.
    """

    def __init__(
        self,
        addresses: str | Sequence[str] | None = None,
        *,
        timeout_s: float = 10.0,
        retry: RetryPolicy | None = None,
        codec: str | Codec = "auto",
        api_key: str | None = None,
        tls: bool | None = None,
        tls_ca_file: PathLike | None = None,
        tls_root_certificates: bytes | None = None,
        tls_cert_file: PathLike | None = None,
        tls_key_file: PathLike | None = None,
        publish_window: int = WINDOW_DEFAULT,
        publish_linger_ms: float = 0.0,
    ) -> None:
        if publish_window < 1 or publish_linger_ms < 0:
            raise ValueError("publish_window must be at least 1 and publish_linger_ms >= 0")
        credentials = Credentials(
            api_key=api_key,
            tls=tls,
            tls_ca_file=tls_ca_file,
            tls_root_certificates=tls_root_certificates,
            tls_cert_file=tls_cert_file,
            tls_key_file=tls_key_file,
        )
        self._transport = Transport(
            addresses or default_addresses(),
            timeout_s=timeout_s,
            retry=retry or RetryPolicy(),
            credentials=credentials,
        )
        self.codec = get_codec(codec)
        self.admin = Admin(self._transport)
        self._producers: set[BufferedProducer] = set()
        self._consumers: set[Consumer] = set()
        self._consumed_closed = ConsumerStats()  # the closed consumers' counters, summed
        self._readers: set[StreamReader] = set()
        self._publish_window = publish_window
        self._publish_linger_ms = publish_linger_ms
        self._pipelines: dict[str, PublishPipeline] = {}
        self._lanes = LanePool(self._transport)  # publish streams, one per node
        self.closed = False

    @property
    def addresses(self) -> list[str]:
        """The known nodes (seeds, discovered nodes, leaders named by the broker)."""
        return list(self._transport.addresses)

    def __repr__(self) -> str:
        creds = self._transport.credentials
        return (
            f"{type(self).__name__}(addresses={self.addresses!r}, "
            f"api_key={creds.key_hint or None}, tls={creds.tls})"
        )

    @property
    def transport(self) -> Transport:
        return self._transport

    async def connect(self, *, timeout_s: float = 2.0) -> None:
        """Adds the cluster's nodes (GetClusterStatus of the first reachable seed) to the
        known addresses. Best effort: a failure leaves the seeds as they are."""
        try:
            status: admin_pb2.ClusterStatus = await self._transport.unary(
                "admin",
                "GetClusterStatus",
                admin_pb2.GetClusterStatusRequest(),
                safe=True,
                timeout_s=timeout_s,
                retry=RetryPolicy(max_attempts=len(self._transport.addresses)),
            )
        except Exception as err:  # discovery is optional
            log.debug("fluxmq: discovery failed: %s", err)
            return
        self._transport.add_addresses(n.grpc_address for n in status.nodes)

    async def __aenter__(self) -> AsyncClient:
        await self.connect()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    async def close(self) -> None:
        """Flushes producers, stops consumers (graceful), closes the channels. Raises the
        first producer error, if any, after everything is closed."""
        if self.closed:
            return
        self.closed = True
        errors: list[BaseException] = []
        for p in list(self._producers):
            try:
                await p.close()
            except Exception as err:  # raised after the rest is closed
                errors.append(err)
        for c in list(self._consumers):
            with contextlib.suppress(Exception):
                await c.close()
        for r in list(self._readers):
            with contextlib.suppress(Exception):
                await r.close()
        for pipeline in list(self._pipelines.values()):
            await pipeline.close()
        await self._lanes.close()
        await self._transport.close()
        if errors:
            raise errors[0]

    def _consumer_closed(self, c: Consumer) -> None:
        self._consumers.discard(c)
        _add_stats(self._consumed_closed, c.stats)

    def stats(self) -> ClientStats:
        """A snapshot of what this client did (see :class:`ClientStats`)."""
        pipelines = [*self._pipelines.values(), *(p.pipeline for p in self._producers)]
        totals = self._transport.published
        consumed = dataclasses.replace(self._consumed_closed)
        held = 0
        for c in self._consumers:
            _add_stats(consumed, c.stats)
            held += c.held
        return ClientStats(
            requests_sent=totals.requests_sent,
            messages_sent=totals.messages_sent,
            bytes_sent=totals.bytes_sent,
            requests_in_flight=sum(p.requests_in_flight for p in pipelines),
            messages_waiting=sum(p.messages_waiting for p in pipelines),
            requests_split=totals.requests_split,
            requests_streamed=totals.requests_streamed,
            retries=self._transport.retries,
            consumed=consumed,
            messages_held=held,
            nodes={a: dataclasses.replace(n) for a, n in self._transport.latency.items()},
        )

    def _codec(self, codec: str | Codec | None) -> Codec:
        return self.codec if codec is None else get_codec(codec)

    # -- publishing ------------------------------------------------------------------------------

    async def publish(
        self,
        queue: str,
        value: Any,
        *,
        key: Key | None = None,
        headers: Headers | None = None,
        partition: int | None = None,
        delay_ms: int | None = None,
        deliver_at_ms: int | None = None,
        idempotency_key: str | None = None,
        codec: str | Codec | None = None,
    ) -> PublishResult:
        """Publishes one message; returns once it is durable. The SDK's retries never store it
        twice: it travels in a producer session (fluxmq/client/sessions.py), or, with your
        ``idempotency_key``, deduplicated by that key within the queue's dedup window. The SDK
        picks the partition (``partition``, else the key's hash, else a sticky one) as the
        broker would. Messages that callers publish to the same queue at the same time share
        requests (fluxmq/client/pipeline.py: up to ``publish_window`` requests in flight); each
        call still gets its own result or error, and one caller awaiting each publish in turn
        keeps its order, also across retries."""
        if self.closed:
            raise RuntimeError("the client is closed")
        message = pb.PublishMessage()
        size_bytes = fill(
            message, self._codec(codec), value, key, headers,
            partition, delay_ms, deliver_at_ms, idempotency_key,
        )  # fmt: skip
        return await self._pipeline(queue).publish(message, size_bytes)

    async def publish_batch(
        self,
        queue: str,
        messages: Iterable[OutgoingMessage | Any],
        *,
        codec: str | Codec | None = None,
    ) -> list[PublishResult]:
        """Publishes values (or :class:`OutgoingMessage`) in order, one result per message,
        through the queue's pipeline as ``publish`` does (partitioned at the edge, in the
        producer session, sharing requests with concurrent publishers); at most 1000 at a time
        wait in the pipeline (plain values are encoded into records once, each 1000 to one
        partition, as a request of keyless messages goes). Raises the first error once every
        message of the call is settled: a message the broker refuses fails alone, the others
        are stored."""
        encode = self._codec(codec)
        pipeline = self._pipeline(queue)
        results: list[PublishResult] = []
        items = list(messages)
        if not any(issubclass(kind, OutgoingMessage) for kind in set(map(type, items))):
            # Values alone (the common case): encoded into records once, no message objects.
            values = encode_each(encode, items)
            for at in range(0, len(values), MAX_BATCH):
                results.extend(await pipeline.publish_values(values[at : at + MAX_BATCH]))
            return results
        chunk: list[tuple[pb.PublishMessage, int]] = []
        for item in items:
            m = pb.PublishMessage()
            if isinstance(item, OutgoingMessage):
                size = fill(
                    m, encode, item.value, item.key, item.headers, item.partition,
                    item.delay_ms, item.deliver_at_ms, item.idempotency_key,
                )  # fmt: skip
            else:
                size = fill(m, encode, item)
            chunk.append((m, size))
            if len(chunk) == MAX_BATCH:
                results.extend(await pipeline.publish_many(chunk))
                chunk = []
        if chunk:
            results.extend(await pipeline.publish_many(chunk))
        return results

    def _pipeline(self, queue: str) -> PublishPipeline:
        pipeline = self._pipelines.get(queue)
        if pipeline is None:
            pipeline = self._pipelines[queue] = PublishPipeline(
                self._transport,
                queue,
                lanes=self._lanes,
                window=self._publish_window,
                linger_ms=self._publish_linger_ms,
            )
        return pipeline

    def producer(
        self,
        queue: str,
        *,
        max_messages: int = MAX_BATCH,
        max_bytes: int = 1024 * 1024,
        linger_ms: float = 5.0,
        max_in_flight: int = 1,
        max_buffered: int | None = None,
        idempotent: bool = True,
        codec: str | Codec | None = None,
    ) -> BufferedProducer:
        """A :class:`BufferedProducer` for ``queue`` (use it with ``async with``)."""
        p = BufferedProducer(
            self._transport,
            queue,
            self._codec(codec),
            lanes=self._lanes,
            max_messages=max_messages,
            max_bytes=max_bytes,
            linger_ms=linger_ms,
            max_in_flight=max_in_flight,
            max_buffered=max_buffered,
            idempotent=idempotent,
        )
        self._producers.add(p)
        return p

    # -- reading ---------------------------------------------------------------------------------

    async def fetch(
        self,
        queue: str,
        partition: int = 0,
        offset: int = 0,
        *,
        max_messages: int = 1000,
        max_bytes: int = 0,
        wait_ms: int = 0,
    ) -> pb.FetchResponse:
        """Reads a partition from ``offset`` (records, next_offset, watermarks); ``wait_ms``
        long-polls at the end of the log. The broker answers with its stored record batches,
        which the SDK checks (crc32c) and decodes here (fluxmq/client/record_batches.py); a
        batch that fails its check raises FluxMQError DATA_LOSS (reason DATA_CORRUPTED)."""
        check_integers(
            pb.FetchRequest,
            {"partition": partition, "offset": offset, "max_messages": max_messages,
             "max_bytes": max_bytes, "wait_ms": wait_ms},
        )  # fmt: skip
        resp: pb.FetchResponse = await self._transport.unary(
            "queue",
            "Fetch",
            pb.FetchRequest(
                queue=queue,
                partition=partition,
                offset=offset,
                max_messages=max_messages,
                max_bytes=max_bytes,
                wait_ms=wait_ms,
                record_batches=True,
            ),
            safe=True,
            queue=queue,
            timeout_s=self._transport.timeout_s + wait_ms / 1000,
        )
        if not resp.record_batches:
            return resp
        start = max(offset, resp.low_watermark)
        out = pb.FetchResponse(high_watermark=resp.high_watermark, low_watermark=resp.low_watermark)
        try:
            # Made in place in the answer's repeated field: a record made apart and then added
            # is copied once more.
            add_records(
                out.records, resp.record_batches, resp.log_id, partition, start,
                max_messages or None,
            )  # fmt: skip
        except CorruptBatchError as err:
            raise FluxMQError(grpc.StatusCode.DATA_LOSS, str(err), reason="DATA_CORRUPTED") from err
        out.next_offset = out.records[-1].offset + 1 if out.records else resp.next_offset
        return out

    # -- consuming -------------------------------------------------------------------------------

    def consumer(
        self,
        queue: str,
        group: str,
        *,
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
        stop: asyncio.Event | None = None,
        codec: str | Codec | None = None,
        on_assigned: RebalanceCallback | None = None,
        on_revoked: RebalanceCallback | None = None,
    ) -> Consumer:
        """A :class:`Consumer` (``async for msg in client.consumer(q, g)``; better inside
        ``async with`` so that leaving the loop closes it). ``on_assigned`` / ``on_revoked``
        (plain or async, called with a frozenset of partitions) say when this member's
        partitions change: revoked ones once their messages are settled, before they are
        released to another member."""
        c = Consumer(
            self._transport,
            queue,
            group,
            codec=self._codec(codec),
            consumer_id=consumer_id,
            batch=batch,
            prefetch=prefetch,
            lease_ms=lease_ms,
            wait_ms=wait_ms,
            mode=mode,
            auto_ack=auto_ack,
            create_group=create_group,
            session_timeout_ms=session_timeout_ms,
            strategy=strategy,
            stop=stop,
            on_close=self._consumer_closed,
            on_assigned=on_assigned,
            on_revoked=on_revoked,
        )
        self._consumers.add(c)
        return c

    def reader(
        self,
        queue: str,
        group: str,
        *,
        partitions: Sequence[int] | None = None,
        fetch_max: int = DEFAULT_FETCH_MAX,
        wait_ms: int = DEFAULT_READ_WAIT_MS,
        commit_interval_ms: int = DEFAULT_COMMIT_INTERVAL_MS,
        create_group: bool = False,
        codec: str | Codec | None = None,
    ) -> StreamReader:
        """A :class:`StreamReader` of a stream queue for ``group``: records from the group's
        committed offsets, no lease and no replicated round per record; the position is
        committed in the background (``async for rec in client.reader(q, g)``, better inside
        ``async with``)."""
        r = StreamReader(
            self,
            queue,
            group,
            codec=self._codec(codec),
            partitions=partitions,
            fetch_max=fetch_max,
            wait_ms=wait_ms,
            commit_interval_ms=commit_interval_ms,
            create_group=create_group,
        )
        self._readers.add(r)
        return r

    def tail(
        self,
        queue: str,
        *,
        partition: int | None = None,
        partitions: Sequence[int] | None = None,
        start: Start = "earliest",
        batch_max: int = TAIL_BATCH_MAX,
        codec: str | Codec | None = None,
    ) -> Tail:
        """A :class:`Tail`: the queue's records as they are appended (``async for rec in
        client.tail(q)``), every partition merged or ``partition`` / ``partitions`` only, from
        ``start``: ``"earliest"`` (default), ``"latest"``, an offset, or an aware datetime.
        It reconnects after node failures and leader changes and goes on after the last record
        it handed out. Reads only: no group, no offsets stored."""
        if partition is not None and partitions is not None:
            raise ValueError("give partition or partitions, not both")
        t = Tail(
            self,
            queue,
            codec=self._codec(codec),
            partitions=[partition] if partition is not None else partitions,
            start=start,
            batch_max=batch_max,
        )
        return t

    async def consume(
        self,
        queue: str,
        group: str,
        handler: Handler,
        *,
        concurrency: int = 1,
        batch: int = DEFAULT_BATCH,
        auto_ack: bool = True,
        stop: asyncio.Event | None = None,
        stop_signals: Sequence[signal.Signals] = (),
        nack_delay_ms: int | None = None,
        consumer_id: str | None = None,
        lease_ms: int | None = None,
        wait_ms: int = DEFAULT_WAIT_MS,
        mode: str = "push",
        create_group: bool = False,
        session_timeout_ms: int = 0,
        strategy: str = "",
        codec: str | Codec | None = None,
        on_assigned: RebalanceCallback | None = None,
        on_revoked: RebalanceCallback | None = None,
    ) -> ConsumerStats:
        """Runs ``handler(msg)`` on every message until ``stop`` is set (or one of
        ``stop_signals`` arrives, e.g. ``(signal.SIGINT, signal.SIGTERM)``), then stops
        gracefully and returns the consumer's counters; see :meth:`Consumer.run`. The handler
        is a coroutine function, or a plain function, which then runs on the event loop (keep
        it short; the blocking :class:`Client` runs plain handlers in threads)."""
        stop = stop or asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in stop_signals:
            loop.add_signal_handler(sig, stop.set)
        try:
            c = self.consumer(
                queue,
                group,
                consumer_id=consumer_id,
                batch=batch,
                lease_ms=lease_ms,
                wait_ms=wait_ms,
                mode=mode,
                auto_ack=auto_ack,
                create_group=create_group,
                session_timeout_ms=session_timeout_ms,
                strategy=strategy,
                codec=codec,
                on_assigned=on_assigned,
                on_revoked=on_revoked,
            )
            return await c.run(handler, concurrency=concurrency, nack_delay_ms=nack_delay_ms,
                               stop=stop)  # fmt: skip
        finally:
            for sig in stop_signals:
                loop.remove_signal_handler(sig)


def _add_stats(into: ConsumerStats, more: ConsumerStats) -> None:
    for name in ConsumerStats.__dataclass_fields__:
        setattr(into, name, getattr(into, name) + getattr(more, name))


@dataclass(frozen=True)
class ClientStats:
    """What a client did since it started (``AsyncClient.stats()``): a snapshot.

    Publishing (every queue's pipeline): requests and messages answered, their bytes, requests
    in flight and messages waiting for one, requests split after a refusal about one message,
    requests answered on a publish stream. ``retries``: calls sent again after a failure.
    Consuming: the consumers' counters summed, and the messages they hold (leased, not
    settled). ``nodes``: per node address, the calls timed (each attempt: count, errors, mean
    and max seconds)."""

    requests_sent: int
    messages_sent: int
    bytes_sent: int
    requests_in_flight: int
    messages_waiting: int
    requests_split: int
    requests_streamed: int
    retries: int
    consumed: ConsumerStats
    messages_held: int
    nodes: dict[str, NodeLatency] = field(default_factory=dict)


class Client:
    """The blocking twin of :class:`AsyncClient`: the same methods, run on an event loop in a
    background thread. ``consumer()`` is a blocking iterator; ``consume()`` runs a plain
    function handler in worker threads; ``admin`` listings return lists (every page). Use it
    as a context manager, or call ``close()``."""

    def __init__(
        self,
        addresses: str | Sequence[str] | None = None,
        *,
        timeout_s: float = 10.0,
        retry: RetryPolicy | None = None,
        codec: str | Codec = "auto",
        api_key: str | None = None,
        tls: bool | None = None,
        tls_ca_file: PathLike | None = None,
        tls_root_certificates: bytes | None = None,
        tls_cert_file: PathLike | None = None,
        tls_key_file: PathLike | None = None,
        publish_window: int = WINDOW_DEFAULT,
        publish_linger_ms: float = 0.0,
    ) -> None:
        options: dict[str, Any] = {
            "api_key": api_key,
            "tls": tls,
            "tls_ca_file": tls_ca_file,
            "tls_root_certificates": tls_root_certificates,
            "tls_cert_file": tls_cert_file,
            "tls_key_file": tls_key_file,
            "publish_window": publish_window,
            "publish_linger_ms": publish_linger_ms,
        }
        self._loop = LoopThread()
        try:
            self._client: AsyncClient = self._loop.run(
                self._make(addresses, timeout_s, retry, codec, options)
            )
            self.admin = SyncAdmin(self._client.admin, self._loop)
        except BaseException:
            self._loop.close()
            raise

    @staticmethod
    async def _make(
        addresses: str | Sequence[str] | None,
        timeout_s: float,
        retry: RetryPolicy | None,
        codec: str | Codec,
        options: dict[str, Any],
    ) -> AsyncClient:
        client = AsyncClient(addresses, timeout_s=timeout_s, retry=retry, codec=codec, **options)
        await client.connect()
        return client

    @property
    def addresses(self) -> list[str]:
        return self._client.addresses

    def __repr__(self) -> str:
        return repr(self._client).replace("AsyncClient(", "Client(", 1)

    def __enter__(self) -> Client:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def close(self) -> None:
        if self._loop.closed:
            return
        try:
            self._loop.run(self._client.close())
        finally:
            self._loop.close()

    def stats(self) -> ClientStats:
        """See :meth:`AsyncClient.stats`."""
        return self._loop.run(_in_loop(self._client.stats))

    def publish(self, queue: str, value: Any, **kwargs: Any) -> PublishResult:
        """See :meth:`AsyncClient.publish`."""
        return self._loop.run(self._client.publish(queue, value, **kwargs))

    def publish_batch(
        self,
        queue: str,
        messages: Iterable[OutgoingMessage | Any],
        *,
        codec: str | Codec | None = None,
    ) -> list[PublishResult]:
        return self._loop.run(self._client.publish_batch(queue, list(messages), codec=codec))

    def fetch(
        self, queue: str, partition: int = 0, offset: int = 0, **kwargs: Any
    ) -> pb.FetchResponse:
        return self._loop.run(self._client.fetch(queue, partition, offset, **kwargs))

    def producer(self, queue: str, **kwargs: Any) -> SyncProducer:
        """A buffering producer: ``send()`` returns a ``concurrent.futures.Future``."""
        producer = self._loop.run(_in_loop(self._client.producer, queue, **kwargs))
        return SyncProducer(producer, self._loop)

    def consumer(self, queue: str, group: str, **kwargs: Any) -> SyncConsumer:
        """A blocking iterator of messages (``ack()`` / ``nack()`` block); use ``with``."""
        consumer = self._loop.run(_in_loop(self._client.consumer, queue, group, **kwargs))
        return SyncConsumer(consumer, self._loop)

    def reader(self, queue: str, group: str, **kwargs: Any) -> SyncRecords:
        """A blocking iterator of a stream queue's records for ``group`` (see
        :meth:`AsyncClient.reader`); use ``with`` (leaving commits the position)."""
        reader = self._loop.run(_in_loop(self._client.reader, queue, group, **kwargs))
        return SyncRecords(reader, self._loop)

    def tail(self, queue: str, **kwargs: Any) -> SyncRecords:
        """A blocking iterator of a queue's records as they are appended (see
        :meth:`AsyncClient.tail`); use ``with``."""
        tail = self._loop.run(_in_loop(self._client.tail, queue, **kwargs))
        return SyncRecords(tail, self._loop)

    def consume(
        self,
        queue: str,
        group: str,
        handler: Callable[[SyncMessage], Any],
        *,
        stop: threading.Event | None = None,
        **kwargs: Any,
    ) -> ConsumerStats:
        """Runs ``handler(msg)`` — a plain function, called in worker threads, ``concurrency``
        at a time — until ``stop`` (a ``threading.Event``) is set; graceful like
        :meth:`AsyncClient.consume` (same keyword arguments)."""
        loop = self._loop

        async def call(m: Message) -> None:
            await asyncio.to_thread(handler, SyncMessage(m, loop))

        async def run() -> ConsumerStats:
            event = asyncio.Event()
            ended = threading.Event()
            if stop is not None:
                aloop = asyncio.get_running_loop()

                def watch() -> None:
                    while not ended.is_set():
                        if stop.wait(0.1):
                            aloop.call_soon_threadsafe(event.set)
                            return

                threading.Thread(target=watch, name="fluxmq-stop-watch", daemon=True).start()
            try:
                return await self._client.consume(queue, group, call, stop=event, **kwargs)
            finally:
                ended.set()

        return self._loop.run(run())


async def _in_loop(factory: Callable[..., _T], *args: Any, **kwargs: Any) -> _T:
    """Builds an object on the client's loop (asyncio primitives belong to a loop)."""
    return factory(*args, **kwargs)
