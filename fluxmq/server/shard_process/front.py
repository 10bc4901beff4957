"""The front end's side: every QueueService and AdminService call that reaches the public gRPC
port is relayed, bytes unopened, over the channel to the shard process (``RelayHandler``), and
the shard process's serving status is mirrored into this port's health service.

While no shard process is attached (it is starting, or restarting after it died) calls are
refused with GROUP_UNAVAILABLE (retriable: nothing was done); a call in flight when the shard
process dies ends with OUTCOME_UNKNOWN (retriable: a write may have been committed, which an
idempotent producer's retry finds).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import socket
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Iterator, Sequence
from typing import Any

import grpc
from google.protobuf.descriptor import MethodDescriptor, ServiceDescriptor

from fluxmq._pb.v1 import admin_pb2, queue_pb2
from fluxmq.core.errors import FluxError
from fluxmq.core.ratelimit import InflightBudget
from fluxmq.server.errors import to_grpc_status
from fluxmq.server.guard import AUTH_HEADER
from fluxmq.server.interceptors import REQUEST_ID_KEY, EdgeInterceptor, node_busy
from fluxmq.server.shard_process import frames as fr
from fluxmq.server.shard_process.channel import Channel
from fluxmq.server.shard_process.frames import Kind, Shape
from fluxmq.server.shard_process.routing import CallRouting
from fluxmq.server.shard_process.shard_server import STREAM_WINDOW
from fluxmq.server.shard_process.siblings import (
    TARGET_PROCESS_KEY,
    QueueTable,
    decode_report,
    encode_report,
)
from fluxmq.server.stream_slots import StreamSlots, too_many_streams

RELAYED_SERVICES = (
    queue_pb2.DESCRIPTOR.services_by_name["QueueService"],
    admin_pb2.DESCRIPTOR.services_by_name["AdminService"],
)
_CODES = {code.value[0]: code for code in grpc.StatusCode}
_END = object()


def shape_of(method: MethodDescriptor) -> Shape:
    if method.client_streaming:
        return Shape.STREAM_STREAM if method.server_streaming else Shape.STREAM_UNARY
    return Shape.UNARY_STREAM if method.server_streaming else Shape.UNARY_UNARY


def not_attached() -> FluxError:
    return FluxError(
        "GROUP_UNAVAILABLE",
        "this node's shard process is starting or restarting; nothing was done; retry",
        retriable=True,
        retry_after_ms=200,
    )


def lost_in_flight() -> FluxError:
    return FluxError(
        "OUTCOME_UNKNOWN",
        "this node's shard process stopped while it served the call: a write may or may not "
        "have been committed; retry (an idempotent producer's retry is not duplicated)",
        retriable=True,
        retry_after_ms=200,
    )


class _LinkLost(Exception):
    def __init__(self, error: FluxError) -> None:
        super().__init__(error.message)
        self.error = error


class _ClientCall:
    def __init__(self, key: str | None, request_bytes: int) -> None:
        self.key = key  # whose share of the link's budget the request holds until the END
        self.request_bytes = request_bytes
        self.items: asyncio.Queue[Any] = asyncio.Queue()
        self.end: fr.End | None = None
        self.lost: FluxError | None = None
        self.credit = STREAM_WINDOW  # request messages the shard process takes before CREDIT
        self.credit_granted = asyncio.Event()
        self.taken = 0


class ShardProcessLink:
    """The front end's end of the channel: calls multiplexed by id over one socket."""

    def __init__(self, frame_bytes_max: int, inflight_bytes_max: int) -> None:
        self._frame_bytes_max = frame_bytes_max
        # Request bytes sent to the shard process and not answered yet, with the shard
        # process's own rule (one key may hold half): one key's flood of large calls is
        # refused here without refusing another key's small ones. Keyed by the authorization
        # value as presented (the shard process verifies it; an entry lives while its calls do).
        self._budget = InflightBudget(inflight_bytes_max, max(1, inflight_bytes_max // 2))
        self._channel: Channel | None = None
        self._calls: dict[int, _ClientCall] = {}
        self._next_id = 0
        self._serving = False  # until the shard process's first health frame
        self.on_health: Callable[[fr.Metadata], None] = lambda statuses: None
        # The shard process's report of its queues (several shard processes: the front end's
        # table, and the other shard processes, learn where each queue is).
        self.on_queues: Callable[[memoryview], None] = lambda payload: None
        self._metrics_asks: dict[int, asyncio.Future[bytes]] = {}
        self._next_ask = 0

    @property
    def attached(self) -> bool:
        return self._serving and self._channel is not None and self._channel.is_open

    async def attach(self, sock: socket.socket) -> Channel:
        """A new shard process's end of the pair: calls go to it once it says it serves."""
        channel = await Channel.over(sock, self._on_frame, self._frame_bytes_max)
        self._channel = channel
        self._serving = False

        def closed() -> None:
            # The shard process closed its end (it is stopping, or a frame did not decode):
            # the calls in flight end now, not when the process has exited.
            if self._channel is channel:
                self.detach()

        channel.on_closed = closed
        return channel

    def detach(self) -> None:
        """The shard process is gone: every call in flight ends with OUTCOME_UNKNOWN."""
        if self._channel is not None:
            self._channel.close()
        self._channel = None
        self._serving = False
        calls, self._calls = self._calls, {}
        for call in calls.values():
            self._budget.release(call.key, call.request_bytes)
            call.lost = lost_in_flight()
            call.items.put_nowait(_END)
            call.credit_granted.set()

    def _on_frame(self, kind: Kind, call_id: int, payload: memoryview) -> None:
        if kind is Kind.HEALTH:
            self._serving = True
            self.on_health(fr.decode_metadata(payload, 0)[0])
            return
        if kind is Kind.QUEUES:
            self.on_queues(payload)
            return
        if kind is Kind.METRICS:
            asked = self._metrics_asks.pop(call_id, None)
            if asked is not None and not asked.done():
                asked.set_result(bytes(payload))
            return
        call = self._calls.get(call_id)
        if call is None:
            return  # cancelled here meanwhile
        if kind is Kind.MESSAGE:
            call.items.put_nowait(bytes(payload))
        elif kind is Kind.END:
            call.end = fr.decode_end(payload)
            del self._calls[call_id]
            self._budget.release(call.key, call.request_bytes)
            call.items.put_nowait(_END)
            call.credit_granted.set()
        elif kind is Kind.CREDIT:
            call.credit += fr.decode_credit(payload)
            call.credit_granted.set()

    def _send(self, data: bytes) -> None:
        if self._channel is None or not self._channel.send(data):
            raise _LinkLost(lost_in_flight())

    def open(self, call: fr.Call) -> tuple[int, _ClientCall]:
        if not self.attached:
            raise _LinkLost(not_attached())
        assert self._channel is not None
        # Sent at once, never awaited (calls reach the shard process in the order they came);
        # what it has not answered yet is bounded here instead.
        key = _authorization(call.metadata)
        size = len(call.body)
        if not self._budget.reserve(key, size):
            raise _LinkLost(node_busy(self._budget, size))
        self._next_id = (self._next_id + 1) & 0xFFFFFFFF or 1
        call_id = self._next_id
        state = _ClientCall(key, size)
        self._calls[call_id] = state
        try:
            self._send(fr.encode_call(call_id, call))
        except BaseException:
            del self._calls[call_id]
            self._budget.release(key, size)
            raise
        return call_id, state

    def send_routes(self, payload: bytes) -> None:
        """Another shard process's queues, for this one (dropped while it is not attached: a
        new one is sent every report when it attaches)."""
        if self._channel is not None and self._channel.is_open:
            self._channel.send(fr.frame(Kind.ROUTES, 0, payload))

    async def metrics(self, timeout_s: float) -> bytes:
        """The shard process's metrics, in the Prometheus text format (b"": it did not answer
        in ``timeout_s``, or is not attached)."""
        if not self.attached or self._channel is None:
            return b""
        self._next_ask = (self._next_ask + 1) & 0xFFFFFFFF or 1
        ask = self._next_ask
        answer = self._metrics_asks[ask] = asyncio.get_running_loop().create_future()
        self._channel.send(fr.frame(Kind.METRICS_ASK, ask))
        try:
            return await asyncio.wait_for(answer, timeout_s)
        except TimeoutError:
            return b""
        finally:
            self._metrics_asks.pop(ask, None)

    def cancel(self, call_id: int) -> None:
        """The caller went away before the END: the shard process stops serving the call."""
        call = self._calls.pop(call_id, None)
        if call is None:
            return
        self._budget.release(call.key, call.request_bytes)
        if self._channel is not None:
            self._channel.send(fr.frame(Kind.CANCEL, call_id))

    async def next_item(self, call_id: int, state: _ClientCall) -> Any:
        """The next streamed answer (bytes), or _END (``state.end`` / ``state.lost`` says how)."""
        item = await state.items.get()
        if item is not _END:
            state.taken += 1
            if state.taken >= STREAM_WINDOW // 2 and self._channel is not None:
                self._channel.send(fr.encode_credit(call_id, state.taken))
                state.taken = 0
        return item

    async def send_request(self, call_id: int, state: _ClientCall, body: bytes) -> bool:
        """One message of a streamed request (-> False: the call ended meanwhile)."""
        while state.credit <= 0 and state.end is None and state.lost is None:
            state.credit_granted.clear()
            await state.credit_granted.wait()
        if state.end is not None or state.lost is not None:
            return False
        state.credit -= 1
        assert self._channel is not None
        await self._channel.writable()
        self._send(fr.frame(Kind.MESSAGE, call_id, body))
        return True

    def half_close(self, call_id: int) -> None:
        if call_id in self._calls:
            self._send(fr.frame(Kind.HALF_CLOSE, call_id))


class QueueReports:
    """Several shard processes: each one's report of its queues goes into the front end's
    table and on to the others (which forward what reaches them by mistake)."""

    def __init__(self, links: Sequence[ShardProcessLink]) -> None:
        self._links = tuple(links)
        self.table = QueueTable(len(links))
        for index, link in enumerate(links):
            link.on_queues = functools.partial(self.on_report, index)

    def on_report(self, index: int, payload: memoryview) -> None:
        _, report = decode_report(payload)
        self.table.update(index, report)
        passed_on = encode_report(report, index)
        for other, link in enumerate(self._links):
            if other != index:
                link.send_routes(passed_on)

    def on_attached(self, index: int) -> None:
        """A new shard process (started, or restarted): where the others' queues are."""
        for other, report in enumerate(self.table.reports):
            if other != index:
                self._links[index].send_routes(encode_report(report, other))


def _authorization(metadata: fr.Metadata) -> str | None:
    for key, value in metadata:
        if key == AUTH_HEADER:
            return value if isinstance(value, str) else None
    return None


def _request_id(metadata: fr.Metadata) -> str:
    for key, value in metadata:
        if key == REQUEST_ID_KEY and isinstance(value, str):
            return value
    return uuid.uuid4().hex


def _metadata(context: grpc.aio.ServicerContext) -> fr.Metadata:
    return tuple((str(k), v) for k, v in (context.invocation_metadata() or ()))


def _timeout_ms(context: grpc.aio.ServicerContext) -> int | None:
    remaining = context.time_remaining()
    return None if remaining is None else int(remaining * 1000)


class RelayHandler(grpc.GenericRpcHandler):  # type: ignore[misc]
    """Serves every method of ``services`` by relaying it to a shard process: with several,
    the one ``routing`` picks (or, on the internal socket, the one the call names)."""

    def __init__(
        self,
        links: Sequence[ShardProcessLink],
        services: Iterable[ServiceDescriptor],
        routing: CallRouting | None = None,
        streams: StreamSlots | None = None,
    ) -> None:
        assert links and (routing is not None or len(links) == 1)
        self._links = tuple(links)
        self._routing = routing
        # Several shard processes: the node's bound on streams (each shard process bounds its
        # own too), counted here where every client's stream passes.
        self._streams = streams
        self._handlers: dict[str, grpc.RpcMethodHandler] = {}
        for service in services:
            for method in service.methods:
                path = f"/{service.full_name}/{method.name}"
                self._handlers[path] = self._handler(path, shape_of(method))

    def service(self, details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler | None:
        return self._handlers.get(details.method)

    def _handler(self, path: str, shape: Shape) -> grpc.RpcMethodHandler:
        if shape is Shape.UNARY_UNARY:
            return grpc.unary_unary_rpc_method_handler(self._unary(path, shape))
        if shape is Shape.UNARY_STREAM:
            return grpc.unary_stream_rpc_method_handler(self._streamed(path, shape))
        if shape is Shape.STREAM_STREAM:
            return grpc.stream_stream_rpc_method_handler(self._streamed(path, shape))
        return grpc.stream_unary_rpc_method_handler(self._unary(path, shape))

    def _link_for(self, path: str, body: bytes, named: int | None) -> ShardProcessLink:
        if self._routing is None:
            return self._links[0]
        if named is not None:
            return self._links[named]
        return self._links[self._routing.process_for(path, body)]

    def _named_process(self, metadata: fr.Metadata) -> int | None:
        """The shard process another one forwards a call to (on the internal socket only)."""
        for key, value in metadata:
            if key == TARGET_PROCESS_KEY and isinstance(value, str) and value.isdigit():
                return int(value) if int(value) < len(self._links) else None
        return None

    async def _open(
        self, path: str, shape: Shape, request: Any, context: grpc.aio.ServicerContext
    ) -> tuple[ShardProcessLink, int, _ClientCall, asyncio.Task[None] | None, fr.Metadata]:
        metadata = _metadata(context)
        named = None
        if self._routing is not None:
            if context.peer().startswith("unix:"):
                named = self._named_process(metadata)
            else:  # only a shard process of this node names the shard process to serve a call
                metadata = tuple((k, v) for k, v in metadata if k != TARGET_PROCESS_KEY)
        first: bytes | None = None
        if shape.request_streams:
            body = b""
            if self._routing is not None and path in self._routing.by_first_request:
                first = await anext(aiter(request), None)  # where its first request's queue is
            link = self._link_for(path, first or b"", named)
        else:
            body = request
            link = self._link_for(path, body, named)
        try:
            call_id, state = link.open(fr.Call(path, _timeout_ms(context), shape, metadata, body))
        except _LinkLost as lost:
            await _abort(context, lost.error, metadata)
            raise  # unreachable: abort raises
        pump = None
        if shape.request_streams:
            pump = asyncio.create_task(
                self._pump(link, call_id, state, first, request), name=f"relay-{call_id}"
            )
        return link, call_id, state, pump, metadata

    def _counts_stream(self, context: grpc.aio.ServicerContext) -> bool:
        """A client's stream takes a slot of the node's (a shard process forwarding to another,
        on the internal socket, holds one of its own already)."""
        return self._streams is not None and not context.peer().startswith("unix:")

    @contextlib.contextmanager
    def _stream_slot(self, context: grpc.aio.ServicerContext) -> Iterator[None]:
        if not self._counts_stream(context):
            yield
            return
        assert self._streams is not None
        with self._streams.hold():
            yield

    async def _pump(
        self,
        link: ShardProcessLink,
        call_id: int,
        state: _ClientCall,
        first: bytes | None,
        requests: AsyncIterator[bytes],
    ) -> None:
        try:
            if first is not None and not await link.send_request(call_id, state, first):
                return
            async for body in requests:
                if not await link.send_request(call_id, state, body):
                    return
            link.half_close(call_id)
        except _LinkLost:
            return  # the answer side reports it

    def _unary(self, path: str, shape: Shape) -> Callable[..., Any]:
        async def relay(request: Any, context: grpc.aio.ServicerContext) -> bytes:
            link, call_id, state, pump, metadata = await self._open(path, shape, request, context)
            try:
                while (await link.next_item(call_id, state)) is not _END:
                    pass  # a unary answer comes in its END
            finally:
                await _finish(link, call_id, state, pump)
            body = await _answer(context, state, metadata)
            assert isinstance(body, bytes), "a unary answer's END carries its body"
            return body

        return relay

    def _streamed(self, path: str, shape: Shape) -> Callable[..., AsyncIterator[bytes]]:
        async def relay(request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[bytes]:
            slots = self._streams
            if slots is not None and self._counts_stream(context) and slots.open >= slots.limit:
                await _abort(context, too_many_streams(slots.limit), _metadata(context))
            with self._stream_slot(context):
                link, call_id, state, pump, metadata = await self._open(
                    path, shape, request, context
                )
                try:
                    while (item := await link.next_item(call_id, state)) is not _END:
                        yield item
                finally:
                    await _finish(link, call_id, state, pump)
                await _answer(context, state, metadata)

        return relay


async def _finish(
    link: ShardProcessLink, call_id: int, state: _ClientCall, pump: asyncio.Task[None] | None
) -> None:
    if state.end is None and state.lost is None:
        link.cancel(call_id)  # cancelled here (the client went away, or its deadline passed)
    if pump is not None:
        pump.cancel()
        await asyncio.wait((pump,))


async def _answer(
    context: grpc.aio.ServicerContext, state: _ClientCall, metadata: fr.Metadata
) -> Any:
    if state.lost is not None:
        await _abort(context, state.lost, metadata)
    end = state.end
    assert end is not None
    if end.code != 0:
        await context.abort(_CODES[end.code], end.details, end.trailers)
    if end.trailers:
        context.set_trailing_metadata(end.trailers)
    return end.body


async def _abort(
    context: grpc.aio.ServicerContext, error: FluxError, metadata: fr.Metadata
) -> None:
    await context.abort_with_status(to_grpc_status(error, _request_id(metadata)))


class FrontEndInterceptor(grpc.aio.ServerInterceptor):  # type: ignore[misc]
    """The edge interceptor around what the front end serves itself (health, reflection): a
    malformed body is INVALID_ARGUMENT / MALFORMED_REQUEST there as on a node in one process.
    Relayed calls pass untouched: the shard process runs the edge around them."""

    def __init__(self) -> None:
        self._edge = EdgeInterceptor()
        self._relayed = tuple(f"/{service.full_name}/" for service in RELAYED_SERVICES)

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        if details.method.startswith(self._relayed):
            return await continuation(details)
        return await self._edge.intercept_service(continuation, details)
