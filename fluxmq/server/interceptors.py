"""The gRPC edge every call passes through: request id, error mapping, RPC metrics.

The request id comes from the client's ``x-request-id`` metadata or is generated; it is in the
trailing metadata of every response (OK or not) and in the ErrorInfo of every error, and log
lines of the call carry it.
"""

from __future__ import annotations

import contextlib
import contextvars
import logging
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc

from fluxmq import metrics
from fluxmq.core.auth import METHOD_ACTIONS, Action
from fluxmq.core.errors import FluxError
from fluxmq.server.errors import domain_error, internal_error, status_code, to_grpc_status
from fluxmq.server.guard import (
    Guard,
    Identity,
    UnknownApiKey,
    audit,
    current_identity,
    queues_of,
)

log = logging.getLogger(__name__)
access_log = logging.getLogger("fluxmq.access")
request_id_var: contextvars.ContextVar[str] = contextvars.ContextVar("request_id", default="-")
REQUEST_ID_KEY = "x-request-id"


def _request_id(context: grpc.aio.ServicerContext) -> str:
    for key, value in context.invocation_metadata() or ():
        if key == REQUEST_ID_KEY and isinstance(value, str) and 0 < len(value) <= 128:
            return value
    return uuid.uuid4().hex


class _Call:
    """Book-keeping of one call: request id, timing, outcome."""

    def __init__(self, method: str, context: grpc.aio.ServicerContext) -> None:
        self.method = method
        self.context = context
        self.request_id = _request_id(context)
        self.token = request_id_var.set(self.request_id)
        self.started = time.perf_counter()
        self.code = "OK"

    async def handle(self, exc: BaseException) -> None:
        """Turn ``exc`` into the call's status: an abort raised by the servicer passes through,
        an error becomes a rich status (abort raises), anything else (cancellation) is
        counted as CANCELLED and re-raised by the caller."""
        if _is_abort(exc):
            return
        if isinstance(exc, Exception):
            await self.fail(exc)
        self.code = "CANCELLED"

    async def fail(self, exc: Exception) -> None:
        err = domain_error(exc)
        if err is None:
            log.exception("unexpected error in %s (request id %s)", self.method, self.request_id)
            err = internal_error(self.request_id)
        self.code = status_code(err).name
        await self.context.abort_with_status(to_grpc_status(err, self.request_id))

    def ok(self, leader: str | None = None) -> None:
        trailers = [(REQUEST_ID_KEY, self.request_id)]
        if leader:
            trailers.append((LEADER_KEY, leader))
        self.context.set_trailing_metadata(tuple(trailers))

    def finish(self) -> None:
        elapsed_s = time.perf_counter() - self.started
        metrics.RPC_DURATION.labels(self.method, self.code).observe(elapsed_s)
        if access_log.isEnabledFor(logging.DEBUG):  # one line per call: debug level only
            access_log.debug("%s %s %.1f ms", self.method, self.code, elapsed_s * 1000)
        with contextlib.suppress(ValueError):  # a stream closed from another context
            request_id_var.reset(self.token)


def _is_abort(exc: BaseException) -> bool:
    # context.abort*() raises an internal exception type that must propagate untouched.
    return type(exc).__name__ == "AbortError"


# A replica that is behind (restarted, or just caught up by snapshot) may not know a queue or
# group yet. Before answering NOT_FOUND it catches up once and retries: NOT_FOUND is raised by
# lookups, before anything is written, so running the call again is safe.
STALE_REASONS = frozenset({"QUEUE_NOT_FOUND", "GROUP_NOT_FOUND"})
CatchUp = Callable[[], Awaitable[bool]]
# Where the leader of the node's shard serves gRPC, when known: returned in the trailing
# metadata of successful calls so that a client can go straight to it next time.
LEADER_KEY = "x-fluxmq-leader"
LeaderAddress = Callable[[], "str | None"]


ADMIN_ACTIONS = frozenset({Action.MANAGE, Action.CLUSTER})


def _metadata(context: grpc.aio.ServicerContext) -> tuple[tuple[str, Any], ...]:
    return tuple(context.invocation_metadata() or ())


def _audit_target(request: Any) -> str:
    if request is None:
        return "-"
    names = queues_of(request)
    if names:
        return "queue " + ",".join(names)
    for field_name in ("key_id", "shard_id", "name"):
        if field_name in request.DESCRIPTOR.fields_by_name:
            value = getattr(request, field_name)
            if value:
                return f"{field_name} {value}"
    return "-"


class EdgeInterceptor(grpc.aio.ServerInterceptor):  # type: ignore[misc]
    def __init__(
        self,
        catch_up: CatchUp | None = None,
        leader: LeaderAddress | None = None,
        guard: Callable[[], Guard | None] | None = None,
    ) -> None:
        self._catch_up = catch_up
        self._leader = leader
        # Read when a call starts: the composition root sets it up after building the server.
        self._guard = guard or (lambda: None)

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(details)
        if handler is None:
            return None
        method = details.method.rsplit("/", 1)[-1]
        # Health checks and reflection stay open (probes carry no key); the API needs one.
        guard = self._guard() if details.method.startswith("/fluxmq.v1.") else None
        if handler.unary_unary:
            return grpc.unary_unary_rpc_method_handler(
                _unary(method, handler.unary_unary, self._catch_up, self._leader, guard),
                request_deserializer=handler.request_deserializer,
                response_serializer=handler.response_serializer,
            )
        if handler.unary_stream:
            return grpc.unary_stream_rpc_method_handler(
                _streaming(method, handler.unary_stream, guard, per_message=False),
                request_deserializer=handler.request_deserializer,
                response_serializer=handler.response_serializer,
            )
        if handler.stream_stream:
            return grpc.stream_stream_rpc_method_handler(
                _streaming(method, handler.stream_stream, guard, per_message=True),
                request_deserializer=handler.request_deserializer,
                response_serializer=handler.response_serializer,
            )
        return handler


def _unary(
    method: str,
    behavior: Callable[..., Awaitable[Any]],
    catch_up: CatchUp | None = None,
    leader: LeaderAddress | None = None,
    guard: Guard | None = None,
) -> Callable[..., Awaitable[Any]]:
    async def wrapper(request: Any, context: grpc.aio.ServicerContext) -> Any:
        call = _Call(method, context)
        identity: Identity | None = None
        try:
            if guard is not None:
                identity = await _admit(guard, method, request, _metadata(context))
                current_identity.set(identity)
            try:
                response = await behavior(request, context)
            except FluxError as err:
                if catch_up is None or err.reason not in STALE_REASONS or not await catch_up():
                    raise
                if guard is not None and identity is not None:
                    # The queue was unknown when admitted (so unchecked): check it now.
                    guard.check_environment(identity, method, request)
                response = await behavior(request, context)
            if guard is not None and identity is not None:
                response = guard.filter_response(identity, method, response)
            call.ok(leader() if leader is not None else None)
            return response
        except BaseException as exc:
            await call.handle(exc)
            raise
        finally:
            call.finish()
            if METHOD_ACTIONS.get(method) in ADMIN_ACTIONS:
                audit(identity, method, call.request_id, call.code, _audit_target(request))

    return wrapper


def _streaming(
    method: str,
    behavior: Callable[..., AsyncIterator[Any]],
    guard: Guard | None = None,
    *,
    per_message: bool,
) -> Callable[..., AsyncIterator[Any]]:
    async def wrapper(request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
        call = _Call(method, context)
        md: tuple[tuple[str, Any], ...] = ()
        try:
            if guard is not None:
                md = _metadata(context)
                if per_message:
                    # A client stream: every request is checked as it arrives (rate limits
                    # count messages, environments are checked per queue).
                    await _authenticate(guard, md)
                    request = _checked(guard, method, request, md)
                else:
                    current_identity.set(await _admit(guard, method, request, md))
            async for response in behavior(request, context):
                if guard is not None:
                    # A stream can outlive its key: a revoked key ends it at the next message
                    # (a remembered verdict makes this a dictionary lookup).
                    guard.authenticate(md)
                yield response
            call.ok()
        except BaseException as exc:
            await call.handle(exc)
            raise
        finally:
            call.finish()

    return wrapper


async def _admit(
    guard: Guard, method: str, request: Any, md: tuple[tuple[str, Any], ...]
) -> Identity:
    try:
        return guard.admit(method, request, md)
    except UnknownApiKey as err:
        # Perhaps created through another node a moment ago: once more if the store knows it.
        if not await guard.keys.maybe_fetch(err.key_id):
            raise
    return guard.admit(method, request, md)


async def _authenticate(guard: Guard, md: tuple[tuple[str, Any], ...]) -> None:
    try:
        guard.authenticate(md)
    except UnknownApiKey as err:
        if not await guard.keys.maybe_fetch(err.key_id):
            raise
        guard.authenticate(md)


async def _checked(
    guard: Guard, method: str, requests: AsyncIterator[Any], md: tuple[tuple[str, Any], ...]
) -> AsyncIterator[Any]:
    async for request in requests:
        current_identity.set(guard.admit(method, request, md))
        yield request
