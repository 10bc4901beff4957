"""The shard process's side of the channel: ``FramedServer`` stands in for the gRPC server.

The servicers register on it as they do on a ``grpc.aio.Server`` and the same interceptors run
around them (authentication, limits, the error table, routing), so a call relayed by the front
end is served exactly as one a node in one process takes from its gRPC port. What the servicers
use of a gRPC call context (metadata, deadline, trailers, abort) is ``FramedContext``.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import grpc

from fluxmq.server.shard_process import frames as fr
from fluxmq.server.shard_process.channel import Channel
from fluxmq.server.shard_process.frames import Kind, Shape

log = logging.getLogger(__name__)

# MESSAGE frames of one stream the other side may send before it waits for CREDIT.
STREAM_WINDOW = 32
CALLS_MAX = 10_000  # calls in progress at once (the front end's gRPC server bounds it first)
_EOF = object()


class AbortError(Exception):
    """Raised by ``FramedContext.abort``: the call ends with the given status (the name is what
    the edge interceptor recognises, as it does grpc.aio's own)."""


@dataclass(frozen=True, slots=True)
class CallDetails:
    method: str
    invocation_metadata: fr.Metadata


class FramedContext:
    """What servicers and interceptors use of ``grpc.aio.ServicerContext``."""

    def __init__(
        self, metadata: fr.Metadata, timeout_ms: int | None, requests: _Requests | None
    ) -> None:
        self._metadata = metadata
        self._deadline = None if timeout_ms is None else time.monotonic() + timeout_ms / 1000
        self._requests = requests
        self.trailers: fr.Metadata = ()
        self.code = grpc.StatusCode.OK
        self.details = ""

    def invocation_metadata(self) -> fr.Metadata:
        return self._metadata

    def time_remaining(self) -> float | None:
        return None if self._deadline is None else max(0.0, self._deadline - time.monotonic())

    def set_trailing_metadata(self, trailing_metadata: Iterable[tuple[str, str | bytes]]) -> None:
        self.trailers = tuple(trailing_metadata)

    def set_code(self, code: grpc.StatusCode) -> None:
        self.code = code

    def set_details(self, details: str) -> None:
        self.details = details

    def peer(self) -> str:
        return "unix:front-end"

    async def abort(
        self,
        code: grpc.StatusCode,
        details: str = "",
        trailing_metadata: Sequence[tuple[str, str | bytes]] = (),
    ) -> None:
        self.code, self.details = code, details
        if trailing_metadata:
            self.trailers = tuple(trailing_metadata)
        raise AbortError(details)

    async def abort_with_status(self, status: grpc.Status) -> None:
        await self.abort(status.code, status.details, status.trailing_metadata)

    async def read(self) -> Any:
        assert self._requests is not None, "read() on a call without a request stream"
        item = await self._requests.next()
        return grpc.aio.EOF if item is _EOF else item


class _Requests:
    """A streamed request's messages as they arrive, decoded; CREDIT goes back as they are
    taken, so at most STREAM_WINDOW wait here."""

    def __init__(self, grant: Callable[[int], None]) -> None:
        self._queue: asyncio.Queue[Any] = asyncio.Queue()
        # The method's request decoder, set once its handler is known (before the first take).
        self.decode: Callable[[bytes], Any] | None = None
        self._grant = grant
        self._taken = 0

    def put(self, item: Any) -> None:
        self._queue.put_nowait(item)

    async def next(self) -> Any:
        item = await self._queue.get()
        if item is _EOF:
            self._queue.put_nowait(_EOF)  # every later read sees the end too
            return _EOF
        self._taken += 1
        if self._taken >= STREAM_WINDOW // 2:
            self._grant(self._taken)
            self._taken = 0
        return self.decode(item) if self.decode is not None else item

    async def __aiter__(self) -> AsyncIterator[Any]:
        while True:
            item = await self.next()
            if item is _EOF:
                return
            yield item


class _ServerCall:
    def __init__(self) -> None:
        self.task: asyncio.Task[None] | None = None
        self.requests: _Requests | None = None
        self.credit = STREAM_WINDOW
        self.credit_granted = asyncio.Event()


Interceptor = Any  # grpc.aio.ServerInterceptor: intercept_service(continuation, details)


class FramedServer:
    def __init__(self, interceptors: Sequence[Interceptor], *, frame_bytes_max: int) -> None:
        self._interceptors = tuple(interceptors)
        self._frame_bytes_max = frame_bytes_max
        self._generic: list[grpc.GenericRpcHandler] = []
        self._registered: dict[str, grpc.RpcMethodHandler] = {}
        self._calls: dict[int, _ServerCall] = {}
        self._channel: Channel | None = None
        self._accepting = True
        # Several shard processes: the front end passes on another one's queues (ROUTES), and
        # this one reports its own before it answers a call that changed them.
        self.on_routes: Callable[[memoryview], None] = lambda payload: None
        self.before_end: Callable[[], None] = lambda: None
        # The metrics this shard process answers a METRICS_ASK with (text exposition).
        self.metrics_text: Callable[[], Awaitable[bytes]] | None = None
        self._asks: set[asyncio.Task[None]] = set()
        # The interceptors around the handler lookup, outermost first, chained once (each
        # call's interceptors wrap its handler as gRPC's do; the chain itself never changes).
        handler: Callable[[CallDetails], Awaitable[Any]] = self._lookup
        for interceptor in reversed(self._interceptors):
            handler = _chained(interceptor, handler)
        self._handler = handler

    # -- what servicers call, as on grpc.aio.Server -----------------------------------------

    def add_generic_rpc_handlers(self, handlers: Iterable[grpc.GenericRpcHandler]) -> None:
        self._generic.extend(handlers)

    def add_registered_method_handlers(
        self, service: str, handlers: dict[str, grpc.RpcMethodHandler]
    ) -> None:
        for method, handler in handlers.items():
            self._registered[f"/{service}/{method}"] = handler

    # -- the channel ------------------------------------------------------------------------

    async def serve(self, sock: socket.socket) -> Channel:
        """Serve the calls that come over ``sock`` (the shard process's end of the pair)."""
        self._channel = await Channel.over(sock, self._on_frame, self._frame_bytes_max)
        return self._channel

    def send_health(self, statuses: fr.Metadata) -> None:
        """The serving status of each service (name -> status number) for the front end."""
        if self._channel is not None:
            self._channel.send(fr.frame(Kind.HEALTH, 0, fr.encode_metadata(statuses)))

    def send_queues(self, payload: bytes) -> None:
        """This shard process's queues (siblings.encode_report) for the front end."""
        if self._channel is not None:
            self._channel.send(fr.frame(Kind.QUEUES, 0, payload))

    async def stop(self, grace_s: float) -> None:
        """New calls are refused (UNAVAILABLE); the calls in progress get ``grace_s`` to end,
        then are cancelled."""
        self._accepting = False
        tasks = [c.task for c in self._calls.values() if c.task is not None]
        if tasks:
            _, pending = await asyncio.wait(tasks, timeout=grace_s)
            for task in pending:
                task.cancel()
            if pending:
                await asyncio.wait(pending)

    def _on_frame(self, kind: Kind, call_id: int, payload: memoryview) -> None:
        if kind is Kind.CALL:
            self._start(call_id, fr.decode_call(payload))
            return
        if kind is Kind.ROUTES:
            self.on_routes(payload)
            return
        if kind is Kind.METRICS_ASK:
            task = asyncio.get_running_loop().create_task(self._answer_metrics(call_id))
            self._asks.add(task)
            task.add_done_callback(self._asks.discard)
            return
        call = self._calls.get(call_id)
        if call is None:
            return  # the call ended meanwhile
        if kind is Kind.MESSAGE and call.requests is not None:
            call.requests.put(bytes(payload))
        elif kind is Kind.HALF_CLOSE and call.requests is not None:
            call.requests.put(_EOF)
        elif kind is Kind.CREDIT:
            call.credit += fr.decode_credit(payload)
            call.credit_granted.set()
        elif kind is Kind.CANCEL and call.task is not None:
            call.task.cancel()

    async def _answer_metrics(self, ask: int) -> None:
        text = b""  # what the front end's scrape counts as not answered
        try:
            if self.metrics_text is not None:
                text = await self.metrics_text()
        except Exception:
            log.exception("rendering this shard process's metrics failed")
        self._send(fr.frame(Kind.METRICS, ask, text))

    def _send(self, data: bytes) -> None:
        if self._channel is not None:
            self._channel.send(data)

    def _start(self, call_id: int, call: fr.Call) -> None:
        if not self._accepting or len(self._calls) >= CALLS_MAX or call_id in self._calls:
            why = "the node is stopping" if not self._accepting else "too many calls"
            self._send(
                fr.encode_end(call_id, fr.End(grpc.StatusCode.UNAVAILABLE.value[0], why, (), None))
            )
            return
        state = _ServerCall()
        if call.shape.request_streams:
            # Now, not when the task runs: the stream's first messages may be in this read.
            state.requests = _Requests(lambda n: self._send(fr.encode_credit(call_id, n)))
        self._calls[call_id] = state
        state.task = asyncio.get_running_loop().create_task(
            self._run(call_id, call, state), name=f"framed-call-{call_id}"
        )

    async def _lookup(self, details: CallDetails) -> grpc.RpcMethodHandler | None:
        handler = self._registered.get(details.method)
        for generic in self._generic if handler is None else ():
            handler = generic.service(details)
            if handler is not None:
                break
        return handler

    async def _run(self, call_id: int, call: fr.Call, state: _ServerCall) -> None:
        context: FramedContext | None = None
        end: fr.End | None = None
        try:
            handler = await self._handler(CallDetails(call.method, call.metadata))
            if handler is None:
                end = fr.End(grpc.StatusCode.UNIMPLEMENTED.value[0], "Method not found!", (), None)
                return
            decode = handler.request_deserializer
            encode = handler.response_serializer
            if state.requests is not None:
                state.requests.decode = decode
            context = FramedContext(call.metadata, call.timeout_ms, state.requests)
            request: Any = state.requests
            if not call.shape.request_streams:
                request = decode(call.body) if decode is not None else call.body
            body = await self._invoke(call_id, call.shape, handler, request, context, encode, state)
            end = fr.End(context.code.value[0], context.details, context.trailers, body)
        except AbortError:
            assert context is not None
            end = fr.End(context.code.value[0], context.details, context.trailers, None)
        except asyncio.CancelledError:
            end = None  # the front end cancelled it (or the node stops): nobody waits for an end
        except Exception:
            log.exception("relayed call %s failed", call.method)
            end = fr.End(grpc.StatusCode.UNKNOWN.value[0], "internal error", (), None)
        finally:
            del self._calls[call_id]
            if end is not None:
                self.before_end()  # a queue it created is routed here before the caller knows
                if self._channel is not None:
                    self._channel.send_parts(fr.end_parts(call_id, end))

    async def _invoke(
        self,
        call_id: int,
        shape: Shape,
        handler: grpc.RpcMethodHandler,
        request: Any,
        context: FramedContext,
        encode: Callable[[Any], bytes] | None,
        state: _ServerCall,
    ) -> bytes | None:
        behavior = getattr(handler, _BEHAVIOR[shape])
        if behavior is None:  # the front end sends each method's shape from the same protos
            await context.abort(grpc.StatusCode.UNIMPLEMENTED, f"not served as {shape.name}")
        if not shape.response_streams:
            response = await behavior(request, context)
            return encode(response) if encode is not None else response  # type: ignore[no-any-return]
        assert self._channel is not None
        async for item in behavior(request, context):
            while state.credit <= 0:
                state.credit_granted.clear()
                await state.credit_granted.wait()
            state.credit -= 1
            await self._channel.writable()
            self._send(
                fr.frame(Kind.MESSAGE, call_id, encode(item) if encode is not None else item)
            )
        return None


_BEHAVIOR = {
    Shape.UNARY_UNARY: "unary_unary",
    Shape.UNARY_STREAM: "unary_stream",
    Shape.STREAM_STREAM: "stream_stream",
    Shape.STREAM_UNARY: "stream_unary",
}


def _chained(
    interceptor: Interceptor, continuation: Callable[[CallDetails], Awaitable[Any]]
) -> Callable[[CallDetails], Awaitable[Any]]:
    async def next_handler(details: CallDetails) -> Any:
        return await interceptor.intercept_service(continuation, details)

    return next_handler
